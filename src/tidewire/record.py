"""The record batch: one :class:`~tidewire.model.Batch`, column-wise, CRC-checked.

It sits beside the model because two layers share it: the log writes it to disk, and the wire
carries it as is (RS.io ``format=records``, read by the clients). It imports only the model.

A segment file is a sequence of records, each laid out as below (little-endian, the record's
total length a multiple of 8 so that every record starts 8-aligned)::

    offset size  field
    0      4     length        u32  bytes of the whole record, header and padding included
    4      1     magic         u8   = 2 (format version; 1 is read too, see below)
    5      1     attributes    u8   bit 0: the record carries keys
    6      2     reserved      u16  = 0
    8      4     count         u32  events in the record (>= 1)
    12     4     body_size     u32  bytes of the body before padding
    16     8     base_id       u64  id of the first event
    24     8     last_id       u64  id of the last event
    32     8     max_timestamp i64  largest timestamp (ms), for retention by age
    40     4     body_crc      u32  CRC-32C of the body (bytes 48 .. 48 + body_size)
    44     4     header_crc    u32  CRC-32C of bytes 0 .. 44
    48           body:
                   ids            count x u64
                   timestamps     count x i64
                   value_offsets  (count + 1) x u32   (may start above 0; see Batch)
                   key_offsets    (count + 1) x u32   } only with attribute bit 0
                   key_flags      count x u8          }
                   values         value_offsets[count] - value_offsets[0] bytes
                   keys           key_offsets[count] - key_offsets[0] bytes (with bit 0)
                 zero padding to a multiple of 8

The header has its own CRC so that a damaged ``length`` is caught as corruption instead of being
mistaken for a torn tail. Decoding hands back zero-copy views of the buffer it was given.

Checksums are CRC-32C (Castagnoli, as in Kafka's record batches, iSCSI and ext4), computed by the
``crc32c`` package (a C extension using the CPU's CRC32 instruction: ~25 GB/s here, against
~2 GB/s for ``zlib.crc32``, which made checking records the largest cost of serving big values;
it takes memoryviews without a copy, which ``google-crc32c`` does not). Format 1, the same layout
with ``zlib.crc32`` checksums, is still read; every record written is format 2.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from crc32c import crc32c

from .model import MAX_ID, Batch, InvalidBatch, TidewireError
from .native import kernel

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "EncodedRecord",
    "Extent",
    "RecordHeader",
    "decode_body",
    "encode",
    "id_range",
    "id_range_py",
    "max_timestamp",
    "max_timestamp_py",
    "merge",
    "parse_header",
]

HEADER = struct.Struct("<IBBHIIQQqII")
HEADER_SIZE = HEADER.size  # 48
MAGIC = 2  # CRC-32C checksums
MAGIC_ZLIB = 1  # format 1: zlib CRC-32 checksums (read, never written)
_CHECKSUMS = {MAGIC: crc32c, MAGIC_ZLIB: zlib.crc32}
ATTR_KEYS = 0x01
_CRC_SPAN = HEADER_SIZE - 4


@dataclass(frozen=True, slots=True)
class RecordHeader:
    length: int
    attributes: int
    count: int
    body_size: int
    base_id: int
    last_id: int
    max_timestamp: int
    body_crc: int
    magic: int = MAGIC


@dataclass(frozen=True, slots=True)
class EncodedRecord:
    """A record ready to write: its bytes, the batch as stored (zero-copy views of those bytes),
    and what the index needs."""

    data: bytearray
    batch: Batch
    length: int
    count: int
    base_id: int
    last_id: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class Extent:
    """What a segment's index needs of a record written (an :class:`EncodedRecord` has the
    same fields): kept instead of the record when its bytes must not stay in memory (a bulk
    append, log/bulk.py)."""

    length: int
    count: int
    base_id: int
    last_id: int
    max_timestamp: int

    @classmethod
    def of(cls, record: EncodedRecord | Extent) -> Extent:
        return cls(record.length, record.count, record.base_id, record.last_id,
                   record.max_timestamp)  # fmt: skip


def encode(batch: Batch, first_id: int | None = None) -> EncodedRecord:
    """Encode ``batch`` as one record: a single copy of its buffers into the record's bytes.

    With ``first_id`` the events are stored as ids ``first_id, first_id + 1, ...`` (ids the log
    assigned) instead of the batch's own. From then on the log holds its own copy, so the
    caller's buffers (say, a receive buffer that a protocol reuses) are free once ``encode``
    returns.
    """
    n = len(batch)
    if first_id is None:
        ids, first, last = batch.ids.cast("B"), batch.first_id, batch.last_id
    else:
        first, last = first_id, first_id + n - 1
        if first < 1 or last > MAX_ID:
            raise InvalidBatch(f"ids {first}..{last} are outside 1..2**63-1")
        ids = memoryview(id_range(first, n))
    attributes = 0
    body: list[memoryview] = [
        ids,
        batch.timestamps.cast("B"),
        batch.value_offsets.cast("B"),
    ]
    if batch.key_offsets is not None and batch.key_flags is not None and batch.keys is not None:
        attributes |= ATTR_KEYS
        body += [batch.key_offsets.cast("B"), batch.key_flags, batch.values, batch.keys]
    else:
        body.append(batch.values)
    body_size = 0
    for part in body:
        body_size += part.nbytes
    length = HEADER_SIZE + body_size
    length += -length % 8
    if length >= 2**32:
        raise ValueError("a record must be smaller than 4 GiB")
    data = bytearray(length)
    pos = HEADER_SIZE
    for part in body:
        end = pos + part.nbytes
        data[pos:end] = part
        pos = end
    view = memoryview(data)
    crc = crc32c(view[HEADER_SIZE:pos])
    max_ts = max_timestamp(batch.timestamps)
    HEADER.pack_into(data, 0, length, MAGIC, attributes, 0, n, body_size, first, last, max_ts,
                     crc, 0)  # fmt: skip
    struct.pack_into("<I", data, _CRC_SPAN, crc32c(view[:_CRC_SPAN]))
    header = RecordHeader(length, attributes, n, body_size, first, last, max_ts, crc)
    stored = decode_body(batch.stream, header, view.toreadonly(), 0, verify=False)
    return EncodedRecord(data, stored, length, n, first, last, max_ts)


def _merge_singles(items: Sequence[tuple[Batch, int | None]]) -> Batch:
    """:func:`merge` for one-event batches (many concurrent single appends): column by column."""
    batches = [b for b, _ in items]
    ids = array("Q", [b.ids[0] if f is None else f for b, f in items])
    if ids[0] < 1 or ids[-1] > MAX_ID:
        raise InvalidBatch("ids must be within 1..2**63-1")
    timestamps = array("q", [b.timestamps[0] for b in batches])
    values = [b.values for b in batches]
    value_offsets = array("I", accumulate([v.nbytes for v in values], initial=0))
    key_flags = key_offsets = keys = None
    if any(b.key_flags is not None for b in batches):
        flags = bytes([0 if b.key_flags is None else b.key_flags[0] for b in batches])
        parts = [
            b.keys if b.keys is not None and f else _EMPTY
            for b, f in zip(batches, flags, strict=True)
        ]
        key_flags = memoryview(flags)
        key_offsets = memoryview(array("I", accumulate([k.nbytes for k in parts], initial=0)))
        keys = memoryview(b"".join(parts))
    return Batch(items[0][0].stream, memoryview(ids), memoryview(timestamps),
                 memoryview(value_offsets), memoryview(b"".join(values)), key_flags,
                 key_offsets, keys)  # fmt: skip


_EMPTY = memoryview(b"")


def merge(items: Sequence[tuple[Batch, int | None]]) -> Batch:
    """One batch holding the events of several small batches of one stream, in order; a batch
    paired with a first id gets ids from it (log-assigned ids).

    Group commit uses it so that many small appends make one record, not one each. It rebases
    offsets event by event, so it is meant for small batches only.
    """
    if all(len(b) == 1 for b, _ in items):
        return _merge_singles(items)
    stream = items[0][0].stream
    ids = array("Q")
    timestamps = array("q")
    value_offsets = array("I", [0])
    values: list[memoryview] = []
    keyed = any(b.key_flags is not None for b, _ in items)
    key_flags = bytearray()
    key_offsets = array("I", [0])
    keys: list[memoryview] = []
    for batch, first_id in items:
        n = len(batch)
        if first_id is None:
            ids.frombytes(batch.ids.cast("B"))
        else:
            ids.extend(range(first_id, first_id + n))
        timestamps.frombytes(batch.timestamps.cast("B"))
        shift = value_offsets[-1] - batch.value_offsets[0]
        value_offsets.extend([o + shift for o in batch.value_offsets[1:]])
        values.append(batch.values)
        if keyed:
            if batch.key_flags is None or batch.key_offsets is None or batch.keys is None:
                key_flags += bytes(n)
                key_offsets.extend([key_offsets[-1]] * n)
            else:
                key_flags += batch.key_flags
                shift = key_offsets[-1] - batch.key_offsets[0]
                key_offsets.extend([o + shift for o in batch.key_offsets[1:]])
                keys.append(batch.keys)
    if ids[0] < 1 or ids[-1] > MAX_ID:
        raise InvalidBatch("ids must be within 1..2**63-1")
    return Batch(
        stream,
        memoryview(ids),
        memoryview(timestamps),
        memoryview(value_offsets),
        memoryview(b"".join(values)),
        memoryview(key_flags) if keyed else None,
        memoryview(key_offsets) if keyed else None,
        memoryview(b"".join(keys)) if keyed else None,
    )


class HeaderError(TidewireError, ValueError):
    """The 48 bytes are not a valid record header (the caller decides: torn tail or corruption)."""


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> RecordHeader:
    """Parse and check the header at ``buf[pos:pos + 48]``; raise :class:`HeaderError` if bad."""
    (length, magic, attributes, reserved, count, body_size, base_id, last_id, max_ts, body_crc,
     header_crc) = HEADER.unpack_from(buf, pos)  # fmt: skip
    checksum = _CHECKSUMS.get(magic, crc32c)  # (a later format would keep CRC-32C)
    if checksum(memoryview(buf)[pos : pos + _CRC_SPAN]) != header_crc:
        raise HeaderError("header CRC mismatch")
    if magic not in _CHECKSUMS:
        raise HeaderError(f"unknown record format {magic}")
    if reserved != 0 or attributes & ~ATTR_KEYS:
        raise HeaderError("reserved bits set")
    if count < 1 or base_id < 1 or last_id < base_id or last_id - base_id < count - 1:
        raise HeaderError(f"inconsistent ids: count {count}, ids {base_id}..{last_id}")
    needed = 20 * count + 4 + ((5 * count + 4) if attributes & ATTR_KEYS else 0)
    if body_size < needed or length != HEADER_SIZE + body_size + (-(HEADER_SIZE + body_size) % 8):
        raise HeaderError(f"inconsistent sizes: length {length}, body {body_size}")
    return RecordHeader(
        length, attributes, count, body_size, base_id, last_id, max_ts, body_crc, magic
    )


def decode_body(
    stream: str, header: RecordHeader, buf: memoryview, pos: int, *, verify: bool = True
) -> Batch:
    """The batch held by the record at ``buf[pos:]`` whose header is ``header``.

    ``buf`` must be a format-``B`` memoryview holding the whole record. Raises ``ValueError`` when
    the body CRC or the body's own offsets disagree with the header.
    """
    start = pos + HEADER_SIZE
    end = start + header.body_size
    body = buf[start:end]
    if verify and _CHECKSUMS[header.magic](body) != header.body_crc:
        raise ValueError("body CRC mismatch")
    n = header.count
    p = 0
    ids = body[p : p + 8 * n].cast("Q")
    p += 8 * n
    timestamps = body[p : p + 8 * n].cast("q")
    p += 8 * n
    value_offsets = body[p : p + 4 * (n + 1)].cast("I")
    p += 4 * (n + 1)
    key_flags = key_offsets = keys = None
    if header.attributes & ATTR_KEYS:
        key_offsets = body[p : p + 4 * (n + 1)].cast("I")
        p += 4 * (n + 1)
        key_flags = body[p : p + n]
        p += n
    values_size = value_offsets[n] - value_offsets[0]
    values = body[p : p + values_size]
    p += values_size
    if key_offsets is not None:
        keys_size = key_offsets[n] - key_offsets[0]
        keys = body[p : p + keys_size]
        p += keys_size
    if p != header.body_size or ids[0] != header.base_id or ids[n - 1] != header.last_id:
        raise ValueError("body layout disagrees with the header")
    return Batch(stream, ids, timestamps, value_offsets, values, key_flags, key_offsets, keys)


def max_timestamp_py(timestamps: memoryview) -> int:
    """The largest of ``timestamps`` (format ``q``; ``ValueError`` when empty)."""
    return max(timestamps)


def id_range_py(first: int, n: int) -> bytes:
    """The ids ``first .. first + n - 1`` as u64 bytes (a record's ids, as the log assigned
    them)."""
    return array("Q", range(first, first + n)).tobytes()


# The compiled kernels when they are built and not switched off (tidewire.native), else the
# pure functions above: ``encode`` spent 42 of its 54 us for 1000 events in these two loops.
max_timestamp = kernel("max_timestamp", max_timestamp_py)
id_range = kernel("id_range", id_range_py)
