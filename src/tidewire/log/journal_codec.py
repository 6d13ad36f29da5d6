"""The write-ahead journal's bytes, without I/O: entries, the end-of-journal scan, checkpoints.

The journal (:mod:`tidewire.log.journal`) is one preallocated file overwritten in place as a
ring. Each group commit of a stream adds one *entry*: the bytes the group wrote to its segment,
with where they went. All integers are little-endian (docs/log.md, "Write-ahead journal")::

    length u32 | crc u32 | lsn u64 | epoch u32 | flags u16 | dir_len u16
    | base u64 | position u64 | extent u64 | stream directory (dir_len bytes) | payload

``length`` is the whole entry; ``crc`` is zlib's CRC-32 of bytes 8..length. ``base`` names the
segment (the id it starts at), ``position`` the byte offset the group was written at, ``extent``
how many bytes it wrote. The payload is those bytes, exactly as written to the segment, unless
``flags`` has :data:`FLAG_SYNCED`: then the writer fsynced the segment itself (a group too big
for the journal) and the entry carries no payload, only the extent.

Entries follow each other; an entry that would not fit before the end of the ring starts at
offset 0 instead. The *end of the journal* is the first place where the entry expected next
(LSN previous + 1, the checkpoint's epoch) is neither at the current offset nor at offset 0:
a torn write, zeros, or an entry of an earlier lap or an earlier process (older LSN or epoch).

A checkpoint says from where to replay::

    magic b"TWJ1" | length u32 | epoch u32 | count u32 | seq u64 | lsn u64 | position u64
    | count x (base u64, size u64, dir_len u16, stream directory) | crc u32

``length`` is the whole checkpoint (what follows it in its file is ignored), ``seq`` counts
checkpoints (the valid one with the highest wins), ``lsn`` is the last entry whose bytes are
durable in their segments, ``position`` the offset of the entry after it; each stream's active
segment (``base``) held at least ``size`` durable bytes when the checkpoint was taken. ``crc``
is zlib's CRC-32 of the ``length - 4`` bytes before it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "ENTRY_HEADER_SIZE",
    "FLAG_SYNCED",
    "Checkpoint",
    "Entry",
    "decode_checkpoint",
    "encode_checkpoint",
    "encode_entry_header",
    "entry_size",
    "parse_entry",
    "place",
    "scan",
]

_ENTRY = struct.Struct("<IIQIHHQQQ")
ENTRY_HEADER_SIZE = _ENTRY.size  # 48
FLAG_SYNCED = 1
"""The entry carries no payload: its bytes were fsynced in their segment before it was written."""
_CKPT_HEAD = struct.Struct("<4sIIIQQQ")
_CKPT_STREAM = struct.Struct("<QQH")
_CKPT_MAGIC = b"TWJ1"
_CRC = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class Entry:
    """One decoded entry; ``payload`` is a view into the scanned buffer (empty when synced)."""

    lsn: int
    epoch: int
    flags: int
    directory: str
    base: int
    position: int
    extent: int
    payload: memoryview

    @property
    def synced(self) -> bool:
        return bool(self.flags & FLAG_SYNCED)


def entry_size(directory: bytes, payload_bytes: int) -> int:
    """Bytes an entry takes in the ring (``payload_bytes`` 0 for a synced entry)."""
    return ENTRY_HEADER_SIZE + len(directory) + payload_bytes


def encode_entry_header(
    lsn: int,
    epoch: int,
    directory: bytes,
    base: int,
    position: int,
    payload: Sequence[bytes | bytearray | memoryview],
    extent: int,
    *,
    synced: bool = False,
) -> bytes:
    """The header and directory of an entry whose payload is ``payload`` (the segment's bytes,
    as written; empty if ``synced``), so that the caller writes them without joining them."""
    size = entry_size(directory, 0 if synced else extent)
    head = bytearray(_ENTRY.pack(size, 0, lsn, epoch, FLAG_SYNCED if synced else 0,
                                 len(directory), base, position, extent))  # fmt: skip
    head += directory
    crc = zlib.crc32(memoryview(head)[8:])
    if not synced:
        for part in payload:
            crc = zlib.crc32(part, crc)
    _CRC.pack_into(head, 4, crc)
    return bytes(head)


def parse_entry(buf: memoryview, at: int, lsn: int, epoch: int) -> Entry | None:
    """The entry at ``buf[at:]`` if it is whole, intact and the one expected (``lsn``,
    ``epoch``); else ``None`` (see the module: that is the end of the journal there)."""
    if len(buf) - at < ENTRY_HEADER_SIZE:
        return None
    size, crc, got_lsn, got_epoch, flags, dir_len, base, position, extent = _ENTRY.unpack_from(
        buf, at
    )
    if got_lsn != lsn or got_epoch != epoch or size > len(buf) - at:
        return None
    payload_bytes = 0 if flags & FLAG_SYNCED else extent
    if size != ENTRY_HEADER_SIZE + dir_len + payload_bytes:
        return None
    if zlib.crc32(buf[at + 8 : at + size]) != crc:
        return None
    start = at + ENTRY_HEADER_SIZE
    try:
        directory = bytes(buf[start : start + dir_len]).decode()
    except UnicodeDecodeError:
        return None
    payload = buf[start + dir_len : at + size]
    return Entry(lsn, epoch, flags, directory, base, position, extent, payload)


def place(offset: int, size: int, ring: int) -> int:
    """Where an entry of ``size`` bytes goes when the previous one ended at ``offset``: there,
    or at 0 if it would not fit before the end of a ``ring``-byte journal."""
    return offset if offset + size <= ring else 0


def scan(buf: memoryview, offset: int, lsn: int, epoch: int) -> Iterator[tuple[Entry, int]]:
    """The entries from ``offset`` on, expecting LSN ``lsn`` first, each with the offset just
    after it; stops at the end of the journal. ``buf`` is the whole ring."""
    while True:
        entry = parse_entry(buf, offset, lsn, epoch) if offset < len(buf) else None
        if entry is None and offset != 0:
            offset = 0  # the writer wrapped: an entry that did not fit starts at 0
            entry = parse_entry(buf, 0, lsn, epoch)
        if entry is None:
            return
        offset += entry_size(entry.directory.encode(), len(entry.payload))
        yield entry, offset
        lsn += 1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a checkpoint says (see the module)."""

    seq: int
    epoch: int
    lsn: int
    position: int
    streams: dict[str, tuple[int, int]]  # stream directory -> (active segment base, size)


