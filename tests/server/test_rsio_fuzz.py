"""Fuzz a LIVE ``tidewire serve`` process over RS.io: random and mutated frames on many short
TCP connections, several at a time, for a bounded time; then the process must still be alive,
serve a normal client correctly, and be back to its file descriptors, without a traceback and
without unbounded memory growth. A few bad inputs are checked against the exact answers
docs/protocols/rsio.md gives.

The fuzz is seeded: ``TIDEWIRE_FUZZ_SEED=<n>`` replays a run's inputs (the seed is in every
failure message; how concurrent connections interleave at the server still varies). Each input
comes from its own seed, shown with it, so ``make_case(random.Random(s), s)`` rebuilds input
``s``. ``TIDEWIRE_FUZZ_SECONDS`` (default 8) lengthens the run for a deeper local search.

The sans-IO machines themselves (RS.io's and the four other protocols') are fuzzed one by one
in tests/fuzz/, from a corpus kept in the repository (docs/fuzzing.md); this file checks the
running hub as a whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import socket
import struct
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

import tidewire
from tidewire.log import Log
from tidewire.model import Batch, RemoteProtocolError
from tidewire.protocols.rsio import (
    Cancel,
    ClientHello,
    Decoder,
    Goodbye,
    Limits,
    Message,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
    encode,
)
from tidewire.protocols.rsio.envelopes import decode_envelope

HOST = "127.0.0.1"
FUZZ_SECONDS = float(os.environ.get("TIDEWIRE_FUZZ_SECONDS", "8"))  # the fuzz loop's budget
MAX_CASES = int(2500 * FUZZ_SECONDS)  # and a count bound, whichever comes first
CONCURRENCY = 12  # connections in flight at once
CASE_DEADLINE = 5.0  # one connection, start to finish (a longer one is a hang)
MAX_READ = 8 * 1024 * 1024  # bytes read back per connection, at most
RSS_GROWTH_LIMIT = 64 * 1024 * 1024
FD_MARGIN = 2
SPEC_STRING_LIMIT = Limits().max_string_bytes  # 64 KiB: docs/protocols/rsio.md

HELLO = bytes(encode(ClientHello()))
ACK = bytes.fromhex("02 14 67 6f 6f 64 62 79 65 20 61 63 6b 6e 6f 77 6c 65 64 67 65 64")
READY = re.compile(r"^ready", re.MULTILINE)  # the line after the endpoints
BREACH_LOG = re.compile(r"closing: (?!transport closed)")  # server/rsio.py logs each breach
ALARMS = ("Traceback", " ERROR ", " CRITICAL ", "never retrieved", "Fatal error", "Exception in")

# --------------------------------------------------------------------------- the data

ORDERS: list[tuple[int, bytes | None, bytes, int]] = [  # (id, key, value, timestamp)
    (1, b"k", b"hello", 1000),
    (2, None, b"\x00\xff", 2000),
    (3, b"k", b"third", 3000),
]
TICKS = 2000  # events of 4-byte values, for fixed-size (size=4) subscriptions


def tick(i: int) -> bytes:
    return i.to_bytes(4, "big")


def fill(data_dir: Path) -> None:
    async def go() -> None:
        log = Log.open(str(data_dir))
        await log.append(
            Batch.build("orders", [v for _, _, v, _ in ORDERS], keys=[k for _, k, _, _ in ORDERS],
                        timestamps=[t for _, _, _, t in ORDERS]),
            assign_ids=True,
        )  # fmt: skip
        await log.append(Batch.build("ticks", [tick(i) for i in range(TICKS)], timestamps=5),
                         assign_ids=True)  # fmt: skip
        await log.close()

    asyncio.run(go())


# --------------------------------------------------------------------------- the server


@dataclass
class LiveServer:
    proc: subprocess.Popen[bytes]
    port: int
    url: str
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stderr_tail(self, lines: int = 30) -> str:
        return "\n".join(self.stderr().splitlines()[-lines:])

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss(self) -> int:
        status = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None, status
        return int(match.group(1)) * 1024


def poll(
    predicate: Callable[[], bool],
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    interval: float = 0.01,
) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds, checked every
    ``interval`` (giving up early if ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline or (proc is not None and proc.poll() is not None):
            return False
        time.sleep(interval)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    data = tmp_path / "data"
    data.mkdir()
    fill(data)
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWIRE_")}
    env.update(TIDEWIRE_RSIO_PORT="0", TIDEWIRE_HTTP_PORT="0", TIDEWIRE_SEGURO_PORT="0",
               TIDEWIRE_TOLLIVER_PORT="0")
    # Files, not pipes: the server logs a line per breach, and a full pipe would stall it.
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", str(data),
             "--host", HOST],
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
        )  # fmt: skip
    try:
        ready = poll(lambda: READY.search(out_path.read_text()) is not None, 30, proc)
        text = out_path.read_text()
        match = re.search(r"rsio://127\.0\.0\.1:(\d+)", text)
        failed = f"the server did not become ready:\n{text}\n{err_path.read_text()}"
        assert ready, failed
        assert match is not None, failed
        assert proc.poll() is None, failed
        port = int(match.group(1))
        yield LiveServer(proc, port, f"rsio://{HOST}:{port}", err_path)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


# --------------------------------------------------------------------------- a raw peer


class ServerOutput:
    """Decodes what the server sends, as a client would; fixed-size elements follow each
    ``subscribed``'s size. ``ours``: the extensions our clientHello listed. Once the
    serverHello shows that an extension is in use, the rest is only collected, not decoded
    (extension messages are outside what this test checks)."""

    def __init__(
        self, max_string_bytes: int = SPEC_STRING_LIMIT, ours: frozenset[int] = frozenset()
    ) -> None:
        self.sizes: dict[int, int] = {}
        self.decoder = Decoder(Limits(max_string_bytes=max_string_bytes), self._size)
        self.messages: list[object] = []
        self.raw = bytearray()
        self.ours = ours
        self.extended = False  # an extension is in use: not decoded past the hello

    def _size(self, subscriber: int) -> int:
        return self.sizes.get(subscriber, 0)

    def feed(self, data: bytes) -> None:
        """Decode ``data``; raises ``RemoteProtocolError`` if the server sent a bad frame."""
        self.raw += data
        if self.extended:
            return
        self.decoder.feed(data)
        while (message := self.decoder.next_message()) is not None:
            if isinstance(message, Subscribed):
                self.sizes[message.subscriber] = message.element_size
            self.messages.append(message)
            if isinstance(message, ServerHello) and self.ours & set(message.extensions):
                self.extended = True
                return

    @property
    def leftover(self) -> int:
        return 0 if self.extended else self.decoder.buffered

    @property
    def hello_bytes(self) -> int:
        """The length of the serverHello frame (it may list extensions)."""
        hello = self.messages[0] if self.messages else None
        return len(encode(hello)) if isinstance(hello, ServerHello) else 0


def hello_extensions(data: bytes) -> frozenset[int]:
    """The extensions of the clientHello ``data`` starts with, as the server decodes it."""
    decoder = Decoder()
    decoder.feed(data)
    try:
        first = decoder.next_message()
    except RemoteProtocolError:
        return frozenset()
    return frozenset(first.extensions) if isinstance(first, ClientHello) else frozenset()


def is_server_hello(message: object) -> bool:
    return isinstance(message, ServerHello) and message.version == 0


class Peer:
    """One raw RS.io connection to the live server."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, output: ServerOutput
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.output = output
        self.eof = False
        self.taken = 0  # messages already returned by messages() or until_eof()

    @classmethod
    async def open(cls, port: int, max_string_bytes: int = SPEC_STRING_LIMIT) -> Peer:
        reader, writer = await asyncio.open_connection(HOST, port)
        return cls(reader, writer, ServerOutput(max_string_bytes))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_some(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            self.eof = True
        else:
            self.output.feed(data)

    async def messages(self, n: int, within: float = 10.0) -> list[object]:
        """The next ``n`` messages not yet taken (fewer if the server closes first)."""
        async with asyncio.timeout(within):
            while len(self.output.messages) - self.taken < n and not self.eof:
                await self.read_some()
        got = self.output.messages[self.taken : self.taken + n]
        self.taken += len(got)
        return got

    async def until_eof(self, within: float = 10.0) -> list[object]:
        """Every message not yet taken, up to the server closing the connection."""
        async with asyncio.timeout(within):
            while not self.eof:
                await self.read_some()
        got = self.output.messages[self.taken :]
        self.taken += len(got)
        return got

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


# --------------------------------------------------------------------------- the inputs

PUBLISHERS: tuple[str, ...] = (
    "orders", "ticks", "nostream", "orders?from=1&size=5", "ticks?size=4",
    "ticks?size=4&from=1990", "ticks?format=value&until=50", "orders?from=latest",
    "nostream?from=latest", "orders?from=2&until=3", "orders?from=3&until=1", "orders?until=0",
    "orders?key=k", "orders?key=%ZZ", "orders?key=" + "%00" * 100, "orders?format=value",
    "orders?format=bogus", "orders?size=0", "ticks?size=18446744073709551616",
    "ticks?size=65536", "orders?size=4&format=envelope",
    "orders?from=9223372036854775807", "orders?from=9223372036854775808", "orders?from=²",
    "orders?from=" + "9" * 5000, "orders?from=1&from=2", "orders?nope=1", "orders?from",
    "orders?", "orders&from=1", "", "?", "&", "%", "%ff", "%ED%A0%80", "orders%3Ffrom%3D1",
    "ørders", "a b", "tab\there", "x" * 300, "orders\x00", "..", "../orders", "/etc/passwd",
    "\U0001f4a5", "orders?from=1&until=2&key=k&format=value",
)  # fmt: skip

BIG_LONG = 2**63 - 1
DEMANDS = (0, 1, 2, 3, 7, 100, 4096, 2**62, BIG_LONG)
OVERLONG = (
    b"\xff" * 11,  # 11 bytes: over the 10-byte limit
    b"\x80" * 10 + b"\x00",  # 11 bytes of padding
    b"\xff" * 9 + b"\x02",  # 2**64: over 64 bits
    b"\xff" * 9 + b"\x7f",
)
HUGE_LENGTHS = (2**16 + 1, 2**24 + 1, 2**32, 2**63, 2**64 - 1)
BAD_UTF8 = (b"\xff", b"\xfe\xff", b"orders\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80")


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def subscriber_id(rng: random.Random) -> int:
    return rng.choice((1, 1, 2, 2, 3, 4, 5, 6, 127, 128, 2**32, 2**64 - 1))


def valid_frame(rng: random.Random) -> bytes:
    """One well-formed frame, of any type the codec can encode (mostly the client's)."""
    sid = subscriber_id(rng)
    roll = rng.random()
    message: Message
    if roll < 0.30:
        message = Subscribe(rng.choice(PUBLISHERS), sid, rng.choice(DEMANDS))
    elif roll < 0.50:
        message = Request(sid, rng.choice(DEMANDS))
    elif roll < 0.60:
        message = Cancel(sid)
    elif roll < 0.65:
        message = ClientHello(rng.choice((0, 0, 1, 5)), tuple(rng.sample(range(1, 400), 2)))
    elif roll < 0.70:
        message = Goodbye(rng.choice(("bye", "", "é" * 40)))
    elif roll < 0.76:
        message = OnNext(sid, rng.randbytes(rng.randrange(8)))
    elif roll < 0.82:
        message = OnComplete(sid)
    elif roll < 0.88:
        message = OnError(sid, "boom é")
    elif roll < 0.92:
        message = Subscribed(sid, rng.choice((0, 4)))
    elif roll < 0.95:
        message = ServerHello()
    else:
        return bytes(encode(OnNextPacked(sid, 1, b"abcd"), element_size=4))
    return bytes(encode(message))


def conversation(rng: random.Random, hello: bool) -> bytes:
    """A mostly sensible session: subscriptions to real streams, demand, cancels."""
    out = bytearray(HELLO if hello else b"")
    for _ in range(rng.randrange(1, 10)):
        if rng.random() < 0.45:
            publisher = rng.choice(("orders", "ticks", "ticks?size=4", "orders?format=value",
                                    rng.choice(PUBLISHERS)))  # fmt: skip
            encode(Subscribe(publisher, subscriber_id(rng), rng.choice(DEMANDS)), out=out)
        else:
            out += valid_frame(rng)
    return bytes(out)


def nasty(rng: random.Random) -> bytes:
    """One hand-made bad frame (or field) of the kinds the spec lists as breaches."""
    sid = varint(subscriber_id(rng))
    kind = rng.randrange(12)
    if kind == 0:  # unknown message types: 11..63, then the extension range 64 and up
        code = rng.choice((rng.randrange(11, 64), rng.randrange(64, 128),
                           rng.randrange(128, 2**20), 2**63, 2**64 - 1))  # fmt: skip
        return varint(code) + b"\x00"
    if kind == 1:  # an over-long varint as the type, an id, a demand or a length
        bad = rng.choice(OVERLONG)
        return rng.choice((bad, b"\x04" + bad, b"\x04" + sid + bad, b"\x03" + bad, b"\x05" + bad))
    if kind == 2:  # huge declared String / element / list lengths, bodies never sent
        length = varint(rng.choice(HUGE_LENGTHS))
        return rng.choice((b"\x03" + length + b"orders", b"\x07" + sid + length + b"xx",
                           b"\x02" + length, b"\x0a" + sid + length, b"\x00\x00" + length,
                           b"\x07" + sid + varint(16 * 1024 * 1024 - 1) + b"x" * 64))  # fmt: skip
    if kind == 3:  # invalid UTF-8: a subscription-level error in subscribe, else a breach
        raw = rng.choice(BAD_UTF8)
        return rng.choice((
            b"\x03" + varint(len(raw)) + raw + sid + b"\x05",
            b"\x02" + varint(len(raw)) + raw,
            b"\x0a" + sid + varint(len(raw)) + raw,
        ))  # fmt: skip
    if kind == 4:  # a Long above 2**63-1
        return b"\x04" + sid + varint(rng.choice((2**63, 2**64 - 1)))
    if kind == 5:  # onNextPacked with a count of 0 or for a variable-size subscription
        return b"\x08" + sid + varint(rng.choice((0, 1, 5))) + b"abcd"
    if kind == 6:  # too many extensions in a hello
        return b"\x00\x00" + varint(rng.choice((257, 1000))) + b"\x01" * 300
    if kind == 7:  # a subscribe reusing an id, back to back
        frame = bytes(encode(Subscribe("ticks", 1)))
        return frame + frame
    if kind == 8:  # request(0) right behind its subscribe, then more for the same id
        return bytes(encode(Subscribe("ticks", 3, 1)) + encode(Request(3, 0))
                     + encode(Request(3, 5)) + encode(Cancel(3)))  # fmt: skip
    if kind == 9:  # a long publisher name (weird characters are escaped in error messages)
        name = rng.choice(("orders?", "\\", "\x01", "é")) * rng.choice((200, 5000, 16000))
        return bytes(encode(Subscribe(name, 9, 1)))
    if kind == 10:  # a huge stream of tiny frames: request/cancel for ids never seen
        return (b"\x04\x63\x01\x05\x62") * rng.randrange(100, 3000)
    return rng.randbytes(rng.randrange(1, 32))


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One mutation: bit flips, a truncation, a duplicated or deleted slice, a splice, random
    bytes, a bad frame or field inserted anywhere."""
    buf = bytearray(data)
    kind = rng.randrange(8)
    if not buf or kind == 0:  # insert random bytes
        pos = rng.randrange(len(buf) + 1)
        buf[pos:pos] = rng.randbytes(rng.randrange(1, 16))
    elif kind == 1:  # flip bits
        for _ in range(rng.randrange(1, 9)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == 2:  # truncate
        del buf[rng.randrange(len(buf)) :]
    elif kind == 3:  # duplicate a slice
        a = rng.randrange(len(buf))
        b = rng.randrange(a, len(buf)) + 1
        buf[b:b] = buf[a:b] * rng.randrange(1, 4)
    elif kind == 4:  # delete a slice
        a = rng.randrange(len(buf))
        del buf[a : a + rng.randrange(1, 8)]
    elif kind == 5:  # splice a valid frame in anywhere (maybe mid-frame)
        pos = rng.randrange(len(buf) + 1)
        buf[pos:pos] = valid_frame(rng)
    elif kind == 6:  # a bad frame or field anywhere
        pos = rng.randrange(len(buf) + 1)
        buf[pos:pos] = nasty(rng)
    else:  # overwrite a byte with an interesting value
        buf[rng.randrange(len(buf))] = rng.choice((0x00, 0x01, 0x0B, 0x3F, 0x40, 0x7F, 0x80, 0xFF))
    return bytes(buf)


Ending = Literal["close", "eof", "reset"]


@dataclass(frozen=True)
class Case:
    seed: int
    kind: str
    data: bytes
    chunks: tuple[int, ...]  # write sizes, summing to len(data)
    ending: Ending  # close after reading a little; half-close and read to EOF; RST
    idle: float  # how long to wait for more output before closing ("close")

    def describe(self) -> str:
        shown = self.data[:96].hex(" ") + (" ..." if len(self.data) > 96 else "")
        return (f"case seed {self.seed} ({self.kind}, {len(self.data)} bytes, {self.ending}, "
                f"{len(self.chunks)} write(s)): {shown}")  # fmt: skip


def subscribe_flood(rng: random.Random) -> bytes:
    """More subscriptions on one connection than the hub serves (1024)."""
    out = bytearray(HELLO)
    for sid in range(1, rng.randrange(1026, 1100)):
        publisher = rng.choice(("ticks", "ticks?size=4", "nostream", "orders?from=latest",
                                rng.choice(PUBLISHERS)))  # fmt: skip
        encode(Subscribe(publisher, sid, rng.choice((0, 0, 0, 1))), out=out)
    for _ in range(rng.randrange(4)):
        encode(Request(rng.randrange(1, 1100), rng.choice(DEMANDS[1:])), out=out)
    return bytes(out)


def make_case(rng: random.Random, seed: int) -> Case:
    """One input and how to send it, all drawn from ``rng`` (made from ``seed``)."""
    hello = rng.random() < 0.8
    roll = rng.random()
    if roll < 0.25:
        kind, data = "valid", conversation(rng, hello)
    elif roll < 0.60:
        kind, data = "mutated", conversation(rng, hello)
        for _ in range(rng.randrange(1, 4)):
            data = mutate(rng, data)
    elif roll < 0.70:
        kind = "random"
        data = (HELLO if hello else b"") + rng.randbytes(rng.choice((1, 8, 64, 512, 4096)))
    elif roll < 0.85:
        kind = "nasty"
        data = (HELLO if hello else b"") + b"".join(
            rng.choice((nasty, valid_frame))(rng) for _ in range(rng.randrange(1, 4))
        )
    elif roll < 0.97:
        kind = "splice"
        a, b = conversation(rng, hello), conversation(rng, rng.random() < 0.5)
        data = a[: rng.randrange(len(a) + 1)] + b[rng.randrange(len(b) + 1) :]
    else:
        kind, data = "flood", subscribe_flood(rng)
    if data and rng.random() < 0.35:  # random-sized chunks (sometimes a byte at a time)
        top = 1 if len(data) < 200 and rng.random() < 0.3 else rng.choice((2, 7, 64, 1500))
        chunks: list[int] = []
        left = len(data)
        while left:
            chunks.append(min(left, rng.randint(1, top)))
            left -= chunks[-1]
    else:
        chunks = [len(data)]
    ending: Ending = rng.choice(("close", "close", "eof", "eof", "reset"))
    return Case(seed, kind, data, tuple(chunks), ending, rng.choice((0.01, 0.05, 0.2)))


def cases(seed: int) -> Iterator[Case]:
    """The run's inputs, in order: each from its own seed, drawn from ``random.Random(seed)``."""
    master = random.Random(seed)
    while True:
        case_seed = master.getrandbits(64)
        yield make_case(random.Random(case_seed), case_seed)


# --------------------------------------------------------------------------- one connection


@dataclass
class Outcome:
    messages: list[object] = field(default_factory=list)
    eof: bool = False
    problems: list[str] = field(default_factory=list)


async def run_case(port: int, case: Case, max_string_bytes: int) -> Outcome:
    """Send ``case`` on a fresh connection, read what comes back (bounded), end as it says, and
    check that what the server sent is well-formed RS.io."""
    outcome = Outcome()
    output = ServerOutput(max_string_bytes, hello_extensions(case.data))
    try:
        async with asyncio.timeout(CASE_DEADLINE):
            reader, writer = await asyncio.open_connection(HOST, port)
            try:
                await _exchange(reader, writer, case, output, outcome)
            finally:
                if case.ending == "reset":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                else:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
    except TimeoutError:
        what = "close after our EOF" if case.ending == "eof" else "finish"
        outcome.problems.append(f"the connection did not {what} within {CASE_DEADLINE}s")
    except RemoteProtocolError as exc:
        outcome.problems.append(f"the server sent a malformed frame: {exc}")
    except OSError as exc:
        if isinstance(exc, ConnectionRefusedError):
            outcome.problems.append(f"connection refused: {exc}")
        # else: reset by the server after a breach while we wrote; what it sent is checked
    outcome.messages = output.messages
    outcome.problems += check_output(output, outcome.eof)
    return outcome


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    case: Case,
    output: ServerOutput,
    outcome: Outcome,
) -> None:
    pos = 0
    try:
        for size in case.chunks:
            writer.write(case.data[pos : pos + size])
            pos += size
            await writer.drain()
        if case.ending == "eof":
            writer.write_eof()
    except (OSError, RuntimeError):
        pass  # the server may close after a breach while we still write
    if case.ending == "reset" and case.idle < 0.05:
        return  # reset at once, maybe while the server still works on the input
    while len(output.raw) < MAX_READ:
        try:
            if case.ending == "eof":  # the server must close after our EOF
                data = await reader.read(65536)
            else:
                async with asyncio.timeout(case.idle):
                    data = await reader.read(65536)
        except TimeoutError:
            return
        if not data:
            outcome.eof = True
            return
        output.feed(data)


