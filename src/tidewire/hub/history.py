"""The dashboard's recent past: per-stream rates and lag, and the log's latencies, once a second.

:class:`~.traffic.Metrics` takes a sample of its counters every second
(:meth:`~.traffic.Metrics.sample`); with a :class:`History` set on it, each sample also becomes a
*point* here: the wall-clock time, then for each of the ``streams`` busiest streams of that
second its events and bytes per second in and out (the counters' deltas over the time since the
previous sample) and its largest subscription lag, then the append and fsync latencies' p50 and
p99 over the last ``latency_window`` samples (the histograms' deltas, so a slow minute long ago
does not hide a fast one now). Points are kept for ``seconds`` samples; ``GET /api/history``
(``server/admin.py``) hands them out as columns, which is what a chart draws.

Bounded whatever the hub does: at most ``seconds`` points of at most ``streams`` streams each
(five 8-byte floats per stream and a tuple of the names, which are the hub's own strings): at
the defaults (900 x 32) about 1.7 MB (measured with tracemalloc). The time is an argument
(``now``, ``wall_ms``): tests drive it with a fake clock. Nothing here is on a hot path: one
point a second, O(S log N) for S streams of which N are kept.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SERIES", "History", "HistoryLimits", "quantile"]

SERIES = ("events_in_rate", "bytes_in_rate", "events_out_rate", "bytes_out_rate", "max_lag")
"""A stream's values in each point, in this order (the keys of ``/api/history``'s streams)."""

_HIDDEN_PREFIX = "_tidewire."
"""The hub's own streams (``tidewire.hub.RESERVED_PREFIX``: that module imports this one's
importer, so the value is repeated; a test checks they agree): not charted."""

Totals = tuple[int, int, int, int]
"""A stream's events and bytes in, events and bytes out, since the hub started."""


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """How much the history keeps (``dashboard.history_seconds``, ``dashboard.history_streams``)."""

    seconds: int = 900
    """Points kept: one a second, so 15 minutes."""
    streams: int = 32
    """Streams in each point: the busiest of that second (events, then bytes, then lag)."""
    latency_window: int = 10
    """Samples the latency percentiles are taken over (the histograms' deltas)."""

    def __post_init__(self) -> None:
        if self.seconds < 1 or self.streams < 1 or self.latency_window < 1:
            raise ValueError(f"every history limit must be at least 1: {self}")


@dataclass(frozen=True, slots=True)
class _Point:
    at_ms: int
    names: tuple[str, ...]
    values: array[float]  # len(SERIES) per name, in the order of ``names``
    latencies: tuple[float, ...]  # append p50, p99, fsync p50, p99 (NaN: none)


def quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float | None:
    """The ``q`` quantile (0..1) of a histogram: ``counts[i]`` observations in bucket ``i``
    (above ``bounds[i - 1]``, at most ``bounds[i]``; the last bucket is above every bound).
    Linear within the bucket, as Prometheus' ``histogram_quantile`` (the first bucket starts
    at 0); in the last bucket, the largest bound. ``None`` without observations."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    below = 0
    for i, n in enumerate(counts):
        if n and below + n >= rank:
            if i >= len(bounds):
                return bounds[-1]
            low = bounds[i - 1] if i else 0.0
            # (clamped: the float arithmetic may land a hair past the bucket's top)
            return min(bounds[i], low + (bounds[i] - low) * max(0.0, rank - below) / n)
        below += n
    return bounds[-1]  # (not reached: the counts add up to total)


class History:
    """The points of the last ``limits.seconds`` samples (see the module's docstring)."""

    def __init__(self, limits: HistoryLimits | None = None, *,
                 hidden_prefix: str = _HIDDEN_PREFIX) -> None:  # fmt: skip
        self.limits = limits or HistoryLimits()
        self.hidden_prefix = hidden_prefix
        self._points: deque[_Point] = deque(maxlen=self.limits.seconds)
        self._last: tuple[float, Mapping[str, Totals]] | None = None
        # the histograms' counts at the last latency_window + 1 samples, oldest first
        self._latency: deque[tuple[tuple[int, ...], tuple[int, ...]]] = deque(
            maxlen=self.limits.latency_window + 1)

    def __len__(self) -> int:
        return len(self._points)

    def record(self, now: float, wall_ms: int, totals: Mapping[str, Totals],
               lags: Mapping[str, int], append: tuple[Sequence[float], Sequence[int]],
               fsync: tuple[Sequence[float], Sequence[int]]) -> None:  # fmt: skip
        """Take the sample at ``now`` (monotonic seconds; ``wall_ms``, the wall clock then):
        every stream's ``totals`` (a copy: kept until the next sample), each stream's largest
        subscription ``lags``, and the append and fsync histograms as ``(bounds, counts)``.
        The first sample only sets the baseline (a rate needs two)."""
        self._latency.append((tuple(append[1]), tuple(fsync[1])))
        last, self._last = self._last, (now, totals)
        if last is None or now <= last[0]:
            return
        elapsed = now - last[0]
        before = last[1]
        zero = (0, 0, 0, 0)
        rows = []
        for name in totals.keys() | lags.keys():
            if name.startswith(self.hidden_prefix):
                continue
            new, old = totals.get(name, zero), before.get(name, zero)
            # (a counter never goes down; a stream deleted and made again might: not below 0)
            ei, bi, eo, bo = (max(0, new[i] - old[i]) / elapsed for i in range(4))
            rows.append((-(ei + eo), -(bi + bo), -lags.get(name, 0), name, ei, bi, eo, bo))
        kept = heapq.nsmallest(self.limits.streams, rows)  # (sorted, in O(S log streams))
        values = array("d")
        for row in kept:
            values.extend((row[4], row[5], row[6], row[7], float(-row[2])))
        self._points.append(_Point(wall_ms, tuple(row[3] for row in kept), values,
                                   self._percentiles(append[0], fsync[0])))  # fmt: skip

    def _percentiles(self, append_bounds: Sequence[float],
                     fsync_bounds: Sequence[float]) -> tuple[float, ...]:  # fmt: skip
        first, latest = self._latency[0], self._latency[-1]
        out = []
        for which, bounds in ((0, append_bounds), (1, fsync_bounds)):
            delta = [n - o for n, o in zip(latest[which], first[which], strict=True)]
            for q in (0.5, 0.99):
                value = quantile(q, bounds, delta)
                out.append(math.nan if value is None else value)
        return tuple(out)

    def as_json(self, since_ms: int | None = None) -> dict[str, Any]:
        """The points after ``since_ms`` (all: ``None``) as columns (docs/observability.md,
        ``GET /api/history``): ``time`` (wall-clock ms), per stream each of :data:`SERIES`
        (``null`` at a point where the stream was not among the busiest), and the latencies
        (seconds, ``null`` where nothing was observed in the window)."""
        points = [p for p in self._points if since_ms is None or p.at_ms > since_ms]
        width = len(SERIES)
        streams: dict[str, dict[str, list[float | int | None]]] = {}
        for i, point in enumerate(points):
            for j, name in enumerate(point.names):
                columns = streams.get(name)
                if columns is None:
                    columns = streams[name] = {s: [None] * len(points) for s in SERIES}
                base = j * width
                for k, series in enumerate(SERIES[:-1]):
                    columns[series][i] = round(point.values[base + k], 3)
                columns["max_lag"][i] = int(point.values[base + width - 1])
        latency = [[_maybe(p.latencies[k]) for p in points] for k in range(4)]
        return {
            "interval_seconds": 1,
            "history_seconds": self.limits.seconds,
            "history_streams": self.limits.streams,
            "latency_window_seconds": self.limits.latency_window,
            "time": [p.at_ms for p in points],
            "streams": {name: streams[name] for name in sorted(streams)},
            "append_seconds": {"p50": latency[0], "p99": latency[1]},
            "fsync_seconds": {"p50": latency[2], "p99": latency[3]},
        }


def _maybe(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 7)
