"""Lost notifications, found from the shards' state (docs/cluster.md "Live tail and the cheap
queries").

Every gateway learns of stored records from the shards' republished headers (``twn.>``):
core NATS, at most once. A notification can be lost where nothing says so: a subscription
whose interest had not yet reached the server of a shard's leader when it republished, a
message dropped on a route. A waiter (a live subscription) on that stream would then wait
until the stream's next record. The storage's status pass (every ``status_interval_s``) asks
every shard's ``STREAM.INFO`` anyway; :class:`Notices` compares each shard's last sequence
with the last one heard of it: a shard whose last message is older than
:data:`SETTLE_S` and was never heard of is *suspect*, and the storage reads again the heads
of the streams of that shard someone waits on (one direct get each). Only then: a busy shard
(its last message newer than that) or a quiet one fully heard costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

__all__ = ["SETTLE_S", "Notices"]

SETTLE_S = 1.0
"""How old a shard's last message must be for a notification of it still missing to count
as lost rather than on its way."""

_FRACTION = re.compile(r"(\.\d{6})\d+")


def _seconds(timestamp: str) -> float | None:
    """An RFC 3339 time as JetStream writes it (nanoseconds, ``Z``): seconds since the epoch."""
    try:
        return datetime.fromisoformat(_FRACTION.sub(r"\1", timestamp.replace("Z", "+00:00"))
                                      ).timestamp()  # fmt: skip
    except ValueError:
        return None


class Notices:
    """The last sequence heard of per shard stream (``TW_<k>``)."""

    def __init__(self) -> None:
        self.heard: dict[str, int] = {}

    def hear(self, headers: Mapping[str, str]) -> None:
        """A notification's headers (``Nats-Stream``, ``Nats-Sequence``: republish adds them)."""
        shard, seq = headers.get("Nats-Stream"), headers.get("Nats-Sequence", "")
        if shard and seq.isdigit() and int(seq) > self.heard.get(shard, 0):
            self.heard[shard] = int(seq)

    def suspects(self, infos: Sequence[Mapping[str, Any]], now_s: float) -> list[str]:
        """The shards (of these ``STREAM.INFO`` answers) whose last message, stored more than
        :data:`SETTLE_S` before ``now_s``, was never heard of; each is then taken as heard."""
        out = []
        for info in infos:
            name = str(info.get("config", {}).get("name", ""))
            state = info.get("state", {})
            last = int(state.get("last_seq", 0))
            stored = _seconds(str(state.get("last_ts", "")))
            if last > self.heard.get(name, 0) and stored is not None and stored < now_s - SETTLE_S:
                self.heard[name] = last
                out.append(name)
        return out
