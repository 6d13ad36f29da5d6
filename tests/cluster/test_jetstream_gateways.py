"""Two gateways (hubs, each on its own JetStreamStorage, each with its RS.io listener) over the
shared cluster: what a client publishes through one, a subscriber of the other receives,
history then live, in order, exactly once. (A transaction committed through one gateway being
known to the other is the multi-writer ledger's work, tested with it.)"""

from __future__ import annotations

import asyncio
import uuid

import tidewire
from helpers import run
from tidewire.cluster.jetstream import JetStreamStorage
from tidewire.cluster.local import LocalCluster
from tidewire.hub import Hub
from tidewire.server.rsio import start_rsio_server

HOST = "127.0.0.1"


def test_published_through_one_gateway_subscribed_through_the_other(
    cluster: LocalCluster,
) -> None:
    stream = f"gw.{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        hubs = [Hub(await JetStreamStorage.connect(cluster.urls)) for _ in range(2)]
        servers = [await start_rsio_server(hub, HOST, 0) for hub in hubs]
        urls = [f"rsio://{HOST}:{server.port}" for server in servers]
        try:
            async with await tidewire.connect(urls[0]) as writer:
                for chunk in range(5):
                    await writer.publish(stream, [b"h%d" % (chunk * 100 + i) for i in range(100)])

                async def take(n: int) -> list[tuple[int, bytes]]:
                    got: list[tuple[int, bytes]] = []
                    async with await tidewire.connect(urls[1]) as reader:
                        async for batch in reader.subscribe(stream):
                            got += [(e.id, e.value) for e in batch]
                            if len(got) >= n:
                                return got
                    return got

                subscriber = asyncio.ensure_future(take(1000))
                for chunk in range(5):
                    await writer.publish(stream, [b"l%d" % (chunk * 100 + i) for i in range(100)])
                got = await asyncio.wait_for(subscriber, 30)
                assert [i for i, _ in got] == list(range(1, 1001))
                assert got[499][1] == b"h499"
                assert got[500][1] == b"l0"
            async with await tidewire.connect(urls[1]) as other:  # (and back the other way)
                receipt = await other.publish(stream, [b"back"])
            assert receipt.first_id == 1001
            await asyncio.wait_for(hubs[0].storage.wait_for(stream, 1000), 10)
            assert hubs[0].latest(stream) == hubs[1].latest(stream) == 1001
        finally:
            for server in servers:
                await server.close()
            for hub in hubs:
                await hub.close()

    run(main(), 90)
