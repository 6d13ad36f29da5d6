"""The storage interface's contract, one test per promise, run against every implementation:
the in-memory one (tests/memory_storage.py), the embedded log, and JetStream on the shared
3-node cluster (real nats-server processes). Each test uses stream names of its own, since the
cluster is shared by the session."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from helpers import run
from memory_storage import MemoryStorage
from tidewire.cluster.local import LocalCluster
from tidewire.hub import EmbeddedStorage, Hub, Storage
from tidewire.hub.storage import StreamAdmin
from tidewire.log import LogConfig, Retention, StreamExists
from tidewire.model import Batch, IdOrderError, UnknownStream

Opener = Callable[[], AbstractAsyncContextManager[Storage]]

KINDS = ["memory", "embedded", "jetstream"]


@pytest.fixture(params=KINDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the storage under test (again, for a test that reopens it), on the running loop."""
    kind = request.param
    memory = MemoryStorage()
    cluster: LocalCluster | None = None
    if kind == "jetstream":
        cluster = request.getfixturevalue("cluster")

    @asynccontextmanager
    async def open_storage() -> AsyncIterator[Storage]:
        storage: Storage
        if kind == "memory":
            storage = memory
            memory.closed = False
        elif kind == "embedded":
            storage = EmbeddedStorage.open(str(tmp_path), LogConfig(fsync=False))
        else:
            from tidewire.cluster.jetstream import JetStreamStorage

            assert cluster is not None
            storage = await JetStreamStorage.connect(cluster.urls)
        try:
            yield storage
        finally:
            await storage.close()

    return open_storage


def name(what: str) -> str:
    """A stream name no other test uses (the cluster is shared)."""
    return f"{what}.{uuid.uuid4().hex[:10]}"


def values(batches: list[Batch]) -> list[bytes]:
    return [b.value(i) for b in batches for i in range(len(b))]


