"""Recovery from the write-ahead journal (issue 22): what a crash leaves is emulated by copying
the data directory of a running log (its files hold what the page cache held: a process crash),
then, for a power loss, cutting or garbling the segments past what the checkpoint made durable.
Replay must give back every acknowledged event, once, whatever was lost."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers import run
from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.log.journal import CHECKPOINT_FILES, JOURNAL_DIR
from tidewire.log.journal_codec import Checkpoint, decode_checkpoint
from tidewire.log.journal_replay import recover
from tidewire.log.stream import directory_name
from tidewire.model import Batch, LogClosedError

NO_CHECKPOINT = 3600.0  # (seconds) only the ring's own need checkpoints during a test
SMALL = LogConfig(defaults=StreamSettings(segment_bytes=4096, index_interval_bytes=512),
                  checkpoint_interval_s=NO_CHECKPOINT)  # fmt: skip


def checkpoint_of(directory: Path) -> Checkpoint:
    files = [directory / JOURNAL_DIR / name for name in CHECKPOINT_FILES]
    found = [decode_checkpoint(path.read_bytes()) for path in files]
    return max((c for c in found if c is not None), key=lambda c: c.seq)


def segments(directory: Path, stream: str) -> list[Path]:
    return sorted((directory / directory_name(stream)).glob("*.log"))


def power_loss(directory: Path, *, garble: bool = False) -> int:
    """Lose what no fsync made durable: each active segment past its checkpointed size (all of
    it if the checkpoint names an older segment) is cut off, or overwritten with garbage."""
    cp = checkpoint_of(directory)
    lost = 0
    for name in os.listdir(directory):
        if name.startswith("."):
            continue
        logs = sorted((directory / name).glob("*.log"))
        base, size = cp.streams.get(name, (0, 0))
        active = logs[-1]
        keep = size if int(active.name[:-4]) == base else 0
        length = active.stat().st_size
        lost += length - keep
        if garble:
            with open(active, "r+b") as f:
                f.seek(keep)
                f.write(b"\xa5" * (length - keep + 100))
        else:
            os.truncate(active, keep)
    return lost


def values(log: Log, stream: str) -> list[tuple[int, bytes]]:
    return [(e.id, e.value) for b in log.read(stream, log.start_id(stream), 1 << 30) for e in b]


def reopened(directory: Path, stream: str) -> list[tuple[int, bytes]]:
    log = Log.open(str(directory), SMALL)
    try:
        return values(log, stream)
    finally:
        log.close_sync()


async def write(log: Log, streams: list[str], rounds: int) -> dict[str, list[tuple[int, bytes]]]:
    """``rounds`` appends to each stream, concurrently; what was acknowledged, per stream."""
    acked: dict[str, list[tuple[int, bytes]]] = {s: [] for s in streams}

    async def one(stream: str) -> None:
        for i in range(rounds):
            value = f"{stream}-{i}-".encode() * 8
            stored = await log.append(Batch.build(stream, [value]), assign_ids=True)
            acked[stream].append((stored.first_id, value))

    await asyncio.gather(*(one(s) for s in streams))
    return acked


Acked = dict[str, list[tuple[int, bytes]]]


def crashed_copy(tmp_path: Path, scenario: object) -> tuple[Path, Acked]:
    """Run ``scenario(log)`` on a fresh log, copy the directory while the log still runs (a
    crash), then close the original. The copy and what was acknowledged."""
    data, copy = tmp_path / "data", tmp_path / "crash"

    async def main() -> dict[str, list[tuple[int, bytes]]]:
        log = Log.open(str(data), SMALL)
        try:
            acked: dict[str, list[tuple[int, bytes]]] = await scenario(log)  # type: ignore[operator]
            shutil.copytree(data, copy, ignore=shutil.ignore_patterns(".lock"))
            return acked
        finally:
            await log.close()

    return copy, run(main())


@pytest.mark.parametrize("garble", [False, True], ids=["cut", "garbled"])
def test_power_loss_after_acks_loses_nothing(tmp_path: Path, garble: bool) -> None:
    streams = [f"s{i}" for i in range(16)]
    copy, acked = crashed_copy(tmp_path, lambda log: write(log, streams, 30))
    assert power_loss(copy, garble=garble) > 0  # (the segments did lose acknowledged bytes)
    log = Log.open(str(copy), SMALL)
    try:
        for stream in streams:
            assert values(log, stream) == acked[stream]
    finally:
        log.close_sync()


def test_replaying_twice_leaves_the_same_files(tmp_path: Path) -> None:
    copy, _ = crashed_copy(tmp_path, lambda log: write(log, ["a", "b"], 40))
    power_loss(copy, garble=True)

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(copy)): p.read_bytes() for p in copy.rglob("*.log")}

    first = recover(str(copy))
    after_one = files()
    second = recover(str(copy))
    assert first == second
    assert first is not None
    assert first.lsn > 0
    assert files() == after_one


def test_a_missing_segment_is_rebuilt(tmp_path: Path) -> None:
    """Rolls after the checkpoint: the newest segment of each stream is missing altogether
    (as if its creation had not been durable); replay creates it again from the journal."""
    copy, acked = crashed_copy(tmp_path, lambda log: write(log, ["a", "b"], 80))
    cp = checkpoint_of(copy)
    for stream in ("a", "b"):
        logs = segments(copy, stream)
        assert len(logs) > 2
        newest = logs[-1]
        assert int(newest.name[:-4]) > cp.streams.get(directory_name(stream), (0, 0))[0]
        newest.unlink()
    for stream in ("a", "b"):
        assert reopened(copy, stream) == acked[stream]


def test_unacknowledged_bytes_past_the_durable_end_are_cut(tmp_path: Path) -> None:
    copy, acked = crashed_copy(tmp_path, lambda log: write(log, ["a"], 5))
    active = segments(copy, "a")[-1]
    with open(active, "ab") as f:  # a group written to the segment, its entry not durable
        f.write(b"\x01" * 300)
    assert reopened(copy, "a") == acked["a"]


def test_entries_of_segments_that_retention_deleted_are_skipped(tmp_path: Path) -> None:
    config = LogConfig(defaults=StreamSettings(segment_bytes=4096, retention_bytes=8192),
                       checkpoint_interval_s=NO_CHECKPOINT)  # fmt: skip

    async def scenario(log: Log) -> dict[str, list[tuple[int, bytes]]]:
        acked = await write(log, ["r"], 120)
        assert log.enforce_retention(0) > 0
        return acked

    data, copy = tmp_path / "data", tmp_path / "crash"

    async def main() -> dict[str, list[tuple[int, bytes]]]:
        log = Log.open(str(data), config)
        try:
            acked = await scenario(log)
            shutil.copytree(data, copy, ignore=shutil.ignore_patterns(".lock"))
            return acked
        finally:
            await log.close()

    acked = run(main())
    log = Log.open(str(copy), config)
    try:
        start = log.start_id("r")
        assert start > 1
        assert values(log, "r") == [(i, v) for i, v in acked["r"] if i >= start]
        assert not (copy / "r" / "00000000000000000001.log").exists()
    finally:
        log.close_sync()


def test_a_stream_created_after_the_checkpoint_is_replayed(tmp_path: Path) -> None:
    async def scenario(log: Log) -> dict[str, list[tuple[int, bytes]]]:
        acked = await write(log, ["old"], 3)
        assert log.journal is not None
        assert log.journal.checkpoint()
        acked.update(await write(log, ["new"], 3))
        return acked

    copy, acked = crashed_copy(tmp_path, scenario)
    assert directory_name("new") not in checkpoint_of(copy).streams
    os.truncate(segments(copy, "new")[-1], 0)  # nothing of it reached the disk
    assert reopened(copy, "new") == acked["new"]
    assert reopened(copy, "old") == acked["old"]


def test_a_small_ring_is_reused_through_checkpoints(tmp_path: Path) -> None:
    """64 KiB of journal for ~200 KiB of entries: the syncer waits for checkpoints and the ring
    wraps; a power loss afterwards still loses nothing acknowledged."""
    config = LogConfig(defaults=StreamSettings(segment_bytes=16384), journal_bytes=65536,
                       checkpoint_interval_s=NO_CHECKPOINT)  # fmt: skip
    data, copy = tmp_path / "data", tmp_path / "crash"

    async def main() -> tuple[dict[str, list[tuple[int, bytes]]], int]:
        log = Log.open(str(data), config)
        try:
            acked = await write(log, [f"s{i}" for i in range(8)], 200)
            assert log.journal is not None
            assert log.journal.live_bytes <= 65536
            shutil.copytree(data, copy, ignore=shutil.ignore_patterns(".lock"))
            return acked, log.journal.checkpoints
        finally:
            await log.close()

    acked, checkpoints = run(main())
    assert checkpoints >= 3
    assert (copy / JOURNAL_DIR / "journal.wal").stat().st_size == 65536
    power_loss(copy)
    log = Log.open(str(copy), config)
    try:
        for stream, events in acked.items():
            assert values(log, stream) == events
    finally:
        log.close_sync()


def test_a_failed_journal_fsync_fails_every_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        log = Log.open(str(tmp_path), SMALL)
        try:
            await write(log, ["a", "b"], 2)
            real = os.fdatasync
            ring = os.open(tmp_path / JOURNAL_DIR / "journal.wal", os.O_RDONLY)
            ring_inode = os.fstat(ring).st_ino
            os.close(ring)

            def failing(fd: int) -> None:
                if os.fstat(fd).st_ino == ring_inode:
                    raise OSError(errno.EIO, "injected")
                real(fd)

            def failing_synced_write(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
                """A round's write with ``RWF_DSYNC`` is its fdatasync too (docs/log.md)."""
                if flags and os.fstat(fd).st_ino == ring_inode:
                    raise OSError(errno.EIO, "injected")
                return real_pwritev(fd, buffers, offset, flags)

            real_pwritev = os.pwritev
            monkeypatch.setattr("tidewire.log.journal.os.fdatasync", failing)
            monkeypatch.setattr("tidewire.log.journal.os.pwritev", failing_synced_write)
            with pytest.raises(LogClosedError):
                await log.append(Batch.build("a", [b"lost"]), assign_ids=True)
            monkeypatch.setattr("tidewire.log.journal.os.fdatasync", real)
            monkeypatch.setattr("tidewire.log.journal.os.pwritev", real_pwritev)
            for stream in ("a", "b", "c"):  # every stream, a new one too: one disk
                with pytest.raises(LogClosedError):
                    await log.append(Batch.build(stream, [b"refused"]), assign_ids=True)
        finally:
            await log.close()

    run(main())
    log = Log.open(str(tmp_path), SMALL)  # a restart writes again
    try:
        assert [v for _, v in values(log, "a")][:2] == [b"a-0-" * 8, b"a-1-" * 8]
        run(log.append(Batch.build("b", [b"again"]), assign_ids=True))
    finally:
        log.close_sync()


