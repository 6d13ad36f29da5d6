"""Tube's ``Limits.prealloc_bytes`` (sans-IO): a message of several fragments that may be that big
at most is put together in one buffer allocated at its header (the compiled ``Reassembly``),
and comes out the same bytes as a joined one; what the side holds (``buffered``) is then that
whole buffer from the header on; a bigger message, and every one by default, is kept and joined
as before; the limits hold as without it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.native import COMPILED
from tidewire.protocols.tube import Closed, Connection, Limits, MessageReceived, Role, push_varint


def sender(peer_size: int) -> Connection:
    """A server that has read a client's fragment size ``peer_size`` (answer taken)."""
    conn = Connection(Role.SERVER, compression="never")
    conn.receive_data(push_varint(peer_size), 0.0)
    conn.next_event()
    conn.data_to_send()
    return conn


def receiver(size: int, limits: Limits) -> Connection:
    """A client asking for ``size``, past the exchange."""
    conn = Connection(Role.CLIENT, fragment_size=size, limits=limits)
    conn.data_to_send()
    conn.receive_data(push_varint(0), 0.0)
    conn.next_event()
    return conn


def events(conn: Connection) -> list[object]:
    out: list[object] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(st.binary(max_size=700), min_size=1, max_size=4),
       size=st.sampled_from((8, 9, 64, 100)),
       prealloc=st.sampled_from((0, 300, 1 << 20)))  # fmt: skip
def test_a_preallocated_message_is_the_joined_one(
    payloads: list[bytes], size: int, prealloc: int
) -> None:
    out = sender(size)
    for payload in payloads:
        out.send(payload, 0.0)
    joined, filled = receiver(size, Limits()), receiver(size, Limits(prealloc_bytes=prealloc))
    got: list[bytes] = []
    for message in out.data_to_send():
        joined.receive_data(message, 0.0)
        filled.receive_data(message, 0.0)
        assert filled.buffered >= joined.buffered  # (at least what came; the buffer if any)
        a, b = events(joined), events(filled)
        assert a == b
        got += [e.data for e in b if isinstance(e, MessageReceived)]
    assert got == payloads
    assert filled.buffered == joined.buffered == 0


def test_the_whole_buffer_is_held_from_the_header() -> None:
    size, payload = 1000, bytes(range(256)) * 20  # 5120 bytes: 6 fragments of at most 1000
    out = sender(size)
    out.send(payload, 0.0)
    wire = out.data_to_send()
    assert len(wire) == 6
    default = receiver(size, Limits())
    small = receiver(size, Limits(prealloc_bytes=5999))  # 6 x 1000 would not fit: joined
    filled = receiver(size, Limits(prealloc_bytes=6000))
    for conn in (default, small, filled):
        conn.receive_data(wire[0], 0.0)
    assert default.buffered == small.buffered == len(wire[0]) - 1  # (the header: 1 byte)
    assert filled.buffered == (6000 if COMPILED else len(wire[0]) - 1)
    for conn in (default, small, filled):
        for message in wire[1:]:
            conn.receive_data(message, 0.0)
        assert events(conn) == [MessageReceived(payload, False)]
        assert conn.buffered == 0


def test_the_limits_hold_with_a_preallocated_message() -> None:
    size = 1000
    out = sender(size)
    out.send(b"x" * 4500, 0.0)  # 5 fragments: declared at most 5000 bytes
    wire = out.data_to_send()
    conn = receiver(size, Limits(max_message_bytes=4000, prealloc_bytes=1 << 20))
    for message in wire:
        conn.receive_data(message, 0.0)
    (event,) = events(conn)  # refused at the header (4 full fragments cannot fit) or at 4000
    assert isinstance(event, Closed)
    assert event.code == 1009
    conn = receiver(size, Limits(max_message_bytes=4600, prealloc_bytes=1 << 20))
    too_long = [wire[0], *wire[1:-1], wire[-1] + b"y" * 500]  # the last over the fragment size
    for message in too_long:
        conn.receive_data(message, 0.0)
    (event,) = events(conn)
    assert isinstance(event, Closed)
    assert event.code == 1009
