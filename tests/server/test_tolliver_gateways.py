"""The hub's Tolliver instance with several gateways (cluster mode): two or three hubs over ONE
shared storage in one process (tests/memory_storage.py: a :class:`Gateway` per hub), each
running the Tolliver instance on a real socket on 127.0.0.1.

One UUID for the cluster, whichever gateway started first; delivery-id blocks that never
overlap between gateways; a remote moving from gateway A to gateway B resumes where its acks at
A left it (tidewire.server.tolliver_state).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from helpers import run, until
from memory_storage import Gateway, MemoryStorage
from tidewire.hub import Hub
from tidewire.model import Batch
from tidewire.server.tolliver import STATE_STREAM, TolliverServer, start_tolliver_server
from tidewire.server.tolliver_state import ID_BLOCK
from tidewire.tolliver import Delivery, Instance


async def take(instance: Instance, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    async for delivery in instance.messages():
        got.append(delivery)
        if len(got) >= n:
            break
    return got


def ledger(shared: MemoryStorage) -> list[dict[str, object]]:
    return [json.loads(b.value(i)) for b in shared.committed.get(STATE_STREAM, [])
            for i in range(len(b))]  # fmt: skip


def overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


@pytest.mark.parametrize("seed", range(8))
def test_gateways_starting_at_once_share_one_uuid_and_a_later_one_takes_it(seed: int) -> None:
    async def main() -> None:
        shared = MemoryStorage()
        hubs = [Hub(Gateway(shared, random.Random(seed * 3 + n))) for n in range(3)]
        servers = list(await asyncio.gather(*(start_tolliver_server(h, "127.0.0.1", 0)
                                              for h in hubs[:2])))  # fmt: skip
        servers.append(await start_tolliver_server(hubs[2], "127.0.0.1", 0))
        try:
            assert len({s.instance for s in servers}) == 1
            assert [r for r in ledger(shared) if "instance" in r] == [
                {"instance": str(servers[0].instance)}
            ]
        finally:
            for server in servers:
                await server.close()
            for hub in hubs:
                await hub.close()

    run(main())


@pytest.mark.parametrize("seed", range(4))
def test_delivery_id_blocks_never_overlap_between_gateways(seed: int) -> None:
    async def main() -> None:
        shared = MemoryStorage()
        hubs = [Hub(Gateway(shared, random.Random(seed * 2 + n))) for n in range(2)]
        servers: list[TolliverServer] = list(await asyncio.gather(
            *(start_tolliver_server(h, "127.0.0.1", 0) for h in hubs)))  # fmt: skip
        held: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
        try:
            for _ in range(6):  # each round: both use most of their ids, reserving anew at once
                for n, server in enumerate(servers):
                    held[n] += server.id_blocks()
                    (first, count), *_ = server.id_blocks()
                    take_ = count - ID_BLOCK // 4
                    server.took_ids((first + take_) & 0xFFFFFFFF, take_)
                await until(lambda: all(not s.tasks for s in servers))
            for n, server in enumerate(servers):
                held[n] += server.id_blocks()
                assert server.ids_ready.is_set()
            assert not any(overlap(a, b) for a in held[0] for b in held[1]), held
            ends = [r["ids"] for r in ledger(shared) if "ids" in r]
            assert ends == [ID_BLOCK * (k + 1) for k in range(len(ends))]  # one after another
        finally:
            for server in servers:
                await server.close()
            for hub in hubs:
                await hub.close()

    run(main())


def test_a_remote_moving_to_another_gateway_resumes_where_its_acks_left_it(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        shared = MemoryStorage()
        hub_a, hub_b = Hub(Gateway(shared)), Hub(Gateway(shared))
        gw_a = await start_tolliver_server(hub_a, "127.0.0.1", 0)
        gw_b = await start_tolliver_server(hub_b, "127.0.0.1", 0)
        remote = Instance(str(tmp_path / "r.db"), inbox_limit=2)
        remote.subscribe("ticks")
        try:
            await remote.connect("127.0.0.1", gw_a.port)
            await until(lambda: gw_a.by_peer.get(remote.instance_id) is not None)
            await hub_a.append(Batch.build("ticks", [b"t%d" % i for i in range(4)]),
                               assign_ids=True)  # fmt: skip
            first = await take(remote, 2)  # its inbox holds 2: t2 and t3 are not acked
            assert [d.body for d in first] == [b"t0", b"t1"]
            mine = {"remote": str(remote.instance_id), "channel": "ticks", "next": 3}
            await until(lambda: any(mine.items() <= r.items() for r in ledger(shared)))
            await remote.close()
            await hub_b.append(Batch.build("ticks", [b"t4"]), assign_ids=True)  # (while away)
            remote = Instance(str(tmp_path / "r.db"))  # same UUID, room in its inbox
            remote.subscribe("ticks")
            await remote.connect("127.0.0.1", gw_b.port)  # the other gateway now
            rest = await take(remote, 3)
            assert [d.body for d in rest] == [b"t2", b"t3", b"t4"]
            assert {d.sender for d in rest} == {gw_a.instance}  # (one instance, both doors)
        finally:
            await remote.close()
            await gw_a.close()
            await gw_b.close()
            await hub_a.close()
            await hub_b.close()

    run(main())
