"""The durable log on a full disk (issue 11), on a real tmpfs of a few MiB (tests/smallfs.py):
no mock stands in for the file system; a ballast file fills it and is deleted to give space back.

* a write out of space is refused with :class:`StorageFullError`, the segment is cut back to
  its last commit (on disk, not just in memory), the ids are free again and the stream stays
  open: once the ballast goes, the next append succeeds, without a restart;
* what is queued behind a refused group is refused with it; a *fenced* append (several in
  flight) is refused after a refusal even once space is back;
* a roll out of space (the sealed segment's index, the next segment's file: pages, then
  inodes) and a stream's creation out of space leave no file behind;
* recovery accepts what a full disk leaves: a record cut short by a real short write, on a
  disk still full, and the log then refuses and accepts writes as space comes and goes;
* a writer killed with SIGKILL at random moments while the disk fills and empties loses no
  acknowledged event, and no refused one ever appears.

The child of the last test is this file, run as a script (``python test_log_disk_full.py
child DIRECTORY SEED``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_child import CONFIG as CRASH_CONFIG
from crash_child import STREAM as CRASH_STREAM
from crash_child import make_batch

from helpers import child_env, run
from smallfs import SmallFs, Unavailable
from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch, StorageFullError
from tidewire.record import encode

STREAM = "orders"
SIZE = 2 * 1024 * 1024
BIG = 64 * 1024  # more than the slack of any partly written page: needs new pages
SMALL_SEGMENTS = LogConfig(defaults=StreamSettings(segment_bytes=16384, index_interval_bytes=512))
SEED = int(os.environ.get("TIDEWIRE_CRASH_SEED", "20250611"))


def start(fs: SmallFs) -> SmallFs:
    try:
        return fs.start()
    except Unavailable as exc:
        pytest.skip(f"no small file system to fill: {exc}")


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[SmallFs]:
    small = start(SmallFs(tmp_path / "mnt", SIZE))
    try:
        yield small
    finally:
        small.stop()


def big(n: int = 1, fill: int = 7) -> Batch:
    return Batch.build(STREAM, [bytes([fill]) * BIG] * n)


def values(log: Log, stream: str = STREAM) -> list[tuple[int, bytes]]:
    return [(e.id, e.value) for b in log.read(stream, 1, 2**63 - 1) for e in b]


def reopened(directory: Path, config: LogConfig | None = None) -> list[tuple[int, bytes]]:
    log = Log.open(str(directory), config)
    try:
        return values(log) if STREAM in log else []
    finally:
        log.close_sync()


def warnings_with(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and text in r.getMessage()]  # fmt: skip


# --------------------------------------------------------------------------- refused, then resumed


def test_a_write_on_a_full_disk_is_refused_and_the_stream_stays_open(
    fs: SmallFs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tidewire.log")
    data = fs.root / "data"
    segment = data / STREAM / "00000000000000000001.log"
    log = Log.open(str(data))
    acked = [(i + 1, b"ok-%d" % i) for i in range(5)]

    async def scenario() -> None:
        try:
            await refused_then_resumed()
        finally:
            await log.close()

    async def refused_then_resumed() -> None:
        for _, value in acked:
            await log.append(Batch.build(STREAM, [value]), assign_ids=True)
        size = segment.stat().st_size
        fs.fill()
        assert fs.available() == 0
        for attempt in range(3):  # refused each time, and the stream is still open each time
            with pytest.raises(StorageFullError) as info:
                await log.append(big(2), assign_ids=True)
            error = info.value
            assert error.errno == errno.ENOSPC
            assert error.stream == STREAM
            assert str(error).startswith(f"stream {STREAM!r}: disk full (ENOSPC: ")
            assert str(segment) in str(error)
            # Cut back on disk: the file ends at the last acknowledged record.
            assert segment.stat().st_size == size, f"attempt {attempt}"
        with pytest.raises(StorageFullError):  # the caller's own ids: refused the same way
            await log.append(Batch.build(STREAM, [b"x" * BIG], ids=[6]))
        assert log.latest(STREAM) == log.accepted_latest(STREAM) == 5
        assert values(log) == acked  # reads go on
        fs.free()
        stored = await log.append(big(2), assign_ids=True)  # no restart: space is back
        assert list(stored.ids) == [6, 7]  # the refused ids were free again
        stored = await log.append(Batch.build(STREAM, [b"own"], ids=[8]))
        assert list(stored.ids) == [8]

    run(scenario())
    assert reopened(data) == [*acked, (6, bytes([7]) * BIG), (7, bytes([7]) * BIG), (8, b"own")]
    # One warning for the run of refusals (the others at debug level), one when writes resume.
    full = warnings_with(caplog, "disk full")
    assert len(full) == 1, full
    assert "the write was refused and nothing of it stored" in full[0]
    assert "2 event(s)" in full[0]
    assert warnings_with(caplog, f"stream {STREAM!r}: writes succeed again (4 refused")
    assert not warnings_with(caplog, "torn tail")


def test_queued_and_fenced_appends_are_refused_with_the_group(fs: SmallFs) -> None:
    data = fs.root / "data"

    async def scenario() -> None:
        log = Log.open(str(data))
        try:
            await log.append(Batch.build(STREAM, [b"first"]), assign_ids=True)
            fence = log.fence()
            fs.fill()
            # Appends arriving at different moments (in one group or several, or queued behind
            # one being written): every one of them is refused, and none leaves an id taken.
            tasks = []
            for i in range(8):
                tasks.append(asyncio.create_task(log.append(big(1, i), assign_ids=True)))
                for _ in range(i % 3):
                    await asyncio.sleep(0)
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, StorageFullError) for r in results), results
            assert log.fence() != fence
            assert await log.settled(STREAM) == 1
            assert log.accepted_latest(STREAM) == 1
            fs.free()
            # An append fenced before the refusals is refused although there is space now:
            # a caller with several appends in flight never has one stored after one refused.
            with pytest.raises(StorageFullError, match="after an earlier append was refused"):
                await log.append(Batch.build(STREAM, [b"late"]), assign_ids=True, fence=fence)
            fresh = log.fence()
            stored = await log.append(Batch.build(STREAM, [b"second"]), assign_ids=True,
                                      fence=fresh)  # fmt: skip
            assert list(stored.ids) == [2]
            stored = await log.append(Batch.build(STREAM, [b"third"]), assign_ids=True)
            assert list(stored.ids) == [3]
            assert log.fence() == fresh  # no refusal since
        finally:
            await log.close()

    run(scenario())
    assert reopened(data) == [(1, b"first"), (2, b"second"), (3, b"third")]


# --------------------------------------------------------------------------- rolls and creation


def test_a_roll_out_of_space_leaves_no_index_and_no_new_segment(fs: SmallFs) -> None:
    data = fs.root / "data"
    stream_dir = data / STREAM
    acked = [(i + 1, b"%d" % i * 1000) for i in range(10)]  # ~10 KiB of a 16 KiB segment

    async def scenario() -> None:
        log = Log.open(str(data), SMALL_SEGMENTS)
        try:
            for _, value in acked:
                await log.append(Batch.build(STREAM, [value]), assign_ids=True)
            fs.fill()
            batch = Batch.build(STREAM, [b"r" * 1000] * 8)  # 8 KiB more: the segment rolls
            with pytest.raises(StorageFullError) as info:
                await log.append(batch, assign_ids=True)
            assert info.value.during.endswith("00000000000000000001.index")
            assert sorted(os.listdir(stream_dir)) == ["00000000000000000001.log", "stream.name"]
            fs.free()
            stored = await log.append(batch, assign_ids=True)
            assert list(stored.ids) == list(range(11, 19))
            assert sorted(os.listdir(stream_dir)) == [
                "00000000000000000001.index", "00000000000000000001.log",
                "00000000000000000011.log", "stream.name"]  # fmt: skip
        finally:
            await log.close()

    run(scenario())
    assert reopened(data, SMALL_SEGMENTS) == acked + [(i, b"r" * 1000) for i in range(11, 19)]


def test_out_of_inodes_a_roll_and_a_new_stream_leave_nothing_behind(tmp_path: Path) -> None:
    """tmpfs with 64 inodes: creating a file runs out of space (``ENOSPC``) with pages free."""
    with start(SmallFs(tmp_path / "mnt", SIZE, inodes=64)) as fs:
        data = fs.root / "data"
        stream_dir = data / STREAM
        acked = [(i + 1, b"%d" % i * 1000) for i in range(10)]

        async def scenario() -> None:
            log = Log.open(str(data), SMALL_SEGMENTS)
            try:
                for _, value in acked:
                    await log.append(Batch.build(STREAM, [value]), assign_ids=True)
                # One inode left: the roll's index file takes it, the next segment finds none.
                fs.fill_inodes(leave=1)
                assert fs.inodes_free() == 1
                batch = Batch.build(STREAM, [b"r" * 1000] * 8)
                with pytest.raises(StorageFullError) as info:
                    await log.append(batch, assign_ids=True)
                assert info.value.during == f"creating {stream_dir}/00000000000000000011.log"
                assert sorted(os.listdir(stream_dir)) == ["00000000000000000001.log",
                                                          "stream.name"]  # fmt: skip
                assert fs.inodes_free() == 1  # the index file was removed again
                # A new stream cannot be made either, and no half-made one is left.
                fs.fill_inodes("more", leave=0)
                with pytest.raises(StorageFullError) as info:
                    await log.append(Batch.build("fresh", [b"x"]), assign_ids=True)
                assert info.value.stream == "fresh"
                assert "fresh" not in log.streams()
                assert not [e for e in os.listdir(data) if "fresh" in e]
                fs.free("inode-ballast")
                fs.free("more")
                stored = await log.append(batch, assign_ids=True)
                assert list(stored.ids) == list(range(11, 19))
                stored = await log.append(Batch.build("fresh", [b"x"]), assign_ids=True)
                assert list(stored.ids) == [1]
            finally:
                await log.close()

        run(scenario())
        assert reopened(data, SMALL_SEGMENTS) == acked + [(i, b"r" * 1000) for i in range(11, 19)]


def test_a_new_stream_on_a_full_disk_is_refused_then_made(fs: SmallFs) -> None:
    data = fs.root / "data"

    async def scenario() -> None:
        log = Log.open(str(data))
        try:
            fence = log.fence()
            fs.fill()
            with pytest.raises(StorageFullError) as info:
                await log.append(Batch.build(STREAM, [b"x"]), assign_ids=True, fence=fence)
            assert info.value.during == f"creating {data / STREAM}"
            assert log.streams() == []
            assert [e for e in os.listdir(data) if e not in (".lock", ".journal")] == []
            fs.free()
            # A refused creation counts for fences too (of any stream: the disk is shared).
            for name in (STREAM, "other"):
                with pytest.raises(StorageFullError, match="after an"):
                    await log.append(Batch.build(name, [b"y"]), assign_ids=True, fence=fence)
            assert log.streams() == []
            stored = await log.append(Batch.build(STREAM, [b"x"]), assign_ids=True)
            assert list(stored.ids) == [1]
        finally:
            await log.close()

    run(scenario())
    assert reopened(data) == [(1, b"x")]


# --------------------------------------------------------------------------- recovery


def test_recovery_on_a_full_disk_after_a_write_cut_short(
    fs: SmallFs, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash between a short write and its cut leaves a record cut short at the end of the
    active segment. The real file system makes that short write here; the log then restarts
    on a disk that is still full."""
    caplog.set_level(logging.INFO, "tidewire.log")
    data = fs.root / "data"
    segment = data / STREAM / "00000000000000000001.log"
    acked = [(i + 1, b"ok-%d" % i) for i in range(5)]

    async def write_some() -> None:
        log = Log.open(str(data))
        for _, value in acked:
            await log.append(Batch.build(STREAM, [value]), assign_ids=True)
        await log.close()

    run(write_some())
    size = segment.stat().st_size
    record = encode(Batch.build(STREAM, [b"z" * 30000]), 6)  # what the log would write next
    fs.fill(leave=4096)
    fd = os.open(segment, os.O_WRONLY)
    try:
        written = os.pwrite(fd, record.data, size)
    finally:
        os.close(fd)
    assert 0 < written < record.length, "the file system did not cut the write short"
    fs.fill()

    async def restart() -> None:
        log = Log.open(str(data))  # recovery, on a full disk
        try:
            assert values(log) == acked
            assert segment.stat().st_size == size
            with pytest.raises(StorageFullError):
                await log.append(big(), assign_ids=True)
            fs.free()
            stored = await log.append(big(), assign_ids=True)
            assert list(stored.ids) == [6]
        finally:
            await log.close()

    run(restart())
    torn = warnings_with(caplog, f"recovery: truncating torn tail of {segment} at byte offset "
                                 f"{size} ({written} bytes dropped")  # fmt: skip
    assert len(torn) == 1, caplog.text
    assert reopened(data) == [*acked, (6, bytes([7]) * BIG)]


