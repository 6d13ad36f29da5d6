"""``/tube`` on the hub's aiohttp app: Tube (seed 001) over WebSocket, carrying RS.io.

The thin adapter between aiohttp's WebSocket, the sans-IO Tube
:class:`~tidewire.protocols.tube.Connection` and the hub's RS.io server protocol
(:class:`~tidewire.server.rsio.RsioServerProtocol`, the very one behind port 7400): every Tube
message the peer sends is a chunk of RS.io bytes, and every write of the RS.io side is one Tube
message. So subscribing with demand, publishing (extension 1) and every limit of RS.io over TCP
work over Tube unchanged.

Who the peer is: the upgrade request's principal (``Authorization: Bearer``, else the client
certificate, else anonymous), settled by the app's middleware, which answers a bad token with
401 before any upgrade. The RS.io side starts as that principal (a browser, which cannot set
headers on a WebSocket, authenticates in-band: RS.io's extension 2) and checks every subscribe
and offer against the ACL itself.

Flow control: what the RS.io side writes is queued as Tube messages and sent by one writer task;
past ``WRITE_HIGH_WATER`` bytes queued, the RS.io side is paused (its pumps wait) and the
WebSocket is no longer read, until the queue drains below ``WRITE_LOW_WATER``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

from ..hub import Hub
from ..hub.access import Access
from ..observe.logs import connection_log
from ..protocols.tube import Closed, Connection, Established, Limits, MessageReceived, Role
from .rsio import RsioServerProtocol, RsioSettings
from .rsio_http import principal

__all__ = ["TubeSettings", "TubeTransport", "add_tube_route"]

log = logging.getLogger("tidewire.tube")

WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024
_TLS_INFO = frozenset({"peercert", "sslcontext", "cipher", "compression", "ssl_object"})


@dataclass(frozen=True, slots=True)
class TubeSettings:
    fragment_size: int = 64 * 1024  # what the hub asks peers to split at
    max_message_bytes: int = 128 * 1024 * 1024
    keepalive_seconds: float | None = 30.0  # ping after this much quiet; close after 3x silence
    compression: str = "smart"


class TubeTransport(asyncio.Transport):
    """What an asyncio protocol writes becomes Tube messages on a WebSocket (one per write)."""

    def __init__(self, ws: web.WebSocketResponse, tube: Connection, peer: str,
                 http: asyncio.BaseTransport | None = None) -> None:  # fmt: skip
        super().__init__()
        self.http = http  # the HTTP connection under the WebSocket (its TLS facts)
        self.ws = ws
        self.tube = tube
        self.peer = peer
        self.protocol: asyncio.Protocol | None = None
        self.queued = 0
        self._closing = False
        self._paused = False  # the protocol's writing
        self._readable = asyncio.Event()
        self._readable.set()
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._in_writer = 0  # bytes the writer task took and has not sent yet
        self.close_code = 1000
        self.close_reason = ""

    # writing
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data or not self.tube.established:
            return
        self.tube.send(data, self._loop.time())
        self.flush()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def flush(self) -> None:
        """Hand what the Tube machine wants to send to the writer task."""
        self._wake.set()
        self.queued = self.tube.pending + self._in_writer
        if not self._paused and self.queued > WRITE_HIGH_WATER and self.protocol is not None:
            self._paused = True
            self.protocol.pause_writing()

    async def run_writer(self) -> None:
        """Send the queued Tube messages, in order; close the WebSocket once closing."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                messages = self.tube.data_to_send()
                self._in_writer = sum(len(m) for m in messages)
                for message in messages:
                    await self.ws.send_bytes(message)
                    self._in_writer -= len(message)
                self.queued = self._in_writer
                if self._paused and self.queued < WRITE_LOW_WATER and self.protocol is not None:
                    self._paused = False
                    self.protocol.resume_writing()
                if self._closing and not self._wake.is_set():
                    break
        except (ConnectionError, RuntimeError) as exc:  # the peer went away mid-write
            connection_log(log, self, "tube").info("writing stopped: %s", exc)
        finally:
            self._closing = True
            if not self.ws.closed:
                await self.ws.close(code=self.close_code,
                                    message=self.close_reason[:120].encode())  # fmt: skip

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True
        self._wake.set()

    def abort(self) -> None:
        self.close()

    def get_write_buffer_size(self) -> int:
        return self.queued

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # (the Tube queue has its own: WRITE_HIGH_WATER / WRITE_LOW_WATER)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``peername`` is the peer's address; TLS facts (``peercert``, ``sslcontext``,
        ``cipher``, ``ssl_object``) are the HTTP connection's."""
        if name == "peername":
            return self.peer
        if name == "guard" and self.http is not None:  # (the connection's id and log context)
            return self.http.get_extra_info("guard", default)
        if name in _TLS_INFO and self.http is not None:
            return self.http.get_extra_info(name, default)
        return default

    # reading
    def pause_reading(self) -> None:
        self._readable.clear()

    def resume_reading(self) -> None:
        self._readable.set()

    def is_reading(self) -> bool:
        return self._readable.is_set()

    async def readable(self) -> None:
        await self._readable.wait()


