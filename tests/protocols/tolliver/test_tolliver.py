"""Tolliver (seed 003): golden frames written by hand from the seed's layout (big-endian, the
code byte first), decoded at once, byte by byte and with trailing data; Hypothesis round trips
cut anywhere; handshakes between two sans-IO connections for every status; acks, at-least-once
delivery, resends on a fake clock, subscriptions on the reserved channel; and bad input, which
closes the connection with ``error=True`` and a reason, after which input is ignored."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.model import LocalProtocolError, RemoteProtocolError
from tidewire.protocols.tolliver import (
    CONTROL_CHANNEL,
    UNRELIABLE,
    Ack,
    Acked,
    Closed,
    Connection,
    Decoder,
    Established,
    Event,
    Frame,
    HandshakeFinal,
    HandshakeRequest,
    HandshakeResponse,
    Limits,
    Message,
    PeerSubscriptions,
    Received,
    Role,
    SubscriptionEntry,
    encode,
    encode_entry,
    matches,
    parse_entry,
)

C_ID = uuid.UUID("01890a5d-ac96-774b-bcce-b302099a8057")  # the connector's instance
A_ID = uuid.UUID("01890a5d-ac96-7fff-8000-000000000001")  # the acceptor's instance
C_HEX = "01890a5dac96774bbcceb302099a8057"
A_HEX = "01890a5dac967fff8000000000000001"


def h(text: str) -> bytes:
    """Bytes from hex written with spaces between the fields."""
    return bytes.fromhex(text)


# --------------------------------------------------------------------------- golden frames

GOLDEN: list[tuple[str, Frame, bytes]] = [
    (
        "handshake-req",
        HandshakeRequest(
            0x0102030405060708,
            C_ID,
            (SubscriptionEntry(0, "ch", "k1"), SubscriptionEntry(1, "é", "")),
        ),
        # code | version u64 | UUID | count u32 | op | chan len | key len | chan | key ...
        h(
            f"00 0102030405060708 {C_HEX} 00000002"
            "   00 00000002 00000002 6368 6b31"
            "   01 00000002 00000000 c3a9"
        ),
    ),
    (
        "handshake-req-empty",
        HandshakeRequest(1, C_ID),
        h(f"00 0000000000000001 {C_HEX} 00000000"),
    ),
    (
        "handshake-res",
        HandshakeResponse(2, A_ID, 3, (SubscriptionEntry(0, "news", ""),)),
        # code | version u64 | UUID | status u8 | count u32 | entries
        h(f"01 0000000000000002 {A_HEX} 03 00000001   00 00000004 00000000 6e657773"),
    ),
    (
        "handshake-res-empty",
        HandshakeResponse(1, A_ID, 0),
        h(f"01 0000000000000001 {A_HEX} 00 00000000"),
    ),
    ("handshake-final-1", HandshakeFinal(1), h("02 01")),
    ("handshake-final-2", HandshakeFinal(2), h("02 02")),
    (
        "message-reliable",
        Message("news", "k", b"hi!", 0x01020304),
        # code | chan len | key len | body len | id | chan | key | body
        h("03 00000004 00000001 00000003 01020304 6e657773 6b 686921"),
    ),
    (
        "message-unreliable",
        Message("ü", "", b"", UNRELIABLE),
        h("03 00000002 00000000 00000000 7fffffff c3bc"),
    ),
    (
        "message-control",
        Message(CONTROL_CHANNEL, "", h("01 00000001 00000002 61 6263"), UNRELIABLE),
        h("03 00000008 00000000 0000000c 7fffffff 746f6c6c69766572 01 00000001 00000002 61 6263"),
    ),
    ("ack", Ack(0xDEADBEEF), h("04 deadbeef")),
]
GOLDEN_IDS = [name for name, _, _ in GOLDEN]


def decode_all(data: bytes, limits: Limits | None = None) -> list[Frame]:
    decoder = Decoder(limits)
    decoder.feed(data)
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    return frames


@pytest.mark.parametrize(("frame", "wire"), [(f, w) for _, f, w in GOLDEN], ids=GOLDEN_IDS)
def test_golden_encode(frame: Frame, wire: bytes) -> None:
    assert bytes(encode(frame)) == wire
    out = bytearray(b"x")
    assert encode(frame, out) is out
    assert bytes(out) == b"x" + wire


@pytest.mark.parametrize(("frame", "wire"), [(f, w) for _, f, w in GOLDEN], ids=GOLDEN_IDS)
def test_golden_decode_at_once_byte_by_byte_and_with_trailing_data(
    frame: Frame, wire: bytes
) -> None:
    assert decode_all(wire) == [frame]

    decoder = Decoder()
    for i in range(len(wire) - 1):
        decoder.feed(wire[i : i + 1])
        assert decoder.next_frame() is None, f"a frame after {i + 1} of {len(wire)} bytes"
    decoder.feed(wire[-1:])
    assert decoder.next_frame() == frame
    assert decoder.next_frame() is None
    assert decoder.buffered == 0

    decoder = Decoder()
    decoder.feed(wire + h("04 0000"))  # an ack cut short after it
    assert decoder.next_frame() == frame
    assert decoder.next_frame() is None
    assert decoder.buffered == 3
    decoder.feed(h("0007"))
    assert decoder.next_frame() == Ack(7)

    assert decode_all(wire + wire + h("02 01")) == [frame, frame, HandshakeFinal(1)]


def test_golden_entry_and_reliability() -> None:
    entry = SubscriptionEntry(0, "news", "k")
    assert bytes(encode_entry(entry)) == h("00 00000004 00000001 6e657773 6b")
    assert parse_entry(h("00 00000004 00000001 6e657773 6b"), Limits()) == entry
    assert parse_entry(h("01 00000001 00000000 61"), Limits()) == SubscriptionEntry(1, "a")
    assert UNRELIABLE == 2**31 - 1
    assert not Message("c", "", b"", 2**31 - 1).reliable
    assert Message("c", "", b"", 0).reliable
    assert Message("c", "", b"", 2**31).reliable
    assert Message("c", "", b"", 2**32 - 1).reliable
    assert not Message("c", "", b"").reliable  # unreliable by default


@pytest.mark.parametrize(
    "make",
    [
        lambda: Message("c", "", b"", 2**32),
        lambda: Message("c", "", b"", -1),
        lambda: Message("\ud800", "", b""),  # not encodable as UTF-8
        lambda: Ack(2**32),
        lambda: HandshakeRequest(2**64, C_ID),
        lambda: HandshakeResponse(1, C_ID, 256),
        lambda: HandshakeFinal(256),
        lambda: SubscriptionEntry(2, "c"),
    ],
)
def test_unencodable_frames_are_refused(make: Callable[[], Frame]) -> None:
    """Refused when built or, for the hot-path frames (message, ack), when encoded."""
    with pytest.raises(LocalProtocolError):
        encode(make())


# --------------------------------------------------------------------------- round trips

names = st.text(st.characters(codec="utf-8"), max_size=12)
ids = st.integers(0, 2**32 - 1) | st.just(UNRELIABLE)
uuids = st.binary(min_size=16, max_size=16).map(lambda b: uuid.UUID(bytes=b))
entries = st.builds(SubscriptionEntry, st.sampled_from([0, 1]), names, names)
entry_lists = st.lists(entries, max_size=5).map(tuple)
frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(HandshakeRequest, st.integers(0, 2**64 - 1), uuids, entry_lists),
    st.builds(
        HandshakeResponse, st.integers(0, 2**64 - 1), uuids, st.integers(0, 255), entry_lists
    ),
    st.builds(HandshakeFinal, st.integers(0, 255)),
    st.builds(Message, names, names, st.binary(max_size=64), ids),
    st.builds(Ack, st.integers(0, 2**32 - 1)),
)


@settings(max_examples=300, deadline=None)
@given(frames)
def test_round_trip_every_frame(frame: Frame) -> None:
    assert decode_all(bytes(encode(frame))) == [frame]


@settings(max_examples=200, deadline=None)
@given(st.lists(frames, min_size=1, max_size=8), st.data())
def test_round_trip_cut_anywhere(sent: list[Frame], data: st.DataObject) -> None:
    wire = b"".join(bytes(encode(f)) for f in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    decoder = Decoder()
    got: list[Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        decoder.feed(wire[start:end])
        while (frame := decoder.next_frame()) is not None:
            got.append(frame)
    assert got == sent
    assert decoder.buffered == 0


@settings(max_examples=100, deadline=None)
@given(entries)
def test_round_trip_entry(entry: SubscriptionEntry) -> None:
    assert parse_entry(bytes(encode_entry(entry)), Limits()) == entry


# --------------------------------------------------------------------------- connections


def connection(
    role: Role,
    version: int = 1,
    supported: Iterable[int] = (),
    subs: Iterable[tuple[str, str]] = (),
    *,
    limits: Limits | None = None,
    resend_interval: float = 1.0,
) -> Connection:
    return Connection(
        role,
        C_ID if role is Role.CONNECTOR else A_ID,
        version,
        frozenset(supported),
        subscriptions=set(subs),
        limits=limits or Limits(),
        resend_interval=resend_interval,
    )


def events(conn: Connection) -> list[Event]:
    out: list[Event] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def transfer(src: Connection, dst: Connection) -> list[Event]:
    """What ``src`` has to send, received by ``dst``; ``dst``'s events."""
    data = src.data_to_send()
    if data:
        dst.receive_data(data)
    return events(dst)


