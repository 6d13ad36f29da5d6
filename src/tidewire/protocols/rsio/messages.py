"""The eleven RS.io messages (seed 000 and the decisions in shared/seeds/README.md), and the
three of tidewire's publishing extension (extension id 1, message types 64-66).

One frozen dataclass per message, complete and checked at construction: a message that cannot
exist on the wire cannot be built. ``MessageType`` gives each its wire code.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ...model import LocalProtocolError
from .varint import MAX_LONG, MAX_VARINT

__all__ = [
    "EXT_AUTH",
    "EXT_PUBLISH",
    "MAX_REASON_CHARS",
    "PROTOCOL_VERSION",
    "Authenticate",
    "Authenticated",
    "Cancel",
    "ClientHello",
    "Committed",
    "Goodbye",
    "Message",
    "MessageType",
    "Offer",
    "OfferEnded",
    "OnComplete",
    "OnError",
    "OnNext",
    "OnNextPacked",
    "Request",
    "ServerHello",
    "Subscribe",
    "Subscribed",
    "clip_reason",
]

PROTOCOL_VERSION = 0

EXT_PUBLISH = 1
"""tidewire's publishing extension: a client offers a publisher and the hub subscribes to it
(``offer``, ``committed``, ``offerEnded``; see docs/protocols/rsio.md)."""

EXT_AUTH = 2
"""tidewire's authentication extension: the client proves who it is with a bearer token
(``authenticate``), the hub answers with the principal (``authenticated``) or ``goodbye``."""


MAX_REASON_CHARS = 1000
"""Reasons this side sends (goodbye, onError, offerEnded) are clipped to this many characters
(at most 4000 bytes of UTF-8, far below any peer's String limit): they often quote the peer's
input, which may be as long as the peer's own limit allows."""


def clip_reason(reason: str) -> str:
    """``reason``, cut to :data:`MAX_REASON_CHARS` characters (an ellipsis marks the cut)."""
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "…"


class MessageType(enum.IntEnum):
    CLIENT_HELLO = 0
    SERVER_HELLO = 1
    GOODBYE = 2
    SUBSCRIBE = 3
    REQUEST = 4
    CANCEL = 5
    SUBSCRIBED = 6
    ON_NEXT = 7
    ON_NEXT_PACKED = 8
    ON_COMPLETE = 9
    ON_ERROR = 10
    # extension 1 (publishing)
    OFFER = 64
    COMMITTED = 65
    OFFER_ENDED = 66
    # extension 2 (authentication)
    AUTHENTICATE = 67
    AUTHENTICATED = 68


def _check_varint(name: str, value: int) -> None:
    if not 0 <= value <= MAX_VARINT:
        raise LocalProtocolError(f"{name} {value} is outside 0..2**64-1")


def _check_text(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"{name} cannot be encoded as UTF-8: {exc}") from None


def _check_long(name: str, value: int) -> None:
    if not 0 <= value <= MAX_LONG:
        raise LocalProtocolError(f"{name} {value} is outside 0..2**63-1 (a Long)")


@dataclass(frozen=True, slots=True)
class _Hello:
    version: int = PROTOCOL_VERSION
    extensions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_varint("version", self.version)
        for ext in self.extensions:
            _check_varint("extension id", ext)


@dataclass(frozen=True, slots=True)
class ClientHello(_Hello):
    """``clientHello(version: varint, extensions: List[Id])``: the opener's hello."""


@dataclass(frozen=True, slots=True)
class ServerHello(_Hello):
    """``serverHello(version: varint, extensions: List[Id])``: the accepter's hello."""


@dataclass(frozen=True, slots=True)
class Goodbye:
    """``goodbye(reason: String)``: closes every subscription; answered by a goodbye."""

    reason: str = ""

    def __post_init__(self) -> None:
        _check_text("goodbye reason", self.reason)


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``subscribe(publisher: String, subscriber: Id, initialDemand: Long = 0)``."""

    publisher: str
    subscriber: int
    initial_demand: int = 0

    def __post_init__(self) -> None:
        _check_text("publisher", self.publisher)
        _check_varint("subscriber id", self.subscriber)
        _check_long("initialDemand", self.initial_demand)


@dataclass(frozen=True, slots=True)
class Request:
    """``request(subscriber: Id, demand: Long)``; demand 0 is an error for that subscription."""

    subscriber: int
    demand: int

    def __post_init__(self) -> None:
        _check_varint("subscriber id", self.subscriber)
        _check_long("demand", self.demand)


@dataclass(frozen=True, slots=True)
class Cancel:
    """``cancel(subscriber: Id)``."""

    subscriber: int

    def __post_init__(self) -> None:
        _check_varint("subscriber id", self.subscriber)


@dataclass(frozen=True, slots=True)
class Subscribed:
    """``subscribed(subscriber: Id, elementSize: varint = 0)``; a size > 0 is fixed-size mode."""

    subscriber: int
    element_size: int = 0

    def __post_init__(self) -> None:
        _check_varint("subscriber id", self.subscriber)
        _check_varint("elementSize", self.element_size)


@dataclass(frozen=True, slots=True)
class OnNext:
    """``onNext(subscriber: Id, element: bytes)``; in fixed-size mode the element has no length
    prefix and is exactly ``elementSize`` bytes."""

    subscriber: int
    element: bytes

    def __post_init__(self) -> None:
        _check_varint("subscriber id", self.subscriber)


@dataclass(frozen=True, slots=True)
class OnNextPacked:
    """``onNextPacked(subscriber: Id, count: varint, messages: count * elementSize bytes)``:
    fixed-size mode only. ``elements`` holds the ``count`` elements back to back."""

    subscriber: int
    count: int
    elements: bytes

    def __post_init__(self) -> None:
        _check_varint("subscriber id", self.subscriber)
        if self.count < 1 or not self.elements:
            raise LocalProtocolError("onNextPacked carries at least one non-empty element")
        if len(self.elements) % self.count:
            raise LocalProtocolError("onNextPacked elements are not count equal-sized parts")

    @property
    def element_size(self) -> int:
        return len(self.elements) // self.count

    def element(self, i: int) -> bytes:
        size = self.element_size
        return self.elements[i * size : (i + 1) * size]


@dataclass(frozen=True, slots=True)
class OnComplete:
    """``onComplete(subscriber: Id)``."""

    subscriber: int

    def __post_init__(self) -> None:
        _check_varint("subscriber id", self.subscriber)


@dataclass(frozen=True, slots=True)
class OnError:
    """``onError(subscriber: Id, error: String)``."""

    subscriber: int
    error: str

    def __post_init__(self) -> None:
        _check_varint("subscriber id", self.subscriber)
        _check_text("error", self.error)


@dataclass(frozen=True, slots=True)
class Offer:
    """``offer(offer: Id, publisher: String)`` (extension 1, client to hub): "subscribe to my
    publisher ``publisher`` and store what it publishes". The hub subscribes with subscriber
    id ``offer``, or answers ``offerEnded`` with the reason it will not."""

    offer: int
    publisher: str

    def __post_init__(self) -> None:
        _check_varint("offer id", self.offer)
        _check_text("publisher", self.publisher)


@dataclass(frozen=True, slots=True)
class Committed:
    """``committed(offer: Id, count: Long, firstId: Long, lastId: Long)`` (extension 1, hub to
    client): the next ``count`` elements of the offer are durable, stored as ids
    ``firstId``..``lastId``."""

    offer: int
    count: int
    first_id: int
    last_id: int

    def __post_init__(self) -> None:
        _check_varint("offer id", self.offer)
        for name, value in (("count", self.count), ("firstId", self.first_id),
                            ("lastId", self.last_id)):  # fmt: skip
            _check_long(name, value)
        if self.count < 1 or not 1 <= self.first_id <= self.last_id:
            raise LocalProtocolError("committed needs count >= 1 and 1 <= firstId <= lastId")
        if self.last_id - self.first_id + 1 < self.count:
            raise LocalProtocolError(f"{self.count} ids cannot fit {self.first_id}..{self.last_id}")


@dataclass(frozen=True, slots=True)
class OfferEnded:
    """``offerEnded(offer: Id, error: String)`` (extension 1, hub to client): the offer is over
    and its id free. ``error`` is empty when every element was committed (after the client's
    ``onComplete``); else it says why, and elements not covered by a ``committed`` were not
    stored."""

    offer: int
    error: str = ""

    def __post_init__(self) -> None:
        _check_varint("offer id", self.offer)
        _check_text("error", self.error)


@dataclass(frozen=True, slots=True)
class Authenticate:
    """``authenticate(token: String)`` (extension 2, client to hub, at most once, only after
    the hub's hello listed extension 2): from now on the connection acts as the token's
    principal. A wrong or expired token is answered with ``goodbye``."""

    token: str

    def __post_init__(self) -> None:
        _check_text("token", self.token)


@dataclass(frozen=True, slots=True)
class Authenticated:
    """``authenticated(principal: String)`` (extension 2, hub to client): the token is valid;
    ``principal`` is the name the ACL knows the connection by (``token:<name>``)."""

    principal: str

    def __post_init__(self) -> None:
        _check_text("principal", self.principal)


Message = (
    ClientHello
    | ServerHello
    | Goodbye
    | Subscribe
    | Request
    | Cancel
    | Subscribed
    | OnNext
    | OnNextPacked
    | OnComplete
    | OnError
    | Offer
    | Committed
    | OfferEnded
    | Authenticate
    | Authenticated
)
