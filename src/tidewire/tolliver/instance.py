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
  id): of one the application has finished with (remembered in the store, so also after a
  restart: the ack then waits for that record), and of one it holds now.
* A new connection from a remote UUID that already has one replaces the old one.
* ``connect(..., ssl=context)`` dials a remote over TLS (the hub's listener requires a client
  certificate whose subject CN is this instance's UUID).
* ``connect(..., retry=Retry(...))`` keeps the remote connected: a :class:`Supervisor` task
  reconnects with :class:`~tidewire.client.backoff.Backoff` whenever the link is lost, does the
  handshake again (with this instance's subscriptions), and the outbox re-offers every unacked
  message at once on the new connection. While the remote is away, ``send`` keeps what its
  last known subscriptions cover (on disk, as ever; at most ``outbox_bytes`` of unacked
  bodies in all, over which ``send`` raises ``LimitExceeded``). A handshake the remote refuses
  (versions) is final; one closed before any response counts as a failed try
  (docs/protocols/tolliver.md, "Reconnecting and duplicates").
* Time is the instance's ``clock`` (resends, the supervisor's pacing) and its ``sleep`` (the
  supervisor's waits): tests inject both, and :meth:`Instance.handle_timer` resends what is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as _ssl
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from operator import attrgetter, itemgetter

from ..client.backoff import Retry
from ..model import LimitExceeded, LocalProtocolError
from ..protocols.tolliver import CONTROL_CHANNEL, UNRELIABLE, Message, Role, matches
from .inbox import Delivery, Inbox, deliveries
from .instance_link import InstanceLink, ack_on_links
from .link import HandshakeFailed
from .store import Store
from .supervisor import Supervisor

__all__ = ["Delivery", "HandshakeFailed", "Inbox", "Instance", "Supervisor"]


log = logging.getLogger("tidewire.tolliver")

# what the application has handled: (the connection it came on, its sender, its id)
_Handled = list[tuple[InstanceLink, uuid.UUID, int]]


class Instance:
    """A Tolliver instance whose state lives in the SQLite file ``path``."""

    def __init__(self, path: str, *, resend_interval: float = 1.0, resend_backoff: float = 1.0,
                 resend_max_interval: float = 60.0, dedupe: bool = False,
                 dedupe_window: int = 100_000, inbox_limit: int = 10_000,
                 inbox_bytes: int = 64 * 1024 * 1024, outbox_bytes: int = 1024 * 1024 * 1024,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:  # fmt: skip
        """``dedupe``: drop repeats of the (sender, id) of the last ``dedupe_window`` reliable
        messages the application finished with (kept in the store) or holds now.
        ``outbox_bytes``: the bodies kept unacked, at most (a send over it is refused with
        :class:`~tidewire.model.LimitExceeded`). ``clock`` (seconds) and ``sleep``: time for
        resends and the supervisors' pacing. ``resend_backoff``: each resend of a message on
        one connection waits that many times longer than the last, at most
        ``resend_max_interval`` (1, the default: every ``resend_interval``; the hub uses 2)."""
        self.store = Store.open(path)
        self.resend_interval = resend_interval
        self.resend_backoff = resend_backoff
        self.resend_max_interval = resend_max_interval
        self.outbox_bytes = outbox_bytes
        self.dedupe = dedupe
        self.dedupe_window = dedupe_window
        self.clock = clock
        self.sleep = sleep
        self.subscriptions: set[tuple[str, str]] = set()
        self.links: dict[uuid.UUID, InstanceLink] = {}
        self.supervisors: list[Supervisor] = []  # connect(..., retry=...): one per call
        self.last_error: BaseException | None = None  # the latest of any supervisor
        self.duplicates = 0  # repeats dropped (dedupe)
        self._inbox = Inbox(inbox_limit, inbox_bytes)
        # dedupe: finished by the application (the newest dedupe_window, from the store too),
        # and held now (in the inbox or being handled)
        self._done: OrderedDict[tuple[uuid.UUID, int], None] = OrderedDict()
        if dedupe:
            self._done.update((seen, None) for seen in self.store.recent_seen(dedupe_window))
        self._held: set[tuple[uuid.UUID, int]] = set()
        self._seen: list[tuple[uuid.UUID, int]] = []  # finished: recorded with the next commit
        self._ack_after: list[tuple[InstanceLink, int]] = []  # their acks: sent once it is durable
        # acks received, not committed yet: peer -> ids (keyed once a run: a UUID's hash is
        # Python code, too dear once an ack)
        self._acking: dict[uuid.UUID, set[int]] = {}
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
        self._closed = False
        # unacked_at_most(n) callers: (n, their future), woken after each commit; one per caller
        self._room_waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def instance_id(self) -> uuid.UUID:
        """This instance's UUIDv7 (kept in its store across restarts)."""
        return self.store.instance

    @property
    def inbox(self) -> Inbox:
        """What arrived and the application has not taken yet (bounded by ``inbox_limit`` and
        ``inbox_bytes``): a message that finds it full is not acked, so its sender resends it."""
        return self._inbox

    @property
    def committing(self) -> bool:
        """Whether a group commit of the store (new messages, acks) is running in its thread."""
        return self._commit is not None

    @property
    def reconnects(self) -> int:
        """Connections re-established by every supervisor (:meth:`connect` with ``retry``)."""
        return sum(supervisor.reconnects for supervisor in self.supervisors)

    # ------------------------------------------------------------------ connections

    async def listen(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Accept remotes on ``host:port``; the port bound."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: InstanceLink(self, Role.ACCEPTOR), host, port)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def connect(
        self,
        host: str,
        port: int,
        *,
        ssl: _ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        retry: Retry | None = None,
        handshake_timeout: float = 10.0,
        stable_after: float = 1.0,
        failover: str | Sequence[str] = (),
    ) -> uuid.UUID:
        """Connect to a remote and complete the handshake; the remote's UUID.

        ``ssl``: a client context: TLS, the remote's certificate verified against the
        context's CAs and its host name (``server_hostname``, default ``host``). A remote
        that requires client certificates (the hub) needs one in the context whose subject
        CN is this instance's UUID (:attr:`instance_id`).

        Without ``retry``: one try (bound it with ``asyncio.timeout``); a refused connection
        raises :class:`OSError` (``ssl.SSLError``, ``ConnectionError``; :class:`HandshakeFailed`
        if the remote's handshake said no), and a connection lost later is not made again.

        With ``retry``: a :class:`Supervisor` (in :attr:`supervisors`) keeps the remote
        connected until :meth:`close`. This returns once the first handshake completed, each
        try bounded by ``handshake_timeout`` seconds and paced by ``retry``; it raises
        :class:`GaveUp` if ``retry`` runs out first (or at once on :class:`HandshakeFailed`).
        ``stable_after``: how long a connection must have lasted for its loss to start a new
        outage (see :class:`Supervisor`). ``failover`` (with ``retry``): more gateways of the
        same hub, ``host:port`` or ``tolliver://host:port``, tried round robin."""
        if failover and retry is None:
            raise ValueError("failover= needs retry= (gateways are tried by the supervisor)")
        if retry is not None:
            if self._closed:
                raise ConnectionError("the instance is closed")
            supervisor = Supervisor(self, host, port, retry, ssl=ssl,
                                    server_hostname=server_hostname,
                                    handshake_timeout=handshake_timeout,
                                    stable_after=stable_after, failover=failover)  # fmt: skip
            self.supervisors.append(supervisor)
            try:
                return await supervisor.first()
            except asyncio.CancelledError:  # the caller gave up waiting: so does the supervisor
                await supervisor.stop()
                raise
        loop = asyncio.get_running_loop()
        _, link = await loop.create_connection(
            lambda: InstanceLink(self, Role.CONNECTOR), host, port, ssl=ssl,
            server_hostname=(server_hostname or host) if ssl is not None else None,
        )  # fmt: skip
        return await link.ready

    def _handshake_done(self) -> None:
        self._handshakes -= 1
        if self._handshakes <= 0:
            self._handshakes = 0
            self._sendable.set()

    def _adopt(self, link: InstanceLink, peer: uuid.UUID) -> None:
        old = self.links.get(peer)
        self.links[peer] = link
        if old is not None and old is not link and old.transport is not None:
            old.transport.close()  # a reconnect replaces the stale connection
        now = self.clock()
        acking = self._acking.get(peer, set())
        for message_id, channel, key, body in self.store.pending_for(peer):
            if message_id not in acking:  # (acked, not yet committed: not resent)
                link.conn.send(Message(channel, key, body, message_id), now)  # resent at once
        link.flush()

    def _forget(self, link: InstanceLink) -> None:
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
        (returns once it is in the store and written to the remotes' connections).

        A reliable message is also kept for every supervised remote that is away (between
        connections) if its subscriptions, as last seen, cover (channel, key): it goes out
        when the remote is back. One no remote wants is not kept. An unreliable message only
        goes to the remotes connected now."""
        (message_id,) = await self.send_many(channel, key, [body], reliable=reliable)
        return message_id

    async def send_many(
        self, channel: str, key: str, bodies: Sequence[bytes], *, reliable: bool = True
    ) -> list[int]:
        """:meth:`send` of many messages at once, in order (one store commit, one write per
        remote); their ids. :class:`~tidewire.model.LimitExceeded` (nothing sent) if the
        outbox would hold more than ``outbox_bytes`` of unacked bodies."""
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
            for supervisor in self.supervisors:  # away (or going): kept for when it is back
                peer = supervisor.peer
                if peer is not None and peer not in peers and supervisor.keeps(channel, key):
                    peers.append(peer)
            if peers:
                kept = self.store.unacked_bytes() + sum(len(body) for body in bodies)
                if kept > self.outbox_bytes:  # (remotes away, or not acking)
                    raise LimitExceeded("the outbox's unacked bytes", self.outbox_bytes, kept)
            future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
            rows = list(zip(repeat(channel), repeat(key), bodies, repeat(peers)))  # (C loops)
            self._adds.append((rows, future))
            self._schedule()
            ids = await future  # kept on disk before it goes out
            # on the remotes' connections as they are now: one that reconnected meanwhile
            # asked the store for its pending messages before these were in it
            links = [link for peer in peers if (link := self.links.get(peer)) is not None]
        else:
            ids = [UNRELIABLE] * len(bodies)
        now = self.clock()
        for link in links:
            if link.conn.established:
                items = list(zip(repeat(raw_key), bodies, ids))  # (C loops)
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
        if self._commit is not None or not self._queued():
            return
        adds, self._adds = self._adds, []
        acks, self._acks = self._acks, []
        seen, self._seen = self._seen, []
        then, self._ack_after = self._ack_after, []
        rows = [row for rows, _ in adds for row in rows]
        loop = asyncio.get_running_loop()
        self._commit = commit = asyncio.ensure_future(loop.run_in_executor(
            self._committer, self.store.apply, rows, acks, seen, self.dedupe_window
        ))  # fmt: skip
        commit.add_done_callback(lambda _: self._committed(adds, acks, then, commit))

    def _queued(self) -> bool:
        return bool(self._adds or self._acks or self._seen)

    def _committed(
        self,
        adds: list[tuple[list[tuple[str, str, bytes, list[uuid.UUID]]], asyncio.Future[list[int]]]],
        acks: list[tuple[int, uuid.UUID]],
        then: list[tuple[InstanceLink, int]],
        commit: asyncio.Future[list[int]],
    ) -> None:
        self._commit = None
        self._committed_acks(acks)
        ack_on_links(then)  # (also if the record failed: the application is done with them)
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
        if self._room_waiters:
            self._wake_room()
        if self._queued():
            self._schedule()

    def _committed_acks(self, acks: list[tuple[int, uuid.UUID]]) -> None:
        """Forget ``acks`` from :attr:`_acking` (committed, or failed: a resend comes)."""
        acking = self._acking
        if acks and len(set(map(id, map(itemgetter(1), acks)))) == 1:  # (C loops)
            # (one remote object in every pair, the common case: its ids at once)
            acking.get(acks[0][1], set()).difference_update(map(itemgetter(0), acks))
        else:
            for message_id, peer in acks:
                ids = acking.get(peer, set())
                ids.discard(message_id)
        for peer in [peer for peer, ids in acking.items() if not ids]:
            del acking[peer]

    async def unacked_at_most(self, n: int) -> None:
        """Wait until the store keeps at most ``n`` reliable messages unacked (an ack counts
        once it is committed, as in ``store.unacked()``): a sender's window, without polling.
        ``RuntimeError`` if the instance closes meanwhile."""
        while self.store.unacked() > n:
            if self._closed:
                raise RuntimeError("the instance is closed")
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._room_waiters.append((n, waiter))
            await waiter

    def _wake_room(self, closing: bool = False) -> None:
        unacked, waiting = self.store.unacked(), []
        for n, waiter in self._room_waiters:
            if waiter.done():
                continue  # (cancelled)
            if closing:
                waiter.set_exception(RuntimeError("the instance is closed"))
            elif unacked <= n:
                waiter.set_result(None)
            else:
                waiting.append((n, waiter))
        self._room_waiters = waiting

    def acked(self, message_id: int, peer: uuid.UUID) -> None:
        """Record an ack (with the next group commit: losing one only means a resend)."""
        self._acks.append((message_id, peer))
        self._acking.setdefault(peer, set()).add(message_id)
        self._schedule()

    def acked_many(self, message_ids: list[int], peer: uuid.UUID) -> None:
        """:meth:`acked` of each of ``message_ids`` (a run of acks from one read)."""
        self._acks += zip(message_ids, repeat(peer))
        self._acking.setdefault(peer, set()).update(message_ids)
        self._schedule()

    def handle_timer(self, now: float | None = None) -> None:
        """Resend, on every connection, what is unacked since ``resend_interval`` at ``now``
        (default: the instance's clock). The connections' timers call this on their own; a
        test with a fake ``clock`` advances it and calls this."""
        now = self.clock() if now is None else now
        for link in list(self.links.values()):
            link.handle_timer(now)

    def _deliver_many(self, link: InstanceLink, messages: list[Message]) -> None:
        """:meth:`_deliver` of each of ``messages`` (a run from one read): without ``dedupe``,
        into the inbox in one go when they all fit (the common case)."""
        sender = link.conn.peer
        nbytes = sum(map(len, map(attrgetter("body"), messages)))  # (C loops)
        if self.dedupe or sender is None or not self._inbox.fits(messages, nbytes):
            for message in messages:
                self._deliver(link, message)
            return
        self._inbox.put_many(deliveries(Delivery, sender, messages, link), nbytes)

    def _deliver(self, link: InstanceLink, message: Message) -> None:
        sender = link.conn.peer
        assert sender is not None
        seen = (sender, message.id)
        dedupe = self.dedupe and message.reliable
        if dedupe:
            if seen in self._done:  # the application is done with it: ack it again
                self.duplicates += 1
                link.conn.ack(message.id)
                return
            if seen in self._held:  # it holds the first copy, acked once it is done with it
                self.duplicates += 1  # (not this one: if it dies meanwhile, it is resent)
                return
        delivery = Delivery(sender, message.channel, message.key, message.body, message.id)
        try:
            self._inbox.put_nowait((delivery, link))
        except asyncio.QueueFull:  # not acked: the sender resends it later
            log.warning("tolliver: the application is not reading; a delivery of %s/%s waits "
                        "for the sender's resend", message.channel, message.key)  # fmt: skip
            return
        if dedupe:
            self._held.add(seen)

    def _finish(self, handled: _Handled) -> None:
        """The application is done with ``handled``: ack them (with ``dedupe``, once the store
        remembers them), and forget them."""
        if not handled:
            return
        if not self.dedupe:
            links = set(map(itemgetter(0), handled))
            if len(links) == 1:  # (one connection: one ack_many, no pair per message)
                (link,) = links
                if link.conn.established:
                    link.conn.ack_many(list(map(itemgetter(2), handled)))
                    link.soon()
            else:
                ack_on_links([(link, message_id) for link, _, message_id in handled])
            handled.clear()
            return
        done, window = self._done, self.dedupe_window
        for link, sender, message_id in handled:
            seen = (sender, message_id)
            self._held.discard(seen)
            done[seen] = None
            done.move_to_end(seen)
            self._seen.append(seen)
            self._ack_after.append((link, message_id))
        while len(done) > window:
            done.popitem(last=False)
        handled.clear()
        self._schedule()

    async def messages(self) -> AsyncGenerator[Delivery, None]:
        """Every message received, as it comes (reliable ones possibly more than once). A
        reliable message is acked when the application asks for the next one (or stops
        reading): one it was handling when it died is resent."""
        handled: _Handled = []
        try:
            while True:
                self._finish(handled)
                ((delivery, link),) = await self._inbox.take(1)
                if delivery.id != UNRELIABLE:
                    handled.append((link, delivery.sender, delivery.id))
                yield delivery
        finally:  # the application stopped reading: it is done with the last one
            self._finish(handled)

    async def batches(self, most: int = 1024) -> AsyncGenerator[list[Delivery], None]:
        """:meth:`messages` a list at a time (up to ``most``, what has arrived): the reliable
        ones of a list are acked together when the application asks for the next list (or
        stops reading)."""
        handled: _Handled = []
        try:
            while True:
                self._finish(handled)
                taken = await self._inbox.take(most)
                batch = list(map(itemgetter(0), taken))
                ids = list(map(attrgetter("id"), batch))
                if UNRELIABLE in ids:
                    handled += [(link, d.sender, d.id) for d, link in taken if d.id != UNRELIABLE]
                else:  # (all reliable: C loops, no tuple built in Python per message)
                    senders = map(attrgetter("sender"), batch)
                    handled += zip(map(itemgetter(1), taken), senders, ids, strict=True)
                yield batch
        finally:
            self._finish(handled)

    async def close(self) -> None:
        """Stop every supervisor (no more reconnects), keep what is queued for the store (and
        send the acks waiting for it), close every connection and listener, then the store."""
        self._closed = True
        self._wake_room(closing=True)
        await asyncio.gather(*(s.stop() for s in self.supervisors))
        while self._commit is not None or self._queued():  # what is queued is kept
            if self._commit is None:
                self._flush()
            if self._commit is not None:
                await asyncio.wait([self._commit])  # (after its done callback, added first)
        self._committer.shutdown(wait=False)
        for server in self._servers:
            server.close()
        for link in list(self.links.values()):
            link.flush()  # (the acks that waited for the store, before the transport closes)
            if link.transport is not None:
                link.transport.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self.store.close()
