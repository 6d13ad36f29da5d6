"""Admission: connections in total and per peer address, counted over every listener together.

The guard (:mod:`tidewire.server.guard`) asks :meth:`Admission.admit` for each accepted socket
and refuses, in the protocol's own words, one over the limits (settings ``limits.*``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Admission", "ConnectionLimits"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Bounds on connections (settings ``limits.*``); 0 seconds turns a timer off."""

    max_connections: int = 10_000
    max_connections_per_peer: int = 256
    handshake_seconds: float = 10.0
    idle_seconds: float = 3600.0
    write_stall_seconds: float = 60.0
    message_seconds: float = 60.0
    """An inbound message begun (its header read) and unfinished this long: closed."""


class Admission:
    """Connections in total and per peer address, shared by every listener of the hub."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.total = 0
        self.per_peer: dict[str, int] = {}

    def admit(self, host: str) -> str | None:
        """Count a new connection from ``host``; or say why it is refused (and count nothing)."""
        if self.total >= self.limits.max_connections:
            return f"too many connections (the limit is {self.limits.max_connections})"
        count = self.per_peer.get(host, 0)
        if count >= self.limits.max_connections_per_peer:
            limit = self.limits.max_connections_per_peer
            return f"too many connections from {host} (the limit is {limit})"
        self.total += 1
        self.per_peer[host] = count + 1
        return None

    def release(self, host: str) -> None:
        self.total -= 1
        count = self.per_peer.pop(host) - 1
        if count:
            self.per_peer[host] = count
