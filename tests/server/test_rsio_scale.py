"""RS.io at scale against a real ``tidewire serve`` process (the client here, the hub in its own
process, so each has a core): a million events published and read back live, in order, exactly
once; and a slow reader while 1 GiB is published, with the server's memory sampled throughout."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

import helpers
import tidewire
from tidewire.client.rsio import Receipt

MiB = 1024 * 1024


# ---------------------------------------------------------------------- the server process


@dataclass(frozen=True, slots=True)
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    out: Path
    err: Path


def _output(served: Served) -> str:
    return served.out.read_text(errors="replace") + served.err.read_text(errors="replace")


@contextmanager
def serve(root: Path, *, timeout: float = 60.0) -> Iterator[Served]:
    """Run ``tidewire serve`` on 127.0.0.1 with free ports and ``root/data``; yield once it is
    ready. Its stdout and stderr go to files (a pipe nobody drains could block it)."""
    out, err = root / "serve.out", root / "serve.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWIRE_")}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", str(root / "data"),
             "--host", "127.0.0.1", "--http-port", "0", "--rsio-port", "0", "--seguro-port", "0",
             "--tolliver-port", "0"],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
        )  # fmt: skip
    served = Served(proc, "", out, err)
    try:
        deadline = time.monotonic() + timeout
        while "ready" not in (text := out.read_text(errors="replace")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"tidewire serve did not get ready:\n{_output(served)}")
            time.sleep(0.01)  # polling for the line, bounded by the deadline
        match = re.search(r"rsio://127\.0\.0\.1:\d+", text)
        assert match is not None, text
        yield Served(proc, match.group(0), out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def stop(served: Served) -> None:
    """Stop gracefully (SIGTERM) and check that the server exits 0 after the load."""
    served.proc.send_signal(signal.SIGTERM)
    try:
        code = served.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no exit within 60 s of SIGTERM:\n{_output(served)}") from None
    assert code == 0, _output(served)


run = functools.partial(helpers.run, loop="uvloop")  # (these run on uvloop)


# ---------------------------------------------------------------------- checking helpers


def big_endian_counters(first: int, n: int) -> bytes:
    """``first``, ``first + 1``, ... ``first + n - 1`` as 8-byte big-endian integers."""
    counters = array("Q", range(first, first + n))
    if sys.byteorder == "little":
        counters.byteswap()
    return counters.tobytes()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time used so far by process ``pid``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def first_mismatch(got: Sequence[int] | bytes, expected: Sequence[int] | bytes) -> str | None:
    """None if equal; else where they first differ (no multi-megabyte reprs in the report)."""
    if got == expected:
        return None
    for i, (a, b) in enumerate(zip(got, expected, strict=False)):
        if a != b:
            return f"first difference at index {i}: got {a!r}, expected {b!r}"
    return f"lengths differ: got {len(got)}, expected {len(expected)}"


def check_receipts(receipts: list[Receipt], sizes: list[int]) -> None:
    """The receipts of consecutive submits cover ids 1..sum(sizes) contiguously."""
    assert len(receipts) == len(sizes)
    next_id = 1
    for i, (receipt, size) in enumerate(zip(receipts, sizes, strict=True)):
        expected = Receipt(size, next_id, next_id + size - 1)
        assert receipt == expected, f"receipt {i}: {receipt} != {expected}"
        next_id += size


# ---------------------------------------------------------------------- a million events

N_EVENTS = 1_000_000
SUBMIT = 10_000


@dataclass(slots=True)
class ReadAll:
    ids: array[int]
    values: bytearray
    received_at_last_receipt: int = -1
    published_after: float = 0.0  # seconds from the first submit to the last receipt


async def publish_counters(url: str, stream: str, shared: ReadAll) -> list[Receipt]:
    async with tidewire.connect(url) as hub:
        pub = await hub.publisher(stream)
        futures: list[asyncio.Future[Receipt]] = []
        started = time.perf_counter()
        for first in range(1, N_EVENTS + 1, SUBMIT):
            data = big_endian_counters(first, min(SUBMIT, N_EVENTS + 1 - first))
            values = [data[i : i + 8] for i in range(0, len(data), 8)]
            futures.append(await pub.submit(values))  # pipelined: waits only for queue room
        receipts = list(await asyncio.gather(*futures))
        shared.received_at_last_receipt = len(shared.ids)
        shared.published_after = time.perf_counter() - started
        await pub.close()
    return receipts


async def read_all(url: str, stream: str, shared: ReadAll) -> list[str]:
    """Read ``stream`` from earliest until id N_EVENTS (then live: started before publishing);
    gather ids and values as buffers; return what is wrong with the batches' value layout."""
    problems: list[str] = []
    async with tidewire.connect(url) as hub:
        async for batch in hub.subscribe(stream, from_id="earliest", until_id=N_EVENTS,
                                         prefetch=16384):  # fmt: skip
            offsets = batch.value_offsets
            base, n = offsets[0], len(batch)
            if offsets.tobytes() != array("I", range(base, base + 8 * n + 1, 8)).tobytes():
                problems.append(f"batch {batch.first_id}..{batch.last_id}: not all values 8 B")
            shared.ids.frombytes(batch.ids.cast("B"))
            shared.values += batch.values
    return problems


