"""The publisher's side of a connection's subscriptions: elements to the peer, one message or
a whole batch at a time.

:class:`Delivery` is owned by a :class:`~.connection.Connection`, which checks that the
connection is open and hands it the send queue, the peer's subscriptions and a callback that
counts an offer's elements. It checks each subscription against the legality table
(:mod:`.subscriptions`), keeps within the subscriber's demand (Reactive Streams 1.1) and
chooses the encoding of a batch (:meth:`Delivery.batch`), so that the adapter never touches
the codecs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...model import Batch, LocalProtocolError
from .codec import encode
from .envelopes import fixed_size_values
from .messages import MessageType, OnNext, OnNextPacked
from .names import PublisherName
from .output import BIG_ELEMENT, SendQueue
from .records import record_parts
from .runs import envelope_frames
from .subscriptions import UNBOUNDED, Kind, Subscription, Subscriptions, element_count
from .varint import varint_bytes

__all__ = ["Delivery"]


class Delivery:
    """Elements for the peer's subscriptions (see the module docstring)."""

    __slots__ = ("_delivered", "_out", "_theirs")

    def __init__(
        self, out: SendQueue, theirs: Subscriptions, delivered: Callable[[int, int], None]
    ) -> None:
        self._out = out
        self._theirs = theirs
        self._delivered = delivered  # (subscriber, count): elements sent on it

    def _active(self, subscriber: int, name: str) -> Subscription:
        sub, _ = self._theirs.apply(Kind.ELEMENTS, subscriber, name)
        assert sub is not None  # (the table keeps an active subscription active)
        return sub

    def _take_demand(self, sub: Subscription, subscriber: int, count: int) -> None:
        if count > sub.demand:
            raise LocalProtocolError(
                f"{count} element(s) for subscriber {subscriber} exceed its demand of "
                f"{sub.demand} (Reactive Streams 1.1)"
            )
        if sub.demand < UNBOUNDED:
            sub.demand -= count
        self._delivered(subscriber, count)

    def message(self, message: OnNext | OnNextPacked) -> None:
        """Queue one elements message, checked whole before anything changes."""
        sub = self._active(message.subscriber, type(message).__name__)
        frame = encode(message, sub.element_size)  # refuses a wrong size, changes nothing
        self._take_demand(sub, message.subscriber, element_count(message))
        self._out.write(frame)

    def _variable_size(self, subscriber: int, what: str) -> Subscription:
        sub = self._active(subscriber, "onNext")
        if sub.element_size:
            raise LocalProtocolError(f"{what} is for variable-size subscriptions")
        return sub

    def elements(
        self,
        subscriber: int,
        elements: Sequence[bytes | memoryview],
        heads: Sequence[bytes] | None = None,
    ) -> None:
        """See :meth:`.Connection.send_elements`."""
        sub = self._variable_size(subscriber, "send_elements")
        if heads is not None and len(heads) != len(elements):
            raise LocalProtocolError(f"{len(heads)} heads for {len(elements)} elements")
        self._take_demand(sub, subscriber, len(elements))
        prefix = varint_bytes(MessageType.ON_NEXT) + varint_bytes(subscriber)
        self._out.write_elements(prefix, elements, heads)

    def frames(self, subscriber: int, count: int, frames: bytes) -> None:
        """See :meth:`.Connection.send_frames`."""
        sub = self._variable_size(subscriber, "send_frames")
        self._take_demand(sub, subscriber, count)
        self._out.write(frames)

    def batch(self, subscriber: int, batch: Batch, name: PublisherName) -> None:
        """See :meth:`.Connection.send_batch`."""
        if name.size:
            packed = fixed_size_values(batch, name.size)
            self.message(OnNextPacked(subscriber, len(batch), bytes(packed)))
        elif name.format == "records":  # one log record per batch (docs/log.md), uncopied
            sub = self._variable_size(subscriber, "send_elements")
            parts = record_parts(batch)
            self._take_demand(sub, subscriber, 1)
            prefix = varint_bytes(MessageType.ON_NEXT) + varint_bytes(subscriber)
            self._out.write_element_parts(prefix, parts)
        elif name.format == "value":
            self.elements(subscriber, [batch.value(i) for i in range(len(batch))])
        elif batch.values.nbytes >= len(batch) * BIG_ELEMENT:  # big values: never copied
            sub = self._variable_size(subscriber, "send_elements")
            self._take_demand(sub, subscriber, len(batch))
            prefix = varint_bytes(MessageType.ON_NEXT) + varint_bytes(subscriber)
            self._out.write_envelopes(prefix, batch)  # (envelope_parts' bytes, in one pass)
        else:
            self.frames(subscriber, len(batch), envelope_frames(subscriber, batch))
