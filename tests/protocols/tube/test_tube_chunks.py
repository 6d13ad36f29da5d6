"""Tube's ``send_chunks`` (sans-IO): one message from a list of chunks is on the wire exactly
what ``send`` makes of their join, in every compression mode and at every fragment size; the
plain path hands out views of the chunks, uncopied, for every WebSocket message that lies
within one chunk (``chunks_to_send``), while ``data_to_send`` keeps giving bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.model import LocalProtocolError
from tidewire.protocols.tube import Connection, MessageReceived, Role, push_varint

SIZES = (0, 8, 9, 64, 100, 1000)


def server(peer_size: int, mode: str = "never") -> Connection:
    """A server that has read a client's fragment size ``peer_size`` (answer taken)."""
    conn = Connection(Role.SERVER, compression=mode)  # type: ignore[arg-type]
    conn.receive_data(push_varint(peer_size), 0.0)
    conn.next_event()
    conn.data_to_send()
    return conn


def received(peer_size: int, messages: list[bytes]) -> list[bytes]:
    """What a client asking for ``peer_size`` reassembles from ``messages``."""
    client = Connection(Role.CLIENT, fragment_size=peer_size)
    client.data_to_send()
    client.receive_data(push_varint(0), 0.0)
    client.next_event()
    for message in messages:
        client.receive_data(message, 0.0)
    out = []
    while (event := client.next_event()) is not None:
        assert isinstance(event, MessageReceived), event
        out.append(event.data)
    return out


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.lists(st.binary(max_size=300), max_size=6),
    size=st.sampled_from(SIZES),
    mode=st.sampled_from(("never", "always", "smart")),
)
def test_the_wire_is_that_of_send_of_the_join(chunks: list[bytes], size: int, mode: str) -> None:
    by_chunks, by_join = server(size, mode), server(size, mode)
    by_chunks.send_chunks(chunks, 0.0)
    by_join.send(b"".join(chunks), 0.0)
    wire = by_chunks.data_to_send()
    assert wire == by_join.data_to_send()
    assert all(isinstance(m, bytes) for m in wire)
    assert not size or all(len(m) <= size for m in wire)
    assert received(size, wire) == [b"".join(chunks)]


def test_messages_within_a_chunk_are_views_of_it() -> None:
    big = bytes(range(256)) * 40  # 10,240 bytes
    head = b"frame header"
    conn = server(1000)
    conn.send_chunks([head, memoryview(big)], 0.0)
    assert conn.pending == 2 + len(head) + len(big)  # header: a byte, and 11 as a varint
    out = conn.chunks_to_send()
    assert isinstance(out[0], bytes)  # the header, the frame header and the first of big
    views = [m for m in out[1:] if isinstance(m, memoryview)]
    assert len(views) == len(out) - 1  # (every later message lies within big)
    assert all(v.obj is big for v in views)
    assert b"".join(out)[2:] == head + big
    assert conn.pending == 0


def test_a_message_across_chunks_is_joined() -> None:
    conn = server(8)
    conn.send_chunks([b"abc", b"defg", b"hijklmnopq"], 0.0)
    out = conn.chunks_to_send()
    assert out == [b"\x03abcdefg", b"hijklmno", b"pq"]
    assert isinstance(out[1], memoryview)  # within the third chunk


def test_an_empty_message_is_the_header_byte_alone() -> None:
    conn = server(64)
    conn.send_chunks([], 0.0)
    conn.send_chunks([b"", b""], 0.0)
    assert conn.data_to_send() == [b"\x01", b"\x01"]


def test_nothing_before_the_exchange() -> None:
    with pytest.raises(LocalProtocolError):
        Connection(Role.SERVER).send_chunks([b"x"], 0.0)


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.lists(st.binary(max_size=300), max_size=6),
    size=st.sampled_from(SIZES),
    mode=st.sampled_from(("never", "always", "smart")),
)
def test_messages_as_parts_join_to_the_same_wire(chunks: list[bytes], size: int,
                                                 mode: str) -> None:  # fmt: skip
    by_parts, by_join = server(size, mode), server(size, mode)
    by_parts.send_chunks(chunks, 0.0)
    by_join.send_chunks(chunks, 0.0)
    pending = by_parts.pending
    messages = by_parts.messages_to_send()
    assert [b"".join(parts) for parts in messages] == by_join.data_to_send()
    assert sum(len(p) for parts in messages for p in parts) == pending
    assert by_parts.pending == 0


def test_a_one_message_payload_is_never_joined() -> None:
    """Unfragmented, the parts of the message are the Tube header and the chunks themselves
    (views of the same memory): the adapter writes them with one writelines."""
    big = bytes(range(256)) * 400  # 102,400 bytes
    small = b"frame header"
    conn = server(0)  # no splitting
    conn.send_chunks([small, memoryview(big)], 0.0)
    (parts,) = conn.messages_to_send()
    assert parts[0] == b"\x01"  # CODE_PLAIN, one fragment
    assert [bytes(p) for p in parts[1:]] == [small, big]
    assert all(isinstance(p, memoryview) for p in parts[1:])
    assert isinstance(parts[2], memoryview)
    assert parts[2].obj is big
