"""A second :class:`~tidewire.hub.Storage`: streams in memory, appends completed when the test
says (``hold=True``) or at the next turn of the loop. It proves the interface has no local-disk
assumption (the hub runs on it), and lets the ingest tests complete appends out of order and
refuse them for want of space. :class:`Gateway`: one of several hubs' doors to one shared
:class:`MemoryStorage` (cluster mode in one process)."""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tidewire.hub import StreamStats
from tidewire.model import (
    MAX_ID,
    Batch,
    DataLossError,
    IdOrderError,
    LogClosedError,
    StorageFullError,
)


@dataclass(slots=True, eq=False)
class Pending:
    """An append handed to the storage, not completed yet."""

    batch: Batch  # with its final ids
    future: asyncio.Future[Batch]
    fence: int | None


class MemoryStorage:
    """Every stream a list of committed batches, in id order."""

    def __init__(self, *, hold: bool = False) -> None:
        self.hold = hold
        self.committed: dict[str, list[Batch]] = {}
        self.starts: dict[str, int] = {}
        self.accepted: dict[str, int] = {}
        self.pending: list[Pending] = []
        self.appends = 0  # calls to append, ever
        self.refusals = 0
        self.closed = False
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    # ------------------------------------------------------------------ the test's controls

    def complete(self, index: int = 0) -> None:
        """Commit the ``index``-th pending append (any order)."""
        item = self.pending.pop(index)
        if item.future.done():
            return
        if item.fence is not None and item.fence != self.refusals:
            self._refuse(item, during="after an earlier refusal")
            return
        batches = self.committed.setdefault(item.batch.stream, [])
        batches.append(item.batch)
        batches.sort(key=lambda b: b.first_id)
        item.future.set_result(item.batch)
        self._notify(item.batch.stream)

    def refuse(self, index: int = 0) -> None:
        """Refuse the ``index``-th pending append for want of space."""
        self._refuse(self.pending.pop(index), during="writing")

    def _refuse(self, item: Pending, during: str) -> None:
        self.refusals += 1
        stream = item.batch.stream
        if not item.future.done():
            item.future.set_exception(StorageFullError(stream, errno.ENOSPC, during))
        self.accepted[stream] = self.latest(stream)  # (the ids are free again)
        self._notify(stream)

    def trim(self, stream: str, start_id: int) -> None:
        """Retention: drop the events below ``start_id``."""
        self.starts[stream] = start_id
        self.committed[stream] = [b for b in self.committed.get(stream, []) if
                                  b.last_id >= start_id]  # fmt: skip

    # ------------------------------------------------------------------ Storage

    def cluster(self) -> None:
        return None

    def describe(self) -> str:
        return "memory"

    def observe(
        self,
        *,
        append: Callable[[float], None] | None = None,
        fsync: Callable[[float], None] | None = None,
    ) -> None:
        pass

    def streams(self) -> list[str]:
        return sorted(self.committed)

    def stats(self) -> list[StreamStats]:
        out = []
        for name in self.streams():
            batches = self.committed[name]
            events = sum(len(b) for b in batches)
            first = batches[0].first_id if batches else None
            latest = batches[-1].last_id if batches else None
            out.append(StreamStats(name, events, first, latest,
                                   sum(b.nbytes for b in batches), len(batches)))  # fmt: skip
        return out

    def __contains__(self, stream: object) -> bool:
        return stream in self.committed

    def latest(self, stream: str) -> int:
        batches = self.committed.get(stream)
        return batches[-1].last_id if batches else 0

    def accepted_latest(self, stream: str) -> int:
        return max(self.accepted.get(stream, 0), self.latest(stream))

    def start_id(self, stream: str) -> int:
        return self.starts.get(stream, 1)

    def fence(self) -> int:
        return self.refusals

    def replay(self, stream: str) -> Iterator[Batch]:
        yield from list(self.committed.get(stream, []))

    async def append(
        self, batch: Batch, *, assign_ids: bool = False, fence: int | None = None
    ) -> Batch:
        if self.closed:
            raise LogClosedError("closed")
        self.appends += 1
        batch = batch.owned().validate()
        if fence is not None and fence != self.refusals:
            raise StorageFullError(batch.stream, errno.ENOSPC, "after an earlier refusal")
        accepted = self.accepted_latest(batch.stream)
        if assign_ids:
            assert accepted + len(batch) <= MAX_ID
            batch = batch.with_ids(accepted + 1)
        elif batch.first_id <= accepted:
            raise IdOrderError(batch.stream, batch.first_id, accepted)
        self.accepted[batch.stream] = batch.last_id
        item = Pending(batch, asyncio.get_running_loop().create_future(), fence)
        self.pending.append(item)
        if not self.hold:
            asyncio.get_running_loop().call_soon(self._complete_item, item)
        return await item.future

    def _complete_item(self, item: Pending) -> None:
        if item in self.pending:
            self.complete(self.pending.index(item))

    async def read(
        self, stream: str, from_id: int, max_bytes: int, max_events: int
    ) -> list[Batch]:
        start = self.start_id(stream)
        if from_id < start and start > 1:
            raise DataLossError(stream, from_id, start)
        out: list[Batch] = []
        size = events = 0
        for batch in self.committed.get(stream, []):
            if batch.last_id < from_id:
                continue
            skip = sum(1 for i in batch.ids if i < from_id)
            part = batch.slice(skip, min(len(batch), skip + max_events - events))
            if out and size + part.nbytes > max_bytes:
                break
            out.append(part)
            size += part.nbytes
            events += len(part)
            if events >= max_events or size >= max_bytes:
                break
        return out

    async def find_time(self, stream: str, ms: int) -> int | None:
        """By brute force: the first retained event whose timestamp is at least ``ms``."""
        start = self.start_id(stream)
        return next((event.id for batch in self.committed.get(stream, []) for event in batch
                     if event.id >= start and event.timestamp >= ms), None)  # fmt: skip

    async def wait_for(self, stream: str, after_id: int) -> None:
        while self.latest(stream) <= after_id:
            if self.closed:
                raise LogClosedError("closed")
            future = asyncio.get_running_loop().create_future()
            waiters = self._waiters.setdefault(stream, [])
            waiters.append(future)
            try:
                await future
            finally:
                if future in waiters:
                    waiters.remove(future)

    def _notify(self, stream: str) -> None:
        for future in self._waiters.pop(stream, []):
            if not future.done():
                future.set_result(None)

    async def settled(self, stream: str) -> int:
        mine = [p.future for p in self.pending if p.batch.stream == stream]
        if mine:
            await asyncio.wait(mine)
        return self.latest(stream)

    def enforce_retention(self, now_ms: int) -> int:
        return 0

    async def close(self) -> None:
        self.closed = True
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)


