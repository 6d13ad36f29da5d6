"""Bulk appends: many records of one stream that readers see all at once, or none of them
(issue 23: a staged transaction of any size, hub/staging.py), and the in-memory tail of
recent commits that such an append bypasses.

:meth:`Log.append_bulk <tidewire.log.store.Log.append_bulk>` takes a *source* (a function
giving the batches, in order, read as they are written: one staged part at a time, so that
the bulk is never in memory at once) and the ids it is to get (the caller's own, above the
stream's latest, as a transaction's intent names them). It

1. waits for the stream's queue to be empty and nothing of it in flight, with the queue's
   admission held (appenders that come meanwhile wait behind it, in order); then takes the
   stream as a group in flight would (``busy``) and counts its ids as accepted, so that later
   appenders queue behind it with ids above it;
2. in a worker thread, encodes each batch as one record with its ids and writes it past the
   segment's committed end, publishing nothing (:meth:`~.stream.StreamLog.write_bulk`), then
   fdatasyncs the segment and submits one payload-less journal entry for the whole extent;
3. waits for that entry to be durable, then publishes every record under the stream's lock
   in one step: a reader sees all of them from then on, or (before) none.

A crash before the entry is durable leaves bytes past the stream's durable end, which recovery
cuts (docs/log.md, "Recovery"): all or nothing survives, as for any group. Without the journal
(``log.journal = false``) that cut has no entry to go by: a crash in the middle of a bulk
append may then leave its first records; the staged commit uses bulk appends only with the
journal (or without fsync, whose data a crash may lose anyway). The queue's byte bound does not
count a bulk append (its bytes are never queued in memory); the disk is its bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..model import MAX_ID, Batch, IdOrderError, InvalidBatch, LimitExceeded, LogClosedError
from ..record import HEADER_SIZE, EncodedRecord, encode
from .committer import StreamQueue
from .segment import ReadBudget
from .stream import StreamLog, Unpublished

if TYPE_CHECKING:
    from .store import Log

__all__ = ["RECENT_BATCH_OVERHEAD", "BulkAppender", "read_recent", "remember"]

RECENT_BATCH_OVERHEAD = 1024
"""Bytes one batch of the in-memory tail costs beyond its ``nbytes``: the batch object and its
views, the record's header and buffer (measured: about 1.1 KB). ``recent_bytes`` counts it, so
that it bounds the memory held and not only the payload: without it, a stream of one-event
appends (the hub's own state records, ten a second) kept about ten times its bound."""

Source = Callable[[], Iterator[Batch]]
"""What a bulk append writes: called once, in a worker thread; its batches in order."""


class BulkAppender:
    """The bulk appends of one log (see the module docstring)."""

    def __init__(self, log: Log, ready: Callable[[StreamQueue], None],
                 notify: Callable[[str], None],
                 tasks: set[asyncio.Task[Any]]) -> None:  # fmt: skip
        self._log = log
        self._ready = ready
        self._notify = notify
        self._tasks = tasks  # the committer's (Log.close waits for them)

    async def append(self, queue: StreamQueue, first_id: int, count: int, size_hint: int,
                     source: Source) -> tuple[int, int]:  # fmt: skip
        """Append ``count`` events from ``source`` as ids ``first_id``.. at once; the ids
        stored (first, last). :class:`IdOrderError` if ``first_id`` is not above the stream's
        latest (queued appends included); :class:`ValueError` if the source does not give
        ``count`` events; its own errors propagate (nothing is stored then)."""
        last_id = first_id + count - 1
        if count < 1 or last_id > MAX_ID:
            raise InvalidBatch(f"a bulk append of {count} event(s) from id {first_id}")
        stream = queue.stream
        queue.waiting += 1
        try:
            async with queue.admission:
                while queue.queue or queue.busy:  # (each group's end sets ``room``)
                    queue.room.clear()
                    await queue.room.wait()
                if stream.failed is not None:
                    raise LogClosedError(f"stream {stream.name!r} failed: {stream.failed}")
                if first_id <= queue.latest:
                    raise IdOrderError(stream.name, first_id, queue.latest)
                queue.busy, queue.latest = True, last_id
        finally:
            queue.waiting -= 1
        # A task of its own, shielded: a caller that goes away does not stop it half-way.
        task = asyncio.create_task(self._write(queue, first_id, count, size_hint, source))
        queue.task = task  # (Log.committer(name) tells of it)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _write(self, queue: StreamQueue, first_id: int, count: int, size_hint: int,
                     source: Source) -> tuple[int, int]:  # fmt: skip
        try:
            return await self._written(queue, first_id, count, size_hint, source)
        finally:
            queue.busy, queue.writing, queue.task = False, None, None
            queue.room.set()
            if queue.queue:
                self._ready(queue)

    async def _written(self, queue: StreamQueue, first_id: int, count: int, size_hint: int,
                       source: Source) -> tuple[int, int]:  # fmt: skip
        log, stream = self._log, queue.stream
        job = asyncio.get_running_loop().run_in_executor(
            None, self._records, stream, first_id, count, size_hint, source)
        queue.writing = job  # (Log.close waits for it)
        try:
            written = await asyncio.shield(job)
            journal = log.journal
            lsn = written.lsn
            if journal is not None and lsn >= 0 and journal.durable_now(lsn) is None:
                await journal.durable(lsn)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) or (job.done() and not job.exception()):
                # written, fate unknown to this process: as a committer cancelled mid-write
                if stream.failed is None:
                    stream.failed = RuntimeError("a bulk append was cancelled mid-write")
            elif stream.failed is None and not queue.queue:
                queue.latest = stream.latest  # (nothing written: the ids are free again)
            self._notify(stream.name)
            raise
        stream.publish_written(written)
        queue.recent.clear()  # (its batches were never in memory: the tail now has a gap)
        queue.recent_bytes = 0
        self._notify(stream.name)
        return first_id, first_id + count - 1

    def _records(self, stream: StreamLog, first_id: int, count: int, size_hint: int,
                 source: Source) -> Unpublished:  # fmt: skip
        """In a worker thread: encode and write everything (:meth:`StreamLog.write_bulk`)."""
        limit = self._log.config.max_record_bytes

        def groups() -> Iterator[Sequence[EncodedRecord]]:
            next_id = first_id
            for batch in source():
                if next_id + len(batch) - 1 > first_id + count - 1:
                    raise ValueError(f"a bulk append's source gave more than {count} event(s)")
                records = [encode(piece, next_id + at) for at, piece in _fitting(batch, limit)]
                for record in records:
                    if record.length > limit:  # (one event alone too big)
                        raise LimitExceeded("record bytes", limit, record.length)
                next_id += len(batch)
                yield records
            if next_id != first_id + count:
                raise ValueError(f"a bulk append's source gave {next_id - first_id} "
                                 f"event(s), not {count}")  # fmt: skip

        config = self._log.config
        written = stream.write_bulk(groups(), size_hint, self._log.journal, fsync=config.fsync)
        if written is None:  # (count >= 1: groups() raised already)
            raise ValueError("a bulk append's source gave no event")
        return written


