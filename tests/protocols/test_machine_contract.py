"""The machine contract (docs/architecture.md), checked the same way on every sans-IO machine
that parses bytes (RS.io, Tolliver, Seguro's two sides, Tube) and on RS.io over HTTP's state:
fed one byte (or one WebSocket message) at a time, a machine reaches the events it reaches when
fed at once; ``next_event()`` is ``None`` while it needs data; ``buffered`` is the bytes
received and not parsed, and is bounded; ``pending`` is what ``data_to_send()`` would hand out.
Only public members are used."""

from __future__ import annotations

import uuid

from tidewire.protocols import rsio, seguro, tolliver, tube
from tidewire.protocols.rsio_http import ServerSubscription

# --------------------------------------------------------------------------- Tolliver

A, B = uuid.UUID(int=1), uuid.UUID(int=2)


def tolliver_pair() -> tuple[tolliver.Connection, tolliver.Connection]:
    connector = tolliver.Connection(tolliver.Role.CONNECTOR, A, 1, frozenset({1}), {("c", "")})
    acceptor = tolliver.Connection(tolliver.Role.ACCEPTOR, B, 1, frozenset({1}), {("d", "")})
    return connector, acceptor


def tolliver_wire() -> bytes:
    """What a connector says: its handshake, then (once answered) messages, a subscription
    and an ack."""
    connector, acceptor = tolliver_pair()
    connector.initiate()
    wire = connector.data_to_send()
    acceptor.receive_data(wire)
    drain_tolliver(acceptor)
    connector.receive_data(acceptor.data_to_send())
    drain_tolliver(connector)
    connector.send(tolliver.Message("d", "k", b"body", 7), 0.0)
    connector.send(tolliver.Message("d", "", b"x" * 300), 0.0)
    connector.subscribe("e", "k2")
    connector.ack(3)
    return wire + connector.data_to_send()


def drain_tolliver(conn: tolliver.Connection) -> list[tolliver.Event]:
    events = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    return events


def test_tolliver_fed_byte_by_byte_reaches_the_same_events() -> None:
    wire = tolliver_wire()
    _, whole = tolliver_pair()
    whole.receive_data(wire)
    expected = drain_tolliver(whole)
    assert any(isinstance(e, tolliver.Received) for e in expected)
    _, thin = tolliver_pair()
    got: list[tolliver.Event] = []
    before = 0
    for i in range(len(wire)):
        thin.receive_data(wire[i : i + 1])
        got += drain_tolliver(thin)  # None as soon as it needs a byte more
        # each byte either waits with those of its frame or completes the frame
        assert thin.buffered in (0, before + 1)
        before = thin.buffered
    assert got == expected
    assert thin.buffered == 0
    assert whole.data_to_send() == thin.data_to_send()  # (the same acks and answer)


def test_tolliver_pending_is_what_data_to_send_hands_out() -> None:
    connector, _ = tolliver_pair()
    assert connector.pending == 0
    connector.initiate()
    size = connector.pending
    assert size > 0
    assert len(connector.data_to_send()) == size
    assert connector.pending == 0


