"""Tube's bounds under hostile input (issue 20), sans-IO: a deflate bomb is inflated a slice
per :meth:`Connection.next_event` (never more than a slice ahead, the running size checked at
every slice), a floor on the fragment size a peer may ask for (golden bytes), and a deadline on
a message of several fragments left unfinished (a fake clock: ``handle_timer(now)``)."""

from __future__ import annotations

import zlib

import pytest

from tidewire.model import LocalProtocolError
from tidewire.protocols.tube import (
    CODE_DEFLATE,
    CODE_PLAIN,
    Closed,
    Connection,
    Established,
    Event,
    Limits,
    MessageReceived,
    Ping,
    Role,
    encode_header,
    push_varint,
)

SLICE = 64 * 1024


def h(text: str) -> bytes:
    return bytes.fromhex(text)


def drain(conn: Connection) -> list[Event]:
    out: list[Event] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def server(limits: Limits | None = None, fragment_size: int = 0) -> Connection:
    conn = Connection(Role.SERVER, fragment_size=fragment_size, limits=limits or Limits())
    conn.receive_data(push_varint(0), 0.0)
    assert drain(conn) == [Established(0)]
    conn.data_to_send()
    return conn


def deflated(payload: bytes) -> bytes:
    return encode_header(CODE_DEFLATE, 1) + zlib.compress(payload, 9)


# --------------------------------------------------------------------------- inflating


def test_a_deflated_message_is_inflated_a_slice_per_event() -> None:
    payload = bytes(range(256)) * (8 * 4096)  # 8 MiB, deflating to a few KB
    wire = deflated(payload)
    assert len(wire) < 64 * 1024
    conn = server(Limits(max_message_bytes=16 * 1024 * 1024))
    conn.receive_data(wire, 0.0)
    assert conn.buffered == len(wire) - 1  # the compressed bytes, nothing inflated yet
    assert conn.inflated == 0
    parts: list[bytes] = []
    while (event := conn.next_event()) is not None:
        assert isinstance(event, MessageReceived)
        assert event.compressed
        assert len(event.data) <= SLICE  # never more than a slice
        parts.append(event.data)
        if not event.final:
            assert conn.inflated == sum(map(len, parts))  # the running size
    assert b"".join(parts) == payload
    assert len(parts) == len(payload) // SLICE
    assert conn.buffered == conn.inflated == 0


def test_a_small_deflated_message_is_one_final_event() -> None:
    conn = server()
    conn.receive_data(deflated(b"hello" * 100), 0.0)
    assert drain(conn) == [MessageReceived(b"hello" * 100, True, True)]
    conn.receive_data(h("09 78 01 03 00 00 00 00 01"), 0.0)  # a deflated empty message
    assert drain(conn) == [MessageReceived(b"", True, True)]


def test_a_bomb_is_refused_at_the_slice_that_passes_the_limit() -> None:
    limit = 1024 * 1024
    conn = server(Limits(max_message_bytes=limit, inflate_slice_bytes=4096))
    conn.receive_data(deflated(bytes(64 * 1024 * 1024)), 0.0)  # 64 MiB of zeros: ~64 KB
    evs = drain(conn)
    *parts, end = evs
    assert sum(len(e.data) for e in parts if isinstance(e, MessageReceived)) == limit
    assert len(parts) == limit // 4096
    assert isinstance(end, Closed)
    assert end.code == 1009
    assert end.error
    assert "inflating over 1048576 bytes" in end.reason
    assert conn.buffered == 0


def test_what_follows_a_deflated_message_waits_for_its_last_part() -> None:
    conn = server(Limits(inflate_slice_bytes=1000))
    conn.receive_data(deflated(bytes(2500)), 0.0)
    conn.receive_data(encode_header(CODE_PLAIN, 1) + b"after", 0.0)
    conn.receive_data(h("80"), 0.0)  # a ping: answered at once, its event after the parts
    assert conn.data_to_send() == [h("88")]
    assert drain(conn) == [
        MessageReceived(bytes(1000), True, False),
        MessageReceived(bytes(1000), True, False),
        MessageReceived(bytes(500), True, True),
        MessageReceived(b"after", False),
        Ping(),
    ]


@pytest.mark.parametrize(("wire", "why"), [
    (h("09 00 01 02 03"), "does not inflate"),
    (deflated(bytes(100_000))[:40], "cut short"),
])  # fmt: skip
def test_a_bad_deflated_message_is_a_breach_and_voids_what_follows(wire: bytes, why: str) -> None:
    conn = server(Limits(inflate_slice_bytes=1024))
    conn.receive_data(wire, 0.0)
    conn.receive_data(encode_header(CODE_PLAIN, 1) + b"later", 0.0)
    evs = drain(conn)
    end = evs[-1]
    assert isinstance(end, Closed)
    assert end.code == 1002
    assert why in end.reason
    assert MessageReceived(b"later", False) not in evs
    conn.receive_data(encode_header(CODE_PLAIN, 1) + b"ignored", 0.0)
    assert drain(conn) == []


