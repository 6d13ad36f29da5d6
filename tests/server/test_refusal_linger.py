"""A refused peer's close lingers (guard.refused, ``limits.refusal_close_seconds``): it is told
why at once, then its connection stays, unread, for the delay before it is closed, so that a
peer refused and reconnecting in a loop cannot make the hub accept and close connections at
the pace of its own loop (as Kafka delays closing a failed authentication)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from helpers import hub_server, until
from loops import Run
from raw_wire import RSIO_HELLO, decode_rsio, varint
from tidewire.protocols.rsio import Goodbye
from tidewire.server.guard import ConnectionLimits

MiB = 1024 * 1024
GOODBYE = "protocol error: elements for subscriber 7, which is not subscribed"


async def breach(port: int) -> tuple[list[object], float]:
    """An ``onNext`` for a subscription never made: what the hub said, and how long after its
    goodbye arrived the connection was closed (the rest of the declared body is written
    meanwhile, as the attacker would)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(RSIO_HELLO + b"\x07\x07" + varint(16 * MiB))
    data, said = b"", 0.0
    try:
        while chunk := await reader.read(65536):
            data += chunk
            if not said and GOODBYE.encode() in data:
                said = time.monotonic()
                writer.write(bytes(64 * 1024))  # (more of the body: not read, not an error)
    except ConnectionError:
        pass
    closed = time.monotonic()
    writer.close()
    return decode_rsio(data), closed - said


def test_a_breach_is_told_at_once_and_closed_after_the_delay(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        limits = ConnectionLimits(refusal_close_seconds=0.6)
        async with hub_server(tmp_path, limits=limits) as (hub, server, _):
            said, lingered = await breach(server.port)
            assert said[-1] == Goodbye(GOODBYE)
            assert lingered >= 0.5  # (told at once, closed 0.6 s later)
            await until(lambda: not list(server.listener.open_connections()))
            assert hub.budget.used == 0

    run(main())


def test_the_lingering_connection_counts_and_is_not_read(tmp_path: Path, run: Run) -> None:
    """While it lingers the connection is one of the peer's (limits.max_connections_per_peer)
    and the hub reads nothing more from it."""

    async def main() -> None:
        limits = ConnectionLimits(refusal_close_seconds=30.0, max_connections_per_peer=1)
        async with hub_server(tmp_path, limits=limits) as (_, server, _):
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(RSIO_HELLO + b"\x07\x07" + varint(16 * MiB))
            (guard,) = server.listener.open_connections()
            await until(lambda: guard.lingering, "the breach's close to linger")
            received = guard.bytes_in
            writer.write(bytes(256 * 1024))
            await writer.drain()
            # a second connection from the same peer is refused meanwhile (one at a time)
            reader2, writer2 = await asyncio.open_connection("127.0.0.1", server.port)
            refusal = await reader2.read()
            assert b"too many connections" in refusal
            writer2.close()
            assert guard.bytes_in == received  # nothing more was read
            assert guard.is_closing()  # (to the wrapped protocol: closed)
            writer.close()

    run(main())


def test_no_delay_when_the_setting_is_zero(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        limits = ConnectionLimits(refusal_close_seconds=0.0)
        async with hub_server(tmp_path, limits=limits) as (_, server, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(RSIO_HELLO + b"\x07\x07" + varint(16 * MiB))
            await reader.read(65536)  # (the goodbye)
            assert not any(c.lingering for c in server.listener.open_connections())
            writer.close()

    run(main())
