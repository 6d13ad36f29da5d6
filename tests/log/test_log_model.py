"""The durable log (tidewire.log.Log) against an in-memory model, driven by Hypothesis.

The model knows the documented rules exactly: record sizes (48-byte header, 20 bytes per event + 4,
keys 5 per event + 4, padding to 8), rolling (a group of records that would push a non-empty
active segment past ``segment_bytes`` goes to a new segment whose base id is the last id + 1), and
retention (the oldest sealed segment goes while the stream keeps at least ``retention_bytes``
without it, or when its newest timestamp is older than ``retention_ms``). So it predicts not only
the events but also ``start_id``, the segment files and the stats.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from array import array
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.log.grouping import MERGE_MAX_BYTES, MERGE_MAX_EVENTS
from tidewire.log.stream import directory_name
from tidewire.model import (
    MAX_ID,
    Batch,
    DataLossError,
    Event,
    IdOrderError,
    InvalidBatch,
    LogClosedError,
)

T = TypeVar("T")

SEGMENT_BYTES = 4096
INDEX_INTERVAL = 64
STREAMS = ("alpha", "β/two")
NO_LIMIT = 2**63 - 1


def record_length(events: list[Event]) -> int:
    """The on-disk size of one record holding ``events`` (computed from the documented layout)."""
    n = len(events)
    size = 48 + 20 * n + 4 + sum(len(e.value) for e in events)
    if any(e.key is not None for e in events):
        size += 5 * n + 4 + sum(len(e.key or b"") for e in events)
    return size + (-size % 8)


def batch_nbytes(events: list[Event]) -> int:
    """``Batch.nbytes`` of a batch holding ``events`` (keys counted when any event has one)."""
    n = len(events)
    size = 20 * n + 4 + sum(len(e.value) for e in events)
    if any(e.key is not None for e in events):
        size += 5 * n + 4 + sum(len(e.key or b"") for e in events)
    return size


def merged_records(group: list[list[Event]]) -> list[list[Event]]:
    """The records one group commit writes: consecutive batches of at most MERGE_MAX_EVENTS
    events and MERGE_MAX_BYTES bytes share a record (a run closes before it would grow past
    MERGE_MAX_BYTES); any other batch is a record of its own."""
    records: list[list[Event]] = []
    run: list[Event] = []
    run_bytes = 0
    for batch in group:
        size = batch_nbytes(batch)
        if len(batch) <= MERGE_MAX_EVENTS and size <= MERGE_MAX_BYTES:
            if run and run_bytes + size > MERGE_MAX_BYTES:
                records.append(run)
                run, run_bytes = [], 0
            run = [*run, *batch]
            run_bytes += size
        else:
            if run:
                records.append(run)
                run, run_bytes = [], 0
            records.append(batch)
    if run:
        records.append(run)
    return records


@dataclass
class ModelSegment:
    base_id: int
    size: int = 0
    last_id: int = 0
    max_ts: int = -(2**63)


@dataclass
class ModelStream:
    name: str
    created: bool = False
    latest: int = 0
    events: list[Event] = field(default_factory=list)  # retained events, in id order
    segments: list[ModelSegment] = field(default_factory=lambda: [ModelSegment(1)])
    record_of: dict[int, tuple[int, bool]] = field(default_factory=dict)  # id: (record, keyed)
    records: int = 0

    @property
    def start_id(self) -> int:
        return self.segments[0].base_id

    def commit(self, appended: list[list[Event]]) -> None:
        """One group commit (one write): rolls at most once, before the group; runs of small
        batches share a record (see :func:`merged_records`)."""
        group = merged_records(appended)
        incoming = sum(record_length(batch) for batch in group)
        active = self.segments[-1]
        if active.size and active.size + incoming > SEGMENT_BYTES:
            active = ModelSegment(active.last_id + 1)
            self.segments.append(active)
            event("segment rolled")
        for batch in group:
            active.size += record_length(batch)
            active.last_id = batch[-1].id
            active.max_ts = max(active.max_ts, *(e.timestamp for e in batch))
            self.events.extend(batch)
            self.latest = batch[-1].id
            keyed = any(e.key is not None for e in batch)
            self.record_of.update((e.id, (self.records, keyed)) for e in batch)
            self.records += 1

    def read_sizes(self, events: list[Event]) -> list[int]:
        """``Batch.nbytes`` summed over what a read of the first 1, 2, ... of ``events`` returns
        (consecutive retained events, one batch per record)."""
        sizes: list[int] = []
        total = 0
        previous = None
        for e in events:
            record, keyed = self.record_of[e.id]
            total += 20 + len(e.value) + (5 + len(e.key or b"") if keyed else 0)
            if record != previous:
                total += 8 if keyed else 4  # a new batch
            previous = record
            sizes.append(total)
        return sizes

    def retain(self, now_ms: int, by_bytes: int | None, by_age: int | None) -> int:
        if not self.created or (by_bytes is None and by_age is None):
            return 0
        total = sum(s.size for s in self.segments)
        removed = 0
        while len(self.segments) > 1:
            oldest = self.segments[0]
            too_old = by_age is not None and oldest.max_ts < now_ms - by_age
            too_big = by_bytes is not None and total - oldest.size >= by_bytes
            if not (too_old or too_big):
                break
            self.segments.pop(0)
            total -= oldest.size
            removed += 1
        self.events = [e for e in self.events if e.id >= self.start_id]
        return removed


# --------------------------------------------------------------------------- strategies

values = st.one_of(
    st.binary(max_size=48),
    st.builds(lambda n, b: bytes([b]) * n, st.integers(0, 1800), st.integers(0, 255)),
)
EventSpec = tuple[bytes, bytes | None, int]
event_specs = st.tuples(values, st.none() | st.binary(max_size=16), st.integers(-100, 100))
batch_specs = st.lists(event_specs, min_size=1, max_size=6)
stream_names = st.sampled_from(STREAMS)


class LogMachine(RuleBasedStateMachine):
    base_dir: ClassVar[Path | None] = None

    def __init__(self) -> None:
        super().__init__()
        assert self.base_dir is not None
        self.dir = tempfile.mkdtemp(dir=self.base_dir)
        self.runner = asyncio.Runner()
        self.log: Log | None = None
        self.config = LogConfig()
        self.model = {name: ModelStream(name) for name in STREAMS}
        self.clock = 1_000_000
        self.retention_bytes: int | None = None
        self.retention_ms: int | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    @property
    def the_log(self) -> Log:
        assert self.log is not None
        return self.log

    def teardown(self) -> None:
        try:
            if self.log is not None and not self.log.closed:
                self.run(self.log.close())
        finally:
            self.runner.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ setup

    @initialize(
        retention_bytes=st.sampled_from([None, 0, 3000, 6000, 12000]),
        retention_ms=st.sampled_from([None, 0, 1500, 5000]),
    )
    def open_log(self, retention_bytes: int | None, retention_ms: int | None) -> None:
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self.config = LogConfig(
            defaults=StreamSettings(
                segment_bytes=SEGMENT_BYTES,
                index_interval_bytes=INDEX_INTERVAL,
                retention_bytes=retention_bytes,
                retention_ms=retention_ms,
            )
        )
        self.log = Log.open(self.dir, self.config)

    # ------------------------------------------------------------------ helpers

    def _build(
        self, name: str, specs: list[EventSpec], keyed: bool, ids: list[int] | None = None
    ) -> Batch:
        return Batch.build(
            name,
            [v for v, _, _ in specs],
            ids=ids,
            keys=[k for _, k, _ in specs] if keyed else None,
            timestamps=[self.clock + jitter for _, _, jitter in specs],
        )

    @staticmethod
    def _events(name: str, batch: Batch, first_id: int) -> list[Event]:
        return [
            Event(name, first_id + i, batch.value(i), batch.key(i), int(batch.timestamps[i]))
            for i in range(len(batch))
        ]

    # ------------------------------------------------------------------ rules: appends

    @rule(name=stream_names, specs=batch_specs, keyed=st.booleans(), tick=st.integers(0, 800))
    def append_assigned(self, name: str, specs: list[EventSpec], keyed: bool, tick: int) -> None:
        self.clock += tick
        m = self.model[name]
        batch = self._build(name, specs, keyed)
        if m.latest + len(batch) > MAX_ID:
            with pytest.raises(InvalidBatch):
                self.run(self.the_log.append(batch, assign_ids=True))
            return
        stored = self.run(self.the_log.append(batch, assign_ids=True))
        expected = self._events(name, batch, m.latest + 1)
        assert list(stored) == expected
        m.created = True
        m.commit([expected])

    @rule(
        name=stream_names,
        specs=batch_specs,
        keyed=st.booleans(),
        kind=st.sampled_from(["small"] * 6 + ["big", "near-max"]),
        data=st.data(),
    )
    def append_chosen(
        self, name: str, specs: list[EventSpec], keyed: bool, kind: str, data: st.DataObject
    ) -> None:
        m = self.model[name]
        gaps = data.draw(
            st.lists(st.integers(1, 4), min_size=len(specs) - 1, max_size=len(specs) - 1)
        )
        span = sum(gaps)
        if kind == "small":
            first = m.latest + data.draw(st.integers(1, 5))
        elif kind == "big":
            first = m.latest + data.draw(st.integers(6, 10**12))
        else:
            first = MAX_ID - span - data.draw(st.integers(0, 3))
        if first <= m.latest or first + span > MAX_ID:
            return  # nothing valid of this kind is left
        ids = [first]
        for gap in gaps:
            ids.append(ids[-1] + gap)
        batch = self._build(name, specs, keyed, ids)
        stored = self.run(self.the_log.append(batch))
        expected = [
            Event(name, event_id, e.value, e.key, e.timestamp)
            for event_id, e in zip(ids, self._events(name, batch, 0), strict=True)
        ]
        assert list(stored) == expected
        m.created = True
        m.commit([expected])

    @rule(name=stream_names, specs=batch_specs, back=st.integers(0, 5))
    def append_rejected(self, name: str, specs: list[EventSpec], back: int) -> None:
        m = self.model[name]
        if m.latest == 0:
            return
        first = max(1, m.latest - back)
        ids = list(range(first, first + len(specs)))
        if ids[-1] > MAX_ID:
            return
        batch = self._build(name, specs, False, ids)
        with pytest.raises(IdOrderError) as info:
            self.run(self.the_log.append(batch))
        assert (info.value.stream, info.value.first_id, info.value.latest) == (
            name,
            first,
            m.latest,
        )

    @rule(
        name=stream_names,
        group=st.lists(st.tuples(batch_specs, st.booleans()), min_size=2, max_size=4),
        clash=st.booleans(),
    )
    def append_concurrently(
        self, name: str, group: list[tuple[list[EventSpec], bool]], clash: bool
    ) -> None:
        """Concurrent appenders form one group commit; ids follow the order of the queue.

        With ``clash``, one more appender picks ids that only a *queued* batch already took: it
        must be rejected (the latest id counts batches not yet written).
        """
        m = self.model[name]
        batches = [self._build(name, specs, keyed) for specs, keyed in group]
        total = sum(len(b) for b in batches)
        if m.latest + total + 1 > MAX_ID:
            return
        log = self.the_log
        clashing = self._build(
            name, group[0][0], False, list(range(m.latest + 1, m.latest + 1 + len(group[0][0])))
        )

        async def go() -> list[Batch | BaseException]:
            calls = [log.append(b, assign_ids=True) for b in batches]
            if clash:
                calls.append(log.append(clashing))
            return await asyncio.gather(*calls, return_exceptions=True)

        results = self.run(go())
        next_id = m.latest + 1
        committed = []
        for batch, result in zip(batches, results, strict=False):
            assert isinstance(result, Batch), result
            expected = self._events(name, batch, next_id)
            assert list(result) == expected
            committed.append(expected)
            next_id += len(batch)
        if clash:
            error = results[-1]
            assert isinstance(error, IdOrderError), error
            assert (error.first_id, error.latest) == (m.latest + 1, next_id - 1)
        m.created = True
        m.commit(committed)

    # ------------------------------------------------------------------ rules: reads

    @rule(
        data=st.data(),
        max_events=st.integers(1, 8) | st.just(NO_LIMIT),
        in_thread=st.booleans(),
    )
    def read(self, data: st.DataObject, max_events: int, in_thread: bool) -> None:
        created = [name for name, m in self.model.items() if m.created]
        name = data.draw(st.sampled_from(created) if created else stream_names, label="name")
        if created and data.draw(st.integers(0, 9), label="uncreated") == 0:
            name = data.draw(stream_names, label="name")
        m = self.model[name]
        candidates = {1, m.start_id, max(1, m.start_id - 1), m.latest, m.latest + 1, m.latest + 7}
        candidates.update(e.id for e in m.events[-4:])
        choices = [st.sampled_from(sorted(candidates)), st.integers(1, m.latest + 2)]
        if m.events:
            ids = [e.id for e in m.events]
            choices.append(st.sampled_from(ids))
            choices.append(st.sampled_from(ids).map(lambda i: max(1, i - 1)))
        if m.start_id > 1:  # below the start: removed by retention
            choices.append(st.integers(1, m.start_id - 1))
        from_id = data.draw(st.one_of(choices), label="from_id")
        expected = [e for e in m.events if e.id >= from_id]
        budgets = [st.sampled_from([0, 1, 200, 1000, 5000, 1 << 20]), st.integers(0, 20000)]
        if expected:  # just below, at or just above the size of the first k events
            sizes = m.read_sizes(expected[:30])
            budgets.append(
                st.builds(
                    lambda k, delta: max(0, sizes[k] + delta),
                    st.integers(0, len(sizes) - 1),
                    st.integers(-9, 9),
                )
            )
        max_bytes = data.draw(st.one_of(budgets), label="max_bytes")
        log = self.the_log

        def do_read() -> list[Batch]:
            if in_thread:
                return self.run(log.read_async(name, from_id, max_bytes, max_events))
            return log.read(name, from_id, max_bytes, max_events)

        if not m.created:
            assert do_read() == []
            return
        if from_id < m.start_id:
            event("read below start_id")
            with pytest.raises(DataLossError) as info:
                do_read()
            assert (info.value.requested, info.value.first_id) == (from_id, m.start_id)
            return
        batches = do_read()
        got = [e for b in batches for e in b]
        event(f"read: {'all' if len(got) == len(expected) else 'partial'} of the remaining events")
        assert got == expected[: len(got)]
        assert len(got) <= max_events
        if expected:
            assert got, "a read gives at least one event when there is one"
        # One batch per record (a slice of it), in order.
        records = [{m.record_of[e.id][0] for e in b} for b in batches]
        assert all(len(r) == 1 for r in records), records
        numbers = [min(r) for r in records]
        assert numbers == sorted(set(numbers))
        # As many events as fit in max_bytes (as Batch.nbytes counts them), at least one.
        total = sum(b.nbytes for b in batches)
        if len(got) > 1:
            assert total <= max_bytes, "the read returned more than max_bytes"
        if len(got) < min(len(expected), max_events):
            one_more = m.read_sizes(expected[: len(got) + 1])[-1]
            assert one_more > max_bytes, "the read stopped although the next event fit"
        for b in batches:
            assert b.stream == name
            b.validate()

    # ------------------------------------------------------------------ rules: lifecycle

    @rule(graceful=st.booleans())
    def restart(self, graceful: bool) -> None:
        log = self.the_log
        if graceful:
            self.run(log.close())
        else:
            log.close_sync()
        assert log.closed
        with pytest.raises(LogClosedError):
            self.run(log.append(Batch.build(STREAMS[0], [b"late"], timestamps=0), assign_ids=True))
        for name in STREAMS:
            if self.model[name].created:
                with pytest.raises(LogClosedError):
                    log.read(name, self.model[name].start_id)
        self.log = Log.open(self.dir, self.config)

    @rule(advance=st.integers(0, 6000))
    def retention(self, advance: int) -> None:
        now = self.clock + advance
        expected = sum(
            m.retain(now, self.retention_bytes, self.retention_ms) for m in self.model.values()
        )
        assert self.the_log.enforce_retention(now) == expected
        for name, m in self.model.items():
            if m.start_id > 1:
                with pytest.raises(DataLossError):
                    self.the_log.read(name, m.start_id - 1)
                first = self.the_log.read(name, m.start_id, 0, 1)
                assert [e for b in first for e in b] == m.events[:1]
        event(f"retention removed {min(expected, 3)}{'+' if expected > 3 else ''} segments")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def matches_the_model(self) -> None:
        if self.log is None:
            return
        log = self.log
        for name, m in self.model.items():
            assert log.latest(name) == m.latest
            assert log.start_id(name) == m.start_id
            if not m.created:
                assert name not in log
                assert log.read(name, 1) == []
                continue
            assert [e for b in log.read(name, m.start_id, NO_LIMIT) for e in b] == m.events
            stats = log.stream(name).stats()
            assert stats.events == len(m.events)
            assert stats.first_id == (m.events[0].id if m.events else None)
            assert stats.latest_id == (m.latest if m.events else None)
            assert stats.bytes == sum(s.size for s in m.segments)
            assert stats.segments == len(m.segments)
            files = sorted(os.listdir(log.stream(name).directory))
            assert [f for f in files if f.endswith(".log")] == [
                f"{s.base_id:020d}.log" for s in m.segments
            ]
            assert [f for f in files if f.endswith(".index")] == [
                f"{s.base_id:020d}.index" for s in m.segments[:-1]
            ]
        assert log.streams() == sorted(name for name, m in self.model.items() if m.created)


def test_log_against_model(tmp_path: Path) -> None:
    LogMachine.base_dir = tmp_path
    try:
        run_state_machine_as_test(
            LogMachine,
            settings=settings(
                max_examples=100,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            ),
        )
    finally:
        LogMachine.base_dir = None


# --------------------------------------------------------------------------- stream directories


def _tricky_names() -> list[str]:
    long_name = "a" * 255
    digest = hashlib.sha256(long_name.encode()).hexdigest()
    return [
        long_name,
        "a" * 254 + "b",  # same first 160 encoded characters as long_name
        "a" * 160 + "~" + digest[:32],  # what an earlier directory_name() made of long_name
        directory_name(long_name),  # what directory_name() makes of it now, as a stream name
        "é" * 127 + "a",
        "é" * 127 + "b",
        "%" * 255,
        "%25" * 85,
        ".",
        "..",
        ".lock",
        "%2E",
        "a/b",
        "a%2Fb",
        "A",
        "a",
    ]


def test_directory_names_are_distinct_and_safe() -> None:
    names = _tricky_names()
    assert len(set(names)) == len(names)
    directories = [directory_name(n) for n in names]
    assert len(set(directories)) == len(directories), directories
    for d in directories:
        assert "/" not in d
        assert d not in (".", "..", ".lock")
        assert not d.startswith(".")
        assert len(d.encode()) <= 255


def test_distinct_stream_names_keep_distinct_data(tmp_path: Path) -> None:
    """Regression: a 193-byte name once got the same directory as a 255-byte one; appending to it
    overwrote the other stream's stream.name, and after a restart its events changed names."""
    names = _tricky_names()
    directory = str(tmp_path / "data")

    async def scenario() -> dict[str, list[bytes]]:
        log = Log.open(directory)
        try:
            for i, name in enumerate(names):
                value = f"value {i}".encode()
                await log.append(Batch.build(name, [value], timestamps=0), assign_ids=True)
        finally:
            await log.close()
        log = Log.open(directory)
        try:
            assert log.streams() == sorted(names)
            return {n: [e.value for b in log.read(n, 1) for e in b] for n in names}
        finally:
            await log.close()

    values = asyncio.run(scenario())
    assert values == {n: [f"value {i}".encode()] for i, n in enumerate(names)}


