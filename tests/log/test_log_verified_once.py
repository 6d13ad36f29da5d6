"""A record's body CRC is checked at its first read in a process, not at every read (docs/log.md,
"Reads"; log/verified.py): the checked stretches of a segment, and what a read of a record that
was never checked (or that failed its check) still does."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tidewire.log import Log, LogConfig
from tidewire.log.verified import MAX_RUNS, VerifiedRuns
from tidewire.model import Batch, CorruptLogError

STREAM = "s"
NO_LIMIT = 2**63 - 1
RECORD_VALUES = 4
VALUE = 1000


def test_runs_grow_join_and_stay_few() -> None:
    runs = VerifiedRuns()
    assert not runs.covers(0, 10)
    runs.add(0, 10)
    runs.add(10, 25)  # extends the run that ends where it starts
    assert runs.runs == ((0, 25),)
    assert runs.covers(0, 25)
    assert runs.covers(10, 25)
    assert not runs.covers(20, 30)
    runs.add(40, 50)
    assert sorted(runs.runs) == [(0, 25), (40, 50)]
    runs.add(25, 40)  # fills the gap: one run
    assert runs.runs == ((0, 50),)
    for start in range(100, 100 + 20 * MAX_RUNS, 20):  # apart from each other
        runs.add(start, start + 10)
    assert len(runs.runs) == MAX_RUNS
    assert (0, 50) in runs.runs  # the longest are kept; the shortest are forgotten


def fill(directory: Path, records: int) -> list[bytes]:
    async def run() -> list[bytes]:
        log = Log.open(str(directory), LogConfig(recent_bytes=0))  # every read from the file
        values: list[bytes] = []
        for _ in range(records):
            batch = [os.urandom(VALUE) for _ in range(RECORD_VALUES)]
            await log.append(Batch.build(STREAM, batch), assign_ids=True)
            values += batch
        await log.close()
        return values

    return asyncio.run(run())


def segment_file(directory: Path) -> Path:
    (path,) = (directory / STREAM).glob("*.log")
    return path


def damage_value(directory: Path, value: bytes) -> int:
    """Flip a byte of ``value`` where the segment file holds it (the mapping sees it too);
    its offset in the file (:func:`flip` it back)."""
    at = segment_file(directory).read_bytes().index(value) + VALUE // 2
    flip(directory, at)
    return at


def flip(directory: Path, at: int) -> None:
    with open(segment_file(directory), "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0xFF]))


def values_read(log: Log, from_id: int = 1) -> list[bytes]:
    return [e.value for batch in log.read(STREAM, from_id, NO_LIMIT) for e in batch]


def test_a_record_read_once_is_not_checked_again_in_this_process(tmp_path: Path) -> None:
    values = fill(tmp_path, 3)
    log = Log.open(str(tmp_path), LogConfig(recent_bytes=0))
    try:
        assert values_read(log) == values  # every record checked, here
        damage_value(tmp_path, values[5])  # the second record, after its check
        again = values_read(log)  # **decision**: not checked again (the pages were checked)
        assert len(again) == len(values)
        assert again[5] != values[5]
    finally:
        log.close_sync()
    with pytest.raises(CorruptLogError, match="body CRC"):  # another process: at its open
        Log.open(str(tmp_path), LogConfig(recent_bytes=0))  # (the active segment's scan)


def test_a_record_not_read_yet_is_checked_and_a_bad_one_stays_bad(tmp_path: Path) -> None:
    values = fill(tmp_path, 3)
    log = Log.open(str(tmp_path), LogConfig(recent_bytes=0))
    try:
        first = log.read(STREAM, 1, 1)  # the first record only: checked
        assert [e.value for batch in first for e in batch] == values[:1]
        at = damage_value(tmp_path, values[-1])  # the third record, never read
        for _ in range(2):  # a failed check marks nothing: it fails every time
            with pytest.raises(CorruptLogError, match="body CRC"):
                log.read(STREAM, 1, NO_LIMIT)
        flip(tmp_path, at)  # (back: intact again)
        assert values_read(log) == values
    finally:
        log.close_sync()


def test_a_reader_starting_mid_segment_is_checked_from_there(tmp_path: Path) -> None:
    values = fill(tmp_path, 3)
    log = Log.open(str(tmp_path), LogConfig(recent_bytes=0))
    try:
        middle = 1 + RECORD_VALUES  # the second record's first id
        assert values_read(log, middle) == values[RECORD_VALUES:]  # records 2 and 3 checked
        damage_value(tmp_path, values[0])  # the first record: never read, so checked now
        with pytest.raises(CorruptLogError, match="body CRC"):
            log.read(STREAM, 1, NO_LIMIT)
        damage_value(tmp_path, values[-1])  # record 3, checked before: passes unchecked
        assert len(values_read(log, middle)) == len(values) - RECORD_VALUES
    finally:
        log.close_sync()
