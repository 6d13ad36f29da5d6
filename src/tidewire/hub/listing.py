"""The hub's stream listing as a subscription-shaped source: what RS.io's publisher
``?streams`` delivers (docs/protocols/rsio.md), within demand, by the ordinary pump.

The rows are taken once, when the listing is made (a snapshot, not a live view): one JSON
element per stream the principal may read, ``{"stream", "exists", "first_id", "latest_id",
"events", "bytes"}`` (``first_id`` null when the stream is empty; a stream named but absent is
listed with ``"latest_id": 0`` and ``"exists": false``), then the end. Parsing the publisher
name is the wire protocol's business; this module takes the names.

``?times=`` (issue 23, :meth:`Listing.times`): one element per (stream, ms) pair the principal
may read, ``{"stream", "time", "id"}``, ``id`` the first id whose timestamp is at least
``time`` (:meth:`Hub.find_time`), ``null`` when no event is that new; looked up at the first
delivery (the lookups are I/O), then a snapshot like the listing's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from ..model import Batch
from .access import Access, Principal
from .hub import Hub

__all__ = ["Listing"]


class Listing:
    """The streams ``names`` (``None``: every stream, sorted) as JSON rows, delivered within
    demand: :meth:`request`, :meth:`cancel`, :meth:`next` and :attr:`complete`, as a
    :class:`~tidewire.hub.Subscription` has them."""

    def __init__(
        self, hub: Hub, names: list[str] | None, access: Access, principal: Principal
    ) -> None:
        stats = {s.name: s for s in hub.streams()}
        wanted = access.streams(principal, sorted(stats) if names is None else names)
        rows = []
        for stream in wanted:
            st = stats.get(stream)
            row: dict[str, object] = {"stream": stream, "exists": st is not None}
            if st is None:
                row.update(first_id=None, latest_id=0, events=0, bytes=0)
            else:
                row.update(first_id=st.first_id, latest_id=st.latest_id or 0,
                           events=st.events, bytes=st.bytes)  # fmt: skip
            rows.append(json.dumps(row, separators=(",", ":")).encode())
        self._rows = rows
        self._hub = hub
        self._times: Sequence[tuple[str, int]] = ()  # pairs still to look up (times())
        self.demand = 0
        self.cancelled = False
        self._wake = asyncio.Event()

    @classmethod
    def of(cls, hub: Hub, names: Sequence[str] | None, times: Sequence[tuple[str, int]] | None,
           access: Access, principal: Principal) -> Listing:  # fmt: skip
        """``?times=`` when ``times`` is given, else ``?streams`` of ``names``."""
        if times is not None:
            return cls.times(hub, times, access, principal)
        return cls(hub, None if names is None else list(names), access, principal)

    @classmethod
    def times(cls, hub: Hub, pairs: Sequence[tuple[str, int]], access: Access,
              principal: Principal) -> Listing:  # fmt: skip
        """The ids at times of ``?times=``: one row per pair whose stream ``principal`` may
        read, looked up at the first :meth:`next`."""
        listing = cls(hub, [], access, principal)
        readable = set(access.streams(principal, {stream for stream, _ in pairs}))
        listing._times = [(stream, ms) for stream, ms in pairs if stream in readable]
        return listing

    async def _look_up(self) -> None:
        pairs, self._times = self._times, ()
        for stream, ms in pairs:
            found = await self._hub.find_time(stream, ms)
            row = {"stream": stream, "time": ms, "id": found}
            self._rows.append(json.dumps(row, separators=(",", ":")).encode())

    @property
    def complete(self) -> bool:
        """Every row was delivered."""
        return not self._rows and not self._times

    def request(self, n: int) -> None:
        self.demand = min(2**63 - 1, self.demand + n)
        self._wake.set()

    def cancel(self) -> None:
        self.cancelled = True
        self._wake.set()

    async def next(self) -> list[Batch] | None:
        """The next rows within demand (waits for demand); ``None`` once all went or when
        cancelled."""
        if self._times and not self.cancelled:
            await self._look_up()
        while not self.cancelled and self._rows:
            if self.demand:
                rows, self._rows = self._rows[: self.demand], self._rows[self.demand :]
                self.demand -= len(rows)
                return [Batch.build("-", rows, timestamps=0)]
            self._wake.clear()
            await self._wake.wait()
        return None