# --------------------------------------------------------------------------- SIGKILL while filling

ROUNDS = 8
ROUND_TIMEOUT = 30.0
MAX_BATCHES = 50_000  # the child's safety net: the parent kills it long before


def child(directory: str, seed: int) -> None:
    """Append tokens' batches (tests/log/crash_child.py) with four appenders until killed: ``SEND
    <token>`` before each append, ``ACK <token> <first> <last>`` once durable, ``REFUSED
    <token>`` for a StorageFullError (then a new token: a refused one is never sent again)."""

    def emit(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    async def main() -> None:
        log = Log.open(directory, CRASH_CONFIG)
        emit("READY")
        rng = random.Random(seed)
        budget = [MAX_BATCHES]

        async def worker(wrng: random.Random) -> None:
            while budget[0] > 0:
                budget[0] -= 1
                token = wrng.getrandbits(62)
                emit(f"SEND {token}")
                try:
                    stored = await log.append(make_batch(token), assign_ids=True)
                except StorageFullError:
                    emit(f"REFUSED {token}")
                    await asyncio.sleep(0.002)  # pace the retries of a full disk
                    continue
                emit(f"ACK {token} {stored.first_id} {stored.last_id}")

        try:
            await asyncio.gather(*(worker(random.Random(rng.getrandbits(64))) for _ in range(4)))
        finally:
            await log.close()

    asyncio.run(main())


class Ledger:
    def __init__(self) -> None:
        self.sent: set[int] = set()
        self.acked: dict[int, tuple[int, int]] = {}
        self.refused: set[int] = set()

    def take(self, line: str) -> str:
        kind, *fields = line.split()
        if kind == "SEND":
            self.sent.add(int(fields[0]))
        elif kind == "ACK":
            token, first, last = (int(f) for f in fields)
            assert token in self.sent, line
            assert token not in self.acked, line
            self.acked[token] = (first, last)
        elif kind == "REFUSED":
            self.refused.add(int(fields[0]))
        else:
            assert kind == "READY", line
        return kind


def run_round(fs: SmallFs, directory: Path, rng: random.Random, ledger: Ledger,
              kill_phase: str, stderr_path: Path) -> None:  # fmt: skip
    """One child: fill the disk after some acks, SIGKILL it at a random line of ``kill_phase``:
    ``"full"``, or ``"free"`` (after some refusals the disk is emptied again)."""
    fill_after = rng.randint(0, 30)  # acks
    free_after = rng.randint(1, 20)  # refusals
    kill_after = rng.randint(0, 60)  # lines into that phase
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, __file__, "child", str(directory), str(rng.getrandbits(64))],
            stdout=subprocess.PIPE, stderr=stderr, env=child_env(),
        )  # fmt: skip
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    phase, counted, in_phase = "start", 0, 0
    received: list[bytes] = []
    try:
        deadline = time.monotonic() + ROUND_TIMEOUT
        while True:
            try:
                raw = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the round took more than {ROUND_TIMEOUT} s (phase {phase})")
            assert raw is not None, "the child exited: " + stderr_path.read_text(errors="replace")
            received.append(raw)
            kind = raw.split(b" ", 1)[0].strip()
            in_phase += 1
            if phase == kill_phase and in_phase > kill_after:
                break
            if kind == (b"ACK" if phase == "start" else b"REFUSED"):
                counted += 1
            if phase == "start" and counted >= fill_after:
                fs.fill()
                phase, counted, in_phase = "full", 0, 0
            elif phase == "full" and kill_phase == "free" and counted >= free_after:
                fs.free()
                phase, counted, in_phase = "free", 0, 0
    finally:
        proc.kill()  # SIGKILL: nothing is flushed, closed or cut back
        proc.wait(timeout=30)
        reader.join(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    while (raw := lines.get_nowait() if not lines.empty() else None) is not None:
        received.append(raw)
    for raw in received:
        if raw.endswith(b"\n"):  # (a line cut short by the kill says nothing)
            ledger.take(raw.decode())


def verify(directory: Path, ledger: Ledger) -> None:
    """Reopen (recover) the log, on whatever disk there is, and check it against the ledger."""
    log = Log.open(str(directory), CRASH_CONFIG)
    try:
        if CRASH_STREAM not in log:
            assert not ledger.acked
            return
        everything = log.read(CRASH_STREAM, 1, 2**63 - 1)  # whole records
        seen: set[int] = set()
        next_id = 1
        for record in everything:
            start = 0  # small batches share a record; a batch's timestamps run token, token+1...
            for i in range(1, len(record) + 1):
                if i < len(record) and record.timestamps[i] == record.timestamps[i - 1] + 1:
                    continue
                batch = record.slice(start, i)
                start = i
                token = int(batch.timestamps[0])
                assert token in ledger.sent, f"ids {batch.first_id}..: a batch nobody sent"
                assert token not in ledger.refused, f"batch {token} was refused, yet stored"
                assert token not in seen, f"batch {token} stored twice"
                seen.add(token)
                assert batch.first_id == next_id, f"ids jump from {next_id - 1} to {batch.first_id}"
                assert list(batch) == list(make_batch(token).with_ids(next_id)), f"{token} differs"
                if token in ledger.acked:
                    assert (batch.first_id, batch.last_id) == ledger.acked[token]
                next_id = batch.last_id + 1
        lost = sorted(ledger.acked[t] for t in ledger.acked.keys() - seen)
        assert not lost, f"acknowledged batches lost: {lost}"
        assert log.latest(CRASH_STREAM) == next_id - 1
    finally:
        log.close_sync()


@pytest.mark.timeout(180)
def test_sigkill_while_the_disk_fills_and_frees_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    ledger = Ledger()
    with start(SmallFs(tmp_path / "mnt", 4 * SIZE)) as fs:  # room for every round's data
        directory = fs.root / "data"
        for round_no in range(ROUNDS):
            kill_phase = ("full", "free")[round_no % 2]
            run_round(fs, directory, rng, ledger, kill_phase, tmp_path / f"child-{round_no}.err")
            verify(directory, ledger)  # on a disk still full if it was killed while full
            fs.free()
        assert len(list((directory / CRASH_STREAM).glob("*.log"))) > 1, "no segment was rolled"
    assert ledger.refused, "no write was refused: the disk never filled"
    assert len(ledger.acked) >= ROUNDS


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2], int(sys.argv[3]))
