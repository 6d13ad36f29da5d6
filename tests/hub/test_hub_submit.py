"""Appends without a coroutine (issue 22, round 3): ``Log.submit``, ``Hub.submit`` and
``Pipeline.begin`` on the embedded log (a real one, in a temporary directory): the same checks,
order, durability and metrics as ``append``, or ``None`` (nothing queued) where the caller must
take the coroutine's way; the pipeline's ``submit`` beside them; ``one_event``."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import run
from memory_storage import MemoryStorage
from tidewire.hub import Hub, IngestLimits
from tidewire.hub.ingest import one_event
from tidewire.log import Log, LogConfig
from tidewire.model import MAX_ID, Batch, IdOrderError, InvalidBatch


def one(event_id: int, value: bytes = b"v", stream: str = "s") -> Batch:
    return Batch.build(stream, [value], ids=[event_id])


def test_log_submit_queues_at_once_or_says_none(tmp_path: Path) -> None:
    async def main() -> None:
        log = Log.open(str(tmp_path), LogConfig(max_pending_bytes=4096))
        try:
            assert log.submit(one(1)) is None  # (no stream yet: append creates it)
            await log.append(one(1))
            future = log.submit(one(2, b"two"))
            assert future is not None
            assert log.accepted_latest("s") == 2  # queued at once, in call order
            with pytest.raises(IdOrderError):
                log.submit(one(2))  # (the checks of append, raised here)
            stored = await future
            assert (stored.first_id, stored.value(0)) == (2, b"two")
            assert log.latest("s") == 2
            # No room in the stream's queue: nothing queued, append waits for room instead.
            big = Batch.build("s", [bytes(3000)], ids=[3])
            first = log.submit(big)
            assert first is not None
            assert log.submit(Batch.build("s", [bytes(3000)], ids=[4])) is None
            assert log.accepted_latest("s") == 3
            await first
        finally:
            await log.close()
        again = Log.open(str(tmp_path))
        try:
            assert again.latest("s") == 3  # durable
        finally:
            await again.close()

    run(main())


def test_hub_submit_counts_what_is_stored_and_needs_the_embedded_log(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            first = await hub.append(one(1), via="seguro")
            future = hub.submit(one(2, b"22"), via="seguro")
            assert future is not None
            second = await future
            assert hub.metrics.totals("s")[:2] == (2, first.nbytes + second.nbytes)
        finally:
            await hub.close()
        assert Hub(MemoryStorage()).submit(one(1)) is None  # (no such path: append)

    run(main())


def test_pipeline_begin_only_when_nothing_is_in_flight_and_keeps_the_order(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            await hub.append(one(1))
            ingest = hub.ingest(via="test", limits=IngestLimits(10_000, 4, 100))
            pipeline = ingest.pipeline()
            ingest.hold(1)
            began = pipeline.begin(one(2), held=1)
            assert began is not None
            assert pipeline.in_flight == 1
            assert pipeline.begin(one(3)) is None  # (one in flight: submit or append)
            receipt = pipeline.submit(one(3), held=0)
            assert (await began).first_id == 2
            assert (await receipt).first_id == 3
            assert ingest.pending_bytes == 0  # (released by the pipeline's own callback)
            assert pipeline.in_flight == 0
            assert len(pipeline) == 0
            assert hub.latest("s") == 3
        finally:
            await hub.close()

    run(main())


def test_pipeline_submit_over_the_embedded_log_resolves_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            await hub.append(one(1))
            pipeline = hub.ingest(via="test").pipeline()
            receipts = [pipeline.submit(one(i)) for i in range(2, 6)]
            refused = pipeline.submit(one(5))  # (an id already queued: refused, not stored)
            assert [(await r).first_id for r in receipts] == [2, 3, 4, 5]
            with pytest.raises(IdOrderError):
                await refused
            assert hub.latest("s") == 5
        finally:
            await hub.close()

    run(main())


@pytest.mark.parametrize("value", [b"", b"x", bytes(range(256)) * 4])
@pytest.mark.parametrize("event_id", [1, 42, MAX_ID])
def test_one_event_is_the_batch_the_builder_makes(event_id: int, value: bytes) -> None:
    made = one_event("~zod", event_id, value, timestamp=1234)
    assert made == Batch.build("~zod", [value], ids=[event_id], timestamps=1234)
    assert made.owned() is made  # (immutable buffers: the log takes it without a copy)
    assert made.validate() is made


@pytest.mark.parametrize("event_id", [0, -1, MAX_ID + 1])
def test_one_event_refuses_an_id_out_of_range(event_id: int) -> None:
    with pytest.raises(InvalidBatch):
        one_event("~zod", event_id, b"x")
