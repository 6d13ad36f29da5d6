"""The cluster as a gateway sees it (:class:`~tidewire.hub.storage.ClusterStatus`), built from
``$JS.API.STREAM.INFO`` answers: pure functions of their JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..hub.storage import ClusterStatus, GroupStatus, ReplicaStatus

__all__ = ["cluster_status", "group_status"]


def group_status(info: Mapping[str, Any]) -> GroupStatus:
    """One shard stream's leader, followers and content from its stream info."""
    config, state = info.get("config", {}), info.get("state", {})
    cluster = info.get("cluster", {})
    replicas = tuple(
        ReplicaStatus(str(r.get("name", "?")), bool(r.get("current", False)),
                      bool(r.get("offline", False)), int(r.get("lag", 0)),
                      int(r.get("active", 0)) / 1e9)
        for r in cluster.get("replicas", ()) or ()
    )  # fmt: skip
    return GroupStatus(str(config.get("name", "?")), cluster.get("leader") or None, replicas,
                       int(state.get("messages", 0)), int(state.get("bytes", 0)),
                       int(state.get("first_seq", 0)), int(state.get("last_seq", 0)))  # fmt: skip


def cluster_status(
    infos: Sequence[Mapping[str, Any]], connected: str, servers: Sequence[str], at_ms: int
) -> ClusterStatus:
    """The whole picture from every shard's stream info (those that answered)."""
    name = next((str(i["cluster"]["name"]) for i in infos if i.get("cluster", {}).get("name")),
                "")  # fmt: skip
    return ClusterStatus(name, connected, tuple(servers), tuple(group_status(i) for i in infos),
                         at_ms)  # fmt: skip
