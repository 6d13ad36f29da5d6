"""Exactly-once appends (``Hub.commit`` and RS.io offers with ``txn=``).

Part 1 drives :class:`~tidewire.hub.Hub` directly: a transaction is stored once however often,
and however concurrently, it is committed; the registry in ``_tidewire.txns`` survives a
reopen; other writers racing for the same ids never make a transaction lose or duplicate data.

Part 2 builds the states a crash leaves behind with the real log (no mocks): the intent record
is written by hand into ``_tidewire.txns``, the data appended (or not) with exactly the ids the
intent names, the hub closed and reopened; then a commit of that transaction must settle it
right. A real crash follows: a child process (this file, run as a script) commits transactions
while plain writers append, and is SIGKILLed at a random moment; every transaction it started
is then replayed and must be stored exactly once, where its acknowledgement said.

Part 3 runs the hub's RS.io listener and the asyncio client on real sockets (default loop and
uvloop): ``publish(..., txn=)`` twice, the ``rsio.max_txn_bytes`` bound, a publisher that fails
mid-transaction, packed values in a transaction, and the hub's own publisher ``?streams``.

The bugs this file found (fingerprints of slices with empty key columns, cancelled commits,
retention of the registry, busy streams, client receipts) are fixed; their tests stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import tidewire
from helpers import child_env, hub_server
from tidewire.client.rsio import Receipt, RsioError
from tidewire.hub import Hub
from tidewire.hub.txn import TXN_STREAM, TxnReceipt, fingerprint
from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch, TidewireError
from tidewire.protocols.rsio import (
    EXT_PUBLISH,
    Committed,
    Connection,
    ConnectionClosed,
    Goodbye,
    HandshakeCompleted,
    Message,
    Offer,
    OfferEnded,
    OnComplete,
    OnError,
    OnNext,
    Request,
    Role,
    Subscribe,
    Subscribed,
)
from tidewire.protocols.rsio import Event as RsioEvent
from tidewire.server.rsio import OFFER_WINDOW, RsioServer, RsioSettings

TEST_TIMEOUT = 15.0  # seconds, per test: a hang fails instead of stalling the suite

Runner = Callable[[Coroutine[Any, Any, None]], None]


def arun(coro: Coroutine[Any, Any, None]) -> None:
    """Run a hub-level test on the default loop, bounded."""

    async def bounded() -> None:
        async with asyncio.timeout(TEST_TIMEOUT):
            await coro

    with asyncio.Runner() as r:
        r.run(bounded())


async def contents(hub: Hub, stream: str) -> list[tuple[int, bytes | None, bytes]]:
    """Every event of ``stream``: (id, key, value)."""
    return [(e.id, e.key, e.value) for b in await hub.read(stream, 1, 1 << 30) for e in b]


async def txn_records(hub: Hub) -> list[dict[str, Any]]:
    return [json.loads(e.value) for b in await hub.read(TXN_STREAM, 1, 1 << 30) for e in b]


async def write_intent(hub: Hub, txn: str, batch: Batch, first: int,
                       principal: str | None = "anonymous") -> None:  # fmt: skip
    """The intent record ``Transactions.commit`` writes before the data (module docstring of
    tidewire.hub.txn), written here by hand; ``principal=None``: the format from before
    transactions had keys (no principal)."""
    record = {"txn": txn, "stream": batch.stream, "first": first, "count": len(batch),
              "fp": fingerprint(batch)}  # fmt: skip
    if principal is not None:
        record["principal"] = principal
    data = json.dumps(record, separators=(",", ":")).encode()
    await hub.storage.append(Batch.build(TXN_STREAM, [data]), assign_ids=True)  # (the hub's own)


def receipt_of(stream: str, first: int, n: int, already: bool) -> TxnReceipt:
    return TxnReceipt(stream, n, first, first + n - 1, already)


def done(txn: str, stream: str = "s", principal: str | None = "anonymous") -> dict[str, Any]:
    """The record that says a transaction's data is durable."""
    record: dict[str, Any] = {"txn": txn, "stream": stream, "done": True}
    if principal is not None:
        record["principal"] = principal
    return record


# =========================================================================== 1. the hub


