"""RS.io's start by time end to end (issue 23, docs/protocols/rsio.md "Publisher names"): a
subscription ``from-time=ms`` starts at the first event whose timestamp is at least ``ms``,
over TCP, HTTP and Tube, on real sockets on 127.0.0.1; the hub publisher ``?times=`` and
``RsioClient.ids_at``; refusals."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from raw_wire import RSIO_HELLO, decode_rsio, varint
from tidewire.client import tube
from tidewire.client.backoff import Retry
from tidewire.client.http import HttpHub
from tidewire.client.resilient import ReconnectingClient
from tidewire.client.rsio import RsioClient, connect
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl
from tidewire.log import LogConfig, StreamSettings
from tidewire.model import Batch, TidewireError
from tidewire.protocols.rsio import OnError, OnNext, Subscribe, encode
from tidewire.protocols.rsio.names import FromTime
from tidewire.server.app import build_app
from tidewire.server.rsio import start_rsio_server

RUN_SECONDS = 30.0  # (the run fixture's bound, tests/conftest.py)
Run = Callable[[Coroutine[Any, Any, None]], None]
STREAM = "ticks"
# Timestamps not in id order: the first event at or after a time is not the first id after
# the events before it in time.
STAMPS = [500, 100, 900, 300, 700, 200, 800, 400, 600, 1000] * 30


@dataclass(slots=True)
class Urls:
    hub: Hub
    rsio: str
    http: str
    tube: str


@asynccontextmanager
async def served(path: Path, access: Access | None = None) -> AsyncIterator[Urls]:
    """A hub with small segments (so lookups cross segments), its RS.io TCP server and its web
    app (HTTP RS.io and Tube), all on free ports of 127.0.0.1."""
    config = LogConfig(fsync=False, defaults=StreamSettings(segment_bytes=4096,
                                                            index_interval_bytes=256))
    hub = Hub.open(str(path), config)
    server = await start_rsio_server(hub, "127.0.0.1", 0, access=access)
    runner = web.AppRunner(build_app(hub, access=access), access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        yield Urls(hub, f"rsio://127.0.0.1:{server.port}", f"http://127.0.0.1:{port}",
                   f"ws://127.0.0.1:{port}/tube")  # fmt: skip
    finally:
        await runner.cleanup()
        await server.close()
        await hub.close()


async def fill(hub: Hub) -> list[tuple[int, int]]:
    """Append STAMPS in batches of 7; the (id, timestamp) pairs."""
    pairs: list[tuple[int, int]] = []
    for at in range(0, len(STAMPS), 7):
        stamps = STAMPS[at : at + 7]
        stored = await hub.append(Batch.build(STREAM, [b"x" * 40] * len(stamps),
                                              timestamps=stamps), assign_ids=True)  # fmt: skip
        pairs += zip(stored.ids, stored.timestamps, strict=True)
    return pairs


def first_at(pairs: list[tuple[int, int]], ms: int) -> int | None:
    return next((i for i, t in pairs if t >= ms), None)


async def ids_of(batches: AsyncIterator[Batch]) -> list[int]:
    out: list[int] = []
    async with contextlib.aclosing(batches):  # type: ignore[type-var]
        async for batch in batches:
            out += batch.ids
    return out


@pytest.mark.parametrize("carrier", ["tcp", "tube"])
def test_from_time_over_rsio_and_tube_starts_at_the_first_event_that_new(
    tmp_path: Path, run: Run, carrier: str
) -> None:
    async def main() -> None:
        async with served(tmp_path) as urls:
            pairs = await fill(urls.hub)
            last = pairs[-1][0]
            opened = connect(urls.rsio) if carrier == "tcp" else tube.connect(urls.tube)
            async with opened as client:
                assert isinstance(client, RsioClient)
                for ms in (0, 100, 101, 450, 999, 1000):
                    start = first_at(pairs, ms)
                    assert start is not None
                    got = await ids_of(client.subscribe(STREAM, from_id=FromTime(ms),
                                                        until_id=last))  # fmt: skip
                    assert got == list(range(start, last + 1)), ms
                values = client.subscribe_values(STREAM, from_id=FromTime(950), until_id=last)
                async with contextlib.aclosing(values):
                    count = sum([len(v.items) async for v in values])
                assert count == last - (first_at(pairs, 950) or 0) + 1
                records = client.subscribe_records(STREAM, from_id=FromTime(1000), until_id=last)
                got = await ids_of(records)
                assert got[0] <= (first_at(pairs, 1000) or 0) <= got[-1] == last

    run(main())


def test_no_event_that_new_starts_live_whatever_the_next_events_time(
    tmp_path: Path, run: Run
) -> None:
    async def main() -> None:
        async with served(tmp_path) as urls, connect(urls.rsio) as client:
            pairs = await fill(urls.hub)
            last = pairs[-1][0]
            sub = client.subscribe(STREAM, from_id=FromTime(5000))
            async with contextlib.aclosing(sub):
                first = asyncio.ensure_future(anext(sub))
                # Old events appended until one is delivered: the lookup (nothing that new)
                # happens at some point meanwhile; what follows it is delivered, whatever its
                # time, and nothing from before (the history holds nothing that new).
                for _ in range(50):
                    await urls.hub.append(Batch.build(STREAM, [b"late"], timestamps=[7]),
                                          assign_ids=True)  # fmt: skip
                    done, _ = await asyncio.wait([first], timeout=0.1)
                    if done:
                        break
                batch = await asyncio.wait_for(first, 10)
            assert last < batch.first_id <= urls.hub.latest(STREAM)
            assert set(batch.timestamps) == {7}

    run(main())


def test_from_time_over_http(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with served(tmp_path) as urls:
            pairs = await fill(urls.hub)
            last = pairs[-1][0]
            async with HttpHub(urls.http) as client:
                for ms in (0, 450, 1000):
                    start = first_at(pairs, ms)
                    got = await ids_of(client.subscribe(STREAM, from_id=FromTime(ms),
                                                        until_id=last))  # fmt: skip
                    assert start is not None
                    assert got == list(range(start, last + 1)), ms
            async with aiohttp.ClientSession() as session:
                for query, why in (("from-time=5&from=1", "exclude each other"),
                                   ("from-time=-5", "from-time= is not a time")):  # fmt: skip
                    url = f"{urls.http}/rsio/pub/{STREAM}?{query}"
                    async with session.put(url) as response:
                        assert response.status == 400
                        assert why in (await response.read()).decode()

    run(main())


def test_ids_at_answers_every_stream_asked(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with served(tmp_path) as urls, connect(urls.rsio) as client:
            pairs = await fill(urls.hub)
            times = {STREAM: 450, "absent": 0}
            assert await client.ids_at(times) == {STREAM: first_at(pairs, 450), "absent": None}
            assert await client.ids_at({STREAM: 1001}) == {STREAM: None}
            assert await client.ids_at({}) == {}
            for ms in sorted({t for _, t in pairs}):
                assert (await client.ids_at({STREAM: ms}))[STREAM] == first_at(pairs, ms)
            with pytest.raises(ValueError, match=r"0\.\.2"):
                await client.ids_at({STREAM: -1})

    run(main())


REFUSED = {
    "ticks?from-time=5&from=1": "from= and from-time= exclude each other",
    "ticks?from-time=soon": "'soon' is not an id",
    "ticks?from-time=-1": "'-1' is not an id",
    "?times=ticks%3Dsoon": "'soon' is not an id",
    "?times": "?times needs stream=ms pairs",
    "?times=%3D5": "bad stream",
    "?when=1": "unknown hub publisher",
}


def test_bad_times_are_refused_with_on_error_and_the_connection_goes_on(
    tmp_path: Path, run: Run
) -> None:
    async def main() -> None:
        async with served(tmp_path) as urls:
            await fill(urls.hub)
            host, port = urls.rsio.removeprefix("rsio://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            frames = b"".join(bytes(encode(Subscribe(p, n, 1))) for n, p in enumerate(REFUSED))
            good = bytes(encode(Subscribe("ticks?from-time=1000", 99, 1)))
            writer.write(RSIO_HELLO + frames + good)
            data = b""
            while len([m for m in decode_rsio(data) if isinstance(m, OnError | OnNext)]) < 8:
                chunk = await asyncio.wait_for(reader.read(65536), 10)
                assert chunk, decode_rsio(data)
                data += chunk
            writer.close()
            errors = {m.subscriber: m.error for m in decode_rsio(data) if isinstance(m, OnError)}
            for n, why in enumerate(REFUSED.values()):
                assert why in errors[n], (n, errors[n])
            (element,) = [m.element for m in decode_rsio(data) if isinstance(m, OnNext)]
            assert bytes(element)[:1] == bytes(varint(10))  # (envelope: id 10 first)

    run(main())


def test_ids_at_leaves_out_streams_the_principal_may_not_read(tmp_path: Path, run: Run) -> None:
    access = Access(Acl.parse('[principal."anonymous"]\nread = ["ticks"]\n'))

    async def main() -> None:
        async with served(tmp_path, access) as urls, connect(urls.rsio) as client:
            await urls.hub.append(Batch.build("secret", [b"s"], timestamps=[5]), assign_ids=True)
            await fill(urls.hub)
            assert await client.ids_at({STREAM: 1000}) == {STREAM: 10}
            with pytest.raises(TidewireError, match="'secret'"):
                await client.ids_at({STREAM: 0, "secret": 0})

    run(main())


def test_the_reconnecting_client_starts_by_time_and_asks_ids_at(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with served(tmp_path) as urls:
            pairs = await fill(urls.hub)
            last = pairs[-1][0]
            async with await connect(urls.rsio, retry=Retry(attempts=3)) as client:
                assert isinstance(client, ReconnectingClient)
                start = first_at(pairs, 650)
                assert start is not None
                got = await ids_of(client.subscribe(STREAM, from_id=FromTime(650), until_id=last))
                assert got == list(range(start, last + 1))
                assert await client.ids_at({STREAM: 650}) == {STREAM: start}

    run(main())
