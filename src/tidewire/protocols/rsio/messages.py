"""The eleven RS.io messages (seed 000 and the decisions in shared/seeds/README.md).

One frozen dataclass per message, complete and checked at construction: a message that cannot
exist on the wire cannot be built. ``MessageType`` gives each its wire code.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ...model import LocalProtocolError
from .wire import MAX_LONG, MAX_VARINT

__all__ = [
    "PROTOCOL_VERSION",
    "Cancel",
    "ClientHello",
    "Goodbye",
    "Message",
    "MessageType",
    "OnComplete",
    "OnError",
    "OnNext",
    "OnNextPacked",
    "Request",
    "ServerHello",
    "Subscribe",
    "Subscribed",
]

PROTOCOL_VERSION = 0


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
)
