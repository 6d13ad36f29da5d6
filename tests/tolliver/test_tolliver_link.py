"""The one Tolliver link (``tidewire.tolliver.link``) on both sides, over real sockets on
127.0.0.1: a handshake refusal (response status 2, or final 2) reaches the peer before the
connection closes; resends follow the injected clock (no sleeping for a timer)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from helpers import run
from tidewire.hub import Hub
from tidewire.model import Batch
from tidewire.protocols.tolliver import (
    Decoder,
    Frame,
    HandshakeFinal,
    HandshakeRequest,
    HandshakeResponse,
    encode,
)
from tidewire.server.tolliver import TolliverServer, start_tolliver_server
from tidewire.tolliver import HandshakeFailed, Instance


async def frames_until_eof(reader: asyncio.StreamReader) -> list[Frame]:
    """Every frame the other side wrote before it closed the connection."""
    decoder = Decoder()
    decoder.feed(await reader.read())  # (read() returns at EOF)
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    return frames


async def request_version_0(port: int) -> list[Frame]:
    """Dial, send a handshake request of version 0 (older than 1, not supported: status 2)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(bytes(encode(HandshakeRequest(0, uuid.uuid4(), ()))))
        return await frames_until_eof(reader)
    finally:
        writer.close()


def test_the_hub_writes_its_refusal_before_it_closes(tmp_path: Path) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await start_tolliver_server(hub, "127.0.0.1", 0)
        try:
            frames = await request_version_0(server.port)
            assert len(frames) == 1
            assert isinstance(frames[0], HandshakeResponse)
            assert (frames[0].status, frames[0].instance) == (2, server.instance)
        finally:
            await server.close()
            await hub.close()

    run(main())


def test_an_instance_writes_its_refusal_before_it_closes(tmp_path: Path) -> None:
    async def main() -> None:
        instance = Instance(str(tmp_path / "i.db"))
        try:
            port = await instance.listen()
            frames = await request_version_0(port)
            assert len(frames) == 1
            assert isinstance(frames[0], HandshakeResponse)
            assert (frames[0].status, frames[0].instance) == (2, instance.instance_id)
        finally:
            await instance.close()

    run(main())


def test_an_instance_writes_its_failing_final_before_it_closes(tmp_path: Path) -> None:
    """A remote that is older (status 3) in a version the instance cannot speak gets the
    final 2 (failure), then the close; the instance's ``connect`` raises HandshakeFailed."""

    async def main() -> None:
        got: asyncio.Future[list[Frame]] = asyncio.get_running_loop().create_future()

        async def older(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            decoder = Decoder()
            while (request := decoder.next_frame()) is None:
                decoder.feed(await reader.read(4096))
            assert isinstance(request, HandshakeRequest)
            writer.write(bytes(encode(HandshakeResponse(0, uuid.uuid4(), 3, ()))))
            got.set_result(await frames_until_eof(reader))
            writer.close()

        remote = await asyncio.start_server(older, "127.0.0.1", 0)
        instance = Instance(str(tmp_path / "i.db"))
        try:
            with pytest.raises(HandshakeFailed):
                await instance.connect("127.0.0.1", remote.sockets[0].getsockname()[1])
            assert await got == [HandshakeFinal(2)]
        finally:
            await instance.close()
            remote.close()

    run(main())


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_hubs_resends_follow_its_injected_clock(tmp_path: Path) -> None:
    """A delivery not acked is resent once the hub's clock passes ``resend_interval`` and its
    link's ``handle_timer`` runs: not before (the instance holds the first copy, unacked)."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        clock = FakeClock()
        server = TolliverServer(hub, clock=clock)
        await server.start("127.0.0.1", 0)
        instance = Instance(str(tmp_path / "i.db"))
        instance.subscribe("ticks")
        try:
            await instance.connect("127.0.0.1", server.port)
            (link,) = server.links
            await hub.append(Batch.build("ticks", [b"one"]), assign_ids=True)
            messages = aiter(instance.messages())
            first = await anext(messages)  # held: not acked while the application has it
            assert first.body == b"one"
            assert link.conn.unacked_count == 1
            link.handle_timer(clock.now + 0.9)
            assert link.conn.resends == 0
            clock.now += 1.1
            link.handle_timer(clock.now)
            assert link.conn.resends == 1
        finally:
            await instance.close()
            await server.close()
            await hub.close()

    run(main())
