"""The RS.io-over-TCP listener: a thin asyncio adapter between sockets, the sans-IO
:class:`~tidewire.protocols.rsio.Connection` and the :class:`~tidewire.hub.Hub`.

Per connection: bytes read go into the connection machine; its events become hub calls; each
subscription the peer makes is pumped by one task that waits for the hub subscription's next
delivery (which honours the peer's demand) and encodes it. Output is flow-controlled: while the
transport's write buffer is above its high-water mark, pumps wait, so a slow reader holds a
bounded buffer and a position in the log, never a backlog in memory.

Publishing (extension 1): for each ``offer`` the hub subscribes to the client's publisher with
subscriber id = the offer id and a window of ``OFFER_WINDOW`` elements. What arrives is
gathered per offer; one committer task per offer hands everything gathered so far to the hub's
ingest path (:mod:`tidewire.hub.ingest`, one pipeline per offer) as one batch (so the log's
group commit sees big batches), then sends ``committed`` and requests as many elements as it
has just stored: the disk drives the backpressure. Bytes received and not yet committed are
bounded per connection (the ingest's ``max_pending_bytes``, ``MAX_INLET_BYTES`` by default):
above it the adapter stops reading the socket, and TCP pushes back on the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import unquote

from ..hub import Hub, IngestLimits, Pipeline, RecordSubscription, Subscription
from ..hub.access import ANONYMOUS, Access, Principal, certificate_principal
from ..model import Batch, Forbidden, TidewireError, Unauthenticated, now_ms
from ..observe.logs import connection_log
from ..protocols.rsio import (
    EXT_AUTH,
    EXT_PUBLISH,
    PROTOCOL_VERSION,
    Authenticate,
    Authenticated,
    Cancel,
    Committed,
    Connection,
    ConnectionClosed,
    Goodbye,
    HandshakeCompleted,
    Limits,
    Offer,
    OfferEnded,
    OfferRefused,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    SubscriptionErrored,
    encode,
)
from ..protocols.rsio.codec import OnNextDecoded, OnNextRun
from ..protocols.rsio.names import OfferName, PublisherName, PublisherNameError
from ..protocols.rsio.runs import OfferRun, join_offer_parts, offer_run_decoder
from .guard import Admission, ConnectionLimits, Listener, established, peer_certificate

__all__ = ["RsioServer", "RsioServerProtocol", "RsioSettings", "start_rsio_server"]

log = logging.getLogger("tidewire.rsio")

WRITE_HIGH_WATER = 4 * 1024 * 1024
MAX_DELIVERY_BYTES = 1024 * 1024
MAX_SUBSCRIPTIONS = 1024  # per connection: each costs a task and a hub subscription
MAX_OFFERS = 256  # per connection: each costs a task
OFFER_WINDOW = 8192  # elements requested ahead of what is committed, per offer
MAX_INLET_BYTES = 8 * 1024 * 1024  # per connection: received for offers, not yet committed
MAX_TXN_BYTES = 64 * 1024 * 1024  # per connection: transaction offers are held until complete


def _retrieve(future: asyncio.Future[Batch]) -> None:
    if not future.cancelled():
        future.exception()  # an abandoned append's failure is logged by the log, not here


@dataclass(frozen=True, slots=True)
class RsioSettings:
    """The listener's bounds (settings ``rsio.*``, docs/configuration.md)."""

    limits: Limits = field(default_factory=Limits)
    max_subscriptions: int = MAX_SUBSCRIPTIONS
    max_offers: int = MAX_OFFERS
    max_inlet_bytes: int = MAX_INLET_BYTES
    max_txn_bytes: int = MAX_TXN_BYTES
    appends_in_flight: int = 4  # per offer, when the hub assigns the ids (ingest.*)
    commit_bytes: int = 1024 * 1024  # an offer's elements are appended in chunks of about this

    def ingest_limits(self) -> IngestLimits:
        """What the connection's :class:`~tidewire.hub.Ingest` is bounded by."""
        return IngestLimits(self.max_inlet_bytes, self.appends_in_flight, self.commit_bytes)


@dataclass(slots=True, eq=False)
class _Inlet:
    """One offer being received: elements gathered for the next commit."""

    offer: int
    name: OfferName
    element_size: int = 0  # from the client's subscribed
    # elements, packed runs of them, or decoded runs of envelopes
    parts: list[bytes | OfferRun] = field(default_factory=list)
    count: int = 0  # elements in parts
    nbytes: int = 0
    ended: str | None = None  # None: open; "": onComplete; else the publisher's onError
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    explicit_ids: bool | None = None  # decided by the offer's first envelope batch
    failed: str | None = None  # the hub gave up on the offer (a transaction too big)