# --------------------------------------------------------------------------- exact examples


def _fixed_record(stream: str, ts: int) -> Batch:
    """One event whose record is exactly 1024 bytes: 48 + 20 + 4 + 952."""
    batch = Batch.build(stream, [bytes([ts % 251]) * 952], timestamps=ts)
    assert record_length(list(batch)) == 1024
    return batch


def _fill(directory: str, config: LogConfig, count: int) -> None:
    async def go() -> None:
        log = Log.open(directory, config)
        try:
            for i in range(1, count + 1):
                stored = await log.append(_fixed_record("r", 1000 * i), assign_ids=True)
                assert stored.first_id == i
        finally:
            await log.close()

    asyncio.run(go())


def _settings(**retention: int) -> LogConfig:
    return LogConfig(
        defaults=StreamSettings(segment_bytes=4096, index_interval_bytes=64, **retention)
    )


def test_a_record_that_exactly_fills_a_segment_does_not_roll(tmp_path: Path) -> None:
    directory = str(tmp_path)
    _fill(directory, _settings(), 10)
    stream_dir = tmp_path / "r"
    sizes = {p.name: p.stat().st_size for p in sorted(stream_dir.glob("*.log"))}
    assert sizes == {
        f"{1:020d}.log": 4096,
        f"{5:020d}.log": 4096,
        f"{9:020d}.log": 2048,
    }
    assert sorted(p.name for p in stream_dir.glob("*.index")) == [
        f"{1:020d}.index",
        f"{5:020d}.index",
    ]