def feed(conn: Connection, *sent: Frame | bytes) -> list[Event]:
    for item in sent:
        conn.receive_data(item if isinstance(item, bytes) else bytes(encode(item)))
    return events(conn)


def sent_frames(conn: Connection) -> list[Frame]:
    return decode_all(conn.data_to_send())


def established(
    c_subs: Iterable[tuple[str, str]] = (),
    a_subs: Iterable[tuple[str, str]] = (),
    *,
    limits: Limits | None = None,
    resend_interval: float = 1.0,
) -> tuple[Connection, Connection]:
    c = connection(Role.CONNECTOR, subs=c_subs, limits=limits, resend_interval=resend_interval)
    a = connection(Role.ACCEPTOR, subs=a_subs, limits=limits, resend_interval=resend_interval)
    c.initiate()
    transfer(c, a)
    transfer(a, c)
    assert c.established
    assert a.established
    return c, a


def assert_breach(conn: Connection, sent: Iterable[Frame | bytes], reason: str) -> None:
    """Feeding ``sent`` closes ``conn`` with an error whose reason matches ``reason``; later
    input is ignored."""
    got = feed(conn, *sent)
    assert len(got) == 1, got
    closed = got[0]
    assert isinstance(closed, Closed)
    assert closed.error
    assert reason.lower() in closed.reason.lower(), closed.reason
    assert conn.closed
    assert not conn.established
    # Nothing but acks (of a reliable breaching message) is sent: no response, no final.
    assert all(isinstance(f, Ack) for f in decode_all(conn.data_to_send()))
    assert feed(conn, Message("news", "k", b"later", 9), HandshakeRequest(1, C_ID)) == []
    assert conn.data_to_send() == b""
    with pytest.raises(LocalProtocolError):
        conn.send(Message("news", "k", b""), 0.0)


