"""The staged sink's two halves without a JVM (``tidewire.spark.sink``), against a real
``tidewire serve``: what an executor task's ``write()`` hands the driver is a few hundred
bytes whatever its rows weigh; the driver's commit then stores the rows, per stream, once;
an abort leaves nothing staged."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from spark_rows import events
from tidewire.hub.staging import STAGING_DIR
from tidewire.spark.planning import parse_options

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install tidewire[spark])")
from tidewire.spark.sink import StagedParts, abort_parts_of, commit_parts, stage_task


def rows(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "stream": [f"s{i % 2}" for i in range(n)],
        "value": [b"v%06d" % i + b"." * 94 for i in range(n)],
    })  # fmt: skip


def test_a_task_hands_the_driver_part_names_not_rows(tmp_path: Path, hub_url: str) -> None:
    options = parse_options({"url": hub_url}, streaming=False, writing=True)
    batch = rows(20_000)  # ~2 MB
    message = stage_task(iter([batch.slice(0, 7000), batch.slice(7000)]), options, "spark-write:t")
    assert isinstance(message, StagedParts)
    assert [(s, p.count) for s, _, p in message.parts] == [("s0", 10_000), ("s1", 10_000)]
    assert len(pickle.dumps(message)) < 1000 < batch.nbytes // 1000
    assert events(hub_url, "s0") == []  # staged: nothing readable yet
    commit_parts([message, None], "spark-write:t")  # (None: a task that failed)
    for stream, start in (("s0", 0), ("s1", 1)):
        assert [v for _, _, v, _ in events(hub_url, stream)] == [
            b"v%06d" % i + b"." * 94 for i in range(start, 20_000, 2)]
    commit_parts([message], "spark-write:t")  # a replay: nothing more
    assert len(events(hub_url, "s0")) == 10_000
    assert os.listdir(tmp_path / "hub" / STAGING_DIR) == []


def test_abort_drops_what_the_tasks_staged(tmp_path: Path, hub_url: str) -> None:
    options = parse_options({"url": hub_url}, streaming=False, writing=True)
    message = stage_task(iter([rows(10)]), options, "spark-write:a")
    assert len(os.listdir(tmp_path / "hub" / STAGING_DIR)) == 2  # one key per stream
    abort_parts_of([message], "spark-write:a")
    assert os.listdir(tmp_path / "hub" / STAGING_DIR) == []
    assert events(hub_url, "s0") == []
