"""The operators' side of the HTTP app: ``/metrics`` (Prometheus), the JSON admin API
(``/api/...``, docs/observability.md), the dashboard page at ``/`` and the stream page at
``/stream?name=<stream>`` (a message browser: it reads over RS.io on Tube, so it needs
``read`` on the stream, not ``monitor``). The writes (``POST /api/streams``, ``PATCH`` and
``DELETE /api/streams/<name>``: create, re-configure, delete) are :mod:`.admin_streams`'s,
for principals granted ``admin`` on the stream. ``/api/history`` is the dashboard's charts: the last
``dashboard.history_seconds`` of once-a-second points (:mod:`tidewire.hub.history`). On a
gateway of a cluster (``storage.url``), ``/api/cluster`` and ``/api/stats``' ``cluster`` show
the cluster as the storage last saw it (:meth:`~tidewire.hub.Hub.cluster_status`); on an
embedded hub ``/api/cluster`` is ``null`` and ``/api/stats`` has no ``cluster``.

Every figure is read from the hub when asked (:mod:`tidewire.observe.metrics`): the API costs
nothing while nobody looks. With an ACL, ``/metrics`` and ``/api`` need a principal granted
``monitor``; the dashboard page itself is open (code, not data).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import __version__
from ..config import ServerConfig
from ..hub import Hub
from ..hub.history import HistoryLimits
from ..hub.hub import RESERVED_PREFIX
from ..hub.subscription import MAX_DEMAND
from ..observe.metrics import (
    CONNECTION_PROTOCOLS,
    SUBSCRIPTION_PROTOCOLS,
    per_protocol,
    registry,
    subscription_lag,
)
from .admin_streams import add_stream_admin_routes

__all__ = [
    "LagReader",
    "add_admin_routes",
    "cluster",
    "connections",
    "history",
    "history_limits",
    "max_lags",
    "overview",
    "stats",
    "streams",
    "subscriptions",
    "tolliver",
]

Json = dict[str, Any]


def overview(hub: Hub) -> Json:
    """The hub at a glance (``GET /api/overview``)."""
    metrics = hub.metrics
    ei = bi = eo = bo = 0
    for stream in list(metrics.traffic):
        t = metrics.totals(stream)
        ei, bi, eo, bo = ei + t[0], bi + t[1], eo + t[2], bo + t[3]
    rates = metrics.rates()
    conns = per_protocol((c.protocol for c in metrics.connections()), CONNECTION_PROTOCOLS)
    subs = per_protocol((s.via for s in hub.live_subscriptions()), SUBSCRIPTION_PROTOCOLS)
    return {
        "version": __version__,
        "started_at": int(metrics.started_at * 1000),
        "uptime_seconds": round(time.time() - metrics.started_at, 3),
        "data_dir": hub.describe(),  # (the storage: in cluster mode, the cluster's URLs)
        "streams": sum(1 for s in hub.stream_names() if not s.startswith(RESERVED_PREFIX)),
        "events_in": ei, "bytes_in": bi, "events_out": eo, "bytes_out": bo,
        "events_in_rate": rates[0], "bytes_in_rate": rates[1],
        "events_out_rate": rates[2], "bytes_out_rate": rates[3],
        "connections": conns,
        "subscriptions": subs,
        "staged_bytes": hub.txns.staged_bytes(),
    }  # fmt: skip


def streams(hub: Hub, *, internal: bool = False) -> list[Json]:
    """Per stream (``GET /api/streams``); the hub's own (``_tidewire.*``) with ``internal``."""
    metrics = hub.metrics
    out = []
    for s in sorted(hub.streams(), key=lambda s: s.name):
        if s.name.startswith(RESERVED_PREFIX) and not internal:
            continue
        ei, bi, eo, bo = metrics.totals(s.name)
        rate = metrics.rates(s.name)
        out.append({
            "name": s.name, "events": s.events, "first_id": s.first_id,
            "latest_id": s.latest_id, "bytes": s.bytes, "segments": s.segments,
            "events_in": ei, "bytes_in": bi, "events_out": eo, "bytes_out": bo,
            "events_in_rate": rate[0], "bytes_in_rate": rate[1],
            "events_out_rate": rate[2], "bytes_out_rate": rate[3],
            "protocols": {p: t.as_dict()
                          for p, t in sorted(metrics.traffic.get(s.name, {}).items())},
            "retention": _retention(hub, s.name),
        })  # fmt: skip
    return out