# --------------------------------------------------------------------------- handshakes


def test_connector_request_bytes() -> None:
    c = connection(Role.CONNECTOR, version=7, subs=[("news", ""), ("a", "k")])
    c.initiate()
    assert c.data_to_send() == h(
        f"00 0000000000000007 {C_HEX} 00000002"
        "   00 00000001 00000001 61 6b"
        "   00 00000004 00000000 6e657773"
    )
    a = connection(Role.ACCEPTOR)
    with pytest.raises(LocalProtocolError):
        a.initiate()


def test_status_0_equal_versions_and_subscriptions_before_the_response() -> None:
    c = connection(Role.CONNECTOR, subs=[("news", ""), ("sport", "k")])
    a = connection(Role.ACCEPTOR, subs=[("weather", "x")])
    c.initiate()
    assert events(c) == []
    a.receive_data(c.data_to_send())
    first = a.next_event()
    # Processing the request registered the peer's subscriptions and produced the response in
    # the same step: by the time the response can be sent, they are in place.
    assert a.peer_subscriptions == {("news", ""), ("sport", "k")}
    response = a.data_to_send()
    assert response == h(
        f"01 0000000000000001 {A_HEX} 00 00000001   00 00000007 00000001 77656174686572 78"
    )
    assert [first, *events(a)] == [
        Established(C_ID, 1, 0),
        PeerSubscriptions(frozenset({("news", ""), ("sport", "k")})),
    ]
    assert a.established
    assert a.peer == C_ID
    assert a.spoken == 1
    c.receive_data(response)
    assert events(c) == [
        Established(A_ID, 1, 0),
        PeerSubscriptions(frozenset({("weather", "x")})),
    ]
    assert c.peer_subscriptions == {("weather", "x")}
    assert c.peer == A_ID
    assert c.spoken == 1
    assert c.data_to_send() == b""  # no final after status 0


