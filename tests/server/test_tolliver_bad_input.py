"""The hub's Tolliver endpoint against bad input, over raw sockets on 127.0.0.1: unknown codes,
lengths past the :class:`Limits`, the reserved channel misused, invalid UTF-8, frames out of
place. Per docs/protocols/tolliver.md, a breach closes that connection (with a warning in the
log); an ack for an id not awaited and a handshake response or final nobody asked for are
ignored; a message on a channel that is no (writable) stream is refused, logged, not acked.

Whatever the input, the hub never crashes (no exception reaches the event loop), forgets the
connection, accepts new ones, and two instances connected through it keep sending and receiving.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers import run, until
from tidewire.hub import Hub
from tidewire.protocols.tolliver import (
    UNRELIABLE,
    Ack,
    Decoder,
    Frame,
    HandshakeFinal,
    HandshakeRequest,
    HandshakeResponse,
    Limits,
    Message,
    SubscriptionEntry,
    encode,
    encode_entry,
    matches,
)
from tidewire.server.tolliver import TolliverServer, TolliverSettings, start_tolliver_server
from tidewire.tolliver import Delivery, Instance

HOST = "127.0.0.1"
LIMITS = Limits()


# ---------------------------------------------------------------------------- raw frames


def request(*entries: bytes, count: int | None = None) -> bytes:
    """A handshake request, version 1, with these (raw) subscription entries."""
    n = len(entries) if count is None else count
    return (
        b"\x00"
        + struct.pack(">Q", 1)
        + uuid.uuid4().bytes
        + struct.pack(">I", n)
        + b"".join(entries)
    )


def entry(channel: bytes, key: bytes = b"", op: int = 0) -> bytes:
    return struct.pack(">BII", op, len(channel), len(key)) + channel + key


def message(channel: bytes, key: bytes, body: bytes, message_id: int = UNRELIABLE) -> bytes:
    """A message frame by hand (any bytes as names)."""
    return (
        b"\x03"
        + struct.pack(">IIII", len(channel), len(key), len(body), message_id)
        + (channel + key + body)
    )


def header(channel_len: int, key_len: int, body_len: int, message_id: int = 1) -> bytes:
    """A message frame's fixed part only: the lengths it declares."""
    return b"\x03" + struct.pack(">IIII", channel_len, key_len, body_len, message_id)


def control(body: bytes, key: bytes = b"") -> bytes:
    return message(b"tolliver", key, body)


def frame(f: Frame) -> bytes:
    return bytes(encode(f))


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes
    handshake: bool  # sent once the raw client's handshake is complete
    closes: bool  # else: ignored, the connection carries on
    warning: str = ""  # a fragment of the hub's warning ("" = none expected)


HUB = uuid.uuid4()  # any UUID, for frames that need one
CASES = [
    # ---- before the handshake: nothing but handshake frames
    Case("unknown code first", b"\x09", False, True, "unknown message code 9"),
    Case("message before the handshake", frame(Message("c", "", b"x", 1)), False, True,
         "a message before the handshake"),
    Case("ack before the handshake", frame(Ack(1)), False, True, "an ack before the handshake"),
    Case("too many subscriptions", request(count=LIMITS.max_subscriptions + 1), False, True,
         f"{LIMITS.max_subscriptions + 1} subscriptions in a handshake"),
    Case("subscription channel too long", request(entry(b"c" * (LIMITS.max_name_bytes + 1))),
         False, True, f"over {LIMITS.max_name_bytes} bytes"),
    Case("subscription key too long",
         request(entry(b"c", b"k" * (LIMITS.max_name_bytes + 1))), False, True,
         f"over {LIMITS.max_name_bytes} bytes"),
    Case("subscription op 2", request(entry(b"c", op=2)), False, True, "subscription op 2"),
    Case("subscription to the reserved channel", request(entry(b"tolliver")), False, True,
         "reserved channel"),
    Case("subscription channel not UTF-8", request(entry(b"\xff\xfe")), False, True,
         "not UTF-8"),
    Case("subscription key not UTF-8", request(entry(b"c", b"\xc3")), False, True, "not UTF-8"),
    Case("unasked handshake response first", frame(HandshakeResponse(1, HUB, 0)), False, False),
    Case("unasked handshake final first", frame(HandshakeFinal(1)), False, False),
    # ---- on an established connection
    Case("unknown code", b"\xff", True, True, "unknown message code 255"),
    Case("channel too long", header(LIMITS.max_name_bytes + 1, 0, 1), True, True,
         f"over {LIMITS.max_name_bytes} bytes"),
    Case("key too long", header(1, LIMITS.max_name_bytes + 1, 1), True, True,
         f"over {LIMITS.max_name_bytes} bytes"),
    Case("body over 16 MiB declared", header(1, 0, LIMITS.max_body_bytes + 1), True, True,
         f"over {LIMITS.max_body_bytes}"),
    Case("reserved channel with a key",
         control(bytes(encode_entry(SubscriptionEntry(0, "c"))), b"k"),
         True, True, "reserved channel with a key"),
    Case("reserved channel, body cut short", control(b"\x00\x00"), True, True, "cut short"),
    Case("reserved channel, body not an entry", control(b"hello, world"), True, True,
         "subscription op 104"),
    Case("reserved channel, bytes after the entry",
         control(bytes(encode_entry(SubscriptionEntry(0, "c"))) + b"!"), True, True,
         "bytes after a subscription entry"),
    Case("reserved channel, subscribing to it", control(entry(b"tolliver")), True, True,
         "reserved channel"),
    Case("reserved channel, empty body", control(b""), True, True, "cut short"),
    Case("channel not UTF-8", message(b"c\xff", b"", b"x", 1), True, True, "not UTF-8"),
    Case("key not UTF-8", message(b"c", b"\xed\xa0\x80", b"x", 1), True, True, "not UTF-8"),
    Case("ack for an unknown id", frame(Ack(123_456)), True, False),
    Case("unasked handshake response", frame(HandshakeResponse(1, HUB, 0)), True, False),
    Case("unasked handshake final", frame(HandshakeFinal(2)), True, False),
    Case("channel that is no stream name", message(b"two words", b"", b"x", 4), True, False,
         "refused"),
    Case("channel that is the hub's own stream",
         message(b"_tidewire.tolliver", b"", b"not json", 4), True, False, "refused"),
]  # fmt: skip


