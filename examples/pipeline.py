"""A tidewire data pipeline on Spark, end to end, in one command (``./tw pipeline``).

1. A hub runs (``tidewire serve`` on free ports, data in a temporary directory), unless
   ``--url`` names one that is already running.
2. A producer publishes JSON page views, ``{"user": "u7", "page": "/cart", "ts": <ms>}``, into
   the stream ``views`` over RS.io, a few hundred a second (any protocol could: they all reach
   the same stream).
3. Spark Structured Streaming reads ``views`` (format ``tidewire``), parses the JSON, counts
   views per page in 10-second event-time windows (with a 5-second watermark) and writes each
   window's final count, as JSON, to the stream ``page_counts`` once the watermark has passed
   the window (append mode; exactly once: see docs/spark.md). The first counts come out about
   20 s after the start.
4. You watch the results live from another terminal, with the command this script prints:
   ``tidewire tail page_counts --url rsio://...``; it also prints the latest counts itself.

It runs for ``--seconds`` (default 60), then stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

PAGES = ["/", "/search", "/product", "/cart", "/checkout"]


def start_hub(data_dir: str) -> tuple[subprocess.Popen[str], str]:
    """``tidewire serve`` on free ports; returns the process and its rsio:// URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", data_dir,
         "--http-port", "0", "--rsio-port", "0", "--seguro-port", "0", "--tolliver-port", "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    url = None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        match = re.search(r"rsio://\S+", line)
        if match:
            url = match.group(0)
        if "ready" in line or time.monotonic() > deadline:
            break
    if url is None:
        proc.kill()
        raise SystemExit("the hub did not start")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
    return proc, url


def produce(url: str, stop: threading.Event, rate: int) -> None:
    """Publish JSON page views until ``stop`` (in its own thread and event loop)."""
    import tidewire

    async def run() -> None:
        rng = random.Random(7)
        async with tidewire.connect(url) as hub, await hub.publisher("views") as pub:
            while not stop.is_set():
                now = int(time.time() * 1000)
                views = [
                    json.dumps({"user": f"u{rng.randrange(50)}", "page": rng.choice(PAGES),
                                "ts": now - rng.randrange(3000)}).encode()  # a little late
                    for _ in range(max(1, rate // 10))
                ]  # fmt: skip
                await pub.submit(views)
                await asyncio.sleep(0.1)

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running hub's rsio:// URL (default: start one)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to run")
    parser.add_argument("--rate", type=int, default=300, help="page views per second")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import tidewire.spark

    data_dir = tempfile.mkdtemp(prefix="tidewire-pipeline-")
    checkpoint = tempfile.mkdtemp(prefix="tidewire-pipeline-ckpt-")
    hub = None
    url = args.url
    if url is None:
        hub, url = start_hub(data_dir)
    stop = threading.Event()
    producer = threading.Thread(target=produce, args=(url, stop, args.rate), daemon=True)
    producer.start()
    print(f"hub: {url}\nwatch the results live:  .venv/bin/tidewire tail page_counts --url {url}",
          flush=True)  # fmt: skip

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidewire-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    tidewire.spark.register(spark)
    view = "user string, page string, ts long"
    try:
        views = (
            spark.readStream.format("tidewire")
            .option("url", url)
            .option("streams", "views")
            .option("startingOffsets", "earliest")
            .load()
            .select(F.from_json(F.col("value").cast("string"), view).alias("v"))
            .select("v.page", (F.col("v.ts") / 1000).cast("timestamp").alias("at"))
        )
        counts = (
            views.withWatermark("at", "5 seconds")
            .groupBy(F.window("at", "10 seconds"), "page")
            .count()
            .select(
                F.col("page").cast("binary").alias("key"),
                F.to_json(F.struct(F.col("window.start").alias("window"), "page", "count"))
                .cast("binary")
                .alias("value"),
            )
        )
        query = (
            counts.writeStream.format("tidewire")
            .option("url", url)
            .option("stream", "page_counts")
            .option("checkpointLocation", checkpoint)
            .outputMode("append")  # a window's count, once the watermark closes it
            .trigger(processingTime="2 seconds")
            .start()
        )
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline and query.isActive:
            query.awaitTermination(5)
            progress = query.lastProgress
            if progress:
                out = progress["sink"].get("numOutputRows", "?")
                print(f"batch {progress['batchId']}: {progress['numInputRows']} views in, "
                      f"{out} window counts out", flush=True)  # fmt: skip
        query.stop()
        latest = (
            spark.read.format("tidewire").option("url", url).option("streams", "page_counts")
            .load().orderBy(F.col("id").desc()).limit(5).collect()
        )  # fmt: skip
        print("latest window counts:")
        for row in reversed(latest):
            print(f"  {row['id']}\t{bytes(row['value']).decode()}")
    finally:
        stop.set()
        producer.join(timeout=10)
        spark.stop()
        if hub is not None:
            hub.terminate()
            hub.wait(timeout=30)
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(checkpoint, ignore_errors=True)


if __name__ == "__main__":
    main()
