"""The legality of subscription messages, as one table (h11's ``_state.py`` is the model).

Every subscription is seen from one side: ours (we are its **subscriber**: we sent
``subscribe``) or the peer's (we are its **publisher**). Which side sends a message is fixed by
its kind: the subscriber sends ``subscribe``, ``request`` and ``cancel``; the publisher sends
``subscribed``, the elements (``onNext``, ``onNextPacked``) and the end (``onComplete``,
``onError``). So one table, :data:`TRANSITIONS`, keyed by (side, kind) and then by the
subscription's state, says for both directions at once which message is legal and what state
follows. A message missing from the table is a breach: :class:`LocalProtocolError` when we
send it (a bug on this side), :class:`RemoteProtocolError` when the peer does.

Both sides' states are one enum, :class:`SubState`, which holds every sub-state (there are no
flags beside it): the subscriber side needs more of them, since after its ``cancel`` the
publisher's messages still cross it, and an id may be reused at once (Reactive Streams 2.8):

* ``REQUESTED_OVER``: subscribed again on an id whose previous subscription we cancelled; until
  ``subscribed`` arrives, what comes for the id is the old subscription's, and dropped.
* ``CANCELLED_EARLY``: cancelled before ``subscribed`` arrived; the id stays taken until it does
  (else which ``subscribed`` answers which subscribe is unknowable).
* ``CANCELLED``: cancelled after ``subscribed``: late elements are dropped, the id is free.

Demand, element sizes and offers are counted by the connection; this module decides only
legality and state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...model import LocalProtocolError, RemoteProtocolError
from .codec import OnNextDecoded, OnNextRun
from .messages import (
    Cancel,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    Subscribe,
    Subscribed,
)

if TYPE_CHECKING:
    from .runs import RunDecoder

__all__ = [
    "KIND_OF",
    "SENT_BY_SUBSCRIBER",
    "TRANSITIONS",
    "UNBOUNDED",
    "Kind",
    "Side",
    "SubState",
    "Subscription",
    "Subscriptions",
    "element_count",
]

UNBOUNDED = 2**63 - 1
"""Demand this high means unbounded (Reactive Streams 3.17: it saturates there)."""


class Side(enum.Enum):
    SUBSCRIBER = "subscriber"  # our subscription: we sent subscribe
    PUBLISHER = "publisher"  # the peer's subscription to us: we publish


class Kind(enum.Enum):
    SUBSCRIBE = "subscribe"  # sent by the subscriber
    REQUEST = "request"
    CANCEL = "cancel"
    SUBSCRIBED = "subscribed"  # sent by the publisher
    ELEMENTS = "elements"  # onNext, onNextPacked (and decoded runs of them)
    END = "end"  # onComplete, onError


SENT_BY_SUBSCRIBER = frozenset({Kind.SUBSCRIBE, Kind.REQUEST, Kind.CANCEL})

KIND_OF: dict[type, Kind] = {
    Subscribe: Kind.SUBSCRIBE,
    Request: Kind.REQUEST,
    Cancel: Kind.CANCEL,
    Subscribed: Kind.SUBSCRIBED,
    OnNext: Kind.ELEMENTS,
    OnNextPacked: Kind.ELEMENTS,
    OnNextRun: Kind.ELEMENTS,
    OnNextDecoded: Kind.ELEMENTS,
    OnComplete: Kind.END,
    OnError: Kind.END,
}
"""The subscription messages, by kind; every other message is the connection's business."""


def element_count(message: object) -> int:
    """How many elements an elements message carries."""
    if isinstance(message, OnNextRun):
        return len(message.elements)
    if isinstance(message, OnNextPacked | OnNextDecoded):
        return message.count
    return 1


class SubState(enum.Enum):
    FREE = "free"  # no subscription has the id
    REQUESTED = "requested"  # subscribe sent/received, subscribed not yet
    REQUESTED_OVER = "requested over a cancelled one"  # subscriber side, see the docstring
    ACTIVE = "active"
    CANCELLED_EARLY = "cancelled before subscribed"  # subscriber side
    CANCELLED_EARLY_OVER = "cancelled before subscribed, over a cancelled one"  # subscriber side
    CANCELLED = "cancelled"  # subscriber side: late elements are dropped quietly


