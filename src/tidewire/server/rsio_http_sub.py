"""One RS.io-over-HTTP subscription on the hub (:mod:`.rsio_http`): its sans-IO state, the
batches its pump has read and not yet put in a response, its share of the memory budget, and
how far its reads run ahead of the client's demand.

Read-ahead (issue 22): a fetch that finds its elements read answers at once; one that finds
nothing waits for the log (a read, a hop to a worker thread and back) before it can answer.
So once the hub subscription has delivered all its demand, it is given the client's largest
request yet once more (:meth:`HttpSubscription.read_ahead`), and the pump reads that while
the last response is on its way; the client's next request then covers it
(:meth:`HttpSubscription.ask`). A response still holds no more than the client's demand, and
what is read is still one delivery at most, granted by the share first: what changes is
when the read happens, not how much is held. When the client asks for more than the read
ahead guessed, the fetch has the pump read once more before it answers
(:meth:`HttpSubscription.short`), so that responses hold what they held when every read
followed the demand.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass

from ..hub import RecordSubscription, Share, Subscription
from ..hub.access import Principal
from ..model import Batch, TidewireError
from ..protocols.rsio.envelopes import encode_envelopes, fixed_size_values
from ..protocols.rsio.names import PublisherName
from ..protocols.rsio_http import (
    FIXED_SIZE,
    LENGTH_PREFIXED,
    ServerSubscription,
    length_prefixed_envelopes,
    length_prefixed_values,
)

__all__ = ["HttpSubscription", "Prebuilt", "response_body"]


@dataclass(frozen=True, slots=True)
class Prebuilt:
    """A response body encoded ahead, by the pump, from exactly ``batches`` (all of
    :attr:`HttpSubscription.ready` when it was made): ``count`` elements, its
    ``Content-Encoding`` (``None``: one element)."""

    batches: tuple[Batch, ...]
    count: int
    body: bytes
    encoding: str | None


class HttpSubscription:
    """The hub's side of one subscription: made by a subscribe, found by its id."""

    def __init__(self, sid: str, name: PublisherName, source: Subscription | RecordSubscription,
                 now: float, owner: Principal, share: Share) -> None:  # fmt: skip
        self.id = sid
        self.name = name
        self.owner = owner  # the principal that made it: the only one it answers
        self.source = source
        self.share = share  # its bytes in the hub's budget, under its owner's name
        self.paused = False  # the share refused the next read-ahead: the pump waits
        self.state = ServerSubscription(name.size)
        self.ready: deque[Batch] = deque()  # from the hub, not yet in a delivery
        self.ready_bytes = 0
        self.changed = asyncio.Event()  # ready, state or demand changed
        self.drained = asyncio.Event()  # the pump may read more
        self.last_seen = now
        self.fetching = 0  # fetches under way
        self.polls = 0  # the newest fetch's number: an older one still waiting answers 204
        self.pump: asyncio.Task[None] | None = None
        self.lead = 0  # the largest request yet: what the pump reads ahead of demand
        self.ahead = 0  # demand the hub subscription was given ahead of the client's
        self.topup = False  # a fetch waits for one more read to fill its response
        self.guessed = False  # what is ready was read ahead of demand (read_ahead)
        self.prebuilt: Prebuilt | None = None  # the next response's body, encoded ahead

    @property
    def hub_sub(self) -> Subscription:
        """The hub subscription that reads the log (under a record subscription, if any)."""
        source = self.source
        return source.sub if isinstance(source, RecordSubscription) else source

    def ask(self, n: int) -> None:
        """``n`` (>= 1) more elements of demand, for the responses and for the hub
        subscription (less what it was given ahead already: see :meth:`read_ahead`)."""
        self.state.request(n)
        self.lead = max(self.lead, n)
        covered = min(n, self.ahead)
        self.ahead -= covered
        if n > covered:
            self.source.request(n - covered)

    def read_ahead(self) -> bool:
        """Give the hub subscription, which has delivered all its demand, :attr:`lead` more
        (once, until requests cover it), so that the pump reads what the client's next
        request will most likely ask for. ``False`` when there is nothing to give (no
        request yet, or given already)."""
        if self.ahead or not self.lead:
            return False
        self.ahead = self.lead
        self.source.request(self.lead)
        return True

    def short(self, max_response_bytes: int) -> bool:
        """Whether what is ready was read ahead of demand and is less than the next response
        may hold, while more can be read at once (committed, demanded, and no key filter
        that could drop it all, which would make the read wait for commits): the client
        asked for more than the read ahead guessed."""
        source, hub_sub = self.source, self.hub_sub
        if not self.guessed or self.name.key is not None or self.paused or hub_sub.done or (
                source.demand <= 0):  # fmt: skip
            return False
        if not (source.held_bytes or hub_sub.poll_ready()):
            return False
        ready = self.ready
        count = len(ready) if self.name.format == "records" else sum(len(b) for b in ready)
        return count < self.state.room and self.ready_bytes < max_response_bytes

    def prebuild(self, max_response_bytes: int) -> None:
        """Encode what was just read ahead (:attr:`ready`, all of it) as the body of the
        response the client's next fetch will most likely get (issue 22): the pump does it
        while the last response is on its way, so that the fetch only writes it. The fetch
        uses it only if it takes exactly these batches (``rsio_http.RsioHttp._take``); a
        body that cannot be encoded (a value that is not ``size=N`` bytes) is left to the
        fetch, which refuses it. The body is charged to the ``readahead`` gauge; when the
        share has no room for it, nothing is encoded ahead."""
        if self.name.format == "records":  # (one record per response: nothing to gain)
            return
        batches = tuple(self.ready)
        if self.ready_bytes > max_response_bytes and len(batches) > 1:
            return  # (a response would take only part of it)
        count = sum(len(b) for b in batches)
        # The body's bytes are granted by the share first, as a read is (an envelope and its
        # length take at most 16 bytes more than the event's columns): no room, no body.
        held = self.ready_bytes + self.source.held_bytes
        if not self.share.try_hold("readahead", held + self.ready_bytes + 16 * count):
            return
        with contextlib.suppress(TidewireError, ValueError):
            body, encoding = response_body(self.name, list(batches), count)
            self.prebuilt = Prebuilt(batches, count, body, encoding)
        # (the caller, the pump, sets the gauges to the exact bytes next: account)

    def touch(self) -> None:
        self.changed.set()

    def account(self) -> None:
        """Set the share's gauges to what this subscription holds now (bytes in memory)."""
        pre = self.prebuilt
        self.share.hold("readahead", self.ready_bytes + self.source.held_bytes + (
            len(pre.body) if pre is not None else 0))  # fmt: skip
        state = self.state
        last = state.last
        kept = len(last.body) if last is not None and last is not state.unsent else 0
        self.share.hold("outbound", state.pending + kept)


def response_body(name: PublisherName, batches: list[Batch],
                  count: int) -> tuple[bytes, str | None]:  # fmt: skip
    """The body of a response of ``count`` elements from ``batches`` (not ``format=records``:
    one record per response), and its ``Content-Encoding`` (``None``: one element)."""
    if name.size:  # (one join of the columns' views, the size first: one copy)
        columns = [fixed_size_values(b, name.size) for b in batches]
        if count == 1:
            return bytes(columns[0]), None
        return b"".join([name.size.to_bytes(4, "big"), *columns]), FIXED_SIZE
    if name.format == "value":
        if count == 1:
            return batches[0].value(0), None
        body = b"".join([length_prefixed_values(b.values, b.value_offsets) for b in batches])
        return body, LENGTH_PREFIXED
    if count == 1:
        return encode_envelopes(batches[0])[0], None
    body = b"".join([length_prefixed_envelopes(b) for b in batches])  # (compiled: native)
    return body, LENGTH_PREFIXED
