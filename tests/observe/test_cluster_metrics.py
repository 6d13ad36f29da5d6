"""What a gateway shows of its cluster (issue 21), over HTTP from the hub's guarded listener on
127.0.0.1: the ``tidewire_cluster_*`` families of ``/metrics`` (parsed with prometheus-client's
own parser), ``/api/cluster`` and ``/api/stats``' ``cluster``, from a hub whose storage reports
a fixed :class:`ClusterStatus` (tests/clustered_storage.py: a real Storage, in memory). An
embedded hub shows none of it: no family, ``null``, no key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from clustered_storage import STATUS, URLS, ClusteredStorage
from helpers import run
from tidewire.hub import Hub
from tidewire.hub.storage import Storage
from tidewire.log import LogConfig
from tidewire.observe.metrics import cluster_families
from tidewire.server.admin import cluster
from tidewire.server.app import build_app, start_http_site
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.rsio_http import HttpSettings

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@asynccontextmanager
async def served(storage: Storage | None, data_dir: Path) -> AsyncIterator[str]:
    """The admin side of a hub on ``storage`` (``None``: the embedded log in ``data_dir``),
    at the URL yielded."""
    hub = Hub(storage) if storage is not None else Hub.open(str(data_dir), LogConfig(fsync=False))
    settings = HttpSettings()
    runner = web.AppRunner(build_app(hub, settings), handle_signals=False, access_log=None)
    await runner.setup()
    port = await start_http_site(runner, "127.0.0.1", 0, admission=Admission(ConnectionLimits()),
                                 tls=None, settings=settings)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await hub.close()


async def fetch(base: str) -> tuple[Samples, Any, Any]:
    """``/metrics``' cluster samples, ``/api/cluster`` and ``/api/stats``."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/metrics") as answer:
            assert answer.status == 200
            text = await answer.text()
        async with http.get(f"{base}/api/cluster") as answer:
            assert answer.status == 200
            api = await answer.json()
        async with http.get(f"{base}/api/stats") as answer:
            stats = await answer.json()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("tidewire_cluster_"):
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, api, stats


def at(group: str, server: str) -> tuple[tuple[str, str], ...]:
    return (("group", group), ("server", server))


def test_metrics_and_the_api_show_the_cluster(tmp_path: Path) -> None:
    async def main() -> tuple[Samples, Any, Any]:
        async with served(ClusteredStorage(), tmp_path) as base:
            return await fetch(base)

    samples, api, stats = run(main())
    assert samples[("tidewire_cluster_servers", ())] == 3
    assert samples[("tidewire_cluster_groups_without_leader", ())] == 1
    assert samples[("tidewire_cluster_status_age_seconds", ())] > 0
    leaders = {k[1]: v for k, v in samples.items() if k[0] == "tidewire_cluster_group_leader"}
    assert leaders == {at("TW_0", "n1"): 1, at("TW_0", "n2"): 0, at("TW_0", "n3"): 0,
                       at("TW_1", "n1"): 0, at("TW_1", "n3"): 0}  # fmt: skip
    assert samples[("tidewire_cluster_replica_current", at("TW_0", "n2"))] == 1
    assert samples[("tidewire_cluster_replica_current", at("TW_0", "n3"))] == 0
    assert samples[("tidewire_cluster_replica_lag", at("TW_0", "n3"))] == 7
    assert samples[("tidewire_cluster_replica_lag", at("TW_0", "n2"))] == 0
    assert samples[("tidewire_cluster_replica_offline", at("TW_1", "n1"))] == 1
    assert samples[("tidewire_cluster_replica_active_seconds", at("TW_1", "n1"))] == 30.0
    assert samples[("tidewire_cluster_group_messages", (("group", "TW_0"),))] == 12
    assert samples[("tidewire_cluster_group_bytes", (("group", "TW_0"),))] == 4096
    assert samples[("tidewire_cluster_group_last_seq", (("group", "TW_1"),))] == 0
    # (the leader of TW_0 is no follower: it has no replica sample)
    assert ("tidewire_cluster_replica_lag", at("TW_0", "n1")) not in samples

    assert api["name"] == "tidewire"
    assert api["connected"] == URLS[0]
    assert api["servers"] == list(URLS)
    assert api["at_ms"] == STATUS.at_ms
    assert api["nodes"] == [
        {"name": "n1", "leads": 1, "current": 0, "behind": 0, "offline": 1},
        {"name": "n2", "leads": 0, "current": 1, "behind": 0, "offline": 0},
        {"name": "n3", "leads": 0, "current": 1, "behind": 1, "offline": 0},
    ]
    assert api["groups"][0] == {
        "name": "TW_0", "leader": "n1", "messages": 12, "bytes": 4096, "first_seq": 1,
        "last_seq": 12, "replicas": [
            {"name": "n2", "current": True, "offline": False, "lag": 0, "active_seconds": 0.2},
            {"name": "n3", "current": False, "offline": False, "lag": 7, "active_seconds": 1.5},
        ],
    }  # fmt: skip
    assert api["groups"][1]["leader"] is None
    stats["cluster"].pop("age_seconds")
    api.pop("age_seconds")
    assert stats["cluster"] == api  # (what the dashboard polls)
    assert stats["overview"]["data_dir"] == ClusteredStorage().describe()


def test_an_embedded_hub_or_a_status_not_seen_yet_shows_no_cluster(tmp_path: Path) -> None:
    for storage in (None, ClusteredStorage(status=None)):
        async def main(storage: Storage | None = storage) -> tuple[Samples, Any, Any]:
            async with served(storage, tmp_path / "data") as base:
                return await fetch(base)

        samples, api, stats = run(main())
        assert samples == {}
        assert api is None
        assert "cluster" not in stats


def test_the_status_age_is_read_against_the_clock_given() -> None:
    families = {f.name: f for f in cluster_families(STATUS, STATUS.at_ms / 1000 + 2.5)}
    assert families["tidewire_cluster_status_age_seconds"].samples[0].value == 2.5
    shown = cluster(Hub(ClusteredStorage()), now=STATUS.at_ms / 1000 + 2.5)
    assert shown is not None
    assert shown["age_seconds"] == 2.5
