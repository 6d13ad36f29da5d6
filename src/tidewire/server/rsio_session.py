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
and never reads the answers must not grow our buffers). Reading also pauses while too much is
received and not yet durable (the ingest's signal) and for good at shutdown; the session keeps
the reasons and asks the carrier to pause or resume reading once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

from ..hub import Hub, IngestLimits, RecordSubscription, Subscription
from ..hub.access import ANONYMOUS, Access, Principal, certificate_principal
from ..hub.listing import Listing
from ..model import Forbidden, TidewireError, Unauthenticated
from ..observe.logs import connection_log
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
from ..protocols.rsio.codec import OnNextDecoded, OnNextRun
from ..protocols.rsio.names import OfferName, PublisherName, PublisherNameError
from ..protocols.rsio.runs import OfferRun
from .guard import peer_certificate
from .rsio_offers import Inlet, Offers

__all__ = [
    "MAX_DELIVERY_BYTES",
    "MAX_INLET_BYTES",
    "MAX_OFFERS",
    "MAX_SUBSCRIPTIONS",
    "MAX_TXN_BYTES",
    "Carrier",
    "RsioSession",
    "RsioSettings",
]

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

    def ingest_limits(self) -> IngestLimits:
        """What the connection's :class:`~tidewire.hub.Ingest` is bounded by."""
        return IngestLimits(self.max_inlet_bytes, self.appends_in_flight, self.commit_bytes)


class Carrier(Protocol):
    """What carries a session's bytes (a TCP transport; a Tube connection on a WebSocket)."""

    def write_chunks(self, chunks: list[bytes | memoryview]) -> None:
        """Send ``chunks`` back to back (they are the peer's bytes in order; views into
        immutable buffers, to be sent without a copy where the carrier can)."""

    def pause_reading(self) -> None:
        """Read nothing more from the peer until :meth:`resume_reading`."""

    def resume_reading(self) -> None: ...

    def close(self) -> None:
        """Send what is queued, then close."""

    def abort(self) -> None:
        """Drop the connection at once, without a word."""

    def is_closing(self) -> bool: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """Facts about the connection, as ``asyncio.Transport`` names them: ``peername``,
        ``guard`` (the guard's connection: id and log context), the TLS ones (``peercert``,
        ``ssl_object``, ...)."""

    def established(self) -> None:
        """The RS.io handshake is over (the guard's handshake deadline no longer applies)."""


_Source = Subscription | Listing | RecordSubscription
"""What a pump delivers from."""


class RsioSession:
    """The hub's side of one RS.io connection. The carrier calls :meth:`start` once it is
    connected, :meth:`receive_data` with what it reads, :meth:`pause_writing` /
    :meth:`resume_writing` as its output crosses its water marks, and
    :meth:`connection_lost` at the end; the listener calls :meth:`quiesce`, :meth:`shutdown`
    and reads :attr:`busy`. While started and not lost, the session is in ``registry``."""

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
        self.pumps: dict[int, tuple[_Source, asyncio.Task[None]]] = {}
        self.ingest = hub.ingest(via=via, limits=settings.ingest_limits(),
                                 on_pause=self._inlet_paused)  # fmt: skip
        self.offers = Offers(self.conn, self.ingest, self.log, self._flush,
                             max_offers=settings.max_offers,
                             max_txn_bytes=settings.max_txn_bytes)  # fmt: skip
        self._pauses: set[str] = set()  # why reading is paused: "output", "inlet", "shutdown"
        self._writable = asyncio.Event()
        self._writable.set()

    # ------------------------------------------------------------------ the carrier's calls

    def start(self, carrier: Carrier) -> None:
        """The carrier is connected: say hello."""
        self.carrier = carrier
        self.log = self.offers.log = connection_log(log, carrier, self.via)
        self.peer = self.log.context.peer
        self.connection = self.log.context.conn
        if self.principal.anonymous:  # mutual TLS: the certificate names the peer
            self.principal = certificate_principal(peer_certificate(carrier)) or ANONYMOUS
        self.log.context.principal = self.ingest.principal = self.principal.name
        self.registry.add(self)
        self.conn.initiate()
        self._flush()

    def receive_data(self, data: bytes) -> None:
        """Bytes from the peer; ``b""``: the end of its stream."""
        self.conn.receive_data(data)
        self._handle_events()
        if data:
            self._flush()

    def connection_lost(self) -> None:
        """The carrier is gone: stop every pump and offer."""
        self.registry.discard(self)
        self._cancel_all()
        self._writable.set()

    def pause_writing(self) -> None:
        """The peer does not read fast enough: pumps wait, and so does reading its input."""
        self._writable.clear()
        self._pause("output")

    def resume_writing(self) -> None:
        self._writable.set()
        self._resume("output")

    # ------------------------------------------------------------------ the listener's calls

    def shutdown(self, reason: str) -> None:
        """Goodbye, then close (server shutdown)."""
        self._cancel_all()
        if not self.conn.closed:
            self.conn.send(Goodbye(reason))
            self._flush()
        if self.carrier is not None:
            self.carrier.close()

    def expire(self, reason: str) -> None:
        """A deadline of the guard's (handshake, idle): goodbye with the reason, and close."""
        self.shutdown(reason)

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
    def inlets(self) -> dict[int, Inlet]:
        """The offers being received, by offer id."""
        return self.offers.inlets

    # ------------------------------------------------------------------ reading

    def _inlet_paused(self, paused: bool) -> None:
        """The ingest path's signal: too much received and not yet durable, or room again."""
        if paused:
            self._pause("inlet")
        else:
            self._resume("inlet")

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
            carrier.resume_reading()

    # ------------------------------------------------------------------ events

    def _handle_events(self) -> None:
        offers = self.offers
        while (event := self.conn.next_event()) is not None:
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
                    self.log.info("subscription %d refused: %s", subscriber, reason)
                    self._stop(subscriber)
                case Offer(offer, publisher):
                    self._offer(offer, publisher)
                case Subscribed(subscriber, size):
                    offers.subscribed(subscriber, size)
                case OnComplete(subscriber):
                    offers.end(subscriber, None)
                case OnError(subscriber, error):
                    offers.end(subscriber, error)
                case OfferRefused(offer, reason):
                    self.log.info("offer %d refused: %s", offer, reason)
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
                        self.carrier.close()
                case _:
                    pass  # hellos, and messages for subscriptions we do not make

    def _authenticate(self, token: str) -> None:
        """Extension 2: the token names the principal from now on; a bad one ends the
        connection (goodbye), since the client asked to be someone it cannot prove to be."""
        try:
            self.principal = self.access.authenticate(token)
            self.log.context.principal = self.ingest.principal = self.principal.name
        except Unauthenticated as exc:
            self.log.warning("authentication failed: %s", exc)
            self.shutdown(f"authentication failed: {exc}")
            return
        self.log.info("authenticated as %s", self.principal)
        self.conn.send(Authenticated(self.principal.name))

    def _refused(self, exc: Forbidden) -> str:
        self.log.warning("refused: %s", exc)
        return f"forbidden: {exc}"

    def _source(self, publisher: str) -> tuple[_Source, PublisherName]:
        """What a subscription to ``publisher`` delivers from (checked against the ACL)."""
        if publisher.startswith("?"):  # the hub's own publishers (see docs)
            field_name, eq, value = publisher[1:].partition("=")
            if field_name != "streams":
                raise PublisherNameError(f"unknown hub publisher {publisher!r} (try '?streams')")
            names = [unquote(n, errors="strict") for n in value.split(",")] if eq and value else (
                None)  # fmt: skip
            listing = Listing(self.hub, names, self.access, self.principal)
            return listing, PublisherName("-", format="value")
        name = PublisherName.parse(publisher)
        self.access.check(self.principal, "read", name.stream)
        sub = self.hub.subscribe(
            name.stream, name.start, until_id=name.until, key=name.key,
            max_batch_bytes=MAX_DELIVERY_BYTES, via=self.via, connection=self.connection,
        )  # fmt: skip
        return (RecordSubscription(sub) if name.format == "records" else sub), name

    def _subscribe(self, publisher: str, subscriber: int, initial: int) -> None:
        if len(self.pumps) >= self.settings.max_subscriptions:
            limit = self.settings.max_subscriptions
            reason = f"too many subscriptions on this connection (the limit is {limit})"
            self.conn.send(OnError(subscriber, reason))
            return
        try:
            sub, name = self._source(publisher)
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
        self.offers.cancel_all()

    def _offer(self, offer: int, publisher: str) -> None:
        try:
            name = OfferName.parse(publisher)
        except PublisherNameError as exc:
            self.offers.refuse(offer, str(exc))
            return
        try:
            self.access.check(self.principal, "write", name.stream)
        except Forbidden as exc:
            self.conn.send(OfferEnded(offer, self._refused(exc)))
            return
        except Unauthenticated as exc:  # its token expired or was revoked since it authenticated
            self.conn.send(OfferEnded(offer, f"unauthenticated: {exc}"))
            return
        self.offers.open(offer, publisher, name)

    # ------------------------------------------------------------------ writing

    def _flush(self) -> None:
        chunks = self.conn.chunks_to_send()
        carrier = self.carrier
        if chunks and carrier is not None and not carrier.is_closing():
            carrier.write_chunks(chunks)

    async def _pump(self, subscriber: int, sub: _Source, name: PublisherName) -> None:
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