class Gateway:
    """One gateway's door to a shared :class:`MemoryStorage` (cluster mode: several hubs over
    one storage, in one process). Everything is the shared storage's, except:

    * :meth:`close` closes this door only (the others go on);
    * :meth:`kill` (or :attr:`die_before`, :attr:`die_after`): the gateway "dies" there:
      every later append, read or wait of it raises :class:`~tidewire.model.LogClosedError`,
      while what it handed over before still lands (as a publish that reached the cluster
      does);
    * ``rng``: each append first lets the loop turn 0..3 times (chosen by ``rng``), so that
      two gateways' appends interleave in ways a seed picks.
    """

    def __init__(self, shared: MemoryStorage, rng: random.Random | None = None) -> None:
        self.shared = shared
        self.rng = rng
        self.dead = False
        self.reads: dict[str, int] = {}  # by stream: how many reads this gateway made
        self.die_before: Callable[[Batch], bool] = lambda batch: False
        """The test's seam: an append for which this says true kills the gateway instead."""
        self.die_after: Callable[[Batch], bool] = lambda batch: False
        """An append for which this says true lands, then the gateway dies (no answer)."""

    def kill(self) -> None:
        self.dead = True

    def _alive(self) -> None:
        if self.dead or self.shared.closed:
            raise LogClosedError("this gateway is gone")

    def cluster(self) -> None:
        return None

    def describe(self) -> str:
        return "memory (a gateway)"

    def observe(
        self,
        *,
        append: Callable[[float], None] | None = None,
        fsync: Callable[[float], None] | None = None,
    ) -> None:
        pass

    def streams(self) -> list[str]:
        return self.shared.streams()

    def stats(self) -> list[StreamStats]:
        return self.shared.stats()

    def __contains__(self, stream: object) -> bool:
        return stream in self.shared

    def latest(self, stream: str) -> int:
        return self.shared.latest(stream)

    def accepted_latest(self, stream: str) -> int:
        return self.shared.accepted_latest(stream)

    def start_id(self, stream: str) -> int:
        return self.shared.start_id(stream)

    def fence(self) -> int:
        return self.shared.fence()

    def replay(self, stream: str) -> Iterator[Batch]:
        return self.shared.replay(stream)

    async def append(
        self, batch: Batch, *, assign_ids: bool = False, fence: int | None = None
    ) -> Batch:
        self._alive()
        for _ in range(self.rng.randrange(4) if self.rng is not None else 0):
            await asyncio.sleep(0)
            self._alive()
        if self.die_before(batch):
            self.kill()
            self._alive()
        stored = await self.shared.append(batch, assign_ids=assign_ids, fence=fence)
        if self.die_after(batch):
            self.kill()
        self._alive()
        return stored

    async def read(
        self, stream: str, from_id: int, max_bytes: int, max_events: int
    ) -> list[Batch]:
        self._alive()
        self.reads[stream] = self.reads.get(stream, 0) + 1
        return await self.shared.read(stream, from_id, max_bytes, max_events)

    async def find_time(self, stream: str, ms: int) -> int | None:
        self._alive()
        return await self.shared.find_time(stream, ms)

    async def wait_for(self, stream: str, after_id: int) -> None:
        self._alive()
        await self.shared.wait_for(stream, after_id)

    async def settled(self, stream: str) -> int:
        self._alive()
        return await self.shared.settled(stream)

    def enforce_retention(self, now_ms: int) -> int:
        return 0

    async def close(self) -> None:
        self.dead = True