def check_output(output: ServerOutput, eof: bool) -> list[str]:
    """What a server may send: a version-0 serverHello first, then only what a publisher sends
    (no extension is in use), nothing after a goodbye, and that goodbye is a breach's or the
    acknowledgement of ours."""
    problems: list[str] = []
    messages = output.messages
    if bytes(output.raw[:1]) not in (b"", b"\x01"):
        problems.append(f"first bytes are not serverHello: {bytes(output.raw[:16]).hex(' ')}")
    if messages and not is_server_hello(messages[0]):
        problems.append(f"the first message is not a version-0 serverHello: {messages[0]!r}")
    for i, message in enumerate(messages[1:], 1):
        if not isinstance(message, PUBLISHER_MESSAGES):
            problems.append(f"message {i} is not one a publisher sends: {message!r}")
        if isinstance(message, Goodbye):
            if i != len(messages) - 1 or output.leftover:
                problems.append(f"bytes after the server's goodbye: {messages[i + 1 :]!r}")
            if not message.reason.startswith("protocol error: ") and message.reason != (
                "goodbye acknowledged"
            ):
                problems.append(f"unexpected goodbye reason {message.reason!r}")
    if eof and output.leftover:
        problems.append(f"{output.leftover} bytes of a frame cut short before EOF")
    return problems


