"""A stand-alone Tolliver instance: listens, connects to remotes, sends and receives.

Built on the sans-IO :class:`~tidewire.protocols.tolliver.Connection` (one per remote) and the
durable :class:`~.store.Store`:

* ``subscribe``/``unsubscribe`` change what this instance wants; every connection is told.
* ``send(channel, key, body)``: a reliable message gets an id from the store and is kept there
  for every connected remote subscribed to (channel, key) (or to the channel with the empty key)
  until that remote acks it; it is resent every ``resend_interval`` seconds meanwhile, and on the
  remote's next connection, also after a restart of this instance. While a connection is being
  established, sending waits (the seed), so a new remote gets every message sent after it came.
* Received messages come out of :meth:`messages` (an async iterator), every time they arrive
  (at-least-once), and a reliable one is acked only when the application asks for the next
  (so one it was handling when it died is resent); ``dedupe=True`` drops repeats of (sender,
  id) handed over lately.
* A new connection from a remote UUID that already has one replaces the old one.
* ``connect(..., ssl=context)`` dials a remote over TLS (the hub's listener requires a client
  certificate whose subject CN is this instance's UUID).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as _ssl
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

from ..model import LocalProtocolError
from ..protocols.tolliver import (
    CONTROL_CHANNEL,
    UNRELIABLE,
    Acked,
    Closed,
    Connection,
    Established,
    Message,
    PeerSubscriptions,
    Received,
    Role,
    matches,
)
from .store import Store

__all__ = ["Delivery", "Instance"]


def _ack(handled: list[tuple[_Link, int]]) -> None:
    """Ack what the application has handled (one write per connection), and forget it."""
    by_link: dict[_Link, list[int]] = {}
    for link, message_id in handled:
        by_link.setdefault(link, []).append(message_id)
    for link, message_ids in by_link.items():
        if link.conn.established:
            link.conn.ack_many(message_ids)
            link.soon()
    handled.clear()


log = logging.getLogger("tidewire.tolliver")

VERSION = 1


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message received from ``sender`` (``id`` 2**31-1: unreliable)."""

    sender: uuid.UUID
    channel: str
    key: str
    body: bytes
    id: int


class _Inbox:
    """Messages received and not yet taken by the application: bounded in count and bytes
    (one over either bound is not acked, so its sender resends it later)."""

    def __init__(self, limit: int, limit_bytes: int) -> None:
        self.limit = limit
        self.limit_bytes = limit_bytes
        self.nbytes = 0
        self._items: deque[tuple[Delivery, _Link]] = deque()
        self._ready = asyncio.Event()

    def full(self) -> bool:
        return len(self._items) >= self.limit or self.nbytes >= self.limit_bytes

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item: tuple[Delivery, _Link]) -> None:
        size = len(item[0].body)
        over = self._items and self.nbytes + size > self.limit_bytes  # (one always fits)
        if len(self._items) >= self.limit or over:
            raise asyncio.QueueFull
        self._items.append(item)
        self.nbytes += size
        self._ready.set()

    async def take(self, most: int) -> list[tuple[Delivery, _Link]]:
        """At least one and at most ``most`` items, oldest first (waits for one)."""
        items = self._items
        while not items:
            self._ready.clear()
            await self._ready.wait()
        taken = [items.popleft() for _ in range(min(most, len(items)))]
        self.nbytes -= sum(len(delivery.body) for delivery, _ in taken)
        return taken


