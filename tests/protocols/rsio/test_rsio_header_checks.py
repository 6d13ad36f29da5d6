"""The RS.io machine under hostile input (issue 20): an element frame for an id never
subscribed is a breach at its header, byte by byte, before its body is buffered; what a frame
has declared and not delivered is visible (``awaiting``) so an adapter can charge it to its
budget, and ``refuse_input`` ends the connection in the protocol's words; ``next_event``'s
work is bounded by ``max_frames``. Golden bytes are those of docs/protocols/rsio.md.
"""

from __future__ import annotations

import pytest

from tidewire.protocols.rsio import (
    ClientHello,
    Connection,
    ConnectionClosed,
    Goodbye,
    HandshakeCompleted,
    Message,
    OnNext,
    Request,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    encode,
)
from tidewire.protocols.rsio.varint import push_varint


def raw(*messages: Message) -> bytes:
    out = bytearray()
    for message in messages:
        encode(message, 0, out)
    return bytes(out)


def varint(n: int) -> bytes:
    out = bytearray()
    push_varint(out, n)
    return bytes(out)


def drain(conn: Connection) -> list[object]:
    events: list[object] = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    return events


def hub_side() -> Connection:
    """The hub's side after the peer's hello (it subscribed with no id of the peer's)."""
    server = Connection(Role.SERVER)
    server.initiate()
    server.data_to_send()
    server.receive_data(raw(ClientHello()))
    assert drain(server) == [HandshakeCompleted(0, frozenset())]
    return server


GOODBYE_7 = b"\x02" + varint(len(b"protocol error: elements for subscriber 7, which is not "
                                 b"subscribed")) + (
    b"protocol error: elements for subscriber 7, which is not subscribed")  # fmt: skip


@pytest.mark.parametrize("kind", [0x07, 0x08])  # onNext, onNextPacked
def test_an_element_frame_for_an_id_never_subscribed_is_a_breach_at_its_header(
    kind: int,
) -> None:
    """Fed one byte at a time: nothing is refused while the header is incomplete; the
    subscriber id completes it and the goodbye's exact bytes are queued before any length or
    body byte is read."""
    conn = hub_side()
    frame = bytes([kind]) + varint(7)  # type, subscriber id (two bytes: the header)
    conn.receive_data(frame[:1])
    assert drain(conn) == []
    assert not conn.closed
    assert conn.data_to_send() == b""
    conn.receive_data(frame[1:])
    events = drain(conn)
    assert len(events) == 1
    assert isinstance(events[0], ConnectionClosed)
    assert events[0].error
    assert conn.data_to_send() == GOODBYE_7
    assert conn.awaiting == 0  # nothing is awaited: the length was never read
    held = conn.buffered  # (at most the header: the frame was refused there)
    assert held <= len(frame)
    conn.receive_data(varint(16 * 1024 * 1024) + b"x" * 1000)  # (the declared body: ignored)
    assert drain(conn) == []
    assert conn.buffered == held


def test_a_multi_byte_subscriber_id_is_judged_once_complete() -> None:
    conn = hub_side()
    frame = b"\x07" + varint(300)  # 0xac 0x02
    for byte in frame[:-1]:
        conn.receive_data(bytes([byte]))
        assert drain(conn) == []
        assert not conn.closed
    conn.receive_data(frame[-1:])
    assert isinstance(drain(conn)[0], ConnectionClosed)
    assert b"subscriber 300, which is not subscribed" in conn.data_to_send()


def test_an_element_frame_before_the_hello_is_a_breach_at_its_header() -> None:
    conn = Connection(Role.SERVER)
    conn.initiate()
    conn.data_to_send()
    conn.receive_data(b"\x07\x01")
    assert isinstance(drain(conn)[0], ConnectionClosed)
    assert b"expected ClientHello first, got onNext" in conn.data_to_send()


def client_subscribed() -> Connection:
    client = Connection(Role.CLIENT)
    client.initiate()
    client.send(Subscribe("p", 1, 5))
    client.data_to_send()
    client.receive_data(raw(ServerHello(), Subscribed(1, 0)))
    assert drain(client) == [HandshakeCompleted(0, frozenset()), Subscribed(1, 0)]
    return client


def test_declared_bytes_are_awaiting_until_they_arrive() -> None:
    client = client_subscribed()
    element = b"e" * 1000
    frame = raw(OnNext(1, element))
    client.receive_data(frame[:5])  # type, id, two length bytes, one body byte
    assert drain(client) == []
    assert client.buffered == 5
    assert client.buffered + client.awaiting == len(frame)  # the whole frame, as declared
    client.receive_data(frame[5:500])
    assert drain(client) == []
    assert client.buffered + client.awaiting == len(frame)
    client.receive_data(frame[500:])
    assert drain(client) == [OnNext(1, element)]
    assert client.buffered == 0
    assert client.awaiting == 0


def test_an_element_over_the_limit_is_refused_when_its_length_is_read() -> None:
    client = client_subscribed()
    client.receive_data(b"\x07\x01" + varint(16 * 1024 * 1024 + 1))
    assert isinstance(drain(client)[0], ConnectionClosed)
    assert b"exceeds the limit" in client.data_to_send()


def test_refuse_input_is_a_breach_in_the_protocols_words() -> None:
    client = client_subscribed()
    client.receive_data(b"\x07\x01" + varint(1_000_000))
    assert drain(client) == []
    assert client.buffered == 5
    assert client.awaiting == 1_000_000
    client.refuse_input("a frame of 1000005 bytes does not fit")
    events = drain(client)
    assert len(events) == 1
    assert isinstance(events[0], ConnectionClosed)
    reason = b"protocol error: a frame of 1000005 bytes does not fit"
    assert client.data_to_send() == b"\x02" + varint(len(reason)) + reason
    assert client.closed
    assert client.awaiting == 0
    client.refuse_input("again")  # (idempotent once closed)
    assert client.data_to_send() == b""


def test_next_event_does_a_bounded_amount_of_work() -> None:
    """Frames dropped quietly (requests for ids never opened) make no event: with
    ``max_frames`` one call decodes at most that many and returns; frames_received says how
    far it got."""
    conn = hub_side()
    conn.receive_data(raw(*[Request(99, 1)] * 1000) + raw(Goodbye("bye")))
    start = conn.frames_received
    assert conn.next_event(max_frames=256) is None
    assert conn.frames_received - start == 256
    assert not conn.closed
    empty = 1
    while (event := conn.next_event(max_frames=256)) is None:
        empty += 1
    assert isinstance(event, ConnectionClosed)
    assert empty == 3  # 768 requests in three calls; the fourth: the rest and the goodbye
    assert conn.frames_received - start == 1001