def _retention(hub: Hub, stream: str) -> Json | None:
    """The retention that applies to ``stream``: ``ms``, ``bytes`` (``null``: no bound) and
    ``source`` (``runtime``: set by the admin API, ``config``: the stream's own table of the
    configuration, ``default``: ``[log]``'s); ``null`` for a storage without stream
    administration."""
    r = hub.retention(stream)
    return None if r is None else {"ms": r.ms, "bytes": r.bytes, "source": r.source}


def connections(hub: Hub) -> list[Json]:
    """The open connections (``GET /api/connections``), by id."""
    return [{"id": c.serial, "protocol": c.protocol, "peer": c.peer, "principal": c.principal,
             "opened_at": int(c.opened_at * 1000), "bytes_in": c.bytes_in,
             "bytes_out": c.bytes_out, "tls": c.secure}
            for c in sorted(hub.metrics.connections(), key=lambda c: c.serial)]  # fmt: skip


def subscriptions(hub: Hub) -> list[Json]:
    """The live subscriptions (``GET /api/subscriptions``), oldest first."""
    out = []
    for s in hub.live_subscriptions():
        latest = hub.latest(s.stream)
        out.append({"id": s.id, "protocol": s.via, "stream": s.stream,
                    "connection": s.connection, "next_id": s.next_id, "latest_id": latest,
                    "delivered": s.delivered, "demand": s.demand,
                    "unbounded": s.demand >= MAX_DEMAND,
                    "lag": subscription_lag(latest, s.next_id)})  # fmt: skip
    return out


def tolliver(hub: Hub) -> Json:
    """The hub's Tolliver instance and its peers (``GET /api/tolliver``)."""
    instance, peers = hub.metrics.tolliver_peers()
    return {"instance": instance,
            "peers": [{"uuid": p.uuid, "address": p.address, "connected": p.connected,
                       "channels": list(p.channels), "unacked": p.unacked,
                       "resends": p.resends} for p in peers]}  # fmt: skip


def cluster(hub: Hub, now: float | None = None) -> Json | None:
    """The cluster the hub's storage is replicated on (``GET /api/cluster``), as the storage
    last saw it (``at_ms``; ``age_seconds`` before ``now``, the wall clock in seconds);
    ``None`` (JSON ``null``) on an embedded hub. ``servers`` are client URLs, a group's
    ``leader`` and replicas' ``name`` server names; ``nodes`` sums the groups up by server."""
    status = hub.cluster_status()
    if status is None:
        return None
    now = time.time() if now is None else now
    nodes: dict[str, Json] = {}

    def node(name: str) -> Json:
        return nodes.setdefault(name, {"name": name, "leads": 0, "current": 0, "behind": 0,
                                       "offline": 0})  # fmt: skip

    groups = []
    for g in status.groups:
        if g.leader is not None:
            node(g.leader)["leads"] += 1
        for r in g.replicas:
            node(r.name)["offline" if r.offline else "current" if r.current else "behind"] += 1
        replicas = [{"name": r.name, "current": r.current, "offline": r.offline, "lag": r.lag,
                     "active_seconds": r.active_s} for r in g.replicas]  # fmt: skip
        groups.append({"name": g.name, "leader": g.leader, "messages": g.messages,
                       "bytes": g.bytes, "first_seq": g.first_seq, "last_seq": g.last_seq,
                       "replicas": replicas})  # fmt: skip
    return {"name": status.name, "connected": status.connected, "servers": list(status.servers),
            "at_ms": status.at_ms, "age_seconds": round(max(0.0, now - status.at_ms / 1000), 3),
            "nodes": [nodes[name] for name in sorted(nodes)], "groups": groups}  # fmt: skip


def stats(hub: Hub, *, internal: bool = False) -> Json:
    """Everything (``GET /api/stats``: what the dashboard polls); with ``cluster`` only on a
    gateway of a cluster (an embedded hub's answer is as it was before cluster mode)."""
    out = {"overview": overview(hub), "streams": streams(hub, internal=internal),
           "connections": connections(hub), "subscriptions": subscriptions(hub),
           "tolliver": tolliver(hub)}  # fmt: skip
    status = cluster(hub)
    if status is not None:
        out["cluster"] = status
    return out


