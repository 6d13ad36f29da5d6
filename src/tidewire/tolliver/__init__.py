"""Tolliver instances (seed 003) over the sans-IO :mod:`tidewire.protocols.tolliver`: a
stand-alone instance (:class:`Instance`), the :class:`Supervisor` that keeps one connected to a
remote (``connect(..., retry=...)``), and its durable store (:class:`Store`). The hub's own
instance is :mod:`tidewire.server.tolliver` (docs/protocols/tolliver.md); both drive each
connection with the one asyncio adapter in :mod:`.link`."""

from .instance import Delivery, HandshakeFailed, Inbox, Instance, Supervisor
from .store import Store, uuid7

__all__ = ["Delivery", "HandshakeFailed", "Inbox", "Instance", "Store", "Supervisor", "uuid7"]
