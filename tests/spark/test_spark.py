"""The ``tidewire`` PySpark data source against real hubs (``tidewire serve`` subprocesses on
127.0.0.1, free ports, data in ``tmp_path``): batch reads, streaming reads restarted from their
checkpoint, the exactly-once sink when Spark replays a micro-batch or a hub goes down, several
hubs, option errors and ``failOnDataLoss``.

Spark queries cost seconds each, so every test combines several checks. What a query wrote is
read back over RS.io (:func:`events`), not with Spark."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from spark_rows import (
    QUERY_TIMEOUT,
    batch_files,
    content,
    copy_once,
    events,
    input_rows,
    publish,
    read_stream,
    source_batch,
)
from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch, now_ms
from tidewire.spark.hubs import home_hub

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

try:
    import pyspark  # noqa: F401
except ImportError:
    HAVE_PYSPARK = False
else:
    HAVE_PYSPARK = True

pytestmark = pytest.mark.skipif(
    not HAVE_PYSPARK, reason="pyspark is not installed (pip install tidewire[spark])"
)


# --------------------------------------------------------------------------- hubs


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


class HubProcess:
    """A ``tidewire serve`` subprocess on 127.0.0.1; restartable on the same port and data."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0

    @property
    def url(self) -> str:
        assert self.port, "the hub was never started"
        return f"rsio://127.0.0.1:{self.port}"

    def _file(self, kind: str) -> Path:
        return self.data_dir.with_name(f"{self.data_dir.name}.{self.starts}.{kind}")

    def start(self) -> str:
        """Start (again, on the port of the first start) and wait for "ready"; the url."""
        assert self.proc is None, "already running"
        self.starts += 1
        out, err = self._file("out"), self._file("err")
        with out.open("wb") as stdout, err.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", str(self.data_dir),
                 "--host", "127.0.0.1", "--http-port", "0"],
                stdout=stdout, stderr=stderr,
                env={**os.environ, "TIDEWIRE_RSIO_PORT": str(self.port),
                     "TIDEWIRE_SEGURO_PORT": "0", "TIDEWIRE_TOLLIVER_PORT": "0"},
            )  # fmt: skip

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"tidewire serve exited {self.proc.returncode}: "
                                     f"{err.read_text()}")  # fmt: skip
            return "ready" in out.read_text()

        wait_for(ready, "tidewire serve to be ready")
        words = out.read_text().split()
        port = int(next(w for w in words if w.startswith("rsio://")).rsplit(":", 1)[1])
        assert self.port in (0, port)
        self.port = port
        return self.url

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye (a crash)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None

    def stop(self) -> None:
        """SIGTERM: a graceful stop."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(timeout=30) == 0
            self.proc = None

    def log_text(self) -> str:
        """Everything the hub logged (stderr), over all its starts."""
        return "".join(
            self.data_dir.with_name(f"{self.data_dir.name}.{i}.err").read_text()
            for i in range(1, self.starts + 1)
        )


@contextmanager
def hubs(tmp_path: Path, *names: str) -> Iterator[list[HubProcess]]:
    """Hub processes (not started) on ``tmp_path / name``; all killed at the end."""
    procs = [HubProcess(tmp_path / name) for name in names]
    with ExitStack() as stack:
        for proc in procs:
            stack.callback(proc.kill)
        yield procs


def fill(data_dir: Path, batches: Sequence[Batch], config: LogConfig | None = None,
         *, assign_ids: bool = True) -> None:  # fmt: skip
    """Append ``batches`` to the log of ``data_dir`` (no hub may be running on it)."""

    async def go() -> None:
        log = Log.open(str(data_dir), config)
        try:
            for batch in batches:
                await log.append(batch, assign_ids=assign_ids)
        finally:
            await log.close()

    asyncio.run(go())


# --------------------------------------------------------------------------- Spark helpers


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- tests


def test_batch_read_is_exact_over_several_partitions(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    a = [source_batch("a", 1, 10), source_batch("a", 11, 15)]
    # b has its own ids, with gaps: partitions cut by id span, some of them inside a gap
    b = Batch.build("b", [b"b1", b"b2", b"", b"b10", b"b11", b"b30", b"b31", b"b40"],
                    ids=[1, 2, 3, 10, 11, 30, 31, 40], timestamps=5,
                    keys=[b"k", None, b"", None, b"x", b"y", None, b"z"])  # fmt: skip
    fill(tmp_path / "h", a)
    fill(tmp_path / "h", [b], assign_ids=False)
    fill(tmp_path / "h", [source_batch("other", 1, 3)])
    with hubs(tmp_path, "h") as (hub,):
        url = hub.start()
        expected_a = events(url, "a")
        expected_b = events(url, "b")
        assert len(expected_a) == 25
        assert [r[0] for r in expected_b][-1] == 40
        df = (
            spark.read.format("tidewire")
            .option("url", url)
            .option("streams", "a,b")
            .option("startingOffsets", json.dumps({"a": -2, "b": 3}))
            .option("endingOffsets", json.dumps({"a": -1, "b": 32}))  # exclusive
            .option("eventsPerPartition", "4")
            .load()
        )
        assert df.schema.simpleString() == (
            "struct<stream:string,id:bigint,key:binary,value:binary,timestamp:timestamp>"
        )
        rows = df.select(
            "stream", "id", "key", "value", F.unix_micros("timestamp").alias("us"),
            F.spark_partition_id().alias("part"),
        ).collect()  # fmt: skip
    got = [(r.stream, r.id, r.key, r.value, r.us) for r in rows]
    want = [("a", i, k, v, ts * 1000) for i, k, v, ts in expected_a] + [
        ("b", i, k, v, ts * 1000) for i, k, v, ts in expected_b if 3 <= i < 32
    ]
    assert sorted(got, key=lambda r: (r[0], r[1])) == want
    # ids 1..25 of a in 7 partitions, ids 3..31 of b in 8: each one stream, ids rising
    parts: dict[int, list[tuple[str, int]]] = {}
    for r in rows:
        parts.setdefault(r.part, []).append((r.stream, r.id))
    assert len({r.part for r in rows if r.stream == "a"}) == 7
    for part in parts.values():
        assert len({stream for stream, _ in part}) == 1
        assert [i for _, i in part] == sorted(i for _, i in part)


def test_streaming_read_restarts_from_its_checkpoint_and_a_replayed_batch_adds_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    fill(tmp_path / "h", [source_batch("src", 1, 15)])
    with hubs(tmp_path, "h") as (hub,):
        url = hub.start()

        def run() -> StreamingQuery:
            df = read_stream(spark, url, "src", maxEventsPerTrigger="10")
            return copy_once(df.select("key", "value", "timestamp"), url, checkpoint,
                             stream="out")  # fmt: skip

        first = run()
        assert input_rows(first) == [10, 5]
        assert content(events(url, "out")) == content(events(url, "src"))

        publish(url, "src", source_batch("src", 16, 7))
        second = run()
        assert input_rows(second) == [7]
        source = events(url, "src")
        assert len(source) == 22
        out = events(url, "out")
        assert content(out) == content(source)  # every event once, in order
        assert [r[0] for r in out] == list(range(1, 23))

        # A driver that died after the sink's commit, before Spark recorded it: the batch's
        # offsets are logged, its commit is not, so the restarted query runs it again.
        last = batch_files(checkpoint, "commits")[-1]
        assert batch_files(checkpoint, "offsets")[-1] == last == 2
        (checkpoint / "commits" / str(last)).unlink()
        (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
        replay = run()
        assert [p.batchId for p in replay.recentProgress if p.numInputRows] == [last]
        assert input_rows(replay) == [7]
        assert batch_files(checkpoint, "commits")[-1] == last  # it ran and was committed again
        assert "was committed before: not appended again" in hub.log_text()
        assert events(url, "out") == out  # and the sink holds every event still once


def test_sink_hub_down_at_commit_fails_the_query_and_a_restart_writes_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    fill(tmp_path / "source", [source_batch("src", 1, 12)])
    with hubs(tmp_path, "source", "sink") as (source_hub, sink_hub):
        source_url = source_hub.start()
        sink_hub.port = unused_port()  # the sink's hub is down: it starts on this port later
        sink_url = sink_hub.url

        def run() -> StreamingQuery:
            df = read_stream(spark, source_url, "src", maxEventsPerTrigger="8")
            return copy_once(df.select("key", "value", "timestamp"), sink_url, checkpoint,
                             stream="out")  # fmt: skip

        # The source's hub is up, so the first micro-batch is planned and read, and fails in
        # the driver's commit, when it publishes to the sink's hub.
        with pytest.raises(Exception, match=re.escape(f"hub {sink_url}: ")):
            run()
        assert batch_files(checkpoint, "offsets") == [0]
        assert not (checkpoint / "commits").exists() or batch_files(checkpoint, "commits") == []

        sink_hub.start()
        query = run()  # micro-batch 0 again, then the rest
        assert input_rows(query) == [8, 4]
        out = events(sink_url, "out")
        assert content(out) == content(events(source_url, "src"))
        assert [r[0] for r in out] == list(range(1, 13))


def test_hub_down_is_a_clear_error_and_a_killed_hub_loses_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    nowhere = f"rsio://127.0.0.1:{unused_port()}"
    with pytest.raises(Exception, match=re.escape(f"hub {nowhere}: ")):
        spark.read.format("tidewire").option("url", nowhere).option("streams", "a").load(
        ).collect()  # fmt: skip

    checkpoint = tmp_path / "checkpoint"
    fill(tmp_path / "h", [source_batch("src", 1 + 20 * i, 20) for i in range(10)])
    with hubs(tmp_path, "h") as (hub,):
        url = hub.start()
        df = read_stream(spark, url, "src", maxEventsPerTrigger="20")
        query = (
            df.select("key", "value", "timestamp")
            .writeStream.format("tidewire")
            .option("url", url)
            .option("stream", "out")
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            wait_for(lambda: len(events(url, "out")) >= 40, "two micro-batches in the sink",
                     QUERY_TIMEOUT)  # fmt: skip
            assert len(events(url, "out")) < 200
            hub.kill()  # mid-query: the next micro-batch, or this one, cannot reach the hub
            with pytest.raises(Exception, match=re.escape(f"hub {url}: ")):
                query.awaitTermination(QUERY_TIMEOUT)
        finally:
            query.stop()

        hub.start()  # same data, same port
        df = read_stream(spark, url, "src", maxEventsPerTrigger="100")
        copy_once(df.select("key", "value", "timestamp"), url, checkpoint, stream="out")
        out = events(url, "out")
        assert content(out) == content(events(url, "src"))
        assert [r[0] for r in out] == list(range(1, 201))


def test_option_errors_are_clear(spark: SparkSession, tmp_path: Path) -> None:
    def load(**options: str) -> None:
        reader = spark.read.format("tidewire")
        for key, value in options.items():
            reader = reader.option(key, value)
        reader.load().collect()

    with pytest.raises(Exception, match="option 'url' is required"):
        load(streams="a")
    with pytest.raises(Exception, match=r"unknown option\(s\) colour for format tidewire"):
        load(url="rsio://127.0.0.1:1", streams="a", colour="blue")
    with pytest.raises(Exception, match="'maxEventsPerTrigger' applies to streaming reads only"):
        load(url="rsio://127.0.0.1:1", streams="a", maxEventsPerTrigger="5")
    fill(tmp_path / "h", [source_batch("a", 1, 3)])
    with hubs(tmp_path, "h") as (hub,):
        url = hub.start()  # offsets are checked against what the hub has
        with pytest.raises(Exception, match="'startingOffsets' must be earliest, latest or JSON"):
            load(url=url, streams="a", startingOffsets='{"a": 1')
        with pytest.raises(Exception, match="'endingOffsets' names streams not in 'streams'"):
            load(url=url, streams="a", endingOffsets='{"b": 1}')
        with pytest.raises(Exception, match=r"stream\(s\) \['nope'\] exist on none of the hubs"):
            load(url=url, streams="a,nope")


def test_two_hubs_read_together_and_rows_are_written_where_their_stream_lives(
    spark: SparkSession, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    fill(tmp_path / "h1", [source_batch("a", 1, 6)])
    fill(tmp_path / "h2", [source_batch("b", 1, 4), source_batch("existing", 1, 2)])
    with hubs(tmp_path, "h1", "h2") as (h1, h2):
        urls = [h1.start(), h2.start()]
        both = ",".join(urls)
        # a new stream whose home is h1, written with rows read from h2 (and the reverse)
        fresh = next(f"fresh{i}" for i in range(100) if home_hub(f"fresh{i}", urls) == urls[0])

        existing_before = events(urls[1], "existing")
        rows = spark.read.format("tidewire").option("url", both).option("streams", "a,b").load(
        ).select("stream", "id", "value").collect()  # fmt: skip
        assert sorted((r.stream, r.id, r.value) for r in rows) == [
            (s, i, v) for s, url in (("a", urls[0]), ("b", urls[1]))
            for i, _, v, _ in events(url, s)
        ]  # fmt: skip

        df = read_stream(spark, both, "a,b").select(
            F.when(F.col("stream") == "a", F.lit("existing")).otherwise(F.lit(fresh))
            .alias("stream"), "key", "value", "timestamp",
        )  # fmt: skip
        copy_once(df, both, tmp_path / "checkpoint")
        a, b = events(urls[0], "a"), events(urls[1], "b")
        existing = events(urls[1], "existing")
        assert content(existing) == content(existing_before) + content(a)
        assert content(events(urls[0], fresh)) == content(b)
        assert events(urls[0], "existing") == []
        assert events(urls[1], fresh) == []


def test_fail_on_data_loss(spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "h"
    small = StreamSettings(segment_bytes=4096)
    fill(data, [source_batch("r", 1 + 10 * i, 10, pad=200) for i in range(10)],
         LogConfig(streams={"r": small}))  # fmt: skip
    checkpoint = tmp_path / "checkpoint"
    with hubs(tmp_path, "h") as (hub,):

        def run(**options: str) -> StreamingQuery:
            df = read_stream(spark, hub.url, "r", **options)
            return copy_once(df.select("key", "value", "timestamp"), hub.url, checkpoint,
                             stream="out")  # fmt: skip

        hub.start()
        run()
        before = events(hub.url, "r")
        assert content(events(hub.url, "out")) == content(before)
        hub.stop()

        # 100 more events, then retention keeps only the newest few segments: ids the query
        # has not read (101 and on) are gone before it runs again.
        trimmed = LogConfig(streams={"r": StreamSettings(segment_bytes=4096,
                                                         retention_bytes=6000)})  # fmt: skip
        fill(data, [source_batch("r", 101 + 10 * i, 10, pad=200) for i in range(10)], trimmed)
        log = Log.open(str(data), trimmed)
        try:
            assert log.enforce_retention(now_ms()) > 0
            kept = log.start_id("r")
        finally:
            log.close_sync()
        assert 101 < kept < 200

        hub.start()
        lost = (f"stream 'r': ids 101..{kept - 1} were removed by retention before they were "
                "read; set failOnDataLoss=false to skip them and go on")  # fmt: skip
        with pytest.raises(Exception, match=re.escape(lost)):
            run()
        assert len(events(hub.url, "out")) == 100  # nothing written

        run(failOnDataLoss="false")  # skips the lost ids and goes on
        after = events(hub.url, "r")
        assert after[0][0] == kept
        assert content(events(hub.url, "out")) == content(before) + content(after)


def test_gateways_with_a_dead_first_url_read_and_write_through_the_second(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The option ``gateways`` (every URL serves every stream, cluster mode): with the first
    gateway dead, planning asks the second, every partition (some dealt to the dead one first)
    reads there, and the exactly-once sink commits there."""
    fill(tmp_path / "h", [source_batch("a", 1, 40), source_batch("b", 1, 25)])
    with hubs(tmp_path, "h") as (hub,), socket.socket() as dead_socket:
        dead_socket.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        dead = f"rsio://127.0.0.1:{dead_socket.getsockname()[1]}"
        live = hub.start()
        gateways = f"{dead},{live.removeprefix('rsio://')}"  # (the second form: no scheme)
        rows = (spark.read.format("tidewire").option("gateways", gateways)
                .option("streams", "a,b").option("minPartitions", "6").load()
                .select("stream", "id", "value").collect())  # fmt: skip
        assert sorted((r.stream, r.id, r.value) for r in rows) == [
            (s, i, v) for s in ("a", "b") for i, _, v, _ in events(live, s)
        ]  # fmt: skip
        reader = (spark.readStream.format("tidewire").option("gateways", gateways)
                  .option("streams", "a").option("startingOffsets", "earliest").load()
                  .select("key", "value", "timestamp"))  # fmt: skip
        copy_once(reader, "", tmp_path / "checkpoint", gateways=gateways, stream="copy")
        assert content(events(live, "copy")) == content(events(live, "a"))


