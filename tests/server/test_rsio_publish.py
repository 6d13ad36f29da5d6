"""RS.io publishing extension (extension 1: ``offer``, ``committed``, ``offerEnded``).

Part 1 is sans-IO: a CLIENT and a SERVER :class:`Connection` that both list extension 1, paired
in memory by shuttling ``data_to_send()`` into ``receive_data()`` (raw frames stand in for a
misbehaving peer); it pins the bytes of one whole offer, the rules each side enforces, and a
Hypothesis state machine of a publisher and a hub whose messages cross at random moments.

Part 2 runs the hub's listener and the asyncio client over real sockets on 127.0.0.1, under the
default loop and uvloop: what is published (values, batches with keys, explicit ids, value and
packed formats) reads back identically, receipts match what subscribers see, and failures
(refused offers, ids not above the latest, a hub shutting down) surface as errors, not hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import tidewire
from helpers import hub_server
from tidewire.client.rsio import Receipt, RsioClient, RsioError
from tidewire.hub import Hub
from tidewire.model import (
    Batch,
    InvalidStreamName,
    LocalProtocolError,
    TidewireError,
    now_ms,
)
from tidewire.model import Event as Stored
from tidewire.protocols.rsio import (
    EXT_PUBLISH,
    Cancel,
    ClientHello,
    Committed,
    Connection,
    ConnectionClosed,
    Decoder,
    Goodbye,
    HandshakeCompleted,
    Message,
    Offer,
    OfferEnded,
    OfferRefused,
    OnComplete,
    OnNext,
    OnNextDecoded,
    OnNextPacked,
    Request,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    encode,
)
from tidewire.protocols.rsio import Event as RsioEvent
from tidewire.protocols.rsio.codec import OnNextRun
from tidewire.protocols.rsio.envelopes import encode_envelopes
from tidewire.server.rsio import OFFER_WINDOW, RsioSettings, start_rsio_server

PUBLISHING = frozenset({EXT_PUBLISH})


# =========================================================================== 1. sans-IO


def h(text: str) -> bytes:
    return bytes.fromhex(text)


def raw(*messages: Message, element_size: int = 0) -> bytes:
    """The frames of ``messages``, as a (possibly misbehaving) peer would send them."""
    out = bytearray()
    for message in messages:
        encode(message, element_size, out)
    return bytes(out)


def drain(conn: Connection) -> list[RsioEvent]:
    events: list[RsioEvent] = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    return events


def move(src: Connection, dst: Connection) -> bytes:
    """Deliver everything ``src`` queued to ``dst`` and return those bytes."""
    data = src.data_to_send()
    if data:
        dst.receive_data(data)
    return data


def decode(data: bytes) -> list[Message]:
    decoder = Decoder(publishing=True)
    decoder.feed(data)
    messages: list[Message] = []
    while (message := decoder.next_message()) is not None:
        assert not isinstance(message, OnNextRun | OnNextDecoded)  # runs only when asked for
        messages.append(message)
    assert decoder.buffered == 0
    return messages


def pub_pair(
    client_extensions: tuple[int, ...] = (EXT_PUBLISH,),
    hub_extensions: tuple[int, ...] = (EXT_PUBLISH,),
) -> tuple[Connection, Connection]:
    """A client and a hub, hellos exchanged and their events drained."""
    client = Connection(Role.CLIENT, extensions=client_extensions)
    hub = Connection(Role.SERVER, extensions=hub_extensions)
    client.initiate()
    hub.initiate()
    move(client, hub)
    move(hub, client)
    negotiated = frozenset(client_extensions) & frozenset(hub_extensions)
    assert drain(client) == [HandshakeCompleted(0, negotiated)]
    assert drain(hub) == [HandshakeCompleted(0, negotiated)]
    return client, hub


def offer_taken_up(demand: int, offer: int = 1) -> tuple[Connection, Connection]:
    """A pair where the client offered ``offer``, the hub subscribed to it with ``demand`` and
    the client answered ``subscribed`` (everything delivered and drained)."""
    client, hub = pub_pair()
    client.send(Offer(offer, "s"))
    move(client, hub)
    assert drain(hub) == [Offer(offer, "s")]
    hub.send(Subscribe("s", offer, demand))
    move(hub, client)
    assert drain(client) == [Subscribe("s", offer, demand)]
    client.send(Subscribed(offer, 0))
    move(client, hub)
    assert drain(hub) == [Subscribed(offer, 0)]
    return client, hub


def assert_breached(conn: Connection, events: list[RsioEvent], why: str) -> None:
    """``conn`` answered a peer's breach: goodbye("protocol error: ...") and closed."""
    assert events, "expected a ConnectionClosed event"
    last = events[-1]
    assert isinstance(last, ConnectionClosed), events
    assert last.error
    assert not last.by_peer
    assert why in last.reason, last.reason
    assert conn.closed
    (goodbye,) = decode(conn.data_to_send())
    assert isinstance(goodbye, Goodbye)
    assert goodbye.reason == f"protocol error: {last.reason}"


def test_offer_flow_exact_bytes() -> None:
    """offer -> subscribe -> subscribed -> 1000 onNext -> committed + request -> onComplete ->
    offerEnded(""), byte for byte; the offer id is free again at the end."""
    client, hub = pub_pair()
    assert client.publishing
    assert hub.publishing

    client.send(Offer(3, "orders"))
    assert move(client, hub) == h("40 03 06 6f 72 64 65 72 73")
    assert drain(hub) == [Offer(3, "orders")]
    assert not client.can_offer(3)

    hub.send(Subscribe("orders", 3, 1000))
    assert move(hub, client) == h("03 06 6f 72 64 65 72 73 03 e8 07")
    assert drain(client) == [Subscribe("orders", 3, 1000)]
    assert client.demand(3) == 1000

    client.send(Subscribed(3, 0))
    assert move(client, hub) == h("06 03 00")
    assert drain(hub) == [Subscribed(3, 0)]

    elements = [b"v%d" % i for i in range(1000)]
    client.send(OnNext(3, elements[0]))
    assert client.data_to_send() == h("07 03 02 76 30")  # onNext(3, "v0")
    client.send_elements(3, elements[1:999])
    client.send(OnNext(3, elements[999]))
    assert client.demand(3) == 0
    assert client.offer_delivered(3) == 1000
    with pytest.raises(LocalProtocolError, match="exceed its demand"):
        client.send(OnNext(3, b"one too many"))
    hub.receive_data(raw(OnNext(3, elements[0])))  # the frame taken off the wire above
    move(client, hub)
    received = drain(hub)
    assert received == [OnNext(3, e) for e in elements]
    assert hub.offer_delivered(3) == 1000

    hub.send(Committed(3, 1000, 1, 1000))
    hub.send(Request(3, 1000))
    assert move(hub, client) == h("41 03 e8 07 01 e8 07") + h("04 03 e8 07")
    assert drain(client) == [Committed(3, 1000, 1, 1000), Request(3, 1000)]
    assert client.demand(3) == 1000

    client.send(OnComplete(3))
    assert move(client, hub) == h("09 03")
    assert drain(hub) == [OnComplete(3)]
    assert not hub.is_subscribed(3)

    hub.send(OfferEnded(3, ""))
    assert move(hub, client) == h("42 03 00")
    assert drain(client) == [OfferEnded(3, "")]
    assert client.can_offer(3)
    assert client.offer_delivered(3) == hub.offer_delivered(3) == 0

    # the id is free on both sides: a second offer with it runs from scratch
    client.send(Offer(3, "orders?format=value"))
    move(client, hub)
    assert drain(hub) == [Offer(3, "orders?format=value")]
    hub.send(Subscribe("orders?format=value", 3, 2))
    move(hub, client)
    assert drain(client) == [Subscribe("orders?format=value", 3, 2)]
    client.send(Subscribed(3, 4))
    client.send(OnNextPacked(3, 2, b"aaaabbbb"))
    assert move(client, hub) == h("06 03 04") + h("08 03 02 61 61 61 61 62 62 62 62")
    assert drain(hub) == [Subscribed(3, 4), OnNextPacked(3, 2, b"aaaabbbb")]
    hub.send(Committed(3, 2, 1001, 1002))
    move(hub, client)
    assert drain(client) == [Committed(3, 2, 1001, 1002)]
    assert not client.closed
    assert not hub.closed


