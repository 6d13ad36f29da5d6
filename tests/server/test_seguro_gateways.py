"""Seguro with several gateways (cluster mode): two hubs over ONE shared storage in one process
(tests/memory_storage.py), each with its Seguro listener on 127.0.0.1.

A point is a stream; its session is per gateway (each gateway keeps "one session per point"
for itself), so two ships of one point on two gateways are both welcomed. Their saves stay
safe: a ``SAVE`` appends with the ship's own id, which the storage refuses unless it is above
the point's latest id, whoever appended it; the refused ship is dropped (Seguro has no error
reply: "the hub failed: ... id order"), and its next ``WELCOME`` says the latest id, from
either gateway. Every id stored once, in increasing order; nothing acknowledged lost
(docs/protocols/seguro.md, "Several gateways").
"""

from __future__ import annotations

import asyncio

import pytest

from helpers import run
from memory_storage import Gateway, MemoryStorage
from seguro_hub import REFUSED
from tidewire.client.seguro import SeguroClient, connect
from tidewire.hub import Hub
from tidewire.server.seguro import SeguroServer, start_seguro_server

POINT = "~zod"


def stored(shared: MemoryStorage) -> list[tuple[int, bytes]]:
    return [(b.ids[i], b.value(i)) for b in shared.committed.get(POINT, []) for i in range(len(b))]


async def two_gateways() -> tuple[MemoryStorage, list[Hub], list[SeguroServer]]:
    shared = MemoryStorage()
    hubs = [Hub(Gateway(shared)), Hub(Gateway(shared))]
    servers = [await start_seguro_server(h, "127.0.0.1", 0) for h in hubs]
    return shared, hubs, servers


async def ship(server: SeguroServer) -> SeguroClient:
    return await connect(f"seguro://127.0.0.1:{server.port}", POINT)


async def shut(hubs: list[Hub], servers: list[SeguroServer]) -> None:
    for server in servers:
        await server.close()
    for hub in hubs:
        await hub.close()


def test_two_ships_of_one_point_on_two_gateways_are_ordered_by_the_storage() -> None:
    async def main() -> None:
        shared, hubs, servers = await two_gateways()
        x, y = await ship(servers[0]), await ship(servers[1])  # both welcomed (latest: none)
        try:
            await x.save(5, b"x5")
            with pytest.raises(REFUSED):  # y's 3 is not above 5 (x's, on the other gateway)
                await y.save(3, b"y3")
            y.abort()
            y = await ship(servers[1])
            assert y.latest == 5  # WELCOME says the point's latest, whoever stored it
            await y.save(6, b"y6")
            with pytest.raises(REFUSED):
                await x.save(6, b"x6")  # x's session still believes 5 is the latest
            assert stored(shared) == [(5, b"x5"), (6, b"y6")]
        finally:
            x.abort()
            y.abort()
            await shut(hubs, servers)

    run(main())


def test_the_same_id_saved_at_once_through_two_gateways_is_stored_once() -> None:
    async def main() -> None:
        shared, hubs, servers = await two_gateways()
        ships = [await ship(servers[0]), await ship(servers[1])]
        try:
            results = await asyncio.gather(*(s.save(7, b"s%d" % n) for n, s in enumerate(ships)),
                                           return_exceptions=True)  # fmt: skip
            won = [n for n, r in enumerate(results) if r is None]
            assert len(won) <= 1, results
            (event,) = stored(shared)
            assert event[0] == 7
            if won:  # (the other's refusal may only show at its next command)
                assert event[1] == b"s%d" % won[0]
        finally:
            for s in ships:
                s.abort()
            await shut(hubs, servers)

    run(main())
