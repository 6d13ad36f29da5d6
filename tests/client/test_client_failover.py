"""Several gateways (issue 21): a reconnecting client given URLs [A, B] continues on B when the
hub behind A goes away and a hub on the same data directory comes up at B (what a second
gateway of a cluster is to the client: another address serving the same streams), then back
on A: the subscriber resumes after its last id, the publisher re-offers what was not
acknowledged, nothing is lost or duplicated. RS.io over TCP and over Tube here; Seguro, HTTP
and Tolliver below. Real sockets on 127.0.0.1; every wait bounded."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from test_client_reconnect_rsio import (
    FAST,
    TRANSPORTS,
    Progress,
    Restartable,
    Transport,
    restartable,
    values_of,
)

from loops import Run
from tidewire.client import rsio, tube
from tidewire.client.rsio import Receipt


def free_port() -> int:
    """A port nothing listens on now (the OS's pick, released at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def move(served: Restartable, port: int) -> None:
    """The hub behind one gateway stops; a hub on the same data directory starts at ``port``."""
    await served.stop(close_hub=True)
    served.port = port
    await served.start()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rsio_clients_fail_over_to_the_next_gateway(
    tmp_path: Path, run: Run, transport: Transport
) -> None:
    batches, per = 90, 20
    total = batches * per

    async def main() -> None:
        async with asyncio.timeout(120), restartable(tmp_path, transport) as served:
            first = served.port
            a = served.url
            served.port = free_port()
            b = served.url
            served.port = first
            connect = rsio.connect if transport == "tcp" else tube.connect
            got: list[tuple[int, bytes]] = []
            acked = Progress()
            receipts: list[Receipt] = []
            on: list[str | None] = []
            async with (
                connect(f"{a},{b}", retry=FAST) as sub_hub,
                connect([a, b], retry=FAST) as pub_hub,
            ):
                assert (sub_hub.url, pub_hub.url, pub_hub.urls) == (a, a, (a, b))

                async def subscriber() -> None:
                    async for batch in sub_hub.subscribe("s", prefetch=40):
                        got.extend((e.id, e.value) for e in batch)
                        if len(got) >= total:
                            return

                async def publisher() -> None:
                    pub = await pub_hub.publisher("s", max_unacked_bytes=8 * 1024)
                    async with pub:
                        futures = []
                        for k in range(batches):
                            future = await pub.submit(values_of(k, per))
                            future.add_done_callback(lambda _: acked.add())
                            futures.append(future)
                        receipts.extend(await asyncio.gather(*futures))

                reading = asyncio.create_task(subscriber())
                writing = asyncio.create_task(publisher())
                await acked.reach(batches // 3, writing)
                await move(served, int(b.split(":")[2].split("/")[0]))  # A down, B up
                await acked.reach(2 * batches // 3, writing)
                on += [sub_hub.url, pub_hub.url]
                await move(served, first)  # and back to A
                await writing
                await reading
                on += [sub_hub.url, pub_hub.url]
                assert (sub_hub.error, pub_hub.error) == (None, None)
                assert min(sub_hub.failovers, pub_hub.failovers) >= 2
            assert on == [b, b, a, a]
            stored = await served.stored("s")
            assert [v for _, v in stored] == [v for k in range(batches) for v in values_of(k, per)]
            assert got == stored  # every event once, in order
            ids = dict(stored)
            for k, receipt in enumerate(receipts):
                assert [ids[i] for i in range(receipt.first_id, receipt.last_id + 1)] == (
                    values_of(k, per))  # fmt: skip

    run(main())


def test_without_retry_the_first_gateway_that_answers_is_used(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with asyncio.timeout(30), restartable(tmp_path, "tcp") as served:
            with socket.socket() as one, socket.socket() as two:  # bound, not listening
                one.bind(("127.0.0.1", 0))
                two.bind(("127.0.0.1", 0))
                dead = [f"rsio://127.0.0.1:{s.getsockname()[1]}" for s in (one, two)]
                async with rsio.connect(f"{dead[0]},{served.url}") as hub:
                    assert await hub.streams(["s"])
                with pytest.raises(ConnectionRefusedError):
                    await rsio.connect(dead)

    run(main())
