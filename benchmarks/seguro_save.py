"""Benchmark: durable saves over Seguro against Redis streams (``appendfsync always``) and fsync.

Run ``.venv/bin/python benchmarks/seguro_save.py`` (about 3 minutes) or add ``--quick`` (well
under a minute: fewer, shorter rounds). ``--dir`` picks where the temporary directories go
(default: ``/tmp`` unless it is a RAM file system, then the working directory: a ``fsync`` on
tmpfs is free, which would make every figure here meaningless). First it runs
``benchmarks/redis_peer.sh``, which installs what is missing: Debian's ``redis-server`` and,
into the venv, ``redis`` (redis-py). ``--no-install`` skips that.

Everything runs on 127.0.0.1, the clients in this process (uvloop when installed), each server
in a process of its own. Every measurement starts a fresh server on a fresh data directory (all
in one temporary directory on the same disk), and stops it and removes the directory after.
Events are 1 KiB values (random bytes, built before the clock starts). What is measured:

1. ``save_many_1KiB_x1000``: durable throughput in events/s. tidewire: ``tidewire serve`` (log
   fsync on), one Seguro session (``tidewire.client.seguro``), ``await ship.save_many(events)``
   with 1000 events per call, one call at a time (each returns on ``COMMITTED MANY``, when all
   1000 are on disk). Redis: ``redis-server`` with ``appendonly yes``, ``appendfsync always``
   (no RDB snapshots, no AOF rewrite), redis-py's asyncio client, ``XADD key * v <value>``
   pipelined 1000 at a time (``pipeline(transaction=False)`` + ``execute``), one pipeline at a
   time. Goal (issue 22, row 5): tidewire >= 5x Redis.
2. ``save_latency_p50_1KiB`` / ``save_latency_p99_1KiB``: latency of one durable save at a
   time, in microseconds. tidewire: ``await ship.save(id, value)`` (returns on ``COMMITTED``).
   Baseline: the disk itself, ``os.write`` of 1 KiB + ``os.fsync`` on a file (appended to, so
   it grows as a log does) in a fresh directory beside the servers'. Goal (issue 22, row 6):
   tidewire's p50 <= 1.5x the raw fsync's p50 (the p99 figure has no goal).
3. ``save_latency_p50_vs_redis_xadd`` / ``save_latency_p99_vs_redis_xadd``: the same tidewire
   rounds against one ``await redis.xadd(key, {"v": value})`` at a time (``appendfsync always``:
   Redis answers after the AOF is fsynced). Information only.

4. ``save_points_16_1KiB`` / ``save_points_1000_1KiB`` (issue 22's second row): 16 (1,000)
   Seguro points on one ``tidewire serve``, one connection each, each saving one 1 KiB event at
   a time (``await ship.save``, one in flight per point); the hub's total durable commits/s.
   Baseline: the disk's raw durable-commit rate, one 1 KiB ``os.write`` + ``os.fdatasync`` at
   a time in a loop, appending to a file on the same file system (its own rounds, in turns with
   both). Goal for 16 points, as the issue's table says: ratio >= 6; 1,000 points have no row
   in the table (goal ``null``). The hub runs with ``limits.max_connections_per_peer`` raised
   to twice the points (at least its default 256), as every point connects from 127.0.0.1.

Method: the sides of a figure take turns (forward order in odd rounds, reverse in even ones)
for 5 rounds (2 with ``--quick``); throughput rounds last 4 s (1.5 s), latency rounds take 4000
samples (1000) after 50 unmeasured ones. Each side's best round is reported (the highest rate;
the lowest percentile, p50 and p99 each taken from the round where it is lowest): the machine
is shared, and the best round is the least disturbed one.

Output: exactly one JSON line per figure on stdout (progress goes to stderr), e.g.::

    {"benchmark": "seguro_save", "figure": "save_many_1KiB_x1000", "unit": "events/s",
     "better": "higher", "tidewire": 70000.0, "baseline": "redis-server 7.0.15 ...",
     "baseline_value": 30000.0, "ratio": 2.33, "goal": "ratio >= 2.0", "goal_ratio": 2.0,
     "meets_goal": true, "tidewire_rounds": [...], "baseline_rounds": [...], ...}

(one line in reality). The fields are log_append.py's, plus ``better`` (``higher`` for rates,
``lower`` for latencies: a latency goal is ``ratio <= goal_ratio``), ``rounds`` and, for
latencies, ``samples`` (per round); the many-points lines add ``points``,
``in_flight_per_point`` (1) and ``value_bytes``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from _common import (
    RAM_FILE_SYSTEMS,
    RAW_COMMIT_BYTES,
    LinePump,
    Processes,
    choose_base,
    distribution_version,
    fresh_dir,
    fs_type,
    loop_factory,
    module,
    note,
    raw_fdatasync_rate,
)
from _seguro_points import save_one_at_a_time
from tidewire.client.seguro import connect

HERE = os.path.dirname(os.path.abspath(__file__))
POINT = "~zod"
REDIS_KEY = "bench"
REDIS_FIELD = "v"
VALUE_BYTES = 1024
BATCH_EVENTS = 1000
WARMUP_SAMPLES = 50
MAX_BYTES_PER_MEASUREMENT = 1 << 30  # bounds the disk (and Redis's memory) one round uses
MANY_POINTS = (16, 1000)  # issue 22's second row: points saving one event at a time
MANY_POINTS_GOALS = {16: 6.0}  # the row's goal is for 16 points; 1,000 have no row (null)
START_TIMEOUT_S = 60.0
SETTLE_S = 0.5  # a pause before each measurement, after os.sync()


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int
    budget_s: float  # how long one throughput round runs
    samples: int  # saves timed in one latency round


FULL = Settings(rounds=5, budget_s=4.0, samples=4000)
QUICK = Settings(rounds=2, budget_s=1.5, samples=1000)


# --------------------------------------------------------------------------- places


# --------------------------------------------------------------------------- processes


def install_peers() -> None:
    script = os.path.join(HERE, "redis_peer.sh")
    subprocess.run(["bash", script, sys.executable], check=True)


def redis_binary() -> str:
    return shutil.which("redis-server") or "/usr/bin/redis-server"


def redis_version() -> str:
    out = subprocess.run([redis_binary(), "--version"], capture_output=True, text=True).stdout
    match = re.search(r"v=(\S+)", out)
    return match.group(1) if match else "?"


async def check_redis_config(client: Any) -> None:
    """Refuse to measure a Redis that does not fsync its AOF on every write."""
    got = {}
    for name in ("appendonly", "appendfsync"):
        value = (await client.config_get(name)).get(name)
        got[name] = value.decode() if isinstance(value, bytes) else value
    if got != {"appendonly": "yes", "appendfsync": "always"}:
        raise RuntimeError(f"redis-server runs with {got}, not appendonly yes/appendfsync always")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def tidewire_server(procs: Processes, parent: str, *args: str) -> Iterator[str]:
    """A fresh ``tidewire serve`` (log fsync on) on a fresh data directory, with ``args`` as
    more options; its Seguro URL."""
    with fresh_dir(parent, "tidewire-") as data_dir:
        proc = procs.start(
            [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", data_dir,
             "--host", "127.0.0.1", "--http-port", "0", "--rsio-port", "0",
             "--seguro-port", "0", "--tolliver-port", "0", "--set", "log.fsync=true", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            pump = LinePump(proc.stdout)
            url = pump.wait_for(r"(seguro://\S+)", proc, START_TIMEOUT_S).group(1)
            pump.wait_for(r"^ready", proc, START_TIMEOUT_S)
            yield url
        finally:
            code = procs.stop(proc)
            if code != 0:
                note(f"warning: tidewire serve exited {code}")


@contextmanager
def redis_server(procs: Processes, parent: str) -> Iterator[int]:
    """A fresh ``redis-server`` (AOF, ``appendfsync always``) on a fresh directory; its port."""
    with fresh_dir(parent, "redis-") as data_dir:
        for attempt in range(3):  # the free port may be taken between the probe and the bind
            port = free_port()
            proc = procs.start(
                [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", data_dir,
                 "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                 "--auto-aof-rewrite-percentage", "0", "--daemonize", "no",
                 "--protected-mode", "no", "--logfile", ""],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                LinePump(proc.stdout).wait_for(
                    r"Ready to accept connections", proc, START_TIMEOUT_S
                )
                break
            except RuntimeError:
                procs.stop(proc)
                if attempt == 2:
                    raise
        try:
            yield port
        finally:
            code = procs.stop(proc)
            if code != 0:
                note(f"warning: redis-server exited {code}")


# --------------------------------------------------------------------------- measurements


def make_values(count: int) -> list[bytes]:
    return [os.urandom(VALUE_BYTES) for _ in range(count)]


def max_batches() -> int:
    return max(1, MAX_BYTES_PER_MEASUREMENT // (BATCH_EVENTS * VALUE_BYTES))


async def tidewire_save_many(procs: Processes, parent: str, budget: float) -> float:
    values = make_values(BATCH_EVENTS)
    with tidewire_server(procs, parent) as url:
        async with connect(url, POINT) as ship:
            next_id = 1

            async def save_batch() -> None:
                nonlocal next_id
                await ship.save_many([(next_id + i, v) for i, v in enumerate(values)])
                next_id += BATCH_EVENTS

            await save_batch()  # creates the stream (warm-up)
            calls, limit = 0, max_batches()
            start = time.perf_counter()
            deadline = start + budget
            while calls < limit:
                await save_batch()
                calls += 1
                if time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - start
            if ship.latest != next_id - 1:
                raise RuntimeError(f"the hub committed up to {ship.latest}, not {next_id - 1}")
    return calls * BATCH_EVENTS / elapsed


async def redis_xadd_many(procs: Processes, parent: str, budget: float) -> float:
    redis = module("redis.asyncio")
    values = make_values(BATCH_EVENTS)
    with redis_server(procs, parent) as port:
        client = redis.Redis(host="127.0.0.1", port=port)
        try:
            await check_redis_config(client)

            async def xadd_batch() -> None:
                pipe = client.pipeline(transaction=False)
                for v in values:
                    pipe.xadd(REDIS_KEY, {REDIS_FIELD: v})
                ids = await pipe.execute()
                if len(ids) != BATCH_EVENTS:
                    raise RuntimeError(f"a pipeline of {BATCH_EVENTS} XADD gave {len(ids)} ids")

            await xadd_batch()  # creates the stream (warm-up)
            calls, limit = 0, max_batches()
            start = time.perf_counter()
            deadline = start + budget
            while calls < limit:
                await xadd_batch()
                calls += 1
                if time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - start
            length = await client.xlen(REDIS_KEY)
            if length != (calls + 1) * BATCH_EVENTS:
                raise RuntimeError(f"the Redis stream holds {length}, not {calls + 1} x 1000")
        finally:
            await client.aclose()
    return calls * BATCH_EVENTS / elapsed


@dataclass(frozen=True, slots=True)
class Latency:
    p50_us: float
    p99_us: float
    samples: int


def percentiles(ns: list[int]) -> Latency:
    ordered = sorted(ns)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0

    return Latency(at(0.50), at(0.99), len(ordered))


async def timed_samples(one: Callable[[], Awaitable[None]], samples: int) -> Latency:
    for _ in range(WARMUP_SAMPLES):
        await one()
    ns: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(samples):
        t0 = clock()
        await one()
        ns.append(clock() - t0)
    return percentiles(ns)


async def tidewire_save_latency(procs: Processes, parent: str, samples: int) -> Latency:
    value = make_values(1)[0]
    with tidewire_server(procs, parent) as url:
        async with connect(url, POINT) as ship:
            next_id = 1

            async def save() -> None:
                nonlocal next_id
                await ship.save(next_id, value)
                next_id += 1

            latency = await timed_samples(save, samples)
            if ship.latest != next_id - 1:
                raise RuntimeError(f"the hub committed up to {ship.latest}, not {next_id - 1}")
    return latency


async def redis_xadd_latency(procs: Processes, parent: str, samples: int) -> Latency:
    redis = module("redis.asyncio")
    value = make_values(1)[0]
    with redis_server(procs, parent) as port:
        client = redis.Redis(host="127.0.0.1", port=port)
        try:
            await check_redis_config(client)

            async def xadd() -> None:
                await client.xadd(REDIS_KEY, {REDIS_FIELD: value})

            latency = await timed_samples(xadd, samples)
            length = await client.xlen(REDIS_KEY)
            if length != WARMUP_SAMPLES + samples:
                raise RuntimeError(f"the Redis stream holds {length}, not {samples} + warm-up")
        finally:
            await client.aclose()
    return latency


async def fsync_latency(parent: str, samples: int) -> Latency:
    """``os.write`` of 1 KiB + ``os.fsync``, appending to one file in a fresh directory."""
    value = make_values(1)[0]
    with fresh_dir(parent, "fsync-") as directory:
        fd = os.open(os.path.join(directory, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:

            async def write_fsync() -> None:
                os.write(fd, value)
                os.fsync(fd)

            return await timed_samples(write_fsync, samples)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- many points


async def tidewire_many_points(
    procs: Processes, parent: str, points: int, budget: float
) -> float:
    """``points`` Seguro points on one fresh hub, each saving one 1 KiB event at a time; the
    hub's total durable commits/s (:func:`_seguro_points.save_one_at_a_time`)."""
    value = make_values(1)[0]
    peers = f"limits.max_connections_per_peer={max(256, 2 * points)}"
    with tidewire_server(procs, parent, "--set", peers) as url:
        return await save_one_at_a_time(url, points, value, budget, MAX_BYTES_PER_MEASUREMENT)