def _fitting(batch: Batch, limit: int, at: int = 0) -> Iterator[tuple[int, Batch]]:
    """``batch`` in slices (with their offsets) that each fit a record of ``limit`` bytes, as
    :meth:`Log.append <tidewire.log.store.Log.append>` estimates it (halved until they do):
    a source's batch need not fit this log's records (a staged record is checked against
    the staging hub's limit)."""
    n = len(batch)
    if n == 1 or batch.nbytes + HEADER_SIZE <= limit:
        yield at, batch
        return
    half = n // 2
    yield from _fitting(batch.slice(0, half), limit, at)
    yield from _fitting(batch.slice(half, n), limit, at + half)


def remember(queue: StreamQueue, batches: list[Batch], limit: int) -> None:
    """Keep the newest committed batches in memory (at most ``limit`` bytes, each counted with
    :data:`RECENT_BATCH_OVERHEAD`) so that live tails read without disk I/O."""
    for batch in batches:
        queue.recent.append(batch)
        queue.recent_bytes += batch.nbytes + RECENT_BATCH_OVERHEAD
    while queue.recent and queue.recent_bytes > limit:
        queue.recent_bytes -= queue.recent.popleft().nbytes + RECENT_BATCH_OVERHEAD


def read_recent(queue: StreamQueue | None, from_id: int, max_bytes: int,
                max_events: int) -> list[Batch] | None:  # fmt: skip
    """Serve a read from the in-memory tail, or ``None`` if it starts before it."""
    if queue is None or not queue.recent or from_id < queue.recent[0].first_id:
        return None
    if from_id < queue.stream.start_id:  # retention got there first: let read() say so
        return None
    if queue.recent[-1].last_id < queue.stream.latest:
        # A commit was published by the writer thread but is not remembered yet: the disk
        # has it, the memory does not (yet).
        return None
    budget = ReadBudget(from_id, max_bytes, max_events)
    for batch in queue.recent:
        if not budget.add(batch):
            break
    return budget.out
