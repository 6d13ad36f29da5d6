"""The hub as a Tolliver instance (seed 003; default port 7402).

* A message on channel C with key K from a remote instance is appended to the stream C (with
  key K; the empty key is "no key") and acked only once durable.
* Every connected instance subscribed to (C, K), or to C with the empty key, gets the events of
  stream C as reliable messages, whichever protocol wrote them: per remote and channel, a hub
  subscription follows the stream. Where it starts: the offset this remote acked last time
  (kept in the hub's stream ``_tidewire.tolliver``), else the stream's end as it was when the
  remote's connection was accepted, so that what reaches the hub while a remote is still in its
  handshake is delivered to it too (the seed's rule).
* Acks move the remote's offset for the channel (up to the lowest id still unacked), recorded at
  most every 0.1 s; on its next connection the remote gets again everything after the recorded
  offset: unacked deliveries (and at most 0.1 s of acked ones) are resent.
  They are also resent every second while the connection lasts (the sans-IO machine's timer).
* The hub subscribes to every channel (all keys) that any remote subscribes to, so instances
  send it their messages on those channels; it never unsubscribes (**decision**).
* A new connection from a UUID that has one replaces the old one.

Security and limits (docs/protocols/tolliver.md, "Security and limits"): the socket is a
:class:`~tidewire.server.guard.Listener`'s (TLS, connection limits, handshake and idle
deadlines; the handshake ends when the remote is established). Over TLS a remote's verified
certificate must name its instance: subject CN = the UUID of its handshake request. Its
principal (``cert:<uuid>``, else ``anonymous``) needs ``read`` on stream C to subscribe to
channel C and ``write`` to send messages on C. Bodies are at most
:attr:`TolliverSettings.max_message_bytes`, subscriptions held at most
:attr:`TolliverSettings.max_subscriptions`. Tolliver has no error message outside the
handshake: every refusal is a log line naming the principal, then the connection is closed,
before the handshake response when it concerns the handshake request. Nothing more is
delivered to a remote that does not read (its socket's buffer above the high-water mark), and
the guard drops it after ``limits.write_stall_seconds``; a remote whose messages wait for the
log (more than the ingest path's ``max_pending_bytes``, ``MAX_PENDING_BYTES`` by default) is not
read meanwhile. Messages are stored through the hub's ingest path (:mod:`tidewire.hub.ingest`,
one pipeline per link): acks go out in the order the messages came.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import uuid
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, cast

from ..hub import INGEST_DEFAULTS, Hub, Subscription
from ..hub.access import (
    ANONYMOUS,
    Access,
    Action,
    Principal,
    certificate_name,
    certificate_principal,
)
from ..model import Batch, TidewireError, validate_stream_name
from ..observe.logs import connection_log
from ..observe.metrics import TolliverPeer
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
from ..tolliver.store import uuid7
from .guard import Admission, ConnectionLimits, Listener, established, peer_certificate

__all__ = ["TolliverServer", "TolliverSettings", "start_tolliver_server"]

log = logging.getLogger("tidewire.tolliver")

STATE_STREAM = "_tidewire.tolliver"
VERSION = 1
DELIVERY_BYTES = 256 * 1024
MAX_UNACKED = 4096  # per remote and channel: deliveries in flight
OFFSET_INTERVAL = 0.1  # seconds between records of one remote's offset for one channel
MAX_HUB_SUBSCRIPTIONS = 65536  # what a remote's decoder takes in a handshake (Limits)
MAX_PENDING_BYTES = INGEST_DEFAULTS["tolliver"].max_pending_bytes  # per remote, not yet stored
ID_BLOCK = 1 << 20  # delivery ids reserved at a time in the state stream


@dataclass(frozen=True, slots=True)
class TolliverSettings:
    """A remote's bounds (settings ``tolliver.*``): a message body at most
    ``max_message_bytes``; at most ``max_subscriptions`` held at once (handshake entries and
    later subscribes together). Over either: the connection is closed."""

    max_message_bytes: int = 16 * 1024 * 1024
    max_subscriptions: int = 1024

    def __post_init__(self) -> None:
        if not 0 <= self.max_message_bytes <= 2**32 - 1 or self.max_subscriptions < 0:
            raise ValueError("max_message_bytes is a u32 and max_subscriptions >= 0")


class _Channel:
    """One remote's delivery of one stream: a hub subscription and what awaits acks."""

    def __init__(self, link: _Link, channel: str, start: int,
                 kept: asyncio.Future[None] | None = None) -> None:  # fmt: skip
        """``kept``: delivery waits for it (the remote's first offset on its way to disk)."""
        self.link = link
        self.kept = kept
        self.channel = channel
        self.sub: Subscription = link.server.hub.subscribe(
            channel, start, max_batch_bytes=DELIVERY_BYTES, skip_lost=True, via="tolliver",
            connection=link.log.context.conn, counted=False,  # (deliver() counts what it sends)
        )
        self.sub.request(MAX_UNACKED)
        self.inflight: OrderedDict[int, int] = OrderedDict()  # tolliver id -> event id, in order
        self.acked_to = start - 1
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        link = self.link
        try:
            if self.kept is not None:
                await self.kept
            while True:
                await link.writable.wait()  # a remote that does not read gets nothing more
                await link.server.ids_ready.wait()  # (ids for one delivery: <= MAX_UNACKED)
                if (batches := await self.sub.next()) is None:
                    break
                link.deliver(self, batches)
                link.flush()  # once per delivery, not per message
        except asyncio.CancelledError:
            raise
        except TidewireError as exc:
            link.log.warning("delivering %r stopped: %s", self.channel, exc)

    def acked(self, message_ids: list[int]) -> int | None:
        """Record acks (of this channel's deliveries); the new offset (next event id to
        deliver) if it moved."""
        inflight = self.inflight
        last = None
        for message_id in message_ids:
            last = inflight.pop(message_id)
        if last is None:
            return None
        self.sub.request(len(message_ids))
        low = next(iter(inflight.values()), last + 1)  # (in event order)
        if low - 1 > self.acked_to:
            self.acked_to = low - 1
            return low
        return None

    def stop(self) -> None:
        self.sub.cancel()
        self.task.cancel()