async def raw_fdatasync(parent: str, budget: float) -> float:
    """The disk's raw durable-commit rate (:func:`_common.raw_fdatasync_rate`), commits/s."""
    return raw_fdatasync_rate(parent, budget, MAX_BYTES_PER_MEASUREMENT)


# --------------------------------------------------------------------------- driver


@dataclass(slots=True)
class Side:
    name: str
    run: Callable[[], Awaitable[Any]]
    rounds: list[Any] = field(default_factory=list)


STOP = threading.Event()  # set by SIGTERM


def on_sigterm(signum: int, frame: object) -> None:
    """Stop as Ctrl-C does (asyncio.Runner cancels the running measurement)."""
    STOP.set()
    os.kill(os.getpid(), signal.SIGINT)


def describe(value: Any) -> str:
    if isinstance(value, Latency):
        return f"p50 {value.p50_us:,.0f} µs  p99 {value.p99_us:,.0f} µs  ({value.samples} saves)"
    return f"{value:,.0f} events/s"


async def settle() -> None:
    """Let the disk finish what the last measurement left (its removed files' blocks, the
    journal), so that it does not slow the next side down."""
    await asyncio.to_thread(os.sync)
    await asyncio.sleep(SETTLE_S)


async def run_rounds(title: str, sides: list[Side], rounds: int) -> None:
    for r in range(rounds):
        for side in sides if r % 2 == 0 else list(reversed(sides)):
            if STOP.is_set():
                raise KeyboardInterrupt
            await settle()
            value = await side.run()
            side.rounds.append(value)
            note(f"  {title} round {r + 1} {side.name:<20} {describe(value)}")