FREE = SubState.FREE
REQUESTED = SubState.REQUESTED
REQUESTED_OVER = SubState.REQUESTED_OVER
ACTIVE = SubState.ACTIVE
CANCELLED_EARLY = SubState.CANCELLED_EARLY
CANCELLED_EARLY_OVER = SubState.CANCELLED_EARLY_OVER
CANCELLED = SubState.CANCELLED

Outcome = tuple[SubState, bool]
"""The state after the message, and whether the application hears of it (a message received
for a cancelled subscription is dropped quietly, Reactive Streams 2.8 and 3.6)."""


def _go(state: SubState) -> Outcome:
    return (state, True)


def _quietly(state: SubState) -> Outcome:
    return (state, False)


_OPEN = (REQUESTED, REQUESTED_OVER, ACTIVE)

TRANSITIONS: dict[tuple[Side, Kind], dict[SubState, Outcome]] = {
    # ---- our subscriptions: we send subscribe, request, cancel
    (Side.SUBSCRIBER, Kind.SUBSCRIBE): {FREE: _go(REQUESTED), CANCELLED: _go(REQUESTED_OVER)},
    (Side.SUBSCRIBER, Kind.REQUEST): {s: _go(s) for s in _OPEN},
    (Side.SUBSCRIBER, Kind.CANCEL): {
        REQUESTED: _go(CANCELLED_EARLY),
        REQUESTED_OVER: _go(CANCELLED_EARLY_OVER),
        ACTIVE: _go(CANCELLED),
    },
    # ... and receive the rest
    (Side.SUBSCRIBER, Kind.SUBSCRIBED): {
        REQUESTED: _go(ACTIVE),
        REQUESTED_OVER: _go(ACTIVE),
        CANCELLED_EARLY: _quietly(CANCELLED),
        CANCELLED_EARLY_OVER: _quietly(CANCELLED),
        CANCELLED: _quietly(CANCELLED),
    },
    (Side.SUBSCRIBER, Kind.ELEMENTS): {
        ACTIVE: _go(ACTIVE),
        REQUESTED_OVER: _quietly(REQUESTED_OVER),  # the cancelled predecessor's
        CANCELLED_EARLY: _quietly(CANCELLED_EARLY),
        CANCELLED_EARLY_OVER: _quietly(CANCELLED_EARLY_OVER),
        CANCELLED: _quietly(CANCELLED),
    },
    (Side.SUBSCRIBER, Kind.END): {
        REQUESTED: _go(FREE),
        ACTIVE: _go(FREE),
        REQUESTED_OVER: _quietly(REQUESTED_OVER),  # ends the predecessor, not this one
        CANCELLED_EARLY_OVER: _quietly(CANCELLED_EARLY_OVER),
        CANCELLED_EARLY: _quietly(FREE),
        CANCELLED: _quietly(FREE),
    },
    # ---- the peer's subscriptions to us: we receive subscribe, request, cancel
    (Side.PUBLISHER, Kind.SUBSCRIBE): {FREE: _go(REQUESTED)},
    (Side.PUBLISHER, Kind.REQUEST): {
        FREE: _quietly(FREE),  # closed already: a late request is a no-op (3.6)
        REQUESTED: _go(REQUESTED),
        ACTIVE: _go(ACTIVE),
    },
    (Side.PUBLISHER, Kind.CANCEL): {
        FREE: _quietly(FREE),  # closed already (3.7)
        REQUESTED: _go(FREE),
        ACTIVE: _go(FREE),
    },
    # ... and send the rest
    (Side.PUBLISHER, Kind.SUBSCRIBED): {REQUESTED: _go(ACTIVE)},
    (Side.PUBLISHER, Kind.ELEMENTS): {ACTIVE: _go(ACTIVE)},
    (Side.PUBLISHER, Kind.END): {REQUESTED: _go(FREE), ACTIVE: _go(FREE)},
}

