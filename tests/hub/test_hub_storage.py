"""The storage interface (tidewire.hub.storage) and the ledger (tidewire.hub.ledger).

A second implementation, :class:`MemoryStorage` (tests/memory_storage.py), runs the hub's
appends, reads, subscriptions, transactions and ledgers: the interface assumes no local disk.
The embedded log satisfies it too, and the hub forgets transaction ids once retention removed
their events."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from helpers import run
from memory_storage import MemoryStorage
from tidewire.hub import EmbeddedStorage, Hub, Ledger, Storage
from tidewire.log import LogConfig, StreamSettings
from tidewire.model import Batch, DataLossError, InvalidStreamName


def test_both_implementations_satisfy_the_protocol(tmp_path: Path) -> None:
    embedded = EmbeddedStorage.open(str(tmp_path))
    try:
        assert isinstance(embedded, Storage)
        assert isinstance(MemoryStorage(), Storage)
        assert embedded.describe() == str(tmp_path)
    finally:
        embedded.log.close_sync()


def test_the_hub_appends_reads_and_subscribes_on_a_storage_in_memory() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        hub = Hub(storage)
        stored = await hub.append(Batch.build("s", [b"a", b"b"]), assign_ids=True)
        assert (stored.first_id, stored.last_id) == (1, 2)
        await hub.append(Batch.build("s", [b"c"], ids=[10]))
        assert hub.latest("s") == 10
        assert hub.has_stream("s")
        assert hub.stream_names() == ["s"]
        assert [s.events for s in hub.streams()] == [3]
        assert hub.describe() == "memory"
        batches = await hub.read("s", 2)
        assert [v for b in batches for v in (b.value(i) for i in range(len(b)))] == [b"b", b"c"]

        sub = hub.subscribe("s", "earliest")
        sub.request(10)
        got = await sub.next()
        assert got is not None
        assert [b.first_id for b in got] == [1, 10]
        live = asyncio.ensure_future(sub.next())  # waits for the next commit
        await asyncio.sleep(0)
        assert not live.done()
        await hub.append(Batch.build("s", [b"d"]), assign_ids=True)
        delivered = await live
        assert delivered is not None
        assert delivered[0].value(0) == b"d"

        storage.trim("s", 11)  # retention, the backend's own
        with pytest.raises(DataLossError):
            hub.subscribe("s", 1)
        assert hub.start_id("s") == 11
        await hub.close()

    run(main())


def test_transactions_and_their_registry_on_a_storage_in_memory() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        hub = Hub(storage)
        receipt = await hub.commit("t/1", Batch.build("s", [b"x", b"y"]))
        assert (receipt.first_id, receipt.already) == (1, False)
        # another hub on the same storage (a restart) reads the registry from the ledger
        again = Hub(storage)
        assert len(again.txns) == 1
        assert (await again.commit("t/1", Batch.build("s", [b"x", b"y"]))).already
        assert storage.latest("s") == 2

    run(main())


def test_a_ledger_records_and_loads_json_objects_skipping_what_is_not() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        ledger = Ledger(storage, "_tidewire.test")
        await ledger.record({"a": 1})
        await storage.append(Batch.build("_tidewire.test", [b"not json", b"[1]"]),
                             assign_ids=True)  # fmt: skip
        await ledger.record({"b": [2, "x"]})
        assert list(Ledger(storage, "_tidewire.test").load()) == [{"a": 1}, {"b": [2, "x"]}]
        assert list(Ledger(storage, "_tidewire.none").load()) == []
        assert json.loads(storage.committed["_tidewire.test"][0].value(0)) == {"a": 1}
        with pytest.raises(InvalidStreamName):
            Hub(storage).ledger("plain")

    run(main())


def test_a_txn_id_is_forgotten_once_retention_removed_its_events() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        hub = Hub(storage)
        await hub.commit("old", Batch.build("s", [b"1", b"2"]))
        await hub.commit("new", Batch.build("s", [b"3"]))
        assert len(hub.txns) == 2
        storage.trim("s", 2)  # "old" in part: still known
        hub.enforce_retention()
        assert len(hub.txns) == 2
        storage.trim("s", 3)  # all of "old" gone
        hub.enforce_retention()
        assert len(hub.txns) == 1
        replay = await hub.commit("old", Batch.build("s", [b"1", b"2"]))
        assert not replay.already
        assert replay.first_id == 4
        assert (await hub.commit("new", Batch.build("s", [b"3"]))).already
        assert len(Hub(storage).txns) == 2  # reopened: what retention removed stays forgotten

    run(main())


def test_the_optional_age_bound_forgets_old_txn_ids() -> None:
    async def main() -> None:
        now = [1_000]
        hub = Hub(MemoryStorage(), clock=lambda: now[0], txn_expiration_ms=500)
        await hub.commit("a", Batch.build("s", [b"1"]))
        now[0] = 1_400
        await hub.commit("b", Batch.build("s", [b"2"]))
        now[0] = 1_600
        hub.enforce_retention()
        assert len(hub.txns) == 1
        assert not (await hub.commit("a", Batch.build("s", [b"1"]))).already
        assert (await hub.commit("b", Batch.build("s", [b"2"]))).already

    run(main())


def test_the_embedded_log_forgets_txn_ids_whose_segments_retention_deleted(
    tmp_path: Path,
) -> None:
    config = LogConfig(streams={"s": StreamSettings(segment_bytes=4096, retention_bytes=4096)},
                       fsync=False)  # fmt: skip

    async def main() -> None:
        hub = Hub.open(str(tmp_path), config)
        try:
            for i in range(60):
                await hub.commit(f"t/{i}", Batch.build("s", [b"%03d" % i * 40]))
            assert len(hub.txns) == 60
            assert hub.enforce_retention() > 0
            first = hub.start_id("s")
            assert first > 1
            assert len(hub.txns) == 60 - (first - 1)
        finally:
            await hub.close()
        hub = Hub.open(str(tmp_path), config)
        try:
            assert len(hub.txns) == 60 - (first - 1)
            assert (await hub.commit("t/59", Batch.build("s", [b"059" * 40]))).already
        finally:
            await hub.close()

    run(main())
