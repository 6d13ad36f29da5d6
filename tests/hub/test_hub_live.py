"""Live tail under concurrency: subscribers that ask for events while group commits are in
flight, and many appending tasks racing several subscribers.

These tests run in a forked child process with a watchdog on the child's event loop: a
subscription that busy-loops without yielding would freeze the loop for good (neither
``asyncio.timeout`` nor pytest-timeout could interrupt it), so the child reports the stuck
stack and the test fails in seconds instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subscribing import assert_pending, collect, count, settle
from tidewire.hub import MAX_DEMAND, EmbeddedStorage, Hub
from tidewire.log import GroupItems, GroupWritten, LogConfig, StreamLog, StreamSettings
from tidewire.model import Batch

S = "ticks"
MiB = 1024 * 1024
BLOCKED_AFTER_S = 2.0

EventTuple = tuple[int, bytes, bytes | None]

# --------------------------------------------------------------------------- isolation


class _Loop:
    """What the child's watchdog watches: whether an event loop runs, and its last tick."""

    running = False
    beat = 0.0


def run_loop(main: Callable[[], Coroutine[Any, Any, None]], timeout: float = 10.0) -> None:
    """``asyncio.run(main())``, bounded by ``timeout`` and ticking for the watchdog."""

    async def heartbeat() -> None:
        while True:
            _Loop.beat = time.monotonic()
            await asyncio.sleep(0.05)

    async def guarded() -> None:
        ticker = asyncio.ensure_future(heartbeat())
        try:
            async with asyncio.timeout(timeout):
                await main()
        finally:
            ticker.cancel()

    _Loop.beat = time.monotonic()
    _Loop.running = True
    try:
        asyncio.run(guarded())
    finally:
        _Loop.running = False


def _watch(sender: Connection, loop_thread: int) -> None:
    """Report (and end the child) when a running event loop stops ticking."""
    while True:
        time.sleep(0.1)
        if _Loop.running and time.monotonic() - _Loop.beat > BLOCKED_AFTER_S:
            frame = sys._current_frames().get(loop_thread)
            stack = "".join(traceback.format_stack(frame, limit=8)) if frame is not None else "?"
            sender.send(
                f"the event loop was blocked for more than {BLOCKED_AFTER_S} s "
                f"(a coroutine never yields); the loop thread is at:\n{stack}"
            )
            os._exit(3)


def in_child(target: Callable[[], None], timeout: float) -> None:
    """Run ``target()`` in a forked child; fail with the child's traceback, or with the loop
    thread's stack if an event loop of the child stops ticking for ``BLOCKED_AFTER_S``."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)

    def child() -> None:
        watchdog = threading.Thread(
            target=_watch, args=(sender, threading.get_ident()), daemon=True
        )
        watchdog.start()
        try:
            target()
        except BaseException:
            sender.send(traceback.format_exc())
        else:
            sender.send("")

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    sender.close()
    try:
        if not receiver.poll(timeout + 10):
            pytest.fail(f"the child process gave no result within {timeout + 10} s")
        outcome: str = receiver.recv()
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
    if outcome:
        pytest.fail(outcome, pytrace=False)


def run_in_child(main: Callable[[], Coroutine[Any, Any, None]], timeout: float = 20.0) -> None:
    in_child(lambda: run_loop(main, timeout), timeout)


# --------------------------------------------------------------------------- helpers


def events(batches: Sequence[Batch]) -> list[EventTuple]:
    return [(int(b.ids[i]), b.value(i), b.key(i)) for b in batches for i in range(len(b))]


class HeldCommit:
    """Pause the hub's next group commit in its worker thread once it is written and published
    to readers (the stream's latest id moved), before the event loop hears of it."""

    def __init__(self, hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
        self.written = threading.Event()
        self.release = threading.Event()
        self._armed = True
        assert isinstance(hub.storage, EmbeddedStorage)  # (the embedded log's writer thread)
        log = hub.storage.log
        original = log.write_group

        def write(stream: StreamLog, items: GroupItems) -> GroupWritten:
            result = original(stream, items)
            if self._armed:
                self._armed = False
                self.written.set()
                self.release.wait(10)
            return result

        monkeypatch.setattr(log, "write_group", write)

    async def wait_written(self) -> None:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, self.written.wait, 5.0)


def config(recent_bytes: int) -> LogConfig:
    return LogConfig(
        defaults=StreamSettings(segment_bytes=4096), fsync=False, recent_bytes=recent_bytes
    )


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("wake", ["request", "next"])
@pytest.mark.parametrize(
    "recent_bytes",
    [pytest.param(0, id="no-memory-tail"), pytest.param(MiB, id="memory-tail")],
)
def test_reading_while_a_commit_is_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recent_bytes: int, wake: str
) -> None:
    """A subscriber at the live tail asks for events (a request that wakes a pending next(), or
    a fresh next()) while a commit is written but not yet known to the event loop: it gets the
    new event, and the loop keeps running meanwhile. Regression: next() used to busy-loop
    forever here (the memory tail answered [] instead of deferring to the disk)."""

    async def scenario() -> None:
        hub = Hub.open(str(tmp_path / "log"), config(recent_bytes))
        try:
            await hub.append(Batch.build(S, [b"a"]), assign_ids=True)
            sub = hub.subscribe(S, "latest")
            held = HeldCommit(hub, monkeypatch)
            try:
                pending: asyncio.Future[list[Batch] | None] | None = None
                if wake == "request":
                    pending = asyncio.ensure_future(sub.next())
                    await assert_pending(pending)
                appending = asyncio.ensure_future(
                    hub.append(Batch.build(S, [b"b"]), assign_ids=True)
                )
                await held.wait_written()
                assert hub.latest(S) == 2
                assert not appending.done()
                sub.request(1)
                if pending is None:
                    pending = asyncio.ensure_future(sub.next())
                await settle()  # a next() that never yields keeps the loop here for good
            finally:
                held.release.set()
            got = await pending
            assert got is not None
            assert events(got) == [(2, b"b", None)]
            assert (await appending).last_id == 2
            assert sub.demand == 0
        finally:
            await hub.close()

    run_in_child(scenario)