def test_commit_appends_once_and_a_repeat_returns_the_same_ids(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            await hub.append(Batch.build("s", [b"before"]), assign_ids=True)
            batch = Batch.build("s", [b"a", b"", b"c" * 300], keys=[b"k", None, b""])
            assert await hub.commit("q/1/0", batch) == receipt_of("s", 2, 3, False)
            # a replay (new timestamps, same content) and one with other content: nothing more
            replay = Batch.build("s", [b"a", b"", b"c" * 300], keys=[b"k", None, b""],
                                 timestamps=12345)  # fmt: skip
            assert await hub.commit("q/1/0", replay) == receipt_of("s", 2, 3, True)
            other = Batch.build("s", [b"x", b"y", b"z"])
            assert await hub.commit("q/1/0", other) == receipt_of("s", 2, 3, True)
            assert await contents(hub, "s") == [
                (1, None, b"before"), (2, b"k", b"a"), (3, None, b""), (4, b"", b"c" * 300)
            ]  # fmt: skip
            # another transaction id is another append, even with the same content
            assert await hub.commit("q/1/1", batch) == receipt_of("s", 5, 3, False)
            assert await hub.commit("q/1/1", batch) == receipt_of("s", 5, 3, True)
            assert [v for _, _, v in await contents(hub, "s")][4:] == [b"a", b"", b"c" * 300]
            assert hub.latest("s") == 7
            assert len(hub.txns) == 2
            # the registry: per commit an intent, then a done record, in that order
            records = await txn_records(hub)
            assert [(r["txn"], "done" in r) for r in records] == [
                ("q/1/0", False), ("q/1/0", True), ("q/1/1", False), ("q/1/1", True)
            ]  # fmt: skip
            assert records[0] == {"txn": "q/1/0", "stream": "s", "principal": "anonymous",
                                  "first": 2, "count": 3, "fp": fingerprint(batch)}  # fmt: skip
            assert records[1] == done("q/1/0")
        finally:
            await hub.close()

    arun(main())


def test_a_repeat_with_another_count_is_refused_another_stream_is_another_txn(
    tmp_path: Path,
) -> None:
    """Transactions are keyed by (principal, stream, id) (issue 20): the same id into another
    stream is another transaction; into the same stream with another count, a client bug."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            await hub.commit("t", Batch.build("s", [b"1", b"2"]))
            with pytest.raises(TidewireError, match=r"committed to 's' with 2 event\(s\), not 3"):
                await hub.commit("t", Batch.build("s", [b"1", b"2", b"3"]))
            assert await hub.commit("t", Batch.build("other", [b"1"])) == receipt_of(
                "other", 1, 1, False
            )
            assert (await hub.commit("t", Batch.build("other", [b"1"]))).already
            assert hub.latest("s") == 2
            # transaction ids are 1..1024 bytes
            for bad in ("", "é" * 513):
                with pytest.raises(TidewireError, match=r"1\.\.1024 bytes"):
                    await hub.commit(bad, Batch.build("s", [b"v"]))
            assert hub.latest("s") == 2
            longest = "x" * 1024
            assert await hub.commit(longest, Batch.build("s", [b"v"])) == receipt_of(
                "s", 3, 1, False
            )
            assert (await hub.commit(longest, Batch.build("s", [b"v"]))).already
        finally:
            await hub.close()

    arun(main())


def test_concurrent_commits_of_one_transaction_store_it_once(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            batch = Batch.build("s", [b"x%d" % i for i in range(10)])
            receipts = await asyncio.gather(*(hub.commit("same", batch) for _ in range(5)))
            assert {(r.first_id, r.last_id) for r in receipts} == {(1, 10)}
            assert sorted(r.already for r in receipts) == [False, True, True, True, True]
            assert [v for _, _, v in await contents(hub, "s")] == [b"x%d" % i for i in range(10)]
            # a few distinct transactions at once, each replayed at once too
            batches = {f"d{i}": Batch.build("s", [b"d%d.%d" % (i, j) for j in range(i + 1)])
                       for i in range(6)}  # fmt: skip
            calls = [(t, b) for t, b in batches.items() for _ in range(3)]
            random.Random(7).shuffle(calls)
            got = await asyncio.gather(*(hub.commit(t, b) for t, b in calls))
            by_txn: dict[str, set[tuple[int, int]]] = {}
            for (t, _), r in zip(calls, got, strict=True):
                by_txn.setdefault(t, set()).add((r.first_id, r.last_id))
            assert all(len(ids) == 1 for ids in by_txn.values())
            stored = {e[0]: e[2] for e in await contents(hub, "s")}
            assert len(stored) == 10 + sum(len(b) for b in batches.values())
            for t, b in batches.items():
                ((first, last),) = by_txn[t]
                assert [stored[i] for i in range(first, last + 1)] == [
                    b.value(j) for j in range(len(b))
                ]
        finally:
            await hub.close()

    arun(main())


def test_the_registry_survives_reopening(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        batch = Batch.build("s", [b"one", b"two"], keys=[None, b"k"])
        try:
            assert await hub.commit("r/1", batch) == receipt_of("s", 1, 2, False)
            assert await hub.commit("r/2", Batch.build("t", [b"x"])) == receipt_of("t", 1, 1, False)
        finally:
            await hub.close()
        for _ in range(2):
            hub = Hub.open(str(tmp_path))
            try:
                assert len(hub.txns) == 2
                assert await hub.commit("r/1", batch) == receipt_of("s", 1, 2, True)
                assert await hub.commit("r/2", Batch.build("t", [b"x"])) == receipt_of(
                    "t", 1, 1, True
                )
                with pytest.raises(TidewireError, match="was committed to 't' with 1"):
                    await hub.commit("r/2", Batch.build("t", [b"x", b"y"]))
                assert await contents(hub, "s") == [(1, None, b"one"), (2, b"k", b"two")]
                assert hub.latest("t") == 1
                # known as done: a repeat reads nothing and writes nothing
                assert len(await txn_records(hub)) == 4
            finally:
                await hub.close()

    arun(main())


def test_other_writers_racing_for_the_ids_never_lose_or_duplicate_a_transaction(
    tmp_path: Path,
) -> None:
    """Plain appends (ids assigned by the log) race with transactions for the same ids, so the
    transactions' appends with their own ids fail and are retried under new intents. Whatever
    happens, each transaction ends up stored once, where its receipts say, and every plain
    event once. (A commit may give up with "too busy" under this load: see
    test_many_transactions_into_one_stream_at_once_all_commit.)"""
    writers, appends, txns = 20, 30, 4

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:

            async def writer(w: int) -> None:
                for k in range(appends):
                    n = 1 + (w + k) % 3
                    values = [b"w%d.%d.%d" % (w, k, i) for i in range(n)]
                    await hub.append(Batch.build("s", values), assign_ids=True)

            def txn_batch(t: int) -> Batch:
                return Batch.build("s", [b"t%d.%d" % (t, i) for i in range(1 + t)],
                                   keys=[b"k%d" % t] + [None] * t)  # fmt: skip

            calls = [t for t in range(txns) for _ in range(2)]
            results = await asyncio.gather(
                *(writer(w) for w in range(writers)),
                *(hub.commit(f"race/{t}", txn_batch(t)) for t in calls),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException):
                    assert isinstance(result, TidewireError), result
                    assert "too busy" in str(result)
            during: dict[int, set[tuple[int, int]]] = {}
            for t, result in zip(calls, results[writers:], strict=True):
                if isinstance(result, TxnReceipt):
                    during.setdefault(t, set()).add((result.first_id, result.last_id))
            assert all(len(ids) == 1 for ids in during.values()), during
            # the retry path was taken: some transaction wrote more than one intent
            intents = Counter(r["txn"] for r in await txn_records(hub) if "done" not in r)
            assert max(intents.values()) > 1, intents
            # replayed without the load, every transaction commits, where it was stored before
            final = {t: await hub.commit(f"race/{t}", txn_batch(t)) for t in range(txns)}
            for t, receipt in final.items():
                if t in during:
                    assert receipt.already
                    assert during[t] == {(receipt.first_id, receipt.last_id)}
            events = await contents(hub, "s")
            counts = Counter(v for _, _, v in events)
            assert set(counts.values()) == {1}, [v for v, c in counts.items() if c > 1]
            plain = {b"w%d.%d.%d" % (w, k, i) for w in range(writers) for k in range(appends)
                     for i in range(1 + (w + k) % 3)}  # fmt: skip
            assert plain <= set(counts)
            by_id = {i: (key, v) for i, key, v in events}
            for t, receipt in final.items():
                b = txn_batch(t)
                assert receipt.count == len(b) == receipt.last_id - receipt.first_id + 1
                assert [by_id[i] for i in range(receipt.first_id, receipt.last_id + 1)] == [
                    (b.key(i), b.value(i)) for i in range(len(b))
                ]
            assert len(events) == len(plain) + sum(len(txn_batch(t)) for t in range(txns))
            ids = [i for i, _, _ in events]
            assert ids == sorted(set(ids))  # increasing; a retried commit may leave a gap
        finally:
            await hub.close()

    arun(main())


def test_many_transactions_into_one_stream_at_once_all_commit(tmp_path: Path) -> None:
    """E.g. a Spark micro-batch whose 32 partitions each commit their own transaction into one
    stream."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            results = await asyncio.gather(
                *(hub.commit(f"q/7/{p}", Batch.build("s", [b"p%d" % p])) for p in range(32)),
                return_exceptions=True,
            )
            errors = [str(r) for r in results if isinstance(r, BaseException)]
            assert errors == []
        finally:
            await hub.close()

    arun(main())


