"""Issue 20 on the hub's Tolliver instance, in process over real sockets on 127.0.0.1: the
hub's own subscription list and the remotes' offsets stay bounded (per remote, in total, over
time, across restarts), the handshake shows a remote only the channels it may read or write,
and a frame is checked against the memory budget as declared and has a deadline (the
guard's ``limits.message_seconds``, driven by calling ``sweep`` with a chosen time)."""

from __future__ import annotations

import asyncio
import logging
import struct
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest

from helpers import run, until
from loops import logged
from tidewire.hub import Budget, BudgetLimits, Hub
from tidewire.hub.access import Access, Acl
from tidewire.protocols.tolliver import (
    Ack,
    Decoder,
    HandshakeRequest,
    HandshakeResponse,
    Limits,
    SubscriptionEntry,
    encode,
)
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.tolliver import TolliverServer, TolliverSettings
from tidewire.tolliver import Instance, uuid7

HOST = "127.0.0.1"
MiB = 1024 * 1024


class Raw:
    """A remote that sends bytes of its choosing and reads what the hub answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = Decoder(Limits())

    @classmethod
    async def open(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection(HOST, port))

    async def handshake(self, instance: uuid.UUID, names: Iterable[str]) -> HandshakeResponse:
        entries = tuple(SubscriptionEntry(0, name) for name in names)
        self.writer.write(bytes(encode(HandshakeRequest(1, instance, entries))))
        while True:
            data = await self.reader.read(1 << 20)
            assert data, "closed by the hub"
            self.decoder.feed(data)
            if isinstance(frame := self.decoder.next_frame(), HandshakeResponse):
                return frame

    async def acked(self, message_id: int) -> None:
        """Until the hub acks ``message_id`` (it closing first fails)."""
        while True:
            while (frame := self.decoder.next_frame()) is not None:
                if frame == Ack(message_id):
                    return
            data = await self.reader.read(1 << 20)
            assert data, "closed by the hub"
            self.decoder.feed(data)

    async def closed(self) -> bytes:
        """Until the hub closes the connection; what it sent meanwhile."""
        got = b""
        try:
            while data := await self.reader.read(1 << 20):
                got += data
        except ConnectionError:
            pass
        return got

    def close(self) -> None:
        self.writer.close()


def names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}.{i}" for i in range(n)]


async def serve(hub: Hub, settings: TolliverSettings, **options: object) -> TolliverServer:
    server = TolliverServer(hub, settings, **options)  # type: ignore[arg-type]
    await server.start(HOST, 0)
    return server


def test_the_hubs_list_stays_bounded_and_a_restart_rebuilds_it_within_the_bound(
    tmp_path: Path,
) -> None:
    """Two remotes ask for more channels than ``max_channels`` together: the list holds at most
    that many. A remote that comes back with fewer channels has the others forgotten (in the
    ledger too). After a restart the list is rebuilt within the bound and an instance
    connects."""
    settings = TolliverSettings(max_subscriptions=50, max_channels=60)
    one, two = uuid7(), uuid7()

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await serve(hub, settings)
        try:
            for remote, prefix in ((one, "a"), (two, "b")):
                raw = await Raw.open(server.port)
                await raw.handshake(remote, names(prefix, 50))
                # (every followed channel is delivered: the deliveries are made in slices)
                await until(lambda: sum(p == remote for p, _ in server.offsets) == 50)  # noqa: B023
                raw.close()
            assert len(server.wanted) == 60
            raw = await Raw.open(server.port)  # remote one again, with 10 of its channels
            response = await raw.handshake(one, names("a", 10))
            assert len(response.subscriptions) <= 60
            raw.close()
            await until(lambda: len(server.offsets) == 60)
            assert {c for p, c in server.offsets if p == one} == set(names("a", 10))
        finally:
            await server.close()
        server = await serve(hub, settings)
        instance = Instance(str(tmp_path / "late.db"))
        try:
            assert len(server.offsets) == 60  # the forgotten ones stay forgotten
            assert len(server.wanted) == 60
            async with asyncio.timeout(10):
                assert await instance.connect(HOST, server.port) == server.instance
        finally:
            await instance.close()
            await server.close()
            await hub.close()

    run(main())


def test_a_remote_gone_past_its_retention_is_forgotten(tmp_path: Path) -> None:
    """``remote_retention_seconds`` after a remote was last seen, its offsets are forgotten
    (looked for when another remote comes) and the hub stops following what only it
    followed; a restart later than that forgets it too."""
    settings = TolliverSettings(remote_retention_seconds=100)
    wall = [1_000_000.0]
    gone = uuid7()

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await serve(hub, settings, wall=lambda: wall[0])
        try:
            raw = await Raw.open(server.port)
            await raw.handshake(gone, ["only.mine"])
            raw.close()
            await until(lambda: gone not in server.by_peer)
            wall[0] += 50  # within the retention: kept
            raw = await Raw.open(server.port)
            await raw.handshake(uuid7(), ["other"])
            assert (gone, "only.mine") in server.offsets
            wall[0] += 120  # past it (and past the pruning interval)
            raw2 = await Raw.open(server.port)
            await raw2.handshake(uuid7(), ["other"])
            assert (gone, "only.mine") not in server.offsets
            assert ("only.mine", "") not in server.wanted
            raw.close()
            raw2.close()
        finally:
            await server.close()
        server = await serve(hub, settings, wall=lambda: wall[0] + 1000)
        try:
            assert server.offsets == {}  # (every remote is past its retention by then)
            assert server.wanted == set()
        finally:
            await server.close()
            await hub.close()

    run(main())


def test_the_handshake_shows_only_channels_the_remote_may_read_or_write(
    tmp_path: Path,
) -> None:
    acl = '[principal.anonymous]\nread = ["public.*"]\nwrite = ["carry.*"]\n'
    settings = TolliverSettings(allow_plaintext=True)

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await serve(hub, settings, access=Access(Acl.parse(acl)))
        raw = await Raw.open(server.port)
        try:
            server.want({"secret.x", "public.y", "carry.z"})
            response = await raw.handshake(uuid7(), ["public.news"])
            shown = {e.channel for e in response.subscriptions}
            assert shown == {"public.y", "carry.z"}  # (its own come after: they are told later)
        finally:
            raw.close()
            await server.close()
            await hub.close()

    run(main())


def test_a_frame_is_checked_against_the_budget_as_declared_and_has_a_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A message header declaring more than the connection's share is refused at once (the
    body is never waited for); one within it is an unfinished frame the guard ends after
    ``limits.message_seconds``; a remote that finishes its frames carries on."""
    caplog.set_level(logging.WARNING)
    header = struct.Struct(">BIIII")

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        hub.budget = Budget(BudgetLimits(total=8 * MiB, principal=4 * MiB, connection=MiB))
        limits = ConnectionLimits(message_seconds=60)
        server = await serve(hub, TolliverSettings(), admission=Admission(limits))
        big, slow, fine = [await Raw.open(server.port) for _ in range(3)]
        try:
            for raw in (big, slow, fine):
                await raw.handshake(uuid7(), [])
            big.writer.write(header.pack(3, 1, 0, 2 * MiB, 1) + b"x" + bytes(1000))
            assert await big.closed() == b""
            await logged(caplog, "tidewire.tolliver", "does not fit the memory budget")
            assert hub.budget.used < MiB
            t0 = asyncio.get_running_loop().time()
            slow.writer.write(header.pack(3, 1, 0, 512 * 1024, 2) + b"x" + bytes(1000))
            await until(lambda: hub.budget.used >= 512 * 1024)  # the frame, as declared
            fine.writer.write(header.pack(3, 1, 0, 3, 3) + b"xabc")
            await fine.acked(3)
            server.listener.sweep(t0 + 61)
            assert await slow.closed() == b""
            await logged(caplog, "tidewire.guard", "a message unfinished for 60s")
            fine.writer.write(header.pack(3, 1, 0, 3, 4) + b"xabc")
            await fine.acked(4)  # (its frames were whole: no deadline ran)
            assert hub.budget.used < 1024
        finally:
            for raw in (big, slow, fine):
                raw.close()
            await server.close()
            await hub.close()

    run(main())


def test_a_refused_remote_is_closed_after_the_delay_unread(tmp_path: Path) -> None:
    """A handshake subscribing to a channel that is no stream name is refused with nothing
    said (Tolliver has no frame for it); the close comes ``limits.refusal_close_seconds``
    later, and the connection is not read meanwhile."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        limits = ConnectionLimits(refusal_close_seconds=0.6)
        server = await serve(hub, TolliverSettings(), admission=Admission(limits))
        raw = await Raw.open(server.port)
        try:
            entries = (SubscriptionEntry(0, "not a stream name!"),)
            raw.writer.write(bytes(encode(HandshakeRequest(1, uuid7(), entries))))
            (guard,) = server.listener.open_connections()
            await until(lambda: guard.lingering, "the refusal's close to linger")
            began, received = asyncio.get_running_loop().time(), guard.bytes_in
            raw.writer.write(bytes(4096))  # (not read)
            assert await raw.closed() == b""
            assert asyncio.get_running_loop().time() - began >= 0.4
            assert guard.bytes_in == received
        finally:
            raw.close()
            await server.close()
            await hub.close()

    run(main())