def test_tolliver_buffered_is_bounded() -> None:
    """Bytes the adapter never lets the machine parse stay under the limit: past it, the
    connection closes as for any breach (the adapters drain after each read, so only a peer
    that floods faster than frames can be parsed reaches it)."""
    limits = tolliver.Limits(max_name_bytes=16, max_body_bytes=64, max_buffered_bytes=0)
    acceptor = tolliver.Connection(tolliver.Role.ACCEPTOR, B, 1, frozenset({1}), limits=limits)
    flood = b"\x04\x00\x00\x00\x01" * (limits.buffer_limit // 5 + 1)
    acceptor.receive_data(flood[: limits.buffer_limit])
    assert acceptor.buffered == limits.buffer_limit
    acceptor.receive_data(flood[limits.buffer_limit :])
    (event,) = drain_tolliver(acceptor)
    assert isinstance(event, tolliver.Closed)
    assert event.error
    assert "limit" in event.reason


# --------------------------------------------------------------------------- Seguro


def seguro_hub_wire() -> bytes:
    return (b"SEGURO 0\nIDENTIFY 0\nWELCOME ~zod 5\nLATEST 6\nCOMMITTED 7 3\n"
            b"EVENT 8 2\nhi\n\nSENT 1 8 8\n")  # fmt: skip


def seguro_client() -> seguro.ClientSession:
    return seguro.ClientSession("~zod")


def run_seguro_client(chunks: list[bytes]) -> tuple[list[seguro.Event], list[int]]:
    """The ship's events, and its ``buffered`` after each chunk and drain."""
    ship = seguro_client()
    events: list[seguro.Event] = []
    buffered = []
    for chunk in chunks:
        ship.receive_data(chunk)
        while (event := ship.next_event()) is not None:
            events.append(event)
            if isinstance(event, seguro.Welcome):
                ship.save(7, b"abc")
            elif isinstance(event, seguro.Committed):
                ship.read(8, 1)
        buffered.append(ship.buffered)
        ship.data_to_send()
    return events, buffered


def test_seguro_fed_byte_by_byte_reaches_the_same_events_and_buffers_one_line() -> None:
    wire = seguro_hub_wire()
    expected, after = run_seguro_client([wire])
    assert after == [0]
    assert isinstance(expected[-1], seguro.Sent)
    got, buffered = run_seguro_client([wire[i : i + 1] for i in range(len(wire))])
    assert got == expected
    # unparsed bytes are at most the line (or the event data) under way, and none at the end
    assert max(buffered) < 20
    assert buffered[-1] == 0


def test_seguro_next_event_is_none_until_the_data_is_whole() -> None:
    hub = seguro.ServerSession()
    hub.initiate()
    assert hub.pending == len(b"SEGURO 0\n")
    assert hub.data_to_send() == b"SEGURO 0\n"
    hub.receive_data(b"HELLO 0\nPOINT ~zod\n")
    assert isinstance(hub.next_event(), seguro.Hello)
    assert isinstance(hub.next_event(), seguro.Point)
    hub.welcome(None)
    hub.receive_data(b"SAVE 1 4\nab")
    assert hub.next_event() is None
    assert hub.awaiting_data == 4
    assert hub.buffered == 2
    hub.receive_data(b"cd\n")
    assert hub.next_event() is None  # (the second newline is still due)
    hub.receive_data(b"\n")
    assert hub.next_event() == seguro.Save(1, b"abcd")
    assert hub.buffered == 0
    assert hub.awaiting_data is None


def test_seguro_buffered_is_bounded() -> None:
    limits = seguro.Limits(max_line_bytes=64, max_event_bytes=64, max_buffered_bytes=0)
    hub = seguro.ServerSession(limits=limits)
    hub.initiate()
    line = b"HELLO 0\n"
    hub.receive_data(line * (limits.buffer_limit // len(line)))  # not parsed yet: under
    assert hub.buffered <= limits.buffer_limit
    hub.receive_data(line * 2)
    event = hub.next_event()
    assert isinstance(event, seguro.Breach)
    assert "limit" in event.reason
    assert hub.buffered == 0  # a closed machine keeps no bytes


# --------------------------------------------------------------------------- Tube


def tube_receiver(max_message_bytes: int = 1 << 20) -> tube.Connection:
    conn = tube.Connection(tube.Role.SERVER, fragment_size=16,
                           limits=tube.Limits(max_message_bytes=max_message_bytes))  # fmt: skip
    conn.receive_data(tube.push_varint(0), 0.0)
    assert isinstance(conn.next_event(), tube.Established)
    conn.data_to_send()
    return conn


def test_tube_buffers_the_fragments_of_one_message_and_says_none_meanwhile() -> None:
    conn = tube_receiver()
    payload = bytes(range(40))  # at 16 bytes a message: 15 + 16 + 9, in three fragments
    messages = [tube.encode_header(tube.CODE_PLAIN, 3) + payload[:15], payload[15:31],
                payload[31:]]  # fmt: skip
    assert not conn.receiving
    conn.receive_data(messages[0], 1.0)
    assert conn.next_event() is None
    assert (conn.receiving, conn.buffered) == (True, 15)
    conn.receive_data(messages[1], 1.0)
    assert conn.next_event() is None
    assert conn.buffered == 31
    conn.receive_data(messages[2], 1.0)
    assert conn.next_event() == tube.MessageReceived(payload, False)
    assert (conn.receiving, conn.buffered) == (False, 0)
    assert conn.next_event() is None


def test_tube_buffered_is_bounded_by_the_message_limit() -> None:
    conn = tube_receiver(max_message_bytes=40)
    conn.receive_data(tube.encode_header(tube.CODE_PLAIN, 3) + b"a" * 15, 1.0)
    conn.receive_data(b"b" * 16, 1.0)
    assert conn.buffered == 31
    conn.receive_data(b"c" * 16, 1.0)  # 47 > 40
    event = conn.next_event()
    assert isinstance(event, tube.Closed)
    assert event.code == 1009
    assert conn.buffered == 0


def test_tube_pending_is_what_data_to_send_hands_out() -> None:
    client = tube.Connection(tube.Role.CLIENT, fragment_size=300)
    assert client.pending == len(tube.push_varint(300))
    assert client.data_to_send() == [tube.push_varint(300)]
    assert client.pending == 0


# --------------------------------------------------------------------------- RS.io


def rsio_client(limits: rsio.Limits | None = None) -> rsio.Connection:
    """A client whose hello and subscription 1 are sent (and taken)."""
    client = rsio.Connection(rsio.Role.CLIENT, limits=limits)
    client.initiate()
    client.send(rsio.Subscribe("s", 1, 1000))
    client.data_to_send()
    return client


def rsio_hub_wire() -> bytes:
    """What a hub says to :func:`rsio_client`: its hello, ``subscribed``, elements (one over
    a varint length of two bytes), ``onComplete`` and goodbye."""
    hub = rsio.Connection(rsio.Role.SERVER)
    hub.initiate()
    hello = rsio.encode(rsio.ClientHello())
    hub.receive_data(bytes(rsio.encode(rsio.Subscribe("s", 1, 1000), out=hello)))
    drain_rsio(hub)
    hub.send(rsio.Subscribed(1, 0))
    hub.send_elements(1, [b"a", b"bc", b"x" * 300, b""])
    hub.send(rsio.OnComplete(1))
    hub.send(rsio.Goodbye("bye"))
    return hub.data_to_send()


def drain_rsio(conn: rsio.Connection) -> list[rsio.Event]:
    events = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    return events


def test_rsio_fed_byte_by_byte_reaches_the_same_events() -> None:
    wire = rsio_hub_wire()
    whole = rsio_client()
    whole.receive_data(wire)
    expected = drain_rsio(whole)
    assert isinstance(expected[-1], rsio.ConnectionClosed)
    thin = rsio_client()
    got: list[rsio.Event] = []
    before = 0
    for i in range(len(wire)):
        thin.receive_data(wire[i : i + 1])
        got += drain_rsio(thin)  # None as soon as it needs a byte more
        # each byte either waits with those of its frame or completes the frame
        assert thin.buffered in (0, before + 1)
        before = thin.buffered
    assert got == expected
    assert thin.buffered == 0
    assert whole.data_to_send() == thin.data_to_send()  # (the goodbye acknowledged)


def test_rsio_pending_is_what_data_to_send_hands_out() -> None:
    client = rsio.Connection(rsio.Role.CLIENT)
    assert client.pending == 0
    client.initiate()
    client.send(rsio.Subscribe("s", 1, 5))
    size = client.pending
    assert size > 0
    assert len(client.data_to_send()) == size
    assert client.pending == 0


def test_rsio_buffered_is_bounded() -> None:
    """An adapter that decodes after every read never meets the bound (a partial frame plus a
    read of ``max_read_ahead_bytes``); more undecoded bytes than ``max_buffered_bytes`` are
    the peer's breach, answered with goodbye, and nothing of them is kept."""
    limits = rsio.Limits(max_string_bytes=16, max_element_bytes=16, max_packed_bytes=16,
                         max_extensions=1, max_read_ahead_bytes=64)  # fmt: skip
    limit = limits.max_buffered_bytes
    assert limit == 16 + 40 + 64  # the largest frame (body and head), then one read
    client = rsio_client(limits)
    frames = [rsio.OnNext(1, bytes([i]) * 16) for i in range(200)]
    stream = rsio.encode(rsio.ServerHello()) + rsio.encode(rsio.Subscribed(1, 0))
    for frame in frames:
        rsio.encode(frame, out=stream)
    for start in range(0, len(stream), 64):  # as an adapter reads: never near the bound
        client.receive_data(bytes(stream[start : start + 64]))
        drain_rsio(client)
    assert client.buffered == 0
    assert not client.closed
    client.receive_data(bytes(rsio.encode(rsio.OnNext(1, b"x" * 16))) * 6)  # 114, undecoded
    assert client.buffered == 114
    client.receive_data(bytes(rsio.encode(rsio.OnNext(1, b"y" * 4))))  # 7 more: 121 is over
    assert client.buffered == 114
    (event,) = drain_rsio(client)
    assert isinstance(event, rsio.ConnectionClosed)
    assert event.error
    assert f"121 bytes received and not parsed, over the limit of {limit}" in event.reason
    assert client.data_to_send()[:1] == b"\x02"  # goodbye


# --------------------------------------------------------------------------- RS.io over HTTP


def test_rsio_http_pending_is_the_delivery_not_yet_written() -> None:
    """RS.io over HTTP has no receive buffer (aiohttp frames each body); what it holds to send
    is the one delivery prepared and not yet confirmed written."""
    sub = ServerSubscription()
    sub.request(3)
    assert sub.pending == 0
    delivery = sub.prepare([b"ab", b"cde"])
    assert sub.pending == len(delivery.body)
    sub.sent(delivery)
    assert sub.pending == 0