def test_a_gateway_session_resumes_a_read_and_replays_a_commit_at_the_next_gateway(
    tmp_path: Path,
) -> None:
    """What a partition and the sink do with ``gateways``, without Spark: the hub behind the
    first gateway stops mid-read and the same data is served at the second; the read goes on
    there after the last id it got (each event once), and a transaction committed at the first
    gateway, offered again at the second under the same id, stores nothing more."""
    from tidewire.spark.hubs import HubSession

    fill(tmp_path / "h", [source_batch("a", 1 + 50 * k, 50, pad=30_000) for k in range(6)])
    with hubs(tmp_path, "h") as (hub,):
        first = hub.start()
        second = f"rsio://127.0.0.1:{unused_port()}"
        with HubSession(first, gateways=[first, second], timeout=60) as session:
            got: list[int] = []
            for batch in session.read("a", 1, 301, prefetch=1):
                got += list(batch.ids)
                if hub.port != int(second.rsplit(":", 1)[1]):
                    hub.stop()  # the first gateway goes away mid-read
                    hub.port = int(second.rsplit(":", 1)[1])
                    hub.start()
            assert got == list(range(1, 301))
            assert session.current == second
            one = session.commit("t", source_batch("t", 1, 5), "spark:q:0:t")
            hub.stop()
            hub.port = int(first.rsplit(":", 1)[1])
            hub.start()
            again = session.commit("t", source_batch("t", 1, 5), "spark:q:0:t")
            assert session.current == first
        assert again == one
        assert len(events(first, "t")) == 5


