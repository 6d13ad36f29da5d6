"""The durable log of a data directory: every stream, group commit, and live-tail notification.

Group commit: :meth:`Log.append` checks a batch in full and makes sure it owns its buffers, on
the event loop, then queues it on its stream and waits. One committer per log
(:mod:`.committer`) takes, each round, *everything* queued on every stream, encodes each
stream's group (runs of small batches share a record) and writes it with one ``pwritev``
(small rounds on the loop's thread, others in a worker thread). With the write-ahead journal
(the default, :mod:`.journal`) it then waits once for the journal, whose one ``fdatasync``
serves every stream of the round; without it, each group ends with an ``fdatasync`` of its
segment. Then it publishes the groups and wakes their appenders. Appenders that arrive while
the disk is busy form the next round, so N concurrent writers cost one flush per round, not N.
``append`` returns only once the data is durable.

Ids are either the caller's (they must exceed the stream's latest id, counting batches still
queued: Seguro's rule) or assigned by the log as latest + 1, latest + 2, ...

A write that runs out of space is undone and refused (:class:`StorageFullError`) with its group
and everything queued behind it; the stream stays open, and a fenced append (:meth:`Log.fence`)
is refused after any refusal, so that a pipeline of appends never stores one after a refused
one (docs/log.md, "Disk full").

The queue of each stream is bounded in bytes (``max_pending_bytes``, the group being written
included): appenders wait for room in arrival order. Readers call :meth:`Log.read`
(synchronous, thread-safe) or :meth:`Log.read_async` (from the in-memory tail of recent commits
when it can, else inline from segments mapped already, else in a worker thread), and
:meth:`Log.wait_for` to learn of new commits.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..model import (
    MAX_ID,
    Batch,
    CorruptLogError,
    IdOrderError,
    InvalidBatch,
    LimitExceeded,
    LogClosedError,
    LogError,
    StorageFullError,
    UnknownStream,
    validate_stream_name,
)
from ..record import HEADER_SIZE
from .admin import (
    DELETING_PREFIX,
    Retention,
    StreamDeleted,
    StreamExists,
    apply_override,
    encode_override,
    read_override,
    remove_stream_files,
    write_override,
)
from .bulk import BulkAppender, Source, read_recent, remember
from .committer import Committer, GroupItems, GroupWriter, GroupWritten, Pending, StreamQueue
from .config import LogConfig
from .grouping import encode_group, owned_valid
from .journal import Journal, JournalState
from .journal_replay import recover, remove_journal
from .stream import NAME_FILE, STAGING_PREFIX, StreamLog, StreamStats, read_name

__all__ = ["GroupItems", "GroupWriter", "GroupWritten", "Log"]

log = logging.getLogger("tidewire.log")

LOCK_FILE = ".lock"

@dataclass(slots=True)
class _Tail:
    """The waiters for the next commit of one stream."""

    future: asyncio.Future[None]
    waiters: int = 0


class Log:
    """All streams of one data directory. Open with :meth:`open`; close with :meth:`close`."""

    def __init__(self, directory: str, config: LogConfig, *, read_only: bool) -> None:
        self.directory = directory
        self.config = config
        self.read_only = read_only
        self._streams: dict[str, StreamLog] = {}
        self._writers: dict[str, StreamQueue] = {}
        self._committer = Committer(self, self._refused, self._notify, lambda q, batches:
                                    remember(q, batches, config.recent_bytes))  # fmt: skip
        self._bulk = BulkAppender(self, self._committer.ready, self._notify, self._committer.solo)
        self._tails: dict[str, _Tail] = {}
        self._lock_fd = -1
        self._closed = False
        self._journal: Journal | None = None  # the write-ahead journal (docs/log.md)
        self._refusals = 0  # appends refused for want of space, ever (what a fence compares)
        self._refusal: StorageFullError | None = None  # the last of them
        self._deleting: set[str] = set()  # streams being deleted: no append, no creation
        # Latency observers (the hub's histograms), seconds: each append call, to its commit;
        # each group commit's fsync.
        self.on_append: Callable[[float], None] | None = None
        self.on_fsync: Callable[[float], None] | None = None
        # The one step that touches the disk (inline for small groups, else in a worker
        # thread): an attribute so that a test can wrap it to simulate a slow or failing disk.
        self.write_group: GroupWriter = self._write

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(
        cls, directory: str, config: LogConfig | None = None, *, read_only: bool = False
    ) -> Log:
        """Open (creating it if needed) and recover every stream of ``directory``.

        A writable log takes an exclusive lock on the directory; a read-only one (for offline
        tools) neither locks nor repairs anything.
        """
        self = cls(os.path.abspath(directory), config or LogConfig(), read_only=read_only)
        if not read_only:
            os.makedirs(self.directory, exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.directory, LOCK_FILE),
                                    os.O_RDWR | os.O_CREAT, 0o644)  # fmt: skip
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock_fd)
                raise LogClosedError(
                    f"data directory {self.directory} is in use by another tidewire process"
                ) from None
        elif not os.path.isdir(self.directory):
            raise FileNotFoundError(f"no data directory at {self.directory}")
        try:
            # First the journal: it has acknowledged bytes a power loss took from the segments.
            state = None if read_only else recover(self.directory)
            for entry in sorted(os.listdir(self.directory)):
                path = os.path.join(self.directory, entry)
                if entry.startswith((STAGING_PREFIX, DELETING_PREFIX)):
                    if not read_only:  # a stream creation or deletion a crash interrupted
                        log.info("removing %s, a stream creation or deletion that did not "
                                 "finish", path)  # fmt: skip
                        shutil.rmtree(path, ignore_errors=True)
                    continue
                if entry.startswith(".") or not os.path.isdir(path):
                    continue
                if not os.path.isfile(os.path.join(path, NAME_FILE)):
                    if any(f.endswith(".log") for f in os.listdir(path)):
                        raise CorruptLogError(os.path.join(path, NAME_FILE), 0,
                                              "segments without a stream name")  # fmt: skip
                    continue  # not ours
                name = read_name(path)
                stream = StreamLog.open(path, self.config.for_stream(name), read_only=read_only)
                if (override := read_override(path)) is not None:
                    stream.settings = apply_override(stream.settings, override)
                    stream.runtime_retention = True
                self._streams[stream.name] = stream
            if not read_only:
                self._start_journal(state)
        except BaseException:
            self._close_files()
            raise
        return self

    def _start_journal(self, state: JournalState | None) -> None:
        config = self.config
        if not (config.fsync and config.journal):
            remove_journal(self.directory)  # (replayed above: nothing in it is needed now)
            return
        ends = {s.key: (s.segments[-1].base_id, s.segments[-1].size)
                for s in self._streams.values()}  # fmt: skip
        self._journal = Journal.start(self.directory, config.journal_bytes,
                                      config.checkpoint_interval_s, state or JournalState(),
                                      ends)  # fmt: skip

    @property
    def journal(self) -> Journal | None:
        """The write-ahead journal (``None``: off, ``fsync=False``, or a read-only log)."""
        return self._journal

    async def close(self) -> None:
        """Finish every queued append (flush + fsync), then close all files."""
        if self._closed:
            return
        self._closed = True
        while tasks := self._committer.tasks():
            await asyncio.gather(*tasks, return_exceptions=True)
        # A committer cancelled mid-write left its write running in the worker thread: the
        # files stay open, and the directory locked, until it is done.
        writes = {id(w.writing): w.writing for w in self._writers.values() if w.writing}
        if writes:
            await asyncio.gather(*writes.values(), return_exceptions=True)
        for tail in self._tails.values():
            if not tail.future.done():
                tail.future.set_result(None)
        journal, self._journal = self._journal, None
        if journal is not None:  # (a final checkpoint: fsyncs, off the loop)
            await asyncio.get_running_loop().run_in_executor(None, journal.close)
        self._close_files()

    def close_sync(self) -> None:
        """Close without an event loop (offline tools, or after the loop has gone)."""
        self._closed = True
        self._close_files()

    def _close_files(self) -> None:
        journal, self._journal = self._journal, None
        if journal is not None:
            journal.close()
        for stream in self._streams.values():
            stream.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ streams

    def streams(self) -> list[str]:
        return sorted(self._streams)

    def stats(self) -> list[StreamStats]:
        return [self._streams[name].stats() for name in self.streams()]

    def stream(self, name: str) -> StreamLog:
        try:
            return self._streams[name]
        except KeyError:
            raise UnknownStream(name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._streams

    def committer(self, name: str) -> asyncio.Task[None] | None:
        """The task group-committing ``name``'s queued appends while there are any (else
        ``None``): the log's one committer, or a task of the stream's own for a big group
        (:mod:`.committer`). Cancelled mid-write, it fails every stream it was writing, as a
        crash there would."""
        writer = self._writers.get(name)
        return writer.task if writer is not None else None

    @property
    def tail_waits(self) -> int:
        """Streams someone waits on (:meth:`wait_for`), one shared entry each: 0 once every
        wait has ended, so that abandoned waits keep nothing."""
        return len(self._tails)

    def accepted_latest(self, name: str) -> int:
        """The stream's last id accepted for appending (queued appends included): an append
        with its own ids must start above it."""
        writer = self._writers.get(name)
        return writer.latest if writer is not None else self.latest(name)

    def fence(self) -> int:
        """What :meth:`append`'s ``fence`` compares: take it when none of your appends is in
        flight. It changes whenever an append is refused for want of space (any stream's: the
        disk is shared, and a stream's creation has no committer yet)."""
        return self._refusals

    def _check_fence(self, stream: str, fence: int | None) -> None:
        if fence is not None and fence != self._refusals and self._refusal is not None:
            refused = self._refusal  # an append before this one may have been refused
            if refused.stream == stream:
                during = f"after an earlier append was refused {refused.during}"
            else:
                during = f"after an append to stream {refused.stream!r} was refused"
            raise StorageFullError(stream, refused.errno, during)

    def _refused(self, exc: StorageFullError) -> None:
        self._refusals += 1
        self._refusal = exc

    async def settled(self, name: str) -> int:
        """Wait until every append of ``name`` handed to the log so far is committed or failed
        (:meth:`accepted_latest` is :meth:`latest` again); return the latest committed id."""
        while self.accepted_latest(name) > self.latest(name):
            if self._closed:
                raise LogClosedError("the log is closed")
            failed = self._writers[name].stream.failed
            if failed is not None:  # (its ids are never free again: a restart settles them)
                raise LogClosedError(f"stream {name!r} failed: {failed}")
            await self._next_change(name)
        return self.latest(name)

    def latest(self, name: str) -> int:
        """The stream's last committed id; 0 when it has none (or does not exist)."""
        stream = self._streams.get(name)
        return stream.latest if stream is not None else 0

    def start_id(self, name: str) -> int:
        """The lowest id still readable (1 unless retention removed the start)."""
        stream = self._streams.get(name)
        return stream.start_id if stream is not None else 1

    def _create(self, name: str, retention: tuple[int | None, int | None] | None = None
                ) -> StreamLog:  # fmt: skip
        validate_stream_name(name)
        if self.read_only:
            raise LogClosedError("the log is open read-only")
        if name in self._deleting:
            raise LogError(f"stream {name!r} is being deleted")
        settings = apply_override(self.config.for_stream(name), retention)
        override = None if retention is None else encode_override(*retention)
        try:
            stream = StreamLog.create(self.directory, name, settings, override)
        except StorageFullError as exc:
            log.warning("%s (creating the stream)", exc)
            self._refused(exc)
            raise
        self._streams[name] = stream
        log.info("created stream %r in %s", name, stream.directory)
        return stream

    def enforce_retention(self, now_ms: int) -> int:
        """Apply every stream's retention; return how many segments were deleted."""
        return sum(s.enforce_retention(now_ms) for s in list(self._streams.values()))

    def retention(self, name: str) -> Retention:
        """The retention that applies to ``name`` and its source (what it would get, if new)."""
        stream, own = self._streams.get(name), self.config.for_stream(name)
        if stream is not None and stream.runtime_retention:
            return Retention(stream.settings.retention_ms, stream.settings.retention_bytes,
                             "runtime")  # fmt: skip
        source = "config" if name in self.config.streams else "default"
        return Retention(own.retention_ms, own.retention_bytes, source)

    def create_stream(self, name: str, retention_ms: int | None = None,
                      retention_bytes: int | None = None, *, runtime: bool = False) -> None:
        """Create ``name`` (empty); with ``runtime``, with that retention over the config's
        (kept in its directory: :mod:`.admin`). :class:`StreamExists` if it exists."""
        if name in self._streams:
            raise StreamExists(f"stream {name!r} exists already")
        self._create(name, (retention_ms, retention_bytes) if runtime else None
                     ).runtime_retention = runtime  # fmt: skip

    async def set_retention(self, name: str, retention_ms: int | None,
                            retention_bytes: int | None) -> None:  # fmt: skip
        """Give ``name`` this retention from now on, over the configuration's, durably (the
        next retention pass applies it). :class:`UnknownStream` if there is no such stream."""
        stream = self.stream(name)
        await asyncio.get_running_loop().run_in_executor(
            None, write_override, stream.directory, encode_override(retention_ms, retention_bytes))
        stream.settings = apply_override(stream.settings, (retention_ms, retention_bytes))
        stream.runtime_retention = True

    async def delete_stream(self, name: str) -> None:
        """Delete ``name`` and its files (:mod:`.admin`): appends handed over before finish
        first; later ones and creations of ``name`` are refused until it is gone; waiters of
        the stream are woken (it then has no events). :class:`UnknownStream` if none."""
        stream = self.stream(name)
        if name in self._deleting:
            raise LogError(f"stream {name!r} is being deleted")
        self._deleting.add(name)
        try:
            await self.settled(name)
            self._writers.pop(name, None)  # (settled: nothing queued, nothing in flight)
            stream.failed = LogError(f"stream {name!r} was deleted")  # (appenders left waiting)
            del self._streams[name]
            self._notify(name, StreamDeleted(name))  # (its waiters: it will not grow again)
            await asyncio.get_running_loop().run_in_executor(
                None, remove_stream_files, self.directory, stream, self._journal)
        finally:
            self._deleting.discard(name)

    # ------------------------------------------------------------------ appending

    async def append(
        self, batch: Batch, *, assign_ids: bool = False, fence: int | None = None
    ) -> Batch:
        """Append ``batch`` durably and return it as stored (with the ids the log assigned).

        With ``assign_ids=False`` the batch's own ids are kept and must exceed the stream's
        latest id (:class:`IdOrderError` otherwise). Creates the stream on first append.
        The batch is checked in full (:meth:`Batch.validate`) and, unless its buffers are
        immutable, copied before the first wait, so the caller may reuse its buffers at once.
        Cancelling the caller does not cancel the write. Appenders are admitted first come,
        first served when the stream's queue is full.

        A write refused for want of space fails its group and everything queued behind it with
        :class:`StorageFullError`; their ids are free again and the stream stays open. A
        caller with several appends in flight passes ``fence`` (:meth:`fence`, taken when it
        had none in flight): if any append was refused since, this one is refused too, so that
        none of its appends is stored after one that was refused.
        """
        if self._closed:
            raise LogClosedError("the log is closed")
        if self.read_only:
            raise LogClosedError("the log is open read-only")
        # (the clock is read only for the metrics: ~50 ns per append when nobody listens)
        started = time.perf_counter() if self.on_append is not None else 0.0
        estimate = batch.nbytes + HEADER_SIZE
        if estimate > self.config.max_record_bytes:
            raise LimitExceeded("record bytes", self.config.max_record_bytes, estimate)
        batch = owned_valid(batch)  # (batch.owned().validate(), in C when it can be)
        if fence is not None:
            self._check_fence(batch.stream, fence)
        if batch.stream in self._deleting:
            raise LogError(f"stream {batch.stream!r} is being deleted")
        writer = self._writers.get(batch.stream) or self._queue(batch.stream)
        if writer.waiting or self._full(writer, estimate):
            # FIFO: while anyone waits (for the lock or for room), newcomers queue behind it;
            # the count covers the hand-off, when the lock is free but its next owner not yet
            # awake.
            writer.waiting += 1
            try:
                async with writer.admission:
                    while self._full(writer, estimate):
                        writer.room.clear()
                        await writer.room.wait()
                    future = self._enqueue(writer, batch, assign_ids, estimate, fence)
            finally:
                writer.waiting -= 1
        else:
            future = self._enqueue(writer, batch, assign_ids, estimate, fence)
        stored = await future
        if self.on_append is not None and started:  # (not if it was set while this waited)
            self.on_append(time.perf_counter() - started)
        return stored

    def _queue(self, name: str) -> StreamQueue:
        """The queue of ``name``, made (and the stream created) on first use."""
        stream = self._streams.get(name) or self._create(name)
        writer = self._writers[name] = StreamQueue(stream, stream.latest)
        return writer

    async def append_bulk(self, stream: str, first_id: int, count: int, size_hint: int,
                          source: Source) -> tuple[int, int]:  # fmt: skip
        """Append ``count`` events that ``source`` gives (in a worker thread, as it is
        written: never all in memory) as ids ``first_id``.., visible all at once and durable
        when this returns, all or none after a crash (with the journal): :mod:`.bulk`.
        ``size_hint``: about their bytes (to roll the segment first). Returns (first, last)."""
        if self._closed or self.read_only:
            raise LogClosedError("the log is closed" if self._closed else "read-only")
        if stream in self._deleting:
            raise LogError(f"stream {stream!r} is being deleted")
        writer = self._writers.get(stream) or self._queue(stream)
        return await self._bulk.append(writer, first_id, count, size_hint, source)

    def submit(
        self, batch: Batch, *, assign_ids: bool = False, fence: int | None = None
    ) -> asyncio.Future[Batch] | None:
        """:meth:`append` without a coroutine, for callers that finish in a callback (a lone
        Seguro ``SAVE``: no task, no turn of the loop before the batch is queued): the future
        of the stored batch, or ``None`` when the stream's queue has no room now or others
        wait for it (nothing is queued then: call :meth:`append`). The same checks, raised
        here; the same order, durability and metrics."""
        if self._closed or self.read_only or batch.stream in self._deleting:
            return None  # (append raises what it always did)
        estimate = batch.nbytes + HEADER_SIZE
        writer = self._writers.get(batch.stream)
        if estimate > self.config.max_record_bytes or writer is None or writer.waiting or (
            self._full(writer, estimate)
        ):
            return None
        started = time.perf_counter()
        future = self._enqueue(writer, batch.owned().validate(), assign_ids, estimate, fence)
        if self.on_append is not None:  # (as append: the latency of appends that succeed)
            on_append = self.on_append
            future.add_done_callback(lambda f: None if f.cancelled() or f.exception() else
                                     on_append(time.perf_counter() - started))  # fmt: skip
        return future

    def _full(self, writer: StreamQueue, size: int) -> bool:
        pending = writer.queued_bytes + writer.inflight_bytes
        return pending > 0 and pending + size > self.config.max_pending_bytes

    def _enqueue(
        self, writer: StreamQueue, batch: Batch, assign_ids: bool, size: int, fence: int | None
    ) -> asyncio.Future[Batch]:
        """Check the ids and queue the batch, with no wait in between, so that the queue's order
        is the id order. Returns the future of the stored batch."""
        if writer.stream.failed is not None:
            raise LogClosedError(f"stream {batch.stream!r} failed: {writer.stream.failed}")
        if fence is not None:
            self._check_fence(batch.stream, fence)
        first_id: int | None = None
        if assign_ids:
            n = len(batch.ids)
            if writer.latest + n > MAX_ID:
                raise InvalidBatch(f"stream {batch.stream!r} has run out of ids")
            first_id = writer.latest + 1
            writer.latest += n
        elif batch.first_id <= writer.latest:
            raise IdOrderError(batch.stream, batch.first_id, writer.latest)
        else:
            writer.latest = batch.last_id
        # No shield on this future: cancelling the caller cancels only its own future; the write
        # goes on, and the committer skips futures that are already done.
        future: asyncio.Future[Batch] = self._committer.loop().create_future()
        writer.queue.append(Pending(batch, first_id, size, future))
        writer.queued_bytes += size
        self._committer.ready(writer)
        return future

    def _write(self, stream: StreamLog, items: GroupItems) -> GroupWritten:
        """Encode a group (in a worker thread) and write it durably. Returns the batch stored for
        each item, the batches of the records written, and how long the fsync took."""
        records, stored = encode_group(items, self.config.max_record_bytes)
        if self._journal is not None:  # durable once the journal says so (.committer)
            stream.write_ahead(records, self._journal)
            return stored, [r.batch for r in records], None
        fsync_seconds = stream.write(records, fsync=self.config.fsync)
        return stored, [r.batch for r in records], fsync_seconds

    # ------------------------------------------------------------------ reading and tailing

    def read(
        self, name: str, from_id: int, max_bytes: int = 1024 * 1024, max_events: int = 2**63 - 1
    ) -> list[Batch]:
        """Committed events of ``name`` from ``from_id`` on (see :meth:`StreamLog.read`)."""
        stream = self._streams.get(name)
        if stream is None:
            return []
        return stream.read(from_id, max_bytes, max_events)

    def find_time(self, name: str, ms: int) -> int | None:
        """The first committed id of ``name`` whose timestamp is at least ``ms``; ``None`` when
        none is (or there is no such stream). Synchronous and thread-safe, like :meth:`read`
        (:meth:`StreamLog.find_time`; docs/log.md, "Time index")."""
        stream = self._streams.get(name)
        return None if stream is None else stream.find_time(ms)

    async def read_async(
        self, name: str, from_id: int, max_bytes: int = 1024 * 1024, max_events: int = 2**63 - 1
    ) -> list[Batch]:
        """:meth:`read`, served from the in-memory tail when it can be (live subscribers), else
        inline from segments already mapped (``StreamLog.read_mapped``: the pages were mapped
        by an earlier read, so this is memory access, not a hand-off to a thread and back),
        else in a worker thread, which maps what it reads, so a read that has to open a
        mapping never runs on the event loop (docs/log.md, "Reads")."""
        recent = read_recent(self._writers.get(name), from_id, max_bytes, max_events)
        if recent is not None:
            return recent
        stream = self._streams.get(name)
        if stream is not None:
            mapped = stream.read_mapped(from_id, max_bytes, max_events)
            if mapped is not None:
                return mapped
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.read, name, from_id, max_bytes, max_events)

    async def wait_for(self, name: str, after_id: int) -> None:
        """Return once ``name`` has a committed id greater than ``after_id`` (or the log closes,
        which raises :class:`LogClosedError`). Waiters of a stream share one future, dropped
        when the last of them leaves, so abandoned waits leave nothing behind."""
        while True:
            if self._closed:
                raise LogClosedError("the log is closed")
            if self.latest(name) > after_id:
                return
            await self._next_change(name)

    async def _next_change(self, name: str) -> None:
        """Wait for the next commit or refused group of ``name``, or the log closing."""
        tail = self._tails.get(name)
        if tail is None:
            tail = self._tails[name] = _Tail(asyncio.get_running_loop().create_future())
        tail.waiters += 1
        try:
            await asyncio.shield(tail.future)
        finally:
            tail.waiters -= 1
            if tail.waiters == 0 and self._tails.get(name) is tail:
                del self._tails[name]

    def _notify(self, name: str, error: LogError | None = None) -> None:
        tail = self._tails.pop(name, None)
        if tail is not None and not tail.future.done():  # (an error: for every waiter)
            tail.future.set_result(None) if error is None else tail.future.set_exception(error)

    # ------------------------------------------------------------------ misc

    def __repr__(self) -> str:
        return f"Log({self.directory!r}, streams={len(self._streams)})"
