"""The staged exactly-once sink (docs/spark.md "Sink") in real Spark (local[2]) against a
real ``tidewire serve`` whose ``rsio.max_txn_bytes`` is made tiny (4 KiB) and whose
``log.max_record_bytes`` (64 KiB) is a few times smaller than one stream's micro-batch: a
micro-batch hundreds of times bigger than the first is written whole, since its rows never
pass through the driver (the executors stage them on the hub, the driver commits parts by
name), and as one bulk append (log/bulk.py), since it is bigger than the second; a replayed
micro-batch adds nothing; a batch write takes the same path; nothing stays staged afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hubproc import HubProcess
from spark_rows import (
    batch_files,
    content,
    copy_once,
    events,
    input_rows,
    publish,
    read_stream,
    source_batch,
)
from tidewire.hub.staging import STAGING_DIR

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install tidewire[spark])")

TXN_BYTES = 4096
RECORD_BYTES = 64 * 1024


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    proc = HubProcess(tmp_path / "data", tmp_path / "hub.log",
                      env={"TIDEWIRE_RSIO_MAX_TXN_BYTES": str(TXN_BYTES),
                           "TIDEWIRE_LOG_MAX_RECORD_BYTES": str(RECORD_BYTES)})  # fmt: skip
    try:
        yield proc
    finally:
        proc.stop()


def staged(data_dir: Path) -> list[str]:
    root = data_dir / STAGING_DIR
    return sorted(os.listdir(root)) if root.is_dir() else []


def test_a_micro_batch_far_above_max_txn_bytes_is_written_once_and_a_replay_adds_nothing(
    spark: SparkSession, tmp_path: Path, hub: HubProcess
) -> None:
    url = hub.start()["rsio"]
    source = source_batch("src", 1, 4000, pad=60)  # ~330 KB: 80 x max_txn_bytes
    assert source.nbytes > 50 * TXN_BYTES
    assert source.nbytes > 4 * RECORD_BYTES
    for at in range(0, 4000, 500):  # (appends of less than log.max_record_bytes each)
        publish(url, "src", source.slice(at, at + 500))
    checkpoint = tmp_path / "checkpoint"

    def run() -> StreamingQuery:
        df = read_stream(spark, url, "src", minPartitions="3")
        return copy_once(df.select("key", "value", "timestamp"), url, checkpoint, stream="out")

    first = run()
    assert input_rows(first) == [4000]  # one micro-batch
    out = events(url, "out")
    assert content(out) == content(events(url, "src"))  # every row once, in order
    assert staged(hub.data_dir) == []

    # The driver died after the sink's commit, before Spark logged it: the micro-batch runs
    # again (its tasks stage again), and its commit finds the transaction done.
    last = batch_files(checkpoint, "commits")[-1]
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    replay = run()
    assert input_rows(replay) == [4000]
    assert "was committed before: not appended again" in hub.log()
    assert events(url, "out") == out
    assert staged(hub.data_dir) == []  # the replay's parts dropped too


def test_a_batch_write_far_above_max_txn_bytes_is_stored_at_once(
    spark: SparkSession, hub: HubProcess
) -> None:
    url = hub.start()["rsio"]
    rows = [(f"s{i % 2}", f"row-{i:05d}-" + "x" * 50) for i in range(6000)]  # 2 x 190 KB
    df = spark.createDataFrame(rows, "stream string, value string").repartition(3)
    df.write.format("tidewire").option("url", url).mode("append").save()
    for name in ("s0", "s1"):
        got = sorted(v for _, _, v, _ in events(url, name))
        assert got == sorted(v.encode() for s, v in rows if s == name)
    assert staged(hub.data_dir) == []