def max_lags(hub: Hub) -> dict[str, int]:
    """Each stream's largest subscription lag now (streams without a live subscription are
    absent): what :attr:`~tidewire.hub.traffic.Metrics.lags` gives the history."""
    latest: dict[str, int] = {}
    out: dict[str, int] = {}
    for s in hub.live_subscriptions():
        top = latest.get(s.stream)
        if top is None:
            top = latest[s.stream] = hub.latest(s.stream)
        lag = subscription_lag(top, s.next_id)
        if lag > out.get(s.stream, -1):
            out[s.stream] = lag
    return out


class LagReader:
    """:func:`max_lags` for the history's once-a-second samples, at most ``share`` of the
    time: reading every live subscription costs O(subscriptions) on the event loop (about
    2 ms per 1,000 here), so after a read that took ``t`` seconds the next comes no sooner
    than ``t / share`` later, the points between repeating the last figures. A hub with few
    subscriptions is read every second; one with 50,000 (100 ms) every 10 s at the default
    1 %. ``clock``: seconds, for the cost (tests give their own)."""

    def __init__(self, hub: Hub, share: float = 0.01,
                 clock: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        self.hub = hub
        self.share = share
        self.clock = clock
        self.reads = 0
        self._next_at = float("-inf")
        self._last: dict[str, int] = {}

    def __call__(self) -> dict[str, int]:
        start = self.clock()
        if start < self._next_at:
            return self._last
        self._last = max_lags(self.hub)
        self.reads += 1
        self._next_at = start + (self.clock() - start) / self.share
        return self._last


def history(hub: Hub, since: str | None = None) -> Json:
    """The dashboard's charts (``GET /api/history[?since=<ms>]``): the points after ``since``
    (wall-clock ms, the last ``time`` the caller has), as columns (docs/observability.md)."""
    since_ms = None
    if since is not None:
        try:
            since_ms = int(since)
        except ValueError:
            raise web.HTTPBadRequest(text=f"since must be an integer (ms), not {since[:40]!r}\n",
                                     headers={"Cache-Control": "no-store"}) from None  # fmt: skip
    return hub.metrics.history.as_json(since_ms)


def history_limits(config: ServerConfig) -> HistoryLimits:
    """The history's bounds from the ``dashboard.*`` settings."""
    v = config.values
    return HistoryLimits(seconds=int(v["dashboard.history_seconds"]),
                         streams=int(v["dashboard.history_streams"]))  # fmt: skip


def add_admin_routes(app: web.Application, hub: Hub, pages: Mapping[str, bytes]) -> None:
    """Mount ``/metrics``, ``/api/...`` and, when ``pages`` (the files of ``web/`` by name)
    has them, the dashboard at ``/`` and the stream page at ``/stream``. From now on the
    hub's history has each stream's subscription lag (:class:`LagReader`)."""
    from .app import ACCESS_KEY  # (app imports this module)
    from .rsio_http import principal

    def monitor(request: web.Request) -> None:
        request.app[ACCESS_KEY].check_monitor(principal(request))  # Forbidden: 401/403

    def internal(request: web.Request) -> bool:
        return request.query.get("internal") in ("1", "true")

    async def metrics(request: web.Request) -> web.Response:
        monitor(request)
        body = generate_latest(registry(hub))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def api(build: Any) -> Any:
        async def handler(request: web.Request) -> web.Response:
            monitor(request)
            return web.json_response(build(request), headers={"Cache-Control": "no-store"})

        return handler

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/overview", api(lambda r: overview(hub)))
    app.router.add_get("/api/streams", api(lambda r: streams(hub, internal=internal(r))))
    app.router.add_get("/api/connections", api(lambda r: connections(hub)))
    app.router.add_get("/api/subscriptions", api(lambda r: subscriptions(hub)))
    app.router.add_get("/api/tolliver", api(lambda r: tolliver(hub)))
    app.router.add_get("/api/cluster", api(lambda r: cluster(hub)))
    app.router.add_get("/api/stats", api(lambda r: stats(hub, internal=internal(r))))
    app.router.add_get("/api/history", api(lambda r: history(hub, r.query.get("since"))))
    add_stream_admin_routes(app, hub, app[ACCESS_KEY])  # (POST, PATCH, DELETE: admin)
    hub.metrics.lags = LagReader(hub)
    for path, name in (("/", "dashboard.html"), ("/stream", "stream.html")):
        if name in pages:
            app.router.add_get(path, _page(pages[name]))


def _page(body: bytes) -> Any:
    async def page(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/html", charset="utf-8")

    return page
