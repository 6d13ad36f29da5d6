"""RS.io over HTTP, the state of one subscription on each side (sans-IO: no HTTP library, no
asyncio, no clock).

Server side (:class:`ServerSubscription`): outstanding demand, the sequence number of the next
element, and the one delivery that is written but not known to have arrived. A delivery counts
(demand spent, sequence moved) only once its response was written in full
(:meth:`ServerSubscription.sent`); until then it is resent, as it is, on the next request (the
seed: "the server MUST NOT update its remaining demand count ... it MUST resend all of the
elements in the batch").

Client side (:class:`ClientSubscription`): the demand it has asked for and not received, and
the sequence number of the next element it expects, so that it drops the elements it receives
twice after a resend (the seed's first option: "counting elements starting from the first one
in the batch whose delivery failed").
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ...model import LocalProtocolError, RemoteProtocolError
from .codec import (
    FIXED_SIZE,
    LENGTH_PREFIXED,
    MAX_DEMAND,
    encode_fixed_size,
    encode_length_prefixed,
)

__all__ = ["ClientSubscription", "Delivery", "ServerSubscription", "State"]


class State(enum.Enum):
    OPEN = "open"
    COMPLETE = "complete"  # 410 once everything is delivered
    FAILED = "failed"  # onError: 4xx/5xx with X-Rsio-Error
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One 200 response: ``count`` elements from sequence number ``first``."""

    first: int
    count: int
    body: bytes
    encoding: str | None  # None: a single element, the body as it is


class ServerSubscription:
    def __init__(self, element_size: int = 0) -> None:
        self.element_size = element_size  # > 0: fixed-size elements
        self.demand = 0  # requested, not yet delivered
        self.next_seq = 0  # sequence number of the next element to deliver
        self.unsent: Delivery | None = None
        self.last: Delivery | None = None  # the last one sent in full, until the next request
        self.state = State.OPEN
        self.error: tuple[int, str] | None = None  # (status, message) once FAILED

    def request(self, n: int) -> None:
        """Add ``n`` (>= 0 here: a fetch may carry ``request=0``) to the demand, saturating."""
        if n < 0:
            raise LocalProtocolError("demand is never negative")
        self.demand = min(MAX_DEMAND, self.demand + n)

    @property
    def pending(self) -> int:
        """Bytes of the delivery prepared and not yet known to be written in full (the
        machine contract's pending bytes: RS.io over HTTP has no receive buffer, aiohttp
        frames each body)."""
        return len(self.unsent.body) if self.unsent is not None else 0

    @property
    def room(self) -> int:
        """Elements that may be taken for a new delivery (demand not covered by the unsent)."""
        return self.demand - (self.unsent.count if self.unsent is not None else 0)

    def prepare(self, elements: Sequence[bytes | bytearray | memoryview]) -> Delivery:
        """A delivery of ``elements`` (taken within :attr:`room`), kept as unsent until
        :meth:`sent`."""
        if self.unsent is not None:
            raise LocalProtocolError("the unsent delivery goes first")
        if not elements or len(elements) > self.demand:
            raise LocalProtocolError(f"{len(elements)} elements for a demand of {self.demand}")
        if self.element_size and len(elements[0]) != self.element_size:
            raise LocalProtocolError(f"an element that is not {self.element_size} bytes")
        if len(elements) == 1:
            body, encoding = bytes(elements[0]), None
        elif self.element_size:
            if any(len(e) != self.element_size for e in elements):
                raise LocalProtocolError(f"an element that is not {self.element_size} bytes")
            body = encode_fixed_size(self.element_size, b"".join(elements))
            encoding = FIXED_SIZE
        else:
            body, encoding = encode_length_prefixed(elements), LENGTH_PREFIXED
        return self.prepared(body, len(elements), encoding)

    def prepared(self, body: bytes, count: int, encoding: str | None) -> Delivery:
        """:meth:`prepare` of a body the caller encoded itself (e.g. straight from a batch's
        columns)."""
        if self.unsent is not None:
            raise LocalProtocolError("the unsent delivery goes first")
        if not 0 < count <= self.demand:
            raise LocalProtocolError(f"{count} elements for a demand of {self.demand}")
        self.unsent = Delivery(self.next_seq, count, body, encoding)
        return self.unsent

    def sent(self, delivery: Delivery) -> None:
        """``delivery``'s response was written in full: its elements count."""
        if delivery is not self.unsent:
            raise LocalProtocolError("not the delivery in flight")
        self.unsent = None
        self.last = delivery
        self.demand -= delivery.count
        self.next_seq += delivery.count

    def received_up_to(self, seq: int) -> Delivery | None:
        """The client says ``seq`` is the next element it expects (tidewire's
        ``X-Tidewire-Sequence`` request header): the last delivery again if that one did not
        arrive after all (its response was written, then lost), else ``None``."""
        if seq == self.next_seq:
            self.last = None  # it arrived: no need to keep it
            return None
        last = self.last
        if last is not None and seq == last.first and self.unsent is None:
            return last
        first = last.first if last is not None else self.next_seq
        raise RemoteProtocolError(f"the client expects element {seq}; the next is "
                                  f"{self.next_seq}, and only the last delivery (from "
                                  f"{first}) can be resent")  # fmt: skip

    def complete(self) -> None:
        if self.state is State.OPEN:
            self.state = State.COMPLETE

    def fail(self, status: int, message: str) -> None:
        if self.state is State.OPEN or self.state is State.COMPLETE:
            self.state = State.FAILED
            self.error = (status, message)

    def cancel(self) -> None:
        self.state = State.CANCELLED
        self.unsent = None
        self.last = None


class ClientSubscription:
    def __init__(self) -> None:
        self.outstanding = 0  # asked for, not yet received
        self.next_seq = 0  # sequence number of the next new element

    def asked(self, n: int) -> None:
        self.outstanding = min(MAX_DEMAND, self.outstanding + n)

    def received(self, first: int | None, elements: list[bytes]) -> list[bytes]:
        """The new ones among ``elements`` (from sequence ``first``; ``None``: the server does
        not number them, so all are new)."""
        return elements[self.received_count(first, len(elements)) :]

    def received_count(self, first: int | None, count: int) -> int:
        """A response of ``count`` elements from sequence ``first`` (``None``: not numbered,
        all new) arrived: how many of its first elements were received before (a resend) and
        are to be dropped. The elements after those count as received (a client that counts
        a body before it decodes it asks for more first)."""
        skip = 0
        if first is not None:
            if not 0 <= first <= self.next_seq:  # (numbers start at 0: the header is the peer's)
                raise RemoteProtocolError(
                    f"elements from {first}, but {self.next_seq} was the next expected"
                )
            skip = min(count, self.next_seq - first)
        fresh = count - skip
        self.next_seq += fresh
        self.outstanding = max(0, self.outstanding - fresh)
        return skip