def test_a_partition_hands_spark_whole_records_gathered_to_batch_rows(tmp_path: Path) -> None:
    """Without Spark: a partition's read gathers the hub's records (one per append here, 50
    events each) in one run of the event loop until it holds ``batchRows`` rows, and hands
    them on as one Arrow batch; ``max_bytes`` bounds a gathering before ``rows`` does."""
    from tidewire.spark.hubs import HubSession
    from tidewire.spark.planning import parse_options
    from tidewire.spark.source import TidewireReader

    fill(tmp_path / "h", [source_batch("a", 1 + 50 * k, 50) for k in range(12)])
    with hubs(tmp_path, "h") as (hub,):
        url = hub.start()
        with HubSession(url) as session:
            groups = list(session.read_groups("a", 1, 601, prefetch=2, rows=120))
            assert [[len(b) for b in g] for g in groups] == [[50, 50, 50]] * 4
            assert [i for g in groups for b in g for i in b.ids] == list(range(1, 601))
            single = list(session.read_groups("a", 101, 401, prefetch=2, rows=10_000,
                                              max_bytes=1))  # fmt: skip
            assert [[b.first_id for b in g] for g in single] == [[101 + 50 * k] for k in range(6)]
            assert [b.first_id for b in session.read("a", 551, 601, prefetch=1)] == [551]
        for rows, sizes in (("120", [150] * 4), ("1", [50] * 12), ("10000", [600])):
            options = parse_options({"url": url, "streams": "a", "batchRows": rows},
                                    streaming=False)  # fmt: skip
            reader = TidewireReader(options)
            assert all(p.tune_allocator for p in reader.partitions())  # type: ignore[attr-defined]
            batches = [rb for p in reader.partitions() for rb in reader.read(p)]
            assert [rb.num_rows for rb in batches] == sizes
            got = [v for rb in batches for v in rb.column("value").to_pylist()]
            assert got == [b"a-value-%04d" % i for i in range(1, 601)]
            assert [i for rb in batches for i in rb.column("id").to_pylist()] == list(range(1, 601))
