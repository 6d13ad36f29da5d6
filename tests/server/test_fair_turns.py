"""The adapters charge the loop time they spend on a connection to its principal and wait when
it is over its fair share (tidewire.hub.fairness): here an RS.io publisher's input slices."""

from __future__ import annotations

import asyncio
from pathlib import Path

import tidewire
from helpers import hub_server
from loops import Run
from tidewire.hub import Budget, FairnessLimits, LoopShares


def test_an_anonymous_publisher_over_its_share_waits_and_loses_nothing(
    tmp_path: Path, run: Run
) -> None:
    """Another principal keeps spending (as a busy named client would); the anonymous
    publisher's input is charged, it is told to wait (its reading paused), and everything it
    published is stored."""

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            # busy=0: every loop counts as contended; "token:good" spends a steady 10 % of it
            loop_shares = LoopShares(FairnessLimits(busy=0.0, anonymous=0.02))
            hub.budget = Budget(hub.budget.limits, loop_shares)
            stop = asyncio.Event()

            async def other() -> None:
                while not stop.is_set():
                    loop_shares.spend("token:good", 0.001)
                    await asyncio.sleep(0.01)

            spender = asyncio.create_task(other())
            try:
                async with await tidewire.connect(url) as client, asyncio.timeout(60):
                    for round_ in range(40):
                        await client.publish("s", [b"%06d" % (round_ * 2000 + i) + bytes(94)
                                                   for i in range(2000)])  # fmt: skip
            finally:
                stop.set()
                await spender
            assert hub.latest("s") == 40 * 2000
            assert loop_shares.throttles > 0  # the publisher's input waited
            assert loop_shares.share("anonymous") > 0

    run(main())
