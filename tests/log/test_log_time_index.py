"""The time index (issue 23, docs/log.md "Time index"): ``Log.find_time(stream, ms)`` is the
first id whose timestamp is >= ms, checked against a brute force over random, non-monotonic
timestamps in small segments; live, after a writable and a read-only reopen, with the index
files deleted, damaged or of the previous version (2), after a torn tail and under retention."""

from __future__ import annotations

import asyncio
import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.log.timeindex import INDEX_HEADER, index_crc
from tidewire.model import Batch

STREAM = "ticks"
SMALL = StreamSettings(segment_bytes=4096, index_interval_bytes=200)
Pairs = list[tuple[int, int]]  # (id, timestamp) of every event, in id order

# A batch's timestamps: mostly close together (so that equal and neighbouring values meet),
# sometimes anywhere in the i64 range (the index's extremes).
TIMESTAMPS = st.one_of(
    st.integers(-50, 400),
    st.sampled_from([-(2**63), -(2**63) + 1, 2**63 - 2, 2**63 - 1]),
)
BATCHES = st.lists(st.lists(TIMESTAMPS, min_size=1, max_size=12), min_size=1, max_size=60)


def expected(pairs: Pairs, ms: int) -> int | None:
    return next((i for i, ts in pairs if ts >= ms), None)


def probes(pairs: Pairs) -> list[int]:
    """Every timestamp present, one either side, and the extremes."""
    near = {t + d for _, t in pairs for d in (-1, 0, 1)} | {-(2**63), 2**63 - 1}
    return sorted(t for t in near if -(2**63) <= t < 2**63)


def check(log: Log, pairs: Pairs) -> None:
    for ms in probes(pairs):
        assert log.find_time(STREAM, ms) == expected(pairs, ms), f"find_time({ms})"


def write(directory: str, batches: list[list[int]], config: LogConfig) -> Pairs:
    """Append one batch per list of timestamps (ids assigned); the (id, timestamp) pairs."""

    async def go() -> Pairs:
        log = Log.open(directory, config)
        pairs: Pairs = []
        try:
            for stamps in batches:
                values = [b"v%d" % n * (1 + n % 7) for n in range(len(stamps))]
                stored = await log.append(Batch.build(STREAM, values, timestamps=stamps),
                                          assign_ids=True)  # fmt: skip
                pairs += zip(stored.ids, stored.timestamps, strict=True)
            check(log, pairs)  # live: the active segment's index in memory
        finally:
            await log.close()
        return pairs

    return asyncio.run(go())


def reopened(directory: str, config: LogConfig, pairs: Pairs, *, read_only: bool) -> None:
    log = Log.open(directory, config, read_only=read_only)
    try:
        check(log, pairs)
    finally:
        log.close_sync()


def index_files(directory: str) -> list[Path]:
    return sorted((Path(directory) / STREAM).glob("*.index"))


def as_version_2(path: Path) -> None:
    """Rewrite a version 3 index file as version 2 wrote it (entries without ts_before)."""
    data = path.read_bytes()
    entries = memoryview(data)[INDEX_HEADER.size :].cast("Q")
    kept = [v for i, v in enumerate(entries) if i % 3 != 2]
    out = bytearray(data[: INDEX_HEADER.size]) + struct.pack(f"<{len(kept)}Q", *kept)
    struct.pack_into("<I", out, 4, 2)
    struct.pack_into("<I", out, 40, 0)
    struct.pack_into("<I", out, 40, index_crc(out))
    path.write_bytes(bytes(out))


def flip_ts(path: Path) -> None:
    """Damage the last entry's ts_before (the CRC then fails)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(bytes(data))


DAMAGES: dict[str, Callable[[Path], None]] = {
    "deleted": lambda p: p.unlink(),
    "version 2": as_version_2,
    "ts flipped": flip_ts,
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=BATCHES, interval=st.sampled_from([1, 64, 200, 4096]))
def test_find_time_is_the_first_id_at_or_after_the_time(batches: list[list[int]],
                                                         interval: int) -> None:  # fmt: skip
    config = LogConfig(fsync=False, defaults=StreamSettings(segment_bytes=4096,
                                                            index_interval_bytes=interval))
    with tempfile.TemporaryDirectory() as directory:
        pairs = write(directory, batches, config)
        reopened(directory, config, pairs, read_only=False)
        reopened(directory, config, pairs, read_only=True)
        for path in index_files(directory)[::2]:
            as_version_2(path)
        for path in index_files(directory)[1::2]:
            path.unlink()
        reopened(directory, config, pairs, read_only=True)
        reopened(directory, config, pairs, read_only=False)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_sealed_index_deleted_damaged_or_of_version_2_answers_the_same(
    tmp_path: Path, damage: str
) -> None:
    config = LogConfig(fsync=False, defaults=SMALL)
    stamps = [[(i * 37 + j * 11) % 97 - 10 for j in range(5)] for i in range(120)]
    pairs = write(str(tmp_path), stamps, config)
    files = index_files(str(tmp_path))
    assert len(files) >= 3  # several sealed segments
    for path in files:
        DAMAGES[damage](path)
    reopened(str(tmp_path), config, pairs, read_only=True)
    reopened(str(tmp_path), config, pairs, read_only=False)


def test_no_event_that_new_is_none_and_an_absent_stream_too(tmp_path: Path) -> None:
    config = LogConfig(fsync=False, defaults=SMALL)
    pairs = write(str(tmp_path), [[5, 3, 9], [1]], config)
    log = Log.open(str(tmp_path), config, read_only=True)
    try:
        assert log.find_time(STREAM, 10) is None
        assert log.find_time(STREAM, 9) == 3  # the third event, though the fourth is older
        assert log.find_time(STREAM, 4) == 1
        assert log.find_time("absent", 0) is None
        assert [log.find_time(STREAM, t) for t in (2, 1, -(2**63))] == [1, 1, 1]
        check(log, pairs)
    finally:
        log.close_sync()


def test_a_torn_tail_is_not_found_and_recovery_keeps_the_index(tmp_path: Path) -> None:
    config = LogConfig(fsync=False, defaults=SMALL)
    stamps = [[i, i + 1000] for i in range(100)]
    pairs = write(str(tmp_path), stamps, config)
    active = max((tmp_path / STREAM).glob("*.log"))
    with open(active, "ab") as f:  # half a record header: what a crash mid-write leaves
        f.write(b"\x40\x00\x00\x00\x02" + b"\x00" * 20)
    reopened(str(tmp_path), config, pairs, read_only=True)  # (the tail is ignored)
    reopened(str(tmp_path), config, pairs, read_only=False)  # (the tail is cut)
    assert os.path.getsize(active) % 8 == 0


def test_retention_drops_what_it_removes_from_the_answers(tmp_path: Path) -> None:
    settings_ = StreamSettings(segment_bytes=4096, index_interval_bytes=200,
                               retention_bytes=3 * 4096)  # fmt: skip
    config = LogConfig(fsync=False, defaults=settings_)
    stamps = [[(i * 53 + j) % 211 for j in range(4)] for i in range(200)]
    pairs = write(str(tmp_path), stamps, config)
    log = Log.open(str(tmp_path), config)
    try:
        check(log, pairs)  # (the maxima of the segments are cached now)
        assert log.enforce_retention(0) > 0
        start = log.start_id(STREAM)
        assert start > 1
        kept = [(i, t) for i, t in pairs if i >= start]
        check(log, kept)
        assert all(log.find_time(STREAM, t) != i for i, t in pairs if i < start)
    finally:
        log.close_sync()
    reopened(str(tmp_path), config, kept, read_only=True)