@pytest.mark.parametrize(("retention_bytes", "start"), [(6144, 5), (6145, 1), (2048, 9), (0, 9)])
def test_retention_by_size_boundary(tmp_path: Path, retention_bytes: int, start: int) -> None:
    directory = str(tmp_path)
    config = _settings(retention_bytes=retention_bytes)
    _fill(directory, config, 10)  # segments of 4096, 4096 and 2048 bytes
    log = Log.open(directory, config)
    try:
        removed = log.enforce_retention(now_ms=0)
        assert removed == {1: 0, 5: 1, 9: 2}[start]
        assert log.start_id("r") == start
        assert log.latest("r") == 10
        assert [e.id for b in log.read("r", start, NO_LIMIT) for e in b] == list(range(start, 11))
        if start > 1:
            with pytest.raises(DataLossError) as info:
                log.read("r", start - 1)
            assert (info.value.stream, info.value.requested, info.value.first_id) == (
                "r",
                start - 1,
                start,
            )
        assert log.enforce_retention(now_ms=0) == 0  # idempotent
    finally:
        log.close_sync()


def test_retention_by_age_boundary_and_restart(tmp_path: Path) -> None:
    directory = str(tmp_path)
    config = _settings(retention_ms=1000)
    _fill(directory, config, 10)  # newest timestamps: 4000, 8000 and 10000 ms
    log = Log.open(directory, config)  # sealed segments come back from their index files
    try:
        assert log.enforce_retention(now_ms=5000) == 0  # 4000 is not older than 5000 - 1000
        assert log.start_id("r") == 1
        assert log.enforce_retention(now_ms=5001) == 1
        assert log.start_id("r") == 5
        assert not (tmp_path / "r" / f"{1:020d}.log").exists()
        assert not (tmp_path / "r" / f"{1:020d}.index").exists()
    finally:
        log.close_sync()
    log = Log.open(directory, config)
    try:
        assert log.start_id("r") == 5
        with pytest.raises(DataLossError):
            log.read("r", 4)
        assert log.enforce_retention(now_ms=10**9) == 1  # the active segment always stays
        assert log.start_id("r") == 9
        assert [e.id for b in log.read("r", 9) for e in b] == [9, 10]
        stored = asyncio.run(log.append(_fixed_record("r", 1), assign_ids=True))
        assert stored.first_id == 11
    finally:
        log.close_sync()


