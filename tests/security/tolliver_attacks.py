"""Attacks on a hub's Tolliver listener (issue 20), as raw remotes on 127.0.0.1. Each takes the
listener's port, is bounded in time (``asyncio.timeout``) and in what it sends, closes every
connection it opens, and returns what the hub answered.

* :func:`channel_flood`: handshakes asking for thousands of channels (4,000-byte names
  included) over many connections and UUIDs;
* :func:`never_acking`: a remote that reads every delivery and acks none;
* :func:`uuid_claims`: connections claiming another instance's UUID;
* :class:`Remote`: a remote speaking through the sans-IO machine, sending what it likes.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from tidewire.protocols.tolliver import (
    Acked,
    Closed,
    Connection,
    Decoder,
    Established,
    Event,
    HandshakeRequest,
    HandshakeResponse,
    Limits,
    Message,
    Role,
    SubscriptionEntry,
    encode,
)
from tidewire.tolliver import uuid7

__all__ = ["Remote", "answered", "channel_flood", "never_acking", "request", "response_to",
           "uuid_claims"]  # fmt: skip

HOST = "127.0.0.1"


class Remote:
    """A remote instance speaking through the sans-IO machine: it sends what it likes (any
    channel, any subscription), and shows what the hub says."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: Connection
    ) -> None:
        self.reader, self.writer, self.conn = reader, writer, conn
        self.events: list[Event] = []
        self.received = b""  # every byte the hub sent

    @classmethod
    async def open(
        cls,
        port: int,
        *,
        ssl: ssl.SSLContext | None = None,
        instance: uuid.UUID | None = None,
        subscriptions: Iterable[str] = (),
    ) -> Remote:
        reader, writer = await asyncio.open_connection(HOST, port, ssl=ssl)
        conn = Connection(Role.CONNECTOR, instance or uuid7(), 1, frozenset({1}),
                          {(c, "") for c in subscriptions})  # fmt: skip
        return cls(reader, writer, conn)

    def flush(self) -> None:
        if data := self.conn.data_to_send():
            self.writer.write(data)

    async def _read(self) -> bool:
        try:
            data = await self.reader.read(65536)
        except (ConnectionError, ssl.SSLError):
            data = b""
        self.received += data
        self.conn.receive_data(data)
        while (event := self.conn.next_event()) is not None:
            self.events.append(event)
        self.flush()
        return bool(data)

    async def until(self, kind: type, **fields: object) -> None:
        """Until an event of ``kind`` with ``fields`` (the hub closing first fails)."""
        while not any(isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items())
                      for e in self.events):  # fmt: skip
            assert await self._read(), f"closed by the hub; events: {self.events}"

    async def handshake(self) -> None:
        self.conn.initiate()
        self.flush()
        await self.until(Established)

    async def refused(self) -> bool:
        """Send the handshake request and read until the hub closes: whether it closed before
        sending anything (not even a handshake response)."""
        self.conn.initiate()
        self.flush()
        await self.closed()
        return self.received == b""

    async def send(self, channel: str, body: bytes, message_id: int) -> None:
        self.conn.send(Message(channel, "", body, message_id), 0.0)
        self.flush()

    async def works(self, message_id: int, channel: str = "carry-on") -> None:
        """A reliable message is stored and acked: the connection carries on."""
        await self.send(channel, b"still here", message_id)
        await self.until(Acked, id=message_id)

    async def closed(self) -> None:
        """Until the hub closes the connection."""
        while await self._read():
            pass
        assert self.conn.closed or any(isinstance(e, Closed) for e in self.events)

    def close(self) -> None:
        self.writer.close()


def entries(names: Iterable[str]) -> tuple[SubscriptionEntry, ...]:
    return tuple(SubscriptionEntry(0, name) for name in names)


def request(instance: uuid.UUID, names: Iterable[str]) -> bytes:
    """A handshake request's bytes (made before an attack starts: the test's process shares
    its CPU with the bystander's thread)."""
    return bytes(encode(HandshakeRequest(1, instance, entries(names))))