def test_status_1_acceptor_newer_and_backwards_compatible() -> None:
    c = connection(Role.CONNECTOR, version=1)
    a = connection(Role.ACCEPTOR, version=3, supported={1, 2})
    c.initiate()
    assert transfer(c, a) == [Established(C_ID, 1, 1), PeerSubscriptions(frozenset())]
    response = a.data_to_send()
    assert decode_all(response) == [HandshakeResponse(3, A_ID, 1)]
    c.receive_data(response)
    assert events(c) == [Established(A_ID, 1, 1), PeerSubscriptions(frozenset())]
    assert c.spoken == a.spoken == 1
    assert c.data_to_send() == b""


def test_status_2_acceptor_newer_without_support_closes() -> None:
    c = connection(Role.CONNECTOR, version=1)
    a = connection(Role.ACCEPTOR, version=3, supported={2})
    c.initiate()
    got = transfer(c, a)
    assert len(got) == 1
    assert isinstance(got[0], Closed)
    assert not got[0].error
    assert a.closed
    response = a.data_to_send()  # the response is still sent, then the acceptor closes
    assert response == h(f"01 0000000000000003 {A_HEX} 02 00000000")
    c.receive_data(response)
    got = events(c)
    assert len(got) == 1
    assert isinstance(got[0], Closed)
    assert not got[0].error
    assert c.closed
    assert c.data_to_send() == b""
    with pytest.raises(LocalProtocolError):
        c.send(Message("news", "", b""), 0.0)


def test_status_3_acceptor_older_connector_compatible() -> None:
    c = connection(Role.CONNECTOR, version=2, supported={1}, subs=[("news", "")])
    a = connection(Role.ACCEPTOR, version=1, subs=[("sport", "")])
    c.initiate()
    assert transfer(c, a) == []  # awaiting the final
    assert not a.established
    assert a.peer_subscriptions == {("news", "")}
    response = a.data_to_send()
    assert decode_all(response) == [
        HandshakeResponse(1, A_ID, 3, (SubscriptionEntry(0, "sport", ""),))
    ]
    with pytest.raises(LocalProtocolError):
        a.send(Message("news", "", b""), 0.0)
    c.receive_data(response)
    assert events(c) == [
        Established(A_ID, 1, 3),
        PeerSubscriptions(frozenset({("sport", "")})),
    ]
    final = c.data_to_send()
    assert final == h("02 01")
    a.receive_data(final)
    assert events(a) == [
        Established(C_ID, 1, 3),
        PeerSubscriptions(frozenset({("news", "")})),
    ]
    assert c.spoken == a.spoken == 1
    assert a.data_to_send() == b""


