"""Attacks on a hub's RS.io listener (issue 20), as raw bytes on 127.0.0.1: each takes the
listener's port, is bounded in time by its caller (``asyncio.timeout``) and in what it sends,
closes every connection it opens, and reports what the hub answered.

* :func:`unknown_id_onnext`: ``onNext`` for a subscription id never made, declaring a big
  element, then most of its body, over several connections.
* :func:`refused_subscribes`: one write of many subscribes the hub refuses (a forbidden stream).
* :func:`never_reading`: many subscriptions with unbounded demand on one connection that never
  reads a byte.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field

from raw_wire import RSIO_HELLO, decode_rsio, varint
from tidewire.protocols.rsio import Goodbye, OnError, Subscribe, encode

__all__ = ["Answer", "never_reading", "refused_subscribes", "unknown_id_onnext"]

MiB = 1024 * 1024
HOST = "127.0.0.1"
_CHUNK = 256 * 1024


@dataclass
class Answer:
    """What the hub sent one attacking connection: its bytes, kept as they came (decoding
    them while the attack runs would take the test process's CPU from the bystander, which
    shares its interpreter), and decoded when asked."""

    data: bytearray = field(default_factory=bytearray)
    reset: bool = False  # the hub dropped the connection (or reset it while we still wrote)

    @functools.cached_property
    def messages(self) -> list[object]:
        return decode_rsio(bytes(self.data))

    @property
    def goodbye(self) -> str | None:
        last = self.messages[-1] if self.messages else None
        return last.reason if isinstance(last, Goodbye) else None

    @property
    def errors(self) -> int:
        return sum(isinstance(m, OnError) for m in self.messages)


async def _answer(reader: asyncio.StreamReader, answer: Answer) -> None:
    """Everything until the hub closes."""
    try:
        while data := await reader.read(1024 * 1024):
            answer.data += data
    except ConnectionError:
        answer.reset = True


async def _attacking(port: int, connections: int,
                     send: Callable[[asyncio.StreamWriter, asyncio.Task[None]], Awaitable[None]]
                     ) -> list[Answer]:  # fmt: skip
    """``connections`` connections at once, each: ``send(writer, reading)`` (a write the hub
    may cut short by closing), then everything the hub answers until it closes; each closed
    (aborted) whatever happens. What each was answered."""

    async def one() -> Answer:
        reader, writer = await asyncio.open_connection(HOST, port)
        answer = Answer()
        reading = asyncio.create_task(_answer(reader, answer))
        try:
            with suppress(ConnectionError):
                await send(writer, reading)
            await reading
        finally:
            writer.transport.abort()
            reading.cancel()
        return answer

    return list(await asyncio.gather(*(one() for _ in range(connections))))


async def unknown_id_onnext(port: int, *, connections: int = 8, declared: int = 16 * MiB,
                            body: int = 15 * MiB) -> list[Answer]:  # fmt: skip
    """Each connection: hello, ``onNext`` for subscription 7 (never made) declaring
    ``declared`` bytes, then up to ``body`` bytes of it while the hub lets us write."""
    zeros = bytes(_CHUNK)

    async def send(writer: asyncio.StreamWriter, reading: asyncio.Task[None]) -> None:
        writer.write(RSIO_HELLO + b"\x07\x07" + varint(declared))
        for _ in range(body // _CHUNK):
            if reading.done():
                break
            writer.write(zeros)
            await writer.drain()

    return await _attacking(port, connections, send)


async def refused_subscribes(port: int, *, count: int, publisher: str = "secret.x",
                             connections: int = 1) -> list[Answer]:  # fmt: skip
    """Each connection: hello and ``count`` subscribes to ``publisher`` (which the hub
    refuses) in one write; then everything the hub answers, until it closes."""
    flood = RSIO_HELLO + b"".join(bytes(encode(Subscribe(publisher, i)))
                                  for i in range(1, count + 1))  # fmt: skip

    async def send(writer: asyncio.StreamWriter, reading: asyncio.Task[None]) -> None:
        writer.write(flood)
        await writer.drain()
        writer.write_eof()

    return await _attacking(port, connections, send)


async def never_reading(port: int, stream: str, *, subscriptions: int = 100,
                        seconds: float) -> None:  # fmt: skip
    """One connection: hello, ``subscriptions`` subscriptions to ``stream`` from its start with
    unbounded demand, then nothing read for ``seconds`` (the attack's length)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(RSIO_HELLO + b"".join(bytes(encode(Subscribe(stream, i, 2**63 - 1)))
                                      for i in range(1, subscriptions + 1)))  # fmt: skip
        await writer.drain()
        await asyncio.sleep(seconds)  # (the attack's duration: it reads nothing meanwhile)
    finally:
        writer.transport.abort()
    del reader
