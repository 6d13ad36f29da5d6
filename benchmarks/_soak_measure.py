"""What benchmarks/soak.py measures and how it paces its load: the latency histogram, the hub's
RSS from /proc and the rule that says whether it stayed flat (:class:`RssVerdict`), the offered
rate (:class:`Pacer`) and the counters of each interval (:class:`Stats`). No I/O but /proc."""

from __future__ import annotations

import math
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from tidewire.model import Batch

__all__ = [
    "CATCH_UP_S",
    "HEAD",
    "IN",
    "LATENCY",
    "OUT",
    "STAMP",
    "Histogram",
    "Pacer",
    "RssPoint",
    "RssVerdict",
    "Stats",
    "memory_mb",
    "payloads",
    "record_latency",
    "slope_per_min",
]

IN = ("rsio", "tolliver", "seguro")
OUT = ("rsio", "tube", "http", "tolliver", "slow")
LATENCY = ("rsio", "tube", "http", "tolliver")
CATCH_UP_S = 1.0  # offered load more than this late is shed, not sent in a burst
HEAD = struct.Struct(">qQ")  # monotonic ns at the publish call, sequence number
STAMP = struct.Struct(">q")


class Histogram:
    """Latencies in fixed buckets 2 % wide from 1 µs to about 100 s: constant memory, and a
    percentile within 2 % of the true one."""

    GROWTH = 1.02
    SCALE = 1 / math.log(GROWTH)
    BUCKETS = int(math.log(1e8) * SCALE) + 2

    def __init__(self) -> None:
        self.counts = [0] * self.BUCKETS
        self.n = 0

    def add(self, micros: float, count: int = 1) -> None:
        i = 0 if micros <= 1 else min(self.BUCKETS - 1, int(math.log(micros) * self.SCALE))
        self.counts[i] += count
        self.n += count

    def merge(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            if c:
                self.counts[i] += c
        self.n += other.n

    def percentile_ms(self, q: float) -> float | None:
        """The ``q`` quantile (0..1) in ms: the bucket's geometric middle (None if empty)."""
        if not self.n:
            return None
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return round(math.pow(self.GROWTH, i + 0.5) / 1000, 3)
        return None  # (unreachable: the counts add up to n)


def record_latency(hist: Histogram, batch: Batch, now_ns: int) -> None:
    """Add the latency of every event of ``batch`` (values stamped by :func:`payloads`).
    Events published together share a stamp: a run of equal stamps is one histogram add."""
    values, offsets = batch.values, batch.value_offsets
    base = offsets[0]
    unpack = STAMP.unpack_from
    last_stamp, run = 0, 0
    for i in range(len(batch)):
        start = offsets[i] - base
        if offsets[i + 1] - base - start < STAMP.size:
            continue  # (not one of ours)
        (stamp,) = unpack(values, start)
        if stamp != last_stamp and run:
            hist.add((now_ns - last_stamp) / 1000, run)
            run = 0
        last_stamp = stamp
        run += 1
    if run:
        hist.add((now_ns - last_stamp) / 1000, run)


def payloads(n: int, seq: int, size: int) -> list[bytes]:
    now = time.monotonic_ns()
    pad = b"\0" * max(0, size - HEAD.size)
    return [HEAD.pack(now, seq + i) + pad for i in range(n)]


def memory_mb(pid: int) -> tuple[float, float] | None:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in MB (10^6 bytes), None once it is gone."""
    rss = hwm = 0.0
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024 / 1e6
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024 / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return rss, hwm


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) points in MB/min; None for fewer than 3."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (y - mean_y) for t, y in points)
    return cov / var * 60


@dataclass(frozen=True, slots=True)
class RssPoint:
    """The hub's RSS over one interval (MB): at its end, its mean and its lowest and highest
    one-second samples (the end value when the interval had none)."""

    start: float  # seconds since the load started
    seconds: float
    end: float
    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, line: dict[str, Any]) -> RssPoint:
        end = line["rss_mb"] or 0.0
        return cls(line["elapsed_s"] - line["seconds"], line["seconds"], end,
                   line["rss_mean_mb"] or end, line["rss_interval_min_mb"] or end,
                   line["rss_interval_max_mb"] or end)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RssVerdict:
    """Whether the hub's RSS was flat: every one-second sample of the second half of the run
    (the intervals that start at ``duration / 2`` or later, never the warm-up) within
    ``max_spread`` MB of the others. A run whose second half has no interval is not flat (too
    short to tell)."""

    flat: bool
    points: int  # intervals in the second half
    low: float | None
    high: float | None
    spread: float | None  # high - low
    slope: float | None  # of the intervals' means, MB/min (for the record; not the rule)

    @classmethod
    def of(cls, rss: list[RssPoint], duration: float, max_spread: float) -> RssVerdict:
        # (0.5 s: elapsed_s and seconds are rounded in the lines)
        half = [p for p in rss[1:] if p.start >= duration / 2 - 0.5]
        if not half:
            return cls(False, 0, None, None, None, None)
        low, high = min(p.low for p in half), max(p.high for p in half)
        slope = slope_per_min([(p.start + p.seconds, p.mean) for p in half])
        return cls(high - low <= max_spread, len(half), low, high, high - low, slope)


@dataclass(slots=True)
class Pacer:
    """A steady offered rate: how many events are due since the first call. Load more than
    ``CATCH_UP_S`` late (the hub held the flow back, or it was reconnecting) is shed."""

    rate: float
    start: float | None = None
    offered: int = 0

    def due(self, now: float) -> tuple[int, int]:
        """(events due now, events shed)."""
        if self.start is None:
            self.start = now
        target = int((now - self.start) * self.rate)
        shed = 0
        allowed = max(1, int(self.rate * CATCH_UP_S))
        if target - self.offered > allowed:
            shed = target - self.offered - allowed
            self.offered += shed
        return target - self.offered, shed


@dataclass
class Stats:
    """Counters of the current interval (taken and reset by each report) and of the run."""

    ins: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IN, 0))
    outs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUT, 0))
    shed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IN, 0))
    latency: dict[str, Histogram] = field(
        default_factory=lambda: {name: Histogram() for name in LATENCY}
    )
    errors: int = 0
    reconnects: int = 0
    last_error: str | None = None
    total_in: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IN, 0))
    total_out: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUT, 0))
    total_errors: int = 0
    total_reconnects: int = 0
    total_shed: int = 0

    def error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{where}: {type(exc).__name__}: {exc}"[:300]

    def take(self) -> dict[str, Any]:
        """This interval's counters (then zeroed); the run's totals are kept."""
        taken = {"ins": self.ins, "outs": self.outs, "shed": self.shed,
                 "latency": self.latency, "errors": self.errors,
                 "reconnects": self.reconnects, "last_error": self.last_error}  # fmt: skip
        for name, n in self.ins.items():
            self.total_in[name] += n
        for name, n in self.outs.items():
            self.total_out[name] += n
        self.total_errors += self.errors
        self.total_reconnects += self.reconnects
        self.total_shed += sum(self.shed.values())
        self.ins, self.outs = dict.fromkeys(IN, 0), dict.fromkeys(OUT, 0)
        self.shed = dict.fromkeys(IN, 0)
        self.latency = {name: Histogram() for name in LATENCY}
        self.errors = self.reconnects = 0
        self.last_error = None
        return taken
