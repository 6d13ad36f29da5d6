"""The hub's deliveries take their Tolliver ids in order, never 2**31-1 (the unreliable marker),
wrapping at 2**32, whether a batch goes the run way (issue 22: no keys, every key wanted, none of
the remote's own events: no test per event) or event by event (keys)."""

from __future__ import annotations

from pathlib import Path

from helpers import run
from tidewire.hub import Hub
from tidewire.model import Batch
from tidewire.protocols.tolliver import UNRELIABLE
from tidewire.server.tolliver import start_tolliver_server
from tidewire.tolliver import Delivery, Instance


async def take(instance: Instance, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    async for batch in instance.batches():
        got += batch
        if len(got) >= n:
            break
    return got


def test_delivery_ids_skip_the_unreliable_marker_and_wrap(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await start_tolliver_server(hub, "127.0.0.1", 0)
        b = Instance(str(tmp_path / "b.db"))
        b.subscribe("orders")
        try:
            await b.connect("127.0.0.1", server.port)
            cases = [
                (UNRELIABLE - 2, None, [UNRELIABLE - 2, UNRELIABLE - 1, UNRELIABLE + 1,
                                        UNRELIABLE + 2]),
                (UNRELIABLE - 4, None, [UNRELIABLE - 4, UNRELIABLE - 3, UNRELIABLE - 2,
                                        UNRELIABLE - 1]),
                (UNRELIABLE, None, [UNRELIABLE + 1, UNRELIABLE + 2, UNRELIABLE + 3,
                                    UNRELIABLE + 4]),
                (2**32 - 2, None, [2**32 - 2, 2**32 - 1, 0, 1]),
                (2**32 - 4, None, [2**32 - 4, 2**32 - 3, 2**32 - 2, 2**32 - 1]),
                (UNRELIABLE - 2, [b"k", None, b"", b"k"], [UNRELIABLE - 2, UNRELIABLE - 1,
                                                          UNRELIABLE + 1, UNRELIABLE + 2]),
            ]  # fmt: skip
            for n, (first, keys, expected) in enumerate(cases):
                server.next_message_id = first
                values = [b"%d-%d" % (n, i) for i in range(4)]
                await hub.append(Batch.build("orders", values, keys=keys), assign_ids=True)
                got = await take(b, 4)
                assert [d.id for d in got] == expected
                assert [d.body for d in got] == values
                want = [(k or b"").decode() for k in keys or [None] * 4]
                assert [d.key for d in got] == want
                assert server.next_message_id == (expected[-1] + 1) % 2**32
        finally:
            await b.close()
            await server.close()
            await hub.close()

    run(main())
