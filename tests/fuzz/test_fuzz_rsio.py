"""Fuzzing RS.io over TCP (docs/protocols/rsio.md): the codec, the connection state machine in
both roles, the publisher names and the envelope element format.

Inputs start from ``corpus/rsio`` and are mutated (tests/fuzz/mutate.py), then fed in random
pieces to a :class:`Connection` whose application reacts as the hub's or a client's would
(answering subscriptions, publishing within demand, offering, committing). Properties:

* ``receive_data`` and ``next_event`` never raise: a breach by the peer is a
  ``ConnectionClosed(error=True)`` event, answered with ``goodbye("protocol error: ...")``; a
  breach for one subscription is ``SubscriptionErrored`` (``onError``) or ``OfferRefused``;
* after ``ConnectionClosed`` nothing more happens: no event, nothing sent, input ignored, and
  ``send`` refuses with :class:`LocalProtocolError`;
* while open, the bytes waiting in the decoder are less than one frame the limits allow;
* every byte a machine sends decodes, frame by frame, with the peer's decoder;
* the :class:`Decoder` raises nothing but :class:`RemoteProtocolError`, and is dead after a
  connection-level one;
* every message round-trips through ``encode`` and the decoder, and two machines talking to
  each other deliver every element, offer and commit;
* the three ways of receiving elements (frame by frame, ``runs=True``, a run decoder) agree;
* publisher names parse or are refused with ``PublisherNameError``, and what parses prints
  back to itself; envelopes decode or are refused with ``ValueError``, the same one at a time
  and as a batch.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import (
    chunked,
    corpus,
    decimal,
    fuzz,
    inputs,
    leb128,
    long_decimal,
    replays,
    splits,
    u8,
)

from tidewire.model import MAX_ID, Batch, LocalProtocolError, RemoteProtocolError
from tidewire.protocols.buffer import ReceiveBuffer
from tidewire.protocols.rsio import (
    EXT_AUTH,
    EXT_PUBLISH,
    Authenticate,
    Authenticated,
    Cancel,
    ClientHello,
    Committed,
    Connection,
    ConnectionClosed,
    Decoder,
    Event,
    Goodbye,
    HandshakeCompleted,
    Limits,
    Message,
    Offer,
    OfferEnded,
    OfferRefused,
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
    SubscriptionProtocolError,
    encode,
)
from tidewire.protocols.rsio.envelopes import (
    decode_envelope,
    decode_envelopes,
    encode_envelopes,
    envelopes_to_batch,
)
from tidewire.protocols.rsio.names import OfferName, PublisherName, PublisherNameError
from tidewire.protocols.rsio.runs import envelope_frames, envelope_run_decoder
from tidewire.protocols.rsio.varint import MAX_LONG, MAX_VARINT, NeedData, pull_varint

# Small limits, so that the fuzzer reaches them (the defaults are 64 KiB and 16 MiB).
LIMITS = Limits(max_string_bytes=128, max_element_bytes=256, max_packed_bytes=256,
                max_extensions=8)  # fmt: skip
# The longest frame these limits allow: type, at most three varints, the longest body.
FRAME_BOUND = 1 + 3 * 10 + max(LIMITS.max_string_bytes, LIMITS.max_element_bytes,
                               LIMITS.max_packed_bytes, 10 * LIMITS.max_extensions)  # fmt: skip
# What a peer decodes this side's output with: its reasons are clipped to 1000 characters,
# at most 4000 bytes (connection.MAX_REASON_CHARS).
PEER_LIMITS = Limits(max_string_bytes=4000)
ENCODERS = (leb128, u8)
TO_SERVER = corpus("rsio", "to-server")
TO_CLIENT = corpus("rsio", "to-client")
FUZZ_EVENTS = (
    Message, OnNextRun, OnNextDecoded, HandshakeCompleted, SubscriptionErrored, OfferRefused,
    ConnectionClosed,
)  # fmt: skip
STREAM = "orders"

Row = tuple[object, ...]


def row(element: bytes) -> Row:
    """An envelope as (id, timestamp, key, value), or ("bad", element)."""
    try:
        return decode_envelope(element)
    except ValueError:
        return ("bad", element)


# --------------------------------------------------------------------------- applications


class App:
    """What reacts to a machine's events. ``strict``: a refused send is a test failure (in a
    fuzzed conversation it may be the application's own mistake: LocalProtocolError only)."""

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.rows: defaultdict[int, list[Row]] = defaultdict(list)  # elements received

    @contextlib.contextmanager
    def local(self) -> Iterator[None]:
        if self.strict:
            yield
        else:
            with contextlib.suppress(LocalProtocolError):
                yield

    def start(self, conn: Connection) -> None:
        conn.initiate()

    def react(self, conn: Connection, event: Event) -> None:
        raise NotImplementedError

    def received(self, conn: Connection, event: Event) -> int:
        """Record the elements of ``event`` (0 if it carries none)."""
        match event:
            case OnNext(sid, element):
                self.rows[sid].append(row(element) if sid == 1 else (element,))
                return 1
            case OnNextRun(sid, elements):
                self.rows[sid] += [row(e) if sid == 1 else (e,) for e in elements]
                return len(elements)
            case OnNextPacked(sid, count, _):
                self.rows[sid] += [(event.element(i),) for i in range(count)]
                return count
            case OnNextDecoded(sid, count, batch):
                assert isinstance(batch, Batch)
                assert len(batch) == count
                self.rows[sid] += [(e.id, e.timestamp, e.key, e.value) for e in batch]
                return count
        return 0


