"""The hub's side of one Tolliver connection (:class:`HubLink`, on the shared
:class:`~tidewire.tolliver.link.Link`) and its delivery of one stream to the remote
(:class:`ChannelDelivery`); :mod:`tidewire.server.tolliver` is the hub's instance (state, ids,
offsets, the listener) and the ingest of what remotes send.

* **Vetting.** A remote's certificate must name the instance of its handshake; a channel it
  subscribes to must be a stream name; its principal needs ``read`` on a channel to subscribe
  and ``write`` to send (docs/protocols/tolliver.md, "Security and limits"); with an ACL and
  no TLS, nobody, unless ``tolliver.allow_plaintext``. A connection may not take over a UUID
  that another principal's connection holds. A remote the hub dialed itself
  (``role=CONNECTOR``) is trusted. The hub's own subscriptions it is shown are those it may
  read or write.
* **Memory.** Each connection has a :class:`~tidewire.hub.Share` of the hub's budget: the
  frame being received (``"inbound"``, checked as declared by its header), bodies on their way
  to the log (``"ingest"``), deliveries awaiting acks (``"unacked"``).
* **Delivery.** Per channel the remote follows, a hub subscription on the stream, at most
  ``MAX_UNACKED`` deliveries unacked; every channel together at most
  ``tolliver.max_unacked_bytes`` (and the share's room): over it, nothing new is delivered until
  acks free room; resends back off (1 s, doubling, at most ``RESEND_MAX_INTERVAL``). Acks move
  the remote's offset.
* **No echo.** Events that came from the remote itself are skipped (:class:`Origins`):
  docs/protocols/tolliver.md, "Echo and loops".
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING

from ..hub import Share, Throttle
from ..hub.access import (
    ANONYMOUS,
    Action,
    Principal,
    certificate_name,
    certificate_principal,
)
from ..model import Batch, TidewireError, validate_stream_name
from ..observe.logs import connection_log
from ..protocols.tolliver import (
    UNRELIABLE,
    Acked,
    Closed,
    Connection,
    Established,
    Limits,
    Message,
    PeerSubscriptions,
    Received,
    Role,
)
from ..tolliver.link import HandshakeFailed, Link
from .guard import established, peer_certificate, refused
from .tolliver_delivery import CHANNEL, DELIVERY_BYTES, MAX_UNACKED, ChannelDelivery
from .tolliver_origins import within

if TYPE_CHECKING:
    from .tolliver import TolliverServer

__all__ = ["DELIVERY_BYTES", "MAX_UNACKED", "RESEND_BACKOFF", "RESEND_MAX_INTERVAL", "VERSION",
           "ChannelDelivery", "HubLink", "utf8_key"]  # fmt: skip

log = logging.getLogger("tidewire.tolliver")

VERSION = 1
RESEND_BACKOFF = 2.0  # each resend of one delivery waits twice as long as the last ...
RESEND_MAX_INTERVAL = 60.0  # ... at most this long (seconds)
ID_SPACE = 2**32  # Tolliver message ids are u32
FOLLOW_SLICE = 16  # channel deliveries made per turn of the event loop


class HubLink(Link):
    """The hub's side of one connection: the shared :class:`~tidewire.tolliver.link.Link`
    (flush, resend timer on the server's ``clock``, pause/resume, close after the last words)
    plus the hub's rules: vet the peer (certificate, ACL), store what it sends, deliver the
    streams it follows. The ingest side (``_hold``, ``_store``: how what it sends reaches the
    log, with its backpressure) is the subclass's, in :mod:`tidewire.server.tolliver`."""

    def __init__(self, server: TolliverServer, role: Role = Role.ACCEPTOR) -> None:
        """``role``: ``CONNECTOR`` for a connection the hub dialed (:meth:`TolliverServer.
        connect`): the remote is the operator's choice, so no certificate or ACL check."""
        self.server = server
        settings = server.settings
        limits = Limits(max_body_bytes=settings.max_message_bytes,
                        max_subscriptions=settings.max_subscriptions)  # fmt: skip
        # (its subscriptions, the hub's own, are filled in once the principal is known)
        super().__init__(Connection(role, server.instance, VERSION, frozenset({VERSION}),
                                    set(), limits=limits, auto_ack=False,
                                    resend_backoff=RESEND_BACKOFF,
                                    resend_max_interval=RESEND_MAX_INTERVAL),
                         server.clock)  # fmt: skip
        self.share: Share  # (its account in the hub's budget: made in connection_made)
        self.throttle: Throttle  # (its waits for a fair share of the loop: likewise)
        # deliveries may go out: the unacked ones leave room in max_unacked_bytes and the share
        self.room = asyncio.Event()
        self.room.set()
        self._since: float | None = None  # loop time the frame being received began
        self.channels: dict[str, ChannelDelivery] = {}
        # channels followed whose delivery is not made yet (in order; the values are unused):
        # made FOLLOW_SLICE per turn of the event loop (a thousand at once would stall it)
        self._to_follow: dict[str, None] = {}
        self._following: asyncio.Task[None] | None = None
        self.starts: dict[str, int] = {}  # stream -> next id, when the connection came
        self.peer = "?"  # the socket's address
        self.log = connection_log(log, None, "tolliver")
        self.principal = ANONYMOUS
        self.cert_name: str | None = None  # the verified client certificate's subject CN
        self._vetted_peer: uuid.UUID | None = None  # the instance UUID checked against cert_name
        self._vetted: set[tuple[str, str]] = set()  # subscriptions the ACL allowed
        self._subscriptions: set[tuple[str, str]] | None = None  # the set _vetted copies
        self._write_rights: dict[str, bool] = {}  # channel -> may send on it (a small cache)
        self.dialed = role is Role.CONNECTOR
        # the remote's UUID once established (or why not); awaited by TolliverServer.connect
        self.ready: asyncio.Future[uuid.UUID] = asyncio.get_running_loop().create_future()
        # channel -> [stores started, stores finished] of this remote's messages on a channel
        # it follows (see settled()); dropped when they are equal
        self._storing: dict[str, list[int]] = {}
        self._store_done = asyncio.Event()

    def __str__(self) -> str:
        """For log lines: the address, the instance and the principal."""
        return f"{self.peer} ({self.conn.peer or 'no handshake yet'}, {self.principal})"

    # ------------------------------------------------------------------ asyncio.Protocol

    @property
    def refused(self) -> bool:
        """Refused (identity, ACL): nothing more is read or written."""
        return self.muted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.log = connection_log(log, transport, "tolliver")
        self.peer = self.log.context.peer
        cert = peer_certificate(transport)
        self.cert_name = certificate_name(cert)
        self.principal = certificate_principal(cert) or ANONYMOUS
        self.log.context.principal = self.principal.name
        self.share = self.server.hub.budget.share(self.principal.name, self.peer)
        self.throttle = Throttle(self.share, self._fair)
        self.throttle.check()  # (its principal over its fair share: its first bytes wait)
        self.starts = {s.name: (s.latest_id or 0) + 1 for s in self.server.hub.streams()}
        self.server.links.add(self)
        # the hub's own subscriptions, those this principal may see (before a dialed link's
        # handshake request, in super().connection_made, is written with them)
        self.conn.subscriptions = self.server.listed.shown(self)
        super().connection_made(transport)
        if not self.dialed and self.server.plaintext_refused:
            self._refuse(f"an ACL is configured and this listener has no TLS, so {self.principal}"
                         " proves nothing (set tls.cert_file and tls.ca_file, or "
                         "tolliver.allow_plaintext = true)")  # fmt: skip

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.throttle.cancel()
        self.share.close()
        self._since = None
        self.room.set()  # (the pumps are cancelled below; none waits for ever)
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"closed before the handshake: {exc}"))
            self.ready.exception()  # (retrieved: only a dialed link's is awaited)
        self.server.links.discard(self)
        peer = self.conn.peer
        if peer is not None:  # (the metrics' counter lives on across connections)
            self.server.count_resends(peer, self.conn.resends)
        if peer is not None and self.server.by_peer.get(peer) is self:
            del self.server.by_peer[peer]
            self.server.left(peer)
        self.server.unlist(list(self._to_follow))  # (listed at its handshake, nothing kept)
        self._to_follow.clear()
        if self._following is not None:
            self._following.cancel()
        deliveries, self.channels = list(self.channels.values()), {}
        if len(deliveries) <= FOLLOW_SLICE:
            for delivery in deliveries:
                delivery.stop()
        else:  # (a thousand tasks cancelled at once would all run in one turn of the loop)
            self.server.spawn(_stop_all(deliveries))

    # ------------------------------------------------------------------ access

    def _refuse(self, reason: str) -> None:
        """A refusal (identity, ACL): logged with the principal; the connection is closed
        with nothing more sent (Tolliver has no error message outside the handshake)."""
        self.server.refusals.log(self.log, logging.WARNING,
                                 "refused: %s; closing the connection", reason)  # fmt: skip
        refused(self.transport)  # (its close lingers)
        self.refuse()  # (a handshake response, acks: never sent)
        self._since = None

    def _vet(self, changed: bool = True) -> bool:
        """Whether the peer may be the instance its handshake names and hold its
        subscriptions (those not checked yet), else it is refused. ``changed=False``: only
        if a handshake request came (cheap: once per chunk received). Runs before anything
        is sent in reply."""
        conn = self.conn
        peer = conn.peer
        if self.dialed:
            return True  # the operator chose this remote (TolliverServer.connect)
        if peer is not None and peer != self._vetted_peer:
            if self.cert_name is not None:
                if self.cert_name.lower() != str(peer):
                    self._refuse(f"{self.principal} may not be instance {peer} (a certificate "
                                 "must name the instance UUID it is for)")  # fmt: skip
                    return False
                self.principal = Principal(f"cert:{peer}")  # the UUID's canonical text
            self._vetted_peer = peer
        subscriptions = conn.peer_subscriptions
        if not (changed or subscriptions is not self._subscriptions):
            return True
        access = self.server.access
        for channel, _ in subscriptions - self._vetted:
            try:  # (before the hub follows it, or lists it to every remote)
                validate_stream_name(channel)
            except TidewireError as exc:
                self._refuse(f"a subscription to a channel that is not a stream name: {exc}")
                return False
            if not access.open and not access.may(self.principal, "read", channel):
                self._refuse(self._forbidden("read", channel, "a subscription to it"))
                return False
        self._vetted = set(subscriptions)
        self._subscriptions = subscriptions  # (a handshake request makes a new set)
        return True

    def shows(self, channel: str) -> bool:
        """Whether the hub's own subscription to ``channel`` is told to this remote: those it
        may read or write (a name it may neither read nor write is not its to know; one it may
        write is what the hub wants from it)."""
        access = self.server.access
        if access.open or self.dialed:
            return True
        return access.may(self.principal, "read", channel) or self._may_write(channel)

    def _forbidden(self, action: Action, channel: str, what: str) -> str:
        return f"{self.principal} may not {action} stream {channel!r} ({what})"

    def _may_write(self, channel: str) -> bool:
        allowed = self._write_rights.get(channel)
        if allowed is None:
            allowed = self.server.access.may(self.principal, "write", channel)
            if len(self._write_rights) >= 256:
                self._write_rights.clear()
            self._write_rights[channel] = allowed
        return allowed

    # ------------------------------------------------------------------ events

    def handle_events(self) -> None:
        if self.refused:
            return
        arrived: dict[str, list[Message]] = {}  # stored as one batch per channel
        acks: list[int] = []  # handled together
        everyone_writes = self.server.access.open or self.dialed
        conn, run = self.conn, list[Message]()
        while True:
            if conn.receive_run(run, acks):  # (the hot paths first, in runs)
                for channel in (channels := set(map(CHANNEL, run))):  # (C loops)
                    if not everyone_writes and not self._may_write(channel):
                        self._refuse(self._forbidden("write", channel, "a message"))
                        return  # what arrived with it is neither stored nor acked
                if len(channels) == 1:  # (one channel, the common case: no test per message)
                    arrived.setdefault(run[0].channel, []).extend(run)
                else:
                    for message in run:
                        arrived.setdefault(message.channel, []).append(message)
                run.clear()
            event = conn.next_event()
            if event is None:
                break
            if isinstance(event, Acked):
                acks.append(event.id)
                continue
            match event:
                case Received(message):
                    if not everyone_writes and not self._may_write(message.channel):
                        self._refuse(self._forbidden("write", message.channel, "a message"))
                        return  # what arrived with it is neither stored nor acked
                    arrived.setdefault(message.channel, []).append(message)
                case Established(peer):
                    if not self._vet():
                        return
                    old = self.server.by_peer.get(peer)
                    both_vetted = old is not None and not (old.dialed or self.dialed)
                    if both_vetted and old is not None and old.principal != self.principal:
                        self._refuse(f"{self.principal} may not take over instance {peer}, "
                                     f"connected as {old.principal}")  # fmt: skip
                        return
                    established(self.transport)  # the handshake deadline no longer applies
                    self.server.by_peer[peer] = self
                    if old is not None and old is not self and old.transport is not None:
                        old.transport.close()  # a reconnect replaces the stale connection
                    if not self.ready.done():
                        self.ready.set_result(peer)
                case PeerSubscriptions(subscriptions):
                    if not self._vet():
                        return
                    if self.conn.established:
                        self._follow({c for c, _ in subscriptions})
                case Closed(reason, error):
                    if error:
                        self.log.warning("(%s) closing: %s", self.conn.peer or "no handshake yet",
                                         reason)  # fmt: skip
                        refused(self.transport)  # (its close lingers)
                    if self.conn.peer is not None and not self._vet():
                        return  # (a peer it may not be gets no response, not even a refusal)
                    if not self.ready.done():
                        self.ready.set_exception(HandshakeFailed(reason))
                        self.ready.exception()  # (retrieved: only a dialed link's is awaited)
                    self.close(event)  # (a handshake refusal is written first)
                    return
        if not self._vet(changed=False):  # a request answered 3 (its final is to come)
            return
        if acks:
            self._acked(acks)
        for channel, messages in arrived.items():
            self._hold(sum(len(m.body) for m in messages))
            if self.follows(channel):  # (its own messages are not delivered back to it)
                self._storing.setdefault(channel, [0, 0])[0] += 1
                self.server.spawn(self._store_counted(channel, messages))
            else:
                self.server.spawn(self._store(messages))
        self.flush()

    def _follow(self, channels: set[str]) -> None:
        """Follow the streams of the channels subscribed to; stop the others, and forget this
        remote's offsets on them. The hub itself subscribes to every channel a remote follows
        (within ``tolliver.max_channels``), so that instances send it their messages (it
        stores and relays them)."""
        for name in list(self.channels):
            if name not in channels:
                self.channels.pop(name).stop()
        for name in (dropped := [n for n in self._to_follow if n not in channels]):
            del self._to_follow[name]
        peer = self.conn.peer
        assert peer is not None
        valid = channels  # (vetted: stream names)
        if self.dialed:  # (not vetted: the operator's choice)
            valid = set()
            for name in channels:
                try:
                    valid.add(validate_stream_name(name))
                except TidewireError:
                    continue  # no stream can have that name
        self.server.follows(peer, valid)
        self.server.unlist(dropped)  # (listed by follows, no offset kept: TolliverServer)
        for name in sorted(valid - set(self.channels) - set(self._to_follow)):
            self._to_follow[name] = None
        if self._to_follow and self._following is None:
            self._following = asyncio.create_task(self._make_deliveries(peer))

    async def _make_deliveries(self, peer: uuid.UUID) -> None:
        """Make the deliveries of the channels followed, ``FOLLOW_SLICE`` per turn of the event
        loop. (Where each starts was fixed when the connection came, so making it a little
        later loses nothing: the seed's rule holds.)

        A remote's first subscription to a channel: its offset is kept at once (one ledger
        group per slice), and nothing is delivered before, so that a hub restarted (even
        killed) later resumes it there; else it would start over where the stream then
        stands, and what was stored while it was away would never reach it."""
        offsets, starts = self.server.offsets, self.starts
        try:
            while self._to_follow and not self.lost:
                names = list(self._to_follow)[:FOLLOW_SLICE]
                for name in names:
                    del self._to_follow[name]
                first = [((peer, n), starts.get(n, 1)) for n in names if (peer, n) not in offsets]
                kept = self.server.first_offsets(first) if first else None
                for name in names:
                    start = offsets.get((peer, name)) or starts.get(name, 1)
                    self.channels[name] = ChannelDelivery(self, name, start, kept)
                await asyncio.sleep(0)
        finally:
            self._following = None

    def follows(self, channel: str) -> bool:
        """Whether the remote follows ``channel`` (its delivery made, or to be made)."""
        return channel in self.channels or channel in self._to_follow

    def deliver(self, channel: ChannelDelivery, batches: list[Batch]) -> None:
        """The events of ``batches`` (stream ``channel.channel``) as reliable messages, those
        with a key the remote subscribed to (or all, subscribed to the channel with the empty
        key); the others are skipped."""
        if not self.conn.established:
            return
        wanted = self.conn.peer_subscriptions
        name = channel.channel
        every = (name, "") in wanted
        inflight, now, conn = channel.inflight, self.clock(), self.conn
        items: list[tuple[bytes, bytes, int]] = []
        skipped = sent = run_bytes = 0
        next_id = self.server.next_message_id
        own = self.server.origins.of(self.conn.peer, name) if self.conn.peer else None
        for batch in batches:
            ids = batch.ids
            n = len(ids)
            last = next_id + n  # (one past the run's last id: no 2**31-1 in it, no wrap)
            one_run = last <= UNRELIABLE or (next_id > UNRELIABLE and last <= ID_SPACE)
            if every and not own and not batch.has_keys and one_run:
                # (the common case, without a test per event: ids in one run, no key)
                inflight.update(zip(range(next_id, last), ids, strict=True))
                if items:  # (what came before it goes first: the order of the stream)
                    conn.send_many(name, items, now)
                    sent, items = sent + len(items), []
                conn.send_values(name, batch.values, batch.value_offsets, next_id, now)
                sent, run_bytes = sent + n, run_bytes + 20 * n + batch.values.nbytes
                next_id = last & 0xFFFFFFFF
                continue
            for i in range(n):
                if own and within(own, ids[i]):  # its own message: not echoed (no_echo)
                    skipped += 1
                    continue
                key = utf8_key(batch.key(i))
                if not every and (name, key.decode()) not in wanted:
                    skipped += 1
                    continue
                message_id = next_id
                next_id = (next_id + 1) & 0xFFFFFFFF
                if message_id == UNRELIABLE:  # never a reliable message's id
                    message_id, next_id = next_id, next_id + 1
                inflight[message_id] = ids[i]
                items.append((key, batch.value(i), message_id))
        self.server.took_ids(next_id, sent + len(items))
        if skipped:
            channel.sub.request(skipped)
            channel.sub.delivered -= skipped  # (the API's "delivered": what the remote got)
        if items:
            conn.send_many(name, items, now)
        if sent + len(items):
            self.charge()
            if skipped:  # (what was skipped is not counted as sent)
                nbytes = run_bytes + sum(20 + len(k) + len(v) for k, v, _ in items)
            else:
                nbytes = sum(b.nbytes for b in batches)
            self.server.hub.metrics.sent("tolliver", name, sent + len(items), nbytes)

    def _acked(self, message_ids: list[int]) -> None:
        peer = self.conn.peer
        channels = list(self.channels.values())
        if len(channels) == 1:  # (C loops)
            by_channel = {channels[0]: list(filter(channels[0].inflight.__contains__, message_ids))}
        else:
            by_channel = {}
            for message_id in message_ids:
                for channel in channels:
                    if message_id in channel.inflight:
                        by_channel.setdefault(channel, []).append(message_id)
                        break
        for channel, acked in by_channel.items():
            if acked:
                moved = channel.acked(acked)
                if moved is not None and peer is not None:
                    self.server.remember(peer, channel.channel, moved)
        self.charge()

    def charge(self) -> None:
        """The deliveries awaiting acks, charged to the share (``"unacked"``); new ones may go
        out while they leave room for one more delivery in ``tolliver.max_unacked_bytes`` and
        in the share (and always when none awaits an ack: each remote has at least one)."""
        unacked = self.conn.unacked_bytes
        self.share.hold("unacked", unacked)
        if not unacked or (
            unacked + DELIVERY_BYTES <= self.server.settings.max_unacked_bytes
            and self.share.available() >= DELIVERY_BYTES
        ):
            self.room.set()
        else:
            self.room.clear()

    # ------------------------------------------------------------------ receiving

    def data_received(self, data: bytes) -> None:
        """The frame being received is checked against the share as declared (a message's
        header gives its whole size) before the rest of it is waited for. The time handling
        it takes is charged to the principal (:mod:`tidewire.hub.fairness`)."""
        frames = self.conn.frames_received
        began = time.perf_counter()
        super().data_received(data)
        self.throttle.spent(time.perf_counter() - began)
        if self.muted or self.conn.closed:
            return
        declared = self.conn.receiving
        if not declared:
            self._since = None
        elif self._since is None or self.conn.frames_received != frames:
            self._since = asyncio.get_running_loop().time()  # (a new frame began in it)
        if not self.share.try_hold("inbound", declared):
            self._refuse(f"a frame of {declared} bytes does not fit the memory budget "
                         f"({self.share.available()} bytes free in its share)")  # fmt: skip

    def _fair(self, waiting: bool) -> None:
        """Over its principal's fair share of the loop: not read until the wait is over."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if waiting:
            transport.pause_reading()
        else:
            self.reading_resumed()
            transport.resume_reading()

    def reading_resumed(self) -> None:
        """The hub reads the socket again: an unfinished frame's time starts over now."""
        if self._since is not None:
            self._since = asyncio.get_running_loop().time()

    def receiving_since(self) -> float | None:
        """When the unfinished frame began (``loop.time()``), for the guard's
        ``limits.message_seconds``; ``None``: none is unfinished (or this side is not reading
        it: see the subclass)."""
        return self._since

    async def settled(self, channel: str) -> None:
        """Until every store of this remote's messages on ``channel`` begun so far is over, so
        that the ids of its own messages are known to :meth:`deliver` (a delivery read from
        the stream may hold events whose append has not returned yet). Bounded: stores begun
        later do not extend the wait."""
        counts = self._storing.get(channel)
        if counts is None:
            return
        target = counts[0]
        while counts[1] < target:
            self._store_done.clear()
            await self._store_done.wait()

    def _came(self, channel: str, stored: Batch) -> None:
        """Remember that ``stored`` came from this remote, if it follows ``channel``."""
        peer = self.conn.peer
        if peer is not None and self.follows(channel):
            self.server.origins.came(peer, channel, stored.first_id, stored.last_id)

    async def _store_counted(self, channel: str, messages: list[Message]) -> None:
        """:meth:`_store`, counted as over (stored or refused) for :meth:`settled`."""
        try:
            await self._store(messages)
        finally:
            counts = self._storing[channel]
            counts[1] += 1
            if counts[1] >= counts[0]:
                del self._storing[channel]
            self._store_done.set()

    # ------------------------------------------------------------------ ingest (the subclass's)

    def _hold(self, nbytes: int) -> None:
        """Bodies of ``nbytes`` are on their way to the log (backpressure)."""
        raise NotImplementedError

    async def _store(self, messages: list[Message]) -> None:
        """Store messages of one channel and ack them once durable."""
        raise NotImplementedError

    def quiesce(self) -> None:
        """Shutdown: read nothing more (what was read is still stored while :attr:`busy`)."""
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        """Messages read and not yet stored and acked."""
        raise NotImplementedError


async def _stop_all(deliveries: list[ChannelDelivery]) -> None:
    """Stop ``deliveries``, ``FOLLOW_SLICE`` per turn of the event loop."""
    for at in range(0, len(deliveries), FOLLOW_SLICE):
        for delivery in deliveries[at : at + FOLLOW_SLICE]:
            delivery.stop()
        await asyncio.sleep(0)


def utf8_key(key: bytes | None) -> bytes:
    """An event's key as a Tolliver key: UTF-8 ("" for none; invalid bytes replaced)."""
    if not key:
        return b""
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return key.decode("utf-8", "replace").encode()
    return key