def test_a_breach_after_a_deflated_message_drops_it_uninflated() -> None:
    conn = server(Limits(max_message_bytes=4096))
    conn.receive_data(deflated(bytes(4000)), 0.0)
    conn.receive_data(h("07"), 0.0)  # 7 fragments, nothing after: waits for the first
    conn.receive_data(b"", 0.0)  # an empty fragment in a message of several: a breach
    (end,) = drain(conn)
    assert isinstance(end, Closed)
    assert end.code == 1002
    assert conn.buffered == 0


def test_the_inflate_slice_is_at_least_a_byte() -> None:
    with pytest.raises(LocalProtocolError):
        Limits(inflate_slice_bytes=0)


# --------------------------------------------------------------------------- fragment floor


@pytest.mark.parametrize(("request_bytes", "size", "refused"), [
    ("00", 0, False),        # 0: "do not split", always accepted
    ("10", 8, True),         # 8 bytes: the smallest the seed allows, under the floor
    ("fe 3f", 4095, True),
    ("80 40", 4096, False),  # the floor itself
    ("80 80 08", 65536, False),
])  # fmt: skip
def test_a_peer_may_not_ask_for_fragments_under_the_floor(request_bytes: str, size: int,
                                                          refused: bool) -> None:  # fmt: skip
    conn = Connection(Role.SERVER, fragment_size=65536, limits=Limits(min_fragment_size=4096))
    conn.receive_data(h(request_bytes), 0.0)
    evs = drain(conn)
    if refused:
        assert evs == [Closed(f"a fragment size of {size}, below 4096", 1008, True)]
        assert conn.data_to_send() == []  # no answer: the hub's size is never sent
    else:
        assert evs == [Established(size)]
        assert conn.data_to_send() == [h("80 80 08")]


def test_the_client_checks_the_floor_too() -> None:
    conn = Connection(Role.CLIENT, fragment_size=0, limits=Limits(min_fragment_size=1024))
    assert conn.data_to_send() == [h("00")]
    conn.receive_data(h("fe 0f"), 0.0)  # 1023
    (end,) = drain(conn)
    assert isinstance(end, Closed)
    assert end.code == 1008


def test_the_floor_is_at_least_8() -> None:
    with pytest.raises(LocalProtocolError):
        Limits(min_fragment_size=7)


# --------------------------------------------------------------------------- unfinished


def test_an_unfinished_message_is_closed_at_its_deadline() -> None:
    conn = server(Limits(message_seconds=60.0), fragment_size=1024)
    assert conn.next_deadline() is None  # nothing to time: no keepalive, nothing unfinished
    conn.receive_data(encode_header(CODE_PLAIN, 3) + bytes(1023), 10.0)
    assert conn.receiving
    assert conn.receiving_since == 10.0
    assert conn.buffered == 1023
    assert conn.next_deadline() == 70.0
    conn.receive_data(bytes(1024), 50.0)  # a fragment does not move the deadline
    assert conn.next_deadline() == 70.0
    conn.handle_timer(69.9)
    assert drain(conn) == []
    conn.handle_timer(70.0)
    assert drain(conn) == [Closed("a message unfinished after 60 s", 1008, True)]
    assert conn.buffered == 0
    assert conn.receiving_since is None
    assert conn.next_deadline() is None


def test_a_finished_message_has_no_deadline() -> None:
    conn = server(Limits(message_seconds=5.0), fragment_size=1024)
    conn.receive_data(encode_header(CODE_PLAIN, 2) + bytes(1023), 0.0)
    assert conn.next_deadline() == 5.0
    conn.receive_data(b"x", 1.0)
    assert drain(conn) == [MessageReceived(bytes(1023) + b"x", False)]
    assert conn.receiving_since is None
    assert conn.next_deadline() is None
    conn.handle_timer(100.0)
    assert drain(conn) == []


def test_the_message_deadline_and_keepalive_together() -> None:
    conn = Connection(Role.SERVER, fragment_size=1024, keepalive=30.0,
                      limits=Limits(message_seconds=10.0))  # fmt: skip
    conn.receive_data(push_varint(0), 0.0)
    drain(conn)
    conn.data_to_send()
    assert conn.next_deadline() == 30.0  # the keepalive ping
    conn.receive_data(encode_header(CODE_PLAIN, 2) + bytes(1023), 25.0)
    assert conn.next_deadline() == 30.0  # the ping is still first
    conn.handle_timer(30.0)
    assert conn.data_to_send() == [h("80")]
    assert conn.next_deadline() == 35.0  # then the message's deadline
    conn.handle_timer(35.0)
    (end,) = drain(conn)
    assert isinstance(end, Closed)
    assert end.code == 1008