def encode_checkpoint(cp: Checkpoint) -> bytes:
    out = bytearray(_CKPT_HEAD.size)
    for directory, (base, size) in sorted(cp.streams.items()):
        raw = directory.encode()
        out += _CKPT_STREAM.pack(base, size, len(raw))
        out += raw
    _CKPT_HEAD.pack_into(out, 0, _CKPT_MAGIC, len(out) + _CRC.size, cp.epoch, len(cp.streams),
                         cp.seq, cp.lsn, cp.position)  # fmt: skip
    out += _CRC.pack(zlib.crc32(out))
    return bytes(out)


def decode_checkpoint(data: bytes) -> Checkpoint | None:
    """The checkpoint at the start of ``data``, or ``None`` if it is not a whole, intact one."""
    if len(data) < _CKPT_HEAD.size + _CRC.size:
        return None
    magic, length, epoch, count, seq, lsn, position = _CKPT_HEAD.unpack_from(data)
    if magic != _CKPT_MAGIC or not _CKPT_HEAD.size + _CRC.size <= length <= len(data):
        return None
    (crc,) = _CRC.unpack_from(data, length - _CRC.size)
    if zlib.crc32(memoryview(data)[: length - _CRC.size]) != crc:
        return None
    streams: dict[str, tuple[int, int]] = {}
    at = _CKPT_HEAD.size
    try:
        for _ in range(count):
            base, size, n = _CKPT_STREAM.unpack_from(data, at)
            at += _CKPT_STREAM.size
            streams[data[at : at + n].decode()] = (base, size)
            at += n
    except (struct.error, UnicodeDecodeError):
        return None
    if at != length - _CRC.size:
        return None
    return Checkpoint(seq, epoch, lsn, position, streams)
