"""Fuzzing Tube (docs/protocols/tube.md): the connection in both roles, deflate included, and
its keepalive timers.

A Tube input is a sequence of WebSocket messages: a corpus entry (``corpus/tube``) is each
message as a u32 big-endian length then its payload, so the mutations of mutate.py move
message boundaries too (a length mutated); the messages may also be cut again at random points,
or one byte per message. The receiving :class:`Connection` (fragment size 64, messages of at
most 1 KiB) echoes part of what it receives, and its timers are driven with arbitrary ``now``
values between messages. Properties:

* ``receive_data``, ``handle_timer`` and ``next_event`` never raise; a breach is one
  :class:`Closed` event with a WebSocket close code (1002, or 1009 for too big, 1001 for a
  silent peer), the last; after it nothing is received, queued or timed;
* a message being reassembled never holds more than the limit (nor more parts than its
  count), and no message received (inflated included) is over the limit;
* after ``handle_timer(now)``, a connection still open has its next deadline after ``now``;
* everything a connection sends is received by a peer of the other role exactly as sent, with
  no breach; two connections with any fragment sizes and compression, both readings of the
  header, deliver every message.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import chunked, corpus, fuzz, inputs, replays, u8, u32be, zigzag

from tidewire.model import LocalProtocolError
from tidewire.protocols.tube import (
    Closed,
    CompressionRefused,
    Connection,
    Established,
    Event,
    Limits,
    MessageReceived,
    Ping,
    Pong,
    Role,
    push_varint,
    split_header,
)

FRAGMENT_SIZE = 64  # what the machines under test ask their peer for
LIMITS = Limits(max_message_bytes=1024)
ENCODERS = (u32be, zigzag, u8)
TO_SERVER = corpus("tube", "to-server")
TO_CLIENT = corpus("tube", "to-client")
CLOSE_CODES = {1000, 1001, 1002, 1009}
ECHO = 100  # the application sends back the first bytes of what it receives
KEEPALIVE = 5.0

Compression = Literal["never", "always", "smart"]
COMPRESSIONS: tuple[Compression, ...] = ("never", "always", "smart")


def split_messages(raw: bytes) -> list[bytes]:
    """The WebSocket messages of a corpus entry, read leniently (the rest, when a length does
    not fit, is the last message)."""
    out: list[bytes] = []
    pos = 0
    while pos + 4 <= len(raw) and len(out) < 256:
        (size,) = struct.unpack_from(">I", raw, pos)
        out.append(raw[pos + 4 : pos + 4 + size])
        pos += 4 + size
    if pos < len(raw):
        out.append(raw[pos:])
    return out


@st.composite
def websocket_messages(draw: st.DrawFn, raw: bytes) -> list[bytes]:
    """The messages of ``raw`` as they are, or their bytes cut again anywhere."""
    found = split_messages(raw)
    if draw(st.booleans()):
        return found
    return draw(chunked(b"".join(found), max_chunks=128))


times = st.floats(min_value=-1e6, max_value=1e12, allow_nan=False, allow_infinity=False)


@dataclass
class Machine:
    """A connection under test, its application and what it did."""

    conn: Connection
    echo: bool = True
    events: list[Event] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)  # WebSocket messages it sent
    echoed: list[bytes] = field(default_factory=list)  # messages its application sent
    pings: int = 0  # pings its application saw (each answered with a pong)

    @property
    def closed(self) -> Closed | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Closed) else None

    def receive(self, message: bytes, now: float) -> None:
        self.conn.receive_data(message, now)  # never raises
        self.drain(now)

    def timer(self, now: float) -> None:
        self.conn.handle_timer(now)  # never raises
        self.drain(now)
        deadline = self.conn.next_deadline()
        if self.closed is None and self.conn.keepalive is not None:
            assert deadline is not None
            assert deadline > now, f"deadline {deadline} is not after {now}"
        if self.closed is not None:
            assert deadline is None

    def drain(self, now: float) -> None:
        for _ in range(1000):
            event = self.conn.next_event()
            if event is None:
                break
            assert self.closed is None, f"{event!r} after {self.closed!r}"
            self.events.append(event)
            match event:
                case Closed(_, code, _):
                    assert code in CLOSE_CODES, event
                case MessageReceived(data, _):
                    assert len(data) <= self.conn.limits.max_message_bytes
                    if self.echo and self.conn.established:
                        self.echoed.append(data[:ECHO])
                        self.conn.send(data[:ECHO], now)
                case Ping():
                    self.pings += 1
        else:
            raise AssertionError("next_event never ran dry")
        assert self.conn.buffered <= self.conn.limits.max_message_bytes
        if not self.conn.receiving:
            assert self.conn.buffered == 0
        self.sent += self.conn.data_to_send()

    def after_close(self, now: float) -> None:
        assert self.closed is not None
        self.conn.receive_data(b"\x80", now)
        self.conn.receive_data(b"\x01abc", now)
        self.conn.handle_timer(now + 1e6)
        assert self.conn.next_event() is None
        assert self.conn.data_to_send() == []
        assert self.conn.next_deadline() is None
        with pytest.raises(LocalProtocolError):
            self.conn.send(b"x", now)


def check_peer_reads(machine: Machine) -> None:
    """Everything ``machine`` sent, read by a connection of the other role that asked for the
    fragment size ``machine`` was told: no breach, the same messages, a pong per ping."""
    conn = machine.conn
    if not machine.sent:
        return
    peer_role = Role.SERVER if conn.role is Role.CLIENT else Role.CLIENT
    peer = Connection(peer_role, fragment_size=conn.peer_fragment_size or 0)
    for message in machine.sent:
        peer.receive_data(message, 0.0)
    received, pongs = [], 0
    established = None
    for _ in range(len(machine.sent) + 2):
        event = peer.next_event()
        if event is None:
            break
        match event:
            case Closed():
                raise AssertionError(f"the peer could not read what was sent: {event!r}")
            case Established(size):
                established = size
            case MessageReceived(data, _):
                received.append(data)
            case Pong():
                pongs += 1
            case CompressionRefused(compression_id):
                assert 2 <= compression_id <= 7  # (this side knows deflate)
    assert established == conn.fragment_size
    assert received == machine.echoed
    assert pongs == machine.pings
    assert not peer.receiving, "the output ends inside a message"


def run_machine(role: Role, messages: Sequence[bytes], times_: Sequence[float],
                compression: Compression, keepalive: float | None) -> Machine:  # fmt: skip
    conn = Connection(role, fragment_size=FRAGMENT_SIZE, limits=LIMITS, compression=compression,
                      keepalive=keepalive, now=0.0)  # fmt: skip
    machine = Machine(conn)
    machine.sent += conn.data_to_send()
    now = 0.0
    for i, message in enumerate(messages):
        if i < len(times_):
            now = times_[i]
        machine.receive(message, now)
        if i < len(times_) and i % 2:
            machine.timer(now)
    machine.timer(now)
    if machine.closed is None and keepalive is not None:
        machine.timer(now + 1e7)  # long after: the silent peer is closed
        closed = machine.closed
        assert closed is not None
        assert closed.code == 1001
    if machine.closed is not None:
        machine.after_close(now)
    check_peer_reads(machine)
    return machine


@fuzz()
@given(
    data=st.data(),
    raw=inputs(TO_SERVER, ENCODERS),
    compression=st.sampled_from(COMPRESSIONS),
    keepalive=st.none() | st.just(KEEPALIVE),
    times_=st.lists(times, max_size=8),
)
def test_the_server_side_survives_any_input(
    data: st.DataObject, raw: bytes, compression: Compression, keepalive: float | None,
    times_: list[float],
) -> None:  # fmt: skip
    run_machine(Role.SERVER, data.draw(websocket_messages(raw)), times_, compression, keepalive)


@fuzz()
@given(
    data=st.data(),
    raw=inputs(TO_CLIENT, ENCODERS),
    compression=st.sampled_from(COMPRESSIONS),
    keepalive=st.none() | st.just(KEEPALIVE),
    times_=st.lists(times, max_size=8),
)
def test_the_client_side_survives_any_input(
    data: st.DataObject, raw: bytes, compression: Compression, keepalive: float | None,
    times_: list[float],
) -> None:  # fmt: skip
    run_machine(Role.CLIENT, data.draw(websocket_messages(raw)), times_, compression, keepalive)


@replays("tube", "to-server")
def test_corpus_to_the_server(raw: bytes) -> None:
    for messages in (split_messages(raw), [raw[i : i + 1] for i in range(len(raw))]):
        for compression in COMPRESSIONS:
            run_machine(Role.SERVER, messages, [], compression, KEEPALIVE)


@replays("tube", "to-client")
def test_corpus_to_the_client(raw: bytes) -> None:
    for messages in (split_messages(raw), [raw[i : i + 1] for i in range(len(raw))]):
        for compression in COMPRESSIONS:
            run_machine(Role.CLIENT, messages, [], compression, None)


# --------------------------------------------------------------------------- deflate

DEFLATED = [zlib.compress(b"deflate me " * 40, level) for level in (0, 1, 9)] + [
    zlib.compress(b"\x00" * 4096, 9),  # inflates past the 1 KiB limit
    zlib.compressobj(1, zlib.DEFLATED, -15).compress(b"raw deflate, no zlib header"),
]


@fuzz()
@given(deflated=inputs(DEFLATED, (u8, u32be)), size=st.sampled_from((0, 8, 64)))
def test_a_deflated_message_inflates_or_is_a_breach(deflated: bytes, size: int) -> None:
    """Any bytes under compression id 1 (deflate in zlib format): the message, at most the
    limit, or a breach (1002; 1009 past the limit), never a zlib error."""
    receiver = Connection(Role.SERVER, fragment_size=size, limits=LIMITS)
    receiver.receive_data(push_varint(0), 0.0)
    sender = Connection(Role.CLIENT, fragment_size=0)
    sender.receive_data(push_varint(size), 0.0)
    sender.data_to_send()
    # Private on purpose: no public call sends bytes as they are under a compression id (a user
    # could only send what the peer cannot decode); this one splits them as the sender would.
    sender._send_fragments(1, deflated, 0.0)  # the bytes as they are, under id 1
    for message in sender.data_to_send():
        receiver.receive_data(message, 0.0)
    events = []
    for _ in range(8):
        event = receiver.next_event()
        if event is None:
            break
        events.append(event)
    assert isinstance(events[0], Established)
    last = events[-1]
    if isinstance(last, Closed):
        assert last.code in (1002, 1009), last
    else:
        assert isinstance(last, MessageReceived), events
        assert last.compressed
        assert len(last.data) <= LIMITS.max_message_bytes
        assert last.data == zlib.decompress(deflated)


# --------------------------------------------------------------------------- round trips


def literal(messages: Sequence[bytes]) -> list[bytes]:
    """What a sender of the seed's literal reading sends for the same Tube messages (after
    the fragment size): every header of a message of several fragments alone in its WebSocket
    message, the first fragment in the next one (a header alone with one fragment is an empty
    message, shared/seeds/README.md)."""
    out: list[bytes] = []
    left = 0
    for message in messages:
        if left:
            left -= 1
            out.append(message)
            continue
        code, count, offset = split_header(message)
        if code >= 8:  # control
            out.append(message)
        elif count > 1 and offset < len(message):
            out += [message[:offset], message[offset:]]
            left = count - 1
        else:  # one fragment, kept with its header (an empty message: the header alone)
            out.append(message)
            left = count - 1
    return out


sizes = st.sampled_from((0, 8, 9, 16, 64, 2**31 - 1)) | st.integers(8, 300)
payloads = st.lists(
    st.binary(max_size=600) | st.sampled_from((b"", b"a" * 3000, bytes(range(256)) * 5)),
    max_size=8,
)


@fuzz()
@given(
    data=st.data(),
    client_size=sizes,
    server_size=sizes,
    client_compression=st.sampled_from(COMPRESSIONS),
    server_compression=st.sampled_from(COMPRESSIONS),
    to_server=payloads,
    to_client=payloads,
    readings=st.tuples(st.booleans(), st.booleans()),
)
def test_two_connections_deliver_every_message(
    data: st.DataObject, client_size: int, server_size: int, client_compression: Compression,
    server_compression: Compression, to_server: list[bytes], to_client: list[bytes],
    readings: tuple[bool, bool],
) -> None:  # fmt: skip
    client = Connection(Role.CLIENT, fragment_size=client_size, compression=client_compression)
    server = Connection(Role.SERVER, fragment_size=server_size, compression=server_compression)
    for message in client.data_to_send():
        server.receive_data(message, 0.0)
    for message in server.data_to_send():
        client.receive_data(message, 0.0)
    assert client.established
    assert server.established
    directions = ((client, server, to_server, readings[0]),
                  (server, client, to_client, readings[1]))  # fmt: skip
    for sender, receiver, payloads_, seed_reading in directions:
        for payload in payloads_:
            sender.send(payload, 1.0)
        sent = sender.data_to_send()
        for message in sent:
            limit = receiver.fragment_size
            assert not limit or len(message) <= limit, (len(message), limit)
        if seed_reading:
            sent = literal(sent)
        for message in sent:
            receiver.receive_data(message, 1.0)
        got = []
        for _ in range(len(sent) + 2):
            event = receiver.next_event()
            if event is None:
                break
            if isinstance(event, Established):
                continue
            assert isinstance(event, MessageReceived), event
            got.append(event.data)
            if sender.compression == "never":
                assert not event.compressed
        assert got == payloads_


@fuzz()
@given(
    steps=st.lists(st.tuples(st.floats(0, 20, allow_nan=False), st.sampled_from(
        ("nothing", "ping", "pong", "send", "timer"))), max_size=30),
    role=st.sampled_from((Role.CLIENT, Role.SERVER)),
    keepalive=st.floats(0.001, 100, allow_nan=False),
)
def test_keepalive_pings_the_quiet_and_closes_the_silent(
    steps: list[tuple[float, str]], role: Role, keepalive: float
) -> None:
    """With time moving forward: a ping goes out once nothing was sent for ``keepalive``
    seconds, the connection closes (1001) once nothing was received for three times that,
    and a handled deadline is never left behind."""
    conn = Connection(role, fragment_size=0, keepalive=keepalive, now=0.0)
    conn.receive_data(push_varint(0), 0.0)  # the peer's fragment size
    conn.data_to_send()
    assert conn.next_event() == Established(0)
    now = last_sent = last_received = 0.0
    for dt, action in steps:
        now += dt
        deadline = conn.next_deadline()
        if deadline is None:
            break
        if action == "timer" or now >= deadline:
            conn.handle_timer(now)
            if now >= last_received + 3 * keepalive:
                event = conn.next_event()
                assert isinstance(event, Closed), event
                assert event.code == 1001
                break
            out = conn.data_to_send()
            if now >= last_sent + keepalive:
                assert out == [b"\x80"]
                last_sent = now
            else:
                assert out == []
            next_deadline = conn.next_deadline()
            assert next_deadline is not None
            assert next_deadline > now
        elif action in ("ping", "pong"):
            conn.receive_data(b"\x80" if action == "ping" else b"\x88", now)
            assert conn.next_event() == (Ping() if action == "ping" else Pong())
            last_received = now
            if action == "ping":
                assert conn.data_to_send() == [b"\x88"]
                last_sent = now
        elif action == "send":
            conn.send(b"data", now)
            conn.data_to_send()
            last_sent = now
