"""Cluster mode under faults (issue 21): 3 nodes and 2 gateways, every protocol's reconnecting
client given both gateways, a mixed load (tests/mixed_load.py) while the leader of a stream's
JetStream group is SIGKILLed, then one gateway; both restarted. Afterwards: no acknowledged event
missing, no id or value twice, every follower saw its stream once and in order, every client
resumed, and the restarted node caught up (its copy of every group as long as the leader's).
Also: the whole cluster SIGKILLed at once and started again serves everything acknowledged.

Processes: nats-server nodes (``own_cluster``) and ``tidewire serve --storage`` gateways
(``HubProcess``), on free 127.0.0.1 ports, stopped by pid whatever happens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster_procs import caught_up, gateways, group_of, joined, leader_of
from helpers import run, until
from mixed_load import Mixed, finish_and_check, read_stream
from tidewire.client import rsio
from tidewire.cluster.local import LocalCluster

BOUND = 240.0
STEP = 60.0


@pytest.mark.slow
@pytest.mark.timeout(BOUND + 60)
def test_a_leader_then_a_gateway_killed_under_mixed_load_loses_nothing(
    tmp_path: Path, own_cluster: Callable[[int], LocalCluster]
) -> None:
    cluster = own_cluster(3)
    hubs = gateways(tmp_path, cluster, 2)
    try:
        urls = joined([hub.start() for hub in hubs])
        load = Mixed(urls, tmp_path)

        def logs() -> str:
            return "\n".join(hub.log()[-2000:] for hub in hubs)

        async def main() -> None:
            writers, readers = load.start_flows()
            await load.progress_everywhere("at first", logs)
            leader = leader_of(cluster, group_of("k-rsio"))
            await asyncio.to_thread(cluster.kill, leader)
            await load.progress_everywhere("with the leader of k-rsio's group killed", logs)
            await asyncio.to_thread(cluster.restart, leader)
            await asyncio.to_thread(hubs[0].kill)
            await load.progress_everywhere("with gateway 1 killed", logs)
            await asyncio.to_thread(hubs[0].start)
            await load.progress_everywhere("after both restarts", logs)
            await finish_and_check(load, writers, readers, STEP)
            for flow, count in load.reconnects.items():
                assert count() >= 1, f"{flow} never moved to the other gateway"
            await until(lambda: caught_up(cluster, leader), "the restarted node to catch up",
                        STEP, poll=0.2)  # fmt: skip

        run(main(), BOUND)
    finally:
        for hub in hubs:
            hub.stop()


def test_the_whole_cluster_killed_and_started_again_serves_everything_acknowledged(
    tmp_path: Path, own_cluster: Callable[[int], LocalCluster]
) -> None:
    cluster = own_cluster(3)
    (hub,) = gateways(tmp_path, cluster, 1)
    acked: list[bytes] = []
    try:
        urls = hub.start()

        async def write() -> None:
            async with rsio.connect(urls["rsio"]) as client:
                for i in range(20):
                    values = [b"w-%d-%d" % (i, j) for j in range(50)]
                    await client.publish("whole", values)
                    acked.extend(values)

        run(write(), 60)
        for i in range(3):  # every node at once, right after the acknowledgements
            cluster.kill(i)
        hub.kill()
        began = time.monotonic()
        cluster.start()
        urls = hub.start()
        events = run(read_stream(urls["rsio"], "whole"), 60)
        assert [v for _, v in events] == acked
        assert [i for i, _ in events] == list(range(1, len(acked) + 1))
        print(f"\nthe whole cluster back and serving in {time.monotonic() - began:.1f} s")
    finally:
        hub.stop()
