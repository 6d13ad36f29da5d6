"""The RS.io connection state machine (sans-IO, in the manner of h11 and aioquic).

Bytes in (:meth:`Connection.receive_data`), events out (:meth:`Connection.next_event`, which
decodes and applies one message at a time, as h11 does), bytes to send out
(:meth:`Connection.data_to_send`); messages to send go through :meth:`Connection.send`,
which checks them against the state first (a :class:`LocalProtocolError` means a bug on this
side). No clock is needed: RS.io has no timers.

What it enforces: the handshake (loose: each side sends its hello first and may go on at once;
the first message received must be the peer's hello, version 0; extensions in use are those
both hellos list); subscriptions in both directions, keyed by the subscriber's id, whose
legality is the table in :mod:`.subscriptions`; never more elements than requested (Reactive
Streams 3.9: demand saturates at 2**63-1, unbounded), ``request(0)`` answered with ``onError``;
goodbye (sending it closes every subscription and waits for the peer's; receiving one is
answered with one); the offers of the publishing extension (:mod:`.offers`) and the
authentication extension (``authenticate`` at most once, client to hub).

A connection-level breach by the peer (an element frame for an id never subscribed is one at its
header, before its body is buffered) queues ``goodbye(reason)``, emits :class:`ConnectionClosed`
and ignores the rest; one scoped to a subscription queues its ``onError``
(:class:`SubscriptionErrored`).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence

from ...model import Batch, LocalProtocolError, RemoteProtocolError
from .codec import (
    Decoder,
    Limits,
    OfferProtocolError,
    OnNextDecoded,
    OnNextRun,
    SubscriptionProtocolError,
    encode,
)
from .delivery import Delivery
from .events import (
    ConnectionClosed,
    Event,
    HandshakeCompleted,
    OfferRefused,
    SubscriptionErrored,
)
from .messages import (
    EXT_AUTH,
    EXT_PUBLISH,
    MAX_REASON_CHARS,
    PROTOCOL_VERSION,
    Authenticate,
    Authenticated,
    ClientHello,
    Committed,
    Goodbye,
    Message,
    Offer,
    OfferEnded,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
    clip_reason,
)
from .names import PublisherName
from .offers import Offers
from .output import BIG_ELEMENT, SendQueue
from .runs import RunDecoder
from .subscriptions import (
    KIND_OF,
    SENT_BY_SUBSCRIBER,
    TRANSITIONS,
    UNBOUNDED,
    Kind,
    Side,
    Subscription,
    Subscriptions,
    SubState,
    element_count,
)

__all__ = [
    "BIG_ELEMENT",
    "Connection",
    "ConnectionClosed",
    "Event",
    "HandshakeCompleted",
    "OfferRefused",
    "Role",
    "State",
    "SubscriptionErrored",
]


# The states of our subscriptions in which the peer may send elements (in the others, FREE
# among them, an element frame is a breach at its header).
_ELEMENTS_ACCEPTED = frozenset(TRANSITIONS[(Side.SUBSCRIBER, Kind.ELEMENTS)])


class Role(enum.Enum):
    CLIENT = "client"  # opened the connection; sends clientHello
    SERVER = "server"  # accepted it; sends serverHello


class State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"  # our goodbye sent, waiting for the peer's
    CLOSED = "closed"


class Connection:
    """One RS.io connection, from one side. Create, then send the hello with
    :meth:`initiate` (either role may do so at once: the handshake is loose).

    The machine contract: :meth:`receive_data` (``b""``: the transport closed),
    :meth:`next_event`, :meth:`data_to_send` / :meth:`chunks_to_send`, and the bounds
    :attr:`buffered` (received, not yet decoded: a partial frame once the events are
    drained; more than ``limits.max_buffered_bytes`` is the peer's breach, answered with
    ``goodbye``) and :attr:`pending`. RS.io has no timers: there is no
    ``next_deadline`` / ``handle_timer``."""

    def __init__(
        self,
        role: Role,
        *,
        extensions: Iterable[int] = (),
        limits: Limits | None = None,
        runs: bool = False,
    ) -> None:
        """``runs=True``: consecutive variable-size ``onNext`` frames of one subscription come
        out as one :class:`OnNextRun` event."""
        self.role = role
        self.extensions = frozenset(extensions)
        self.state = State.OPEN
        self.peer_extensions: frozenset[int] | None = None
        self._out = SendQueue()
        self._events: deque[Event] = deque()
        self._mine = Subscriptions(Side.SUBSCRIBER)  # subscriptions we made
        self._theirs = Subscriptions(Side.PUBLISHER)  # subscriptions the peer made to us
        self._offers = Offers()  # open offers (extension 1)
        self._delivery = Delivery(self._out, self._theirs, self._count_offer)
        self._decoder = Decoder(
            limits, self._element_size_in, runs=runs, run_decoder=self._run_decoder_in,
            refuse_elements=self._refuse_elements,
        )  # fmt: skip
        # Three one-shot facts are flags beside ``state``, each on an axis of its own (may we
        # send; is more input coming; extension 2) and settable in any state: folding them in
        # would multiply the states for no transition (h11 keeps its end of input a flag too).
        self._hello_sent = False
        self._eof = False  # the transport ended: close once the buffered input is decoded
        # authenticate went by: sent (a client) or received (the hub); it goes one way only,
        # client to hub, so one flag holds both roles' "at most once"
        self._authenticate_seen = False

    # ------------------------------------------------------------------ handshake

    def initiate(self) -> None:
        """Queue our hello (call once, first)."""
        if self._hello_sent:
            raise LocalProtocolError("hello already sent")
        self._hello_sent = True
        hello_type = ClientHello if self.role is Role.CLIENT else ServerHello
        encode(hello_type(PROTOCOL_VERSION, tuple(sorted(self.extensions))), 0, self._out.tail)

    @property
    def negotiated(self) -> frozenset[int]:
        """Extensions both sides listed (empty until the peer's hello arrives)."""
        if self.peer_extensions is None:
            return frozenset()
        return self.extensions & self.peer_extensions

    @property
    def publishing(self) -> bool:
        """The publishing extension (1) is in use: both hellos listed it."""
        return EXT_PUBLISH in self.negotiated

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    # ------------------------------------------------------------------ output

    def data_to_send(self) -> bytes:
        """Everything queued for the peer, in order; empty when there is nothing."""
        return self._out.data()

    def chunks_to_send(self) -> list[bytes | memoryview]:
        """Everything queued for the peer, in order, as buffers to write back to back (big
        elements given to :meth:`send_elements` come uncopied)."""
        return self._out.chunks()

    @property
    def pending(self) -> int:
        """Bytes queued for the peer and not yet taken."""
        return self._out.pending

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return self._decoder.buffered

    @property
    def awaiting(self) -> int:
        """Bytes the frame begun has declared (an element's length, a String's) and not yet
        delivered. An adapter charges ``buffered + awaiting`` to its memory budget before
        reading on, and calls :meth:`refuse_input` when it does not fit."""
        return 0 if self.state is State.CLOSED else self._decoder.awaiting

    @property
    def frames_received(self) -> int:
        """Frames decoded so far (refused ones too): the peer's progress."""
        return self._decoder.decoded

    def refuse_input(self, reason: str) -> None:
        """End the connection for a frame the adapter will not hold (its declared body is
        over the memory budget): a breach, ``goodbye("protocol error: <reason>")``."""
        if self.state is not State.CLOSED:
            self._breach(reason)

    def send(self, message: Message) -> None:
        """Check ``message`` against the state, then queue it. Raises
        :class:`LocalProtocolError` for a message the protocol forbids now."""
        if not self._hello_sent:
            raise LocalProtocolError("send the hello first (initiate())")
        if self.state is not State.OPEN:
            raise LocalProtocolError(
                f"cannot send {type(message).__name__}: connection {self.state.value}"
            )
        match message:
            case OnError(subscriber, error) if len(error) > MAX_REASON_CHARS:
                message = OnError(subscriber, clip_reason(error))
            case Goodbye(reason) if len(reason) > MAX_REASON_CHARS:
                message = Goodbye(clip_reason(reason))
            case OfferEnded(offer_id, error) if len(error) > MAX_REASON_CHARS:
                message = OfferEnded(offer_id, clip_reason(error))
        kind = KIND_OF.get(type(message))
        if kind is not None:
            self._send_subscription_message(kind, message)
            return
        self._send_connection_message(message)
        encode(message, 0, self._out.tail)

    def _send_subscription_message(self, kind: Kind, message: Message) -> None:
        if isinstance(message, OnNext | OnNextPacked):
            self._delivery.message(message)
            return
        subscriber: int = message.subscriber  # type: ignore[union-attr]
        table = self._mine if kind in SENT_BY_SUBSCRIBER else self._theirs
        if isinstance(message, Request) and table.is_open(subscriber) and message.demand < 1:
            raise LocalProtocolError("request(n) needs n >= 1 (Reactive Streams 3.9)")
        initial = message.initial_demand if isinstance(message, Subscribe) else 0
        sub, _ = table.apply(kind, subscriber, type(message).__name__, initial_demand=initial)
        if isinstance(message, Request) and sub is not None:
            sub.grant(message.demand)
        elif isinstance(message, Subscribed) and sub is not None:
            sub.element_size = message.element_size
        encode(message, 0, self._out.tail)

    def _count_offer(self, subscriber: int, count: int) -> None:
        if self._offers and self.role is Role.CLIENT:  # elements into an offer
            self._offers.count_delivered(subscriber, count)

    def _send_connection_message(self, message: Message) -> None:
        """Check a message that belongs to no subscription (then the caller encodes it)."""
        match message:
            case Goodbye():
                # Every subscription ends here; the tables stay until the peer's goodbye so
                # that what crosses ours is still delimited right (fixed-size elements).
                self.state = State.CLOSING
            case Offer(offer):
                self._check_extension(message, EXT_PUBLISH, Role.CLIENT)
                if not self.can_offer(offer):
                    raise LocalProtocolError(f"offer id {offer} is in use")
                self._offers.sent(message, self._mine.is_open)
            case Committed() | OfferEnded():
                self._check_extension(message, EXT_PUBLISH, Role.SERVER)
                self._offers.sent(message, self._mine.is_open)
            case Authenticate():
                self._check_extension(message, EXT_AUTH, Role.CLIENT)
                if self._authenticate_seen:
                    raise LocalProtocolError("authenticate is sent at most once")
                self._authenticate_seen = True
            case Authenticated():
                self._check_extension(message, EXT_AUTH, Role.SERVER)
            case _:
                raise LocalProtocolError("the hello is sent by initiate()")

    def _check_extension(self, message: Message, extension: int, sender: Role) -> None:
        if extension not in self.negotiated:
            what = "publishing" if extension == EXT_PUBLISH else "authentication"
            raise LocalProtocolError(
                f"{type(message).__name__} needs the {what} extension ({extension}) in both hellos"
            )
        if self.role is not sender:
            raise LocalProtocolError(f"only the {sender.value} sends {type(message).__name__}")

    # ------------------------------------------------------------------ queries

    def can_offer(self, offer: int) -> bool:
        """Whether ``offer`` may name a new offer (no offer, no peer's subscription uses it)."""
        return offer not in self._offers and offer not in self._theirs.subs

    def free_offer_id(self) -> int:
        offer = 1
        while not self.can_offer(offer):
            offer += 1
        return offer

    def offer_delivered(self, offer: int) -> int:
        """Elements delivered on an open offer's subscription so far (0 if none)."""
        return self._offers.delivered(offer)

    def can_subscribe(self, subscriber: int) -> bool:
        """Whether ``subscribe`` may use this id now: it is free, or its subscription was
        cancelled after its ``subscribed`` arrived (**decision**: an id cancelled before that
        stays taken until the ``subscribed`` arrives)."""
        return self._mine.state(subscriber) in TRANSITIONS[(Side.SUBSCRIBER, Kind.SUBSCRIBE)]

    def free_subscriber_id(self) -> int:
        """The lowest id :meth:`can_subscribe` accepts."""
        subscriber = 1
        while not self.can_subscribe(subscriber):
            subscriber += 1
        return subscriber

    def is_subscribed(self, subscriber: int) -> bool:
        """Whether our subscription ``subscriber`` is open (not cancelled, not ended)."""
        return self._mine.is_open(subscriber) and self.state is State.OPEN

    def peer_subscribed(self, subscriber: int) -> bool:
        """Whether the peer's subscription ``subscriber`` to us is open."""
        return subscriber in self._theirs.subs and self.state is State.OPEN

    def demand(self, subscriber: int) -> int:
        """Outstanding demand of a subscription the peer made to us (0 if none)."""
        sub = self._theirs.subs.get(subscriber)
        return sub.demand if sub is not None and self.state is State.OPEN else 0

    # ------------------------------------------------------------------ elements, in bulk

    def _check_open(self) -> None:
        if self.state is not State.OPEN or not self._hello_sent:
            raise LocalProtocolError(f"cannot send onNext: connection {self.state.value}")

    def send_elements(
        self,
        subscriber: int,
        elements: Sequence[bytes | memoryview],
        heads: Sequence[bytes] | None = None,
    ) -> None:
        """Send ``elements`` to the peer's subscription ``subscriber`` as ``onNext`` frames
        (as many :meth:`send` calls would, far cheaper). With ``heads``, element ``i`` is
        ``heads[i] + elements[i]`` (never joined in memory). Elements of ``BIG_ELEMENT`` bytes
        or more are queued uncopied (see :meth:`chunks_to_send`). Variable-size mode only."""
        self._check_open()
        self._delivery.elements(subscriber, elements, heads)

    def send_frames(self, subscriber: int, count: int, frames: bytes) -> None:
        """Queue ``count`` ``onNext`` frames for the peer's subscription ``subscriber``, already
        encoded back to back by the caller (e.g. ``runs.envelope_frames``): the state is
        checked and updated as ``count`` elements; the bytes are trusted to be exactly those
        frames (the hub's hot path, where even :meth:`send_elements` costs too much)."""
        self._check_open()
        self._delivery.frames(subscriber, count, frames)

    def send_batch(self, subscriber: int, batch: Batch, name: PublisherName) -> None:
        """Send ``batch`` to the peer's subscription ``subscriber`` in the element format
        ``name`` asks for: packed fixed-size values (``size=N``; another size raises
        :class:`~tidewire.model.TidewireError`), one log record per batch (``format=records``),
        the values (``format=value``), or envelopes (big values as zero-copy views behind
        their headers). Counts against demand as the elements it sends."""
        self._check_open()
        self._delivery.batch(subscriber, batch, name)

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes (a view may be reused after the call); ``b""``: the transport closed.
        Nothing is decoded until :meth:`next_event` asks: each message is applied only after
        the application has handled the events before it (so a ``request(0)`` right behind
        its ``subscribe`` meets the subscription the application has just answered)."""
        if self.state is State.CLOSED:
            return
        if not data:
            self._eof = True
            return
        try:
            self._decoder.feed(data)
        except RemoteProtocolError as exc:  # more than limits.max_buffered_bytes undecoded
            self._breach(str(exc))

    def next_event(self, max_frames: int = 0) -> Event | None:
        """The next event, or ``None`` when there is none until more data arrives.

        ``max_frames`` > 0 bounds one call's work: after that many frames without an event
        (e.g. quietly dropped requests for closed ids) it returns ``None`` though more input
        may wait (:attr:`frames_received` tells). An adapter working in slices uses it."""
        stop = self._decoder.decoded + max_frames if max_frames > 0 else -1
        while not self._events and not self.closed:
            if self._decoder.decoded == stop:
                break
            try:
                message = self._decoder.next_message()
            except OfferProtocolError as exc:
                self._refuse_offer(exc.subscriber, str(exc))
                continue
            except SubscriptionProtocolError as exc:
                if self.peer_extensions is None:  # not even a hello first: the connection
                    expected = ServerHello if self.role is Role.CLIENT else ClientHello
                    self._breach(f"expected {expected.__name__} first, got Subscribe ({exc})")
                    break
                if exc.subscriber in self._theirs.subs:
                    self._breach(f"subscribe reuses open subscriber id {exc.subscriber}")
                    break
                if self.state is State.OPEN:
                    self._refuse_theirs(exc.subscriber, str(exc))
                continue
            except RemoteProtocolError as exc:
                self._breach(str(exc))
                break
            if message is None:
                if self._eof:
                    self._close("transport closed", by_peer=True, error=self.state is State.OPEN)
                break
            try:
                self._receive(message)
            except RemoteProtocolError as exc:
                self._breach(str(exc))
        return self._events.popleft() if self._events else None

    def set_run_decoder(self, subscriber: int, decoder: RunDecoder | None) -> None:
        """Decode runs of ``onNext`` frames for our (variable-size) subscription
        ``subscriber`` with ``decoder``: they come out as :class:`OnNextDecoded` events, never
        more elements at once than the outstanding demand. For the subscriber's hot path,
        where the element format is known (``runs.envelope_run_decoder``; the hub's offers:
        ``runs.offer_run_decoder``)."""
        sub = self._mine.subs.get(subscriber)
        if sub is None or not self._mine.is_open(subscriber):
            raise LocalProtocolError(f"set_run_decoder: subscription {subscriber} is not open")
        sub.run_decoder = decoder

    def _run_decoder_in(self, subscriber: int) -> tuple[RunDecoder, int] | None:
        sub = self._mine.subs.get(subscriber)
        if (
            sub is None
            or sub.run_decoder is None
            or sub.state is not SubState.ACTIVE
            or sub.element_size
            or sub.demand <= 0
        ):
            return None
        return sub.run_decoder, sub.demand

    def _refuse_elements(self, subscriber: int, name: str) -> str | None:
        """The header check of an element frame (see the codec): a reason when no
        subscription of ours may receive elements on ``subscriber`` (never made, ended, not
        yet confirmed). After our goodbye, what crosses it is dropped as before."""
        if self.peer_extensions is None:
            expected = ServerHello if self.role is Role.CLIENT else ClientHello
            return f"expected {expected.__name__} first, got {name}"
        if self.state is not State.OPEN:
            return None
        if self._mine.state(subscriber) in _ELEMENTS_ACCEPTED:
            return None
        return f"elements for subscriber {subscriber}, which is not subscribed"

    def _element_size_in(self, subscriber: int) -> int:
        sub = self._mine.subs.get(subscriber)
        return 0 if sub is None else sub.incoming_element_size

    def _receive(self, message: Message | OnNextRun | OnNextDecoded) -> None:
        if self.peer_extensions is None:
            self._receive_hello(message)
            return
        if isinstance(message, ClientHello | ServerHello):
            raise RemoteProtocolError("a second hello")
        if isinstance(message, Goodbye):
            if self.state is State.OPEN:
                encode(Goodbye("goodbye acknowledged"), 0, self._out.tail)
            self._close(message.reason, by_peer=self.state is State.OPEN)
            return
        if self.state is State.CLOSING:
            return  # our goodbye closed every subscription: drop what crosses it
        kind = KIND_OF.get(type(message))
        if kind is not None:
            report = self._receive_subscription_message(kind, message)
        else:
            self._receive_connection_message(message)
            report = True
        if report:
            self._events.append(message)

    def _receive_hello(self, message: Message | OnNextRun | OnNextDecoded) -> None:
        expected = ServerHello if self.role is Role.CLIENT else ClientHello
        if not isinstance(message, expected):
            raise RemoteProtocolError(
                f"expected {expected.__name__} first, got {type(message).__name__}"
            )
        if message.version != PROTOCOL_VERSION:
            raise RemoteProtocolError(
                f"unsupported protocol version {message.version} (this side speaks 0)"
            )
        self.peer_extensions = frozenset(message.extensions)
        self._decoder.publishing = self.publishing
        self._decoder.auth = EXT_AUTH in self.negotiated
        self._events.append(HandshakeCompleted(message.version, self.negotiated))

    def _receive_subscription_message(
        self, kind: Kind, message: Message | OnNextRun | OnNextDecoded
    ) -> bool:
        """Apply a subscription message from the peer; whether the application hears of it."""
        subscriber: int = message.subscriber  # type: ignore[union-attr]
        table = self._theirs if kind in SENT_BY_SUBSCRIBER else self._mine
        if isinstance(message, Request) and message.demand == 0 and table.is_open(subscriber):
            self._refuse_theirs(subscriber, "request(0): demand must be >= 1 (RS 3.9)")
            return False
        initial = message.initial_demand if isinstance(message, Subscribe) else 0
        sub, report = table.apply(kind, subscriber, type(message).__name__, initial_demand=initial)
        if sub is not None and isinstance(message, Subscribed):  # (a cancelled one's too)
            sub.element_size = message.element_size
        if sub is None or not report:
            return report
        if isinstance(message, Request):
            sub.grant(message.demand)
        elif kind is Kind.ELEMENTS:
            self._receive_elements(sub, subscriber, message)
        return True

    def _receive_elements(
        self, sub: Subscription, subscriber: int, message: Message | OnNextRun | OnNextDecoded
    ) -> None:
        count = element_count(message)
        if count > sub.demand:
            if isinstance(message, OnNextRun) and sub.demand:  # those within demand
                self._events.append(OnNextRun(subscriber, message.elements[: sub.demand]))
                count -= sub.demand
                sub.demand = 0
            raise RemoteProtocolError(
                f"{count} element(s) for subscriber {subscriber} exceed the demand of {sub.demand}"
            )
        if sub.demand < UNBOUNDED:
            sub.demand -= count
        if self._offers and self.role is Role.SERVER:  # an offer's elements
            self._offers.count_delivered(subscriber, count)

    def _receive_connection_message(self, message: Message | OnNextRun | OnNextDecoded) -> None:
        """Check a message from the peer that belongs to no subscription."""
        match message:
            case Offer():
                if self.role is not Role.SERVER:
                    raise RemoteProtocolError("offer sent to the client")
                self._offers.received(message, self._theirs.subs.__contains__)
            case Committed(offer) | OfferEnded(offer):
                if self.role is not Role.CLIENT:
                    what = "committed" if isinstance(message, Committed) else "offerEnded"
                    raise RemoteProtocolError(f"{what} for offer {offer}, which is not open")
                self._offers.received(message, self._theirs.subs.__contains__)
            case Authenticate():
                if self.role is not Role.SERVER:
                    raise RemoteProtocolError("authenticate sent to the client")
                if self._authenticate_seen:
                    raise RemoteProtocolError("a second authenticate")
                self._authenticate_seen = True
            case Authenticated():
                if self.role is not Role.CLIENT:
                    raise RemoteProtocolError("authenticated sent to the hub")

    # ------------------------------------------------------------------ breaches and the end

    def _refuse_theirs(self, subscriber: int, reason: str) -> None:
        """A breach scoped to one subscription the peer made: onError, and it is closed."""
        self._theirs.subs.pop(subscriber, None)
        encode(OnError(subscriber, clip_reason(reason)), 0, self._out.tail)
        self._events.append(SubscriptionErrored(subscriber, reason, outbound=False))

    def _refuse_offer(self, offer: int, reason: str) -> None:
        if self.state is not State.OPEN:
            return
        if self.role is not Role.SERVER or offer in self._offers:
            self._breach(f"offer {offer}: {reason}")
            return
        encode(OfferEnded(offer, clip_reason(reason)), 0, self._out.tail)
        self._events.append(OfferRefused(offer, reason))

    def _breach(self, reason: str) -> None:
        if self.state is State.OPEN:
            encode(Goodbye(clip_reason(f"protocol error: {reason}")), 0, self._out.tail)
        self._close(reason, by_peer=False, error=True)

    def _close(self, reason: str, *, by_peer: bool, error: bool = False) -> None:
        self.state = State.CLOSED
        self._mine.clear()
        self._theirs.clear()
        self._offers.clear()
        self._events.append(ConnectionClosed(reason, by_peer, error))