PUBLISHER_MESSAGES = (Subscribed, OnNext, OnNextPacked, OnComplete, OnError, Goodbye)


# --------------------------------------------------------------------------- the fuzz loop


@dataclass
class Report:
    seed: int
    cases: int = 0
    bytes_sent: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    received: Counter[str] = field(default_factory=Counter)
    breaches: int = 0
    problems: list[str] = field(default_factory=list)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=2 * CONCURRENCY))

    def summary(self) -> str:
        return (f"seed {self.seed} (rerun with TIDEWIRE_FUZZ_SEED={self.seed}): {self.cases} "
                f"connections, {self.bytes_sent} bytes, inputs {dict(self.kinds)}, "
                f"server messages {dict(self.received)}, {self.breaches} goodbye(s) for "
                "breaches")  # fmt: skip


async def fuzz(
    live: LiveServer, seed: int, seconds: float, max_cases: int, max_string_bytes: int
) -> Report:
    report = Report(seed)
    source = cases(seed)
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < deadline and report.cases < max_cases and live.alive():
            case = next(source)
            report.cases += 1
            report.bytes_sent += len(case.data)
            report.kinds[case.kind] += 1
            report.recent.append(case.describe())
            outcome = await run_case(live.port, case, max_string_bytes)
            for message in outcome.messages:
                report.received[type(message).__name__] += 1
                if isinstance(message, Goodbye) and message.reason.startswith("protocol error"):
                    report.breaches += 1
            report.problems += [f"{p}\n    {case.describe()}" for p in outcome.problems]

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return report