def test_documented_value_offer_bytes() -> None:
    """docs/protocols/rsio.md's example: a value-format offer of "a", "b" into "t", stored by the
    hub as ids 7 and 8, with both hellos listing extension 1."""
    client = Connection(Role.CLIENT, extensions=(EXT_PUBLISH,))
    hub = Connection(Role.SERVER, extensions=(EXT_PUBLISH,))
    client.initiate()
    hub.initiate()
    assert move(client, hub) == h("00 00 01 01")
    assert move(hub, client) == h("01 00 01 01")
    assert drain(client) == drain(hub) == [HandshakeCompleted(0, PUBLISHING)]
    steps: list[tuple[Connection, Connection, Message, str]] = [
        (client, hub, Offer(1, "t?format=value"),
         "40 01 0e 74 3f 66 6f 72 6d 61 74 3d 76 61 6c 75 65"),
        (hub, client, Subscribe("t?format=value", 1, 8192),
         "03 0e 74 3f 66 6f 72 6d 61 74 3d 76 61 6c 75 65 01 80 40"),
        (client, hub, Subscribed(1, 0), "06 01 00"),
        (client, hub, OnNext(1, b"a"), "07 01 01 61"),
        (client, hub, OnNext(1, b"b"), "07 01 01 62"),
        (hub, client, Committed(1, 2, 7, 8), "41 01 02 07 08"),
        (hub, client, Request(1, 2), "04 01 02"),
        (client, hub, OnComplete(1), "09 01"),
        (hub, client, OfferEnded(1, ""), "42 01 00"),
    ]  # fmt: skip
    for sender, receiver, message, frame in steps:
        sender.send(message)
        assert move(sender, receiver) == h(frame), message
        assert drain(receiver) == [message]
    assert client.can_offer(1)
    assert not client.closed
    assert not hub.closed


def test_offer_needs_both_hellos_to_list_the_extension() -> None:
    client = Connection(Role.CLIENT, extensions=(EXT_PUBLISH,))
    with pytest.raises(LocalProtocolError, match="hello first"):
        client.send(Offer(1, "s"))
    client.initiate()
    assert not client.publishing  # the peer's hello has not arrived
    with pytest.raises(LocalProtocolError, match="publishing extension"):
        client.send(Offer(1, "s"))
    assert client.can_offer(1)

    for client_ext, hub_ext in (((EXT_PUBLISH,), ()), ((), (EXT_PUBLISH,)), ((2,), (2,))):
        client, hub = pub_pair(client_ext, hub_ext)
        assert not client.publishing
        assert not hub.publishing
        before = client.pending
        with pytest.raises(LocalProtocolError, match="publishing extension"):
            client.send(Offer(1, "s"))
        assert client.pending == before
        assert client.can_offer(1)  # the refused send left no trace
        hub.send(Subscribe("s", 1, 1))  # the base protocol still works
        move(hub, client)
        assert drain(client) == [Subscribe("s", 1, 1)]
        client.send(Subscribed(1, 0))
        client.send(OnNext(1, b"x"))
        move(client, hub)
        assert drain(hub) == [Subscribed(1, 0), OnNext(1, b"x")]
        for message in (Committed(1, 1, 1, 1), OfferEnded(1, "")):
            with pytest.raises(LocalProtocolError, match="publishing extension"):
                hub.send(message)


def test_hub_without_the_extension_does_not_decode_offer() -> None:
    """Types 64-66 are unknown to a hub that did not list extension 1: a breach."""
    hub = Connection(Role.SERVER)
    hub.initiate()
    hub.data_to_send()
    hub.receive_data(raw(ClientHello(0, (EXT_PUBLISH,))) + h("40 01 01 73"))
    events = drain(hub)
    assert events[0] == HandshakeCompleted(0, frozenset())
    assert_breached(hub, events, "unknown message type 64")


def test_each_message_is_sent_by_its_own_side_only() -> None:
    client, hub = pub_pair()
    with pytest.raises(LocalProtocolError, match="only the client sends Offer"):
        hub.send(Offer(1, "s"))
    client.send(Offer(1, "s"))
    move(client, hub)
    drain(hub)
    for message in (Committed(1, 1, 1, 1), OfferEnded(1, "")):
        with pytest.raises(LocalProtocolError, match="only the server sends"):
            client.send(message)
    assert hub.pending == client.pending == 0


def test_hub_never_commits_more_than_was_delivered() -> None:
    client, hub = offer_taken_up(demand=5)
    with pytest.raises(LocalProtocolError, match="more than was delivered"):
        hub.send(Committed(1, 1, 1, 1))  # nothing delivered yet
    client.send_elements(1, [b"a", b"b"])
    move(client, hub)
    assert len(drain(hub)) == 2
    assert hub.offer_delivered(1) == 2
    with pytest.raises(LocalProtocolError, match="more than was delivered"):
        hub.send(Committed(1, 3, 1, 3))
    assert hub.pending == 0  # refused sends queue nothing and change nothing
    hub.send(Committed(1, 1, 1, 1))
    with pytest.raises(LocalProtocolError, match="more than was delivered"):
        hub.send(Committed(1, 2, 2, 3))  # cumulative: 1 + 2 > 2
    hub.send(Committed(1, 1, 2, 2))
    with pytest.raises(LocalProtocolError, match="offer not open"):
        hub.send(Committed(7, 1, 3, 3))
    move(hub, client)
    assert drain(client) == [Committed(1, 1, 1, 1), Committed(1, 1, 2, 2)]
    assert not client.closed


def test_hub_cannot_end_an_offer_while_its_subscription_is_open() -> None:
    client, hub = pub_pair()
    client.send(Offer(1, "s"))
    move(client, hub)
    drain(hub)
    hub.send(Subscribe("s", 1, 4))  # subscription requested, not yet answered
    with pytest.raises(LocalProtocolError, match="while its subscription is open"):
        hub.send(OfferEnded(1, "no"))
    move(hub, client)
    assert drain(client) == [Subscribe("s", 1, 4)]
    client.send(Subscribed(1, 0))
    client.send(OnNext(1, b"x"))
    move(client, hub)
    assert drain(hub) == [Subscribed(1, 0), OnNext(1, b"x")]
    with pytest.raises(LocalProtocolError, match="while its subscription is open"):
        hub.send(OfferEnded(1, "no"))  # active now
    with pytest.raises(LocalProtocolError, match="offer not open"):
        hub.send(OfferEnded(2, "no"))
    assert hub.pending == 0
    # failure path: cancel, then offerEnded(reason)
    hub.send(Cancel(1))
    hub.send(OfferEnded(1, "disk full"))
    assert move(hub, client) == h("05 01") + h("42 01 09") + b"disk full"
    assert drain(client) == [Cancel(1), OfferEnded(1, "disk full")]
    assert client.can_offer(1)
    with pytest.raises(LocalProtocolError):
        client.send(OnNext(1, b"late"))
    # an element that crossed the cancel is dropped quietly by the hub
    hub.receive_data(raw(OnNext(1, b"crossed")))
    assert drain(hub) == []
    # the id is usable again
    client.send(Offer(1, "s"))
    move(client, hub)
    assert drain(hub) == [Offer(1, "s")]
    hub.send(Subscribe("s", 1, 1))
    move(hub, client)
    assert drain(client) == [Subscribe("s", 1, 1)]
    assert not hub.closed
    assert not client.closed


