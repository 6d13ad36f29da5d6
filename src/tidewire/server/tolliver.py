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
  They are also resent while the connection lasts (the sans-IO machine's timer): after 1 s,
  then each wait twice the last, at most ``RESEND_MAX_INTERVAL``; what awaits acks is at most
  ``tolliver.max_unacked_bytes`` (and the connection's share of the memory budget).
* The hub subscribes to every channel (all keys) that a remote follows (connected, or away with
  its offset kept), so instances send it their messages on those channels, at most
  ``tolliver.max_channels`` of them (the handshake every remote must take); a channel no remote
  follows any more is unsubscribed. A remote's offsets are kept for the channels it follows
  (one it stops following is forgotten) and for ``tolliver.remote_retention_seconds`` after it
  was last seen.
* A new connection from a UUID that has one replaces the old one.
* A remote never gets its own messages back (no echo), and :meth:`TolliverServer.connect`
  dials another hub; two hubs linked so relay nothing in a loop (docs/protocols/tolliver.md,
  "Echo and loops").

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
one pipeline per link): acks go out in the order the messages came. With an ACL and no TLS
every connection is refused unless ``tolliver.allow_plaintext`` (a UUID over plain TCP proves
nothing); each connection's frames, bodies on their way to the log and unacked deliveries are
charged to its share of the hub's memory budget (docs/protocols/tolliver.md, "Identity",
"Memory and deadlines").
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from ..hub import INGEST_DEFAULTS, Hub
from ..hub.access import Access
from ..model import Batch, TidewireError
from ..observe.metrics import TolliverPeer
from ..observe.throttle import LogThrottle
from ..protocols.tolliver import Message, Role
from ..tolliver.store import uuid7
from .guard import Admission, ConnectionLimits, Listener
from .tolliver_delivery import BODY, KEY, reliable_ids
from .tolliver_ledger import GroupedRecords
from .tolliver_link import HubLink
from .tolliver_list import HubList
from .tolliver_offsets import RemoteOffsets
from .tolliver_origins import Origins
from .tolliver_state import ID_BLOCK, ID_MASK, SharedState

__all__ = ["TolliverServer", "TolliverSettings", "start_tolliver_server"]

log = logging.getLogger("tidewire.tolliver")

STATE_STREAM = "_tidewire.tolliver"
OFFSET_INTERVAL = 0.1  # seconds between records of one remote's offset for one channel
MAX_HUB_SUBSCRIPTIONS = 65536  # what a remote's decoder takes in a handshake (Limits)
MAX_COUNTED = 4096  # remotes whose resends are counted past their connections, at least
OFFSETS_PER_CHANNEL = 4  # offsets kept: at most max_channels times this (RemoteOffsets)
MAX_PENDING_BYTES = INGEST_DEFAULTS["tolliver"].max_pending_bytes  # per remote, not yet stored


@dataclass(frozen=True, slots=True)
class TolliverSettings:
    """A remote's bounds (settings ``tolliver.*``): a message body at most
    ``max_message_bytes``; at most ``max_subscriptions`` held at once (handshake entries and
    later subscribes together); over either, the connection is closed. Deliveries awaiting
    its acks at most ``max_unacked_bytes`` (then nothing new goes out until acks free room).
    The hub's own subscriptions (told to every remote) at most ``max_channels`` (a remote's
    decoder takes at most ``MAX_HUB_SUBSCRIPTIONS``); a remote's offsets are forgotten
    ``remote_retention_seconds`` after it was last seen. With an ACL and no TLS every
    connection is refused unless ``allow_plaintext``."""

    max_message_bytes: int = 16 * 1024 * 1024
    max_subscriptions: int = 1024
    max_channels: int = 16384
    max_unacked_bytes: int = 32 * 1024 * 1024
    remote_retention_seconds: float = 30 * 86400.0
    allow_plaintext: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.max_message_bytes <= 2**32 - 1 or self.max_subscriptions < 0:
            raise ValueError("max_message_bytes is a u32 and max_subscriptions >= 0")
        if not 0 < self.max_channels <= MAX_HUB_SUBSCRIPTIONS:
            raise ValueError(f"max_channels is 1..{MAX_HUB_SUBSCRIPTIONS}")
        if self.max_unacked_bytes <= 0 or self.remote_retention_seconds <= 0:
            raise ValueError("max_unacked_bytes and remote_retention_seconds are > 0")