class ServerApp(App):
    """The hub's side: answers subscribe with subscribed (fixed size 4 for names ending in
    ``size=4``) and publishes envelopes (or 4-byte values) within demand, ``budget`` per
    subscription, then onComplete; subscribes to offers and commits what they deliver."""

    def __init__(self, *, strict: bool = False, budget: int = 12) -> None:
        super().__init__(strict=strict)
        self.budget = budget
        self.sizes: dict[int, int] = {}
        self.published: defaultdict[int, list[Row]] = defaultdict(list)
        self.left: dict[int, int] = {}
        self.offers: set[int] = set()
        self.next_id = 1
        self.turn = 0

    def react(self, conn: Connection, event: Event) -> None:
        with self.local():
            self._react(conn, event)

    def _react(self, conn: Connection, event: Event) -> None:
        match event:
            case Subscribe(publisher, sid, _):
                size = 4 if publisher.endswith("size=4") else 0
                conn.send(Subscribed(sid, size))
                self.sizes[sid], self.left[sid] = size, self.budget
                self._publish(conn, sid, 3)
            case Request(sid, _):
                self._publish(conn, sid, 2)
            case Offer(offer, publisher):
                conn.send(Subscribe(publisher, offer, 8))
                self.offers.add(offer)
            case OnComplete(sid) | OnError(sid) if sid in self.offers:
                self.offers.discard(sid)
                conn.send(OfferEnded(sid, "" if isinstance(event, OnComplete) else "failed"))
            case Authenticate():
                conn.send(Authenticated("token:ci"))
            case _:
                count = self.received(conn, event)
                into = getattr(event, "subscriber", None)
                if count and isinstance(into, int) and into in self.offers:
                    conn.send(Committed(into, count, self.next_id, self.next_id + count - 1))
                    self.next_id += count
                    if conn.is_subscribed(into):
                        conn.send(Request(into, count))

    def _publish(self, conn: Connection, sid: int, most: int) -> None:
        n = min(conn.demand(sid), most, self.left.get(sid, 0))
        if n <= 0 or not conn.peer_subscribed(sid):
            return
        self.left[sid] -= n
        self.turn += 1
        if self.sizes[sid]:
            values = [(self.turn * 16 + i).to_bytes(4, "big") for i in range(n)]
            self.published[sid] += [(v,) for v in values]
            conn.send(OnNextPacked(sid, n, b"".join(values)) if n > 1 else OnNext(sid, values[0]))
        else:
            first = len(self.published[sid]) + 1
            batch = Batch.build(STREAM, [b"v%d" % i * (i % 3) for i in range(first, first + n)],
                                ids=range(first, first + n), timestamps=self.turn,
                                keys=[b"k" if i % 2 else None for i in range(n)])  # fmt: skip
            elements = encode_envelopes(batch)
            self.published[sid] += [row(e) if sid == 1 else (e,) for e in elements]
            if self.turn % 3 == 0:
                conn.send_frames(sid, n, envelope_frames(sid, batch))
            elif self.turn % 3 == 1:
                conn.send_elements(sid, elements)
            else:
                for element in elements:
                    conn.send(OnNext(sid, element))
        if not self.left[sid]:
            conn.send(OnComplete(sid))


