"""JetStreamStorage on the shared 3-node cluster: several gateways on one stream, lost acks,
retention, corruption, big batches, refusals for want of space, the cluster's status."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Mapping
from typing import Any

import nats
import pytest

from cluster_procs import everything, unique, with_storages
from helpers import run, until
from tidewire.cluster.jetstream import JetStreamStorage
from tidewire.cluster.jsapi import CorruptRecordError, JetStreamError, StoredRecord
from tidewire.cluster.local import LocalCluster
from tidewire.cluster.shards import shard_config
from tidewire.cluster.subjects import IDS, SUM, WRITE, RecordSum, shard_of, subject_of
from tidewire.log import LogConfig, StreamSettings
from tidewire.model import Batch, DataLossError, IdOrderError, LogError, StorageFullError
from tidewire.record import encode


def name(what: str) -> str:
    return unique(what)


def ids_of(batches: list[Batch]) -> list[int]:
    return [int(i) for b in batches for i in b.ids]


def test_two_gateways_append_to_one_stream_in_order_nothing_lost_or_twice(
    cluster: LocalCluster,
) -> None:
    s = name("two")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        async def writer(storage: JetStreamStorage, tag: bytes) -> list[Batch]:
            done = []
            for i in range(40):
                batch = Batch.build(s, [tag + b"%d" % i, tag + b"%d+" % i])
                done.append(await storage.append(batch, assign_ids=True))
            return done

        async def burst(storage: JetStreamStorage, tag: bytes) -> list[Batch]:
            return list(await asyncio.gather(*(storage.append(Batch.build(s, [tag + b"%d" % i]),
                                                              assign_ids=True)
                                               for i in range(60))))  # fmt: skip

        results = await asyncio.gather(writer(a, b"a"), writer(b, b"b"), burst(a, b"x"),
                                       burst(b, b"y"))  # fmt: skip
        acked = {(b.value(i), int(b.ids[i])) for r in results for b in r for i in range(len(b))}
        assert len(acked) == 2 * 80 + 2 * 60
        stored = await everything(a, s)
        ids = ids_of(stored)
        assert ids == sorted(set(ids))  # strictly increasing, no id twice
        assert {(b.value(i), int(b.ids[i])) for b in stored for i in range(len(b))} == acked
        for tag in (b"a", b"b"):  # each writer's own order kept
            mine = [v for b in stored for v in (b.value(i) for i in range(len(b)))
                    if v.startswith(tag)]  # fmt: skip
            assert mine == [tag + b"%d%s" % (i, p) for i in range(40) for p in (b"", b"+")]
        assert ids_of(await everything(b, s)) == ids  # the other gateway reads the same
        await b.settled(s)
        assert a.latest(s) == b.latest(s) == ids[-1]
        # own ids: the second gateway's must be above what the first stored
        top = a.latest(s)
        await a.append(Batch.build(s, [b"own"], ids=[top + 10]))
        await asyncio.wait_for(b.wait_for(s, top + 9), 10)
        with pytest.raises(IdOrderError):
            await b.append(Batch.build(s, [b"late"], ids=[top + 5]))
        (stats,) = [x for x in b.stats() if x.name == s]
        assert stats.events == len(ids) + 1

    with_storages(cluster, 2, body)


def test_an_append_conflicting_with_another_gateway_is_refused_when_its_ids_are_no_longer_above(
    cluster: LocalCluster,
) -> None:
    s = name("conflict")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        await a.append(Batch.build(s, [b"1"], ids=[1]))
        await asyncio.wait_for(b.wait_for(s, 0), 10)
        head = b.catalog.heads[s]
        stale = head.last  # b's view before a's next append
        await a.append(Batch.build(s, [b"7"], ids=[7]))
        await asyncio.wait_for(b.wait_for(s, 6), 10)
        # As if a's notification had not reached b yet: b publishes on a stale head, JetStream
        # refuses the expected sequence, b reads the head from the leader and refuses the
        # append itself (5 is no longer above 7), then assigns the next id above 7.
        head.last = stale
        assert b.latest(s) == 1
        with pytest.raises(IdOrderError):
            await b.append(Batch.build(s, [b"5"], ids=[5]))
        assert b.latest(s) == 7
        head.last = stale
        stored = await b.append(Batch.build(s, [b"next"]), assign_ids=True)
        assert stored.first_id == 8
        assert ids_of(await everything(a, s)) == [1, 7, 8]

    with_storages(cluster, 2, body)


def test_a_publish_whose_ack_was_lost_is_found_stored_and_never_stored_twice(
    cluster: LocalCluster,
) -> None:
    s = name("lostack")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        real = a.api.publish
        calls: list[dict[str, str]] = []

        async def ack_lost(subject: str, payload: bytes, headers: dict[str, str],
                           wait: float) -> int:  # fmt: skip
            calls.append(dict(headers))
            if len(calls) == 1:
                await real(subject, payload, headers, wait)  # stored...
                await b.append(Batch.build(s, [b"other"]), assign_ids=True)  # (then b writes)
                raise nats.errors.TimeoutError  # ...but the ack never came
            return await real(subject, payload, headers, wait)

        await a.append(Batch.build(s, [b"first"]), assign_ids=True)
        a.api.publish = ack_lost  # type: ignore[method-assign]
        stored = await a.append(Batch.build(s, [b"once"]), assign_ids=True)
        assert stored.first_id == 2
        assert len(calls) == 2  # the retry was refused (10071), then its Tw-Write found
        assert calls[0][WRITE] == calls[1][WRITE]
        values = [b.value(i) for b in await everything(b, s) for i in range(len(b))]
        assert values == [b"first", b"once", b"other"]

    with_storages(cluster, 2, body)


def test_a_publish_that_timed_out_unstored_is_planned_again_after_another_gateway_wrote(
    cluster: LocalCluster,
) -> None:
    s = name("unstored")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        real = a.api.publish
        calls: list[dict[str, str]] = []

        async def lost(subject: str, payload: bytes, headers: dict[str, str],
                       wait: float) -> int:  # fmt: skip
            calls.append(dict(headers))
            if len(calls) == 1:
                await b.append(Batch.build(s, [b"other"]), assign_ids=True)
                raise nats.errors.TimeoutError  # (never reached the server)
            return await real(subject, payload, headers, wait)

        a.api.publish = lost  # type: ignore[method-assign]
        stored = await a.append(Batch.build(s, [b"mine", b"too"]), assign_ids=True)
        assert (stored.first_id, stored.last_id) == (2, 3)
        assert len(calls) == 3  # timed out; refused (not found stored); planned again
        assert calls[2][IDS] == "2-3"
        values = [b.value(i) for b in await everything(b, s) for i in range(len(b))]
        assert values == [b"other", b"mine", b"too"]

    with_storages(cluster, 2, body)


def test_no_ack_within_the_append_timeout_is_a_log_error(cluster: LocalCluster) -> None:
    s = name("noack")

    async def body(a: JetStreamStorage) -> None:
        async def never(subject: str, payload: bytes, headers: dict[str, str],
                        wait: float) -> int:  # fmt: skip
            raise nats.errors.NoRespondersError

        a.api.publish = never  # type: ignore[method-assign]
        with pytest.raises(LogError, match="no ack from JetStream"):
            await a.append(Batch.build(s, [b"x"]), assign_ids=True)
        assert a.accepted_latest(s) == 0

    with_storages(cluster, 1, body, append_timeout_s=0.5)


def test_a_refusal_for_want_of_space_is_storage_full_and_fences_later_appends(
    cluster: LocalCluster,
) -> None:
    s = name("full")

    async def body(a: JetStreamStorage) -> None:
        real = a.api.publish
        full = [True]

        async def refusing(subject: str, payload: bytes, headers: dict[str, str],
                           wait: float) -> int:  # fmt: skip
            if full[0]:
                raise JetStreamError(503, 10047, "insufficient resources")
            return await real(subject, payload, headers, wait)

        a.api.publish = refusing  # type: ignore[method-assign]
        fence = a.fence()
        with pytest.raises(StorageFullError):
            await a.append(Batch.build(s, [b"x"]), assign_ids=True, fence=fence)
        assert a.fence() != fence
        full[0] = False
        with pytest.raises(StorageFullError):  # fenced: refused after an earlier refusal
            await a.append(Batch.build(s, [b"y"]), assign_ids=True, fence=fence)
        stored = await a.append(Batch.build(s, [b"z"]), assign_ids=True, fence=a.fence())
        assert stored.first_id == 1

    with_storages(cluster, 1, body)


def test_retention_purges_whole_records_and_reads_below_raise_data_loss(
    cluster: LocalCluster,
) -> None:
    s = name("keep")
    aged = name("aged")
    config = LogConfig(streams={s: StreamSettings(retention_bytes=3000),
                                aged: StreamSettings(retention_ms=1000)})  # fmt: skip

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        for i in range(20):
            await a.append(Batch.build(s, [b"%04d" % i * 100]), assign_ids=True)
        for i in range(5):
            await a.append(Batch.build(aged, [b"old"], timestamps=[10_000 + i]), assign_ids=True)
        await a.append(Batch.build(aged, [b"new"], timestamps=[50_000]), assign_ids=True)
        assert a.enforce_retention(0) == 0  # (the hub's thread pass: nothing here)
        removed = await a.retention_pass(now=20_000)
        assert removed > 0
        start = a.start_id(s)
        assert 1 < start <= 20
        (stats,) = [x for x in a.stats() if x.name == s]
        assert 3000 <= stats.bytes < 3000 + 600  # whole records: at least the limit kept
        assert a.start_id(aged) == 6  # records older than 1 s before now gone, the new kept
        with pytest.raises(DataLossError):
            await a.read(s, 1, 1 << 20, 100)
        with pytest.raises(DataLossError):  # a gateway that did not purge learns it reading
            await b.read(s, start - 1, 1 << 20, 100)
        assert b.start_id(s) == start
        kept = await everything(a, s)
        assert ids_of(kept) == list(range(start, 21))
        assert await a.retention_pass(now=20_000) == 0  # idempotent

    with_storages(cluster, 2, body, config=config)


def test_a_corrupt_record_is_an_error_never_skipped(cluster: LocalCluster) -> None:
    s = name("corrupt")

    async def body(a: JetStreamStorage) -> None:
        await a.append(Batch.build(s, [b"good"]), assign_ids=True)
        record = encode(Batch.build(s, [b"bad value"], ids=[2]))
        data = bytearray(record.data)
        data[-9] ^= 0xFF  # a flipped bit in the values: the body CRC no longer matches
        previous = a.catalog.heads[s].last
        assert previous is not None
        nc = await nats.connect(servers=cluster.urls)
        try:
            record_sum = previous.sum.following(1, 1, len(data), record.max_timestamp)
            await nc.request(
                subject_of(s, 16),
                bytes(data),
                timeout=5,
                headers={IDS: "2-2", SUM: record_sum.header(), WRITE: "test:1"},
            )
        finally:
            await nc.close()  # fmt: skip
        await asyncio.wait_for(a.wait_for(s, 1), 10)
        assert [b.value(0) for b in await a.read(s, 1, 1 << 20, 1)] == [b"good"]
        with pytest.raises(CorruptRecordError, match="body CRC mismatch") as caught:
            await a.read(s, 1, 1 << 20, 10)
        assert isinstance(caught.value, LogError)
        with pytest.raises(CorruptRecordError):
            await a.read(s, 2, 1 << 20, 10)

    with_storages(cluster, 1, body)


def test_a_batch_bigger_than_a_message_is_split_and_reads_back_whole(
    cluster: LocalCluster,
) -> None:
    s = name("big")

    async def body(a: JetStreamStorage) -> None:
        value = bytes(range(256)) * 4096  # 1 MiB
        stored = await a.append(Batch.build(s, [value] * 20), assign_ids=True)
        assert (stored.first_id, stored.last_id) == (1, 20)
        assert a.catalog.heads[s].records >= 3  # 20 MiB in records of under 8 MiB
        got = await everything(a, s)
        assert ids_of(got) == list(range(1, 21))
        assert all(b.value(i) == value for b in got for i in range(len(b)))

    with_storages(cluster, 1, body)


def test_describe_and_the_cluster_status(cluster: LocalCluster) -> None:
    async def body(a: JetStreamStorage) -> None:
        assert a.describe() == f"{','.join(cluster.urls)} (JetStream, 16 shards, R3)"
        status = await a.refresh_status()
        assert a.cluster() is status
        assert status.name == "tidewire"
        assert len(status.groups) == 16
        assert {g.name for g in status.groups} == {f"TW_{k}" for k in range(16)}
        for group in status.groups:
            assert group.leader in {"n1", "n2", "n3"}
            assert len(group.replicas) == 2
        assert status.connected in {u.removeprefix("nats://") for u in cluster.urls}
        assert len(status.servers) >= 3
        shard = shard_of("anything", 16)
        assert json.dumps(shard_config(shard, a.replicas)["republish"]) == json.dumps(
            {"src": f"tw.{shard}.>", "dest": f"twn.{shard}.>", "headers_only": True}
        )

    with_storages(cluster, 1, body)


def test_the_storage_full_codes() -> None:
    from tidewire.cluster.jsapi import is_storage_full

    assert is_storage_full(JetStreamError(503, 10047, "insufficient resources"))
    assert is_storage_full(JetStreamError(400, 10028, "maximum bytes exceeded"))
    assert not is_storage_full(JetStreamError(400, 10071, "wrong last sequence: 3"))
    assert StorageFullError("s", errno.ENOSPC, "x").errno == errno.ENOSPC
    assert RecordSum(0, 0, 0, 1, 8, 0).events_through == 1


def test_appends_over_the_queue_bound_wait_in_order_and_are_observed(
    cluster: LocalCluster,
) -> None:
    s = name("bounded")

    async def body(a: JetStreamStorage) -> None:
        seen: list[float] = []
        a.observe(append=seen.append)
        calls = [a.append(Batch.build(s, [b"%03d" % i * 30]), assign_ids=True)
                 for i in range(200)]  # fmt: skip
        stored = await asyncio.gather(*calls)
        assert [b.first_id for b in stored] == list(range(1, 201))  # in the order of the calls
        assert [b.value(i) for b in await everything(a, s) for i in range(len(b))] == [
            b"%03d" % i * 30 for i in range(200)
        ]
        assert len(seen) == 200
        assert all(0 <= t < 30 for t in seen)
        assert a.writers[s].queued_bytes == 0

    with_storages(cluster, 1, body, max_queued_bytes=2048)


def test_a_message_without_a_records_headers_is_corrupt_and_does_not_stop_a_connect(
    cluster: LocalCluster,
) -> None:
    s = name("foreign")

    async def main() -> None:
        nc = await nats.connect(servers=cluster.urls)
        try:
            await nc.request(subject_of(s, 16), b"not a record", timeout=5)
        finally:
            await nc.close()
        storage = await JetStreamStorage.connect(cluster.urls)
        try:
            assert s not in storage  # (its head could not be read: logged, left out)
            with pytest.raises(CorruptRecordError, match="not a tidewire record"):
                await storage.refresh_head(storage.catalog.head(s))
        finally:
            await storage.close()

    run(main(), 60)


def test_a_connect_while_new_streams_appear_loads_the_reserved_streams(
    cluster: LocalCluster,
) -> None:
    # A connect reads the reserved streams one by one; streams another gateway creates
    # meanwhile are learnt from notifications during those reads (the CI failure: "dictionary
    # changed size during iteration" ended a gateway's start).
    reserved = f"_tidewire.{name('res')}"

    async def body(a: JetStreamStorage) -> None:
        for chunk in range(20):  # (enough records that reading them takes a while)
            await a.append(Batch.build(reserved, [b"r%d" % (chunk * 50 + i) for i in range(50)]),
                           assign_ids=True)  # fmt: skip
        stop = asyncio.Event()
        created: list[str] = []

        async def create() -> None:
            while not stop.is_set() and len(created) < 5_000:
                created.append(name("new"))
                await a.append(Batch.build(created[-1], [b"v"]), assign_ids=True)

        creator = asyncio.ensure_future(create())
        try:
            for _ in range(3):
                before = len(created)
                b = await JetStreamStorage.connect(cluster.urls)
                try:
                    assert [int(x.ids[-1]) for x in b.replay(reserved)][-1:] == [1000]
                    assert len(created) > before  # (streams did appear during the connect)
                finally:
                    await b.close()
        finally:
            stop.set()
            await creator

    with_storages(cluster, 1, body)


def test_no_cluster_at_the_urls_is_a_log_error_in_seconds() -> None:
    from tidewire.cluster.local import free_port

    async def main() -> None:
        with pytest.raises(LogError, match="cannot reach JetStream"):
            await JetStreamStorage.connect([f"nats://127.0.0.1:{free_port()}"])

    run(main(), 30)


def test_a_seek_misled_by_a_replica_lacking_records_is_caught_and_done_again_on_the_leader(
    cluster: LocalCluster,
) -> None:
    s = name("stale")

    async def body(a: JetStreamStorage) -> None:
        for i in range(1, 21):
            await a.append(Batch.build(s, [b"%d" % i]), assign_ids=True)
        real = a.api.direct_get
        hidden = {5, 6, 7}  # as if each probe were answered by another replica, one lacking these

        async def patchy(stream: str, body: Mapping[str, Any]) -> StoredRecord | None:
            found = await real(stream, body)
            if found is not None and found.first_id in hidden and "next_by_subj" in body:
                return None
            return found

        a.api.direct_get = patchy  # type: ignore[method-assign]
        got = await a.read(s, 6, 1 << 20, 100)
        assert ids_of(got) == list(range(6, 21))  # not 10..20: the overshoot was noticed

    with_storages(cluster, 1, body)


def test_a_stream_first_heard_of_by_a_later_record_gets_its_start_from_its_first_record(
    cluster: LocalCluster,
) -> None:
    s = name("late")
    config = LogConfig(streams={s: StreamSettings(retention_bytes=1000)})

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        for i in range(10):
            await a.append(Batch.build(s, [b"%03d" % i * 100]), assign_ids=True)
        assert await a.retention_pass(now=0) > 0
        start = a.start_id(s)
        assert start > 1
        del b.catalog.heads[s]  # as if b had missed every notification of s so far
        await a.append(Batch.build(s, [b"more"]), assign_ids=True)
        await asyncio.wait_for(b.wait_for(s, 10), 10)
        await until(lambda: b.start_id(s) == start, "b reading the stream's first record")
        (stats,) = [x for x in b.stats() if x.name == s]
        assert stats.first_id == start
        assert stats.events == 11 - (start - 1)

    with_storages(cluster, 2, body, config=config)