class _Link(HubLink):
    """A :class:`HubLink` with the hub's ingest: what the remote sends is stored in the
    stream of its channel, then acked; past ``MAX_PENDING_BYTES`` waiting for the log the
    socket is not read. Nor while the link's principal is over its fair share of a contended
    loop (:mod:`tidewire.hub.fairness`: the time its input takes is charged)."""

    def __init__(self, server: TolliverServer, role: Role = Role.ACCEPTOR) -> None:
        super().__init__(server, role)
        self.ingest = server.hub.ingest(via="tolliver", on_pause=self._ingest_paused)
        self.pipeline = self.ingest.pipeline()
        self._paused = False
        self._quiet = False  # shutting down: never read again
        self._caught_up = False  # (with the other gateways' records of this remote)

    def _fair(self, waiting: bool) -> None:
        if not self._paused:  # (else the ingest's resume sees to it)
            super()._fair(waiting)

    def _hold(self, nbytes: int) -> None:
        """Bodies on their way to the log (the ingest path counts them; so does the share)."""
        self.ingest.hold(nbytes)
        self.share.hold("ingest", self.ingest.pending_bytes)

    def receiving_since(self) -> float | None:
        """As :meth:`HubLink.receiving_since`, but ``None`` while the hub does not read the
        socket (the log is behind): that wait is the hub's, not the remote's."""
        return None if self._paused else super().receiving_since()

    def _ingest_paused(self, paused: bool) -> None:
        """The ingest path's signal. Bodies on their way to the log past its bound: the socket
        is not read (the sender's resends wait in its own store, not in the hub's memory)."""
        if paused:
            if not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
        elif self._paused and not self._quiet:
            self._paused = False
            self.reading_resumed()
            transport = self.transport
            if transport is not None and not transport.is_closing() and not self.throttle.waiting:
                transport.resume_reading()

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

    async def _make_deliveries(self, peer: uuid.UUID) -> None:
        """First, once per connection, fold in what other gateways recorded (tolliver_state):
        a remote that moved here resumes where their recorded acks left it."""
        if not self._caught_up:
            self._caught_up = True
            try:
                await self.server.catch_up(peer, self.channels.keys() | self._to_follow.keys())
            except TidewireError as exc:
                self.log.warning("(%s) other gateways' offsets not caught up: %s", peer, exc)
            finally:
                self.server.joining.discard(peer)
        await super()._make_deliveries(peer)

    def _follow(self, channels: set[str]) -> None:
        """As :meth:`HubLink._follow`; the first time, the remote is :attr:`SharedState.
        joining` until its catch-up is done (its records are folded meanwhile, whoever
        catches up: the state stream's follower may read them first)."""
        if not self._caught_up and self.conn.peer is not None:
            self.server.joining.add(self.conn.peer)
        super()._follow(channels)

    async def _store(self, messages: list[Message]) -> None:
        """Append to stream C (keys K) in one batch through the ingest path (acks in the order
        the messages came), then ack each (an ack says: durable in the hub)."""
        channel = messages[0].channel
        nbytes = sum(map(len, map(BODY, messages)))
        try:
            keys = [m.key.encode() or None for m in messages] if any(map(KEY, messages)) else None
            try:  # (no key at all, the common case: no list of None per message)
                batch = Batch.build(channel, list(map(BODY, messages)), keys=keys)
            except BaseException:
                self.ingest.release(nbytes)
                raise
            try:
                stored = await self.pipeline.append(batch, assign_ids=True, held=nbytes)
            finally:
                self.share.hold("ingest", self.ingest.pending_bytes)
            self._came(channel, stored)
        except TidewireError as exc:
            self.log.warning("(%s) %d message(s) on %r refused: %s",
                             self.conn.peer or "no handshake yet",
                             len(messages), channel, exc)  # fmt: skip
            return  # not acked: the sender keeps them
        if self.conn.established and not self.conn.closed and not self.refused:
            self.conn.ack_many(reliable_ids(messages))  # (one write)
            self.flush()