def test_wait_for_wakes_on_commit_and_on_close(tmp_path: Path) -> None:
    async def go() -> None:
        log = Log.open(str(tmp_path))
        waiter = asyncio.create_task(log.wait_for("t", 0))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiter.done()
        await log.append(Batch.build("t", [b"x"], timestamps=0), assign_ids=True)
        await asyncio.wait_for(waiter, timeout=10)
        await log.wait_for("t", 0)  # already satisfied: returns at once
        later = asyncio.create_task(log.wait_for("t", 1))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not later.done()
        await log.close()
        with pytest.raises(LogClosedError):
            await asyncio.wait_for(later, timeout=10)

    asyncio.run(go())


def test_cancelling_an_appender_does_not_cancel_the_write(tmp_path: Path) -> None:
    async def go() -> None:
        log = Log.open(str(tmp_path))
        task = asyncio.create_task(
            log.append(Batch.build("c", [b"one", b"two"], timestamps=0), assign_ids=True)
        )
        await asyncio.sleep(0)  # one turn of the loop: the batch is queued
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stored = await log.append(Batch.build("c", [b"three"], timestamps=0), assign_ids=True)
        assert stored.first_id == 3
        await log.close()

    asyncio.run(go())
    log = Log.open(str(tmp_path))
    try:
        assert [(e.id, e.value) for b in log.read("c", 1) for e in b] == [
            (1, b"one"),
            (2, b"two"),
            (3, b"three"),
        ]
    finally:
        log.close_sync()


