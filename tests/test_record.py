"""The on-disk record format (tidewire.record): layout, round trip, and CRC checks."""

from __future__ import annotations

import struct
import zlib
from array import array

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from tidewire.model import MAX_ID, Batch, Event
from tidewire.record import (
    HEADER_SIZE,
    EncodedRecord,
    HeaderError,
    decode_body,
    encode,
    merge,
    parse_header,
)


def _bytes_of(record: EncodedRecord) -> bytes:
    data = bytes(record.data)
    assert len(data) == record.length
    return data


def _decode(data: bytes | bytearray, pos: int = 0, stream: str = "s") -> Batch:
    view = memoryview(data)
    return decode_body(stream, parse_header(view, pos), view, pos)


def _u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "little")


def _u64(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 8], "little")


def _with_header_field(data: bytes, fmt: str, at: int, value: int) -> bytes:
    """``data`` with one header field replaced and the header CRC recomputed (still 'valid')."""
    buf = bytearray(data)
    struct.pack_into(fmt, buf, at, value)
    checksum = zlib.crc32 if buf[4] == 1 else crc32c  # format 1 used zlib's CRC-32
    struct.pack_into("<I", buf, 44, checksum(bytes(buf[:44])))
    return bytes(buf)


# --------------------------------------------------------------------------- golden layout


def _le(value: int, size: int, signed: bool = False) -> bytes:
    return value.to_bytes(size, "little", signed=signed)


def test_golden_layout_with_keys() -> None:
    batch = Batch.build(
        "golden",
        [b"a", b"bc", b"def"],
        ids=[5, 6, 9],
        keys=[b"k", None, b""],
        timestamps=[1000, 3000, -2000],
    )
    data = _bytes_of(encode(batch))

    body = b"".join(
        [
            b"".join(_le(i, 8) for i in (5, 6, 9)),  # ids
            b"".join(_le(t, 8, signed=True) for t in (1000, 3000, -2000)),  # timestamps
            b"".join(_le(o, 4) for o in (0, 1, 3, 6)),  # value offsets
            b"".join(_le(o, 4) for o in (0, 1, 1, 1)),  # key offsets
            bytes([1, 0, 1]),  # key flags
            b"abcdef",  # values
            b"k",  # keys
        ]
    )
    assert len(body) == 90
    length = 48 + 90 + 6  # padded to a multiple of 8
    head = b"".join(
        [
            _le(length, 4),
            bytes([2]),  # magic: format 2 (CRC-32C)
            bytes([1]),  # attributes: keys
            _le(0, 2),  # reserved
            _le(3, 4),  # count
            _le(90, 4),  # body size
            _le(5, 8),  # base id
            _le(9, 8),  # last id
            _le(3000, 8, signed=True),  # max timestamp
            _le(crc32c(body), 4),
        ]
    )
    head += _le(crc32c(head), 4)
    expected = head + body + bytes(6)
    assert len(head) == HEADER_SIZE == 48
    assert data == expected

    header = parse_header(data)
    assert (header.length, header.attributes, header.count, header.body_size) == (144, 1, 3, 90)
    assert (header.base_id, header.last_id, header.max_timestamp) == (5, 9, 3000)
    assert header.body_crc == crc32c(body)


def test_golden_layout_without_keys() -> None:
    batch = Batch.build("golden", [b"hello", b"!"], ids=[1, 2], timestamps=[-7, -9])
    record = encode(batch)
    data = _bytes_of(record)
    body = (
        _le(1, 8)
        + _le(2, 8)
        + _le(-7, 8, signed=True)
        + _le(-9, 8, signed=True)
        + _le(0, 4)
        + _le(5, 4)
        + _le(6, 4)
        + b"hello!"
    )
    assert len(body) == 50
    assert data[48 : 48 + 50] == body
    assert data[98:] == bytes(6)
    assert _u32(data, 0) == 104 == record.length
    assert data[4:8] == b"\x02\x00\x00\x00"  # magic 2, no attributes, reserved 0
    assert _u32(data, 8) == 2
    assert _u32(data, 12) == 50
    assert (_u64(data, 16), _u64(data, 24)) == (1, 2)
    assert int.from_bytes(data[32:40], "little", signed=True) == -7
    assert _u32(data, 40) == crc32c(body)
    assert _u32(data, 44) == crc32c(data[:44])
    assert (record.count, record.base_id, record.last_id, record.max_timestamp) == (2, 1, 2, -7)


