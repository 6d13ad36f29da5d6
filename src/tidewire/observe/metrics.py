"""The hub's figures in the Prometheus text format: a collector read at scrape time.

The hub counts (``tidewire.hub.traffic``: per-batch traffic counters and the log's latencies,
as plain data); this module sits above it and only reads. Everything else (connections,
subscriptions with their demand and lag, Tolliver peers, the log's size) is read from the live
objects when ``/metrics`` asks, by :class:`HubCollector`; on a gateway of a cluster (issue 21)
also the cluster as its storage last saw it (:func:`cluster_families`, ``tidewire_cluster_*``).

prometheus-client is the library for the exposition format; the collector is ours because
prometheus-client's labelled counters cost a lock and a label lookup per increment, and because
most figures are states (a subscription's lag) read at scrape time.

Each hub has its own :class:`~prometheus_client.CollectorRegistry` (tests run many hubs in one
process), made at first use by :func:`registry`, which also carries the process collector
(RSS, CPU, open files).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector

from ..hub import Hub
from ..hub.storage import ClusterStatus
from ..hub.traffic import (
    ConnectionView,
    Latency,
    Metrics,
    TolliverPeer,
    Traffic,
    next_subscription_id,
)
from ..registry import PROTOCOLS

__all__ = [
    "CONNECTION_PROTOCOLS",
    "SUBSCRIPTION_PROTOCOLS",
    "ConnectionView",
    "HubCollector",
    "Metrics",
    "TolliverPeer",
    "Traffic",
    "cluster_families",
    "next_subscription_id",
    "per_protocol",
    "registry",
    "subscription_lag",
]

CONNECTION_PROTOCOLS = tuple(p.connection_label for p in PROTOCOLS if p.connection_label)
"""What a connection speaks: its listener's protocol, or ``tube`` once HTTP upgraded (from the
protocol registry, :mod:`tidewire.registry`: rsio, http, tube, tolliver, seguro)."""

SUBSCRIPTION_PROTOCOLS = tuple(p.subscription_label for p in PROTOCOLS if p.subscription_label)
"""Who follows streams: RS.io over TCP, over HTTP (rsio-http), over Tube, and Tolliver's
remotes (from the protocol registry)."""

_registries: weakref.WeakKeyDictionary[Hub, CollectorRegistry] = weakref.WeakKeyDictionary()


def registry(hub: Hub) -> CollectorRegistry:
    """The Prometheus registry of ``hub`` (its :class:`HubCollector` and the process
    collector), made at the first call and the same one after; it lives as long as the hub."""
    found = _registries.get(hub)
    if found is None:
        found = _registries[hub] = CollectorRegistry()
        found.register(HubCollector(hub))
        ProcessCollector(registry=found)
    return found


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
        yield self._latency("tidewire_log_append_seconds",
                            "Time from an append call to its durable commit (queueing, write "
                            "and fsync)", metrics.append_seconds)  # fmt: skip
        yield self._latency("tidewire_log_fsync_seconds", "Time of one group commit's fdatasync",
                            metrics.fsync_seconds)  # fmt: skip
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
        yield from self._budget(hub)
        status = hub.storage.cluster()
        if status is not None:  # (an embedded hub's /metrics is as it was: no cluster_ family)
            yield from cluster_families(status, time.time())

    @staticmethod
    def _budget(hub: Hub) -> Iterator[Metric]:
        budget = hub.budget
        limit = GaugeMetricFamily("tidewire_memory_budget_bytes",
                                  "The memory budget's shares (memory.*), by share",
                                  labels=["share"])  # fmt: skip
        for share, n in (("total", budget.limits.total), ("principal", budget.limits.principal),
                         ("connection", budget.limits.connection)):  # fmt: skip
            limit.add_metric([share], n)
        used = GaugeMetricFamily("tidewire_memory_held_bytes",
                                 "Bytes held for peers, every connection, by what holds them",
                                 labels=["kind"])  # fmt: skip
        kinds: dict[str, int] = {}
        for account in budget:
            for kind, n in account.gauges().items():
                kinds[kind] = kinds.get(kind, 0) + n
        for kind, n in sorted(kinds.items()):
            used.add_metric([kind], n)
        refused = CounterMetricFamily("tidewire_memory_refused",
                                      "Requests for memory the budget refused")  # fmt: skip
        refused.add_metric([], budget.refused)
        yield from (limit, used, refused)
        shares = budget.loop
        busy = GaugeMetricFamily("tidewire_loop_busy",
                                 "The event loop's measured share taken by peers' work, every "
                                 "principal together (hub.fairness)")  # fmt: skip
        busy.add_metric([], shares.busy)
        by_principal = GaugeMetricFamily("tidewire_loop_share",
                                  "The event loop's measured share, by principal (over 0.1 %)",
                                  labels=["principal"])  # fmt: skip
        for principal, fraction in sorted(shares.shares().items()):
            by_principal.add_metric([principal], fraction)
        waits = CounterMetricFamily("tidewire_fair_waits",
                                    "Waits of connections over their principal's fair share "
                                    "of a busy loop")  # fmt: skip
        waits.add_metric([], shares.throttles)
        seconds = CounterMetricFamily("tidewire_fair_wait_seconds",
                                      "Their total length")  # fmt: skip
        seconds.add_metric([], shares.throttled_seconds)
        yield from (busy, by_principal, waits, seconds)

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
    def _latency(name: str, documentation: str, latency: Latency) -> Metric:
        family = HistogramMetricFamily(name, documentation)
        buckets = [("+Inf" if bound == math.inf else repr(bound), float(n))
                   for bound, n in latency.cumulative()]  # fmt: skip
        family.add_metric([], buckets, latency.sum)
        return family

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


def cluster_families(status: ClusterStatus, now: float) -> Iterator[Metric]:
    """The cluster a gateway's storage is replicated on (``tidewire_cluster_*``), as its
    backend last saw it (``status.at_ms``; ``now``: the wall clock, seconds, for the age).

    Groups are JetStream streams (``TW_<k>``), servers are nats-server names; every server
    holding a group has a ``group_leader`` sample (1: it leads, 0: a follower), so a group
    without a leader is all zeros (and counted in ``groups_without_leader``)."""
    servers = GaugeMetricFamily("tidewire_cluster_servers",
                                "Servers of the cluster this gateway knows (gossip)")  # fmt: skip
    servers.add_metric([], len(status.servers))
    age = GaugeMetricFamily("tidewire_cluster_status_age_seconds",
                            "Seconds since the cluster's status below was read")  # fmt: skip
    age.add_metric([], max(0.0, now - status.at_ms / 1000))
    leaderless = GaugeMetricFamily("tidewire_cluster_groups_without_leader",
                                   "Replicated groups electing a leader (none to write to)")
    leaderless.add_metric([], sum(1 for g in status.groups if g.leader is None))
    by_server = ["group", "server"]
    leader = GaugeMetricFamily("tidewire_cluster_group_leader",
                               "1 where the server leads the group, 0 where it follows",
                               labels=by_server)  # fmt: skip
    current = GaugeMetricFamily("tidewire_cluster_replica_current",
                                "1 when the follower has caught up with its leader",
                                labels=by_server)  # fmt: skip
    offline = GaugeMetricFamily("tidewire_cluster_replica_offline",
                                "1 when the follower is offline", labels=by_server)
    lag = GaugeMetricFamily("tidewire_cluster_replica_lag",
                            "Operations the follower is behind its leader", labels=by_server)
    active = GaugeMetricFamily("tidewire_cluster_replica_active_seconds",
                               "Seconds since the leader last heard from the follower",
                               labels=by_server)  # fmt: skip
    messages = GaugeMetricFamily("tidewire_cluster_group_messages",
                                 "Messages (tidewire records) the group holds", labels=["group"])
    size = GaugeMetricFamily("tidewire_cluster_group_bytes", "Bytes the group holds",
                             labels=["group"])  # fmt: skip
    last = GaugeMetricFamily("tidewire_cluster_group_last_seq",
                             "The group's last sequence number", labels=["group"])  # fmt: skip
    for group in status.groups:
        if group.leader is not None:
            leader.add_metric([group.name, group.leader], 1)
        for replica in group.replicas:
            key = [group.name, replica.name]
            leader.add_metric(key, 0)
            current.add_metric(key, int(replica.current))
            offline.add_metric(key, int(replica.offline))
            lag.add_metric(key, replica.lag)
            active.add_metric(key, replica.active_s)
        messages.add_metric([group.name], group.messages)
        size.add_metric([group.name], group.bytes)
        last.add_metric([group.name], group.last_seq)
    yield from (servers, age, leaderless, leader, current, offline, lag, active, messages, size,
                last)
