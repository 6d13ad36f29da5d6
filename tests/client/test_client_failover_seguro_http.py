"""Several gateways (issue 21) for the Seguro ship and the RS.io-over-HTTP subscriber: given
URLs [A, B], both carry on at B when the hub behind A stops and a hub on the same data
directory starts at B (then back at A): every acknowledged event stored once, the subscriber
gets each once, in order. Real sockets on 127.0.0.1; every wait bounded."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from test_client_reconnect_seguro_http import FAST, HOST, POINT, Site, free_port, payload, site

from helpers import until
from loops import Run
from tidewire.client.http import HttpHub
from tidewire.client.seguro import connect


async def move(s: Site, seguro_port: int, http_port: int) -> None:
    """The hub behind one gateway stops; the same data directory is served at new ports."""
    await s.stop(reopen=True)
    s.seguro_port, s.http_port = seguro_port, http_port
    await s.start()


def test_seguro_and_http_fail_over_to_the_next_gateway(tmp_path: Path, run: Run) -> None:
    rounds, many = 24, 40

    async def main() -> None:
        async with asyncio.timeout(120), site(tmp_path) as s:
            a = (s.seguro_port, s.http_port)
            b = (free_port(), free_port())
            seguro = [f"seguro://{HOST}:{p}" for p in (a[0], b[0])]
            http_urls = f"http://{HOST}:{a[1]},{HOST}:{b[1]}"
            ship = await connect(",".join(seguro), POINT, retry=FAST)
            http = HttpHub(http_urls, retry=FAST)
            assert (ship.url, http.url) == (seguro[0], f"http://{HOST}:{a[1]}")
            plan = [[(r * 100 + i + 1, payload(r * 100 + i + 1, 3000 + i)) for i in range(many)]
                    if r % 2 else [(r * 100 + 1, payload(r * 100 + 1, 50))]
                    for r in range(rounds)]  # fmt: skip
            final = plan[-1][-1][0]
            acknowledged: dict[int, bytes] = {}
            finished = 0
            got: list[tuple[int, bytes]] = []

            moved = [asyncio.Event(), asyncio.Event()]  # the writer waits for each move
            marks = [rounds // 3, 2 * rounds // 3]

            async def write() -> None:
                nonlocal finished
                for r, events in enumerate(plan):
                    if r in marks:
                        await moved[marks.index(r)].wait()
                    if len(events) == 1:
                        await ship.save(*events[0])
                    else:
                        await ship.save_many(events)
                    acknowledged.update(events)
                    finished += 1

            async def read() -> None:
                batches = http.subscribe(POINT, demand=50)
                async with contextlib.aclosing(batches):
                    async for batch in batches:
                        got.extend((e.id, e.value) for e in batch)
                        if got[-1][0] >= final:
                            return
                raise AssertionError("the subscription ended")

            writer = asyncio.ensure_future(write())
            reader = asyncio.ensure_future(read())
            on: list[str | None] = []
            try:
                for n, ports in enumerate((b, a)):
                    mark = marks[n]

                    def caught_up() -> bool:  # the writer waits at its mark, the reader has all
                        return finished == mark and len(got) == len(acknowledged)  # noqa: B023

                    await until(caught_up, "the ship at its mark, the subscriber caught up")
                    resubscribed, seen = http.resubscribed, len(got)
                    await move(s, *ports)
                    moved[n].set()

                    def again() -> bool:  # both work again, at the other gateway
                        # (the subscriber has an event saved after the move: its new subscription
                        # is made, not one of its tries, which go to either gateway)
                        return (finished > mark + 1 and http.resubscribed > resubscribed  # noqa: B023
                                and len(got) > seen)  # noqa: B023  # fmt: skip

                    await until(again, "the ship saves again, the subscriber subscribed again")
                    on += [ship.url, http.url]
                await asyncio.wait_for(writer, 30)
                await asyncio.wait_for(reader, 30)
            finally:
                for task in (writer, reader):
                    task.cancel()
                await asyncio.gather(writer, reader, return_exceptions=True)
                await http.close()
            assert on == [seguro[1], f"http://{HOST}:{b[1]}", seguro[0], f"http://{HOST}:{a[1]}"]
            ids = sorted(acknowledged)
            assert await s.stored() == acknowledged  # each once, with its bytes, none missing
            assert got == [(i, acknowledged[i]) for i in ids]  # each once, in order
            assert ship.failovers >= 2
            assert http.failovers >= 2
            assert http.resubscribed >= 2
            await ship.close()

    run(main())