def test_crc32c_is_castagnoli() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720 B.4)


def test_format_1_records_with_zlib_checksums_are_still_read() -> None:
    """Format 1 is format 2's layout with zlib CRC-32 checksums (tidewire <= 0.1 wrote it)."""
    batch = Batch.build("s", [b"one", b"two"], ids=[3, 4], keys=[b"k", None], timestamps=5)
    v1 = bytearray(_bytes_of(encode(batch)))
    v1[4] = 1
    body = bytes(v1[48 : 48 + _u32(bytes(v1), 12)])
    struct.pack_into("<I", v1, 40, zlib.crc32(body))
    struct.pack_into("<I", v1, 44, zlib.crc32(bytes(v1[:44])))
    header = parse_header(v1)
    assert header.magic == 1
    assert decode_body("s", header, memoryview(bytes(v1)), 0) == batch
    v1[60] ^= 1  # a body byte: the zlib CRC catches it
    with pytest.raises(ValueError, match="body CRC mismatch"):
        decode_body("s", header, memoryview(bytes(v1)), 0)


def test_encoding_a_slice_keeps_its_offsets() -> None:
    """A sliced batch is written without rewriting its offsets (they start above zero)."""
    batch = Batch.build("s", [b"aa", b"bbb", b"c", b"dddd"], keys=[None, b"x", b"yy", None])
    part = batch.slice(1, 3)
    data = _bytes_of(encode(part))
    offsets_at = 48 + 16 * 2
    assert [_u32(data, offsets_at + 4 * i) for i in range(3)] == [2, 5, 6]
    assert [_u32(data, offsets_at + 12 + 4 * i) for i in range(3)] == [0, 1, 3]
    decoded = _decode(data)
    assert list(decoded) == list(part)
    assert decoded == part


# --------------------------------------------------------------------------- round trip


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    n = draw(st.integers(1, 12))
    ids = sorted(draw(st.sets(st.integers(1, MAX_ID), min_size=n, max_size=n)))
    values = draw(st.lists(st.binary(max_size=50), min_size=n, max_size=n))
    keys: list[bytes | None] | None = None
    if draw(st.booleans()):
        keys = draw(st.lists(st.none() | st.binary(max_size=12), min_size=n, max_size=n))
    timestamps = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n))
    batch = Batch.build("rt", values, ids=ids, keys=keys, timestamps=timestamps)
    if n > 1 and draw(st.booleans()):
        start = draw(st.integers(0, n - 1))
        stop = draw(st.integers(start + 1, n))
        batch = batch.slice(start, stop)
    return batch


@given(batches(), st.integers(0, 3))
def test_round_trip(batch: Batch, filler_records: int) -> None:
    record = encode(batch)
    data = _bytes_of(record)
    assert record.length % 8 == 0
    assert record.count == len(batch)
    assert (record.base_id, record.last_id) == (batch.first_id, batch.last_id)
    assert record.max_timestamp == max(batch.timestamps)

    header = parse_header(data)
    assert header.length == len(data)
    assert header.count == len(batch)
    assert header.attributes == (1 if batch.has_keys else 0)
    assert data[48 + header.body_size :] == bytes(len(data) - 48 - header.body_size)

    decoded = _decode(data, stream="rt")
    assert decoded == batch
    assert list(decoded) == list(batch)
    # Zero copy: the decoded columns are views of the buffer that was decoded.
    assert decoded.values.obj is decoded.ids.obj

    # The same record at an (8-aligned) offset inside a larger buffer.
    other = _bytes_of(encode(Batch.build("x", [b"filler"], timestamps=0)))
    combined = other * filler_records + data + other
    pos = len(other) * filler_records
    assert list(_decode(combined, pos, stream="rt")) == list(batch)


