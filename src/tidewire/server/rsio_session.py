"""One RS.io connection on the hub's side, whatever carries its bytes: the session between the
sans-IO :class:`~tidewire.protocols.rsio.Connection` and the :class:`~tidewire.hub.Hub`.

A carrier (:class:`Carrier`: RS.io over TCP, :mod:`.rsio`; RS.io over Tube, :mod:`.tube`) feeds
the peer's bytes in (:meth:`RsioSession.receive_data`, ``b""`` for the end of the stream) and
writes the chunks the session hands it (:meth:`Carrier.write_chunks`, zero-copy views of the
log's batches kept apart). Events become hub calls: each subscription the peer makes is pumped
by one task that waits for the hub subscription's next delivery (which honours the peer's
demand) and encodes it with ``Connection.send_batch``; offers (extension 1) go through the
hub's ingest path (:mod:`.rsio_offers`); ``authenticate`` (extension 2) names the principal,
which every subscribe and offer is checked against.

Flow control: while the carrier's output is above its high-water mark it calls
:meth:`RsioSession.pause_writing`: pumps wait, and reading waits too (a peer that sends requests
and never reads the answers must not grow our buffers). The pumps of one connection take turns
at the output (one lock): each waits until its subscription is ready without reading anything,
then, in its turn, waits for writability, reads one delivery and writes it, so a peer that does
not read costs the high-water mark plus one delivery, whatever the number of subscriptions.
Reading also pauses while too much is received and not yet durable (the ingest's signal, or the
budget's ``"ingest"`` gauge refused), while decoded input is handled in slices
(:mod:`.rsio_flow`), and for good at shutdown; the session keeps the reasons and asks the
carrier to pause or resume reading once.

Hostile load (docs/protocols/rsio.md): every byte waiting for the peer is charged to the
connection's budget share; ``limits.max_refusals`` refusals in a row end it; log lines of
refusals are rate-limited per hub; a breach's close lingers (``guard.refused``); over its fair
share of a contended loop (:mod:`tidewire.hub.fairness`) reading and the pumps' turn wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ..hub import Hub, IngestLimits, RecordSubscription, Subscription, Throttle
from ..hub.access import ANONYMOUS, Access, Principal, certificate_principal
from ..hub.listing import Listing
from ..model import Batch, Forbidden, TidewireError, Unauthenticated
from ..observe.logs import connection_log
from ..observe.throttle import Refusals
from ..protocols.rsio import (
    EXT_AUTH,
    EXT_PUBLISH,
    Authenticate,
    Authenticated,
    Cancel,
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
    Subscribe,
    Subscribed,
    SubscriptionErrored,
)
from ..protocols.rsio import names as grammar
from ..protocols.rsio.codec import OnNextDecoded, OnNextRun
from ..protocols.rsio.connection import State
from ..protocols.rsio.events import Event
from ..protocols.rsio.names import OfferName, PublisherName, PublisherNameError
from ..protocols.rsio.runs import OfferRun
from .guard import peer_certificate
from .rsio_flow import (
    OUTPUT_PAUSE_BYTES,
    SLICE_BYTES,
    SLICE_CHECK,
    SLICE_MESSAGES,
    SLICE_SECONDS,
    Buffering,
    Carrier,
    ReadAhead,
    Slicer,
    refusal_log,
)
from .rsio_offers import Inlet, Offers

__all__ = ["MAX_DELIVERY_BYTES", "MAX_INLET_BYTES", "MAX_OFFERS", "MAX_SUBSCRIPTIONS",
           "MAX_TXN_BYTES", "Carrier", "RsioSession", "RsioSettings"]  # fmt: skip

log = logging.getLogger("tidewire.rsio")

MAX_DELIVERY_BYTES = 1024 * 1024
MAX_SUBSCRIPTIONS = 1024  # per connection: each costs a task and a hub subscription
MAX_OFFERS = 256  # per connection: each costs a task
MAX_INLET_BYTES = 8 * 1024 * 1024  # per connection: received for offers, not yet committed
MAX_TXN_BYTES = 64 * 1024 * 1024  # per connection: transaction offers are held until complete


@dataclass(frozen=True, slots=True)
class RsioSettings:
    """An RS.io session's bounds (settings ``rsio.*``, docs/configuration.md)."""

    limits: Limits = field(default_factory=Limits)
    max_subscriptions: int = MAX_SUBSCRIPTIONS
    max_offers: int = MAX_OFFERS
    max_inlet_bytes: int = MAX_INLET_BYTES
    max_txn_bytes: int = MAX_TXN_BYTES
    appends_in_flight: int = 4  # per offer, when the hub assigns the ids (ingest.*)
    commit_bytes: int = 1024 * 1024  # an offer's elements are appended in chunks of about this
    max_refusals: int = 100  # refusals in a row that end the connection (limits.max_refusals)

    def ingest_limits(self) -> IngestLimits:
        """What the connection's :class:`~tidewire.hub.Ingest` is bounded by."""
        return IngestLimits(self.max_inlet_bytes, self.appends_in_flight, self.commit_bytes)


