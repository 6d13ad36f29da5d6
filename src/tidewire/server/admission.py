"""Admission: connections in total and per peer network, counted over every listener together.

The guard (:mod:`tidewire.server.guard`) asks :meth:`Admission.admit` for each accepted socket
and refuses, in the protocol's own words, one over the limits (settings ``limits.*``).

A "peer" is a network prefix, not an exact address: an IPv6 host is usually handed a whole
/64, so counting per address would let one host open ``max_connections_per_peer`` connections
from each of 2**64 addresses. By default IPv4 addresses count per /32 (the address) and IPv6
ones per /64 (``limits.peer_prefix_v4``, ``limits.peer_prefix_v6``); an IPv4-mapped IPv6
address (``::ffff:192.0.2.1``, from a dual-stack socket) counts as the IPv4 address it maps.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Admission", "ConnectionLimits", "peer_network"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Bounds on connections (settings ``limits.*``); 0 seconds turns a timer off."""

    max_connections: int = 10_000
    max_connections_per_peer: int = 256
    """Connections at once from one peer network (``peer_prefix_v4`` / ``peer_prefix_v6``)."""
    handshake_seconds: float = 10.0
    idle_seconds: float = 3600.0
    write_stall_seconds: float = 60.0
    message_seconds: float = 60.0
    """An inbound message begun (its header read) and unfinished this long: closed."""
    refusal_close_seconds: float = 0.1
    """A refused peer's connection, told why, is closed this much later (reading paused)."""
    peer_prefix_v4: int = 32
    """The prefix length that makes one IPv4 peer (32: each address)."""
    peer_prefix_v6: int = 64
    """The prefix length that makes one IPv6 peer (64: a typical host's or LAN's allocation)."""

    def __post_init__(self) -> None:
        if not 0 <= self.peer_prefix_v4 <= 32:
            raise ValueError(f"peer_prefix_v4 {self.peer_prefix_v4} is outside 0..32")
        if not 0 <= self.peer_prefix_v6 <= 128:
            raise ValueError(f"peer_prefix_v6 {self.peer_prefix_v6} is outside 0..128")


@lru_cache(maxsize=4096)
def peer_network(host: str, prefix_v4: int = 32, prefix_v6: int = 64) -> str:
    """The peer ``host`` counts as: its network at the prefix length in CIDR notation
    (``2001:db8::/64``), or the address alone at the full length (``192.0.2.1`` for /32). A
    host that is not an IP address (a Unix socket's path, ``"?"``) is its own peer; an IPv6
    zone (``fe80::1%eth0``) is dropped."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    prefix = prefix_v4 if isinstance(address, ipaddress.IPv4Address) else prefix_v6
    if prefix == address.max_prefixlen:
        return str(address)
    return str(ipaddress.ip_network((address, prefix), strict=False))


class Admission:
    """Connections in total and per peer network, shared by every listener of the hub."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.total = 0
        self.per_peer: dict[str, int] = {}
        """Open connections per peer network (:func:`peer_network`), only those with some."""

    def peer(self, host: str) -> str:
        """The network ``host`` is counted under."""
        return peer_network(host, self.limits.peer_prefix_v4, self.limits.peer_prefix_v6)

    def admit(self, host: str) -> str | None:
        """Count a new connection from ``host``; or say why it is refused (and count nothing)."""
        if self.total >= self.limits.max_connections:
            return f"too many connections (the limit is {self.limits.max_connections})"
        peer = self.peer(host)
        count = self.per_peer.get(peer, 0)
        if count >= self.limits.max_connections_per_peer:
            limit = self.limits.max_connections_per_peer
            return f"too many connections from {peer} (the limit is {limit})"
        self.total += 1
        self.per_peer[peer] = count + 1
        return None

    def release(self, host: str) -> None:
        """Count a connection from ``host`` (admitted earlier) as closed."""
        self.total -= 1
        peer = self.peer(host)
        count = self.per_peer.pop(peer) - 1
        if count:
            self.per_peer[peer] = count
