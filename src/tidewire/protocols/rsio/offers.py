"""The offers of tidewire's publishing extension (extension 1), as one connection sees them.

The client ``offer``s a publisher; the hub subscribes to it with subscriber id = the offer id,
acknowledges durable elements with ``committed`` (never more than were delivered) and ends the
offer with ``offerEnded`` once its subscription is closed; the offer id is then free. This
module keeps the open offers and their counts, and says which of those three messages is legal;
the connection checks first that the extension is negotiated and who may send each.
"""

from __future__ import annotations

from collections.abc import Callable

from ...model import LocalProtocolError, RemoteProtocolError
from .messages import Committed, Offer, OfferEnded

__all__ = ["Offers"]


class _Counts:
    __slots__ = ("committed", "delivered")

    def __init__(self) -> None:
        self.delivered = 0  # elements sent (client) / received (hub) on the offer's subscription
        self.committed = 0


class Offers:
    """The open offers of one connection, by offer id."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: dict[int, _Counts] = {}

    def __contains__(self, offer: int) -> bool:
        return offer in self._open

    def __bool__(self) -> bool:
        return bool(self._open)

    def __len__(self) -> int:
        return len(self._open)

    def clear(self) -> None:
        self._open.clear()

    def delivered(self, offer: int) -> int:
        """Elements delivered on an open offer's subscription so far (0 if none)."""
        counts = self._open.get(offer)
        return counts.delivered if counts is not None else 0

    def count_delivered(self, offer: int, count: int) -> None:
        """``count`` elements went on subscription ``offer`` (no-op if it is not an offer)."""
        counts = self._open.get(offer)
        if counts is not None:
            counts.delivered += count

    def sent(
        self, message: Offer | Committed | OfferEnded, subscription_open: Callable[[int], bool]
    ) -> None:
        """Apply a message we send; :class:`LocalProtocolError` if it is illegal now.
        ``subscription_open(offer)``: our subscription to the offer is open (hub side)."""
        match message:
            case Offer(offer):
                self._open[offer] = _Counts()  # (the connection checked the id is free)
            case Committed(offer, count):
                counts = self._open.get(offer)
                if counts is None or counts.committed + count > counts.delivered:
                    raise LocalProtocolError(
                        f"committed({offer}, {count}): offer not open, or more than was delivered"
                    )
                counts.committed += count
            case OfferEnded(offer, error):
                counts = self._open.get(offer)
                if counts is None:
                    raise LocalProtocolError(f"offerEnded({offer}): offer not open")
                if subscription_open(offer):
                    raise LocalProtocolError(
                        f"offerEnded({offer}) while its subscription is open: cancel it first"
                    )
                if not error and counts.committed != counts.delivered:
                    raise LocalProtocolError(
                        f"offerEnded({offer}, '') with {counts.delivered - counts.committed} "
                        "element(s) not committed: give the reason they were not"
                    )
                del self._open[offer]

    def received(
        self, message: Offer | Committed | OfferEnded, peer_subscribed: Callable[[int], bool]
    ) -> None:
        """Apply a message from the peer; :class:`RemoteProtocolError` if it is illegal now.
        ``peer_subscribed(offer)``: the peer's (the hub's) subscription to it is open."""
        match message:
            case Offer(offer):
                if offer in self._open:
                    raise RemoteProtocolError(f"offer reuses open offer id {offer}")
                self._open[offer] = _Counts()
            case Committed(offer, count):
                counts = self._open.get(offer)
                if counts is None:
                    raise RemoteProtocolError(f"committed for offer {offer}, which is not open")
                if counts.committed + count > counts.delivered:
                    raise RemoteProtocolError(
                        f"committed {counts.committed + count} elements of offer {offer}, but "
                        f"only {counts.delivered} were delivered"
                    )
                counts.committed += count
            case OfferEnded(offer, error):
                counts = self._open.pop(offer, None)
                if counts is None:
                    raise RemoteProtocolError(f"offerEnded for offer {offer}, which is not open")
                if peer_subscribed(offer):
                    raise RemoteProtocolError(
                        f"offerEnded for offer {offer} while the hub's subscription to it is open"
                    )
                if not error and counts.committed != counts.delivered:
                    raise RemoteProtocolError(
                        f"offerEnded({offer}) without an error, but only {counts.committed} of "
                        f"the {counts.delivered} element(s) delivered were committed"
                    )
