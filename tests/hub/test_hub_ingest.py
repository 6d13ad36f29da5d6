"""The hub's one ingest path (tidewire.hub.ingest): receipts in submission order, appends in
flight bounded, fences after a refusal, bytes held with one pause/resume signal, transactions.

Driven over :class:`MemoryStorage` (tests/memory_storage.py), whose appends complete when the test
says, in any order; no sockets, no sleeps."""

from __future__ import annotations

import asyncio

import pytest

from helpers import run
from memory_storage import MemoryStorage
from tidewire.config import ConfigError, load_config
from tidewire.hub import INGEST_DEFAULTS, Hub, Ingest, IngestLimits
from tidewire.model import Batch, IdOrderError, StorageFullError
from tidewire.server.serve import ingest_limits, rsio_settings


def batch(*values: bytes, stream: str = "s", ids: list[int] | None = None) -> Batch:
    return Batch.build(stream, list(values), ids=ids)


async def turns(n: int = 5) -> None:
    """Let callbacks run (completions drive the pipeline through future callbacks)."""
    for _ in range(n):
        await asyncio.sleep(0)


def ingest_on(storage: MemoryStorage, limits: IngestLimits | None = None,
              pauses: list[bool] | None = None) -> Ingest:  # fmt: skip
    hub = Hub(storage)
    return hub.ingest(via="test", limits=limits or IngestLimits(1000, 4, 100),
                      on_pause=None if pauses is None else pauses.append)  # fmt: skip


def test_receipts_resolve_in_submission_order_whatever_order_appends_complete() -> None:
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        pipeline = ingest_on(storage).pipeline()
        receipts = [pipeline.submit(batch(b"%d" % i), assign_ids=True) for i in range(3)]
        await turns()
        assert len(storage.pending) == 3
        assert pipeline.in_flight == 3
        storage.complete(2)  # the last first
        storage.complete(1)
        await turns()
        assert not any(r.done() for r in receipts)  # the first is not durable yet
        storage.complete(0)
        await turns()
        assert [r.result().first_id for r in receipts] == [1, 2, 3]
        assert pipeline.in_flight == 0
        assert len(pipeline) == 0

    run(main())


def test_at_most_appends_in_flight_the_rest_waits_in_the_pipeline() -> None:
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        pipeline = ingest_on(storage, IngestLimits(10_000, 2, 100)).pipeline()
        assert pipeline.has_room()
        receipts = [pipeline.submit(batch(b"x"), assign_ids=True) for _ in range(5)]
        await turns()
        assert storage.appends == 2
        assert pipeline.in_flight == 2
        assert len(pipeline) == 5
        assert not pipeline.has_room()
        storage.complete(0)
        await turns()
        assert storage.appends == 3
        assert receipts[0].done()
        while storage.pending:
            storage.complete(0)
            await turns()
        assert [r.result().first_id for r in receipts] == [1, 2, 3, 4, 5]

    run(main())


def test_own_ids_one_at_a_time_in_a_serial_pipeline() -> None:
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        ingest = ingest_on(storage)
        serial = ingest.pipeline(serial_own_ids=True)
        first = serial.submit(batch(b"a", ids=[10]))
        second = serial.submit(batch(b"b", ids=[11]))
        await turns()
        assert storage.appends == 1
        assert not serial.has_room(False)
        storage.complete(0)
        await turns()
        assert first.result().first_id == 10
        assert storage.appends == 2
        storage.complete(0)
        assert (await second).first_id == 11
        # not serial (Seguro: the session checked its ids): all in flight at once
        free = ingest.pipeline()
        for i in range(3):
            free.submit(batch(b"c", ids=[20 + i]))
        await turns()
        assert len(storage.pending) == 3

    run(main())


def test_after_a_refusal_what_is_in_flight_and_waiting_is_refused_then_it_starts_afresh() -> (
    None
):
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        pipeline = ingest_on(storage, IngestLimits(10_000, 2, 100)).pipeline()
        receipts = [pipeline.submit(batch(b"%d" % i), assign_ids=True) for i in range(4)]
        await turns()
        assert len(storage.pending) == 2
        storage.refuse(0)  # the disk is full
        storage.complete(0)  # in flight behind it, with the same fence: refused
        await turns()
        for receipt in receipts:
            with pytest.raises(StorageFullError):
                receipt.result()
        assert storage.latest("s") == 0
        assert storage.appends == 2
        assert len(pipeline) == 0
        # space again: a drained pipeline takes a new fence
        storage.hold = False
        assert (await pipeline.submit(batch(b"again"), assign_ids=True)).first_id == 1

    run(main())