class RsioServerProtocol(asyncio.Protocol):
    def __init__(
        self,
        hub: Hub,
        registry: set[RsioServerProtocol] | None = None,
        settings: RsioSettings | None = None,
        *,
        access: Access | None = None,
        principal: Principal = ANONYMOUS,
        via: str = "rsio",
    ) -> None:
        """``principal``: who the peer is before any ``authenticate`` (extension 2), e.g. the
        bearer token of a Tube connection's upgrade request; a verified client certificate
        (mutual TLS) names it when the transport has one. ``via``: the protocol carrying RS.io
        (``rsio`` over TCP, ``tube``), for the metrics and the log lines."""
        self.hub = hub
        self.via = via
        self.connection: int | None = None  # the guard's connection id
        self.access = access if access is not None else Access()
        self.principal = principal
        self.settings = settings = settings or RsioSettings()
        self.max_subscriptions = settings.max_subscriptions
        self.registry = registry if registry is not None else set()
        self.conn = Connection(
            Role.SERVER, extensions=(EXT_PUBLISH, EXT_AUTH), limits=settings.limits, runs=True
        )
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.log = connection_log(log, None, via)
        self.pumps: dict[int, tuple[_Source, asyncio.Task[None]]] = {}
        self.inlets: dict[int, _Inlet] = {}
        self.ingest = hub.ingest(via=via, limits=settings.ingest_limits(),
                                 on_pause=self._inlet_paused)  # fmt: skip
        self.txn_bytes = 0
        self._pauses: set[str] = set()  # why reading is paused: "output", "inlet"
        self._writable = asyncio.Event()
        self._writable.set()

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        transport = self.transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.log = connection_log(log, transport, self.via)
        self.peer = self.log.context.peer
        self.connection = self.log.context.conn
        if self.principal.anonymous:  # mutual TLS: the certificate names the peer
            self.principal = certificate_principal(peer_certificate(transport)) or ANONYMOUS
        self.log.context.principal = self.principal.name
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

    def quiesce(self) -> None:
        """Shutdown's first step: read nothing more (what was read is still appended and
        acknowledged: :attr:`busy` says when that is done)."""
        self._pause("shutdown")  # never resumed

    @property
    def busy(self) -> bool:
        """Events read and not yet acknowledged (appends in flight or waiting)."""
        return self.ingest.pending_bytes > 0 and not self.conn.closed

    def _inlet_paused(self, paused: bool) -> None:
        """The ingest path's signal: too much received and not yet durable, or room again."""
        if paused:
            self._pause("inlet")
        else:
            self._resume("inlet")

    def expire(self, reason: str) -> None:
        """A deadline of the guard's (handshake, idle): goodbye with the reason, and close."""
        self.shutdown(reason)

    def pause_writing(self) -> None:
        """The peer does not read fast enough: pumps wait, and so does reading its input (a
        peer that sends requests and never reads the answers must not grow our buffers)."""
        self._writable.clear()
        self._pause("output")

    def resume_writing(self) -> None:
        self._writable.set()
        self._resume("output")

    def _pause(self, why: str) -> None:
        if not self._pauses and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._pauses.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._pauses:
            return
        self._pauses.discard(why)
        if not self._pauses and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

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
                    self.log.info("subscription %d refused: %s", subscriber, reason)
                    self._stop(subscriber)
                case OnNextDecoded(subscriber, count, OfferRun() as run):
                    inlet = self.inlets.get(subscriber)
                    if inlet is not None:
                        self._gather_decoded(inlet, run)
                case OnNextRun(subscriber, elements):
                    inlet = self.inlets.get(subscriber)
                    if inlet is not None:
                        self._gather_run(inlet, elements)
                case OnNext(subscriber, element):
                    inlet = self.inlets.get(subscriber)
                    if inlet is not None:
                        self._gather(inlet, element, 1)
                case OnNextPacked(subscriber, count, elements):
                    inlet = self.inlets.get(subscriber)
                    if inlet is not None:
                        self._gather(inlet, elements, count)
                case Offer(offer, publisher):
                    self._offer(offer, publisher)
                case Subscribed(subscriber, size):
                    inlet = self.inlets.get(subscriber)
                    if inlet is not None:
                        inlet.element_size = size
                        if not size and inlet.name.format == "envelope":  # runs into batches
                            decoder = offer_run_decoder(inlet.name.stream)
                            self.conn.set_run_decoder(subscriber, decoder)
                case OnComplete(subscriber) | OnError(subscriber):
                    inlet = self.inlets.get(subscriber)
                    if inlet is not None:
                        inlet.ended = "" if isinstance(event, OnComplete) else event.error
                        inlet.wake.set()
                case OfferRefused(offer, reason):
                    self.log.info("offer %d refused: %s", offer, reason)
                case HandshakeCompleted():
                    established(self.transport)
                case Authenticate(token):
                    self._authenticate(token)
                case ConnectionClosed(reason, _, error):
                    if error:
                        self.log.warning("closing: %s", reason)
                    self._cancel_all()
                    self._flush()
                    if self.transport is not None:
                        self.transport.close()
                case _:
                    pass  # hellos, and messages for subscriptions we do not make

    def _authenticate(self, token: str) -> None:
        """Extension 2: the token names the principal from now on; a bad one ends the
        connection (goodbye), since the client asked to be someone it cannot prove to be."""
        try:
            self.principal = self.access.authenticate(token)
            self.log.context.principal = self.principal.name
        except Unauthenticated as exc:
            self.log.warning("authentication failed: %s", exc)
            self.shutdown(f"authentication failed: {exc}")
            return
        self.log.info("authenticated as %s", self.principal)
        self.conn.send(Authenticated(self.principal.name))

    def _refused(self, exc: Forbidden) -> str:
        self.log.warning("refused: %s", exc)
        return f"forbidden: {exc}"

    def _subscribe(self, publisher: str, subscriber: int, initial: int) -> None:
        if len(self.pumps) >= self.max_subscriptions:
            limit = self.max_subscriptions
            reason = f"too many subscriptions on this connection (the limit is {limit})"
            self.conn.send(OnError(subscriber, reason))
            return
        try:
            sub: _Source
            if publisher.startswith("?"):  # the hub's own publishers (see docs)
                sub = _Listing(self.hub, publisher, self.access, self.principal)
                name = PublisherName("-", format="value")
            else:
                name = PublisherName.parse(publisher)
                self.access.check(self.principal, "read", name.stream)
                sub = self.hub.subscribe(
                    name.stream, name.start, until_id=name.until, key=name.key,
                    max_batch_bytes=MAX_DELIVERY_BYTES, via=self.via, connection=self.connection,
                )  # fmt: skip
                if name.format == "records":
                    sub = RecordSubscription(sub)
        except Forbidden as exc:
            self.conn.send(OnError(subscriber, self._refused(exc)))
            return
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
        for inlet in list(self.inlets.values()):
            if inlet.task is not None:
                inlet.task.cancel()  # an append in flight still completes (the log shields it)
        self.inlets.clear()

    # ------------------------------------------------------------------ publishing (ext. 1)

    def _offer(self, offer: int, publisher: str) -> None:
        try:
            name = OfferName.parse(publisher)
        except PublisherNameError as exc:
            self._refuse(offer, str(exc))
            return
        try:
            self.access.check(self.principal, "write", name.stream)
        except Forbidden as exc:
            self.conn.send(OfferEnded(offer, self._refused(exc)))
            return
        if len(self.inlets) >= self.settings.max_offers:
            limit = self.settings.max_offers
            self._refuse(offer, f"too many offers on this connection (the limit is {limit})")
            return
        if not self.conn.can_subscribe(offer):  # a cancelled subscription's id, unconfirmed
            self._refuse(offer, f"offer id {offer} is still in use")
            return
        self.conn.send(Subscribe(publisher, offer, OFFER_WINDOW))
        inlet = self.inlets[offer] = _Inlet(offer, name)
        inlet.task = asyncio.create_task(self._commit_loop(inlet))

    def _refuse(self, offer: int, reason: str) -> None:
        self.log.info("offer %d refused: %s", offer, reason)
        self.conn.send(OfferEnded(offer, reason))

    def _gather_txn(
        self, inlet: _Inlet, parts: Sequence[bytes | OfferRun], count: int, nbytes: int
    ) -> None:
        """A transaction's elements are held until its onComplete (then appended at once),
        within ``max_txn_bytes`` per connection; more are requested as they arrive."""
        if inlet.failed is not None:
            return
        inlet.parts += parts
        inlet.count += count
        inlet.nbytes += nbytes
        self.txn_bytes += nbytes
        if self.txn_bytes > self.settings.max_txn_bytes:
            limit = self.settings.max_txn_bytes
            inlet.failed = f"transactions on this connection exceed {limit} bytes"
        elif self.conn.is_subscribed(inlet.offer):
            self.conn.send(Request(inlet.offer, count))
        inlet.wake.set()

    def _gather(self, inlet: _Inlet, data: bytes, count: int) -> None:
        if inlet.name.txn is not None:
            self._gather_txn(inlet, [data], count, len(data))
            return
        inlet.parts.append(data)
        inlet.count += count
        inlet.nbytes += len(data)
        inlet.wake.set()
        self.ingest.hold(len(data))

    def _gather_run(self, inlet: _Inlet, elements: list[bytes]) -> None:
        nbytes = sum(map(len, elements))
        if inlet.name.txn is not None:
            self._gather_txn(inlet, elements, len(elements), nbytes)
            return
        inlet.parts += elements
        inlet.count += len(elements)
        inlet.nbytes += nbytes
        inlet.wake.set()
        self.ingest.hold(nbytes)

    def _gather_decoded(self, inlet: _Inlet, run: OfferRun) -> None:
        """A run of envelopes decoded straight from the receive buffer (no object per
        element): gathered as one part, counted by its bytes on the wire."""
        if inlet.name.txn is not None:
            self._gather_txn(inlet, [run], len(run.batch), run.nbytes)
            return
        inlet.parts.append(run)
        inlet.count += len(run.batch)
        inlet.nbytes += run.nbytes
        inlet.wake.set()
        self.ingest.hold(run.nbytes)

    def _batch(self, inlet: _Inlet, parts: list[bytes | OfferRun]) -> tuple[Batch, bool]:
        name, size = inlet.name, inlet.element_size
        if name.format == "value":  # (no run decoder: every part is bytes)
            values = cast(list[bytes], parts)
            if size:
                return Batch.fixed(name.stream, b"".join(values), size, key=name.key), False
            keys = None if name.key is None else [name.key] * len(values)
            return Batch.build(name.stream, values, keys=keys), False
        if size:  # fixed-size envelopes: split the packed runs
            packed = cast(list[bytes], parts)
            parts = [p[i : i + size] for p in packed for i in range(0, len(p), size)]
        return join_offer_parts(name.stream, parts, now_ms())

    def _take(self, inlet: _Inlet) -> tuple[list[bytes | OfferRun], int, int]:
        """The oldest gathered parts, about ``commit_bytes`` of them (at least one)."""
        size = inlet.element_size
        chunk = self.ingest.limits.commit_bytes
        if inlet.nbytes <= chunk:
            taken = (inlet.parts, inlet.count, inlet.nbytes)
            inlet.parts, inlet.count, inlet.nbytes = [], 0, 0
            return taken
        nbytes = count = stop = 0
        while nbytes < chunk:
            part = inlet.parts[stop]
            stop += 1
            if isinstance(part, OfferRun):
                nbytes += part.nbytes
                count += len(part.batch)
                continue
            nbytes += len(part)
            count += len(part) // size if size else 1
        parts, inlet.parts = inlet.parts[:stop], inlet.parts[stop:]
        inlet.count -= count
        inlet.nbytes -= nbytes
        return parts, count, nbytes

    async def _commit_loop(self, inlet: _Inlet) -> None:
        """Append what arrives, in chunks of about ``commit_bytes`` (records stay small enough
        for subscribers to read without waste), through the offer's ingest pipeline: several
        appends in flight when the hub assigns the ids (so they share group commits), one at a
        time when the envelopes carry ids, fenced, receipts in order. Acknowledge in order."""
        offer = inlet.offer
        if inlet.name.txn is not None:
            await self._commit_txn(inlet, inlet.name.txn)
            return
        pipeline = self.ingest.pipeline(serial_own_ids=True)
        receipts: deque[tuple[asyncio.Future[Batch], int]] = deque()
        try:
            while True:
                while receipts and receipts[0][0].done():
                    receipt, count = receipts.popleft()
                    stored = receipt.result()
                    if self.conn.closed:
                        return
                    self.conn.send(Committed(offer, count, stored.first_id, stored.last_id))
                    if inlet.ended is None and self.conn.is_subscribed(offer):
                        self.conn.send(Request(offer, count))
                    self._flush()
                # (while the pipeline is full, elements gather into the next, bigger, batch)
                if inlet.parts and pipeline.has_room(not inlet.explicit_ids):
                    self._submit(inlet, pipeline, receipts)
                    continue
                if not inlet.parts and not receipts and inlet.ended is not None:
                    break
                inlet.wake.clear()
                await inlet.wake.wait()
            if not self.conn.closed:
                if inlet.ended:
                    self.log.info("offer %d: the publisher failed: %s", offer,
                             inlet.ended)  # fmt: skip
                self.conn.send(OfferEnded(offer, ""))
                self._flush()
        except asyncio.CancelledError:
            raise
        except (TidewireError, ValueError) as exc:
            self.log.warning("offer %d into %r failed: %s", offer,
                        inlet.name.stream, exc)  # fmt: skip
            if not self.conn.closed:
                if self.conn.is_subscribed(offer):
                    self.conn.send(Cancel(offer))
                self.conn.send(OfferEnded(offer, str(exc)))
                self._flush()
        finally:
            pipeline.close()  # the storage finishes what it has; nothing more is acked
            for receipt, _ in receipts:
                receipt.add_done_callback(_retrieve)
            if self.inlets.get(offer) is inlet:
                del self.inlets[offer]
            self.ingest.release(inlet.nbytes)  # gathered, never submitted
            inlet.parts, inlet.count, inlet.nbytes = [], 0, 0

    def _submit(
        self,
        inlet: _Inlet,
        pipeline: Pipeline,
        receipts: deque[tuple[asyncio.Future[Batch], int]],
    ) -> None:
        """The oldest gathered chunk, as one batch, into the pipeline."""
        parts, count, nbytes = self._take(inlet)
        try:
            batch, explicit = self._batch(inlet, parts)
            if inlet.explicit_ids is None:
                inlet.explicit_ids = explicit
            elif explicit != inlet.explicit_ids:
                raise ValueError("an offer's envelopes either all carry ids or none does")
        except (TidewireError, ValueError):
            self.ingest.release(nbytes)
            raise
        receipt = pipeline.submit(batch, assign_ids=not explicit, held=nbytes)
        receipt.add_done_callback(lambda _: inlet.wake.set())
        receipts.append((receipt, count))

    async def _commit_txn(self, inlet: _Inlet, txn: str) -> None:
        """A transaction offer: everything, once, at onComplete (``Hub.commit``)."""
        offer = inlet.offer
        try:
            while inlet.ended is None and inlet.failed is None:
                inlet.wake.clear()
                await inlet.wake.wait()
            reason = inlet.failed
            if reason is None and inlet.ended:
                reason = f"transaction abandoned: the publisher failed: {inlet.ended}"
            if reason is None and inlet.count:
                batch, _ = self._batch(inlet, inlet.parts)  # (its own ids do not matter)
                receipt = await self.ingest.submit_txn(txn, batch)
                if receipt.already:
                    self.log.info("transaction %r was committed before: not appended again",
                             txn)  # fmt: skip
                if not self.conn.closed:
                    self.conn.send(Committed(offer, inlet.count, receipt.first_id,
                                             receipt.last_id))  # fmt: skip
            if reason is not None:
                self.log.warning("offer %d (transaction %r) failed: %s", offer,
                            txn, reason)  # fmt: skip
            if not self.conn.closed:
                if self.conn.is_subscribed(offer):
                    self.conn.send(Cancel(offer))
                self.conn.send(OfferEnded(offer, reason or ""))
                self._flush()
        except asyncio.CancelledError:
            raise
        except (TidewireError, ValueError) as exc:
            self.log.warning("transaction %r into %r failed: %s", txn,
                        inlet.name.stream, exc)  # fmt: skip
            if not self.conn.closed:
                if self.conn.is_subscribed(offer):
                    self.conn.send(Cancel(offer))
                self.conn.send(OfferEnded(offer, str(exc)))
                self._flush()
        finally:
            self.txn_bytes -= inlet.nbytes
            inlet.nbytes = 0
            if self.inlets.get(offer) is inlet:
                del self.inlets[offer]

    def _flush(self) -> None:
        chunks = self.conn.chunks_to_send()
        if chunks and self.transport is not None and not self.transport.is_closing():
            if len(chunks) == 1:
                self.transport.write(chunks[0])
            else:
                self.transport.writelines(chunks)  # uvloop: one writev, no copy

    # ------------------------------------------------------------------ delivery

    async def _pump(
        self, subscriber: int, sub: _Source, name: PublisherName
    ) -> None:
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
                    self.conn.send_batch(subscriber, batch, name)
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


