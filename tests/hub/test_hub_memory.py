"""A slow subscriber costs the hub nothing: a subscription is a position in the log, never a
queue, so a 20 MiB backlog held by an idle subscriber stays on disk, and reading it through
costs memory bounded by one delivery, not by the backlog.

Memory is measured with tracemalloc, which sees every Python allocation, the worker threads'
reads included.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import run
from tidewire.hub import MAX_DEMAND, Hub
from tidewire.log import LogConfig, StreamSettings
from tidewire.model import Batch

S = "backlog"
KiB = 1024
MiB = 1024 * KiB
VALUE_BYTES = 4 * KiB
PER_APPEND = 16
APPENDS = 320  # 320 x 16 x 4 KiB = 20 MiB of values
BACKLOG_BYTES = APPENDS * PER_APPEND * VALUE_BYTES
MAX_BATCH_BYTES = 256 * KiB
CONFIG = LogConfig(
    defaults=StreamSettings(segment_bytes=1 * MiB), fsync=False, recent_bytes=1 * MiB
)


@pytest.fixture
def traced() -> Iterator[None]:
    already = tracemalloc.is_tracing()  # e.g. python -X tracemalloc
    if not already:
        tracemalloc.start()
    try:
        yield
    finally:
        if not already:
            tracemalloc.stop()


def traced_now() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def value(n: int) -> bytes:
    return f"{n:010d}".encode().ljust(VALUE_BYTES, b"-")


async def append_backlog(hub: Hub, first_value: int = 0) -> None:
    for a in range(APPENDS):
        lo = first_value + a * PER_APPEND
        batch = Batch.build(S, [value(n) for n in range(lo, lo + PER_APPEND)])
        await hub.append(batch, assign_ids=True)


def test_idle_subscribers_hold_no_backlog_and_read_it_with_bounded_memory(
    tmp_path: Path, traced: None
) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path), CONFIG)
        try:
            await hub.append(Batch.build(S, [value(-1)]), assign_ids=True)
            slow = hub.subscribe(S, max_batch_bytes=MAX_BATCH_BYTES)
            waiting = asyncio.ensure_future(slow.next())  # waits for demand
            asked = hub.subscribe(S, max_batch_bytes=MAX_BATCH_BYTES)
            asked.request(MAX_DEMAND)  # has demand but never calls next()
            for _ in range(20):
                await asyncio.sleep(0)
            before = traced_now()

            await append_backlog(hub)
            late = hub.subscribe(S, "earliest", max_batch_bytes=MAX_BATCH_BYTES)
            late.request(MAX_DEMAND)  # subscribed to the whole backlog, not reading it
            for _ in range(20):
                await asyncio.sleep(0)
            held = traced_now() - before

            assert hub.latest(S) == APPENDS * PER_APPEND + 1
            assert (stats := hub.streams()[0]).bytes > BACKLOG_BYTES
            assert stats.segments >= 20
            assert not waiting.done()
            assert (slow.delivered, asked.delivered, late.delivered) == (0, 0, 0)
            # The log keeps recent_bytes of newest commits for live tails, plus indexes:
            # nothing that grows with the backlog.
            assert held < 2 * MiB, f"{held} bytes held for a {BACKLOG_BYTES}-byte backlog"

            slow.request(MAX_DEMAND)
            seen = 0
            expected_id = 1
            worst = 0
            first = await waiting
            got: list[Batch] | None
            for _ in range(APPENDS * PER_APPEND + 1):
                if first is not None:
                    got, first = first, None
                else:
                    base = traced_now()
                    tracemalloc.reset_peak()
                    got = await slow.next()
                    worst = max(worst, tracemalloc.get_traced_memory()[1] - base)
                assert got
                size = 0
                for batch in got:
                    for i in range(len(batch)):
                        assert batch.ids[i] == expected_id
                        assert batch.value(i)[:10] == b"%010d" % (expected_id - 2)
                        expected_id += 1
                    size += batch.nbytes
                    seen += len(batch)
                assert size <= MAX_BATCH_BYTES + PER_APPEND * (VALUE_BYTES + 20) + 4
                del got
                if seen == APPENDS * PER_APPEND + 1:
                    break
            assert seen == APPENDS * PER_APPEND + 1
            assert expected_id == seen + 1
            # One delivery, the read-ahead of the disk read, and bookkeeping.
            assert worst < 3 * MiB // 2, f"a next() allocated up to {worst} bytes"
        finally:
            await hub.close()

    run(main())


def test_backlog_of_a_subscriber_without_demand_is_not_read(tmp_path: Path, traced: None) -> None:
    """A subscription with no demand reads nothing, however much the stream holds."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path), CONFIG)
        try:
            await append_backlog(hub)
            await hub.close()
            hub = Hub.open(str(tmp_path), CONFIG)  # no in-memory tail: all on disk
            before = traced_now()
            tracemalloc.reset_peak()
            subs = [hub.subscribe(S, max_batch_bytes=MAX_BATCH_BYTES) for _ in range(50)]
            pending = [asyncio.ensure_future(sub.next()) for sub in subs]
            for _ in range(50):
                await asyncio.sleep(0)
            peak = tracemalloc.get_traced_memory()[1] - before
            assert not any(p.done() for p in pending)
            assert peak < 512 * KiB, f"50 idle subscribers allocated {peak} bytes"
            subs[0].request(1)
            got = await pending[0]
            assert got is not None
            assert [int(i) for b in got for i in b.ids] == [1]
            for sub in subs:
                sub.cancel()
            assert await asyncio.gather(*pending[1:]) == [None] * 49
        finally:
            await hub.close()

    run(main())


def test_a_stream_of_tiny_appends_keeps_recent_bytes_of_memory(
    tmp_path: Path, traced: None
) -> None:
    """The in-memory tail is bounded by what it holds, not only by its events' bytes: a batch
    kept costs about 1 KB beyond its ``nbytes`` (found by the soak: the Tolliver server's
    offsets, one ~90-byte record ten times a second, grew the hub by 0.9 MB a minute until
    ``recent_bytes`` of payload, about 14 MB, was kept)."""
    recent = 64 * KiB
    config = LogConfig(fsync=False, recent_bytes=recent, inline_commit_bytes=64 * KiB)
    record = b'{"remote":"12345678-1234-1234-1234-123456789abc","channel":"c","next":1234567}'

    async def main() -> None:
        hub = Hub.open(str(tmp_path), config)
        try:
            await hub.append(Batch.build("tiny", [record]), assign_ids=True)
            before = traced_now()
            for _ in range(3000):  # 3000 x ~100 bytes: about 5 x recent in nbytes alone
                await hub.append(Batch.build("tiny", [record]), assign_ids=True)
            held = traced_now() - before
            assert hub.latest("tiny") == 3001
            # recent_bytes, plus the index and bookkeeping (3000 x 1.2 KB before the fix)
            assert held < 2 * recent, f"{held} bytes held for {recent} bytes of recent commits"
        finally:
            await hub.close()

    run(main())
