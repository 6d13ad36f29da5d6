"""The Seguro listener (seed 004; default port 7403): a thin asyncio adapter between sockets, the
sans-IO :class:`~tidewire.protocols.seguro.ServerSession` and the :class:`~tidewire.hub.Hub`.

A point's events are the stream named by its ``@p`` (``~sampel-palnet``), so what a ship saves
can be tailed over RS.io and read by Spark. Per connection, one task takes the session's events
in order (a ``SAVE`` that comes while it waits is taken with no task: :meth:`_Protocol._take`):
``SAVE`` appends the event and answers ``COMMITTED`` once it is durable; ``SAVE MANY``
streams its events into the log as they arrive, in chunks of about ``commit_bytes`` with
several appends in flight (they share group commits), says ``LATEST`` as chunks become durable
and ``COMMITTED MANY`` once all are; ``READ`` reads the log in batches. Both writes go through
the hub's ingest path (:mod:`tidewire.hub.ingest`, one pipeline per connection): reading the
socket pauses while more than its ``max_pending_bytes`` (``MAX_PENDING_BYTES`` by default) wait
for the log, so a 10 GiB ``SAVE MANY`` never sits in memory.

A breach is answered the seed's way: the connection is dropped at once (and logged). Events of
a breached ``SAVE MANY`` already handed to the log are stored (the next ``WELCOME`` says how far);
those not yet handed over are discarded. One session per point: a second connection for a point
that has one is dropped after its ``POINT``, unless the one there may only read the point and
the newcomer may write it: then the writer takes the point and the reader is dropped (a
read-only principal never keeps a point from its owner). With several gateways (cluster mode)
that is per gateway; the storage's conditional own-id appends keep two ships of one point on
two gateways in order (docs/protocols/seguro.md, "Several gateways").

Memory (issue 20): each connection has a :class:`~tidewire.hub.Share` of the hub's budget. What
the session holds or was promised (:attr:`ServerSession.inbound_bytes`) is its ``"inbound"``
gauge, checked with ``try_hold`` when a header declares an event's length, before the data is
read: a declaration that does not fit is refused like a breach (the connection dropped). Bytes
already read that do not fit (a ``SAVE MANY`` streaming while the log is slow) pause reading
instead. What waits for the log is the ``"ingest"`` gauge (the ingest path keeps it); a
``READ``'s output not yet written, the ``"outbound"`` gauge while it is answered (what is left
after it drains by itself). An event begun and not finished has a deadline
(:meth:`_Protocol.receiving_since`, the guard's ``limits.message_seconds``).

Security (docs/protocols/seguro.md, "Security and limits"): the socket is a
:class:`~tidewire.server.guard.Listener`'s (TLS, connection limits, handshake and idle
deadlines; the handshake ends at ``WELCOME``). A verified client certificate names the point
its holder may be: its subject CN must be the ``@p`` of ``POINT``. The principal
(``cert:<CN>``, else ``anonymous``) needs ``read`` or ``write`` on the point's stream to be
welcomed, ``write`` to ``SAVE``/``SAVE MANY``, ``read`` to ``READ``. A refusal is logged with
the principal and the connection dropped: Seguro has no error reply.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from typing import cast

from ..hub import INGEST_DEFAULTS, Hub, abandon
from ..hub.access import ANONYMOUS, Access, certificate_name, certificate_principal
from ..hub.ingest import one_event
from ..model import Batch, TidewireError
from ..observe.logs import connection_log
from ..observe.throttle import LogThrottle
from ..protocols.seguro import (
    Breach,
    Limits,
    ManyEvent,
    ManyEvents,
    Point,
    Read,
    Refused,
    Save,
    SaveMany,
    ServerSession,
    StreamedMany,
)
from .guard import (
    Admission,
    ConnectionLimits,
    Listener,
    established,
    peer_certificate,
    refused,
)

__all__ = ["SeguroServer", "start_seguro_server"]

log = logging.getLogger("tidewire.seguro")

# Defaults of the ingest limits (settings ingest.*, tidewire.hub.INGEST_DEFAULTS["seguro"]):
CHUNK_BYTES = INGEST_DEFAULTS["seguro"].commit_bytes  # small: writes overlap the parsing
MAX_PENDING_BYTES = INGEST_DEFAULTS["seguro"].max_pending_bytes
READ_BATCH_BYTES = 1024 * 1024
WRITE_HIGH_WATER = 4 * 1024 * 1024
REFUSAL_LINES = 20  # per 10 s, every connection together; the rest counted in one line
WAIT_FOR_LOG = object()
"""(:meth:`_Protocol._event`) the declared event fits once this flow's appends are durable."""


