"""A staged transaction bigger than one append takes (``log.max_record_bytes``) is committed
as one bulk append (hub/txn.py ``_commit_bulk``, log/bulk.py): every row, once, visible at
once, its replay adding nothing; an intent left by a hub that died between the intent and the
data is completed at its ids; the settling of a big intent reads it a chunk at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import hub_server, run, stream_values
from tidewire.client.rsio import RsioError, connect
from tidewire.client.rsio_staging import commit_parts, stage_part
from tidewire.hub.fingerprint import Fingerprint
from tidewire.hub.staging import STAGING_DIR
from tidewire.hub.storage import BulkAppends
from tidewire.log import LogConfig
from tidewire.model import Batch
from tidewire.protocols.rsio.staged import StagedPart

SMALL = LogConfig(max_record_bytes=64 * 1024)


def rows(tag: str, n: int, size: int = 200, keyed: bool = False) -> Batch:
    keys = [b"k%d" % (i % 5) if i % 7 else None for i in range(n)] if keyed else None
    return Batch.build("s", [b"%s.%06d" % (tag.encode(), i) + b"." * size for i in range(n)],
                       keys=keys)  # fmt: skip


def test_a_transaction_many_times_the_record_limit(tmp_path: Path) -> None:
    """Three parts of ~260 KB each (12 times what one append takes) from two connections: one
    commit stores all 3,600 rows once, in the order named, keys kept; nothing is readable
    before it; its replay answers the same ids and adds nothing."""

    async def main() -> None:
        async with hub_server(tmp_path, log=SMALL) as (hub, _, url), \
                connect(url) as a, connect(url) as b:  # fmt: skip
            await hub.append(Batch.build("s", [b"before"]), assign_ids=True)
            chunks = [rows(f"a{i}", 200, keyed=True) for i in range(6)]
            pa = await stage_part(a, "s", "T", "0.0", chunks)
            pb = await stage_part(b, "s", "T", "1.0", [rows(f"b{i}", 200) for i in range(6)])
            pc = await stage_part(b, "s", "T", "2.0", [rows(f"c{i}", 200) for i in range(6)])
            assert await stream_values(hub) == [b"before"]
            receipt = await commit_parts(a, "s", "T", [pc, pa, pb])
            assert receipt is not None
            assert (receipt.first_id, receipt.last_id) == (2, 3601)
            want = [b"before"] + [f"{p}{i}.{j:06d}".encode() + b"." * 200
                                  for p in ("c", "a", "b") for i in range(6)
                                  for j in range(200)]  # fmt: skip
            assert await stream_values(hub) == want
            got = await hub.read("s", 1202, 1 << 20, 3)  # (a's first rows: keyed)
            assert [got[0].key(i) for i in range(3)] == [None, b"k1", b"k2"]
            assert list((tmp_path / STAGING_DIR).iterdir()) == []
            again = await commit_parts(b, "s", "T", [pc, pa, pb])  # Spark's replay
            assert again is not None
            assert (again.first_id, again.last_id) == (2, 3601)
            assert await stream_values(hub) == want
            # a part that is not what was named fails the commit before any intent
            p0 = await stage_part(a, "s", "U", "0.0", [rows("u", 400)] * 2)
            with pytest.raises(RsioError, match="fingerprint"):
                await commit_parts(a, "s", "U", [type(p0)(p0.part, p0.count, 0, p0.fp ^ 1)])
            assert len(await stream_values(hub)) == 3601

    run(main())


@pytest.mark.parametrize("landed", [False, True])
def test_a_hub_that_died_mid_commit(tmp_path: Path, landed: bool) -> None:
    """The state a hub killed mid-commit leaves, built with the real log: the intent of a big
    transaction recorded, and (``landed``) its data bulk-appended at the intent's ids, with no
    ``done``. Reopened, the replayed commit completes the intent at its ids, or settles it by
    reading the 1,200 events back a chunk at a time and fingerprinting them (DONE: the first
    ids answered, nothing added)."""
    chunks = [rows(f"x{i}", 300) for i in range(4)]

    async def crash() -> list[StagedPart]:
        async with hub_server(tmp_path, log=SMALL) as (hub, _, url), connect(url) as c:
            p = await stage_part(c, "s", "T", "0.0", chunks)
            acc = Fingerprint()
            for chunk in chunks:
                acc.add(chunk)
            await hub.txns.ledger.record({"txn": "T", "stream": "s", "principal": "anonymous",
                                          "first": 1, "count": 1200, "fp": acc.value()})
            if landed:
                storage = hub.storage
                assert isinstance(storage, BulkAppends)
                assert await storage.append_bulk("s", 1, 1200, 0, lambda: iter(chunks)) == (
                    1, 1200)
            return [p]  # (closed: what a SIGKILL after those fsyncs leaves, nothing more)

    async def replay(named: list[StagedPart]) -> None:
        async with hub_server(tmp_path, log=SMALL) as (hub, _, url), connect(url) as c:
            assert len(await stream_values(hub)) == (1200 if landed else 0)
            receipt = await commit_parts(c, "s", "T", named)
            assert receipt is not None
            assert (receipt.first_id, receipt.last_id) == (1, 1200)
            want = [v for chunk in chunks for v in (chunk.value(i) for i in range(300))]
            assert await stream_values(hub) == want
            again = await commit_parts(c, "s", "T", named)
            assert again is not None
            assert (again.first_id, again.last_id) == (1, 1200)
            assert list((tmp_path / STAGING_DIR).iterdir()) == []

    named = run(crash())
    run(replay(named))
