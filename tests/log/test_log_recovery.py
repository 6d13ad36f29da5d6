"""Recovery of the durable log: torn tails, zero tails, corruption, read-only opens, the directory
lock and sealed-segment index files (tidewire.log.segment / stream / store)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import struct
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch, CorruptLogError, Event, LogClosedError
from tidewire.record import HEADER_SIZE, encode, parse_header

STREAM = "events"
CONFIG = LogConfig(defaults=StreamSettings(segment_bytes=4096, index_interval_bytes=64))
NO_LIMIT = 2**63 - 1
ENTRY = 24  # bytes per index entry (version 3: base id, position, ts_before)
COUNT = 15  # batches of 3 events: 11 records in the first segment, 4 in the active one


@dataclass(frozen=True)
class Rec:
    """Where one appended batch landed on disk."""

    path: str
    offset: int
    length: int
    first_id: int
    last_id: int

    @property
    def end(self) -> int:
        return self.offset + self.length


def make_batch(i: int) -> Batch:
    return Batch.build(
        STREAM,
        [f"event {i}.{j} ".encode() * (6 + j) for j in range(3)],
        keys=[None, b"", f"key-{i}".encode()],
        timestamps=[10 * i, 10 * i + 1, 10 * i + 2],
    )


def _where(directory: Path, stored: Batch) -> Rec:
    """The record just appended: at the end of the newest segment file."""
    path = max(str(p) for p in (directory / STREAM).glob("*.log"))
    length = encode(stored).length
    offset = os.path.getsize(path) - length
    return Rec(path, offset, length, stored.first_id, stored.last_id)


def build(directory: Path, count: int, config: LogConfig = CONFIG) -> tuple[list[Rec], list[Event]]:
    """Append ``count`` batches (assigned ids) and report where each record went."""

    async def go() -> tuple[list[Rec], list[Event]]:
        log = Log.open(str(directory), config)
        recs: list[Rec] = []
        events: list[Event] = []
        try:
            for i in range(count):
                stored = await log.append(make_batch(i), assign_ids=True)
                recs.append(_where(directory, stored))
                events.extend(stored)
        finally:
            await log.close()
        return recs, events

    return asyncio.run(go())


def read_all(log: Log, from_id: int = 1, max_bytes: int = NO_LIMIT) -> list[Event]:
    """Every event from ``from_id`` on, in reads of ``max_bytes``."""
    out: list[Event] = []
    while True:
        batches = log.read(STREAM, from_id, max_bytes)
        if not batches:
            return out
        for b in batches:
            out.extend(b)
        from_id = out[-1].id + 1


def append_one(log: Log, i: int) -> Batch:
    return asyncio.run(log.append(make_batch(i), assign_ids=True))


def log_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "tidewire.log" and r.levelno >= logging.WARNING
    ]


def flip(path: str, position: int, mask: int = 0x40) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ mask]))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(directory.rglob("*"))
    }


def body_size(rec: Rec) -> int:
    with open(rec.path, "rb") as f:
        f.seek(rec.offset)
        return parse_header(f.read(HEADER_SIZE)).body_size


@pytest.fixture
def warnings_caught(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="tidewire.log")
    return caplog


# --------------------------------------------------------------------------- layout sanity


def test_layout_used_by_these_tests(tmp_path: Path) -> None:
    recs, events = build(tmp_path, COUNT)
    paths = sorted({r.path for r in recs})
    assert len(paths) >= 2, "the tests below need a sealed and an active segment"
    assert [e.id for e in events] == list(range(1, 3 * COUNT + 1))
    for prev, rec in itertools.pairwise(recs):
        assert rec.first_id == prev.last_id + 1
        assert rec.offset == (prev.end if rec.path == prev.path else 0)
    for path in paths:
        assert os.path.getsize(path) == max(r.end for r in recs if r.path == path)
    assert sum(1 for r in recs if r.path == paths[-1]) >= 3


# --------------------------------------------------------------------------- torn tails


def _cut_points(length: int) -> list[int]:
    return [
        1,
        8,
        HEADER_SIZE - 1,
        HEADER_SIZE,
        HEADER_SIZE + 1,
        length // 2,
        length - 8,
        length - 1,
    ]


@pytest.mark.parametrize("cut_index", range(8))
def test_torn_tail_is_truncated_and_logged(
    tmp_path: Path, warnings_caught: pytest.LogCaptureFixture, cut_index: int
) -> None:
    recs, events = build(tmp_path, COUNT)
    last = recs[-1]
    cut = _cut_points(last.length)[cut_index]
    os.truncate(last.path, last.offset + cut)

    log = Log.open(str(tmp_path), CONFIG)
    try:
        warnings = log_warnings(warnings_caught)
        assert len(warnings) == 1, warnings
        assert last.path in warnings[0]
        assert f"byte offset {last.offset}" in warnings[0]
        assert "torn tail" in warnings[0]
        assert os.path.getsize(last.path) == last.offset
        assert log.latest(STREAM) == last.first_id - 1
        assert read_all(log) == events[:-3]
        assert read_all(log, max_bytes=300) == events[:-3]
        again = append_one(log, 99)
        assert again.first_id == last.first_id
        assert read_all(log, last.first_id) == list(again)
    finally:
        asyncio.run(log.close())

    warnings_caught.clear()
    log = Log.open(str(tmp_path), CONFIG)
    try:
        assert log_warnings(warnings_caught) == []
        assert read_all(log) == events[:-3] + list(again)
    finally:
        log.close_sync()


def test_clean_tail_is_left_alone(
    tmp_path: Path, warnings_caught: pytest.LogCaptureFixture
) -> None:
    recs, events = build(tmp_path, COUNT)
    before = snapshot(tmp_path)
    log = Log.open(str(tmp_path), CONFIG)
    try:
        assert log_warnings(warnings_caught) == []
        assert read_all(log) == events
        assert append_one(log, COUNT).first_id == recs[-1].last_id + 1
    finally:
        log.close_sync()
    assert snapshot(tmp_path).keys() == before.keys()


@pytest.mark.parametrize("which", ["first record of the log", "first record of a new segment"])
def test_torn_tail_that_empties_the_active_segment(
    tmp_path: Path, warnings_caught: pytest.LogCaptureFixture, which: str
) -> None:
    if which == "first record of the log":
        count = 1
    else:
        probe, _ = build(tmp_path / "probe", COUNT)
        count = next(i for i, r in enumerate(probe) if i and r.offset == 0) + 1
    recs, events = build(tmp_path / "data", count)
    last = recs[-1]
    assert last.offset == 0
    os.truncate(last.path, 20)

    log = Log.open(str(tmp_path / "data"), CONFIG)
    try:
        warnings = log_warnings(warnings_caught)
        assert len(warnings) == 1
        assert last.path in warnings[0]
        assert "byte offset 0" in warnings[0]
        assert os.path.getsize(last.path) == 0
        assert log.latest(STREAM) == last.first_id - 1
        assert read_all(log) == events[:-3]
        again = append_one(log, 7)
        assert again.first_id == last.first_id
        assert os.path.getsize(last.path) == encode(again).length  # it went to that segment
        assert read_all(log) == events[:-3] + list(again)
    finally:
        asyncio.run(log.close())


@pytest.mark.parametrize("zeros", [1, 7, HEADER_SIZE - 1, HEADER_SIZE, 4096, 10_000])
def test_zero_filled_tail_is_truncated(
    tmp_path: Path, warnings_caught: pytest.LogCaptureFixture, zeros: int
) -> None:
    recs, events = build(tmp_path, COUNT)
    last = recs[-1]
    with open(last.path, "ab") as f:
        f.write(bytes(zeros))

    log = Log.open(str(tmp_path), CONFIG)
    try:
        warnings = log_warnings(warnings_caught)
        assert len(warnings) == 1, warnings
        assert last.path in warnings[0]
        assert f"byte offset {last.end}" in warnings[0]
        assert os.path.getsize(last.path) == last.end
        assert read_all(log) == events
        assert append_one(log, 50).first_id == last.last_id + 1
    finally:
        asyncio.run(log.close())


def test_large_records_across_recovery_read_chunks(
    tmp_path: Path, warnings_caught: pytest.LogCaptureFixture
) -> None:
    """Records that straddle the 4 MiB chunks recovery reads in, then a torn tail."""
    config = LogConfig()  # one big active segment

    async def fill() -> list[tuple[int, int]]:
        log = Log.open(str(tmp_path), config)
        places = []
        try:
            for i in range(22):
                value = bytes([i]) * (290_000 + 1_013 * i)
                stored = await log.append(
                    Batch.build(STREAM, [value, b"tail"], timestamps=i), assign_ids=True
                )
                places.append((stored.first_id, encode(stored).length))
        finally:
            await log.close()
        return places

    places = asyncio.run(fill())
    path = str(tmp_path / STREAM / f"{1:020d}.log")
    size = os.path.getsize(path)
    assert size > 6 * 1024 * 1024
    last_offset = size - places[-1][1]
    os.truncate(path, size - 1000)

    log = Log.open(str(tmp_path), config)
    try:
        warnings = log_warnings(warnings_caught)
        assert len(warnings) == 1
        assert f"byte offset {last_offset}" in warnings[0]
        assert log.latest(STREAM) == places[-1][0] - 1
        got = read_all(log, max_bytes=100_000)
        assert len(got) == 2 * 21
        for i in range(21):
            assert got[2 * i].value == bytes([i]) * (290_000 + 1_013 * i)
            assert got[2 * i + 1].value == b"tail"
    finally:
        log.close_sync()


# --------------------------------------------------------------------------- corruption


def _position(rec: Rec, where: str) -> int:
    if where == "header":
        return rec.offset + 13  # inside body_size
    return rec.offset + HEADER_SIZE + body_size(rec) // 2


@pytest.mark.parametrize("where", ["header", "body"])
@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_flipped_byte_in_active_segment_fails_open(tmp_path: Path, where: str, which: str) -> None:
    recs, _ = build(tmp_path, COUNT)
    active = [r for r in recs if r.path == recs[-1].path]
    rec = {"first": active[0], "middle": active[len(active) // 2], "last": active[-1]}[which]
    flip(rec.path, _position(rec, where))
    before = snapshot(tmp_path)

    for _ in range(2):  # the failed open releases the directory lock: it fails the same way
        with pytest.raises(CorruptLogError) as info:
            Log.open(str(tmp_path), CONFIG)
        error = info.value
        assert error.path == rec.path
        assert error.offset == rec.offset
        assert rec.path in str(error)
        assert f"byte offset {rec.offset}" in str(error)
        assert ("header" if where == "header" else "body") in error.reason
    assert snapshot(tmp_path) == before, "a corrupt log must not be repaired or truncated"


@pytest.mark.parametrize("where", ["header", "body"])
def test_flipped_byte_in_sealed_segment_fails_read(
    tmp_path: Path, warnings_caught: pytest.LogCaptureFixture, where: str
) -> None:
    recs, events = build(tmp_path, COUNT)
    sealed = [r for r in recs if r.path == recs[0].path]
    k = len(sealed) // 2
    rec = sealed[k]
    flip(rec.path, _position(rec, where))

    log = Log.open(str(tmp_path), CONFIG)  # sealed segments are trusted until they are read
    try:
        assert log_warnings(warnings_caught) == []
        assert log.latest(STREAM) == recs[-1].last_id
        for from_id in (1, rec.first_id, rec.first_id + 1):
            with pytest.raises(CorruptLogError) as info:
                log.read(STREAM, from_id, NO_LIMIT)
            assert info.value.path == rec.path
            assert info.value.offset == rec.offset
            assert f"{rec.path} at byte offset {rec.offset}" in str(info.value)
        # Reads that do not touch the damaged record still work.
        first_events = log.read(STREAM, 1, NO_LIMIT, max_events=rec.first_id - 1)
        assert [e for b in first_events for e in b] == events[: rec.first_id - 1]
        after = sealed[k + 1].first_id
        assert read_all(log, after) == events[after - 1 :]
        # And appending goes on.
        assert append_one(log, 40).first_id == recs[-1].last_id + 1
    finally:
        asyncio.run(log.close())


def test_flipped_header_byte_in_sealed_segment_without_index_fails_open(tmp_path: Path) -> None:
    recs, _ = build(tmp_path, COUNT)
    rec = recs[2]
    assert rec.path == recs[0].path
    os.unlink(rec.path[: -len(".log")] + ".index")
    flip(rec.path, _position(rec, "header"))
    with pytest.raises(CorruptLogError) as info:
        Log.open(str(tmp_path), CONFIG)
    assert (info.value.path, info.value.offset) == (rec.path, rec.offset)


def test_ids_going_backwards_inside_a_segment_is_corruption(tmp_path: Path) -> None:
    recs, _ = build(tmp_path, COUNT)
    active = [r for r in recs if r.path == recs[-1].path]
    a, b = active[0], active[1]
    with open(a.path, "rb") as f:
        data = bytearray(f.read())
    # Replace record b with a copy of record a (valid CRCs, but its ids repeat a's).
    assert a.length == b.length
    data[b.offset : b.end] = data[a.offset : a.end]
    with open(a.path, "wb") as f:
        f.write(data)
    with pytest.raises(CorruptLogError) as info:
        Log.open(str(tmp_path), CONFIG)
    assert (info.value.path, info.value.offset) == (b.path, b.offset)
    assert "does not follow" in info.value.reason


# --------------------------------------------------------------------------- read-only


def test_read_only_open_does_not_modify_anything(
    tmp_path: Path, warnings_caught: pytest.LogCaptureFixture
) -> None:
    recs, events = build(tmp_path, COUNT)
    last = recs[-1]
    os.truncate(last.path, last.offset + 100)  # a torn tail
    sealed_index = recs[0].path[: -len(".log")] + ".index"
    os.unlink(sealed_index)  # and a missing index
    before = snapshot(tmp_path)

    async def use() -> None:
        log = Log.open(str(tmp_path), CONFIG, read_only=True)
        try:
            assert log.read_only
            assert log.latest(STREAM) == last.first_id - 1
            assert read_all(log) == events[:-3]
            assert read_all(log, 5, max_bytes=1) == events[4:-3]
            with pytest.raises(LogClosedError):
                await log.append(make_batch(1), assign_ids=True)
            with pytest.raises(LogClosedError):
                await log.append(Batch.build("new-stream", [b"x"]), assign_ids=True)
            assert log.streams() == [STREAM]
        finally:
            await log.close()

    asyncio.run(use())
    assert snapshot(tmp_path) == before
    warnings = log_warnings(warnings_caught)
    assert any(last.path in w and f"byte offset {last.offset}" in w for w in warnings), warnings

    # A writable open does repair: the snapshot above would have seen it.
    log = Log.open(str(tmp_path), CONFIG)
    log.close_sync()
    assert os.path.getsize(last.path) == last.offset


def test_read_only_open_needs_no_lock_and_no_directory(tmp_path: Path) -> None:
    _, events = build(tmp_path, 3)
    writer = Log.open(str(tmp_path), CONFIG)
    try:
        reader = Log.open(str(tmp_path), CONFIG, read_only=True)
        try:
            assert read_all(reader) == events
        finally:
            reader.close_sync()
    finally:
        writer.close_sync()
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError):
        Log.open(str(missing), CONFIG, read_only=True)
    assert not missing.exists()


# --------------------------------------------------------------------------- directory lock


def test_second_writable_open_fails(tmp_path: Path) -> None:
    _, events = build(tmp_path, 3)
    first = Log.open(str(tmp_path), CONFIG)
    try:
        for _ in range(2):  # a failed attempt must not release the holder's lock
            with pytest.raises(LogClosedError, match="in use"):
                Log.open(str(tmp_path), CONFIG)
        stored = append_one(first, 3)  # the holder is unaffected
        assert stored.first_id == 10
        code = textwrap.dedent(
            """
            import sys
            from tidewire.log import Log
            from tidewire.model import LogClosedError
            try:
                Log.open(sys.argv[1])
            except LogClosedError:
                sys.exit(3)
            sys.exit(0)
            """
        )
        child = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], timeout=60, capture_output=True
        )
        assert child.returncode == 3, child.stderr.decode()
    finally:
        asyncio.run(first.close())
    second = Log.open(str(tmp_path), CONFIG)  # free again once closed
    try:
        assert read_all(second) == [*events, *stored]
    finally:
        second.close_sync()


# --------------------------------------------------------------------------- sealed indexes


def _index_path(rec: Rec) -> str:
    return rec.path[: -len(".log")] + ".index"


def _damage_index(path: str, entries: int, how: str) -> None:
    """Damage the index file at ``path``, which holds ``entries`` entries of ENTRY bytes at its end
    (after a header that starts: magic u32, version u32, segment size u64, last id u64)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    assert data[:4] == b"TWIX"
    header = len(data) - ENTRY * entries
    assert header >= 40
    assert entries >= 3
    if how == "missing":
        os.unlink(path)
        return
    if how == "empty":
        data = bytearray()
    elif how == "truncated":
        data = data[: header + ENTRY * 2 + 5]
    elif how == "header only":
        data = data[:header]
    elif how == "garbage":
        data = bytearray(random.Random(7).randbytes(len(data)))
    elif how == "bad magic":
        data[0:4] = b"XXXX"
    elif how == "bad version":
        struct.pack_into("<I", data, 4, 99)
    elif how == "stale segment size":
        struct.pack_into("<Q", data, 8, struct.unpack_from("<Q", data, 8)[0] - 8)
    elif how == "first position not 0":
        struct.pack_into("<Q", data, header + 8, 8)
    elif how == "position past the end":
        size = struct.unpack_from("<Q", data, 8)[0]
        struct.pack_into("<Q", data, len(data) - ENTRY + 8, size + 64)
    elif how == "entry id flipped":
        # One flipped bit in the base id of the third entry: it becomes smaller, so a read from
        # the ids it now claims would start at the wrong record.
        at = header + ENTRY * 2
        assert data[at] & 0x02
        data[at] ^= 0x02
    elif how == "entry position flipped":
        at = header + ENTRY * 2 + 8
        data[at] ^= 0x08
    elif how == "header last id":
        struct.pack_into("<Q", data, 16, 5)
    elif how == "header events":
        data[32] ^= 0x01
    elif how == "extra entry":
        data += struct.pack("<QQq", 10**6, 0, 0)
    else:  # pragma: no cover
        raise AssertionError(how)
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize(
    "how",
    [
        "missing",
        "empty",
        "truncated",
        "header only",
        "garbage",
        "bad magic",
        "bad version",
        "stale segment size",
        "first position not 0",
        "position past the end",
        "entry id flipped",
        "entry position flipped",
        "header last id",
        "header events",
        "extra entry",
    ],
)
def test_damaged_index_of_sealed_segment_is_rebuilt(
    tmp_path: Path, warnings_caught: pytest.LogCaptureFixture, how: str
) -> None:
    recs, events = build(tmp_path, COUNT)
    sealed = [r for r in recs if r.path == recs[0].path]
    assert sealed[-1].path != recs[-1].path
    index = _index_path(sealed[0])
    _damage_index(index, len(sealed), how)  # every record is indexed (interval 64 bytes)

    log = Log.open(str(tmp_path), CONFIG)
    try:
        for warning in log_warnings(warnings_caught):  # at most a note that it is rebuilt
            assert index in warning
        stats = log.stream(STREAM).stats()
        assert (stats.events, stats.first_id, stats.latest_id) == (3 * COUNT, 1, 3 * COUNT)
        assert stats.segments == 2
        for from_id in range(1, 3 * COUNT + 3):
            got = [e for b in log.read(STREAM, from_id, NO_LIMIT) for e in b]
            assert got == events[from_id - 1 :], f"read from id {from_id}"
            one = [e for b in log.read(STREAM, from_id, 0, 1) for e in b]
            assert one == events[from_id - 1 : from_id]
        assert log.enforce_retention(0) == 0
    finally:
        log.close_sync()


@pytest.mark.parametrize("index", ["kept", "deleted"])
@pytest.mark.parametrize(
    "damage", ["cut inside the last header", "cut inside the last body", "zero tail"]
)
def test_sealed_segment_cut_short_is_corruption(tmp_path: Path, damage: str, index: str) -> None:
    """A sealed segment was complete and fsynced when it was sealed: a short one is corrupt,
    wherever it is cut (unlike the active segment's torn tail)."""
    recs, _ = build(tmp_path, COUNT)
    sealed = [r for r in recs if r.path == recs[0].path]
    last = sealed[-1]
    if index == "deleted":
        os.unlink(_index_path(last))
    if damage == "zero tail":
        with open(last.path, "ab") as f:
            f.write(bytes(100))
        where = last.end
    else:
        where = last.offset
        os.truncate(
            last.path, last.offset + (20 if damage == "cut inside the last header" else 100)
        )
    before = snapshot(tmp_path)

    with pytest.raises(CorruptLogError) as info:
        Log.open(str(tmp_path), CONFIG)
    assert (info.value.path, info.value.offset) == (last.path, where)
    assert snapshot(tmp_path) == before, "a sealed segment must never be truncated"