class _Protocol(asyncio.Protocol):
    def __init__(self, server: SeguroServer) -> None:
        self.server = server
        self.hub = server.hub
        self.session = ServerSession(limits=server.limits, bulk=True)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.log = connection_log(log, None, "seguro")
        self.point: str | None = None
        self.principal = ANONYMOUS
        self.cert_name: str | None = None  # the verified client certificate's subject CN
        self._wake = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._task: asyncio.Task[None] | None = None
        self.may_write = False  # what the ACL said at POINT: a session that may write keeps it
        self.share = self.hub.budget.share(ANONYMOUS.name, "seguro")
        self.ingest = self.hub.ingest(via="seguro", on_pause=self._ingest_paused,
                                      share=self.share)  # fmt: skip
        self._since: float | None = None  # when the unfinished inbound message began
        self._starved = False  # the flow waits for the peer's bytes (not for the log)
        self.pipeline = self.ingest.pipeline()  # SAVE and SAVE MANY, in order
        self._reading = True
        self._quiet = False  # shutting down: never read again
        # A lone SAVE wakes no task (:meth:`_take`; ``_inflight`` meanwhile); other events
        # taken there are ``_handed`` to the flow's task, which waits (``_parked``) for bytes.
        self._parked = False
        self._inflight = False
        self._handed: object = None

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.log = connection_log(log, transport, "seguro")
        self.peer = self.log.context.peer
        cert = peer_certificate(transport)
        self.cert_name = certificate_name(cert)
        self.principal = certificate_principal(cert) or ANONYMOUS
        self.log.context.principal = self.ingest.principal = self.principal.name  # (the share)
        self.share.label = self.peer
        self.server.connections.add(self)
        self.session.initiate()
        self._flush()
        self._task = asyncio.create_task(self._run())

    def data_received(self, data: bytes) -> None:
        session = self.session
        session.receive_data(data)  # (a view for the call only: Listener(buffered=True))
        if self._since is None and session.receiving:
            self._since = asyncio.get_running_loop().time()
        # Bytes already here: recorded whatever the shares; past them (or past what the session
        # should hold unparsed) reading stops until the flow has parsed what it holds.
        fits = self.share.try_hold("inbound", session.inbound_bytes)
        if not fits:
            self.share.hold("inbound", session.inbound_bytes)
        if (not fits or session.buffered > MAX_PENDING_BYTES) and self._reading:
            self._pause()
        if self._inflight:
            return  # (bytes before its COMMITTED: a breach, seen once it is answered)
        if self._parked and self._reading and self._handed is None:
            self._take()
        else:
            self._wake.set()

    def eof_received(self) -> bool | None:
        self.session.receive_data(b"")
        self._wake.set()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.share.close()  # (what its appends still hold is the log's now)
        self._since = None
        if self.point is not None and self.server.points.get(self.point) is self:
            del self.server.points[self.point]
        if self._task is not None:
            self._task.cancel()  # appends handed to the log still complete
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _pause(self) -> None:
        if self.transport is not None and self._reading:
            self._reading = False
            self.transport.pause_reading()

    def quiesce(self) -> None:
        """Shutdown: read nothing more, ever (see :meth:`SeguroServer.quiesce`)."""
        self._quiet = True
        self._pause()

    @property
    def busy(self) -> bool:
        """Events read and not yet committed."""
        return (
            self.ingest.pending_bytes > 0
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def _ingest_paused(self, paused: bool) -> None:
        """The ingest path's signal: stop reading now; or room again, and the flows resume
        reading once they have taken what the session holds (:meth:`_next`)."""
        if paused:
            self._pause()
        else:
            self._wake.set()

    def _may_resume(self) -> None:
        """The flow has parsed what the session holds: read again, unless the ingest path
        said to pause, or what this connection has waiting for the log is over its share of
        the budget (its appends complete and wake the flow, which then asks again)."""
        if self._reading or self.ingest.paused:
            return
        if self.ingest.pending_bytes and not self.share.available():
            return
        self._resume()

    def _resume(self) -> None:
        if self._quiet:
            return
        if self.transport is not None and not self._reading and not self.transport.is_closing():
            self._reading = True
            self.transport.resume_reading()

    def _flush(self) -> None:
        data = self.session.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def receiving_since(self) -> float | None:
        """(:class:`~tidewire.server.guard.Receiving`) ``loop.time()`` when the inbound message
        the flow is waiting for began (a ``SAVE`` or ``EVENT`` whose data has not all come, a
        line without its newline), or when the last whole one before it was parsed; ``None``
        when nothing is unfinished, or while the hub is the one that keeps it waiting (the flow
        waits for the log, or reading is paused)."""
        if not self._starved or not self._reading or self.session.closed:
            return None
        return self._since

    def _event(self, *, may_wait: bool = False) -> object:
        """The session's next event (``None``: it needs more bytes), with the bookkeeping
        every flow needs: the ``"inbound"`` gauge, and the unfinished message's start. A
        declared event that does not fit the budget becomes the session's :class:`Breach`;
        unless ``may_wait`` (this flow's own appends are on their way to the log, and will
        free their bytes): then :data:`WAIT_FOR_LOG`, and the flow asks again once they are
        durable."""
        session = self.session
        event = session.next_event()
        self._starved = event is None
        if event is not None or not session.receiving:
            self._since = asyncio.get_running_loop().time() if session.receiving else None
        if event is not None or session.awaiting_data is None or session.closed:
            self.share.hold("inbound", session.inbound_bytes)  # (lower: parsed, handed out)
            return event
        if self.share.try_hold("inbound", session.inbound_bytes):
            return None
        if may_wait:
            self._starved = False  # (the hub keeps it waiting, not the peer)
            return WAIT_FOR_LOG
        session.breach(f"an event of {session.awaiting_data} bytes does not fit the memory "
                       f"budget ({self.share.available()} bytes left for this "
                       "connection)")  # fmt: skip
        return session.next_event()

    def drop(self, reason: str, *, refusal: bool = True) -> None:
        """Abort the connection, logged. ``refusal``: the peer's doing (a breach, a refusal,
        a point taken): logged through the server's :class:`LogThrottle`, since a peer that
        reconnects in a loop must not write a line each time; else (the hub failed, a point
        taken by its writer) always logged."""
        text = f"({self.point or 'no point yet'}) dropping the connection: {reason}"
        if refusal:
            self.server.refusals_log.log(self.log, logging.WARNING, text)
            refused(self.transport)  # (the abort lingers: guard)
        else:
            self.log.warning(text)
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------------ the session's flows

    async def _next(self) -> object:
        while True:
            handed, self._handed = self._handed, None
            if handed is not None:
                return handed
            if not self._inflight:  # (else the SAVE's callback wakes the task once answered)
                event = self._event()
                if event is not None:
                    return event
                if self.session.closed:
                    return None
                self._may_resume()
            self._wake.clear()
            self._parked = True  # (cancelled only when the connection is gone)
            await self._wake.wait()
            self._parked = False

    def _take(self) -> None:
        """The flow's task waits for bytes and some came: take the next event on the read's
        callback. A ``SAVE`` goes to the log at once and is answered from its append's callback
        (:meth:`_saved`): no task wakes, no turn of the loop passes before the log has it
        (benchmarks/README.md, "Issue 22, round 3"). Anything else, and a ``SAVE`` the log
        cannot queue at once, goes to the task, as every event did before."""
        event = self._event()
        if event is None:
            return self._wake.set() if self.session.closed else None
        if type(event) is not Save or not self._start_save(event):
            self._handed = event
            self._wake.set()

    def _start_save(self, save: Save) -> bool:
        """``save`` to the log with no task (``Pipeline.begin``); False: the task's way."""
        data = save.data
        try:
            appended = self.pipeline.begin(one_event(self.point or "", save.id, data),
                                           held=len(data))  # fmt: skip
        except TidewireError as exc:  # (the log's checks, raised at once)
            self.drop(f"the hub failed: {exc}", refusal=False)
            return True
        if appended is None:
            return False
        self.ingest.hold(len(data))  # (released by the pipeline's callback, which runs first)
        self._inflight = True
        appended.add_done_callback(self._saved)
        return True

    def _saved(self, appended: asyncio.Future[Batch]) -> None:
        """A ``SAVE`` of :meth:`_take` is durable (or failed): as :meth:`_save` ends it."""
        self._inflight = False
        if self.transport is None or self.transport.is_closing():
            return  # (the connection went: the append completed all the same)
        failure = "cancelled" if appended.cancelled() else appended.exception()
        if failure is not None:
            return self.drop(f"the hub failed: {failure}", refusal=False)
        if not self.session.closed and self._waited("COMMITTED"):
            self.session.committed()
            self._flush()
        if self.session.buffered or self.session.closed or not self._reading:
            self._wake.set()  # (a breach to drop for, or reading to resume)

    async def _run(self) -> None:
        try:
            while (event := await self._next()) is not None:
                match event:
                    case Point(point):
                        await self._point(point)
                    case Save(event_id, data):
                        await self._save(event_id, data)
                    case SaveMany():
                        await self._save_many(event)
                    case Read(start, limit):
                        await self._read(start, limit)
                    case Breach(reason):
                        self.drop(f"protocol breach: {reason}")
                        return
                    case Refused(command):
                        action = "read" if command == "READ" else "write"
                        self.drop(f"refused: {self.principal} may not {action} stream "
                                  f"{self.point!r} ({command})")  # fmt: skip
                        return
                    case _:  # Hello: the session queued IDENTIFY
                        self._waited("IDENTIFY")
                self._flush()
        except asyncio.CancelledError:
            raise
        except TidewireError as exc:
            self.drop(f"the hub failed: {exc}", refusal=False)

    async def _point(self, point: str) -> None:
        if self.cert_name is not None and self.cert_name != point:
            self.drop(f"refused: {self.principal} may not be point {point} (a certificate "
                      "must name the point it is for)")  # fmt: skip
            return
        access = self.server.access
        may_read = access.may(self.principal, "read", point)
        may_write = access.may(self.principal, "write", point)
        if not (may_read or may_write):
            self.drop(f"refused: {self.principal} may neither read nor write stream {point!r}")
            return
        other = self.server.points.get(point)
        if other is not None:
            if not may_write or other.may_write:
                self.drop(f"point {point} already has a session ({other.peer})")
                return
            # A session that may only read holds the point until one that may write comes:
            # a read-only principal never keeps a point from its owner (issue 20).
            other.drop(f"{self.principal}, which may write stream {point!r}, takes the point "
                       f"from this session of {other.principal}, which may only read it "
                       f"({self.peer})", refusal=False)  # fmt: skip
        self.point = point
        self.may_write = may_write
        self.server.points[point] = self
        # Appends of an earlier session of this point (its connection dropped mid-SAVE MANY)
        # may still be on their way to disk: WELCOME says how far they got, not less (and not
        # more: they may yet be refused, on a full disk).
        latest = await self.hub.settled(point)
        if self._waited("WELCOME"):
            self.session.welcome(latest or None, may_read=may_read, may_write=may_write)
            established(self.transport)  # the handshake deadline no longer applies

    def _waited(self, reply: str) -> bool:
        """The ship must wait for ``reply`` before saying more: bytes already here were sent
        before it (the reply is not sent yet), a breach. Drops the connection if so."""
        if self.session.buffered:  # (the run loop then meets the Breach and drops the connection)
            self.session.breach(f"a command before the {reply} it had to wait for")
            return False
        return True

    async def _save(self, event_id: int, data: bytes) -> None:
        assert self.point is not None
        batch = one_event(self.point, event_id, data)
        self.ingest.hold(len(data))
        await self.pipeline.append(batch, held=len(data))
        if self._waited("COMMITTED"):
            self.session.committed()

    async def _save_many(self, many: SaveMany) -> None:
        """Stream the events into the log as they arrive (chunks, appends in flight, in
        order); LATEST as chunks become durable; COMMITTED MANY when all are."""
        assert self.point is not None
        receipts: deque[tuple[asyncio.Future[Batch], int]] = deque()
        ids: list[int] = []
        values: list[bytes] = []
        size = 0  # held, not yet shipped
        limits = self.ingest.limits

        def ship() -> None:
            nonlocal ids, values, size
            batch = Batch.build(self.point or "", values, ids=ids)
            receipt = self.pipeline.submit(batch, held=size)
            receipt.add_done_callback(lambda _: self._wake.set())
            receipts.append((receipt, ids[-1]))
            ids, values, size = [], [], 0

        async def settle(block: bool, flush: bool = True) -> None:
            said = False
            try:
                while receipts and (block or receipts[0][0].done()):
                    receipt, last = receipts[0]
                    await receipt
                    receipts.popleft()
                    self.session.latest_committed(last)
                    said = True
            except BaseException:
                if said:  # (what is durable is said before the failure drops the connection)
                    self._flush()
                raise
            # One send for the LATESTs of the appends that became durable together (one
            # round usually makes all of a flow's appends durable at once): each send on
            # loopback also wakes the ship, for nothing until the last (benchmarks/README.md,
            # "Profile (round 2)"). ``flush=False``: the caller sends them with what follows.
            if said and flush:
                self._flush()

        try:
            done = False
            while not done:
                await settle(block=len(receipts) >= limits.appends_in_flight)
                event = self._event(may_wait=bool(receipts or values))
                if event is WAIT_FOR_LOG:
                    if values:
                        ship()
                    await settle(block=True)
                    continue
                if event is None:
                    if self.session.closed:
                        return
                    if values and not receipts:
                        ship()  # nothing in flight: do not hold what has arrived
                        continue
                    self._may_resume()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                match event:
                    case ManyEvents(run_ids, datas):
                        nbytes = sum(map(len, datas))
                        self.ingest.hold(nbytes)
                        ids += run_ids
                        values += datas
                        size += nbytes
                        if size >= limits.commit_bytes:
                            ship()
                    case ManyEvent(event_id, data):
                        self.ingest.hold(len(data))
                        ids.append(event_id)
                        values.append(data)
                        size += len(data)
                        if size >= limits.commit_bytes:
                            ship()
                    case StreamedMany():
                        done = True
                    case Breach(reason):
                        self.drop(f"protocol breach during SAVE MANY {many.count} {many.start} "
                                  f"{many.end}: {reason}")  # fmt: skip
                        return
            if values:
                ship()
            await settle(block=True, flush=False)  # (sent with COMMITTED MANY, by _run)
        finally:
            self.ingest.release(size)  # (a breach: what was not handed over is discarded)
            for receipt, _ in receipts:  # (stored all the same; the next WELCOME says so)
                abandon(receipt)
        if self._waited("COMMITTED MANY"):
            self.session.committed_many()

    async def _read(self, start: int, limit: int) -> None:
        assert self.point is not None
        next_id, left = start, limit
        try:
            while left > 0 and self.hub.has_stream(self.point):
                first = max(next_id, self.hub.start_id(self.point))  # "or the first above it"
                batches = await self.hub.read(self.point, first, READ_BATCH_BYTES, left,
                                              via="seguro")  # fmt: skip
                if not batches:
                    break
                for batch in batches:
                    for i in range(len(batch)):
                        self.session.send_event(batch.ids[i], batch.value(i))
                    left -= len(batch)
                    next_id = batch.last_id + 1
                self._flush()
                if self.transport is not None:  # (already in memory: recorded, not refused)
                    self.share.hold("outbound", self.transport.get_write_buffer_size())
                await self._writable.wait()
        finally:
            self.share.release("outbound")
        if self._waited("SENT"):
            self.session.sent()


class SeguroServer:
    """The listener, its connections, and the points that have a session."""

    def __init__(
        self,
        hub: Hub,
        limits: Limits | None = None,
        *,
        access: Access | None = None,
        admission: Admission | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.hub = hub
        self.limits = limits or Limits()
        self.access = access if access is not None else Access()
        self.connections: set[_Protocol] = set()
        self.points: dict[str, _Protocol] = {}
        self.refusals_log = LogThrottle(burst=REFUSAL_LINES, interval=10.0)
        """Drop lines of refusals and breaches: ``REFUSAL_LINES`` per 10 s, then one line
        counting the rest (issue 20: a peer refused in a loop must not flood the log)."""
        self.listener = Listener(
            "seguro",
            lambda: _Protocol(self),
            admission if admission is not None else Admission(ConnectionLimits()),
            tls=tls,
            # Reads land in the listener's reused buffer: the session's streaming receive
            # buffer copies each into its store (as it copied each new bytes before).
            buffered=True,
        )
        hub.metrics.listeners.append(self.listener)

    @property
    def port(self) -> int:
        return self.listener.port

    def quiesce(self) -> None:
        """Stop listening and stop reading every connection: the flows already read finish
        (their ``COMMITTED`` goes out) while :attr:`busy` is true."""
        self.listener.close()
        for protocol in self.connections:
            protocol.quiesce()

    @property
    def busy(self) -> bool:
        return any(protocol.busy for protocol in self.connections)

    async def close(self) -> None:
        self.listener.close()
        for protocol in list(self.connections):
            if protocol.transport is not None:
                protocol.transport.close()
        await self.listener.wait_closed()


async def start_seguro_server(
    hub: Hub,
    host: str,
    port: int,
    limits: Limits | None = None,
    *,
    access: Access | None = None,
    admission: Admission | None = None,
    tls: ssl.SSLContext | None = None,
) -> SeguroServer:
    """Listen for Seguro on ``host:port`` (0 = any free port). ``access``: the ACL (default:
    open); ``admission``: connection limits shared with other listeners (default: a fresh
    one, default limits); ``tls``: a server context (default: plain TCP)."""
    server = SeguroServer(hub, limits, access=access, admission=admission, tls=tls)
    await server.listener.start(host, port)
    return server
