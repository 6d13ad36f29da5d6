"""RS.io over real sockets on 127.0.0.1: the hub's listener and the asyncio client, under the
default loop and uvloop; bad input from raw sockets never disturbs other connections."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import tidewire
from helpers import hub_server
from tidewire.client.rsio import RsioError
from tidewire.config import load_config
from tidewire.hub import Hub
from tidewire.model import Batch
from tidewire.protocols.rsio import (
    ClientHello,
    Decoder,
    Goodbye,
    OnError,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
    encode,
)
from tidewire.server.rsio import RsioServer, start_rsio_server
from tidewire.server.serve import rsio_settings

RUN_SECONDS = 60.0  # (the run fixture's bound, tests/conftest.py)


async def take(
    url: str, stream: str, n: int, **kwargs: Any
) -> list[tuple[int, bytes | None, bytes]]:
    got: list[tuple[int, bytes | None, bytes]] = []
    async with await tidewire.connect(url) as client:
        async for batch in client.subscribe(stream, **kwargs):
            got += [(e.id, e.key, e.value) for e in batch]
            if len(got) >= n:
                break
    return got


def test_history_then_live_in_order_exactly_once(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            await hub.append(Batch.build("s", [b"h%d" % i for i in range(1000)]), assign_ids=True)
            reader = asyncio.create_task(take(url, "s", 50_000, prefetch=1000))
            for chunk in range(49):
                values = [b"v%d" % (chunk * 1000 + i) for i in range(1000)]
                await hub.append(Batch.build("s", values, keys=[b"k", *[None] * 999]),
                                 assign_ids=True)  # fmt: skip
            got = await reader
            assert [i for i, _, _ in got] == list(range(1, 50_001))
            assert got[999][2] == b"h999"
            assert got[1000] == (1001, b"k", b"v0")
            assert got[-1][2] == b"v48999"

    run(main())


def test_from_until_and_key(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, server, url):
            keys = [b"a" if i % 3 == 0 else None for i in range(30)]
            await hub.append(Batch.build("s", [bytes([i]) for i in range(30)], keys=keys),
                             assign_ids=True)  # fmt: skip
            async with await tidewire.connect(url) as client:
                bounded = [e.id async for b in client.subscribe("s", from_id=5, until_id=9)
                           for e in b]  # fmt: skip
                assert bounded == [5, 6, 7, 8, 9]
            keyed = await take(url, "s", 10, key=b"a")
            assert [i for i, _, _ in keyed] == [1, 4, 7, 10, 13, 16, 19, 22, 25, 28]
            latest = asyncio.create_task(take(url, "s", 1, from_id="latest"))
            await until_subscribed(server)  # the hub must know it before the append
            await hub.append(Batch.build("s", [b"new"]), assign_ids=True)
            assert await latest == [(31, None, b"new")]

    run(main())


async def until_subscribed(server: RsioServer, n: int = 1) -> None:
    """Wait (bounded by the test's timeout) until the server pumps ``n`` subscriptions."""
    while sum(len(c.pumps) for c in server.connections) < n:  # noqa: ASYNC110 - no event to await
        await asyncio.sleep(0.001)


async def raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("rsio://").split(":")
    return await asyncio.open_connection(host, int(port))


async def read_messages(reader: asyncio.StreamReader, n: int) -> list[object]:
    decoder = Decoder()
    out: list[object] = []
    while len(out) < n:
        data = await reader.read(65536)
        if not data:
            break
        decoder.feed(data)
        while (message := decoder.next_message()) is not None:
            out.append(message)
    return out


def test_bad_input_gets_goodbye_and_others_carry_on(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            await hub.append(Batch.build("s", [b"x"] * 5), assign_ids=True)
            good = asyncio.create_task(take(url, "s", 10))
            reader, writer = await raw(url)
            writer.write(bytes(encode(ClientHello())) + b"\x0b\x00")  # type 11: unknown
            messages = await read_messages(reader, 2)
            assert isinstance(messages[0], ServerHello)
            assert isinstance(messages[1], Goodbye)
            assert "unknown message type 11" in messages[1].reason
            assert await reader.read() == b""  # closed by the server
            writer.close()
            await hub.append(Batch.build("s", [b"y"] * 5), assign_ids=True)
            assert len(await good) == 10

    run(main())


def test_subscription_level_errors(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            await hub.append(Batch.build("s", [b"x"]), assign_ids=True)
            reader, writer = await raw(url)
            frames = bytearray(encode(ClientHello()))
            encode(Subscribe("s?nope=1", 1), out=frames)
            encode(Subscribe("s", 2), out=frames)
            encode(Request(2, 0), out=frames)
            encode(Subscribe("s", 3), out=frames)
            writer.write(bytes(frames))
            messages = await read_messages(reader, 5)
            assert isinstance(messages[0], ServerHello)
            assert messages[1] == OnError(1, "unknown parameter 'nope' in 's?nope=1'")
            assert messages[2] == Subscribed(2, 0)
            assert isinstance(messages[3], OnError)
            assert messages[3].subscriber == 2
            assert messages[4] == Subscribed(3, 0)
            writer.write(bytes(encode(Request(3, 1))))
            (element,) = await read_messages(reader, 1)
            assert getattr(element, "subscriber", None) == 3
            writer.close()

    run(main())


def test_server_shutdown_says_goodbye(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        server = await start_rsio_server(hub, "127.0.0.1", 0)
        url = f"rsio://127.0.0.1:{server.port}"
        async with await tidewire.connect(url) as client:
            stream = client.subscribe("s")
            waiting: Awaitable[Batch] = asyncio.ensure_future(anext(stream))
            await until_subscribed(server)
            await server.close()
            with pytest.raises(RsioError, match=r"server shutting down|closed|lost"):
                await waiting
        await hub.close()

    run(main())


def test_subscriptions_per_connection_are_bounded(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (_, server, url):
            assert server.connections == set()
            reader, writer = await raw(url)
            frames = bytearray(encode(ClientHello()))
            for subscriber in range(1, 1026):
                encode(Subscribe("s", subscriber), out=frames)
            writer.write(bytes(frames))
            messages = await read_messages(reader, 1026)
            assert all(isinstance(m, Subscribed) for m in messages[1:1025])
            assert messages[1025] == OnError(
                1025, "too many subscriptions on this connection (the limit is 1024)"
            )
            writer.close()

    run(main())


def test_configured_limits_reach_the_listener(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    """``rsio.*`` settings (docs/configuration.md) bound what one connection may send."""
    config = load_config(
        None, {"rsio.max_string_bytes": "16", "rsio.max_subscriptions": "2"}, environ={}
    )

    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        server = await start_rsio_server(hub, "127.0.0.1", 0, rsio_settings(config))
        url = f"rsio://127.0.0.1:{server.port}"
        try:
            reader, writer = await raw(url)
            frames = bytearray(encode(ClientHello()))
            for subscriber in (1, 2, 3):
                encode(Subscribe("s", subscriber), out=frames)
            encode(Subscribe("s?from=earliest&x", 4), out=frames)  # 18 bytes > 16
            writer.write(bytes(frames))
            messages = await read_messages(reader, 5)
            assert messages[1:3] == [Subscribed(1, 0), Subscribed(2, 0)]
            assert messages[3] == OnError(
                3, "too many subscriptions on this connection (the limit is 2)"
            )
            assert isinstance(messages[4], Goodbye)
            assert "exceeds the limit of 16 bytes" in messages[4].reason
            assert await reader.read() == b""
            writer.close()
        finally:
            await server.close()
            await hub.close()

    run(main())


def test_the_receive_buffer_takes_a_whole_tube_message() -> None:
    """Over Tube a whole Tube message reaches RS.io's ``receive_data`` at once, so the receive
    buffer's read-ahead follows ``tube.max_message_bytes`` (never below its default)."""
    default = rsio_settings(load_config(None, environ={})).limits
    assert default.max_read_ahead_bytes == 128 * 1024 * 1024
    big = load_config(None, {"tube.max_message_bytes": str(256 * 1024 * 1024)}, environ={})
    limits = rsio_settings(big).limits
    assert limits.max_read_ahead_bytes == 256 * 1024 * 1024
    assert limits.max_buffered_bytes > limits.max_element_bytes + 256 * 1024 * 1024
    small = load_config(None, {"tube.max_message_bytes": "65536"}, environ={})
    assert rsio_settings(small).limits == default


def test_records_format_gives_whole_checked_batches(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    """``format=records``: one log record per element, demand in records, CRC checked by the
    client; the same events as the envelope format gives."""

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            for i in range(5):
                await hub.append(Batch.build("r", [b"v%d" % (i * 10 + j) for j in range(10)],
                                             keys=[b"k", None] * 5), assign_ids=True)  # fmt: skip
            async with tidewire.connect(url) as client:
                got = [b async for b in client.subscribe_records("r", from_id=7, until_id=44,
                                                                 prefetch=1)]  # fmt: skip
                plain = [b async for b in client.subscribe("r", from_id=7, until_id=44)]
            assert [e for b in got for e in b] == [e for b in plain for e in b]
            assert [e.id for b in got for e in b] == list(range(7, 45))
            # Raw: each element is one whole record (a multiple of 8 bytes, its header first).
            reader, writer = await raw(url)
            frames = bytearray(encode(ClientHello()))
            encode(Subscribe("r?format=records", 1, 2), out=frames)
            writer.write(bytes(frames))
            messages = await read_messages(reader, 4)
            assert messages[1] == Subscribed(1, 0)
            for message in messages[2:]:
                element = bytes(getattr(message, "element", b""))
                assert len(element) % 8 == 0
                assert int.from_bytes(element[:4], "little") == len(element)  # record length
                assert element[4] == 2  # format 2
            writer.close()

    run(main())


@pytest.mark.parametrize("size", [0, 8])
def test_a_publisher_keeps_nothing_of_what_it_sent(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None], size: int
) -> None:
    """A long-lived offer's queue empties once the hub committed what was sent: no per-element
    bookkeeping is left behind (the soak found one count per variable-size value kept)."""

    async def main() -> None:
        async with hub_server(tmp_path) as (_, _, url), await tidewire.connect(url) as client:
            if size:
                pub = await client.publisher("s", format="value", size=size)
            else:
                pub = await client.publisher("s")
            for i in range(50):
                await pub.send([b"%08d" % (i * 10 + j) for j in range(10)])
            assert (pub.queued_entries, pub.queued_bytes) == (0, 0)
            await pub.close()

    run(main())