def fuzz_seed() -> int:
    text = os.environ.get("TIDEWIRE_FUZZ_SEED")
    return int(text) if text else random.SystemRandom().randrange(2**32)


async def read_back(url: str) -> tuple[list[tuple[int, bytes | None, bytes, int]], list[bytes]]:
    """The pre-filled events, read by the ordinary client."""
    async with asyncio.timeout(30), await tidewire.connect(url) as client:
        stream = client.subscribe("orders", until_id=len(ORDERS))
        orders = [(e.id, e.key, e.value, e.timestamp) async for b in stream for e in b]
        ticks = [e.value async for b in client.subscribe("ticks", until_id=TICKS) for e in b]
    return orders, ticks


def assert_serves_normally(live: LiveServer, context: str) -> None:
    orders, ticks = asyncio.run(read_back(live.url))
    assert orders == ORDERS, context
    assert ticks == [tick(i) for i in range(TICKS)], context


def test_fuzzed_frames_never_crash_or_leak(live: LiveServer) -> None:
    seed = fuzz_seed()
    fds_before = live.fds()  # no connection yet: listeners, log files, the loop's own
    assert_serves_normally(live, f"seed {seed}: before the fuzz")  # also warms the server up
    rss_before = live.rss()
    # Every frame the server sends is decoded with the spec's 64 KiB String limit.
    report = asyncio.run(fuzz(live, seed, FUZZ_SECONDS, MAX_CASES, max_string_bytes=64 * 1024))
    recent = "\n  ".join(report.recent)
    context = (f"{report.summary()}\nlast inputs:\n  {recent}\nserver stderr (tail):\n"
               f"{live.stderr_tail()}")  # fmt: skip

    assert live.alive(), f"the server died (exit code {live.proc.returncode})\n{context}"
    assert not report.problems, "\n".join(report.problems[:10]) + f"\n{context}"
    assert report.cases >= 200, context  # the loop really ran
    assert report.breaches > 0, context
    assert report.received["Subscribed"] > 0, context
    assert report.received["OnNext"] + report.received["OnNextPacked"] > 0, context
    assert_serves_normally(live, context)
    assert poll(lambda: live.fds() <= fds_before + FD_MARGIN, 15), (
        f"file descriptors: {live.fds()} after the fuzz, {fds_before} before\n{context}"
    )
    growth = live.rss() - rss_before
    assert growth <= RSS_GROWTH_LIMIT, f"RSS grew by {growth >> 20} MiB\n{context}"
    stderr = live.stderr()
    alarms = [line for line in stderr.splitlines() if any(a in line for a in ALARMS)]
    assert not alarms, "\n".join(alarms[:20]) + f"\n{context}"
    logged = len(BREACH_LOG.findall(stderr))  # each breach goodbye we saw was logged first
    assert logged >= max(1, report.breaches), f"{logged} breach(es) logged\n{context}"
    assert live.alive(), context
    print(f"{report.summary()}; RSS +{growth >> 10} KiB; fds {fds_before} -> {live.fds()}")