def test_status_3_acceptor_older_connector_incompatible() -> None:
    c = connection(Role.CONNECTOR, version=2)
    a = connection(Role.ACCEPTOR, version=1)
    c.initiate()
    assert transfer(c, a) == []
    c.receive_data(a.data_to_send())
    got = events(c)
    assert len(got) == 1
    assert isinstance(got[0], Closed)
    assert not got[0].error
    final = c.data_to_send()
    assert final == h("02 02")
    a.receive_data(final)
    got = events(a)
    assert len(got) == 1
    assert isinstance(got[0], Closed)
    assert not got[0].error
    assert c.closed
    assert a.closed


def test_second_request_on_an_established_connection_is_answered() -> None:
    c, a = established(c_subs=[("news", "")], a_subs=[("sport", "")])
    # Same version: answered with status 0; the new request's subscriptions replace the old.
    got = feed(a, HandshakeRequest(1, C_ID, (SubscriptionEntry(0, "weather", "x"),)))
    assert got == [PeerSubscriptions(frozenset({("weather", "x")}))]
    assert a.peer_subscriptions == {("weather", "x")}
    assert sent_frames(a) == [HandshakeResponse(1, A_ID, 0, (SubscriptionEntry(0, "sport", ""),))]
    assert a.established
    # An older version the acceptor speaks: status 1, still established.
    a2 = connection(Role.ACCEPTOR, version=2, supported={1})
    c2 = connection(Role.CONNECTOR, version=1)
    c2.initiate()
    transfer(c2, a2)
    transfer(a2, c2)
    feed(a2, HandshakeRequest(1, C_ID))
    assert sent_frames(a2) == [HandshakeResponse(2, A_ID, 1)]
    assert a2.established
    assert c.established


def test_second_request_to_the_established_connector_is_answered() -> None:
    c, _ = established()
    feed(c, HandshakeRequest(1, A_ID))
    assert c.established
    assert [type(f) for f in sent_frames(c)] == [HandshakeResponse]


def test_unexpected_response_or_final_is_ignored() -> None:
    c, a = established()
    for conn in (c, a):
        assert feed(conn, HandshakeResponse(1, A_ID, 2), HandshakeResponse(9, A_ID, 3)) == []
        assert feed(conn, HandshakeFinal(1), HandshakeFinal(2)) == []
        assert conn.established
        assert conn.data_to_send() == b""
        assert conn.peer_subscriptions == set()
    # Before the handshake, too: a response to the acceptor, a final to either side.
    fresh_a = connection(Role.ACCEPTOR)
    assert feed(fresh_a, HandshakeResponse(1, C_ID, 0), HandshakeFinal(1)) == []
    assert not fresh_a.established
    assert not fresh_a.closed
    fresh_c = connection(Role.CONNECTOR)
    fresh_c.initiate()
    fresh_c.data_to_send()
    assert feed(fresh_c, HandshakeFinal(1), HandshakeFinal(2)) == []
    assert not fresh_c.established
    assert not fresh_c.closed
    # ... and the handshake then completes normally.
    assert feed(fresh_c, HandshakeResponse(1, A_ID, 0))[0] == Established(A_ID, 1, 0)


def test_peer_closing_the_stream() -> None:
    c, _ = established()
    c.receive_data(b"")
    assert events(c) == [Closed("the peer closed the connection", error=False)]
    assert c.closed
    assert feed(c, Message("news", "", b"")) == []


# --------------------------------------------------------------------------- messages


def test_nothing_before_established() -> None:
    c = connection(Role.CONNECTOR)
    a = connection(Role.ACCEPTOR)
    for conn in (c, a):
        with pytest.raises(LocalProtocolError, match="handshake"):
            conn.send(Message("news", "k", b"x", 1), 0.0)
    c.initiate()
    with pytest.raises(LocalProtocolError, match="handshake"):
        c.send(Message("news", "k", b"x", UNRELIABLE), 0.0)
    assert decode_all(c.data_to_send()) == [HandshakeRequest(1, C_ID)]  # nothing else queued
    assert c.next_deadline() is None


