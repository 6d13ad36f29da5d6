"""One stream's log: its directory of segments, reads by id range, rolling and retention.

This layer is synchronous and thread-safe: the group committer (:mod:`tidewire.log.store`) writes
from a worker thread while readers read from others. ``_lock`` guards the segment list and each
segment's committed size; the write and fsync themselves run outside it, past the committed size,
so readers never wait for a disk flush and never see an uncommitted byte.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from ..model import (
    Batch,
    CorruptLogError,
    DataLossError,
    InvalidStreamName,
    LogClosedError,
    LogError,
    StorageFullError,
    validate_stored_stream_name,
)
from ..record import EncodedRecord, Extent
from .config import StreamSettings
from .journal import Journal
from .segment import ReadBudget, RollbackError, Segment, segment_name
from .timeindex import first_reaching, running_maxima

__all__ = ["StreamLog", "StreamStats", "Unpublished", "directory_name", "fsync_dir"]

log = logging.getLogger("tidewire.log")

NAME_FILE = "stream.name"
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""Errors of a full file system: a write that meets one is refused, and the stream stays open."""
FULL_WARNING_SECONDS = 60.0
"""At most one warning per stream this often for refused writes (a disk that hovers at full,
small writes fitting and big ones not, would otherwise log two lines per write)."""
STAGING_PREFIX = ".creating-"
RETENTION_FILE = "retention.json"  # a stream's runtime retention (.admin)


def read_name(directory: str) -> str:
    """The stream name kept in ``directory``; :class:`CorruptLogError` if it is not valid."""
    path = os.path.join(directory, NAME_FILE)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return validate_stored_stream_name(raw.decode())
    except (UnicodeDecodeError, InvalidStreamName) as exc:
        raise CorruptLogError(path, 0, f"not a valid stream name: {exc}") from None


def directory_name(stream: str) -> str:
    """A file-system-safe, collision-free directory name for ``stream`` (the real name is kept
    in ``stream.name`` inside it)."""
    encoded = quote(stream, safe="")
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    if len(encoded) > 200:
        # "%%" never occurs in a percent-encoded name, so a hashed name is never a real one.
        digest = hashlib.sha256(stream.encode()).hexdigest()[:32]
        head = encoded[:160]
        cut = head.rfind("%", len(head) - 2)  # do not keep half of a %XX escape
        encoded = (head[:cut] if cut >= 0 else head) + "%%" + digest
    return encoded


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class StreamStats:
    name: str
    events: int
    first_id: int | None
    latest_id: int | None
    bytes: int
    segments: int


@dataclass(slots=True)
class Unpublished:
    """A group written to its segment and submitted to the journal (entry ``lsn``), to be
    published (:meth:`StreamLog.publish_written`) once the journal says it is durable."""

    segment: Segment
    records: Sequence[EncodedRecord | Extent]
    lsn: int  # (-1: no journal; durable already)


