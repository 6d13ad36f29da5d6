"""What the hub counts, as plain data: traffic per batch, the log's latencies, rate samples.

The hot paths count **per batch**, into plain integers (:meth:`Metrics.received`,
:meth:`Metrics.sent`: one dict lookup and four additions per append or delivery, whatever the
batch's size). The log's latencies are observed as they happen into :class:`Latency` (a
fixed-bucket histogram: one bisection and three additions per observation). Everything else
(connections, subscriptions with their demand and lag, Tolliver peers, the log's size) is not
counted at all: it is read from the live objects when someone asks.

This module is the hub's own: it knows nothing of Prometheus. ``tidewire.observe.metrics``
sits above the hub and reads these figures for ``/metrics``; ``server/admin.py`` reads them
for the admin API. Adapters register what they serve (``listeners``, the Tolliver peers) here
so that those readers find them.

Rates (events and bytes per second) come from once-a-second samples of the counters kept for
``rate_window_seconds``; :meth:`Metrics.sample` takes the time as an argument, so tests drive
it with a fake clock. Samples are bounded by the window (at most one a second is taken). With a
:class:`~.history.History` set (``Metrics.history``: the dashboard's charts), each sample also
becomes one of its points, with each stream's largest subscription lag from ``Metrics.lags``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .history import History

__all__ = [
    "LATENCY_BUCKETS",
    "ConnectionView",
    "Latency",
    "ListenerView",
    "Metrics",
    "TolliverPeer",
    "Traffic",
    "next_subscription_id",
]

log = logging.getLogger("tidewire.hub")

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
"""Seconds: an fsync on an SSD takes 0.1 to a few ms, on a busy disk tens of ms."""

_subscription_ids = itertools.count(1)


def next_subscription_id() -> int:
    """A subscription's id in this process (in the API, the metrics' labels, log lines)."""
    return next(_subscription_ids)


class Traffic:
    """Events and bytes of one stream over one protocol, into and out of the hub."""

    __slots__ = ("bytes_in", "bytes_out", "events_in", "events_out")

    def __init__(self) -> None:
        self.events_in = 0
        self.bytes_in = 0
        self.events_out = 0
        self.bytes_out = 0

    def as_dict(self) -> dict[str, int]:
        return {"events_in": self.events_in, "bytes_in": self.bytes_in,
                "events_out": self.events_out, "bytes_out": self.bytes_out}  # fmt: skip


class Latency:
    """A histogram of durations in seconds over fixed upper bounds, as plain integers.

    ``counts[i]`` is the number of observations at most ``bounds[i]`` and above
    ``bounds[i - 1]`` (not cumulative); the last count is for those above every bound (+Inf).
    Memory is fixed by the bounds, whatever the number of observations.
    """

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration (the log's ``on_append`` / ``on_fsync`` hooks)."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.count += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at most it)`` per bucket, the last bound ``inf``."""
        out = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class ConnectionView(Protocol):
    """What the metrics read of an open connection (the guard's ``GuardedConnection``)."""

    @property
    def serial(self) -> int: ...
    @property
    def protocol(self) -> str: ...
    @property
    def peer(self) -> str: ...
    @property
    def principal(self) -> str | None: ...
    @property
    def opened_at(self) -> float: ...
    @property
    def bytes_in(self) -> int: ...
    @property
    def bytes_out(self) -> int: ...
    @property
    def secure(self) -> bool: ...


class ListenerView(Protocol):
    """What the metrics read of a listener (the guard's ``Listener``)."""

    @property
    def name(self) -> str: ...
    @property
    def refused(self) -> int: ...

    def open_connections(self) -> Iterable[ConnectionView]: ...


@dataclass(frozen=True, slots=True)
class TolliverPeer:
    """A remote Tolliver instance the hub knows: connected now, or with offsets kept."""

    uuid: str
    address: str | None
    connected: bool
    channels: tuple[str, ...]
    unacked: int
    resends: int


@dataclass(slots=True)
class Sample:
    """The totals of every stream at one time (monotonic seconds)."""

    at: float
    totals: dict[str, tuple[int, int, int, int]]  # stream -> events/bytes in, events/bytes out


