"""The one-pass parses of issue 22 round 3 against the line by line parses they stand in for.

The hub's parse of a whole ``SAVE`` frame (``ServerSession``): for any bytes that look like a
``SAVE`` (valid or not: numbers with leading zeros, too big, not digits, ids at or below the latest,
lengths that do not match the data, missing or wrong terminators, ``SAVE MANY``, bytes after
the frame), the events fed all at once (the one-pass parse takes a whole frame) are the events
fed one byte at a time (it never sees a whole frame: the line by line parse takes every one).
A ship's ``COMMITTED`` (``ClientSession``): the hub's own form in one comparison, any other
form the line by line way, a wrong one a breach."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.protocols.seguro import (
    Breach,
    ClientSession,
    Committed,
    Event,
    Hello,
    Limits,
    Point,
    Refused,
    Save,
    ServerSession,
)


def welcomed(latest: int | None, *, may_write: bool = True) -> ServerSession:
    server = ServerSession(limits=Limits(max_event_bytes=24))  # (values up to 40 bytes: some over)
    server.initiate()
    server.receive_data(b"HELLO 0\nPOINT ~zod\n")
    assert isinstance(server.next_event(), Hello)
    assert isinstance(server.next_event(), Point)
    server.welcome(latest, may_write=may_write)
    server.data_to_send()
    return server


def events_of(server: ServerSession, chunks: list[bytes]) -> list[Event]:
    """Every event, each SAVE answered at once (the parse, not the adapter's timing rules)."""
    out: list[Event] = []
    for chunk in chunks:
        server.receive_data(chunk)
        while (event := server.next_event()) is not None:
            out.append(event)
            if isinstance(event, Save):
                server.committed()
    return out


numbers = st.one_of(
    st.integers(0, 2**64 + 10).map(lambda n: str(n).encode()),
    st.integers(0, 10**6).map(lambda n: b"000" + str(n).encode()),
    st.sampled_from([b"", b"-1", b"+5", b" 5", b"1e3", b"\xd9\xa1", b"99999999999999999999",
                     b"18446744073709551616", b"9223372036854775807", b"9223372036854775808"]),
)  # fmt: skip


@st.composite
def save_like(draw: st.DrawFn) -> tuple[int | None, bytes]:
    latest = draw(st.sampled_from([None, 1, 41, 2**63 - 2]))
    data = draw(st.one_of(st.binary(max_size=8), st.binary(min_size=20, max_size=40)))
    event_id = draw(st.one_of(numbers, st.integers(0, 100).map(lambda n: str(n).encode())))
    # (mostly the valid choice of each part, so that most frames are whole and valid but one)
    size = draw(st.sampled_from([str(len(data)).encode()] * 3 + [draw(numbers)]))
    head = draw(st.sampled_from([b"SAVE "] * 6 + [b"SAVE MANY ", b"SAVE  ", b"SAVEX", b"save "]))
    sep = draw(st.sampled_from([b" "] * 4 + [b"  ", b"\t"]))
    end = draw(st.sampled_from([b"\n\n"] * 6 + [b"\n", b"", b"\nx", b"\r\n"]))
    after = draw(st.sampled_from([b"", b"READ 1 10\n", b"SAVE 99 1\na\n\n"]))
    return latest, head + event_id + sep + size + b"\n" + data + end + after


@settings(max_examples=400, deadline=None)
@given(save_like())
def test_whole_frames_parse_as_the_line_by_line_parse_does(case: tuple[int | None, bytes]) -> None:
    latest, data = case
    at_once = events_of(welcomed(latest), [data])
    by_byte = events_of(welcomed(latest), [data[i : i + 1] for i in range(len(data))])
    assert at_once == by_byte


def test_a_whole_save_is_one_event_and_its_reply() -> None:
    server = welcomed(4)
    server.receive_data(b"SAVE 0005 3\nabc\n\n")
    assert server.next_event() == Save(5, b"abc")
    assert server.buffered == 0
    server.committed()
    assert server.data_to_send() == b"COMMITTED 5 3\n"


def test_a_session_that_may_not_write_is_refused_not_parsed_in_one_pass() -> None:
    server = welcomed(None, may_write=False)
    server.receive_data(b"SAVE 5 3\nabc\n\n")
    assert isinstance(server.next_event(), Refused)
    assert server.closed


def test_a_save_at_or_below_the_latest_is_still_a_breach() -> None:
    server = welcomed(5)
    server.receive_data(b"SAVE 5 3\nabc\n\n")
    event = server.next_event()
    assert isinstance(event, Breach)
    assert "not greater than the latest" in event.reason


@pytest.mark.parametrize(
    "reply",
    [b"COMMITTED 43 1\n", b"COMMITTED 0043 01\n", b"LATEST 42\nCOMMITTED 43 1\n"],
)
@pytest.mark.parametrize("by_byte", [False, True])
def test_a_ship_takes_its_committed_in_any_valid_form(reply: bytes, by_byte: bool) -> None:
    client = ClientSession("~zod")
    client.receive_data(b"SEGURO 0\nIDENTIFY 0\nWELCOME ~zod 42\n")
    while client.next_event() is not None:
        pass
    client.data_to_send()
    client.save(43, b"x")
    assert client.data_to_send() == b"SAVE 43 1\nx\n\n"
    events: list[Event] = []
    for chunk in [reply[i : i + 1] for i in range(len(reply))] if by_byte else [reply]:
        client.receive_data(chunk)
        while (event := client.next_event()) is not None:
            events.append(event)
    assert events[-1] == Committed(43, 1)
    assert client.latest == 43
    assert client.state.value == "idle"


@pytest.mark.parametrize(
    "reply", [b"COMMITTED 43 10\n", b"COMMITTED 430 1\n", b"COMMITTED 43 1 \n"]
)
def test_a_ship_refuses_a_committed_that_only_begins_like_its_own(reply: bytes) -> None:
    client = ClientSession("~zod")
    client.receive_data(b"SEGURO 0\nIDENTIFY 0\nWELCOME ~zod 42\n")
    while client.next_event() is not None:
        pass
    client.save(43, b"x")
    client.receive_data(reply)
    assert isinstance(client.next_event(), Breach)
    assert client.closed