class _Listing:
    """The publisher ``?streams`` (optionally ``?streams=a,b``, names percent-encoded): one
    JSON element per stream, ``{"stream", "first_id", "latest_id", "events", "bytes"}``
    (``first_id`` null when the stream is empty), then onComplete. Streams named but absent
    are listed with ``"latest_id": 0`` and ``"exists": false``. A subscription-shaped object
    so that the ordinary pump delivers it within demand."""

    def __init__(self, hub: Hub, publisher: str, access: Access, principal: Principal) -> None:
        field_name, eq, value = publisher[1:].partition("=")
        if field_name != "streams":
            raise PublisherNameError(f"unknown hub publisher {publisher!r} (try '?streams')")
        stats = {s.name: s for s in hub.streams()}
        names = [unquote(n, errors="strict") for n in value.split(",")] if eq and value else (
            sorted(stats))  # fmt: skip
        names = access.streams(principal, names)  # only what the principal may read
        rows = []
        for stream in names:
            st = stats.get(stream)
            row: dict[str, object] = {"stream": stream, "exists": st is not None}
            if st is None:
                row.update(first_id=None, latest_id=0, events=0, bytes=0)
            else:
                row.update(first_id=st.first_id, latest_id=st.latest_id or 0,
                           events=st.events, bytes=st.bytes)  # fmt: skip
            rows.append(json.dumps(row, separators=(",", ":")).encode())
        self._rows = rows
        self.demand = 0
        self.cancelled = False
        self._wake = asyncio.Event()

    @property
    def complete(self) -> bool:
        return not self._rows

    def request(self, n: int) -> None:
        self.demand = min(2**63 - 1, self.demand + n)
        self._wake.set()

    def cancel(self) -> None:
        self.cancelled = True
        self._wake.set()

    async def next(self) -> list[Batch] | None:
        while not self.cancelled and self._rows:
            if self.demand:
                rows, self._rows = self._rows[: self.demand], self._rows[self.demand :]
                self.demand -= len(rows)
                return [Batch.build("-", rows, timestamps=0)]
            self._wake.clear()
            await self._wake.wait()
        return None