@pytest.mark.parametrize(
    "frame", [Message("news", "k", b"x", 1), Message("news", "k", b"x"), Ack(1)], ids=repr
)
def test_message_or_ack_before_the_handshake_closes(frame: Frame) -> None:
    assert_breach(connection(Role.ACCEPTOR), [frame], "before the handshake")
    c = connection(Role.CONNECTOR)
    c.initiate()
    c.data_to_send()
    assert_breach(c, [frame], "before the handshake")


def test_message_while_the_acceptor_awaits_the_final_closes() -> None:
    a = connection(Role.ACCEPTOR, version=1)
    feed(a, HandshakeRequest(2, C_ID))
    a.data_to_send()
    assert_breach(a, [Message("news", "", b"x")], "before the handshake")


def test_reliable_messages_are_acked_and_delivered_every_time() -> None:
    c, a = established()
    message = Message("news", "k", b"body", 5)
    c.send(message, 0.0)
    c.send(message, 0.5)  # the same id twice
    assert transfer(c, a) == [Received(message), Received(message)]
    assert a.data_to_send() == h("04 00000005 04 00000005")
    a.receive_data(h("04 00000005 04 00000005"))
    assert events(a) == []  # a never sent 5: acks for unknown ids are ignored
    c.receive_data(h("04 00000005"))
    assert events(c) == [Acked(5)]
    assert c.unacked() == []
    c.receive_data(h("04 00000005"))  # a second ack for the same id: ignored
    assert events(c) == []
    assert c.established
    # Both directions.
    back = Message("reply", "", b"", 0)
    a.send(back, 1.0)
    assert transfer(a, c) == [Received(back)]
    assert transfer(c, a) == [Acked(0)]


def test_unreliable_messages_are_not_acked_or_resent() -> None:
    c, a = established()
    message = Message("news", "k", b"body", UNRELIABLE)
    c.send(message, 0.0)
    assert c.unacked() == []
    assert c.next_deadline() is None
    assert transfer(c, a) == [Received(message)]
    assert a.data_to_send() == b""
    c.handle_timer(1000.0)
    assert c.data_to_send() == b""


def test_resend_until_acked_on_a_fake_clock() -> None:
    c, a = established(resend_interval=2.0)
    first = Message("news", "k", b"1", 1)
    second = Message("news", "k", b"2", 2)
    c.send(first, 10.0)
    c.send(second, 11.0)
    c.send(Message("news", "k", b"u"), 11.0)
    c.data_to_send()  # the originals are lost in transit
    assert c.unacked() == [1, 2]
    assert c.next_deadline() == 12.0
    c.handle_timer(11.99)
    assert c.data_to_send() == b""
    c.handle_timer(12.0)
    assert sent_frames(c) == [first]  # only the one due
    assert c.next_deadline() == 13.0
    c.handle_timer(13.5)
    assert sent_frames(c) == [second]
    assert c.next_deadline() == 14.0
    c.handle_timer(14.0)
    assert sent_frames(c) == [first]
    assert c.next_deadline() == 15.5
    # The resent copy gets through and is acked: no more resends of 1.
    a.receive_data(bytes(encode(first)))
    assert events(a) == [Received(first)]
    assert transfer(a, c) == [Acked(1)]
    assert c.unacked() == [2]
    assert c.next_deadline() == 15.5
    c.handle_timer(100.0)
    assert sent_frames(c) == [second]
    assert c.next_deadline() == 102.0
    feed(c, Ack(2))
    assert c.unacked() == []
    assert c.next_deadline() is None
    c.handle_timer(1000.0)
    assert c.data_to_send() == b""


def test_ack_for_an_unknown_id_is_ignored() -> None:
    c, _ = established()
    c.send(Message("news", "", b"", 3), 0.0)
    c.data_to_send()
    assert feed(c, Ack(4), Ack(UNRELIABLE), Ack(0)) == []
    assert c.established
    assert c.unacked() == [3]
    assert c.data_to_send() == b""