def add_tube_route(app: web.Application, hub: Hub, registry: set[RsioServerProtocol],
                   settings: TubeSettings | None = None,
                   rsio: RsioSettings | None = None,
                   access: Access | None = None) -> None:  # fmt: skip
    """Mount ``GET /tube`` (the WebSocket upgrade) on ``app``; its RS.io connections join
    ``registry`` (so that shutdown says goodbye to them too) and obey ``access``."""
    settings = settings or TubeSettings()
    access = access if access is not None else Access()

    async def tube(request: web.Request) -> web.StreamResponse:
        # WebSocket messages are Tube fragments, at most the fragment size the hub asked for
        # (the header counts against it); aiohttp closes with 1009 past that.
        limit = (
            settings.fragment_size + 1
            if settings.fragment_size
            else (settings.max_message_bytes + 16)
        )  # (aiohttp refuses a message of exactly its limit)
        ws = web.WebSocketResponse(max_msg_size=limit, compress=False, autoping=True)
        await ws.prepare(request)
        return await _serve(ws, request, hub, registry, settings, rsio, access)

    app.router.add_get("/tube", tube)


async def _serve(ws: web.WebSocketResponse, request: web.Request, hub: Hub,
                 registry: set[RsioServerProtocol], settings: TubeSettings,
                 rsio: RsioSettings | None, access: Access) -> web.WebSocketResponse:  # fmt: skip
    loop = asyncio.get_running_loop()
    peer = f"{request.remote}"
    tube = Connection(
        Role.SERVER, fragment_size=settings.fragment_size,
        limits=Limits(max_message_bytes=settings.max_message_bytes),
        compression=settings.compression,  # type: ignore[arg-type]
        keepalive=settings.keepalive_seconds, now=loop.time(),
    )  # fmt: skip
    transport = TubeTransport(ws, tube, peer, request.transport)
    conn_log = connection_log(log, request.transport, "tube")
    protocol = RsioServerProtocol(hub, registry, rsio, access=access, principal=principal(request),
                                  via="tube")  # fmt: skip
    transport.protocol = protocol
    writer = asyncio.create_task(transport.run_writer())
    timer: asyncio.TimerHandle | None = None
    started = False

    def arm() -> None:
        nonlocal timer
        if timer is not None:
            timer.cancel()
        deadline = tube.next_deadline()
        timer = None if deadline is None else loop.call_at(deadline, on_timer)

    def on_timer() -> None:
        tube.handle_timer(loop.time())
        handle()

    def handle() -> None:
        nonlocal started
        while (event := tube.next_event()) is not None:
            if isinstance(event, MessageReceived):
                if event.data:  # (an empty message is no end of stream)
                    protocol.data_received(event.data)
            elif isinstance(event, Established):
                started = True
                protocol.connection_made(transport)
            elif isinstance(event, Closed):
                if event.error:
                    conn_log.warning("closing: %s", event.reason)
                transport.close_code, transport.close_reason = event.code, event.reason
                transport.close()
        transport.flush()
        arm()

    try:
        arm()
        while not transport.is_closing():
            await transport.readable()
            message = await ws.receive()
            if message.type == WSMsgType.BINARY:
                tube.receive_data(message.data, loop.time())
                handle()
            elif message.type == WSMsgType.TEXT:
                conn_log.warning("a text WebSocket message (Tube is binary): closing")
                await ws.close(code=1003, message=b"Tube messages are binary")
                break
            elif message.type == WSMsgType.ERROR:
                conn_log.warning("%s", ws.exception())
                break
            else:  # CLOSE, CLOSING, CLOSED
                break
        if started:
            protocol.eof_received()
    finally:
        if timer is not None:
            timer.cancel()
        if started:
            protocol.connection_lost(None)
        transport.close()
        await writer
    return ws
