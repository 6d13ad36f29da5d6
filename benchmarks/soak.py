"""Soak: a fixed-duration mixed load on one hub, every protocol at once, watching the hub's memory.

    .venv/bin/python benchmarks/soak.py                        # 10 minutes, a report every 30 s
    .venv/bin/python benchmarks/soak.py --duration 60 --interval 10
    .venv/bin/python benchmarks/soak.py --no-spark --rate 500  # without the Spark query

A ``tidewire serve`` child process (free ports, a temporary data directory removed at the end)
carries, for ``--duration`` seconds, all of these at once (clients in this process, on uvloop):

* RS.io/TCP publishers (``--publishers``) offering ``--rate`` events/s in all to ``soak.rsio``,
  in batches every 20 ms; each value (``--size`` bytes) starts with the monotonic clock at the
  publish call and a sequence number;
* subscribers of ``soak.rsio`` from its live end: RS.io/TCP (whose end-to-end latency is the
  headline), RS.io over Tube (WebSocket) and RS.io over HTTP (long polls);
* a slow RS.io/TCP consumer of ``soak.rsio`` (``--slow-rate`` events/s, demand
  ``--slow-demand``): it falls ever further behind, and the hub must hold it back without
  buffering what it has not asked for;
* a Tolliver sender instance (reliable messages on the channel ``soak.tolliver``, at most
  ``TOLLIVER_WINDOW`` unacked) and a receiver instance subscribed to it;
* a Seguro ship (``~zod``) saving ``SAVE MANY`` flows with increasing ids;
* unless ``--no-spark``: a Spark Structured Streaming query in this process (``local[2]``)
  reading ``soak.rsio`` through the ``tidewire`` data source into the ``noop`` sink, a trigger
  every ``--spark-trigger`` seconds.

A flow that fails is counted (``errors``, ``last_error``) and reconnects after a second
(``reconnects``). Offered load the hub could not take within a second of its due time is shed
and counted (``shed``), so a stall never turns into an unbounded backlog in this process.

Every ``--interval`` seconds one JSON line (``"soak": "interval"``) gives the rates in and out
per protocol, the live RS.io subscriber's p50/p99 latency over that interval (a fixed histogram,
2 % buckets), the slow consumer's lag, the Spark query's rows/s, and the hub's RSS (VmRSS now,
VmHWM: peak, and the interval's lowest, highest and mean one-second samples) read from /proc.
The first interval is the warm-up: the RSS at its end is the baseline. The last line
(``"soak": "summary"``) holds the rule: the RSS is flat when every one-second sample of the
second half of the run (the intervals from ``--duration / 2`` on) lies within ``--max-spread``
MB (5) of the others. A hub that keeps anything per message, request or connection climbs
through the whole second half and fails it; one whose memory levelled off during the first
half passes. The exit code is 1 when the RSS is not flat (or the run broke), 0 when it is.
``--without FLOW`` leaves a flow out, to find which flow a growth comes with. The fields and
the rule are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import tidewire
from _common import Processes, choose_base, emit, fresh_dir, loop_factory, note, serve_hub
from _soak_measure import (
    HEAD,
    STAMP,
    Histogram,
    Pacer,
    RssPoint,
    RssVerdict,
    Stats,
    memory_mb,
    payloads,
    record_latency,
)
from _soak_spark import SparkQuery
from tidewire.client import seguro as seguro_client
from tidewire.client import tube as tube_client
from tidewire.client.http import HttpHub
from tidewire.client.rsio import Publisher, Receipt
from tidewire.model import Batch
from tidewire.tolliver import Instance

STREAM = "soak.rsio"
CHANNEL = "soak.tolliver"  # (the hub stores it in the stream of that name)
POINT = "~zod"  # the Seguro ship (its stream is "~zod")
OPTIONAL_FLOWS = ("tube", "http", "slow", "tolliver", "seguro")  # --without

PUBLISH_TICK_S = 0.02
OTHER_TICK_S = 0.05  # Tolliver and Seguro
MAX_SUBMIT = 2000  # events per publish call at most
TOLLIVER_WINDOW = 2000  # messages the sender keeps unacked by the hub, at most
RETRY_S = 1.0
STALL_S = 10.0  # a receiving flow that gets nothing this long while the load runs is restarted
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0

Flow = Callable[[asyncio.Event], Coroutine[Any, Any, None]]  # sets the event once connected


async def poll_until(condition: Callable[[], bool], every: float = 0.05) -> None:
    """Wait until ``condition()`` holds (bound it with ``asyncio.timeout``)."""
    while True:
        if condition():
            return
        await asyncio.sleep(every)


# --------------------------------------------------------------------------- the soak


class Soak:
    def __init__(self, args: argparse.Namespace, loop_name: str) -> None:
        self.args = args
        self.loop_name = loop_name
        self.stats = Stats()
        self.stop = asyncio.Event()  # end the run early (a signal, the hub died)
        self.go = asyncio.Event()  # publishers start offering load
        self.interrupted = False
        self.hub_died: str | None = None
        self.urls: dict[str, str] = {}
        self.work = ""
        self.seq = 0
        self.head = 0  # the highest id of soak.rsio known committed
        self.positions: dict[str, int] = {}  # each subscriber's last id of soak.rsio
        self.heard: dict[str, float] = {}  # when each receiving flow last got events
        self.tasks: list[asyncio.Task[None]] = []
        self.hub: subprocess.Popen[str] | None = None
        self.spark: SparkQuery | None = None
        self.rss_max = 0.0  # this interval's highest sample
        self.rss_min = math.inf  # and lowest
        self.rss_sum = 0.0
        self.rss_samples = 0
        self.log_offset = 0

    def on_signal(self) -> None:
        if self.stop.is_set():  # a second Ctrl-C: stop waiting for a clean end
            for task in asyncio.all_tasks():
                task.cancel()
            return
        note("soak: stopping (Ctrl-C again to abandon the clean stop)")
        self.interrupted = True
        self.stop.set()

    # ------------------------------------------------------------------ flows

    async def keep(self, name: str, body: Flow, ready: asyncio.Event,
                   watch: str | None = None) -> None:  # fmt: skip
        """Run a flow for ever: a failure is counted, and the flow starts again after a pause.
        ``watch``: the flow receives the events counted as ``outs[watch]``; silent for
        ``STALL_S`` while the load runs, it is stalled: counted as an error and restarted."""
        while True:
            if watch is not None:
                self.heard[watch] = time.monotonic()
            attempt = asyncio.create_task(body(ready))
            failure: BaseException | None = None
            try:
                while not attempt.done():
                    await asyncio.wait([attempt], timeout=1.0)
                    if (watch is not None and not attempt.done() and self.go.is_set()
                            and time.monotonic() - self.heard[watch] > STALL_S):  # fmt: skip
                        failure = TimeoutError(f"stalled: no events for {STALL_S:.0f} s")
                        break
            finally:
                if not attempt.done():  # (stalled, or the soak is stopping)
                    attempt.cancel()
                    await asyncio.wait([attempt])
            if not attempt.cancelled():
                failure = attempt.exception() or failure or ConnectionError("the flow ended")
            assert failure is not None
            self.stats.error(name, failure)
            note(f"soak: {name}: {type(failure).__name__}: {failure}")
            await asyncio.sleep(RETRY_S)
            self.stats.reconnects += 1

    async def paced(self, name: str, pacer: Pacer, tick: float,
                    send: Callable[[int], Awaitable[int]]) -> None:  # fmt: skip
        """Offer ``pacer``'s rate: ``send(n)`` every tick (``n`` may be 0) returns how many it
        took; what stays late is shed by the pacer."""
        await self.go.wait()
        loop = asyncio.get_running_loop()
        while True:
            due, shed = pacer.due(loop.time())
            self.stats.shed[name] += shed
            pacer.offered += await send(min(due, MAX_SUBMIT))
            await asyncio.sleep(tick)

    def _committed(self, future: asyncio.Future[Receipt]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self.stats.error("rsio publish", exc)
            return
        receipt = future.result()
        self.stats.ins["rsio"] += receipt.count
        self.head = max(self.head, receipt.last_id)

    async def rsio_publisher(self, pacer: Pacer, ready: asyncio.Event) -> None:
        async with tidewire.connect(self.urls["rsio"]) as hub:
            pub: Publisher = await hub.publisher(STREAM)

            async def send(n: int) -> int:
                if n <= 0:
                    return 0
                values = payloads(n, self.seq, self.args.size)
                self.seq += n
                future = await pub.submit(values)
                future.add_done_callback(self._committed)
                return n

            ready.set()
            await self.paced("rsio", pacer, PUBLISH_TICK_S, send)

    def _start(self, name: str) -> int | str:
        """Where a subscriber starts: the live end, or after what it saw before reconnecting."""
        seen = self.positions.get(name)
        return "latest" if seen is None else seen + 1

    def _received(self, name: str, batch: Batch) -> None:
        self.heard[name] = time.monotonic()
        self.stats.outs[name] += len(batch)
        self.positions[name] = batch.last_id
        if name in self.stats.latency:
            record_latency(self.stats.latency[name], batch, time.monotonic_ns())

    async def rsio_subscriber(self, ready: asyncio.Event) -> None:
        async with tidewire.connect(self.urls["rsio"]) as hub:
            await hub.ready()
            ready.set()
            async for batch in hub.subscribe(STREAM, from_id=self._start("rsio")):
                self._received("rsio", batch)

    async def tube_subscriber(self, ready: asyncio.Event) -> None:
        async with tube_client.connect(self.urls["ws"]) as hub:
            await hub.ready()
            ready.set()
            async for batch in hub.subscribe(STREAM, from_id=self._start("tube")):
                self._received("tube", batch)

    async def http_subscriber(self, ready: asyncio.Event) -> None:
        async with HttpHub(self.urls["http"]) as hub:
            ready.set()
            async for batch in hub.subscribe(STREAM, from_id=self._start("http"), demand=1000):
                self._received("http", batch)

    async def slow_subscriber(self, ready: asyncio.Event) -> None:
        async with tidewire.connect(self.urls["rsio"]) as hub:
            await hub.ready()
            ready.set()
            async for batch in hub.subscribe(STREAM, from_id=self._start("slow"),
                                             prefetch=self.args.slow_demand):  # fmt: skip
                self._received("slow", batch)
                await asyncio.sleep(len(batch) / self.args.slow_rate)

    async def tolliver(self, pacer: Pacer, ready: asyncio.Event) -> None:
        parts = urlsplit(self.urls["tolliver"])
        host, port = parts.hostname or "127.0.0.1", parts.port or 7402
        receiver = Instance(os.path.join(self.work, "tolliver-receiver.sqlite"))
        sender = Instance(os.path.join(self.work, "tolliver-sender.sqlite"))
        reader: asyncio.Task[None] | None = None
        try:
            receiver.subscribe(CHANNEL)
            async with asyncio.timeout(30):
                await receiver.connect(host, port)
                await sender.connect(host, port)
                # The hub subscribes to what its remotes want: wait until the sender knows.
                await poll_until(lambda: any((CHANNEL, "") in link.conn.peer_subscriptions
                                             for link in sender.links.values()))  # fmt: skip
            reader = asyncio.create_task(self._tolliver_read(receiver))

            async def send(n: int) -> int:
                if reader.done():
                    reader.result()  # (its error)
                    raise ConnectionError("the receiver stopped")
                if not sender.links or not receiver.links:
                    raise ConnectionError("a Tolliver connection to the hub closed")
                n = min(n, TOLLIVER_WINDOW - sender.store.unacked())
                if n <= 0:
                    return 0
                await sender.send_many(CHANNEL, "", payloads(n, 0, self.args.size))
                self.stats.ins["tolliver"] += n
                return n

            ready.set()
            await self.paced("tolliver", pacer, OTHER_TICK_S, send)
        finally:
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            await sender.close()
            await receiver.close()

    async def _tolliver_read(self, receiver: Instance) -> None:
        hist_of = self.stats
        async for deliveries in receiver.batches():
            now = time.monotonic_ns()
            hist = hist_of.latency["tolliver"]
            for delivery in deliveries:
                if len(delivery.body) >= STAMP.size:
                    hist.add((now - STAMP.unpack_from(delivery.body)[0]) / 1000)
            hist_of.outs["tolliver"] += len(deliveries)
            self.heard["tolliver"] = time.monotonic()

    async def seguro(self, pacer: Pacer, ready: asyncio.Event) -> None:
        async with seguro_client.connect(self.urls["seguro"], POINT) as ship:

            async def send(n: int) -> int:
                if n < 2:  # (a SAVE MANY holds at least two events)
                    return 0
                first = ship.latest + 1
                values = payloads(n, first, self.args.size)
                await ship.save_many(list(zip(range(first, first + n), values, strict=True)))
                self.stats.ins["seguro"] += n
                return n

            ready.set()
            await self.paced("seguro", pacer, OTHER_TICK_S, send)

    # ------------------------------------------------------------------ watching the hub

    async def sample_rss(self) -> None:
        """Every second: the hub's RSS (for the interval's mean and maximum), and whether it
        still runs."""
        assert self.hub is not None
        while True:
            code = self.hub.poll()
            memory = memory_mb(self.hub.pid)
            if code is not None or memory is None:
                self.hub_died = f"the hub exited with {code}"
                note(f"soak: {self.hub_died}; see its log lines above")
                self.stop.set()
                return
            self.rss_max = max(self.rss_max, memory[0])
            self.rss_min = min(self.rss_min, memory[0])
            self.rss_sum += memory[0]
            self.rss_samples += 1
            await asyncio.sleep(1.0)

    def start_hub(self, procs: Processes) -> tuple[subprocess.Popen[str], dict[str, str]]:
        """``tidewire serve`` on free ports, its log lines (warnings and up) into hub.log."""
        with open(os.path.join(self.work, "hub.log"), "wb") as log:
            return serve_hub(procs, os.path.join(self.work, "data"), "--set", "log_level=warning",
                             stderr=log, new_session=True)  # fmt: skip

    def hub_log_tail(self) -> str:
        with open(os.path.join(self.work, "hub.log"), "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4000))
            return f.read().decode("utf-8", "replace")

    def hub_log(self) -> tuple[int, str | None]:
        """Warning and error lines the hub logged since the last call, and the last of them."""
        path = os.path.join(self.work, "hub.log")
        count, last = 0, None
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                self.log_offset = max(self.log_offset, size - 4 * 1024 * 1024)  # bounded
                f.seek(self.log_offset)
                data = f.read(size - self.log_offset)
        except OSError:
            return 0, None
        cut = data.rfind(b"\n") + 1  # whole lines only
        self.log_offset += cut
        for line in data[:cut].decode("utf-8", "replace").splitlines():
            if any(word in line for word in ("WARNING", "ERROR", "CRITICAL", "Traceback")):
                count += 1
                last = line[:300]
        return count, last

    # ------------------------------------------------------------------ the run

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.on_signal)
        try:
            with fresh_dir(choose_base(self.args.dir), "tw-soak-") as work:
                self.work = work
                return await self._run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        args = self.args
        procs = Processes()
        summary: dict[str, Any] | None = None
        hub_exit: int | None = None
        try:
            note("soak: starting the hub")
            self.hub, self.urls = await asyncio.to_thread(self.start_hub, procs)
            # soak.rsio exists before Spark asks for it (a stamped event, like the rest)
            async with tidewire.connect(self.urls["rsio"]) as hub:
                self.head = (await hub.publish(STREAM, payloads(1, 0, args.size))).last_id
            if not args.no_spark:
                note("soak: starting Spark")
                checkpoint = os.path.join(self.work, "checkpoint")
                self.spark = SparkQuery(self.urls["rsio"], STREAM, checkpoint, args.spark_trigger)
                await asyncio.to_thread(self.spark.start)
            if not self.stop.is_set():
                await self.start_flows()
                summary = await self.intervals()
        finally:
            await self.shut_down(procs)
            if self.hub is not None:
                hub_exit = self.hub.returncode
            if self.hub_died is not None:
                note(self.hub_log_tail())
        if summary is None:
            return 1
        summary["hub_exit_code"] = hub_exit
        emit(summary)
        if self.interrupted:
            return 130
        return 0 if summary["rss_flat"] and summary["completed"] else 1

    async def start_flows(self) -> None:
        args = self.args
        # (name, body, the receiving flow it is watched as)
        flows: list[tuple[str, Flow, str | None]] = []
        for i in range(args.publishers):
            pacer = Pacer(args.rate / args.publishers)
            flows.append((f"rsio publisher {i + 1}", partial(self.rsio_publisher, pacer), None))
        optional: list[tuple[str, str, Flow, str | None]] = [
            ("tube", "tube subscriber", self.tube_subscriber, "tube"),
            ("http", "http subscriber", self.http_subscriber, "http"),
            ("slow", "slow subscriber", self.slow_subscriber, "slow"),
            ("tolliver", "tolliver", partial(self.tolliver, Pacer(args.tolliver_rate)),
             "tolliver"),
            ("seguro", "seguro", partial(self.seguro, Pacer(args.seguro_rate)), None),
        ]  # fmt: skip
        flows.append(("rsio subscriber", self.rsio_subscriber, "rsio"))
        flows += [(name, body, watch) for flow, name, body, watch in optional
                  if flow not in args.without]  # fmt: skip
        readies: dict[str, asyncio.Event] = {}
        for name, body, watch in flows:
            readies[name] = asyncio.Event()
            self.tasks.append(asyncio.create_task(self.keep(name, body, readies[name], watch)))
        self.tasks.append(asyncio.create_task(self.sample_rss()))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        while not all(r.is_set() for r in readies.values()) and not self.stop.is_set():
            if loop.time() > deadline:
                break
            await asyncio.sleep(0.05)
        late = [name for name, ready in readies.items() if not ready.is_set()]
        if late and not self.stop.is_set():
            raise RuntimeError(f"not connected after {READY_TIMEOUT_S:.0f} s: {', '.join(late)} "
                               f"(last error: {self.stats.last_error})")  # fmt: skip

    async def intervals(self) -> dict[str, Any]:
        args = self.args
        loop = asyncio.get_running_loop()
        count = max(1, math.ceil(args.duration / args.interval))
        emit({"soak": "start", "duration_s": args.duration, "interval_s": args.interval,
              "intervals": count, "rate": args.rate, "publishers": args.publishers,
              "tolliver_rate": args.tolliver_rate, "seguro_rate": args.seguro_rate,
              "slow_rate": args.slow_rate, "value_bytes": args.size, "spark": not args.no_spark,
              "without": args.without,
              "loop": self.loop_name, "hub_pid": self.hub.pid if self.hub else None,
              "urls": self.urls})  # fmt: skip
        self.stats.take()  # (what the flows did while connecting is not part of the run)
        self.heard = dict.fromkeys(self.heard, time.monotonic())
        self.go.set()
        start = last = loop.time()
        overall = Histogram()
        rss: list[RssPoint] = []
        peak = 0.0
        done = 0
        for index in range(1, count + 1):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), start + index * args.interval
                                       - loop.time())  # fmt: skip
            if self.stop.is_set():
                break
            now = loop.time()
            line, latency = await self.report(index, now - start, now - last)
            last = now
            done = index
            emit(line)
            if index > 1:  # (the first interval is the warm-up)
                overall.merge(latency)
            peak = max(peak, line["rss_peak_mb"] or 0.0)
            rss.append(RssPoint.of(line))
        return self.summary(done, count, overall, rss, peak, loop.time() - start)

    async def report(self, index: int, elapsed: float, seconds: float
                     ) -> tuple[dict[str, Any], Histogram]:  # fmt: skip
        """The interval's line, and its histogram of the live RS.io subscriber's latency."""
        per_s = max(seconds, 1e-9)
        memory = memory_mb(self.hub.pid) if self.hub is not None else None
        client = memory_mb(os.getpid())
        rows = batches = None
        spark_lag = None
        if self.spark is not None:
            try:
                rows, batches, end, died = await asyncio.wait_for(
                    asyncio.to_thread(self.spark.poll), 30)
            except Exception as exc:
                self.stats.error("spark", exc)
            else:
                if died is not None:
                    self.stats.error("spark", RuntimeError(died))
                    self.stats.reconnects += 1
                if end is not None:
                    spark_lag = max(0, self.head + 1 - end)
        taken = self.stats.take()
        warnings, last_warning = self.hub_log()
        latency: dict[str, Histogram] = taken["latency"]
        slow = self.positions.get("slow")
        slow_lag = None if slow is None else max(0, self.head - slow)
        mean = self.rss_sum / self.rss_samples if self.rss_samples else None
        line = {
            "soak": "interval",
            "interval": index,
            "warmup": index == 1,
            "elapsed_s": round(elapsed, 1),
            "seconds": round(seconds, 2),
            "in_per_s": {k: round(v / per_s, 1) for k, v in taken["ins"].items()},
            "out_per_s": {k: round(v / per_s, 1) for k, v in taken["outs"].items()},
            "p50_ms": latency["rsio"].percentile_ms(0.50),
            "p99_ms": latency["rsio"].percentile_ms(0.99),
            "latency_samples": latency["rsio"].n,
            "p99_ms_by_protocol": {k: h.percentile_ms(0.99) for k, h in latency.items()},
            "slow_lag": slow_lag,
            "spark_rows_per_s": None if rows is None else round(rows / per_s, 1),
            "spark_batches": batches,
            "spark_lag": spark_lag,
            "rss_mb": None if memory is None else round(memory[0], 1),
            "rss_peak_mb": None if memory is None else round(memory[1], 1),
            "rss_interval_max_mb": round(self.rss_max, 1) if self.rss_samples else None,
            "rss_interval_min_mb": round(self.rss_min, 1) if self.rss_samples else None,
            "rss_mean_mb": None if mean is None else round(mean, 1),
            "client_rss_mb": None if client is None else round(client[0], 1),
            "shed": taken["shed"],
            "errors": taken["errors"],
            "reconnects": taken["reconnects"],
            "last_error": taken["last_error"],
            "hub_warnings": warnings,
            "hub_last_warning": last_warning,
        }
        self.rss_max = self.rss_sum = 0.0
        self.rss_min = math.inf
        self.rss_samples = 0
        return line, latency["rsio"]

    def summary(self, done: int, count: int, overall: Histogram, rss: list[RssPoint],
                peak: float, elapsed: float) -> dict[str, Any]:  # fmt: skip
        args = self.args
        self.stats.take()  # (what came after the last line: into the totals)
        baseline = rss[0].end if rss else None
        last = rss[-1].end if rss else None
        growth = None if not baseline or last is None else last / baseline
        verdict = RssVerdict.of(rss, args.duration, args.max_spread)
        low, high, spread, slope = verdict.low, verdict.high, verdict.spread, verdict.slope
        completed = done == count and self.hub_died is None
        return {
            "soak": "summary",
            "completed": completed,
            "interrupted": self.interrupted,
            "hub_died": self.hub_died,
            "intervals": done,
            "elapsed_s": round(elapsed, 1),
            "events_in": self.stats.total_in,
            "events_out": self.stats.total_out,
            "events_in_total": sum(self.stats.total_in.values()),
            "events_out_total": sum(self.stats.total_out.values()),
            "p50_ms": overall.percentile_ms(0.50),
            "p99_ms": overall.percentile_ms(0.99),
            "latency_samples": overall.n,
            "rss_baseline_mb": baseline,
            "rss_last_mb": last,
            "rss_peak_mb": round(peak, 1) if rss else None,
            "rss_growth_ratio": None if growth is None else round(growth, 3),
            "rss_slope_mb_per_min": None if slope is None else round(slope, 3),
            "rss_slope_points": verdict.points,
            "rss_second_half_min_mb": None if low is None else round(low, 1),
            "rss_second_half_max_mb": None if high is None else round(high, 1),
            "rss_second_half_spread_mb": None if spread is None else round(spread, 1),
            "rss_flat": verdict.flat,
            "flat_rule": f"rss_second_half_spread_mb (every 1-s sample of the intervals from "
                         f"{args.duration / 2:g} s on) <= {args.max_spread}",
            "errors": self.stats.total_errors,
            "reconnects": self.stats.total_reconnects,
            "shed": self.stats.total_shed,
        }

    async def shut_down(self, procs: Processes) -> None:
        """Stop the load, then Spark, then the hub (SIGTERM: it drains and exits 0)."""
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=STOP_TIMEOUT_S)
            if pending:
                note(f"soak: {len(pending)} flow(s) did not stop within {STOP_TIMEOUT_S:.0f} s")
        if self.spark is not None:
            note("soak: stopping Spark")
            try:
                await asyncio.wait_for(asyncio.to_thread(self.spark.stop), 60)
            except Exception as exc:
                note(f"soak: stopping Spark: {type(exc).__name__}: {exc}")
        if self.hub is not None:
            await asyncio.to_thread(procs.stop, self.hub)
            if self.hub.returncode:
                note(f"soak: the hub exited with {self.hub.returncode}")
        procs.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--interval", type=float, default=30.0,
                        help="seconds per report line (default 30; the first is the warm-up)")
    parser.add_argument("--rate", type=float, default=5000.0,
                        help="events/s offered by the RS.io publishers together (default 5000)")
    parser.add_argument("--publishers", type=int, default=2, help="RS.io publisher connections")
    parser.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    parser.add_argument("--tolliver-rate", type=float,
                        help="Tolliver messages/s (default: rate / 20, at least 20)")
    parser.add_argument("--seguro-rate", type=float,
                        help="Seguro events/s (default: rate / 5, at least 40)")
    parser.add_argument("--slow-rate", type=float, default=50.0,
                        help="events/s the slow consumer reads (default 50)")
    parser.add_argument("--slow-demand", type=int, default=10,
                        help="the slow consumer's RS.io demand (prefetch, default 10)")
    parser.add_argument("--spark-trigger", type=float, default=5.0,
                        help="seconds between the Spark query's micro-batches (default 5)")
    parser.add_argument("--no-spark", action="store_true", help="leave the Spark query out")
    parser.add_argument("--without", action="append", default=[], choices=OPTIONAL_FLOWS,
                        metavar="FLOW", help="leave a flow out (repeatable; one of "
                        f"{', '.join(OPTIONAL_FLOWS)}): to find which flow a change in the "
                        "hub's memory comes with")  # fmt: skip
    parser.add_argument("--max-spread", type=float, default=5.0,
                        help="flat: every RSS sample of the second half of the run within "
                             "this many MB (default 5)")  # fmt: skip
    parser.add_argument("--dir", help="where the temporary directory goes (default: /tmp, or "
                        "the working directory if /tmp is a RAM file system)")  # fmt: skip
    args = parser.parse_args()
    if args.tolliver_rate is None:
        args.tolliver_rate = max(20.0, args.rate / 20)
    if args.seguro_rate is None:
        args.seguro_rate = max(40.0, args.rate / 5)
    if min(args.duration, args.interval, args.rate, args.slow_rate) <= 0 or args.publishers < 1:
        parser.error("durations, rates and --publishers must be positive")
    if args.size < HEAD.size:
        parser.error(f"--size must be at least {HEAD.size} (the stamp and sequence number)")
    factory, loop_name = loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        try:
            return runner.run(Soak(args, loop_name).run())
        except (RuntimeError, OSError) as exc:
            note(f"soak: {type(exc).__name__}: {exc}")
            return 2


if __name__ == "__main__":
    sys.exit(main())