def test_a_retry_while_a_cancelled_commits_write_is_in_flight_stores_once(
    tmp_path: Path,
) -> None:
    """The log's writes run in the loop's default executor; a single worker, held by a gate
    once the intent is written, keeps the cancelled commit's data write in flight while the
    retry runs (real log and threads, no mocks)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        hub = Hub.open(str(tmp_path))
        gate = threading.Event()
        try:
            await hub.append(Batch.build("s", [b"x"]), assign_ids=True)
            batch = Batch.build("s", [b"a", b"b"])
            txns_before, s_before = hub.latest(TXN_STREAM), hub.storage.accepted_latest("s")
            first = asyncio.create_task(hub.commit("T", batch))
            while hub.latest(TXN_STREAM) == txns_before:  # noqa: ASYNC110 - no event
                await asyncio.sleep(0)  # the intent is written (by the worker thread)
            blocker = loop.run_in_executor(None, gate.wait)  # ahead of the data's write
            while hub.storage.accepted_latest("s") == s_before:  # noqa: ASYNC110 - no event
                await asyncio.sleep(0)  # the data append is queued
            first.cancel()
            txns_queued = hub.storage.accepted_latest(TXN_STREAM)
            retry = asyncio.create_task(hub.commit("T", batch))
            for _ in range(100):  # let the retry go as far as it can without the executor
                if retry.done() or hub.storage.accepted_latest(TXN_STREAM) != txns_queued:
                    break
                await asyncio.sleep(0)
            gate.set()
            await blocker
            with contextlib.suppress(asyncio.CancelledError):
                await first
            receipt = await retry
            assert await contents(hub, "s") == [(1, None, b"x"), (2, None, b"a"),
                                                (3, None, b"b")]  # fmt: skip
            assert receipt == receipt_of("s", 2, 2, True)
        finally:
            gate.set()
            await hub.close()

    arun(main())


def test_reopening_after_retention_trimmed_the_registry(tmp_path: Path) -> None:
    config = LogConfig(
        streams={TXN_STREAM: StreamSettings(segment_bytes=4096, retention_bytes=8192)},
        fsync=False,  # about the registry's contents only
    )

    async def main() -> None:
        hub = Hub.open(str(tmp_path), config)
        try:
            for i in range(100):
                await hub.commit(f"old/{i}", Batch.build("s", [b"%d" % i]))
            assert hub.enforce_retention() > 0
            assert hub.start_id(TXN_STREAM) > 1
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path), config)
        try:
            # the newest transaction's records are retained: it is still known
            assert await hub.commit("old/99", Batch.build("s", [b"99"])) == receipt_of(
                "s", 100, 1, True
            )
            assert hub.latest("s") == 100
        finally:
            await hub.close()

    arun(main())


# =========================================================================== 2. crash windows


def test_an_intent_without_data_is_committed_anew(tmp_path: Path) -> None:
    """Crash after the intent's fsync, before the data's append: the commit appends it."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        batch = Batch.build("s", [b"a", b"b", b"c"])
        fresh = Batch.build("new", [b"n"])
        try:
            await hub.append(Batch.build("s", [b"x", b"y"]), assign_ids=True)
            await write_intent(hub, "T", batch, hub.latest("s") + 1)
            await write_intent(hub, "U", fresh, 1)  # its stream was never created
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path))
        try:
            assert len(hub.txns) == 2
            assert await hub.commit("T", batch) == receipt_of("s", 3, 3, False)
            assert await hub.commit("U", fresh) == receipt_of("new", 1, 1, False)
            assert [v for _, _, v in await contents(hub, "s")] == [b"x", b"y", b"a", b"b", b"c"]
            assert await contents(hub, "new") == [(1, None, b"n")]
            assert await hub.commit("T", batch) == receipt_of("s", 3, 3, True)
            records = await txn_records(hub)
            assert records[-1] == done("U", "new")
            assert done("T") in records
        finally:
            await hub.close()

    arun(main())


