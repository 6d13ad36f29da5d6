"""The streaming reader's admission control and ``subscribePattern`` driven as Spark's planner
drives them (``initialOffset``, ``latestOffset(start, limit)``, ``partitions``,
``prepareForTriggerAvailableNow``), against a real hub (``tidewire serve``, stopped by pid)
but without a JVM, with a fake clock: every step of ``minOffsetsPerTrigger`` and
``maxTriggerDelay`` is checked without waiting for it."""

from __future__ import annotations

import pytest

from spark_rows import publish, source_batch
from tidewire.spark.planning import parse_options

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install tidewire[spark])")

from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    ReadMinRows,
)

from tidewire.spark.source import TidewireStreamReader


class FakeClock:
    """Seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _reader(hub_url: str, **options: str) -> tuple[TidewireStreamReader, FakeClock]:
    reader = TidewireStreamReader(parse_options({"url": hub_url, **options}, streaming=True))
    clock = FakeClock()
    reader.clock = clock
    return reader, clock


def _ranges(reader: TidewireStreamReader, start: dict[str, int],
            end: dict[str, int]) -> list[tuple[str, int, int]]:  # fmt: skip
    return [(p.range.stream, p.range.start, p.range.end)  # type: ignore[attr-defined]
            for p in reader.partitions(start, end)]  # fmt: skip


def test_min_max_and_delay_with_a_pattern_step_by_step(hub_url: str) -> None:
    publish(hub_url, "p-a", source_batch("p-a", 1, 5))
    publish(hub_url, "q", source_batch("q", 1, 5))
    reader, clock = _reader(hub_url, subscribePattern="p-.*", startingOffsets="latest",
                            minOffsetsPerTrigger="4", maxTriggerDelay="10s",
                            maxOffsetsPerTrigger="6")  # fmt: skip
    start = reader.initialOffset()
    assert start == {"p-a": 6}
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxRows(6)
    assert reader.latestOffset(start, limit) == start  # nothing new
    publish(hub_url, "p-a", source_batch("p-a", 6, 2))
    end = reader.latestOffset(start, limit)
    assert end == {"p-a": 8}  # 2 < 4, but no micro-batch ran yet: never held
    # a stream created now joins, from its beginning; 3 waiting < 4: held
    publish(hub_url, "p-b", source_batch("p-b", 1, 3))
    clock.now += 9.999
    held = reader.latestOffset(end, limit)
    assert held == {"p-a": 8, "p-b": 1}
    assert _ranges(reader, end, held) == []  # (held: nothing to read)
    clock.now += 0.001  # maxTriggerDelay since the last micro-batch: fire with what there is
    fired = reader.latestOffset(held, limit)
    assert fired == {"p-a": 8, "p-b": 4}
    assert _ranges(reader, end, fired) == [("p-b", 1, 4)]
    # 20 waiting >= 4: at once, capped at 6, in proportion (p-a: 20, p-b: 4 of 24)
    publish(hub_url, "p-a", source_batch("p-a", 8, 20))
    publish(hub_url, "p-b", source_batch("p-b", 4, 4))
    capped = reader.latestOffset(fired, limit)
    assert capped == {"p-a": 13, "p-b": 5}
    assert reader.latestOffset(capped, ReadAllAvailable()) == {"p-a": 28, "p-b": 8}
    assert reader.reportLatestOffset() == {"p-a": 28, "p-b": 8}


def test_min_alone_is_read_min_rows_and_available_now_is_never_held(hub_url: str) -> None:
    publish(hub_url, "s", source_batch("s", 1, 3))
    reader, clock = _reader(hub_url, streams="s", startingOffsets="earliest",
                            minOffsetsPerTrigger="100")  # fmt: skip
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMinRows(100)
    start = reader.initialOffset()
    first = reader.latestOffset(start, limit)
    assert first == {"s": 4}
    publish(hub_url, "s", source_batch("s", 4, 2))
    assert reader.latestOffset(first, limit) == first  # held: 2 < 100, 15 minutes to go
    clock.now += 15 * 60
    assert reader.latestOffset(first, limit) == {"s": 6}
    # Trigger.AvailableNow must end: never held, and nothing newer than its start is read
    reader, clock = _reader(hub_url, streams="s", startingOffsets="earliest",
                            minOffsetsPerTrigger="100")  # fmt: skip
    start = reader.initialOffset()
    reader.latestOffset(start, limit)
    reader.prepareForTriggerAvailableNow()
    publish(hub_url, "s", source_batch("s", 6, 2))
    assert reader.latestOffset({"s": 4}, limit) == {"s": 6}


def test_a_vanished_pattern_stream_is_data_loss(hub_url: str) -> None:
    publish(hub_url, "v-a", source_batch("v-a", 1, 2))
    reader, _ = _reader(hub_url, subscribePattern="v-.*", startingOffsets="earliest")
    # a checkpoint's offsets that name a stream the hub no longer has
    with pytest.raises(Exception, match=r"\['v-gone'\] matched by subscribePattern no longer"):
        reader.latestOffset({"v-a": 1, "v-gone": 4}, ReadAllAvailable())
    lenient, _ = _reader(hub_url, subscribePattern="v-.*", failOnDataLoss="false")
    assert lenient.latestOffset({"v-a": 1, "v-gone": 4}, ReadAllAvailable()) == {"v-a": 3}
