"""Spark's Kafka source's options in a real Spark session (``local[2]``, the session fixture)
against a real hub (``tidewire serve`` on free ports, stopped by pid): ``minOffsetsPerTrigger``
with ``maxTriggerDelay``, ``subscribePattern`` picking up a stream created while the query
runs, the timestamp options (on a tree with the hub's time index), options in mixed case. The
pure decisions are tested without a JVM in test_spark_kafka_options.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from spark_rows import QUERY_TIMEOUT, publish, source_batch
from tidewire.client.rsio import RsioClient

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install tidewire[spark])")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = QUERY_TIMEOUT) -> None:
    """Poll ``condition`` (10 times a second) until it holds; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def _batches(query: StreamingQuery) -> list[tuple[int, float]]:
    """``(rows, trigger start in s since the epoch)`` of each micro-batch that read rows."""
    return [(p.numInputRows, datetime.fromisoformat(p.timestamp).timestamp())
            for p in query.recentProgress if p.numInputRows]  # fmt: skip


def test_min_offsets_per_trigger_waits_for_max_trigger_delay_then_fires(
    spark: SparkSession, hub_url: str, tmp_path: Path
) -> None:
    delay = 6.0
    publish(hub_url, "src", source_batch("src", 1, 5))
    df = (
        spark.readStream.format("tidewire")
        .option("URL", hub_url)
        .option("Subscribe", "src")
        .option("StartingOffsets", " Earliest ")  # any case, blanks around: as Kafka's
        .option("MINOFFSETSPERTRIGGER", "50")
        .option("maxtriggerdelay", f"{delay:g}S")
        .load()
    )
    query = (df.writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())  # fmt: skip

    def next_batch(count: int, what: str) -> tuple[int, float]:
        wait_for(lambda: len(_batches(query)) >= count, what)
        return _batches(query)[count - 1]

    try:
        # The first trigger is never held (Kafka's): the 5 events at once. It is slow (the
        # session's first Python workers), so the delay has passed when the next 3 come.
        assert next_batch(1, "the first micro-batch")[0] == 5
        publish(hub_url, "src", source_batch("src", 6, 3))
        rows, held_from = next_batch(2, "the second micro-batch")
        assert rows == 3
        # 3 more, < 50 waiting: held until maxTriggerDelay has passed since that micro-batch
        published = time.time()
        publish(hub_url, "src", source_batch("src", 9, 3))
        rows, fired = next_batch(3, "the delayed micro-batch")
        assert rows == 3
        assert published - held_from < delay - 2, "too slow a machine: the events came late"
        # (a trigger starts a little before latestOffset decides: 1 s of slack)
        assert fired - held_from >= delay - 1
        assert fired - published >= 1  # held, not read at the next trigger
        # 50 waiting: fired at once, without waiting for the delay.
        publish(hub_url, "src", source_batch("src", 12, 50))
        rows, at_once = next_batch(4, "the micro-batch of 50")
        assert rows == 50
        assert at_once - fired < delay - 1
        assert [r for r, _ in _batches(query)] == [5, 3, 3, 50]
        assert query.exception() is None
    finally:
        query.stop()


def _waiting(query: StreamingQuery) -> bool:
    """Whether the query has planned its start and waits for data (its first trigger ran)."""
    return bool(query.status["message"] == "Waiting for data to arrive" or query.recentProgress)


