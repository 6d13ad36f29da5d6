"""The RS.io-over-TCP listener: a thin asyncio adapter between sockets, the sans-IO
:class:`~tidewire.protocols.rsio.Connection` and the :class:`~tidewire.hub.Hub`.

Per connection: bytes read go into the connection machine; its events become hub calls; each
subscription the peer makes is pumped by one task that waits for the hub subscription's next
delivery (which honours the peer's demand) and encodes it. Output is flow-controlled: while the
transport's write buffer is above its high-water mark, pumps wait, so a slow reader holds a
bounded buffer and a position in the log, never a backlog in memory.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from ..hub import Hub, Subscription
from ..model import Batch, TidewireError
from ..protocols.rsio import (
    Cancel,
    Connection,
    ConnectionClosed,
    Goodbye,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    Role,
    Subscribe,
    Subscribed,
    SubscriptionErrored,
)
from ..protocols.rsio.publisher import PublisherName, PublisherNameError, encode_envelopes

__all__ = ["RsioServer", "RsioServerProtocol", "start_rsio_server"]

log = logging.getLogger("tidewire.rsio")

WRITE_HIGH_WATER = 1024 * 1024
MAX_DELIVERY_BYTES = 256 * 1024
MAX_SUBSCRIPTIONS = 1024  # per connection: each costs a task and a hub subscription


class RsioServerProtocol(asyncio.Protocol):
    def __init__(
        self,
        hub: Hub,
        registry: set[RsioServerProtocol] | None = None,
        max_subscriptions: int = MAX_SUBSCRIPTIONS,
    ) -> None:
        self.hub = hub
        self.max_subscriptions = max_subscriptions
        self.registry = registry if registry is not None else set()
        self.conn = Connection(Role.SERVER)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.pumps: dict[int, tuple[Subscription, asyncio.Task[None]]] = {}
        self._writable = asyncio.Event()
        self._writable.set()

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        transport = self.transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.peer = str(transport.get_extra_info("peername"))
        self.registry.add(self)
        self.conn.initiate()
        self._flush()

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        self._handle_events()
        self._flush()

    def eof_received(self) -> bool | None:
        self.conn.receive_data(b"")
        self._handle_events()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.discard(self)
        self._cancel_all()
        self._writable.set()

    def shutdown(self, reason: str) -> None:
        """Goodbye, then close (server shutdown)."""
        self._cancel_all()
        if not self.conn.closed:
            self.conn.send(Goodbye(reason))
            self._flush()
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # ------------------------------------------------------------------ events

    def _handle_events(self) -> None:
        while (event := self.conn.next_event()) is not None:
            match event:
                case Subscribe(publisher, subscriber, initial):
                    self._subscribe(publisher, subscriber, initial)
                case Request(subscriber, n):
                    pump = self.pumps.get(subscriber)
                    if pump is not None:
                        pump[0].request(n)
                case Cancel(subscriber):
                    self._stop(subscriber)
                case SubscriptionErrored(subscriber, reason):
                    log.info("rsio %s: subscription %d refused: %s", self.peer, subscriber, reason)
                    self._stop(subscriber)
                case ConnectionClosed(reason, _, error):
                    if error:
                        log.warning("rsio %s: closing: %s", self.peer, reason)
                    self._cancel_all()
                    self._flush()
                    if self.transport is not None:
                        self.transport.close()
                case _:
                    pass  # hellos, and messages for subscriptions we do not make

    def _subscribe(self, publisher: str, subscriber: int, initial: int) -> None:
        if len(self.pumps) >= self.max_subscriptions:
            limit = self.max_subscriptions
            reason = f"too many subscriptions on this connection (the limit is {limit})"
            self.conn.send(OnError(subscriber, reason))
            return
        try:
            name = PublisherName.parse(publisher)
            sub = self.hub.subscribe(name.stream, name.start, until_id=name.until, key=name.key,
                                     max_batch_bytes=MAX_DELIVERY_BYTES)  # fmt: skip
        except (PublisherNameError, TidewireError, ValueError) as exc:
            self.conn.send(OnError(subscriber, str(exc)))
            return
        self.conn.send(Subscribed(subscriber, name.size))
        if initial:
            sub.request(initial)
        task = asyncio.create_task(self._pump(subscriber, sub, name))
        self.pumps[subscriber] = (sub, task)

    def _stop(self, subscriber: int) -> None:
        pump = self.pumps.pop(subscriber, None)
        if pump is not None:
            pump[0].cancel()
            pump[1].cancel()

    def _cancel_all(self) -> None:
        for subscriber in list(self.pumps):
            self._stop(subscriber)

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # ------------------------------------------------------------------ delivery

    async def _pump(self, subscriber: int, sub: Subscription, name: PublisherName) -> None:
        try:
            while True:
                await self._writable.wait()
                batches = await sub.next()
                if batches is None:
                    if sub.complete and not self.conn.closed:
                        self.conn.send(OnComplete(subscriber))
                        self._flush()
                    return
                for batch in batches:
                    self._send_batch(subscriber, batch, name)
                self._flush()
        except asyncio.CancelledError:
            raise
        except TidewireError as exc:
            if not self.conn.closed and subscriber in self.pumps:
                self.conn.send(OnError(subscriber, str(exc)))
                self._flush()
        finally:
            if self.pumps.get(subscriber, (None, None))[0] is sub:
                del self.pumps[subscriber]

    def _send_batch(self, subscriber: int, batch: Batch, name: PublisherName) -> None:
        if name.size:
            n = len(batch)
            if batch.values.nbytes != n * name.size or any(
                batch.value_offsets[i + 1] - batch.value_offsets[i] != name.size for i in range(n)
            ):
                raise TidewireError(
                    f"stream {batch.stream!r} holds a value that is not {name.size} bytes"
                )
            self.conn.send(OnNextPacked(subscriber, n, bytes(batch.values)))
        elif name.format == "value":
            for i in range(len(batch)):
                self.conn.send(OnNext(subscriber, batch.value(i)))
        else:
            for element in encode_envelopes(batch):
                self.conn.send(OnNext(subscriber, element))


class RsioServer:
    """The listener and its live connections (so that shutdown can say goodbye to each)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.connections: set[RsioServerProtocol] = set()
        self.server: asyncio.Server | None = None

    def _protocol(self) -> RsioServerProtocol:
        protocol = RsioServerProtocol(self.hub, self.connections)
        return protocol

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening, say goodbye to every connection and close it."""
        if self.server is not None:
            self.server.close()
        for protocol in list(self.connections):
            protocol.shutdown("server shutting down")
        if self.server is not None:
            await self.server.wait_closed()


async def start_rsio_server(hub: Hub, host: str, port: int) -> RsioServer:
    """Listen for RS.io over TCP on ``host:port`` (0 = any free port)."""
    rsio = RsioServer(hub)
    loop = asyncio.get_running_loop()
    rsio.server = await loop.create_server(rsio._protocol, host, port)
    return rsio
