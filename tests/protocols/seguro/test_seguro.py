"""Seguro (seed 004): the sans-IO sessions against transcripts written from the seed, byte for
byte, in both directions and cut anywhere; ``@p`` validation; every rule of the seed broken
once (sans-IO and over sockets: the connection is dropped at once, the drop is logged, what was
acknowledged stays, other sessions carry on); round trips, durability, streaming and the
non-decreasing committed id over real sockets, with RS.io reading what Seguro wrote."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tidewire
from helpers import run
from tidewire.client.seguro import SeguroError, connect
from tidewire.hub import EmbeddedStorage, Hub
from tidewire.model import MAX_ID, LocalProtocolError
from tidewire.protocols.seguro import (
    Breach,
    ClientSession,
    Committed,
    CommittedMany,
    Event,
    Hello,
    Identify,
    InvalidPatp,
    Latest,
    ManyEvent,
    Point,
    Read,
    Save,
    SaveMany,
    Seguro,
    Sent,
    ServerSession,
    StreamedMany,
    Welcome,
    rank,
    validate_patp,
)
from tidewire.protocols.seguro.patp import PREFIXES, SUFFIXES
from tidewire.server.rsio import start_rsio_server
from tidewire.server.seguro import MAX_PENDING_BYTES, SeguroServer, start_seguro_server

U64_OVER = b"18446744073709551616"  # 2**64
U64_MAX = b"18446744073709551615"

# --------------------------------------------------------------------------- transcripts

Flow = Save | Read | tuple[ManyEvent, ...]
"""What the ship does next: a SAVE, a READ, or a SAVE MANY of these events."""


@dataclass(frozen=True)
class Transcript:
    """One session, as the bytes each side says (``"S"`` the hub, ``"C"`` the ship), in order."""

    name: str
    stored: dict[int, bytes]  # what the hub holds for ~zod before the session
    flows: tuple[Flow, ...]  # what the ship does after WELCOME, one flow per reply
    steps: tuple[tuple[str, bytes], ...]
    server_events: tuple[Event, ...]
    client_events: tuple[Event, ...]
    latest_before_committed_many: bool = False  # the hub says LATEST <first id> first

    def said(self, side: str) -> bytes:
        return b"".join(data for who, data in self.steps if who == side)


HANDSHAKE: tuple[tuple[str, bytes], ...] = (
    ("S", b"SEGURO 0\n"),
    ("C", b"HELLO 0\n"),
    ("S", b"IDENTIFY 0\n"),
    ("C", b"POINT ~zod\n"),
)

FRESH = Transcript(
    name="fresh",
    stored={},
    flows=(
        Save(5, b"hello"),
        (ManyEvent(6, b"a"), ManyEvent(9, b"bb")),
        Read(1, 10),
        Read(10, 10),
    ),
    steps=(
        *HANDSHAKE,
        ("S", b"WELCOME ~zod\n"),
        ("C", b"SAVE 5 5\nhello\n\n"),
        ("S", b"COMMITTED 5 5\n"),
        ("C", b"SAVE MANY 2 6 9\n"),
        ("C", b"EVENT 6 1\na\n\n"),
        ("C", b"EVENT 9 2\nbb\n\n"),
        ("C", b"STREAMED MANY 2 6 9\n"),
        ("S", b"LATEST 6\n"),
        ("S", b"COMMITTED MANY 2 6 9\n"),
        ("C", b"READ 1 10\n"),
        ("S", b"EVENT 5 5\nhello\n\n"),
        ("S", b"EVENT 6 1\na\n\n"),
        ("S", b"EVENT 9 2\nbb\n\n"),
        ("S", b"SENT 3 5 9\n"),
        ("C", b"READ 10 10\n"),
        ("S", b"SENT 0 0 0\n"),
    ),
    server_events=(
        Hello(0),
        Point("~zod"),
        Save(5, b"hello"),
        SaveMany(2, 6, 9),
        ManyEvent(6, b"a"),
        ManyEvent(9, b"bb"),
        StreamedMany(2, 6, 9),
        Read(1, 10),
        Read(10, 10),
    ),
    client_events=(
        Seguro((0,)),
        Identify(0),
        Welcome("~zod", None),
        Committed(5, 5),
        Latest(6),
        CommittedMany(2, 6, 9),
        ManyEvent(5, b"hello"),
        ManyEvent(6, b"a"),
        ManyEvent(9, b"bb"),
        Sent(3, 5, 9),
        Sent(0, 0, 0),
    ),
    latest_before_committed_many=True,
)

RAW = bytes(range(256)) + b"\n\n\n\nEVENT 1 1\nx\n\n"  # data that looks like framing

STORED = Transcript(
    name="stored",
    stored={41: b"old", 42: b""},
    flows=(
        Save(43, b""),
        (ManyEvent(44, RAW), ManyEvent(47, b"\n"), ManyEvent(50, b"SENT 0 0 0\n")),
        Read(42, 2),
        Read(0, 0),
        Read(45, 100),
    ),
    steps=(
        *HANDSHAKE,
        ("S", b"WELCOME ~zod 42\n"),
        ("C", b"SAVE 43 0\n\n\n"),
        ("S", b"COMMITTED 43 0\n"),
        ("C", b"SAVE MANY 3 44 50\n"),
        ("C", b"EVENT 44 %d\n%s\n\n" % (len(RAW), RAW)),
        ("C", b"EVENT 47 1\n\n\n\n"),
        ("C", b"EVENT 50 11\nSENT 0 0 0\n\n\n"),
        ("C", b"STREAMED MANY 3 44 50\n"),
        ("S", b"COMMITTED MANY 3 44 50\n"),
        ("C", b"READ 42 2\n"),
        ("S", b"EVENT 42 0\n\n\n"),
        ("S", b"EVENT 43 0\n\n\n"),
        ("S", b"SENT 2 42 43\n"),
        ("C", b"READ 0 0\n"),
        ("S", b"SENT 0 0 0\n"),
        ("C", b"READ 45 100\n"),  # 45 does not exist: from the first id above it
        ("S", b"EVENT 47 1\n\n\n\n"),
        ("S", b"EVENT 50 11\nSENT 0 0 0\n\n\n"),
        ("S", b"SENT 2 47 50\n"),
    ),
    server_events=(
        Hello(0),
        Point("~zod"),
        Save(43, b""),
        SaveMany(3, 44, 50),
        ManyEvent(44, RAW),
        ManyEvent(47, b"\n"),
        ManyEvent(50, b"SENT 0 0 0\n"),
        StreamedMany(3, 44, 50),
        Read(42, 2),
        Read(0, 0),
        Read(45, 100),
    ),
    client_events=(
        Seguro((0,)),
        Identify(0),
        Welcome("~zod", 42),
        Committed(43, 0),
        CommittedMany(3, 44, 50),
        ManyEvent(42, b""),
        ManyEvent(43, b""),
        Sent(2, 42, 43),
        Sent(0, 0, 0),
        ManyEvent(47, b"\n"),
        ManyEvent(50, b"SENT 0 0 0\n"),
        Sent(2, 47, 50),
    ),
)

TRANSCRIPTS = [FRESH, STORED]


class FakeHub:
    """The hub's side of a transcript: answers each server event the way the listener does."""

    def __init__(self, stored: dict[int, bytes], latest_before_committed_many: bool) -> None:
        self.events = dict(stored)
        self.latest_first = latest_before_committed_many
        self.many: list[int] = []

    def react(self, server: ServerSession, event: Event) -> None:
        match event:
            case Point():
                server.welcome(max(self.events) if self.events else None)
            case Save(event_id, data):
                self.events[event_id] = data
                server.committed()
            case ManyEvent(event_id, data):
                self.events[event_id] = data
                self.many.append(event_id)
            case StreamedMany():
                if self.latest_first:
                    server.latest_committed(self.many[0])
                server.committed_many()
                self.many.clear()
            case Read(start, limit):
                for event_id in sorted(i for i in self.events if i >= start)[:limit]:
                    server.send_event(event_id, self.events[event_id])
                server.sent()
            case _:
                pass


