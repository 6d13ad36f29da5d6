"""What the hub counts, and its export in the Prometheus text format.

The hot paths count **per batch**, into plain integers (:meth:`Metrics.received`,
:meth:`Metrics.sent`: one dict lookup and four additions per append or delivery, whatever the
batch's size). Everything else (connections, subscriptions with their demand and lag, Tolliver
peers, the log's size) is not counted at all: it is read from the live objects when someone
asks, by :class:`HubCollector` for ``/metrics`` and by :meth:`Metrics.snapshot` for the admin
API. Only the log's latencies are observed as they happen, into prometheus-client histograms
(one observation per append call and one per group commit's fsync).

prometheus-client is the library for the exposition format and the histograms; the custom
collector is ours because prometheus-client's labelled counters cost a lock and a label lookup
per increment, and because most figures are states (a subscription's lag) read at scrape time.

Each hub has its own :class:`~prometheus_client.CollectorRegistry` (tests run many hubs in
one process), which also carries the process collector (RSS, CPU, open files).

Rates (events and bytes per second) come from once-a-second samples of the counters kept for
``rate_window_seconds``; :meth:`Metrics.sample` takes the time as an argument, so tests drive
it with a fake clock.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

if TYPE_CHECKING:
    from ..hub import Hub

__all__ = [
    "CONNECTION_PROTOCOLS",
    "SUBSCRIPTION_PROTOCOLS",
    "ConnectionView",
    "HubCollector",
    "Metrics",
    "TolliverPeer",
    "Traffic",
    "next_subscription_id",
    "per_protocol",
    "subscription_lag",
]

CONNECTION_PROTOCOLS = ("rsio", "http", "tube", "tolliver", "seguro")
"""What a connection speaks: its listener's protocol, or ``tube`` once HTTP upgraded."""

SUBSCRIPTION_PROTOCOLS = ("rsio", "rsio-http", "tube", "tolliver")
"""Who follows streams: RS.io over TCP, over HTTP, over Tube, and Tolliver's remotes."""

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
class _Sample:
    at: float
    totals: dict[str, tuple[int, int, int, int]]  # stream -> events/bytes in, events/bytes out


