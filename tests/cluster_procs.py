"""What the cluster tests share (tests/cluster/): gateways as ``tidewire serve --storage``
processes over a ``LocalCluster``, and which node leads a stream's JetStream group, read from
the nodes' monitoring ports (``/jsz?streams=true``); in process, a body run with several
:class:`JetStreamStorage` gateways (:func:`with_storages`), and stream names no other test of
the session-wide cluster uses (:func:`unique`)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from helpers import run
from hubproc import HubProcess
from tidewire.cluster.jetstream import JetStreamStorage
from tidewire.cluster.local import LocalCluster
from tidewire.cluster.subjects import shard_of, shard_stream
from tidewire.hub import Storage
from tidewire.model import Batch

__all__ = ["caught_up", "gateways", "group_of", "groups", "joined", "leader_of", "unique",
           "with_storages"]

SHARDS = 16  # cluster.shards' default


def group_of(stream: str) -> str:
    return shard_stream(shard_of(stream, SHARDS))


def groups(cluster: LocalCluster, node: int) -> dict[str, dict[str, object]]:
    """Node ``node``'s view of every tidewire group: name -> {leader, last_seq}."""
    jsz: Any = cluster.monitor(cluster.nodes[node], "/jsz?streams=true")
    out: dict[str, dict[str, object]] = {}
    for account in jsz.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if str(detail["name"]).startswith("TW_"):
                out[detail["name"]] = {"leader": (detail.get("cluster") or {}).get("leader"),
                                       "last_seq": detail["state"]["last_seq"]}  # fmt: skip
    return out


def leader_of(cluster: LocalCluster, group: str) -> int:
    """The index of the node leading ``group`` (asked of every running node)."""
    for i, node in enumerate(cluster.nodes):
        if node.pid is None:
            continue
        name = groups(cluster, i).get(group, {}).get("leader")
        if name:
            return next(j for j, n in enumerate(cluster.nodes) if n.name == name)
    raise AssertionError(f"no leader known for {group}")


def caught_up(cluster: LocalCluster, node: int) -> bool:
    """Whether ``node`` holds every group as far as its leader does."""
    mine = groups(cluster, node)
    for name, state in mine.items():
        leader = leader_of(cluster, name)
        if groups(cluster, leader)[name]["last_seq"] != state["last_seq"]:
            return False
    return bool(mine)


def gateways(tmp: Path, cluster: LocalCluster, count: int) -> list[HubProcess]:
    return [HubProcess(tmp / f"g{i}", tmp / f"g{i}.log", "--storage", cluster.storage_url)
            for i in range(count)]  # fmt: skip


def joined(per_gateway: list[dict[str, str]]) -> dict[str, str]:
    """Every endpoint as the comma list of the gateways' URLs (the clients fail over)."""
    return {k: ",".join(u[k] for u in per_gateway) for k in per_gateway[0]}


def unique(what: str) -> str:
    """A stream name no other test uses (the session's cluster is shared)."""
    return f"{what}.{uuid.uuid4().hex[:10]}"


def with_storages(cluster: LocalCluster, count: int, body: Callable[..., Awaitable[None]],
                  seconds: float = 90, **options: Any) -> None:  # fmt: skip
    """Run ``body(*storages)`` with ``count`` gateways (``JetStreamStorage.connect(**options)``)
    over ``cluster``, within ``seconds``; every one closed at the end."""

    async def main() -> None:
        storages = [await JetStreamStorage.connect(cluster.urls, **options) for _ in range(count)]
        try:
            await body(*storages)
        finally:
            for storage in storages:
                await storage.close()

    run(main(), seconds)


async def everything(storage: Storage, stream: str) -> list[Batch]:
    """Every batch of ``stream`` a gateway reads, from its start id on."""
    out: list[Batch] = []
    next_id = storage.start_id(stream)
    while batches := await storage.read(stream, next_id, 1 << 20, 10_000):
        out += batches
        next_id = batches[-1].last_id + 1
    return out