class StreamLog:
    """The segments of one stream. Create with :meth:`create` or :meth:`open`."""

    def __init__(self, name: str, directory: str, settings: StreamSettings) -> None:
        self.name = name
        self.directory = directory
        self.settings = settings
        self.runtime_retention = False  # settings' retention is the admin API's (.admin)
        self.segments: list[Segment] = []
        self.failed: BaseException | None = None
        self.key = os.path.basename(directory)  # the directory's name: the journal's key
        # The last group written ahead (:meth:`write_ahead`), until its committer takes it.
        self.unpublished: Unpublished | None = None
        self._refusals = 0  # writes refused for want of space since the last one that succeeded
        self._warned_at = -FULL_WARNING_SECONDS  # (time.monotonic()) the last refusal warned of
        self._warned = False  # the current run of refusals was warned of
        self._latest = 0
        self._start_id = 1
        self._closed = False
        self._readers = 0  # reads doing I/O outside the lock
        self._graveyard: list[Segment] = []  # dropped segments whose fds readers may still use
        # The sealed segments' running maxima of max_timestamp (timeindex.py), made by the
        # first time lookup after a roll or retention changed the segments
        self._sealed_maxima: list[int] | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(cls, root: str, name: str, settings: StreamSettings,
               retention: bytes | None = None) -> StreamLog:  # fmt: skip
        """Create the stream's directory atomically: built under a staging name (which starts
        with a dot, so :meth:`Log.open` never takes it for a stream and removes it), then
        renamed into place; a crash leaves either no stream or a complete one. ``retention``:
        the contents of its runtime retention file (:mod:`.admin`), made with it."""
        final = os.path.join(root, directory_name(name))
        staging = os.path.join(root, STAGING_PREFIX + directory_name(name))
        shutil.rmtree(staging, ignore_errors=True)
        try:
            os.mkdir(staging)
            with open(os.path.join(staging, NAME_FILE), "wb") as f:
                f.write(name.encode())
                f.flush()
                os.fsync(f.fileno())
            Segment.create(staging, 1).close()
            if retention is not None:
                with open(os.path.join(staging, RETENTION_FILE), "wb") as f:
                    f.write(retention)
                    os.fsync(f.fileno())
            fsync_dir(staging)
        except OSError as exc:  # (a full disk, say): no half-made stream is left behind
            shutil.rmtree(staging, ignore_errors=True)
            if exc.errno in NO_SPACE:
                raise StorageFullError(name, exc.errno, f"creating {final}") from exc
            raise
        try:
            os.rename(staging, final)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise LogError(f"cannot create stream {name!r} at {final}: {exc}") from None
        fsync_dir(root)
        stream = cls(name, final, settings)
        path = os.path.join(final, segment_name(1, ".log"))
        stream.segments.append(Segment(path, 1, os.open(path, os.O_RDWR)))
        return stream

    @classmethod
    def open(
        cls, directory: str, settings: StreamSettings, *, read_only: bool = False
    ) -> StreamLog:
        """Open and recover the stream in ``directory`` (see :mod:`tidewire.log.segment`)."""
        name = read_name(directory)
        stream = cls(name, directory, settings)
        bases = sorted(
            int(entry[:-4])
            for entry in os.listdir(directory)
            if entry.endswith(".log") and entry[:-4].isdigit()
        )
        interval = settings.index_interval_bytes
        try:
            for i, base in enumerate(bases):
                path = os.path.join(directory, f"{base:020d}.log")
                if i < len(bases) - 1:
                    seg = Segment.open_sealed(path, base, interval)
                else:
                    seg = Segment.open_active(path, base, interval, read_only=read_only)
                previous = stream.segments[-1] if stream.segments else None
                if (
                    previous is not None
                    and seg.first_id is not None
                    and (seg.first_id <= previous.last_id or base <= previous.last_id)
                ):
                    raise CorruptLogError(path, 0, f"ids overlap the previous segment "
                                          f"(which ends at id {previous.last_id})")  # fmt: skip
                stream.segments.append(seg)
            if not stream.segments:
                if read_only:
                    raise CorruptLogError(directory, 0, "stream directory has no segment")
                stream.segments.append(Segment.create(directory, 1))
                fsync_dir(directory)
        except BaseException:
            stream.close()
            raise
        stream._publish()
        return stream

    def close(self) -> None:
        """Close every file; those a read still uses close when it ends."""
        with self._lock:
            self._closed = True
            self._graveyard.extend(self.segments)
            if not self._readers:
                self._close_graveyard()

    # ------------------------------------------------------------------ state

    @property
    def latest(self) -> int:
        """The last committed id, or 0 when the stream holds no event.

        Read without the lock (an int is published atomically), so the event loop never waits
        for a reader's disk I/O to learn it."""
        return self._latest

    def _latest_locked(self) -> int:
        for seg in reversed(self.segments):
            if seg.events:
                return seg.last_id
        return self.segments[0].base_id - 1 if self.segments else 0

    @property
    def start_id(self) -> int:
        """The lowest id a read may ask for without losing data (retention raises it).
        Read without the lock, like :attr:`latest`."""
        return self._start_id

    def _publish(self) -> None:
        """Refresh what :attr:`latest` and :attr:`start_id` say (call with the lock held)."""
        self._latest = self._latest_locked()
        self._start_id = self.segments[0].base_id if self.segments else 1

    def stats(self) -> StreamStats:
        with self._lock:
            first = next((s.first_id for s in self.segments if s.first_id is not None), None)
            events = sum(s.events for s in self.segments)
            return StreamStats(
                self.name,
                events,
                first,
                self._latest_locked() if events else None,
                sum(s.size for s in self.segments),
                len(self.segments),
            )

    # ------------------------------------------------------------------ writing (one writer)

    def write(self, records: Sequence[EncodedRecord], *, fsync: bool) -> float | None:
        """Write ``records`` (already id-checked by the caller) durably, then publish them.
        Returns how long the fsync took (seconds; ``None`` without one).

        Out of space (``ENOSPC``, ``EDQUOT``) while writing the records, rolling to a new
        segment or writing the sealed one's index, what was begun is undone (the segment cut
        back to its committed size, durably; an unfinished new segment removed) and
        :class:`StorageFullError` raised: nothing was written, and the stream stays open. Any
        other error, an error of the fsync (whatever its errno: after a failed fsync the page
        cache cannot be trusted), or an undo that fails, fails the stream until a restart.

        Only one thread writes at a time (the group committer guarantees it).
        """
        self._check_open()
        try:
            active, _, fsync_seconds = self._put(records, lambda _: fsync)
        except BaseException as exc:
            self._failed_write(exc, records)
            raise
        self._commit(active, records)
        return fsync_seconds

    def write_ahead(self, records: Sequence[EncodedRecord], journal: Journal) -> Unpublished:
        """:meth:`write`'s journal path: write ``records`` to the segment (no fsync) and submit
        the same bytes to ``journal``; the caller waits for the entry to be durable, then
        publishes (:meth:`publish_written`). A group bigger than the journal takes
        (``journal.max_payload``) is fdatasynced in its segment here and journaled without its
        bytes. Errors as :meth:`write` (out of space: refused, the stream stays open). Also
        sets :attr:`unpublished`."""
        self._check_open()
        try:
            active, incoming, seconds = self._put(records, lambda n: n > journal.max_payload)
            lsn = journal.submit(self.key, active, active.size, [r.data for r in records],
                                 incoming, synced=seconds is not None)  # fmt: skip
        except BaseException as exc:
            self._failed_write(exc, records)
            raise
        self.unpublished = Unpublished(active, records, lsn)
        return self.unpublished

    def publish_written(self, written: Unpublished) -> None:
        """Publish a group written ahead, once its journal entry is durable."""
        self._commit(written.segment, written.records)

    def write_bulk(self, groups: Iterable[Sequence[EncodedRecord]], size_hint: int,
                   journal: Journal | None, *, fsync: bool) -> Unpublished | None:  # fmt: skip
        """Write every record of ``groups`` past the committed end of one segment, publishing
        none (log/bulk.py), rolling first if ``size_hint`` bytes would not fit, never in
        between (a segment may outgrow ``segment_bytes``); fdatasync it (with ``fsync`` or a
        ``journal``) and submit one payload-less journal entry for it all: recovery cuts the
        segment back before the bulk unless that entry is durable. The caller publishes
        (:meth:`publish_written`) once it is. Only extents are kept, not bytes. ``None`` if
        ``groups`` had no record. An error of ``groups`` itself (a part missing, say) cuts
        the segment back and propagates, the stream open; the disk's are :meth:`write`'s."""
        self._check_open()
        written: list[Extent] = []
        active = self.segments[-1]
        try:
            if active.size and active.size + size_hint > self.settings.segment_bytes:
                active = self._roll(active)
            end, source = active.size, iter(groups)
            while True:
                try:
                    records = next(source, None)
                except Exception as exc:
                    if written:
                        active.rollback()  # (RollbackError: fails the stream, below)
                    raise _SourceError(exc) from exc
                if records is None:
                    break
                end = _written(self.name, active, records, end)
                written += [Extent.of(r) for r in records]
            if not written:
                return None
            if fsync or journal is not None:
                try:
                    active.sync()
                except BaseException:
                    with contextlib.suppress(RollbackError):
                        active.rollback()
                    raise
            lsn = -1 if journal is None else journal.submit(
                self.key, active, active.size, [], end - active.size, synced=True)
        except _SourceError as exc:
            raise exc.error from None
        except BaseException as exc:
            self._failed_write(exc, written)
            raise
        return Unpublished(active, written, lsn)

    def _commit(self, segment: Segment, records: Sequence[EncodedRecord | Extent]) -> None:
        """Publish ``records`` written to ``segment``: readers see them from now on."""
        with self._lock:
            segment.commit(records, self.settings.index_interval_bytes)
            self._publish()
        if self._refusals:
            log.log(logging.WARNING if self._warned else logging.DEBUG,
                    "stream %r: writes succeed again (%d refused for want of space before)",
                    self.name, self._refusals)  # fmt: skip
            self._refusals, self._warned = 0, False

    def _check_open(self) -> None:
        """Refuse a write at once if the stream failed earlier."""
        if self.failed is not None:
            raise LogClosedError(f"stream {self.name!r} failed earlier: {self.failed}")

    def _failed_write(self, exc: BaseException,
                      records: Sequence[EncodedRecord | Extent]) -> None:  # fmt: skip
        """A write's error: out of space, refused (logged, the stream stays open); anything
        else fails the stream until a restart. (A ``try`` in each writer, not a context
        manager: this runs once per commit.)"""
        if isinstance(exc, StorageFullError):
            self._refused(exc, records)
            return
        self.failed = exc
        log.error("stream %r: write failed, the stream is closed until restart: %s",
                  self.name, exc)  # fmt: skip

    def _put(self, records: Sequence[EncodedRecord], sync: Callable[[int], bool]
             ) -> tuple[Segment, int, float | None]:  # fmt: skip
        """Write ``records`` to the active segment (rolling first when they would not fit) and
        fdatasync it if ``sync(their bytes)``; returns the segment, their bytes and the fsync's
        seconds (``None`` without one). Out of space: :class:`StorageFullError`, nothing
        written; a failed fsync cuts the segment back (whatever its errno) and re-raises."""
        active = self.segments[-1]
        incoming = sum(r.length for r in records)
        if active.size and active.size + incoming > self.settings.segment_bytes:
            active = self._roll(active)
        _written(self.name, active, records, active.size)
        if not sync(incoming):
            return active, incoming, None
        try:
            return active, incoming, active.sync()
        except BaseException:  # whatever the errno: the stream fails (see write)
            with contextlib.suppress(RollbackError):
                active.rollback()
            raise

    def _refused(self, exc: StorageFullError,
                 records: Sequence[EncodedRecord | Extent]) -> None:  # fmt: skip
        """Log a refusal: the first of a run as a warning (at most one per
        ``FULL_WARNING_SECONDS``), the rest (appenders retrying on a full disk) at debug level,
        until a write succeeds."""
        self._refusals += 1
        now = time.monotonic()
        level = logging.DEBUG
        if self._refusals == 1 and now - self._warned_at >= FULL_WARNING_SECONDS:
            level, self._warned_at, self._warned = logging.WARNING, now, True
        events = sum(r.count for r in records)
        nbytes = sum(r.length for r in records)
        log.log(level, "%s (%d event(s), %d bytes refused; the stream stays open, and further "
                "refusals are logged at debug level until a write succeeds)", exc, events,
                nbytes)  # fmt: skip

    def _roll(self, active: Segment) -> Segment:
        """Seal ``active`` and create the next segment. Out of space, what was begun is undone
        (the sealed index file, the new segment's file) and :class:`StorageFullError` raised:
        ``active`` stays the active segment."""
        try:
            active.seal()
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise StorageFullError(self.name, exc.errno,
                                       f"writing {active.index_path}") from exc  # fmt: skip
            raise
        base = active.last_id + 1
        try:
            new = Segment.create(self.directory, base)
        except OSError as exc:
            active.drop_index()
            if exc.errno in NO_SPACE:
                path = os.path.join(self.directory, segment_name(base, ".log"))
                raise StorageFullError(self.name, exc.errno, f"creating {path}") from exc
            raise
        try:
            fsync_dir(self.directory)
        except OSError as exc:
            new.discard()  # (a RollbackError if it cannot be removed: the stream fails)
            active.drop_index()
            if exc.errno in NO_SPACE:
                raise StorageFullError(self.name, exc.errno,
                                       f"syncing {self.directory}") from exc  # fmt: skip
            raise
        with self._lock:
            self.segments.append(new)
            self._sealed_maxima = None
        return new

    def enforce_retention(self, now_ms: int) -> int:
        """Delete the oldest sealed segments that retention no longer keeps; return how many.

        The active segment is never deleted. By size, a segment goes while the stream would still
        hold at least ``retention_bytes`` without it; by age, when its newest event is older
        than ``retention_ms``.
        """
        by_bytes, by_age = self.settings.retention_bytes, self.settings.retention_ms
        if by_bytes is None and by_age is None:
            return 0
        removed: list[Segment] = []
        with self._lock:
            total = sum(s.size for s in self.segments)
            while len(self.segments) > 1:
                oldest = self.segments[0]
                too_old = by_age is not None and oldest.max_timestamp < now_ms - by_age
                too_big = by_bytes is not None and total - oldest.size >= by_bytes
                if not (too_old or too_big):
                    break
                removed.append(self.segments.pop(0))
                total -= oldest.size
            self._publish()
            self._sealed_maxima = None
            for seg in removed:
                log.info("retention: stream %r drops %s (ids up to %d)",
                         self.name, seg.path, seg.last_id)  # fmt: skip
                seg.delete(close=False)
            self._graveyard.extend(removed)
            if not self._readers:
                self._close_graveyard()
        if removed:
            fsync_dir(self.directory)
        return len(removed)

    # ------------------------------------------------------------------ reading (any thread)

    def read(
        self, from_id: int, max_bytes: int = 1024 * 1024, max_events: int = 2**63 - 1
    ) -> list[Batch]:
        """Committed events with ids >= ``from_id``, about ``max_bytes`` of them (at least one
        event when there is one), as zero-copy batches. Raises :class:`DataLossError` when
        ``from_id`` was removed by retention."""
        out = self._read(from_id, max_bytes, max_events, mapped_only=False)
        assert out is not None
        return out

    def read_mapped(
        self, from_id: int, max_bytes: int = 1024 * 1024, max_events: int = 2**63 - 1
    ) -> list[Batch] | None:
        """:meth:`read` for the event loop's thread: only from segments already mapped over all
        that the read may see, so it is memory access (no ``mmap`` made, no file read), or
        ``None`` when a segment it reaches is not mapped that far (the caller then makes the
        whole read in a worker thread, which maps it). When it returns batches they are those
        :meth:`read` would return. Raises what :meth:`read` raises."""
        return self._read(from_id, max_bytes, max_events, mapped_only=True)

    def _read(
        self, from_id: int, max_bytes: int, max_events: int, *, mapped_only: bool
    ) -> list[Batch] | None:
        with self._lock:
            if self._closed or not self.segments:
                raise LogClosedError(f"stream {self.name!r} is closed")
            start = self.segments[0].base_id
            if from_id < start:
                if start > 1:  # retention removed what was asked for
                    raise DataLossError(self.name, from_id, start)
                from_id = 1  # id 0 means "from the start"
            views = [seg.view() for seg in self._segments_from(from_id)]
            self._readers += 1
        # The disk I/O runs without the lock: commits and the event loop never wait for it.
        # Segments that retention drops meanwhile keep their fds until the last reader leaves.
        try:
            budget = ReadBudget(from_id, max_bytes, max_events)
            for view in views:
                if mapped_only and not view.segment.mapped(view.size):
                    # The whole read goes to the thread, not a short one: callers may take a
                    # read that returns less than max_bytes for the end of the stream.
                    return None
                view.segment.read(self.name, budget, view)
                if not budget.open or budget.next_id <= view.last_id:
                    break  # spent, or stopped inside this segment: the next one must wait
        finally:
            with self._lock:
                self._readers -= 1
                if not self._readers:
                    self._close_graveyard()
        return budget.out

    def find_time(self, ms: int) -> int | None:
        """The first committed id whose timestamp is at least ``ms`` (timestamps are the
        clients' and need not grow with the ids); ``None`` when no event retained is that new.
        O(log segments + log index entries), plus a walk over at most about
        ``index_interval_bytes`` of record headers and the scan of one record's timestamps."""
        with self._lock:
            if self._closed or not self.segments:
                raise LogClosedError(f"stream {self.name!r} is closed")
            if self._sealed_maxima is None:
                sealed = [seg.max_timestamp for seg in self.segments[:-1]]
                self._sealed_maxima = running_maxima(sealed)
            first = first_reaching(self._sealed_maxima, ms)
            # the first sealed segment reaching ms, if any, then the active one
            reaching = {id(s): s for s in (*self.segments[first:first + 1], self.segments[-1])}
            candidates = [(seg.view(), seg.max_timestamp) for seg in reaching.values()]
            self._readers += 1
        try:  # as a read: the I/O without the lock, dropped segments closed by the last reader
            for view, max_timestamp in candidates:
                if max_timestamp >= ms:
                    found = view.segment.find_time(self.name, view, ms)
                    if found is not None:
                        return found
            return None
        finally:
            with self._lock:
                self._readers -= 1
                if not self._readers:
                    self._close_graveyard()

    def _close_graveyard(self) -> None:
        for seg in self._graveyard:
            seg.close()
        self._graveyard.clear()

    def _segments_from(self, from_id: int) -> list[Segment]:
        segs = self.segments
        lo = 0
        for i, seg in enumerate(segs):
            if seg.base_id <= from_id:
                lo = i
        return segs[lo:]


class _SourceError(LogError):
    """A bulk append's source failed (``error``): not the disk's fault."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _written(name: str, segment: Segment, records: Sequence[EncodedRecord], at: int) -> int:
    """:meth:`Segment.write` at ``at``; a full disk: :class:`StorageFullError`."""
    try:
        return segment.write(records, at)
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        raise StorageFullError(name, exc.errno, f"writing {segment.path}") from exc
