"""The ``tidewire`` Spark data source (``pyspark.sql.datasource``, PySpark >= 4.2).

Reading (batch and Structured Streaming): the driver asks every hub where the streams are and
how far they go (the ``?streams`` publisher), plans offsets (:mod:`.planning`) and cuts each
stream's id range into input partitions; each executor opens its own RS.io connection inside
``read()`` and turns the hub's batches into Arrow record batches (:mod:`.arrow`), so no Python
object is made per row.

Writing, exactly once (:mod:`.sink`): ``write()`` (on executors) stages its rows on each target
stream's hub as a part of the transaction ``spark:<query id>:<batch id>:<stream>`` and returns
only the parts' names, counts and fingerprints; the driver's ``commit(messages, batch_id)``
commits each stream's parts at once. The hub stores a transaction once, ever
(``tidewire.hub.txn``): a micro-batch that Spark replays after a failure, with the same query
and batch ids, finds its transactions already committed and adds nothing. ``abort()`` drops
the staged parts. With ``gateways`` (cluster mode) the parts are staged in the cluster through
any gateway and committed at any gateway (:mod:`.sink`).

Gateways (the option ``gateways``, cluster mode): every URL serves every stream, so planning
asks whichever answers first, the partitions are dealt round robin over the gateways (each
partition's first), a partition whose connection fails goes on at the next gateway from the
last id it read, and a commit that fails offers the same transaction id at the next gateway
(:class:`~.hubs.HubSession` with ``gateways``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..native import tune_allocator
from .arrow import SCHEMA_DDL, group_to_arrow
from .hubs import HubError, HubSession, ids_at, list_streams, locate, locate_any
from .planning import (
    BATCH_ROWS,
    DataLossSparkError,
    OptionError,
    Options,
    Range,
    StreamInfo,
    TimeLookup,
    cap_offsets,
    check_data_loss,
    delay_batch,
    ending_offsets,
    latest_offsets,
    match_streams,
    parse_options,
    split_ranges,
    spread,
    starting_offsets,
    stream_names,
)
from .sink import StagedParts, abort_parts_of, commit_parts, query_prefix, stage_task

__all__ = ["TidewireDataSource", "register"]

log = logging.getLogger("tidewire.spark")


def register(spark: Any) -> None:
    """Make ``spark.read.format("tidewire")`` (and write, readStream, writeStream) work."""
    spark.dataSource.register(TidewireDataSource)


class TidewireDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tidewire"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidewireReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TidewireStreamReader(parse_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise OptionError("tidewire streams are append-only: use mode 'append'")
        return TidewireWriter(parse_options(self.options, streaming=False, writing=True))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        if overwrite:
            raise OptionError("tidewire streams are append-only: use outputMode 'append'")
        return TidewireStreamWriter(parse_options(self.options, streaming=True, writing=True))


# --------------------------------------------------------------------------- reading


class _Partition(InputPartition):
    def __init__(self, range_: Range, prefetch: int, fail_on_data_loss: bool,
                 gateways: Sequence[str] = (), batch_rows: int = BATCH_ROWS,
                 tune_allocator: bool = True) -> None:  # fmt: skip
        super().__init__(range_)
        self.range = range_
        self.prefetch = prefetch
        self.fail_on_data_loss = fail_on_data_loss
        self.gateways = tuple(gateways)  # this partition's order: its own gateway first
        self.batch_rows = batch_rows
        self.tune_allocator = tune_allocator


def _partitions(ranges: Sequence[Range], options: Options) -> list[InputPartition]:
    if not options.gateways:
        return [_Partition(r, options.prefetch, options.fail_on_data_loss,
                           batch_rows=options.batch_rows, tune_allocator=options.tune_allocator)
                for r in ranges]  # fmt: skip
    urls = options.urls
    return [
        _Partition(r, options.prefetch, options.fail_on_data_loss,
                   urls[i % len(urls):] + urls[: i % len(urls)], options.batch_rows,
                   options.tune_allocator)
        for i, r in enumerate(spread(ranges, urls))
    ]  # fmt: skip


_tuned: bool | None = None  # this executor process's allocator: tuned (once), or not yet asked


def _tune_allocator() -> bool:
    """``tidewire.native.tune_allocator`` once per Python worker process (option
    ``tuneAllocator``): glibc's malloc then serves the receive path's transient buffers (a
    read of 1 MiB, a record of 1.3 MB) and the Arrow batches handed to Spark from its heap
    instead of mapping and page-faulting each anew (docs/spark.md). Whether it applied."""
    global _tuned
    if _tuned is None:
        _tuned = tune_allocator()
    return _tuned


ARROW_BATCH_ROWS = BATCH_ROWS  # (the name benchmarks/spark_read.py imports)


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The record batches of one partition, read over its own connection (opened here: a
    reader is pickled to the executors, connections are not)."""
    assert isinstance(partition, _Partition)
    # With the worker's malloc tuned, the Arrow batches come from it too (Arrow's system pool):
    # Arrow's default pool gave each batch's ~9 MB back to the kernel and page-faulted it in
    # again for the next, about a fifth of the workers' CPU inside Spark (docs/spark.md).
    pool = pa.system_memory_pool() if partition.tune_allocator and _tune_allocator() else None
    r = partition.range
    next_id = r.start
    with HubSession(r.url, gateways=partition.gateways) as hub:
        while next_id < r.end:
            try:
                # One run of the event loop gathers a batch's worth of records (>= batchRows
                # rows), handed to Spark as one Arrow batch: fewer, bigger batches for Spark
                # to take in (batches of one record cost it more: docs/spark.md).
                for group in hub.read_groups(r.stream, next_id, r.end, partition.prefetch,
                                             rows=partition.batch_rows):  # fmt: skip
                    next_id = group[-1].last_id + 1
                    yield group_to_arrow(group, pool)  # (each column copied once, in a kernel)
                return
            except HubError as exc:
                if "retention" not in str(exc):
                    raise
                if partition.fail_on_data_loss:
                    hint = "; set failOnDataLoss=false to skip them and go on"
                    raise HubError(f"{exc}{hint}") from exc
                (info,) = hub.streams([r.stream])
                kept = info.earliest
                if kept <= next_id:
                    raise
                log.warning("stream %r: ids %d..%d were removed by retention before they were "
                            "read; skipping them (failOnDataLoss=false)", r.stream, next_id,
                            kept - 1)  # fmt: skip
                next_id = kept


