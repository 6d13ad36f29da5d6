"""Bulk appends (log/bulk.py): many records of one stream, written as they come from a source
and visible all at once, or not at all, also after a SIGKILL in the middle."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bulk_child import BATCHES, CONFIG, EVENTS, HOLD, STREAM, bulk_batch

from loops import Run
from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch, IdOrderError

CHILD = Path(__file__).with_name("bulk_child.py")
SMALL = LogConfig(defaults=StreamSettings(segment_bytes=8 * 1024, index_interval_bytes=256),
                  max_record_bytes=4096)  # fmt: skip


def values(log: Log, stream: str = STREAM) -> list[bytes]:
    return [e.value for b in log.read(stream, 1, 1 << 30) for e in b]


def batches(n: int, size: int = 8, tag: bytes = b"v") -> list[Batch]:
    return [Batch.build(STREAM, [tag + b"%03d-%d" % (i, j) + b"." * 200 for j in range(size)])
            for i in range(n)]  # fmt: skip


def test_a_bulk_is_seen_all_at_once_and_appenders_queue_behind_it(tmp_path: Path,
                                                                  run: Run) -> None:  # fmt: skip
    parts = batches(12)  # ~20 KB in 12 records of ~1.7 KB: more than two segments' worth
    held, go = threading.Event(), threading.Event()

    def source() -> Iterator[Batch]:
        for i, batch in enumerate(parts):
            yield batch
            if i == 5:
                held.set()
                assert go.wait(20)

    async def main() -> None:
        log = Log.open(str(tmp_path), SMALL)
        try:
            await log.append(Batch.build(STREAM, [b"first"]), assign_ids=True)
            bulk = asyncio.ensure_future(log.append_bulk(STREAM, 5, 12 * 8, 20_000, source))
            assert await asyncio.to_thread(held.wait, 20)
            later = asyncio.ensure_future(log.append(Batch.build(STREAM, [b"later"]),
                                                     assign_ids=True))  # fmt: skip
            await asyncio.sleep(0.05)  # (a chance to finish, which it must not take)
            # half written: nothing of it is visible, and the appender that came waits
            assert (log.latest(STREAM), values(log)) == (1, [b"first"])
            assert log.accepted_latest(STREAM) == 4 + 96 + 1
            assert not later.done()
            go.set()
            assert await bulk == (5, 100)
            stored = await later
            assert (stored.first_id, log.latest(STREAM)) == (101, 101)
            got = log.read(STREAM, 1, 1 << 30)
            assert [b.first_id for b in got][:2] == [1, 5]  # (2..4: a gap, as the ids asked)
            assert values(log) == [b"first"] + [e.value for b in parts for e in b] + [b"later"]
        finally:
            await log.close()
        again = Log.open(str(tmp_path), SMALL)  # the index and the time index rebuilt
        try:
            assert values(again)[1:-1] == [e.value for b in parts for e in b]
            assert again.find_time(STREAM, 0) == 1
        finally:
            again.close_sync()

    run(main())


def test_a_failing_source_stores_nothing_and_frees_the_ids(tmp_path: Path, run: Run) -> None:
    def source() -> Iterator[Batch]:
        yield from batches(3)
        raise OSError("part gone")

    async def main() -> None:
        log = Log.open(str(tmp_path), SMALL)
        try:
            await log.append(Batch.build(STREAM, [b"first"]), assign_ids=True)
            size = sum(s.bytes for s in log.stats())
            with pytest.raises(OSError, match="part gone"):
                await log.append_bulk(STREAM, 2, 3 * 8 + 1, 0, source)
            with pytest.raises(ValueError, match="gave 16 event"):
                await log.append_bulk(STREAM, 2, 17, 0, lambda: iter(batches(2)))
            with pytest.raises(ValueError, match="more than 7"):
                await log.append_bulk(STREAM, 2, 7, 0, lambda: iter(batches(2)))
            with pytest.raises(IdOrderError):
                await log.append_bulk(STREAM, 1, 8, 0, lambda: iter(batches(1)))
            assert sum(s.bytes for s in log.stats()) == size  # (cut back)
            assert (log.latest(STREAM), log.accepted_latest(STREAM)) == (1, 1)
            stored = await log.append(Batch.build(STREAM, [b"next"]), assign_ids=True)
            assert stored.first_id == 2  # the stream stays open, its ids free again
        finally:
            await log.close()
        again = Log.open(str(tmp_path), SMALL)
        try:
            assert values(again) == [b"first", b"next"]
        finally:
            again.close_sync()

    run(main())


def _until(directory: Path, mode: str, line: str, stderr: Path) -> list[str]:
    """Run the child until it prints a line starting with ``line``, then SIGKILL it."""
    with open(stderr, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(CHILD), str(directory), mode],
                                stdout=subprocess.PIPE, stderr=err)  # fmt: skip
    lines: queue.Queue[bytes] = queue.Queue()

    def pump() -> None:
        for raw in proc.stdout or ():
            lines.put(raw)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not seen or not seen[-1].startswith(line):
            try:
                seen.append(lines.get(timeout=max(0.0, deadline - time.monotonic())).decode())
            except queue.Empty:
                pytest.fail(f"no {line!r} from the child in 60 s: {seen}, {stderr.read_text()}")
    finally:
        proc.kill()
        proc.wait(30)
        reader.join(30)
    return seen


@pytest.mark.parametrize("mode", ["mid", "done"])
def test_a_sigkill_leaves_all_of_a_bulk_or_none(tmp_path: Path, mode: str) -> None:
    directory = tmp_path / "log"
    seen = _until(directory, mode, f"WROTE {HOLD}" if mode == "mid" else "DONE",
                  tmp_path / "child.err")  # fmt: skip
    assert seen[0].split()[:2] == ["PRE", "1"]
    segments = [p for p in directory.rglob("*.log") if p.stem.isdigit()]
    before = sum(p.stat().st_size for p in segments)
    assert before > HOLD * EVENTS * 300  # the records written are in the file
    log = Log.open(str(directory), CONFIG)  # recovery: the journal's durable end
    try:
        got = values(log)
        bulk = [e.value for i in range(BATCHES) for e in bulk_batch(i)]
        if mode == "mid":  # 25 records written to the file, none durable: cut
            assert got == [b"pre"]
            assert sum(p.stat().st_size for p in segments) < 1000
        else:
            assert got == [b"pre", *bulk]
            assert seen[-1].split() == ["DONE", "2", str(1 + BATCHES * EVENTS)]
    finally:
        log.close_sync()
