"""Benchmark: tidewire's durable log against stdlib ``sqlite3`` (WAL, ``synchronous=FULL``).

Run ``.venv/bin/python benchmarks/log_append.py`` (about 1-2 minutes) or add ``--quick`` (about
20 s, fewer and shorter rounds, a smaller read data set). ``--dir`` picks where the temporary
directories go (default: ``/tmp`` unless it is a RAM file system, then the working directory; a
``fsync`` on tmpfs is free, which would make the comparison meaningless).

What is measured (every event has an 8-byte key, a value of the stated size and a timestamp; the
SQLite table is ``t(id INTEGER PRIMARY KEY, key BLOB, value BLOB, ts INTEGER)``, ids assigned by
the store on both sides, inputs built before the clock starts):

1. ``batched_append_100B``: durable appends of 100 B events, 1000 per call. tidewire: one
   ``Batch`` of 1000 per ``await log.append(batch, assign_ids=True)``, one writer. SQLite:
   ``executemany`` of 1000 rows + ``commit`` per transaction.
2. ``batched_append_1KiB``: the same with 1 KiB values. Goal: tidewire >= 2x SQLite.
3. ``concurrent_single_append_16w``: 16 asyncio tasks each appending 1-event batches (100 B) to
   the same stream in a loop, so group commit coalesces them. SQLite: one row per transaction,
   one connection, sequential. Goal (issue 22, row 1): tidewire >= 10x SQLite.
3b. ``concurrent_single_append_16w_16s_100B``: 16 asyncio tasks, each appending 1-event batches
   (100 B) to a stream of its own (16 streams), one append in flight per task: commits to
   *different* streams (issue 22, item 1). Baseline: the disk's raw durable-commit rate, one
   1 KiB ``os.write`` + ``os.fdatasync`` at a time in a loop on the same file system (its own
   rounds, taken in turns with both many-stream sides). No goal of its own (issue 22's table
   sets one for Seguro points, in ``seguro_save.py``). Also reported: figure 3 of the same run
   (``one_stream_value``, ``vs_one_stream``).
3c. ``concurrent_single_append_1000w_1000s_100B``: the same with 1,000 tasks on 1,000 streams
   (one task per stream, so one append in flight per stream, as 1,000 Seguro points are).
4. ``range_read_100B``: reading a whole stream of 100 B events (1.5 M events, 200 k with
   ``--quick``, written in records of 1000) by id range from the warm page cache. tidewire:
   the log reopened read-only, ``log.read(stream, next_id, max_bytes=1 MiB)`` in a loop,
   counting ``len(batch)`` only (no per-event Python work; CRCs are checked as records are
   read). SQLite: ``SELECT id, value FROM t WHERE id >= ? AND id < ?`` in
   chunks of 8192 ids, ``fetchall``. Goal (absolute): tidewire >= 2,000,000 events/s.

Method: each measurement runs against a fresh temporary directory (a new log or database; the
stream or table and a warm-up write happen before the clock starts) for a fixed time budget
(bounded in count as well), then everything is removed. The two sides are interleaved, alternating
which goes first, for several rounds; the best round of each side is reported (the machine is
shared and noisy; the best round is the least disturbed one). Appends are durable: tidewire's
``append`` returns after ``fdatasync``, SQLite's ``commit`` after the WAL is synced.

Output: exactly one JSON line per figure on stdout (progress goes to stderr), e.g.::

    {"benchmark": "log_append", "figure": "batched_append_1KiB", "unit": "events/s",
     "tidewire": 123.0, "baseline": "sqlite-wal-full-1000-per-txn", "baseline_value": 45.0,
     "ratio": 2.73, "goal": "ratio >= 2.0", "goal_ratio": 2.0, "meets_goal": true, ...}

(one line in reality). ``tidewire`` and ``baseline_value`` are the best rounds in ``unit``;
``ratio`` is tidewire / baseline; ``goal_ratio`` is the ratio aimed for (``null`` where the goal
is absolute or there is none); ``meets_goal`` says whether the goal is met (``null`` if there is
no goal); ``tidewire_rounds`` / ``baseline_rounds`` list every round, to judge the noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from _common import (
    RAM_FILE_SYSTEMS,
    RAW_COMMIT_BYTES,
    choose_base,
    fresh_dir,
    fs_type,
    loop_factory,
    note,
    raw_fdatasync_rate,
)
from tidewire.config import SETTINGS
from tidewire.log import Log, LogConfig
from tidewire.model import Batch

STREAM = "bench"
BATCH_EVENTS = 1000
WRITERS = 16
MANY_STREAM_WRITERS = (16, 1000)  # figures 3b, 3c: one task per stream, as many streams
KEY_BYTES = 8
SMALL = 100
LARGE = 1024
READ_MAX_BYTES = 1024 * 1024
SQLITE_READ_CHUNK = 8192
TIMESTAMP = 1_700_000_000_000
READ_GOAL = 2_000_000.0
MAX_BYTES_PER_MEASUREMENT = 1 << 30  # bounds the disk used by one measurement

CREATE_TABLE = "CREATE TABLE t (id INTEGER PRIMARY KEY, key BLOB, value BLOB, ts INTEGER)"
INSERT = "INSERT INTO t (key, value, ts) VALUES (?, ?, ?)"
SELECT_RANGE = "SELECT id, value FROM t WHERE id >= ? AND id < ?"


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int
    budget_s: float  # the time one measurement runs for
    read_events: int  # size of the stream / table read by figure 4


FULL = Settings(rounds=3, budget_s=2.5, read_events=1_500_000)
QUICK = Settings(rounds=2, budget_s=0.5, read_events=200_000)


# --------------------------------------------------------------------------- places and data


def make_values(size: int, count: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(count)]


def make_keys(count: int) -> list[bytes | None]:
    return [i.to_bytes(KEY_BYTES, "big") for i in range(count)]


def make_batch(values: list[bytes]) -> Batch:
    return Batch.build(STREAM, values, keys=make_keys(len(values)), timestamps=TIMESTAMP)


def make_rows(values: list[bytes]) -> list[tuple[bytes | None, bytes, int]]:
    return [(k, v, TIMESTAMP) for k, v in zip(make_keys(len(values)), values, strict=True)]


def open_sqlite(directory: str) -> sqlite3.Connection:
    conn = sqlite3.connect(os.path.join(directory, "bench.db"))
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise RuntimeError(f"SQLite refused WAL mode (got {mode!r})")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(CREATE_TABLE)
    conn.commit()
    return conn


def check_sqlite_count(conn: sqlite3.Connection, expected: int) -> None:
    got = conn.execute("SELECT count(*) FROM t").fetchone()[0]
    if got != expected:
        raise RuntimeError(f"SQLite holds {got} rows, expected {expected}")


def check_log_count(log: Log, expected: int) -> None:
    if log.latest(STREAM) != expected:
        raise RuntimeError(f"tidewire's latest id is {log.latest(STREAM)}, expected {expected}")


SERVE_CONFIG = LogConfig(inline_commit_bytes=SETTINGS["log.inline_commit_bytes"][1])
"""The log as ``tidewire serve`` opens it (its ``log.inline_commit_bytes``, 64 KiB: small commit
rounds are written on the loop's thread), not the library's default (0: every round in a worker
thread): these figures stand for the server's log (benchmarks/README.md says why)."""

# --------------------------------------------------------------------------- figures 1 and 2


async def tidewire_batched(parent: str, value_size: int, budget: float) -> float:
    batch = make_batch(make_values(value_size, BATCH_EVENTS))
    max_calls = max(1, MAX_BYTES_PER_MEASUREMENT // (BATCH_EVENTS * value_size))
    with fresh_dir(parent, "tw-batched-") as directory:
        log = Log.open(directory, SERVE_CONFIG)
        try:
            await log.append(batch, assign_ids=True)  # creates the stream (warm-up)
            calls = 0
            start = time.perf_counter()
            deadline = start + budget
            while calls < max_calls:
                await log.append(batch, assign_ids=True)
                calls += 1
                if time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - start
            check_log_count(log, (calls + 1) * BATCH_EVENTS)
        finally:
            await log.close()
    return calls * BATCH_EVENTS / elapsed


def sqlite_batched(parent: str, value_size: int, budget: float) -> float:
    rows = make_rows(make_values(value_size, BATCH_EVENTS))
    max_calls = max(1, MAX_BYTES_PER_MEASUREMENT // (BATCH_EVENTS * value_size))
    with fresh_dir(parent, "sqlite-batched-") as directory:
        conn = open_sqlite(directory)
        try:
            conn.executemany(INSERT, rows)  # warm-up
            conn.commit()
            calls = 0
            start = time.perf_counter()
            deadline = start + budget
            while calls < max_calls:
                conn.executemany(INSERT, rows)
                conn.commit()
                calls += 1
                if time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - start
            check_sqlite_count(conn, (calls + 1) * BATCH_EVENTS)
        finally:
            conn.close()
    return calls * BATCH_EVENTS / elapsed


# --------------------------------------------------------------------------- figure 3


async def timed_appenders(log: Log, batches: list[Batch], max_per_writer: int,
                          budget: float) -> tuple[list[int], float]:  # fmt: skip
    """One asyncio task per batch, each appending its batch (``assign_ids``) one append in
    flight, until ``budget`` seconds or ``max_per_writer`` appends: appends per task, seconds."""
    counts = [0] * len(batches)
    start = time.perf_counter()
    deadline = start + budget

    async def writer(i: int) -> None:
        n = 0
        while n < max_per_writer:
            await log.append(batches[i], assign_ids=True)
            n += 1
            if time.perf_counter() >= deadline:
                break
        counts[i] = n

    await asyncio.gather(*(writer(i) for i in range(len(batches))))
    return counts, time.perf_counter() - start


async def tidewire_concurrent(parent: str, budget: float) -> float:
    batches = [make_batch(make_values(SMALL, 1)) for _ in range(WRITERS)]
    max_per_writer = MAX_BYTES_PER_MEASUREMENT // (WRITERS * SMALL)
    with fresh_dir(parent, "tw-concurrent-") as directory:
        log = Log.open(directory, SERVE_CONFIG)
        try:
            await log.append(batches[0], assign_ids=True)  # creates the stream (warm-up)
            counts, elapsed = await timed_appenders(log, batches, max_per_writer, budget)
            check_log_count(log, sum(counts) + 1)
        finally:
            await log.close()
    return sum(counts) / elapsed


def sqlite_single(parent: str, budget: float) -> float:
    row = make_rows(make_values(SMALL, 1))[0]
    max_calls = MAX_BYTES_PER_MEASUREMENT // SMALL
    with fresh_dir(parent, "sqlite-single-") as directory:
        conn = open_sqlite(directory)
        try:
            conn.execute(INSERT, row)  # warm-up
            conn.commit()
            calls = 0
            start = time.perf_counter()
            deadline = start + budget
            while calls < max_calls:
                conn.execute(INSERT, row)
                conn.commit()
                calls += 1
                if time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - start
            check_sqlite_count(conn, calls + 1)
        finally:
            conn.close()
    return calls / elapsed


# --------------------------------------------------------------------------- figures 3b and 3c


def stream_names(count: int) -> list[str]:
    """One stream per writer of the many-stream figures (``bench-0000`` ...)."""
    return [f"{STREAM}-{i:04d}" for i in range(count)]


async def tidewire_many_streams(parent: str, writers: int, budget: float) -> float:
    """``writers`` asyncio tasks, each appending 1-event batches (100 B) to its own stream, one
    append in flight per task; durable appends/s over all of them. Every stream is created
    (its first append) before the clock starts, all at once."""
    names = stream_names(writers)
    batches = [
        Batch.build(name, make_values(SMALL, 1), keys=make_keys(1), timestamps=TIMESTAMP)
        for name in names
    ]
    max_per_writer = max(1, MAX_BYTES_PER_MEASUREMENT // (writers * SMALL))
    with fresh_dir(parent, f"tw-many-{writers}-") as directory:
        log = Log.open(directory, SERVE_CONFIG)
        try:
            await asyncio.gather(*(log.append(b, assign_ids=True) for b in batches))  # warm-up
            counts, elapsed = await timed_appenders(log, batches, max_per_writer, budget)
            for name, n in zip(names, counts, strict=True):
                if log.latest(name) != n + 1:
                    raise RuntimeError(f"{name}: latest id {log.latest(name)}, expected {n + 1}")
        finally:
            await log.close()
    return sum(counts) / elapsed


async def many_streams(settings: Settings, parent: str, one_stream: Figure) -> list[Figure]:
    """Figures 3b and 3c: the writers of figure 3, each on a stream of its own (16 and 1,000
    of them), against the disk's raw durable-commit rate (one 1 KiB ``os.write`` +
    ``os.fdatasync`` at a time), all three taking turns in the same rounds. ``one_stream`` is
    figure 3 of this run, reported beside them (``one_stream_value``, ``vs_one_stream``)."""
    budget = settings.budget_s
    figures = [
        Figure(
            f"concurrent_single_append_{w}w_{w}s_100B",
            f"os.write {RAW_COMMIT_BYTES} B + os.fdatasync, one at a time",
            None,  # issue 22's table has no row for the log alone (row 2 is Seguro's)
            None,
            tidewire_rounds=[],
            baseline_rounds=[],
            one_stream=one_stream,
        )
        for w in MANY_STREAM_WRITERS
    ]
    raw_rounds: list[float] = []
    sides: list[tuple[str, Callable[[], Awaitable[float]]]] = [
        (f"{w} streams", partial(tidewire_many_streams, parent, w, budget))
        for w in MANY_STREAM_WRITERS
    ]

    async def raw() -> float:
        return raw_fdatasync_rate(parent, budget, MAX_BYTES_PER_MEASUREMENT)

    sides.append(("raw write+fdatasync", raw))
    for r in range(settings.rounds):
        order = list(range(len(sides))) if r % 2 == 0 else list(reversed(range(len(sides))))
        for k in order:
            label, measure = sides[k]
            value = await measure()
            if k < len(figures):
                figures[k].tidewire_rounds = [*(figures[k].tidewire_rounds or []), value]
            else:
                raw_rounds.append(value)
            note(f"  many_streams round {r + 1} {label}: {value:,.0f} commits/s")
    for figure in figures:
        figure.baseline_rounds = raw_rounds
    return figures


# --------------------------------------------------------------------------- figure 4


async def fill_log(log: Log, events: int) -> None:
    batch = make_batch(make_values(SMALL, BATCH_EVENTS))
    for _ in range(events // BATCH_EVENTS):
        await log.append(batch, assign_ids=True)
    check_log_count(log, events)


def fill_sqlite(conn: sqlite3.Connection, events: int) -> None:
    rows = make_rows(make_values(SMALL, BATCH_EVENTS))
    per_txn = 100  # 100,000 rows per transaction: filling is not what is measured
    calls = events // BATCH_EVENTS
    for done in range(0, calls, per_txn):
        for _ in range(min(per_txn, calls - done)):
            conn.executemany(INSERT, rows)
        conn.commit()
    check_sqlite_count(conn, events)


def tidewire_read_pass(log: Log) -> int:
    next_id, count = 1, 0
    while True:
        batches = log.read(STREAM, next_id, max_bytes=READ_MAX_BYTES)
        if not batches:
            return count
        for batch in batches:
            count += len(batch)
        next_id = batches[-1].last_id + 1


def sqlite_read_pass(conn: sqlite3.Connection, last_id: int) -> int:
    count = 0
    for lo in range(1, last_id + 1, SQLITE_READ_CHUNK):
        count += len(conn.execute(SELECT_RANGE, (lo, lo + SQLITE_READ_CHUNK)).fetchall())
    return count


def timed_passes(read_pass: Callable[[], int], expected: int, budget: float) -> float:
    """Whole passes over the data until ``budget`` is spent (at least one); events/s."""
    events = 0
    start = time.perf_counter()
    deadline = start + budget
    for _ in range(1000):
        got = read_pass()
        if got != expected:
            raise RuntimeError(f"a read pass saw {got} events, expected {expected}")
        events += got
        if time.perf_counter() >= deadline:
            break
    return events / (time.perf_counter() - start)


# --------------------------------------------------------------------------- driver


@dataclass(slots=True)
class Figure:
    name: str
    baseline: str
    goal: str | None
    goal_ratio: float | None
    goal_absolute: float | None = None
    tidewire_rounds: list[float] | None = None
    baseline_rounds: list[float] | None = None
    one_stream: Figure | None = None  # figures 3b, 3c: figure 3 of the same run, for reference

    def line(self) -> dict[str, Any]:
        tw_rounds = self.tidewire_rounds or []
        base_rounds = self.baseline_rounds or []
        tw, base = max(tw_rounds), max(base_rounds)
        ratio = tw / base if base > 0 else float("inf")
        meets: bool | None = None
        if self.goal_absolute is not None:
            meets = tw >= self.goal_absolute
        elif self.goal_ratio is not None:
            meets = ratio >= self.goal_ratio
        line: dict[str, Any] = {
            "benchmark": "log_append",
            "figure": self.name,
            "unit": "events/s",
            "tidewire": round(tw, 1),
            "baseline": self.baseline,
            "baseline_value": round(base, 1),
            "ratio": round(ratio, 2),
            "goal": self.goal,
            "goal_ratio": self.goal_ratio,
            "meets_goal": meets,
            "tidewire_rounds": [round(x, 1) for x in tw_rounds],
            "baseline_rounds": [round(x, 1) for x in base_rounds],
        }
        if self.one_stream is not None:
            line.update(self.many_stream_fields(tw, self.one_stream))
        return line

    @staticmethod
    def many_stream_fields(tw: float, one_stream: Figure) -> dict[str, Any]:
        """The many-stream figures' extra fields: the one-stream figure of the same run."""
        one_rounds = one_stream.tidewire_rounds or []
        one = max(one_rounds)
        return {
            "one_stream_figure": one_stream.name,
            "one_stream_value": round(one, 1),
            "vs_one_stream": round(tw / one, 2) if one > 0 else None,
            "one_stream_rounds": [round(x, 1) for x in one_rounds],
        }


async def interleave(
    figure: Figure,
    settings: Settings,
    tidewire: Callable[[], Awaitable[float]],
    baseline: Callable[[], float],
) -> Figure:
    """Run ``settings.rounds`` rounds of both sides, alternating which one goes first."""
    figure.tidewire_rounds, figure.baseline_rounds = [], []
    for r in range(settings.rounds):
        for side in ("tidewire", "baseline") if r % 2 == 0 else ("baseline", "tidewire"):
            if side == "tidewire":
                value = await tidewire()
                figure.tidewire_rounds.append(value)
            else:
                value = baseline()
                figure.baseline_rounds.append(value)
            note(f"  {figure.name} round {r + 1} {side}: {value:,.0f} events/s")
    return figure


async def run(settings: Settings, parent: str) -> list[Figure]:
    budget = settings.budget_s
    figures: list[Figure] = []

    for size, label, goal_ratio in ((SMALL, "100B", None), (LARGE, "1KiB", 2.0)):
        figure = Figure(
            f"batched_append_{label}",
            f"sqlite-wal-full-{BATCH_EVENTS}-per-txn",
            None if goal_ratio is None else f"ratio >= {goal_ratio}",
            goal_ratio,
        )
        figures.append(
            await interleave(
                figure,
                settings,
                partial(tidewire_batched, parent, size, budget),
                partial(sqlite_batched, parent, size, budget),
            )
        )

    figure = Figure(
        f"concurrent_single_append_{WRITERS}w_100B",
        "sqlite-wal-full-1-per-txn",
        "ratio >= 10.0",  # issue 22, row 1 (was 5)
        10.0,
    )
    figures.append(
        await interleave(
            figure,
            settings,
            partial(tidewire_concurrent, parent, budget),
            partial(sqlite_single, parent, budget),
        )
    )
    figures.extend(await many_streams(settings, parent, figure))

    events = settings.read_events
    with fresh_dir(parent, "tw-read-") as tw_dir, fresh_dir(parent, "sqlite-read-") as sq_dir:
        started = time.perf_counter()
        # The read data set is written without fsync (the files are the same; only reads are
        # timed), so that filling it does not eat the time budget. The log is then reopened
        # read-only, as a reader process would: reads come from the segment files (page cache),
        # never from anything the writer kept in memory.
        writer = Log.open(tw_dir, LogConfig(fsync=False))
        try:
            await fill_log(writer, events)
        finally:
            await writer.close()
        log = Log.open(tw_dir, LogConfig(), read_only=True)
        conn = open_sqlite(sq_dir)
        try:
            check_log_count(log, events)
            fill_sqlite(conn, events)
            note(f"  filled {events:,} events per side in {time.perf_counter() - started:.1f} s")

            async def tidewire_read() -> float:
                return timed_passes(lambda: tidewire_read_pass(log), events, budget)

            figure = Figure(
                "range_read_100B",
                f"sqlite-wal-range-select-{SQLITE_READ_CHUNK}-fetchall",
                f"events/s >= {READ_GOAL:.0e}".replace("e+0", "e"),
                None,
                goal_absolute=READ_GOAL,
            )
            figures.append(
                await interleave(
                    figure,
                    settings,
                    tidewire_read,
                    lambda: timed_passes(lambda: sqlite_read_pass(conn, events), events, budget),
                )
            )
        finally:
            conn.close()
            await log.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (about 20 s)")
    parser.add_argument("--dir", help="where to create temporary directories (default: /tmp)")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    base = choose_base(args.dir)
    kind = fs_type(base)
    if kind in RAM_FILE_SYSTEMS:
        note(f"warning: {base} is {kind}: fsync costs nothing there, the figures mean little")
    factory, loop_name = loop_factory()
    note(
        f"log_append: {'quick' if args.quick else 'full'} run, {settings.rounds} rounds of "
        f"{settings.budget_s} s per side, temp dirs in {base} ({kind}), {loop_name}, "
        f"SQLite {sqlite3.sqlite_version}"
    )
    started = time.perf_counter()
    with fresh_dir(base, "tidewire-bench-") as parent, asyncio.Runner(loop_factory=factory) as r:
        figures = r.run(run(settings, parent))
    for figure in figures:
        print(json.dumps(figure.line()), flush=True)
    note(f"log_append: done in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
