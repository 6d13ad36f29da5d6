"""Fuzzing Seguro (docs/protocols/seguro.md): the server session (frame by frame and
``bulk``), the client session, and ``@p`` names.

Inputs start from ``corpus/seguro`` and are mutated (tests/fuzz/mutate.py; integers go in as
decimal text, the way Seguro writes them, and as runs of digits), then fed in random pieces to
a session whose application answers as the hub's or a ship's would. Small limits (lines of 64
bytes, events of 64, ``SAVE MANY`` of 8) so that the fuzzer reaches them, and lines of 8 KiB,
long enough for numbers of more digits than ``int()`` takes. Properties:

* ``receive_data`` and ``next_event`` never raise: a breach is one ``Breach`` (or ``Refused``)
  event, the last; after it nothing is parsed or sent, and the application's calls refuse with
  :class:`LocalProtocolError`;
* while open, the bytes waiting are at most a line, or the event data being waited for;
* everything a session sends is read by a session of the other role running the same flows,
  with no breach, and the ids it says committed never decrease;
* ``bulk=True`` gives the same events and the same breach as frame by frame;
* a ship and a hub deliver every event saved, and read back what was saved;
* ``validate_patp`` accepts a name or raises ``InvalidPatp``, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import chunked, corpus, decimal, fuzz, inputs, long_decimal, replays, splits, u8

from tidewire.model import MAX_ID, LocalProtocolError
from tidewire.protocols.seguro import (
    Breach,
    ClientSession,
    Committed,
    CommittedMany,
    Event,
    Hello,
    InvalidPatp,
    Latest,
    Limits,
    ManyEvent,
    ManyEvents,
    Point,
    Read,
    Refused,
    Save,
    SaveMany,
    Sent,
    ServerSession,
    StreamedMany,
    Welcome,
    validate_patp,
)
from tidewire.protocols.seguro.patp import PREFIXES, SUFFIXES

LIMITS = Limits(max_line_bytes=64, max_event_bytes=64, max_many_count=8)
# Lines long enough for numbers of more digits than Python's int() takes (4300)
LONG_LINES = Limits(max_line_bytes=8192, max_event_bytes=64, max_many_count=8)
ENCODERS = (decimal, long_decimal, u8)
TO_SERVER = corpus("seguro", "to-server")
TO_CLIENT = corpus("seguro", "to-client")
POINT = "~sampel-palnet"
VERSIONS = (0, 1)

Flow = tuple[str, int, int]  # ("save", id, size) | ("many", count, size) | ("read", start, limit)


def check_waiting(session: ServerSession | ClientSession) -> None:
    """A session that ran dry waits for one line, or for the event data it was announced."""
    if session.closed:
        return
    buffered = session.buffered
    awaiting = session.awaiting_data
    if awaiting is None:
        assert buffered <= session.limits.max_line_bytes, buffered
    else:
        assert buffered < awaiting + 2, (buffered, awaiting)


def after_close(session: ServerSession | ClientSession) -> None:
    session.receive_data(b"SAVE 100 1\nx\n\nREAD 1 1\n")
    session.receive_data(b"")
    assert session.next_event() is None
    assert session.data_to_send() == b""
    if isinstance(session, ServerSession):
        for call in (session.committed, session.committed_many, session.sent):
            with pytest.raises(LocalProtocolError):
                call()
        with pytest.raises(LocalProtocolError):
            session.welcome(None)
    else:
        with pytest.raises(LocalProtocolError):
            session.read(1, 1)


# --------------------------------------------------------------------------- the hub's side


@dataclass
class Hub:
    """The hub's application: welcomes the point, commits what is saved (telling ``LATEST``
    every other event of a ``SAVE MANY``), answers reads from what it stored."""

    session: ServerSession
    latest: int | None = None
    may_read: bool = True
    may_write: bool = True
    events: list[Event] = field(default_factory=list)
    stored: dict[int, bytes] = field(default_factory=dict)
    out: bytearray = field(default_factory=bytearray)
    flows: list[tuple[Event, list[tuple[int, bytes]]]] = field(default_factory=list)
    fed: int = 0
    _many: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def ended(self) -> Event | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Breach | Refused) else None

    def start(self) -> None:
        self.session.initiate()
        self.out += self.session.data_to_send()

    def feed(self, chunk: bytes) -> None:
        self.session.receive_data(chunk)  # never raises
        self.fed += len(chunk)
        self.drain()

    def drain(self) -> None:
        for _ in range(self.fed + 2):
            event = self.session.next_event()  # never raises
            if event is None:
                break
            assert self.ended is None, f"{event!r} after {self.ended!r}"
            self.events.append(event)
            self.react(event)
        else:
            raise AssertionError("next_event never ran dry")
        self.out += self.session.data_to_send()
        check_waiting(self.session)

    def react(self, event: Event) -> None:
        session = self.session
        match event:
            case Point():
                session.welcome(self.latest, may_read=self.may_read, may_write=self.may_write)
            case Save(event_id, data):
                self.stored[event_id] = data
                session.committed()
                self.flows.append((event, [(event_id, data)]))
            case SaveMany():
                self._many = []
            case ManyEvent(event_id, data):
                self._store(event_id, data)
            case ManyEvents(ids, datas):
                for event_id, data in zip(ids, datas, strict=True):
                    self._store(event_id, data)
            case StreamedMany():
                session.committed_many()
                self.flows.append((event, self._many))
            case Read(start, limit):
                sent = []
                for event_id in sorted(i for i in self.stored if i >= start)[:limit]:
                    session.send_event(event_id, self.stored[event_id])
                    sent.append((event_id, self.stored[event_id]))
                session.sent()
                self.flows.append((event, sent))
            case Breach() | Refused():
                assert session.closed

    def _store(self, event_id: int, data: bytes) -> None:
        self.stored[event_id] = data
        self._many.append((event_id, data))
        if len(self._many) % 2:
            self.session.latest_committed(event_id)


def run_hub(chunks: Sequence[bytes], eof: bool, *, bulk: bool = False,
            latest: int | None = None, may_read: bool = True, may_write: bool = True,
            limits: Limits = LIMITS) -> Hub:  # fmt: skip
    hub = Hub(ServerSession(VERSIONS, limits, bulk=bulk), latest, may_read, may_write)
    hub.start()
    for chunk in chunks:
        hub.feed(chunk)
    if eof:
        hub.feed(b"")
        assert hub.session.closed
    if hub.session.closed:
        after_close(hub.session)
    check_a_ship_reads(hub)
    return hub


def check_a_ship_reads(hub: Hub) -> None:
    """A ship running the flows the hub answered reads everything the hub sent, with no
    breach, and gets the same replies."""
    point = next((e.point for e in hub.events if isinstance(e, Point)), POINT)
    version = next((e.version for e in hub.events if isinstance(e, Hello)), 0)
    ship = ClientSession(point, version, Limits())
    ship.receive_data(bytes(hub.out))
    flows = list(hub.flows)
    got: list[Event] = []
    for _ in range(len(hub.out) + 2):
        event = ship.next_event()
        if event is None:
            break
        assert not isinstance(event, Breach), f"the ship could not read the hub: {event}"
        got.append(event)
        if isinstance(event, Welcome | Committed | CommittedMany | Sent) and flows:
            what, events = flows.pop(0)  # the next flow, as the hub saw it
            match what:
                case Save(event_id, data):
                    ship.save(event_id, data)
                case StreamedMany():
                    ship.save_many(events)
                case Read(start, limit):
                    ship.read(start, limit)
    assert not flows, f"flows the ship never saw answered: {flows}"
    committed = [e for e in got if isinstance(e, Committed | CommittedMany | Latest)]
    said = [e.id if isinstance(e, Committed | Latest) else e.end for e in committed]
    assert said == sorted(said), "the committed id went back"
    reads = [(e.id, e.data) for e in got if isinstance(e, ManyEvent)]
    expected = [pair for what, events in hub.flows if isinstance(what, Read) for pair in events]
    assert reads == expected


def flat(hub: Hub) -> tuple[list[object], object]:
    """The events as frame by frame gives them, and how it ended."""
    out: list[object] = []
    for event in hub.events:
        if isinstance(event, ManyEvents):
            out += [ManyEvent(i, d) for i, d in zip(event.ids, event.datas, strict=True)]
        elif not isinstance(event, Breach):
            out.append(event)
    return out, hub.ended


@fuzz()
@given(
    data=st.data(),
    raw=inputs(TO_SERVER, ENCODERS),
    eof=st.booleans(),
    bulk=st.booleans(),
    latest=st.sampled_from((None, 0, 42, MAX_ID)),
    rights=st.sampled_from(((True, True), (True, False), (False, True))),
    limits=st.sampled_from((LIMITS, LONG_LINES)),
)
def test_the_hub_side_survives_any_input(
    data: st.DataObject, raw: bytes, eof: bool, bulk: bool, latest: int | None,
    rights: tuple[bool, bool], limits: Limits,
) -> None:  # fmt: skip
    run_hub(data.draw(chunked(raw)), eof, bulk=bulk, latest=latest, may_read=rights[0],
            may_write=rights[1], limits=limits)  # fmt: skip


@fuzz()
@given(data=st.data(), raw=inputs(TO_SERVER, ENCODERS),
       limits=st.sampled_from((LIMITS, LONG_LINES)))  # fmt: skip
def test_bulk_reads_as_frame_by_frame_does(
    data: st.DataObject, raw: bytes, limits: Limits
) -> None:
    chunks = data.draw(chunked(raw))
    assert flat(run_hub(chunks, False, bulk=True, limits=limits)) == flat(
        run_hub(chunks, False, bulk=False, limits=limits)
    )


@replays("seguro", "to-server")
def test_corpus_to_the_hub(raw: bytes) -> None:
    for chunks in splits(raw):
        for bulk in (False, True):
            run_hub(chunks, True, bulk=bulk)
            run_hub(chunks, False, bulk=bulk, latest=42, may_read=False)
            run_hub(chunks, False, bulk=bulk, limits=LONG_LINES)
        assert flat(run_hub(chunks, False, bulk=True)) == flat(run_hub(chunks, False))


# --------------------------------------------------------------------------- the ship's side


@dataclass
class Ship:
    """A ship's application: once welcomed, runs ``flows`` one after the other, each with ids
    above the latest it was told."""

    session: ClientSession
    flows: list[Flow]
    events: list[Event] = field(default_factory=list)
    out: bytearray = field(default_factory=bytearray)
    started: list[tuple[str, list[tuple[int, bytes]], int, int]] = field(default_factory=list)
    fed: int = 0

    @property
    def ended(self) -> Breach | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Breach) else None

    def feed(self, chunk: bytes) -> None:
        self.session.receive_data(chunk)  # never raises
        self.fed += len(chunk)
        self.drain()

    def drain(self) -> None:
        for _ in range(self.fed + 2):
            event = self.session.next_event()  # never raises
            if event is None:
                break
            assert self.ended is None, f"{event!r} after {self.ended!r}"
            self.events.append(event)
            if isinstance(event, Welcome | Committed | CommittedMany | Sent):
                self.next_flow()
        else:
            raise AssertionError("next_event never ran dry")
        self.out += self.session.data_to_send()
        check_waiting(self.session)

    def next_flow(self) -> None:
        if not self.flows:
            return
        kind, a, b = self.flows.pop(0)
        latest = self.session.latest
        try:
            if kind == "save":
                data = bytes(range(b))
                self.session.save(latest + a, data)
                self.started.append((kind, [(latest + a, data)], 0, 0))
            elif kind == "many":
                events = [(latest + 1 + 3 * i, b"%d" % i * b) for i in range(max(2, a))]
                self.session.save_many(events)
                self.started.append((kind, events, 0, 0))
            else:
                self.session.read(a, b)
                self.started.append((kind, [], a, b))
        except LocalProtocolError:  # ids past 2^64-1: the only refusal of an idle ship
            assert latest + 3 * max(a, 2) + 1 > 2**64 - 1, (kind, a, b, latest)


flows = st.lists(
    st.one_of(
        st.tuples(st.just("save"), st.integers(1, 3), st.integers(0, 70)),
        st.tuples(st.just("many"), st.integers(2, 9), st.integers(0, 20)),
        st.tuples(st.just("read"), st.integers(0, 50), st.integers(0, 5)),
    ),
    max_size=4,
)


def run_ship(chunks: Sequence[bytes], eof: bool, flows_: list[Flow],
             limits: Limits = LIMITS) -> Ship:  # fmt: skip
    ship = Ship(ClientSession(POINT, 0, limits), list(flows_))
    for chunk in chunks:
        ship.feed(chunk)
    if eof:
        ship.feed(b"")
        assert ship.session.closed
    if ship.session.closed:
        after_close(ship.session)
    check_a_hub_reads(ship)
    return ship


def check_a_hub_reads(ship: Ship) -> None:
    """A hub welcoming the ship with the latest id it was told reads everything the ship sent,
    with no breach, and sees the same flows."""
    if any(i > MAX_ID for _, events, _, _ in ship.started for i, _ in events):
        return  # (the hub refuses ids above 2^63-1: docs/protocols/seguro.md)
    welcome = ship.session.welcomed
    hub = Hub(ServerSession(VERSIONS, Limits()), welcome.latest if welcome else None)
    hub.start()
    hub.feed(bytes(ship.out))
    assert hub.ended is None, hub.ended
    seen = [(type(what).__name__, events) for what, events in hub.flows]
    expected = []
    for kind, events, _, _ in ship.started:
        if kind == "save":
            expected.append(("Save", events))
        elif kind == "many":
            expected.append(("StreamedMany", events))
    assert [s for s in seen if s[0] != "Read"] == expected


@fuzz()
@given(data=st.data(), raw=inputs(TO_CLIENT, ENCODERS), eof=st.booleans(), flows_=flows,
       limits=st.sampled_from((LIMITS, LONG_LINES)))  # fmt: skip
def test_the_ship_side_survives_any_input(
    data: st.DataObject, raw: bytes, eof: bool, flows_: list[Flow], limits: Limits
) -> None:
    run_ship(data.draw(chunked(raw)), eof, flows_, limits)


# the flows the corpus's conversations are made for (make_corpus.py)
CORPUS_FLOWS: list[Flow] = [("save", 1, 5), ("many", 2, 1), ("read", 1, 10)]


@replays("seguro", "to-client")
def test_corpus_to_the_ship(raw: bytes) -> None:
    for chunks in splits(raw):
        run_ship(chunks, True, CORPUS_FLOWS)
        run_ship(chunks, False, [])
        run_ship(chunks, False, CORPUS_FLOWS, LONG_LINES)


# --------------------------------------------------------------------------- round trip


@fuzz()
@given(data=st.data(), flows_=flows, latest=st.sampled_from((None, 0, 7)))
def test_a_ship_and_a_hub_save_and_read_everything(
    data: st.DataObject, flows_: list[Flow], latest: int | None
) -> None:
    """Every byte each sends fed to the other in random pieces: every event saved is stored,
    every read gives back what is stored from its start, no breach, and the ship ends idle."""
    hub = Hub(ServerSession(VERSIONS, Limits()), latest)
    ship = Ship(ClientSession(POINT, 0, Limits()), list(flows_))
    hub.start()
    read = [0, 0]
    for _ in range(4 * len(flows_) + 10):  # bounded: each round trip ends a flow
        to_ship, to_hub = bytes(hub.out[read[0] :]), bytes(ship.out[read[1] :])
        if not to_ship and not to_hub:
            break
        read = [len(hub.out), len(ship.out)]
        for chunk in data.draw(chunked(to_ship)):
            ship.feed(chunk)
        for chunk in data.draw(chunked(to_hub)):
            hub.feed(chunk)
    else:
        raise AssertionError("the conversation did not end")
    assert hub.ended is None, hub.ended
    assert ship.ended is None, ship.ended
    assert ship.session.state.value == "idle"
    assert not ship.flows
    saved: dict[int, bytes] = {}
    expected: list[tuple[int, bytes]] = []
    for kind, events, start, limit in ship.started:  # a read sees what was saved before it
        saved.update(events)
        if kind == "read":
            expected += sorted((i, d) for i, d in saved.items() if i >= start)[:limit]
    assert hub.stored == saved
    assert [(e.id, e.data) for e in ship.events if isinstance(e, ManyEvent)] == expected


# --------------------------------------------------------------------------- @p


@st.composite
def patps(draw: st.DrawFn) -> str:
    """A mutated ``@p``: syllables from the tables (or not), grouped right (or not)."""
    words = draw(st.sampled_from((1, 2, 4, 8, 3, 0)))
    if words == 0:
        return draw(st.text(max_size=20))
    syllables = st.sampled_from(PREFIXES) | st.text("abcdz", min_size=3, max_size=3)
    endings = st.sampled_from(SUFFIXES) | st.text("abcdz", min_size=3, max_size=3)
    parts = [draw(syllables) + draw(endings) for _ in range(words)]
    if words == 1 and draw(st.booleans()):
        parts = [draw(endings)]
    joints = [draw(st.sampled_from(("-", "--", "", "_"))) for _ in parts[1:]]
    text = "~" + parts[0] + "".join(j + p for j, p in zip(joints, parts[1:], strict=True))
    if draw(st.booleans()):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(max_size=2)) + text[at + draw(st.integers(0, 2)) :]
    return text


@fuzz(3)
@given(text=patps())
def test_patp_validation_accepts_or_refuses(text: str) -> None:
    try:
        assert validate_patp(text) == text
    except InvalidPatp:
        return
    assert text.startswith("~")
    assert text == text.lower()
    words = text[1:].replace("--", "-").split("-")
    assert len(words) in (1, 2, 4, 8)
