"""The write-ahead journal of a log directory: one fsync makes any number of streams' commits
durable (docs/log.md, "Write-ahead journal").

The log's committer (:mod:`tidewire.log.committer`) no longer ends a stream's group with an
fdatasync of its segment: it writes each group of its round to its segment (page cache only),
hands the same bytes to the journal (:meth:`submit`, the whole round in one :meth:`batch`) and
waits (:meth:`durable`). The journal is itself a group-commit service: one syncer thread takes
every entry submitted while it was busy, writes them with one ``pwrite`` per contiguous run of
the ring and makes them durable with one ``fdatasync``, then wakes every waiter of the round.

A background thread checkpoints (:meth:`checkpoint`): it fdatasyncs the segments written since
the last checkpoint, then writes the checkpoint file atomically; the ring's bytes behind it are
free again. The ring's size bounds the bytes in flight: the syncer waits for a checkpoint when
the next entry would overwrite an entry the last checkpoint does not cover.

A failed journal write or fdatasync fails the journal, and with it every stream, for writing
until a restart (after a failed fsync the page cache cannot be trusted: its recovery replays
what the journal holds).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..model import LogClosedError
from .journal_codec import Checkpoint, encode_checkpoint, encode_entry_header, entry_size, place
from .segment import Segment

__all__ = [
    "CHECKPOINT_FILES",
    "JOURNAL_DIR",
    "RING_FILE",
    "Journal",
    "JournalState",
    "checkpoint_file",
    "sync_dir",
]

log = logging.getLogger("tidewire.log")

JOURNAL_DIR = ".journal"
"""Under the data directory; the leading dot keeps :meth:`Log.open` from taking it for a stream."""
RING_FILE = "journal.wal"
CHECKPOINT_FILES = ("checkpoint.0", "checkpoint.1")
CHECKPOINT_BLOCK = 4096
GROW_CHUNK = 1024 * 1024
"""The ring file grows (on its first lap) by zero-filled chunks of this size: later rounds
overwrite written blocks, and their fdatasync then has no file-system metadata to commit."""
MAX_ENTRY_PAYLOAD = 256 * 1024
"""Groups bigger than this (or than a quarter of the ring) are not copied into the journal: their
writer fdatasyncs the segment itself and journals a payload-less entry (docs/log.md)."""
MIN_RING = 64 * 1024
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})

Parts = Sequence[bytes | bytearray | memoryview]


def checkpoint_file(seq: int) -> str:
    """The file checkpoint ``seq`` goes to: the two alternate."""
    return CHECKPOINT_FILES[seq % 2]


@dataclass(slots=True)
class JournalState:
    """Where the journal stands when it starts: after replay, everything up to ``lsn`` is in the
    segments. ``epoch`` is the one of the previous process (0: none)."""

    epoch: int = 0
    lsn: int = 0
    seq: int = 0  # of the checkpoint in force


@dataclass(slots=True)
class _Waiter:
    lsn: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[float]


@dataclass(slots=True)
class _Shared:
    """State shared by the submitters, the syncer and the checkpointer (under ``Journal._lock``)."""

    next_lsn: int
    pending: list[tuple[int, list[bytes | bytearray | memoryview]]] = field(default_factory=list)
    durable_lsn: int = 0
    durable_seconds: float = 0.0  # what the fdatasync of the round that made it durable took
    durable_total: int = 0  # ring bytes used (waste included) up to the durable entry
    durable_offset: int = 0  # where the entry after the durable one goes
    total: int = 0  # ring bytes used so far, ever (waste included)
    checkpoint_total: int = 0  # ``total`` at the last checkpoint: live bytes = total - this
    checkpoint_lsn: int = 0
    ends: dict[str, tuple[int, int]] = field(default_factory=dict)  # dir -> (base, end)
    dirty: dict[int, Segment] = field(default_factory=dict)  # id() -> segment written
    waiters: list[_Waiter] = field(default_factory=list)
    failed: BaseException | None = None
    closing: bool = False


class Journal:
    """The running journal of one log directory. Create with :meth:`start` (after replay)."""

    def __init__(self, directory: str, ring_bytes: int, interval_s: float, epoch: int,
                 lsn: int, fd: int) -> None:  # fmt: skip
        self.directory = directory
        self.ring_bytes = ring_bytes
        self.interval_s = interval_s
        self.epoch = epoch
        self.max_payload = min(MAX_ENTRY_PAYLOAD, ring_bytes // 4)
        self._fd = fd
        self._file_size = os.fstat(fd).st_size
        self._offset = 0  # the syncer's write offset (only the syncer moves it)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._s = _Shared(next_lsn=lsn + 1, durable_lsn=lsn, checkpoint_lsn=lsn)
        self._checkpoint_lock = threading.Lock()  # one checkpoint at a time
        self._wake_checkpointer = threading.Event()
        self._syncer = threading.Thread(target=self._sync_loop, name="tidewire-journal",
                                        daemon=True)  # fmt: skip
        self._checkpointer = threading.Thread(target=self._checkpoint_loop,
                                              name="tidewire-checkpoint", daemon=True)  # fmt: skip
        self.fsyncs = 0  # journal fdatasyncs done (rounds), for tests and metrics
        self.checkpoints = 0
        self._seq = 0  # the last checkpoint's
        self._kick_pending = False  # a _kick is scheduled on a loop
        # Rounds write with pwritev(RWF_DSYNC) while the kernel takes it (None: it did not).
        self._dsync: int | None = getattr(os, "RWF_DSYNC", None)
        self._round_lock = threading.Lock()  # one round at a time (syncer or a leader)
        self._local = threading.local()  # .deferred: in a batch() on this thread

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(cls, data_dir: str, ring_bytes: int, interval_s: float, state: JournalState,
              ends: dict[str, tuple[int, int]]) -> Journal:  # fmt: skip
        """Open (creating it if needed) the ring, write a checkpoint of a new epoch at offset 0
        that covers ``state.lsn`` and says each stream's active segment (``ends``), and start
        the threads. Entries of earlier epochs are never replayed again."""
        directory = os.path.join(data_dir, JOURNAL_DIR)
        fresh = state.seq == 0  # no checkpoint in force: a new journal, or one never started
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, RING_FILE)
        ring_bytes = max(MIN_RING, ring_bytes)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fresh:  # (no entry of an unknown past may ever pass for one of epoch 1)
                os.ftruncate(fd, 0)
            elif os.fstat(fd).st_size > ring_bytes:  # journal_bytes was lowered
                os.ftruncate(fd, ring_bytes)
            self = cls(directory, ring_bytes, interval_s, state.epoch + 1, state.lsn, fd)
            self._grow(min(ring_bytes, GROW_CHUNK))
            with self._lock:
                self._s.ends = dict(ends)
            os.fsync(fd)
            if fresh:  # both files exist, a block each, from the start (see _write_checkpoint)
                for seq in (1, 2):
                    with open(os.path.join(directory, checkpoint_file(seq)), "wb") as f:
                        f.write(bytes(CHECKPOINT_BLOCK))
                        os.fsync(f.fileno())
                sync_dir(directory)
                sync_dir(data_dir)
            self._write_checkpoint(Checkpoint(state.seq + 1, self.epoch, state.lsn, 0, ends))
        except BaseException:
            os.close(fd)
            raise
        self._syncer.start()
        self._checkpointer.start()
        return self

    def close(self) -> None:
        """Write what is submitted, checkpoint, stop the threads and close the ring."""
        with self._lock:
            self._s.closing = True
            self._cond.notify_all()
        self._wake_checkpointer.set()
        if self._syncer.is_alive():
            self._syncer.join()
        if self._checkpointer.is_alive():
            self._checkpointer.join()
        if self._s.failed is None:
            try:
                self.checkpoint()
            except OSError as exc:  # the next start replays instead
                log.warning("journal: final checkpoint failed: %s", exc)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def failed(self) -> BaseException | None:
        return self._s.failed

    @property
    def live_bytes(self) -> int:
        """Ring bytes holding entries the last checkpoint does not cover."""
        with self._lock:
            return self._s.total - self._s.checkpoint_total

    @property
    def durable_lsn(self) -> int:
        return self._s.durable_lsn

    # ------------------------------------------------------------------ committing

    def submit(self, key: str, segment: Segment, position: int, payload: Parts, extent: int,
               *, synced: bool = False) -> int:  # fmt: skip
        """Queue the entry of a group that wrote ``payload`` (``extent`` bytes) to ``segment``
        at ``position`` (of stream directory ``key``); return its LSN, for :meth:`durable`.
        ``synced``: the segment was fdatasynced already and the entry carries no payload.
        Raises :class:`LogClosedError` once the journal has failed."""
        raw = key.encode()
        deferred = getattr(self._local, "deferred", False)  # (in a batch: it leads at its end)
        loop: asyncio.AbstractEventLoop | None = None
        if not deferred:  # on an event loop's thread, the syncer is woken once per iteration
            loop = _running_loop()
        with self._lock:
            s = self._s
            if s.failed is not None:
                raise LogClosedError(f"the journal failed: {s.failed}")
            lsn = s.next_lsn
            s.next_lsn += 1
            head = encode_entry_header(lsn, self.epoch, raw, segment.base_id, position, payload,
                                       extent, synced=synced)  # fmt: skip
            s.pending.append((entry_size(raw, 0 if synced else extent),
                              [head] if synced else [head, *payload]))  # fmt: skip
            s.ends[key] = (segment.base_id, position + extent)
            s.dirty[id(segment)] = segment
            if loop is not None and not self._kick_pending:
                self._kick_pending = True
                loop.call_soon(self._kick)
        if loop is None and not deferred and not self._lead():
            with self._lock:
                self._cond.notify_all()  # a round is in progress: the syncer takes the rest
        return lsn

    def batch(self) -> _Batch:
        """A context manager: within the block, :meth:`submit` on this thread only queues; at
        its end one round takes everything queued (on this thread, unless one is in progress:
        then the syncer does, after it). The log's committer submits a whole round of streams
        this way, so that they share one fdatasync instead of the first of them leading a
        round alone.

        On an event loop's thread, a round of several entries goes to the syncer thread: the
        loop then reads, parses and writes the next commits while the disk flushes (measured
        with 16 Seguro points: about +14%); one entry alone (one stream: a lone ``SAVE``)
        is still flushed on the loop, which spares it the hand-off (docs/log.md). (A class,
        not a generator: it runs once per commit round.)"""
        return _Batch(self)

    def end_batch(self) -> None:
        """What the end of a :meth:`batch` does (see there)."""
        self._local.deferred = False
        with self._lock:  # (see batch(): several streams on a loop's thread)
            handoff = len(self._s.pending) > 1 and _running_loop() is not None
        if handoff or not self._lead():
            with self._lock:
                self._cond.notify_all()

    def _kick(self) -> None:
        """Run a round for the entries submitted from the loop during its last iteration: the
        committers of every stream woken by one round submit within one iteration, and join
        one round, instead of the first of them starting a round of its own. The round runs
        here, on the loop's thread (these are groups of at most ``inline_commit_bytes``, which
        the loop has always fsynced itself), unless one is in progress: then the syncer takes
        them after it."""
        with self._lock:
            self._kick_pending = False
        if not self._lead():
            with self._lock:
                self._cond.notify_all()

    def _lead(self) -> bool:
        """Leader-follower group commit: if no round is in progress, write everything pending
        in one round on this thread (no hand-off to the syncer: a single stream's commit costs
        what it did without the journal) and return True; else False. Errors fail the journal
        (the waiters learn it); they do not propagate."""
        if not self._round_lock.acquire(blocking=False):
            return False
        try:
            with self._lock:
                s = self._s
                batch, s.pending = s.pending, []
                first = s.next_lsn - len(batch)
                if s.failed is not None:
                    return True
            if batch:
                try:
                    self._write_batch(batch, first)
                except BaseException as exc:
                    self._fail(exc, "write")
        finally:
            self._round_lock.release()
        with self._lock:
            if self._s.pending:  # (submitted during the round: the syncer takes them)
                self._cond.notify_all()
        return True

    def durable_now(self, lsn: int) -> float | None:
        """What :meth:`durable`'s future would carry if entry ``lsn`` is durable already (a
        round led on this thread), else ``None``: no future for a commit that needs no wait."""
        with self._lock:
            s = self._s
            return s.durable_seconds if s.durable_lsn >= lsn else None

    def durable(self, lsn: int) -> asyncio.Future[float]:
        """A future (of the running loop) done once entry ``lsn`` is durable, with the seconds
        the fdatasync of its round took; failed with :class:`LogClosedError` if the journal
        fails first."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        with self._lock:
            s = self._s
            if s.durable_lsn >= lsn:  # (a batch's round, say: led before its committer waits)
                future.set_result(s.durable_seconds)
            elif s.failed is not None:
                future.set_exception(LogClosedError(f"the journal failed: {s.failed}"))
            else:
                s.waiters.append(_Waiter(lsn, loop, future))
        return future

    # ------------------------------------------------------------------ the syncer thread

    def _sync_loop(self) -> None:
        while True:
            with self._lock:
                s = self._s
                while not s.pending and not s.closing:
                    self._cond.wait()
                if not s.pending or s.failed is not None:
                    if s.closing or s.failed is not None:
                        return
                    continue
            with self._round_lock:  # (after a leader's round, if one is in progress)
                with self._lock:
                    batch, s.pending = s.pending, []
                    first = s.next_lsn - len(batch)
                    if s.failed is not None:
                        return
                if not batch:
                    continue
                try:
                    self._write_batch(batch, first)
                except BaseException as exc:  # whatever it is, the journal cannot go on
                    self._fail(exc, "write")
                    return

    def _write_batch(self, batch: list[tuple[int, list[bytes | bytearray | memoryview]]],
                     first: int) -> None:  # fmt: skip
        """Write ``batch`` (LSNs from ``first`` on) in one round: one ``pwrite`` per contiguous
        run of the ring, one fdatasync. Only when the ring has no room for the rest (the
        checkpoint cannot free bytes not durable yet) is it cut into several rounds."""
        runs: list[tuple[int, list[bytes | bytearray | memoryview]]] = []
        run_end = -1
        lsn = first - 1
        for size, parts in batch:
            at = self._reserve(size, wait=not runs)
            if at is None:  # no room before the entries reserved so far are durable
                self._round(runs, lsn)
                runs, run_end = [], -1
                at = self._reserve(size, wait=True)
                assert at is not None
            if at == run_end:
                runs[-1][1].extend(parts)
            else:
                runs.append((at, list(parts)))
            run_end = at + size
            lsn += 1
        self._round(runs, lsn)

    def _round(self, runs: list[tuple[int, list[bytes | bytearray | memoryview]]],
               last: int) -> None:  # fmt: skip
        """Write ``runs`` durably (each with :meth:`_write_synced`, or where that is refused
        ``pwrite`` then one ``fdatasync``); wake the waiters of entries up to ``last``."""
        started = time.perf_counter()
        if self._dsync:
            try:
                for at, parts in runs:
                    self._write_synced(b"".join(parts), at)
            except OSError as exc:  # (refused before anything is written: see _write_synced)
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                log.info("journal: pwritev(RWF_DSYNC) refused (%s): pwrite + fdatasync", exc)
                self._dsync = None
        if not self._dsync:
            for at, parts in runs:
                view = memoryview(b"".join(parts))
                while view:
                    n = os.pwrite(self._fd, view, at)
                    view, at = view[n:], at + n
            started = time.perf_counter()
            os.fdatasync(self._fd)
        seconds = time.perf_counter() - started
        self.fsyncs += 1
        with self._lock:
            s = self._s
            s.durable_lsn, s.durable_seconds = last, seconds
            s.durable_total, s.durable_offset = s.total, self._offset
            ready = [w for w in s.waiters if w.lsn <= last]
            s.waiters = [w for w in s.waiters if w.lsn > last]
            if (s.total - s.checkpoint_total) * 2 > self.ring_bytes:
                self._wake_checkpointer.set()  # half full: free room before it is needed
        _wake(ready, seconds, None)

    def _write_synced(self, data: bytes, at: int) -> None:
        """``data`` at ``at``, durable on return: ``pwritev(RWF_DSYNC)``, an fdatasync of the
        range written, in one call (docs/log.md, "Fixed cost per commit"). Without the flag the
        kernel refuses before writing (``EOPNOTSUPP``, ``EINVAL``: the caller falls back)."""
        view = memoryview(data)
        while view:  # (a short write is durable as far as it went)
            n = os.pwritev(self._fd, [view], at, self._dsync or 0)
            view, at = view[n:], at + n

    def _reserve(self, size: int, *, wait: bool) -> int | None:
        """Where the next entry of ``size`` bytes goes. Without room in the ring (it would
        overwrite an entry the last checkpoint does not cover): ``None`` unless ``wait``, else
        wait for checkpoints until there is (every entry reserved before is durable then)."""
        at = place(self._offset, size, self.ring_bytes)
        if at + size > self._file_size:  # (the first lap: may stop the ring growing)
            self._grow(at + size)
            at = place(self._offset, size, self.ring_bytes)
        need = size + (self.ring_bytes - self._offset if at == 0 and self._offset else 0)
        if need > self.ring_bytes:  # (only a ring that a full disk kept tiny)
            raise OSError(errno.ENOSPC, f"a {size}-byte journal entry does not fit the ring")
        while True:
            with self._lock:
                s = self._s
                if s.total - s.checkpoint_total + need <= self.ring_bytes:
                    s.total += need
                    break
                if not wait:
                    return None
            # Every entry reserved so far is durable: a checkpoint frees the whole ring. Taken
            # here rather than left to the checkpointer, so that closing never waits for it.
            try:
                self.checkpoint()
            except OSError as exc:
                if exc.errno not in NO_SPACE:
                    raise
                log.warning("journal: full, and its checkpoint refused for want of space; "
                            "retrying: %s", exc)  # fmt: skip
                time.sleep(0.1)
        self._offset = at + size
        return at

    def _grow(self, end: int) -> None:
        """Zero-fill the ring file up to ``end`` (rounded up to a chunk, at most the ring). Out
        of space, the ring stops growing: its size is what the file has (at least
        :data:`MIN_RING`, else the error propagates)."""
        target = min(self.ring_bytes, -(-end // GROW_CHUNK) * GROW_CHUNK)
        zeros = bytes(max(0, min(GROW_CHUNK, target - self._file_size)))
        try:
            while self._file_size < target:
                n = os.pwrite(self._fd, zeros[: target - self._file_size], self._file_size)
                self._file_size += n
        except OSError as exc:
            if exc.errno not in NO_SPACE or self._file_size < MIN_RING:
                raise
            log.warning("journal: disk full, the ring stays at %d bytes (journal_bytes %d): %s",
                        self._file_size, self.ring_bytes, exc)  # fmt: skip
            self.ring_bytes = self._file_size
            self.max_payload = min(MAX_ENTRY_PAYLOAD, self.ring_bytes // 4)

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_loop(self) -> None:
        while True:
            self._wake_checkpointer.wait(self.interval_s)
            self._wake_checkpointer.clear()
            if self._s.closing or self._s.failed is not None:
                return
            try:
                self.checkpoint()
            except OSError as exc:
                if exc.errno in NO_SPACE:
                    log.warning("journal: checkpoint refused for want of space (retried): %s",
                                exc)  # fmt: skip
                    continue
                self._fail(exc, "checkpoint")
                return

    def checkpoint(self) -> bool:
        """Make the segments written so far durable and record it; the ring's bytes before
        the last durable entry are free again. False if there was nothing new to record.
        Thread-safe; the checkpointer thread calls it every ``checkpoint_interval_s`` and when
        the ring is half full."""
        with self._checkpoint_lock:
            with self._lock:
                s = self._s
                if s.durable_lsn == s.checkpoint_lsn and not s.dirty:
                    return False
                lsn, total, offset = s.durable_lsn, s.durable_total, s.durable_offset
                ends, dirty, s.dirty = dict(s.ends), s.dirty, {}
            for segment in dirty.values():
                fd = segment.fd
                if fd < 0:
                    continue  # closed: sealed (fsynced then) or deleted by retention
                try:
                    os.fdatasync(fd)
                except OSError as exc:
                    if exc.errno != errno.EBADF:  # (closed meanwhile)
                        raise
            self._write_checkpoint(Checkpoint(self._seq + 1, self.epoch, lsn, offset, ends))
            with self._lock:
                s.checkpoint_lsn, s.checkpoint_total = lsn, total
                self._cond.notify_all()
            self.checkpoints += 1
            return True

    def _write_checkpoint(self, cp: Checkpoint) -> None:
        """Overwrite the older of the two checkpoint files in place and fdatasync it: no new
        file, so that a checkpoint needs no free space unless the stream list grew (a torn
        write leaves the other file, the previous checkpoint, in force)."""
        data = encode_checkpoint(cp)
        data += bytes(-len(data) % CHECKPOINT_BLOCK)  # (the file grows by whole blocks)
        path = os.path.join(self.directory, checkpoint_file(cp.seq))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            view, at = memoryview(data), 0
            while view:
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self._seq = cp.seq

    def _fail(self, exc: BaseException, what: str) -> None:
        log.error("journal: %s failed, the log is closed for writing until restart: %r",
                  what, exc)  # fmt: skip
        with self._lock:
            self._s.failed = exc
            waiters, self._s.waiters = self._s.waiters, []
            self._cond.notify_all()
        _wake(waiters, None, LogClosedError(f"the journal failed: {exc!r}"))


class _Batch:
    """:meth:`Journal.batch`'s context manager."""

    __slots__ = ("_journal",)

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def __enter__(self) -> None:
        self._journal._local.deferred = True

    def __exit__(self, *exc: object) -> None:
        self._journal.end_batch()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """This thread's running loop, if any (``asyncio._get_running_loop``, exported for this use:
    no exception raised and caught on the threads without one, the syncer's each round)."""
    return asyncio._get_running_loop()


def sync_dir(path: str) -> None:
    """fsync a directory (after creating, renaming or removing an entry of it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _wake(waiters: list[_Waiter], seconds: float | None, error: BaseException | None) -> None:
    """Settle ``waiters``' futures on their loops: one thread-safe call per loop and round, or
    none for the loop running on this thread (a round led by ``_kick``): its futures are set
    here, which spares the self-pipe write and the loop iteration that reads it (profiled:
    docs/log.md, "Fixed cost per commit")."""
    here = _running_loop()
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[float]]] = {}
    for w in waiters:
        by_loop.setdefault(w.loop, []).append(w.future)
    for loop, futures in by_loop.items():
        if loop is here:
            _settle(futures, seconds, error)
            continue
        with contextlib.suppress(RuntimeError):  # (a loop closed meanwhile: nobody waits)
            loop.call_soon_threadsafe(_settle, futures, seconds, error)


def _settle(futures: list[asyncio.Future[float]], seconds: float | None,
            error: BaseException | None) -> None:  # fmt: skip
    for future in futures:
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(seconds or 0.0)