# --------------------------------------------------------------------------- the spec's answers


def breach(messages: list[object], what: str) -> str:
    """The reason of the goodbye that ends ``messages`` (asserting it is a breach's)."""
    assert messages, "nothing received"
    last = messages[-1]
    assert isinstance(last, Goodbye), messages
    assert last.reason.startswith("protocol error: "), last
    assert what in last.reason, last
    return last.reason


def test_bad_input_gets_the_documented_answers(live: LiveServer) -> None:
    async def hello_then(data: bytes) -> Peer:
        peer = await Peer.open(live.port)
        await peer.send(HELLO + data)
        (hello,) = await peer.messages(1)
        assert is_server_hello(hello), hello
        return peer

    async def expect_breach(data: bytes, what: str, *, hello: bool = True) -> None:
        if hello:
            peer = await hello_then(data)
        else:
            peer = await Peer.open(live.port)
            await peer.send(data)
            (first,) = await peer.messages(1)
            assert is_server_hello(first), first
        rest = await peer.until_eof()  # goodbye, then the server closes
        reason = breach(rest, what)
        assert peer.output.raw.endswith(bytes(encode(Goodbye(reason))))
        await peer.close()

    async def main() -> None:
        # unknown message types, below and in the extension range: goodbye (0x02), then EOF
        for code in (11, 63, 64, 127, 128, 300):
            peer = await hello_then(varint(code) + b"\x00")
            rest = await peer.until_eof()
            assert rest == [Goodbye(f"protocol error: unknown message type {code}")]
            assert peer.output.raw[peer.output.hello_bytes] == 0x02
            await peer.close()
        # the hello's version: the exact bytes of docs/protocols/rsio.md
        peer = await Peer.open(live.port)
        await peer.send(b"\x00\x05\x00")
        await peer.until_eof()
        reason = b"protocol error: unsupported protocol version 5 (this side speaks 0)"
        assert bytes(peer.output.raw[peer.output.hello_bytes :]) == b"\x02\x43" + reason
        await peer.close()
        await expect_breach(b"\x04\x01" + b"\xff" * 11, "varint longer than 10 bytes")
        await expect_breach(b"\x04\x01" + b"\xff" * 9 + b"\x02", "varint exceeds 64 bits")
        await expect_breach(b"\x04\x01" + varint(2**63), "exceeds 2**63-1")
        # a String over 64 KiB is refused as soon as its length is read: no body is sent
        await expect_breach(b"\x03" + varint(64 * 1024 + 1), "exceeds the limit")
        # an element frame for an id the hub never subscribed with is a breach at its header,
        # whatever it declares: before its length, let alone its body, is read
        await expect_breach(b"\x07\x07" + varint(16 * 1024 * 1024 + 1), "7, which is not")
        await expect_breach(b"\x07\x07", "elements for subscriber 7, which is not subscribed")
        await expect_breach(b"\x09\x07", "OnComplete for subscriber 7")
        await expect_breach(b"\x02\x01\xff", "not valid UTF-8")
        await expect_breach(b"\x08\x01", "elements for subscriber 1, which is not subscribed")
        await expect_breach(bytes(encode(Subscribe("nostream", 1))) * 2, "reuses open")
        await expect_breach(HELLO, "a second hello")
        await expect_breach(bytes(encode(Subscribe("orders", 1))), "expected ClientHello first",
                            hello=False)  # fmt: skip
        # goodbye is acknowledged with the documented bytes, then the server closes
        peer = await hello_then(bytes(encode(Goodbye("bye"))))
        assert await peer.until_eof() == [Goodbye("goodbye acknowledged")]
        assert peer.output.raw.endswith(ACK)
        await peer.close()

        # subscription-level errors: onError (0x0a) for that id, and the connection carries on
        peer = await hello_then(
            bytes(encode(Subscribe("orders", 1)) + encode(Request(1, 0))
                  + encode(Request(99, 5)) + encode(Cancel(98)))  # ignored: ids never opened
            + b"\x03\x02\xc3\x28\x02\x00"  # subscribe(publisher=b"\xc3\x28", 2, 0)
            + bytes(encode(Subscribe("orders?nope=1", 3)) + encode(Subscribe("orders", 4, 10)))
        )  # fmt: skip
        got = await peer.messages(8)
        assert got[0] == Subscribed(1, 0)
        assert isinstance(got[1], OnError)
        assert got[1].subscriber == 1
        assert "request(0)" in got[1].error
        assert isinstance(got[2], OnError)
        assert got[2].subscriber == 2
        assert "UTF-8" in got[2].error
        assert got[3] == OnError(3, "unknown parameter 'nope' in 'orders?nope=1'")
        assert got[4] == Subscribed(4, 0)
        assert [decode_envelope(m.element) for m in got[5:8] if isinstance(m, OnNext)] == [
            (i, t, k, v) for i, k, v, t in ORDERS
        ]
        assert b"\x0a\x01" in peer.output.raw  # the raw onError frame for id 1
        await peer.send(bytes(encode(Subscribe("ticks?size=4&until=3", 1, 5))))  # id 1 reused
        got = await peer.messages(3)
        assert got[0] == Subscribed(1, 4)
        assert got[1] == OnNextPacked(1, 3, tick(0) + tick(1) + tick(2))
        assert got[2] == OnComplete(1)
        # fixed-size mode: a value of another size ends the subscription with onError
        await peer.send(bytes(encode(Subscribe("orders?size=5", 5, 10))))
        got = await peer.messages(2)
        assert got == [
            Subscribed(5, 5),
            OnError(5, "stream 'orders' holds a value that is not 5 bytes"),
        ]
        await peer.send(bytes(encode(Goodbye("done"))))
        assert await peer.until_eof() == [Goodbye("goodbye acknowledged")]
        await peer.close()

        # more than 1024 subscriptions on one connection
        flood = bytearray()
        for sid in range(1, 1027):
            encode(Subscribe("nostream", sid), out=flood)
        peer = await hello_then(bytes(flood))
        got = await peer.messages(1026)
        assert got[:1024] == [Subscribed(sid, 0) for sid in range(1, 1025)]
        limit = "too many subscriptions on this connection (the limit is 1024)"
        assert got[1024:] == [OnError(1025, limit), OnError(1026, limit)]
        await peer.send(bytes(encode(Cancel(1)) + encode(Subscribe("orders?until=1", 1027, 1))))
        got = await peer.messages(3)
        assert got[0] == Subscribed(1027, 0)
        assert isinstance(got[1], OnNext)
        assert got[2] == OnComplete(1027)
        await peer.close()

    asyncio.run(main())
    assert live.alive()
    assert BREACH_LOG.search(live.stderr())
    assert_serves_normally(live, live.stderr_tail())