# ---------------------------------------------------------------------------- the raw client


class Raw:
    """A raw connection to the hub: bytes out, frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = Decoder()
        self.frames: list[Frame] = []

    @classmethod
    async def open(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection(HOST, port))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until(self, found: Any) -> Frame:
        """Read frames until one satisfies ``found`` (an EOF first fails the test)."""
        while True:
            for f in self.frames:
                if found(f):
                    self.frames.remove(f)
                    return f
            data = await self.reader.read(65536)
            assert data, f"the hub closed the connection; frames so far: {self.frames}"
            self.decoder.feed(data)
            while (new := self.decoder.next_frame()) is not None:
                self.frames.append(new)

    async def handshake(self, *subscriptions: SubscriptionEntry) -> HandshakeResponse:
        await self.send(frame(HandshakeRequest(1, uuid.uuid4(), subscriptions)))
        response = await self.until(lambda f: isinstance(f, HandshakeResponse))
        assert isinstance(response, HandshakeResponse)
        assert response.status == 0
        return response

    async def works(self, message_id: int = 5) -> None:
        """A reliable message is stored and acked: the connection carries on."""
        await self.send(frame(Message("carry-on", "", b"still here", message_id)))
        await self.until(lambda f: f == Ack(message_id))

    async def closed(self) -> None:
        """Until the hub closes the connection (what it sends before is read and dropped)."""
        try:
            while await self.reader.read(65536):
                pass
        except ConnectionResetError:
            pass

    def close(self) -> None:
        self.writer.close()


# ---------------------------------------------------------------------------- the test


async def take(instance: Instance) -> Delivery:
    async for delivery in instance.messages():
        return delivery
    raise AssertionError("messages() ended")


async def relay_works(a: Instance, b: Instance, body: bytes) -> None:
    await a.send("news", "", body)
    got = await take(b)
    assert (got.channel, got.body) == ("news", body)


async def connected_pair(tmp_path: Path, port: int) -> tuple[Instance, Instance]:
    """b subscribes to "news" through the hub; a sends there (once the hub wants "news")."""
    a, b = Instance(str(tmp_path / "a.db")), Instance(str(tmp_path / "b.db"))
    b.subscribe("news")
    await b.connect(HOST, port)
    hub = await a.connect(HOST, port)
    await until(lambda: (link := a.links.get(hub)) is not None
                and matches(link.conn.peer_subscriptions, "news", ""))  # fmt: skip
    return a, b


def hub_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tidewire.tolliver" and r.levelno >= logging.WARNING]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_closes_or_is_ignored_and_the_hub_carries_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: Case
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.tolliver")

    async def main() -> None:
        errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        hub = Hub.open(str(tmp_path / "hub"))
        server: TolliverServer = await start_tolliver_server(hub, HOST, 0)
        a, b = await connected_pair(tmp_path, server.port)
        raw = await Raw.open(server.port)
        try:
            await relay_works(a, b, b"before")
            if case.handshake:
                await raw.handshake()
            await raw.send(case.data)
            if case.closes:
                await raw.closed()
                await until(lambda: len(server.links) == 2)  # forgotten: only a and b are left
            else:
                if not case.handshake:
                    await raw.handshake()  # the ignored frame left the handshake to come
                await raw.works()
                assert Ack(4) not in raw.frames  # a refused message is not acked
            if case.warning:
                await until(lambda: any(case.warning in w for w in hub_warnings(caplog)))
            else:
                assert not hub_warnings(caplog)
            # The hub carries on: the instances relay through it, a new connection works.
            await relay_works(a, b, b"after")
            again = await Raw.open(server.port)
            try:
                await again.handshake(SubscriptionEntry(0, "news"))
                await again.works(6)
            finally:
                again.close()
            assert not errors, errors
        finally:
            raw.close()
            await a.close()
            await b.close()
            await server.close()
            await hub.close()

    run(main())
    if case.name == "channel that is the hub's own stream":
        run(reopened_hub_keeps_its_state(tmp_path))


async def reopened_hub_keeps_its_state(tmp_path: Path) -> None:
    """A message refused on ``_tidewire.tolliver`` did not corrupt the hub's state stream."""
    hub = Hub.open(str(tmp_path / "hub"))
    try:
        server = await start_tolliver_server(hub, HOST, 0)
        await server.close()
    finally:
        await hub.close()