def test_read_async_serves_what_was_written_not_the_callers_buffer(tmp_path: Path) -> None:
    async def go() -> tuple[list[bytes], list[bytes]]:
        log = Log.open(str(tmp_path))
        try:
            # A batch decoded zero-copy from a receive buffer that the caller reuses afterwards.
            receive_buffer = bytearray(b"hello")
            batch = Batch(
                "z",
                memoryview(array("Q", [1])),
                memoryview(array("q", [0])),
                memoryview(array("I", [0, 5])),
                memoryview(receive_buffer),
            )
            await log.append(batch)
            receive_buffer[:] = b"XXXXX"  # the next request arrives in the same buffer
            from_memory = [e.value for b in await log.read_async("z", 1) for e in b]
            from_disk = [e.value for b in log.read("z", 1) for e in b]
            return from_memory, from_disk
        finally:
            await log.close()

    from_memory, from_disk = asyncio.run(go())
    assert from_disk == [b"hello"]
    assert from_memory == from_disk


def test_read_across_segments_never_returns_more_than_max_bytes(tmp_path: Path) -> None:
    """Two 3024-byte events in two segments: a 3100-byte read must stop after the first."""
    config = _settings()

    async def go() -> tuple[list[int], list[int], list[int]]:
        log = Log.open(str(tmp_path), config)
        try:
            for fill in (b"a", b"b"):
                await log.append(Batch.build("r", [fill * 3000], timestamps=0), assign_ids=True)
            assert log.stream("r").stats().segments == 2
            from_memory = [e.id for b in await log.read_async("r", 1, 3100) for e in b]
        finally:
            await log.close()
        log = Log.open(str(tmp_path), config)
        try:
            from_disk = [e.id for b in log.read("r", 1, 3100) for e in b]
            from_disk_async = [e.id for b in await log.read_async("r", 1, 3100) for e in b]
        finally:
            await log.close()
        return from_memory, from_disk, from_disk_async

    from_memory, from_disk, from_disk_async = asyncio.run(go())
    assert from_memory == [1]
    assert from_disk == [1], "the disk read went past max_bytes into the next segment"
    assert from_disk_async == [1]


def test_read_within_a_record_never_returns_more_than_max_bytes(tmp_path: Path) -> None:
    async def go() -> list[tuple[int, int, int]]:
        log = Log.open(str(tmp_path))
        over = []
        try:
            await log.append(Batch.build("f", [b"x" * 10] * 5, timestamps=0), assign_ids=True)
            for max_bytes in range(35, 160):
                for batches in (
                    log.read("f", 1, max_bytes),
                    await log.read_async("f", 1, max_bytes),
                ):
                    total = sum(b.nbytes for b in batches)
                    if total > max_bytes:
                        over.append((max_bytes, sum(len(b) for b in batches), total))
        finally:
            await log.close()
        return over

    assert asyncio.run(go()) == []  # e.g. max_bytes=63 gives 2 events, 64 bytes