@pytest.mark.parametrize(
    ("recent_bytes", "reopen"),
    [
        pytest.param(0, False, id="disk-tail"),
        pytest.param(0, True, id="disk-tail-reopened"),
        pytest.param(MiB, False, id="memory-tail"),
        pytest.param(MiB, True, id="memory-tail-reopened"),
        pytest.param(600, False, id="tiny-memory-tail"),
    ],
)
def test_catch_up_then_live_with_concurrent_appenders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recent_bytes: int, reopen: bool
) -> None:
    """History, then 8 tasks appending concurrently while three subscribers follow (one with
    unbounded demand from the start, one from "latest", one asking a few events at a time with
    small deliveries): every subscriber sees exactly the stream's order, no gap, no duplicate."""
    rng = random.Random(1234)
    producers, rounds, old = 8, 30, 150
    plan = [[rng.randint(1, 6) for _ in range(rounds)] for _ in range(producers)]
    live_total = sum(map(sum, plan)) + 2  # + the two appends of the in-flight step

    async def main() -> None:
        hub = Hub.open(str(tmp_path), config(recent_bytes))
        past = []
        for lo in range(0, old, 5):
            values = [f"h{i}".encode() for i in range(lo, lo + 5)]
            past.append(await hub.append(Batch.build(S, values), assign_ids=True))
        if reopen:
            await hub.close()
            hub = Hub.open(str(tmp_path), config(recent_bytes))
        try:
            everything = hub.subscribe(S, "earliest")
            everything.request(MAX_DEMAND)
            trickle = hub.subscribe(S, "earliest", max_batch_bytes=200)

            # One plain append (so that the memory tail holds something), then one whose commit
            # is in flight when a subscriber waiting for exactly that event asks for it.
            first = [await hub.append(Batch.build(S, [b"warm"]), assign_ids=True)]
            only_new = hub.subscribe(S, "latest")
            new_first = asyncio.ensure_future(only_new.next())  # waits for demand
            held = HeldCommit(hub, monkeypatch)
            try:
                in_flight = asyncio.ensure_future(
                    hub.append(Batch.build(S, [b"held"]), assign_ids=True)
                )
                await held.wait_written()
                only_new.request(MAX_DEMAND)
                await settle()
            finally:
                held.release.set()
            first.append(await in_flight)

            async def produce(p: int) -> list[Batch]:
                stored = []
                for r, size in enumerate(plan[p]):
                    values = [f"p{p}r{r}e{k}".encode() for k in range(size)]
                    stored.append(await hub.append(Batch.build(S, values), assign_ids=True))
                    for _ in range(rng.randint(0, 2)):
                        await asyncio.sleep(0)
                return stored

            async def follow_with_small_demand() -> list[Batch]:
                out: list[Batch] = []
                total = old + live_total
                for _ in range(total):
                    if count(out) >= total:
                        break
                    asked = min(rng.randint(1, 9), total - count(out))
                    trickle.request(asked)
                    got = await trickle.next()
                    assert got
                    assert count(got) <= asked
                    assert trickle.demand == asked - count(got)
                    if trickle.demand:  # spend the rest before asking again
                        got += await collect(trickle, trickle.demand)
                    out.extend(got)
                return out

            async def follow_new() -> list[Batch]:
                got = await new_first
                assert got
                return got + await collect(only_new, live_total - 1 - count(got))

            consumers = [
                asyncio.ensure_future(collect(everything, old + live_total)),
                asyncio.ensure_future(follow_new()),
                asyncio.ensure_future(follow_with_small_demand()),
            ]
            await settle()
            written = await asyncio.gather(*(produce(p) for p in range(producers)))
            got_all, got_new, got_trickle = await asyncio.gather(*consumers)

            live = first + sorted((b for bs in written for b in bs), key=lambda b: b.first_id)
            expected = events(past) + events(live)
            assert [e[0] for e in expected] == list(range(1, old + live_total + 1))
            assert events(got_all) == expected
            assert events(got_new) == events(live[1:])
            assert events(got_trickle) == expected
            assert events(await hub.read(S, 1, max_bytes=100 * MiB)) == expected
            for sub in (everything, only_new, trickle):
                await assert_pending(asyncio.ensure_future(sub.next()))
        finally:
            await hub.close()

    run_in_child(main, timeout=30)


