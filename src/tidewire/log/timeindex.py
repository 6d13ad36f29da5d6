"""A sealed segment's index file, with its time column (issue 23), and the time lookups' pure
steps.

The time index is folded into the sparse id index (one file per segment, one CRC, one fsync at
seal; Kafka keeps a separate ``.timeindex``). Each entry of ``<base>.index`` version 3 is::

    base_id u64 | position u64 | ts_before i64

where ``ts_before`` is the largest timestamp of the segment's records *before* the entry's
record (``-2**63`` for the first): it never decreases along the file even though timestamps
are the clients' and not monotonic (Kafka's ``TimeIndex`` entry means the same). The file::

    magic b"TWIX" | version u32 = 3 | segment_size u64 | last_id u64 | max_timestamp i64
    | events u64 | crc u32 | 4 zero bytes | entries (base_id u64, position u64, ts_before i64) ...

``crc`` is the CRC-32 of the whole file with the crc field read as zero. A version 2 file (the
same header, entries without ``ts_before``) is still read: its time column is rebuilt from the
record headers at the first time lookup of the segment in the process (:meth:`Segment.
time_column <tidewire.log.segment.Segment.time_column>`), never written back (a read-only open
must not write, and a sealed segment is never sealed again).

A lookup (:meth:`StreamLog.find_time <tidewire.log.stream.StreamLog.find_time>`) bisects the
segments' running maxima (:func:`first_reaching`), then the segment's ``ts_before`` column for
the last entry below the time (:func:`last_entry_below`), then walks record headers to the
first record whose ``max_timestamp`` reaches it and scans that record's timestamps.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

__all__ = [
    "INDEX_VERSION",
    "MIN_TS",
    "IndexFile",
    "first_reaching",
    "last_entry_below",
    "pack_index",
    "unpack_index",
]

INDEX_HEADER = struct.Struct("<4sIQQqQI4x")  # ... | crc u32 | 4 zero bytes
INDEX_MAGIC = b"TWIX"
INDEX_VERSION = 3
_ENTRY_SIZE = {2: 16, 3: 24}  # bytes per entry, by version
MIN_TS = -(2**63)
"""``ts_before`` of a segment's first entry: no record before it."""


@dataclass(frozen=True, slots=True)
class IndexFile:
    """What an index file says. ``index_ts`` is ``None`` for a version 2 file (no time column)."""

    version: int
    size: int
    last_id: int
    max_timestamp: int
    events: int
    index_ids: array[int]
    index_pos: array[int]
    index_ts: array[int] | None


def pack_index(size: int, last_id: int, max_timestamp: int, events: int,
               ids: array[int], positions: array[int], ts_before: array[int]) -> bytes:  # fmt: skip
    """The bytes of a version 3 index file (entries from the three columns, of equal length)."""
    if not len(ids) == len(positions) == len(ts_before):
        raise ValueError("the index's columns differ in length")
    entries = array("q", bytes(len(ids) * 24))  # (ids and positions are below 2**63)
    entries[0::3], entries[1::3], entries[2::3] = array("q", ids), array("q", positions), ts_before
    data = bytearray(INDEX_HEADER.size) + entries.tobytes()
    INDEX_HEADER.pack_into(data, 0, INDEX_MAGIC, INDEX_VERSION, size, last_id, max_timestamp,
                           events, 0)  # fmt: skip
    INDEX_HEADER.pack_into(data, 0, INDEX_MAGIC, INDEX_VERSION, size, last_id, max_timestamp,
                           events, index_crc(data))  # fmt: skip
    return bytes(data)


def unpack_index(data: bytes, segment_size: int) -> IndexFile | str:
    """The index file ``data`` of a segment of ``segment_size`` bytes, or why it cannot be
    trusted (the caller then rebuilds the index from the segment's record headers)."""
    if len(data) < INDEX_HEADER.size:
        return "has a bad size"
    magic, version, size, last_id, max_ts, events, crc = INDEX_HEADER.unpack_from(data)
    if magic != INDEX_MAGIC or version not in _ENTRY_SIZE:
        return "is not a tidewire index"
    if (len(data) - INDEX_HEADER.size) % _ENTRY_SIZE[version]:
        return "has a bad size"
    if size != segment_size:
        return f"describes {size} bytes of a {segment_size}-byte segment"
    if index_crc(data) != crc:
        return "fails its CRC"
    body = memoryview(data)[INDEX_HEADER.size :]
    ts: array[int] | None = None
    if version == 2:
        entries = body.cast("Q")
        ids, positions = array("Q", entries[0::2]), array("Q", entries[1::2])
    else:
        unsigned = body.cast("Q")
        ids, positions = array("Q", unsigned[0::3]), array("Q", unsigned[1::3])
        ts = array("q", body.cast("q")[2::3])
    if size and (not ids or positions[0] != 0 or positions[-1] >= size):
        return "has entries outside its segment"
    return IndexFile(version, size, last_id, max_ts, events, ids, positions, ts)


def index_crc(data: bytes | bytearray) -> int:
    """CRC-32 of an index file with its CRC field (bytes 40..44) read as zero."""
    view = memoryview(data)
    crc = zlib.crc32(view[:40])
    crc = zlib.crc32(b"\0\0\0\0", crc)
    return zlib.crc32(view[44:], crc)


def running_maxima(maxima: list[int]) -> list[int]:
    """``out[i] = max(maxima[:i + 1])``: non-decreasing, so it can be bisected."""
    return list(accumulate(maxima, max))


def first_reaching(running: list[int], ms: int) -> int:
    """The index of the first segment whose running maximum is at least ``ms`` (that is, the
    first segment holding an event at or after ``ms``); ``len(running)`` when none."""
    return bisect_left(running, ms)


def last_entry_below(ts_before: array[int], entries: int, ms: int) -> int:
    """The last of the first ``entries`` index entries with ``ts_before < ms``: every record
    before it is older than ``ms``, and a record from it on reaches ``ms`` first. 0 when ``ms``
    is the smallest timestamp (no entry is below it)."""
    return max(bisect_left(ts_before, ms, 0, entries) - 1, 0)