def pieces(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]


def run_server(t: Transcript, chunks: Iterable[bytes]) -> tuple[list[Event], bytes]:
    """Feed the ship's bytes to a ServerSession; the hub's bytes and the session's events."""
    server = ServerSession()
    hub = FakeHub(t.stored, t.latest_before_committed_many)
    server.initiate()
    out = bytearray(server.data_to_send())
    events: list[Event] = []
    for chunk in chunks:
        server.receive_data(chunk)
        while (event := server.next_event()) is not None:
            events.append(event)
            hub.react(server, event)
        out += server.data_to_send()
    server.receive_data(b"")  # the ship leaves between flows: no breach
    assert server.next_event() is None
    assert server.closed
    return events, bytes(out)


def start_flow(client: ClientSession, flow: Flow) -> None:
    if isinstance(flow, Save):
        client.save(flow.id, flow.data)
    elif isinstance(flow, Read):
        client.read(flow.start, flow.limit)
    else:
        client.save_many([(e.id, e.data) for e in flow])


def run_client(t: Transcript, chunks: Iterable[bytes]) -> tuple[list[Event], bytes]:
    """Feed the hub's bytes to a ClientSession that runs the transcript's flows."""
    client = ClientSession("~zod")
    flows = deque(t.flows)
    out = bytearray()
    events: list[Event] = []
    for chunk in chunks:
        client.receive_data(chunk)
        while (event := client.next_event()) is not None:
            events.append(event)
            if isinstance(event, Welcome | Committed | CommittedMany | Sent) and flows:
                start_flow(client, flows.popleft())
        out += client.data_to_send()
    assert not flows
    return events, bytes(out)


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=lambda t: t.name)
def test_transcript_at_once(t: Transcript) -> None:
    events, said = run_server(t, [t.said("C")])
    assert events == list(t.server_events)
    assert said == t.said("S")
    events, said = run_client(t, [t.said("S")])
    assert events == list(t.client_events)
    assert said == t.said("C")


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=lambda t: t.name)
def test_transcript_byte_by_byte(t: Transcript) -> None:
    ship, hub = t.said("C"), t.said("S")
    events, said = run_server(t, [ship[i : i + 1] for i in range(len(ship))])
    assert (events, said) == (list(t.server_events), hub)
    events, said = run_client(t, [hub[i : i + 1] for i in range(len(hub))])
    assert (events, said) == (list(t.client_events), ship)


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=lambda t: t.name)
@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=40))
def test_transcript_cut_anywhere(t: Transcript, cuts: list[int]) -> None:
    ship, hub = t.said("C"), t.said("S")
    events, said = run_server(t, pieces(ship, cuts))
    assert (events, said) == (list(t.server_events), hub)
    events, said = run_client(t, pieces(hub, cuts))
    assert (events, said) == (list(t.client_events), ship)


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=lambda t: t.name)
def test_the_two_machines_talk_the_transcript(t: Transcript) -> None:
    """A ClientSession wired to a ServerSession says exactly the transcript, in order."""
    server, client = ServerSession(), ClientSession("~zod")
    hub = FakeHub(t.stored, t.latest_before_committed_many)
    flows = deque(t.flows)
    wire: list[tuple[str, bytes]] = []
    server.initiate()
    for _ in range(100):
        if data := server.data_to_send():
            wire.append(("S", data))
            client.receive_data(data)
            while (event := client.next_event()) is not None:
                if isinstance(event, Welcome | Committed | CommittedMany | Sent) and flows:
                    start_flow(client, flows.popleft())
        elif data := client.data_to_send():
            wire.append(("C", data))
            server.receive_data(data)
            while (event := server.next_event()) is not None:
                hub.react(server, event)
        else:
            break
    assert not flows
    assert [w for w, _ in wire] == [w for w, _ in _merged(t.steps)]
    assert wire == _merged(t.steps)


