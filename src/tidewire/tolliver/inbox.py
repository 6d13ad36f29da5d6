"""What a stand-alone instance received and the application has not taken yet: bounded in
count and bytes; a message over either bound is not acked, so its sender resends it later."""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..native import kernel
from ..protocols.tolliver import Message

if TYPE_CHECKING:
    from .instance_link import InstanceLink

__all__ = ["Delivery", "Inbox", "deliveries", "deliveries_py", "make_delivery"]


class HasBody(Protocol):
    @property
    def body(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message received from ``sender`` (``id`` 2**31-1: unreliable)."""

    sender: uuid.UUID
    channel: str
    key: str
    body: bytes
    id: int


_new = object.__new__
_SLOTS: list[Any] = [getattr(Delivery, name).__set__
                     for name in ("sender", "channel", "key", "body", "id")]  # fmt: skip


def make_delivery(
    sender: uuid.UUID, channel: str, key: str, body: bytes, message_id: int
) -> Delivery:
    """``Delivery(sender, channel, key, body, message_id)``, its five slots set directly: the
    frozen dataclass's ``__init__`` sets each through ``object.__setattr__`` (about 0.6 us a
    delivery against 0.3, issue 22). Equal to the constructor's, field for field; it checks
    nothing, as that does not either."""
    delivery: Delivery = _new(Delivery)
    set_sender, set_channel, set_key, set_body, set_id = _SLOTS
    set_sender(delivery, sender)
    set_channel(delivery, channel)
    set_key(delivery, key)
    set_body(delivery, body)
    set_id(delivery, message_id)
    return delivery


L = TypeVar("L")


def deliveries_py(
    delivery_type: type[Delivery], sender: uuid.UUID, messages: list[Message], link: L
) -> list[tuple[Delivery, L]]:
    """``(Delivery(sender, m.channel, m.key, m.body, m.id), link)`` for each of ``messages``
    (a run from one read), each built by :func:`make_delivery` (``delivery_type`` is
    :class:`Delivery`: the compiled twin, ``tolliver_deliveries``, sets the slots of the type
    it is given). The pure specification of that kernel."""
    del delivery_type  # (always Delivery here)
    return [(make_delivery(sender, m.channel, m.key, m.body, m.id), link) for m in messages]


deliveries = kernel("tolliver_deliveries", deliveries_py)
"""The compiled kernel when built (tidewire.native), else :func:`deliveries_py`."""


class Inbox:
    """Deliveries with the connection each came on (its ack goes there), oldest first; at most
    ``limit`` of them and ``limit_bytes`` of bodies (one always fits).

    ``limit`` and ``limit_bytes`` may be changed while it runs: they are checked at each
    arrival, so raising them lets the senders' next resends in. ``nbytes`` is the bodies'
    bytes held now."""

    def __init__(self, limit: int, limit_bytes: int) -> None:
        self.limit = limit
        self.limit_bytes = limit_bytes
        self.nbytes = 0
        self._items: deque[tuple[Delivery, InstanceLink]] = deque()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        """The deliveries held now."""
        return len(self._items)

    def full(self) -> bool:
        """Whether a bound is reached: the next arrival is refused (not acked) unless the
        inbox is empty."""
        return len(self._items) >= self.limit or self.nbytes >= self.limit_bytes

    def empty(self) -> bool:
        """Whether no delivery is held."""
        return not self._items

    def put_nowait(self, item: tuple[Delivery, InstanceLink]) -> None:
        """Add one; :class:`asyncio.QueueFull` if it is over a bound."""
        size = len(item[0].body)
        over = self._items and self.nbytes + size > self.limit_bytes  # (one always fits)
        if len(self._items) >= self.limit or over:
            raise asyncio.QueueFull
        self._items.append(item)
        self.nbytes += size
        self._ready.set()

    def fits(self, messages: Sequence[HasBody], nbytes: int | None = None) -> bool:
        """Whether every one of ``messages`` fits now (then :meth:`put_many` takes them all,
        as :meth:`put_nowait` of each would); ``nbytes``: their bodies' bytes, if the caller
        counted them already."""
        if nbytes is None:
            nbytes = sum(len(m.body) for m in messages)
        return len(self._items) + len(messages) <= self.limit and (
            self.nbytes + nbytes <= self.limit_bytes
        )

    def put_many(
        self, items: list[tuple[Delivery, InstanceLink]], nbytes: int | None = None
    ) -> None:
        """Add all of ``items``, which :meth:`fits` said fit (not checked again); ``nbytes``:
        their bodies' bytes, if the caller counted them already."""
        self._items += items
        if nbytes is None:
            nbytes = sum(len(delivery.body) for delivery, _ in items)
        self.nbytes += nbytes
        self._ready.set()

    async def take(self, most: int) -> list[tuple[Delivery, InstanceLink]]:
        """At least one and at most ``most`` items, oldest first (waits for one)."""
        items = self._items
        while not items:
            self._ready.clear()
            await self._ready.wait()
        if most >= len(items):  # (the common case: all of them, no pop per item)
            taken = list(items)
            items.clear()
            self.nbytes = 0
            return taken
        taken = [items.popleft() for _ in range(most)]
        self.nbytes -= sum(len(delivery.body) for delivery, _ in taken)
        return taken
