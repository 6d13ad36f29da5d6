"""The Spark side of benchmarks/soak.py: a Structured Streaming query over the tidewire source."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

__all__ = ["SparkQuery"]


class SparkQuery:
    """A Structured Streaming query reading ``stream`` into the ``noop`` sink. Every method
    blocks (py4j): call them in a thread."""

    def __init__(self, url: str, stream: str, checkpoint: str, trigger_s: float) -> None:
        self.url = url
        self.stream = stream
        self.checkpoint = checkpoint
        self.trigger_s = trigger_s
        self.spark: Any = None
        self.query: Any = None
        self.last_progress = ""  # the timestamp of the last progress counted

    def start(self) -> None:
        # Spark starts its Python workers with this interpreter (the one that has tidewire).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        import tidewire.spark

        self.spark = (
            SparkSession.builder.master("local[2]")
            .appName("tidewire-soak")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        tidewire.spark.register(self.spark)
        self._start_query()

    def _start_query(self) -> None:
        df = (self.spark.readStream.format("tidewire").option("url", self.url)
              .option("streams", self.stream).option("startingOffsets", "latest")
              .load())  # fmt: skip
        self.query = (df.writeStream.format("noop").queryName("soak")
                      .option("checkpointLocation", self.checkpoint)
                      .trigger(processingTime=f"{self.trigger_s} seconds").start())  # fmt: skip

    def poll(self) -> tuple[int, int, int | None, str | None]:
        """Rows and micro-batches since the last poll, the query's next id of the stream
        (its last end offset) and, if the query had died (it is then restarted from its
        checkpoint), why."""
        died = None
        if not self.query.isActive:
            exc = self.query.exception()
            died = f"the Spark query stopped: {exc}"[:300]
            self._start_query()
        rows = batches = 0
        end: int | None = None
        for progress in self.query.recentProgress:
            stamp = str(progress["timestamp"])
            if stamp <= self.last_progress:
                continue
            self.last_progress = stamp
            n = int(progress["numInputRows"])
            rows += n
            batches += 1 if n else 0
        last = self.query.lastProgress
        if last is not None and last["sources"]:
            offset = last["sources"][0]["endOffset"]
            with contextlib.suppress(ValueError, TypeError, KeyError):
                offset = json.loads(offset) if isinstance(offset, str) else offset
                end = int(offset[self.stream])
        return rows, batches, end, died

    def stop(self) -> None:
        if self.query is not None:
            with contextlib.suppress(Exception):
                self.query.stop()
        if self.spark is not None:
            self.spark.stop()
