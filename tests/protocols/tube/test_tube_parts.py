"""Tube's ``parts`` (sans-IO): a receiver whose messages carry a byte stream takes a plain
message of several fragments as its fragments, as they come (``MessageReceived`` parts,
``final`` on the last), nothing held and nothing joined; the bytes are those of the whole
message, and every limit holds as without it. Without ``parts`` (the default) the message comes
whole, as before."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.protocols.tube import Closed, Connection, Limits, MessageReceived, Role, push_varint
from tidewire.protocols.tube.codec import CODE_DEFLATE, CODE_PLAIN, encode_header


def sender(peer_size: int) -> Connection:
    """A server that has read a client's fragment size ``peer_size`` (answer taken)."""
    conn = Connection(Role.SERVER, compression="never")
    conn.receive_data(push_varint(peer_size), 0.0)
    conn.next_event()
    conn.data_to_send()
    return conn


def receiver(size: int, *, parts: bool, limits: Limits | None = None) -> Connection:
    """A client asking for ``size``, past the exchange."""
    conn = Connection(Role.CLIENT, fragment_size=size, parts=parts, limits=limits or Limits())
    conn.data_to_send()
    conn.receive_data(push_varint(0), 0.0)
    conn.next_event()
    return conn


def events(conn: Connection) -> list[object]:
    out: list[object] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


@settings(max_examples=150, deadline=None)
@given(payloads=st.lists(st.binary(max_size=500), min_size=1, max_size=4),
       size=st.sampled_from((8, 9, 64, 100)))  # fmt: skip
def test_parts_are_the_message_in_order(payloads: list[bytes], size: int) -> None:
    out = sender(size)
    for payload in payloads:
        out.send(payload, 0.0)
    wire = out.data_to_send()
    whole, parted = receiver(size, parts=False), receiver(size, parts=True)
    got: list[bytes] = []
    part = b""
    for message in wire:
        whole.receive_data(message, 0.0)
        parted.receive_data(message, 0.0)
        assert parted.buffered == 0  # nothing held between fragments
        for event in events(parted):
            assert isinstance(event, MessageReceived)
            assert not event.compressed
            part += event.data
            if event.final:
                got, part = [*got, part], b""
    assert got == payloads
    assert [e.data for e in events(whole) if isinstance(e, MessageReceived)] == payloads


def test_each_fragment_comes_as_it_arrives() -> None:
    out = sender(16)
    out.send(bytes(range(40)), 0.0)
    first, *rest = out.data_to_send()
    conn = receiver(16, parts=True)
    conn.receive_data(first, 0.0)
    (event,) = events(conn)
    assert event == MessageReceived(first[1:], False, final=False)
    assert conn.receiving  # the message is unfinished: its deadline and count still run
    for message in rest:
        conn.receive_data(message, 0.0)
    assert [e.final for e in events(conn) if isinstance(e, MessageReceived)] == [False, True]
    assert not conn.receiving


def test_without_parts_the_fragments_are_held_until_the_last() -> None:
    out = sender(16)
    out.send(bytes(range(40)), 0.0)
    first, *rest = out.data_to_send()
    conn = receiver(16, parts=False)
    conn.receive_data(first, 0.0)
    assert events(conn) == []
    assert conn.buffered == 15
    for message in rest:
        conn.receive_data(message, 0.0)
    assert events(conn) == [MessageReceived(bytes(range(40)), False)]
    assert conn.buffered == 0


def test_the_message_limit_holds_with_parts() -> None:
    conn = receiver(4096, parts=True, limits=Limits(max_message_bytes=10_000))
    conn.receive_data(encode_header(CODE_PLAIN, 3) + bytes(4094), 0.0)
    conn.receive_data(bytes(4096), 0.0)
    conn.receive_data(bytes(4096), 0.0)  # 12,286 bytes: past the limit at this fragment
    *parts, end = events(conn)
    assert [len(p.data) for p in parts if isinstance(p, MessageReceived)] == [4094, 4096]
    assert isinstance(end, Closed)
    assert end.code == 1009
    assert end.error


def test_a_deflated_message_is_still_held_until_its_last_fragment() -> None:
    payload = bytes(range(256)) * 64
    packed = zlib.compress(payload, 1)
    assert 100 < len(packed) < 4096
    conn = receiver(4096, parts=True)
    conn.receive_data(encode_header(CODE_DEFLATE, 2) + packed[:100], 0.0)
    assert events(conn) == []
    assert conn.buffered == 100
    conn.receive_data(packed[100:], 0.0)
    got = [e for e in events(conn) if isinstance(e, MessageReceived)]
    assert b"".join(e.data for e in got) == payload
    assert got[-1].final
    assert got[0].compressed
