"""Transactions with several gateways (cluster mode): two or three :class:`Hub`\\ s over ONE
shared storage in one process (tests/memory_storage.py: a :class:`Gateway` per hub over one
:class:`MemoryStorage`), as ``tidewire serve`` gateways over one JetStream cluster.

A transaction is stored once, ever, whichever gateways commit it, at once or one after the
other, and whichever of them dies half-way (after its intent, or after its data): the others'
replays append nothing twice and answer the ids of the first commit. The last test drives
seeded interleavings: gateways committing the same keys at once, plain writers on the same
stream, one gateway killed at a random append.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Coroutine
from typing import Any

import pytest

from memory_storage import Gateway, MemoryStorage
from tidewire.hub import Hub
from tidewire.hub.txn import TXN_STREAM, TxnReceipt, fingerprint
from tidewire.model import Batch, IdOrderError, TidewireError

TEST_TIMEOUT = 15.0


def arun(coro: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TEST_TIMEOUT):
            await coro

    with asyncio.Runner() as r:
        r.run(bounded())


def values(shared: MemoryStorage, stream: str = "s") -> list[bytes]:
    return [b.value(i) for b in shared.committed.get(stream, []) for i in range(len(b))]


def by_id(shared: MemoryStorage, stream: str = "s") -> dict[int, bytes]:
    return {b.ids[i]: b.value(i) for b in shared.committed.get(stream, []) for i in range(len(b))}


def txn_batch(name: str, n: int = 3, stream: str = "s") -> Batch:
    return Batch.build(stream, [f"{name}.{i}".encode() for i in range(n)])


async def write_record(shared: MemoryStorage, record: dict[str, Any]) -> None:
    """A ledger record written as a gateway (now dead) would have."""
    data = json.dumps(record, separators=(",", ":")).encode()
    await shared.append(Batch.build(TXN_STREAM, [data]), assign_ids=True)


def intent(txn: str, batch: Batch, first: int) -> dict[str, Any]:
    return {"txn": txn, "stream": batch.stream, "principal": "anonymous", "first": first,
            "count": len(batch), "fp": fingerprint(batch)}  # fmt: skip


def test_two_gateways_committing_the_same_keys_at_once_store_each_once() -> None:
    async def main() -> None:
        shared = MemoryStorage()
        a, b = Hub(Gateway(shared)), Hub(Gateway(shared))
        batches = {f"T{k}": txn_batch(f"T{k}", 1 + k % 4) for k in range(12)}
        jobs = [hub.commit(t, batch) for t, batch in batches.items() for hub in (a, b, a)]
        receipts = await asyncio.gather(*jobs)
        for k in range(len(batches)):
            trio = receipts[3 * k : 3 * k + 3]
            assert len({(r.first_id, r.last_id) for r in trio}) == 1, trio
            assert sum(not r.already for r in trio) <= 1  # (one appended; the rest found it)
        assert sorted(values(shared)) == sorted(v for bt in batches.values() for v in
                                                (bt.value(i) for i in range(len(bt))))  # fmt: skip
        await a.close()
        await b.close()

    arun(main())


def test_a_commit_through_one_gateway_is_known_through_another_opened_before() -> None:
    async def main() -> None:
        shared = MemoryStorage()
        a, b = Hub(Gateway(shared)), Hub(Gateway(shared))  # (b loaded the ledger empty)
        batch = txn_batch("T")
        first = await a.commit("T", batch)
        again = await b.commit("T", batch)
        assert again == TxnReceipt("s", 3, first.first_id, first.last_id, already=True)
        assert len(values(shared)) == 3
        await a.close()
        await b.close()

    arun(main())


@pytest.mark.parametrize("where", ["after the intent", "after the data"])
def test_a_gateway_dying_mid_commit_leaves_it_to_the_others_replay(where: str) -> None:
    """Gateway A dies between its intent and its data (the data never sent), or between its
    data and its done record; B replays: stored once, at A's intent's ids."""

    async def main() -> None:
        shared = MemoryStorage()
        door_a = Gateway(shared)
        a, b = Hub(door_a), Hub(Gateway(shared))
        await b.append(Batch.build("s", [b"x"]), assign_ids=True)
        batch = txn_batch("T")
        if where == "after the intent":
            door_a.die_before = lambda bt: bt.stream == "s"
        else:
            door_a.die_after = lambda bt: bt.stream == "s"
        with pytest.raises(TidewireError):
            await a.commit("T", batch)
        records = [json.loads(v) for v in values(shared, TXN_STREAM)]
        assert [r.get("done", False) for r in records] == [False]  # the intent, no done
        stored = len(values(shared))
        assert stored == (1 if where == "after the intent" else 4)
        replay = await b.commit("T", batch)
        assert replay == TxnReceipt("s", 3, 2, 4, already=where == "after the data")
        assert values(shared) == [b"x", b"T.0", b"T.1", b"T.2"]
        assert (await b.commit("T", batch)).already
        # a third gateway, opened afterwards, knows it too; A's data can never land again
        c = Hub(Gateway(shared))
        assert await c.commit("T", batch) == TxnReceipt("s", 3, 2, 4, already=True)
        with pytest.raises(IdOrderError):
            await shared.append(batch.with_ids(2))
        await b.close()
        await c.close()

    arun(main())


def test_a_live_intent_of_other_content_is_raced_at_its_own_ids() -> None:
    """A's intent for T (content X) is live (A slow or dead); B commits T with content Y: its
    intent takes the same first id, so whichever lands first is T, never both."""

    async def main() -> None:
        shared = MemoryStorage()
        x, y = txn_batch("X"), txn_batch("Y")
        await write_record(shared, intent("T", x, 1))
        b = Hub(Gateway(shared))
        assert await b.commit("T", y) == TxnReceipt("s", 3, 1, 3, already=False)
        with pytest.raises(IdOrderError):  # A's data, late: refused
            await shared.append(x.with_ids(1))
        c = Hub(Gateway(shared))
        assert await c.commit("T", x) == TxnReceipt("s", 3, 1, 3, already=True)
        assert values(shared) == [b"Y.0", b"Y.1", b"Y.2"]
        await b.close()
        await c.close()

    arun(main())


@pytest.mark.parametrize("done_record", [False, True])
def test_when_the_rival_loses_the_first_intent_is_the_transaction(done_record: bool) -> None:
    """Intents X then Y (rivals, same first id); X's data landed (its gateway alive after
    all). A third gateway's replay of Y appends nothing: T is X, with or without the (then
    ambiguous) done record."""

    async def main() -> None:
        shared = MemoryStorage()
        x, y = txn_batch("X"), txn_batch("Y")
        await write_record(shared, intent("T", x, 1))
        await write_record(shared, intent("T", y, 1))
        await shared.append(x.with_ids(1))
        if done_record:
            await write_record(shared, {"txn": "T", "stream": "s", "principal": "anonymous",
                                        "done": True})  # fmt: skip
        c = Hub(Gateway(shared))
        assert await c.commit("T", y) == TxnReceipt("s", 3, 1, 3, already=True)
        assert await c.commit("T", x) == TxnReceipt("s", 3, 1, 3, already=True)
        assert values(shared) == [b"X.0", b"X.1", b"X.2"]
        await c.close()

    arun(main())


def test_on_one_hub_a_known_transaction_costs_no_read_and_a_new_one_one_empty_read() -> None:
    async def main() -> None:
        shared = MemoryStorage()
        door = Gateway(shared)
        hub = Hub(door)
        reads = door.reads
        await hub.commit("T", txn_batch("T"))
        assert reads == {TXN_STREAM: 1}  # the catch-up, finding nothing
        await hub.commit("T", txn_batch("T"))
        assert reads == {TXN_STREAM: 1}
        assert len(values(shared, TXN_STREAM)) == 2  # intent, done
        await hub.close()

    arun(main())


# ------------------------------------------------------------------ seeded interleavings

KEYS = 10
TOKENS = [f"K{k}" for k in range(KEYS)]


def content(token: str, who: int | None) -> Batch:
    """Token's batch; ``who``: the gateway's own content for it (a client reusing a key for
    other data: rivals), else the one content every gateway commits."""
    n = 1 + int(token[1:]) % 3
    return txn_batch(token if who is None else f"{token}@{who}", n)


@pytest.mark.parametrize("seed", range(40))
def test_seeded_interleavings_with_a_gateway_killed_store_every_transaction_once(
    seed: int,
) -> None:
    """Two or three gateways, two committers each, plain writers; one gateway killed at a
    random append (before it, or after it landed); odd seeds: each gateway commits its own
    content under the same keys. Then a gateway opened afterwards replays every key: each is
    stored once (one content, at the ids every acknowledgement said)."""
    rng = random.Random(seed)
    rivals = seed % 2 == 1

    async def main() -> None:
        shared = MemoryStorage()
        doors = [Gateway(shared, random.Random(rng.random())) for _ in range(rng.choice([2, 3]))]
        hubs = [Hub(d) for d in doors]
        victim = rng.randrange(len(doors))
        budget = [rng.randrange(1, 40)]

        def die(batch: Batch) -> bool:
            budget[0] -= 1
            return budget[0] == 0

        if rng.random() < 0.5:
            doors[victim].die_before = die
        else:
            doors[victim].die_after = die
        acked: dict[str, tuple[int, int]] = {}

        async def committer(n: int, tokens: list[str]) -> None:
            for token in tokens:
                try:
                    r = await hubs[n].commit(token, content(token, n if rivals else None))
                except TidewireError:
                    return  # (its gateway died)
                assert acked.setdefault(token, (r.first_id, r.last_id)) == (r.first_id,
                                                                            r.last_id)  # fmt: skip

        async def plain(hub: Hub, w: int) -> None:
            for k in range(15):
                try:
                    await hub.append(Batch.build("s", [b"P%d.%d" % (w, k)]), assign_ids=True)
                except TidewireError:
                    return
                await asyncio.sleep(0)

        jobs = []
        for n in range(len(hubs)):
            for _ in range(2):
                order = TOKENS[:]
                rng.shuffle(order)
                jobs += [committer(n, order[: rng.randrange(3, KEYS + 1)])]
        jobs += [plain(hubs[w % len(hubs)], w) for w in range(2)]
        await asyncio.gather(*jobs)
        survivor = Hub(Gateway(shared))  # opened afterwards: replays every transaction
        for token in TOKENS:
            r = await survivor.commit(token, content(token, 9 if rivals else None))
            if token in acked:
                assert (r.first_id, r.last_id) == acked[token]
                assert r.already
            acked[token] = (r.first_id, r.last_id)
        stored = by_id(shared)
        counts = Counter(stored.values())
        assert set(counts.values()) == {1}, counts.most_common(3)
        for token, (first, last) in acked.items():
            got = [stored.get(i) for i in range(first, last + 1)]
            options = [content(token, w) for w in ([*range(len(hubs)), 9] if rivals else [None])]
            assert any(got == [b.value(i) for i in range(len(b))] for b in options), got
            mine = [v for v in stored.values() if v.split(b".")[0].split(b"@")[0] == token.encode()]
            assert len(mine) == len(got)  # (no other content of the key stored anywhere)
        for hub in [*hubs, survivor]:
            await hub.close()

    arun(main())
