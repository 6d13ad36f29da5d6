"""``/tube`` on the hub's aiohttp app: Tube (seed 001) over WebSocket, carrying RS.io.

One adapter, :class:`TubeCarrier`, drives two sans-IO machines layered as aioquic layers
HTTP/3 on QUIC: the Tube :class:`~tidewire.protocols.tube.Connection` and, above it, the RS.io
:class:`~tidewire.server.rsio_session.RsioSession` (the very session behind port 7400, whose
carrier this is). WebSocket messages in -> ``tube.receive_data(message, now)`` -> each
:class:`~tidewire.protocols.tube.MessageReceived` payload -> ``session.receive_data``; each
write of the session (a list of chunks, the log's zero-copy views among them) -> one Tube
message (``tube.send_chunks``: uncompressed, a WebSocket message within one chunk stays a view
of it; deflated, compressing makes one new buffer) -> ``tube.chunks_to_send()`` -> one
``ws.send_bytes`` each. So subscribing with demand, publishing (extension 1) and every limit of
RS.io over TCP work over Tube unchanged. One timer is armed from ``tube.next_deadline()``.

Who the peer is: the upgrade request's principal (``Authorization: Bearer``, else the client
certificate, else anonymous), settled by the app's middleware, which answers a bad token with
401 before any upgrade. The RS.io session starts as that principal (a browser, which cannot set
headers on a WebSocket, authenticates in-band: RS.io's extension 2) and checks every subscribe
and offer against the ACL itself.

Flow control: the Tube messages queued (in the machine and in the writer task, which sends
them in order) are bounded: past ``WRITE_HIGH_WATER`` bytes the session is paused (its pumps
wait, and it pauses reading the WebSocket), until the queue drains below ``WRITE_LOW_WATER``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import WSMsgType, web

from ..hub import Hub
from ..hub.access import Access
from ..observe.logs import connection_log
from ..protocols.tube import Closed, Connection, Established, Limits, MessageReceived, Role
from .rsio_http import principal
from .rsio_session import RsioSession, RsioSettings

__all__ = ["TubeCarrier", "TubeSettings", "add_tube_route"]

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


class TubeCarrier:
    """One ``/tube`` WebSocket: the Tube machine ``tube`` and the RS.io ``session`` it
    carries, driven together by :meth:`run`; the session's
    :class:`~tidewire.server.rsio_session.Carrier`. ``peer`` is the peer's address, ``http``
    the HTTP connection under the WebSocket (the guard's connection, the TLS facts)."""

    def __init__(self, ws: web.WebSocketResponse, tube: Connection, session: RsioSession,
                 peer: str, http: asyncio.BaseTransport | None = None) -> None:  # fmt: skip
        self.ws = ws
        self.tube = tube
        self.session = session
        self.peer = peer
        self.http = http
        self.log = connection_log(log, http, "tube")
        self.queued = 0  # bytes of Tube messages not yet handed to the WebSocket
        self.close_code = 1000
        self.close_reason = ""
        self._loop = asyncio.get_running_loop()
        self._closing = False
        self._started = False  # the fragment sizes are exchanged: the session is started
        self._paused = False  # the session's writing
        self._readable = asyncio.Event()
        self._readable.set()
        self._wake = asyncio.Event()  # the writer task has messages to send, or must close
        self._in_writer = 0  # bytes the writer task took and has not sent yet
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ Carrier

    def write_chunks(self, chunks: list[bytes | memoryview]) -> None:
        """One Tube message of ``chunks`` (dropped once closing, as a closed socket would)."""
        if self._closing or not self.tube.established:
            return
        self.tube.send_chunks(chunks, self._loop.time())
        self._flush()

    def pause_reading(self) -> None:
        self._readable.clear()

    def resume_reading(self) -> None:
        self._readable.set()

    def close(self) -> None:
        """The writer task sends what is queued, then closes the WebSocket."""
        self._closing = True
        self._wake.set()

    def abort(self) -> None:
        self.close()  # (a WebSocket has no reset; the close is immediate enough)

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``peername`` is the peer's address; ``guard`` and the TLS facts (``peercert``,
        ``sslcontext``, ``cipher``, ``ssl_object``) are the HTTP connection's."""
        if name == "peername":
            return self.peer
        if (name == "guard" or name in _TLS_INFO) and self.http is not None:
            return self.http.get_extra_info(name, default)
        return default

    def established(self) -> None:
        """Nothing to tell: the guard's handshake deadline ended with the upgrade request."""

    # ------------------------------------------------------------------ driving

    async def run(self) -> None:
        """Read WebSocket messages into the machines until either side closes."""
        writer = asyncio.create_task(self._write())
        try:
            self._arm()
            while not self._closing:
                await self._readable.wait()
                message = await self.ws.receive()
                if message.type == WSMsgType.BINARY:
                    self.tube.receive_data(message.data, self._loop.time())
                    self._handle()
                elif message.type == WSMsgType.TEXT:
                    self.log.warning("a text WebSocket message (Tube is binary): closing")
                    await self.ws.close(code=1003, message=b"Tube messages are binary")
                    break
                elif message.type == WSMsgType.ERROR:
                    self.log.warning("%s", self.ws.exception())
                    break
                else:  # CLOSE, CLOSING, CLOSED
                    break
            if self._started:
                self.session.receive_data(b"")  # the end of the peer's RS.io stream
        finally:
            if self._timer is not None:
                self._timer.cancel()
            if self._started:
                self.session.connection_lost()
            self.close()
            await writer

    def _handle(self) -> None:
        """The Tube machine's events into the session; then send, and re-arm the timer."""
        while (event := self.tube.next_event()) is not None:
            if isinstance(event, MessageReceived):
                if event.data:  # (an empty message is no end of stream)
                    self.session.receive_data(event.data)
            elif isinstance(event, Established):
                self._started = True
                self.session.start(self)
            elif isinstance(event, Closed):
                if event.error:
                    self.log.warning("closing: %s", event.reason)
                self.close_code, self.close_reason = event.code, event.reason
                self.close()
        self._flush()
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        deadline = self.tube.next_deadline()
        self._timer = None if deadline is None else self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self.tube.handle_timer(self._loop.time())
        self._handle()

    def _flush(self) -> None:
        """Wake the writer task; past the high-water mark, pause the session."""
        self._wake.set()
        self.queued = self.tube.pending + self._in_writer
        if not self._paused and self.queued > WRITE_HIGH_WATER:
            self._paused = True
            self.session.pause_writing()

    async def _write(self) -> None:
        """Send the queued Tube messages, in order; close the WebSocket once closing."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                messages = self.tube.chunks_to_send()
                self._in_writer = sum(len(m) for m in messages)
                for message in messages:
                    # (aiohttp takes any bytes-like object, a view too, though typed bytes)
                    await self.ws.send_bytes(cast(bytes, message))
                    self._in_writer -= len(message)
                self.queued = self._in_writer
                if self._paused and self.queued < WRITE_LOW_WATER:
                    self._paused = False
                    self.session.resume_writing()
                if self._closing and not self._wake.is_set():
                    break
        except (ConnectionError, RuntimeError) as exc:  # the peer went away mid-write
            self.log.info("writing stopped: %s", exc)
        finally:
            self._closing = True
            if not self.ws.closed:
                await self.ws.close(code=self.close_code,
                                    message=self.close_reason[:120].encode())  # fmt: skip


def add_tube_route(app: web.Application, hub: Hub, registry: set[RsioSession],
                   settings: TubeSettings | None = None,
                   rsio: RsioSettings | None = None,
                   access: Access | None = None) -> None:  # fmt: skip
    """Mount ``GET /tube`` (the WebSocket upgrade) on ``app``; its RS.io sessions join
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
        machine = Connection(
            Role.SERVER, fragment_size=settings.fragment_size,
            limits=Limits(max_message_bytes=settings.max_message_bytes),
            compression=settings.compression,  # type: ignore[arg-type]
            keepalive=settings.keepalive_seconds, now=asyncio.get_running_loop().time(),
        )  # fmt: skip
        session = RsioSession(hub, registry, rsio, access=access, principal=principal(request),
                              via="tube")  # fmt: skip
        await TubeCarrier(ws, machine, session, f"{request.remote}", request.transport).run()
        return ws

    app.router.add_get("/tube", tube)
