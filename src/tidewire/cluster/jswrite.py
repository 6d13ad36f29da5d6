"""Per-stream writers: this gateway's appends to one stream, as conditional JetStream publishes.

Every append to a stream is queued on its :class:`StreamWriter`; one publish per stream is in
flight at a time, and the appends queued meanwhile are merged into the next record (group
commit, as the embedded log does). Different streams publish concurrently.

Each publish carries ``Nats-Expected-Last-Subject-Sequence``, the subject's last sequence as
this gateway knows it, so JetStream stores it only if no other gateway wrote the stream since.
When one did (error 10071), the writer reads the stream's head from the leader, plans the ids
again (an append's own ids no longer above the head fail with ``IdOrderError``; assigned ids
continue from the head) and publishes again. A publish that got no ack (timeout, no responders
while a leader is elected) is retried with backoff, bounded by ``append_timeout_s``; since it
may have been stored, a retry refused with 10071 first looks for its own ``Tw-Write`` among the
subject's messages after the expected sequence: found, the append is done (stored once).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import Error as NatsError

from ..model import (
    MAX_ID,
    Batch,
    IdOrderError,
    LimitExceeded,
    LogClosedError,
    LogError,
    StorageFullError,
    TidewireError,
)
from ..record import HEADER_SIZE, encode, merge
from .catalog import Catalog, Head, RecordPoint
from .jsapi import (
    WRONG_LAST_SEQUENCE,
    Api,
    JetStreamError,
    StoredRecord,
    Tombstone,
    is_storage_full,
)
from .subjects import IDS, SUM, WRITE, RecordSum

__all__ = ["RECORD_BYTES", "StreamWriter", "WriterHost"]

log = logging.getLogger(__name__)

RECORD_BYTES = 8 * 1024 * 1024 - 64 * 1024
"""The largest record the writer publishes: JetStream's ``max_payload`` (8 MiB) less room for
the headers. A bigger batch is split into several records."""

_NO_ACK = (NatsError, asyncio.TimeoutError)  # (ConnectionClosedError is caught before)
_FIRST_DELAY = 0.05
_FIRST_ACK_WAIT = 1.0
_MAX_DELAY = 1.0


class WriterHost(Protocol):
    """What a writer needs from the storage that owns it."""

    api: Api
    catalog: Catalog
    append_timeout_s: float
    refusals: int
    on_append: Callable[[float], None] | None

    def next_write(self) -> str:
        """A ``Tw-Write`` value never used before (``<gateway uuid>:<n>``)."""
        ...

    def refused(self, exc: StorageFullError) -> None:
        """An append was refused for want of space: bump the fence."""
        ...

    def tombstoned(self, stream: str, seq: int) -> None:
        """The stream was deleted, its tombstone at ``seq`` (found by a refused append):
        forget its records (:meth:`Catalog.fenced`), and what was read of them."""
        ...


@dataclass(slots=True, eq=False)
class _Append:
    """One caller's append, queued; ``done`` events of it already stored (a batch bigger than
    a record is published in parts)."""

    batch: Batch
    assign: bool
    fence: int | None
    future: asyncio.Future[Batch]
    started: float
    done: int = 0
    ids: array[int] = field(default_factory=lambda: array("Q"))  # assigned ids, so far


@dataclass(slots=True)
class _Part:
    item: _Append
    start: int
    stop: int
    first_id: int = 0  # planned: the part's first id


class _Conflict(TidewireError):
    """Another gateway wrote the stream since the head this publish expected (internal: the
    writer plans again and never lets it out)."""


class StreamWriter:
    """The appends of one stream from this gateway (see the module)."""

    def __init__(self, host: WriterHost, head: Head, max_queued_bytes: int) -> None:
        self.host = host
        self.head = head
        self.max_queued_bytes = max_queued_bytes
        self.queue: deque[_Append] = deque()
        self.queued_bytes = 0
        self.accepted = 0  # the last id planned for a queued append (accepted_latest)
        self.room = asyncio.Event()
        self.admission = asyncio.Lock()
        self.waiting = 0  # appenders waiting for room (newcomers queue behind them)
        self.idle = asyncio.Event()
        self.idle.set()
        self.task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ queueing

    async def append(self, batch: Batch, assign: bool, fence: int | None) -> Batch:
        """Queue ``batch`` (owned and validated) and wait until it is stored or refused."""
        started = time.perf_counter()
        size = batch.nbytes
        if self.waiting or self._full(size):
            # Bounded in bytes: wait for room, first come first served (an asyncio.Lock is
            # FIFO), so that appends are stored in the order of the calls.
            self.waiting += 1
            try:
                async with self.admission:
                    while self._full(size):
                        self.room.clear()
                        await self.room.wait()
                    stored = self._enqueue(batch, assign, fence, started)
            finally:
                self.waiting -= 1
        else:
            stored = self._enqueue(batch, assign, fence, started)
        return await stored

    def _full(self, size: int) -> bool:
        return bool(self.queue) and self.queued_bytes + size > self.max_queued_bytes

    def _enqueue(
        self, batch: Batch, assign: bool, fence: int | None, started: float
    ) -> asyncio.Future[Batch]:
        self._check_fence(fence)
        cursor = max(self.accepted, self.head.latest)
        if assign:
            if cursor + len(batch) > MAX_ID:
                raise IdOrderError(batch.stream, MAX_ID, cursor)
            self.accepted = cursor + len(batch)
        elif batch.first_id <= cursor:
            raise IdOrderError(batch.stream, batch.first_id, cursor)
        else:
            self.accepted = batch.last_id
        item = _Append(batch, assign, fence, asyncio.get_running_loop().create_future(), started)
        self.queue.append(item)
        self.queued_bytes += batch.nbytes
        self.idle.clear()
        if self.task is None:
            self.task = asyncio.ensure_future(self._run())
        return asyncio.shield(item.future)  # (a cancelled caller leaves the write on)

    def _check_fence(self, fence: int | None) -> None:
        if fence is not None and fence != self.host.refusals:
            raise StorageFullError(self.head.name, errno.ENOSPC,
                                   "after an earlier append was refused")  # fmt: skip

    # ------------------------------------------------------------------ publishing

    async def _run(self) -> None:
        try:
            while self.queue:
                parts = self._take()
                try:
                    await self._commit(parts)
                except LogError as exc:
                    self._fail_parts(parts, exc)
                    if isinstance(exc, StorageFullError):
                        self.host.refused(exc)
                        self._fail_queue(exc)  # (nothing is stored after a refused append)
                except Exception as exc:  # a bug or a dead connection: fail, never hang
                    log.exception("stream %r: append failed", self.head.name)
                    failure = LogError(f"stream {self.head.name!r}: append failed: {exc!r}")
                    self._fail_parts(parts, failure)
                self.accepted = max(self.head.latest, self._replan_accepted())
        finally:
            self.task = None
            self.idle.set()
            self.room.set()

    def _take(self) -> list[_Part]:
        """The next record's parts, from the front of the queue: whole appends while they fit
        in :data:`RECORD_BYTES`, the front one cut when it alone is bigger."""
        parts: list[_Part] = []
        room = RECORD_BYTES - HEADER_SIZE - 8
        for item in self.queue:
            if item.future.done():
                continue
            stop = item.batch.fit(item.done, room)
            if stop == item.done:
                if not parts:  # one event bigger than a record
                    limit = LimitExceeded(
                        "event bytes in a JetStream record",
                        room,
                        item.batch.slice(item.done, item.done + 1).nbytes,
                    )
                    self._finish(item, limit)  # fmt: skip
                    continue
                break
            part = _Part(item, item.done, stop)
            parts.append(part)
            room -= item.batch.slice(part.start, part.stop).nbytes
            if stop < len(item.batch):
                break
        return parts

    def _plan(self, parts: list[_Part]) -> list[_Part]:
        """Ids for ``parts`` from the head on; appends whose own ids are not above it fail."""
        cursor = self.head.latest
        kept: list[_Part] = []
        for part in parts:
            item = part.item
            if item.future.done():
                continue
            if item.fence is not None and item.fence != self.host.refusals:
                self._finish(
                    item,
                    StorageFullError(
                        self.head.name, errno.ENOSPC, "after an earlier append was refused"
                    ),
                )
                continue  # fmt: skip
            n = part.stop - part.start
            if item.assign:
                part.first_id = cursor + 1
                if cursor + n > MAX_ID:
                    self._finish(item, IdOrderError(self.head.name, MAX_ID, cursor))
                    continue
            else:
                part.first_id = int(item.batch.ids[part.start])
                if part.first_id <= cursor:
                    self._finish(item, IdOrderError(self.head.name, part.first_id, cursor))
                    continue
            cursor = part.first_id + n - 1 if item.assign else int(item.batch.ids[part.stop - 1])
            kept.append(part)
        return kept

    async def _commit(self, parts: list[_Part]) -> None:
        """Publish ``parts`` as one record, re-planned after each conflict, until stored."""
        while True:
            parts = self._plan(parts)
            if not parts:
                return
            pieces = [(p.item.batch.slice(p.start, p.stop), p.first_id if p.item.assign else None)
                      for p in parts]  # fmt: skip
            if len(pieces) == 1:
                record = encode(pieces[0][0], pieces[0][1])
            else:
                record = encode(merge(pieces))
            try:
                stored = await self._publish(record.data, record.count, record.max_timestamp,
                                             record.last_id)  # fmt: skip
            except _Conflict:
                continue
            self.host.catalog.advance(self.head.name, stored)
            for part in parts:
                self._stored(part)
            return

    async def _publish(self, data: bytearray, count: int, max_ts: int, last_id: int) -> RecordPoint:
        """One record, conditional on the head, retried until acked or ``append_timeout_s``."""
        head, host = self.head, self.host
        prev = head.last
        record_sum = (prev.sum.following(prev.last_id, count, len(data), max_ts) if prev
                      else RecordSum(0, 0, 0, count, len(data), max_ts))  # fmt: skip
        first_id = int.from_bytes(data[16:24], "little")
        write = host.next_write()
        expected = head.last_seq
        headers = {IDS: f"{first_id}-{last_id}", WRITE: write, SUM: record_sum.header(),
                   "Nats-Expected-Last-Subject-Sequence": str(expected)}  # fmt: skip
        payload = bytes(data)
        deadline = time.monotonic() + host.append_timeout_s
        delay = _FIRST_DELAY
        unsure = False  # an attempt without an ack may have been stored
        conflict = False  # refused for a stale expected sequence: resolve before anything
        # A first attempt waits 1 s for its ack, later ones longer: a leader that died with the
        # publish costs a second, not the whole request timeout, and an unsure attempt is safe.
        ack_wait = min(_FIRST_ACK_WAIT, host.api.timeout)
        for attempt in itertools.count():
            left = deadline - time.monotonic()
            try:
                if conflict:
                    found = await self._resolve_conflict(expected, write, unsure)
                    if found is not None:
                        return RecordPoint.of(found)
                    raise _Conflict
                seq = await host.api.publish(
                    head.subject, payload, headers, wait=max(0.05, min(left, ack_wait))
                )
                return RecordPoint(seq, first_id, last_id, record_sum)
            except JetStreamError as exc:
                if exc.err_code in WRONG_LAST_SEQUENCE:
                    conflict = True
                    continue
                if is_storage_full(exc):
                    raise StorageFullError(
                        head.name, errno.ENOSPC, f"writing to JetStream: {exc.description}"
                    ) from None
                if exc.code != 503:  # (503: JetStream unavailable for now, as no ack)
                    raise
                unsure = True
            except ConnectionClosedError:
                raise LogClosedError("the JetStream connection is closed") from None
            except _NO_ACK as exc:
                # No ack: a timeout, no responders (a leader being elected), a connection
                # being re-established. Only "no responders" proves nothing was stored.
                unsure = unsure or not isinstance(exc, NoRespondersError)
                if time.monotonic() + delay > deadline:
                    raise LogError(f"stream {head.name!r}: no ack from JetStream in "
                                   f"{host.append_timeout_s:g} s ({attempt + 1} attempts: "
                                   f"{exc!r})") from None  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY)
            ack_wait = min(ack_wait * 2, host.api.timeout)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _resolve_conflict(
        self, expected: int, write: str, unsure: bool
    ) -> StoredRecord | None:
        """After a 10071: this publish's own message when an unacked attempt was stored (found
        by its ``Tw-Write`` after ``expected``), else ``None`` with the head refreshed from the
        leader."""
        api, head = self.host.api, self.head
        if unsure:
            seq = expected + 1
            while True:
                found = await api.leader_get(
                    head.jetstream, {"seq": seq, "next_by_subj": head.subject}
                )
                if found is None:
                    break  # fmt: skip
                self.host.catalog.advance(head.name, RecordPoint.of(found))
                if found.write == write:
                    return found
                seq = found.seq + 1
        try:
            last = await api.leader_get(head.jetstream, {"last_by_subj": head.subject})
        except Tombstone as tomb:
            # The stream was deleted since this head was read: plan from nothing, as the
            # stream made again under the name (ids from 1), after its tombstone.
            self.host.tombstoned(head.name, tomb.seq)
            self.rebase()
            return None
        if last is not None:
            self.host.catalog.advance(head.name, RecordPoint.of(last))
        elif head.last is not None:
            # No message at all (retention always keeps the last record, a deletion its
            # tombstone: purged by hand?): plan from nothing, not from a sequence that will
            # never be the subject's last again.
            self.host.catalog.emptied(head.name)
        return None

    # ------------------------------------------------------------------ outcomes

    def _stored(self, part: _Part) -> None:
        item = part.item
        n = part.stop - part.start
        if item.assign:
            item.ids.extend(range(part.first_id, part.first_id + n))
        item.done = part.stop
        if item.done == len(item.batch):
            self._finish(item, None)

    def _finish(self, item: _Append, exc: BaseException | None) -> None:
        if item.future.done():
            return
        if exc is not None:
            item.future.set_exception(exc)
        elif not item.assign:
            item.future.set_result(item.batch)
        elif item.ids[-1] - item.ids[0] == len(item.ids) - 1:
            item.future.set_result(item.batch.with_ids(item.ids[0]))
        else:  # (parts of one batch re-planned after another gateway wrote between them)
            b = item.batch
            item.future.set_result(Batch(b.stream, memoryview(item.ids), b.timestamps,
                                         b.value_offsets, b.values, b.key_flags,
                                         b.key_offsets, b.keys))  # fmt: skip
        on_append = self.host.on_append
        if on_append is not None and exc is None:
            on_append(time.perf_counter() - item.started)
        self._drop_done()

    def _drop_done(self) -> None:
        while self.queue and self.queue[0].future.done():
            self.queued_bytes -= self.queue.popleft().batch.nbytes
        self.room.set()

    def _fail_parts(self, parts: list[_Part], exc: LogError) -> None:
        for part in parts:
            self._finish(part.item, exc)

    def _fail_queue(self, exc: LogError) -> None:
        for item in list(self.queue):
            self._finish(item, exc)

    def rebase(self) -> None:
        """The head was emptied (the stream deleted): what the queued appends would get now."""
        self.accepted = max(self.head.latest, self._replan_accepted())

    def _replan_accepted(self) -> int:
        """The last id the queued appends would get from the head now."""
        cursor = self.head.latest
        for item in self.queue:
            if item.future.done():
                continue
            left = len(item.batch) - item.done
            cursor = cursor + left if item.assign else max(cursor, item.batch.last_id)
        return cursor