def test_refused_offer_frees_the_id_on_both_sides() -> None:
    client, hub = pub_pair()
    client.send(Offer(2, "bad name"))
    move(client, hub)
    assert drain(hub) == [Offer(2, "bad name")]
    hub.send(OfferEnded(2, "bad stream"))
    move(hub, client)
    assert drain(client) == [OfferEnded(2, "bad stream")]
    assert client.can_offer(2)
    assert client.free_offer_id() == 1
    client.send(Offer(2, "good"))
    move(client, hub)
    assert drain(hub) == [Offer(2, "good")]


def test_offer_reusing_an_open_id() -> None:
    client, hub = pub_pair()
    client.send(Offer(1, "a"))
    with pytest.raises(LocalProtocolError, match="offer id 1 is in use"):
        client.send(Offer(1, "b"))
    assert client.free_offer_id() == 2
    move(client, hub)
    assert drain(hub) == [Offer(1, "a")]
    hub.receive_data(raw(Offer(1, "b")))  # a misbehaving client
    assert_breached(hub, drain(hub), "offer reuses open offer id 1")


def test_offer_id_taken_by_the_hubs_subscription_is_not_offered() -> None:
    """An id the hub subscribes with (outside any offer) is not free for an offer."""
    client, hub = pub_pair()
    hub.send(Subscribe("plain", 1, 1))
    move(hub, client)
    assert drain(client) == [Subscribe("plain", 1, 1)]
    assert not client.can_offer(1)
    assert client.free_offer_id() == 2
    with pytest.raises(LocalProtocolError, match="in use"):
        client.send(Offer(1, "s"))


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        (raw(Committed(1, 3, 1, 3)), "committed 3 elements of offer 1, but only 2 were delivered"),
        (raw(Committed(1, 2, 1, 2), Committed(1, 1, 3, 3)), "committed 3 elements of offer 1"),
        (raw(Committed(9, 1, 1, 1)), "committed for offer 9, which is not open"),
        (raw(OfferEnded(9, "")), "offerEnded for offer 9, which is not open"),
        (raw(OfferEnded(1, "")), "while the hub's subscription to it is open"),
        (raw(Offer(2, "x")), "offer sent to the client"),
        (h("41 01 00 01 01"), "committed needs count >= 1"),
        (h("41 01 02 05 05"), "2 ids cannot fit 5..5"),
        (h("42 01 02 ff fe"), "not valid UTF-8"),
    ],
    ids=[
        "committed-beyond-delivered",
        "committed-beyond-delivered-cumulative",
        "committed-unknown-offer",
        "offerEnded-unknown-offer",
        "offerEnded-subscription-open",
        "offer-to-client",
        "committed-count-0",
        "committed-ids-too-few",
        "offerEnded-bad-utf8",
    ],
)
def test_client_breaches(frames: bytes, why: str) -> None:
    client, hub = offer_taken_up(demand=5)
    client.send_elements(1, [b"a", b"b"])
    move(client, hub)
    client.receive_data(frames)
    events = drain(client)
    assert_breached(client, events, why)
    assert all(isinstance(e, Committed) for e in events[:-1])
    with pytest.raises(LocalProtocolError):
        client.send(OnNext(1, b"c"))
    client.receive_data(raw(Committed(1, 1, 1, 1)))  # ignored after the breach
    assert drain(client) == []


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        (raw(Committed(1, 1, 1, 1)), "committed for offer 1, which is not open"),
        (raw(OfferEnded(1, "")), "offerEnded for offer 1, which is not open"),
    ],
    ids=["committed-to-hub", "offerEnded-to-hub"],
)
def test_hub_breaches(frames: bytes, why: str) -> None:
    _client, hub = offer_taken_up(demand=5)
    hub.receive_data(frames)
    assert_breached(hub, drain(hub), why)


def test_invalid_utf8_publisher_refuses_that_offer_only() -> None:
    client, hub = pub_pair()
    client.send(Offer(5, "ab"))
    client.send(Offer(6, "ok"))
    wire = client.data_to_send()
    assert wire[:5] == h("40 05 02 61 62")
    hub.receive_data(wire[:3] + h("ff fe") + wire[5:])  # offer 5's publisher: invalid UTF-8
    events = drain(hub)
    assert len(events) == 2
    refused = events[0]
    assert isinstance(refused, OfferRefused)
    assert refused.offer == 5
    assert "not valid UTF-8" in refused.reason
    assert events[1] == Offer(6, "ok")
    assert not hub.closed
    answer = hub.data_to_send()
    assert decode(answer) == [OfferEnded(5, refused.reason)]
    client.receive_data(answer)
    assert drain(client) == [OfferEnded(5, refused.reason)]
    assert client.can_offer(5)
    assert not client.can_offer(6)
    hub.send(Subscribe("ok", 6, 1))  # offer 6 goes on as usual
    move(hub, client)
    assert drain(client) == [Subscribe("ok", 6, 1)]
    # the same breach on an id that is open is one too many: connection-level
    hub.receive_data(h("40 06 01 ff"))
    assert_breached(hub, drain(hub), "offer 6")


def test_hub_refuses_committing_elements_it_sent_itself() -> None:
    client, hub = pub_pair()
    client.send(Subscribe("in", 1, 5))
    client.send(Offer(1, "out"))
    move(client, hub)
    drain(hub)
    hub.send(Subscribed(1, 0))
    hub.send(Subscribe("out", 1, 10))
    hub.send_elements(1, [b"in1", b"in2", b"in3"])  # on the client's subscription 1
    assert hub.offer_delivered(1) == 0
    with pytest.raises(LocalProtocolError, match="more than was delivered"):
        hub.send(Committed(1, 3, 1, 3))


def test_client_breaches_on_committed_for_elements_it_only_received() -> None:
    client = Connection(Role.CLIENT, extensions=(EXT_PUBLISH,))
    client.initiate()
    client.send(Subscribe("in", 1, 5))
    client.data_to_send()
    client.receive_data(raw(ServerHello(0, (EXT_PUBLISH,))))
    drain(client)
    client.send(Offer(1, "out"))
    client.data_to_send()
    client.receive_data(raw(Subscribed(1, 0), Subscribe("out", 1, 10), *[OnNext(1, b"in")] * 3))
    assert len(drain(client)) == 5
    assert client.offer_delivered(1) == 0
    client.receive_data(raw(Committed(1, 3, 1, 3)))  # nothing was published on offer 1
    assert_breached(client, drain(client), "only 0 were delivered")


# --------------------------------------------------------------------------- state machine


@dataclass
class ClientOffer:
    state: str = "offered"  # offered | active | completed | cancelled
    delivered: int = 0
    committed: int = 0


@dataclass
class HubOffer:
    state: str = "new"  # new | subscribed | active | complete
    received: int = 0
    committed: int = 0


def payload(offer: int, seq: int) -> bytes:
    return b"%d:%d" % (offer, seq)


OFFER_IDS = (1, 2, 3)


