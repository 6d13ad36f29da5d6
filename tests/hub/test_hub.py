"""Hub and Subscription over a real Log: start positions, catch-up then live tail, demand,
cancel, bounded subscriptions, key filter, delivery size, retention and close.

No pytest-asyncio: every test drives its coroutine with :func:`run`, which also bounds it in
time so that a hang fails fast instead of waiting for pytest-timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from helpers import run
from subscribing import assert_pending, collect, count, settle
from tidewire.hub import MAX_DEMAND, EmbeddedStorage, Hub, Subscription
from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch, DataLossError, LogClosedError

S = "orders"
MiB = 1024 * 1024
# Small segments so that a few hundred events roll over many segment files.
SMALL = LogConfig(defaults=StreamSettings(segment_bytes=4096), fsync=False)

EventTuple = tuple[int, bytes, bytes | None]


# --------------------------------------------------------------------------- helpers


@asynccontextmanager
async def open_hub(path: Path, config: LogConfig = SMALL) -> AsyncIterator[Hub]:
    hub = Hub.open(str(path), config)
    try:
        yield hub
    finally:
        await hub.close()


def events(batches: Sequence[Batch]) -> list[EventTuple]:
    return [(int(b.ids[i]), b.value(i), b.key(i)) for b in batches for i in range(len(b))]


def ids_of(batches: Sequence[Batch]) -> list[int]:
    return [int(i) for b in batches for i in b.ids]


async def append_values(
    hub: Hub,
    values: Sequence[bytes],
    *,
    per_batch: int = 1,
    keys: Sequence[bytes | None] | None = None,
    timestamp: int | None = None,
) -> list[Batch]:
    """Append ``values`` with log-assigned ids, ``per_batch`` events per append."""
    stored: list[Batch] = []
    for lo in range(0, len(values), per_batch):
        chunk = values[lo : lo + per_batch]
        chunk_keys = None if keys is None else keys[lo : lo + per_batch]
        batch = Batch.build(S, chunk, keys=chunk_keys, timestamps=timestamp)
        stored.append(await hub.append(batch, assign_ids=True))
    return stored


def payloads(n: int, prefix: str = "e", size: int = 0) -> list[bytes]:
    return [f"{prefix}{i}".encode().ljust(size, b".") for i in range(n)]


async def history(
    path: Path, n: int, *, reopen: bool, per_batch: int = 1
) -> tuple[Hub, list[Batch]]:
    """A hub whose stream holds ``n`` events; with ``reopen`` they were written by a previous
    hub, so the new one has no in-memory tail and serves them from disk."""
    hub = Hub.open(str(path), SMALL)
    stored = await append_values(hub, payloads(n), per_batch=per_batch)
    if reopen:
        await hub.close()
        hub = Hub.open(str(path), SMALL)
    return hub, stored


# --------------------------------------------------------------------------- start positions


@pytest.mark.parametrize("reopen", [False, True], ids=["memory", "disk"])
def test_earliest_delivers_history_across_segment_rolls(tmp_path: Path, reopen: bool) -> None:
    async def main() -> None:
        hub, stored = await history(tmp_path, 300, reopen=reopen, per_batch=3)
        try:
            (stats,) = hub.streams()
            assert stats.segments > 3, "the test must cross segment boundaries"
            sub = hub.subscribe(S, "earliest")
            sub.request(MAX_DEMAND)
            got = await collect(sub, 300)
            assert events(got) == events(stored)
            assert ids_of(got) == list(range(1, 301))
            await assert_pending(asyncio.ensure_future(sub.next()))
        finally:
            await hub.close()

    run(main())


def test_latest_delivers_only_events_appended_after_subscribing(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await append_values(hub, payloads(10, "old"))
            sub = hub.subscribe(S, "latest")
            sub.request(MAX_DEMAND)
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            stored = await append_values(hub, payloads(3, "new"), per_batch=3)
            got = await pending
            assert got is not None
            got += await collect(sub, 3 - count(got))
            assert events(got) == events(stored)
            assert ids_of(got) == [11, 12, 13]

    run(main())


def test_latest_is_fixed_when_subscribing(tmp_path: Path) -> None:
    """Events appended between subscribe() and the first next() are delivered."""

    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await append_values(hub, payloads(5))
            sub = hub.subscribe(S, "latest")
            await append_values(hub, payloads(4, "later"))
            sub.request(MAX_DEMAND)
            assert ids_of(await collect(sub, 4)) == [6, 7, 8, 9]

    run(main())


@pytest.mark.parametrize("reopen", [False, True], ids=["memory", "disk"])
@pytest.mark.parametrize("start", [1, 2, 57, 150, 199, 200])
def test_explicit_start_id_is_inclusive(tmp_path: Path, reopen: bool, start: int) -> None:
    async def main() -> None:
        hub, stored = await history(tmp_path, 200, reopen=reopen, per_batch=7)
        try:
            assert hub.resolve_start(S, start) == start
            sub = hub.subscribe(S, start)
            sub.request(MAX_DEMAND)
            got = await collect(sub, 201 - start)
            assert events(got) == events(stored)[start - 1 :]
        finally:
            await hub.close()

    run(main())


def test_start_past_latest_waits_for_that_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await append_values(hub, payloads(5))
            sub = hub.subscribe(S, 8)
            sub.request(MAX_DEMAND)
            pending = asyncio.ensure_future(sub.next())
            await append_values(hub, payloads(2, "x"))  # ids 6, 7: before the start
            await assert_pending(pending)
            await append_values(hub, payloads(2, "y"), per_batch=2)  # ids 8, 9
            got = await pending
            assert got is not None
            got += await collect(sub, 2 - count(got))
            assert events(got) == [(8, b"y0", None), (9, b"y1", None)]

    run(main())


def test_start_id_zero_means_from_the_first_event(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            stored = await append_values(hub, payloads(20), per_batch=4)
            assert hub.resolve_start(S, 0) == 1
            sub = hub.subscribe(S, 0)
            sub.request(MAX_DEMAND)
            assert events(await collect(sub, 20)) == events(stored)

    run(main())


def test_start_ids_with_gaps(tmp_path: Path) -> None:
    """Caller-chosen ids: a start inside a gap begins at the next existing event."""

    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await hub.append(Batch.build(S, [b"a", b"b"], ids=[10, 20]))
            await hub.append(Batch.build(S, [b"c"], ids=[30]))
            for start, expected in [(0, [10, 20, 30]), (10, [10, 20, 30]), (11, [20, 30]),
                                    (20, [20, 30]), (25, [30]), (30, [30])]:  # fmt: skip
                sub = hub.subscribe(S, start)
                sub.request(MAX_DEMAND)
                assert ids_of(await collect(sub, len(expected))) == expected, start

    run(main())


def test_resolve_start(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            assert hub.resolve_start("absent", "earliest") == 1
            assert hub.resolve_start("absent", "latest") == 1
            await append_values(hub, payloads(12), per_batch=4)
            assert hub.resolve_start(S, "earliest") == 1
            assert hub.resolve_start(S, "latest") == 13
            assert hub.resolve_start(S, 5) == 5
            assert hub.resolve_start(S, 100) == 100
            with pytest.raises(ValueError, match="bad start"):
                hub.resolve_start(S, -1)
            with pytest.raises(ValueError, match="bad start"):
                hub.resolve_start(S, "first")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="bad start"):
                hub.subscribe(S, -5)

    run(main())


def test_subscribe_before_the_stream_exists(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            sub = hub.subscribe(S, "earliest")
            late = hub.subscribe(S, "latest")
            sub.request(MAX_DEMAND)
            late.request(MAX_DEMAND)
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            assert not hub.has_stream(S)
            stored = await append_values(hub, payloads(3), per_batch=3)
            got = await pending
            assert got is not None
            assert events(got) == events(stored)
            assert events(await collect(late, 3)) == events(stored)

    run(main())


# --------------------------------------------------------------------------- demand


@pytest.mark.parametrize("reopen", [False, True], ids=["memory", "disk"])
@pytest.mark.parametrize("per_batch", [1, 100])
def test_demand_bounds_delivery(tmp_path: Path, reopen: bool, per_batch: int) -> None:
    async def main() -> None:
        hub, stored = await history(tmp_path, 100, reopen=reopen, per_batch=per_batch)
        try:
            sub = hub.subscribe(S, "earliest")
            sub.request(3)
            got = await sub.next()
            assert got is not None
            assert ids_of(got) == [1, 2, 3]
            assert sub.demand == 0
            assert sub.delivered == 3
            assert not sub.poll_ready()
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            sub.request(2)
            got = await pending
            assert got is not None
            assert ids_of(got) == [4, 5]
            assert sub.demand == 0
            sub.request(1)
            assert sub.poll_ready()
            sub.request(1)
            got = await collect(sub, 2)
            assert ids_of(got) == [6, 7]
            assert sub.delivered == 7
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            sub.request(200)  # more than the stream holds
            rest = await pending
            assert rest is not None
            rest += await collect(sub, 93 - count(rest))
            assert events(rest) == events(stored)[7:]
            assert sub.demand == 107
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)  # waiting for data now, not for demand
            new = await append_values(hub, payloads(1, "live"))
            assert events((await pending) or []) == events(new)
            assert sub.demand == 106
        finally:
            await hub.close()

    run(main())


def test_no_demand_no_delivery_even_with_live_data(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            sub = hub.subscribe(S, "earliest")
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            await append_values(hub, payloads(10))
            await assert_pending(pending)
            assert not sub.poll_ready()
            assert sub.delivered == 0
            sub.request(4)
            assert ids_of((await pending) or []) == [1, 2, 3, 4]

    run(main())


@pytest.mark.parametrize("n", [0, -1, -(2**63)])
def test_request_must_be_positive(tmp_path: Path, n: int) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            sub = hub.subscribe(S)
            with pytest.raises(ValueError, match="at least 1"):
                sub.request(n)
            assert sub.demand == 0
            sub.request(5)
            with pytest.raises(ValueError, match="at least 1"):
                sub.request(n)
            assert sub.demand == 5

    run(main())


def test_demand_saturates_and_is_then_unbounded(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await append_values(hub, payloads(100), per_batch=10)
            sub = hub.subscribe(S)
            sub.request(MAX_DEMAND)
            sub.request(MAX_DEMAND)
            assert sub.demand == MAX_DEMAND == 2**63 - 1
            assert ids_of(await collect(sub, 100)) == list(range(1, 101))
            assert sub.demand == MAX_DEMAND  # unbounded: never decremented
            assert sub.delivered == 100
            sub.request(1)
            assert sub.demand == MAX_DEMAND
            await append_values(hub, payloads(50, "more"), per_batch=25)
            assert ids_of(await collect(sub, 50)) == list(range(101, 151))
            assert sub.demand == MAX_DEMAND

            near = hub.subscribe(S)
            near.request(MAX_DEMAND - 1)
            assert near.demand == MAX_DEMAND - 1
            near.request(5)
            assert near.demand == MAX_DEMAND
            bounded = hub.subscribe(S)
            bounded.request(MAX_DEMAND - 1)
            await collect(bounded, 150)
            assert bounded.demand == MAX_DEMAND - 1 - 150  # below the cap: counted down

    run(main())


# --------------------------------------------------------------------------- cancel


def test_cancel_while_waiting_for_demand(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await append_values(hub, payloads(5))
            sub = hub.subscribe(S)
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            sub.cancel()
            async with asyncio.timeout(1):
                assert await pending is None
            assert sub.done
            sub.cancel()  # idempotent
            sub.request(10)
            assert await sub.next() is None
            assert sub.delivered == 0

    run(main())


@pytest.mark.parametrize("stream_exists", [True, False])
def test_cancel_while_waiting_for_data(tmp_path: Path, stream_exists: bool) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            if stream_exists:
                await append_values(hub, payloads(5))
            sub = hub.subscribe(S, "latest")
            sub.request(5)
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            sub.cancel()
            async with asyncio.timeout(1):
                assert await pending is None
            await append_values(hub, payloads(3, "after"))
            assert await sub.next() is None
            assert sub.delivered == 0

    run(main())


@pytest.mark.parametrize("where", ["demand", "data", "disk-read"])
def test_cancelling_the_task_awaiting_next_loses_nothing(tmp_path: Path, where: str) -> None:
    """A caller may abandon a next() (a timeout, a closed connection): the position and the
    demand stay as they were, so the next call delivers the same events, once."""

    async def main() -> None:
        hub, stored = await history(tmp_path, 40, reopen=where == "disk-read", per_batch=4)
        try:
            sub = hub.subscribe(S, "latest" if where == "data" else "earliest")
            if where != "demand":
                sub.request(10)
            task = asyncio.ensure_future(sub.next())
            if where == "disk-read":
                await asyncio.sleep(0)  # now inside the worker-thread read
                assert not task.done()
            else:
                await assert_pending(task)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert sub.delivered == 0
            assert sub.demand == (0 if where == "demand" else 10)
            if where == "demand":
                sub.request(10)
            if where == "data":
                with pytest.raises(TimeoutError):  # abandoned by a timeout, this time
                    await asyncio.wait_for(sub.next(), 0.01)
                stored = await append_values(hub, payloads(10, "n"), per_batch=10)
            got = await collect(sub, 10)
            first = 41 if where == "data" else 1
            assert ids_of(got) == list(range(first, first + 10))
            assert events(got) == [e for e in events(stored) if e[0] >= first][:10]
            assert sub.demand == 0
        finally:
            await hub.close()

    run(main())


# --------------------------------------------------------------------------- until_id


@pytest.mark.parametrize("asked", [MAX_DEMAND, 3])
def test_until_id_completes_after_the_last_event(tmp_path: Path, asked: int) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            stored = await append_values(hub, payloads(30), per_batch=4)  # 9..12 straddles
            sub = hub.subscribe(S, 3, until_id=10)
            got: list[Batch] = []
            for _ in range(20):
                if sub.demand == 0:
                    sub.request(asked)
                batches = await sub.next()
                if batches is None:
                    break
                assert count(batches) <= asked
                got += batches
            assert events(got) == events(stored)[2:10]
            assert sub.complete
            assert await sub.next() is None

    run(main())


def test_until_id_reached_by_the_live_tail(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await append_values(hub, payloads(3))
            sub = hub.subscribe(S, "latest", until_id=5)
            sub.request(MAX_DEMAND)
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            await append_values(hub, payloads(4, "n"), per_batch=4)  # ids 4..7
            assert ids_of((await pending) or []) == [4, 5]
            assert await sub.next() is None
            assert sub.demand == MAX_DEMAND

    run(main())


def test_until_id_in_a_gap_of_caller_ids(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await hub.append(Batch.build(S, [b"a", b"b"], ids=[10, 20]))
            await hub.append(Batch.build(S, [b"c", b"d"], ids=[30, 40]))
            sub = hub.subscribe(S, until_id=25)
            sub.request(MAX_DEMAND)
            assert ids_of(await collect(sub, 2)) == [10, 20]
            assert await sub.next() is None
            assert sub.complete

            # At the live tail nothing says yet that no id in 21..25 will come.
            live = hub.subscribe(S, "latest", until_id=55)
            live.request(MAX_DEMAND)
            await hub.append(Batch.build(S, [b"e"], ids=[50]))
            assert ids_of(await collect(live, 1)) == [50]
            pending = asyncio.ensure_future(live.next())
            await assert_pending(pending)
            await hub.append(Batch.build(S, [b"f"], ids=[52]))
            assert ids_of((await pending) or []) == [52]
            pending = asyncio.ensure_future(live.next())
            await assert_pending(pending)
            await hub.append(Batch.build(S, [b"g", b"h"], ids=[60, 70]))  # past until_id
            async with asyncio.timeout(1):
                assert await pending is None
            assert live.complete

    run(main())


@pytest.mark.parametrize("reopen", [False, True], ids=["memory", "disk"])
@pytest.mark.parametrize(
    ("until", "expected", "complete"),
    [
        (4, [], True),
        (5, [5], True),
        (7, [5], True),
        (8, [5, 8], True),
        (11, [5, 8, 11], True),
        (12, [5, 8, 11, 12], True),
        (30, [5, 8, 11, 12, 20], False),
    ],
)
def test_until_id_inside_a_batch_of_caller_ids(
    tmp_path: Path, reopen: bool, until: int, expected: list[int], complete: bool
) -> None:
    """until_id on, between and after the ids of one stored batch (5, 8, 11, 12, 20)."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path), SMALL)
        await hub.append(Batch.build(S, [b"a", b"b", b"c", b"d", b"e"], ids=[5, 8, 11, 12, 20]))
        if reopen:
            await hub.close()
            hub = Hub.open(str(tmp_path), SMALL)
        try:
            sub = hub.subscribe(S, until_id=until)
            sub.request(MAX_DEMAND)
            got = await collect(sub, len(expected)) if expected else []
            assert ids_of(got) == expected
            pending = asyncio.ensure_future(sub.next())
            if complete:
                async with asyncio.timeout(1):
                    assert await pending is None
                assert sub.complete
            else:
                await assert_pending(pending)  # 21..until may still come
                assert not sub.complete
                sub.cancel()
                assert await pending is None
        finally:
            await hub.close()

    run(main())