def _merged(steps: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Consecutive steps of one side joined (what one ``data_to_send`` gives)."""
    out: list[tuple[str, bytes]] = []
    for who, data in steps:
        if out and out[-1][0] == who:
            out[-1] = (who, out[-1][1] + data)
        else:
            out.append((who, data))
    return out


def test_greeting_lists_every_version_and_the_client_picks_its_own() -> None:
    server = ServerSession(versions=(0, 7, 65535))
    server.initiate()
    assert server.data_to_send() == b"SEGURO 0 7 65535\n"
    client = ClientSession("~sampel-palnet", version=7)
    client.receive_data(b"SEGURO 0 7 65535\n")
    assert client.next_event() == Seguro((0, 7, 65535))
    assert client.data_to_send() == b"HELLO 7\n"
    server.receive_data(b"HELLO 7\n")
    assert server.next_event() == Hello(7)
    assert server.data_to_send() == b"IDENTIFY 7\n"
    client.receive_data(b"IDENTIFY 7\n")
    assert client.next_event() == Identify(7)
    assert client.data_to_send() == b"POINT ~sampel-palnet\n"
    server.receive_data(b"POINT ~sampel-palnet\n")
    assert server.next_event() == Point("~sampel-palnet")
    server.welcome(None)
    assert server.data_to_send() == b"WELCOME ~sampel-palnet\n"


def test_leading_zeros_are_decimal_and_the_largest_numbers_fit() -> None:
    """Decimal digits, leading zeros accepted (docs decision); u64 max is a valid READ."""
    server = ready_server()
    server.receive_data(b"READ 0005 " + U64_MAX + b"\n")
    assert server.next_event() == Read(5, 2**64 - 1)
    server.sent()
    server.receive_data(b"SAVE %d 1\nx\n\n" % MAX_ID)  # the largest id tidewire stores
    assert server.next_event() == Save(MAX_ID, b"x")


# --------------------------------------------------------------------------- @p


@pytest.mark.parametrize(
    ("patp", "kind"),
    [
        ("~zod", "galaxy"),
        ("~nec", "galaxy"),
        ("~fes", "galaxy"),
        ("~marzod", "star"),
        ("~fipfes", "star"),
        ("~sampel-palnet", "planet"),
        ("~doznec-dozzod", "planet"),
        ("~taglux-nidsep-sampel-palnet", "moon"),
        ("~dozzod-marzod-sampel-palnet", "moon"),
        ("~dasres-ragnep-lislyt-ribpyl--mosnyx-bisdem-nidful-marzod", "comet"),
    ],
)
def test_patp_accepted(patp: str, kind: str) -> None:
    assert rank(patp) == kind
    assert validate_patp(patp) == patp


@pytest.mark.parametrize(
    "patp",
    [
        "",
        "~",
        "zod",  # no ~
        "sampel-palnet",
        "~Zod",  # uppercase
        "~SAMPEL-PALNET",
        "~zad",  # not a syllable
        "~mar",  # a prefix is not a galaxy
        "~zodmar",  # suffix then prefix
        "~palsam",
        "~sampel-palxyz",
        "~sampel-pelnet",  # pel is a suffix, not a prefix
        "~sampel-palnet-marzod",  # three words
        "~dozzod-dozzod",  # a leading zero word: that is ~zod
        "~dozzod",  # a star that is a galaxy
        "~dozzod-dozzod-sampel-palnet",  # a moon with zero top half
        "~dozzod-dozzod-dozzod-dozzod--sampel-palnet-sampel-palnet",
        "~sampel--palnet",  # -- misplaced
        "~sampel-palnet--sampel-palnet",
        "~dasres-ragnep-lislyt--ribpyl-mosnyx-bisdem-nidful-marzod",
        "~dasres-ragnep-lislyt-ribpyl-mosnyx-bisdem-nidful-marzod",  # comet without --
        "~sampel-palnet-",
        "~-sampel-palnet",
        "~sampel_palnet",
        " ~zod",
        "~zod ",
        "~zod\n",
        "~~zod",
    ],
)
def test_patp_refused(patp: str) -> None:
    with pytest.raises(InvalidPatp):
        rank(patp)
    with pytest.raises(InvalidPatp):
        validate_patp(patp)


WORD = st.builds(lambda p, s: p + s, st.sampled_from(PREFIXES), st.sampled_from(SUFFIXES))
ZERO = "dozzod"


@st.composite
def patps(draw: st.DrawFn) -> tuple[str, str]:
    kind = draw(st.sampled_from(["galaxy", "star", "planet", "moon", "comet"]))
    if kind == "galaxy":
        return "~" + draw(st.sampled_from(SUFFIXES)), kind
    if kind == "star":
        return "~" + draw(st.sampled_from(PREFIXES[1:])) + draw(st.sampled_from(SUFFIXES)), kind
    n, top = {"planet": (2, 1), "moon": (4, 2), "comet": (8, 4)}[kind]
    words = draw(st.lists(st.one_of(WORD, st.just(ZERO)), min_size=n, max_size=n))
    if all(w == ZERO for w in words[:top]):
        words[draw(st.integers(0, top - 1))] = draw(WORD.filter(lambda w: w != ZERO))
    if kind == "comet":
        return "~" + "-".join(words[:4]) + "--" + "-".join(words[4:]), kind
    return "~" + "-".join(words), kind


@settings(max_examples=300, deadline=None)
@given(patps())
def test_patp_property_every_valid_shape_is_accepted(patp_kind: tuple[str, str]) -> None:
    patp, kind = patp_kind
    assert rank(patp) == kind
    with pytest.raises(InvalidPatp):
        rank(patp.upper())
    with pytest.raises(InvalidPatp):
        rank(patp[1:])  # without its ~


# --------------------------------------------------------------------------- bad input

READY = b"HELLO 0\nPOINT ~zod\nSAVE 4 4\nfour\n\n"
"""The ship's handshake and one acknowledged event (id 4): the state every "ready" case starts
from (the hub answers WELCOME ~zod, COMMITTED 4 4)."""


@dataclass(frozen=True)
class Bad:
    name: str
    data: bytes
    ready: bool = True  # after READY; else from the first byte
    eof: bool = False  # the ship then closes its side
    marks: tuple[pytest.MarkDecorator, ...] = field(default=())


MANY = b"SAVE MANY 2 6 9\nEVENT 6 1\na\n\n"

BAD: list[Bad] = [
    # -- the handshake
    Bad("save before the handshake", b"SAVE 5 5\nhello\n\n", ready=False),
    Bad("read before the handshake", b"READ 1 10\n", ready=False),
    Bad("point before hello", b"POINT ~zod\n", ready=False),
    Bad("save instead of point", b"HELLO 0\nSAVE 5 5\nhello\n\n", ready=False),
    Bad("hello twice", b"HELLO 0\nHELLO 0\n", ready=False),
    Bad("hello in lower case", b"hello 0\n", ready=False),
    Bad("hello without a version", b"HELLO\n", ready=False),
    Bad("hello +0", b"HELLO +0\n", ready=False),
    Bad("hello -0", b"HELLO -0\n", ready=False),
    Bad("hello double space", b"HELLO  0\n", ready=False),
    Bad("hello trailing space", b"HELLO 0 \n", ready=False),
    Bad("hello leading space", b" HELLO 0\n", ready=False),
    Bad("hello hex", b"HELLO 0x0\n", ready=False),
    Bad("version past 16 bits", b"HELLO 65536\n", ready=False),
    Bad("version past 64 bits", b"HELLO " + U64_OVER + b"\n", ready=False),
    Bad("a wrong version", b"HELLO 1\n", ready=False),
    Bad("point without ~", b"HELLO 0\nPOINT zod\n", ready=False),
    Bad("point in upper case", b"HELLO 0\nPOINT ~ZOD\n", ready=False),
    Bad("point of wrong syllables", b"HELLO 0\nPOINT ~sampel-pelnet\n", ready=False),
    Bad("point of three words", b"HELLO 0\nPOINT ~sampel-palnet-marzod\n", ready=False),
    Bad("point with a leading zero", b"HELLO 0\nPOINT ~dozzod-dozzod\n", ready=False),
    Bad("point with -- misplaced", b"HELLO 0\nPOINT ~sampel--palnet\n", ready=False),
    Bad("point empty", b"HELLO 0\nPOINT \n", ready=False),
    Bad("point missing", b"HELLO 0\nPOINT\n", ready=False),
    Bad("point twice on a line", b"HELLO 0\nPOINT ~zod ~zod\n", ready=False),
    Bad("point not ascii", b"HELLO 0\nPOINT ~z\xc3\xb6d\n", ready=False),
    # -- numbers
    Bad("save id +5", b"SAVE +5 5\nhello\n\n"),
    Bad("save id -5", b"SAVE -5 5\nhello\n\n"),
    Bad("save length +5", b"SAVE 5 +5\nhello\n\n"),
    Bad("read limit -1", b"READ 1 -1\n"),
    Bad("save many count +2", b"SAVE MANY +2 6 9\n"),
    Bad("event id +6", b"SAVE MANY 2 6 9\nEVENT +6 1\na\n\n"),
    Bad("save double space", b"SAVE  5 5\nhello\n\n"),
    Bad("save trailing space", b"SAVE 5 5 \nhello\n\n"),
    Bad("save leading space", b" SAVE 5 5\nhello\n\n"),
    Bad("save tab", b"SAVE\t5 5\nhello\n\n"),
    Bad("read double space", b"READ 1  10\n"),
    Bad("read trailing space", b"READ 1 10 \n"),
    Bad("save many double space", b"SAVE  MANY 2 6 9\n"),
    Bad("save many trailing space", b"SAVE MANY 2 6 9 \n"),
    Bad("event double space", b"SAVE MANY 2 6 9\nEVENT 6  1\na\n\n"),
    Bad("streamed many trailing space", MANY + b"EVENT 9 1\nb\n\nSTREAMED MANY 2 6 9 \n"),
    Bad("save hex id", b"SAVE 0x10 5\nhello\n\n"),
    Bad("read hex start", b"READ 0x1 10\n"),
    Bad("save id past 64 bits", b"SAVE " + U64_OVER + b" 5\nhello\n\n"),
    Bad("save length past 64 bits", b"SAVE 5 " + U64_OVER + b"\nhello\n\n"),
    Bad("read limit past 64 bits", b"READ 1 " + U64_OVER + b"\n"),
    Bad("save many count past 64 bits", b"SAVE MANY " + U64_OVER + b" 6 9\n"),
    Bad("event id past 64 bits", b"SAVE MANY 2 6 9\nEVENT " + U64_OVER + b" 1\na\n\n"),
    Bad("save id above 2**63-1 (decision)", b"SAVE %d 1\nx\n\n" % (MAX_ID + 1)),
    Bad("save many end above 2**63-1", b"SAVE MANY 2 6 %d\n" % (MAX_ID + 1)),
    Bad("a number of unicode digits", "READ 1 ١٠\n".encode()),
    Bad("a line too long", b"READ 1 " + b"1" * 2000 + b"\n"),
    # -- data framing
    Bad("data one byte short", b"SAVE 5 5\nhell\n\nREAD 1 10\n"),
    Bad("data one byte short, then close", b"SAVE 5 5\nhell\n\n", eof=True),
    Bad("data one byte long", b"SAVE 5 5\nhelloo\n\n"),
    Bad("data then one newline", b"SAVE 5 5\nhello\nREAD 1 10\n"),
    Bad("data then no newline", b"SAVE 5 5\nhelloREAD 1 10\n"),
    Bad("data then three newlines", b"SAVE 5 5\nhello\n\n\n"),
    Bad("data then crlf", b"SAVE 5 5\nhello\r\n\r\n"),
    Bad("crlf after the save line", b"SAVE 5 5\r\nhello\n\n"),
    Bad("close in the middle of data", b"SAVE 5 5\nhel", eof=True),
    Bad("event data one byte short", b"SAVE MANY 2 6 9\nEVENT 6 2\na\n\nEVENT 9 1\nb\n\n"),
    Bad("event data one byte long", b"SAVE MANY 2 6 9\nEVENT 6 1\naa\n\n"),
    Bad("event data then one newline", b"SAVE MANY 2 6 9\nEVENT 6 1\na\nEVENT 9 1\nb\n\n"),
    Bad("event data then three newlines", MANY + b"\nEVENT 9 1\nb\n\n"),
    # -- ids
    Bad("save id equal to the latest", b"SAVE 4 1\nx\n\n"),
    Bad("save id below the latest", b"SAVE 3 1\nx\n\n"),
    Bad("save id 0", b"SAVE 0 1\nx\n\n"),
    Bad("save id repeated", b"SAVE 5 1\nx\n\nSAVE 5 1\ny\n\n"),
    Bad("save many start equal to the latest", b"SAVE MANY 2 4 9\n"),
    Bad("save many start below the latest", b"SAVE MANY 2 1 9\n"),
    Bad("save many end equal to start", b"SAVE MANY 2 6 6\n"),
    Bad("save many end below start", b"SAVE MANY 2 9 6\n"),
    Bad("save many of one event", b"SAVE MANY 1 6 9\nEVENT 6 1\na\n\n"),
    Bad("save many of zero events", b"SAVE MANY 0 6 9\n"),
    Bad("save many count that cannot fit its ids", b"SAVE MANY 5 6 9\n"),
    Bad("fewer events than declared",
        b"SAVE MANY 3 6 9\nEVENT 6 1\na\n\nEVENT 9 1\nb\n\nSTREAMED MANY 3 6 9\n"),
    Bad("more events than declared", MANY + b"EVENT 7 1\nb\n\nEVENT 9 1\nc\n\n"),
    Bad("event ids repeat", b"SAVE MANY 3 6 9\nEVENT 6 1\na\n\nEVENT 6 1\nb\n\n"),
    Bad("event ids decrease",
        b"SAVE MANY 3 6 9\nEVENT 6 1\na\n\nEVENT 8 1\nb\n\nEVENT 7 1\nc\n\n"),
    Bad("first event id is not start", b"SAVE MANY 2 6 9\nEVENT 7 1\na\n\n"),
    Bad("last event id is not end", MANY + b"EVENT 8 1\nb\n\nSTREAMED MANY 2 6 9\n"),
    Bad("event id past end", MANY + b"EVENT 10 1\nb\n\n"),
    Bad("streamed many count differs", MANY + b"EVENT 9 1\nb\n\nSTREAMED MANY 3 6 9\n"),
    Bad("streamed many start differs", MANY + b"EVENT 9 1\nb\n\nSTREAMED MANY 2 5 9\n"),
    Bad("streamed many end differs", MANY + b"EVENT 9 1\nb\n\nSTREAMED MANY 2 6 10\n"),
    Bad("streamed many of three fields", MANY + b"EVENT 9 1\nb\n\nSTREAMED MANY 2 6\n"),
    Bad("streamed many misspelled", MANY + b"EVENT 9 1\nb\n\nSTREAMED MANYX 2 6 9\n"),
    Bad("streamed many before any event", b"SAVE MANY 2 6 9\nSTREAMED MANY 2 6 9\n"),
    Bad("close in the middle of save many", MANY, eof=True),
    # -- flow order and unknown commands
    Bad("read in the middle of save many", MANY + b"READ 1 10\n"),
    Bad("save in the middle of save many", MANY + b"SAVE 10 1\nx\n\n"),
    Bad("save many in the middle of save many", MANY + b"SAVE MANY 2 10 11\n"),
    Bad("unknown command", b"FROB 1\n"),
    Bad("save in lower case", b"save 5 5\nhello\n\n"),
    Bad("savemany", b"SAVEMANY 2 6 9\n"),
    Bad("an empty line", b"\n"),
    Bad("hello again", b"HELLO 0\n"),
    Bad("point again", b"POINT ~zod\n"),
    Bad("latest from the ship", b"LATEST 5\n"),
    Bad("committed from the ship", b"COMMITTED 5 5\n"),
    Bad("sent from the ship", b"SENT 0 0 0\n"),
    Bad("event outside save many", b"EVENT 5 1\nx\n\n"),
    Bad("streamed many outside save many", b"STREAMED MANY 2 6 9\n"),
    Bad("read of one field", b"READ 1\n"),
    Bad("read of three fields", b"READ 1 2 3\n"),
    Bad("save of two fields", b"SAVE 5\nhello\n\n"),
]  # fmt: skip


def bad_params() -> list[Any]:
    return [pytest.param(b, id=b.name, marks=b.marks) for b in BAD]


def ready_server() -> ServerSession:
    server = ServerSession()
    server.initiate()
    server.receive_data(READY)
    hub = FakeHub({}, False)
    for _ in range(3):  # Hello, Point, Save
        event = server.next_event()
        assert event is not None
        hub.react(server, event)
    assert server.data_to_send() == b"SEGURO 0\nIDENTIFY 0\nWELCOME ~zod\nCOMMITTED 4 4\n"
    return server


@pytest.mark.parametrize("bad", bad_params())
def test_breach_sans_io(bad: Bad) -> None:
    """Answered as the listener does (each event at once): the machine emits Breach, closes,
    and ignores everything after."""
    if bad.ready:
        server = ready_server()
    else:
        server = ServerSession()
        server.initiate()
        server.data_to_send()
    hub = FakeHub({4: b"four"} if bad.ready else {}, False)
    server.receive_data(bad.data)
    if bad.eof:
        server.receive_data(b"")
    events: list[Event] = []
    while (event := server.next_event()) is not None:
        events.append(event)
        hub.react(server, event)
    assert events, "no event at all"
    assert isinstance(events[-1], Breach), events
    assert events[-1].reason
    assert not any(isinstance(e, Breach) for e in events[:-1])
    assert server.closed
    server.data_to_send()
    server.receive_data(b"READ 1 10\n")
    assert server.next_event() is None
    assert server.data_to_send() == b""


PIPELINED = [  # the ship's bytes, the id acknowledged, the reply to the command that breaches
    pytest.param(b"SAVE 5 1\na\n\nSAVE 6 1\nb\n\n", 5, b"COMMITTED 6 1\n",
                 id="save before committed"),
    pytest.param(MANY + b"EVENT 9 1\nb\n\nSTREAMED MANY 2 6 9\nREAD 1 10\n", 9, b"SENT 3 4 9\n",
                 id="read before committed many"),
    pytest.param(b"READ 1 10\nSAVE 5 1\na\n\n", 4, b"COMMITTED 5 1\n", id="save before sent"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "acked", "reply"), PIPELINED)
def test_new_command_before_the_reply_sans_io(data: bytes, acked: int, reply: bytes) -> None:
    """Pulled before the reply is given, a command that follows a flow is a breach."""
    server = ready_server()
    server.receive_data(data)
    events: list[Event] = []
    while (event := server.next_event()) is not None:
        events.append(event)
    assert isinstance(events[-1], Breach), events
    assert "before the reply" in events[-1].reason
    assert server.closed


def test_server_refuses_to_say_a_committed_id_below_what_it_said() -> None:
    server = ready_server()  # COMMITTED 4 said
    with pytest.raises(LocalProtocolError):
        server.latest_committed(3)
    server.latest_committed(4)  # may repeat
    assert server.data_to_send() == b"LATEST 4\n"


@pytest.mark.parametrize("bulk", [False, True])
def test_inbound_bytes_and_receiving_say_what_a_declaration_promises(bulk: bool) -> None:
    """What the adapter charges to the budget (issue 20): the declared data from its header
    on, whatever has come of it; ``receiving`` while a message is unfinished, never between
    two events of a SAVE MANY."""
    server = ServerSession(bulk=bulk)
    server.receive_data(b"HELLO 0\nPOINT ~zod\n")
    while server.next_event() is not None:
        pass
    server.welcome(None)
    assert (server.inbound_bytes, server.receiving) == (0, False)
    server.receive_data(b"SAVE 1 1000")
    assert server.next_event() is None
    assert (server.inbound_bytes, server.receiving, server.awaiting_data) == (11, True, None)
    server.receive_data(b"\nabc")
    assert server.next_event() is None
    assert (server.inbound_bytes, server.awaiting_data) == (1002, 1000)
    server.receive_data(b"x" * 997 + b"\n\nSAVE")  # (a breach later: not waiting for COMMITTED)
    assert server.inbound_bytes == 1006  # the data, its newlines and what came after
    assert server.next_event() == Save(1, b"abc" + b"x" * 997)
    assert (server.inbound_bytes, server.receiving) == (4, True)
    server = ready_server()
    server.receive_data(b"SAVE MANY 2 5 6\nEVENT 5 3\nabc\n\n")
    assert isinstance(server.next_event(), SaveMany)
    assert server.next_event() is not None  # event 5
    assert server.next_event() is None
    assert (server.inbound_bytes, server.receiving) == (0, False)  # between two events
    server.receive_data(b"EVENT 6 2000000\n")
    assert server.next_event() is None
    assert (server.inbound_bytes, server.receiving, server.awaiting_data) == (
        2000002, True, 2000000)  # fmt: skip


# --------------------------------------------------------------------------- the client machine


def welcomed_client(latest: int | None) -> ClientSession:
    client = ClientSession("~zod")
    tail = b"" if latest is None else b" %d" % latest
    client.receive_data(b"SEGURO 0\nIDENTIFY 0\nWELCOME ~zod" + tail + b"\n")
    events = [client.next_event() for _ in range(3)]
    assert events[-1] == Welcome("~zod", latest)
    assert client.data_to_send() == b"HELLO 0\nPOINT ~zod\n"
    return client


@dataclass(frozen=True)
class HubBad:
    name: str
    data: bytes
    flow: Flow | None = None  # the ship's flow in progress
    handshake: bool = True  # after WELCOME ~zod 42; else from the first byte
    eof: bool = False
    marks: tuple[pytest.MarkDecorator, ...] = field(default=())


TWO = (ManyEvent(44, b"a"), ManyEvent(47, b"b"))
HUB_BAD = [
    HubBad("latest below welcome", b"LATEST 41\n"),
    HubBad("latest 0 below welcome", b"LATEST 0\n"),
    HubBad("latest below latest", b"LATEST 50\nLATEST 49\n"),
    HubBad("latest below committed", b"COMMITTED 45 1\nLATEST 44\n", Save(45, b"x")),
    HubBad("latest below committed many", b"COMMITTED MANY 2 44 47\nLATEST 46\n", TWO),
    HubBad("latest +43", b"LATEST +43\n"),
    HubBad("latest past 64 bits", b"LATEST " + U64_OVER + b"\n"),
    HubBad("committed without save", b"COMMITTED 43 1\n"),
    HubBad("committed of another id", b"COMMITTED 44 1\n", Save(43, b"x")),
    HubBad("committed of another length", b"COMMITTED 43 2\n", Save(43, b"x")),
    HubBad("committed many for a save", b"COMMITTED MANY 1 43 43\n", Save(43, b"x")),
    HubBad("committed many mismatched", b"COMMITTED MANY 2 44 48\n", TWO),
    HubBad("committed for a save many", b"COMMITTED 47 1\n", TWO),
    HubBad("event without read", b"EVENT 43 1\nx\n\n"),
    HubBad("sent without read", b"SENT 0 0 0\n"),
    HubBad("event below the read start", b"EVENT 9 1\nx\n\n", Read(10, 5)),
    HubBad("events past the limit", b"EVENT 10 1\nx\n\nEVENT 11 1\ny\n\n", Read(10, 1)),
    HubBad("read events decrease", b"EVENT 12 1\nx\n\nEVENT 11 1\ny\n\n", Read(10, 5)),
    HubBad("read event data one byte long", b"EVENT 12 1\nxy\n\n", Read(10, 5)),
    HubBad("sent count differs", b"EVENT 12 1\nx\n\nSENT 2 12 12\n", Read(10, 5)),
    HubBad("sent end differs", b"EVENT 12 1\nx\n\nSENT 1 12 13\n", Read(10, 5)),
    HubBad("sent start differs", b"EVENT 47 1\nx\n\nSENT 1 4 47\n", Read(10, 5)),
    HubBad("sent 0 with ids", b"SENT 0 5 5\n", Read(10, 5)),
    HubBad("the hub closes mid-read", b"EVENT 12 1\nx", Read(10, 5), eof=True),
    HubBad("the hub closes before committed", b"", Save(43, b"x"), eof=True),
    HubBad("welcome of another point", b"SEGURO 0\nIDENTIFY 0\nWELCOME ~nec\n", handshake=False),
    HubBad("welcome latest -1", b"SEGURO 0\nIDENTIFY 0\nWELCOME ~zod -1\n", handshake=False),
    HubBad("welcome trailing space", b"SEGURO 0\nIDENTIFY 0\nWELCOME ~zod \n", handshake=False),
    HubBad("welcome before identify", b"SEGURO 0\nWELCOME ~zod\n", handshake=False),
    HubBad("seguro without our version", b"SEGURO 1 2\n", handshake=False),
    HubBad("seguro past 16 bits", b"SEGURO 65536\n", handshake=False),
    HubBad("seguro double space", b"SEGURO  0\n", handshake=False),
    HubBad("seguro +0", b"SEGURO +0\n", handshake=False),
    HubBad("identify another version", b"SEGURO 0 1\nIDENTIFY 1\n", handshake=False),
]  # fmt: skip


@pytest.mark.parametrize("bad", [pytest.param(b, id=b.name, marks=b.marks) for b in HUB_BAD])
def test_client_breach_sans_io(bad: HubBad) -> None:
    """The ship checks the hub the same way; the committed id never goes down across
    WELCOME, LATEST, COMMITTED and COMMITTED MANY."""
    client = welcomed_client(42) if bad.handshake else ClientSession("~zod")
    if bad.flow is not None:
        start_flow(client, bad.flow)
    client.receive_data(bad.data)
    if bad.eof:
        client.receive_data(b"")
    events: list[Event] = []
    while (event := client.next_event()) is not None:
        events.append(event)
    assert events, "no event at all"
    assert isinstance(events[-1], Breach), events
    assert client.closed


def test_client_latest_may_repeat_and_rise() -> None:
    client = welcomed_client(42)
    client.receive_data(b"LATEST 42\nLATEST 42\nLATEST 50\n")
    assert [client.next_event() for _ in range(3)] == [Latest(42), Latest(42), Latest(50)]
    assert client.latest == 50
    with pytest.raises(LocalProtocolError):
        client.save(50, b"x")  # the ship, too, saves only above what the hub has
    client.save(51, b"x")
    with pytest.raises(LocalProtocolError):
        client.read(1, 1)  # one flow at a time


# --------------------------------------------------------------------------- over sockets


@asynccontextmanager
async def seguro_hub(path: Path) -> AsyncIterator[tuple[Hub, SeguroServer, str]]:
    hub = Hub.open(str(path))
    server = await start_seguro_server(hub, "127.0.0.1", 0)
    try:
        yield hub, server, f"seguro://127.0.0.1:{server.port}"
    finally:
        await server.close()
        await hub.close()


class Raw:
    """A ship speaking bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        return cls(reader, writer)

    async def expect(self, line: bytes) -> None:
        assert await self.reader.readline() == line

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def ready(self, point: str = "~zod") -> None:
        """Handshake (one step at a time), then SAVE 4 acknowledged."""
        await self.expect(b"SEGURO 0\n")
        await self.send(b"HELLO 0\n")
        await self.expect(b"IDENTIFY 0\n")
        await self.send(b"POINT %s\n" % point.encode())
        await self.expect(b"WELCOME %s\n" % point.encode())
        await self.send(b"SAVE 4 4\nfour\n\n")
        await self.expect(b"COMMITTED 4 4\n")

    async def until_closed(self, stop: bytes = b"COMMITTED MANY") -> bytes:
        """Everything the hub says until it closes (or says ``stop``: then it did not)."""
        got = bytearray()
        while stop not in got:
            try:
                data = await self.reader.read(1 << 16)
            except ConnectionError:
                break
            if not data:
                break
            got += data
        return bytes(got)

    def close(self) -> None:
        self.writer.close()


ACK = re.compile(rb"^(?:COMMITTED (\d+) \d+|COMMITTED MANY \d+ \d+ (\d+)|LATEST (\d+))$", re.M)


def acknowledged(said: bytes) -> int:
    """The highest id the hub acknowledged in ``said`` (0 if none)."""
    return max((int(next(g for g in m.groups() if g)) for m in ACK.finditer(said)), default=0)


def drops(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The listener's "dropping the connection" log lines."""
    lines = [r.getMessage() for r in caplog.records if r.name == "tidewire.seguro"]
    return [line for line in lines if "dropping the connection" in line]


async def wait_for(predicate: Callable[[], bool], what: str, within: float = 10.0) -> None:
    """Poll ``predicate`` until it holds (at most ``within`` seconds)."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("bad", bad_params())
def test_breach_over_sockets(tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: Bad) -> None:
    """The connection is dropped at once, with a clear log line; what the hub acknowledged is
    stored; another ship's session carries on; the point can come back."""
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")

    async def main() -> None:
        async with seguro_hub(tmp_path) as (hub, server, url), connect(url, "~marzod") as other:
            await other.save(1, b"before")
            raw = await Raw.open(server.port)
            try:
                if bad.ready:
                    await raw.ready()
                await raw.send(bad.data)
                if bad.eof:
                    raw.writer.write_eof()
                async with asyncio.timeout(10):
                    said = await raw.until_closed()
            finally:
                raw.close()
            acked = max(acknowledged(said), 4 if bad.ready else 0)
            assert hub.latest("~zod") >= acked
            if bad.ready:  # what is stored: event 4, then only events the ship offered
                stored = await read_all(hub, "~zod")
                assert stored[0] == (4, b"four")
                assert set(stored[1:]) <= offered(bad.data), stored
            assert b"COMMITTED MANY" not in said, said
            await wait_for(lambda: len(drops(caplog)) >= 1, "the drop's log line")
            (line,) = drops(caplog)
            assert "protocol breach" in line
            if bad.ready:
                assert "~zod" in line
            await other.save(2, b"after")
            assert (await other.read(1, 10))[0] == [(1, b"before"), (2, b"after")]
            await wait_for(lambda: "~zod" not in server.points, "the point to be free")
            async with connect(url, "~zod") as again:
                assert again.welcome is not None
                assert again.welcome.latest == (hub.latest("~zod") or None)

    run(main())


def offered(data: bytes) -> set[tuple[int, bytes]]:
    """The (id, data) of every SAVE and EVENT in ``data`` (as declared, whatever follows)."""
    out = set()
    for m in re.finditer(rb"(?:^|\n)(?:SAVE|EVENT) (\d+) (\d+)\n", data):
        out.add((int(m.group(1)), data[m.end() : m.end() + int(m.group(2))]))
    return out


async def read_all(hub: Hub, stream: str) -> list[tuple[int, bytes]]:
    if hub.latest(stream) == 0:
        return []
    return [(e.id, e.value) for b in await hub.read(stream, 1, 1 << 30) for e in b]


@pytest.mark.parametrize(("data", "acked", "reply"), PIPELINED)
def test_new_command_before_the_reply_over_sockets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, data: bytes, acked: int, reply: bytes
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")

    async def main() -> None:
        async with seguro_hub(tmp_path) as (hub, server, _):
            raw = await Raw.open(server.port)
            try:
                await raw.ready()
                await raw.send(data)  # one write: all of it is there before the first reply
                async with asyncio.timeout(10):
                    said = await raw.until_closed(stop=reply)
            finally:
                raw.close()
            assert reply not in said, f"the hub served the command: {said!r}"
            assert hub.latest("~zod") == acked
            assert drops(caplog)

    run(main(), timeout=15)


def test_round_trip_and_rsio_reads_what_seguro_wrote(tmp_path: Path) -> None:
    async def main() -> None:
        async with seguro_hub(tmp_path) as (hub, _, url):
            rsio = await start_rsio_server(hub, "127.0.0.1", 0)
            try:
                async with connect(url, "~sampel-palnet") as ship:
                    assert ship.welcome == Welcome("~sampel-palnet", None)
                    await ship.save(5, b"hello")
                    assert hub.latest("~sampel-palnet") >= 5
                    many = [(6, b"a"), (9, b"bb"), (10, b""), (100, RAW)]
                    await ship.save_many(many)
                    assert ship.latest == 100
                    events, sent = await ship.read(1, 10)
                    assert events == [(5, b"hello"), *many]
                    assert sent == Sent(5, 5, 100)
                    assert await ship.read(7, 2) == ([(9, b"bb"), (10, b"")], Sent(2, 9, 10))
                    assert await ship.read(101, 10) == ([], Sent(0, 0, 0))
                    assert await ship.read(1, 0) == ([], Sent(0, 0, 0))
                async with connect(url, "~sampel-palnet") as ship:
                    assert ship.welcome == Welcome("~sampel-palnet", 100)
                    with pytest.raises(LocalProtocolError):
                        await ship.save(100, b"again")
                    await ship.save(101, b"more")
                async with connect(url, "~zod") as other:
                    assert other.welcome == Welcome("~zod", None)  # its own stream
                    assert await other.read(1, 10) == ([], Sent(0, 0, 0))
                got: list[tuple[int, bytes]] = []
                rsio_url = f"rsio://127.0.0.1:{rsio.port}"
                async with await tidewire.connect(rsio_url) as client:
                    async for batch in client.subscribe("~sampel-palnet"):
                        got += [(e.id, e.value) for e in batch]
                        if len(got) >= 6:
                            break
                assert got == [(5, b"hello"), *many, (101, b"more")]
            finally:
                await rsio.close()

    run(main())


async def exchange(
    session: ClientSession,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    until: type,
    on_event: Callable[[Event], None] = lambda _: None,
) -> list[Event]:
    """Send what the session has to say; take events until one of type ``until``."""
    got: list[Event] = []
    writer.write(session.data_to_send())
    while True:
        event = session.next_event()
        if event is None:
            data = await reader.read(1 << 16)
            assert data, f"the hub closed the connection; got {got}"
            session.receive_data(data)
            continue
        assert not isinstance(event, Breach), event
        on_event(event)
        got.append(event)
        writer.write(session.data_to_send())
        if isinstance(event, until):
            return got


def test_acknowledged_only_once_durable(tmp_path: Path) -> None:
    """When COMMITTED / LATEST / COMMITTED MANY arrives, the log already holds the id."""

    async def main() -> None:
        async with seguro_hub(tmp_path) as (hub, server, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            session = ClientSession("~marzod")
            checked: list[int] = []

            def durable(event: Event) -> None:
                match event:
                    case Committed(event_id, _) | Latest(event_id) | CommittedMany(_, _, event_id):
                        assert hub.latest("~marzod") >= event_id, event
                        checked.append(event_id)
                    case _:
                        pass

            try:
                await exchange(session, reader, writer, Welcome)
                for i in range(1, 30, 2):
                    session.save(i, b"x" * i)
                    await exchange(session, reader, writer, Committed, durable)
                events = [(100 + i, bytes([i % 256]) * 3000) for i in range(2000)]
                session.save_many(events)
                got = await exchange(session, reader, writer, CommittedMany, durable)
                assert any(isinstance(e, Latest) for e in got)  # ~6 MB: several chunks
                assert checked == sorted(checked)
                assert checked[-1] == 2099
            finally:
                writer.close()

    run(main())


def test_large_save_many_is_streamed_into_the_log(tmp_path: Path) -> None:
    """50k events of 1 KiB: stored as they arrive (the log grows before STREAMED MANY is
    sent), the hub's pending bytes stay bounded, LATEST never decreases."""
    count, size, start = 50_000, 1024, 1000

    def value(event_id: int) -> bytes:
        return event_id.to_bytes(8, "big") * (size // 8)

    async def main() -> None:
        async with seguro_hub(tmp_path) as (hub, server, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            session = ClientSession("~sampel-palnet")
            try:
                await exchange(session, reader, writer, Welcome)
                protocol = server.points["~sampel-palnet"]
                session.save_many([(start + i, value(start + i)) for i in range(count)])
                stream = session.data_to_send()
                tail = stream.rindex(b"STREAMED MANY")
                assert tail > count * size
                latest: list[tuple[int, bool]] = []  # (id, STREAMED MANY sent yet)
                streamed = False
                peak = 0

                async def replies() -> None:
                    while True:
                        event = session.next_event()
                        if event is None:
                            data = await reader.read(1 << 16)
                            assert data, "the hub closed the connection"
                            session.receive_data(data)
                            continue
                        assert not isinstance(event, Breach), event
                        if isinstance(event, Latest):
                            assert hub.latest("~sampel-palnet") >= event.id
                            latest.append((event.id, streamed))
                        if isinstance(event, CommittedMany):
                            assert event == CommittedMany(count, start, start + count - 1)
                            return

                replying = asyncio.create_task(replies())
                view = memoryview(stream)
                for offset in range(0, tail, 200_000):
                    writer.write(view[offset : min(offset + 200_000, tail)])
                    await writer.drain()
                    pending = protocol.session.buffered + protocol.ingest.pending_bytes
                    peak = max(peak, pending)
                await wait_for(lambda: bool(latest), "a LATEST before STREAMED MANY is sent")
                assert hub.latest("~sampel-palnet") >= latest[0][0] >= start
                assert not latest[0][1]
                streamed = True
                writer.write(view[tail:])
                await replying
                assert hub.latest("~sampel-palnet") == start + count - 1
                ids = [i for i, _ in latest]
                assert ids == sorted(ids), "LATEST decreased"
                assert peak < 2 * MAX_PENDING_BYTES < count * size, peak
                session.read(start + count - 3, 10)
                got = await exchange(session, reader, writer, Sent)
                assert got == [
                    ManyEvent(start + count - 3 + i, value(start + count - 3 + i)) for i in range(3)
                ] + [Sent(3, start + count - 3, start + count - 1)]
                first = await hub.read("~sampel-palnet", start, 1 << 20, 2)
                assert [(e.id, e.value) for b in first for e in b] == [
                    (start, value(start)),
                    (start + 1, value(start + 1)),
                ]
            finally:
                writer.close()

    run(main(), timeout=35)


def test_a_second_connection_for_a_point_is_dropped_and_the_first_carries_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")

    async def main() -> None:
        async with seguro_hub(tmp_path) as (hub, server, url):
            async with connect(url, "~zod") as first:
                await first.save(1, b"one")
                raw = await Raw.open(server.port)
                try:
                    await raw.expect(b"SEGURO 0\n")
                    await raw.send(b"HELLO 0\n")
                    await raw.expect(b"IDENTIFY 0\n")
                    await raw.send(b"POINT ~zod\n")
                    async with asyncio.timeout(10):
                        assert await raw.until_closed() == b""  # no WELCOME
                finally:
                    raw.close()
                with pytest.raises(SeguroError):
                    await connect(url, "~zod")
                assert any("already has a session" in line for line in drops(caplog))
                await first.save_many([(2, b"two"), (3, b"three")])
                assert await first.read(1, 10) == (
                    [(1, b"one"), (2, b"two"), (3, b"three")],
                    Sent(3, 1, 3),
                )
            await wait_for(lambda: "~zod" not in server.points, "the point to be free")
            async with connect(url, "~zod") as again:
                assert again.welcome == Welcome("~zod", 3)
            assert hub.latest("~zod") == 3

    run(main())


def test_a_breached_save_many_keeps_what_was_acknowledged(tmp_path: Path) -> None:
    """A SAVE MANY broken after several chunks: every id the hub said LATEST for is stored and
    WELCOME says how far it got; other ships are not disturbed."""

    async def main() -> None:
        async with seguro_hub(tmp_path) as (hub, server, url), connect(url, "~nec") as other:
            raw = await Raw.open(server.port)
            try:
                await raw.ready("~sampel-palnet")
                n = 6000
                body = b"".join(b"EVENT %d 1000\n%s\n\n" % (10 + i, b"e" * 1000) for i in range(n))
                await raw.send(b"SAVE MANY %d 10 %d\n" % (n, 10 + n - 1) + body)
                await wait_for(lambda: hub.latest("~sampel-palnet") > 10, "a chunk stored")
                await raw.send(b"EVENT 3 1\nx\n\n")  # ids must increase
                async with asyncio.timeout(10):
                    said = await raw.until_closed()
            finally:
                raw.close()
            acked = acknowledged(said)
            assert acked > 10, said  # LATEST for at least one chunk
            assert hub.latest("~sampel-palnet") >= acked
            await other.save(1, b"fine")
            await wait_for(lambda: "~sampel-palnet" not in server.points, "the point")
            async with connect(url, "~sampel-palnet") as again:
                assert again.welcome is not None
                assert again.welcome.latest is not None
                assert again.welcome.latest >= acked
            stored = await read_all(hub, "~sampel-palnet")
            assert stored[0] == (4, b"four")
            assert stored[1:] == [(10 + i, b"e" * 1000) for i in range(len(stored) - 1)]
            assert stored[-1][0] >= again.welcome.latest

    run(main())


def test_reconnect_while_the_dropped_session_is_still_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ship whose connection dies mid-SAVE MANY reconnects at once: WELCOME must not say an
    id below what the log will hold, so that resending from WELCOME's id is accepted."""

    async def main() -> None:
        async with seguro_hub(tmp_path) as (hub, server, url):
            # Hold the log's background writes (worker threads) until the ship is back.
            gate = threading.Event()
            gate.set()
            assert isinstance(hub.storage, EmbeddedStorage)  # (its writer thread)
            log = hub.storage.log
            write = log.write_group

            def held_write(*args: Any) -> Any:
                if threading.current_thread() is not threading.main_thread():
                    gate.wait(20)
                return write(*args)

            monkeypatch.setattr(log, "write_group", held_write)
            point = "~sampel-palnet"
            raw = await Raw.open(server.port)
            try:
                await raw.ready(point)
                gate.clear()
                n = 4000
                body = b"".join(b"EVENT %d 1000\n%s\n\n" % (10 + i, b"e" * 1000) for i in range(n))
                await raw.send(b"SAVE MANY %d 10 %d\n" % (n, 9 + n) + body)
                await wait_for(lambda: log.accepted_latest(point) > hub.latest(point) + 1000,
                               "appends queued in the log")  # fmt: skip
                raw.writer.transport.abort()  # the ship's connection dies
                await wait_for(lambda: point not in server.points, "the point to be free")
                again = asyncio.ensure_future(connect(url, point))
                await wait_for(
                    lambda: (
                        again.done() or any(c.session.point == point for c in server.connections)
                    ),
                    "the new session's POINT",
                )
            finally:
                gate.set()
                raw.close()
            ship = await again
            try:
                assert ship.welcome is not None
                resume = (ship.welcome.latest or 0) + 1
                await ship.save(resume, b"resumed")  # the hub must accept it
                assert (await ship.read(resume, 1))[0] == [(resume, b"resumed")]
            finally:
                await ship.close()

    run(main())
