"""Spark reading tidewire against Spark reading Parquet, and Spark writing tidewire, in one run.

    .venv/bin/python benchmarks/spark_read.py            # 5 M events of 100 B, 3 rounds
    .venv/bin/python benchmarks/spark_read.py --quick    # 1 M events, 2 rounds

The same events (stream, id, key, 100 B value, timestamp) are stored twice: in a tidewire stream
(written with ``tidewire.log.Log``, served by a ``tidewire serve`` subprocess) and in a local
Parquet file with the same columns. A ``local[2]`` SparkSession then reads each, in alternation,
with ``count()`` and with a full scan into the ``noop`` sink (every column materialised), and
keeps each side's best round. Then a streaming query with ``Trigger.AvailableNow`` copies the
Parquet events into a tidewire stream through the exactly-once sink, against the same query
writing Parquet.

One JSON line per figure on stdout (fields as in log_append.py), progress on stderr.
Goal: reading from tidewire >= 50% of the rows/s of Parquet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

VALUE_BYTES = 100
PER_APPEND = 10_000
PER_FILE = 100_000  # Parquet rows per file: one file per streaming micro-batch (~13 MB)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def scratch_dir(base: str | None) -> str:
    """A temporary directory (``--dir``, else the system's); removed at the end."""
    return tempfile.mkdtemp(prefix="tw-spark-bench-", dir=base)


def fill(data_dir: str, parquet: str, n: int) -> None:
    """``n`` events into the stream ``events`` and into Parquet files under ``parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tidewire.log import Log, LogConfig
    from tidewire.model import Batch
    from tidewire.spark.arrow import to_arrow

    async def run() -> None:
        log = Log.open(data_dir, LogConfig(fsync=False))
        os.makedirs(parquet)
        writer = None
        try:
            for start in range(0, n, PER_APPEND):
                count = min(PER_APPEND, n - start)
                values = [b"%0*d" % (VALUE_BYTES, start + i) for i in range(count)]
                keys = [b"k%d" % ((start + i) % 100) for i in range(count)]
                stored = await log.append(Batch.build("events", values, keys=keys,
                                                      timestamps=1_700_000_000_000 + start),
                                          assign_ids=True)  # fmt: skip
                rb = to_arrow(stored)
                if start % PER_FILE == 0:
                    if writer is not None:
                        writer.close()
                    name = os.path.join(parquet, f"part-{start // PER_FILE:05d}.parquet")
                    writer = pq.ParquetWriter(name, rb.schema)
                assert writer is not None
                writer.write_table(pa.Table.from_batches([rb]))
        finally:
            if writer is not None:
                writer.close()
            await log.close()

    asyncio.run(run())


def start_hub(data_dir: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", data_dir,
         "--http-port", "0", "--rsio-port", "0", "--seguro-port", "0", "--tolliver-port", "0",
         "--set", "log_level=warning"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    url = None
    for line in proc.stdout:
        match = re.search(r"rsio://\S+", line)
        if match:
            url = match.group(0)
        if "ready" in line:
            break
    if url is None:
        proc.kill()
        raise SystemExit("the hub did not start")
    return proc, url


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def figure(name: str, unit: str, tw: list[float], base: list[float], baseline: str,
           goal: str | None, goal_ratio: float | None) -> dict[str, Any]:  # fmt: skip
    best, best_base = max(tw), max(base)
    ratio = best / best_base
    return {
        "figure": name,
        "unit": unit,
        "tidewire": round(best),
        "baseline": baseline,
        "baseline_value": round(best_base),
        "ratio": round(ratio, 3),
        "goal": goal,
        "goal_ratio": goal_ratio,
        "meets_goal": None if goal_ratio is None else ratio >= goal_ratio,
        "tidewire_rounds": [round(x) for x in tw],
        "baseline_rounds": [round(x) for x in base],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Spark reading tidewire vs Parquet")
    parser.add_argument("--quick", action="store_true", help="1 M events, 2 rounds")
    parser.add_argument("--dir", help="where to put the temporary data (default: the system's)")
    args = parser.parse_args()
    n = 1_000_000 if args.quick else 5_000_000
    rounds = 2 if args.quick else 3

    from pyspark.sql import SparkSession

    import tidewire.spark

    work = scratch_dir(args.dir)
    data_dir, parquet = os.path.join(work, "hub"), os.path.join(work, "events")
    hub = None
    spark = None
    try:
        say(f"writing {n:,} events of {VALUE_BYTES} B to a tidewire stream and to Parquet")
        fill(data_dir, parquet, n)
        hub, url = start_hub(data_dir)
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        tidewire.spark.register(spark)

        def tw_df() -> Any:
            return (spark.read.format("tidewire").option("url", url).option("streams", "events")
                    .option("minPartitions", "2").load())  # fmt: skip

        def pq_df() -> Any:
            return spark.read.parquet(parquet)

        assert tw_df().count() == n == pq_df().count()  # (also warms both up)
        results: dict[str, tuple[list[float], list[float]]] = {"count": ([], []), "scan": ([], [])}
        for r in range(rounds):
            sides = [("tw", tw_df), ("pq", pq_df)]
            if r % 2:
                sides.reverse()
            for side, make in sides:
                index = 0 if side == "tw" else 1
                df = make()
                rate = n / timed(df.count)
                results["count"][index].append(rate)
                rate_scan = n / timed(make().write.format("noop").mode("overwrite").save)
                results["scan"][index].append(rate_scan)
                say(f"round {r + 1} {side}: count {rate:,.0f} rows/s, scan {rate_scan:,.0f} rows/s")
        goal = "tidewire >= 50% of Parquet's rows/s"
        for op, (tw, base) in results.items():
            print(json.dumps(figure(f"batch_read_{op}_100B", "rows/s", tw, base, "parquet",
                                    goal, 0.5)), flush=True)  # fmt: skip

        # Streaming write: Parquet events -> tidewire (exactly-once sink) vs -> Parquet.
        schema = pq_df().schema
        tw_rates: list[float] = []
        pq_rates: list[float] = []
        for r in range(rounds):
            for side in ("tw", "pq") if r % 2 == 0 else ("pq", "tw"):
                checkpoint = os.path.join(work, f"ckpt-{side}-{r}")
                source = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
                          .parquet(parquet))  # fmt: skip
                if side == "tw":
                    sink = (source.select("key", "value", "timestamp").writeStream
                            .format("tidewire").option("url", url)
                            .option("stream", f"copy{r}"))  # fmt: skip
                else:
                    sink = (source.writeStream.format("parquet")
                            .option("path", os.path.join(work, f"out-{r}")))  # fmt: skip
                query = sink.option("checkpointLocation", checkpoint).trigger(availableNow=True)

                def run(query: Any = query) -> None:
                    query.start().awaitTermination()

                seconds = timed(run)
                (tw_rates if side == "tw" else pq_rates).append(n / seconds)
                say(f"streaming write round {r + 1} {side}: {n / seconds:,.0f} rows/s")
        print(json.dumps(figure("streaming_write_100B", "rows/s", tw_rates, pq_rates,
                                "parquet sink", None, None)), flush=True)  # fmt: skip
    finally:
        if spark is not None:
            spark.stop()
        if hub is not None:
            hub.terminate()
            hub.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