def go(opener: Opener, body: Callable[[Storage], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        async with opener() as storage:
            await body(storage)

    run(main(), 60)


def test_appends_assign_or_keep_ids_and_the_queries_follow(opener: Opener) -> None:
    s = name("ids")

    async def body(storage: Storage) -> None:
        assert isinstance(storage, Storage)  # (runtime_checkable: every method is there)
        assert s not in storage
        assert storage.latest(s) == 0
        assert storage.start_id(s) == 1
        stored = await storage.append(Batch.build(s, [b"a", b"b"]), assign_ids=True)
        assert (stored.first_id, stored.last_id) == (1, 2)
        own = await storage.append(Batch.build(s, [b"c", b"d"], ids=[10, 12]))
        assert list(own.ids) == [10, 12]
        assert s in storage
        assert storage.latest(s) == storage.accepted_latest(s) == 12
        with pytest.raises(IdOrderError):
            await storage.append(Batch.build(s, [b"x"], ids=[12]))
        more = await storage.append(Batch.build(s, [b"e"]), assign_ids=True)
        assert more.first_id == 13  # (assigned ids continue from the latest, gaps kept)
        assert s in storage.streams()
        (stats,) = [x for x in storage.stats() if x.name == s]
        assert (stats.events, stats.latest_id) == (5, 13)
        assert await storage.settled(s) == 13

    go(opener, body)


def test_reads_from_any_id_within_the_limits(opener: Opener) -> None:
    s = name("read")

    async def body(storage: Storage) -> None:
        await storage.append(Batch.build(s, [b"1", b"2", b"3"]), assign_ids=True)
        await storage.append(Batch.build(s, [b"4", b"5"], keys=[b"k", None],
                                         timestamps=[7, 8]), assign_ids=True)  # fmt: skip
        await storage.append(Batch.build(s, [b"9"], ids=[9]))
        assert values(await storage.read(s, 0, 1 << 20, 100)) == [b"1", b"2", b"3", b"4",
                                                                  b"5", b"9"]  # fmt: skip
        got = await storage.read(s, 2, 1 << 20, 100)
        assert got[0].first_id == 2
        assert values(got) == [b"2", b"3", b"4", b"5", b"9"]
        assert values(await storage.read(s, 6, 1 << 20, 100)) == [b"9"]  # (gap: next id)
        assert values(await storage.read(s, 2, 1 << 20, 2)) == [b"2", b"3"]
        small = values(await storage.read(s, 1, 1, 100))  # "about" max_bytes, one at least
        assert small[0] == b"1"
        assert len(small) <= 3
        assert await storage.read(s, 10, 1 << 20, 100) == []
        (keyed,) = await storage.read(s, 4, 1 << 20, 1)
        assert keyed.event(0).key == b"k"
        assert keyed.event(0).timestamp == 7
        assert await storage.read(name("none"), 1, 1 << 20, 100) == []

    go(opener, body)


def test_wait_for_wakes_on_a_commit_and_a_cancelled_wait_leaves_nothing(opener: Opener) -> None:
    s = name("wait")

    async def body(storage: Storage) -> None:
        await storage.append(Batch.build(s, [b"a"]), assign_ids=True)
        await asyncio.wait_for(storage.wait_for(s, 0), 5)  # (already above)
        waiting = asyncio.ensure_future(storage.wait_for(s, 1))
        cancelled = asyncio.ensure_future(storage.wait_for(s, 1))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        cancelled.cancel()
        await storage.append(Batch.build(s, [b"b"]), assign_ids=True)
        await asyncio.wait_for(waiting, 10)
        assert cancelled.cancelled()

    go(opener, body)


def test_concurrent_appends_to_one_stream_keep_their_order(opener: Opener) -> None:
    s = name("order")

    async def body(storage: Storage) -> None:
        stored = await asyncio.gather(
            *(storage.append(Batch.build(s, [b"%d" % i]), assign_ids=True) for i in range(50))
        )
        assert [b.first_id for b in stored] == list(range(1, 51))  # fmt: skip
        assert await storage.settled(s) == 50
        assert values(await storage.read(s, 1, 1 << 20, 100)) == [b"%d" % i for i in range(50)]

    go(opener, body)


def test_a_hub_appends_reads_subscribes_and_commits_once_over_it(opener: Opener) -> None:
    s = name("hub")
    txn = f"t/{uuid.uuid4().hex}"

    async def main() -> None:
        async with opener() as storage:
            hub = Hub(storage)
            assert (await hub.append(Batch.build(s, [b"a", b"b"]), assign_ids=True)).last_id == 2
            sub = hub.subscribe(s, "earliest")
            sub.request(10)
            got = await asyncio.wait_for(sub.next(), 10)
            assert got is not None
            assert values(got) == [b"a", b"b"]
            live = asyncio.ensure_future(sub.next())
            await asyncio.sleep(0.05)
            assert not live.done()
            await hub.append(Batch.build(s, [b"c"]), assign_ids=True)
            delivered = await asyncio.wait_for(live, 10)
            assert delivered is not None
            assert values(delivered) == [b"c"]
            receipt = await hub.commit(txn, Batch.build(s, [b"x"]))
            assert not receipt.already
        async with opener() as storage:  # reopened (another gateway): the txn is known
            again = Hub(storage)
            assert (await again.commit(txn, Batch.build(s, [b"x"]))).already
            assert storage.latest(s) == receipt.first_id

    run(main(), 60)


def test_stats_count_events_bytes_and_the_first_id_stored(opener: Opener) -> None:
    s = name("stats")

    async def body(storage: Storage) -> None:
        await storage.append(Batch.build(s, [b"a", b"b"], ids=[5, 6]))
        await storage.append(Batch.build(s, [b"c" * 100]), assign_ids=True)
        (stats,) = [x for x in storage.stats() if x.name == s]
        assert (stats.events, stats.first_id, stats.latest_id) == (3, 5, 7)
        assert stats.bytes >= 100
        assert stats.segments >= 1
        assert storage.start_id(s) == 1  # (nothing removed: ids below 5 were never there)

    go(opener, body)


def test_stream_administration_the_same_where_it_is_offered(opener: Opener) -> None:
    """``StreamAdmin``: the embedded log and JetStream keep one contract (the same errors, a
    stream made again from id 1, the runtime retention kept over a reopen); the memory storage
    does not offer it (the hub refuses with ``NotSupported``)."""
    s, other, unknown = name("adm"), name("adm-data"), name("adm-none")

    async def main() -> None:
        async with opener() as storage:
            if not isinstance(storage, StreamAdmin):
                assert Hub(storage).retention(s) is None
                return
            assert storage.retention(s) == Retention(None, None, "default")
            await storage.create_stream(s, 60_000, None, runtime=True)
            assert s in storage
            assert s in storage.streams()
            assert storage.latest(s) == 0
            assert storage.retention(s) == Retention(60_000, None, "runtime")
            with pytest.raises(StreamExists):
                await storage.create_stream(s)
            await storage.append(Batch.build(other, [b"x"]), assign_ids=True)
            with pytest.raises(StreamExists):
                await storage.create_stream(other)
            await storage.set_retention(other, None, 1 << 20)
            with pytest.raises(UnknownStream):
                await storage.set_retention(unknown, 1, 1)
            with pytest.raises(UnknownStream):
                await storage.delete_stream(unknown)
            await storage.append(Batch.build(s, [b"a", b"b"]), assign_ids=True)
        async with opener() as storage:  # (reopened: a restart, or another gateway)
            assert isinstance(storage, StreamAdmin)
            assert storage.retention(s) == Retention(60_000, None, "runtime")
            assert storage.retention(other) == Retention(None, 1 << 20, "runtime")
            assert storage.latest(s) == 2
            await storage.delete_stream(s)
            assert s not in storage
            assert storage.latest(s) == 0
            assert storage.retention(s) == Retention(None, None, "default")
            with pytest.raises(UnknownStream):
                await storage.delete_stream(s)
            stored = await storage.append(Batch.build(s, [b"new"]), assign_ids=True)
            assert stored.first_id == 1
            got = await storage.read(s, 1, 1 << 20, 10)
            assert values(got) == [b"new"]

    run(main(), 60)
