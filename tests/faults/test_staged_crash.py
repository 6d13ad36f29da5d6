"""Staged commits after a crash: the states a hub killed between the intent and the ``done``
leaves behind, built with the real log (no mocks), then the hub reopened and the commit
replayed (as Spark replays a micro-batch); and a real SIGKILL of a ``tidewire serve`` child
while staged transactions are committed, every one of them then replayed.

Either way each transaction's rows must be stored exactly once, at the ids its first commit
got (when it was acknowledged), and its staged parts dropped once it is done.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from helpers import run, stream_values, until
from hubproc import HubProcess
from tidewire.client.rsio import RsioError, connect
from tidewire.client.rsio_staging import commit_parts, stage_part
from tidewire.hub import Hub
from tidewire.hub.staging import STAGING_DIR, Staging
from tidewire.hub.txn import fingerprint
from tidewire.model import Batch
from tidewire.protocols.rsio.staged import StagedPart
from tidewire.record import encode, merge

SEED = int(os.environ.get("TIDEWIRE_FAULTS_SEED", "20261126"))


def part_rows(txn: str, part: int, n: int = 4) -> Batch:
    return Batch.build("s", [f"{txn}/{part}/{i}".encode() for i in range(n)])


def stage_by_hand(hub: Hub, txn: str, parts: int) -> tuple[list[StagedPart], Batch]:
    """Parts staged as a ``stage=`` offer leaves them; their rows as the commit merges them."""
    staging = hub.txns.staging
    assert isinstance(staging, Staging)
    named, batches = [], []
    for p in range(parts):
        batch = part_rows(txn, p)
        writer = staging.writer("anonymous", "s", txn, f"{p}.0")
        writer.add(bytes(encode(batch.with_ids(1)).data))
        info = writer.finish()
        named.append(StagedPart(info.part, info.count, info.nbytes, info.fp))
        batches.append(batch)
    return named, merge([(b, None) for b in batches])


@pytest.mark.parametrize("landed", [False, True])
def test_replay_after_a_crash_between_intent_and_done(tmp_path: Path, landed: bool) -> None:
    """The intent is recorded (and with ``landed`` the data appended at its ids), no
    ``done``: reopened, the replayed commit completes it at the intent's ids (or finds it
    stored) and appends nothing twice; the parts are dropped."""

    async def crash() -> list[StagedPart]:
        hub = Hub.open(str(tmp_path))
        await hub.storage.append(Batch.build("s", [b"before"]), assign_ids=True)
        named, batch = stage_by_hand(hub, "T", 3)
        intent = {"txn": "T", "stream": "s", "principal": "anonymous", "first": 2,
                  "count": len(batch), "fp": fingerprint(batch)}  # fmt: skip
        await hub.txns.ledger.record(intent)
        if landed:
            await hub.storage.append(batch.with_ids(2))
        await hub.close()  # (what a SIGKILL after those fsyncs leaves: nothing more)
        return named

    async def replay(named: list[StagedPart]) -> None:
        hub = Hub.open(str(tmp_path))
        try:
            receipt = await hub.txns.commit_staged("T", "s", named)
            assert (receipt.first_id, receipt.last_id, receipt.already) == (2, 13, landed)
            again = await hub.txns.commit_staged("T", "s", named)
            assert (again.first_id, again.already) == (2, True)
            values = await stream_values(hub)
            assert values[0] == b"before"
            assert values[1:] == [f"T/{p}/{i}".encode() for p in range(3) for i in range(4)]
            assert os.listdir(tmp_path / STAGING_DIR) == []
        finally:
            await hub.close()

    named = run(crash())
    run(replay(named))


async def _commit_all(url: str, txns: list[str], acked: dict[str, tuple[int, int]]) -> None:
    """Stage (two parts) and commit each transaction in turn, noting acknowledged ids."""
    async with connect(url) as c:
        for txn in txns:
            parts = [await stage_part(c, "s", txn, f"{p}.0", [part_rows(txn, p, 50)])
                     for p in range(2)]  # fmt: skip
            receipt = await commit_parts(c, "s", txn, parts)
            assert receipt is not None
            acked[txn] = (receipt.first_id, receipt.last_id)


async def _replay(url: str, txn: str) -> tuple[int, int]:
    """Spark's replay: commit the parts; if they are gone (never staged, or dropped by a
    commit that finished), stage them again first."""
    async with connect(url) as c:
        parts = [StagedPart(f"{p}.0", 50, 0, 0) for p in range(2)]
        try:
            receipt = await commit_parts(c, "s", txn, parts)
        except RsioError as exc:
            if "not staged" not in str(exc) and "fingerprint" not in str(exc):
                raise
            parts = [await stage_part(c, "s", txn, f"{p}.0", [part_rows(txn, p, 50)])
                     for p in range(2)]  # fmt: skip
            receipt = await commit_parts(c, "s", txn, parts)
        assert receipt is not None
        return receipt.first_id, receipt.last_id


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_while_committing_staged_transactions(tmp_path: Path) -> None:
    """A ``tidewire serve`` child SIGKILLed at a random moment of a run of staged commits;
    restarted, every transaction is replayed: each stored once, where it was acknowledged."""
    rng = random.Random(SEED)
    hub = HubProcess(tmp_path / "data", tmp_path / "hub.log")
    txns = [f"spark:q:{b}:s" for b in range(40)]
    acked: dict[str, tuple[int, int]] = {}
    try:
        url = hub.start()["rsio"]

        async def load_then_kill() -> None:
            task = asyncio.create_task(_commit_all(url, txns, acked))
            kill_after = rng.randrange(2, len(txns) - 5)  # commits, then a random instant more
            await until(lambda: len(acked) >= kill_after or task.done(), "commits", 30)
            await asyncio.sleep(rng.uniform(0, 0.01))
            hub.kill()
            with pytest.raises((RsioError, OSError, ConnectionError, AssertionError)):
                await task  # (the load ends on the dead connection)

        run(load_then_kill(), timeout=60)
        assert 0 < len(acked) < len(txns), "the kill fell outside the load: change the seed"
        url = hub.start()["rsio"]
        got = {txn: run(_replay(url, txn), timeout=60) for txn in txns}
        for txn, ids in acked.items():
            assert got[txn] == ids, txn

        async def values() -> list[bytes]:
            async with connect(url) as c:
                (row,) = await c.streams(["s"])
                return [b.value(i) async for b in c.subscribe("s", until_id=row["latest_id"])
                        for i in range(len(b))]  # fmt: skip

        stored = run(values(), timeout=60)
        want = [f"{t}/{p}/{i}".encode() for t in txns for p in range(2) for i in range(50)]
        assert sorted(stored) == sorted(want)  # each once
    finally:
        hub.stop()