class PublishMachine(RuleBasedStateMachine):
    """A well-behaved publisher (client) and hub: the client offers, sends within demand and
    completes; the hub subscribes or refuses, commits what it received (or tries to commit
    more), fails offers; the bytes cross at random, cut at random points."""

    def __init__(self) -> None:
        super().__init__()
        self.client = Connection(Role.CLIENT, extensions=(EXT_PUBLISH,))
        self.hub = Connection(Role.SERVER, extensions=(EXT_PUBLISH,), runs=True)
        self.client.initiate()
        self.hub.initiate()
        self.c: dict[int, ClientOffer] = {}
        self.h: dict[int, HubOffer] = {}
        self.next_id = 1  # the hub's next id (one stream for every offer)
        self.last_seen_id = 0  # the client's view of it
        self.handshakes = 0
        self.ended_ok: list[int] = []  # delivered counts of offers ended with ""

    @initialize(hellos=st.sampled_from(["both", "client's", "hub's", "none"]))
    def hellos(self, hellos: str) -> None:
        """Deliver none, one or both hellos up front (the rest travels with the wire rule)."""
        if hellos in ("both", "client's"):
            self.wire("to hub", [])
        if hellos in ("both", "hub's"):
            self.wire("to client", [])

    # ----------------------------------------------------------- client

    def active(self) -> list[int]:
        return sorted(o for o, s in self.c.items() if s.state == "active")

    @precondition(lambda self: self.client.publishing)
    @rule(data=st.data(), burst=st.integers(1, 4))
    def client_acts(self, data: st.DataObject, burst: int) -> None:
        """A few client actions in a row: offers (sometimes with an id still open), elements
        (within demand, or one too many), now and then onComplete."""
        for _ in range(burst):
            actions: list[Callable[[st.DataObject], None]] = [self.client_offers]
            if self.active():
                actions += [self.client_sends] * 4 + [self.client_completes]
            data.draw(st.sampled_from(actions), label="client action")(data)

    def client_offers(self, data: st.DataObject) -> None:
        offer = data.draw(st.sampled_from(OFFER_IDS), label="offer id")
        assert self.client.can_offer(offer) == (offer not in self.c)
        if offer in self.c:
            before = self.client.pending
            with pytest.raises(LocalProtocolError, match="in use"):
                self.client.send(Offer(offer, f"s{offer}"))
            assert self.client.pending == before
            return
        self.client.send(Offer(offer, f"s{offer}"))
        self.c[offer] = ClientOffer()

    def client_sends(self, data: st.DataObject) -> None:
        offer = data.draw(st.sampled_from(self.active()), label="send on")
        demand = self.client.demand(offer)
        n = data.draw(st.integers(1, min(demand, 5) + 1), label="n")
        state = self.c[offer]
        elements = [payload(offer, state.delivered + i) for i in range(n)]
        bulk = data.draw(st.booleans(), label="bulk")
        if n > demand:
            if bulk:  # refused as a whole: nothing goes out
                before = self.client.pending
                with pytest.raises(LocalProtocolError, match="exceed its demand"):
                    self.client.send_elements(offer, elements)
                assert self.client.pending == before
                return
            for element in elements[:demand]:
                self.client.send(OnNext(offer, element))
            state.delivered += demand
            with pytest.raises(LocalProtocolError, match="exceed its demand"):
                self.client.send(OnNext(offer, elements[demand]))
            return
        if bulk:
            self.client.send_elements(offer, elements)
        else:
            for element in elements:
                self.client.send(OnNext(offer, element))
        state.delivered += n

    def client_completes(self, data: st.DataObject) -> None:
        offer = data.draw(st.sampled_from(self.active()), label="complete")
        self.client.send(OnComplete(offer))
        self.c[offer].state = "completed"

    # ----------------------------------------------------------- hub

    def hub_offers(self, *states: str) -> list[int]:
        return sorted(o for o, s in self.h.items() if s.state in states)

    @precondition(lambda self: bool(self.h))
    @rule(data=st.data(), burst=st.integers(1, 4))
    def hub_acts(self, data: st.DataObject, burst: int) -> None:
        """A few hub actions in a row: answer offers (subscribe, now and then refuse), request,
        commit what it received (or try to commit more), fail an offer, end a completed one."""
        for _ in range(burst):
            actions: list[Callable[[st.DataObject], None]] = []
            if self.hub_offers("new"):
                actions += [self.hub_answers] * 3
            if self.hub_offers("subscribed", "active"):
                actions += [self.hub_requests]
            if self.h:
                actions += [self.hub_commits] * 4 + [self.hub_fails]
            if self.hub_offers("complete"):
                actions += [self.hub_ends] * 3
            if actions:
                data.draw(st.sampled_from(actions), label="hub action")(data)

    def hub_answers(self, data: st.DataObject) -> None:
        offer = data.draw(st.sampled_from(self.hub_offers("new")), label="answer")
        if data.draw(st.integers(0, 4), label="refuse?") == 0:
            self.hub.send(OfferEnded(offer, "refused"))
            del self.h[offer]
        else:
            demand = data.draw(st.integers(0, 6), label="initialDemand")
            self.hub.send(Subscribe(f"s{offer}", offer, demand))
            self.h[offer].state = "subscribed"

    def hub_requests(self, data: st.DataObject) -> None:
        offer = data.draw(st.sampled_from(self.hub_offers("subscribed", "active")), label="req")
        self.hub.send(Request(offer, data.draw(st.integers(1, 6), label="n")))

    def hub_commits(self, data: st.DataObject) -> None:
        offer = data.draw(st.sampled_from(sorted(self.h)), label="commit")
        state = self.h[offer]
        uncommitted = state.received - state.committed
        count = data.draw(st.integers(1, uncommitted + 2), label="count")
        first, last = self.next_id, self.next_id + count - 1
        if count > uncommitted:
            before = self.hub.pending
            with pytest.raises(LocalProtocolError, match="more than was delivered"):
                self.hub.send(Committed(offer, count, first, last))
            assert self.hub.pending == before
            return
        self.hub.send(Committed(offer, count, first, last))
        state.committed += count
        self.next_id = last + 1
        if self.hub.is_subscribed(offer) and data.draw(st.booleans(), label="request"):
            self.hub.send(Request(offer, count))  # as the hub does: as many as it stored

    def hub_fails(self, data: st.DataObject) -> None:
        offer = data.draw(st.sampled_from(sorted(self.h)), label="fail")
        if self.hub.is_subscribed(offer):
            with pytest.raises(LocalProtocolError, match="while its subscription is open"):
                self.hub.send(OfferEnded(offer, "disk full"))
            self.hub.send(Cancel(offer))
        self.hub.send(OfferEnded(offer, "disk full"))
        del self.h[offer]

    def hub_ends(self, data: st.DataObject) -> None:
        self.end(data.draw(st.sampled_from(self.hub_offers("complete")), label="end"))

    def end(self, offer: int) -> None:
        """The client completed: commit the rest, then offerEnded("")."""
        state = self.h.pop(offer)
        rest = state.received - state.committed
        if rest:
            self.hub.send(Committed(offer, rest, self.next_id, self.next_id + rest - 1))
            self.next_id += rest
        self.hub.send(OfferEnded(offer, ""))

    # ----------------------------------------------------------- the wire

    @rule(
        way=st.sampled_from(["to hub", "to client", "round trip"]),
        cuts=st.lists(st.integers(0, 10_000), max_size=3),
        react=st.booleans(),
    )
    def wire(self, way: str, cuts: list[int], react: bool = False) -> None:
        """Deliver what is queued, cut at random points; with ``react`` the hub then answers
        as the real one does: new offers get a subscribe, completed ones are ended."""
        if way != "to client":
            self.deliver(self.client, self.hub, cuts, self.on_hub_event)
            if react:
                for offer in self.hub_offers("new"):
                    self.hub.send(Subscribe(f"s{offer}", offer, 4))
                    self.h[offer].state = "subscribed"
                for offer in self.hub_offers("complete"):
                    self.end(offer)
        if way != "to hub":
            self.deliver(self.hub, self.client, cuts, self.on_client_event)

    def deliver(
        self,
        src: Connection,
        dst: Connection,
        cuts: list[int],
        handle: Callable[[RsioEvent], None],
    ) -> None:
        data = src.data_to_send()
        points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
        for a, b in itertools.pairwise(points):
            if b > a:
                dst.receive_data(data[a:b])
                # one event at a time, answering as we go (as the client and server do)
                while (event := dst.next_event()) is not None:
                    handle(event)

    def on_client_event(self, event: RsioEvent) -> None:
        match event:
            case HandshakeCompleted(_, extensions):
                assert extensions == PUBLISHING
                self.handshakes += 1
            case Subscribe(_, offer, _):
                state = self.c[offer]
                assert state.state == "offered"
                self.client.send(Subscribed(offer, 0))  # take it up at once, as the client does
                state.state = "active"
            case Request(offer, _):
                assert self.c[offer].state in ("active", "completed")
            case Cancel(offer):
                assert self.c[offer].state in ("active", "completed")
                self.c[offer].state = "cancelled"
            case Committed(offer, count, first, last):
                state = self.c[offer]
                state.committed += count
                assert state.committed <= state.delivered
                assert (first, last) == (self.last_seen_id + 1, self.last_seen_id + count)
                self.last_seen_id = last
            case OfferEnded(offer, error):
                state = self.c.pop(offer)
                assert state.committed <= state.delivered
                if error == "":
                    assert state.state == "completed"
                    assert state.committed == state.delivered  # everything is durable
                    self.ended_ok.append(state.delivered)
            case _:
                raise AssertionError(f"unexpected event at the client: {event!r}")

    def on_hub_event(self, event: RsioEvent) -> None:
        match event:
            case HandshakeCompleted(_, extensions):
                assert extensions == PUBLISHING
                self.handshakes += 1
            case Offer(offer, publisher):
                assert offer not in self.h
                assert publisher == f"s{offer}"
                self.h[offer] = HubOffer()
            case Subscribed(offer, size):
                assert size == 0
                assert self.h[offer].state == "subscribed"
                self.h[offer].state = "active"
            case OnNextRun(offer, elements):
                state = self.h[offer]
                assert state.state == "active"
                assert elements == [payload(offer, state.received + i)
                                    for i in range(len(elements))]  # fmt: skip
                state.received += len(elements)
            case OnComplete(offer):
                assert self.h[offer].state == "active"
                self.h[offer].state = "complete"
            case _:
                raise AssertionError(f"unexpected event at the hub: {event!r}")

    # ----------------------------------------------------------- invariants

    @invariant()
    def both_open(self) -> None:
        assert not self.client.closed
        assert not self.hub.closed

    @invariant()
    def committed_never_exceeds_delivered(self) -> None:
        for offer, hub_state in self.h.items():
            assert hub_state.committed <= hub_state.received == self.hub.offer_delivered(offer)
            if offer in self.c:  # the same offer (a new one with the id comes after the end)
                assert hub_state.received <= self.c[offer].delivered
        for offer, client_state in self.c.items():
            assert client_state.committed <= client_state.delivered
            assert self.client.offer_delivered(offer) == client_state.delivered

    def teardown(self) -> None:
        """Finish every offer the well-behaved way, then say goodbye."""
        for _ in range(10):
            self.wire("round trip", [], react=True)
            for offer, state in self.c.items():
                if state.state == "active":
                    self.client.send(OnComplete(offer))
                    state.state = "completed"
            if not self.c and not self.h and not self.client.pending:
                break
        assert self.c == {}
        assert self.h == {}
        assert self.handshakes == 2
        self.client.send(Goodbye("done"))
        move(self.client, self.hub)
        assert drain(self.hub)[-1] == ConnectionClosed("done", by_peer=True, error=False)
        move(self.hub, self.client)
        assert drain(self.client) == [ConnectionClosed("goodbye acknowledged", by_peer=False)]