_Source = Subscription | _Listing | RecordSubscription
"""What a pump delivers from."""


class RsioServer:
    """The listener (behind the guard: TLS, connection limits, deadlines) and its live
    connections (so that shutdown can say goodbye to each)."""

    def __init__(
        self,
        hub: Hub,
        settings: RsioSettings | None = None,
        *,
        access: Access | None = None,
        admission: Admission | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.hub = hub
        self.settings = settings or RsioSettings()
        self.access = access if access is not None else Access()
        self.connections: set[RsioServerProtocol] = set()
        self.listener = Listener(
            "rsio", self._protocol, admission or Admission(ConnectionLimits()), tls=tls,
            refuse=_refusal,
        )  # fmt: skip
        hub.metrics.listeners.append(self.listener)

    def _protocol(self) -> RsioServerProtocol:
        return RsioServerProtocol(self.hub, self.connections, self.settings, access=self.access)

    @property
    def port(self) -> int:
        return self.listener.port

    def quiesce(self) -> None:
        """Stop listening and stop reading every connection (see :meth:`RsioServerProtocol.
        quiesce`); :meth:`close` then says goodbye."""
        self.listener.close()
        for protocol in self.connections:
            protocol.quiesce()

    @property
    def busy(self) -> bool:
        return any(protocol.busy for protocol in self.connections)

    async def close(self) -> None:
        """Stop listening, say goodbye to every connection and close it."""
        self.listener.close()
        for protocol in list(self.connections):
            protocol.shutdown("server shutting down")
        await self.listener.wait_closed()


def _refusal(reason: str) -> bytes:
    """What a connection refused at admission gets: the hub's hello, then goodbye."""
    return bytes(encode(ServerHello(PROTOCOL_VERSION, (EXT_PUBLISH, EXT_AUTH)))
                 + encode(Goodbye(reason)))  # fmt: skip


async def start_rsio_server(
    hub: Hub,
    host: str,
    port: int,
    settings: RsioSettings | None = None,
    *,
    access: Access | None = None,
    admission: Admission | None = None,
    tls: ssl.SSLContext | None = None,
) -> RsioServer:
    """Listen for RS.io over TCP (over TLS with ``tls``) on ``host:port`` (0 = any free port)."""
    rsio = RsioServer(hub, settings, access=access, admission=admission, tls=tls)
    await rsio.listener.start(host, port)
    return rsio