def test_million_events_published_and_received_in_order_exactly_once(tmp_path: Path) -> None:
    with serve(tmp_path) as served:

        async def main() -> tuple[list[Receipt], list[str], ReadAll, float]:
            shared = ReadAll(array("Q"), bytearray())
            reader = asyncio.create_task(read_all(served.url, "counters", shared))
            await asyncio.sleep(0)  # let the reader connect and send its subscribe first
            started = time.perf_counter()
            receipts = await publish_counters(served.url, "counters", shared)
            problems = await reader
            return receipts, problems, shared, time.perf_counter() - started

        cpu = time.process_time(), cpu_seconds(served.proc.pid)
        receipts, problems, got, elapsed = run(main(), timeout=120)
        client_cpu = time.process_time() - cpu[0]
        server_cpu = cpu_seconds(served.proc.pid) - cpu[1]
        print(f"\n{N_EVENTS:,} events: all receipts after {got.published_after:.1f} s, all "
              f"received after {elapsed:.1f} s ({N_EVENTS / elapsed:,.0f} events/s); "
              f"{got.received_at_last_receipt:,} received by the last receipt; CPU: client "
              f"{client_cpu:.1f} s, server {server_cpu:.1f} s")  # fmt: skip
        check_receipts(receipts, [SUBMIT] * (N_EVENTS // SUBMIT))
        assert problems == []
        mismatch = first_mismatch(got.ids, array("Q", range(1, N_EVENTS + 1)))
        assert mismatch is None, f"ids are not 1..{N_EVENTS} in order, once each: {mismatch}"
        mismatch = first_mismatch(bytes(got.values), big_endian_counters(1, N_EVENTS))
        assert mismatch is None, f"values do not match their ids: {mismatch}"
        # The subscriber followed live: it had events before the publisher's last commit.
        assert got.received_at_last_receipt > 0
        stop(served)


# ---------------------------------------------------------------------- a slow reader, 1 GiB

VALUE_SIZE = 64 * 1024
N_VALUES = 16_384  # x 64 KiB = 1 GiB
PER_SUBMIT = 16  # 1 MiB per submit
READER_PREFETCH = 16  # 1 MiB a delivery at most
READER_PACE_S = 0.05  # the slow reader's deliberate pause after each batch
BATCHES_AFTER_PUBLISHING = 20
# What the server may hold for this run, whatever the reader's lag (the unbounded failure mode
# is holding what the reader has not read yet: up to the whole 1 GiB):
# - the publisher's connection: at most MAX_INLET_BYTES (8 MiB) received and not committed,
#   plus one 256 KiB socket read, plus the batch joined from it for the append: ~17 MiB;
# - the log: at most max_pending_bytes (64 MiB) per stream queued for the group commit, plus
#   the record being encoded and written from it: ~128 MiB;
# - the slow subscriber: its transport's write buffer (high water 1 MiB), one delivery
#   (256 KiB) and what the log reads for it: a whole record (the publisher's commits make
#   records of ~8 MiB here; max_record_bytes is 64 MiB): ~10 MiB;
# - the allocator and interpreter (freed blocks not returned at once, buffers in flight):
#   the rest of 256 MiB, a quarter of what an unbounded server would hold.
# Measured on a 2-core machine: 115-121 MiB (publishing alone: ~60 MiB).
RSS_GROWTH_BOUND = 256 * MiB


def status_bytes(pid: int, field: str) -> int:
    """``field`` (e.g. VmRSS, VmHWM) of /proc/<pid>/status, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


class RssSampler(threading.Thread):
    """Samples the server's VmRSS every ``interval`` seconds; ``peak`` is the highest seen,
    together with the kernel's own high-water mark (VmHWM, reset at the start when allowed)."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.finished = threading.Event()
        # "5" resets VmHWM to VmRSS; if refused, VmHWM includes the start-up peak (pessimistic)
        with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as clear:
            clear.write("5")
        self.baseline = status_bytes(pid, "VmRSS")
        self.peak = self.baseline
        self.samples = 1

    def sample(self) -> None:
        self.peak = max(self.peak, status_bytes(self.pid, "VmRSS"))
        self.samples += 1

    def run(self) -> None:
        while not self.finished.wait(self.interval):
            try:
                self.sample()
            except OSError:  # the process is gone: nothing more to sample
                return

    def stop(self) -> None:
        self.finished.set()
        self.join(timeout=10)
        with contextlib.suppress(OSError):  # if the server is gone, the test fails elsewhere
            self.sample()
            self.peak = max(self.peak, status_bytes(self.pid, "VmHWM"))


def numbered_values(first: int, n: int) -> list[bytes]:
    """Values of VALUE_SIZE bytes, each starting with its (expected) id, 8 bytes big-endian."""
    pad = bytes(VALUE_SIZE - 8)
    return [i.to_bytes(8, "big") + pad for i in range(first, first + n)]


@dataclass(slots=True)
class SlowRead:
    next_id: int = 1  # the id the reader expects next
    batches: int = 0
    ids_at_published: int = 0  # events read when publishing had finished
    batches_after: int = 0


async def slow_reader(url: str, published: asyncio.Event, state: SlowRead) -> None:
    """Read from earliest, slowly, checking ids and values; once ``published`` is set, read
    BATCHES_AFTER_PUBLISHING more batches (they go on where it was), then cancel."""
    async with (
        tidewire.connect(url) as hub,
        contextlib.aclosing(hub.subscribe("big", prefetch=READER_PREFETCH)) as batches,
    ):
        async for batch in batches:
            n = len(batch)
            expected = array("Q", range(state.next_id, state.next_id + n))
            assert batch.ids.tobytes() == expected.tobytes(), (
                f"expected ids {state.next_id}..{state.next_id + n - 1}, got {list(batch.ids)}"
            )
            for event in batch:
                assert len(event.value) == VALUE_SIZE
                assert event.value[:8] == event.id.to_bytes(8, "big"), event.id
            state.next_id += n
            state.batches += 1
            assert state.batches <= N_VALUES, "more batches than events"  # bounded loop
            if published.is_set():
                state.batches_after += 1
                if state.batches_after >= BATCHES_AFTER_PUBLISHING:
                    return  # aclosing cancels the subscription
            await asyncio.sleep(READER_PACE_S)


async def publish_gib(url: str) -> list[Receipt]:
    async with tidewire.connect(url) as hub:
        pub = await hub.publisher("big", format="value", size=VALUE_SIZE)
        futures: list[asyncio.Future[Receipt]] = []
        for first in range(1, N_VALUES + 1, PER_SUBMIT):
            futures.append(await pub.submit(numbered_values(first, PER_SUBMIT)))
        receipts = list(await asyncio.gather(*futures))
        await pub.close()
    return receipts


@pytest.mark.slow  # ~20 s: 1 GiB written and fsynced
def test_slow_reader_keeps_server_rss_bounded(tmp_path: Path) -> None:
    with serve(tmp_path) as served:

        async def main() -> tuple[list[Receipt], SlowRead, RssSampler, float, float]:
            published = asyncio.Event()
            state = SlowRead()
            reader = asyncio.create_task(slow_reader(served.url, published, state))
            await asyncio.sleep(0)  # let the reader connect and send its subscribe first
            sampler = RssSampler(served.proc.pid)
            sampler.start()
            try:
                started = time.perf_counter()
                receipts = await publish_gib(served.url)
                publish_s = time.perf_counter() - started
                state.ids_at_published = state.next_id - 1
                published.set()
                await reader
                total_s = time.perf_counter() - started
            finally:
                sampler.stop()
                reader.cancel()
            return receipts, state, sampler, publish_s, total_s

        cpu = time.process_time(), cpu_seconds(served.proc.pid)
        receipts, state, sampler, publish_s, total_s = run(main(), timeout=180)
        client_cpu = time.process_time() - cpu[0]
        server_cpu = cpu_seconds(served.proc.pid) - cpu[1]
        lag = (N_VALUES - state.ids_at_published) * VALUE_SIZE
        growth = sampler.peak - sampler.baseline
        figures = (
            f"server VmRSS: baseline {sampler.baseline / MiB:.0f} MiB, peak "
            f"{sampler.peak / MiB:.0f} MiB, growth {growth / MiB:.0f} MiB "
            f"(bound {RSS_GROWTH_BOUND / MiB:.0f} MiB, {sampler.samples} samples); "
            f"1 GiB published in {publish_s:.1f} s ({N_VALUES * VALUE_SIZE / MiB / publish_s:.0f}"
            f" MiB/s), the slow reader had read {state.ids_at_published} of {N_VALUES} events "
            f"by then ({lag / MiB:.0f} MiB behind); {total_s:.1f} s in all; CPU: client "
            f"{client_cpu:.1f} s, server {server_cpu:.1f} s"
        )
        print("\n" + figures)
        check_receipts(receipts, [PER_SUBMIT] * (N_VALUES // PER_SUBMIT))
        assert growth < RSS_GROWTH_BOUND, figures
        # The test means something only if the reader lagged far more than the bound.
        assert lag > 2 * RSS_GROWTH_BOUND, f"the reader was not slow enough: {figures}"
        assert state.batches_after == BATCHES_AFTER_PUBLISHING
        assert state.next_id > state.ids_at_published + BATCHES_AFTER_PUBLISHING
        stop(served)
