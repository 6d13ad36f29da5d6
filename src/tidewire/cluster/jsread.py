"""Reads from any id: a binary search for the record holding it, then batched direct gets.

A stream's records are the messages of its subject, in sequence order, their ids (``Tw-Ids``)
and sums (``Tw-Sum``) growing with the sequence. :func:`seek` finds the first record whose key
(its last id, or a sum for retention) reaches a target with direct gets ``{"seq": mid,
"next_by_subj": subject}``: O(log n) round trips over the shard's sequence range. A
:class:`Reader` remembers where each read stopped, so a subscriber reading on from there never
seeks again, and reads with batched direct gets (one request, up to ``batch`` messages, about
``max_bytes``). Every record is decoded and CRC-checked: a damaged one is
:class:`CorruptRecordError`, never skipped.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..log.segment import ReadBudget
from ..model import Batch, DataLossError
from ..record import HeaderError, decode_body, parse_header
from .catalog import Catalog, Head, RecordPoint
from .jsapi import Api, CorruptRecordError, StoredRecord

__all__ = ["CorruptRecordError", "Reader", "decode", "find_time", "seek"]

POSITIONS = 4096  # remembered read positions (stream, next id) -> sequence, least recent out
BATCH = 256  # messages per batched direct get
STALE_RETRIES = 20  # a lagging replica answered short: ask again, 10 ms apart
_STALE_DELAY = 0.01


def decode(head: Head, record: StoredRecord) -> Batch:
    """The record's batch (zero-copy views of the message's payload), CRC-checked against its
    headers; :class:`CorruptRecordError` when anything disagrees."""
    data = memoryview(record.data)
    try:
        header = parse_header(data)
        if header.length != len(data):
            raise ValueError(f"record length {header.length}, message {len(data)} bytes")
        if (header.base_id, header.last_id) != (record.first_id, record.last_id):
            raise ValueError(f"ids {header.base_id}-{header.last_id}, headers say "
                             f"{record.first_id}-{record.last_id}")  # fmt: skip
        return decode_body(head.name, header, data, 0)
    except (HeaderError, ValueError, TypeError) as exc:
        raise CorruptRecordError(head.jetstream, head.subject, record.seq, str(exc)) from None


Get = Callable[[str, Mapping[str, Any]], Awaitable[StoredRecord | None]]


async def seek(
    api: Api, head: Head, key: Callable[[StoredRecord], int], target: int, get: Get | None = None
) -> StoredRecord | None:
    """The stream's first record whose ``key`` is at least ``target`` (keys grow with the
    sequence); ``None`` when none does. O(log n) direct gets, or ``get``s (the leader's)."""
    get = get or api.direct_get
    if head.last is None:
        return None
    lo = head.first.seq if head.first is not None else 1
    best: StoredRecord | None = None
    hi = head.last.seq + 1  # exclusive: the candidate range is [lo, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        found = await get(head.jetstream, {"seq": mid, "next_by_subj": head.subject})
        if found is None or found.seq >= hi:
            hi = mid  # no record of the stream in [mid, hi)
            continue
        if key(found) >= target:
            best, hi = found, mid
        else:
            lo = found.seq + 1
    return best


async def find_time(api: Api, head: Head, ms: int) -> int | None:
    """The stream's first id whose event timestamp is at least ``ms``; ``None`` when none.

    ``Tw-Sum``'s ``max_ts`` is the running maximum of the stream's timestamps, so the first
    record reaching ``ms`` is found by :func:`seek` (the leader's gets: a lagging replica could
    make it overshoot, and a planner must not start late). Its events are scanned; when none
    reaches ``ms`` (the running maximum came from records retention purged since), the
    following records are read in turn until one does.
    """
    found = await seek(api, head, lambda r: r.sum.max_ts, ms, api.leader_get)
    seq = None if found is None else found.seq
    while seq is not None:
        records = await api.direct_batch(head.jetstream, head.subject, seq, BATCH, 1 << 20)
        seq = None
        for record in records:
            batch = decode(head, record)
            for i, ts in enumerate(batch.timestamps):
                if ts >= ms:
                    return int(batch.ids[i])
            seq = record.seq + 1
    return None


class Reader:
    """Reads of every stream for one storage (see the module)."""

    def __init__(self, api: Api, catalog: Catalog) -> None:
        self.api = api
        self.catalog = catalog
        self._positions: OrderedDict[tuple[str, int], int] = OrderedDict()

    async def read(self, stream: str, from_id: int, max_bytes: int, max_events: int) -> list[Batch]:
        """The storage interface's ``read`` (its contract)."""
        head = self.catalog.heads.get(stream)
        if head is None or head.last is None or max_events < 1:
            return []
        from_id = max(from_id, 1)
        start = head.start_id
        if from_id < start and start > 1:
            raise DataLossError(stream, from_id, start)
        for _ in range(STALE_RETRIES):
            if from_id > head.latest:
                return []
            got = await self._read(head, from_id, max_bytes, max_events)
            if got:
                return got
            await asyncio.sleep(_STALE_DELAY)  # a replica behind the head we know of
        return []

    async def _read(
        self, head: Head, from_id: int, max_bytes: int, max_events: int, *, sure: bool = False
    ) -> list[Batch]:
        """One read; ``sure``: seek with the leader's gets (a direct get may be answered by a
        replica behind the others, which can make a seek overshoot)."""
        seq = None if sure else self._positions.pop((head.name, from_id), None)
        if seq is None:
            get = self.api.leader_get if sure else None
            found = await seek(self.api, head, lambda r: r.last_id, from_id, get)
            if found is None:
                return []
            seq = found.seq
        budget = ReadBudget(from_id, max_bytes, max_events)
        checked = False
        while budget.open:
            records = await self.api.direct_batch(head.jetstream, head.subject, seq,
                                                  min(BATCH, budget.events_left),
                                                  max(budget.bytes_left, 1))  # fmt: skip
            if not records:
                break
            for record in records:
                if not checked:
                    checked = True
                    if await self._lost(head, record, from_id, sure):
                        return await self._read(head, from_id, max_bytes, max_events, sure=True)
                batch = decode(head, record)
                self.catalog.advance(head.name, RecordPoint.of(record))
                taken = budget.add(batch)
                seq = record.seq if budget.next_id <= record.last_id else record.seq + 1
                if not taken:
                    break
        if budget.out:
            self._remember(head.name, budget.next_id, seq)
        return budget.out

    async def _lost(self, head: Head, record: StoredRecord, from_id: int, sure: bool) -> bool:
        """Whether the first record found after ``from_id`` follows one that held it
        (``Tw-Sum``'s prev) which is not there. Removed by retention (:class:`DataLossError`)
        when it is the stream's first record now, as the leader says; else the seek
        overshot (True: seek again, surely)."""
        if record.first_id <= from_id or record.sum.prev < from_id:
            return False
        first = await self.api.leader_get(head.jetstream, {"seq": 0, "next_by_subj": head.subject})
        if sure or first is None or first.seq >= record.seq:
            self.catalog.trimmed(head.name, RecordPoint.of(first or record))
            raise DataLossError(head.name, from_id, (first or record).sum.prev + 1)
        return True

    def forget(self, stream: str) -> None:
        """Drop every position remembered for ``stream`` (deleted: its sequences are gone, and
        a stream made again under the name reuses its ids)."""
        for key in [k for k in self._positions if k[0] == stream]:
            del self._positions[key]

    def _remember(self, stream: str, next_id: int, seq: int) -> None:
        self._positions[(stream, next_id)] = seq
        self._positions.move_to_end((stream, next_id))
        while len(self._positions) > POSITIONS:
            self._positions.popitem(last=False)