def test_publish_state_machine() -> None:
    run_state_machine_as_test(
        PublishMachine,
        settings=settings(
            max_examples=200,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# =========================================================================== 2. over sockets

TEST_TIMEOUT = 15.0  # seconds, per test: a hang fails instead of stalling the suite
RUN_SECONDS = TEST_TIMEOUT  # (the run fixture's bound, tests/conftest.py)

Runner = Callable[[Coroutine[Any, Any, None]], None]


ONE_OFFER = RsioSettings(max_offers=1)


def fields(event: Stored) -> tuple[int, bytes | None, bytes, int]:
    return event.id, event.key, event.value, event.timestamp


async def read_back(url: str, stream: str, until_id: int) -> list[Stored]:
    """Every event of ``stream`` up to ``until_id``, through an RS.io subscription."""
    async with tidewire.connect(url) as client:
        return [e async for batch in client.subscribe(stream, until_id=until_id) for e in batch]


def test_publish_values_and_batches_read_back_identically(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            client = await tidewire.connect(url)  # the awaitable form
            try:
                t0 = now_ms()
                assert await client.publish("orders", [b"one", b"", b"three"]) == Receipt(3, 1, 3)
                t1 = now_ms()
                keyed = Batch.build("orders", [b"a", b"b" * 300, b"c"], keys=[b"k1", None, b""],
                                    timestamps=[1_700_000_000_000, -1, 5])  # fmt: skip
                assert await client.publish("orders", keyed) == Receipt(3, 4, 6)
                explicit = Batch.build("orders", [b"x", b"y", b"z"], ids=[100, 2**40, 2**62],
                                       keys=[None, b"\x00k" * 100, b"k3"],
                                       timestamps=[42, -(2**40), 2**50])  # fmt: skip
                receipt = await client.publish("orders", explicit, assign_ids=False)
                assert receipt == Receipt(3, 100, 2**62)
                assert await client.publish("orders", [b"after"]) == Receipt(
                    1, 2**62 + 1, 2**62 + 1
                )
                t2 = now_ms()
                stamped = Batch.build("orders", [b"hub clock", b"seven"], timestamps=[0, 7])
                assert await client.publish("orders", stamped) == Receipt(2, 2**62 + 2, 2**62 + 3)
                t3 = now_ms()
            finally:
                await client.close()
            got = await read_back(url, "orders", 2**62 + 3)
            assert [e.id for e in got][:10] == [1, 2, 3, 4, 5, 6, 100, 2**40, 2**62, 2**62 + 1]
            assert [(e.key, e.value) for e in got[:3]] == [(None, b"one"), (None, b""),
                                                           (None, b"three")]  # fmt: skip
            assert len({e.timestamp for e in got[:3]}) == 1
            assert t0 <= got[0].timestamp <= t1
            assert [fields(e) for e in got[3:6]] == [fields(e) for e in keyed.with_ids(4)]
            assert [fields(e) for e in got[6:9]] == [fields(e) for e in explicit]
            assert got[9].value == b"after"
            # timestamp 0 in an envelope means "the hub's clock"; others are kept
            assert [(e.id, e.value) for e in got[10:]] == [(2**62 + 2, b"hub clock"),
                                                          (2**62 + 3, b"seven")]  # fmt: skip
            assert t2 <= got[10].timestamp <= t3
            assert got[11].timestamp == 7
            assert all(e.stream == "orders" for e in got)
            # what the hub itself stored, without RS.io
            stored = [e for b in await hub.read("orders", 1) for e in b]
            assert [fields(e) for e in stored] == [fields(e) for e in got]

    run(main())


def test_pipelined_submits_get_contiguous_receipts(tmp_path: Path, run: Runner) -> None:
    """Submits of many sizes in flight at once (more than the hub's window, so commits split
    batches): receipts come back in order, contiguous, and name the ids subscribers see."""
    sizes = [1, 7, 500, 3000, 1, OFFER_WINDOW + 5, 2, 4000, 1]

    async def main() -> None:
        async with hub_server(tmp_path) as (_, _, url), tidewire.connect(url) as client:
            async with await client.publisher("s") as pub:
                futures = [await pub.submit([b"%d:%d" % (j, i) for i in range(n)])
                           for j, n in enumerate(sizes)]  # fmt: skip
                receipts = [await f for f in futures]
            expected_first = 1
            for receipt, n in zip(receipts, sizes, strict=True):
                assert receipt == Receipt(n, expected_first, expected_first + n - 1)
                expected_first += n
            got = await read_back(url, "s", receipts[-1].last_id)
            assert [e.id for e in got] == list(range(1, sum(sizes) + 1))
            for j, receipt in enumerate(receipts):
                window = got[receipt.first_id - 1 : receipt.last_id]
                assert [e.value for e in window] == [b"%d:%d" % (j, i) for i in range(sizes[j])]

    run(main())


def test_receipts_of_concurrent_publishers_match_the_stream(tmp_path: Path, run: Runner) -> None:
    """Two publishers (two connections) into one stream: receipts interleave, and each names
    the ids where its first and last events are stored."""

    async def publish_all(url: str, tag: bytes) -> list[tuple[Receipt, list[bytes]]]:
        out: list[tuple[Receipt, list[bytes]]] = []
        async with tidewire.connect(url) as client:
            pub = await client.publisher("shared")
            futures = []
            for j in range(30):
                values = [b"%s%d.%d" % (tag, j, i) for i in range(j * 37 % 500 + 1)]
                futures.append((await pub.submit(values), values))
            out = [(await f, values) for f, values in futures]
            await pub.close()
        return out

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            results = await asyncio.gather(publish_all(url, b"a"), publish_all(url, b"b"))
            total = sum(r.count for result in results for r, _ in result)
            assert hub.latest("shared") == total
            by_id = {e.id: e.value for e in await read_back(url, "shared", total)}
            assert len(by_id) == total
            seen: list[bytes] = []
            for result in results:
                previous = 0
                for receipt, values in result:
                    assert receipt.count == len(values)
                    assert previous < receipt.first_id <= receipt.last_id
                    assert receipt.last_id - receipt.first_id + 1 >= receipt.count
                    assert by_id[receipt.first_id] == values[0]
                    assert by_id[receipt.last_id] == values[-1]
                    previous = receipt.last_id
                    seen += values
            assert sorted(seen) == sorted(by_id.values())

    run(main())


def test_value_format_plain_and_packed(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (_, _, url), tidewire.connect(url) as client:
            async with await client.publisher("plain", format="value") as pub:
                assert await pub.send([b"a", b"bb", b"", b"d" * 1000]) == Receipt(4, 1, 4)
                assert await pub.send(Batch.build("plain", [b"e"], keys=[b"dropped"])) == \
                    Receipt(1, 5, 5)  # fmt: skip
            values = [v async for vs in client.subscribe_values("plain", until_id=5) for v in vs]
            assert values == [b"a", b"bb", b"", b"d" * 1000, b"e"]
            events = await read_back(url, "plain", 5)
            assert [(e.id, e.key) for e in events] == [(i, None) for i in range(1, 6)]

            n = 3 * 7000  # over the hub's window: runs split at the demand
            data = [i.to_bytes(8, "big") for i in range(n)]
            async with await client.publisher("ticks", format="value", size=8) as pub:
                with pytest.raises(ValueError, match="every value must be 8 bytes"):
                    await pub.submit([b"short"])
                futures = [await pub.submit(data[i : i + 7000]) for i in range(0, n, 7000)]
                receipts = [await f for f in futures]
            assert receipts == [Receipt(7000, 1, 7000), Receipt(7000, 7001, 14000),
                                Receipt(7000, 14001, 21000)]  # fmt: skip
            packed = b""
            count = 0
            async for chunk in client.subscribe_values("ticks", size=8, until_id=n):
                assert chunk.size == 8
                assert len(chunk.data) == 8 * len(chunk)
                assert list(chunk) == data[count : count + len(chunk)]
                assert chunk[-1] == data[count + len(chunk) - 1]
                count += len(chunk)
                packed += chunk.data
            assert packed == b"".join(data)
            events = await read_back(url, "ticks", n)
            assert [e.value for e in events] == data
            assert [e.id for e in events] == list(range(1, n + 1))

    run(main())


# ------------------------------------------------------------------ a sans-IO client on a socket


class RawClient:
    """A sans-IO client connection on a real socket: the test says exactly what is sent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = Connection(Role.CLIENT, extensions=(EXT_PUBLISH,))
        self.conn.initiate()
        self.flush()

    @classmethod
    async def open(cls, url: str) -> RawClient:
        host, port = url.removeprefix("rsio://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        client = cls(reader, writer)
        assert await client.until(HandshakeCompleted) == [HandshakeCompleted(0, PUBLISHING)]
        return client

    def send(self, *messages: Message) -> None:
        for message in messages:
            self.conn.send(message)
        self.flush()

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    async def until(self, kind: type[Any]) -> list[RsioEvent]:
        """Events up to and including the first of type ``kind``."""
        events: list[RsioEvent] = []
        while True:
            while (event := self.conn.next_event()) is not None:
                events.append(event)
                assert not isinstance(event, ConnectionClosed) or kind is ConnectionClosed, events
                if isinstance(event, kind):
                    self.flush()
                    return events
            self.flush()
            self.conn.receive_data(await self.reader.read(65536))

    async def close(self) -> None:
        if not self.conn.closed:
            self.send(Goodbye("done"))
            await self.until(ConnectionClosed)
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def test_hub_answers_offers_on_the_wire(tmp_path: Path, run: Runner) -> None:
    """The hub's side of the exchange, message by message: subscribe with its window,
    committed then request, offerEnded(""); value offers with a key, plain and packed."""

    async def main() -> None:
        async with hub_server(tmp_path) as (_, _, url):
            raw_client = await RawClient.open(url)
            raw_client.send(Offer(1, "keyed?format=value&key=user%2F42"))
            assert await raw_client.until(Subscribe) == [
                Subscribe("keyed?format=value&key=user%2F42", 1, OFFER_WINDOW)
            ]
            raw_client.send(Subscribed(1, 0), OnNext(1, b"v1"), OnNext(1, b"v2"))
            raw_client.send(OnNext(1, b"v3"))
            events: list[RsioEvent] = []
            while sum(e.count for e in events if isinstance(e, Committed)) < 3:
                events += await raw_client.until(Committed)
                # each committed is followed by a request for as many elements as it stored
                # (awaited before onComplete: after it, a request is a no-op and not reported)
                events += await raw_client.until(Request)
            raw_client.send(OnComplete(1))
            events += await raw_client.until(OfferEnded)
            committed = [e for e in events if isinstance(e, Committed)]
            requests = [e for e in events if isinstance(e, Request)]
            assert (committed[0].first_id, committed[-1].last_id) == (1, 3)
            assert [type(e) for e in events] == [Committed, Request] * len(committed) + [OfferEnded]
            assert [(r.subscriber, r.demand) for r in requests] == [(1, c.count) for c in committed]
            assert events[-1] == OfferEnded(1, "")

            # packed, with a key, on the same id again
            raw_client.send(Offer(1, "keyed?format=value&key=k"))
            await raw_client.until(Subscribe)
            raw_client.send(Subscribed(1, 4), OnNextPacked(1, 3, b"aaaabbbbcccc"), OnComplete(1))
            events = await raw_client.until(OfferEnded)
            assert [e for e in events if not isinstance(e, Request)] == [
                Committed(1, 3, 4, 6),
                OfferEnded(1, ""),
            ]
            await raw_client.close()
            events_read = await read_back(url, "keyed", 6)
            assert [(e.id, e.key, e.value) for e in events_read] == [
                (1, b"user/42", b"v1"), (2, b"user/42", b"v2"), (3, b"user/42", b"v3"),
                (4, b"k", b"aaaa"), (5, b"k", b"bbbb"), (6, b"k", b"cccc"),
            ]  # fmt: skip
            async with tidewire.connect(url) as client:
                only = [e.id async for b in client.subscribe("keyed", key=b"k", until_id=6)
                        for e in b]  # fmt: skip
                assert only == [4, 5, 6]

    run(main())


def test_hub_fails_a_bad_offer_with_cancel_then_offer_ended(tmp_path: Path, run: Runner) -> None:
    """A malformed envelope: cancel(offer), then offerEnded(offer, reason); nothing of it is
    stored and the connection carries on. An offer whose publisher is not UTF-8 or names a bad
    stream is refused with offerEnded alone."""

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            raw_client = await RawClient.open(url)
            raw_client.send(Offer(1, "s"))
            await raw_client.until(Subscribe)
            # a cut-short envelope, then a good one: however they are read, nothing is stored
            raw_client.send(Subscribed(1, 0), OnNext(1, h("80")), OnNext(1, h("00 00 00") + b"ok"))
            events = await raw_client.until(OfferEnded)
            assert events[-2] == Cancel(1)
            ended = events[-1]
            assert isinstance(ended, OfferEnded)
            assert ended.offer == 1
            assert "bad envelope" in ended.error
            assert hub.streams() == []  # nothing of the failed offer was stored

            raw_client.send(Offer(2, "bad%20name"))
            events = await raw_client.until(OfferEnded)
            assert len(events) == 1
            assert isinstance(events[0], OfferEnded)
            assert "bad stream in offer" in events[0].error

            raw_client.conn.send(Offer(3, "ab"))
            wire = raw_client.conn.data_to_send()
            raw_client.write(wire[:3] + h("ff fe"))  # offer 3's publisher: invalid UTF-8
            events = await raw_client.until(OfferEnded)
            assert len(events) == 1
            assert isinstance(events[0], OfferEnded)
            assert events[0].offer == 3
            assert "not valid UTF-8" in events[0].error

            raw_client.send(Offer(1, "s?format=value"))  # every id is usable again
            await raw_client.until(Subscribe)
            raw_client.send(Subscribed(1, 0), OnNext(1, b"fine"), OnComplete(1))
            events = await raw_client.until(OfferEnded)
            assert [e for e in events if not isinstance(e, Request)] == [
                Committed(1, 1, 1, 1),
                OfferEnded(1, ""),
            ]
            await raw_client.close()
            assert [e.value for e in await read_back(url, "s", 1)] == [b"fine"]

    run(main())


def test_documented_exchange_on_a_real_socket(tmp_path: Path, run: Runner) -> None:
    """The bytes docs/protocols/rsio.md gives for a value-format offer, against the real hub."""

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url):
            await hub.append(Batch.build("t", [b"x"] * 6), assign_ids=True)  # next ids: 7, 8
            host, port = url.removeprefix("rsio://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(h("00 00 01 01") + h("40 01 0e 74 3f 66 6f 72 6d 61 74 3d 76 61 6c 75 65"))
            assert await reader.readexactly(5) == h("01 00 02 01 02")  # extensions 1 and 2
            assert await reader.readexactly(19) == h(
                "03 0e 74 3f 66 6f 72 6d 61 74 3d 76 61 6c 75 65 01 80 40"
            )
            writer.write(h("06 01 00") + h("07 01 01 61") + h("07 01 01 62"))
            acks = await reader.readexactly(8)
            if acks.startswith(h("41 01 01")):  # the two elements came in two reads: two commits
                acks += await reader.readexactly(8)
                assert acks == h("41 01 01 07 07 04 01 01 41 01 01 08 08 04 01 01")
            else:
                assert acks == h("41 01 02 07 08") + h("04 01 02")
            writer.write(h("09 01"))
            assert await reader.readexactly(3) == h("42 01 00")
            writer.write(raw(Goodbye("bye")))
            assert decode(await reader.read()) == [Goodbye("goodbye acknowledged")]
            writer.close()
            assert [(e.id, e.value) for e in await read_back(url, "t", 8)][6:] == [
                (7, b"a"),
                (8, b"b"),
            ]

    run(main())


def test_offers_per_connection_are_bounded(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (_, _, url):
            raw_client = await RawClient.open(url)
            raw_client.send(*[Offer(i, f"s{i}") for i in range(1, 258)])
            events = await raw_client.until(OfferEnded)
            assert [e for e in events if isinstance(e, Subscribe)] == [
                Subscribe(f"s{i}", i, OFFER_WINDOW) for i in range(1, 257)
            ]
            assert events[-1] == OfferEnded(
                257, "too many offers on this connection (the limit is 256)"
            )
            raw_client.send(Subscribed(1, 0), OnComplete(1))  # ending one makes room
            await raw_client.until(OfferEnded)
            raw_client.send(Offer(257, "s257"))
            assert await raw_client.until(Subscribe) == [Subscribe("s257", 257, OFFER_WINDOW)]
            await raw_client.close()

    run(main())


# ------------------------------------------------------------------ errors through the client


def test_explicit_ids_not_above_latest(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url), tidewire.connect(url) as client:
            assert await client.publish("s", [b"a", b"b"]) == Receipt(2, 1, 2)
            stale = Batch.build("s", [b"dup", b"new"], ids=[2, 3])
            with pytest.raises(RsioError, match="id 2 is not greater than the latest id 2"):
                await client.publish("s", stale, assign_ids=False)
            assert hub.latest("s") == 2  # nothing of it stored
            # the connection is still usable, for explicit and assigned ids alike
            fresh = Batch.build("s", [b"c"], ids=[10])
            assert await client.publish("s", fresh, assign_ids=False) == Receipt(1, 10, 10)
            assert await client.publish("s", [b"d"]) == Receipt(1, 11, 11)

            # a long-lived publisher: the failing send, then the publisher is over
            pub = await client.publisher("s")
            ok = Batch.build("s", [b"e"], ids=[12])
            assert await pub.send(ok, assign_ids=False) == Receipt(1, 12, 12)
            with pytest.raises(RsioError, match="id 5 is not greater than the latest id 12"):
                await pub.send(Batch.build("s", [b"old"], ids=[5]), assign_ids=False)
            with pytest.raises(RsioError, match=r"closed|ended"):
                await pub.send(Batch.build("s", [b"f"], ids=[20]), assign_ids=False)
            with pytest.raises(RsioError, match="id 5 is not greater"):
                await pub.close()
            assert await client.publish("s", [b"g"]) == Receipt(1, 13, 13)
            got = await read_back(url, "s", 13)
            assert [(e.id, e.value) for e in got] == [
                (1, b"a"), (2, b"b"), (10, b"c"), (11, b"d"), (12, b"e"), (13, b"g")
            ]  # fmt: skip

    run(main())


def test_invalid_stream_name_in_an_offer(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url), tidewire.connect(url) as client:
            for bad in ("bad name", "", "x" * 256, "tab\there"):  # refused before any offer
                with pytest.raises(InvalidStreamName):
                    await client.publisher(bad, format="value")
                with pytest.raises(InvalidStreamName):
                    await client.publish(bad, Batch.build("s", [b"v"]))
            # The hub refuses them too, for a client that does not check (a raw offer).
            reader, writer = await asyncio.open_connection(*url.removeprefix("rsio://").split(":"))
            conn = Connection(Role.CLIENT, extensions=(EXT_PUBLISH,))
            conn.initiate()
            writer.write(conn.data_to_send())
            events: list[object] = []
            while not any(isinstance(e, OfferEnded) for e in events):
                conn.receive_data(await reader.read(65536))
                while (event := conn.next_event()) is not None:
                    events.append(event)
                    if isinstance(event, HandshakeCompleted):
                        conn.send(Offer(1, "bad%20name"))
                        writer.write(conn.data_to_send())
            ended = next(e for e in events if isinstance(e, OfferEnded))
            assert "bad stream in offer" in ended.error
            writer.close()
            assert hub.streams() == []
            assert await client.publish("good", [b"v"]) == Receipt(1, 1, 1)
            assert await client.publish("a?b&c%", [b"w"]) == Receipt(1, 1, 1)  # quoted
            assert [e.value for e in await read_back(url, "a?b&c%", 1)] == [b"w"]

    run(main())


def test_send_after_a_refusal_arrived_reports_the_hubs_reason(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with hub_server(tmp_path, ONE_OFFER) as (_, _, url), tidewire.connect(url) as client:
            first = await client.publisher("good")
            pub = await client.publisher("other", format="value")  # one offer too many
            # one round trip on the connection: the refusal of the offer arrives meanwhile
            assert await first.send([b"x"]) == Receipt(1, 1, 1)
            assert pub.ended.done()
            try:
                with pytest.raises(RsioError, match="too many offers"):
                    await pub.send([b"v"])
            finally:
                with pytest.raises(RsioError, match="too many offers"):
                    await pub.close()
                await first.close()

    run(main())


def test_a_failed_publisher_dropped_after_its_error_reports_nothing_more(
    tmp_path: Path, run: Runner
) -> None:
    """The application saw the offer's error from send() and dropped the publisher: asyncio
    must not report "Future exception was never retrieved" for its ``ended`` future."""

    async def main() -> None:
        reported: list[str] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
        async with hub_server(tmp_path, ONE_OFFER) as (_, _, url), tidewire.connect(url) as client:
            first = await client.publisher("good")
            pub = await client.publisher("other", format="value")  # one offer too many
            with pytest.raises(RsioError, match="too many offers"):
                await pub.send([b"v"])
            assert await first.send([b"x"]) == Receipt(1, 1, 1)  # all settled
            await first.close()
            del pub
            gc.collect()
            assert reported == []

    run(main())


def test_publisher_needs_the_extension(tmp_path: Path, run: Runner) -> None:
    """A hub whose hello does not list extension 1: publisher() refuses, subscribing works."""

    async def fake_hub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(Role.SERVER)  # no extensions
        conn.initiate()
        writer.write(conn.data_to_send())
        while not conn.closed:
            conn.receive_data(await reader.read(65536))
            while (event := conn.next_event()) is not None:
                if isinstance(event, Subscribe):
                    conn.send(Subscribed(event.subscriber, 0))
                    conn.send(OnComplete(event.subscriber))
            writer.write(conn.data_to_send())
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(fake_hub, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, tidewire.connect(f"rsio://127.0.0.1:{port}") as client:
            with pytest.raises(RsioError, match="publishing extension"):
                await client.publisher("s")
            assert [b async for b in client.subscribe("s")] == []

    run(main())


def test_live_subscriber_sees_what_a_concurrent_publisher_commits(
    tmp_path: Path, run: Runner
) -> None:
    """Followers on the publisher's own connection (its subscription and the offer share id 1)
    and on another connection see each commit, live, before the next batch is published."""
    rounds, per_round = 25, 40
    total = 1 + rounds * per_round

    async def main() -> None:
        async with hub_server(tmp_path) as (_, _, url), tidewire.connect(url) as client:
            progress = [0, 0]  # the last id each follower has seen
            changed = asyncio.Condition()

            async def follow(index: int, connection: RsioClient) -> list[Stored]:
                got: list[Stored] = []
                batches = connection.subscribe("live", prefetch=64)
                async with contextlib.aclosing(batches):
                    async for batch in batches:
                        got += batch
                        async with changed:
                            progress[index] = got[-1].id
                            changed.notify_all()
                        if len(got) >= total:
                            break
                return got

            async def seen_by_both(last_id: int) -> None:
                async with changed:
                    await changed.wait_for(lambda: min(progress) >= last_id)

            async with tidewire.connect(url) as other:
                followers = [asyncio.create_task(follow(0, client)),
                             asyncio.create_task(follow(1, other))]  # fmt: skip
                async with await client.publisher("live") as pub:
                    receipts = [await pub.send([b"first"])]
                    await seen_by_both(1)
                    for j in range(rounds):
                        values = [b"%d.%d" % (j, i) for i in range(per_round)]
                        receipts.append(await pub.send(values))
                        await seen_by_both(receipts[-1].last_id)
                results = await asyncio.gather(*followers)
            expected = [b"first"] + [b"%d.%d" % (j, i) for j in range(rounds)
                                     for i in range(per_round)]  # fmt: skip
            for got in results:
                assert [e.id for e in got] == list(range(1, total + 1))
                assert [e.value for e in got] == expected
            assert receipts[-1] == Receipt(per_round, total - per_round + 1, total)

    run(main())


def test_hub_shutdown_fails_the_publisher_instead_of_hanging(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        server = await start_rsio_server(hub, "127.0.0.1", 0)
        try:
            client = await tidewire.connect(f"rsio://127.0.0.1:{server.port}")
            pub = await client.publisher("s")
            assert await pub.send([b"before"]) == Receipt(1, 1, 1)
            futures = [await pub.submit([b"x" * 100] * 100) for _ in range(50)]
            closing = asyncio.ensure_future(pub.close())
            await server.close()
            results = await asyncio.gather(*futures, return_exceptions=True)
            assert all(isinstance(r, Receipt | RsioError) for r in results), results
            assert isinstance(results[-1], RsioError)
            assert "server shutting down" in str(results[-1])
            with pytest.raises(RsioError, match="server shutting down"):
                await closing
            with pytest.raises(RsioError):
                await pub.send([b"after"])
            with pytest.raises(TidewireError, match="server shutting down"):
                await client.publish("s", [b"after"])
            await client.close()
        finally:
            await server.close()
            await hub.close()

    run(main())


@pytest.mark.parametrize("size", [0, 8])
def test_backpressure_small_queue_delivers_everything_in_order(
    tmp_path: Path, run: Runner, size: int
) -> None:
    """With ``max_queue_bytes`` far below what is published, submit waits for room: the queue
    stays bounded, and everything arrives once, in order, with matching receipts (envelopes,
    and fixed-size values whose packed runs are split at the hub's demand)."""
    limit = 64

    def queued_size(values: list[bytes]) -> int:
        """What the publisher queues for ``values``: envelopes, or the packed values."""
        if size:
            return sum(map(len, values))
        return sum(map(len, encode_envelopes(Batch.build("bp", values), with_ids=False)))

    async def main() -> None:
        async with hub_server(tmp_path) as (_, _, url), tidewire.connect(url) as client:
            fmt: Literal["envelope", "value"] = "value" if size else "envelope"
            pub = await client.publisher("bp", format=fmt, size=size, max_queue_bytes=limit)
            groups: list[list[bytes]] = []
            futures: list[asyncio.Future[Receipt]] = []
            waits = 0
            for j in range(400):
                values = [b"%08d" % (j * 3 + i) for i in range(j % 3 + 1)]
                if j % 50 == 49:  # now and then one bigger than the whole queue
                    values = [b"%08d" % (10_000_000 + j * 100 + i) for i in range(20)]
                nbytes = queued_size(values)
                before = pub.queued_bytes
                waits += before > 0 and before + nbytes > limit  # submit must wait for room
                futures.append(await pub.submit(values))
                assert pub.queued_bytes <= max(limit, nbytes)
                groups.append(values)
            receipts = [await f for f in futures]
            await pub.close()
            assert waits > 100  # the bound was hit again and again
            first = 1
            for receipt, values in zip(receipts, groups, strict=True):
                assert receipt == Receipt(len(values), first, first + len(values) - 1)
                first = receipt.last_id + 1
            sent = [v for values in groups for v in values]
            got = await read_back(url, "bp", len(sent))
            assert [e.value for e in got] == sent
            assert [e.id for e in got] == list(range(1, len(sent) + 1))

    run(main())
