"""The remotes' offsets the hub keeps (:class:`RemoteOffsets`), pure: rebuilt from the ledger's
records in order, bounded per remote, in total and over time, and remembering a remote only
while it has offsets."""

from __future__ import annotations

import uuid

from tidewire.server.tolliver_offsets import PRUNE_INTERVAL, RemoteOffsets

A, B, C = (uuid.UUID(int=i) for i in (1, 2, 3))


def record(peer: uuid.UUID, channel: str | None = None, **fields: object) -> dict[str, object]:
    out: dict[str, object] = {"remote": str(peer), **fields}
    if channel is not None:
        out["channel"] = channel
    return out


def test_load_replays_offsets_and_drops_in_order() -> None:
    kept = RemoteOffsets(max_per_remote=10, max_total=100, retention=1000)
    stale = kept.load([
        record(A, "x", next=5, at=900.0),
        record(A, "x", next=3, at=901.0),  # (an older offset kept late: the highest wins)
        record(A, "y", next=1, at=902.0),
        record(A, "y", drop=True),
        record(B, "y", next=7, at=903.0),
        record(B, "y", drop=True),
        record(B, "y", next=2, at=904.0),  # (followed again after the drop)
        record(C, at=950.0),  # (seen, no offsets: not remembered)
    ], now=1000.0)  # fmt: skip
    assert stale == []
    assert kept.next == {(A, "x"): 5, (B, "y"): 2}
    assert dict(kept.refs) == {"x": 1, "y": 1}
    assert set(kept.seen) == {A, B}


def test_load_drops_what_is_past_the_retention_or_the_bounds() -> None:
    kept = RemoteOffsets(max_per_remote=2, max_total=3, retention=100)
    stale = kept.load([
        record(A, "old", next=1, at=10.0),  # A last seen at 10: past the retention at 1000
        *(record(B, f"c{i}", next=1, at=990.0) for i in range(3)),  # one over the bound
        *(record(C, f"d{i}", next=1, at=995.0) for i in range(2)),  # 4 in all: one over
    ], now=1000.0)  # fmt: skip
    assert (A, "old") in stale
    assert (B, "c2") in stale
    assert len(kept.next) <= 3
    assert (C, "d0") in kept.next  # (the remote seen last is kept)
    assert A not in kept.seen


def test_a_remote_is_remembered_only_while_it_has_offsets() -> None:
    kept = RemoteOffsets(max_per_remote=10, max_total=100, retention=100)
    kept.seen[A] = 0.0
    kept.add((A, "x"), 1)
    kept.add((A, "y"), 1)
    assert kept.unfollowed(A, {"y"}) == [(A, "x")]
    assert kept.forget((A, "x")) is True  # (no remote follows x any more)
    assert kept.forget((A, "y")) is True
    assert A not in kept.seen
    assert kept.forget((A, "y")) is False


def test_expired_looks_at_most_every_prune_interval_and_spares_the_connected() -> None:
    kept = RemoteOffsets(max_per_remote=10, max_total=100, retention=100)
    for peer in (A, B):
        kept.seen[peer] = 0.0
        kept.add((peer, "x"), 1)
    assert kept.expired(50.0, set()) == []  # (within the retention)
    assert PRUNE_INTERVAL == 60.0
    assert kept.expired(105.0, set()) == []  # (past it, but looked 55 s ago)
    assert kept.expired(115.0, {B}) == [(A, "x")]  # (B is connected: spared)
    assert A not in kept.seen
    assert kept.excess(set()) == []
