"""The RS.io connection state machine (sans-IO, in the manner of h11 and aioquic).

Bytes in (:meth:`Connection.receive_data`), events out (:meth:`Connection.next_event`, which
decodes and applies one message at a time, as h11 does), bytes to send out
(:meth:`Connection.data_to_send`); messages to send go through :meth:`Connection.send`,
which checks them against the state first (a :class:`LocalProtocolError` means a bug on this
side). No clock is needed: RS.io has no timers.

What it enforces:

* **Handshake** (loose): each side sends its hello first and may go on sending at once; the first
  message received must be the peer's hello, with version 0, else goodbye + close. Extensions
  in use are those both hellos list.
* **Subscriptions in both directions**, keyed by the subscriber's id (the same number may name
  one subscription each way). As subscriber: ``subscribe`` → ``subscribed`` → ``onNext``… →
  ``onComplete``/``onError``; after our ``cancel`` late elements are dropped quietly (Reactive
  Streams 2.8). As publisher: never more elements than requested (3.9: demand saturates at
  2**63-1, which means unbounded), ``request(0)`` answered with ``onError`` (3.9).
* **Id reuse**: an id is free again after ``cancel`` was sent or ``onComplete``/``onError``
  received (subscriber side), or after ``cancel`` was received or ``onComplete``/``onError``
  sent (publisher side). A ``subscribe`` for an id still open is a breach.
* **Goodbye**: sending it closes every subscription and waits for the peer's goodbye; receiving
  one is answered with a goodbye, and the connection is then closed.
* **Publishing** (extension 1, once both hellos list it): the client ``offer``s a publisher; the
  hub subscribes to it with subscriber id = the offer id, acknowledges durable elements with
  ``committed`` (never more than were delivered) and ends the offer with ``offerEnded`` once its
  subscription is closed; the offer id is then free.

A connection-level breach by the peer queues ``goodbye(reason)``, emits
:class:`ConnectionClosed` and ignores everything after; a breach scoped to one subscription
queues ``onError`` for it and emits :class:`SubscriptionErrored`.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ...model import LocalProtocolError, RemoteProtocolError
from .codec import (
    Decoder,
    Limits,
    OfferProtocolError,
    OnNextDecoded,
    OnNextRun,
    RunDecoder,
    SubscriptionProtocolError,
    encode,
)
from .messages import (
    EXT_AUTH,
    EXT_PUBLISH,
    PROTOCOL_VERSION,
    Authenticate,
    Authenticated,
    Cancel,
    ClientHello,
    Committed,
    Goodbye,
    Message,
    MessageType,
    Offer,
    OfferEnded,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
)
from .varint import MAX_LONG, push_varint

_SMALL = [bytes((i,)) for i in range(0x80)]

BIG_ELEMENT = 16 * 1024
"""Elements this big are queued by reference (zero-copy), smaller ones are joined."""

MAX_REASON_CHARS = 1000
"""Reasons this side sends (goodbye, onError, offerEnded) are clipped to this many characters
(at most 4000 bytes of UTF-8, far below any peer's String limit): they often quote the peer's
input, which may be as long as the peer's own limit allows."""


def clip_reason(reason: str) -> str:
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "…"

__all__ = [
    "Connection",
    "ConnectionClosed",
    "Event",
    "HandshakeCompleted",
    "OfferRefused",
    "Role",
    "SubscriptionErrored",
]

UNBOUNDED = MAX_LONG


class Role(enum.Enum):
    CLIENT = "client"  # opened the connection; sends clientHello
    SERVER = "server"  # accepted it; sends serverHello


class State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"  # our goodbye sent, waiting for the peer's
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class HandshakeCompleted:
    """The peer's hello arrived; ``extensions`` are those both sides listed."""

    version: int
    extensions: frozenset[int]


@dataclass(frozen=True, slots=True)
class SubscriptionErrored:
    """We answered a peer's breach for one subscription with ``onError`` (it is now closed)."""

    subscriber: int
    reason: str
    outbound: bool  # True: one of our subscriptions; False: one the peer made to us


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """No more messages either way. ``by_peer``: the peer said goodbye (or closed the
    transport); else we did (after our goodbye's acknowledgement, or after a breach)."""

    reason: str
    by_peer: bool
    error: bool = False  # a protocol breach, not an orderly goodbye


@dataclass(frozen=True, slots=True)
class OfferRefused:
    """We answered a malformed ``offer`` with ``offerEnded`` (hub side)."""

    offer: int
    reason: str


Event = (
    Message
    | OnNextRun
    | OnNextDecoded
    | HandshakeCompleted
    | SubscriptionErrored
    | OfferRefused
    | ConnectionClosed
)


class _SubState(enum.Enum):
    REQUESTED = "requested"  # subscribe sent/received, subscribed not yet
    ACTIVE = "active"
    CANCELLED = "cancelled"  # subscriber side: cancel sent, late elements are dropped


@dataclass(slots=True)
class _Sub:
    state: _SubState
    demand: int  # outstanding: granted by the subscriber, not yet delivered
    element_size: int = 0
    # Subscriber side, an id reused right after cancel: until ``subscribed`` arrives, what
    # comes for the id belongs to the cancelled subscription (decoded with its element size).
    draining: bool = False
    old_element_size: int = 0
    confirmed: bool = False  # ``subscribed`` arrived (subscriber side)
    run_decoder: RunDecoder | None = None  # subscriber side: see Connection.set_run_decoder


@dataclass(slots=True)
class _Table:
    """The subscriptions of one direction."""

    subs: dict[int, _Sub] = field(default_factory=dict)

    def open(self, subscriber: int) -> _Sub | None:
        sub = self.subs.get(subscriber)
        return sub if sub is not None and sub.state is not _SubState.CANCELLED else None


@dataclass(slots=True)
class _Offer:
    delivered: int = 0  # elements sent (client) / received (hub) on the offer's subscription
    committed: int = 0


def _add_demand(current: int, n: int) -> int:
    return min(UNBOUNDED, current + n)


class Connection:
    """One RS.io connection, from one side. Create, then send the hello with
    :meth:`initiate` (either role may do so at once: the handshake is loose)."""

    def __init__(
        self,
        role: Role,
        *,
        extensions: Iterable[int] = (),
        limits: Limits | None = None,
        runs: bool = False,
    ) -> None:
        """``runs=True``: consecutive variable-size ``onNext`` frames for one subscription come
        out as one :class:`OnNextRun` event (the subscriber's hot path)."""
        self.role = role
        self.extensions = frozenset(extensions)
        self.state = State.OPEN
        self.peer_extensions: frozenset[int] | None = None
        self._out = bytearray()
        self._chunks: list[bytes | memoryview] = []  # queued before _out: see chunks_to_send
        self._events: deque[Event] = deque()
        self._mine = _Table()  # subscriptions we made (we are the subscriber)
        self._theirs = _Table()  # subscriptions the peer made to us (we publish)
        self._offers: dict[int, _Offer] = {}  # open offers (extension 1), by offer id
        self._decoder = Decoder(
            limits, self._element_size_in, runs=runs, run_decoder=self._run_decoder_in
        )
        self._hello_sent = False
        self._eof = False
        self._auth_sent = False  # extension 2: authenticate is sent (received) at most once
        self._auth_received = False

    # ------------------------------------------------------------------ handshake

    def initiate(self) -> None:
        """Queue our hello (call once, first)."""
        if self._hello_sent:
            raise LocalProtocolError("hello already sent")
        self._hello_sent = True
        hello_type = ClientHello if self.role is Role.CLIENT else ServerHello
        self._out += encode(hello_type(PROTOCOL_VERSION, tuple(sorted(self.extensions))))

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

    # ------------------------------------------------------------------ output

    def data_to_send(self) -> bytes:
        """Everything queued for the peer, in order; empty when there is nothing."""
        if self._chunks:
            return b"".join(self.chunks_to_send())
        data = bytes(self._out)
        self._out.clear()
        return data

    def chunks_to_send(self) -> list[bytes | memoryview]:
        """Everything queued for the peer, in order, as buffers to write back to back (e.g.
        with ``transport.writelines``): big elements given to :meth:`send_elements` come as
        they were given, uncopied."""
        chunks = self._chunks
        self._chunks = []
        if self._out:
            chunks.append(bytes(self._out))
            self._out.clear()
        return chunks

    @property
    def pending_output(self) -> int:
        return len(self._out) + sum(len(c) for c in self._chunks)

    def send(self, message: Message) -> None:
        """Check ``message`` against the state, then queue it. Raises
        :class:`LocalProtocolError` for a message the protocol forbids now."""
        if not self._hello_sent:
            raise LocalProtocolError("send the hello first (initiate())")
        if self.state is not State.OPEN:
            raise LocalProtocolError(
                f"cannot send {type(message).__name__}: connection {self.state.value}"
            )
        size = 0
        match message:
            case OnError(subscriber, error) if len(error) > MAX_REASON_CHARS:
                message = OnError(subscriber, clip_reason(error))
            case Goodbye(reason) if len(reason) > MAX_REASON_CHARS:
                message = Goodbye(clip_reason(reason))
            case OfferEnded(offer_id, error) if len(error) > MAX_REASON_CHARS:
                message = OfferEnded(offer_id, clip_reason(error))
        match message:
            case ClientHello() | ServerHello():
                raise LocalProtocolError("the hello is sent by initiate()")
            case Goodbye():
                # Every subscription ends here; the tables stay until the peer's goodbye so
                # that what crosses ours is still delimited right (fixed-size elements).
                self.state = State.CLOSING
            # --- as subscriber
            case Subscribe(_, subscriber, initial):
                if not self.can_subscribe(subscriber):
                    raise LocalProtocolError(
                        f"subscriber id {subscriber} is still open, or was cancelled before its "
                        "subscribed arrived (then which subscribed answers which is unknowable)"
                    )
                old = self._mine.subs.get(subscriber)
                self._mine.subs[subscriber] = _Sub(
                    _SubState.REQUESTED,
                    initial,
                    draining=old is not None,
                    old_element_size=old.element_size if old is not None else 0,
                )
            case Request(subscriber, n):
                sub = self._mine.open(subscriber)
                if sub is None:
                    raise LocalProtocolError(f"request for subscriber {subscriber}, not open")
                if n < 1:
                    raise LocalProtocolError("request(n) needs n >= 1 (Reactive Streams 3.9)")
                sub.demand = _add_demand(sub.demand, n)
            case Cancel(subscriber):
                sub = self._mine.open(subscriber)
                if sub is None:
                    raise LocalProtocolError(f"cancel for subscriber {subscriber}, not open")
                sub.state = _SubState.CANCELLED
            # --- as publisher
            case Subscribed(subscriber, element_size):
                sub = self._theirs.subs.get(subscriber)
                if sub is None or sub.state is not _SubState.REQUESTED:
                    raise LocalProtocolError(f"subscribed for {subscriber}: no subscribe pending")
                sub.state = _SubState.ACTIVE
                sub.element_size = element_size
            case OnNext(subscriber) | OnNextPacked(subscriber):
                sub = self._active_theirs(subscriber, type(message).__name__)
                count = message.count if isinstance(message, OnNextPacked) else 1
                frame = encode(message, sub.element_size)  # refuses a wrong size, changes nothing
                if count > sub.demand:
                    raise LocalProtocolError(
                        f"{count} element(s) for subscriber {subscriber} exceed its demand of "
                        f"{sub.demand} (Reactive Streams 1.1)"
                    )
                if sub.demand < UNBOUNDED:
                    sub.demand -= count
                if self._offers and self.role is Role.CLIENT:  # elements into an offer
                    self._delivered(subscriber, count)
                self._out += frame
                return
            case OnComplete(subscriber) | OnError(subscriber):
                sub = self._theirs.subs.get(subscriber)
                if sub is None:
                    raise LocalProtocolError(f"{type(message).__name__} for {subscriber}: not open")
                del self._theirs.subs[subscriber]
            # --- publishing (extension 1)
            case Offer(offer):
                self._check_publishing(message, Role.CLIENT)
                if not self.can_offer(offer):
                    raise LocalProtocolError(f"offer id {offer} is in use")
                self._offers[offer] = _Offer()
            case Committed(offer, count):
                self._check_publishing(message, Role.SERVER)
                state = self._offers.get(offer)
                if state is None or state.committed + count > state.delivered:
                    raise LocalProtocolError(f"committed({offer}, {count}): offer not open, or "
                                             "more than was delivered")  # fmt: skip
                state.committed += count
            case OfferEnded(offer, error):
                self._check_publishing(message, Role.SERVER)
                state = self._offers.get(offer)
                if state is None:
                    raise LocalProtocolError(f"offerEnded({offer}): offer not open")
                if self._mine.open(offer) is not None:
                    raise LocalProtocolError(
                        f"offerEnded({offer}) while its subscription is open: cancel it first"
                    )
                if not error and state.committed != state.delivered:
                    raise LocalProtocolError(
                        f"offerEnded({offer}, '') with {state.delivered - state.committed} "
                        "element(s) not committed: give the reason they were not"
                    )
                del self._offers[offer]
            # --- authentication (extension 2)
            case Authenticate():
                self._check_auth(message, Role.CLIENT)
                if self._auth_sent:
                    raise LocalProtocolError("authenticate is sent at most once")
                self._auth_sent = True
            case Authenticated():
                self._check_auth(message, Role.SERVER)
        encode(message, size, self._out)

    def _delivered(self, subscriber: int, count: int) -> None:
        """Count elements of the offer ``subscriber`` (only the hub's subscription to the client
        carries an offer's elements: the caller checks the direction)."""
        offer = self._offers.get(subscriber)
        if offer is not None:
            offer.delivered += count

    def _check_publishing(self, message: Message, sender: Role) -> None:
        if not self.publishing:
            raise LocalProtocolError(
                f"{type(message).__name__} needs the publishing extension (1) in both hellos"
            )
        if self.role is not sender:
            raise LocalProtocolError(f"only the {sender.value} sends {type(message).__name__}")

    def _check_auth(self, message: Message, sender: Role) -> None:
        if EXT_AUTH not in self.negotiated:
            raise LocalProtocolError(
                f"{type(message).__name__} needs the authentication extension (2) in both hellos"
            )
        if self.role is not sender:
            raise LocalProtocolError(f"only the {sender.value} sends {type(message).__name__}")

    def can_offer(self, offer: int) -> bool:
        """Whether ``offer`` may name a new offer: no offer and no subscription of the peer's
        to us uses the id."""
        return offer not in self._offers and offer not in self._theirs.subs

    def free_offer_id(self) -> int:
        offer = 1
        while not self.can_offer(offer):
            offer += 1
        return offer

    def offer_delivered(self, offer: int) -> int:
        """Elements delivered on an open offer's subscription so far (0 if none)."""
        state = self._offers.get(offer)
        return state.delivered if state is not None else 0

    def send_elements(
        self,
        subscriber: int,
        elements: Sequence[bytes | memoryview],
        heads: Sequence[bytes] | None = None,
    ) -> None:
        """Send ``elements`` to the peer's subscription ``subscriber`` as ``onNext`` frames
        (as many :meth:`send` calls would, at a fraction of the cost: the publisher's hot
        path). With ``heads``, element ``i`` is ``heads[i] + elements[i]`` (e.g. an envelope's
        header and its value, never joined in memory). Elements of ``BIG_ELEMENT`` bytes or
        more are queued as they are, not copied (see :meth:`chunks_to_send`). Variable-size
        mode only; a fixed-size subscription takes ``OnNextPacked``."""
        if self.state is not State.OPEN or not self._hello_sent:
            raise LocalProtocolError(f"cannot send onNext: connection {self.state.value}")
        sub = self._active_theirs(subscriber, "onNext")
        count = len(elements)
        if sub.element_size:
            raise LocalProtocolError("send_elements is for variable-size subscriptions")
        if heads is not None and len(heads) != count:
            raise LocalProtocolError(f"{len(heads)} heads for {count} elements")
        if count > sub.demand:
            raise LocalProtocolError(
                f"{count} element(s) for subscriber {subscriber} exceed its demand of "
                f"{sub.demand} (Reactive Streams 1.1)"
            )
        if sub.demand < UNBOUNDED:
            sub.demand -= count
        if self._offers and self.role is Role.CLIENT:  # elements into an offer
            self._delivered(subscriber, count)
        head = bytearray()
        push_varint(head, MessageType.ON_NEXT)
        push_varint(head, subscriber)
        prefix = bytes(head)
        small = _SMALL
        parts: list[bytes | memoryview] = []
        append = parts.append
        chunks = self._chunks
        for i, element in enumerate(elements):
            extra = b"" if heads is None else heads[i]
            n = len(element) + len(extra)
            append(prefix)
            if n < 0x80:
                append(small[n])
            else:
                size = bytearray()
                push_varint(size, n)
                append(bytes(size))
            if extra:
                append(extra)
            if len(element) >= BIG_ELEMENT:
                if self._out:
                    chunks.append(bytes(self._out))
                    self._out.clear()
                chunks.append(b"".join(parts))
                chunks.append(element)
                parts.clear()
            else:
                append(element)
        if parts:  # _out always follows every chunk
            self._out += b"".join(parts)

    def send_frames(self, subscriber: int, count: int, frames: bytes) -> None:
        """Queue ``count`` ``onNext`` frames for the peer's subscription ``subscriber``, already
        encoded back to back by the caller (e.g. ``publisher.envelope_frames``): the state is
        checked and updated as ``count`` elements; the bytes are trusted to be exactly those
        frames (the hub's hot path, where even :meth:`send_elements` costs too much)."""
        if self.state is not State.OPEN or not self._hello_sent:
            raise LocalProtocolError(f"cannot send onNext: connection {self.state.value}")
        sub = self._active_theirs(subscriber, "onNext")
        if sub.element_size:
            raise LocalProtocolError("send_frames is for variable-size subscriptions")
        if count > sub.demand:
            raise LocalProtocolError(
                f"{count} element(s) for subscriber {subscriber} exceed its demand of "
                f"{sub.demand} (Reactive Streams 1.1)"
            )
        if sub.demand < UNBOUNDED:
            sub.demand -= count
        if self._offers and self.role is Role.CLIENT:  # elements into an offer
            self._delivered(subscriber, count)
        self._out += frames

    def _active_theirs(self, subscriber: int, what: str) -> _Sub:
        sub = self._theirs.subs.get(subscriber)
        if sub is None or sub.state is not _SubState.ACTIVE:
            raise LocalProtocolError(f"{what} for subscriber {subscriber}: not subscribed")
        return sub

    def can_subscribe(self, subscriber: int) -> bool:
        """Whether ``subscribe`` may use this id now: it is free, or its subscription was
        cancelled after its ``subscribed`` arrived (**decision**: an id cancelled before that
        stays taken until the ``subscribed`` arrives)."""
        sub = self._mine.subs.get(subscriber)
        return sub is None or (sub.state is _SubState.CANCELLED and sub.confirmed)

    def free_subscriber_id(self) -> int:
        """The lowest id :meth:`can_subscribe` accepts."""
        subscriber = 1
        while not self.can_subscribe(subscriber):
            subscriber += 1
        return subscriber

    def is_subscribed(self, subscriber: int) -> bool:
        """Whether our subscription ``subscriber`` is open (subscribe sent; no cancel sent, no
        onComplete/onError received)."""
        return self._mine.open(subscriber) is not None and self.state is State.OPEN

    def peer_subscribed(self, subscriber: int) -> bool:
        """Whether the peer's subscription ``subscriber`` to us is open."""
        return subscriber in self._theirs.subs and self.state is State.OPEN

    def demand(self, subscriber: int) -> int:
        """Outstanding demand of a subscription the peer made to us (0 if none)."""
        sub = self._theirs.subs.get(subscriber)
        return sub.demand if sub is not None and self.state is State.OPEN else 0

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer; ``b""`` means the transport closed. Nothing is decoded
        until :meth:`next_event` asks: each message is applied only after the application has
        handled the events before it (so a ``request(0)`` right behind its ``subscribe`` meets
        the subscription the application has just answered)."""
        if self.state is State.CLOSED:
            return
        if not data:
            self._eof = True
            return
        self._decoder.feed(data)

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def next_event(self) -> Event | None:
        """The next event, or ``None`` when there is none until more data arrives."""
        while not self._events and not self.closed:
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
        more elements at once than the outstanding demand. For the subscriber's hot path, where
        the element format is known (e.g. ``publisher.envelope_run_decoder``)."""
        sub = self._mine.open(subscriber)
        if sub is None:
            raise LocalProtocolError(f"set_run_decoder: subscription {subscriber} is not open")
        sub.run_decoder = decoder

    def _run_decoder_in(self, subscriber: int) -> tuple[RunDecoder, int] | None:
        sub = self._mine.subs.get(subscriber)
        if (
            sub is None
            or sub.run_decoder is None
            or sub.state is not _SubState.ACTIVE
            or sub.draining
            or sub.element_size
            or sub.demand <= 0
        ):
            return None
        return sub.run_decoder, sub.demand

    def _element_size_in(self, subscriber: int) -> int:
        sub = self._mine.subs.get(subscriber)
        if sub is None:
            return 0
        return sub.old_element_size if sub.draining else sub.element_size

    def _receive(self, message: Message | OnNextRun | OnNextDecoded) -> None:
        if self.peer_extensions is None:
            expected = ServerHello if self.role is Role.CLIENT else ClientHello
            if not isinstance(message, expected):
                raise RemoteProtocolError(f"expected {expected.__name__} first, got "
                                          f"{type(message).__name__}")  # fmt: skip
            if message.version != PROTOCOL_VERSION:
                raise RemoteProtocolError(
                    f"unsupported protocol version {message.version} (this side speaks 0)"
                )
            self.peer_extensions = frozenset(message.extensions)
            self._decoder.publishing = self.publishing
            self._decoder.auth = EXT_AUTH in self.negotiated
            self._events.append(HandshakeCompleted(message.version, self.negotiated))
            return
        match message:
            case ClientHello() | ServerHello():
                raise RemoteProtocolError("a second hello")
            case Goodbye(reason):
                if self.state is State.OPEN:
                    self._out += encode(Goodbye("goodbye acknowledged"))
                self._close(reason, by_peer=self.state is State.OPEN)
                return
        if self.state is State.CLOSING:
            return  # our goodbye closed every subscription: drop what crosses it
        match message:
            # --- the peer subscribes to us
            case Subscribe(_, subscriber, initial):
                if subscriber in self._theirs.subs:
                    raise RemoteProtocolError(f"subscribe reuses open subscriber id {subscriber}")
                self._theirs.subs[subscriber] = _Sub(_SubState.REQUESTED, initial)
            case Request(subscriber, n):
                sub = self._theirs.subs.get(subscriber)
                if sub is None:
                    return  # closed already: a late request is a no-op (Reactive Streams 3.6)
                if n == 0:
                    self._refuse_theirs(subscriber, "request(0): demand must be >= 1 (RS 3.9)")
                    return
                sub.demand = _add_demand(sub.demand, n)
            case Cancel(subscriber):
                if self._theirs.subs.pop(subscriber, None) is None:
                    return  # closed already (3.7)
            # --- the peer publishes to us
            case Subscribed(subscriber, element_size):
                sub = self._mine.subs.get(subscriber)
                if sub is None or sub.state is _SubState.ACTIVE:
                    raise RemoteProtocolError(f"subscribed for {subscriber}: none pending")
                sub.draining = False
                sub.confirmed = True
                if sub.state is _SubState.CANCELLED:
                    sub.element_size = element_size
                    return
                sub.state = _SubState.ACTIVE
                sub.element_size = element_size
            case (
                OnNext(subscriber)
                | OnNextPacked(subscriber)
                | OnNextRun(subscriber)
                | OnNextDecoded(subscriber)
            ):
                sub = self._mine.subs.get(subscriber)
                if sub is not None and sub.draining:
                    return  # the cancelled subscription's, still in flight (RS 2.8)
                if sub is None or sub.state is _SubState.REQUESTED:
                    raise RemoteProtocolError(f"elements for subscriber {subscriber}, which is "
                                              "not subscribed")  # fmt: skip
                if sub.state is _SubState.CANCELLED:
                    return  # in flight when we cancelled (Reactive Streams 2.8)
                if isinstance(message, OnNextRun):
                    count = len(message.elements)
                elif isinstance(message, OnNextPacked | OnNextDecoded):
                    count = message.count
                else:
                    count = 1
                if count > sub.demand:
                    if isinstance(message, OnNextRun) and sub.demand:  # those within demand
                        self._events.append(OnNextRun(subscriber,
                                                      message.elements[: sub.demand]))  # fmt: skip
                        count -= sub.demand
                        sub.demand = 0
                    raise RemoteProtocolError(
                        f"{count} element(s) for subscriber {subscriber} exceed the demand of "
                        f"{sub.demand}"
                    )
                if sub.demand < UNBOUNDED:
                    sub.demand -= count
                if self._offers and self.role is Role.SERVER:  # an offer's elements
                    self._delivered(subscriber, count)
            case OnComplete(subscriber) | OnError(subscriber):
                current = self._mine.subs.get(subscriber)
                if current is not None and current.draining:
                    return  # ends the cancelled subscription, not the new one
                sub = self._mine.subs.pop(subscriber, None)
                if sub is None:
                    raise RemoteProtocolError(
                        f"{type(message).__name__} for subscriber {subscriber}, which is not open"
                    )
                if sub.state is _SubState.CANCELLED:
                    return
            # --- publishing (extension 1; the decoder knows these types only once negotiated)
            case Offer(offer):
                if self.role is not Role.SERVER:
                    raise RemoteProtocolError("offer sent to the client")
                if offer in self._offers:
                    raise RemoteProtocolError(f"offer reuses open offer id {offer}")
                self._offers[offer] = _Offer()
            case Committed(offer, count):
                state = self._offers.get(offer)
                if self.role is not Role.CLIENT or state is None:
                    raise RemoteProtocolError(f"committed for offer {offer}, which is not open")
                if state.committed + count > state.delivered:
                    raise RemoteProtocolError(
                        f"committed {state.committed + count} elements of offer {offer}, but "
                        f"only {state.delivered} were delivered"
                    )
                state.committed += count
            case OfferEnded(offer, error):
                state = self._offers.pop(offer, None) if self.role is Role.CLIENT else None
                if state is None:
                    raise RemoteProtocolError(f"offerEnded for offer {offer}, which is not open")
                if offer in self._theirs.subs:
                    raise RemoteProtocolError(f"offerEnded for offer {offer} while the hub's "
                                              "subscription to it is open")  # fmt: skip
                if not error and state.committed != state.delivered:
                    raise RemoteProtocolError(
                        f"offerEnded({offer}) without an error, but only {state.committed} of "
                        f"the {state.delivered} element(s) delivered were committed"
                    )
            # --- authentication (extension 2; decoded only once negotiated)
            case Authenticate():
                if self.role is not Role.SERVER:
                    raise RemoteProtocolError("authenticate sent to the client")
                if self._auth_received:
                    raise RemoteProtocolError("a second authenticate")
                self._auth_received = True
            case Authenticated():
                if self.role is not Role.CLIENT:
                    raise RemoteProtocolError("authenticated sent to the hub")
        self._events.append(message)

    def _refuse_theirs(self, subscriber: int, reason: str) -> None:
        """A breach scoped to one subscription the peer made: onError, and it is closed."""
        self._theirs.subs.pop(subscriber, None)
        self._out += encode(OnError(subscriber, clip_reason(reason)))
        self._events.append(SubscriptionErrored(subscriber, reason, outbound=False))

    def _refuse_offer(self, offer: int, reason: str) -> None:
        if self.state is not State.OPEN:
            return
        if self.role is not Role.SERVER or offer in self._offers:
            self._breach(f"offer {offer}: {reason}")
            return
        self._out += encode(OfferEnded(offer, clip_reason(reason)))
        self._events.append(OfferRefused(offer, reason))

    def _breach(self, reason: str) -> None:
        if self.state is State.OPEN:
            self._out += encode(Goodbye(clip_reason(f"protocol error: {reason}")))
        self._close(reason, by_peer=False, error=True)

    def _close(self, reason: str, *, by_peer: bool, error: bool = False) -> None:
        self.state = State.CLOSED
        self._mine.subs.clear()
        self._theirs.subs.clear()
        self._offers.clear()
        self._events.append(ConnectionClosed(reason, by_peer, error))