class _Link(asyncio.Protocol):
    def __init__(self, server: TolliverServer) -> None:
        self.server = server
        settings = server.settings
        limits = Limits(max_body_bytes=settings.max_message_bytes,
                        max_subscriptions=settings.max_subscriptions)  # fmt: skip
        self.conn = Connection(Role.ACCEPTOR, server.instance, VERSION, frozenset({VERSION}),
                               set(server.wanted), limits=limits, auto_ack=False)  # fmt: skip
        self.transport: asyncio.Transport | None = None
        self.channels: dict[str, _Channel] = {}
        self.starts: dict[str, int] = {}  # stream -> next id, when the connection came
        self.peer = "?"  # the socket's address
        self.log = connection_log(log, None, "tolliver")
        self.principal = ANONYMOUS
        self.cert_name: str | None = None  # the verified client certificate's subject CN
        self.refused = False
        self._vetted_peer: uuid.UUID | None = None  # the instance UUID checked against cert_name
        self._vetted: set[tuple[str, str]] = set()  # subscriptions the ACL allowed
        self._subscriptions: set[tuple[str, str]] | None = None  # the set _vetted copies
        self._write_rights: dict[str, bool] = {}  # channel -> may send on it (a small cache)
        self.writable = asyncio.Event()  # the transport's buffer is below its high-water mark
        self.writable.set()
        self.ingest = server.hub.ingest(via="tolliver", on_pause=self._ingest_paused)
        self.pipeline = self.ingest.pipeline()
        self._paused = False
        self._quiet = False  # shutting down: never read again
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when it fires (time.monotonic())

    def __str__(self) -> str:
        """For log lines: the address, the instance and the principal."""
        return f"{self.peer} ({self.conn.peer or 'no handshake yet'}, {self.principal})"

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.log = connection_log(log, transport, "tolliver")
        self.peer = self.log.context.peer
        cert = peer_certificate(transport)
        self.cert_name = certificate_name(cert)
        self.principal = certificate_principal(cert) or ANONYMOUS
        self.log.context.principal = self.principal.name
        self.starts = {s.name: (s.latest_id or 0) + 1 for s in self.server.hub.streams()}
        self.server.links.add(self)

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        self._events()

    def eof_received(self) -> bool | None:
        self.conn.receive_data(b"")
        self._events()
        return None

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()
        self.flush()  # (arms the resend timer again)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.links.discard(self)
        peer = self.conn.peer
        if peer is not None:  # (the metrics' counter lives on across connections)
            self.server.resends[peer] = self.server.resends.get(peer, 0) + self.conn.resends
        if peer is not None and self.server.by_peer.get(peer) is self:
            del self.server.by_peer[peer]
        for channel in self.channels.values():
            channel.stop()
        if self._timer is not None:
            self._timer.cancel()

    def flush(self) -> None:
        if self.refused:
            return
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
        deadline = self.conn.next_deadline()
        if self._timer is not None and (deadline is None or deadline < self._timer_at):
            self._timer.cancel()
            self._timer = None
        if deadline is not None and self._timer is None:  # (one that fires early re-arms)
            delay = max(0.0, deadline - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._resend)
            self._timer_at = deadline

    def _resend(self) -> None:
        self._timer = None
        self.handle_timer(time.monotonic())

    def handle_timer(self, now: float) -> None:
        """Resend what is due at ``now`` (``time.monotonic()``): nothing while the remote does
        not read (its unacked messages would pile up in the buffer once a second); the timer
        is armed again when it reads (:meth:`resume_writing`)."""
        if not self.writable.is_set():
            return
        self.conn.handle_timer(now)
        self.flush()

    # ------------------------------------------------------------------ access

    def _refuse(self, reason: str) -> None:
        """A refusal (identity, ACL): logged with the principal; the connection is closed
        with nothing more sent (Tolliver has no error message outside the handshake)."""
        self.log.warning("refused: %s; closing the connection", reason)
        self.refused = True
        self.conn.data_to_send()  # (a handshake response, acks: never sent)
        if self.transport is not None:
            self.transport.close()

    def _vet(self, changed: bool = True) -> bool:
        """Whether the peer may be the instance its handshake names and hold its
        subscriptions (those not checked yet), else it is refused. ``changed=False``: only
        if a handshake request came (cheap: once per chunk received). Runs before anything
        is sent in reply."""
        conn = self.conn
        peer = conn.peer
        if peer is not None and peer != self._vetted_peer:
            if self.cert_name is not None:
                if self.cert_name.lower() != str(peer):
                    self._refuse(f"{self.principal} may not be instance {peer} (a certificate "
                                 "must name the instance UUID it is for)")  # fmt: skip
                    return False
                self.principal = Principal(f"cert:{peer}")  # the UUID's canonical text
            self._vetted_peer = peer
        subscriptions = conn.peer_subscriptions
        if self.server.access.open or not (changed or subscriptions is not self._subscriptions):
            return True
        for channel, _ in subscriptions - self._vetted:
            if not self.server.access.may(self.principal, "read", channel):
                self._refuse(self._forbidden("read", channel, "a subscription to it"))
                return False
        self._vetted = set(subscriptions)
        self._subscriptions = subscriptions  # (a handshake request makes a new set)
        return True

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

    def _events(self) -> None:
        if self.refused:
            return
        arrived: dict[str, list[Message]] = {}  # stored as one batch per channel
        acks: list[int] = []  # handled together
        everyone_writes = self.server.access.open
        while (event := self.conn.next_event()) is not None:
            if isinstance(event, Acked):  # (the hot path first)
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
                    established(self.transport)  # the handshake deadline no longer applies
                    old = self.server.by_peer.get(peer)
                    self.server.by_peer[peer] = self
                    if old is not None and old is not self and old.transport is not None:
                        old.transport.close()  # a reconnect replaces the stale connection
                case PeerSubscriptions(subscriptions):
                    if not self._vet():
                        return
                    if self.conn.established:
                        self._follow({c for c, _ in subscriptions})
                case Closed(reason, error):
                    if error:
                        self.log.warning("(%s) closing: %s", self.conn.peer or "no handshake yet",
                                         reason)  # fmt: skip
                    if self.transport is not None:
                        self.transport.close()
        if not self._vet(changed=False):  # a request answered 3 (its final is to come)
            return
        if acks:
            self._acked(acks)
        for messages in arrived.values():
            self.ingest.hold(sum(len(m.body) for m in messages))
            self.server.spawn(self._store(messages))
        self.flush()

    def _ingest_paused(self, paused: bool) -> None:
        """The ingest path's signal. Bodies on their way to the log past its bound: the socket
        is not read (the sender's resends wait in its own store, not in the hub's memory)."""
        if paused:
            if not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
        elif self._paused and not self._quiet:
            self._paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def quiesce(self) -> None:
        """Shutdown: read nothing more, ever; the messages read are still stored and acked
        while :attr:`busy` is true."""
        self._quiet = True
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    @property
    def busy(self) -> bool:
        """Messages read and not yet stored and acked."""
        return self.ingest.pending_bytes > 0 and self.transport is not None \
            and not self.transport.is_closing()

    def _follow(self, channels: set[str]) -> None:
        """Follow the streams of the channels subscribed to; stop the others. The hub itself
        subscribes to every channel a remote wants, so that instances send it their messages
        (it stores and relays them)."""
        self.server.want(channels)
        for name in list(self.channels):
            if name not in channels:
                self.channels.pop(name).stop()
        peer = self.conn.peer
        assert peer is not None
        for name in channels - set(self.channels):
            try:
                validate_stream_name(name)
            except TidewireError:
                continue  # no stream can have that name: nothing to deliver
            key = (peer, name)
            known = self.server.offsets.get(key)
            start = known or self.starts.get(name, 1)
            kept = None
            if known is None:
                # A remote's first subscription to a channel: its offset is kept at once, and
                # nothing is delivered before, so that a hub restarted (even killed) later
                # resumes it there; else it would start over where the stream then stands,
                # and what was stored while it was away would never reach it.
                self.server.offsets[key] = start
                kept = asyncio.ensure_future(self.server._keep_offset(key, start))
            self.channels[name] = _Channel(self, name, start, kept)

    def deliver(self, channel: _Channel, batches: list[Batch]) -> None:
        """The events of ``batches`` (stream ``channel.channel``) as reliable messages, those
        with a key the remote subscribed to (or all, subscribed to the channel with the empty
        key); the others are skipped."""
        if not self.conn.established:
            return
        wanted = self.conn.peer_subscriptions
        name = channel.channel
        every = (name, "") in wanted
        inflight = channel.inflight
        items: list[tuple[bytes, bytes, int]] = []
        skipped = 0
        next_id = self.server.next_message_id
        for batch in batches:
            ids = batch.ids
            for i in range(len(ids)):
                key = _utf8_key(batch.key(i))
                if not every and (name, key.decode()) not in wanted:
                    skipped += 1
                    continue
                message_id = next_id
                next_id = (next_id + 1) & 0xFFFFFFFF
                if message_id == UNRELIABLE:  # never a reliable message's id
                    message_id, next_id = next_id, next_id + 1
                inflight[message_id] = ids[i]
                items.append((key, batch.value(i), message_id))
        self.server.took_ids(next_id, len(items))
        if skipped:
            channel.sub.request(skipped)
            channel.sub.delivered -= skipped  # (the API's "delivered": what the remote got)
        if items:
            self.conn.send_many(name, items, time.monotonic())
            if skipped:  # (what was skipped is not counted as sent)
                nbytes = sum(20 + len(k) + len(v) for k, v, _ in items)
            else:
                nbytes = sum(b.nbytes for b in batches)
            self.server.hub.metrics.sent("tolliver", name, len(items), nbytes)

    def _acked(self, message_ids: list[int]) -> None:
        peer = self.conn.peer
        channels = list(self.channels.values())
        if len(channels) == 1:
            by_channel = {channels[0]: [m for m in message_ids if m in channels[0].inflight]}
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

    async def _store(self, messages: list[Message]) -> None:
        """Append to stream C (keys K) in one batch, then ack each (an ack says: durable in the
        hub)."""
        channel = messages[0].channel
        nbytes = sum(len(m.body) for m in messages)
        try:
            keys = [m.key.encode() if m.key else None for m in messages]
            try:
                batch = Batch.build(channel, [m.body for m in messages], keys=keys)
            except BaseException:
                self.ingest.release(nbytes)
                raise
            await self.pipeline.submit(batch, assign_ids=True, held=nbytes)
        except TidewireError as exc:
            self.log.warning("(%s) %d message(s) on %r refused: %s",
                             self.conn.peer or "no handshake yet",
                             len(messages), channel, exc)  # fmt: skip
            return  # not acked: the sender keeps them
        if self.conn.established and not self.conn.closed and not self.refused:
            for message in messages:
                if message.reliable:
                    self.conn.ack(message.id)
            self.flush()