class _Link(asyncio.Protocol):
    """One connection to a remote: the sans-IO machine, its transport, its resend timer."""

    def __init__(self, instance: Instance, role: Role) -> None:
        self.instance = instance
        self.conn = Connection(role, instance.store.instance, VERSION, frozenset({VERSION}),
                               set(instance.subscriptions),
                               resend_interval=instance.resend_interval,
                               auto_ack=False)  # acked once in the inbox (_deliver)  # fmt: skip
        self.transport: asyncio.Transport | None = None
        self.ready = asyncio.get_running_loop().create_future()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when it fires (time.monotonic())
        self._flush_soon = False
        self.lost = False  # the connection is gone: nothing to resend on it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.instance._handshakes += 1
        self.instance._sendable.clear()
        if self.conn.role is Role.CONNECTOR:
            self.conn.initiate()
        self.flush()

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        self.pump()

    def eof_received(self) -> bool | None:
        self.conn.receive_data(b"")
        self.pump()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"connection lost: {exc}"))
            self.instance._handshake_done()
        self.instance._forget(self)
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def flush(self) -> None:
        self._flush_soon = False
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
        self._arm()

    def soon(self) -> None:
        """Flush once the event loop is done with what is ready now (one write for the sends
        and acks of one turn)."""
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self.flush)

    def _arm(self) -> None:
        deadline = None if self.lost else self.conn.next_deadline()
        if self._timer is not None and (deadline is None or deadline < self._timer_at):
            self._timer.cancel()
            self._timer = None
        if deadline is not None and self._timer is None:  # (one that fires early re-arms)
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, deadline - time.monotonic()), self._resend)
            self._timer_at = deadline

    def _resend(self) -> None:
        self._timer = None
        self.conn.handle_timer(time.monotonic())
        self.flush()

    def pump(self) -> None:
        instance = self.instance
        while (event := self.conn.next_event()) is not None:
            if isinstance(event, Received):  # (the hot paths first)
                instance._deliver(self, event.message)
                continue
            if isinstance(event, Acked):
                if self.conn.peer is not None:
                    instance.acked(event.id, self.conn.peer)
                continue
            match event:
                case Established(peer):
                    instance._adopt(self, peer)
                    if not self.ready.done():
                        self.ready.set_result(peer)
                        instance._handshake_done()
                case Received(message):
                    instance._deliver(self, message)
                case Acked(message_id):
                    if self.conn.peer is not None:
                        instance.acked(message_id, self.conn.peer)
                case PeerSubscriptions():
                    pass
                case Closed(reason, error):
                    if error:
                        log.warning("tolliver %s: closing: %s", self.conn.peer, reason)
                    if self.transport is not None:
                        self.transport.close()
        self.flush()