_ELEMENTS = frozenset({OnNextDecoded, OnNextRun, OnNext, OnNextPacked})

_Source = Subscription | Listing | RecordSubscription
"""What a pump delivers from."""


class RsioSession:
    """The hub's side of one RS.io connection. The carrier calls :meth:`start` once it is
    connected, :meth:`receive_data` with what it reads, :meth:`pause_writing` /
    :meth:`resume_writing` as its output crosses its water marks, and
    :meth:`connection_lost` at the end; the listener calls :meth:`quiesce`, :meth:`shutdown`
    and reads :attr:`busy`; the guard reads :meth:`receiving_since` (through the TCP
    carrier). While started and not lost, the session is in ``registry``."""

    def __init__(
        self,
        hub: Hub,
        registry: set[RsioSession] | None = None,
        settings: RsioSettings | None = None,
        *,
        access: Access | None = None,
        principal: Principal = ANONYMOUS,
        via: str = "rsio",
    ) -> None:
        """``principal``: who the peer is before any ``authenticate`` (extension 2), e.g. the
        bearer token of a Tube connection's upgrade request; a verified client certificate
        (mutual TLS) names it when the carrier has one. ``via``: the protocol carrying RS.io
        (``rsio`` over TCP, ``tube``), for the metrics and the log lines."""
        self.hub = hub
        self.via = via
        self.connection: int | None = None  # the guard's connection id
        self.access = access if access is not None else Access()
        self.principal = principal
        self.settings = settings = settings or RsioSettings()
        self.registry = registry if registry is not None else set()
        self.conn = Connection(
            Role.SERVER, extensions=(EXT_PUBLISH, EXT_AUTH), limits=settings.limits, runs=True
        )
        self.carrier: Carrier | None = None
        self.peer = "?"
        self.log = connection_log(log, None, via)
        self.share = hub.budget.share(principal.name)
        """This connection's account in the hub's memory budget (closed when it ends)."""
        self.readahead = ReadAhead(self.share)
        self.refusals = Refusals(settings.max_refusals)
        self.refusal_log = refusal_log(hub)
        self.pumps: dict[int, tuple[_Source, asyncio.Task[None]]] = {}
        self.ingest = hub.ingest(via=via, limits=settings.ingest_limits(),
                                 on_pause=self._inlet_paused)  # fmt: skip
        self.offers = Offers(self.conn, self.ingest, self.log, self._flush,
                             max_offers=settings.max_offers,
                             max_txn_bytes=settings.max_txn_bytes, share=self.share,
                             on_ingest=self._charge_ingest)  # fmt: skip
        # why reading is paused: "output", "inlet", "budget", "inbound", "slice", "shutdown", "fair"
        self._pauses: set[str] = set()
        self.throttle = Throttle(self.share,
                                 lambda wait: (self._pause if wait else self._resume)("fair"))
        self._writable = asyncio.Event()
        self._writable.set()
        self._turn = asyncio.Lock()  # the pumps' turns at the output
        self._slicer = Slicer(self._slice, self._sliced, self.throttle)
        self._buffering: Buffering | None = None
        self._since: float | None = None  # when the unfinished frame began to wait
        self._progress = 0  # frames received when _since was set

    # ------------------------------------------------------------------ the carrier's calls

    def start(self, carrier: Carrier) -> None:
        """The carrier is connected: say hello."""
        self.carrier = carrier
        self._buffering = carrier if isinstance(carrier, Buffering) else None
        self.log = self.offers.log = connection_log(log, carrier, self.via)
        self.peer = self.log.context.peer
        self.connection = self.log.context.conn
        if self.principal.anonymous:  # mutual TLS: the certificate names the peer
            self.principal = certificate_principal(peer_certificate(carrier)) or ANONYMOUS
        self.log.context.principal = self.ingest.principal = self.principal.name
        self.share.label = self.peer
        self.share.rebind(self.principal.name)
        self.registry.add(self)
        self.conn.initiate()
        self._flush()

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes from the peer (a view is not kept past the call); ``b""``: the end of its
        stream. What they decode to is
        handled a slice at a time (:mod:`.rsio_flow`): the rest from the event loop, with
        reading paused meanwhile."""
        self.conn.receive_data(data)
        self._slicer.run()

    def receiving_since(self) -> float | None:
        """``loop.time()`` since which a frame begun by the peer waits unfinished (the
        guard's ``limits.message_seconds`` applies); ``None`` when none does, or while the
        session itself does not read (then the peer cannot finish it)."""
        return None if self._pauses else self._since

    def connection_lost(self) -> None:
        """The carrier is gone: stop every pump and offer, return the budget."""
        self.registry.discard(self)
        self._slicer.cancel()
        self.throttle.cancel()
        self._cancel_all()
        self._writable.set()
        self.share.close()

    def pause_writing(self) -> None:
        """The peer does not read fast enough: pumps wait. Its input is still read (its
        requests are what keeps a fast subscriber fed); only what the input itself makes the
        hub write (refusals, ...) can grow the output further, and past
        :data:`~.rsio_flow.OUTPUT_PAUSE_BYTES` reading pauses too (:meth:`_charge_outbound`)."""
        self._writable.clear()
        self._charge_outbound()

    def resume_writing(self) -> None:
        self._writable.set()
        self._charge_outbound()
        if "inbound" in self._pauses:
            self._slicer.run()

    # ------------------------------------------------------------------ the listener's calls

    def shutdown(self, reason: str, *, refusal: bool = False) -> None:
        """Goodbye, then close (server shutdown; ``refusal``: the close lingers, guard)."""
        self._cancel_all()
        if refusal and self.carrier is not None:
            self.carrier.refused()
        if self.conn.state is State.OPEN:
            self.conn.send(Goodbye(reason))
            self._flush()
        if self.carrier is not None:
            self.carrier.close()

    def expire(self, reason: str) -> None:
        self.shutdown(reason)  # a deadline of the guard's: goodbye with the reason, close

    def abort(self) -> None:
        """Drop the connection without a word (as a reset would)."""
        if self.carrier is not None:
            self.carrier.abort()

    def quiesce(self) -> None:
        """Shutdown's first step: read nothing more (what was read is still appended and
        acknowledged: :attr:`busy` says when that is done)."""
        self._pause("shutdown")  # never resumed

    @property
    def busy(self) -> bool:
        """Events read and not yet acknowledged (appends in flight or waiting)."""
        return self.ingest.pending_bytes > 0 and not self.conn.closed

    @property
    def slices(self) -> int:
        """How many times a full slice left decoded input for the loop to go on with."""
        return self._slicer.slices

    @property
    def inlets(self) -> dict[int, Inlet]:
        """The offers being received, by offer id."""
        return self.offers.inlets

    # ------------------------------------------------------------------ reading

    def _inlet_paused(self, paused: bool) -> None:
        """The ingest path's signal: too much received and not yet durable, or room again."""
        (self._pause if paused else self._resume)("inlet")
        self._charge_ingest()

    def _charge_ingest(self) -> None:
        """The ingest's pending bytes into the budget; when they do not fit, reading pauses
        (as over ``max_pending_bytes``) until acknowledgements lower them."""
        pending = self.ingest.pending_bytes
        if self.share.try_hold("ingest", pending):
            self._resume("budget")
        else:
            self.share.hold("ingest", pending)  # (received already)
            self._pause("budget")
        if "inbound" in self._pauses:  # a frame waiting for room: is there room now?
            self._slicer.run()

    def _sliced(self, pending: bool) -> None:
        (self._pause if pending else self._resume)("slice")

    def _pause(self, why: str) -> None:
        carrier = self.carrier
        if not self._pauses and carrier is not None and not carrier.is_closing():
            carrier.pause_reading()
        self._pauses.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._pauses:
            return
        self._pauses.discard(why)
        carrier = self.carrier
        if not self._pauses and carrier is not None and not carrier.is_closing():
            if self._since is not None:  # the peer could not go on meanwhile
                self._since = asyncio.get_running_loop().time()
            carrier.resume_reading()

    def _slice(self) -> bool:
        """Handle decoded input, at most a slice of it; True when more is left."""
        conn = self.conn
        start_bytes, start_frames = conn.buffered, conn.frames_received
        deadline = time.perf_counter() + SLICE_SECONDS
        check = SLICE_CHECK
        more = False
        while not self._closing():
            frames = conn.frames_received - start_frames
            if frames >= check:
                check = frames + SLICE_CHECK
                if time.perf_counter() >= deadline:
                    more = True
                    break
            if frames >= SLICE_MESSAGES or start_bytes - conn.buffered >= SLICE_BYTES:
                more = True
                break
            event = conn.next_event(check - frames)
            if event is not None:
                self._handle_event(event)
            elif conn.frames_received - start_frames < check:
                break  # nothing more until more data arrives
        if not more:
            self._settle()
        self._flush()
        return more

    def _closing(self) -> bool:
        carrier = self.carrier
        return self.conn.closed or (carrier is not None and carrier.is_closing())

    def _settle(self) -> None:
        """Input decoded as far as it goes: charge what is left (and what the frame begun has
        declared), refusing a frame that cannot fit before its body is read; note since when."""
        conn, share = self.conn, self.share
        buffered, awaiting = conn.buffered, conn.awaiting
        if awaiting and not share.try_hold("inbound", buffered + awaiting):
            share.hold("inbound", buffered)
            # Waited for (retried as bytes are returned anywhere): a frame that fits once this
            # connection's holdings drain (elements made durable, output read) or that fits its
            # own and its principal's shares (only the hub's total, others', is in the way).
            draining = share.gauge("ingest") + share.gauge("outbound")
            if awaiting <= share.available() + draining or share.fits_own(
                    "inbound", buffered + awaiting):  # fmt: skip
                self._pause("inbound")
                share.on_release(self._slicer.run)  # (dropped when the share closes)
                return
            # Staged transactions overflowing the budget fail, not the connection; the frame
            # then fits (it is their next element, dropped), or it is refused.
            if not (self.offers.fail_open_txns("transactions on this connection exceed its "
                                               "memory budget")
                    and share.try_hold("inbound", buffered + awaiting)):  # fmt: skip
                conn.refuse_input(f"a frame of {buffered + awaiting} bytes does not fit this "
                                  f"connection's memory budget ({share.available()} bytes "
                                  "left)")  # fmt: skip
                while (event := conn.next_event()) is not None:  # (ConnectionClosed)
                    self._handle_event(event)
                return
        self._resume("inbound")
        if not awaiting:
            share.hold("inbound", buffered)
        if not buffered or conn.closed:
            self._since = None
        elif self._since is None or conn.frames_received != self._progress:
            self._since = asyncio.get_running_loop().time()
            self._progress = conn.frames_received

    # ------------------------------------------------------------------ events

    def _handle_event(self, event: Event) -> None:
        offers = self.offers
        if type(event) in _ELEMENTS:  # (decoded: counted as ingest or txn from now on)
            self.share.hold("inbound", self.conn.buffered)
        match event:
            case OnNextDecoded(subscriber, _, OfferRun() as run):
                offers.decoded(subscriber, run)
            case OnNextRun(subscriber, elements):
                offers.run(subscriber, elements)
            case OnNext(subscriber, element):
                offers.element(subscriber, element)
            case OnNextPacked(subscriber, count, elements):
                offers.element(subscriber, elements, count)
            case Request(subscriber, n):
                pump = self.pumps.get(subscriber)
                if pump is not None:
                    pump[0].request(n)
            case Subscribe(publisher, subscriber, initial):
                self._subscribe(publisher, subscriber, initial)
            case Cancel(subscriber):
                self._stop(subscriber)
            case SubscriptionErrored(subscriber, reason):
                self._stop(subscriber)
                self._refuse(logging.INFO, "subscription %d refused: %s", subscriber, reason)
            case Offer(offer, publisher):
                self._offer(offer, publisher)
            case Subscribed(subscriber, size):
                offers.subscribed(subscriber, size)
            case OnComplete(subscriber):
                offers.end(subscriber, None)
            case OnError(subscriber, error):
                offers.end(subscriber, error)
            case OfferRefused(offer, reason):
                self._refuse(logging.INFO, "offer %d refused: %s", offer, reason)
            case HandshakeCompleted():
                if self.carrier is not None:
                    self.carrier.established()
            case Authenticate(token):
                self._authenticate(token)
            case ConnectionClosed(reason, _, error):
                if error:
                    self.log.warning("closing: %s", reason)
                self._cancel_all()
                self._flush()
                if self.carrier is not None:
                    if error:  # (a breach or refusal: its close lingers, guard.refused)
                        self.carrier.refused()
                    self.carrier.close()
            case _:
                pass  # hellos, and messages for subscriptions we do not make

    def _refuse(self, level: int, msg: str, *args: object) -> None:
        """A refusal: logged within the hub's rate, counted; ``max_refusals`` in a row end
        the connection with goodbye."""
        self.refusal_log.log(self.log, level, msg, *args)
        if self.refusals.refuse() and not self._closing():
            limit = self.refusals.limit
            self.refusal_log.log(self.log, logging.WARNING, "closing: %d refusals in a row", limit)
            self.shutdown(f"too many refusals in a row (the limit is {limit})", refusal=True)

    def _authenticate(self, token: str) -> None:
        """Extension 2: the token names the principal from now on; a bad one ends the
        connection (goodbye), since the client asked to be someone it cannot prove to be."""
        try:
            self.principal = self.access.authenticate(token)
            self.log.context.principal = self.ingest.principal = self.principal.name
        except Unauthenticated as exc:
            self.log.warning("authentication failed: %s", exc)
            self.shutdown(f"authentication failed: {exc}", refusal=True)
            return
        self.share.rebind(self.principal.name)
        self.log.info("authenticated as %s", self.principal)
        self.conn.send(Authenticated(self.principal.name))

    def _source(self, publisher: str) -> tuple[_Source, PublisherName]:
        """What a subscription to ``publisher`` delivers from (checked against the ACL)."""
        if publisher.startswith("?"):  # the hub's own publishers (see docs)
            own = grammar.HubPublisher.parse(publisher)
            listing = Listing.of(self.hub, own.streams, own.times, self.access, self.principal)
            return listing, PublisherName("-", format="value")
        name = PublisherName.parse(publisher)
        self.access.check(self.principal, "read", name.stream)
        sub = self.hub.subscribe(  # (from-time=: "latest" until the pump resolves it)
            name.stream, "latest" if isinstance(name.start, grammar.FromTime) else name.start,
            until_id=name.until, key=name.key,
            max_batch_bytes=MAX_DELIVERY_BYTES, via=self.via, connection=self.connection,
        )  # fmt: skip
        sub.account = self.readahead.account()
        return (RecordSubscription(sub) if name.format == "records" else sub), name

    def _subscribe(self, publisher: str, subscriber: int, initial: int) -> None:
        if len(self.pumps) >= self.settings.max_subscriptions:
            limit = self.settings.max_subscriptions
            reason = f"too many subscriptions on this connection (the limit is {limit})"
            self.conn.send(OnError(subscriber, reason))
            self._refuse(logging.INFO, "subscription %d refused: %s", subscriber, reason)
            return
        try:
            sub, name = self._source(publisher)
        except Forbidden as exc:
            self.conn.send(OnError(subscriber, f"forbidden: {exc}"))
            self._refuse(logging.WARNING, "refused: %s", exc)
            return
        except (PublisherNameError, TidewireError, ValueError) as exc:
            self.conn.send(OnError(subscriber, str(exc)))
            self._refuse(logging.INFO, "subscription %d refused: %s", subscriber, exc)
            return
        self.refusals.succeed()
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
        self.offers.cancel_all()

    def _offer(self, offer: int, publisher: str) -> None:
        try:
            name = OfferName.parse(publisher)
            self.access.check(self.principal, "write", name.stream)
        except PublisherNameError as exc:
            self.offers.refuse(offer, str(exc))
            self._refuse(logging.INFO, "offer %d refused: %s", offer, exc)
            return
        except Forbidden as exc:
            self.conn.send(OfferEnded(offer, f"forbidden: {exc}"))
            self._refuse(logging.WARNING, "refused: %s", exc)
            return
        except Unauthenticated as exc:  # its token expired or was revoked since it authenticated
            self.conn.send(OfferEnded(offer, f"unauthenticated: {exc}"))
            self._refuse(logging.WARNING, "refused: %s", exc)
            return
        refused = self.offers.open(offer, publisher, name)
        if refused is None:
            self.refusals.succeed()
        else:
            self._refuse(logging.INFO, "offer %d refused: %s", offer, refused)

    # ------------------------------------------------------------------ writing

    def _flush(self) -> None:
        chunks = self.conn.chunks_to_send()
        carrier = self.carrier
        if chunks and carrier is not None and not carrier.is_closing():
            carrier.write_chunks(chunks)
            self._charge_outbound()

    def _charge_outbound(self) -> None:
        """What the carrier holds for the peer, as the ``outbound`` gauge (in memory already:
        recorded, never refused; the high-water mark is what bounds it)."""
        if self._buffering is None:
            return
        size = self._buffering.get_write_buffer_size()
        self.share.hold("outbound", size)
        if size > OUTPUT_PAUSE_BYTES:
            self._pause("output")
        elif "output" in self._pauses and self._writable.is_set():
            self._resume("output")

    async def _pump(self, subscriber: int, sub: _Source, name: PublisherName) -> None:
        """Deliver ``sub`` to the peer's subscription ``subscriber``: wait until it is ready
        (nothing read), then in the connection's turn wait for writability, read one
        delivery and write it: at most one delivery past the high-water mark per
        connection. (A listing, small and rare, is read first and written in its turn.)"""
        try:
            if isinstance(name.start, grammar.FromTime) and not isinstance(sub, Listing):
                await self.hub.seek_time(sub, name.start.ms)  # once, before the first read
            while True:
                batches: list[Batch] | None = None
                if isinstance(sub, Subscription | RecordSubscription):
                    await sub.wait_ready()
                else:
                    batches = await sub.next()
                async with self._turn:
                    await self._writable.wait()
                    if isinstance(sub, Subscription | RecordSubscription):
                        batches = await sub.take()  # (never waits: others wait for the turn)
                    began = time.perf_counter()
                    if not self._deliver(subscriber, sub, name, batches):
                        return
                    if wait := self.share.spend(time.perf_counter() - began):
                        await asyncio.sleep(wait)  # (over its fair share: its turn waits)
                if batches == []:  # (a key filter dropped a read: let the loop breathe)
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except TidewireError as exc:
            if not self.conn.closed and subscriber in self.pumps:
                self.conn.send(OnError(subscriber, str(exc)))
                self._flush()
        finally:
            if self.pumps.get(subscriber, (None, None))[0] is sub:
                del self.pumps[subscriber]

    def _deliver(self, subscriber: int, sub: _Source, name: PublisherName,
                 batches: list[Batch] | None) -> bool:  # fmt: skip
        """Write one delivery (``None``: the end); False once the pump is done."""
        if batches is None:
            if sub.complete and not self.conn.closed:
                self.conn.send(OnComplete(subscriber))
                self._flush()
            return False
        for batch in batches:
            self.conn.send_batch(subscriber, batch, name)
        self._flush()
        return True
