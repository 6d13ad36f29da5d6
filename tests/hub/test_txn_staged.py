"""Staged transactions (docs/protocols/rsio.md "Staged transactions"): parts offered by many
writers over real sockets (``stream?format=records&txn=T&stage=P``), read by nobody, then
appended exactly once by a ``commit`` naming them, dropped by ``abort`` or by the TTL sweep.

A commit's replay adds nothing and answers the first ids; a named part that is missing or
holds other rows fails the commit (so Spark replays and stages again); unnamed parts (failed
or speculative attempts) are dropped; another principal's parts are another transaction's;
the names' grammar refuses what it cannot mean; bad records fail the part, not the hub.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import hub_server, run, stream_values
from tidewire.client.rsio import RsioError, connect
from tidewire.client.rsio_staging import abort_parts, commit_parts, stage_part
from tidewire.config import load_config
from tidewire.hub.staging import STAGING_DIR, Staging, TxnPartMissing
from tidewire.model import Batch
from tidewire.protocols.rsio.names import OfferName, PublisherNameError
from tidewire.protocols.rsio.staged import StagedPart, encode_parts, parse_parts
from tidewire.server.storage_open import open_hub


def rows(tag: str, n: int, stream: str = "s", keyed: bool = False) -> Batch:
    keys = [f"k{i % 3}".encode() for i in range(n)] if keyed else None
    return Batch.build(stream, [f"{tag}.{i}".encode() for i in range(n)], keys=keys)




def staged_dirs(path: Path) -> list[str]:
    root = path / STAGING_DIR
    return sorted(os.listdir(root)) if root.is_dir() else []


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("text", [
    "s?txn=T&format=records&stage=3.17",
    "s?txn=T&commit",
    "s?txn=T&abort",
    "a%2Fb?txn=spark%3Aq%3A1&commit",
])  # fmt: skip
def test_offer_names_round_trip(text: str) -> None:
    name = OfferName.parse(text)
    assert OfferName.parse(str(name)) == name


@pytest.mark.parametrize("text", [
    "s?stage=1&format=records",  # no txn
    "s?txn=T&stage=1",  # not format=records
    "s?txn=T&format=records",  # records without stage
    "s?txn=T&format=records&stage=a/b",  # part outside its alphabet
    "s?txn=T&format=records&stage=" + "x" * 65,
    "s?commit",
    "s?txn=T&commit&abort",
    "s?txn=T&commit&format=value",
    "s?txn=T&format=records&stage=1&commit",
])  # fmt: skip
def test_offer_names_refused(text: str) -> None:
    with pytest.raises(PublisherNameError):
        OfferName.parse(text)


def test_commit_element_grammar() -> None:
    parts = [StagedPart("0.1", 3, 0, 7), StagedPart("1.2", 0, 0, 0)]
    assert encode_parts(parts) == (b'{"parts":[{"part":"0.1","count":3,"fp":7},'
                                   b'{"part":"1.2","count":0,"fp":0}]}')  # fmt: skip
    assert parse_parts(encode_parts(parts)) == parts
    for bad in (b"[]", b'{"parts":{}}', b'{"parts":[{"part":"a"}]}', b"\xff",
                b'{"parts":[{"part":"a","count":1,"fp":1},{"part":"a","count":1,"fp":1}]}',
                b'{"parts":[{"part":"a","count":-1,"fp":1}]}',
                b'{"parts":[{"part":"a","count":1,"fp":4294967296}]}'):  # fmt: skip
        with pytest.raises(ValueError, match=r"commit|part"):
            parse_parts(bad)


# ---------------------------------------------------------------- over sockets


def test_staged_commit_exactly_once(tmp_path: Path) -> None:
    """Two parts staged by two connections, a third (unnamed: a failed attempt) dropped; the
    commit appends the named ones in the order named, once; its replay adds nothing and
    answers the same ids; nothing is readable before the commit."""

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url), connect(url) as a, connect(url) as b:
            pa = await stage_part(a, "s", "T", "0.0", [rows("a", 5), rows("a2", 2)])
            pb = await stage_part(b, "s", "T", "1.4", [rows("b", 3, keyed=True)])
            await stage_part(b, "s", "T", "1.3", [rows("lost", 4)])  # (a failed attempt)
            assert (pa.count, pb.count) == (7, 3)
            assert await stream_values(hub) == []  # staged: read by nobody
            assert len(staged_dirs(tmp_path)) == 1
            assert hub.txns.staged_bytes() > 0  # (the stats' staged_bytes)
            receipt = await commit_parts(a, "s", "T", [pb, pa])
            assert receipt is not None
            assert (receipt.first_id, receipt.last_id) == (1, 10)
            want = ([f"b.{i}".encode() for i in range(3)]
                    + [f"a.{i}".encode() for i in range(5)] + [b"a2.0", b"a2.1"])  # fmt: skip
            assert await stream_values(hub) == want
            assert staged_dirs(tmp_path) == []  # every part of the key dropped
            assert hub.txns.staged_bytes() == 0
            again = await commit_parts(b, "s", "T", [pb, pa])  # Spark's replay
            assert again is not None
            assert (again.first_id, again.last_id) == (1, 10)
            assert await stream_values(hub) == want
            got = await hub.read("s", 1, 1 << 20)
            assert got[0].key(0) == b"k0"  # keys kept

    run(main())


def test_missing_or_different_part_fails_the_commit(tmp_path: Path) -> None:
    """A part not staged, or named with another count or fingerprint: the commit fails with
    the hub's reason and appends nothing; staging it again lets the commit through."""

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url), connect(url) as c:
            p0 = await stage_part(c, "s", "T", "0.0", [rows("x", 4)])
            ghost = StagedPart("1.0", 2, 0, 123)
            with pytest.raises(RsioError, match="not staged"):
                await commit_parts(c, "s", "T", [p0, ghost])
            wrong = StagedPart("0.0", p0.count, 0, p0.fp ^ 1)
            with pytest.raises(RsioError, match="fingerprint"):
                await commit_parts(c, "s", "T", [wrong])
            assert await stream_values(hub) == []
            # A part a machine crash tore (parts are not fsynced: hub/staging.py): its file
            # cut short, or with a byte changed, no longer matches what the driver names.
            [path] = [tmp_path / STAGING_DIR / d / "0.0.log" for d in staged_dirs(tmp_path)]
            whole = path.read_bytes()
            for torn in (whole[: len(whole) // 2], whole[:-1] + bytes([whole[-1] ^ 1])):
                path.write_bytes(torn)
                with pytest.raises(RsioError, match=r"not staged|damaged"):
                    await commit_parts(c, "s", "T", [p0])
            path.write_bytes(whole)
            p1 = await stage_part(c, "s", "T", "1.0", [rows("y", 2)])
            receipt = await commit_parts(c, "s", "T", [p0, p1])
            assert receipt is not None
            assert receipt.last_id == 6

    run(main())


def test_principals_and_streams_do_not_share_parts(tmp_path: Path) -> None:
    """A part staged for stream s is not one of stream t's (another key: another directory),
    nor is a part staged over the hub's API by another principal."""

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            async with connect(url) as c:
                p = await stage_part(c, "s", "T", "0.0", [rows("x", 2)])
                with pytest.raises(RsioError, match="not staged"):
                    await commit_parts(c, "t", "T", [p])
            staging = hub.txns.staging
            assert isinstance(staging, Staging)
            assert staging.directory("anonymous", "s", "T") != staging.directory("bob", "s", "T")
            with pytest.raises(TxnPartMissing):
                await hub.txns.commit_staged("T", "s", [p], principal="bob")
            receipt = await hub.txns.commit_staged("T", "s", [p], principal="anonymous")
            assert (receipt.count, receipt.already) == (2, False)

    run(main())


def test_abort_drops_parts(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url), connect(url) as c:
            p = await stage_part(c, "s", "T", "0.0", [rows("x", 2)])
            await abort_parts(c, "s", "T")
            assert staged_dirs(tmp_path) == []
            with pytest.raises(RsioError, match="not staged"):
                await commit_parts(c, "s", "T", [p])
            assert await commit_parts(c, "s", "T", []) is None  # nothing: no event
            assert await stream_values(hub) == []

    run(main())


def test_a_bad_record_fails_the_part_not_the_connection(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (_hub, _, url):
            async with connect(url) as c:
                pub = await c.publisher("s", format="records", txn="T", stage="0.0")
                await pub.submit([b"\x00" * 64])
                with pytest.raises(RsioError, match="not a log record"):
                    await pub.close()
                p = await stage_part(c, "s", "T", "0.0", [rows("ok", 1)])  # same connection
                assert (await commit_parts(c, "s", "T", [p])) is not None
            assert [f for d in staged_dirs(tmp_path)
                    for f in os.listdir(tmp_path / STAGING_DIR / d)] == []  # fmt: skip

    run(main())


def test_sweep_and_partial_files(tmp_path: Path) -> None:
    """The sweep drops key directories untouched for the TTL (by the files' times), and an
    open removes the ``*.tmp`` a crash left."""
    staging = Staging(str(tmp_path / "st"))
    writer = staging.writer("p", "s", "T", "0.0")  # never finished: a crash
    old = staging.writer("p", "s", "OLD", "0.0")
    old.add(bytes(_record()))
    old.finish()
    for entry in os.scandir(staging.directory("p", "s", "OLD")):
        os.utime(entry.path, (1000, 1000))
    staging.ttl_ms = 1000
    assert staging.sweep(now_ms=2_000_000) == 1
    assert not os.path.isdir(staging.directory("p", "s", "OLD"))
    assert staging.remove_partial() == 1
    assert os.listdir(staging.directory("p", "s", "T")) == []
    writer.discard()


def _record() -> bytes:
    from tidewire.record import encode

    return bytes(encode(rows("r", 2).with_ids(1)).data)


def test_a_retention_pass_sweeps_stale_staging(tmp_path: Path) -> None:
    """Parts nobody committed or aborted are dropped by the retention pass once untouched
    for ``staging_ttl_ms`` (files' times, set back here: no waiting)."""

    async def main() -> tuple[Staging, list[str]]:
        async with hub_server(tmp_path) as (hub, _, url), connect(url) as c:
            await stage_part(c, "s", "OLD", "0.0", [rows("x", 2)])
            await stage_part(c, "s", "NEW", "0.0", [rows("y", 2)])
            staging = hub.txns.staging
            assert isinstance(staging, Staging)
            before = staged_dirs(tmp_path)
            for entry in os.scandir(staging.directory("anonymous", "s", "OLD")):
                os.utime(entry.path, (1000, 1000))
            hub.txns.staging_ttl_ms = 3600 * 1000
            hub.enforce_retention()
            return staging, before

    staging, before = run(main())
    assert len(before) == 2
    new = os.path.basename(staging.directory("anonymous", "s", "NEW"))
    assert staged_dirs(tmp_path) == [new]
    assert staging.staged_bytes() > 0


def test_the_staging_ttl_is_a_setting(tmp_path: Path) -> None:
    """``txn.staging_ttl_ms`` reaches the hub ``serve`` opens (default: a day)."""
    async def main() -> None:
        for given, expected in ((None, 24 * 3600 * 1000), (60_000, 60_000)):
            more = {} if given is None else {"txn.staging_ttl_ms": given}
            config = load_config(None, {"data_dir": str(tmp_path / f"d{given}"), **more},
                                 environ={})  # fmt: skip
            hub = await open_hub(config)
            try:
                assert hub.txns.staging_ttl_ms == expected
            finally:
                await hub.close()

    run(main())