def test_subscribe_and_unsubscribe_after_established() -> None:
    c, a = established(c_subs=[("news", "")])
    c.subscribe("sport", "k")
    assert c.subscriptions == {("news", ""), ("sport", "k")}
    wire = c.data_to_send()
    assert wire == h(
        "03 00000008 00000000 0000000f 7fffffff 746f6c6c69766572"
        "   00 00000005 00000001 73706f7274 6b"
    )
    a.receive_data(wire)
    assert events(a) == [PeerSubscriptions(frozenset({("news", ""), ("sport", "k")}))]
    assert a.data_to_send() == b""  # unreliable: not acked, and not delivered as Received
    c.unsubscribe("news")
    assert c.subscriptions == {("sport", "k")}
    assert decode_all(c.data_to_send()) == [
        Message(CONTROL_CHANNEL, "", bytes(encode_entry(SubscriptionEntry(1, "news"))))
    ]
    c.unsubscribe("news")
    transfer(c, a)
    assert a.peer_subscriptions == {("sport", "k")}
    # A control message sent reliable by the peer is acked too.
    body = bytes(encode_entry(SubscriptionEntry(0, "x", "")))
    assert feed(a, Message(CONTROL_CHANNEL, "", body, 8)) == [
        PeerSubscriptions(frozenset({("sport", "k"), ("x", "")}))
    ]
    assert sent_frames(a) == [Ack(8)]


def test_subscribe_before_established_goes_in_the_handshake() -> None:
    c = connection(Role.CONNECTOR)
    c.subscribe("news", "k")
    c.subscribe("gone")
    c.unsubscribe("gone")
    c.initiate()
    assert decode_all(c.data_to_send()) == [
        HandshakeRequest(1, C_ID, (SubscriptionEntry(0, "news", "k"),))
    ]


def test_matches() -> None:
    subs = {("news", "k"), ("sport", "")}
    assert matches(subs, "news", "k")
    assert not matches(subs, "news", "other")
    assert not matches(subs, "news", "")
    assert matches(subs, "sport", "")
    assert matches(subs, "sport", "anything")
    assert not matches(subs, "weather", "")
    assert matches(iter([("news", "")]), "news", "k")  # any iterable
    assert not matches([], "news", "")


# --------------------------------------------------------------------------- bad input

SMALL = Limits(max_name_bytes=8, max_body_bytes=16, max_subscriptions=2)


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (h("05"), "unknown message code 5"),
        (h("ff 00000000"), "unknown message code 255"),
        # The lengths are refused from the header alone, before their bytes arrive.
        (h("03 00000009 00000000 00000000 00000001"), "over 8 bytes"),
        (h("03 00000001 00000009 00000000 00000001"), "over 8 bytes"),
        (h("03 00000001 00000000 00000011 00000001"), "body of 17 bytes"),
        (h("03 ffffffff ffffffff ffffffff 00000001"), "over 8 bytes"),
        (h(f"00 0000000000000001 {C_HEX} 00000003"), "3 subscriptions"),
        (h(f"00 0000000000000001 {C_HEX} 00000001 00 00000009 00000000"), "over 8 bytes"),
        (h(f"00 0000000000000001 {C_HEX} 00000001 00 00000000 00000009"), "over 8 bytes"),
        (h(f"00 0000000000000001 {C_HEX} 00000001 02 00000001 00000000 61"), "op 2"),
        (h(f"00 0000000000000001 {C_HEX} 00000001 ff 00000001 00000000 61"), "op 255"),
        (h(f"00 0000000000000001 {C_HEX} 00000001 00 00000001 00000000 ff"), "not utf-8"),
        (h(f"00 0000000000000001 {C_HEX} 00000001 00 00000001 00000001 61 c3"), "not utf-8"),
        (
            bytes(encode(HandshakeRequest(1, C_ID, (SubscriptionEntry(0, CONTROL_CHANNEL),)))),
            "reserved channel",
        ),
    ],
    ids=repr,
)
def test_bad_input_to_the_acceptor_before_the_handshake(wire: bytes, reason: str) -> None:
    a = connection(Role.ACCEPTOR, limits=SMALL)
    assert_breach(a, [wire], reason)
    decoder = Decoder(SMALL)
    decoder.feed(wire)
    if "reserved" not in reason:
        with pytest.raises(RemoteProtocolError):
            decoder.next_frame()
        with pytest.raises(RemoteProtocolError):  # the decoder stays dead
            decoder.feed(bytes(encode(Ack(1))))


