"""Tolliver instances (seed 003) over the sans-IO :mod:`tidewire.protocols.tolliver`: a
stand-alone instance (:class:`Instance`) and its durable store (:class:`Store`). The hub's own
instance comes next (docs/protocols/tolliver.md)."""

from .instance import Delivery, Instance
from .store import Store, uuid7

__all__ = ["Delivery", "Instance", "Store", "uuid7"]