class TolliverServer(SharedState):
    def __init__(
        self,
        hub: Hub,
        settings: TolliverSettings | None = None,
        *,
        access: Access | None = None,
        admission: Admission | None = None,
        tls: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: the time base of resends (seconds; tests give a fake one and call a
        link's ``handle_timer``); ``wall``: the time kept with a remote's offsets (seconds
        since the epoch, for ``remote_retention_seconds`` across restarts)."""
        self.hub = hub
        self.clock = clock
        self.wall = wall
        self.settings = settings or TolliverSettings()
        self.access = access if access is not None else Access()
        # with an ACL, a remote without TLS is anonymous and its UUID proves nothing: refused
        # unless the operator says otherwise (docs/protocols/tolliver.md, "Identity")
        self.plaintext_refused = (tls is None and not self.access.open
                                  and not self.settings.allow_plaintext)  # fmt: skip
        self.refusals = LogThrottle(clock=clock)  # refusals' log lines, rate-limited
        self.listener = Listener(
            "tolliver",
            lambda: _Link(self),
            admission if admission is not None else Admission(ConnectionLimits()),
            tls=tls,
        )
        self.links: set[HubLink] = set()
        self.by_peer: dict[uuid.UUID, HubLink] = {}
        self.joining: set[uuid.UUID] = set()  # (tolliver_state: connected, not caught up)
        self.resends: dict[uuid.UUID, int] = {}  # by remote, over its past connections
        self.origins = Origins()  # which events came from which remote: never echoed to it
        hub.metrics.listeners.append(self.listener)
        hub.metrics.tolliver = self.peers
        self.tasks: set[asyncio.Task[None]] = set()
        self.listed = HubList(self.settings.max_channels, self.links, self.access,
                              self.refusals)  # fmt: skip
        self.wanted = self.listed.wanted  # the hub's own subscriptions
        self.kept = RemoteOffsets(self.settings.max_subscriptions,
                                  self.settings.max_channels * OFFSETS_PER_CHANNEL,
                                  self.settings.remote_retention_seconds)  # fmt: skip
        self.offsets = self.kept.next  # (remote, channel) -> next event id it gets
        self._stale: list[tuple[uuid.UUID, str]] = []  # offsets dropped at load: to record
        self._dirty: dict[tuple[uuid.UUID, str], asyncio.TimerHandle] = {}  # not yet kept
        # The ids of deliveries: one sequence for every remote and connection, never restarted
        # (reserved ahead in the state stream), so that (hub, id) names one delivery, as an
        # instance's ids do (from its database): a receiver's dedupe keys on it.
        self.next_message_id = 0
        self._ids_left = 0  # reserved (durably) and not yet taken
        self._spare: int | None = None  # (tolliver_state: blocks with several gateways)
        self._upto = 0
        self.ids_ready = asyncio.Event()  # at least MAX_UNACKED ids are reserved
        self._reserving = False
        self._follower: asyncio.Task[None] | None = None  # (follow_ledger)
        self.instance = uuid7()
        self.state = hub.ledger(STATE_STREAM)  # the UUID, the remotes' offsets, the ids kept
        self.records = GroupedRecords(self.state)  # (appended in groups: one per loop turn)
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
        """The hub's UUID, the ids reserved and the remotes' offsets, from
        ``_tidewire.tolliver`` (:class:`RemoteOffsets`: those past the retention or the
        bounds are dropped, and recorded so at :meth:`start`); the hub's list is rebuilt
        within ``max_channels``."""
        found = False
        remotes = []
        for record in self.state.load():
            if "instance" in record:
                if not found:  # (the first recorded wins: tolliver_state)
                    self.instance = uuid.UUID(record["instance"])
                found = True
            elif "ids" in record:  # the last reservation: start after it
                self.next_message_id = self._upto = int(record["ids"]) & ID_MASK
            elif "remote" in record:
                remotes.append(record)
        self._needs_instance = not found
        self._stale = self.kept.load(remotes, self.wall())
        # The channels remotes followed: the hub keeps taking messages on them for remotes that
        # are away (their offsets say where they resume); within max_channels.
        for channel in sorted(self.kept.refs)[: self.settings.max_channels]:
            self.wanted.add((channel, ""))  # (no remote is connected yet: none to tell)

    async def start(self, host: str, port: int) -> None:
        await self.claim_instance()
        for peer, channel in self._stale:  # (else a later record of the remote revives them)
            self._record_later({"remote": str(peer), "channel": channel, "drop": True})
        self._stale.clear()
        await self.records.wait()
        if self.plaintext_refused:
            log.error("tolliver: an ACL is configured and the Tolliver listener has no TLS: "
                      "every connection to it is refused (a remote's instance UUID would prove "
                      "nothing); set tls.cert_file and tls.ca_file, or tolliver.allow_plaintext "
                      "= true to let remotes in as 'anonymous'")  # fmt: skip
        try:
            await self.reserve_block()
        except TidewireError as exc:  # (a full disk): the hub starts; deliveries wait
            log.warning("tolliver: delivery ids not reserved (%s): nothing is delivered "
                        "until they are", exc)  # fmt: skip
            self._reserving = True
            self.spawn(self._reserve())
        self._follower = asyncio.create_task(self.follow_ledger())
        await self.listener.start(host, port)

    async def connect(
        self,
        host: str,
        port: int,
        channels: Iterable[str] = (),
        *,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> uuid.UUID:
        """Dial another Tolliver instance (another hub, say) and complete the handshake; its
        UUID. The hub first subscribes to ``channels`` (every key; see :meth:`want`), so the
        remote sends it its messages on them, and it delivers to the remote the streams the
        remote subscribes to, as for a remote that dialed the hub. The remote is the
        operator's choice: no certificate or ACL check. ``tls``: a client context (the
        remote's certificate is verified against its CAs and ``server_hostname``, default
        ``host``). One try (bound it with
        ``asyncio.timeout``): a lost connection is not made again. :class:`~tidewire.
        tolliver.HandshakeFailed` if the remote's handshake said no, ``OSError`` if it could
        not be reached. Two hubs are linked by one connection, dialed by either: a message
        is never delivered back to the instance it came from, so they relay nothing in a
        loop (docs/protocols/tolliver.md, "Echo and loops")."""
        self.want(set(channels))
        loop = asyncio.get_running_loop()
        _, link = await loop.create_connection(
            lambda: _Link(self, Role.CONNECTOR), host, port, ssl=tls,
            server_hostname=(server_hostname or host) if tls is not None else None,
        )  # fmt: skip
        try:
            return await link.ready
        except BaseException:
            if link.transport is not None:
                link.transport.abort()
            raise

    def took_ids(self, next_id: int, count: int) -> None:
        """Deliveries took ``count`` ids, up to ``next_id``; past half of the reserved ones,
        the next block is reserved."""
        self._ids_left -= (next_id - self.next_message_id) & ID_MASK  # (UNRELIABLE skipped too)
        self.next_message_id = next_id
        if not self._switch():  # (only while reserving fails: a full disk)
            self.ids_ready.clear()
        if self._ids_left < ID_BLOCK // 2 and not self._reserving and self._spare is None:
            self._reserving = True
            self.spawn(self._reserve())

    async def _reserve(self) -> None:
        """Reserve a block, trying again every second while the log refuses (disk full)."""
        try:
            while True:
                try:
                    await self.reserve_block()
                    return
                except TidewireError as exc:
                    log.warning("tolliver: delivery ids not reserved, trying again: %s", exc)
                    await asyncio.sleep(1.0)
        finally:
            self._reserving = False

    def want(self, channels: set[str]) -> None:
        """Subscribe the hub to ``channels`` (every key) for as long as it runs (the
        operator's choice: :meth:`connect`), telling every connected remote."""
        self.listed.pin(channels)

    # ------------------------------------------------------------------ remotes' offsets

    def follows(self, peer: uuid.UUID, channels: set[str]) -> None:
        """``peer`` follows ``channels`` now (stream names, at most ``max_subscriptions``): its
        offsets on others are forgotten, and the hub lists those it has offsets on (within
        ``max_channels``; the others with their first offsets, :meth:`first_offsets`)."""
        now = self.wall()
        self._forget(self.kept.unfollowed(peer, channels) + self.kept.expired(now, self.by_peer))
        if channels:
            self.kept.seen[peer] = now
        # Listed now, before the handshake is answered, not when its first offsets are kept
        # (after a catch-up, later): a sender whose handshake comes meanwhile would get a list
        # without them and keep what it sends on them for nobody (lost). One it stops
        # following before its offset is kept is unlisted again (unlist).
        self.listed.add(channels)

    def unlist(self, channels: Iterable[str]) -> None:
        """A remote no longer follows ``channels``, listed for it by :meth:`follows` though
        its offsets on them were never kept: unlisted, unless a remote has an offset on one
        or another connected remote follows it (so nothing is left behind)."""
        self.listed.remove([c for c in channels if c not in self.kept.refs
                            and not any(link.follows(c) for link in self.links)])  # fmt: skip

    def first_offsets(self, keys: list[tuple[tuple[uuid.UUID, str], int]]
                      ) -> asyncio.Future[None]:  # fmt: skip
        """A remote's first offsets on channels (``(key, start)``), on their way to the
        ledger, in one group (delivery waits for it: a hub restarted, even killed, later
        resumes the remote there); the future never fails (a failure is logged)."""
        for key, start in keys:
            self.kept.add(key, start)
        self.listed.add(key[1] for key, _ in keys)
        self._forget(self.kept.excess(self.by_peer))
        now = self.wall()
        done = None
        for (peer, channel), start in keys:
            done = self.records.add({"remote": str(peer), "channel": channel, "next": start,
                                     "at": now})  # fmt: skip
        kept: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle(group: asyncio.Future[None]) -> None:
            if not group.cancelled() and (exc := group.exception()) is not None:
                log.warning("tolliver: %d first offset(s) not kept: %s", len(keys), exc)
            if not kept.done():
                kept.set_result(None)

        if done is None:
            kept.set_result(None)
        else:
            done.add_done_callback(settle)
        return kept

    def _forget(self, keys: list[tuple[uuid.UUID, str]]) -> None:
        """Forget remotes' offsets on channels, in the ledger too; a channel no remote follows
        any more leaves the hub's list (told to the remotes at once, for all of them)."""
        unlisted = []
        for key in keys:
            if key not in self.kept.next:
                continue
            handle = self._dirty.pop(key, None)
            if handle is not None:
                handle.cancel()
            self.origins.forget(*key)
            if self.kept.forget(key):
                unlisted.append(key[1])
            self._record_later({"remote": str(key[0]), "channel": key[1], "drop": True})
        self.listed.remove(unlisted)

    def count_resends(self, peer: uuid.UUID, resends: int) -> None:
        """Add a closed connection's resends to ``peer``'s count (the metrics'). Kept for the
        remotes the hub remembers (connected, or with offsets): past ``MAX_COUNTED`` remotes,
        the others' are dropped (remotes passing by with new UUIDs leave nothing behind)."""
        self.resends[peer] = self.resends.get(peer, 0) + resends
        if len(self.resends) > MAX_COUNTED:
            for other in list(self.resends):
                if other not in self.by_peer and other not in self.kept.by_remote:
                    del self.resends[other]

    def left(self, peer: uuid.UUID) -> None:
        """``peer``'s connection ended: when it was last seen is kept (its retention runs
        from then)."""
        self.joining.discard(peer)
        if peer in self.kept.by_remote:
            self.kept.seen[peer] = now = self.wall()
            self._record_later({"remote": str(peer), "at": now})

    def _record_later(self, record: dict[str, object]) -> None:
        """Queue ``record``; a failure is logged (a full disk: the next load may revive an
        offset dropped, or forget a remote's last visit sooner)."""

        def settle(group: asyncio.Future[None]) -> None:
            if not group.cancelled() and (exc := group.exception()) is not None:
                log.warning("tolliver: %s not kept: %s", record, exc)

        self.records.add(record).add_done_callback(settle)

    def remember(self, peer: uuid.UUID, channel: str, next_id: int) -> None:
        """A remote's new offset for a channel: kept in the hub's stream, at most every
        ``OFFSET_INTERVAL`` seconds per remote and channel (a crash in between only means
        resending what was acked since)."""
        key = (peer, channel)
        if key not in self.offsets or next_id <= self.offsets[key]:
            return  # (forgotten: the remote stopped following the channel)
        self.offsets[key] = next_id
        self.origins.passed(peer, channel, next_id)
        if key not in self._dirty:
            self._dirty[key] = asyncio.get_running_loop().call_later(
                OFFSET_INTERVAL, self._save, key
            )

    def _save(self, key: tuple[uuid.UUID, str]) -> None:
        self._dirty.pop(key, None)
        if key in self.offsets:
            self.spawn(self._keep_offset(key, self.offsets[key]))

    async def _keep_offset(self, key: tuple[uuid.UUID, str], next_id: int) -> None:
        peer, channel = key
        try:
            await self._record({"remote": str(peer), "channel": channel, "next": next_id,
                                "at": self.wall()})  # fmt: skip
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
        await self.records.add(record)

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
        self.listed.close()
        for link in list(self.links):
            if link.transport is not None:
                link.transport.close()
        await self.listener.wait_closed()
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)
        for key, handle in list(self._dirty.items()):  # keep the offsets not yet kept
            handle.cancel()
            self._save(key)
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.records.wait()


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