@pytest.mark.parametrize(
    ("keyed", "neighbour"),
    [
        (False, None),
        (True, None),
        (True, "plain"),
        (True, "keyed"),
        (False, "plain"),
        (False, "keyed"),
    ],
)
def test_an_intent_with_its_data_but_no_done_is_not_appended_again(
    tmp_path: Path, keyed: bool, neighbour: str | None
) -> None:
    """Crash after the data's fsync, before the done record: the commit finds the data by its
    ids and fingerprint, appends nothing, and writes the done record. ``neighbour``: another
    writer's event appended in the same group commit as the data (one log record)."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        keys = [b"k1", None, b""] if keyed else None
        batch = Batch.build("s", [b"a", b"bb" * 50, b""], keys=keys, timestamps=111)
        try:
            await hub.append(Batch.build("s", [b"x"]), assign_ids=True)
            first = hub.latest("s") + 1
            await write_intent(hub, "T", batch, first)
            data = hub.append(batch.with_ids(first))
            if neighbour is None:
                await data
            else:
                other = Batch.build("s", [b"o"], keys=[b"ko"] if neighbour == "keyed" else None)
                await asyncio.gather(data, hub.append(other, assign_ids=True))
        finally:
            await hub.close()
        stored = disk_contents(tmp_path)
        hub = Hub.open(str(tmp_path))
        try:
            replay = Batch.build("s", [b"a", b"bb" * 50, b""], keys=keys, timestamps=999)
            assert await hub.commit("T", replay) == receipt_of("s", 2, 3, True)
            assert await contents(hub, "s") == stored
            assert (await txn_records(hub))[-1] == done("T")
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path))  # now known as done: settled once, recorded once
        try:
            assert await hub.commit("T", replay) == receipt_of("s", 2, 3, True)
            assert [r for r in await txn_records(hub) if r.get("done")] == [done("T")]
            assert await contents(hub, "s") == stored
        finally:
            await hub.close()

    arun(main())


def disk_contents(path: Path) -> list[tuple[int, bytes | None, bytes]]:
    """The stream ``s`` as the disk holds it (read through a fresh, read-only log)."""
    log = Log.open(str(path), read_only=True)
    try:
        return [(e.id, e.key, e.value) for b in log.read("s", 1, 1 << 30) for e in b]
    finally:
        log.close_sync()


@pytest.mark.parametrize(
    "others",
    [
        [b"o1", b"o2"],  # fewer events than the transaction's
        [b"o1", b"o2", b"o3"],  # as many, other values
        [b"a", b"b", b"c", b"o4", b"o5"],  # more, starting with the same values
    ],
)
def test_an_intent_whose_ids_another_writer_took_is_committed_anew(
    tmp_path: Path, others: list[bytes]
) -> None:
    """Crash after the intent, while another writer took ids F.. (with other content): the
    transaction's data was never stored, so the commit appends it now; nothing is lost."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        batch = Batch.build("s", [b"a", b"b", b"c"], keys=[b"k", b"k", b"k"])
        try:
            await hub.append(Batch.build("s", [b"x"]), assign_ids=True)
            await write_intent(hub, "T", batch, 2)
            await hub.append(Batch.build("s", others), assign_ids=True)  # ids 2..
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path))
        try:
            first = 2 + len(others)
            assert await hub.commit("T", batch) == receipt_of("s", first, 3, False)
            assert await contents(hub, "s") == [
                (1, None, b"x"),
                *[(2 + i, None, v) for i, v in enumerate(others)],
                (first, b"k", b"a"), (first + 1, b"k", b"b"), (first + 2, b"k", b"c"),
            ]  # fmt: skip
            assert await hub.commit("T", batch) == receipt_of("s", first, 3, True)
        finally:
            await hub.close()

    arun(main())


