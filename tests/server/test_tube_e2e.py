"""Tube over real WebSockets on 127.0.0.1: the hub's ``/tube`` endpoint (``build_app`` on an
aiohttp AppRunner) carrying RS.io, the Python client ``tidewire.client.tube.connect`` and raw
aiohttp WebSocket clients speaking Tube by hand; under the default loop and uvloop."""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import tidewire
from tidewire.client.rsio import RsioError
from tidewire.client.tube import TubeStream, connect
from tidewire.hub import Hub
from tidewire.model import Batch
from tidewire.protocols.rsio import (
    ClientHello,
    Decoder,
    Goodbye,
    OnComplete,
    OnNext,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
    encode,
)
from tidewire.protocols.tube import (
    Connection,
    MessageReceived,
    Role,
    encode_header,
    pull_varint,
    push_varint,
    split_header,
)
from tidewire.server.app import TUBE_CONNECTIONS_KEY, build_app
from tidewire.server.rsio import start_rsio_server
from tidewire.server.tube import TubeSettings

RUN_SECONDS = 30.0  # (the run fixture's bound, tests/conftest.py)
Runner = Callable[[Coroutine[Any, Any, None]], None]


@dataclass(slots=True)
class Served:
    hub: Hub
    app: web.Application
    runner: web.AppRunner
    url: str
    stopped: bool = False

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.runner.cleanup()


