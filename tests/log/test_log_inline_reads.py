"""``Log.read_async`` reads inline, on the event loop, only what is mapped already (docs/log.md,
"Reads"): the first read of a segment goes to a worker thread (which maps it), later reads of
it are memory access on the loop's thread; a read that reaches a segment not mapped yet goes
to the thread whole (never cut short at the mapped segment's end). The executor is the loop's
default, replaced here by one that counts what it is given."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch, DataLossError

T = TypeVar("T")
STREAM = "s"
NO_LIMIT = 2**63 - 1
PER_RECORD = 10


class CountingExecutor(ThreadPoolExecutor):
    """A thread pool that counts the calls handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.calls = 0

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        self.calls += 1
        return super().submit(fn, *args, **kwargs)


def ids_of(batches: list[Batch]) -> list[int]:
    return [e.id for batch in batches for e in batch]


def fill(directory: Path, config: LogConfig, records: int) -> list[tuple[int, bytes]]:
    """``records`` records of 10 events of ~2 KiB each (one record per 4 KiB segment)."""
    expected: list[tuple[int, bytes]] = []

    async def run() -> None:
        log = Log.open(str(directory), config)
        for i in range(records):
            values = [f"{i}.{j}:".encode() + os.urandom(200) for j in range(PER_RECORD)]
            stored = await log.append(Batch.build(STREAM, values), assign_ids=True)
            expected.extend((e.id, e.value) for e in stored)
        await log.close()

    asyncio.run(run())
    return expected


def test_a_mapped_segment_is_read_on_the_loop_and_a_new_one_in_a_thread(tmp_path: Path) -> None:
    config = LogConfig(defaults=StreamSettings(segment_bytes=4096), recent_bytes=0)
    expected = fill(tmp_path, config, 3)

    async def scenario() -> None:
        executor = CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        log = Log.open(str(tmp_path), config)
        try:
            first = await log.read_async(STREAM, 1, 1)  # (one event: segment 1 only)
            assert executor.calls == 1  # segment 1 was not mapped: a worker thread mapped it
            assert ids_of(first) == [1]
            again = await log.read_async(STREAM, 3, NO_LIMIT, PER_RECORD - 2)  # (to id 10)
            assert executor.calls == 1  # mapped now: read inline
            assert [(e.id, e.value) for b in again for e in b] == expected[2:PER_RECORD]
            second = await log.read_async(STREAM, PER_RECORD + 1, 1)
            assert executor.calls == 2  # segment 2 is new: the thread again
            assert ids_of(second) == [PER_RECORD + 1]
            twenty = await log.read_async(STREAM, 1, NO_LIMIT, 2 * PER_RECORD)
            assert ids_of(twenty) == list(range(1, 2 * PER_RECORD + 1))  # (segments 1 and 2)
            assert executor.calls == 2  # inline: the segments it reads are mapped
            assert ids_of(await log.read_async(STREAM, 1, NO_LIMIT)) == [e[0] for e in expected]
            assert executor.calls == 3  # (this one reaches segment 3: the thread, whole)
        finally:
            await log.close()
            executor.shutdown()

    asyncio.run(scenario())


def test_a_read_reaching_an_unmapped_segment_goes_to_the_thread_whole(tmp_path: Path) -> None:
    # One record per segment: a read that is not limited would run on into the next.
    config = LogConfig(defaults=StreamSettings(segment_bytes=4096), recent_bytes=0)
    fill(tmp_path, config, 2)

    async def scenario() -> None:
        executor = CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        log = Log.open(str(tmp_path), config)
        try:
            assert ids_of(log.read(STREAM, 1, 1)) == [1]  # (maps segment 1 only)
            inline = await log.read_async(STREAM, 5, 1)  # (one event: segment 1 only)
            assert executor.calls == 0
            assert ids_of(inline) == [5]
            whole = await log.read_async(STREAM, 5, NO_LIMIT)  # reaches segment 2: the thread
            assert executor.calls == 1
            assert ids_of(whole) == list(range(5, 2 * PER_RECORD + 1))  # not cut at segment 1
            again = await log.read_async(STREAM, 5, NO_LIMIT)  # both mapped now: inline
            assert executor.calls == 1
            assert ids_of(again) == ids_of(whole)
        finally:
            await log.close()
            executor.shutdown()

    asyncio.run(scenario())


def test_an_inline_read_below_retention_raises_data_loss(tmp_path: Path) -> None:
    config = LogConfig(defaults=StreamSettings(segment_bytes=4096, retention_bytes=0),
                       recent_bytes=0)  # fmt: skip
    fill(tmp_path, config, 3)

    async def scenario() -> None:
        log = Log.open(str(tmp_path), config)
        try:
            assert log.enforce_retention(0) == 2  # segments 1 and 2 go
            assert ids_of(await log.read_async(STREAM, 2 * PER_RECORD + 1, NO_LIMIT))
            with pytest.raises(DataLossError):  # (segment 3 mapped: the inline path says so)
                await log.read_async(STREAM, 1, NO_LIMIT)
        finally:
            await log.close()

    asyncio.run(scenario())