def test_decoded_events_are_byte_exact() -> None:
    events = [
        Event("s", 10, b"\x00" * 7, b"", 0),
        Event("s", 11, b"", None, -1),
        Event("s", 20, bytes(range(256)), b"\xff", 2**63 - 1),
    ]
    decoded = _decode(_bytes_of(encode(Batch.from_events(events))))
    assert list(decoded) == events


def test_encode_makes_the_logs_own_copy() -> None:
    """The stored batch is a view of the record's bytes: the caller may reuse its buffers."""
    receive_buffer = bytearray(b"abcdefg")
    keys_buffer = bytearray(b"k")
    batch = Batch(
        "s",
        memoryview(array("Q", [4, 5])),
        memoryview(array("q", [1, 2])),
        memoryview(array("I", [0, 3, 7])),
        memoryview(receive_buffer),
        memoryview(b"\x01\x00"),
        memoryview(array("I", [0, 1, 1])),
        memoryview(keys_buffer),
    )
    expected = list(batch)
    record = encode(batch)
    assert list(record.batch) == expected
    assert record.batch.values.obj is record.data
    assert record.batch.ids.obj is record.data
    receive_buffer[:] = b"XXXXXXX"
    keys_buffer[:] = b"Y"
    assert list(record.batch) == expected
    assert list(_decode(_bytes_of(record))) == expected


# --------------------------------------------------------------------------- flipped bytes


def _record_without_padding(keys: bool) -> bytes:
    if keys:
        # body: 25 * 2 + 8 + values 3 + keys 3 = 64
        batch = Batch.build("s", [b"ab", b"c"], ids=[7, 9], keys=[b"xyz", None], timestamps=[1, 2])
    else:
        # body: 20 + 4 + 8 = 32
        batch = Batch.build("s", [b"8 bytes!"], ids=[3], timestamps=[42])
    data = _bytes_of(encode(batch))
    assert parse_header(data).body_size == len(data) - HEADER_SIZE  # no padding at all
    return data


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_flipped_byte_is_caught(keys: bool, mask: int) -> None:
    data = _record_without_padding(keys)
    assert len(_decode(data)) in (1, 2)
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= mask
        if position < HEADER_SIZE:
            with pytest.raises(HeaderError, match="header CRC mismatch"):
                parse_header(memoryview(damaged))
        else:
            header = parse_header(memoryview(damaged))  # the header is intact
            with pytest.raises(ValueError, match="body CRC mismatch"):
                decode_body("s", header, memoryview(damaged), 0)


def test_flipped_bytes_in_a_padded_record_are_caught_in_header_and_body() -> None:
    batch = Batch.build("s", [b"a", b"bc", b"def"], keys=[b"k", None, b""], timestamps=0)
    data = _bytes_of(encode(batch))
    body_end = HEADER_SIZE + parse_header(data).body_size
    assert body_end < len(data)  # this record is padded
    for position in range(body_end):  # the padding carries no data and has no CRC
        damaged = bytearray(data)
        damaged[position] ^= 0x10
        with pytest.raises(ValueError, match="CRC mismatch"):
            _decode(damaged)


# --------------------------------------------------------------------------- header checks


def _small() -> bytes:
    return _bytes_of(encode(Batch.build("s", [b"ab", b"cd"], ids=[10, 12], timestamps=0)))


@pytest.mark.parametrize(
    ("fmt", "at", "value", "message"),
    [
        ("<B", 4, 3, "unknown record format 3"),  # magic
        ("<B", 4, 0, "unknown record format 0"),
        ("<B", 5, 0x02, "reserved bits"),  # unknown attribute
        ("<H", 6, 1, "reserved bits"),  # reserved field
        ("<I", 8, 0, "inconsistent ids"),  # count 0
        ("<I", 8, 4, "inconsistent ids"),  # 4 events cannot fit in ids 10..12
        ("<Q", 16, 0, "inconsistent ids"),  # base id 0
        ("<Q", 16, 13, "inconsistent ids"),  # base id after last id
        ("<I", 12, 20 * 2 + 3, "inconsistent sizes"),  # body too small for 2 events
        ("<I", 0, 56, "inconsistent sizes"),  # length disagrees with body size
        ("<I", 0, 2**31, "inconsistent sizes"),
    ],
)
def test_header_consistency_checks(fmt: str, at: int, value: int, message: str) -> None:
    damaged = _with_header_field(_small(), fmt, at, value)
    with pytest.raises(HeaderError, match=message):
        parse_header(damaged)


