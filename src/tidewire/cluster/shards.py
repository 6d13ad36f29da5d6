"""The shard streams ``TW_<k>`` that hold every tidewire stream (docs/cluster.md "Layout"):
their configuration, and making them (or checking and upgrading those another gateway, or an
older tidewire, made) when a gateway connects."""

from __future__ import annotations

import json
from typing import Any

from ..model import LogError
from .jsapi import NOT_FOUND, STREAM_NAME_IN_USE, Api, JetStreamError, retrying
from .subjects import shard_stream

__all__ = ["MAX_MSG_SIZE", "STARTING", "ensure_shard", "shard_config"]

MAX_MSG_SIZE = 8 * 1024 * 1024
FIRST_WAIT = 2.0  # seconds for each answer while connecting (a restarted cluster drops some)

STARTING = frozenset({NOT_FOUND})
"""What a shard stream's info may answer at startup, and is waited out: another gateway
starting at the same moment created it (a create of the same configuration succeeds here
too), and until the cluster has made it, "stream not found" (10059)."""


def shard_config(shard: int, replicas: int) -> dict[str, Any]:
    """The JetStream configuration of shard stream ``TW_<shard>``: ``allow_atomic`` for the
    atomic appends (:mod:`.jsatomic`, nats-server 2.12+)."""
    return {
        "name": shard_stream(shard),
        "subjects": [f"tw.{shard}.>"],
        "retention": "limits",
        "storage": "file",
        "num_replicas": replicas,
        "allow_direct": True,
        "allow_atomic": True,
        "max_msg_size": MAX_MSG_SIZE,
        "discard": "old",
        "republish": {"src": f"tw.{shard}.>", "dest": f"twn.{shard}.>", "headers_only": True},
    }


async def ensure_shard(api: Api, shard: int, replicas: int, startup_s: float) -> None:
    """Make ``TW_<shard>``, or check the one there: usable (its subjects, its notifications,
    no limits of its own), and given ``allow_atomic`` if it lacks it (made by a tidewire
    before atomic appends). :class:`~tidewire.model.LogError` when it cannot be used (a
    server older than 2.12 leaves ``allow_atomic`` unset)."""
    name = shard_stream(shard)
    wanted = shard_config(shard, replicas)
    try:
        info = await retrying(
            lambda: api.call(f"$JS.API.STREAM.CREATE.{name}", wanted, FIRST_WAIT), startup_s)
    except JetStreamError as exc:
        if exc.err_code != STREAM_NAME_IN_USE:
            raise
        info = await _existing(api, shard, startup_s)
    if not info.get("config", {}).get("allow_atomic"):
        raise LogError(f"JetStream stream {name} has no atomic batches: tidewire needs "
                       "nats-server 2.12 or later")  # fmt: skip


async def _existing(api: Api, shard: int, startup_s: float) -> dict[str, Any]:
    """The info of ``TW_<shard>`` made by someone else, checked, and upgraded if need be."""
    name = shard_stream(shard)
    info = await retrying(lambda: api.call(f"$JS.API.STREAM.INFO.{name}"), startup_s,
                          also=STARTING)  # fmt: skip
    config = info.get("config", {})
    republish = config.get("republish") or {}
    if (
        f"tw.{shard}.>" not in config.get("subjects", [])
        or republish.get("dest") != f"twn.{shard}.>"
        or config.get("max_age", 0)
        or config.get("max_msgs_per_subject", -1) > 0
    ):
        raise LogError(f"JetStream stream {name} exists with a configuration tidewire "
                       f"cannot use: {json.dumps(config)}")  # fmt: skip
    if config.get("allow_atomic"):
        return info
    upgraded = {**config, "allow_atomic": True}
    return await retrying(lambda: api.call(f"$JS.API.STREAM.UPDATE.{name}", upgraded),
                          startup_s)  # fmt: skip
