"""Reads from mapped segments (docs/log.md, "Reads"): batches are views into ``mmap``s of the
segment files, so their lifetime is the mapping's. A batch held across retention deleting its
segment and across the log's close stays readable, byte for byte; the active segment is mapped
again, larger, when a read needs what was committed since."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch

STREAM = "s"
NO_LIMIT = 2**63 - 1


def values_of(batches: list[Batch]) -> list[tuple[int, bytes]]:
    return [(e.id, e.value) for batch in batches for e in batch]


def deleted_fds(directory: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(os.path.realpath(directory)) and target.endswith(" (deleted)"):
            out.append(target)
    return out


def test_a_held_batch_outlives_retention_and_close(tmp_path: Path) -> None:
    config = LogConfig(defaults=StreamSettings(segment_bytes=4096, retention_bytes=0))
    expected: list[tuple[int, bytes]] = []

    async def fill() -> None:
        log = Log.open(str(tmp_path), config)
        for i in range(4):  # one ~2 KiB record per segment: four segments
            values = [f"{i}.{j}:".encode() + os.urandom(200) for j in range(10)]
            stored = await log.append(Batch.build(STREAM, values), assign_ids=True)
            expected.extend((e.id, e.value) for e in stored)
        await log.close()

    asyncio.run(fill())
    log = Log.open(str(tmp_path), config)
    held = log.read(STREAM, 1, NO_LIMIT)  # views into the mappings of all four segments
    assert values_of(held) == expected
    assert log.enforce_retention(0) == 3  # no read in progress: their fds close at once
    assert not (tmp_path / STREAM / f"{1:020d}.log").exists()
    assert values_of(held) == expected  # the deleted segments' pages are still mapped
    log.close_sync()  # closing the segments a batch still views must not fail
    assert values_of(held) == expected
    assert bytes(held[0].values) == b"".join(v for _, v in expected[:10])
    assert len(deleted_fds(tmp_path)) == 3  # (Python's mmap keeps a dup of the fd)
    del held
    gc.collect()
    assert deleted_fds(tmp_path) == []  # unmapped with the last view: the space is freed


def test_the_active_segment_is_mapped_again_as_it_grows(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = Log.open(str(tmp_path), LogConfig(recent_bytes=0))  # every read from the file
        try:
            await log.append(Batch.build(STREAM, [b"a" * 100] * 3), assign_ids=True)
            first = log.read(STREAM, 1, NO_LIMIT)
            assert values_of(first) == [(i, b"a" * 100) for i in (1, 2, 3)]
            await log.append(Batch.build(STREAM, [b"b" * 5000]), assign_ids=True)
            second = log.read(STREAM, 1, NO_LIMIT)
            assert values_of(second)[-1] == (4, b"b" * 5000)
            assert values_of(log.read(STREAM, 4, NO_LIMIT)) == [(4, b"b" * 5000)]
            # The first read's batches view the smaller, older mapping: still intact.
            assert values_of(first) == [(i, b"a" * 100) for i in (1, 2, 3)]
        finally:
            await log.close()

    asyncio.run(scenario())