def test_a_request_on_an_established_connection_is_answered_and_replaces_subscriptions(
    tmp_path: Path,
) -> None:
    """Not a breach (the seed): the hub answers again and follows the new subscriptions."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await start_tolliver_server(hub, HOST, 0)
        a, b = await connected_pair(tmp_path, server.port)
        raw = await Raw.open(server.port)
        try:
            await raw.handshake(SubscriptionEntry(0, "other"))
            await raw.handshake(SubscriptionEntry(0, "news"))  # again, on the same connection
            await raw.works()
            await a.send("news", "", b"to both")
            got = await raw.until(lambda f: isinstance(f, Message) and f.channel == "news")
            assert isinstance(got, Message)
            assert got.body == b"to both"
            assert (await take(b)).body == b"to both"
        finally:
            raw.close()
            await a.close()
            await b.close()
            await server.close()
            await hub.close()

    run(main())


def test_remotes_cannot_make_the_hub_unreachable_with_subscriptions(tmp_path: Path) -> None:
    """Each remote stays within its limits; together they ask for more channels than
    ``max_channels``: the hub lists at most that many (every remote must be able to take its
    handshake: a decoder takes 65536 entries), and a new instance still connects. (Small
    numbers, so that the test stays fast: the bound is what matters.)"""

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        settings = TolliverSettings(max_subscriptions=300, max_channels=256)
        server = await start_tolliver_server(hub, HOST, 0, settings)
        first, second = await Raw.open(server.port), await Raw.open(server.port)
        instance = Instance(str(tmp_path / "late.db"))
        try:
            await first.handshake(*(SubscriptionEntry(0, f"s.{i}") for i in range(300)))
            await second.handshake(SubscriptionEntry(0, "one.more"))
            await until(lambda: len(server.wanted) == 256)  # (deliveries made in slices)
            async with asyncio.timeout(5):
                assert await instance.connect(HOST, server.port) == server.instance
        finally:
            first.close()
            second.close()
            await instance.close()
            await server.close()
            await hub.close()

    run(main())


def test_a_channel_that_is_not_a_stream_name_is_refused_before_the_hub_follows_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A subscription to a channel no stream can be named (whitespace, over 255 bytes) is
    refused before the handshake response (Tolliver's refusal: a log line, then the close),
    and the hub's own list does not get it."""

    async def main() -> None:
        hub = Hub.open(str(tmp_path / "hub"))
        server = await start_tolliver_server(hub, HOST, 0)
        try:
            for name in ("s 1", "x" * 4000):
                raw = await Raw.open(server.port)
                await raw.send(frame(HandshakeRequest(1, uuid.uuid4(),
                                                      (SubscriptionEntry(0, name),))))  # fmt: skip
                async with asyncio.timeout(5):
                    assert await raw.reader.read() == b""  # no response: closed
                raw.close()
            assert server.wanted == set()
        finally:
            await server.close()
            await hub.close()

    with caplog.at_level(logging.WARNING, "tidewire.tolliver"):
        run(main())
    assert "refused: a subscription to a channel that is not a stream name" in caplog.text
