"""The hub's own Tolliver list (what instances send it) with the receiver's channels on it in
time, on one hub and across gateways (issue 21's chaos test lost messages here).

An instance keeps a reliable message only for the remotes whose subscriptions, as it last saw
them, cover it: a sender told a hub list without the channel sends the hub nothing and keeps
nothing (the seed's rule), so the hub must list a channel before any sender can be told a list
without it: as soon as a remote's handshake names it (not once its offset is kept, after a
ledger catch-up), and on every gateway, not only the one the receiver is connected to.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_tolliver_hub_bounds import Raw

from helpers import HOST, run, until
from memory_storage import Gateway, MemoryStorage
from tidewire.hub import Hub
from tidewire.model import Batch
from tidewire.protocols.tolliver import SubscriptionEntry
from tidewire.server.tolliver import STATE_STREAM, start_tolliver_server
from tidewire.tolliver import Delivery, Instance, uuid7


async def take(instance: Instance, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    async for delivery in instance.messages():
        got.append(delivery)
        if len(got) >= n:
            break
    return got


class SlowLedger(Gateway):
    """A gateway whose reads of the Tolliver state stream wait while :attr:`open` is clear
    (a cluster's round trips, made as long as the test likes)."""

    def __init__(self, shared: MemoryStorage) -> None:
        super().__init__(shared)
        self.open = asyncio.Event()
        self.open.set()

    async def read(
        self, stream: str, from_id: int, max_bytes: int, max_events: int
    ) -> list[Batch]:
        if stream == STATE_STREAM:
            await self.open.wait()
        return await super().read(stream, from_id, max_bytes, max_events)


def test_a_sender_right_after_a_receiver_is_told_the_receivers_channel() -> None:
    """The receiver's handshake is answered: a sender whose handshake comes next gets the
    channel in the hub's list, however slow the ledger (the chaos test's first messages were
    lost: the hub listed the channel only after catching up with the ledger, a round trip
    to the cluster). A channel listed so, for a remote that leaves before its offset is
    kept, is unlisted again."""

    async def main() -> None:
        door = SlowLedger(MemoryStorage())
        hub = Hub(door)
        server = await start_tolliver_server(hub, HOST, 0)
        receiver, sender = await Raw.open(server.port), await Raw.open(server.port)
        try:
            door.open.clear()
            await receiver.handshake(uuid7(), ["k"])
            response = await sender.handshake(uuid7(), [])
            assert SubscriptionEntry(0, "k", "") in response.subscriptions
            receiver.close()  # (before its offset is kept: the ledger is still slow)
            async with asyncio.timeout(5):
                await until(lambda: ("k", "") not in server.wanted)
        finally:
            door.open.set()
            receiver.close()
            sender.close()
            await server.close()
            await hub.close()

    run(main())


def test_a_sender_at_another_gateway_than_the_receiver_reaches_it(tmp_path: Path) -> None:
    """The receiver follows ``k`` through gateway A; a sender connected to gateway B (which
    started before the receiver came) is told ``k`` by B and what it sends reaches the
    receiver (the chaos test lost what was sent to the surviving gateway after a failover:
    that gateway listed only what remotes connected to it followed)."""

    async def main() -> None:
        shared = MemoryStorage()
        hub_a, hub_b = Hub(Gateway(shared)), Hub(Gateway(shared))
        gw_a = await start_tolliver_server(hub_a, HOST, 0)
        gw_b = await start_tolliver_server(hub_b, HOST, 0)
        receiver = Instance(str(tmp_path / "r.db"))
        receiver.subscribe("k")
        sender = Instance(str(tmp_path / "s.db"))
        try:
            await receiver.connect(HOST, gw_a.port)
            async with asyncio.timeout(5):  # (B folds A's record of the receiver's offset)
                await until(lambda: ("k", "") in gw_b.wanted)
            await sender.connect(HOST, gw_b.port)
            await sender.send_many("k", "", [b"m0", b"m1", b"m2"])
            async with asyncio.timeout(5):
                got = await take(receiver, 3)
            assert [d.body for d in got] == [b"m0", b"m1", b"m2"]
            stored = await hub_a.read("k", 1, 1 << 20, 100)
            assert [b.value(i) for b in stored for i in range(len(b))] == [b"m0", b"m1", b"m2"]
        finally:
            await sender.close()
            await receiver.close()
            await gw_a.close()
            await gw_b.close()
            await hub_a.close()
            await hub_b.close()

    run(main())


def test_a_gateway_lists_what_an_away_remote_follows_through_another(tmp_path: Path) -> None:
    """A remote that followed ``k`` through gateway A and left (its offset kept by A) keeps
    ``k`` on gateway B's list, so that what a sender hands B meanwhile is stored for it."""

    async def main() -> None:
        shared = MemoryStorage()
        hub_a, hub_b = Hub(Gateway(shared)), Hub(Gateway(shared))
        gw_a = await start_tolliver_server(hub_a, HOST, 0)
        gw_b = await start_tolliver_server(hub_b, HOST, 0)
        receiver = Instance(str(tmp_path / "r.db"))
        receiver.subscribe("k")
        sender = Instance(str(tmp_path / "s.db"))
        try:
            await receiver.connect(HOST, gw_a.port)
            await until(lambda: (receiver.instance_id, "k") in gw_a.offsets)
            await receiver.close()
            await gw_a.close()
            async with asyncio.timeout(5):
                await until(lambda: ("k", "") in gw_b.wanted)
            await sender.connect(HOST, gw_b.port)
            await sender.send("k", "", b"while away")
            async with asyncio.timeout(5):
                await until(lambda: shared.latest("k") == 1)
            await hub_b.append(Batch.build("k", [b"later"]), assign_ids=True)
            receiver = Instance(str(tmp_path / "r.db"))
            receiver.subscribe("k")
            await receiver.connect(HOST, gw_b.port)
            async with asyncio.timeout(5):
                got = await take(receiver, 2)
            assert [d.body for d in got] == [b"while away", b"later"]
        finally:
            await sender.close()
            await receiver.close()
            await gw_b.close()
            await hub_a.close()
            await hub_b.close()

    run(main())


def test_a_remote_moving_gateways_resumes_though_the_follower_read_its_records_first(
    tmp_path: Path,
) -> None:
    """Gateway B's follower of the state stream is reading (slowly) when a remote that acked
    up to ``t1`` at gateway A connects to B: the records A kept of it, which that read
    brings, are folded in though the remote is connected to B by then (else B's own catch-up
    finds nothing left and the remote would start at the stream's end, missing t2..t4)."""

    async def main() -> None:
        shared = MemoryStorage()
        door_b = SlowLedger(shared)
        hub_a, hub_b = Hub(Gateway(shared)), Hub(door_b)
        gw_a = await start_tolliver_server(hub_a, HOST, 0)
        gw_b = await start_tolliver_server(hub_b, HOST, 0)
        remote = Instance(str(tmp_path / "r.db"), inbox_limit=2)
        remote.subscribe("ticks")
        try:
            door_b.open.clear()  # (B's follower will read A's records of the remote slowly)
            await remote.connect(HOST, gw_a.port)
            await until(lambda: gw_a.by_peer.get(remote.instance_id) is not None)
            await hub_a.append(Batch.build("ticks", [b"t%d" % i for i in range(4)]),
                               assign_ids=True)  # fmt: skip
            first = await take(remote, 2)  # its inbox holds 2: t2 and t3 are not acked
            assert [d.body for d in first] == [b"t0", b"t1"]
            await until(lambda: gw_a.offsets.get((remote.instance_id, "ticks")) == 3)
            await remote.close()
            await gw_a.close()  # (keeps the offset: next 3)
            await hub_b.append(Batch.build("ticks", [b"t4"]), assign_ids=True)  # (while away)
            remote = Instance(str(tmp_path / "r.db"))
            remote.subscribe("ticks")
            await remote.connect(HOST, gw_b.port)
            await until(lambda: gw_b.by_peer.get(remote.instance_id) is not None)
            door_b.open.set()
            async with asyncio.timeout(5):
                rest = await take(remote, 3)
            assert [d.body for d in rest] == [b"t2", b"t3", b"t4"]
        finally:
            door_b.open.set()
            await remote.close()
            await gw_b.close()
            await hub_a.close()
            await hub_b.close()

    run(main())
