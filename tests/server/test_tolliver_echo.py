"""Echo and loops (docs/protocols/tolliver.md, "Echo and loops"), over real sockets on
127.0.0.1: the hub never delivers a message back to the instance it came from (other
subscribers get it), and two hubs linked to each other relay nothing in a loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers import run, until
from tidewire.hub import Hub
from tidewire.model import Batch
from tidewire.server.tolliver import TolliverServer, start_tolliver_server
from tidewire.tolliver import Delivery, Instance


async def values(hub: Hub, stream: str) -> list[bytes]:
    if stream not in [s.name for s in hub.streams()]:
        return []
    return [bytes(e.value) for batch in await hub.read(stream, 1) for e in batch]


async def has(hub: Hub, stream: str, want: list[bytes]) -> None:
    """Until ``stream`` holds at least ``len(want)`` events, then: exactly ``want``."""
    while len(got := await values(hub, stream)) < len(want):  # noqa: ASYNC110 - bounded by run()
        await asyncio.sleep(0.005)
    assert got == want


def test_the_sender_does_not_get_its_own_message_back(tmp_path: Path) -> None:
    """Both instances subscribe to ``chat`` and send on it: each gets the other's messages,
    never its own; events written by another protocol reach both."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await start_tolliver_server(hub, "127.0.0.1", 0)
        a, b = Instance(str(tmp_path / "a.db")), Instance(str(tmp_path / "b.db"))
        a.subscribe("chat")
        b.subscribe("chat")
        try:
            await a.connect("127.0.0.1", server.port)
            await b.connect("127.0.0.1", server.port)
            await a.send("chat", "", b"from a")
            await has(hub, "chat", [b"from a"])
            await b.send("chat", "", b"from b")
            await has(hub, "chat", [b"from a", b"from b"])
            await hub.append(Batch.build("chat", [b"from rsio"]), assign_ids=True)
            got_a, got_b = aiter(a.messages()), aiter(b.messages())
            first_a: Delivery = await anext(got_a)
            assert [first_a.body, (await anext(got_a)).body] == [b"from b", b"from rsio"]
            assert [(await anext(got_b)).body for _ in range(2)] == [b"from a", b"from rsio"]
            assert first_a.sender == server.instance
        finally:
            await a.close()
            await b.close()
            await server.close()
            await hub.close()

    run(main())


def test_two_linked_hubs_relay_nothing_in_a_loop(tmp_path: Path) -> None:
    """Hub A dials hub B for channel ``x``; B then subscribes to ``x`` on A too. What is
    written on either side reaches the other once, and nothing comes back: the streams hold
    each event once, in the order written (deliveries on a channel keep the stream's order, so
    an echo would come before the next event)."""

    async def main() -> None:
        hub_a, hub_b = Hub.open(str(tmp_path / "a")), Hub.open(str(tmp_path / "b"))
        a: TolliverServer = await start_tolliver_server(hub_a, "127.0.0.1", 0)
        b: TolliverServer = await start_tolliver_server(hub_b, "127.0.0.1", 0)
        try:
            assert await a.connect("127.0.0.1", b.port, ["x"]) == b.instance
            link_a, link_b = next(iter(a.links)), next(iter(b.links))
            await until(lambda: "x" in link_a.channels and "x" in link_b.channels)
            await hub_a.append(Batch.build("x", [b"m"]), assign_ids=True)
            await has(hub_b, "x", [b"m"])
            await hub_b.append(Batch.build("x", [b"n"]), assign_ids=True)
            await has(hub_a, "x", [b"m", b"n"])  # (an echo of m would be before n)
            await hub_a.append(Batch.build("x", [b"z"]), assign_ids=True)
            await has(hub_b, "x", [b"m", b"n", b"z"])  # (an echo of n would be before z)
            await until(lambda: link_a.conn.unacked_count == 0 == link_b.conn.unacked_count)
            assert await values(hub_a, "x") == [b"m", b"n", b"z"]
        finally:
            await a.close()
            await b.close()
            await hub_a.close()
            await hub_b.close()

    run(main())
