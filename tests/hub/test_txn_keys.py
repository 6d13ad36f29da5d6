"""Transactions keyed by (principal, stream, id) (issue 20, item 6).

A writer that reuses another principal's transaction id must neither learn its stream or count,
nor block the owner's id, nor get the owner's data dropped as "already done". Part 1 drives
``Hub.commit`` directly; part 2 reloads the ledger (keyed records, and the records written
before keys, which load compatibly); part 3 runs two principals (tokens) over RS.io.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

import tidewire
from helpers import stream_values
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.hub.txn import TXN_STREAM, TxnReceipt, fingerprint
from tidewire.model import Batch, TidewireError
from tidewire.server.rsio import start_rsio_server

TEST_TIMEOUT = 15.0


def arun(coro: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TEST_TIMEOUT):
            await coro

    with asyncio.Runner() as r:
        r.run(bounded())


def receipt(stream: str, first: int, n: int, already: bool) -> TxnReceipt:
    return TxnReceipt(stream, n, first, first + n - 1, already)


async def records(hub: Hub) -> list[dict[str, Any]]:
    return [json.loads(e.value) for b in await hub.read(TXN_STREAM, 1, 1 << 30) for e in b]


async def write_record(hub: Hub, record: dict[str, Any]) -> None:
    """A record of ``_tidewire.txns`` written by hand (the hub's own stream)."""
    data = json.dumps(record, separators=(",", ":")).encode()
    await hub.storage.append(Batch.build(TXN_STREAM, [data]), assign_ids=True)


# =========================================================================== 1. the keys


def test_another_principals_id_is_another_transaction(tmp_path: Path) -> None:
    """The owner commits first: mallory, reusing the id (same stream, same count, or another
    stream), appends its own events and learns nothing of the owner's."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            owner = Batch.build("c1.s", [b"o1", b"o2"])
            assert await hub.commit("T", owner, principal="token:owner") == receipt(
                "c1.s", 1, 2, False)  # fmt: skip
            # another stream: no "committed to 'c1.s' with 2 event(s)"
            assert await hub.commit("T", Batch.build("c2.x", [b"m"]),
                                    principal="token:mallory") == receipt("c2.x", 1, 1, False)
            # the same stream and count: mallory's data is appended, not taken for the owner's
            got = await hub.commit("T", Batch.build("c1.s", [b"m1", b"m2"]),
                                   principal="token:mallory")  # fmt: skip
            assert got == receipt("c1.s", 3, 2, False)
            # the same stream, another count: no error naming the owner's count either
            got = await hub.commit("U", Batch.build("c1.s", [b"u"]), principal="token:owner")
            assert got == receipt("c1.s", 5, 1, False)
            got = await hub.commit("U", Batch.build("c1.s", [b"x", b"y", b"z"]),
                                   principal="token:mallory")  # fmt: skip
            assert got == receipt("c1.s", 6, 3, False)
            # each replays its own
            assert (await hub.commit("T", owner, principal="token:owner")).first_id == 1
            assert (await hub.commit("T", Batch.build("c1.s", [b"m1", b"m2"]),
                                     principal="token:mallory")).first_id == 3  # fmt: skip
            assert await stream_values(hub, "c1.s") == [b"o1", b"o2", b"m1", b"m2", b"u", b"x",
                                                        b"y", b"z"]  # fmt: skip
            assert len(hub.txns) == 5
        finally:
            await hub.close()

    arun(main())


def test_an_id_taken_first_by_another_principal_does_not_block_its_owner(tmp_path: Path) -> None:
    """Mallory commits the owner's next id first (it guessed it): the owner's commit of that
    id is stored all the same, and its replay finds it."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            batch = Batch.build("s", [b"a", b"b"])
            assert not (await hub.commit("q/7/0", batch, principal="token:mallory")).already
            mine = await hub.commit("q/7/0", batch, principal="token:owner")
            assert mine == receipt("s", 3, 2, False)
            assert await hub.commit("q/7/0", batch, principal="token:owner") == receipt(
                "s", 3, 2, True)  # fmt: skip
            assert await stream_values(hub, "s") == [b"a", b"b", b"a", b"b"]
            # concurrently, too: each principal's commit once
            both = await asyncio.gather(*(
                hub.commit("race", Batch.build("s", [p.encode()]), principal=p)
                for p in ("token:a", "token:b", "token:a", "token:b")))  # fmt: skip
            assert [r.already for r in both].count(False) == 2
            assert sorted(await stream_values(hub, "s"))[-2:] == [b"token:a", b"token:b"]
        finally:
            await hub.close()

    arun(main())


def test_the_default_principal_is_anonymous(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            await hub.commit("T", Batch.build("s", [b"a"]))
            assert (await hub.commit("T", Batch.build("s", [b"a"]), principal="anonymous")).already
            assert not (await hub.commit("T", Batch.build("s", [b"a"]),
                                         principal="token:x")).already  # fmt: skip
            intent = (await records(hub))[0]
            assert intent["principal"] == "anonymous"
        finally:
            await hub.close()

    arun(main())


# =========================================================================== 2. the ledger


def test_keyed_entries_survive_reopening(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            for p in ("token:a", "token:b"):
                await hub.commit("T", Batch.build("s", [p.encode()]), principal=p)
                await hub.commit("T", Batch.build("t", [p.encode()]), principal=p)
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path))
        try:
            assert len(hub.txns) == 4
            assert await hub.commit("T", Batch.build("s", [b"?"]), principal="token:b") == (
                receipt("s", 2, 1, True))  # fmt: skip
            assert await hub.commit("T", Batch.build("t", [b"?"]), principal="token:a") == (
                receipt("t", 1, 1, True))  # fmt: skip
            assert not (await hub.commit("T", Batch.build("s", [b"c"]),
                                         principal="token:c")).already  # fmt: skip
            done = [r for r in await records(hub) if r.get("done")]
            assert {"txn": "T", "stream": "t", "principal": "token:b", "done": True} in done
        finally:
            await hub.close()

    arun(main())


def test_records_from_before_keys_match_any_principal_of_their_stream(tmp_path: Path) -> None:
    """An upgrade: intents without a principal and done records with only the id. A replay
    by whoever (the Spark sink, under its token) still finds the transaction done; the same id
    into another stream is another transaction."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        old = Batch.build("s", [b"a", b"b"])
        try:
            await hub.append(old.with_ids(1))
            await write_record(hub, {"txn": "T", "stream": "s", "first": 1, "count": 2,
                                     "fp": fingerprint(old)})  # fmt: skip
            await write_record(hub, {"txn": "T", "done": True})
            await write_record(hub, {"txn": "bad", "stream": 7, "first": 1, "count": 1,
                                     "fp": 0})  # (malformed: skipped)  # fmt: skip
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path))
        try:
            assert len(hub.txns) == 1
            assert await hub.commit("T", old, principal="token:spark") == receipt("s", 1, 2, True)
            assert await hub.commit("T", old) == receipt("s", 1, 2, True)
            with pytest.raises(TidewireError, match="with 2 event"):
                await hub.commit("T", Batch.build("s", [b"x"]), principal="token:spark")
            assert not (await hub.commit("T", Batch.build("t", [b"x"]))).already
            assert hub.latest("s") == 2
        finally:
            await hub.close()

    arun(main())


def test_an_unsettled_intent_from_before_keys_is_settled_by_any_principal(tmp_path: Path) -> None:
    """The hub crashed, before the upgrade, between the data and its done record: the
    replay finds the data and records it done, still keyless (it stays the old entry)."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        old = Batch.build("s", [b"a"])
        try:
            await write_record(hub, {"txn": "T", "stream": "s", "first": 1, "count": 1,
                                     "fp": fingerprint(old)})  # fmt: skip
            await hub.append(old.with_ids(1))
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path))
        try:
            assert await hub.commit("T", old, principal="token:x") == receipt("s", 1, 1, True)
            assert (await records(hub))[-1] == {"txn": "T", "stream": "s", "done": True}
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path))
        try:
            assert await hub.commit("T", old, principal="token:y") == receipt("s", 1, 1, True)
            assert hub.latest("s") == 1
        finally:
            await hub.close()

    arun(main())


