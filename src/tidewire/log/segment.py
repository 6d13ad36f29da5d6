"""One segment: a file of records (``<base>.log``) and its sparse id index (``<base>.index``).

``<base>`` is the 20-digit id that the segment starts at: the id after the previous segment's last
id (1 for a stream's first segment), like Kafka's segment names. Only the last segment of a stream
(the *active* one) is written to; the others are *sealed*.

The sparse index maps the base id of a record to its byte position and to the largest timestamp
of the records before it (the time index, issue 23), one entry at least every
``index_interval_bytes`` (and always for the first record). The active segment's index lives in
memory and is rebuilt by recovery; a sealed segment's index is written to ``<base>.index`` when it
is sealed, with a header that lets recovery trust it without reading the segment (the format is
in :mod:`.timeindex`). A missing index file, or one that fails its CRC or disagrees with the
segment's size, is rebuilt from the headers.

Recovery of the active segment reads every record and checks both CRCs. The *torn tail* (a header
cut short, a record whose length runs past the end of the file, or a tail of zero bytes) is what a
crash in the middle of a write leaves: it is truncated and logged with file and offset. Anything
else that fails a check (a bad CRC, ids going backwards) is corruption: :class:`CorruptLogError`
names file and offset, and nothing is skipped.

A write that fails (a full disk, say) is undone: the file is cut back to its committed size and
the cut fsynced (:meth:`Segment.rollback`), so it ends at the last committed record again;
:class:`RollbackError` when even that fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..model import Batch, CorruptLogError, LogError
from ..record import (
    HEADER_SIZE,
    EncodedRecord,
    Extent,
    HeaderError,
    RecordHeader,
    decode_body,
    parse_header,
)
from .timeindex import MIN_TS, IndexFile, last_entry_below, pack_index, unpack_index
from .verified import VerifiedRuns

__all__ = ["ReadBudget", "RollbackError", "Segment", "segment_name"]

log = logging.getLogger("tidewire.log")

_SCAN_CHUNK = 4 * 1024 * 1024
WRITEBACK_BYTES = 8 * 1024 * 1024
"""Every this many bytes written to a segment, the kernel is told to start writing them to
the disk (``sync_file_range(SYNC_FILE_RANGE_WRITE)``: it returns at once). Without it a
segment's pages stay dirty until its :meth:`Segment.seal` at the roll, whose ``fdatasync`` then
writes up to ``segment_bytes`` at once on the stream's append path: 80 ms for 128 MiB here,
every append of the stream waiting (the security tests' bystander saw it as a stall). Kafka's
``flush.messages`` and RocksDB's ``bytes_per_sync`` answer the same way."""
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 16


class RollbackError(LogError):
    """A failed write that could not be undone: the file may hold bytes past its committed
    size, or a file of an unfinished roll could not be removed. The stream must stop writing
    (it is failed until a restart, whose recovery settles what is on disk)."""


def _writeback() -> Callable[[int, int, int], None]:
    """``sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE)`` from the C library
    (Linux; through ctypes, which releases the GIL: the os module has no binding), else a
    no-op. A hint: its failure changes nothing (``fdatasync`` makes data durable)."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return lambda fd, offset, nbytes: None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int

    def start(fd: int, offset: int, nbytes: int) -> None:
        call(fd, offset, nbytes, 2)  # SYNC_FILE_RANGE_WRITE: start write-out, do not wait

    return start


start_writeback = _writeback()


def segment_name(base_id: int, suffix: str) -> str:
    return f"{base_id:020d}{suffix}"


@dataclass(slots=True)
class Segment:
    """A segment's file descriptor and what is known of its committed content.

    ``size`` is the committed length: bytes past it are being written and are never read.
    """

    path: str
    base_id: int
    fd: int
    size: int = 0
    last_id: int = 0
    max_timestamp: int = -(2**63)
    events: int = 0
    index_ids: array[int] = field(default_factory=lambda: array("Q"))
    index_pos: array[int] = field(default_factory=lambda: array("Q"))
    # Per entry, the largest timestamp of the records before it (timeindex.py); None for a
    # version 2 index file until a time lookup rebuilds it (time_column)
    index_ts: array[int] | None = field(default_factory=lambda: array("q"))
    bytes_since_index: int = 0
    fsync_seconds: float = 0.0  # how long the last write's fdatasync took (the metrics)
    written_back: int = 0  # the offset up to which the kernel was told to write back
    # Reads: a read-only mapping of the file's first len(_map) bytes (all committed), made at
    # the first read and again when a read needs more (the active segment grows). Batches read
    # are views into it and keep it alive: close() only drops this reference.
    _map: mmap.mmap | None = field(default=None, repr=False, compare=False)
    # The records whose body CRC this process has checked (verified.py: once, not per read)
    _verified: VerifiedRuns = field(default_factory=VerifiedRuns, repr=False, compare=False)

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(cls, directory: str, base_id: int) -> Segment:
        path = os.path.join(directory, segment_name(base_id, ".log"))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        return cls(path, base_id, fd)

    @classmethod
    def open_sealed(cls, path: str, base_id: int, interval: int) -> Segment:
        fd = os.open(path, os.O_RDONLY)
        seg = cls(path, base_id, fd, size=os.fstat(fd).st_size)
        if not seg._load_index_file():
            seg._scan(interval, active=False, repair=False)
        return seg

    @classmethod
    def open_active(cls, path: str, base_id: int, interval: int, *, read_only: bool) -> Segment:
        fd = os.open(path, os.O_RDONLY if read_only else os.O_RDWR)
        seg = cls(path, base_id, fd, size=os.fstat(fd).st_size)
        seg._scan(interval, active=True, repair=not read_only)
        return seg

    @property
    def index_path(self) -> str:
        return self.path[: -len(".log")] + ".index"

    @property
    def first_id(self) -> int | None:
        return int(self.index_ids[0]) if self.index_ids else None

    # ------------------------------------------------------------------ recovery

    def _scan(self, interval: int, *, active: bool, repair: bool) -> None:
        """Walk every record from the start, rebuilding the index; handle the tail (see module).

        Only the active segment may have a torn tail and has its bodies checked here; a sealed
        segment was complete and fsynced when it was sealed, so a short one is corrupt.
        """
        file_size = self.size
        pos = 0
        buf = memoryview(b"")
        buf_start = 0
        last_id = 0
        while pos < file_size:
            remaining = file_size - pos
            if remaining < HEADER_SIZE:
                self._torn(pos, "a record header is cut short", active, repair)
                return
            if pos + HEADER_SIZE > buf_start + len(buf):
                buf_start = pos
                buf = memoryview(os.pread(self.fd, min(_SCAN_CHUNK, remaining), pos))
            try:
                header = parse_header(buf, pos - buf_start)
            except HeaderError as exc:
                if self._zeros_from(pos):
                    self._torn(pos, "the tail is zero bytes", active, repair)
                    return
                raise CorruptLogError(self.path, pos, str(exc)) from None
            if header.length > remaining:
                self._torn(pos, f"a {header.length}-byte record is cut short", active, repair)
                return
            if header.base_id <= last_id:
                raise CorruptLogError(
                    self.path, pos, f"id {header.base_id} does not follow id {last_id}"
                )
            if active:
                if pos + header.length > buf_start + len(buf):
                    buf_start = pos
                    buf = memoryview(os.pread(self.fd, max(header.length, _SCAN_CHUNK), pos))
                try:
                    decode_body("-", header, buf, pos - buf_start)
                except ValueError as exc:
                    raise CorruptLogError(self.path, pos, str(exc)) from None
            self._note_record(pos, header.length, header.count, header.base_id, header.last_id,
                              header.max_timestamp, interval)  # fmt: skip
            last_id = header.last_id
            pos += header.length
        self.size = pos

    def _zeros_from(self, pos: int) -> bool:
        while pos < self.size:
            chunk = os.pread(self.fd, min(_SCAN_CHUNK, self.size - pos), pos)
            if not chunk or chunk.count(0) != len(chunk):
                return False
            pos += len(chunk)
        return True

    def _torn(self, pos: int, why: str, active: bool, repair: bool) -> None:
        if not active:
            raise CorruptLogError(self.path, pos, f"sealed segment is cut short: {why}")
        if repair:
            log.warning(
                "recovery: truncating torn tail of %s at byte offset %d (%d bytes dropped: %s)",
                self.path, pos, self.size - pos, why,
            )  # fmt: skip
            os.ftruncate(self.fd, pos)
            os.fsync(self.fd)
        else:
            log.warning("torn tail of %s at byte offset %d ignored (read-only)", self.path, pos)
        self.size = pos

    def _load_index_file(self) -> bool:
        try:
            with open(self.index_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return False
        index = unpack_index(data, self.size)
        if not isinstance(index, IndexFile):
            log.warning("index file %s %s: rebuilding it from the segment",
                        self.index_path, index)  # fmt: skip
            return False
        self.last_id, self.max_timestamp, self.events = (index.last_id, index.max_timestamp,
                                                         index.events)  # fmt: skip
        self.index_ids, self.index_pos, self.index_ts = (index.index_ids, index.index_pos,
                                                         index.index_ts)  # fmt: skip
        return True

    def _note_record(self, pos: int, length: int, count: int, base_id: int, last_id: int,
                     max_ts: int, interval: int) -> None:  # fmt: skip
        if not self.index_ids or self.bytes_since_index >= interval:
            self.index_ids.append(base_id)
            self.index_pos.append(pos)
            if self.index_ts is not None:  # (an active segment always has its time column)
                self.index_ts.append(self.max_timestamp)  # the largest before this record
            self.bytes_since_index = 0
        self.bytes_since_index += length
        self.last_id = last_id
        self.events += count
        self.max_timestamp = max(self.max_timestamp, max_ts)

    # ------------------------------------------------------------------ writing

    def write(self, records: Sequence[EncodedRecord], at: int | None = None) -> int:
        """Write ``records`` at the end (past the committed size; or at ``at``, past records
        written but not committed yet: a bulk append, log/bulk.py) in one ``writev``, resuming
        a short one. Returns the new end; the caller makes it durable (:meth:`sync`) and
        publishes it (:meth:`commit`).

        On failure the file is cut back to its committed size, durably (:meth:`rollback`),
        before the error propagates: the file ends at the last committed record again, and what
        the write took on disk is free. If the cut fails too, :class:`RollbackError` propagates
        instead (the write's error is its ``__context__``).
        """
        pending: list[bytes | bytearray | memoryview] = [r.data for r in records]
        total = sum(r.length for r in records)
        start = self.size if at is None else at
        try:
            offset = start
            left = total
            while pending:  # pwritev may write less than asked: resume where it stopped
                n = os.pwritev(self.fd, pending[:_IOV_MAX], offset)
                if n <= 0:
                    raise OSError("pwritev wrote nothing")
                left -= n
                if not left:  # (the common case: all of it at once)
                    break
                offset += n
                pending = _skip(pending, n)
        except BaseException:
            self.rollback()
            raise
        end = start + total
        if end - self.written_back >= WRITEBACK_BYTES:
            start_writeback(self.fd, self.written_back, end - self.written_back)
            self.written_back = end
        return end

    def sync(self) -> float:
        """``fdatasync`` what :meth:`write` wrote; how long it took (seconds)."""
        started = time.perf_counter()
        os.fdatasync(self.fd)
        self.fsync_seconds = time.perf_counter() - started
        return self.fsync_seconds

    def rollback(self) -> None:
        """Cut the file back to its committed size and make the cut durable, so that a crash
        afterwards never finds the records of a write that was refused. Raises
        :class:`RollbackError` if either step fails."""
        try:
            os.ftruncate(self.fd, self.size)
            os.fsync(self.fd)
        except OSError as exc:
            log.error("could not cut %s back to its committed %d bytes: %s",
                      self.path, self.size, exc)  # fmt: skip
            raise RollbackError(
                f"could not cut {self.path} back to its committed {self.size} bytes: {exc}"
            ) from exc

    def commit(self, records: Sequence[EncodedRecord | Extent], interval: int) -> None:
        """Publish records written by :meth:`write` (call with the stream lock held)."""
        pos = self.size
        for r in records:
            self._note_record(pos, r.length, r.count, r.base_id, r.last_id, r.max_timestamp,
                              interval)  # fmt: skip
            pos += r.length
        self.size = pos

    def seal(self) -> None:
        """fdatasync a segment that will not grow any more (its last groups may be durable
        only in the journal so far), then write and fsync its index file."""
        os.fdatasync(self.fd)
        data = pack_index(self.size, self.last_id, self.max_timestamp, self.events,
                          self.index_ids, self.index_pos, self.time_column(self.view()))
        fd = os.open(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:  # a write may be short (a nearly full disk): go on where it stopped
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(f"writing {self.index_path} wrote nothing")
                view = view[n:]
            os.fsync(fd)
        except BaseException:
            self.drop_index()  # not left half written (recovery would rebuild it, but still)
            raise
        finally:
            os.close(fd)

    def drop_index(self) -> None:
        """Remove the index file, if any (best effort): a segment that is still the active one
        after a roll that could not finish. An active segment's index file is never read;
        sealing rewrites it."""
        with contextlib.suppress(OSError):
            os.unlink(self.index_path)

    def discard(self) -> None:
        """Close and remove a segment just created and never written (a roll that could not
        finish); :class:`RollbackError` if its file cannot be removed."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RollbackError(f"could not remove {self.path}: {exc}") from exc

    def close(self) -> None:
        mapping, self._map = self._map, None
        if mapping is not None:
            # Unmapped now if no batch still views it, else when the last view goes (an
            # unlinked file's pages stay readable through the mapping meanwhile).
            with contextlib.suppress(BufferError):
                mapping.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def delete(self, *, close: bool = True) -> None:
        """Remove the files; with ``close=False`` the fd stays open for reads in progress
        (the caller closes it when they are done)."""
        if close:
            self.close()
        for path in (self.path, self.index_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # ------------------------------------------------------------------ reading

    def view(self) -> SegmentView:
        """What a reader needs, as of now (call with the stream lock held)."""
        return SegmentView(self, self.size, self.last_id, len(self.index_pos))

    def read(self, stream: str, budget: ReadBudget, view: SegmentView | None = None) -> None:
        """Add to ``budget`` the events from ``budget.next_id`` on, until it is spent or the
        segment ends, as of ``view`` (taken under the stream lock; the read itself needs no
        lock). Records are checked against their CRCs at their first read (verified.py)."""
        view = view or self.view()
        from_id = budget.next_id
        end = view.size
        if from_id > view.last_id or end == 0:
            return
        slot = bisect_right(self.index_ids, from_id, 0, view.index_entries) - 1
        pos = int(self.index_pos[max(slot, 0)])
        self._read_mapped(stream, budget, self._mapping(end), pos, end)

    def mapped(self, end: int) -> bool:
        """The segment's mapping covers its first ``end`` bytes already (a read of them then
        makes no ``mmap`` and reads no file: :meth:`StreamLog.read_mapped`)."""
        mapping = self._map
        return mapping is not None and len(mapping) >= end

    def _mapping(self, end: int) -> memoryview:
        """A view of the file's first ``end`` (committed) bytes or more, from the segment's
        mapping (made, or made again larger, here: a read of the active segment may need
        what was committed since the last). Any thread: a race maps twice, harmlessly."""
        mapping = self._map
        if mapping is None or len(mapping) < end:
            mapping = mmap.mmap(self.fd, end, access=mmap.ACCESS_READ)
            self._map = mapping
        return memoryview(mapping)

    def _read_mapped(
        self, stream: str, budget: ReadBudget, buf: memoryview, pos: int, end: int
    ) -> None:
        """:meth:`read` from the mapping: no copy; each batch views the mapped pages (its
        values are checked by the body CRC at the first read in this process, verified.py,
        then only pass: to a socket, a decoder)."""
        from_id = budget.next_id
        while pos < end:  # skip whole records that end before from_id: headers only
            header = self._header(buf[:end], pos, pos)
            if header.last_id >= from_id:
                break
            pos += header.length
        while pos < end and budget.open:
            header = self._header(buf[:end], pos, pos)
            batch = self._record(stream, header, buf, pos, end)
            if not budget.add(batch):
                return
            pos += header.length

    def _record(self, stream: str, header: RecordHeader, buf: memoryview, pos: int,
                end: int) -> Batch:  # fmt: skip
        """The record at ``pos`` (its ``header`` parsed), its body CRC checked at its first read
        in this process (verified.py)."""
        if pos + header.length > end:
            raise CorruptLogError(self.path, pos, "record runs past the committed size")
        stop = pos + header.length
        checked = self._verified.covers(pos, stop)
        try:
            batch = decode_body(stream, header, buf, pos, verify=not checked)
        except ValueError as exc:
            raise CorruptLogError(self.path, pos, str(exc)) from None
        if not checked:
            self._verified.add(pos, stop)
        return batch

    def time_column(self, view: SegmentView) -> array[int]:
        """The index's ``ts_before`` column (timeindex.py) for ``view``'s entries; rebuilt here
        from the record headers (not bodies) when the index file had none (version 2), once
        per process. Any thread: a race rebuilds it twice, harmlessly."""
        column = self.index_ts
        if column is not None and len(column) >= view.index_entries:
            return column
        built, running, entry = array("q"), MIN_TS, 0
        buf, pos = self._mapping(view.size), 0
        while pos < view.size and entry < view.index_entries:
            header = self._header(buf[: view.size], pos, pos)
            if pos == self.index_pos[entry]:
                built.append(running)
                entry += 1
            running = max(running, header.max_timestamp)
            pos += header.length
        if entry < view.index_entries:
            raise CorruptLogError(self.path, pos, "an index entry falls between two records")
        self.index_ts = built
        return built

    def find_time(self, stream: str, view: SegmentView, ms: int) -> int | None:
        """The first id of the segment (as of ``view``) whose timestamp is at least ``ms``;
        ``None`` when none is. Bisects the time column, walks headers from that entry to the
        first record whose ``max_timestamp`` reaches ``ms`` (at most about
        ``index_interval_bytes`` of them), and scans that record's timestamps."""
        if view.size == 0 or not view.index_entries:
            return None
        entry = last_entry_below(self.time_column(view), view.index_entries, ms)
        pos, end = int(self.index_pos[entry]), view.size
        buf = self._mapping(end)
        while pos < end:
            header = self._header(buf[:end], pos, pos)
            if header.max_timestamp >= ms:
                batch = self._record(stream, header, buf, pos, end)
                for i, ts in enumerate(batch.timestamps):
                    if ts >= ms:
                        return int(batch.ids[i])
            pos += header.length
        return None

    def _header(self, buf: bytes | memoryview, at: int, pos: int) -> RecordHeader:
        if len(buf) - at < HEADER_SIZE:
            raise CorruptLogError(self.path, pos, "record header cut short inside the file")
        try:
            return parse_header(buf, at)
        except HeaderError as exc:
            raise CorruptLogError(self.path, pos, str(exc)) from None


@dataclass(frozen=True, slots=True)
class SegmentView:
    """A segment as a reader saw it under the stream lock: its committed size and last id, and
    how many index entries were complete (the writer appends to the index meanwhile)."""

    segment: Segment
    size: int
    last_id: int
    index_entries: int


class ReadBudget:
    """What one read gathers: batches from ``next_id`` on, within ``max_bytes`` (as
    :attr:`Batch.nbytes` counts them; a batch is sliced to fit) and ``max_events``, and at least
    one event when there is one, whatever it costs. Segments and the in-memory tail feed it."""

    __slots__ = ("bytes_left", "events_left", "next_id", "open", "out")

    def __init__(self, from_id: int, max_bytes: int, max_events: int) -> None:
        self.next_id = from_id
        self.bytes_left = max_bytes
        self.events_left = max_events
        self.out: list[Batch] = []
        self.open = max_events > 0

    def add(self, batch: Batch) -> bool:
        """Take what fits of ``batch`` (from ``next_id`` on); False once the read is complete,
        that is when the budget is spent or did not take the whole rest of ``batch``."""
        if batch.last_id < self.next_id:
            return True
        start = batch.index_of(self.next_id) if batch.first_id < self.next_id else 0
        n = len(batch)
        stop = min(n, start + self.events_left)
        if batch.nbytes > self.bytes_left:
            stop = min(stop, batch.fit(start, self.bytes_left))
        if stop <= start:
            if self.out:
                self.open = False
                return False
            stop = start + 1  # the first event is always taken
        piece = batch if start == 0 and stop == n else batch.slice(start, stop)
        self.out.append(piece)
        self.next_id = piece.last_id + 1
        self.bytes_left -= piece.nbytes
        self.events_left -= stop - start
        self.open = stop == n and self.events_left > 0 and self.bytes_left > 0
        return self.open


def _skip(
    parts: list[bytes | bytearray | memoryview], n: int
) -> list[bytes | bytearray | memoryview]:
    """``parts`` with their first ``n`` bytes dropped (to resume a short ``pwritev``)."""
    if n == 0:
        return parts
    for i, part in enumerate(parts):
        size = part.nbytes if isinstance(part, memoryview) else len(part)
        if n < size:
            return [memoryview(part)[n:], *parts[i + 1 :]]
        n -= size
    return []