def test_a_failure_other_than_space_also_refuses_what_waits_behind_it() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        pipeline = ingest_on(storage).pipeline(serial_own_ids=True)
        await pipeline.submit(batch(b"a", ids=[5]))
        stale = pipeline.submit(batch(b"b", ids=[5]))  # not above the latest
        behind = pipeline.submit(batch(b"c", ids=[6]))
        with pytest.raises(IdOrderError):
            await stale
        with pytest.raises(IdOrderError):
            await behind
        assert storage.latest("s") == 5

    run(main())


def test_bytes_held_pause_above_the_limit_resume_at_half() -> None:
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        pauses: list[bool] = []
        ingest = ingest_on(storage, IngestLimits(100, 4, 10), pauses)
        pipeline = ingest.pipeline()
        ingest.hold(60)  # an adapter's partial batch
        assert pauses == []
        assert ingest.pending_bytes == 60
        ingest.hold(60)
        assert pauses == [True]
        assert ingest.paused
        ingest.hold(10)
        assert pauses == [True]  # one signal, not one per hold
        receipt = pipeline.submit(batch(b"x" * 70), assign_ids=True, held=70)
        ingest.release(20)  # discarded by the adapter
        assert ingest.pending_bytes == 110
        assert pauses == [True]
        await turns()
        storage.complete(0)
        await receipt
        assert ingest.pending_bytes == 40
        assert pauses == [True, False]
        assert not ingest.paused

    run(main())


def test_a_failed_append_releases_its_bytes_and_close_drops_what_waits() -> None:
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        ingest = ingest_on(storage, IngestLimits(10_000, 1, 10))
        pipeline = ingest.pipeline()
        for _ in range(3):
            ingest.hold(5)
        first = pipeline.submit(batch(b"1"), assign_ids=True, held=5)
        waiting = pipeline.submit(batch(b"2"), assign_ids=True, held=5)
        await turns()
        pipeline.close()  # the connection went: what never reached the storage is dropped
        assert waiting.cancelled()
        assert ingest.pending_bytes == 10
        late = pipeline.submit(batch(b"3"), assign_ids=True, held=5)
        assert late.cancelled()
        assert ingest.pending_bytes == 5
        storage.refuse(0)
        await turns()
        with pytest.raises(StorageFullError):
            first.result()
        assert ingest.pending_bytes == 0

    run(main())


def test_transactions_through_the_ingest_path_are_stored_once() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        ingest = ingest_on(storage)
        first = await ingest.submit_txn("q/1", batch(b"a", b"b"))
        again = await ingest.submit_txn("q/1", batch(b"a", b"b"))
        assert (first.first_id, first.last_id, first.already) == (1, 2, False)
        assert (again.first_id, again.last_id, again.already) == (1, 2, True)
        assert storage.latest("s") == 2

    run(main())


def test_transactions_are_the_principals_and_the_principal_follows_the_share() -> None:
    """``submit_txn`` commits as :attr:`Ingest.principal` (transactions are keyed by
    principal, stream and id); with a share, that is the share's principal, and setting it
    rebinds the share (the peer authenticated)."""

    async def main() -> None:
        storage = MemoryStorage()
        hub = Hub(storage)
        alone = hub.ingest(via="test", principal="token:a")
        assert not (await alone.submit_txn("q/1", batch(b"a"))).already
        share = hub.budget.share("anonymous", "peer")
        ingest = hub.ingest(via="test", share=share)
        assert ingest.principal == "anonymous"
        assert not (await ingest.submit_txn("q/1", batch(b"b"))).already
        ingest.principal = "token:a"
        assert share.principal == "token:a"
        assert (await ingest.submit_txn("q/1", batch(b"a"))).already
        share.rebind("token:b")
        assert ingest.principal == "token:b"
        assert not (await ingest.submit_txn("q/1", batch(b"c"))).already
        assert storage.latest("s") == 3

    run(main())