class Instance:
    """A Tolliver instance whose state lives in the SQLite file ``path``."""

    def __init__(self, path: str, *, resend_interval: float = 1.0, dedupe: bool = False,
                 inbox_limit: int = 10_000,
                 inbox_bytes: int = 64 * 1024 * 1024) -> None:  # fmt: skip
        self.store = Store.open(path)
        self.resend_interval = resend_interval
        self.dedupe = dedupe
        self.subscriptions: set[tuple[str, str]] = set()
        self.links: dict[uuid.UUID, _Link] = {}
        self._inbox = _Inbox(inbox_limit, inbox_bytes)
        self._seen: OrderedDict[tuple[uuid.UUID, int], None] = OrderedDict()
        self._servers: list[asyncio.Server] = []
        self._handshakes = 0
        self._sendable = asyncio.Event()
        self._sendable.set()
        # group commit of the store: new messages (with the future of their ids) and acks
        self._adds: list[tuple[list[tuple[str, str, bytes, list[uuid.UUID]]],
                               asyncio.Future[list[int]]]] = []  # fmt: skip
        self._acks: list[tuple[int, uuid.UUID]] = []
        self._flush_scheduled = False
        self._commit: asyncio.Future[list[int]] | None = None  # the one running, in a thread
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="tolliver-store")

    @property
    def instance_id(self) -> uuid.UUID:
        """This instance's UUIDv7 (kept in its store across restarts)."""
        return self.store.instance

    # ------------------------------------------------------------------ connections

    async def listen(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Accept remotes on ``host:port``; the port bound."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Link(self, Role.ACCEPTOR), host, port)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def connect(
        self,
        host: str,
        port: int,
        *,
        ssl: _ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> uuid.UUID:
        """Connect to a remote and complete the handshake; the remote's UUID (bound it with
        ``asyncio.timeout``).

        ``ssl``: a client context: TLS, the remote's certificate verified against the
        context's CAs and its host name (``server_hostname``, default ``host``). A remote
        that requires client certificates (the hub) needs one in the context whose subject
        CN is this instance's UUID (:attr:`instance_id`). A refused connection raises
        :class:`OSError` (``ssl.SSLError``, ``ConnectionError``)."""
        loop = asyncio.get_running_loop()
        _, link = await loop.create_connection(
            lambda: _Link(self, Role.CONNECTOR), host, port, ssl=ssl,
            server_hostname=(server_hostname or host) if ssl is not None else None,
        )  # fmt: skip
        return cast(uuid.UUID, await link.ready)

    def _handshake_done(self) -> None:
        self._handshakes -= 1
        if self._handshakes <= 0:
            self._handshakes = 0
            self._sendable.set()

    def _adopt(self, link: _Link, peer: uuid.UUID) -> None:
        old = self.links.get(peer)
        self.links[peer] = link
        if old is not None and old is not link and old.transport is not None:
            old.transport.close()  # a reconnect replaces the stale connection
        now = time.monotonic()
        for message_id, channel, key, body in self.store.pending_for(peer):
            link.conn.send(Message(channel, key, body, message_id), now)  # resent at once
        link.flush()

    def _forget(self, link: _Link) -> None:
        peer = link.conn.peer
        if peer is not None and self.links.get(peer) is link:
            del self.links[peer]

    # ------------------------------------------------------------------ subscriptions

    def subscribe(self, channel: str, key: str = "") -> None:
        self.subscriptions.add((channel, key))
        for link in list(self.links.values()):
            link.conn.subscribe(channel, key)
            link.flush()

    def unsubscribe(self, channel: str, key: str = "") -> None:
        self.subscriptions.discard((channel, key))
        for link in list(self.links.values()):
            link.conn.unsubscribe(channel, key)
            link.flush()

    # ------------------------------------------------------------------ sending, receiving

    async def send(self, channel: str, key: str, body: bytes, *, reliable: bool = True) -> int:
        """Send to every connected remote subscribed to (channel, key); the message's id
        (returns once it is in the store and written to the remotes' connections)."""
        (message_id,) = await self.send_many(channel, key, [body], reliable=reliable)
        return message_id

    async def send_many(
        self, channel: str, key: str, bodies: Sequence[bytes], *, reliable: bool = True
    ) -> list[int]:
        """:meth:`send` of many messages at once, in order (one store commit, one write per
        remote); their ids."""
        if channel == CONTROL_CHANNEL:
            raise LocalProtocolError(f"the channel {CONTROL_CHANNEL!r} is reserved")
        try:
            raw_key = key.encode()
        except UnicodeEncodeError as exc:
            raise LocalProtocolError(f"the key is not UTF-8: {exc}") from None
        await self._sendable.wait()
        links = [
            link for link in self.links.values()
            if link.conn.established and matches(link.conn.peer_subscriptions, channel, key)
        ]  # fmt: skip
        if not bodies:
            return []
        if reliable:
            peers = [link.conn.peer for link in links if link.conn.peer is not None]
            future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
            self._adds.append(([(channel, key, body, peers) for body in bodies], future))
            self._schedule()
            ids = await future  # kept on disk before it goes out
            # on the remotes' connections as they are now: one that reconnected meanwhile
            # asked the store for its pending messages before these were in it
            links = [link for peer in peers if (link := self.links.get(peer)) is not None]
        else:
            ids = [UNRELIABLE] * len(bodies)
        now = time.monotonic()
        for link in links:
            if link.conn.established:
                items = [(raw_key, b, i) for b, i in zip(bodies, ids, strict=True)]
                link.conn.send_many(channel, items, now)
                link.soon()
        return ids

    def _schedule(self) -> None:
        if not self._flush_scheduled and self._commit is None:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """One store transaction, in the committer thread, for everything queued since the last
        one (group commit: what comes while it runs waits for the next)."""
        self._flush_scheduled = False
        if self._commit is not None or not (self._adds or self._acks):
            return
        adds, self._adds = self._adds, []
        acks, self._acks = self._acks, []
        rows = [row for rows, _ in adds for row in rows]
        loop = asyncio.get_running_loop()
        self._commit = commit = asyncio.ensure_future(
            loop.run_in_executor(self._committer, self.store.apply, rows, acks)
        )
        commit.add_done_callback(lambda _: self._committed(adds, commit))

    def _committed(
        self,
        adds: list[tuple[list[tuple[str, str, bytes, list[uuid.UUID]]], asyncio.Future[list[int]]]],
        commit: asyncio.Future[list[int]],
    ) -> None:
        self._commit = None
        if commit.cancelled() or commit.exception() is not None:
            exc = commit.exception() if not commit.cancelled() else asyncio.CancelledError()
            assert exc is not None
            for _, future in adds:
                if not future.done():
                    future.set_exception(exc)
        else:
            ids, at = commit.result(), 0
            for rows, future in adds:
                if not future.done():
                    future.set_result(ids[at : at + len(rows)])
                at += len(rows)
        if self._adds or self._acks:
            self._schedule()

    def acked(self, message_id: int, peer: uuid.UUID) -> None:
        """Record an ack (with the next group commit: losing one only means a resend)."""
        self._acks.append((message_id, peer))
        self._schedule()

    def _deliver(self, link: _Link, message: Message) -> None:
        sender = link.conn.peer
        assert sender is not None
        seen = (sender, message.id)
        if self.dedupe and message.reliable and seen in self._seen:
            link.conn.ack(message.id)  # handed over before: just ack it again
            return
        delivery = Delivery(sender, message.channel, message.key, message.body, message.id)
        try:
            self._inbox.put_nowait((delivery, link))
        except asyncio.QueueFull:  # not acked: the sender resends it later
            log.warning("tolliver: the application is not reading; a delivery of %s/%s waits "
                        "for the sender's resend", message.channel, message.key)  # fmt: skip
            return
        if self.dedupe and message.reliable:
            self._seen[seen] = None
            if len(self._seen) > 100_000:
                self._seen.popitem(last=False)

    async def messages(self) -> AsyncIterator[Delivery]:
        """Every message received, as it comes (reliable ones possibly more than once). A
        reliable message is acked when the application asks for the next one (or stops
        reading): one it was handling when it died is resent."""
        handled: list[tuple[_Link, int]] = []
        try:
            while True:
                _ack(handled)
                ((delivery, link),) = await self._inbox.take(1)
                if delivery.id != UNRELIABLE:
                    handled.append((link, delivery.id))
                yield delivery
        finally:  # the application stopped reading: it is done with the last one
            _ack(handled)

    async def batches(self, most: int = 1024) -> AsyncIterator[list[Delivery]]:
        """:meth:`messages` a list at a time (up to ``most``, what has arrived): the reliable
        ones of a list are acked together when the application asks for the next list (or
        stops reading)."""
        handled: list[tuple[_Link, int]] = []
        try:
            while True:
                _ack(handled)
                taken = await self._inbox.take(most)
                handled += [(link, d.id) for d, link in taken if d.id != UNRELIABLE]
                yield [delivery for delivery, _ in taken]
        finally:
            _ack(handled)

    async def close(self) -> None:
        while self._commit is not None or self._adds or self._acks:  # what is queued is kept
            if self._commit is None:
                self._flush()
            if self._commit is not None:
                await asyncio.wait([self._commit])  # (after its done callback, added first)
        self._committer.shutdown(wait=False)
        for server in self._servers:
            server.close()
        for link in list(self.links.values()):
            if link.transport is not None:
                link.transport.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self.store.close()