def test_until_id_between_records_with_demand_one(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await hub.append(Batch.build(S, [b"a", b"b", b"c"], ids=[2, 4, 6]))
            await hub.append(Batch.build(S, [b"d", b"e"], ids=[9, 11]))
            sub = hub.subscribe(S, 3, until_id=10)
            got: list[int] = []
            for _ in range(10):
                sub.request(1)
                batches = await sub.next()
                if batches is None:
                    break
                assert count(batches) == 1
                got += ids_of(batches)
            assert got == [4, 6, 9]
            assert sub.complete

    run(main())


@pytest.mark.parametrize(("start", "until"), [(5, 4), (1, 0), ("latest", 3)])
def test_until_id_before_the_start_is_already_complete(
    tmp_path: Path, start: int | str, until: int
) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await append_values(hub, payloads(3))
            sub = hub.subscribe(S, start, until_id=until)  # type: ignore[arg-type]
            sub.request(MAX_DEMAND)
            assert sub.complete
            assert await sub.next() is None
            assert sub.delivered == 0

    run(main())


# --------------------------------------------------------------------------- key filter


def test_key_filter_delivers_matching_events_and_counts_only_those(tmp_path: Path) -> None:
    cycle: list[bytes | None] = [b"a", b"b", None, b"", b"a", b"c"]
    keys = [cycle[i % len(cycle)] for i in range(120)]

    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            stored = await append_values(hub, payloads(120), per_batch=7, keys=keys)
            everything = events(stored)
            only_a = [e for e in everything if e[2] == b"a"]
            assert len(only_a) == 40

            sub = hub.subscribe(S, key=b"a")
            sub.request(5)
            got = await collect(sub, 5)
            assert events(got) == only_a[:5]
            assert sub.demand == 0
            assert sub.delivered == 5
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            sub.request(MAX_DEMAND)
            first = await pending
            assert first is not None
            got = first + await collect(sub, 35 - count(first))
            assert events(got) == only_a[5:]

            live = [b"a", b"z", None, b"a"]
            more = await append_values(hub, payloads(4, "live"), per_batch=4, keys=live)
            assert events(await collect(sub, 2)) == [e for e in events(more) if e[2] == b"a"]
            await assert_pending(asyncio.ensure_future(sub.next()))

            empty = hub.subscribe(S, key=b"")
            empty.request(MAX_DEMAND)
            want = [e for e in everything if e[2] == b""]
            assert events(await collect(empty, len(want))) == want

            nobody = hub.subscribe(S, key=b"nobody")
            nobody.request(MAX_DEMAND)
            pending = asyncio.ensure_future(nobody.next())
            await assert_pending(pending)
            assert nobody.next_id > 1  # it moved past the events it filtered out
            await hub.append(Batch.build(S, [b"x"], keys=[b"nobody"]), assign_ids=True)
            assert [e[1:] for e in events((await pending) or [])] == [(b"x", b"nobody")]

    run(main())


def test_key_filter_on_events_without_keys(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_hub(tmp_path) as hub:
            await append_values(hub, payloads(20), per_batch=5)
            sub = hub.subscribe(S, key=b"k")
            sub.request(3)
            pending = asyncio.ensure_future(sub.next())
            await assert_pending(pending)
            assert sub.demand == 3
            await hub.append(Batch.build(S, [b"v"], keys=[b"k"]), assign_ids=True)
            assert events((await pending) or []) == [(21, b"v", b"k")]
            assert sub.demand == 2

    run(main())


# --------------------------------------------------------------------------- max_batch_bytes


async def deliveries_of(sub: Subscription, n: int) -> list[list[Batch]]:
    """Every delivery of ``sub`` until ``n`` events came."""
    out: list[list[Batch]] = []
    for _ in range(n):
        if sum(count(d) for d in out) >= n:
            break
        got = await sub.next()
        assert got
        out.append(got)
    assert sum(count(d) for d in out) == n
    return out


def nbytes(delivery: Sequence[Batch]) -> int:
    return sum(b.nbytes for b in delivery)


@pytest.mark.parametrize("reopen", [False, True], ids=["memory", "disk"])
@pytest.mark.parametrize("per_batch", [1, 7, 150])
@pytest.mark.parametrize("limit", [1, 500, 2000])
def test_max_batch_bytes_bounds_each_delivery(
    tmp_path: Path, reopen: bool, per_batch: int, limit: int
) -> None:
    """Deliveries hold at least one event, stay within ``limit`` unless they hold a single
    event, and are about full: a small limit means more deliveries, never fewer events."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path), SMALL)
        stored = await append_values(hub, payloads(150, size=100), per_batch=per_batch)
        one = 20 + 100  # what one more event adds to a batch's nbytes
        if reopen:
            await hub.close()
            hub = Hub.open(str(tmp_path), SMALL)
        try:
            sub = hub.subscribe(S, max_batch_bytes=limit)
            sub.request(MAX_DEMAND)
            deliveries = await deliveries_of(sub, 150)
            assert events([b for d in deliveries for b in d]) == events(stored)
            for d in deliveries:
                assert count(d) == 1 or nbytes(d) <= limit
            if limit < one:
                assert all(count(d) == 1 for d in deliveries)
            else:
                assert len(deliveries) <= 150 * (one + 4) // (limit - one - 8) + 2
        finally:
            await hub.close()

    run(main())


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@pytest.mark.parametrize("reopen", [False, True], ids=["memory", "disk"])
@pytest.mark.parametrize(
    ("slack", "per_delivery"),
    [
        pytest.param(0, 8, id="8-fit-exactly"),
        pytest.param(60, 8, id="8-fit"),
        pytest.param(-1, 7, id="8-miss-by-1-byte"),
    ],
)
def test_max_batch_bytes_splits_a_large_batch(
    tmp_path: Path, reopen: bool, keyed: bool, slack: int, per_delivery: int
) -> None:
    """One append of 100 events is split into deliveries of at most ``max_batch_bytes``, each
    as full as the limit allows: the limit is what 8 events take (``nbytes``) plus ``slack``.
    Regression: Batch.fit used to leave out the 4 (8 with keys) bytes of offset sentinels."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path), SMALL)
        keys = [b"key-%05d" % i for i in range(100)] if keyed else None
        stored = await append_values(hub, payloads(100, size=100), per_batch=100, keys=keys)
        limit = stored[0].slice(0, 8).nbytes + slack
        if reopen:
            await hub.close()
            hub = Hub.open(str(tmp_path), SMALL)
        try:
            sub = hub.subscribe(S, max_batch_bytes=limit)
            sub.request(MAX_DEMAND)
            deliveries = await deliveries_of(sub, 100)
            assert events([b for d in deliveries for b in d]) == events(stored)
            sizes = [nbytes(d) for d in deliveries]
            assert all(size <= limit for size in sizes), f"{sizes} over {limit}"
            full, rest = divmod(100, per_delivery)
            assert [count(d) for d in deliveries] == [per_delivery] * full + [rest]
        finally:
            await hub.close()

    run(main())


@pytest.mark.parametrize("reopen", [False, True], ids=["memory", "disk"])
def test_max_batch_bytes_across_a_segment_boundary(tmp_path: Path, reopen: bool) -> None:
    """A delivery that starts 16 events before the end of a segment, with room for 16 events
    and a bit: it must stop at the segment's end, not take one more event from the next.
    Regression: the first-event allowance used to be granted again by every segment."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path), SMALL)
        stored = await append_values(hub, payloads(100, size=100))
        one = stored[0].nbytes
        limit = 16 * one + one // 2
        if reopen:
            await hub.close()
            hub = Hub.open(str(tmp_path), SMALL)
        try:
            assert isinstance(hub.storage, EmbeddedStorage)  # (segments are the log's)
            end = hub.storage.log.stream(S).segments[0].last_id
            assert 16 < end < 100
            sub = hub.subscribe(S, end - 15, max_batch_bytes=limit)
            sub.request(MAX_DEMAND)
            got = await sub.next()
            assert got is not None
            assert nbytes(got) <= limit, f"{count(got)} events, {nbytes(got)} bytes"
            assert ids_of(got) == list(range(end - 15, end + 1))
        finally:
            await hub.close()

    run(main())


# --------------------------------------------------------------------------- retention

OLD = 1_000  # ms timestamps of old events
NOW = 10_000_000
AGED = LogConfig(defaults=StreamSettings(segment_bytes=4096, retention_ms=60_000), fsync=False)


async def aged_history(path: Path, *, reopen: bool) -> tuple[Hub, list[Batch]]:
    """200 old events over several segments, then 10 recent ones in the active segment."""
    hub = Hub.open(str(path), AGED)
    stored = await append_values(hub, payloads(200, size=40), per_batch=10, timestamp=OLD)
    stored += await append_values(hub, payloads(10, "new"), per_batch=10, timestamp=NOW)
    if reopen:
        await hub.close()
        hub = Hub.open(str(path), AGED)
    return hub, stored


@pytest.mark.parametrize("reopen", [False, True], ids=["memory", "disk"])
def test_retention_fails_a_subscriber_whose_position_was_removed(
    tmp_path: Path, reopen: bool
) -> None:
    async def main() -> None:
        hub, stored = await aged_history(tmp_path, reopen=reopen)
        try:
            reader = hub.subscribe(S)
            reader.request(3)
            assert ids_of(await collect(reader, 3)) == [1, 2, 3]
            idle = hub.subscribe(S, 50)
            pending = asyncio.ensure_future(idle.next())  # waiting for demand
            ahead = hub.subscribe(S, "latest")
            ahead.request(MAX_DEMAND)
            waiting = asyncio.ensure_future(ahead.next())  # waiting for data
            await settle()

            assert hub.start_id(S) == 1
            assert hub.enforce_retention(NOW) > 0
            first = hub.start_id(S)
            assert 50 < first <= 201, "retention must remove the old segments only"
            assert hub.streams()[0].first_id == first

            reader.request(5)
            with pytest.raises(DataLossError) as caught:
                await reader.next()
            assert (caught.value.stream, caught.value.requested) == (S, 4)
            assert caught.value.first_id == first
            assert reader.delivered == 3

            idle.request(1)
            with pytest.raises(DataLossError) as caught:
                await pending
            assert (caught.value.requested, caught.value.first_id) == (50, first)

            await assert_pending(waiting)
            new = await append_values(hub, payloads(2, "z"), timestamp=NOW)
            got = (await waiting) or []
            got += await collect(ahead, 2 - count(got))
            assert events(got) == events(new)
            assert count(stored) == 210
        finally:
            await hub.close()

    run(main())


@pytest.mark.parametrize("reopen", [False, True], ids=["memory", "disk"])
def test_retention_skip_lost_continues_from_the_new_start(tmp_path: Path, reopen: bool) -> None:
    async def main() -> None:
        hub, stored = await aged_history(tmp_path, reopen=reopen)
        try:
            sub = hub.subscribe(S, skip_lost=True)
            sub.request(3)
            assert ids_of(await collect(sub, 3)) == [1, 2, 3]
            assert hub.enforce_retention(NOW) > 0
            first = hub.start_id(S)
            assert first > 4
            sub.request(MAX_DEMAND)
            got = await collect(sub, 211 - first)
            assert events(got) == events(stored)[first - 1 :]
            await assert_pending(asyncio.ensure_future(sub.next()))
        finally:
            await hub.close()

    run(main())


def test_resolve_start_below_the_first_retained_id(tmp_path: Path) -> None:
    async def main() -> None:
        hub, stored = await aged_history(tmp_path, reopen=False)
        try:
            hub.enforce_retention(NOW)
            first = hub.start_id(S)
            assert first > 1
            for start in (1, first - 1):
                with pytest.raises(DataLossError) as caught:
                    hub.resolve_start(S, start)
                assert (caught.value.requested, caught.value.first_id) == (start, first)
                with pytest.raises(DataLossError):
                    hub.subscribe(S, start)
                assert hub.resolve_start(S, start, skip_lost=True) == first
            assert hub.resolve_start(S, first) == first
            assert hub.resolve_start(S, "earliest") == first
            sub = hub.subscribe(S, 1, skip_lost=True)
            sub.request(MAX_DEMAND)
            assert events(await collect(sub, 211 - first)) == events(stored)[first - 1 :]
            sub = hub.subscribe(S, "earliest")
            sub.request(2)
            assert ids_of(await collect(sub, 2)) == [first, first + 1]
        finally:
            await hub.close()

    run(main())


def test_retention_by_size_never_touches_the_active_segment(tmp_path: Path) -> None:
    config = LogConfig(defaults=StreamSettings(segment_bytes=4096, retention_bytes=0), fsync=False)

    async def main() -> None:
        async with open_hub(tmp_path, config) as hub:
            stored = await append_values(hub, payloads(100, size=40), per_batch=5)
            sub = hub.subscribe(S, "latest")
            sub.request(MAX_DEMAND)
            assert hub.enforce_retention(NOW) > 0
            (stats,) = hub.streams()
            assert stats.segments == 1
            first = hub.start_id(S)
            kept = hub.subscribe(S, "earliest")
            kept.request(MAX_DEMAND)
            assert events(await collect(kept, 101 - first)) == events(stored)[first - 1 :]
            new = await append_values(hub, payloads(1, "n"))
            assert events(await collect(sub, 1)) == events(new)

    run(main())


# --------------------------------------------------------------------------- close


def test_close_cancels_a_subscription_waiting_for_demand(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path), SMALL)
        await append_values(hub, payloads(5))
        sub = hub.subscribe(S)
        pending = asyncio.ensure_future(sub.next())
        await assert_pending(pending)
        await hub.close()
        async with asyncio.timeout(1):
            assert await pending is None
        assert sub.cancelled
        assert await sub.next() is None

    run(main())


@pytest.mark.parametrize("start", ["latest", "earliest"])
def test_close_cancels_a_subscription_waiting_for_data(tmp_path: Path, start: str) -> None:
    """Regression: the closed log's wake-up used to surface as LogClosedError."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path), SMALL)
        if start == "latest":
            await append_values(hub, payloads(5))
        sub = hub.subscribe(S, start)  # type: ignore[arg-type]
        sub.request(5)
        pending = asyncio.ensure_future(sub.next())
        await assert_pending(pending)
        await hub.close()
        async with asyncio.timeout(1):
            assert await pending is None
        assert sub.cancelled

    run(main())


def test_close_flushes_queued_appends(tmp_path: Path) -> None:
    config = LogConfig(defaults=StreamSettings(segment_bytes=4096), fsync=True)

    async def main() -> list[Batch]:
        hub = Hub.open(str(tmp_path), config)
        await append_values(hub, payloads(3, "first"))
        appends = [
            asyncio.ensure_future(
                hub.append(
                    Batch.build(S, [f"q{i}-{k}".encode() for k in range(3)]), assign_ids=True
                )
            )
            for i in range(30)
        ]
        await asyncio.sleep(0)  # every append is queued, not yet durable
        assert not all(a.done() for a in appends)
        await hub.close()
        assert all(a.done() for a in appends)
        stored = [a.result() for a in appends]
        with pytest.raises(LogClosedError):
            await hub.append(Batch.build(S, [b"late"]), assign_ids=True)
        return stored

    stored = run(main())
    log = Log.open(str(tmp_path), config, read_only=True)
    try:
        on_disk = log.read(S, 4, max_bytes=100 * MiB)
    finally:
        log.close_sync()
    expected = sorted(stored, key=lambda b: b.first_id)
    assert events(on_disk) == events(expected)
    assert ids_of(on_disk) == list(range(4, 94))
