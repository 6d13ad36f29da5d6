"""The hub as a Tolliver instance, over real sockets: messages stored in streams before they are
acked and relayed to subscribers; events from any protocol delivered; a remote's offsets kept
across reconnects; what arrives while a remote is in its handshake reaches it."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

from helpers import run, until
from tidewire.hub import Hub
from tidewire.model import Batch
from tidewire.protocols.tolliver import Connection, Established, Received, Role
from tidewire.server.tolliver import TolliverServer, start_tolliver_server
from tidewire.tolliver import Delivery, Instance


async def take(instance: Instance, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    async for delivery in instance.messages():
        got.append(delivery)
        if len(got) >= n:
            break
    return got


def test_messages_are_stored_then_acked_and_relayed(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await start_tolliver_server(hub, "127.0.0.1", 0)
        a, b = Instance(str(tmp_path / "a.db")), Instance(str(tmp_path / "b.db"))
        b.subscribe("orders")
        try:
            await b.connect("127.0.0.1", server.port)
            await a.connect("127.0.0.1", server.port)  # the hub now subscribes to "orders"
            for i in range(3):
                await a.send("orders", "k" if i else "", b"m%d" % i)
            got = await take(b, 3)
            assert [(d.key, d.body) for d in got] == [("", b"m0"), ("k", b"m1"), ("k", b"m2")]
            assert {d.sender for d in got} == {server.instance}
            await until(lambda: a.store.unacked() == 0)  # acked by the hub once stored
            stored = [e for batch in await hub.read("orders", 1) for e in batch]
            assert [(e.key, e.value) for e in stored] == [(None, b"m0"), (b"k", b"m1"),
                                                         (b"k", b"m2")]  # fmt: skip
        finally:
            await a.close()
            await b.close()
            await server.close()
            await hub.close()

    run(main())


def test_events_from_any_protocol_reach_subscribers_and_offsets_survive_reconnects(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await start_tolliver_server(hub, "127.0.0.1", 0)
        b = Instance(str(tmp_path / "b.db"), inbox_limit=2)
        b.subscribe("ticks")
        try:
            await b.connect("127.0.0.1", server.port)
            await until(lambda: server.by_peer.get(b.instance_id) is not None)
            await hub.append(Batch.build("ticks", [b"t%d" % i for i in range(4)]),
                             assign_ids=True)  # fmt: skip
            first = await take(b, 2)  # b's inbox holds 2: t2 and t3 are not acked
            assert [d.body for d in first] == [b"t0", b"t1"]
            await until(lambda: server.offsets.get((b.instance_id, "ticks")) == 3)
            await b.close()
            b = Instance(str(tmp_path / "b.db"))  # restarted, same UUID, room in its inbox
            b.subscribe("ticks")
            await b.connect("127.0.0.1", server.port)
            rest = await take(b, 2)  # the hub resumes after what b acked
            assert [d.body for d in rest] == [b"t2", b"t3"]
        finally:
            await b.close()
            await server.close()
            await hub.close()

    run(main())


def test_what_reaches_the_hub_during_a_handshake_reaches_that_remote(tmp_path: Path) -> None:
    """The seed: messages sent while a connection is being established reach the new remote
    once its subscriptions are registered. The hub starts a new remote's streams where they
    stood when its connection was accepted."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        await hub.append(Batch.build("news", [b"old"]), assign_ids=True)  # before: not sent
        server = await start_tolliver_server(hub, "127.0.0.1", 0)
        sock = socket.create_connection(("127.0.0.1", server.port))
        try:
            await until(lambda: len(server.links) == 1)  # accepted, no handshake yet
            await hub.append(Batch.build("news", [b"early"]), assign_ids=True)
            conn = Connection(Role.CONNECTOR, uuid.uuid4(), 1, frozenset({1}), {("news", "")})
            conn.initiate()
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(conn.data_to_send())
            events: list[object] = []
            while not any(isinstance(e, Received) for e in events):
                conn.receive_data(await reader.read(65536))
                while (event := conn.next_event()) is not None:
                    events.append(event)
                writer.write(conn.data_to_send())
            assert any(isinstance(e, Established) for e in events)
            (received,) = [e for e in events if isinstance(e, Received)]
            assert received.message.body == b"early"
            writer.close()
        finally:
            await server.close()
            await hub.close()

    run(main())


def test_the_hub_keeps_its_uuid(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        first = (await start_tolliver_server(hub, "127.0.0.1", 0))
        instance = first.instance
        await first.close()
        await hub.close()
        hub = Hub.open(str(tmp_path / "hub"))
        again: TolliverServer = await start_tolliver_server(hub, "127.0.0.1", 0)
        assert again.instance == instance
        assert instance.version == 7
        await again.close()
        await hub.close()

    run(main())
