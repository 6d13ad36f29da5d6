"""SIGKILL under mixed load (issue 11): every protocol's reconnecting client writes or reads
while the hub is killed and restarted, on the same ports and directory, several times.

Flows, all at once:

* RS.io/TCP publishes to ``k-rsio`` (hub ids; each offer a transaction: exactly once);
* RS.io over Tube publishes to ``k-tube`` with its own ids (exactly once for the only writer);
* RS.io/TCP follows ``k-tube``, Tube and RS.io over HTTP follow ``k-rsio`` (resumed after the
  last id each handed over);
* Seguro saves ``SAVE MANY`` batches for ``~zod`` (exactly once: ``WELCOME`` says what was
  stored);
* Tolliver: one instance sends reliable messages on ``k-tolliver``, another receives them
  through the hub (at least once, by the seed).

Afterwards: no acknowledged event is missing, no id (and, where the protocol allows it, no
value) appears twice within a stream, every subscriber saw exactly the stream's events in
order, and every client made progress after the last restart (it resumed).
``TIDEWIRE_FAULTS_SEED`` replays a run's timings.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from hubproc import HubProcess
from mixed_load import Mixed, finish_and_check

SEED = int(os.environ.get("TIDEWIRE_FAULTS_SEED", "20261121"))
KILLS = 3
BOUND = 150.0  # the whole test
STEP = 30.0  # the longest wait for any one condition


@pytest.mark.slow
@pytest.mark.timeout(BOUND + 30)
def test_sigkill_under_mixed_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    hub = HubProcess(tmp_path / "data", tmp_path / "hub.log")
    try:
        urls = hub.start()
        load = Mixed(urls, tmp_path)

        async def main() -> None:
            writers, readers = load.start_flows()

            async def progress_everywhere(what: str) -> None:
                await load.progress_everywhere(what, hub.log)

            for kill in range(KILLS):
                await progress_everywhere(f"before kill {kill + 1}")
                await asyncio.sleep(rng.uniform(0.0, 0.4))  # somewhere mid-commit
                await asyncio.to_thread(hub.kill)
                await asyncio.sleep(rng.uniform(0.0, 0.3))  # clients fail and back off
                await asyncio.to_thread(hub.start)
            await progress_everywhere("after the last restart")  # every client resumed
            await finish_and_check(load, writers, readers, STEP)
            for flow, count in load.reconnects.items():
                assert count() >= 1, f"{flow} never reconnected"

        asyncio.run(asyncio.wait_for(main(), BOUND))
        assert hub.starts == KILLS + 1
    finally:
        hub.stop()