def test_keys_attribute_without_room_for_keys_is_rejected() -> None:
    data = _small()
    assert parse_header(data).body_size == 2 * 20 + 4 + 4  # no room for key columns
    with pytest.raises(HeaderError, match="inconsistent sizes"):
        parse_header(_with_header_field(data, "<B", 5, 1))


@pytest.mark.parametrize(("at", "value"), [(16, 9), (24, 13), (16, 11)])
def test_body_disagreeing_with_a_valid_header_is_rejected(at: int, value: int) -> None:
    """Header ids that are self-consistent and CRC-valid but do not match the body's ids."""
    damaged = _with_header_field(_small(), "<Q", at, value)
    header = parse_header(damaged)
    with pytest.raises(ValueError, match="body layout disagrees"):
        decode_body("s", header, memoryview(damaged), 0)


def test_parse_header_at_offset() -> None:
    a = _small()
    b = _bytes_of(encode(Batch.build("s", [b"x"], ids=[99], timestamps=5)))
    header = parse_header(a + b, len(a))
    assert (header.base_id, header.count, header.max_timestamp) == (99, 1, 5)
    with pytest.raises(HeaderError):
        parse_header(a + b, 8)  # not a record boundary


def test_merge_keeps_every_event_and_assigns_ids() -> None:
    """Small batches committed together share one record: keyed and unkeyed batches, given
    and log-assigned ids, offsets that start above zero (a slice)."""
    plain = Batch.build("m", [b"a", b"bb"], ids=[3, 4], timestamps=10)
    keyed = Batch.build("m", [b"ccc", b"", b"d"], keys=[b"k", None, b""], timestamps=20)
    sliced = Batch.build("m", [b"x", b"yy", b"zzz"], keys=[b"1", b"22", b"333"]).slice(1, 3)
    merged = merge([(plain, None), (keyed, 5), (sliced, 8)])
    merged.validate()
    assert [(e.id, e.key, e.value) for e in merged] == [
        (3, None, b"a"),
        (4, None, b"bb"),
        (5, b"k", b"ccc"),
        (6, None, b""),
        (7, b"", b"d"),
        (8, b"22", b"yy"),
        (9, b"333", b"zzz"),
    ]
    assert list(merged.timestamps[:5]) == [10, 10, 20, 20, 20]
    record = encode(merged)
    stored = decode_body("m", parse_header(record.data), memoryview(bytes(record.data)), 0)
    assert stored == merged


def test_encode_with_first_id_renumbers_without_touching_the_batch() -> None:
    batch = Batch.build("m", [b"a", b"b"], ids=[1, 2])
    record = encode(batch, 41)
    assert [e.id for e in record.batch] == [41, 42]
    assert (record.base_id, record.last_id) == (41, 42)
    assert [e.id for e in batch] == [1, 2]


def test_merge_of_single_event_batches() -> None:
    """The column-wise path for many one-event appends: keys absent, empty and present, given
    and assigned ids, and a one-event slice of a larger batch."""
    wide = Batch.build("m", [b"p", b"qq", b"rrr"], keys=[b"a", b"bb", b"ccc"], timestamps=5)
    items: list[tuple[Batch, int | None]] = [
        (Batch.build("m", [b"one"], ids=[7], timestamps=1), None),
        (Batch.build("m", [b""], keys=[b""], timestamps=2), 8),
        (wide.slice(1, 2), 9),
        (Batch.build("m", [b"four"], keys=[None], timestamps=4), 10),
    ]
    merged = merge(items)
    merged.validate()
    assert [(e.id, e.key, e.value, e.timestamp) for e in merged] == [
        (7, None, b"one", 1),
        (8, b"", b"", 2),
        (9, b"bb", b"qq", 5),
        (10, None, b"four", 4),
    ]
    plain = merge([(Batch.build("m", [b"x"], timestamps=0), i) for i in (1, 2, 3)])
    assert plain.key_flags is None
    assert [e.id for e in plain] == [1, 2, 3]
