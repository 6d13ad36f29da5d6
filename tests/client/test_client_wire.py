"""The RS.io client's BufferedProtocol carrier (tidewire.client.rsio_wire) on real sockets, on
asyncio's loop and uvloop: reads of any size (one byte at a time, a few bytes, 8 MiB at once)
decode to the same elements byte for byte; bytes that arrive before a sink is attached are
handed over, then EOF; writelines of many chunks arrive byte-exact."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from helpers import hub_server
from tidewire.client.rsio import RsioClient
from tidewire.client.rsio_wire import WireProtocol

HOST = "127.0.0.1"
Run = Callable[[Coroutine[Any, Any, None]], None]


async def open_wire(port: int, read_bytes: int) -> WireProtocol:
    loop = asyncio.get_running_loop()
    _, wire = await loop.create_connection(lambda: WireProtocol(read_bytes), HOST, port)
    return wire


@pytest.mark.parametrize(
    ("read_bytes", "sizes"),
    [
        (1, [0, 1, 127, 128, 3000]),  # every varint and frame split at every byte
        (7, [5, 200, 70_000]),
        (8 * 1024 * 1024, [16, 65_536, 1_000_000, 3]),  # a read holds many whole frames
    ],
)
def test_reads_of_any_size_decode_byte_exact(
    tmp_path: Path, run: Run, read_bytes: int, sizes: list[int]
) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (_, server, _url):
            values = [os.urandom(n) for n in sizes] * 3
            wire = await open_wire(server.port, read_bytes)
            client = RsioClient(wire, wire)
            try:
                receipt = await client.publish("s", values)
                assert (receipt.first_id, receipt.last_id) == (1, len(values))
                got: list[bytes] = []
                async for batch in client.subscribe("s", until_id=len(values)):
                    got += [e.value for e in batch]
                assert got == values
            finally:
                await client.close()
            assert client.closed is not None

    run(main())


def test_early_bytes_then_eof_reach_a_late_sink(run: Run) -> None:
    sent = [os.urandom(n) for n in (1, 5000, 300_000)]

    async def main() -> None:
        all_sent = asyncio.Event()

        async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for chunk in sent:
                writer.write(chunk)
            await writer.drain()
            writer.close()
            all_sent.set()

        server = await asyncio.start_server(serve, HOST, 0)
        async with server:
            wire = await open_wire(server.sockets[0].getsockname()[1], 4096)
            # The loop runs meanwhile: reads under way (uvloop) are kept, the rest waits in
            # the kernel, EOF included, until the sink is attached.
            await asyncio.wait_for(all_sent.wait(), 10)
            received = bytearray()
            eofs: list[int] = []
            ended = asyncio.Event()

            def sink(data: memoryview | bytes) -> None:
                if not data:
                    eofs.append(len(received))
                received.extend(data)

            wire.attach(sink, lambda exc: ended.set())
            await asyncio.wait_for(ended.wait(), 10)
            assert bytes(received) == b"".join(sent)
            assert eofs == [len(received)]
            with pytest.raises(ConnectionResetError):
                await wire.drain()

    run(main())


def test_writelines_of_many_chunks_is_byte_exact(run: Run) -> None:
    chunks: list[bytes | bytearray | memoryview] = []
    for i in range(2000):  # more than IOV_MAX (1024) chunks, of mixed types and sizes
        data = os.urandom(i % 300)
        chunks.append(data if i % 3 == 0 else bytearray(data) if i % 3 == 1 else memoryview(data))
    expected = b"".join(chunks)

    async def main() -> None:
        got = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            got.set_result(await reader.read())  # to EOF
            writer.close()

        server = await asyncio.start_server(serve, HOST, 0)
        async with server:
            wire = await open_wire(server.sockets[0].getsockname()[1], 4096)
            wire.attach(lambda data: None, lambda exc: None)
            wire.writelines(chunks)
            await wire.drain()
            assert wire.transport is not None
            wire.transport.write_eof()
            assert await asyncio.wait_for(got, 10) == expected
            wire.close()
            await wire.wait_closed()

    run(main())
