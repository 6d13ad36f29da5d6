"""``subscribe_records`` gives demand back in ``Request`` frames of half its prefetch (issue 22:
one small write per record cost the Spark executor about a fifth of its read, in the kernel):
every prefetch still reads a range to its end, with no stall, whether the range is a multiple
of the refill or not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import tidewire
from helpers import hub_server
from tidewire.model import Batch


@pytest.mark.parametrize("prefetch", [1, 2, 3, 4, 16])
def test_every_record_arrives_whatever_the_prefetch(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None], prefetch: int
) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            for i in range(23):  # 23 records of 3 events: not a multiple of any refill
                await hub.append(Batch.build("r", [b"v%d" % (i * 3 + j) for j in range(3)]),
                                 assign_ids=True)  # fmt: skip
            async with tidewire.connect(url) as client:
                records = client.subscribe_records("r", from_id=1, until_id=69,
                                                   prefetch=prefetch)  # fmt: skip
                async with asyncio.timeout(20):  # a stall (demand not given back) fails here
                    got = [b async for b in records]
            assert len(got) == 23
            assert [e.id for b in got for e in b] == list(range(1, 70))
            assert [e.value for b in got for e in b] == [b"v%d" % i for i in range(69)]

    run(main())