@dataclass(slots=True)
class Metrics:
    """The hub's counters and the sources of everything else; one per :class:`Hub`."""

    rate_window_seconds: float = 10.0
    started_at: float = field(default_factory=time.time)
    traffic: dict[str, dict[str, Traffic]] = field(default_factory=dict)
    listeners: list[ListenerView] = field(default_factory=list)
    tolliver: Callable[[], tuple[str, list[TolliverPeer]]] | None = None
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry())
    append_seconds: Histogram = field(init=False)
    fsync_seconds: Histogram = field(init=False)
    _samples: deque[_Sample] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.append_seconds = Histogram(
            "tidewire_log_append_seconds",
            "Time from an append call to its durable commit (queueing, write and fsync)",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.fsync_seconds = Histogram(
            "tidewire_log_fsync_seconds", "Time of one group commit's fdatasync",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        ProcessCollector(registry=self.registry)

    # ------------------------------------------------------------------ the hot paths

    def received(self, protocol: str, stream: str, events: int, nbytes: int) -> None:
        """``events`` events (``nbytes`` bytes) of ``stream`` were stored, through ``protocol``."""
        t = self._traffic(protocol, stream)
        t.events_in += events
        t.bytes_in += nbytes

    def sent(self, protocol: str, stream: str, events: int, nbytes: int) -> None:
        """``events`` events (``nbytes`` bytes) of ``stream`` were handed to a subscriber."""
        t = self._traffic(protocol, stream)
        t.events_out += events
        t.bytes_out += nbytes

    def _traffic(self, protocol: str, stream: str) -> Traffic:
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

    def sample(self, now: float) -> None:
        """Take a sample of every stream's totals at ``now`` (monotonic seconds)."""
        self._samples.append(_Sample(now, {s: self.totals(s) for s in self.traffic}))
        while len(self._samples) > 2 and now - self._samples[1].at >= self.rate_window_seconds:
            self._samples.popleft()

    def rates(self, stream: str | None = None) -> tuple[float, float, float, float]:
        """Events and bytes per second in, then out, of ``stream`` (``None``: every stream),
        between the oldest and the newest sample; zeros until there are two."""
        if len(self._samples) < 2:
            return 0.0, 0.0, 0.0, 0.0
        first, last = self._samples[0], self._samples[-1]
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


def subscription_lag(latest: int, next_id: int) -> int:
    """Committed events a subscription at ``next_id`` has not been handed (never below 0)."""
    return max(0, latest - (next_id - 1))


def per_protocol(protocols: Iterable[str], known: tuple[str, ...]) -> dict[str, int]:
    """How many of each protocol in ``protocols``; every one of ``known`` is a key (0: none)."""
    count = dict.fromkeys(known, 0)
    for protocol in protocols:
        count[protocol] = count.get(protocol, 0) + 1
    return count


class HubCollector:
    """prometheus-client's collector for what :class:`Metrics` reads at scrape time."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        hub, metrics = self.hub, self.hub.metrics
        yield from self._traffic(metrics.traffic)
        yield from self._log(hub)
        conns = GaugeMetricFamily("tidewire_connections", "Open connections, by protocol",
                                  labels=["protocol"])  # fmt: skip
        counts = per_protocol((c.protocol for c in metrics.connections()), CONNECTION_PROTOCOLS)
        for protocol, n in counts.items():
            conns.add_metric([protocol], n)
        yield conns
        refused = CounterMetricFamily("tidewire_connections_refused",
                                      "Connections refused at admission (limits), by listener",
                                      labels=["listener"])  # fmt: skip
        for listener in metrics.listeners:
            refused.add_metric([listener.name], listener.refused)
        yield refused
        yield from self._subscriptions(hub)
        yield from self._tolliver(metrics)

    @staticmethod
    def _traffic(traffic: Mapping[str, Mapping[str, Traffic]]) -> Iterator[Metric]:
        labels = ["stream", "protocol"]
        families = {
            "events_in": CounterMetricFamily("tidewire_events_received",
                                             "Events stored, by stream and protocol",
                                             labels=labels),
            "bytes_in": CounterMetricFamily("tidewire_bytes_received",
                                            "Event bytes stored, by stream and protocol",
                                            labels=labels),
            "events_out": CounterMetricFamily("tidewire_events_sent",
                                              "Events delivered to subscribers, by stream and "
                                              "protocol", labels=labels),
            "bytes_out": CounterMetricFamily("tidewire_bytes_sent",
                                             "Event bytes delivered to subscribers, by stream "
                                             "and protocol", labels=labels),
        }  # fmt: skip
        for stream, by_protocol in list(traffic.items()):
            for protocol, t in list(by_protocol.items()):
                key = [stream, protocol]
                families["events_in"].add_metric(key, t.events_in)
                families["bytes_in"].add_metric(key, t.bytes_in)
                families["events_out"].add_metric(key, t.events_out)
                families["bytes_out"].add_metric(key, t.bytes_out)
        yield from families.values()

    @staticmethod
    def _log(hub: Hub) -> Iterator[Metric]:
        size = GaugeMetricFamily("tidewire_log_size_bytes", "Bytes of the stream's segments",
                                 labels=["stream"])  # fmt: skip
        events = GaugeMetricFamily("tidewire_log_events", "Events the stream's log holds",
                                   labels=["stream"])  # fmt: skip
        latest = GaugeMetricFamily("tidewire_stream_latest_id",
                                   "The stream's latest committed id (0: none)",
                                   labels=["stream"])  # fmt: skip
        for s in hub.streams():
            size.add_metric([s.name], s.bytes)
            events.add_metric([s.name], s.events)
            latest.add_metric([s.name], s.latest_id or 0)
        yield from (size, events, latest)

    @staticmethod
    def _subscriptions(hub: Hub) -> Iterator[Metric]:
        count = GaugeMetricFamily("tidewire_subscriptions", "Live subscriptions, by protocol",
                                  labels=["protocol"])  # fmt: skip
        labels = ["subscription", "protocol", "stream", "connection"]
        demand = GaugeMetricFamily("tidewire_subscription_demand",
                                   "Outstanding demand (2**63-1: unbounded)",
                                   labels=labels)  # fmt: skip
        lag = GaugeMetricFamily("tidewire_subscription_lag_events",
                                "Committed events not yet delivered (latest id minus the last "
                                "id delivered)", labels=labels)  # fmt: skip
        subs = hub.live_subscriptions()
        for sub in subs:
            key = [str(sub.id), sub.via, sub.stream,
                   "" if sub.connection is None else str(sub.connection)]  # fmt: skip
            demand.add_metric(key, sub.demand)
            lag.add_metric(key, subscription_lag(hub.latest(sub.stream), sub.next_id))
        for protocol, n in per_protocol((s.via for s in subs), SUBSCRIPTION_PROTOCOLS).items():
            count.add_metric([protocol], n)
        yield from (count, demand, lag)

    @staticmethod
    def _tolliver(metrics: Metrics) -> Iterator[Metric]:
        _, peers = metrics.tolliver_peers()
        unacked = GaugeMetricFamily("tidewire_tolliver_unacked",
                                    "Reliable messages sent to a Tolliver peer and not acked",
                                    labels=["peer"])  # fmt: skip
        resends = CounterMetricFamily("tidewire_tolliver_resends",
                                      "Reliable messages resent to a Tolliver peer (no ack in "
                                      "time)", labels=["peer"])  # fmt: skip
        for p in peers:
            unacked.add_metric([p.uuid], p.unacked)
            resends.add_metric([p.uuid], p.resends)
        yield from (unacked, resends)