def figure_line(
    name: str,
    unit: str,
    tidewire: list[float],
    baseline: str,
    baseline_rounds: list[float],
    goal_ratio: float | None,
    *,
    lower_is_better: bool,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    pick = min if lower_is_better else max
    tw, base = pick(tidewire), pick(baseline_rounds)
    ratio = tw / base if base > 0 else float("inf")
    meets: bool | None = None
    goal: str | None = None
    if goal_ratio is not None:
        meets = ratio <= goal_ratio if lower_is_better else ratio >= goal_ratio
        goal = f"ratio {'<=' if lower_is_better else '>='} {goal_ratio}"
    return {
        "benchmark": "seguro_save",
        "figure": name,
        "unit": unit,
        "better": "lower" if lower_is_better else "higher",
        "tidewire": round(tw, 1),
        "baseline": baseline,
        "baseline_value": round(base, 1),
        "ratio": round(ratio, 2),
        "goal": goal,
        "goal_ratio": goal_ratio,
        "meets_goal": meets,
        "rounds": len(tidewire),
        **(extra or {}),
        "tidewire_rounds": [round(x, 1) for x in tidewire],
        "baseline_rounds": [round(x, 1) for x in baseline_rounds],
    }


async def run(settings: Settings, parent: str, procs: Processes) -> list[dict[str, Any]]:
    redis_label = f"redis-server {redis_version()} appendfsync always, redis-py " + (
        distribution_version("redis")
    )
    lines: list[dict[str, Any]] = []

    budget = settings.budget_s
    tw_many = Side("tidewire SAVE MANY", lambda: tidewire_save_many(procs, parent, budget))
    redis_many = Side("redis XADD x1000", lambda: redis_xadd_many(procs, parent, budget))
    await run_rounds("save_many", [tw_many, redis_many], settings.rounds)
    lines.append(
        figure_line(
            f"save_many_1KiB_x{BATCH_EVENTS}",
            "events/s",
            tw_many.rounds,
            f"{redis_label}, XADD pipelined {BATCH_EVENTS} per execute",
            redis_many.rounds,
            5.0,  # issue 22, row 5 (was 2)
            lower_is_better=False,
        )
    )
    print(json.dumps(lines[-1]), flush=True)

    n = settings.samples
    tw_one = Side("tidewire SAVE", lambda: tidewire_save_latency(procs, parent, n))
    raw = Side("write+fsync", lambda: fsync_latency(parent, n))
    redis_one = Side("redis XADD", lambda: redis_xadd_latency(procs, parent, n))
    await run_rounds("latency", [tw_one, raw, redis_one], settings.rounds)
    fsync_label = f"os.write {VALUE_BYTES} B + os.fsync, appending to one file"
    xadd_label = f"{redis_label}, one XADD at a time"
    extra = {"samples": n, "value_bytes": VALUE_BYTES}
    for pct in ("p50", "p99"):

        def of(side: Side, pct: str = pct) -> list[float]:
            return [getattr(m, f"{pct}_us") for m in side.rounds]

        lines.append(
            figure_line(
                f"save_latency_{pct}_1KiB",
                "us",
                of(tw_one),
                fsync_label,
                of(raw),
                1.5 if pct == "p50" else None,  # issue 22, row 6 (was 2)
                lower_is_better=True,
                extra=extra,
            )
        )
        print(json.dumps(lines[-1]), flush=True)
    for pct in ("p50", "p99"):
        lines.append(
            figure_line(
                f"save_latency_{pct}_vs_redis_xadd",
                "us",
                [getattr(m, f"{pct}_us") for m in tw_one.rounds],
                xadd_label,
                [getattr(m, f"{pct}_us") for m in redis_one.rounds],
                None,
                lower_is_better=True,
                extra=extra,
            )
        )
        print(json.dumps(lines[-1]), flush=True)
    lines.extend(await many_points(settings, parent, procs))
    return lines


async def many_points(settings: Settings, parent: str, procs: Processes) -> list[dict[str, Any]]:
    """Issue 22's second row: 16 and 1,000 points each saving one event at a time, total durable
    commits/s, against the disk's raw write + fdatasync loop, all in turns in the same rounds."""
    budget = settings.budget_s
    sides = [
        Side(f"tidewire {n} points", partial(tidewire_many_points, procs, parent, n, budget))
        for n in MANY_POINTS
    ]
    raw = Side("write+fdatasync", partial(raw_fdatasync, parent, budget))
    await run_rounds("many_points", [*sides, raw], settings.rounds)
    lines: list[dict[str, Any]] = []
    for n, side in zip(MANY_POINTS, sides, strict=True):
        lines.append(
            figure_line(
                f"save_points_{n}_1KiB",
                "commits/s",
                side.rounds,
                f"os.write {RAW_COMMIT_BYTES} B + os.fdatasync, one at a time, appending",
                raw.rounds,
                MANY_POINTS_GOALS.get(n),
                lower_is_better=False,
                extra={"points": n, "in_flight_per_point": 1, "value_bytes": VALUE_BYTES},
            )
        )
        print(json.dumps(lines[-1]), flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (< 1 min)")
    parser.add_argument("--dir", help="where to create temporary directories (default: /tmp)")
    parser.add_argument("--no-install", action="store_true", help="do not run redis_peer.sh")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    base = choose_base(args.dir)
    kind = fs_type(base)
    if kind in RAM_FILE_SYSTEMS:
        note(f"warning: {base} is {kind}: fsync costs nothing there, the figures mean little")
    # SIGTERM ends the run as Ctrl-C does; finally blocks then stop every subprocess and
    # remove the temporary directories.
    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.perf_counter()
    if not args.no_install:
        install_peers()
    factory, loop_name = loop_factory()
    note(
        f"seguro_save: {'quick' if args.quick else 'full'} run, {settings.rounds} rounds "
        f"({settings.budget_s} s per throughput round, {settings.samples} saves per latency "
        f"round), temp dirs in {base} ({kind}), client loop {loop_name}"
    )
    procs = Processes()
    try:
        with (
            fresh_dir(base, "tidewire-seguro-bench-") as parent,
            asyncio.Runner(loop_factory=factory) as runner,
        ):
            runner.run(run(settings, parent, procs))
    except KeyboardInterrupt:
        note("seguro_save: interrupted")
        return 130
    finally:
        procs.stop_all()
    note(f"seguro_save: done in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