SUBSCRIPTIONS = ((1, STREAM, 10), (2, "other", 0), (7, "ticks?size=4", 10))
OFFER_ID = 3
OFFERED = (b"a", b"b")


class ClientApp(App):
    """A client: subscribes with ids 1 (envelopes), 2 (asks for 5 once subscribed) and 7
    (``size=4``) at once; offers id 3 once the hub's hello lists extension 1, and answers the
    hub's subscription to it with two values and onComplete; authenticates with extension 2.
    ``top_up``: ask for one more element per element received."""

    def __init__(
        self, *, strict: bool = False, top_up: bool = True, run_decoder: bool = False,
        demand: int = 10,
    ) -> None:  # fmt: skip
        super().__init__(strict=strict)
        self.top_up = top_up
        self.run_decoder = run_decoder
        self.demand = demand
        self.offered: defaultdict[int, list[bytes]] = defaultdict(list)
        self.committed: defaultdict[int, int] = defaultdict(int)
        self.ended: dict[int, str] = {}
        self.principal: str | None = None

    def start(self, conn: Connection) -> None:
        conn.initiate()
        for sid, publisher, demand in SUBSCRIPTIONS:
            conn.send(Subscribe(publisher, sid, min(demand, self.demand)))
        if self.run_decoder:
            conn.set_run_decoder(1, envelope_run_decoder(STREAM))

    def react(self, conn: Connection, event: Event) -> None:
        with self.local():
            self._react(conn, event)

    def _react(self, conn: Connection, event: Event) -> None:
        match event:
            case HandshakeCompleted(_, extensions):
                if EXT_PUBLISH in extensions:
                    conn.send(Offer(OFFER_ID, "t?format=value"))
                if EXT_AUTH in extensions:
                    conn.send(Authenticate("ci.s3cr3t"))
            case Subscribe(_, sid, _):  # the hub's subscription to our offer
                conn.send(Subscribed(sid, 0))
                elements = list(OFFERED[: conn.demand(sid)])
                if elements:
                    conn.send_elements(sid, elements)
                self.offered[sid] += elements
                conn.send(OnComplete(sid))
            case Subscribed(2, _):
                conn.send(Request(2, 5))
            case Committed(offer, count):
                self.committed[offer] += count
            case OfferEnded(offer, error):
                self.ended[offer] = error
            case Authenticated(principal):
                self.principal = principal
            case _:
                count = self.received(conn, event)
                subscriber = getattr(event, "subscriber", None)
                if (count and self.top_up and isinstance(subscriber, int)
                        and conn.is_subscribed(subscriber)):  # fmt: skip
                    conn.send(Request(subscriber, count))


# --------------------------------------------------------------------------- harness