def test_bytes_held_are_the_shares_ingest_gauge() -> None:
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        hub = Hub(storage)
        share = hub.budget.share("token:a", "peer")
        ingest = hub.ingest(via="test", limits=IngestLimits(1000, 4, 100), share=share)
        ingest.hold(300)
        assert share.gauge("ingest") == 300
        assert hub.budget.used_by("token:a") == 300
        receipt = ingest.pipeline().submit(batch(b"x" * 300), assign_ids=True, held=300)
        await turns()
        assert share.gauge("ingest") == 300  # in flight: still waiting for the log
        storage.complete(0)
        await turns()
        assert receipt.done()
        assert share.gauge("ingest") == 0
        assert hub.budget.used == 0

    run(main())


def test_the_hub_gives_each_protocol_its_limits() -> None:
    hub = Hub(MemoryStorage())
    assert hub.ingest(via="rsio").limits.max_pending_bytes == 8 * 1024 * 1024
    assert hub.ingest(via="seguro").limits.max_pending_bytes == 16 * 1024 * 1024
    assert hub.ingest(via="tolliver").limits.max_pending_bytes == 32 * 1024 * 1024
    assert hub.ingest(via="other").limits == IngestLimits()
    with pytest.raises(ValueError, match="positive"):
        IngestLimits(0)


def test_the_settings_make_one_family_of_limits() -> None:
    defaults = ingest_limits(load_config(None, environ={}))
    assert defaults == INGEST_DEFAULTS
    assert rsio_settings(load_config(None, environ={})).ingest_limits() == INGEST_DEFAULTS["rsio"]
    config = load_config(None, {"ingest.max_pending_bytes": "65536",
                                "ingest.appends_in_flight": "2"}, environ={})  # fmt: skip
    limits = ingest_limits(config)
    assert {v.max_pending_bytes for v in limits.values()} == {65536}
    assert {v.appends_in_flight for v in limits.values()} == {2}
    assert limits["seguro"].commit_bytes == 256 * 1024  # (0: each protocol's own)
    only_rsio = load_config(None, {"rsio.max_inlet_bytes": "8192"}, environ={})
    assert rsio_settings(only_rsio).max_inlet_bytes == 8192
    assert ingest_limits(only_rsio)["seguro"] == INGEST_DEFAULTS["seguro"]
    with pytest.raises(ConfigError, match="below 4096"):
        load_config(None, {"ingest.max_pending_bytes": "100"}, environ={})


def test_append_runs_inline_when_it_may_start_and_keeps_the_order_of_receipts() -> None:
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        pipeline = ingest_on(storage).pipeline()
        first = pipeline.submit(batch(b"a"), assign_ids=True)
        second = asyncio.ensure_future(pipeline.append(batch(b"b"), assign_ids=True))
        await turns()
        assert storage.appends == 2  # both in flight: the append did not wait for the first
        assert pipeline.in_flight == 2
        storage.complete(1)  # the append's own write is durable first
        await turns()
        assert not second.done()  # ... but its receipt waits for the earlier one
        storage.complete(0)
        await turns()
        assert first.result().first_id == 1
        assert second.result().first_id == 2
        assert (pipeline.in_flight, len(pipeline)) == (0, 0)

    run(main())


def test_append_waits_in_the_pipeline_when_no_append_may_start() -> None:
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        pipeline = ingest_on(storage, IngestLimits(10_000, 1, 100)).pipeline()
        first = pipeline.submit(batch(b"a"), assign_ids=True)
        second = asyncio.ensure_future(pipeline.append(batch(b"b"), assign_ids=True))
        await turns()
        assert storage.appends == 1  # one in flight at most
        storage.complete(0)
        await turns()
        assert first.done()
        assert storage.appends == 2
        storage.complete(0)
        await turns()
        assert second.result().first_id == 2

    run(main())


def test_a_refused_inline_append_raises_and_refuses_what_waits_behind_it() -> None:
    async def main() -> None:
        storage = MemoryStorage(hold=True)
        ingest = ingest_on(storage, IngestLimits(10_000, 1, 100))
        pipeline = ingest.pipeline()
        ingest.hold(2)
        lone = asyncio.ensure_future(pipeline.append(batch(b"a"), assign_ids=True, held=1))
        await turns()
        ingest.hold(1)
        behind = pipeline.submit(batch(b"b"), assign_ids=True, held=1)
        storage.refuse(0)  # the disk is full
        await turns()
        with pytest.raises(StorageFullError):
            lone.result()
        with pytest.raises(StorageFullError):
            behind.result()
        assert storage.appends == 1  # what waited was refused, not appended
        assert ingest.pending_bytes == 1  # the two appends' bytes are released

    run(main())
