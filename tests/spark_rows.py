"""What the Spark tests share (tests/spark/, tests/cluster/): reading and writing a hub's
events over RS.io, test batches, and running the ``tidewire`` source into its sink."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import tidewire
from tidewire.model import Batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["QUERY_TIMEOUT", "Row", "batch_files", "content", "copy_once", "events",
           "input_rows", "publish", "read_stream", "source_batch"]  # fmt: skip

QUERY_TIMEOUT = 90  # seconds a streaming query may take (they take a few)

Row = tuple[int, bytes | None, bytes, int]  # id, key, value, timestamp (ms)


def events(url: str, stream: str) -> list[Row]:
    """Every event of ``stream`` on the hub at ``url``, read over RS.io ([] if none)."""

    async def go() -> list[Row]:
        async with asyncio.timeout(30), tidewire.connect(url) as hub:
            (info,) = await hub.streams([stream])
            if not info["exists"] or not info["latest_id"]:
                return []
            out: list[Row] = []
            async for batch in hub.subscribe(stream, until_id=info["latest_id"]):
                out += [(e.id, e.key, e.value, e.timestamp) for e in batch]
            return out

    return asyncio.run(go())


def publish(url: str, stream: str, batch: Batch) -> None:
    async def go() -> None:
        async with asyncio.timeout(30), tidewire.connect(url) as hub:
            await hub.publish(stream, batch)

    asyncio.run(go())


def source_batch(
    stream: str, first: int, n: int, *, timestamp: int = 1_700_000_000_000, pad: int = 0
) -> Batch:
    """Events ``first .. first + n - 1`` of a test stream: every third key absent."""
    numbers = range(first, first + n)
    return Batch.build(
        stream,
        [b"%s-value-%04d%s" % (stream.encode(), i, b"." * pad) for i in numbers],
        keys=[None if i % 3 == 0 else b"key-%d" % (i % 5) for i in numbers],
        timestamps=[timestamp + 7 * i for i in numbers],
    )


def content(rows: Sequence[Row]) -> list[tuple[bytes | None, bytes, int]]:
    """Rows without their ids: what a copy to another stream must keep, in order."""
    return [(key, value, ts) for _, key, value, ts in rows]


def read_stream(spark: SparkSession, url: str, streams: str, **options: str) -> DataFrame:
    reader = spark.readStream.format("tidewire").option("url", url).option("streams", streams)
    for key, value in {"startingOffsets": "earliest", **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def copy_once(df: DataFrame, url: str, checkpoint: Path, **options: str) -> StreamingQuery:
    """Run ``df`` into the tidewire sink at ``url`` (or where ``options`` say) with
    ``Trigger.AvailableNow``, to the end; the finished query (its failure raises)."""
    writer = (
        df.writeStream.format("tidewire")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    if url:  # (else the options name the hubs: gateways=...)
        writer = writer.option("url", url)
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    try:
        assert query.awaitTermination(QUERY_TIMEOUT), "the query did not finish in time"
    finally:
        query.stop()
    return query


def input_rows(query: StreamingQuery) -> list[int]:
    return [p.numInputRows for p in query.recentProgress if p.numInputRows]


def batch_files(checkpoint: Path, log: str) -> list[int]:
    """The batch ids in ``<checkpoint>/offsets`` or ``<checkpoint>/commits``."""
    return sorted(int(p.name) for p in (checkpoint / log).iterdir() if p.name.isdigit())