# --------------------------------------------------------------------------- property

KEYS: list[bytes | None] = [b"a", b"b", None]

Op = (
    # keys of the events, id gap (caller ids), in the background (log-assigned ids only)
    tuple[Literal["append"], list[bytes | None], int, bool]
    | tuple[Literal["request"], int]
    | tuple[Literal["next"]]  # start a next() if none is pending
    | tuple[Literal["check"]]  # a pending next() completes iff demand and events allow it
    | tuple[Literal["yield"], int]
)

ops_strategy: st.SearchStrategy[list[Op]] = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.lists(st.sampled_from(KEYS), min_size=1, max_size=8),
            st.integers(1, 4),
            st.booleans(),
        ),
        st.tuples(
            st.just("request"),
            st.one_of(st.integers(1, 12), st.integers(1, 12), st.just(MAX_DEMAND)),
        ),
        st.tuples(st.just("next")),
        st.tuples(st.just("check")),
        st.tuples(st.just("yield"), st.integers(0, 10)),
    ),
    max_size=40,
)


async def interleaving(
    directory: str,
    ops: list[Op],
    *,
    caller_ids: bool,
    key: bytes | None,
    max_batch_bytes: int,
    recent_bytes: int,
) -> None:
    hub = Hub.open(directory, config(recent_bytes))
    try:
        sub = hub.subscribe(S, key=key, max_batch_bytes=max_batch_bytes)
        appended: list[EventTuple] = []
        delivered: list[EventTuple] = []
        requested = 0
        pending: asyncio.Future[list[Batch] | None] | None = None
        background: list[asyncio.Future[Batch]] = []
        serial = 0

        def expected() -> list[EventTuple]:
            return [e for e in appended if key is None or e[2] == key]

        def harvest() -> None:
            nonlocal pending
            if pending is None or not pending.done():
                return
            got, pending = pending.result(), None
            assert got, f"next() returned {got!r} on a live, uncancelled subscription"
            delivered.extend(events(got))
            assert len(delivered) <= requested, "delivered more than requested"
            assert sub.delivered == len(delivered)
            assert sub.demand == (
                MAX_DEMAND if requested == MAX_DEMAND else requested - len(delivered)
            )

        async def settle_appends() -> None:
            """Wait for the background appends and add their events, in id order."""
            nonlocal background
            if background:
                stored = await asyncio.gather(*background)
                background = []
                appended.extend(events(stored))
                appended.sort(key=lambda e: e[0])

        for op in ops:
            harvest()
            if op[0] == "append":
                keys, gap, in_background = op[1], op[2], op[3]
                values = [f"v{serial + i}".encode() for i in range(len(keys))]
                serial += len(keys)
                if caller_ids:
                    last = appended[-1][0] if appended else 0
                    ids = [last + gap * (i + 1) for i in range(len(keys))]
                    batch = await hub.append(Batch.build(S, values, ids=ids, keys=keys))
                    appended.extend(events([batch]))
                elif in_background:
                    appending = hub.append(Batch.build(S, values, keys=keys), assign_ids=True)
                    background.append(asyncio.ensure_future(appending))
                else:
                    batch = await hub.append(Batch.build(S, values, keys=keys), assign_ids=True)
                    appended.extend(events([batch]))
            elif op[0] == "request":
                sub.request(op[1])
                requested = min(MAX_DEMAND, requested + op[1])
            elif op[0] == "next":
                if pending is None:
                    pending = asyncio.ensure_future(sub.next())
            elif op[0] == "check":
                await settle_appends()
                harvest()  # (a pending next() may have completed while the appends settled)
                if pending is None:
                    pending = asyncio.ensure_future(sub.next())
                if sub.demand > 0 and len(expected()) > len(delivered):
                    done, _ = await asyncio.wait({pending}, timeout=5)
                    assert done, "next() stalls with demand and events to deliver"
                    harvest()
                else:
                    await assert_pending(pending)
            else:
                for _ in range(op[1]):
                    await asyncio.sleep(0)

        # Drain: ask for exactly what is missing, then nothing more must come.
        await settle_appends()
        harvest()
        missing = len(expected()) - len(delivered)
        if missing > sub.demand:
            extra = missing - sub.demand
            sub.request(extra)
            requested = min(MAX_DEMAND, requested + extra)
        for _ in range(missing):
            if len(delivered) >= len(expected()):
                break
            if pending is None:
                pending = asyncio.ensure_future(sub.next())
            async with asyncio.timeout(5):
                await asyncio.wait({pending})
            harvest()
        assert delivered == expected()
        assert len(delivered) <= requested
        if pending is None:
            pending = asyncio.ensure_future(sub.next())
        await assert_pending(pending)
        sub.cancel()
        async with asyncio.timeout(1):
            assert await pending is None
    finally:
        await hub.close()


