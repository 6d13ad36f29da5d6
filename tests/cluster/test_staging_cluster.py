"""Atomic appends and staged transactions in cluster mode, on the shared 3-node cluster
(docs/cluster.md "Atomic appends", "Staged parts"): an own-id append bigger than one record
is one JetStream atomic batch; a batch whose source fails half-way leaves nothing, and a
transaction whose gateway died half-way is completed once through another; parts staged
through one gateway are committed through another, exactly once, all visible at once; a part
whose messages are not as named is never taken; shards made before atomic batches are
upgraded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import nats
import pytest

from cluster_procs import everything, unique, with_storages
from helpers import run
from tidewire.client.rsio import RsioError, connect
from tidewire.client.rsio_staging import abort_parts, commit_parts, stage_part
from tidewire.cluster.jetstream import JetStreamStorage
from tidewire.cluster.jsatomic import MAX_MESSAGES
from tidewire.cluster.local import LocalCluster
from tidewire.cluster.shards import shard_config
from tidewire.cluster.staging import STAGE_STREAM
from tidewire.hub import Hub, Storage
from tidewire.hub.fingerprint import fingerprint
from tidewire.hub.staging import STAGING_TTL_MS, Content
from tidewire.model import Batch, IdOrderError, LimitExceeded
from tidewire.server.rsio import start_rsio_server

HOST = "127.0.0.1"
MiB = 1024 * 1024


def big(stream: str, n: int, size: int = MiB, tag: bytes = b"v") -> Batch:
    return Batch.build(stream, [tag + b"%d:" % i + b"x" * size for i in range(n)])


async def values_of(storage: Storage, stream: str) -> list[bytes]:
    return [b.value(i) for b in await everything(storage, stream) for i in range(len(b))]


async def staged(hub: Hub, stream: str, txn: str) -> dict[str, int]:
    """The messages staged under that key, per subject (``TW_STAGE``'s own count)."""
    storage = hub.storage
    assert isinstance(storage, JetStreamStorage)
    subject = storage.staging_area().subject("anonymous", stream, txn)
    info = await storage.api.call(f"$JS.API.STREAM.INFO.{STAGE_STREAM}",
                                  {"subjects_filter": subject})  # fmt: skip
    return dict(info["state"].get("subjects") or {})


def test_an_own_id_append_bigger_than_a_record_is_stored_at_once(cluster: LocalCluster) -> None:
    s = unique("atomic")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        await a.append(Batch.build(s, [b"before"]), assign_ids=True)
        stored = await a.append(big(s, 20).with_ids(5))  # ~20 MiB: three records at least
        assert (stored.first_id, stored.last_id) == (5, 24)
        assert a.latest(s) == 24
        await asyncio.wait_for(b.wait_for(s, 23), 10)
        got = await values_of(b, s)
        assert got[0] == b"before"
        assert [v.split(b":")[0] for v in got[1:]] == [b"v%d" % i for i in range(20)]
        assert a.stats()[a.streams().index(s)].segments >= 4  # (records: 1 + the batch's)
        with pytest.raises(IdOrderError):  # (ids at or below the stream's latest)
            await b.append(big(s, 10).with_ids(20))
        after = await a.append(Batch.build(s, [b"after"]), assign_ids=True)
        assert after.first_id == 25

    with_storages(cluster, 2, body)


def test_a_batch_whose_source_fails_half_way_leaves_nothing(cluster: LocalCluster) -> None:
    s = unique("half")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        async def failing() -> AsyncIterator[Batch]:
            yield big(s, 20)  # (three records published, none committed)
            raise RuntimeError("the gateway dies here")

        with pytest.raises(RuntimeError, match="dies here"):
            await a.append_atomic(s, 1, 40, failing)
        stored = await b.append(Batch.build(s, [b"next"]), assign_ids=True)
        assert stored.first_id == 1  # (nothing of the batch is there)
        await asyncio.wait_for(a.wait_for(s, 0), 10)
        assert await values_of(a, s) == [b"next"]

    with_storages(cluster, 2, body)


def test_a_batch_of_more_messages_than_jetstream_takes_is_refused_whole(
    cluster: LocalCluster,
) -> None:
    s = unique("many")

    async def body(a: JetStreamStorage) -> None:
        async def records() -> AsyncIterator[Batch]:
            yield Batch.build(s, [b"%04d" % i + b"e" * 96 for i in range(n)])

        n = MAX_MESSAGES + 1  # (records of one event each: 100-byte values, 200-byte records)
        with pytest.raises(LimitExceeded):
            await a.append_atomic(s, 1, n, records, record_bytes=200)
        n = MAX_MESSAGES  # (as many as it takes: stored, all at once)
        assert await a.append_atomic(s, 1, n, records, record_bytes=200) == (1, n)
        assert (a.stats()[a.streams().index(s)].segments, a.latest(s)) == (n, n)  # (records)

    with_storages(cluster, 1, body)


def test_parts_staged_through_one_gateway_are_committed_through_another_once(
    cluster: LocalCluster,
) -> None:
    s = unique("staged")

    async def main() -> None:
        hubs = [Hub(await JetStreamStorage.connect(cluster.urls)) for _ in range(2)]
        servers = [await start_rsio_server(hub, HOST, 0) for hub in hubs]
        urls = [f"rsio://{HOST}:{server.port}" for server in servers]
        try:
            async with connect(urls[0]) as one, connect(urls[1]) as two:
                p0 = await stage_part(one, s, "T", "0.1", [big(s, 6, tag=b"a")])
                p1 = await stage_part(two, s, "T", "1.1", [big(s, 6, tag=b"b")])
                unnamed = await stage_part(one, s, "T", "2.1", [big(s, 1, tag=b"z")])
                assert p0.records >= 2  # (records of up to 4 MiB: the client's)
                assert hubs[0].txns.staged_bytes() >= 0
                receipt = await commit_parts(two, s, "T", [p0, p1])
                assert receipt is not None
                assert (receipt.first_id, receipt.last_id) == (1, 12)
                again = await commit_parts(one, s, "T", [p0, p1])  # a replay, elsewhere
                assert again is not None
                assert (again.first_id, again.last_id) == (1, 12)
                tags = [v.split(b":")[0] for v in await values_of(hubs[0].storage, s)]
                assert tags == [b"a%d" % i for i in range(6)] + [b"b%d" % i for i in range(6)]
                # The commit dropped every part of the key, the unnamed one too.
                assert unnamed.count == 1
                assert await staged(hubs[0], s, "T") == {}
                p2 = await stage_part(one, s, "V", "0.1", [big(s, 1)])
                await abort_parts(two, s, "V")
                with pytest.raises(RsioError, match="not staged"):
                    await commit_parts(one, s, "V", [p2])
        finally:
            for server in servers:
                await server.close()
            for hub in hubs:
                await hub.close()

    run(main(), 120)


def test_a_part_missing_a_message_is_not_taken(cluster: LocalCluster) -> None:
    s = unique("gap")

    async def main() -> None:
        hub = Hub(await JetStreamStorage.connect(cluster.urls))
        server = await start_rsio_server(hub, HOST, 0)
        try:
            async with connect(f"rsio://{HOST}:{server.port}") as c:
                part = await stage_part(c, s, "T", "0.1", [big(s, 10)])
                assert part.records >= 3
                storage = hub.storage
                assert isinstance(storage, JetStreamStorage)
                assert sum((await staged(hub, s, "T")).values()) == part.records
                subject = storage.staging_area().subject("anonymous", s, "T", "0.1")
                msgs = await storage.api.direct_messages(STAGE_STREAM, subject, 1, 100, 64 * MiB)
                middle = int((msgs[1].headers or {})["Nats-Sequence"])
                await storage.api.call(f"$JS.API.STREAM.MSG.DELETE.{STAGE_STREAM}",
                                       {"seq": middle})  # fmt: skip
                with pytest.raises(RsioError, match=r"holds 3 event\(s\) .*not the 10 of"):
                    await commit_parts(c, s, "T", [part])  # (the first record's 3 only)
                assert s not in hub.storage
        finally:
            await server.close()
            await hub.close()

    run(main(), 120)


def test_staging_expires_with_the_ttl(cluster: LocalCluster) -> None:
    async def body(a: JetStreamStorage) -> None:
        staging = a.staging_area()
        staging.ttl_ms = 3_600_000
        await staging.ensure()
        info = await a.api.call(f"$JS.API.STREAM.INFO.{STAGE_STREAM}")
        assert info["config"]["max_age"] == 3_600_000 * 1_000_000
        staging.ttl_ms = 7_200_000
        await staging.ensure()
        info = await a.api.call(f"$JS.API.STREAM.INFO.{STAGE_STREAM}")
        assert json.dumps(info["config"]["max_age"]) == str(7_200_000 * 1_000_000)
        staging.ttl_ms = STAGING_TTL_MS  # (as the other tests' gateways have it)
        await staging.ensure()

    with_storages(cluster, 1, body)


def test_a_shard_made_without_atomic_batches_is_upgraded_at_connect(
    own_cluster: Callable[[int], LocalCluster],
) -> None:
    cluster = own_cluster(1)

    async def main() -> None:
        nc = await nats.connect(servers=cluster.urls)
        try:  # (TW_0 as a tidewire before atomic appends made it)
            old = {k: v for k, v in shard_config(0, 1).items() if k != "allow_atomic"}
            await nc.request("$JS.API.STREAM.CREATE.TW_0", json.dumps(old).encode(), timeout=10)
        finally:
            await nc.close()
        storage = await JetStreamStorage.connect(cluster.urls, shards=1)
        try:
            info = await storage.api.call("$JS.API.STREAM.INFO.TW_0")
            assert info["config"]["allow_atomic"] is True
            stored = await storage.append(big("s", 10).with_ids(1))  # (an atomic batch)
            assert stored.last_id == storage.latest("s") == 10
        finally:
            await storage.close()

    run(main(), 60)


def test_a_commit_that_died_half_way_is_completed_once_through_another_gateway(
    cluster: LocalCluster,
) -> None:
    """The gap atomic batches close: a gateway that dies in the middle of a transaction's
    append (its intent recorded, part of its records published) leaves nothing stored, so the
    next commit of the key, through another gateway, finds the intent OPEN and completes it
    at its ids: stored once, with the ids the first commit would have answered."""
    s = unique("died")

    async def main() -> None:
        a = Hub(await JetStreamStorage.connect(cluster.urls))
        b = Hub(await JetStreamStorage.connect(cluster.urls))
        try:
            batch = big(s, 20)  # ~20 MiB: three records

            async def dies(first: int) -> tuple[int, int]:
                async def half() -> AsyncIterator[Batch]:
                    yield batch.slice(0, 12)
                    raise RuntimeError("the gateway dies here")

                storage = a.storage
                assert isinstance(storage, JetStreamStorage)
                return await storage.append_atomic(s, first, len(batch), half)

            content = Content(len(batch), fingerprint(batch), dies)
            with pytest.raises(RuntimeError, match="dies here"):
                await a.commit_content("T", s, content, batch.nbytes, principal="p")
            assert s not in b.storage
            receipt = await b.commit("T", batch, principal="p")
            assert (receipt.first_id, receipt.last_id, receipt.already) == (1, 20, False)
            again = await a.commit("T", batch, principal="p")
            assert (again.first_id, again.already) == (1, True)
            got = await values_of(b.storage, s)
            assert [v.split(b":")[0] for v in got] == [b"v%d" % i for i in range(20)]
        finally:
            await a.close()
            await b.close()

    run(main(), 120)
