"""The remotes' offsets the hub's Tolliver instance keeps (``_tidewire.tolliver``), bounded.

A remote's offset on a channel says where its next connection resumes the channel's stream. One
is kept per (remote, channel) the remote follows, and they decide the hub's own subscription
list (a channel is listed while some remote has an offset on it). So that no remote can grow
that list, or the ledger, without bound (issue 20):

* a remote's offsets are those of the channels it follows now (at most
  ``tolliver.max_subscriptions``): one it stops following is forgotten;
* a remote away for longer than ``tolliver.remote_retention_seconds`` is forgotten, and so,
  past ``max_total`` offsets, are the remotes away the longest (a connected remote's never);
* records: ``{"remote", "channel", "next", "at"}`` an offset, ``{"remote", "channel",
  "drop": true}`` one forgotten, ``{"remote", "at"}`` a remote last seen (``at``: seconds
  since the epoch, so that retention holds across restarts).

Plain data, no I/O and no clock of its own: ``now`` is an argument; the server records what
this says and tells the remotes.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from typing import Any

__all__ = ["PRUNE_INTERVAL", "RemoteOffsets"]

PRUNE_INTERVAL = 60.0  # seconds between looks for remotes gone past their retention

Key = tuple[uuid.UUID, str]


class RemoteOffsets:
    """Offsets by (remote, channel) (:attr:`next`), the remotes following each channel, and
    when each remote was last seen."""

    def __init__(self, max_per_remote: int, max_total: int, retention: float) -> None:
        self.max_per_remote = max_per_remote
        self.max_total = max_total
        self.retention = retention
        self.next: dict[Key, int] = {}  # (remote, channel) -> the next event id it gets
        self.refs: Counter[str] = Counter()  # channel -> remotes with an offset on it
        self.by_remote: dict[uuid.UUID, set[str]] = {}
        # remote -> last seen (``now``'s time base), for the remotes with offsets only (so
        # that remotes passing by, each with a new UUID, leave nothing behind)
        self.seen: dict[uuid.UUID, float] = {}
        self._pruned_at = float("-inf")

    def load(self, records: Iterable[Mapping[str, Any]], now: float) -> list[Key]:
        """Rebuild from the ledger's records (those naming a ``"remote"``); the offsets
        dropped for being past the retention or the bounds (the caller records them as
        dropped, else a later record of the remote would bring them back)."""
        offsets: dict[Key, int] = {}
        for record in records:
            peer = uuid.UUID(record["remote"])
            at = float(record.get("at", now))  # (records before issue 20 have none)
            self.seen[peer] = max(self.seen.get(peer, at), at)
            if "channel" not in record:
                continue
            key = (peer, str(record["channel"]))
            if record.get("drop"):
                offsets.pop(key, None)
            else:
                offsets[key] = max(offsets.get(key, 0), int(record["next"]))
        stale = []
        cutoff = now - self.retention
        per_remote: Counter[uuid.UUID] = Counter()
        for key, next_id in sorted(offsets.items()):
            per_remote[key[0]] += 1
            if self.seen[key[0]] < cutoff or per_remote[key[0]] > self.max_per_remote:
                stale.append(key)
            else:
                self.add(key, next_id)
        for key in self.excess(()):
            self.forget(key)
            stale.append(key)
        self.seen = {peer: at for peer, at in self.seen.items() if peer in self.by_remote}
        return stale

    def add(self, key: Key, next_id: int) -> None:
        """Keep ``key``'s offset (a new one, or moved)."""
        if key not in self.next:
            self.refs[key[1]] += 1
            self.by_remote.setdefault(key[0], set()).add(key[1])
        self.next[key] = next_id

    def forget(self, key: Key) -> bool:
        """Forget ``key``'s offset; whether its channel is now followed by no remote."""
        if self.next.pop(key, None) is None:
            return False
        peer, channel = key
        channels = self.by_remote.get(peer)
        if channels is not None:
            channels.discard(channel)
            if not channels:  # (a remote is remembered only while it has offsets)
                del self.by_remote[peer]
                self.seen.pop(peer, None)
        self.refs[channel] -= 1
        if self.refs[channel] > 0:
            return False
        del self.refs[channel]
        return True

    def unfollowed(self, peer: uuid.UUID, channels: Container[str]) -> list[Key]:
        """``peer``'s offsets on channels other than ``channels`` (those it follows now)."""
        return [(peer, c) for c in sorted(self.by_remote.get(peer, ())) if c not in channels]

    def expired(self, now: float, connected: Container[uuid.UUID]) -> list[Key]:
        """The offsets of remotes not ``connected`` and last seen more than ``retention``
        ago (looked for at most every ``PRUNE_INTERVAL``); they are no longer remembered as
        seen (the caller forgets the offsets)."""
        if now - self._pruned_at < PRUNE_INTERVAL:
            return []
        self._pruned_at = now
        cutoff = now - self.retention
        out = []
        for peer, at in list(self.seen.items()):
            if at < cutoff and peer not in connected:
                out += [(peer, c) for c in sorted(self.by_remote.get(peer, ()))]
                del self.seen[peer]
        return out

    def excess(self, connected: Container[uuid.UUID]) -> list[Key]:
        """Past ``max_total`` offsets: those of the remotes away the longest, enough to come
        back within it (never a ``connected`` remote's)."""
        over = len(self.next) - self.max_total
        if over <= 0:
            return []
        away = sorted((self.seen.get(p, 0.0), str(p), p) for p in self.by_remote
                      if p not in connected)  # fmt: skip
        out: list[Key] = []
        for _, _, peer in away:
            if over <= 0:
                break
            keys = [(peer, c) for c in sorted(self.by_remote[peer])]
            out += keys
            over -= len(keys)
        return out