@given(
    ops=ops_strategy,
    caller_ids=st.booleans(),
    key=st.sampled_from([None, b"a"]),
    max_batch_bytes=st.sampled_from([1, 150, MiB]),
    recent_bytes=st.sampled_from([0, 300, MiB]),
)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def _interleavings(
    ops: list[Op], caller_ids: bool, key: bytes | None, max_batch_bytes: int, recent_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as directory:

        async def main() -> None:
            await interleaving(
                directory,
                ops,
                caller_ids=caller_ids,
                key=key,
                max_batch_bytes=max_batch_bytes,
                recent_bytes=recent_bytes,
            )

        run_loop(main, timeout=5)


def test_random_interleavings_of_appends_and_requests() -> None:
    """Whatever the interleaving of appends (assigned or caller ids with gaps, any batch size,
    keyed or not) and requests, with or without a key filter: the concatenation of every
    delivery is the appended (matching) events in order, the total delivered never exceeds the
    total requested, and a pending next() completes exactly when demand and events allow."""
    in_child(_interleavings, timeout=120)


def test_a_key_filter_cut_by_demand_skips_nothing_read_after_it(tmp_path: Path) -> None:
    """Regression (found by the interleavings above): a read of two records, the first cut
    short by the demand after its key filter, used to keep the second as the carry while the
    position stayed inside the first, so the rest of the first was never delivered."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path), config(0))
        try:
            sub = hub.subscribe(S, key=b"a", max_batch_bytes=150)
            background = asyncio.ensure_future(
                hub.append(Batch.build(S, [b"v0"], keys=[b"a"]), assign_ids=True)
            )
            await hub.append(Batch.build(S, [b"v1"], keys=[b"a"]), assign_ids=True)
            await hub.append(Batch.build(S, [b"v2"], keys=[b"a"]), assign_ids=True)
            await background
            got: list[int] = []
            for _ in range(3):
                sub.request(1)
                async with asyncio.timeout(5):
                    batches = await sub.next()
                assert batches is not None
                got += [e.id for b in batches for e in b]
            assert got == [1, 2, 3]
        finally:
            await hub.close()

    run_loop(main, timeout=10)