def test_an_old_intent_that_did_not_happen_gives_way_to_a_keyed_one(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        batch = Batch.build("s", [b"a"])
        try:
            await write_record(hub, {"txn": "T", "stream": "s", "first": 1, "count": 1,
                                     "fp": fingerprint(batch)})  # fmt: skip
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path))
        try:
            assert await hub.commit("T", batch, principal="token:x") == receipt("s", 1, 1, False)
            assert len(hub.txns) == 1
            assert not (await hub.commit("T", batch, principal="token:y")).already
        finally:
            await hub.close()

    arun(main())


# =========================================================================== 3. over RS.io

ACL = """
[principal."token:owner"]
read = ["c1.*"]
write = ["c1.*"]

[principal."token:mallory"]
read = ["c2.*"]
write = ["c1.*", "c2.*"]
"""


def test_two_tokens_reusing_one_txn_id_over_rsio(tmp_path: Path) -> None:
    """The RS.io offers commit as the session's principal (issue 20's reproduction): mallory's
    ``txn=`` of the owner's id neither answers with the owner's ids nor fails naming them."""
    owner, owner_table = mint_token("owner")
    mallory, mallory_table = mint_token("mallory")
    access = Access(Acl.parse(ACL), Tokens.parse(owner_table + mallory_table))

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        server = await start_rsio_server(hub, "127.0.0.1", 0, access=access)
        url = f"rsio://127.0.0.1:{server.port}"
        try:
            async with tidewire.connect(url, token=owner) as o:
                first = await o.publish("c1.s", [b"o1", b"o2"], txn="q/1")
            async with tidewire.connect(url, token=mallory) as m:
                elsewhere = await m.publish("c2.x", [b"m"], txn="q/1")
                assert (elsewhere.first_id, elsewhere.last_id) == (1, 1)
                same = await m.publish("c1.s", [b"m1", b"m2"], txn="q/1")
                assert (same.first_id, same.last_id) == (3, 4)
            async with tidewire.connect(url, token=owner) as o:
                assert await o.publish("c1.s", [b"o1", b"o2"], txn="q/1") == first
            assert await stream_values(hub, "c1.s") == [b"o1", b"o2", b"m1", b"m2"]
        finally:
            await server.close()
            await hub.close()

    arun(main())
