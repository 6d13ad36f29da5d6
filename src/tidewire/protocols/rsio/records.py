"""RS.io ``format=records`` elements: a batch sent as one log record, without copying it.

A ``format=records`` element is one log record, byte for byte as docs/log.md ("Record batch")
lays it out and :func:`tidewire.record.encode` writes it::

    header (48 bytes: length, magic 2, attributes, count, body size, ids, max timestamp,
            body CRC-32C, header CRC-32C)
    body   ids | timestamps | value offsets | [key offsets | key flags] | values | [keys]
    zero padding to a multiple of 8

The body is the batch's own buffers back to back, in that order, so the hub need not build the
record to send it: :func:`record_parts` gives the header (the only bytes made here) followed by
views of the batch's buffers and the padding, for a writer with ``writelines`` (one
``writev``). The body CRC-32C is computed over those views in place (``crc32c`` chains over the
parts), so the bytes are those ``encode(batch).data`` would hold, for any batch: a whole record
read from a segment (then they are the stored bytes), a slice of one (offsets may start above
0), or a batch from memory. What it saves per record of 10,000 events of 100 B (1.3 MB): the
copy into a new ``bytearray`` (and its page faults), a second CRC pass over the copy and the
decoding of the copy (benchmarks/README.md, ``spark_read.py``, "Issue 22, round 3" of the
third session).
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from ...model import Batch
from ...record import ATTR_KEYS, HEADER, HEADER_SIZE, MAGIC, max_timestamp

__all__ = ["record_parts"]

_HEADER_CRC_AT = HEADER_SIZE - 4  # the header CRC covers bytes 0 .. 44
_PADDING = bytes(8)


def record_parts(batch: Batch) -> list[bytes | memoryview]:
    """The log record of ``batch`` as buffers to write back to back (the header, views of the
    batch's buffers, the padding if any); joined, they equal ``record.encode(batch).data``.

    The views keep the batch's buffers alive until written. Raises ``ValueError`` for a
    record of 4 GiB or more, as :func:`~tidewire.record.encode` does."""
    body: list[bytes | memoryview] = [
        batch.ids.cast("B"),
        batch.timestamps.cast("B"),
        batch.value_offsets.cast("B"),
    ]
    attributes = 0
    if batch.key_offsets is not None and batch.key_flags is not None and batch.keys is not None:
        attributes = ATTR_KEYS
        body += [batch.key_offsets.cast("B"), batch.key_flags, batch.values, batch.keys]
    else:
        body.append(batch.values)
    body_size = 0
    crc = 0
    for part in body:
        body_size += len(part)  # (format "B" views: len is nbytes)
        crc = crc32c(part, crc)
    length = HEADER_SIZE + body_size
    padding = -length % 8
    length += padding
    if length >= 2**32:
        raise ValueError("a record must be smaller than 4 GiB")
    header = bytearray(HEADER_SIZE)
    HEADER.pack_into(header, 0, length, MAGIC, attributes, 0, len(batch), body_size,
                     batch.first_id, batch.last_id, max_timestamp(batch.timestamps), crc,
                     0)  # fmt: skip
    struct.pack_into("<I", header, _HEADER_CRC_AT, crc32c(memoryview(header)[:_HEADER_CRC_AT]))
    if padding:
        body.append(_PADDING[:padding])
    return [bytes(header), *body]
