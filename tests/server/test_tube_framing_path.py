"""The hub's Tube carrier frames each WebSocket message itself with one ``writelines`` when the
transport can take it (``writes_lines``). uvloop's transports are not subclasses of
``asyncio.WriteTransport``: an ``isinstance`` test once sent every message of a hub on uvloop (as
``tidewire serve`` runs) down the joining fallback, with the same bytes on the wire, so only this
test could see it. Real connections on 127.0.0.1, on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from tidewire.server.tube import binary_frame_head, writes_lines

Runner = Callable[[Coroutine[Any, Any, None]], None]


def test_both_ends_of_a_tcp_connection_take_writelines(run: Runner) -> None:
    async def main() -> None:
        accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

        async def on_client(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(writer)

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            served = await asyncio.wait_for(accepted, 10)
            assert writes_lines(writer.transport)
            assert writes_lines(served.transport)
            # and what the carrier writes that way arrives whole, in order
            parts: list[bytes | memoryview] = [b"\x00tube", memoryview(b"x" * 70000)[5:], b"end"]
            size = sum(len(p) for p in parts)
            served.transport.writelines([binary_frame_head(size), *parts])
            head = await asyncio.wait_for(reader.readexactly(10), 10)
            assert head == bytes((0x82, 127)) + size.to_bytes(8, "big")
            body = await asyncio.wait_for(reader.readexactly(size), 10)
            assert body == b"".join(bytes(p) for p in parts)
            served.close()
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    run(main())


def test_a_transport_without_writelines_is_not_framed_here() -> None:
    assert not writes_lines(asyncio.BaseTransport())
    assert binary_frame_head(125) == bytes((0x82, 125))
    assert binary_frame_head(126) == bytes((0x82, 126, 0, 126))
    assert binary_frame_head(65535) == bytes((0x82, 126, 0xFF, 0xFF))
    assert binary_frame_head(65536) == bytes((0x82, 127)) + (65536).to_bytes(8, "big")
