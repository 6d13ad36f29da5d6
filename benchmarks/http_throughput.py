"""Benchmark: RS.io over HTTP against RS.io over TCP, reading the same stream from one hub.

Run ``.venv/bin/python benchmarks/http_throughput.py`` (about a minute) or add ``--quick``.

One figure, ``http_vs_tcp_1KiB``: elements/s of 1 KiB elements (the default envelope format:
id, timestamp, key, value) read from a stream of N events by one subscriber with a demand of
1000, over HTTP (:class:`tidewire.client.http.HttpHub`: ``PUT`` subscribe, then long-poll
fetches asking for more as it consumes; each response up to the hub's ``http.max_response_bytes``)
and over TCP (``tidewire.connect(...).subscribe(..., prefetch=1000)``). Both clients hand the
application decoded :class:`~tidewire.model.Batch` es, and both run in this process on uvloop;
the hub is ``tidewire serve`` in a process of its own. The stream is written once, before the
rounds (through RS.io/TCP); every round reads it all (``until=N``), so both sides read from the
page cache. Sides alternate (TCP first in odd rounds); each side's best round is reported.

Output: one JSON line on stdout (progress on stderr) with ``tidewire`` (HTTP elements/s),
``baseline_value`` (TCP elements/s), ``ratio`` and the rounds. Goal (issue 22, row 8): ratio >= 0.7.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import tidewire
from _common import LinePump, Processes, choose_base, fresh_dir, fs_type, loop_factory, note
from tidewire.client.http import HttpHub

STREAM = "bench.http"
VALUE_BYTES = 1024
DEMAND = 1000
GOAL_RATIO = 0.7  # issue 22, row 8 (was 0.5)
PUBLISH_BATCH = 4096


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int
    events: int


FULL = Settings(rounds=3, events=400_000)
QUICK = Settings(rounds=2, events=100_000)


def start_hub(procs: Processes, data_dir: str) -> tuple[str, str]:
    proc = procs.start(
        [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", data_dir,
         "--host", "127.0.0.1", "--http-port", "0", "--set", "log.fsync=false"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "TIDEWIRE_RSIO_PORT": "0", "TIDEWIRE_SEGURO_PORT": "0",
             "TIDEWIRE_TOLLIVER_PORT": "0"},
    )  # fmt: skip
    pump = LinePump(proc.stdout)
    rsio = pump.wait_for(r"(rsio://[\d.]+:\d+)", proc, 60).group(1)
    http = pump.wait_for(r"(http://[\d.]+:\d+)/healthz", proc, 60).group(1)
    pump.wait_for(r"^ready", proc, 60)
    return rsio, http


async def fill(rsio: str, n: int) -> None:
    value = os.urandom(VALUE_BYTES)
    async with tidewire.connect(rsio) as hub:
        for start in range(0, n, PUBLISH_BATCH):
            await hub.publish(STREAM, [value] * min(PUBLISH_BATCH, n - start))


async def read_tcp(rsio: str, n: int) -> float:
    got = 0
    async with tidewire.connect(rsio) as hub:
        start = time.perf_counter()
        async for batch in hub.subscribe(STREAM, until_id=n, prefetch=DEMAND):
            got += len(batch)
        seconds = time.perf_counter() - start
    if got != n:
        raise RuntimeError(f"TCP read {got} of {n} events")
    return n / seconds


async def read_http(http: str, n: int) -> float:
    got = 0
    async with HttpHub(http) as hub:
        start = time.perf_counter()
        async for batch in hub.subscribe(STREAM, until_id=n, demand=DEMAND):
            got += len(batch)
        seconds = time.perf_counter() - start
    if got != n:
        raise RuntimeError(f"HTTP read {got} of {n} events")
    return n / seconds


async def main_async(settings: Settings, base: str) -> dict[str, object]:
    procs = Processes()
    try:
        with fresh_dir(base, "tidewire-bench-http-") as directory:
            rsio, http = start_hub(procs, os.path.join(directory, "hub"))
            note(f"http_throughput: writing {settings.events:,} events of {VALUE_BYTES} B")
            await fill(rsio, settings.events)
            await read_tcp(rsio, min(settings.events, 20_000))  # warm both paths (untimed)
            await read_http(http, min(settings.events, 20_000))
            tcp: list[float] = []
            web: list[float] = []
            for i in range(settings.rounds):
                order = ["tcp", "http"] if i % 2 == 0 else ["http", "tcp"]
                for side in order:
                    if side == "tcp":
                        tcp.append(await read_tcp(rsio, settings.events))
                        rate = tcp[-1]
                    else:
                        web.append(await read_http(http, settings.events))
                        rate = web[-1]
                    note(f"  round {i + 1} {side:<5} {rate:12,.0f} elements/s")
    finally:
        procs.stop_all()
    ratio = max(web) / max(tcp)
    return {
        "benchmark": "http_throughput",
        "figure": "http_vs_tcp_1KiB",
        "unit": "elements/s",
        "better": "higher",
        "tidewire": round(max(web), 1),
        "baseline": f"RS.io over TCP from the same hub and stream (prefetch {DEMAND})",
        "baseline_value": round(max(tcp), 1),
        "ratio": round(ratio, 3),
        "goal": f"ratio >= {GOAL_RATIO}",
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio >= GOAL_RATIO,
        "tidewire_rounds": [round(r, 1) for r in web],
        "baseline_rounds": [round(r, 1) for r in tcp],
        "events": settings.events,
        "value_bytes": VALUE_BYTES,
        "demand": DEMAND,
        "rounds": settings.rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer events and rounds")
    parser.add_argument("--dir", help="where the hub's temporary data directory goes")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    base = choose_base(args.dir)
    note(f"http_throughput: {settings.rounds} rounds, data in {base} ({fs_type(base)})")
    factory, loop_name = loop_factory()
    started = time.perf_counter()
    with asyncio.Runner(loop_factory=factory) as runner:
        line = runner.run(main_async(settings, base))
    line["loop"] = loop_name
    print(json.dumps(line), flush=True)
    note(f"http_throughput: done in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
