"""Stream administration through the hub's doors (issue 23): create a stream with its
retention, change a stream's retention at run time (kept over the configuration's across
restarts), delete a stream (its files, its subscriptions, its transactions)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from helpers import run
from memory_storage import MemoryStorage
from tidewire.hub import EmbeddedStorage, Hub
from tidewire.hub.access import Access, Acl, Principal
from tidewire.hub.hub import NotSupported, StreamDeleted
from tidewire.log import LogConfig, StreamExists, StreamSettings
from tidewire.log.admin import DELETING_PREFIX
from tidewire.model import Batch, Forbidden, InvalidStreamName, LogError, UnknownStream

SMALL = StreamSettings(segment_bytes=4096)


def _config(**streams: StreamSettings) -> LogConfig:
    return LogConfig(defaults=SMALL, streams=dict(streams))


async def _fill(hub: Hub, stream: str, n: int, size: int = 500) -> None:
    for i in range(n):
        await hub.append(Batch.build(stream, [bytes([65 + i % 26]) * size]), assign_ids=True)


def _values(batches: list[Batch]) -> list[bytes]:
    return [b.value(i) for b in batches for i in range(len(b))]


def test_created_stream_keeps_its_runtime_retention_over_the_config_across_restarts(
    tmp_path: Path,
) -> None:
    config = _config(orders=StreamSettings(segment_bytes=4096, retention_ms=1000))

    async def first() -> None:
        hub = Hub.open(str(tmp_path), config)
        before = hub.retention("orders")
        assert before is not None
        assert (before.ms, before.bytes, before.source) == (
            1000, None, "config")
        await hub.create_stream("orders", None, 8192, runtime=True)
        await hub.create_stream("plain")
        assert hub.has_stream("orders")
        assert hub.latest("orders") == 0
        with pytest.raises(StreamExists):
            await hub.create_stream("orders")
        now = hub.retention("orders")
        assert now is not None
        assert (now.ms, now.bytes, now.source) == (None, 8192, "runtime")
        plain = hub.retention("plain")
        assert plain is not None
        assert plain.source == "default"
        await hub.close()

    async def second() -> None:
        hub = Hub.open(str(tmp_path), config)
        kept = hub.retention("orders")
        assert kept is not None
        assert (kept.ms, kept.bytes, kept.source) == (None, 8192, "runtime")
        # the config's 1 s is not what applies: old events stay, the byte bound cuts
        await _fill(hub, "orders", 40)
        assert hub.enforce_retention(now=10**15) > 0
        stats = {s.name: s for s in hub.streams()}
        assert 8192 <= stats["orders"].bytes < 8192 + 2 * 4096
        await hub.close()

    run(first())
    run(second())


def test_retention_changed_at_run_time_applies_and_survives_a_restart(tmp_path: Path) -> None:
    async def first() -> None:
        hub = Hub.open(str(tmp_path), _config())
        await _fill(hub, "s", 40)
        assert hub.enforce_retention(now=10**15) == 0  # (the config keeps everything)
        await hub.set_retention("s", None, 4096)
        assert hub.enforce_retention(now=10**15) > 0
        assert hub.start_id("s") > 1
        with pytest.raises(UnknownStream):
            await hub.set_retention("nope", 1, 1)
        await hub.close()

    async def second() -> None:
        hub = Hub.open(str(tmp_path), _config())
        r = hub.retention("s")
        assert r is not None
        assert (r.ms, r.bytes, r.source) == (None, 4096, "runtime")
        await hub.set_retention("s", None, None)  # keep forever, still the runtime's say
        r = hub.retention("s")
        assert r is not None
        assert (r.ms, r.bytes, r.source) == (None, None, "runtime")
        await hub.close()

    run(first())
    run(second())


def test_delete_ends_subscriptions_removes_files_and_a_new_stream_starts_at_one(
    tmp_path: Path,
) -> None:
    async def first() -> None:
        hub = Hub.open(str(tmp_path), _config())
        await _fill(hub, "s", 20)
        await _fill(hub, "other", 2)
        sub = hub.subscribe("s", "latest")
        sub.request(10)
        waiting = asyncio.ensure_future(sub.next())
        await asyncio.sleep(0)
        assert not waiting.done()
        dirs = set(os.listdir(tmp_path))
        await hub.delete_stream("s")
        with pytest.raises(StreamDeleted) as caught:
            await asyncio.wait_for(waiting, 10)
        assert str(caught.value) == "stream deleted"
        assert not hub.has_stream("s")
        assert hub.stream_names().count("other") == 1
        left = set(os.listdir(tmp_path))
        assert len(dirs - left) == 1
        assert not any(d.startswith(".deleting") for d in left)
        with pytest.raises(UnknownStream):
            await hub.delete_stream("s")
        stored = await hub.append(Batch.build("s", [b"new"]), assign_ids=True)
        assert stored.first_id == 1
        await hub.close()

    async def second() -> None:
        # the journal's entries of the old stream are never replayed into the new one
        hub = Hub.open(str(tmp_path), _config())
        assert _values(await hub.read("s", 1)) == [b"new"]
        assert hub.latest("s") == 1
        assert len(_values(await hub.read("other", 1))) == 2
        await hub.close()

    run(first())
    run(second())


def test_delete_forgets_the_streams_transactions_also_after_a_restart(tmp_path: Path) -> None:
    async def first() -> None:
        hub = Hub.open(str(tmp_path), _config())
        receipt = await hub.commit("t1", Batch.build("s", [b"a", b"b"]))
        assert not receipt.already
        assert (await hub.commit("t1", Batch.build("s", [b"a", b"b"]))).already
        await hub.delete_stream("s")
        again = await hub.commit("t1", Batch.build("s", [b"c"]))
        assert not again.already
        assert hub.latest("s") == 1
        await hub.close()

    async def second() -> None:
        hub = Hub.open(str(tmp_path), _config())
        repeat = await hub.commit("t1", Batch.build("s", [b"c"]))
        assert repeat.already  # (the new stream's transaction is remembered)
        await hub.close()

    run(first())
    run(second())


def test_a_deletion_a_crash_interrupted_is_finished_at_open(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path), _config())
        await _fill(hub, "s", 3)
        await hub.close()

    run(main())
    [own] = [d for d in os.listdir(tmp_path) if not d.startswith((".", "_"))]
    os.rename(tmp_path / own, tmp_path / (DELETING_PREFIX + own))  # (the crash: after rename)

    async def reopen() -> None:
        hub = Hub.open(str(tmp_path), _config())
        assert not hub.has_stream("s")
        assert not any(d.startswith(DELETING_PREFIX) for d in os.listdir(tmp_path))
        await hub.close()

    run(reopen())


def test_refusals() -> None:
    async def main() -> None:
        hub = Hub(MemoryStorage())
        assert hub.retention("s") is None
        with pytest.raises(NotSupported, match="not supported by this storage"):
            await hub.create_stream("s")
        with pytest.raises(NotSupported):
            await hub.delete_stream("s")

    run(main())


def test_the_hubs_own_streams_are_not_the_operators(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path), _config())
        await hub.commit("t", Batch.build("s", [b"a"]))
        with pytest.raises(InvalidStreamName):
            await hub.delete_stream("_tidewire.txns")
        with pytest.raises(InvalidStreamName):
            await hub.set_retention("_tidewire.txns", 1, None)
        await hub.close()

    run(main())


def test_a_crash_after_delete_and_recreate_replays_nothing_of_the_old_stream(
    tmp_path: Path,
) -> None:
    """The journal's entries for the deleted stream's directory come before the checkpoint
    the deletion takes: a crash (the directory copied while the log runs, no final checkpoint)
    replays none of them into the new stream of the same name."""
    data, copy = tmp_path / "data", tmp_path / "crash"
    config = LogConfig(defaults=SMALL, checkpoint_interval_s=3600.0)

    async def main() -> None:
        hub = Hub.open(str(data), config)
        try:
            await _fill(hub, "s", 30, size=100)
            await hub.delete_stream("s")
            await hub.append(Batch.build("s", [b"new"]), assign_ids=True)
            shutil.copytree(data, copy, ignore=shutil.ignore_patterns(".lock"))
        finally:
            await hub.close()

    run(main())

    async def reopen() -> None:
        hub = Hub.open(str(copy), config)
        assert _values(await hub.read("s", 1)) == [b"new"]
        await hub.close()

    run(reopen())


def test_the_admin_right_is_a_list_of_patterns_and_never_the_open_default() -> None:
    ops, anonymous = Principal("token:ops"), Principal("anonymous")
    open_hub = Access()
    assert open_hub.may(anonymous, "write", "orders")  # (reads and writes stay open)
    assert not open_hub.may(anonymous, "admin", "orders")
    with pytest.raises(Forbidden, match="no ACL file grants admin"):
        open_hub.check(anonymous, "admin", "orders")
    acl = Acl.parse('[principal."token:*"]\nwrite = ["*"]\n'
                    '[principal."token:ops"]\nadmin = ["orders*", "_tidewire.audit"]\n')
    access = Access(acl)
    access.check(ops, "admin", "orders.eu")
    assert not access.may(ops, "admin", "clicks")
    assert not access.may(Principal("token:ci"), "admin", "orders")  # (write is not admin)
    assert not access.may(ops, "read", "orders")  # (admin is not read)
    assert access.may(ops, "admin", "_tidewire.audit")  # (named; the hub refuses it anyway)
    assert not Acl.parse('[principal.a]\nadmin = ["*"]\n').allows(
        Principal("a"), "admin", "_tidewire.txns")


def test_appends_racing_a_delete_are_stored_or_refused_never_left_waiting(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path), LogConfig(defaults=SMALL, max_pending_bytes=64 * 1024))
        await _fill(hub, "s", 1)
        appends = [asyncio.ensure_future(hub.append(Batch.build("s", [b"x" * 30000]),
                                                    assign_ids=True)) for _ in range(12)]
        await asyncio.sleep(0)  # (each has queued, or waits for room in the queue)
        assert isinstance(hub.storage, EmbeddedStorage)
        deleting = asyncio.ensure_future(hub.storage.log.delete_stream("s"))
        await asyncio.sleep(0)  # (the deletion has begun: appends from now on are refused)
        with pytest.raises(LogError, match="being deleted"):
            await hub.append(Batch.build("s", [b"late"]), assign_ids=True)
        await deleting
        results = await asyncio.wait_for(asyncio.gather(*appends, return_exceptions=True), 20)
        refused = [r for r in results if isinstance(r, LogError)]
        assert len(refused) + sum(isinstance(r, Batch) for r in results) == len(results)
        assert not hub.has_stream("s")
        stored = await hub.append(Batch.build("s", [b"again"]), assign_ids=True)
        assert stored.first_id == 1
        await hub.close()

    run(main())