def _utf8_key(key: bytes | None) -> bytes:
    """An event's key as a Tolliver key: UTF-8 ("" for none; invalid bytes replaced)."""
    if not key:
        return b""
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return key.decode("utf-8", "replace").encode()
    return key


class TolliverServer:
    def __init__(
        self,
        hub: Hub,
        settings: TolliverSettings | None = None,
        *,
        access: Access | None = None,
        admission: Admission | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.hub = hub
        self.settings = settings or TolliverSettings()
        self.access = access if access is not None else Access()
        self.listener = Listener(
            "tolliver",
            lambda: _Link(self),
            admission if admission is not None else Admission(ConnectionLimits()),
            tls=tls,
        )
        self.links: set[_Link] = set()
        self.by_peer: dict[uuid.UUID, _Link] = {}
        self.offsets: dict[tuple[uuid.UUID, str], int] = {}
        self.resends: dict[uuid.UUID, int] = {}  # by remote, over its past connections
        hub.metrics.listeners.append(self.listener)
        hub.metrics.tolliver = self.peers
        self.tasks: set[asyncio.Task[None]] = set()
        self.wanted: set[tuple[str, str]] = set()  # the hub's own subscriptions
        self._dirty: dict[tuple[uuid.UUID, str], asyncio.TimerHandle] = {}  # not yet kept
        # The ids of deliveries: one sequence for every remote and connection, never restarted
        # (reserved ahead in the state stream), so that (hub, id) names one delivery, as an
        # instance's ids do (from its database): a receiver's dedupe keys on it.
        self.next_message_id = 0
        self._ids_left = 0  # reserved (durably) and not yet taken
        self.ids_ready = asyncio.Event()  # at least MAX_UNACKED ids are reserved
        self._reserving = False
        self.instance = uuid7()
        self.state = hub.ledger(STATE_STREAM)  # the UUID, the remotes' offsets, the ids kept
        self._load()

    def peers(self) -> tuple[str, list[TolliverPeer]]:
        """The hub's instance UUID and every remote it knows: connected now, or away with
        offsets kept (the metrics and the admin API)."""
        out: dict[uuid.UUID, TolliverPeer] = {}
        for link in list(self.links):  # (until connection_lost: closed ones too, so that the
            peer = link.conn.peer  # resends counter never goes back)
            if peer is None:
                continue
            channels = tuple(sorted({c for c, _ in link.conn.peer_subscriptions}))
            out[peer] = TolliverPeer(str(peer), link.peer, link.conn.established, channels,
                                     link.conn.unacked_count,
                                     self.resends.get(peer, 0) + link.conn.resends)  # fmt: skip
        away: dict[uuid.UUID, set[str]] = {}
        for peer, channel in self.offsets:
            if peer not in out:
                away.setdefault(peer, set()).add(channel)
        for peer, names in away.items():
            out[peer] = TolliverPeer(str(peer), None, False, tuple(sorted(names)), 0,
                                     self.resends.get(peer, 0))  # fmt: skip
        return str(self.instance), sorted(out.values(), key=lambda p: p.uuid)

    def _load(self) -> None:
        """The hub's UUID and the remotes' offsets, from ``_tidewire.tolliver``."""
        found = False
        for record in self.state.load():
            if "instance" in record:
                self.instance = uuid.UUID(record["instance"])
                found = True
            elif "ids" in record:  # the last reservation: start after it
                self.next_message_id = int(record["ids"])
            else:
                key = (uuid.UUID(record["remote"]), record["channel"])
                self.offsets[key] = max(self.offsets.get(key, 0), record["next"])
        self._needs_instance = not found
        # The channels remotes followed: the hub keeps taking messages on them for remotes that
        # are away (their offsets say where they resume).
        self.wanted = {(channel, "") for _, channel in self.offsets}

    async def start(self, host: str, port: int) -> None:
        if self._needs_instance:
            await self._record({"instance": str(self.instance)})
        try:
            await self._reserve_block()
        except TidewireError as exc:  # (a full disk): the hub starts; deliveries wait
            log.warning("tolliver: delivery ids not reserved (%s): nothing is delivered "
                        "until they are", exc)  # fmt: skip
            self._reserving = True
            self.spawn(self._reserve())
        await self.listener.start(host, port)

    def took_ids(self, next_id: int, count: int) -> None:
        """Deliveries took ``count`` ids, up to ``next_id``; past half of the reserved ones,
        the next block is reserved."""
        self.next_message_id = next_id
        self._ids_left -= count
        if self._ids_left < MAX_UNACKED:  # (only while reserving fails: a full disk)
            self.ids_ready.clear()
        if self._ids_left < ID_BLOCK // 2 and not self._reserving:
            self._reserving = True
            self.spawn(self._reserve())

    async def _reserve_block(self) -> None:
        """Keep, durably, that ids up to one more block are taken; only then use them (a
        restart, even after SIGKILL, starts after the last block kept)."""
        upto = (self.next_message_id + self._ids_left + ID_BLOCK) & 0xFFFFFFFF
        await self._record({"ids": upto})
        self._ids_left += ID_BLOCK
        self.ids_ready.set()

    async def _reserve(self) -> None:
        """Reserve a block, trying again every second while the log refuses (disk full)."""
        try:
            while True:
                try:
                    await self._reserve_block()
                    return
                except TidewireError as exc:
                    log.warning("tolliver: delivery ids not reserved, trying again: %s", exc)
                    await asyncio.sleep(1.0)
        finally:
            self._reserving = False

    def want(self, channels: set[str]) -> None:
        """Subscribe the hub to ``channels`` (every key), telling every connected remote."""
        new = {(c, "") for c in channels} - self.wanted
        room = MAX_HUB_SUBSCRIPTIONS - len(self.wanted)
        if len(new) > room:  # every remote must be able to take the hub's handshake
            log.warning("tolliver: the hub follows %d channels already; not %d more",
                        len(self.wanted), len(new) - room)  # fmt: skip
            new = set(sorted(new)[: max(0, room)])
        if not new:
            return
        self.wanted |= new
        for link in list(self.links):
            for channel, key in sorted(new):
                if link.conn.established:
                    link.conn.subscribe(channel, key)
                else:
                    link.conn.subscriptions.add((channel, key))
            link.flush()

    def remember(self, peer: uuid.UUID, channel: str, next_id: int) -> None:
        """A remote's new offset for a channel: kept in the hub's stream, at most every
        ``OFFSET_INTERVAL`` seconds per remote and channel (a crash in between only means
        resending what was acked since)."""
        key = (peer, channel)
        if next_id <= self.offsets.get(key, 0):
            return
        self.offsets[key] = next_id
        if key not in self._dirty:
            self._dirty[key] = asyncio.get_running_loop().call_later(
                OFFSET_INTERVAL, self._save, key
            )

    def _save(self, key: tuple[uuid.UUID, str]) -> None:
        self._dirty.pop(key, None)
        self.spawn(self._keep_offset(key, self.offsets[key]))

    async def _keep_offset(self, key: tuple[uuid.UUID, str], next_id: int) -> None:
        peer, channel = key
        try:
            await self._record({"remote": str(peer), "channel": channel, "next": next_id})
        except TidewireError as exc:
            # (A full disk, say.) A later ack keeps a newer offset; a restart before that only
            # resends what was acked since the last offset kept.
            log.warning("tolliver: %s's offset %d on %r not kept: %s",
                        peer, next_id, channel, exc)  # fmt: skip

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background, keeping a reference until it is done."""
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _record(self, record: dict[str, object]) -> None:
        await self.state.record(record)

    @property
    def port(self) -> int:
        return self.listener.port

    def quiesce(self) -> None:
        """Stop listening and stop reading every link (see :meth:`_Link.quiesce`)."""
        self.listener.close()
        for link in self.links:
            link.quiesce()

    @property
    def busy(self) -> bool:
        return any(link.busy for link in self.links)

    async def close(self) -> None:
        self.listener.close()
        for link in list(self.links):
            if link.transport is not None:
                link.transport.close()
        await self.listener.wait_closed()
        for key, handle in list(self._dirty.items()):  # keep the offsets not yet kept
            handle.cancel()
            self._save(key)
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)


async def start_tolliver_server(
    hub: Hub,
    host: str,
    port: int,
    settings: TolliverSettings | None = None,
    *,
    access: Access | None = None,
    admission: Admission | None = None,
    tls: ssl.SSLContext | None = None,
) -> TolliverServer:
    """The hub's Tolliver instance, listening on ``host:port`` (0 = any free port).
    ``settings``: a remote's bounds (default :class:`TolliverSettings()`); ``access``: the
    ACL (default: open); ``admission``: connection limits shared with other listeners
    (default: a fresh one, default limits); ``tls``: a server context, which should require
    client certificates (default: plain TCP)."""
    server = TolliverServer(hub, settings, access=access, admission=admission, tls=tls)
    await server.start(host, port)
    return server