@dataclass(slots=True)
class Metrics:
    """The hub's counters and the sources of everything else; one per hub (``Hub.metrics``)."""

    rate_window_seconds: float = 10.0
    started_at: float = field(default_factory=time.time)
    traffic: dict[str, dict[str, Traffic]] = field(default_factory=dict)
    listeners: list[ListenerView] = field(default_factory=list)
    tolliver: Callable[[], tuple[str, list[TolliverPeer]]] | None = None
    append_seconds: Latency = field(default_factory=Latency)
    """From an append call to its durable commit (queueing, write and fsync)."""
    fsync_seconds: Latency = field(default_factory=Latency)
    """One group commit's fdatasync."""
    samples: deque[Sample] = field(default_factory=deque)
    """The rate samples in the window, oldest first (read-only for callers)."""
    history: History = field(default_factory=History)
    """The dashboard's recent past, a point per sample (``serve`` sizes it: ``dashboard.*``)."""
    lags: Callable[[], Mapping[str, int]] | None = None
    """Each stream's largest subscription lag now, for :attr:`history` (the admin API sets
    it: the hub's subscriptions are not this object's to read); ``None``: no lag."""
    _lag_failed_at: float = float("-inf")

    # ------------------------------------------------------------------ the hot paths

    def received(self, protocol: str, stream: str, events: int, nbytes: int) -> None:
        """``events`` events (``nbytes`` bytes) of ``stream`` were stored, through ``protocol``."""
        t = self.counters(protocol, stream)
        t.events_in += events
        t.bytes_in += nbytes

    def sent(self, protocol: str, stream: str, events: int, nbytes: int) -> None:
        """``events`` events (``nbytes`` bytes) of ``stream`` were handed to a subscriber."""
        t = self.counters(protocol, stream)
        t.events_out += events
        t.bytes_out += nbytes

    def counters(self, protocol: str, stream: str) -> Traffic:
        """The counters of ``stream`` over ``protocol``, made at first use."""
        by_protocol = self.traffic.get(stream)
        if by_protocol is None:
            by_protocol = self.traffic[stream] = {}
        t = by_protocol.get(protocol)
        if t is None:
            t = by_protocol[protocol] = Traffic()
        return t

    # ------------------------------------------------------------------ rates

    def totals(self, stream: str) -> tuple[int, int, int, int]:
        """Events and bytes in, events and bytes out of ``stream``, over every protocol."""
        ei = bi = eo = bo = 0
        for t in self.traffic.get(stream, {}).values():
            ei += t.events_in
            bi += t.bytes_in
            eo += t.events_out
            bo += t.bytes_out
        return ei, bi, eo, bo

    def sample(self, now: float, wall: float | None = None) -> None:
        """Take a sample of every stream's totals at ``now`` (monotonic seconds; ``wall``, the
        wall clock in seconds then, default :func:`time.time`), a point of :attr:`history`."""
        totals = {s: self.totals(s) for s in self.traffic}
        self.samples.append(Sample(now, totals))
        while len(self.samples) > 2 and now - self.samples[1].at >= self.rate_window_seconds:
            self.samples.popleft()
        wall_ms = int((time.time() if wall is None else wall) * 1000)
        self.history.record(now, wall_ms, totals, self._lags(now),
                            (self.append_seconds.bounds, self.append_seconds.counts),
                            (self.fsync_seconds.bounds, self.fsync_seconds.counts))  # fmt: skip

    def _lags(self, now: float) -> Mapping[str, int]:
        if self.lags is None:
            return {}
        try:
            return self.lags()
        except Exception:  # (the sampler goes on: the rates depend on it; a line a minute)
            if now - self._lag_failed_at >= 60:
                self._lag_failed_at = now
                log.exception("the dashboard's history could not read the subscriptions' lag")
            return {}

    def rates(self, stream: str | None = None) -> tuple[float, float, float, float]:
        """Events and bytes per second in, then out, of ``stream`` (``None``: every stream),
        between the oldest and the newest sample; zeros until there are two."""
        if len(self.samples) < 2:
            return 0.0, 0.0, 0.0, 0.0
        first, last = self.samples[0], self.samples[-1]
        elapsed = last.at - first.at
        if elapsed <= 0:
            return 0.0, 0.0, 0.0, 0.0
        names = [stream] if stream is not None else list(last.totals)
        delta = [0, 0, 0, 0]
        zero = (0, 0, 0, 0)
        for name in names:
            new, old = last.totals.get(name, zero), first.totals.get(name, zero)
            for i in range(4):
                delta[i] += new[i] - old[i]
        return (delta[0] / elapsed, delta[1] / elapsed, delta[2] / elapsed, delta[3] / elapsed)

    async def run_sampler(self, interval: float = 1.0) -> None:
        """Sample every ``interval`` seconds, forever (the hub's background task)."""
        loop = asyncio.get_running_loop()
        while True:
            self.sample(loop.time())
            await asyncio.sleep(interval)

    # ------------------------------------------------------------------ live objects

    def connections(self) -> Iterator[ConnectionView]:
        for listener in self.listeners:
            yield from listener.open_connections()

    def tolliver_peers(self) -> tuple[str | None, list[TolliverPeer]]:
        if self.tolliver is None:
            return None, []
        return self.tolliver()