def test_same_values_other_keys_at_the_intents_ids_are_not_the_transaction(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        batch = Batch.build("s", [b"a", b"b"], keys=[b"k", None])
        try:
            await write_intent(hub, "T", batch, 1)
            await hub.append(Batch.build("s", [b"a", b"b"], keys=[b"K", None]), assign_ids=True)
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path))
        try:
            assert await hub.commit("T", batch) == receipt_of("s", 3, 2, False)
            assert [(k, v) for _, k, v in await contents(hub, "s")] == [
                (b"K", b"a"), (None, b"b"), (b"k", b"a"), (None, b"b")
            ]  # fmt: skip
        finally:
            await hub.close()

    arun(main())


# ------------------------------------------------------------------ a real crash (SIGKILL)

CRASH_STREAM = "crashing"
CRASH_ROUNDS = 2
CRASH_TXN_WORKERS = 3
CRASH_PLAIN_WRITERS = 2


def crash_batch(token: int) -> Batch:
    """The transaction ``token``'s batch: a pure function of it (its first event keyed, so that
    group commit's merging keeps its key columns)."""
    n = 1 + token % 7
    keys = [b"k%d" % token if i % 2 == 0 else None for i in range(n)]
    return Batch.build(CRASH_STREAM, [b"T%d.%d" % (token, i) for i in range(n)], keys=keys)


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def crash_child(directory: str, seed: int) -> None:
    """Commits transactions (``SEND token`` before, ``ACK token first last already`` after;
    sometimes a replay of an acknowledged one) while plain writers append, until killed."""
    hub = Hub.open(directory)
    emit("READY")
    rng = random.Random(seed)
    counter = iter(range(seed * 1_000_000, (seed + 1) * 1_000_000))

    async def commit(token: int) -> TxnReceipt:
        while True:
            try:
                return await hub.commit(f"crash/{token}", crash_batch(token))
            except TidewireError:  # "too busy" (should not happen any more); try again
                continue

    async def txn_worker() -> None:
        acked: list[int] = []
        while True:
            if acked and rng.random() < 0.2:
                token = rng.choice(acked)
            else:
                token = next(counter)
                emit(f"SEND {token}")
            r = await commit(token)
            emit(f"ACK {token} {r.first_id} {r.last_id} {int(r.already)}")
            acked.append(token)

    async def plain_writer(w: int) -> None:
        for k in range(10**9):
            values = [b"P%d.%d.%d.%d" % (seed, w, k, i) for i in range(1 + k % 3)]
            await hub.append(Batch.build(CRASH_STREAM, values), assign_ids=True)

    await asyncio.gather(*(txn_worker() for _ in range(CRASH_TXN_WORKERS)),
                         *(plain_writer(w) for w in range(CRASH_PLAIN_WRITERS)))  # fmt: skip


def run_crash_child(directory: Path, seed: int, kill_after: int, stderr_path: Path) -> list[str]:
    """Start the child, SIGKILL it once it printed ``kill_after`` lines; every line it printed."""
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, __file__, "crash-child", str(directory), str(seed)],
            stdout=subprocess.PIPE,
            stderr=stderr, env=child_env(),
        )
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    out: list[str] = []
    deadline = time.monotonic() + TEST_TIMEOUT
    try:
        while len(out) < kill_after:
            raw = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if raw is None:
                raise AssertionError(f"the child ended early: {stderr_path.read_text()}")
            out.append(raw.decode())
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=TEST_TIMEOUT)
        reader.join(timeout=TEST_TIMEOUT)
    while (raw := lines.get_nowait()) is not None:  # printed before it died
        out.append(raw.decode())
    return [line.rstrip("\n") for line in out if line.endswith("\n")]