class Monitor:
    """Decodes what a machine sends, frame by frame, as its peer would (fixed element sizes
    from the ``subscribed`` frames of the same output)."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}
        self.decoder = Decoder(PEER_LIMITS, lambda sid: self.sizes.get(sid, 0),
                               publishing=True, auth=True)  # fmt: skip
        self.messages: list[object] = []
        self.raw = bytearray()

    def feed(self, data: bytes) -> None:
        self.raw += data
        self.decoder.feed(data)
        for _ in range(len(data) + 1):
            message = self.decoder.next_message()  # raises if this side sent a bad frame
            if message is None:
                return
            if isinstance(message, Subscribed):
                self.sizes[message.subscriber] = message.element_size
            self.messages.append(message)
        raise AssertionError("the decoder never ran dry")


@dataclass
class Run:
    conn: Connection
    app: App
    monitor: Monitor = field(default_factory=Monitor)
    events: list[Event] = field(default_factory=list)
    closed: ConnectionClosed | None = None
    fed: int = 0

    def start(self) -> None:
        self.app.start(self.conn)
        self.flush()

    def feed(self, chunk: bytes) -> None:
        self.conn.receive_data(chunk)  # never raises
        self.fed += len(chunk)
        self.drain()

    def drain(self) -> None:
        for _ in range(self.fed + 2):  # every event but the last takes at least one byte
            event = self.conn.next_event()  # never raises
            if event is None:
                break
            assert self.closed is None, f"{event!r} after {self.closed!r}"
            assert isinstance(event, FUZZ_EVENTS), event
            self.events.append(event)
            if isinstance(event, ConnectionClosed):
                self.closed = event
                assert self.conn.closed
            self.app.react(self.conn, event)
        else:
            raise AssertionError("next_event never ran dry")
        self.flush()
        if self.closed is None:
            buffered = self.conn.buffered
            assert buffered < FRAME_BOUND, f"{buffered} bytes buffered, over one frame"

    def flush(self) -> None:
        self.monitor.feed(self.conn.data_to_send())

    def finish(self, eof: bool) -> None:
        if eof:
            self.feed(b"")
            assert self.closed is not None, "EOF did not close the connection"
        assert self.monitor.decoder.buffered == 0, "output ends inside a frame"
        if self.closed is not None:
            self.check_closed()

    def check_closed(self) -> None:
        closed = self.closed
        assert closed is not None
        sent = self.monitor.messages
        if closed.error and closed.reason != "transport closed":
            # a breach: answered with goodbye("protocol error: ..."), the last frame sent
            assert sent, "a breach without a goodbye"
            last = sent[-1]
            assert isinstance(last, Goodbye), last
            assert last.reason.startswith("protocol error: "), last
        assert sum(isinstance(m, Goodbye) for m in sent) <= 1, sent
        # and then nothing more, whatever comes
        self.conn.receive_data(b"\x00\x00\x00" + bytes(encode(Goodbye("late"))))
        self.conn.receive_data(b"")
        assert self.conn.next_event() is None
        assert self.conn.data_to_send() == b""
        with pytest.raises(LocalProtocolError):
            self.conn.send(Cancel(1))


def run_machine(role: Role, chunks: Sequence[bytes], app: App, eof: bool,
                runs: bool = False) -> Run:  # fmt: skip
    conn = Connection(role, extensions=(EXT_PUBLISH, EXT_AUTH), limits=LIMITS, runs=runs)
    run = Run(conn, app)
    run.start()
    for chunk in chunks:
        run.feed(chunk)
    run.finish(eof)
    return run


# --------------------------------------------------------------------------- the machines


def check_hub_side(chunks: Sequence[bytes], eof: bool) -> None:
    run_machine(Role.SERVER, chunks, ServerApp(), eof)


def check_client_side(chunks: Sequence[bytes], eof: bool, runs: bool, run_decoder: bool,
                      top_up: bool) -> None:  # fmt: skip
    app = ClientApp(top_up=top_up, run_decoder=run_decoder)
    run_machine(Role.CLIENT, chunks, app, eof, runs=runs)


def check_receivers_agree(chunks: Sequence[bytes], demand: int) -> None:
    """Frame by frame, as runs (``runs=True``) and through a run decoder, the same bytes give
    the same elements and end the same way (the application asks for nothing more, so that
    demand is the same in the three)."""
    outcomes = []
    for runs, run_decoder in ((False, False), (True, False), (False, True)):
        app = ClientApp(top_up=False, run_decoder=run_decoder, demand=demand)
        run = run_machine(Role.CLIENT, chunks, app, eof=False, runs=runs)
        closed = run.closed
        outcomes.append((dict(app.rows), closed is not None and closed.error))
    assert outcomes[1] == outcomes[0]
    assert outcomes[2] == outcomes[0]


def check_decoder(chunks: Sequence[bytes], publishing: bool, auth: bool, runs: bool,
                  sizes: dict[int, int]) -> None:  # fmt: skip
    decoder = Decoder(LIMITS, lambda sid: sizes.get(sid, 0), publishing=publishing, auth=auth,
                      runs=runs)  # fmt: skip
    error: RemoteProtocolError | None = None
    for chunk in chunks:
        decoder.feed(chunk)
        for _ in range(decoder.buffered + 1):
            try:
                message = decoder.next_message()
            except SubscriptionProtocolError:
                continue  # that frame is consumed; the connection carries on
            except RemoteProtocolError as exc:
                error = exc
                break
            if message is None:
                break
        else:
            raise AssertionError("the decoder never ran dry")
        if error is not None:  # dead: the same error again, for anything
            with pytest.raises(RemoteProtocolError) as again:
                decoder.next_message()
            assert again.value is error
            with pytest.raises(RemoteProtocolError) as again:
                decoder.feed(b"\x05\x01")
            assert again.value is error
            return
        assert decoder.buffered < FRAME_BOUND


@fuzz()
@given(data=st.data(), raw=inputs(TO_SERVER, ENCODERS), eof=st.booleans())
def test_the_hub_side_survives_any_input(data: st.DataObject, raw: bytes, eof: bool) -> None:
    check_hub_side(data.draw(chunked(raw)), eof)


@fuzz()
@given(
    data=st.data(),
    raw=inputs(TO_CLIENT, ENCODERS),
    eof=st.booleans(),
    runs=st.booleans(),
    run_decoder=st.booleans(),
    top_up=st.booleans(),
)
def test_the_client_side_survives_any_input(
    data: st.DataObject, raw: bytes, eof: bool, runs: bool, run_decoder: bool, top_up: bool
) -> None:
    check_client_side(data.draw(chunked(raw)), eof, runs, run_decoder, top_up)


@fuzz()
@given(data=st.data(), raw=inputs(TO_CLIENT, ENCODERS),
       demand=st.sampled_from((1, 3, 10, MAX_LONG)))  # fmt: skip
def test_three_ways_of_receiving_elements_agree(
    data: st.DataObject, raw: bytes, demand: int
) -> None:
    check_receivers_agree(data.draw(chunked(raw)), demand)


SIZES = st.dictionaries(st.integers(0, 8), st.sampled_from((0, 1, 4, 300, MAX_VARINT)))


@fuzz()
@given(
    data=st.data(),
    raw=inputs(TO_SERVER + TO_CLIENT, ENCODERS),
    publishing=st.booleans(),
    auth=st.booleans(),
    runs=st.booleans(),
    sizes=SIZES,
)
def test_the_decoder_raises_only_remote_protocol_errors(
    data: st.DataObject, raw: bytes, publishing: bool, auth: bool, runs: bool,
    sizes: dict[int, int],
) -> None:  # fmt: skip
    check_decoder(data.draw(chunked(raw)), publishing, auth, runs, sizes)


@replays("rsio", "to-server")
def test_corpus_to_the_hub(raw: bytes) -> None:
    for chunks in splits(raw):
        for eof in (False, True):
            check_hub_side(chunks, eof)
        check_decoder(chunks, True, True, False, {7: 4})


@replays("rsio", "to-client")
def test_corpus_to_the_client(raw: bytes) -> None:
    for chunks in splits(raw):
        for runs, run_decoder, top_up in itertools.product((False, True), repeat=3):
            check_client_side(chunks, True, runs, run_decoder, top_up)
        for demand in (1, 10, MAX_LONG):
            check_receivers_agree(chunks, demand)
        check_decoder(chunks, True, True, True, {7: 4})


# --------------------------------------------------------------------------- round trips

ids = st.sampled_from((0, 1, 127, 128, 2**31 - 1, 2**63, MAX_VARINT)) | st.integers(0, MAX_VARINT)
longs = st.sampled_from((0, 1, MAX_LONG)) | st.integers(0, MAX_LONG)
texts = st.text(max_size=24)
variable_sid = st.integers(100, 200)  # fixed-size subscriptions use 0..99


@st.composite
def committed(draw: st.DrawFn) -> Committed:
    first = draw(st.integers(1, MAX_LONG))
    last = draw(st.integers(first, min(MAX_LONG, first + 2**40)))
    return Committed(draw(ids), draw(st.integers(1, last - first + 1)), first, last)


def messages(fixed: dict[int, int]) -> st.SearchStrategy[Message]:
    """Any message; elements of a subscriber in ``fixed`` are of its size."""
    hellos = st.lists(ids, max_size=LIMITS.max_extensions).map(tuple)
    options: list[st.SearchStrategy[Message]] = [
        st.builds(ClientHello, ids, hellos),
        st.builds(ServerHello, ids, hellos),
        st.builds(Goodbye, texts),
        st.builds(Subscribe, texts, ids, longs),
        st.builds(Request, ids, longs),
        st.builds(Cancel, ids),
        st.builds(Subscribed, ids, ids),
        st.builds(OnNext, variable_sid, st.binary(max_size=40)),
        st.builds(OnComplete, ids),
        st.builds(OnError, ids, texts),
        st.builds(Offer, ids, texts),
        committed(),
        st.builds(OfferEnded, ids, texts),
        st.builds(Authenticate, texts),
        st.builds(Authenticated, texts),
    ]
    for sid, size in fixed.items():
        options.append(st.builds(OnNext, st.just(sid), st.binary(min_size=size, max_size=size)))
        options.append(packed(sid, size))
    return st.one_of(options)


@st.composite
def packed(draw: st.DrawFn, sid: int, size: int) -> OnNextPacked:
    count = draw(st.integers(1, 4))
    return OnNextPacked(sid, count, draw(st.binary(min_size=count * size, max_size=count * size)))


@fuzz(2)
@given(data=st.data(), fixed=st.dictionaries(st.integers(0, 99), st.integers(1, 9), max_size=3))
def test_every_message_round_trips(data: st.DataObject, fixed: dict[int, int]) -> None:
    sent = data.draw(st.lists(messages(fixed), max_size=12))
    wire = bytearray()
    for message in sent:
        size = fixed.get(getattr(message, "subscriber", -1), 0)
        encode(message, size if isinstance(message, OnNext | OnNextPacked) else 0, wire)
    decoder = Decoder(Limits(), lambda sid: fixed.get(sid, 0), publishing=True, auth=True)
    got: list[object] = []
    for chunk in data.draw(chunked(bytes(wire))):
        decoder.feed(chunk)
        while (decoded := decoder.next_message()) is not None:
            got.append(decoded)
    assert got == sent
    assert decoder.buffered == 0


@fuzz(0.5)
@given(
    data=st.data(),
    client_extensions=st.sets(st.sampled_from((EXT_PUBLISH, EXT_AUTH, 300))),
    runs=st.booleans(),
    run_decoder=st.booleans(),
    budget=st.integers(0, 30),
)
def test_a_client_and_a_hub_deliver_everything(
    data: st.DataObject, client_extensions: set[int], runs: bool, run_decoder: bool,
    budget: int,
) -> None:  # fmt: skip
    """Two machines, each byte they send fed to the other in random pieces: every element
    the hub publishes reaches the client, the offer is delivered, committed and ended, the
    token authenticates; no breach on either side; then goodbye closes both cleanly."""
    client = Run(Connection(Role.CLIENT, extensions=client_extensions, limits=LIMITS, runs=runs),
                 ClientApp(strict=True, run_decoder=run_decoder))  # fmt: skip
    hub = Run(Connection(Role.SERVER, extensions=(EXT_PUBLISH, EXT_AUTH), limits=LIMITS),
              ServerApp(strict=True, budget=budget))  # fmt: skip
    client.start()
    hub.start()
    to_hub = to_client = 0  # how much of each side's output the other has read
    for _ in range(200):  # the conversation is finite: the hub publishes `budget` each
        c_out, h_out = client.monitor.raw[to_hub:], hub.monitor.raw[to_client:]
        if not c_out and not h_out:
            break
        to_hub += len(c_out)
        to_client += len(h_out)
        for chunk in data.draw(chunked(bytes(c_out))):
            hub.feed(chunk)
        for chunk in data.draw(chunked(bytes(h_out))):
            client.feed(chunk)
    else:
        raise AssertionError("the conversation did not end")
    assert client.closed is None, client.closed
    assert hub.closed is None, hub.closed
    capp, happ = client.app, hub.app
    assert isinstance(capp, ClientApp)
    assert isinstance(happ, ServerApp)
    for sid, _, _ in SUBSCRIPTIONS:
        assert capp.rows[sid] == happ.published[sid], sid
    assert len(happ.published[1]) == budget
    publishing = EXT_PUBLISH in client_extensions
    assert happ.rows[OFFER_ID] == ([(e,) for e in OFFERED] if publishing else [])
    assert capp.committed[OFFER_ID] == (len(OFFERED) if publishing else 0)
    assert capp.ended == ({OFFER_ID: ""} if publishing else {})
    assert capp.principal == ("token:ci" if EXT_AUTH in client_extensions else None)
    # goodbye, acknowledged: both closed, no error
    client.conn.send(Goodbye("done"))
    client.flush()
    hub.feed(bytes(client.monitor.raw[to_hub:]))
    client.feed(bytes(hub.monitor.raw[to_client:]))
    for side in (client, hub):
        assert side.closed is not None
        assert not side.closed.error, side.closed
    assert hub.closed is not None
    assert hub.closed.by_peer
    assert hub.monitor.messages[-1] == Goodbye("goodbye acknowledged")


# --------------------------------------------------------------------------- names

NAMES = corpus("rsio", "publisher")


@st.composite
def names(draw: st.DrawFn) -> str:
    """A mutated publisher name: bytes mutations decoded leniently, or characters of any
    category (digits of other scripts, superscripts, spaces, controls) put in anywhere."""
    text = draw(inputs(NAMES, (decimal, long_decimal))).decode("utf-8", "replace")
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(max_size=3)) + text[at:]
    return text


def check_name(text: str) -> None:
    for parse in (PublisherName.parse, OfferName.parse):
        try:
            name = parse(text)
        except PublisherNameError:
            continue
        assert parse(str(name)) == name, (text, str(name))


@fuzz(2)
@given(text=names())
def test_publisher_names_parse_or_are_refused(text: str) -> None:
    check_name(text)


@replays("rsio", "publisher")
def test_corpus_publisher_names(raw: bytes) -> None:
    check_name(raw.decode("utf-8", "replace"))


# --------------------------------------------------------------------------- envelopes

ENVELOPES = corpus("rsio", "envelope")


def split_elements(raw: bytes) -> list[bytes]:
    """The elements of ``raw`` (varint length + element, repeated), read leniently: what
    does not parse is the last element."""
    elements: list[bytes] = []
    pos = 0
    while pos < len(raw) and len(elements) < 64:
        try:
            size, start = pull_varint(raw, pos)
        except (NeedData, RemoteProtocolError):
            break
        elements.append(raw[start : start + size])
        pos = start + size
    if pos < len(raw):
        elements.append(raw[pos:])
    return elements


def valid_ids(found: list[int]) -> bool:
    """Every id 0 (the hub assigns them), or 1..2^63-1 and strictly increasing."""
    if not any(found):
        return True
    return (found[0] >= 1 and found[-1] <= MAX_ID
            and all(a < b for a, b in itertools.pairwise(found)))  # fmt: skip


def check_envelopes(raw: bytes) -> None:
    """Decoded one at a time and as a batch, the same envelopes, or ``ValueError`` for both
    (also when the ids break the rule: all 0, or 1..2^63-1 increasing)."""
    elements = split_elements(raw)
    rows = [row(e) for e in elements]
    found = [r[0] for r in rows if isinstance(r[0], int)]
    expected_ok = bool(rows) and len(found) == len(rows) and valid_ids(found)
    try:
        batch = envelopes_to_batch(STREAM, elements)
    except ValueError:
        assert not expected_ok, rows
    else:
        assert expected_ok, rows
        assert [(e.id, e.timestamp, e.key, e.value) for e in batch] == rows
    try:
        published, explicit = decode_envelopes(STREAM, elements)
    except ValueError:
        assert not expected_ok
    else:
        assert expected_ok
        assert explicit == bool(rows[0][0])
        assert [e.value for e in published] == [r[3] for r in rows]


def check_run_decoder(raw: bytes, prefix: bytes, max_count: int, tail: bytes) -> None:
    """The envelope run decoder, fed ``onNext`` frames of the elements and any bytes after
    them: the elements it takes are exactly those the one-at-a-time decoding gives."""
    elements = split_elements(raw)
    buf = bytearray()
    for element in elements:
        buf += prefix + leb128(len(element)) + element
    buf += tail
    decode = envelope_run_decoder(STREAM)
    received = ReceiveBuffer(max(1, len(buf)))
    received.append(buf)
    batch, count = decode(received, prefix, max_count, LIMITS.max_element_bytes)
    end = received.pos
    if not count:
        assert batch is None
        assert end == 0
        return
    assert isinstance(batch, Batch)
    assert count <= min(max_count, len(elements))
    assert end == sum(len(prefix) + len(leb128(len(e))) + len(e) for e in elements[:count])
    assert [(e.id, e.timestamp, e.key, e.value) for e in batch] == [
        row(e) for e in elements[:count]
    ]


PREFIXES = (b"\x07\x01", b"\x07\x00", b"\x07\x80\x01")


@fuzz(2)
@given(raw=inputs(ENVELOPES, (leb128, u8)))
def test_envelopes_decode_alike_one_at_a_time_and_as_a_batch(raw: bytes) -> None:
    check_envelopes(raw)


@fuzz(2)
@given(
    raw=inputs(ENVELOPES, (leb128, u8)),
    prefix=st.sampled_from(PREFIXES),
    max_count=st.integers(1, 70),
    tail=st.binary(max_size=12).filter(lambda t: not t.startswith(b"\x07")),
)
def test_the_run_decoder_takes_only_what_decodes(
    raw: bytes, prefix: bytes, max_count: int, tail: bytes
) -> None:
    check_run_decoder(raw, prefix, max_count, tail)


@replays("rsio", "envelope")
def test_corpus_envelopes(raw: bytes) -> None:
    check_envelopes(raw)
    for prefix, tail in itertools.product(PREFIXES, (b"", b"\x00", b"\x80\x00", b"\x01")):
        check_run_decoder(raw, prefix, 64, tail)


events = st.tuples(
    st.integers(0, 2**20),
    st.sampled_from((0, -1, 1, -(2**63), 2**63 - 1)) | st.integers(-(2**63), 2**63 - 1),
    st.none() | st.binary(max_size=6),
    st.binary(max_size=140),
)


@fuzz(2)
@given(rows=st.lists(events, min_size=1, max_size=20), start=st.integers(1, MAX_ID - 2**21))
def test_envelopes_round_trip(rows: list[tuple[int, int, bytes | None, bytes]],
                              start: int) -> None:  # fmt: skip
    ids_ = sorted({start + gap for gap, _, _, _ in rows})
    rows = rows[: len(ids_)]
    batch = Batch.build(STREAM, [v for _, _, _, v in rows], ids=ids_,
                        keys=[k for _, _, k, _ in rows],
                        timestamps=[t for _, t, _, _ in rows])  # fmt: skip
    elements = encode_envelopes(batch)
    expected = [(i, t, k, v) for i, (_, t, k, v) in zip(ids_, rows, strict=True)]
    assert [row(e) for e in elements] == expected
    assert [(e.id, e.timestamp, e.key, e.value) for e in envelopes_to_batch(STREAM, elements)] == (
        expected
    )
    frames = b"".join(bytes(encode(OnNext(5, e))) for e in elements)
    assert envelope_frames(5, batch) == frames
