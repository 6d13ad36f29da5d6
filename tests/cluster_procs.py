"""What the cluster tests share (tests/cluster/): gateways as ``tidewire serve --storage``
processes over a ``LocalCluster``, and which node leads a stream's JetStream group, read from
the nodes' monitoring ports (``/jsz?streams=true``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hubproc import HubProcess
from tidewire.cluster.local import LocalCluster
from tidewire.cluster.subjects import shard_of, shard_stream

__all__ = ["caught_up", "gateways", "group_of", "groups", "joined", "leader_of"]

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
