"""Fuzzing Tolliver (docs/protocols/tolliver.md): the codec, the connection in both roles,
and its resend timer.

Inputs start from ``corpus/tolliver`` and are mutated (tests/fuzz/mutate.py; the integers go in
as u32 and u64 big-endian, its length fields), then fed in random pieces to a
:class:`Connection` (version 2, which can speak 1) whose application sends reliable messages
once established, acks by hand when ``auto_ack`` is off, and runs the timer at arbitrary
``now`` values. Small limits (names of 32 bytes, bodies of 256, 8 subscriptions) so that the
fuzzer reaches them. Properties:

* ``receive_data``, ``next_event`` and ``handle_timer`` never raise; a breach is one
  ``Closed(error=True)`` event, the last; after ``Closed`` nothing is received, sent or timed,
  and ``send`` refuses with :class:`LocalProtocolError`;
* while open, the bytes waiting in the decoder are less than one frame the limits allow, and
  the peer holds at most ``max_subscriptions``, never one to the reserved channel;
* what a machine sends decodes with the peer's decoder, starts with its handshake frame, and
  acks only reliable messages it received;
* with time moving forward, ``handle_timer(now)`` leaves no message overdue and
  ``next_deadline()`` is the earliest resend;
* every frame round-trips through ``encode`` and the decoder; two machines of any versions
  settle the handshake as the seed's table says and deliver every message at least once.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import chunked, corpus, fuzz, inputs, replays, splits, u8, u32be, u64be

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
)

LIMITS = Limits(max_name_bytes=32, max_body_bytes=256, max_subscriptions=8)
ENTRY_BOUND = 9 + 2 * LIMITS.max_name_bytes
FRAME_BOUND = max(1 + 8 + 16 + 1 + 4 + LIMITS.max_subscriptions * ENTRY_BOUND,
                  17 + 2 * LIMITS.max_name_bytes + LIMITS.max_body_bytes)  # fmt: skip
ENCODERS = (u32be, u64be, u8)
TO_ACCEPTOR = corpus("tolliver", "to-acceptor")
TO_CONNECTOR = corpus("tolliver", "to-connector")
ME = uuid.UUID("0192ffff-0000-7000-8000-00000000000a")
VERSION = 2
SUPPORTED = frozenset({1, 2})
RESEND = 1.0
SENT_IDS = (1, 2)

times = st.floats(min_value=-1e6, max_value=1e12, allow_nan=False, allow_infinity=False)


@dataclass
class Machine:
    conn: Connection
    events: list[Event] = field(default_factory=list)
    out: bytearray = field(default_factory=bytearray)  # what it sent
    fed_bytes: bytearray = field(default_factory=bytearray)  # what it was sent

    @property
    def closed(self) -> Closed | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Closed) else None

    def start(self) -> None:
        if self.conn.role is Role.CONNECTOR:
            self.conn.initiate()
        self.flush()

    def feed(self, chunk: bytes, now: float) -> None:
        self.conn.receive_data(chunk)  # never raises
        self.fed_bytes += chunk
        self.drain(now)

    def drain(self, now: float) -> None:
        conn = self.conn
        for _ in range(len(self.fed_bytes) + 2):  # each event but the last takes a byte
            event = conn.next_event()  # never raises
            if event is None:
                break
            assert self.closed is None, f"{event!r} after {self.closed!r}"
            self.events.append(event)
            self.react(event, now)
        else:
            raise AssertionError("next_event never ran dry")
        self.flush()
        if self.closed is None:
            assert conn.buffered < FRAME_BOUND
            assert len(conn.peer_subscriptions) <= LIMITS.max_subscriptions
            assert all(c != CONTROL_CHANNEL for c, _ in conn.peer_subscriptions)

    def react(self, event: Event, now: float) -> None:
        conn = self.conn
        match event:
            case Established():
                for message_id in SENT_IDS:
                    conn.send(Message("orders", "", b"m%d" % message_id, message_id), now)
                conn.send(Message("x", "k", b"unreliable"), now)
                conn.subscribe("y")
            case Received(message):
                assert message.channel != CONTROL_CHANNEL
                if message.reliable and not conn.auto_ack:
                    conn.ack(message.id)
            case PeerSubscriptions(subscriptions):
                assert subscriptions == frozenset(conn.peer_subscriptions)

    def timer(self, now: float) -> None:
        self.conn.handle_timer(now)  # never raises
        self.drain(now)

    def flush(self) -> None:
        self.out += self.conn.data_to_send()

    def after_close(self, now: float) -> None:
        conn = self.conn
        conn.receive_data(bytes(encode(Ack(1))))
        conn.receive_data(b"")
        conn.handle_timer(now + 1e9)
        assert conn.next_event() is None
        assert conn.data_to_send() == b""
        assert conn.next_deadline() is None
        with pytest.raises(LocalProtocolError):
            conn.send(Message("orders", "", b"late", 5), now)


def frames_of(data: bytes, limits: Limits) -> list[Frame]:
    """The frames ``data`` starts with, up to the end or the first bad one."""
    decoder = Decoder(limits)
    decoder.feed(data)
    frames: list[Frame] = []
    for _ in range(len(data) + 1):
        try:
            frame = decoder.next_frame()
        except RemoteProtocolError:
            break
        if frame is None:
            break
        frames.append(frame)
    return frames


def check_output(machine: Machine) -> None:
    """What ``machine`` sent decodes, starts with its handshake frame, and acks only reliable
    messages it was sent (control messages included)."""
    decoder = Decoder(Limits())
    decoder.feed(bytes(machine.out))
    frames: list[Frame] = []
    for _ in range(len(machine.out) + 1):
        frame = decoder.next_frame()  # raises if this side sent a bad frame
        if frame is None:
            break
        frames.append(frame)
    assert decoder.buffered == 0, "the output ends inside a frame"
    if not frames:
        return
    first = HandshakeRequest if machine.conn.role is Role.CONNECTOR else HandshakeResponse
    assert isinstance(frames[0], first), frames[0]
    reliable = {f.id for f in frames_of(bytes(machine.fed_bytes), LIMITS)
                if isinstance(f, Message) and f.reliable}  # fmt: skip
    for frame in frames:
        if isinstance(frame, Ack):
            assert frame.id in reliable, frame


def run_machine(role: Role, chunks: Sequence[bytes], times_: Sequence[float], auto_ack: bool,
                eof: bool) -> Machine:  # fmt: skip
    conn = Connection(role, ME, VERSION, SUPPORTED, {("orders", ""), ("x", "k")}, LIMITS,
                      resend_interval=RESEND, auto_ack=auto_ack)  # fmt: skip
    machine = Machine(conn)
    machine.start()
    now = 0.0
    for i, chunk in enumerate(chunks):
        if i < len(times_):
            now = times_[i]
            machine.timer(now)
        machine.feed(chunk, now)
    if eof:
        machine.feed(b"", now)
        assert machine.closed is not None
    if machine.closed is not None:
        machine.after_close(now)
    check_output(machine)
    return machine


@fuzz()
@given(
    data=st.data(),
    raw=inputs(TO_ACCEPTOR, ENCODERS),
    times_=st.lists(times, max_size=6),
    auto_ack=st.booleans(),
    eof=st.booleans(),
)
def test_the_acceptor_survives_any_input(
    data: st.DataObject, raw: bytes, times_: list[float], auto_ack: bool, eof: bool
) -> None:
    run_machine(Role.ACCEPTOR, data.draw(chunked(raw)), times_, auto_ack, eof)


@fuzz()
@given(
    data=st.data(),
    raw=inputs(TO_CONNECTOR, ENCODERS),
    times_=st.lists(times, max_size=6),
    auto_ack=st.booleans(),
    eof=st.booleans(),
)
def test_the_connector_survives_any_input(
    data: st.DataObject, raw: bytes, times_: list[float], auto_ack: bool, eof: bool
) -> None:
    run_machine(Role.CONNECTOR, data.draw(chunked(raw)), times_, auto_ack, eof)


@replays("tolliver", "to-acceptor")
def test_corpus_to_the_acceptor(raw: bytes) -> None:
    for chunks in splits(raw):
        for auto_ack in (False, True):
            run_machine(Role.ACCEPTOR, chunks, [0.0, 0.5, 2.0], auto_ack, eof=False)
        run_machine(Role.ACCEPTOR, chunks, [], True, eof=True)


@replays("tolliver", "to-connector")
def test_corpus_to_the_connector(raw: bytes) -> None:
    for chunks in splits(raw):
        for auto_ack in (False, True):
            run_machine(Role.CONNECTOR, chunks, [0.0, 0.5, 2.0], auto_ack, eof=False)
        run_machine(Role.CONNECTOR, chunks, [], True, eof=True)


# --------------------------------------------------------------------------- the timer


@fuzz()
@given(
    steps=st.lists(
        st.tuples(st.floats(0, 3, allow_nan=False),
                  st.sampled_from(("send", "timer", "ack", "again"))),
        max_size=40,
    ),
    interval=st.floats(0.01, 5, allow_nan=False),
)
def test_resends_are_never_left_overdue(steps: list[tuple[float, str]], interval: float) -> None:
    """Time moving forward, messages sent, acked and sent again under the same id: after
    ``handle_timer(now)`` no unacked message is due at ``now`` or before, and
    ``next_deadline()`` is the earliest due time; what is resent is what was due."""
    conn = Connection(Role.ACCEPTOR, ME, VERSION, SUPPORTED, resend_interval=interval)
    peer = Connection(Role.CONNECTOR, uuid.uuid4(), VERSION, SUPPORTED)
    peer.initiate()
    conn.receive_data(peer.data_to_send())
    assert isinstance(conn.next_event(), Established)
    assert isinstance(conn.next_event(), PeerSubscriptions)
    conn.data_to_send()
    now = 0.0
    due: dict[int, float] = {}  # the model: id -> next resend
    next_id = 1
    for dt, action in steps:
        now += dt
        if action == "send" or (action == "again" and not due):
            conn.send(Message("c", "", b"body", next_id), now)
            due[next_id] = now + interval
            next_id += 1
        elif action == "again":  # the same id again: its resend moves
            again = min(due)
            conn.send(Message("c", "", b"again", again), now)
            due[again] = now + interval
        elif action == "ack" and due:
            gone = min(due)
            conn.receive_data(bytes(encode(Ack(gone))))
            assert conn.next_event() == Acked(gone)
            del due[gone]
        else:
            conn.handle_timer(now)
            resent = {f.id for f in frames_of(conn.data_to_send(), Limits())
                      if isinstance(f, Message)}  # fmt: skip
            expected = {i for i, when in due.items() if when <= now}
            assert resent == expected
            for i in expected:
                due[i] = now + interval
            deadline = conn.next_deadline()
            assert deadline is None or deadline > now
        conn.data_to_send()
        assert conn.next_deadline() == (min(due.values()) if due else None)
        assert sorted(due) == conn.unacked()


# --------------------------------------------------------------------------- round trips

names = st.text(max_size=8).filter(lambda t: len(t.encode()) <= LIMITS.max_name_bytes)
u32 = st.sampled_from((0, 1, UNRELIABLE, 2**31, 2**32 - 1)) | st.integers(0, 2**32 - 1)
u64 = st.sampled_from((0, 1, 2**63 - 1, 2**64 - 1)) | st.integers(0, 2**64 - 1)
entries = st.lists(st.builds(SubscriptionEntry, st.sampled_from((0, 1)), names, names),
                   max_size=LIMITS.max_subscriptions).map(tuple)  # fmt: skip
uuids = st.builds(uuid.UUID, st.sampled_from(("0" * 32, "f" * 32)) | st.uuids().map(str))
frames = st.one_of(
    st.builds(Message, names, names, st.binary(max_size=LIMITS.max_body_bytes), u32),
    st.builds(Ack, u32),
    st.builds(HandshakeRequest, u64, uuids, entries),
    st.builds(HandshakeResponse, u64, uuids, st.integers(0, 255), entries),
    st.builds(HandshakeFinal, st.integers(0, 255)),
)


@fuzz(2)
@given(data=st.data(), sent=st.lists(frames, max_size=10))
def test_every_frame_round_trips(data: st.DataObject, sent: list[Frame]) -> None:
    wire = bytearray()
    for frame in sent:
        encode(frame, wire)
    decoder = Decoder(LIMITS)
    got: list[Frame] = []
    for chunk in data.draw(chunked(bytes(wire))):
        decoder.feed(chunk)
        while (decoded := decoder.next_frame()) is not None:
            got.append(decoded)
    assert got == sent
    assert decoder.buffered == 0


subscription_sets = st.sets(
    st.tuples(names, names).filter(lambda s: s[0] != CONTROL_CHANNEL), max_size=3
)


def expected_status(requester: int, responder: int, responder_speaks: frozenset[int]) -> int:
    """The seed's table, as the responder compares the versions."""
    if requester == responder:
        return 0
    if requester < responder:
        return 1 if requester in responder_speaks else 2
    return 3