def test_a_killed_committer_leaves_every_transaction_exactly_once(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    rng = random.Random(int(os.environ.get("TIDEWIRE_CRASH_SEED", "20240612")))
    sent: set[int] = set()
    acked: dict[int, tuple[int, int]] = {}
    for round_ in range(CRASH_ROUNDS):
        lines = run_crash_child(directory, round_ + 1, rng.randint(10, 40),
                                tmp_path / f"stderr.{round_}")  # fmt: skip
        assert lines[0] == "READY"
        for line in lines[1:]:
            kind, *fields = line.split()
            if kind == "SEND":
                assert int(fields[0]) not in sent
                sent.add(int(fields[0]))
                continue
            assert kind == "ACK", line
            token, first, last, already = (int(f) for f in fields)
            assert token in sent
            assert last - first + 1 == len(crash_batch(token))
            if token in acked:  # a replay in the child
                assert (acked[token], already) == ((first, last), 1)
            acked.setdefault(token, (first, last))

        async def settle() -> None:
            hub = Hub.open(str(directory))  # recovery, then the registry from the log
            try:
                receipts = {t: await hub.commit(f"crash/{t}", crash_batch(t)) for t in sent}
                for token, receipt in receipts.items():
                    if token in acked:
                        assert receipt.already
                        assert (receipt.first_id, receipt.last_id) == acked[token]
                    acked[token] = (receipt.first_id, receipt.last_id)
                events = await contents(hub, CRASH_STREAM)
                counts = Counter(v for _, _, v in events)
                assert set(counts.values()) == {1}, [v for v, c in counts.items() if c > 1]
                by_id = {i: (k, v) for i, k, v in events}
                for token, (first, last) in acked.items():
                    b = crash_batch(token)
                    assert [by_id.get(i) for i in range(first, last + 1)] == [
                        (b.key(i), b.value(i)) for i in range(len(b))
                    ]
                txn_values = sum(1 for v in counts if v.startswith(b"T"))
                assert txn_values == sum(len(crash_batch(t)) for t in sent)
            finally:
                await hub.close()

        arun(settle())
    assert len(sent) >= CRASH_ROUNDS


# =========================================================================== 3. over RS.io

RUN_SECONDS = TEST_TIMEOUT  # (the run fixture's bound, tests/conftest.py)


class RawClient:
    """A sans-IO client connection on a real socket: the test says exactly what is sent, and
    the connection machine checks what the hub sends (demand included)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = Connection(Role.CLIENT, extensions=(EXT_PUBLISH,))
        self.conn.initiate()
        self.flush()

    @classmethod
    async def open(cls, url: str) -> RawClient:
        host, port = url.removeprefix("rsio://").split(":")
        client = cls(*await asyncio.open_connection(host, int(port)))
        await client.until(HandshakeCompleted)
        return client

    def send(self, *messages: Message) -> None:
        for message in messages:
            self.conn.send(message)
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    async def until(self, kind: type[Any]) -> list[RsioEvent]:
        """Events up to and including the first of type ``kind``."""
        events: list[RsioEvent] = []
        while True:
            while (event := self.conn.next_event()) is not None:
                events.append(event)
                assert not isinstance(event, ConnectionClosed) or kind is ConnectionClosed, events
                assert not isinstance(event, OnError) or kind is OnError, events
                if isinstance(event, kind):
                    return events
            self.flush()
            data = await self.reader.read(65536)
            assert data or kind is ConnectionClosed, f"the hub closed the connection: {events}"
            self.conn.receive_data(data)

    async def close(self) -> None:
        if not self.conn.closed:
            self.send(Goodbye("done"))
            await self.until(ConnectionClosed)
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def test_publish_with_a_txn_twice_stores_once(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            values = [b"one", b"", b"three" * 100]
            async with tidewire.connect(url) as client:
                first = await client.publish("s", values, txn="q/1/s")
                assert first == Receipt(3, 1, 3)
                assert await client.publish("s", values, txn="q/1/s") == first
                keyed = Batch.build("s", [b"k1", b"k2"], keys=[b"key", None])
                assert await client.publish("s", keyed, txn="q/1/t") == Receipt(2, 4, 5)
            # the answer was lost: a new connection offers the transactions again
            async with tidewire.connect(url) as client:
                assert await client.publish("s", values, txn="q/1/s") == first
                assert await client.publish("s", keyed, txn="q/1/t") == Receipt(2, 4, 5)
                assert await client.publish("s", [b"plain"]) == Receipt(1, 6, 6)
                # another stream: another transaction (keyed by principal, stream and id)
                assert await client.publish("elsewhere", values, txn="q/1/s") == Receipt(3, 1, 3)
                with pytest.raises(RsioError, match="with 3 event"):
                    await client.publish("s", values[:2], txn="q/1/s")
                # a txn id needing percent-encoding, at the limit of 1024 bytes
                long_txn = "é&?%/" * 170 + "abcd"
                assert len(long_txn.encode()) == 1024
                assert await client.publish("s", [b"z"], txn=long_txn) == Receipt(1, 7, 7)
                assert await client.publish("s", [b"z"], txn=long_txn) == Receipt(1, 7, 7)
            assert await contents(hub, "s") == [
                (1, None, b"one"), (2, None, b""), (3, None, b"three" * 100),
                (4, b"key", b"k1"), (5, None, b"k2"), (6, None, b"plain"), (7, None, b"z"),
            ]  # fmt: skip
            assert [v for _, _, v in await contents(hub, "elsewhere")] == values

    run(main())


def test_a_transaction_over_max_txn_bytes_fails_and_stores_nothing(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        settings = RsioSettings(max_txn_bytes=1000)
        async with hub_server(tmp_path, settings) as (hub, _, url), tidewire.connect(url) as c:
            with pytest.raises(RsioError, match="exceed 1000 bytes"):
                await c.publish("s", [b"v" * 100] * 11, txn="big")
            assert hub.streams() == []  # neither the data nor the registry
            # what it held is released: a transaction within the bound goes through; the
            # failed one left no trace (offered again, it fails again, storing nothing)
            assert await c.publish("s", [b"v" * 100] * 9, txn="small") == Receipt(9, 1, 9)
            with pytest.raises(RsioError, match="exceed 1000 bytes"):
                await c.publish("s", [b"v" * 100] * 11, txn="big")
            assert hub.latest("s") == 9
            assert len(hub.txns) == 1
            # a plain offer is not bound by it
            assert await c.publish("s", [b"w" * 100] * 20) == Receipt(20, 10, 29)

    run(main())


def test_a_transaction_whose_publisher_fails_is_abandoned(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            raw = await RawClient.open(url)
            raw.send(Offer(1, "s?format=value&txn=q%2F9"))
            assert (await raw.until(Subscribe))[-1] == Subscribe(
                "s?format=value&txn=q%2F9", 1, OFFER_WINDOW
            )
            raw.send(Subscribed(1, 0), OnNext(1, b"v1"), OnNext(1, b"v2"))
            raw.send(OnError(1, "boom"))
            events = await raw.until(OfferEnded)
            assert not any(isinstance(e, Committed) for e in events), events
            ended = events[-1]
            assert isinstance(ended, OfferEnded)
            assert ended.error == "transaction abandoned: the publisher failed: boom"
            assert hub.streams() == []
            # the same transaction, offered again and completed, is stored (once)
            raw.send(Offer(1, "s?format=value&txn=q%2F9"))
            await raw.until(Subscribe)
            raw.send(Subscribed(1, 0), OnNext(1, b"v1"), OnNext(1, b"v2"), OnComplete(1))
            events = await raw.until(OfferEnded)
            assert [e for e in events if isinstance(e, Committed | OfferEnded)] == [
                Committed(1, 2, 1, 2), OfferEnded(1, "")
            ]  # fmt: skip
            await raw.close()
            assert [v for _, _, v in await contents(hub, "s")] == [b"v1", b"v2"]

    run(main())


async def until_gathered(server: RsioServer, n: int) -> None:
    """Wait (bounded by the test's timeout) until the hub holds ``n`` elements of an offer."""
    while sum(i.count for c in server.connections for i in c.inlets.values()) < n:  # noqa: ASYNC110
        await asyncio.sleep(0.001)


def test_a_transaction_of_packed_values(tmp_path: Path, run: Runner) -> None:
    """More elements than the hub's window: it requests more as they arrive, and stores them
    all at once at close."""
    n = 3 * OFFER_WINDOW + 17
    data = [i.to_bytes(8, "big") for i in range(n)]

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, server, url), tidewire.connect(url) as client:
            await client.publish("ticks", [b"x" * 8])
            receipts: list[Receipt] = []
            for _ in range(2):  # committed, then offered again: the same ids
                before = hub.latest("ticks")
                pub = await client.publisher("ticks", format="value", size=8, txn="ticks/1")
                futures = [await pub.submit(data[i : i + 5000]) for i in range(0, n, 5000)]
                await until_gathered(server, n)
                assert hub.latest("ticks") == before  # nothing is stored before close
                await pub.close()
                receipts.append(Receipt(n, (await futures[0]).first_id,
                                        (await futures[-1]).last_id))  # fmt: skip
                assert [(await f).count for f in futures] == [
                    len(data[i : i + 5000]) for i in range(0, n, 5000)
                ]
            assert receipts == [Receipt(n, 2, n + 1)] * 2
            stored = await hub.read("ticks", 2, 1 << 30)
            assert [e.value for b in stored for e in b] == data
            assert hub.latest("ticks") == n + 1

    run(main())


def test_streams_lists_what_the_hub_holds(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url), tidewire.connect(url) as client:
            assert await client.streams() == []
            assert await client.streams(["a"]) == [
                {"stream": "a", "exists": False, "first_id": None, "latest_id": 0,
                 "events": 0, "bytes": 0}
            ]  # fmt: skip
            await hub.append(Batch.build("a", [b"x" * 10] * 5), assign_ids=True)
            await hub.append(Batch.build("b,c%", [b"y"], ids=[40]))
            stats = {s.name: s for s in hub.streams()}
            rows = await client.streams()
            assert [r["stream"] for r in rows] == ["a", "b,c%"]
            assert rows[0] == {"stream": "a", "exists": True, "first_id": 1, "latest_id": 5,
                               "events": 5, "bytes": stats["a"].bytes}  # fmt: skip
            assert stats["a"].bytes > 50
            assert rows[1] == {"stream": "b,c%", "exists": True, "first_id": 40,
                               "latest_id": 40, "events": 1,
                               "bytes": stats["b,c%"].bytes}  # fmt: skip
            assert await client.streams(["b,c%", "missing", "a"]) == [
                rows[1],
                {"stream": "missing", "exists": False, "first_id": None, "latest_id": 0,
                 "events": 0, "bytes": 0},
                rows[0],
            ]  # fmt: skip
            # a committed transaction shows the registry's own stream too
            await client.publish("a", [b"t"], txn="t1")
            names = [r["stream"] for r in await client.streams()]
            assert names == [TXN_STREAM, "a", "b,c%"]  # sorted: "_" < "a"
            assert (await client.streams(["a"]))[0]["latest_id"] == 6

    run(main())


def test_streams_publisher_on_the_wire(tmp_path: Path, run: Runner) -> None:
    """``?streams`` honours demand: one element per request here (more would be a breach for
    this side's connection machine; the hub's own machine turns it into onError), then
    onComplete; ``?nope`` gets onError."""

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            for name in ("c", "a", "b"):
                await hub.append(Batch.build(name, [name.encode()] * 2), assign_ids=True)
            raw = await RawClient.open(url)
            raw.send(Subscribe("?streams", 1, 1))
            events = await raw.until(OnNext)
            assert [type(e) for e in events] == [Subscribed, OnNext]
            assert events[0] == Subscribed(1, 0)
            rows = [events[1]]
            for _ in range(2):
                # a round trip on another subscription: no element of 1 comes meanwhile
                raw.send(Subscribe("?streams=x", 2, 5))
                events = await raw.until(OnComplete)
                assert events == [Subscribed(2, 0), OnNext(2, b'{"stream":"x","exists":false,'
                                  b'"first_id":null,"latest_id":0,"events":0,"bytes":0}'),
                                  OnComplete(2)]  # fmt: skip
                raw.send(Request(1, 1))
                events = await raw.until(OnNext)
                assert [type(e) for e in events] == [OnNext], events
                rows.append(events[0])
            # all three delivered: onComplete needs no demand
            assert await raw.until(OnComplete) == [OnComplete(1)]
            decoded = []
            for row in rows:
                assert isinstance(row, OnNext)
                assert row.subscriber == 1
                decoded.append(json.loads(row.element))
            assert [(r["stream"], r["latest_id"], r["events"]) for r in decoded] == [
                ("a", 2, 2), ("b", 2, 2), ("c", 2, 2)
            ]  # fmt: skip
            raw.send(Subscribe("?nope", 3, 1))
            events = await raw.until(OnError)
            assert isinstance(events[-1], OnError)
            assert events[-1].subscriber == 3
            assert "unknown hub publisher '?nope'" in events[-1].error
            raw.send(Subscribe("?streams=%FF", 4, 1))  # not UTF-8 once decoded
            events = await raw.until(OnError)
            assert isinstance(events[-1], OnError)
            assert events[-1].subscriber == 4
            await raw.close()

    run(main())


def test_a_transaction_receipt_names_where_the_events_are(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url), tidewire.connect(url) as client:
            await client.publish("s", [b"x", b"y"])
            batch = Batch.build("s", [b"a", b"b"], ids=[100, 101])
            try:
                receipt = await client.publish("s", batch, assign_ids=False, txn="T")
            except (ValueError, RsioError):  # refusing the combination would do too
                assert hub.latest("s") == 2
                return
            stored = {i: v for i, _, v in await contents(hub, "s")}
            assert [stored.get(i) for i in range(receipt.first_id, receipt.last_id + 1)] == [
                b"a",
                b"b",
            ]

    run(main())


def _main(argv: Sequence[str]) -> None:
    if len(argv) == 4 and argv[1] == "crash-child":
        asyncio.run(crash_child(argv[2], int(argv[3])))
    else:
        raise SystemExit(f"usage: {argv[0]} crash-child DIRECTORY SEED")


if __name__ == "__main__":
    _main(sys.argv)
