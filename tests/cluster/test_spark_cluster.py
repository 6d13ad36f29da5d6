"""Spark's exactly-once streaming write across two gateways of a cluster (issue 21): a copy
from ``src`` to ``out`` given both gateways (option ``gateways``) runs micro-batches; the leader
of ``out``'s JetStream group and the first gateway are then SIGKILLed, the last micro-batch is
replayed (its commit file removed: a driver that died after the sink's commit) and the query
goes on through the second gateway. Afterwards ``out`` holds every event of ``src`` once, in
order, and the replayed micro-batch added nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cluster_procs import gateways, group_of, leader_of
from hubproc import HubProcess
from spark_rows import batch_files, content, copy_once, events, input_rows, publish, source_batch
from tidewire.cluster.local import LocalCluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

pytest.importorskip("pyspark")


def test_a_replayed_micro_batch_adds_nothing_across_gateways_and_a_killed_leader(
    spark: SparkSession, tmp_path: Path, own_cluster: Callable[[int], LocalCluster]
) -> None:
    cluster = own_cluster(3)
    hubs: list[HubProcess] = gateways(tmp_path, cluster, 2)
    checkpoint = tmp_path / "checkpoint"
    try:
        first, second = (hub.start()["rsio"] for hub in hubs)
        listed = f"{first},{second}"
        publish(first, "src", source_batch("src", 1, 60))

        def run() -> StreamingQuery:
            reader = (spark.readStream.format("tidewire").option("gateways", listed)
                      .option("streams", "src").option("startingOffsets", "earliest")
                      .option("maxEventsPerTrigger", "25").load()
                      .select("key", "value", "timestamp"))  # fmt: skip
            return copy_once(reader, "", checkpoint, gateways=listed, stream="out")

        assert input_rows(run()) == [25, 25, 10]
        assert content(events(second, "out")) == content(events(second, "src"))

        leader = leader_of(cluster, group_of("out"))
        cluster.kill(leader)
        hubs[0].kill()
        last = batch_files(checkpoint, "commits")[-1]
        (checkpoint / "commits" / str(last)).unlink()
        (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
        publish(second, "src", source_batch("src", 61, 30))
        replay = run()  # the replayed micro-batch, then the new events, all through `second`
        assert next(p.batchId for p in replay.recentProgress if p.numInputRows) == last
        assert sum(input_rows(replay)) == 10 + 30

        cluster.restart(leader)
        hubs[0].start()
        out = events(first, "out")
        assert content(out) == content(events(first, "src"))  # every event once, in order
        assert len(out) == 90
    finally:
        for hub in hubs:
            hub.stop()