def test_subscribe_pattern_picks_up_a_stream_created_while_the_query_runs(
    spark: SparkSession, hub_url: str, tmp_path: Path
) -> None:
    publish(hub_url, "ev-a", source_batch("ev-a", 1, 4))
    publish(hub_url, "other", source_batch("other", 1, 2))
    df = (
        spark.readStream.format("TIDEWIRE")
        .option("url", hub_url)
        .option("SubscribePattern", "ev-.*")
        .option("startingOffsets", "LATEST")
        .load()
    )
    query = (df.writeStream.format("memory").queryName("pattern_rows")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())  # fmt: skip

    def rows() -> list[tuple[str, int, bytes]]:
        return sorted((r.stream, r.id, bytes(r.value))
                      for r in spark.sql("SELECT * FROM pattern_rows").collect())  # fmt: skip

    try:
        wait_for(lambda: _waiting(query), "the query to start")
        publish(hub_url, "ev-a", source_batch("ev-a", 5, 2))
        wait_for(lambda: len(rows()) >= 2, "ev-a's new events")
        # a stream created now: read from its beginning, though startingOffsets is latest
        publish(hub_url, "ev-b", source_batch("ev-b", 1, 3))
        publish(hub_url, "other", source_batch("other", 3, 2))
        publish(hub_url, "xev-c", source_batch("xev-c", 1, 2))  # matches in part only: not read
        wait_for(lambda: len(rows()) >= 5, "ev-b's events")
        assert query.exception() is None
    finally:
        query.stop()
    assert [(s, i) for s, i, _ in rows()] == [
        ("ev-a", 5), ("ev-a", 6), ("ev-b", 1), ("ev-b", 2), ("ev-b", 3),
    ]  # fmt: skip
    assert rows()[0][2] == b"ev-a-value-0005"
    # a batch read with the pattern: every matching stream, from earliest
    batch = (spark.read.format("tidewire").option("URL", hub_url)
             .option("subscribePattern", "ev-[ab]").load()
             .select("stream", "id").collect())  # fmt: skip
    assert sorted((r.stream, r.id) for r in batch) == (
        [("ev-a", i) for i in range(1, 7)] + [("ev-b", i) for i in range(1, 4)]
    )


T0 = 1_700_000_000_000  # source_batch's events: id i at T0 + 7 * i ms


@pytest.mark.skipif(not hasattr(RsioClient, "ids_at"),
                    reason="no time index here (RsioClient.ids_at: issue 23, item 1)")  # fmt: skip
def test_timestamp_options_start_and_end_at_times(
    spark: SparkSession, hub_url: str, tmp_path: Path
) -> None:
    publish(hub_url, "t", source_batch("t", 1, 20))
    publish(hub_url, "u", source_batch("u", 1, 10))

    def ids(**options: str) -> list[tuple[str, int]]:
        reader = spark.read.format("tidewire").option("url", hub_url).option("streams", "t,u")
        for key, value in options.items():
            reader = reader.option(key, value)
        return sorted((r.stream, r.id) for r in reader.load().select("stream", "id").collect())

    # t from id 5 to before id 12 (Kafka's nested JSON), u from id 5 to its end
    got = ids(STARTINGTIMESTAMP=str(T0 + 35), startingOffsets="latest",
              endingOffsetsByTimestamp=f'{{"t": {{"0": {T0 + 84}}}}}')  # fmt: skip
    assert got == [("t", i) for i in range(5, 12)] + [("u", i) for i in range(5, 11)]
    # a time between two events: the first event after it; u, not named: startingOffsets
    got = ids(startingOffsetsByTimestamp=f'{{"t": {T0 + 130}}}')
    assert got == [("t", 19), ("t", 20)] + [("u", i) for i in range(1, 11)]
    # endingTimestamp wins over endingOffsets
    got = ids(endingTimestamp=str(T0 + 21), endingOffsets='{"t": 2}')
    assert got == [("t", 1), ("t", 2), ("u", 1), ("u", 2)]
    # u has no event that new: an error naming it, or its end with the strategy latest
    with pytest.raises(Exception, match="stream 'u' has no event at or after"):
        ids(startingTimestamp=str(T0 + 105))
    got = ids(startingTimestamp=str(T0 + 105), startingOffsetsByTimestampStrategy="Latest")
    assert got == [("t", i) for i in range(15, 21)]

    # streaming: a new query starts at the time, and reads on from there
    df = (spark.readStream.format("tidewire").option("url", hub_url).option("streams", "t")
          .option("startingOffsetsByTimestamp", f'{{"t": {T0 + 126}}}').load())  # fmt: skip
    query = (df.writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())  # fmt: skip
    try:
        assert query.awaitTermination(QUERY_TIMEOUT), "the query did not finish in time"
        assert [p.numInputRows for p in query.recentProgress if p.numInputRows] == [3]  # 18..20
    finally:
        query.stop()
