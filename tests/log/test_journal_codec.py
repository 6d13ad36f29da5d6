"""The write-ahead journal's codec (tidewire.log.journal_codec): entries, the end-of-journal
scan over torn, garbled and recycled tails, and checkpoints."""

from __future__ import annotations

import struct
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.log.journal_codec import (
    ENTRY_HEADER_SIZE,
    Checkpoint,
    decode_checkpoint,
    encode_checkpoint,
    encode_entry_header,
    entry_size,
    parse_entry,
    place,
    scan,
)

EPOCH = 7


def entry(lsn: int, payload: bytes, *, directory: bytes = b"orders", epoch: int = EPOCH,
          synced: bool = False, position: int = 0) -> bytes:  # fmt: skip
    head = encode_entry_header(lsn, epoch, directory, 1, position, [payload], len(payload),
                               synced=synced)  # fmt: skip
    return head + (b"" if synced else payload)


def ring_of(entries: list[bytes], size: int, *, fill: bytes = b"\0") -> tuple[bytearray, int]:
    """A ring holding ``entries`` written one after the other (wrapping as the writer does),
    starting at offset 0; the ring and where the next entry would go."""
    ring = bytearray(fill * size)
    at = 0
    for data in entries:
        at = place(at, len(data), size)
        ring[at : at + len(data)] = data
        at += len(data)
    return ring, at


def test_an_entry_round_trips_with_its_exact_bytes() -> None:
    data = entry(5, b"record bytes", position=4096)
    assert len(data) == ENTRY_HEADER_SIZE + len(b"orders") + len(b"record bytes")
    assert len(data) == entry_size(b"orders", 12)
    size, crc = struct.unpack_from("<II", data)
    assert size == len(data)
    assert crc == zlib.crc32(data[8:])
    got = parse_entry(memoryview(data), 0, 5, EPOCH)
    assert got is not None
    assert (got.lsn, got.epoch, got.directory, got.base, got.position, got.extent) == (
        5, EPOCH, "orders", 1, 4096, 12,
    )  # fmt: skip
    assert bytes(got.payload) == b"record bytes"
    assert not got.synced


def test_a_synced_entry_carries_no_payload_but_its_extent() -> None:
    data = entry(1, b"x" * 1000, synced=True)
    assert len(data) == ENTRY_HEADER_SIZE + len(b"orders")
    got = parse_entry(memoryview(data), 0, 1, EPOCH)
    assert got is not None
    assert got.synced
    assert got.extent == 1000
    assert not got.payload


def test_the_wrong_lsn_or_epoch_is_the_end() -> None:
    data = memoryview(entry(5, b"abc"))
    assert parse_entry(data, 0, 5, EPOCH) is not None
    assert parse_entry(data, 0, 6, EPOCH) is None  # an entry of an earlier lap
    assert parse_entry(data, 0, 5, EPOCH + 1) is None  # of an earlier process


def test_scan_follows_the_ring_around_its_end() -> None:
    entries = [entry(i, bytes([i]) * 40) for i in range(1, 21)]  # 94 bytes each
    ring, _ = ring_of(entries, 1500)  # 15 fit: 16..20 overwrite 1..5 (and part of 6)
    # Start from the 7th (the oldest intact), as a checkpoint would.
    start = sum(len(e) for e in entries[:6])
    got = [e.lsn for e, _ in scan(memoryview(ring), start, 7, EPOCH)]
    assert got == list(range(7, 21))


def test_scan_stops_at_a_recycled_tail() -> None:
    """After a wrap, the bytes after the newest entry are an older lap's entries: intact, but
    with older LSNs, so they end the scan."""
    old = [entry(i, b"o" * 30) for i in range(1, 12)]
    ring, _ = ring_of(old, 1024)
    new = entry(12, b"n" * 30)
    ring[0 : len(new)] = new  # a wrap happened at lsn 12 (as if)
    got = [e.lsn for e, _ in scan(memoryview(ring), len(ring) - 10, 12, EPOCH)]
    assert got == [12]


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=120), min_size=1, max_size=40),
    ring_size=st.integers(1024, 4096),
    cut=st.integers(0, 10_000),
    garble=st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.integers(1, 255))),
)
def test_scan_returns_exactly_the_intact_prefix(
    payloads: list[bytes], ring_size: int, cut: int, garble: tuple[int, int] | None
) -> None:
    """Whatever happens to the bytes after some point (a torn write: zeros from ``cut`` on; a
    flipped byte), the scan returns the entries before it, in order, and never one after."""
    entries = [entry(i + 1, p) for i, p in enumerate(payloads)]
    total = sum(len(e) for e in entries)
    if total > ring_size:  # keep one lap: the whole history is checkable
        return
    ring, end = ring_of(entries, ring_size)
    before = bytes(ring)
    cut = min(cut, end)
    ring[cut:end] = bytes(end - cut)
    if garble is not None:
        at, bit = garble
        if at < cut:
            ring[at] ^= bit
    # the intact prefix ends at the first byte that changed: zeros written over bytes that were
    # zeros already (a payload ending in b"\0", cut just before it) damage nothing
    cut = next((i for i in range(end) if ring[i] != before[i]), end)
    got = [(e.lsn, bytes(e.payload)) for e, _ in scan(memoryview(ring), 0, 1, EPOCH)]
    whole: list[tuple[int, bytes]] = []
    pos = 0
    for i, data in enumerate(entries):
        if pos + len(data) > cut:
            break
        whole.append((i + 1, payloads[i]))
        pos += len(data)
    assert got == whole


@settings(max_examples=100, deadline=None)
@given(
    streams=st.dictionaries(
        st.text(min_size=1, max_size=30), st.tuples(st.integers(1, 2**63), st.integers(0, 2**40))
    ),
    seq=st.integers(0, 2**63),
    lsn=st.integers(0, 2**63),
    flip=st.integers(0, 10_000),
)
def test_checkpoints_round_trip_and_any_damage_is_seen(
    streams: dict[str, tuple[int, int]], seq: int, lsn: int, flip: int
) -> None:
    cp = Checkpoint(seq, 3, lsn, 4096, streams)
    data = encode_checkpoint(cp)
    assert decode_checkpoint(data + bytes(100)) == cp  # (trailing padding is ignored)
    damaged = bytearray(data)
    damaged[flip % len(data)] ^= 0x40
    assert decode_checkpoint(bytes(damaged)) is None
    assert decode_checkpoint(data[:-1]) is None
