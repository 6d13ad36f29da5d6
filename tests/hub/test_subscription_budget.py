"""A subscription's read-ahead within its connection's memory budget (issue 20): it reads ahead
only if its :class:`~tidewire.hub.subscription.Account` lets it hold ``readahead_bytes``,
otherwise one delivery at a time; what it keeps (its carry) is recorded there, and returned
when it is cancelled. ``wait_ready`` waits for demand and events without reading."""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers import run
from tidewire.hub import Budget, BudgetLimits, Hub
from tidewire.model import Batch
from tidewire.server.rsio_flow import ReadAhead

KiB = 1024
MiB = 1024 * KiB


async def filled(path: Path) -> Hub:
    hub = Hub.open(str(path))
    for _ in range(16):  # 16 records of 16 x 4 KiB: 1 MiB
        await hub.append(Batch.build("s", [b"v" * 4 * KiB] * 16), assign_ids=True)
    return hub


def test_read_ahead_is_charged_and_returned(tmp_path: Path) -> None:
    async def main() -> None:
        hub = await filled(tmp_path)
        share = Budget().share()
        sub = hub.subscribe("s", max_batch_bytes=64 * KiB)
        sub.readahead_bytes = 512 * KiB
        sub.account = ReadAhead(share).account()
        sub.request(2**63 - 1)
        first = await sub.next()
        assert first is not None
        delivered = sum(b.nbytes for b in first)
        assert delivered <= 64 * KiB + 64 * KiB  # (one record over a delivery at most)
        carry = share.gauge("readahead")
        assert 256 * KiB < carry <= 512 * KiB  # read ahead, kept for the next deliveries
        await sub.next()
        assert share.gauge("readahead") < carry  # spent as it is delivered
        sub.cancel()
        assert share.gauge("readahead") == 0
        await hub.close()

    run(main())


def test_without_room_in_the_budget_it_reads_what_it_sends(tmp_path: Path) -> None:
    async def main() -> None:
        hub = await filled(tmp_path)
        budget = Budget(BudgetLimits(total=4 * MiB, principal=2 * MiB, connection=1 * MiB))
        share = budget.share()
        assert share.try_hold("outbound", 1 * MiB - 100 * KiB)  # the share is nearly used
        sub = hub.subscribe("s", max_batch_bytes=64 * KiB)
        sub.readahead_bytes = 512 * KiB
        sub.account = ReadAhead(share).account()
        sub.request(2**63 - 1)
        batches = await sub.next()
        assert batches
        assert share.gauge("readahead") <= 64 * KiB + 64 * KiB  # at most one record beyond
        assert budget.refused >= 1
        sub.cancel()
        await hub.close()

    run(main())


def test_wait_ready_reads_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        sub = hub.subscribe("t")
        waiting = asyncio.create_task(sub.wait_ready())
        await asyncio.sleep(0)
        sub.request(1)  # demand, but no events yet
        await asyncio.sleep(0)
        assert not waiting.done()
        await hub.append(Batch.build("t", [b"x"]), assign_ids=True)
        async with asyncio.timeout(5):
            await waiting
        assert sub.next_id == 1  # nothing was read: the position did not move
        assert (await sub.next()) is not None
        assert sub.next_id == 2
        await hub.close()

    run(main())