@fuzz()
@given(
    data=st.data(),
    versions=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    speaks=st.tuples(st.sets(st.integers(1, 4)), st.sets(st.integers(1, 4))),
    subscriptions=st.tuples(subscription_sets, subscription_sets),
    auto_ack=st.booleans(),
)
def test_two_machines_handshake_and_deliver(
    data: st.DataObject, versions: tuple[int, int], speaks: tuple[set[int], set[int]],
    subscriptions: tuple[set[tuple[str, str]], set[tuple[str, str]]], auto_ack: bool,
) -> None:  # fmt: skip
    """Any two versions settle as the seed's table says; once established, every reliable
    message is received (resent until acked, so maybe twice), acks empty the resend queues,
    each side holds the other's subscriptions, changes included."""
    connector = Machine(Connection(Role.CONNECTOR, uuid.uuid4(), versions[0],
                                   frozenset(speaks[0]), set(subscriptions[0]), LIMITS,
                                   resend_interval=RESEND, auto_ack=auto_ack))  # fmt: skip
    acceptor = Machine(Connection(Role.ACCEPTOR, uuid.uuid4(), versions[1],
                                  frozenset(speaks[1]), set(subscriptions[1]), LIMITS,
                                  resend_interval=RESEND, auto_ack=auto_ack))  # fmt: skip
    connector.start()
    acceptor.start()
    sides = (connector, acceptor)
    read = [0, 0]  # how much of each side's output the other has read
    now = 0.0
    for _ in range(30):  # bounded: a few resends, then everything is acked
        moved = False
        for i, (sender, receiver) in enumerate(((connector, acceptor), (acceptor, connector))):
            fresh = bytes(sender.out[read[i] :])
            read[i] = len(sender.out)
            if fresh and receiver.closed is None:
                moved = True
                for chunk in data.draw(chunked(fresh)):
                    receiver.feed(chunk, now)
        if not moved:
            if not any(side.conn.unacked_count for side in sides if side.closed is None):
                break
            now += RESEND  # an ack is pending: the timer resends
            for side in sides:
                side.timer(now)
    else:
        raise AssertionError("the exchange did not settle")
    status = expected_status(versions[0], versions[1], acceptor.conn.supported)
    settled = status in (0, 1) or (status == 3 and versions[1] in connector.conn.supported)
    for side in sides:
        if not settled:
            assert side.closed is not None
            assert not side.closed.error, side.closed
            continue
        assert side.closed is None, side.closed
        established = [e for e in side.events if isinstance(e, Established)]
        assert len(established) == 1
        assert established[0].status == status
        assert established[0].version == min(versions)
        assert side.conn.unacked_count == 0
        other = acceptor if side is connector else connector
        assert side.conn.peer_subscriptions == other.conn.subscriptions
        got = {e.message.id for e in side.events if isinstance(e, Received) and e.message.reliable}
        assert got == set(SENT_IDS)