def _located(options: Options) -> dict[str, StreamInfo]:
    """What the hubs say of the streams to read: those named, or (``subscribePattern``) every
    stream that exists now and matches."""
    if options.pattern is not None:
        listed = list_streams(options.urls, gateways=options.gateways)
        return {name: listed[name] for name in match_streams(options.pattern, list(listed))}
    if options.gateways:
        return locate_any(options.urls, options.streams)
    return locate(options.urls, options.streams)


def _lookup(options: Options, info: dict[str, StreamInfo]) -> TimeLookup:
    """The time lookup for the timestamp options, at the hubs that hold the streams."""

    def lookup(times: dict[str, int]) -> dict[str, int | None]:
        return ids_at(info, times, gateways=options.urls if options.gateways else ())

    return lookup


class TidewireReader(DataSourceReader):
    """A batch read of ``[startingOffsets, endingOffsets)`` of each stream, planned once."""

    def __init__(self, options: Options) -> None:
        self.options = options
        info = _located(options)
        missing = [s for s in options.streams if not info[s].exists]
        if missing:
            raise OptionError(f"stream(s) {missing} exist on none of the hubs {list(options.urls)}")
        lookup = _lookup(options, info)
        start, lost = check_data_loss(
            starting_offsets(options, info, lookup), info, fail=options.fail_on_data_loss
        )
        for message in lost:
            log.warning("%s; skipping them (failOnDataLoss=false)", message)
        end = ending_offsets(options, info, lookup)
        self.ranges = split_ranges(start, end, info,
                                   events_per_partition=options.events_per_partition,
                                   min_partitions=options.min_partitions)  # fmt: skip

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(self.ranges, self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class TidewireStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{stream: next id}``; ``maxOffsetsPerTrigger`` and ``minOffsetsPerTrigger``
    with ``maxTriggerDelay`` through admission control, applied here (see :mod:`.limits`).

    Spark keeps one reader for the query's life in its planner process, so its state holds:
    ``_target`` (``Trigger.AvailableNow``'s end) and ``_last_ms`` (when the last micro-batch
    that read something was planned, on the monotonic clock, for ``maxTriggerDelay``; None:
    none yet, so the query's first trigger is never held, as Kafka's)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow's end
        self._last_ms: int | None = None
        self.clock: Callable[[], float] = time.monotonic  # seconds; tests put a fake one here

    def initialOffset(self) -> dict[str, int]:
        info = _located(self.options)
        return starting_offsets(self.options, info, _lookup(self.options, info))

    def getDefaultReadLimit(self) -> ReadLimit:
        # PySpark has no composite limit (Kafka's default is min and max together): the limit
        # only tells latestOffset "not everything"; it applies both from the options.
        if self.options.max_events_per_trigger is not None:
            return ReadMaxRows(self.options.max_events_per_trigger)
        if self.options.min_events_per_trigger is not None:
            return ReadMinRows(self.options.min_events_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        info = _located(self.options)
        self._target = latest_offsets(info, stream_names(self.options, info))

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        info = _located(self.options)
        start = self._complete(start, info)
        latest = latest_offsets(info, list(start))
        if self._target is not None:  # a stream found since holds only newer events: none
            latest = {s: min(latest[s], self._target.get(s, start[s])) for s in latest}
        if isinstance(limit, ReadAllAvailable):
            return cap_offsets(start, latest, None)  # (never below start)
        min_events = self.options.min_events_per_trigger
        now_ms = int(self.clock() * 1000)  # (monotonic: a wall clock set back would hold)
        if min_events is not None and self._target is None and delay_batch(
            now_ms=now_ms, last_ms=self._last_ms, start=start, latest=latest,
            min_events=min_events, delay_ms=self.options.max_trigger_delay_ms,
        ):  # fmt: skip
            return start  # held: the same offsets, so Spark runs no micro-batch
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = cap_offsets(start, latest, max_rows)
        if end != start:
            self._last_ms = now_ms
        return end

    def reportLatestOffset(self) -> dict[str, int]:
        info = _located(self.options)
        return latest_offsets(info, stream_names(self.options, info))

    def _complete(self, offsets: dict[str, int], info: dict[str, StreamInfo]) -> dict[str, int]:
        """``offsets`` for the streams read now: a stream added to 'streams' after the
        checkpoint starts as 'startingOffsets' says, one that 'subscribePattern' found since
        starts at its beginning (as Kafka's new partitions). A matched stream that is gone
        fails the query (``failOnDataLoss``) or is dropped with a warning."""
        names = stream_names(self.options, info)
        missing = [s for s in names if s not in offsets]
        if missing and self.options.pattern is None:
            added = starting_offsets(self.options, info, _lookup(self.options, info))
            offsets = {**offsets, **{s: added[s] for s in missing}}
        elif missing:
            offsets = {**offsets, **{s: info[s].earliest for s in missing}}
        gone = sorted(set(offsets) - set(names))
        if gone and self.options.pattern is not None:
            message = (f"stream(s) {gone} matched by subscribePattern no longer exist: events "
                       "not read yet may be lost")  # fmt: skip
            if self.options.fail_on_data_loss:
                raise DataLossSparkError(message + "; set failOnDataLoss=false to go on")
            log.warning("%s; going on without them (failOnDataLoss=false)", message)
        return {s: int(offsets[s]) for s in names}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        info = _located(self.options)
        if self.options.pattern is not None:  # the streams of this micro-batch, found or not
            info = {s: info.get(s) or StreamInfo(s, self.options.urls[0], False, None, 0)
                    for s in end}  # fmt: skip
        start, end = self._complete(start, info), self._complete(end, info)
        start, lost = check_data_loss(start, info, fail=self.options.fail_on_data_loss)
        for message in lost:
            log.warning("%s; skipping them (failOnDataLoss=false)", message)
        start = {s: min(start[s], end[s]) for s in start}
        ranges = split_ranges(start, end, info,
                              events_per_partition=self.options.events_per_partition,
                              min_partitions=self.options.min_partitions)  # fmt: skip
        return _partitions(ranges, self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: dict[str, int]) -> None:
        pass  # nothing is held for a batch: the hub keeps every event until retention


# --------------------------------------------------------------------------- writing


class TidewireWriter(DataSourceArrowWriter):
    """``df.write.format("tidewire")``: each stream's rows stored at once (one transaction)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.txn = f"spark-write:{uuid.uuid4()}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return stage_task(iterator, self.options, self.txn)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_parts(messages, self.txn, self._gateways())

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_parts_of(messages, self.txn, self._gateways())
        log.info("write aborted: nothing was published")

    def _gateways(self) -> Sequence[str]:
        return self.options.urls if self.options.gateways else ()


class TidewireStreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once streaming sink: a micro-batch is one transaction per stream, named by the
    query id and batch id, so a replayed micro-batch adds nothing."""

    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return stage_task(iterator, self.options)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        prefix = query_prefix(messages)
        if prefix is None:
            if any(isinstance(m, StagedParts) and m.parts for m in messages):
                raise RuntimeError("the streaming query id is unknown: cannot write "
                                   "exactly once")  # fmt: skip
            return
        if not prefix.endswith(f":{batchId}"):
            raise RuntimeError(f"the tasks staged {prefix!r}, not micro-batch {batchId}")
        commit_parts(messages, prefix, self.options.urls if self.options.gateways else ())

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        prefix = query_prefix(messages)
        if prefix is not None:
            abort_parts_of(messages, prefix, self.options.urls if self.options.gateways else ())
        log.info("micro-batch %d aborted: nothing was published", batchId)
