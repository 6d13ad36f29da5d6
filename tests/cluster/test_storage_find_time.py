"""``Storage.find_time`` (issue 23) against a brute force on every implementation: the
in-memory one (tests/memory_storage.py), the embedded log and JetStream on the shared 3-node
cluster (real nats-server processes); and on JetStream after retention purged records whose
timestamps were the stream's largest (the ``Tw-Sum`` running maximum then overshoots)."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from helpers import run
from memory_storage import MemoryStorage
from tidewire.cluster.local import LocalCluster
from tidewire.hub import EmbeddedStorage, Storage
from tidewire.log import LogConfig, StreamSettings
from tidewire.model import Batch
from tidewire.record import encode

KINDS = ["memory", "embedded", "jetstream"]


def name(what: str) -> str:
    """A stream name no other test uses (the cluster is shared)."""
    return f"{what}.{uuid.uuid4().hex[:10]}"


async def fill(storage: Storage, stream: str, seed: int) -> list[tuple[int, int]]:
    """Random, non-monotonic timestamps in batches of 1 to 9; the (id, timestamp) pairs."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    for _ in range(40):
        stamps = [rng.randrange(0, 300) for _ in range(rng.randrange(1, 10))]
        stored = await storage.append(Batch.build(stream, [b"e" * 30] * len(stamps),
                                                  timestamps=stamps), assign_ids=True)  # fmt: skip
        pairs += zip(stored.ids, stored.timestamps, strict=True)
    return pairs


async def check(storage: Storage, stream: str, pairs: list[tuple[int, int]]) -> None:
    for ms in sorted({t + d for _, t in pairs for d in (-1, 0, 1)}):
        want = next((i for i, t in pairs if t >= ms), None)
        assert await storage.find_time(stream, ms) == want, ms


@pytest.mark.parametrize("kind", KINDS)
def test_find_time_is_the_first_id_at_or_after_the_time(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    stream = name("times")

    async def main() -> None:
        storage: Storage
        if kind == "memory":
            storage = MemoryStorage()
        elif kind == "embedded":
            config = LogConfig(fsync=False, defaults=StreamSettings(segment_bytes=4096,
                                                                    index_interval_bytes=128))
            storage = EmbeddedStorage.open(str(tmp_path), config)
        else:
            from tidewire.cluster.jetstream import JetStreamStorage

            cluster: LocalCluster = request.getfixturevalue("cluster")
            storage = await JetStreamStorage.connect(cluster.urls)
        try:
            pairs = await fill(storage, stream, seed=23)
            await check(storage, stream, pairs)
            assert await storage.find_time(name("absent"), 0) is None
        finally:
            await storage.close()

    run(main(), 120)


def test_find_time_on_jetstream_after_retention_purged_the_newest_timestamps(
    cluster: LocalCluster,
) -> None:
    from tidewire.cluster.jetstream import JetStreamStorage

    stream = name("purged")
    stamps = [50_000, 10, 20, 40_000, 30]  # one event per record, all of one size
    size = encode(Batch.build(stream, [b"x"], timestamps=[0])).length
    config = LogConfig(streams={stream: StreamSettings(retention_bytes=3 * size)})  # 3 records

    async def main() -> None:
        storage = await JetStreamStorage.connect(cluster.urls, config=config)
        try:
            for ts in stamps:
                await storage.append(Batch.build(stream, [b"x"], timestamps=[ts]),
                                     assign_ids=True)  # fmt: skip
            assert await storage.retention_pass(now=0) == 2
            assert storage.start_id(stream) == 3
            # Every retained record's running maximum is 50 000 (id 1's): the bisection
            # lands on the first retained record, and the lookup scans on to the record
            # that really holds a timestamp that new.
            await check(storage, stream, [(3, 20), (4, 40_000), (5, 30)])
            assert await storage.find_time(stream, 40_001) is None
        finally:
            await storage.close()

    run(main(), 120)
