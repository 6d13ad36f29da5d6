"""A stream's leader SIGKILLed while a gateway appends to it: no acknowledged append lost, none
stored twice, appends resume within seconds (a cluster of the test's own)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable

from helpers import run
from tidewire.cluster.jetstream import JetStreamStorage
from tidewire.cluster.local import LocalCluster
from tidewire.cluster.subjects import shard_of
from tidewire.model import Batch

RESUME_SECONDS = 15.0


def leader_of(cluster: LocalCluster, jetstream: str) -> int:
    """The index of the node leading ``jetstream`` (asked of every live node's /jsz)."""
    for node in cluster.nodes:
        if node.pid is None:
            continue
        url = f"http://127.0.0.1:{node.monitor_port}/jsz?streams=true"
        with urllib.request.urlopen(url, timeout=5) as answer:
            report = json.loads(answer.read())
        for account in report.get("account_details", []):
            for stream in account.get("stream_detail", []):
                if stream["name"] == jetstream:
                    leader = stream.get("cluster", {}).get("leader")
                    if leader:
                        return [n.name for n in cluster.nodes].index(leader)
    raise AssertionError(f"no leader found for {jetstream}")


def test_killing_the_leader_loses_no_acked_append_and_appends_resume(
    own_cluster: Callable[[int], LocalCluster],
) -> None:
    cluster = own_cluster(3)
    stream = "failover.s"
    jetstream = f"TW_{shard_of(stream, 16)}"

    async def main() -> None:
        storage = await JetStreamStorage.connect(cluster.urls, append_timeout_s=30)
        acked: list[tuple[int, bytes, float]] = []
        stop = asyncio.Event()
        progress = asyncio.Condition()

        async def until(done: Callable[[], bool], seconds: float) -> None:
            async with progress:
                await asyncio.wait_for(progress.wait_for(done), seconds)

        async def appender(tag: bytes) -> None:
            n = 0
            while not stop.is_set():
                value = tag + b"%d" % n
                stored = await storage.append(Batch.build(stream, [value]), assign_ids=True)
                acked.append((stored.first_id, value, time.monotonic()))
                n += 1
                async with progress:
                    progress.notify_all()

        tasks = [asyncio.ensure_future(appender(b"%d-" % i)) for i in range(4)]
        await until(lambda: len(acked) >= 200, 30)
        victim = leader_of(cluster, jetstream)
        killed_at = time.monotonic()
        cluster.kill(victim)
        before = len(acked)
        await until(lambda: any(a[2] > killed_at for a in acked[before:]), RESUME_SECONDS)
        resumed = min(a[2] for a in acked[before:] if a[2] > killed_at) - killed_at
        target = len(acked) + 200
        await until(lambda: len(acked) >= target, 30)
        stop.set()
        await asyncio.gather(*tasks)
        await storage.close()

        cluster.restart(victim)
        reader = await JetStreamStorage.connect(cluster.urls)
        try:
            stored: list[tuple[int, bytes]] = []
            next_id = 1
            while batches := await reader.read(stream, next_id, 1 << 20, 10_000):
                stored += [(int(b.ids[i]), b.value(i)) for b in batches for i in range(len(b))]
                next_id = batches[-1].last_id + 1
        finally:
            await reader.close()
        ids = [i for i, _ in stored]
        assert ids == sorted(set(ids))  # strictly increasing, nothing twice
        assert len({v for _, v in stored}) == len(stored)  # no value stored twice
        assert {(i, v) for i, v, _ in acked} <= set(stored)  # every acked append is there
        print(f"appends resumed {resumed:.2f} s after the leader was killed")
        assert resumed < RESUME_SECONDS

    run(main(), 120)


def test_the_whole_cluster_stopped_and_started_serves_everything_acked(
    own_cluster: Callable[[int], LocalCluster],
) -> None:
    cluster = own_cluster(3)
    stream = "restart.s"

    async def main() -> None:
        storage = await JetStreamStorage.connect(cluster.urls)
        try:
            for i in range(50):
                await storage.append(Batch.build(stream, [b"before%d" % i]), assign_ids=True)
            await asyncio.to_thread(cluster.stop)
            await asyncio.to_thread(cluster.start)
            # the same gateway reconnects, and appends and reads again
            stored = await storage.append(Batch.build(stream, [b"after"]), assign_ids=True)
            assert stored.first_id == 51
            got = await storage.read(stream, 1, 1 << 20, 1000)
            values = [b.value(i) for b in got for i in range(len(b))]
            assert values == [b"before%d" % i for i in range(50)] + [b"after"]
        finally:
            await storage.close()
        fresh = await JetStreamStorage.connect(cluster.urls)
        try:
            assert fresh.latest(stream) == 51
        finally:
            await fresh.close()

    run(main(), 120)


def test_a_waiting_gateway_whose_node_died_wakes_for_a_record_stored_meanwhile(
    own_cluster: Callable[[int], LocalCluster],
) -> None:
    cluster = own_cluster(3)
    stream = "reconnect.s"

    async def main() -> None:
        waiter = await JetStreamStorage.connect(cluster.urls)
        connected = waiter.nc.connected_url
        assert connected is not None
        assert connected.port is not None
        victim = [n.client_port for n in cluster.nodes].index(connected.port)
        others = [n.url for i, n in enumerate(cluster.nodes) if i != victim]
        writer = await JetStreamStorage.connect(others)
        try:
            await writer.append(Batch.build(stream, [b"1"]), assign_ids=True)
            await asyncio.wait_for(waiter.wait_for(stream, 0), 10)
            waiting = asyncio.ensure_future(waiter.wait_for(stream, 1))
            cluster.kill(victim)  # the waiter's connection drops; its notifications stop
            await writer.append(Batch.build(stream, [b"2"]), assign_ids=True)
            await asyncio.wait_for(waiting, 30)  # woken after its reconnect, by the reload
            assert waiter.latest(stream) == 2
            got = await waiter.read(stream, 2, 1 << 20, 10)
            assert [b.value(0) for b in got] == [b"2"]
        finally:
            await writer.close()
            await waiter.close()

    run(main(), 90)
