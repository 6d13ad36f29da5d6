"""The RS.io connection state machine (sans-IO): a CLIENT and a SERVER paired in memory by
shuttling ``data_to_send()`` into ``receive_data()``; events drained with ``next_event()``.

Covers the loose handshake, subscriptions both ways under the same id, demand (limits,
saturation, request(0), late requests/cancels), fixed-size mode, id reuse, goodbye, invalid
UTF-8 in ``subscribe.publisher``, and a Hypothesis state machine of a well-behaved pair whose
messages cross at random moments. Raw bytes stand in for a misbehaving peer.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tidewire.model import Batch, LocalProtocolError, RemoteProtocolError
from tidewire.protocols.rsio import (
    EXT_AUTH,
    Authenticate,
    Authenticated,
    Cancel,
    ClientHello,
    Connection,
    ConnectionClosed,
    Decoder,
    Event,
    Goodbye,
    HandshakeCompleted,
    Message,
    OnComplete,
    OnError,
    OnNext,
    OnNextDecoded,
    OnNextPacked,
    OnNextRun,
    Request,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    SubscriptionErrored,
    encode,
)
from tidewire.protocols.rsio.envelopes import encode_envelopes
from tidewire.protocols.rsio.names import PublisherName
from tidewire.protocols.rsio.output import BIG_ELEMENT
from tidewire.protocols.rsio.subscriptions import (
    SENT_BY_SUBSCRIBER,
    TRANSITIONS,
    Kind,
    Side,
    Subscription,
    Subscriptions,
    SubState,
)
from tidewire.record import encode as encode_record

U = 2**63 - 1  # saturated demand: unbounded


# --------------------------------------------------------------------------- helpers


def raw(*messages: Message, element_size: int = 0) -> bytes:
    """The frames of ``messages``, as a (possibly misbehaving) peer would send them."""
    out = bytearray()
    for message in messages:
        encode(message, element_size, out)
    return bytes(out)


def drain(conn: Connection) -> list[Event]:
    events: list[Event] = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    return events


def shuttle(src: Connection, dst: Connection) -> None:
    """Deliver everything ``src`` queued to ``dst`` (never feeds b"", which means EOF)."""
    data = src.data_to_send()
    if data:
        dst.receive_data(data)


def decode(data: bytes, element_size: int = 0) -> list[Message]:
    decoder = Decoder(element_size=lambda subscriber: element_size)
    decoder.feed(data)
    messages: list[Message] = []
    while (message := decoder.next_message()) is not None:
        assert not isinstance(message, OnNextRun | OnNextDecoded)  # runs only when asked for
        messages.append(message)
    assert decoder.buffered == 0
    return messages


def pair(
    client_extensions: tuple[int, ...] = (), server_extensions: tuple[int, ...] = ()
) -> tuple[Connection, Connection]:
    """A client and a server, handshake done and events drained."""
    client = Connection(Role.CLIENT, extensions=client_extensions)
    server = Connection(Role.SERVER, extensions=server_extensions)
    client.initiate()
    server.initiate()
    shuttle(client, server)
    shuttle(server, client)
    assert [type(e) for e in drain(client)] == [HandshakeCompleted]
    assert [type(e) for e in drain(server)] == [HandshakeCompleted]
    return client, server


def server_after_hello() -> Connection:
    """A server that has sent its hello and received a version-0 clientHello."""
    server = Connection(Role.SERVER)
    server.initiate()
    server.data_to_send()
    server.receive_data(raw(ClientHello()))
    assert drain(server) == [HandshakeCompleted(0, frozenset())]
    return server


def client_subscribed(element_size: int = 0, demand: int = 0) -> Connection:
    """A client whose subscription 1 was answered by ``subscribed`` from a raw peer."""
    client = Connection(Role.CLIENT)
    client.initiate()
    client.send(Subscribe("p", 1, demand))
    client.data_to_send()
    client.receive_data(raw(ServerHello(), Subscribed(1, element_size)))
    assert drain(client) == [HandshakeCompleted(0, frozenset()), Subscribed(1, element_size)]
    return client


def subscribe(
    subscriber_side: Connection, publisher_side: Connection, sid: int, demand: int, size: int = 0
) -> None:
    """``subscriber_side`` subscribes as ``sid``; the publisher answers ``subscribed``."""
    subscriber_side.send(Subscribe(f"stream-{sid}", sid, demand))
    shuttle(subscriber_side, publisher_side)
    assert drain(publisher_side) == [Subscribe(f"stream-{sid}", sid, demand)]
    publisher_side.send(Subscribed(sid, size))
    shuttle(publisher_side, subscriber_side)
    assert drain(subscriber_side) == [Subscribed(sid, size)]


def assert_breach(conn: Connection, *, mentions: str = "") -> Goodbye:
    """``conn`` answered a breach: one goodbye queued, ConnectionClosed(error=True)."""
    events = drain(conn)  # input is decoded as events are asked for
    data = conn.data_to_send()
    assert data[:1] == b"\x02"
    messages = decode(data)
    assert len(messages) == 1
    goodbye = messages[0]
    assert isinstance(goodbye, Goodbye)
    assert mentions in goodbye.reason
    assert len(events) == 1
    closed = events[0]
    assert isinstance(closed, ConnectionClosed)
    assert closed.error
    assert not closed.by_peer
    assert conn.closed
    # everything after is ignored, and nothing may be sent any more
    conn.receive_data(raw(Goodbye("late")))
    assert drain(conn) == []
    assert conn.data_to_send() == b""
    with pytest.raises(LocalProtocolError):
        conn.send(Goodbye("again"))
    return goodbye


# --------------------------------------------------------------------------- 1. handshake


def test_loose_handshake_client_sends_before_server_hello() -> None:
    client = Connection(Role.CLIENT)
    server = Connection(Role.SERVER)
    client.initiate()
    client.send(Subscribe("orders", 1, 0))
    client.send(Request(1, 3))
    client.send(Subscribe("orders", 2, 1))
    # nothing from the server yet: the client does not wait for the serverHello
    assert drain(client) == []
    shuttle(client, server)
    assert drain(server) == [
        HandshakeCompleted(0, frozenset()),
        Subscribe("orders", 1, 0),
        Request(1, 3),
        Subscribe("orders", 2, 1),
    ]
    server.initiate()
    server.send(Subscribed(1))
    server.send(Subscribed(2))
    for i in range(3):
        server.send(OnNext(1, b"e%d" % i))
    server.send(OnNext(2, b"x"))
    server.send(OnComplete(1))
    shuttle(server, client)
    assert drain(client) == [
        HandshakeCompleted(0, frozenset()),
        Subscribed(1),
        Subscribed(2),
        OnNext(1, b"e0"),
        OnNext(1, b"e1"),
        OnNext(1, b"e2"),
        OnNext(2, b"x"),
        OnComplete(1),
    ]
    assert client.negotiated == server.negotiated == frozenset()


def test_server_may_speak_first_and_hellos_cross() -> None:
    client = Connection(Role.CLIENT)
    server = Connection(Role.SERVER)
    server.initiate()
    client.initiate()
    client.send(Subscribe("a", 0, 1))
    c_bytes, s_bytes = client.data_to_send(), server.data_to_send()
    assert s_bytes == bytes.fromhex("01 00 00")
    assert c_bytes.startswith(bytes.fromhex("00 00 00"))
    client.receive_data(s_bytes)
    server.receive_data(c_bytes)
    assert drain(client) == [HandshakeCompleted(0, frozenset())]
    assert drain(server) == [HandshakeCompleted(0, frozenset()), Subscribe("a", 0, 1)]


def test_handshake_extensions_are_the_intersection() -> None:
    client = Connection(Role.CLIENT, extensions=[300, 1, 5])
    server = Connection(Role.SERVER, extensions=[7, 5, 300])
    client.initiate()
    server.initiate()
    assert client.negotiated == frozenset()  # nothing known before the peer's hello
    hello = client.data_to_send()
    assert hello == bytes.fromhex("00 00 03 01 05 ac 02")  # sorted ids
    server.receive_data(hello)
    shuttle(server, client)
    both = frozenset({5, 300})
    assert drain(client) == [HandshakeCompleted(0, both)]
    assert drain(server) == [HandshakeCompleted(0, both)]
    assert client.negotiated == server.negotiated == both
    assert client.peer_extensions == frozenset({5, 7, 300})
    assert server.peer_extensions == frozenset({1, 5, 300})


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_version_mismatch_is_answered_with_goodbye(role: Role) -> None:
    conn = Connection(role)
    conn.initiate()
    conn.data_to_send()
    hello_type = ClientHello if role is Role.SERVER else ServerHello
    kind = 0 if role is Role.SERVER else 1
    data = bytes([kind, 0x01, 0x00])  # hello, version 1, no extensions
    assert data == raw(hello_type(1))
    conn.receive_data(data)
    goodbye = assert_breach(conn, mentions="version")
    assert "1" in goodbye.reason


def test_version_mismatch_between_real_peers() -> None:
    server = Connection(Role.SERVER)
    server.initiate()
    server.data_to_send()
    server.receive_data(bytes([0x00, 0x01, 0x02, 0x05, 0x06]))  # version 1, extensions [5, 6]
    assert_breach(server, mentions="unsupported protocol version 1")


@pytest.mark.parametrize(
    "first",
    [
        Subscribe("orders", 1, 0),
        Request(1, 1),
        Cancel(1),
        Subscribed(1),
        OnNext(1, b"x"),
        OnComplete(1),
        OnError(1, "no"),
        Goodbye("bye"),
        ServerHello(),  # the wrong hello for a server to receive
    ],
    ids=lambda m: type(m).__name__,
)
def test_anything_but_the_hello_first_is_a_breach(first: Message) -> None:
    server = Connection(Role.SERVER)
    server.initiate()
    server.data_to_send()
    server.receive_data(raw(first, ClientHello()))
    assert_breach(server, mentions="expected ClientHello first")


def test_client_expects_server_hello_first() -> None:
    client = Connection(Role.CLIENT)
    client.initiate()
    client.data_to_send()
    client.receive_data(raw(ClientHello()))
    assert_breach(client, mentions="expected ServerHello first")


@pytest.mark.parametrize("again", [ClientHello(), ServerHello()], ids=["client", "server"])
def test_a_second_hello_is_a_breach(again: Message) -> None:
    server = server_after_hello()
    server.receive_data(raw(again))
    assert_breach(server, mentions="second hello")


def test_hello_rules_on_the_sending_side() -> None:
    conn = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        conn.send(Subscribe("a", 1))  # before initiate()
    assert conn.data_to_send() == b""
    conn.initiate()
    with pytest.raises(LocalProtocolError):
        conn.initiate()
    with pytest.raises(LocalProtocolError):
        conn.send(ClientHello())
    assert conn.data_to_send() == bytes.fromhex("00 00 00")


def test_authenticate_goes_once_from_the_client_to_the_hub() -> None:
    """Extension 2: the client sends ``authenticate`` at most once (a second is this side's
    bug), the hub receives it at most once (a second is the peer's breach), and neither may
    go the other way."""
    client, server = pair((EXT_AUTH,), (EXT_AUTH,))
    client.send(Authenticate("token"))
    with pytest.raises(LocalProtocolError, match="at most once"):
        client.send(Authenticate("again"))
    with pytest.raises(LocalProtocolError, match="only the client"):
        server.send(Authenticate("token"))
    shuttle(client, server)
    assert drain(server) == [Authenticate("token")]
    server.send(Authenticated("me"))
    shuttle(server, client)
    assert drain(client) == [Authenticated("me")]
    server.receive_data(raw(Authenticate("again")))
    assert_breach(server, mentions="a second authenticate")


def test_a_hello_split_byte_by_byte() -> None:
    server = Connection(Role.SERVER, extensions=[300])
    server.initiate()
    data = raw(ClientHello(0, (300,)), Subscribe("orders?from=3", 1, 10))
    for i in range(len(data)):
        server.receive_data(data[i : i + 1])
    assert drain(server) == [
        HandshakeCompleted(0, frozenset({300})),
        Subscribe("orders?from=3", 1, 10),
    ]


# --------------------------------------------------------------------------- 2. both directions


def test_subscriptions_both_ways_with_the_same_id_are_independent() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=2)  # client -> server as id 1
    subscribe(server, client, 1, demand=1, size=2)  # server -> client as id 1, fixed-size 2
    assert server.demand(1) == 2
    assert client.demand(1) == 1

    server.send(OnNext(1, b"to-client"))
    client.send(OnNext(1, b"ok"))
    shuttle(server, client)
    shuttle(client, server)
    assert drain(client) == [OnNext(1, b"to-client")]
    assert drain(server) == [OnNext(1, b"ok")]
    assert server.demand(1) == 1
    assert client.demand(1) == 0
    with pytest.raises(LocalProtocolError):
        client.send(OnNext(1, b"no"))  # the server's demand on the client is used up

    # the client cancels its subscription; the server's subscription to the client lives on
    client.send(Cancel(1))
    shuttle(client, server)
    assert drain(server) == [Cancel(1)]
    assert server.demand(1) == 0
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"gone"))
    server.send(Request(1, 3))
    shuttle(server, client)
    assert drain(client) == [Request(1, 3)]
    client.send(OnNextPacked(1, 3, b"aabbcc"))
    client.send(OnComplete(1))
    shuttle(client, server)
    events = drain(server)
    assert events == [OnNextPacked(1, 3, b"aabbcc"), OnComplete(1)]
    packed = events[0]
    assert isinstance(packed, OnNextPacked)
    assert [packed.element(i) for i in range(3)] == [b"aa", b"bb", b"cc"]
    assert client.data_to_send() == server.data_to_send() == b""


# --------------------------------------------------------------------------- 3. demand


def test_publisher_never_sends_more_than_requested() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=2, size=1)
    assert server.demand(1) == 2
    server.send(OnNext(1, b"a"))
    assert server.demand(1) == 1
    with pytest.raises(LocalProtocolError, match="exceed"):
        server.send(OnNextPacked(1, 2, b"bc"))
    assert server.demand(1) == 1
    server.send(OnNext(1, b"b"))
    assert server.demand(1) == 0
    before = server.pending
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"c"))
    assert server.pending == before  # nothing queued for the refused element

    client.send(Request(1, 5))
    shuttle(client, server)
    assert drain(server) == [Request(1, 5)]
    assert server.demand(1) == 5
    server.send(OnNextPacked(1, 3, b"cde"))  # counts 3 elements
    assert server.demand(1) == 2
    with pytest.raises(LocalProtocolError):
        server.send(OnNextPacked(1, 3, b"fgh"))
    server.send(OnNextPacked(1, 2, b"fg"))
    assert server.demand(1) == 0
    shuttle(server, client)
    assert drain(client) == [
        OnNext(1, b"a"),
        OnNext(1, b"b"),
        OnNextPacked(1, 3, b"cde"),
        OnNextPacked(1, 2, b"fg"),
    ]


def test_demand_saturates_at_2_63_minus_1_and_is_then_unbounded() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=0, size=1)
    client.send(Request(1, U))
    client.send(Request(1, U))
    data = client.data_to_send()
    assert data == bytes.fromhex("04 01 ff ff ff ff ff ff ff ff 7f") * 2
    server.receive_data(data)
    assert drain(server) == [Request(1, U), Request(1, U)]
    assert server.demand(1) == U
    client.send(Request(1, 1))
    shuttle(client, server)
    drain(server)
    assert server.demand(1) == U
    for _ in range(50):
        server.send(OnNext(1, b"x"))
    server.send(OnNextPacked(1, 1000, b"y" * 1000))
    assert server.demand(1) == U  # unbounded: never decreases
    shuttle(server, client)
    events = drain(client)
    assert len(events) == 51
    assert client.state.value == "open"


def test_demand_sums_to_exactly_2_63_minus_1_is_unbounded() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=2**62, size=1)
    client.send(Request(1, 2**62 - 1))
    shuttle(client, server)
    drain(server)
    assert server.demand(1) == U
    server.send(OnNext(1, b"x"))
    assert server.demand(1) == U


def test_initial_demand_unbounded() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=U)
    server.send(OnNext(1, b"x"))
    client.send(Request(1, 7))
    shuttle(client, server)
    assert server.demand(1) == U


def test_more_elements_than_demand_is_a_breach() -> None:
    client = client_subscribed(demand=1)
    client.receive_data(raw(OnNext(1, b"one")))
    assert drain(client) == [OnNext(1, b"one")]
    client.receive_data(raw(OnNext(1, b"two")))
    assert_breach(client, mentions="exceed the demand")


def test_runs_deliver_what_demand_allows_then_breach() -> None:
    """With ``runs=True`` consecutive onNext frames come as one OnNextRun; a run longer than
    the demand delivers the elements within it, then the connection is breached, exactly as
    one frame at a time would."""
    client = Connection(Role.CLIENT, runs=True)
    client.initiate()
    client.send(Subscribe("p", 1, 2))
    client.data_to_send()
    client.receive_data(raw(ServerHello(), Subscribed(1, 0), OnNext(1, b"a"), OnNext(1, b"b")))
    assert drain(client) == [HandshakeCompleted(0, frozenset()), Subscribed(1, 0),
                             OnNextRun(1, [b"a", b"b"])]  # fmt: skip
    client.send(Request(1, 2))
    client.receive_data(raw(OnNext(1, b"c"), OnNext(1, b"d"), OnNext(1, b"e")))
    events = drain(client)
    assert events[0] == OnNextRun(1, [b"c", b"d"])
    assert isinstance(events[1], ConnectionClosed)
    assert events[1].error
    assert b"exceed the demand" in client.data_to_send()


def test_send_elements_frames_like_single_sends() -> None:
    client, server = pair()
    subscribe(client, server, 300, 3)
    elements = [b"x", b"", b"y" * 200]
    server.send_elements(300, elements)
    single = b"".join(raw(OnNext(300, e)) for e in elements)
    assert server.data_to_send() == single
    assert server.demand(300) == 0
    with pytest.raises(LocalProtocolError, match="exceed its demand"):
        server.send_elements(300, [b"z"])
    subscribe(client, server, 7, 5, size=2)
    with pytest.raises(LocalProtocolError, match="variable-size"):
        server.send_elements(7, [b"zz"])


def test_packed_count_beyond_demand_is_a_breach() -> None:
    client = client_subscribed(element_size=2, demand=2)
    client.receive_data(bytes.fromhex("08 01 03 61 61 62 62 63 63"))  # count 3 > demand 2
    assert_breach(client, mentions="3 element(s)")


def test_elements_before_subscribed_or_for_unknown_ids_are_a_breach() -> None:
    client = Connection(Role.CLIENT)
    client.initiate()
    client.send(Subscribe("p", 1, 5))
    client.data_to_send()
    client.receive_data(raw(ServerHello(), OnNext(1, b"early")))
    assert drain(client)[:1] == [HandshakeCompleted(0, frozenset())]
    assert client.closed

    client = client_subscribed(demand=5)
    client.receive_data(raw(OnNext(2, b"who")))
    assert_breach(client, mentions="not subscribed")


def test_request_zero_errors_that_subscription_only() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=1)
    subscribe(client, server, 2, demand=1)
    with pytest.raises(LocalProtocolError):
        client.send(Request(1, 0))  # refused locally...
    assert client.data_to_send() == b""
    server.receive_data(bytes.fromhex("04 01 00"))  # ...so a misbehaving peer sends it raw
    events = drain(server)
    assert len(events) == 1
    errored = events[0]
    assert isinstance(errored, SubscriptionErrored)
    assert (errored.subscriber, errored.outbound) == (1, False)
    assert "request(0)" in errored.reason
    reason = errored.reason.encode()
    assert server.data_to_send() == bytes([0x0A, 0x01, len(reason)]) + reason
    assert server.demand(1) == 0
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"closed"))

    # subscription 2 carries on, and the connection too
    server.send(OnNext(2, b"still here"))
    client.send(Request(2, 1))
    shuttle(client, server)
    assert drain(server) == [Request(2, 1)]
    assert server.demand(2) == 1
    shuttle(server, client)
    assert drain(client) == [OnNext(2, b"still here")]
    assert not client.closed
    assert not server.closed


def test_request_zero_onerror_reaches_the_subscriber() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=1)
    server.receive_data(raw(Request(1, 0)))
    errored = drain(server)[0]
    assert isinstance(errored, SubscriptionErrored)
    shuttle(server, client)
    assert drain(client) == [OnError(1, errored.reason)]
    subscribe(client, server, 1, demand=1)  # id free again on both sides


def test_request_zero_for_a_pending_subscription() -> None:
    server = server_after_hello()
    server.receive_data(raw(Subscribe("p", 4, 0), Request(4, 0)))
    events = drain(server)
    assert events[0] == Subscribe("p", 4, 0)
    assert isinstance(events[1], SubscriptionErrored)
    assert server.data_to_send()[:2] == b"\x0a\x04"
    with pytest.raises(LocalProtocolError):
        server.send(Subscribed(4))


@pytest.mark.parametrize("late", [Request(9, 5), Request(9, 0), Cancel(9)], ids=str)
def test_request_or_cancel_for_an_unknown_id_is_ignored(late: Message) -> None:
    server = server_after_hello()
    server.receive_data(raw(late))
    assert drain(server) == []
    assert server.data_to_send() == b""
    assert not server.closed


@pytest.mark.parametrize("close", ["complete", "error", "cancel"])
def test_request_or_cancel_for_a_closed_id_is_ignored(close: str) -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=1)
    if close == "cancel":
        client.send(Cancel(1))
        shuttle(client, server)
        assert drain(server) == [Cancel(1)]
    else:
        server.send(OnComplete(1) if close == "complete" else OnError(1, "x"))
    server.data_to_send()
    server.receive_data(raw(Request(1, 3), Request(1, 0), Cancel(1)))
    assert drain(server) == []
    assert server.data_to_send() == b""
    assert server.demand(1) == 0


def test_local_request_and_cancel_need_an_open_subscription() -> None:
    client, server = pair()
    for message in (Request(3, 1), Cancel(3)):
        with pytest.raises(LocalProtocolError):
            client.send(message)
    subscribe(client, server, 3, demand=0)
    client.send(Cancel(3))
    for message in (Request(3, 1), Cancel(3)):
        with pytest.raises(LocalProtocolError):
            client.send(message)
    assert client.data_to_send() == raw(Cancel(3))


def test_publisher_side_sends_need_a_subscription() -> None:
    client, server = pair()
    for message in (Subscribed(1), OnNext(1, b"x"), OnComplete(1), OnError(1, "e")):
        with pytest.raises(LocalProtocolError):
            server.send(message)
    client.send(Subscribe("p", 1, 3))
    shuttle(client, server)
    drain(server)
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"x"))  # before subscribed
    server.send(Subscribed(1))
    with pytest.raises(LocalProtocolError):
        server.send(Subscribed(1))  # twice
    assert server.data_to_send() == raw(Subscribed(1))


# --------------------------------------------------------------------------- 4. fixed-size mode


def test_fixed_size_elements_on_the_wire_and_decoded() -> None:
    client, server = pair()
    subscribe(client, server, 7, demand=10, size=4)
    server.send(OnNext(7, b"wxyz"))
    data = server.data_to_send()
    assert data == bytes.fromhex("07 07 77 78 79 7a")  # no length prefix
    client.receive_data(data)
    assert drain(client) == [OnNext(7, b"wxyz")]

    server.send(OnNextPacked(7, 2, b"aaaabbbb"))
    data = server.data_to_send()
    assert data == bytes.fromhex("08 07 02 61 61 61 61 62 62 62 62")
    for i in range(len(data)):  # byte by byte
        client.receive_data(data[i : i + 1])
    events = drain(client)
    assert events == [OnNextPacked(7, 2, b"aaaabbbb")]
    packed = events[0]
    assert isinstance(packed, OnNextPacked)
    assert (packed.element(0), packed.element(1), packed.element_size) == (b"aaaa", b"bbbb", 4)

    # an element whose first byte looks like a length or a message type stays opaque
    server.send(OnNext(7, b"\x02\x03bye"[:4]))
    server.send(OnNext(7, b"\xff\xff\xff\xff"))
    shuttle(server, client)
    assert drain(client) == [OnNext(7, b"\x02\x03by"), OnNext(7, b"\xff\xff\xff\xff")]


@pytest.mark.parametrize(
    "bad",
    [
        OnNext(7, b"abc"),
        OnNext(7, b"abcde"),
        OnNextPacked(7, 2, b"abcdef"),
        OnNextPacked(7, 1, b"abc"),
    ],
    ids=repr,
)
def test_wrong_size_element_is_refused(bad: Message) -> None:
    client, server = pair()
    subscribe(client, server, 7, demand=10, size=4)
    with pytest.raises(LocalProtocolError):
        server.send(bad)


def test_refused_wrong_size_element_leaves_no_trace() -> None:
    client, server = pair()
    subscribe(client, server, 7, demand=10, size=4)
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(7, b"abc"))
    assert server.demand(7) == 10
    assert server.data_to_send() == b""


def test_packed_needs_fixed_size_mode() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=10, size=0)
    with pytest.raises(LocalProtocolError):
        server.send(OnNextPacked(1, 2, b"ab"))
    # a raw onNextPacked for a variable-size subscription is a connection breach
    client.receive_data(bytes.fromhex("08 01 02 61 62"))
    assert_breach(client, mentions="not in fixed-size mode")


# --------------------------------------------------------------------------- 5. id reuse


def test_id_reuse_after_cancel() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=1)
    client.send(Cancel(1))
    client.send(Subscribe("again", 1, 2))  # allowed once cancel is sent
    shuttle(client, server)
    assert drain(server) == [Cancel(1), Subscribe("again", 1, 2)]
    server.send(Subscribed(1, 1))
    server.send(OnNextPacked(1, 2, b"ab"))
    shuttle(server, client)
    assert drain(client) == [Subscribed(1, 1), OnNextPacked(1, 2, b"ab")]


@pytest.mark.parametrize("end", [OnComplete(1), OnError(1, "boom é")], ids=repr)
def test_id_reuse_after_oncomplete_or_onerror(end: Message) -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=1, size=3)
    server.send(end)
    shuttle(server, client)
    assert drain(client) == [end]
    subscribe(client, server, 1, demand=2)  # variable-size this time
    server.send(OnNext(1, b"variable length"))
    shuttle(server, client)
    assert drain(client) == [OnNext(1, b"variable length")]


def test_onerror_before_subscribed_frees_the_id() -> None:
    client, server = pair()
    client.send(Subscribe("nope", 1, 0))
    shuttle(client, server)
    drain(server)
    server.send(OnError(1, "no such stream"))
    shuttle(server, client)
    assert drain(client) == [OnError(1, "no such stream")]
    subscribe(client, server, 1, demand=0)


def test_subscribe_with_an_open_id_is_refused_locally() -> None:
    client, server = pair()
    client.send(Subscribe("p", 1, 0))
    with pytest.raises(LocalProtocolError):
        client.send(Subscribe("p", 1, 0))  # requested, not yet subscribed
    shuttle(client, server)
    drain(server)
    server.send(Subscribed(1))
    shuttle(server, client)
    drain(client)
    with pytest.raises(LocalProtocolError):
        client.send(Subscribe("q", 1, 0))  # active
    assert client.data_to_send() == b""


@pytest.mark.parametrize("answered", [False, True])
def test_peer_subscribing_with_an_open_id_is_a_breach(answered: bool) -> None:
    server = server_after_hello()
    server.receive_data(raw(Subscribe("p", 1, 0)))
    assert drain(server) == [Subscribe("p", 1, 0)]
    if answered:
        server.send(Subscribed(1))
        server.data_to_send()
    server.receive_data(raw(Subscribe("p", 1, 0)))
    assert_breach(server, mentions="reuses open subscriber id 1")


def test_late_elements_after_cancel_are_dropped_quietly() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=3, size=2)
    server.send(OnNext(1, b"aa"))
    server.send(OnNextPacked(1, 2, b"bbcc"))
    server.send(OnComplete(1))
    client.send(Cancel(1))  # crosses the elements and the onComplete
    shuttle(server, client)
    assert drain(client) == []
    assert client.data_to_send() == raw(Cancel(1))
    assert not client.closed
    server.receive_data(raw(Cancel(1)))  # the cancel of a completed subscription: a no-op
    assert drain(server) == []
    assert server.data_to_send() == b""


def test_late_subscribed_and_elements_after_cancel_before_subscribed() -> None:
    client, server = pair()
    client.send(Subscribe("p", 1, 5))
    shuttle(client, server)
    drain(server)
    server.send(Subscribed(1, 3))
    server.send(OnNext(1, b"\x00\x01\x02"))  # fixed-size: must still be delimited right
    client.send(Cancel(1))
    shuttle(server, client)
    assert drain(client) == []
    assert not client.closed
    shuttle(client, server)
    assert drain(server) == [Cancel(1)]
    subscribe(client, server, 1, demand=1)
    server.send(OnNext(1, b"new"))
    shuttle(server, client)
    assert drain(client) == [OnNext(1, b"new")]


def test_reuse_right_after_cancel_with_elements_in_flight() -> None:
    """The old subscription was answered: what arrives before the new ``subscribed`` is its."""
    client, server = pair()
    subscribe(client, server, 1, demand=5)
    server.send(OnNext(1, b"old"))  # in flight
    client.send(Cancel(1))
    client.send(Subscribe("p", 1, 5))
    shuttle(server, client)
    events = drain(client)
    assert not any(isinstance(e, ConnectionClosed) for e in events)
    assert OnNext(1, b"old") not in events
    shuttle(client, server)
    assert drain(server) == [Cancel(1), Subscribe("p", 1, 5)]
    server.send(Subscribed(1, 2))
    server.send(OnNext(1, b"nw"))
    shuttle(server, client)
    assert drain(client) == [Subscribed(1, 2), OnNext(1, b"nw")]


def test_reuse_right_after_cancel_with_old_fixed_size_elements_and_end_in_flight() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=5, size=3)
    server.send(OnNext(1, b"\x09\x01\x00"))  # looks like onComplete(1) if mis-delimited
    server.send(OnNextPacked(1, 2, b"abcdef"))
    server.send(OnComplete(1))
    client.send(Cancel(1))
    client.send(Subscribe("p", 1, 1))
    shuttle(server, client)
    assert drain(client) == []
    shuttle(client, server)
    assert drain(server) == [Subscribe("p", 1, 1)]  # the cancel of an ended one is a no-op
    server.send(Subscribed(1))
    server.send(OnNext(1, b"variable"))
    shuttle(server, client)
    assert drain(client) == [Subscribed(1), OnNext(1, b"variable")]


def test_reuse_right_after_cancel_before_subscribed_arrived() -> None:
    client, server = pair()
    client.send(Subscribe("p", 1, 5))
    shuttle(client, server)
    drain(server)
    server.send(Subscribed(1, 4))
    server.send(OnNext(1, b"old!"))
    client.send(Cancel(1))
    with pytest.raises(LocalProtocolError, match="cancelled before its subscribed arrived"):
        client.send(Subscribe("p", 1, 5))
    assert client.free_subscriber_id() == 2
    shuttle(server, client)  # the old subscribed(1, 4) and onNext arrive: dropped quietly
    assert drain(client) == []
    assert client.can_subscribe(1)  # confirmed now: the id is free again
    client.send(Subscribe("p", 1, 5))
    shuttle(client, server)
    events = drain(client)
    shuttle(client, server)
    drain(server)
    server.send(Subscribed(1, 0))
    server.send(OnNext(1, b"new"))
    shuttle(server, client)
    events += drain(client)
    assert not any(isinstance(e, ConnectionClosed) for e in events)
    assert [e for e in events if isinstance(e, OnNext)] == [OnNext(1, b"new")]


# --------------------------------------------------------------------------- 6. goodbye


def test_orderly_goodbye_exchange() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=3)
    subscribe(server, client, 1, demand=3)
    client.send(Goodbye("done"))
    assert client.pending == len(b"\x02\x04done")
    for message in (
        Request(1, 1),
        Cancel(1),
        Subscribe("p", 2),
        OnNext(1, b"x"),
        OnComplete(1),
        Goodbye("again"),
    ):
        with pytest.raises(LocalProtocolError):
            client.send(message)
    assert client.demand(1) == 0
    assert not client.closed  # waits for the acknowledgement
    shuttle(client, server)
    assert drain(server) == [ConnectionClosed("done", by_peer=True, error=False)]
    assert server.closed
    ack = server.data_to_send()
    assert ack[:1] == b"\x02"
    assert all(isinstance(m, Goodbye) for m in decode(ack))
    assert len(decode(ack)) == 1
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"x"))
    client.receive_data(ack)
    events = drain(client)
    assert len(events) == 1
    closed = events[0]
    assert isinstance(closed, ConnectionClosed)
    assert (closed.by_peer, closed.error) == (False, False)
    assert client.closed
    assert client.data_to_send() == b""


def test_messages_crossing_our_goodbye_are_dropped() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=3)
    subscribe(server, client, 2, demand=0)
    client.send(Goodbye("done"))
    server.send(OnNext(1, b"crossing"))
    server.send(Request(2, 5))
    server.send(Subscribe("new", 3, 1))
    server.send(OnComplete(1))
    shuttle(client, server)
    assert drain(server) == [ConnectionClosed("done", by_peer=True, error=False)]
    shuttle(server, client)
    events = drain(client)
    assert len(events) == 1
    assert isinstance(events[0], ConnectionClosed)
    assert not events[0].by_peer
    assert not events[0].error
    assert client.data_to_send() == b""  # no answer to the crossing subscribe/request


def test_fixed_size_element_crossing_our_goodbye() -> None:
    client, server = pair()
    subscribe(client, server, 1, demand=3, size=4)
    client.send(Goodbye("done"))
    server.send(OnNext(1, b"wxyz"))
    shuttle(client, server)
    assert drain(server) == [ConnectionClosed("done", by_peer=True, error=False)]
    shuttle(server, client)
    events = drain(client)
    assert len(events) == 1
    assert isinstance(events[0], ConnectionClosed)
    assert not events[0].error


def test_goodbyes_that_cross_close_both_without_a_third() -> None:
    client, server = pair()
    client.send(Goodbye("c"))
    server.send(Goodbye("s"))
    shuttle(client, server)
    shuttle(server, client)
    for conn in (client, server):
        events = drain(conn)
        assert len(events) == 1
        closed = events[0]
        assert isinstance(closed, ConnectionClosed)
        assert (closed.by_peer, closed.error) == (False, False)
        assert conn.data_to_send() == b""


def test_transport_eof() -> None:
    client, server = pair()
    server.receive_data(b"")
    events = drain(server)
    assert len(events) == 1
    closed = events[0]
    assert isinstance(closed, ConnectionClosed)
    assert closed.by_peer
    assert server.closed
    server.receive_data(b"")
    server.receive_data(raw(Request(1, 1)))
    assert drain(server) == []
    # EOF while waiting for the goodbye's acknowledgement is not an error
    client.send(Goodbye("bye"))
    client.receive_data(b"")
    events = drain(client)
    assert len(events) == 1
    closed = events[0]
    assert isinstance(closed, ConnectionClosed)
    assert (closed.by_peer, closed.error) == (True, False)


# --------------------------------------------------------------------------- 7. invalid UTF-8


def test_invalid_utf8_publisher_errors_that_subscription_only() -> None:
    server = server_after_hello()
    server.receive_data(raw(Subscribe("p", 1, 2)))
    assert drain(server) == [Subscribe("p", 1, 2)]
    server.send(Subscribed(1))
    server.data_to_send()
    bad = bytes.fromhex("03 02 c3 28 03 00")  # subscribe("\xc3(", 3, 0)
    server.receive_data(bad + raw(Request(1, 1)))
    events = drain(server)
    assert len(events) == 2
    errored = events[0]
    assert isinstance(errored, SubscriptionErrored)
    assert (errored.subscriber, errored.outbound) == (3, False)
    assert "UTF-8" in errored.reason
    assert events[1] == Request(1, 1)
    out = server.data_to_send()
    assert out[:2] == b"\x0a\x03"
    assert decode(out) == [OnError(3, errored.reason)]
    assert server.demand(1) == 3
    # the connection carries on, and id 3 is free
    server.receive_data(raw(Subscribe("good", 3, 1)))
    assert drain(server) == [Subscribe("good", 3, 1)]
    server.send(Subscribed(3))
    server.send(OnNext(3, b"ok"))
    server.send(OnNext(1, b"one"))
    assert decode(server.data_to_send()) == [Subscribed(3), OnNext(3, b"ok"), OnNext(1, b"one")]


def test_invalid_utf8_publisher_between_real_peers() -> None:
    client, server = pair()
    client.data_to_send()
    # the client's own subscribe is replaced on the wire by one with a broken publisher
    client.send(Subscribe("placeholder", 3, 1))
    client.data_to_send()
    server.receive_data(bytes.fromhex("03 01 ff 03 01"))
    errored = drain(server)[0]
    assert isinstance(errored, SubscriptionErrored)
    shuttle(server, client)
    assert drain(client) == [OnError(3, errored.reason)]
    subscribe(client, server, 3, demand=1)


@pytest.mark.parametrize("when", ["first message", "after our goodbye"])
def test_invalid_utf8_subscribe_respects_connection_state(when: str) -> None:
    bad = bytes.fromhex("03 01 ff 03 00")
    if when == "first message":
        server = Connection(Role.SERVER)
        server.initiate()
        server.data_to_send()
        server.receive_data(bad)
        assert_breach(server, mentions="ClientHello")
    else:
        server = server_after_hello()
        server.send(Goodbye("bye"))
        server.data_to_send()
        server.receive_data(bad)
        assert drain(server) == []
        assert server.data_to_send() == b""  # nothing may follow our goodbye


def test_unencodable_text_is_refused_cleanly() -> None:
    client = Connection(Role.CLIENT)
    client.initiate()
    client.data_to_send()
    with pytest.raises(LocalProtocolError):
        client.send(Subscribe("\ud800", 1))
    with pytest.raises(LocalProtocolError):
        client.send(Goodbye("\udfff"))
    assert client.data_to_send() == b""
    assert client.state.value == "open"
    client.send(Subscribe("ok", 1))
    assert client.data_to_send() == raw(Subscribe("ok", 1))


# --------------------------------------------------------------------------- 8. state machine


@dataclass
class ClientSub:
    state: str  # requested | active | cancelled | closed
    outstanding: int  # from the client's view: granted, not yet delivered
    size: int = 0
    next_seq: int = 0
    flush: int = 0  # cancelled: 1 once the cancel reached the server, free after a round trip


@dataclass
class ServerSub:
    subscribed: bool = False
    size: int = 0
    seq: int = 0


def element(seq: int, size: int) -> bytes:
    if size:
        return (seq % (1 << (8 * size))).to_bytes(size, "big")
    return f"#{seq}".encode()


DEMANDS = st.one_of(st.integers(1, 4), st.integers(1, U), st.just(U))


@dataclass
class Model:
    client: dict[int, ClientSub] = field(default_factory=dict)
    server: dict[int, ServerSub] = field(default_factory=dict)


class PairMachine(RuleBasedStateMachine):
    """A well-behaved client subscribing to a well-behaved server; bytes cross at random."""

    def __init__(self) -> None:
        super().__init__()
        self.client = Connection(Role.CLIENT, extensions=[1, 2])
        self.server = Connection(Role.SERVER, extensions=[2, 3])
        self.client.initiate()
        self.server.initiate()
        self.m = Model()
        self.handshakes = 0

    # ----------------------------------------------------------- helpers

    def free_ids(self) -> list[int]:
        """Ids the client may subscribe with: never used, ended, or cancelled after its
        ``subscribed`` arrived (what is still in flight for the old one is then told apart:
        everything before the new ``subscribed``)."""
        return [
            i
            for i in range(4)
            if i not in self.m.client
            or self.m.client[i].state in ("closed", "cancelled-after-subscribed")
        ]

    def open_ids(self) -> list[int]:
        return [i for i, s in self.m.client.items() if s.state in ("requested", "active")]

    def pending_ids(self) -> list[int]:
        return [i for i, s in self.m.server.items() if not s.subscribed]

    def sendable_ids(self) -> list[int]:
        return [i for i, s in self.m.server.items() if s.subscribed and self.server.demand(i)]

    def deliver(self, src: Connection, dst: Connection, cuts: list[int]) -> None:
        data = src.data_to_send()
        points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
        for a, b in itertools.pairwise(points):
            if b > a:
                dst.receive_data(data[a:b])

    def on_client_events(self) -> None:
        for event in drain(self.client):
            assert not isinstance(event, ConnectionClosed | SubscriptionErrored), event
            if isinstance(event, HandshakeCompleted):
                assert event.extensions == frozenset({2})
                self.handshakes += 1
                continue
            assert isinstance(event, Subscribed | OnNext | OnNextPacked | OnComplete | OnError)
            sub = self.m.client[event.subscriber]
            assert sub.state in ("requested", "active"), (event, sub)
            if isinstance(event, Subscribed):
                assert sub.state == "requested"
                sub.state, sub.size = "active", event.element_size
            elif isinstance(event, OnNext | OnNextPacked):
                assert sub.state == "active"
                count = event.count if isinstance(event, OnNextPacked) else 1
                assert count <= sub.outstanding, (event, sub)
                if sub.outstanding < U:
                    sub.outstanding -= count
                for i in range(count):
                    got = event.element(i) if isinstance(event, OnNextPacked) else event.element
                    assert got == element(sub.next_seq, sub.size)
                    sub.next_seq += 1
            else:
                sub.state = "closed"

    def on_server_events(self) -> None:
        for event in drain(self.server):
            assert not isinstance(event, ConnectionClosed | SubscriptionErrored), event
            if isinstance(event, HandshakeCompleted):
                assert event.extensions == frozenset({2})
                self.handshakes += 1
            elif isinstance(event, Subscribe):
                assert event.subscriber not in self.m.server
                self.m.server[event.subscriber] = ServerSub()
            elif isinstance(event, Cancel):
                del self.m.server[event.subscriber]
            else:
                assert isinstance(event, Request), event

    # ----------------------------------------------------------- client actions

    def client_subscribes(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.free_ids()), label="subscribe id")
        initial = data.draw(st.sampled_from([0, 1, 2]) | DEMANDS, label="initialDemand")
        self.client.send(Subscribe(f"s{sid}", sid, initial))
        self.m.client[sid] = ClientSub("requested", initial)

    def client_requests(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.open_ids()), label="request id")
        n = data.draw(DEMANDS, label="n")
        self.client.send(Request(sid, n))
        sub = self.m.client[sid]
        sub.outstanding = min(U, sub.outstanding + n)

    def client_cancels(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.open_ids()), label="cancel id")
        self.client.send(Cancel(sid))
        sub = self.m.client[sid]
        sub.state = "cancelled-after-subscribed" if sub.state == "active" else "cancelled"
        sub.flush = 0

    @precondition(lambda self: bool(self.free_ids() or self.open_ids()))
    @rule(data=st.data(), burst=st.integers(1, 3))
    def client_acts(self, data: st.DataObject, burst: int) -> None:
        for _ in range(burst):
            actions = []
            if self.free_ids():
                actions += [self.client_subscribes] * 2
            if self.open_ids():
                actions += [self.client_requests] * 3 + [self.client_cancels]
            if actions:
                data.draw(st.sampled_from(actions), label="client action")(data)

    # ----------------------------------------------------------- server actions

    def server_subscribed(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.pending_ids()), label="subscribed id")
        size = data.draw(st.sampled_from([0, 1, 2, 4]), label="elementSize")
        self.server.send(Subscribed(sid, size))
        self.m.server[sid] = ServerSub(True, size)

    def server_sends(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.sendable_ids()), label="onNext id")
        sub = self.m.server[sid]
        demand = self.server.demand(sid)
        if sub.size and data.draw(st.booleans(), label="packed"):
            count = min(data.draw(st.integers(1, 5), label="count"), demand)
            body = b"".join(element(sub.seq + i, sub.size) for i in range(count))
            self.server.send(OnNextPacked(sid, count, body))
        else:
            count = 1
            self.server.send(OnNext(sid, element(sub.seq, sub.size)))
        sub.seq += count
        assert self.server.demand(sid) == (U if demand == U else demand - count)

    def server_ends(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.m.server)), label="end id")
        error = data.draw(st.booleans(), label="onError")
        self.server.send(OnError(sid, "bye é") if error else OnComplete(sid))
        del self.m.server[sid]

    @precondition(lambda self: bool(self.m.server))
    @rule(data=st.data(), burst=st.integers(1, 4))
    def server_acts(self, data: st.DataObject, burst: int) -> None:
        for _ in range(burst):
            actions = []
            if self.pending_ids():
                actions += [self.server_subscribed] * 3
            if self.sendable_ids():
                actions += [self.server_sends] * 6
            if self.m.server:
                actions += [self.server_ends]
            if actions:
                data.draw(st.sampled_from(actions), label="server action")(data)

    # ----------------------------------------------------------- forbidden sends

    @rule(
        sid=st.integers(0, 3),
        kind=st.sampled_from(["subscribe", "request", "zero", "cancel", "server"]),
    )
    def forbidden_sends(self, sid: int, kind: str) -> None:
        """Sends the state forbids raise LocalProtocolError and queue nothing."""
        if kind == "server":
            self.server_forbidden(sid)
            return
        is_open = sid in self.open_ids()
        before = self.client.pending
        if kind == "subscribe" and is_open:
            with pytest.raises(LocalProtocolError):
                self.client.send(Subscribe("dup", sid))
        elif kind == "zero" and is_open:
            with pytest.raises(LocalProtocolError):
                self.client.send(Request(sid, 0))
        elif kind in ("request", "cancel") and not is_open:
            with pytest.raises(LocalProtocolError):
                self.client.send(Request(sid, 1) if kind == "request" else Cancel(sid))
        assert self.client.pending == before

    def server_forbidden(self, sid: int) -> None:
        sub = self.m.server.get(sid)
        before = self.server.pending
        if sub is None:
            for message in (Subscribed(sid), OnNext(sid, b"x"), OnComplete(sid)):
                with pytest.raises(LocalProtocolError):
                    self.server.send(message)
        elif not sub.subscribed:
            with pytest.raises(LocalProtocolError):
                self.server.send(OnNext(sid, b"x"))
        elif self.server.demand(sid) == 0:
            with pytest.raises(LocalProtocolError):
                self.server.send(OnNext(sid, element(sub.seq, sub.size)))
        else:
            with pytest.raises(LocalProtocolError):
                self.server.send(Subscribed(sid))
        assert self.server.pending == before

    # ----------------------------------------------------------- the wire

    @rule(
        way=st.sampled_from(["to server", "to client", "round trip"]),
        cuts=st.lists(st.integers(0, 10_000), max_size=3),
    )
    def wire(self, way: str, cuts: list[int]) -> None:
        """Deliver what is queued, cut at random points; one way at a time, messages cross."""
        if way != "to client":
            self.client_to_server(cuts)
        if way != "to server":
            self.server_to_client(cuts)

    def client_to_server(self, cuts: list[int]) -> None:
        self.deliver(self.client, self.server, cuts)
        self.on_server_events()
        for sub in self.m.client.values():
            if sub.state.startswith("cancelled") and sub.flush == 0:
                sub.flush = 1  # the server has seen the cancel

    def server_to_client(self, cuts: list[int]) -> None:
        self.deliver(self.server, self.client, cuts)
        self.on_client_events()
        for sub in self.m.client.values():
            # Nothing of the old subscription can still arrive. An id cancelled before its
            # subscribed arrived stays taken (the connection's decision: which subscribed would
            # answer which is unknowable), so only the confirmed ones are freed here.
            if sub.state == "cancelled-after-subscribed" and sub.flush == 1:
                sub.state = "closed"

    # ----------------------------------------------------------- invariants

    @invariant()
    def still_open(self) -> None:
        assert not self.client.closed
        assert not self.server.closed
        assert self.client.state.value == self.server.state.value == "open"

    @invariant()
    def server_demand_never_exceeds_the_clients_view(self) -> None:
        for sid, sub in self.m.client.items():
            if sub.state == "active" and sid in self.m.server and self.m.server[sid].subscribed:
                assert self.server.demand(sid) <= sub.outstanding

    def teardown(self) -> None:
        # drain everything both ways, then close in order
        for _ in range(2):
            self.client_to_server([])
            self.server_to_client([])
        assert self.handshakes == 2
        self.client.send(Goodbye("done"))
        self.client_to_server_closing()

    def client_to_server_closing(self) -> None:
        shuttle(self.client, self.server)
        events = drain(self.server)
        assert events[-1] == ConnectionClosed("done", by_peer=True, error=False)
        shuttle(self.server, self.client)
        events = drain(self.client)
        assert events == [ConnectionClosed("goodbye acknowledged", by_peer=False, error=False)]


def test_pair_state_machine() -> None:
    run_state_machine_as_test(
        PairMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# --------------------------------------------------------------------------- the table, the buffer


@pytest.mark.parametrize(("side", "kind"), list(TRANSITIONS))
def test_every_message_missing_from_the_table_is_a_breach_of_its_sender(
    side: Side, kind: Kind
) -> None:
    """Whoever sends ``kind`` on ``side``: an illegal one is a LocalProtocolError when it is
    us, a RemoteProtocolError when it is the peer, and changes nothing."""
    legal = TRANSITIONS[(side, kind)]
    ours = (kind in SENT_BY_SUBSCRIBER) == (side is Side.SUBSCRIBER)
    for state in SubState:
        table = Subscriptions(side)
        if state is not SubState.FREE:
            table.subs[7] = Subscription(state, demand=1)
        if state in legal:
            after, _ = legal[state]
            sub, _ = table.apply(kind, 7, "m", initial_demand=1)
            assert table.state(7) is after
            assert (sub is None) == (after is SubState.FREE)
            continue
        error = LocalProtocolError if ours else RemoteProtocolError
        with pytest.raises(error):
            table.apply(kind, 7, "m")
        assert table.state(7) is state


def test_buffered_is_the_partial_frame_left_after_decoding() -> None:
    """Decoding consumes whole frames from the shared receive buffer; what is left is the
    frame cut short, whose bytes a later call completes."""
    client = client_subscribed(demand=10)
    frames = raw(OnNext(1, b"abc"), OnNext(1, b"defg"))
    client.receive_data(frames[:-2])
    assert drain(client) == [OnNext(1, b"abc")]
    assert client.buffered == len(raw(OnNext(1, b"defg"))) - 2
    client.receive_data(frames[-2:])
    assert drain(client) == [OnNext(1, b"defg")]
    assert client.buffered == 0


@pytest.mark.parametrize("publisher", ["s", "s?format=value", "s?size=3", "s?format=records"])
@pytest.mark.parametrize("value_size", [3, BIG_ELEMENT])
def test_send_batch_encodes_as_the_subscription_asks(publisher: str, value_size: int) -> None:
    """``send_batch`` gives the frames of the format ``publisher`` names: what the elements
    sent one ``OnNext`` at a time give (records: one element, the batch's log record)."""
    name = PublisherName.parse(publisher)
    if name.size and value_size != name.size:
        return
    batch = Batch.build("s", [bytes([i]) * value_size for i in range(4)], ids=[5, 6, 7, 9],
                        timestamps=1_700_000_000_000)  # fmt: skip
    client, server = pair()
    subscribe(client, server, 1, demand=10, size=name.size)
    server.send_batch(1, batch, name)
    assert server.demand(1) == (9 if name.format == "records" else 6)
    if name.size:
        elements = [bytes(batch.values)]
        expected = raw(OnNextPacked(1, 4, elements[0]), element_size=name.size)
    else:
        if name.format == "records":
            elements = [bytes(encode_record(batch).data)]
        elif name.format == "value":
            elements = [batch.value(i) for i in range(4)]
        else:
            elements = encode_envelopes(batch)
        expected = raw(*(OnNext(1, e) for e in elements))
    chunks = server.chunks_to_send()
    assert b"".join(chunks) == expected
    assert server.pending == 0
    if value_size >= BIG_ELEMENT and name.format == "envelope":  # big values: not copied
        assert any(isinstance(c, memoryview) for c in chunks)