def test_limits_are_inclusive() -> None:
    c, a = established(limits=SMALL)
    message = Message("12345678", "abcdefgh", b"x" * 16, 1)
    c.send(message, 0.0)
    assert transfer(c, a) == [Received(message)]
    fresh = connection(Role.ACCEPTOR, limits=SMALL)
    subs = (SubscriptionEntry(0, "12345678", "abcdefgh"), SubscriptionEntry(0, "b"))
    assert feed(fresh, HandshakeRequest(1, C_ID, subs))[0] == Established(C_ID, 1, 0)
    assert fresh.peer_subscriptions == {("12345678", "abcdefgh"), ("b", "")}


def control(body: bytes, key: str = "", message_id: int = UNRELIABLE) -> bytes:
    return bytes(encode(Message(CONTROL_CHANNEL, key, body, message_id)))


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (h("06"), "unknown message code 6"),
        (h("03 00000009 00000000 00000000 7fffffff"), "over 8 bytes"),
        (h("03 00000001 00000000 00000021 7fffffff"), "body of 33 bytes"),
        (h("03 00000001 00000000 00000000 00000001 ff"), "channel is not utf-8"),
        (h("03 00000001 00000002 00000000 7fffffff 61 eda080"), "key is not utf-8"),
        (control(bytes(encode_entry(SubscriptionEntry(0, "news"))), key="k"), "with a key"),
        (control(b""), "cut short"),
        (control(h("00 00000004 00000000 6e6577")), "cut short"),
        (control(h("00 00000001 00000000 61 62")), "bytes after"),
        (control(h("02 00000001 00000000 61")), "op 2"),
        (control(h("00 00000001 00000000 ff")), "not utf-8"),
        (control(h("00 00000009 00000000 616263646566676869")), "over 8 bytes"),
        (control(bytes(encode_entry(SubscriptionEntry(0, CONTROL_CHANNEL)))), "reserved channel"),
        (control(bytes(encode_entry(SubscriptionEntry(1, CONTROL_CHANNEL, "k")))), "reserved"),
    ],
    ids=repr,
)
def test_bad_input_on_an_established_connection(wire: bytes, reason: str) -> None:
    c, _ = established(limits=Limits(max_name_bytes=8, max_body_bytes=32))
    assert_breach(c, [wire], reason)


def test_bad_input_after_good_frames_in_the_same_chunk() -> None:
    c, _ = established()
    good = Message("news", "", b"ok")
    c.receive_data(bytes(encode(good)) + h("07") + bytes(encode(good)))
    got = events(c)
    assert got[0] == Received(good)
    assert isinstance(got[1], Closed)
    assert got[1].error
    assert "unknown message code 7" in got[1].reason
    assert len(got) == 2


def test_bad_handshake_status_closes_the_connector() -> None:
    c = connection(Role.CONNECTOR)
    c.initiate()
    c.data_to_send()
    assert_breach(c, [HandshakeResponse(1, A_ID, 4)], "status 4")


def test_sending_on_the_reserved_channel_is_refused() -> None:
    c, _ = established()
    for message in (
        Message(CONTROL_CHANNEL, "", bytes(encode_entry(SubscriptionEntry(0, "x")))),
        Message(CONTROL_CHANNEL, "k", b"", 1),
    ):
        with pytest.raises(LocalProtocolError, match="reserved"):
            c.send(message, 0.0)
    for op in (c.subscribe, c.unsubscribe):
        with pytest.raises(LocalProtocolError, match="reserved"):
            op(CONTROL_CHANNEL, "")
    assert c.data_to_send() == b""
    assert c.unacked() == []
    assert CONTROL_CHANNEL not in {ch for ch, _ in c.subscriptions}