# What a breach says, by (side, kind): ``{name}`` is the message's type, ``{id}`` its subscriber.
_REFUSALS: dict[tuple[Side, Kind], str] = {
    (Side.SUBSCRIBER, Kind.SUBSCRIBE): (
        "subscriber id {id} is still open, or was cancelled before its subscribed arrived "
        "(then which subscribed answers which is unknowable)"
    ),
    (Side.SUBSCRIBER, Kind.REQUEST): "request for subscriber {id}, not open",
    (Side.SUBSCRIBER, Kind.CANCEL): "cancel for subscriber {id}, not open",
    (Side.SUBSCRIBER, Kind.SUBSCRIBED): "subscribed for {id}: none pending",
    (Side.SUBSCRIBER, Kind.ELEMENTS): "elements for subscriber {id}, which is not subscribed",
    (Side.SUBSCRIBER, Kind.END): "{name} for subscriber {id}, which is not open",
    (Side.PUBLISHER, Kind.SUBSCRIBE): "subscribe reuses open subscriber id {id}",
    (Side.PUBLISHER, Kind.SUBSCRIBED): "subscribed for {id}: no subscribe pending",
    (Side.PUBLISHER, Kind.ELEMENTS): "{name} for subscriber {id}: not subscribed",
    (Side.PUBLISHER, Kind.END): "{name} for {id}: not open",
}


@dataclass(slots=True)
class Subscription:
    """One subscription's state and counts."""

    state: SubState
    demand: int  # outstanding: granted by the subscriber, not yet delivered
    element_size: int = 0  # from subscribed (0: variable-size)
    old_element_size: int = 0  # the cancelled predecessor's (states *_OVER)
    run_decoder: RunDecoder | None = None  # subscriber side: see Connection.set_run_decoder

    def grant(self, n: int) -> None:
        """Add ``n`` to the demand, saturating at :data:`UNBOUNDED`."""
        self.demand = min(UNBOUNDED, self.demand + n)

    @property
    def incoming_element_size(self) -> int:
        """The size of the elements arriving now: the predecessor's until subscribed."""
        if self.state in (REQUESTED_OVER, CANCELLED_EARLY_OVER):
            return self.old_element_size
        return self.element_size


@dataclass(slots=True)
class Subscriptions:
    """The subscriptions of one side of a connection, by subscriber id."""

    side: Side
    subs: dict[int, Subscription] = field(default_factory=dict)

    def state(self, subscriber: int) -> SubState:
        sub = self.subs.get(subscriber)
        return FREE if sub is None else sub.state

    def is_open(self, subscriber: int) -> bool:
        """Subscribed and not cancelled (nor ended)."""
        return self.state(subscriber) in _OPEN

    def apply(
        self, kind: Kind, subscriber: int, name: str, *, initial_demand: int = 0
    ) -> tuple[Subscription | None, bool]:
        """Move subscription ``subscriber`` by a message of ``kind`` (named ``name``), sent by
        us when our side sends that kind, else received; returns the subscription (``None``
        once free) and whether the application hears of the message. Raises
        :class:`LocalProtocolError` / :class:`RemoteProtocolError` for an illegal message (the
        state is then unchanged). ``initial_demand``: a ``subscribe``'s."""
        sub = self.subs.get(subscriber)
        state = FREE if sub is None else sub.state
        outcome = TRANSITIONS[(self.side, kind)].get(state)
        if outcome is None:
            local = (kind in SENT_BY_SUBSCRIBER) == (self.side is Side.SUBSCRIBER)
            error = LocalProtocolError if local else RemoteProtocolError
            template = _REFUSALS.get((self.side, kind), "{name} for subscriber {id}: {state}")
            reason = template.format(id=subscriber, name=name, state=state.value)
            raise error(reason)
        after, report = outcome
        if after is FREE:
            self.subs.pop(subscriber, None)
            return None, report
        if kind is Kind.SUBSCRIBE:
            old_size = sub.element_size if sub is not None else 0
            sub = self.subs[subscriber] = Subscription(after, initial_demand, 0, old_size)
        elif sub is not None:
            sub.state = after
        return sub, report

    def clear(self) -> None:
        self.subs.clear()