def test_journal_off_and_read_only_opens(tmp_path: Path) -> None:
    """A log opened without the journal replays it first, then removes it (an old checkpoint
    must never judge segments written without it); read-only opens replay nothing."""
    copy, acked = crashed_copy(tmp_path, lambda log: write(log, ["a"], 10))
    power_loss(copy)
    ro = Log.open(str(copy), SMALL, read_only=True)
    try:
        assert len(values(ro, "a")) < len(acked["a"])  # (what a power loss took is missing)
    finally:
        ro.close_sync()
    log = Log.open(str(copy), LogConfig(journal=False))
    try:
        assert values(log, "a") == acked["a"]
        assert log.journal is None
        assert not (copy / JOURNAL_DIR).exists()
    finally:
        log.close_sync()


def test_a_full_disk_stops_the_ring_growing_and_commits_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ring grows on its first lap; out of space there, it keeps the size it has and
    recycles it through checkpoints: appends go on, and nothing is lost."""
    real = os.pwrite
    ring_path = str(tmp_path / JOURNAL_DIR / "journal.wal")

    def full_past_1mib(fd: int, data: Any, offset: int) -> int:
        if offset >= 1 << 20 and os.readlink(f"/proc/self/fd/{fd}") == ring_path:
            raise OSError(errno.ENOSPC, "injected: no space")
        return real(fd, data, offset)

    config = LogConfig(journal_bytes=8 << 20, checkpoint_interval_s=NO_CHECKPOINT)

    async def main() -> dict[str, list[tuple[int, bytes]]]:
        log = Log.open(str(tmp_path), config)
        try:
            monkeypatch.setattr("tidewire.log.journal.os.pwrite", full_past_1mib)
            acked: dict[str, list[tuple[int, bytes]]] = {f"s{i}": [] for i in range(4)}
            for n in range(100):  # ~3 MiB of entries
                for stream, events in acked.items():
                    value = bytes([n]) * 8000
                    stored = await log.append(Batch.build(stream, [value]), assign_ids=True)
                    events.append((stored.first_id, value))
            assert log.journal is not None
            assert log.journal.ring_bytes == 1 << 20
            assert log.journal.checkpoints >= 2
            return acked
        finally:
            await log.close()
            monkeypatch.setattr("tidewire.log.journal.os.pwrite", real)

    acked = run(main())
    assert os.path.getsize(ring_path) == 1 << 20
    log = Log.open(str(tmp_path), config)
    try:
        for stream, events in acked.items():
            assert values(log, stream) == events
    finally:
        log.close_sync()
