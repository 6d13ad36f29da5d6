"""Tolliver instances (seed 003) over the sans-IO :mod:`tidewire.protocols.tolliver`: the
durable store of a stand-alone instance (:mod:`.store`). The instance's networking and the
hub's own instance come next (docs/protocols/tolliver.md)."""

from .store import Store, uuid7

__all__ = ["Store", "uuid7"]
