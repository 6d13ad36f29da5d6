"""Issue 20 in the sans-IO core: what awaits acks is counted in bytes, resends back off, and a
frame's declared size is known from its header (for the adapter's memory budget)."""

from __future__ import annotations

import uuid

import pytest

from tidewire.protocols.tolliver import (
    CONTROL_CHANNEL,
    UNRELIABLE,
    Ack,
    Connection,
    Decoder,
    HandshakeRequest,
    Limits,
    Message,
    Role,
    SubscriptionEntry,
    codec,
    encode,
    parse_entry,
)


def pair(backoff: float = 1.0, most: float = 60.0) -> tuple[Connection, Connection]:
    """An established connector/acceptor pair; the acceptor (the sender) resends with
    ``backoff`` and ``most``."""
    a = Connection(Role.CONNECTOR, uuid.uuid4(), 1, frozenset({1}))
    b = Connection(Role.ACCEPTOR, uuid.uuid4(), 1, frozenset({1}), resend_backoff=backoff,
                   resend_max_interval=most)  # fmt: skip
    a.initiate()
    b.receive_data(a.data_to_send())
    while b.next_event() is not None:
        pass
    a.receive_data(b.data_to_send())
    while a.next_event() is not None:
        pass
    assert a.established
    assert b.established
    return a, b


def test_unacked_bytes_follow_sends_and_acks() -> None:
    _, b = pair()
    b.send(Message("x", "k", b"hello", 7), 0.0)
    b.send_many("y", [(b"", b"abc", 8), (b"", b"zz", UNRELIABLE)], 0.0)
    frames = b.data_to_send()
    assert b.unacked_count == 2
    assert b.unacked_bytes == (17 + 1 + 1 + 5) + (17 + 1 + 3)  # the frames kept for resends
    assert len(frames) == b.unacked_bytes + 17 + 1 + 2  # (and the unreliable one, not kept)
    b.receive_data(bytes(encode(Ack(7))))
    while b.next_event() is not None:
        pass
    assert (b.unacked_count, b.unacked_bytes) == (1, 17 + 1 + 3)
    b.receive_data(bytes(encode(Ack(8))))
    while b.next_event() is not None:
        pass
    assert (b.unacked_count, b.unacked_bytes) == (0, 0)


def test_resends_back_off_up_to_the_most() -> None:
    """Resent after 1 s, then 2, 4, 8, 8 ... (backoff 2, at most 8); a message sent later keeps
    its own schedule."""
    _, b = pair(2.0, 8.0)
    b.send(Message("x", "", b"m", 1), 0.0)
    b.data_to_send()
    resent_at: list[float] = []
    while len(resent_at) < 6:
        deadline = b.next_deadline()
        assert deadline is not None
        b.handle_timer(deadline)
        if b.data_to_send():
            resent_at.append(deadline)
    assert resent_at == [1.0, 3.0, 7.0, 15.0, 23.0, 31.0]
    b.send(Message("x", "", b"n", 2), 31.5)  # a new one: 1 s after it is sent
    b.data_to_send()
    assert b.next_deadline() == 32.5
    b.handle_timer(32.5)
    assert b.data_to_send() == bytes(encode(Message("x", "", b"n", 2)))
    assert b.resends == 7


def test_without_backoff_resends_come_every_interval() -> None:
    """The default (an Instance's): every ``resend_interval``, as before issue 20."""
    _, b = pair()
    b.send(Message("x", "", b"m", 1), 0.0)
    b.data_to_send()
    for second in (1.0, 2.0, 3.0):
        assert b.next_deadline() == second
        b.handle_timer(second)
        assert b.data_to_send()


def test_a_frames_declared_size_is_known_from_its_header() -> None:
    header = bytes([3]) + (1).to_bytes(4, "big") + (0).to_bytes(4, "big") \
        + (1_000_000).to_bytes(4, "big") + (9).to_bytes(4, "big")
    decoder = Decoder(Limits())
    decoder.feed(header[:10])
    assert decoder.declared == 10  # (the header is not whole yet: what has come)
    decoder.feed(header[10:] + b"x" + b"\0" * 100)
    assert decoder.declared == 17 + 1 + 1_000_000
    assert decoder.next_frame() is None
    assert decoder.frames == 0
    decoder.feed(b"\0" * (1_000_000 - 100))
    assert isinstance(decoder.next_frame(), Message)
    assert (decoder.declared, decoder.frames) == (0, 1)


def test_subscribe_many_is_subscribe_for_each() -> None:
    a, b = pair()
    b.subscribe_many([("x", ""), ("y", "k")])
    b.subscribe_many([("x", "")], op=1)
    assert b.subscriptions == {("y", "k")}
    a.receive_data(b.data_to_send())
    while a.next_event() is not None:
        pass
    assert a.peer_subscriptions == {("y", "k")}
    one = Connection(Role.CONNECTOR, uuid.uuid4(), 1, frozenset({1}))
    one.subscribe_many([("z", "")])  # before the handshake: in the request
    one.initiate()
    request = one.data_to_send()
    assert request == bytes(encode(HandshakeRequest(1, one.instance,
                                                    (SubscriptionEntry(0, "z"),))))  # fmt: skip
    assert parse_entry(bytes([0, 0, 0, 0, 1, 0, 0, 0, 0]) + b"z", Limits()).channel == "z"
    assert CONTROL_CHANNEL == "tolliver"


def test_a_handshake_in_many_pieces_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its entries are walked by their length fields as the pieces come and decoded once it
    is all in: not decoded again from the start at every piece (quadratic in the pieces)."""
    entries = tuple(SubscriptionEntry(0, f"channel.{i}", "k" * (i % 7)) for i in range(1000))
    request = HandshakeRequest(1, uuid.uuid4(), entries)
    data = bytes(encode(request))
    decoded = []
    real = codec._entry

    def counted(buf: bytes | bytearray, pos: int, limits: Limits) -> tuple[SubscriptionEntry, int]:
        decoded.append(pos)
        return real(buf, pos, limits)

    monkeypatch.setattr(codec, "_entry", counted)
    decoder = Decoder(Limits())
    frames = []
    for at in range(0, len(data), 64):
        decoder.feed(data[at : at + 64])
        while (frame := decoder.next_frame()) is not None:
            frames.append(frame)
    assert frames == [request]
    assert len(decoded) == 1000