async def answered(port: int, data: bytes, *, tls: ssl.SSLContext | None = None) -> bool:
    """Send ``data`` (a handshake request): whether the hub answered before closing."""
    reader, writer = await asyncio.open_connection(HOST, port, ssl=tls)
    try:
        writer.write(data)
        try:
            return bool(await reader.read(65536))
        except (ConnectionError, ssl.SSLError):
            return False
    finally:
        writer.close()


async def response_to(port: int, data: bytes, *, tls: ssl.SSLContext | None = None
                      ) -> HandshakeResponse | None:  # fmt: skip
    """Send ``data`` (a handshake request); the hub's response, or ``None`` if it closed
    without one."""
    reader, writer = await asyncio.open_connection(HOST, port, ssl=tls)
    try:
        writer.write(data)
        decoder = Decoder(Limits())
        while True:
            try:
                chunk = await reader.read(1 << 20)
            except (ConnectionError, ssl.SSLError):
                chunk = b""
            if not chunk:
                return None
            decoder.feed(chunk)
            if isinstance(frame := decoder.next_frame(), HandshakeResponse):
                return frame
    finally:
        writer.close()


async def channel_flood(port: int, prefix: str = "glob", *, long_names: int = 5,
                        connections: int = 4, uuids: int = 3) -> tuple[int, int]:  # fmt: skip
    """The flood of channels: ``long_names`` handshakes asking for 200 channels of 4,000-byte
    names under ``prefix``, then ``connections`` handshakes of one UUID each asking for a new
    thousand channels, then one each of ``uuids`` more UUIDs. (long-name handshakes the hub
    closed without a response, handshakes it answered)"""
    long = request(uuid7(), (f"{prefix}.{i:04d}" + "x" * 3990 for i in range(200)))
    one = uuid7()  # one UUID, a new thousand channels each time; then more UUIDs
    rounds = [request(one, (f"{prefix}.r{r}.c{i}" for i in range(1000)))
              for r in range(connections)]  # fmt: skip
    rounds += [request(uuid7(), (f"{prefix}.u{u}.c{i}" for i in range(1000)))
               for u in range(uuids)]  # fmt: skip
    refused = 0
    for _ in range(long_names):  # 4,000-byte names: refused, no response
        refused += not await answered(port, long)
    taken = 0
    for data in rounds:
        taken += await answered(port, data)
    return refused, taken


async def never_acking(
    port: int, channels: list[str], seconds: float, fill: Callable[[], Coroutine[Any, Any, None]]
) -> tuple[int, int, int]:
    """A remote following ``channels`` that reads everything the hub sends for ``seconds`` and
    acks nothing; ``fill()`` (what publishes into the channels) starts once its handshake is
    answered (a new remote starts at the streams' end). (distinct messages, their body bytes,
    message frames received)"""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(request(uuid7(), channels))
    decoder, seen, nbytes, frames = Decoder(Limits()), set(), 0, 0
    filling: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(seconds):
            while data := await reader.read(1 << 20):
                decoder.feed(data)
                while (frame := decoder.next_frame()) is not None:
                    if isinstance(frame, HandshakeResponse) and filling is None:
                        filling = asyncio.create_task(fill())
                    if isinstance(frame, Message) and frame.channel != "tolliver":
                        frames += 1
                        if frame.id not in seen:
                            seen.add(frame.id)
                            nbytes += len(frame.body)
    except TimeoutError:
        pass
    finally:
        writer.close()
    assert filling is not None
    await filling
    return len(seen), nbytes, frames


async def uuid_claims(port: int, victim: uuid.UUID, ctx: ssl.SSLContext | None, tries: int,
                      channels: Iterable[str] = ("news",)) -> int:  # fmt: skip
    """``tries`` connections (with ``ctx``: the attacker's own certificate) claiming to be
    instance ``victim``: how many the hub closed before sending anything."""
    refused = 0
    for _ in range(tries):
        claim = await Remote.open(port, ssl=ctx, instance=victim, subscriptions=channels)
        try:
            refused += await claim.refused()
        finally:
            claim.close()
    return refused
