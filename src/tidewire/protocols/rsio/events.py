"""The events an RS.io :class:`~.connection.Connection` gives besides the wire messages
themselves: what happened to the connection or to one subscription or offer."""

from __future__ import annotations

from dataclasses import dataclass

from .codec import OnNextDecoded, OnNextRun
from .messages import Message

__all__ = [
    "ConnectionClosed",
    "Event",
    "HandshakeCompleted",
    "OfferRefused",
    "SubscriptionErrored",
]


@dataclass(frozen=True, slots=True)
class HandshakeCompleted:
    """The peer's hello arrived; ``extensions`` are those both sides listed."""

    version: int
    extensions: frozenset[int]


@dataclass(frozen=True, slots=True)
class SubscriptionErrored:
    """We answered a peer's breach for one subscription with ``onError`` (it is now closed)."""

    subscriber: int
    reason: str
    outbound: bool  # True: one of our subscriptions; False: one the peer made to us


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """No more messages either way. ``by_peer``: the peer said goodbye (or closed the
    transport); else we did (after our goodbye's acknowledgement, or after a breach)."""

    reason: str
    by_peer: bool
    error: bool = False  # a protocol breach, not an orderly goodbye


@dataclass(frozen=True, slots=True)
class OfferRefused:
    """We answered a malformed ``offer`` with ``offerEnded`` (hub side)."""

    offer: int
    reason: str


Event = (
    Message
    | OnNextRun
    | OnNextDecoded
    | HandshakeCompleted
    | SubscriptionErrored
    | OfferRefused
    | ConnectionClosed
)