# ------------------------------------------------------------ regressions the fuzzer found


def test_a_fixed_size_no_value_has_ends_with_onerror(live: LiveServer) -> None:
    async def main() -> None:
        for size in (2**32, 99_999_999_999):
            peer = await Peer.open(live.port)
            await peer.send(HELLO + bytes(encode(Subscribe(f"ticks?size={size}", 1, 1))))
            try:
                got = await peer.messages(3, within=2)
            finally:
                await peer.close()
            error = f"stream 'ticks' holds a value that is not {size} bytes"
            assert got[1:] == [Subscribed(1, size), OnError(1, error)], live.stderr_tail()

    asyncio.run(main())
    assert "Traceback" not in live.stderr()


def test_onerror_reasons_fit_the_string_limit(live: LiveServer) -> None:
    async def main() -> None:
        for name in ("s?" + "a" * 33_000 + "=1", "\x01" * 17_000, "\\" * 33_000):
            peer = await Peer.open(live.port)  # decodes with the spec's 64 KiB limit
            await peer.send(HELLO + bytes(encode(Subscribe(name, 1))))
            try:
                got = await peer.messages(2)
            finally:
                await peer.close()
            assert isinstance(got[1], OnError)

    asyncio.run(main())


def test_a_peer_that_never_reads_cannot_grow_server_memory(live: LiveServer) -> None:
    frame = bytes(encode(Subscribe("s?" + "a" * 30_000 + "=1", 1)))  # ~66 KB onError each

    async def main() -> int:
        _, writer = await asyncio.open_connection(HOST, live.port)
        before = live.rss()
        growth = 0
        try:
            writer.write(HELLO)
            sent = 0
            while sent < 96 * 1024 * 1024:
                writer.write(frame)
                sent += len(frame)
                try:  # a server that stops reading makes this wait: that is the fix
                    async with asyncio.timeout(2):
                        await writer.drain()
                except TimeoutError:
                    break
                except ConnectionError:  # (or it ends the connection: limits.max_refusals)
                    break
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and growth <= RSS_GROWTH_LIMIT:
                growth = max(growth, live.rss() - before)
                await asyncio.sleep(0.05)  # polling the RSS, bounded by the deadline
        finally:
            writer.transport.abort()
        return growth

    growth = asyncio.run(main())
    assert live.alive()
    assert growth <= RSS_GROWTH_LIMIT, f"RSS grew by {growth >> 20} MiB while we did not read"