@asynccontextmanager
async def tube_hub(path: Path, settings: TubeSettings | None = None) -> AsyncIterator[Served]:
    hub = Hub.open(str(path))
    runner = web.AppRunner(build_app(hub, tube=settings), access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    served = Served(hub, runner.app, runner, f"ws://127.0.0.1:{runner.addresses[0][1]}/tube")
    try:
        yield served
    finally:
        await served.stop()
        await hub.close()


async def until_subscribed(served: Served, n: int = 1) -> None:
    """Wait (bounded by the test's timeout) until the hub pumps ``n`` Tube subscriptions."""
    connections = served.app[TUBE_CONNECTIONS_KEY]
    while sum(len(c.pumps) for c in connections) < n:  # noqa: ASYNC110 - no event to await
        await asyncio.sleep(0.001)


async def append(hub: Hub, stream: str, values: list[bytes]) -> None:
    await hub.append(Batch.build(stream, values), assign_ids=True)


# --------------------------------------------------------------------------- raw Tube


class RawTube:
    """A Tube client by hand over aiohttp's WebSocket client: fragment sizes exchanged, then
    whole Tube messages (README reading) decoded into RS.io messages."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.decoder = Decoder()
        self.messages: list[object] = []

    async def receive(self) -> aiohttp.WSMessage:
        return await self.ws.receive(timeout=10)

    async def handshake(self, fragment_size: int = 0) -> int:
        await self.ws.send_bytes(push_varint(fragment_size))
        answer = await self.receive()
        assert answer.type == aiohttp.WSMsgType.BINARY
        size, end = pull_varint(answer.data)
        assert end == len(answer.data)
        return size

    async def next_rsio(self, n: int = 1) -> list[object]:
        """The next ``n`` RS.io messages from the hub (each Tube message has one fragment)."""
        while len(self.messages) < n:
            message = await self.receive()
            assert message.type == aiohttp.WSMsgType.BINARY, message
            code, count, offset = split_header(message.data)
            assert count == 1, "a small RS.io write fits one fragment"
            body = message.data[offset:]
            self.decoder.feed(zlib.decompress(body) if code == 1 else body)
            while (decoded := self.decoder.next_message()) is not None:
                self.messages.append(decoded)
        out, self.messages = self.messages[:n], self.messages[n:]
        return out

    async def close_code(self) -> int | None:
        """Read until the hub closes; its close code."""
        for _ in range(1000):
            message = await self.receive()
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                aiohttp.WSMsgType.CLOSING):  # fmt: skip
                return self.ws.close_code
        raise AssertionError("the hub did not close")


@asynccontextmanager
async def raw_tube(url: str) -> AsyncIterator[RawTube]:
    async with aiohttp.ClientSession() as session, session.ws_connect(url, autoclose=True) as ws:
        yield RawTube(ws)


def frames(*messages: Any) -> bytes:
    out = bytearray()
    for message in messages:
        encode(message, out=out)
    return bytes(out)


# --------------------------------------------------------------------------- the client


def test_publish_then_subscribe_history_then_live(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with tube_hub(tmp_path) as served:
            rsio = await start_rsio_server(served.hub, "127.0.0.1", 0)
            try:
                async with connect(served.url) as client:
                    receipt = await client.publish("s", [b"h%d" % i for i in range(100)])
                    assert (receipt.count, receipt.first_id, receipt.last_id) == (100, 1, 100)
                    got: list[tuple[int, bytes]] = []
                    async for batch in client.subscribe("s", prefetch=64):
                        got += [(e.id, e.value) for e in batch]
                        if len(got) == 100:  # history done: publish live, from another client
                            async with connect(served.url) as other:
                                await other.publish("s", [b"l%d" % i for i in range(50)])
                        if len(got) >= 150:
                            break
                assert [i for i, _ in got] == list(range(1, 151))
                assert got[0] == (1, b"h0")
                assert got[100] == (101, b"l0")
                # the same events over RS.io / TCP
                async with await tidewire.connect(f"rsio://127.0.0.1:{rsio.port}") as tcp:
                    over_tcp = [(e.id, e.value) async for b in tcp.subscribe("s", until_id=150)
                                for e in b]  # fmt: skip
                assert over_tcp == got
            finally:
                await rsio.close()

    run(main())


def test_values_bigger_than_the_fragment_size(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        rng = random.Random(5)
        values = [rng.randbytes(1 << 20), bytes(1 << 20), rng.randbytes(100_000) * 3]
        settings = TubeSettings(fragment_size=16 * 1024)
        async with tube_hub(tmp_path, settings) as served:
            async with connect(served.url, fragment_size=16 * 1024) as client:
                receipt = await client.publish("big", values)
                assert receipt.count == 3
                got = [e.value async for b in client.subscribe("big", until_id=3) for e in b]
            assert got == values
            async with connect(served.url, fragment_size=16 * 1024, compression="never") as c:
                plain = [v async for vs in c.subscribe_values("big", until_id=3) for v in vs]
            assert plain == values

    run(main())


def test_values_across_every_websocket_length_encoding(tmp_path: Path, run: Runner) -> None:
    """The hub frames its WebSocket messages itself (head, Tube header and payload in one
    writelines): payload lengths at each boundary of RFC 6455's three length encodings (125 /
    126, 65,535 / 65,536) arrive byte for byte, one value per message (demand 1)."""

    async def main() -> None:
        rng = random.Random(7)
        # (each value travels in an envelope: a few bytes of id and timestamp before it)
        values = [rng.randbytes(n) for n in (0, 100, 118, 119, 120, 65_520, 65_530, 65_540,
                                             200_000)]  # fmt: skip
        async with tube_hub(tmp_path) as served:
            await served.hub.append(Batch.build("edges", values), assign_ids=True)
            async with connect(served.url, compression="never") as client:
                got = [e.value async for b in client.subscribe("edges", until_id=len(values),
                                                              prefetch=1) for e in b]  # fmt: skip
            assert got == values

    run(main())


def test_fixed_size_values(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        values = [i.to_bytes(16, "big") for i in range(5000)]
        async with tube_hub(tmp_path, TubeSettings(fragment_size=4096)) as served:
            async with connect(served.url, fragment_size=4096) as client:
                async with await client.publisher("ticks", format="value", size=16) as pub:
                    receipt = await pub.send(values)
                assert (receipt.first_id, receipt.last_id) == (1, 5000)
                data = b""
                deliveries = 0
                async for got in client.subscribe_values("ticks", size=16, until_id=5000,
                                                         prefetch=1000):  # fmt: skip
                    assert got.size == 16
                    data += got.data
                    deliveries += 1
            assert data == b"".join(values)
            assert deliveries < 5000  # packed runs, not one delivery per value

    run(main())


# --------------------------------------------------------------------------- raw WebSocket


def test_a_raw_client_speaking_the_literal_reading(tmp_path: Path, run: Runner) -> None:
    """The header of a message of several fragments alone in one WebSocket message, its
    fragments in the next ones (the seed's literal reading); the hub answers in the README
    reading (header + first fragment). (A header alone with one fragment is an empty message:
    shared/seeds/README.md.)"""

    async def main() -> None:
        async with tube_hub(tmp_path) as served:
            await append(served.hub, "s", [b"v0", b"v1", b"v2"])
            async with raw_tube(served.url) as tube:
                assert await tube.handshake(4096) == 64 * 1024  # the hub's default
                hello = frames(ClientHello())
                await tube.ws.send_bytes(encode_header(0, 2))  # header alone
                await tube.ws.send_bytes(hello[:1])  # its two fragments
                await tube.ws.send_bytes(hello[1:])
                (server_hello,) = await tube.next_rsio()
                assert isinstance(server_hello, ServerHello)
                subscribe = frames(Subscribe("s?format=value", 1, 2))
                await tube.ws.send_bytes(encode_header(0, 3))  # 3 fragments after the header
                await tube.ws.send_bytes(subscribe[:2])
                await tube.ws.send_bytes(subscribe[2:5])
                await tube.ws.send_bytes(subscribe[5:])
                assert await tube.next_rsio(3) == [
                    Subscribed(1, 0), OnNext(1, b"v0"), OnNext(1, b"v1")
                ]  # fmt: skip
                # and the README reading on the same connection
                await tube.ws.send_bytes(encode_header(0, 1) + frames(Request(1, 1)))
                assert await tube.next_rsio() == [OnNext(1, b"v2")]
                await tube.ws.send_bytes(b"\x80")  # ping
                pong = await tube.receive()
                assert pong.data == b"\x88"

    run(main())


def test_an_empty_tube_message_from_a_client_is_no_end_of_stream(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with tube_hub(tmp_path) as served:
            await append(served.hub, "s", [b"v0"])
            async with raw_tube(served.url) as tube:
                await tube.handshake()
                await tube.ws.send_bytes(encode_header(0, 1) + frames(ClientHello()))
                assert isinstance((await tube.next_rsio())[0], ServerHello)
                await tube.ws.send_bytes(encode_header(0, 1))  # an empty message: the header
                # alone (README); then one as tidewire sent it before, with an empty fragment
                await tube.ws.send_bytes(encode_header(0, 1))
                await tube.ws.send_bytes(b"")
                await tube.ws.send_bytes(b"\x01" + frames(Subscribe("s?format=value", 1, 1)))
                assert await tube.next_rsio(2) == [Subscribed(1, 0), OnNext(1, b"v0")]

    run(main())


@asynccontextmanager
async def fake_hub(*, empty: bool) -> AsyncIterator[str]:
    """A Tube server by hand that answers RS.io: serverHello (followed by an empty Tube
    message if ``empty``), then every subscribe with subscribed + onComplete."""

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        tube = Connection(Role.SERVER, fragment_size=1024, compression="never")
        decoder = Decoder()
        for _ in range(100):
            message = await ws.receive()
            if message.type != aiohttp.WSMsgType.BINARY:
                break
            tube.receive_data(message.data, 0.0)
            while (event := tube.next_event()) is not None:
                if isinstance(event, MessageReceived):
                    decoder.feed(event.data)
            while (rsio := decoder.next_message()) is not None:
                if isinstance(rsio, ClientHello):
                    tube.send(frames(ServerHello()), 0.0)
                    if empty:
                        tube.send(b"", 0.0)
                elif isinstance(rsio, Subscribe):
                    tube.send(frames(Subscribed(rsio.subscriber, 0),
                                     OnComplete(rsio.subscriber)), 0.0)  # fmt: skip
                elif isinstance(rsio, Goodbye):
                    tube.close()
            for out in tube.data_to_send():
                await ws.send_bytes(out)
            if not tube.established:
                break
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/tube", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"ws://127.0.0.1:{runner.addresses[0][1]}/tube"
    finally:
        await runner.cleanup()


def test_an_empty_tube_message_from_the_hub_is_no_end_of_stream(run: Runner) -> None:
    async def main() -> None:
        async with fake_hub(empty=True) as url, connect(url) as client:
            assert await client.streams() == []

    run(main())


def test_the_fake_hub_answers_without_the_empty_message(run: Runner) -> None:
    """(The check of the fake hub above: without the empty message, the client works.)"""

    async def main() -> None:
        async with fake_hub(empty=False) as url, connect(url) as client:
            assert await client.streams() == []
            assert await client.streams(["a"]) == []

    run(main())


def test_a_text_websocket_message_closes_with_1003(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with tube_hub(tmp_path) as served, raw_tube(served.url) as tube:
            await tube.handshake()
            await tube.ws.send_str("hello")
            assert await tube.close_code() == 1003

    run(main())


def test_a_websocket_message_far_over_the_fragment_size_is_refused(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        settings = TubeSettings(fragment_size=1024)
        async with tube_hub(tmp_path, settings) as served, raw_tube(served.url) as tube:
            assert await tube.handshake() == 1024
            await tube.ws.send_bytes(b"\x01" + bytes(2048))
            assert await tube.close_code() == 1009

    run(main())


def test_a_websocket_message_one_byte_over_the_fragment_size_is_refused(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        settings = TubeSettings(fragment_size=1024)
        async with tube_hub(tmp_path, settings) as served, raw_tube(served.url) as tube:
            assert await tube.handshake() == 1024
            await tube.ws.send_bytes(encode_header(0, 1) + frames(ClientHello()))
            assert isinstance((await tube.next_rsio())[0], ServerHello)
            # 2048 bytes of RS.io that are harmless if read (a subscription refused for
            # an unknown parameter), as a header + 1023 bytes, then 1025 bytes
            name = "s?nope="
            while len(subscribe := frames(Subscribe(name, 7))) < 2048:
                name += "x"
            assert len(subscribe) == 2048
            await tube.ws.send_bytes(encode_header(0, 2) + subscribe[:1023])
            await tube.ws.send_bytes(subscribe[1023:])
            answer = await tube.receive()
            assert answer.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), (
                f"read: {answer.type.name} {bytes(answer.data)[:40]!r}")  # fmt: skip

    run(main())


def test_a_bad_header_closes_that_connection_only(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with tube_hub(tmp_path) as served:
            await append(served.hub, "s", [b"a", b"b"])
            async with connect(served.url) as client:
                stream = client.subscribe_values("s")
                assert list(await anext(stream)) == [b"a", b"b"]
                for bad in (b"\x81", b"\x00\x00", b"\x00\x80\x80\x80\x80\x80\x01"):
                    async with raw_tube(served.url) as tube:
                        await tube.handshake()
                        await tube.ws.send_bytes(bad)
                        assert await tube.close_code() == 1002
                async with raw_tube(served.url) as tube:  # bytes after the size
                    await tube.ws.send_bytes(b"\x20\x00")
                    assert await tube.close_code() == 1002
                await append(served.hub, "s", [b"c"])
                assert list(await anext(stream)) == [b"c"]
                await stream.aclose()

    run(main())


def test_shutdown_says_goodbye_to_tube_clients(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with (
            tube_hub(tmp_path) as served,
            connect(served.url) as client,
            raw_tube(served.url) as tube,
        ):
            await tube.handshake()
            await tube.ws.send_bytes(b"\x01" + frames(ClientHello(), Subscribe("s", 1, 5)))
            server_hello, subscribed = await tube.next_rsio(2)
            assert isinstance(server_hello, ServerHello)
            assert subscribed == Subscribed(1, 0)
            stream = client.subscribe("s")
            waiting = asyncio.ensure_future(anext(stream))
            await until_subscribed(served, 2)
            stopping = asyncio.create_task(served.stop())
            (goodbye,) = await tube.next_rsio()
            assert goodbye == Goodbye("server shutting down")
            assert await tube.close_code() is not None
            with pytest.raises(RsioError, match=r"server shutting down|closed|lost"):
                await waiting
            await stopping

    run(main())


def test_a_subscriber_receives_no_more_than_its_demand(tmp_path: Path, run: Runner) -> None:
    """RS.io demand over Tube (the client's byte stream, RS.io frames by hand): a subscriber
    that asked for 3 and stops requesting gets 3, however many events there are."""

    async def main() -> None:
        settings = TubeSettings(fragment_size=1024, min_fragment_size=1024)  # (floor: 4096)
        async with tube_hub(tmp_path, settings) as served:
            await append(served.hub, "s", [b"e%d" % i for i in range(100)])
            await append(served.hub, "t", [b"mark"])
            stream = await TubeStream.open(served.url, fragment_size=1024)
            decoder = Decoder()
            got: list[object] = []

            async def until(predicate: Callable[[], bool]) -> None:
                for _ in range(10_000):
                    if predicate():
                        return
                    data = await stream.read()
                    assert data, stream.closed_reason
                    decoder.feed(data)
                    while (message := decoder.next_message()) is not None:
                        got.append(message)
                raise AssertionError("too many reads")

            def of(subscriber: int) -> list[object]:
                return [m for m in got if getattr(m, "subscriber", None) == subscriber]

            try:
                stream.write(frames(ClientHello(), Subscribe("s?format=value", 1, 3)))
                await until(lambda: len(of(1)) >= 4)  # subscribed + 3 elements
                await append(served.hub, "s", [b"live"] * 20)  # more, live
                # round trips behind everything the hub could have sent for 1
                for marker in (2, 3):
                    stream.write(frames(Subscribe("t?format=value", marker, 5)))
                    await until(lambda m=marker: len(of(m)) >= 2)  # type: ignore[misc]
                    assert of(marker) == [Subscribed(marker, 0), OnNext(marker, b"mark")]
                assert of(1) == [Subscribed(1, 0)] + [OnNext(1, b"e%d" % i) for i in range(3)]
                stream.write(frames(Request(1, 2)))
                stream.write(frames(Subscribe("t?format=value", 4, 5)))
                await until(lambda: len(of(4)) >= 2 and len(of(1)) >= 6)
                assert of(1)[4:] == [OnNext(1, b"e3"), OnNext(1, b"e4")]
                stream.write(frames(Subscribe("t?format=value", 5, 5)))
                await until(lambda: len(of(5)) >= 2)
                assert len(of(1)) == 6
            finally:
                stream.close()
                await stream.wait_closed()

    run(main())
