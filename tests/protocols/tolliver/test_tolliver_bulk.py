"""Tolliver's bulk paths (docs/protocols/tolliver.md): ``encode_message`` from encoded names,
``Connection.send_many`` and ``ack_many`` (the same bytes as one call per message, the same
resend bookkeeping), the decoder's cache of channel and key names (bounded; invalid UTF-8 still
refused), ``Store.apply`` with many messages and acks at once (ids, the in-memory count of kept
messages, wrap-around), and ``Instance.send_many`` / ``Instance.batches`` over real sockets on
127.0.0.1 (acks once the application asks for the next list; the inbox's byte bound)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import uuid
from collections.abc import AsyncGenerator, Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import run, until
from tidewire.model import Batch, LocalProtocolError, RemoteProtocolError
from tidewire.protocols.tolliver import (
    CONTROL_CHANNEL,
    UNRELIABLE,
    Ack,
    Acked,
    Closed,
    Connection,
    Decoder,
    Event,
    Frame,
    HandshakeRequest,
    Limits,
    Message,
    Received,
    Role,
    encode,
)
from tidewire.protocols.tolliver.codec import encode_message
from tidewire.tolliver import Delivery, Instance, Store, uuid7

C_ID = uuid.UUID("01890a5d-ac96-774b-bcce-b302099a8057")  # the connector's instance
A_ID = uuid.UUID("01890a5d-ac96-7fff-8000-000000000001")  # the acceptor's instance


def h(text: str) -> bytes:
    """Bytes from hex written with spaces between the fields."""
    return bytes.fromhex(text)


def decode_all(data: bytes, limits: Limits | None = None) -> list[Frame]:
    decoder = Decoder(limits)
    decoder.feed(data)
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    return frames


def wire_of(frames: Iterable[Frame]) -> bytes:
    return b"".join(bytes(encode(frame)) for frame in frames)


# --------------------------------------------------------------------------- sans-IO helpers


def connection(
    role: Role,
    version: int = 1,
    *,
    resend_interval: float = 1.0,
    auto_ack: bool = True,
) -> Connection:
    return Connection(
        role,
        C_ID if role is Role.CONNECTOR else A_ID,
        version,
        frozenset(),
        resend_interval=resend_interval,
        auto_ack=auto_ack,
    )


def events(conn: Connection) -> list[Event]:
    out: list[Event] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def transfer(src: Connection, dst: Connection) -> list[Event]:
    """What ``src`` has to send, received by ``dst``; ``dst``'s events."""
    data = src.data_to_send()
    if data:
        dst.receive_data(data)
    return events(dst)


def feed(conn: Connection, *sent: Frame | bytes) -> list[Event]:
    for item in sent:
        conn.receive_data(item if isinstance(item, bytes) else bytes(encode(item)))
    return events(conn)


def sent_frames(conn: Connection) -> list[Frame]:
    return decode_all(conn.data_to_send())


def established(
    *, resend_interval: float = 1.0, acceptor_auto_ack: bool = True
) -> tuple[Connection, Connection]:
    c = connection(Role.CONNECTOR, resend_interval=resend_interval)
    a = connection(Role.ACCEPTOR, resend_interval=resend_interval, auto_ack=acceptor_auto_ack)
    c.initiate()
    transfer(c, a)
    transfer(a, c)
    assert c.established
    assert a.established
    return c, a


def not_yet_established() -> list[Connection]:
    """A connection in each state before the handshake completes."""
    fresh_c = connection(Role.CONNECTOR)
    started_c = connection(Role.CONNECTOR)
    started_c.initiate()
    fresh_a = connection(Role.ACCEPTOR)
    awaiting_final = connection(Role.ACCEPTOR, version=1)
    feed(awaiting_final, HandshakeRequest(2, C_ID))  # a newer peer: the acceptor answers 3
    assert not awaiting_final.established
    assert not awaiting_final.closed
    return [fresh_c, started_c, fresh_a, awaiting_final]


names = st.text(st.characters(codec="utf-8"), max_size=12)
ids = st.integers(0, 2**32 - 1) | st.just(UNRELIABLE)


# --------------------------------------------------------------------------- encode_message


def test_encode_message_golden_bytes() -> None:
    wire = h("03 00000004 00000001 00000003 01020304 6e657773 6b 686921")
    got = encode_message(b"news", b"k", b"hi!", 0x01020304)
    assert isinstance(got, bytes)
    assert got == wire == bytes(encode(Message("news", "k", b"hi!", 0x01020304)))
    # unreliable, empty key and body, a channel that is not ASCII
    wire = h("03 00000002 00000000 00000000 7fffffff c3bc")
    assert encode_message("ü".encode(), b"", b"", UNRELIABLE) == wire
    assert wire == bytes(encode(Message("ü", "", b"", UNRELIABLE)))
    # the extreme ids
    assert encode_message(b"c", b"", b"", 0) == h("03 00000001 00000000 00000000 00000000 63")
    assert encode_message(b"c", b"", b"", 2**32 - 1) == h(
        "03 00000001 00000000 00000000 ffffffff 63"
    )


@settings(max_examples=200, deadline=None)
@given(names, names, st.binary(max_size=64), ids)
def test_encode_message_equals_encode_of_a_message(
    channel: str, key: str, body: bytes, message_id: int
) -> None:
    frame = Message(channel, key, body, message_id)
    wire = encode_message(channel.encode(), key.encode(), body, message_id)
    assert wire == bytes(encode(frame))
    assert decode_all(wire) == [frame]


@pytest.mark.parametrize("bad_id", [2**32, 2**32 + 5, 2**40, -1, -(2**31)])
def test_encode_message_refuses_ids_outside_u32(bad_id: int) -> None:
    with pytest.raises(LocalProtocolError, match="u32"):
        encode_message(b"c", b"k", b"body", bad_id)
    with pytest.raises(LocalProtocolError):
        encode(Message("c", "k", b"body", bad_id))


# --------------------------------------------------------------------------- send_many

ITEMS: list[tuple[bytes, bytes, int]] = [
    (b"k1", b"one", 1),
    (b"", b"", UNRELIABLE),
    ("ключ".encode(), b"\x00\xff" * 10, 2**32 - 1),
    (b"k1", b"again", 0),
    (b"k2", b"two", 2**31),
]


def test_send_many_writes_the_bytes_of_successive_sends() -> None:
    bulk, bulk_peer = established()
    single, _ = established()
    bulk.send_many("é", ITEMS, 5.0)
    for key, body, message_id in ITEMS:
        single.send(Message("é", key.decode(), body, message_id), 5.0)
    wire = bulk.data_to_send()
    assert wire == single.data_to_send()
    sent = [Message("é", k.decode(), b, i) for k, b, i in ITEMS]
    assert decode_all(wire) == sent
    assert bulk.unacked() == single.unacked() == [0, 1, 2**31, 2**32 - 1]
    assert bulk.next_deadline() == single.next_deadline() == 6.0
    # The peer gets them in order, acks the reliable ones, and the acks clear them.
    bulk_peer.receive_data(wire)
    assert events(bulk_peer) == [Received(m) for m in sent]
    assert transfer(bulk_peer, bulk) == [Acked(m.id) for m in sent if m.reliable]
    assert bulk.unacked() == []
    assert bulk.next_deadline() is None
    # Any iterable; an empty one sends nothing.
    bulk.send_many("c", iter([(b"", b"x", 7)]), 6.0)
    assert sent_frames(bulk) == [Message("c", "", b"x", 7)]
    bulk.send_many("c", [], 6.0)
    assert bulk.data_to_send() == b""
    assert bulk.unacked() == [7]


@settings(max_examples=100, deadline=None)
@given(names, st.lists(st.tuples(names, st.binary(max_size=32), ids), max_size=8))
def test_send_many_equals_successive_sends_for_any_messages(
    channel: str, items: list[tuple[str, bytes, int]]
) -> None:
    if channel == CONTROL_CHANNEL:
        channel = "not-" + channel
    bulk, _ = established()
    single, _ = established()
    bulk.send_many(channel, [(k.encode(), b, i) for k, b, i in items], 1.0)
    for key, body, message_id in items:
        single.send(Message(channel, key, body, message_id), 1.0)
    assert bulk.data_to_send() == single.data_to_send()
    assert bulk.unacked() == single.unacked()
    assert bulk.next_deadline() == single.next_deadline()
    bulk.handle_timer(2.0)
    single.handle_timer(2.0)
    assert bulk.data_to_send() == single.data_to_send()  # the same resends, in the same order


@settings(max_examples=100, deadline=None)
@given(names, st.lists(st.binary(max_size=32), max_size=8),
       st.sampled_from([0, 7, UNRELIABLE - 2, UNRELIABLE + 1, 2**32 - 8]),
       st.lists(ids, max_size=3))  # fmt: skip
def test_send_values_equals_send_many_of_the_same_values(
    channel: str, values: list[bytes], first_id: int, before: list[int]
) -> None:
    """The hub's delivery of a run of events (a batch's value column, ids from ``first_id``,
    no key): the bytes, the awaited acks and the resends of ``send_many``, also with ids
    awaited already (resent: they move to the end) or a run over the unreliable marker."""
    if channel == CONTROL_CHANNEL:
        channel = "not-" + channel
    values_side, _ = established()
    many_side, _ = established()
    for side in (values_side, many_side):
        side.send_many(channel, [(b"", b"before", i) for i in before], 0.5)
    if values:
        batch = Batch.build("s", values)
        values_side.send_values(channel, batch.values, batch.value_offsets, first_id, 1.0)
    many_side.send_many(channel, [(b"", v, first_id + i) for i, v in enumerate(values)], 1.0)
    assert values_side.data_to_send() == many_side.data_to_send()
    assert values_side.unacked() == many_side.unacked()
    assert values_side.unacked_bytes == many_side.unacked_bytes
    assert values_side.next_deadline() == many_side.next_deadline()
    values_side.handle_timer(2.0)
    many_side.handle_timer(2.0)
    assert values_side.data_to_send() == many_side.data_to_send()  # the same resends


def test_send_many_tracks_reliable_messages_and_resends_them_in_order() -> None:
    c, _ = established(resend_interval=2.0)
    c.send_many(
        "news",
        [(b"k", b"5", 5), (b"k", b"u", UNRELIABLE), (b"k", b"3", 3), (b"", b"9", 9)],
        10.0,
    )
    c.data_to_send()  # lost in transit
    assert c.unacked() == [3, 5, 9]
    assert c.next_deadline() == 12.0
    c.handle_timer(11.99)
    assert c.data_to_send() == b""
    c.handle_timer(12.0)
    # in the order sent (not by id), the unreliable one never again
    assert sent_frames(c) == [
        Message("news", "k", b"5", 5), Message("news", "k", b"3", 3), Message("news", "", b"9", 9),
    ]  # fmt: skip
    assert c.next_deadline() == 14.0
    assert feed(c, Ack(3), Ack(3), Ack(UNRELIABLE)) == [Acked(3)]
    assert c.unacked() == [5, 9]
    c.handle_timer(14.0)
    assert sent_frames(c) == [Message("news", "k", b"5", 5), Message("news", "", b"9", 9)]
    assert feed(c, Ack(9), Ack(5)) == [Acked(9), Acked(5)]
    assert c.unacked() == []
    assert c.next_deadline() is None
    c.handle_timer(1000.0)
    assert c.data_to_send() == b""


def test_unreliable_messages_of_send_many_are_not_tracked() -> None:
    c, a = established()
    c.send_many("news", [(b"", b"a", UNRELIABLE), (b"k", b"b", UNRELIABLE)], 0.0)
    assert c.unacked() == []
    assert c.next_deadline() is None
    assert transfer(c, a) == [
        Received(Message("news", "", b"a")), Received(Message("news", "k", b"b")),
    ]  # fmt: skip
    assert a.data_to_send() == b""  # not acked
    c.handle_timer(1000.0)
    assert c.data_to_send() == b""


def test_sending_an_id_again_replaces_its_frame_and_deadline() -> None:
    c, _ = established(resend_interval=1.0)
    c.send_many("news", [(b"", b"old", 1), (b"", b"two", 2)], 0.0)
    c.send(Message("news", "", b"three", 3), 0.2)
    c.send_many("news", [(b"k", b"new", 1)], 0.5)  # replaces a send_many frame
    c.send(Message("news", "", b"new three", 3), 0.6)  # replaces a send frame
    c.data_to_send()
    assert c.unacked() == [1, 2, 3]
    assert c.next_deadline() == 1.0  # 2's: 1 is now due at 1.5, 3 at 1.6
    c.handle_timer(1.0)
    assert sent_frames(c) == [Message("news", "", b"two", 2)]
    assert c.next_deadline() == 1.5
    c.handle_timer(1.6)
    assert sent_frames(c) == [Message("news", "k", b"new", 1), Message("news", "", b"new three", 3)]
    # The same id twice in one call: both go out, the later one is what is resent.
    d, _ = established(resend_interval=1.0)
    d.send_many("news", [(b"", b"first", 4), (b"", b"second", 4)], 0.0)
    assert sent_frames(d) == [Message("news", "", b"first", 4), Message("news", "", b"second", 4)]
    assert d.unacked() == [4]
    d.handle_timer(1.0)
    assert sent_frames(d) == [Message("news", "", b"second", 4)]


def test_send_many_is_refused_before_the_handshake_and_after_close() -> None:
    for conn in not_yet_established():
        before = conn.data_to_send()
        with pytest.raises(LocalProtocolError, match="handshake"):
            conn.send_many("news", [(b"k", b"x", 1), (b"k", b"y", UNRELIABLE)], 0.0)
        with pytest.raises(LocalProtocolError, match="handshake"):
            conn.send_many("news", [], 0.0)
        assert conn.data_to_send() == b""  # nothing queued besides the handshake
        assert all(not isinstance(f, Message) for f in decode_all(before))
        assert conn.unacked() == []
        assert conn.next_deadline() is None
    c, _ = established()
    c.receive_data(b"")  # the peer closed
    assert isinstance(events(c)[0], Closed)
    with pytest.raises(LocalProtocolError):
        c.send_many("news", [(b"k", b"x", 1)], 0.0)
    assert c.unacked() == []


def test_send_many_is_refused_on_the_reserved_channel() -> None:
    c, a = established()
    for items in ([(b"", b"\x00\x00\x00\x00\x01\x00\x00\x00\x00x", 1)], [(b"k", b"", UNRELIABLE)],
                  []):  # fmt: skip
        with pytest.raises(LocalProtocolError, match="reserved"):
            c.send_many(CONTROL_CHANNEL, items, 0.0)
    assert c.data_to_send() == b""
    assert c.unacked() == []
    assert c.next_deadline() is None
    # still usable
    c.send_many("news", [(b"", b"ok", 1)], 0.0)
    assert transfer(c, a) == [Received(Message("news", "", b"ok", 1))]


def test_a_refused_send_many_tracks_nothing_it_did_not_write() -> None:
    c, _ = established()
    with pytest.raises(LocalProtocolError):
        c.send_many("news", [(b"", b"ok", 1), (b"", b"bad", 2**32), (b"", b"after", 2)], 0.0)
    written = {f.id for f in sent_frames(c) if isinstance(f, Message) and f.reliable}
    assert set(c.unacked()) == written  # all or nothing: either way, what is awaited went out
    assert (c.next_deadline() is None) == (not written)


# --------------------------------------------------------------------------- ack_many


def test_ack_many_writes_the_bytes_of_successive_acks() -> None:
    message_ids = [0, 5, UNRELIABLE, 2**32 - 1, 5]
    bulk, _ = established()
    single, _ = established()
    bulk.ack_many(message_ids)
    for message_id in message_ids:
        single.ack(message_id)
    wire = bulk.data_to_send()
    assert wire == single.data_to_send()
    assert wire == h("04 00000000 04 00000005 04 7fffffff 04 ffffffff 04 00000005")
    assert decode_all(wire) == [Ack(i) for i in message_ids]
    bulk.ack_many(i for i in (1, 2))  # any iterable
    assert bulk.data_to_send() == h("04 00000001 04 00000002")
    bulk.ack_many([])
    assert bulk.data_to_send() == b""


def test_ack_many_of_what_was_received_clears_the_senders_resends() -> None:
    c, a = established(acceptor_auto_ack=False)
    c.send_many("news", [(b"", b"%d" % i, i) for i in (10, 11, 12)], 0.0)
    got = transfer(c, a)
    assert [e.message.id for e in got if isinstance(e, Received)] == [10, 11, 12]
    assert a.data_to_send() == b""  # the application acks
    a.ack_many([12, 10])
    assert transfer(a, c) == [Acked(12), Acked(10)]
    assert c.unacked() == [11]
    a.ack_many([11, 11, 99])  # a repeat and an id never sent: ignored by the sender
    assert transfer(a, c) == [Acked(11)]
    assert c.unacked() == []


@pytest.mark.parametrize("bad_id", [2**32, 2**33, 2**64, -1])
def test_ack_many_refuses_ids_outside_u32(bad_id: int) -> None:
    c, _ = established()
    with pytest.raises(LocalProtocolError, match="u32"):
        c.ack_many([1, bad_id, 2])
    assert c.data_to_send() == b""  # nothing of the refused call is queued
    with pytest.raises(LocalProtocolError, match="u32"):
        c.ack(bad_id)
    assert c.data_to_send() == b""
    c.ack_many([3])  # still usable
    assert c.data_to_send() == h("04 00000003")


def test_ack_many_is_refused_before_the_handshake_and_after_close() -> None:
    for conn in not_yet_established():
        conn.data_to_send()
        with pytest.raises(LocalProtocolError, match="handshake"):
            conn.ack_many([1, 2])
        with pytest.raises(LocalProtocolError, match="handshake"):
            conn.ack(1)
        assert conn.data_to_send() == b""
    c, _ = established()
    c.receive_data(b"")
    events(c)
    with pytest.raises(LocalProtocolError):
        c.ack_many([1])
    assert c.data_to_send() == b""


# --------------------------------------------------------------------------- the decoder


def test_many_messages_with_the_same_names_decode_to_equal_strings() -> None:
    sent = [Message("orders", ["k", "é", ""][i % 3], b"%d" % i, i) for i in range(600)]
    decoder = Decoder()
    decoder.feed(wire_of(sent))
    got = []
    while (frame := decoder.next_frame()) is not None:
        got.append(frame)
    assert got == sent
    messages = [f for f in got if isinstance(f, Message)]
    assert {m.channel for m in messages} == {"orders"}
    assert [m.key for m in messages[:3]] == ["k", "é", ""]
    assert all(isinstance(m.channel, str) and isinstance(m.key, str) for m in messages)


def test_more_than_256_distinct_names_decode_correctly_and_the_cache_stays_bounded() -> None:
    sent = [Message(f"channel-{i}", f"ключ-{i % 300}", b"", i) for i in range(700)]
    sent += sent[:50]  # names seen before, since forgotten
    sent += [Message("channel-699", "ключ-99", b"again", 1)]  # names seen lately
    decoder = Decoder()
    got: list[Frame] = []
    for message in sent:  # one frame at a time, to watch the cache's size
        decoder.feed(bytes(encode(message)))
        frame = decoder.next_frame()
        assert frame is not None
        got.append(frame)
        assert decoder.names_cached <= 256
    assert got == sent
    assert decoder.next_frame() is None


INVALID_UTF8 = [
    h("ff"),
    h("c3"),  # cut short
    h("eda080"),  # a surrogate
    h("c080"),  # overlong
    h("f4908080"),  # past U+10FFFF
    h("61 ff"),  # valid, then not
]


@pytest.mark.parametrize("bad", INVALID_UTF8, ids=bytes.hex)
@pytest.mark.parametrize("where", ["channel", "key"])
def test_invalid_utf8_names_are_refused_after_valid_ones(bad: bytes, where: str) -> None:
    # Valid names, some of the invalid one's length or sharing its start, go through first
    # (and into the cache), as channel and as key.
    valid = [b"a", b"ab", b"a" * len(bad), "é".encode(), b"\xc3\xa9a"]
    good = [Message(v.decode(), w.decode(), b"", 1) for v in valid for w in valid]
    decoder = Decoder()
    decoder.feed(wire_of(good))
    for message in good:
        assert decoder.next_frame() == message
    channel, key = (bad, b"ab") if where == "channel" else (b"ab", bad)
    decoder.feed(encode_message(channel, key, b"body", 7))
    with pytest.raises(RemoteProtocolError, match=f"{where} is not UTF-8"):
        decoder.next_frame()
    with pytest.raises(RemoteProtocolError):  # the decoder stays dead
        decoder.next_frame()
    with pytest.raises(RemoteProtocolError):
        decoder.feed(bytes(encode(Ack(1))))


@pytest.mark.parametrize("where", ["channel", "key"])
def test_invalid_utf8_is_refused_after_the_cache_was_cleared(where: str) -> None:
    decoder = Decoder()
    sent = [Message(f"c{i}", f"k{i}", b"", i) for i in range(400)]
    decoder.feed(wire_of(sent))
    assert [decoder.next_frame() for _ in sent] == sent
    channel, key = (h("c3 28"), b"k1") if where == "channel" else (b"c1", h("c3 28"))
    decoder.feed(encode_message(channel, key, b"", UNRELIABLE))
    with pytest.raises(RemoteProtocolError, match=f"{where} is not UTF-8"):
        decoder.next_frame()


def test_invalid_utf8_after_valid_messages_closes_the_connection() -> None:
    c, a = established()
    c.send_many("orders", [(b"k", b"%d" % i, i) for i in range(5)], 0.0)
    assert len(transfer(c, a)) == 5
    a.receive_data(encode_message(b"orders", h("6b ff"), b"", 5))
    (closed,) = events(a)
    assert isinstance(closed, Closed)
    assert closed.error
    assert "key is not utf-8" in closed.reason.lower()
    assert a.closed


POOL = ["", "orders", "k", "é", "ключ", "x" * 40]
pool_names = st.sampled_from(POOL) | names
run_frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(Message, pool_names, pool_names, st.binary(max_size=48), ids),
    st.builds(Ack, st.integers(0, 2**32 - 1)),
)


def bulk_wire(frames: list[Frame]) -> bytes:
    """The frames as the bulk senders write them: ``encode_message`` and packed acks."""
    out = bytearray()
    for frame in frames:
        if isinstance(frame, Message):
            out += encode_message(frame.channel.encode(), frame.key.encode(), frame.body, frame.id)
        else:
            encode(frame, out)
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(st.lists(run_frames, min_size=1, max_size=12))
def test_a_run_of_messages_and_acks_fed_byte_by_byte(sent: list[Frame]) -> None:
    wire = bulk_wire(sent)
    assert wire == wire_of(sent)
    assert decode_all(wire) == sent
    decoder = Decoder()
    got: list[Frame] = []
    for i in range(len(wire)):
        decoder.feed(wire[i : i + 1])
        while (frame := decoder.next_frame()) is not None:
            got.append(frame)
    assert got == sent
    assert decoder.buffered == 0


def test_a_long_run_fed_in_small_pieces_past_the_buffer_compaction() -> None:
    """Over 64 KiB consumed: the decoder drops what it has read from its buffer meanwhile."""
    sent: list[Frame] = []
    for i in range(400):
        body = bytes([i % 256]) * (i * 5 % 1000)
        sent.append(Message(POOL[i % len(POOL)], POOL[i * 7 % len(POOL)], body, i))
        if i % 3 == 0:
            sent.append(Ack(i))
    wire = bulk_wire(sent)
    assert len(wire) > 2 * 65536
    decoder = Decoder()
    got: list[Frame] = []
    sizes = [1, 2, 3, 5, 7, 11, 13]
    pos = step = 0
    while pos < len(wire):
        size = sizes[step % len(sizes)]
        decoder.feed(wire[pos : pos + size])
        pos += size
        step += 1
        while (frame := decoder.next_frame()) is not None:
            got.append(frame)
    assert got == sent
    assert decoder.buffered == 0


# --------------------------------------------------------------------------- the store


def outbox_count(store: Store) -> int:
    return int(store.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])


def consistent(store: Store) -> int:
    """The in-memory count of kept messages is the outbox's (checked); that count."""
    count = outbox_count(store)
    assert store.unacked() == count
    return count


def set_next_id(path: str, value: int) -> None:
    """Move a closed store's id counter (as if that many ids had been taken)."""
    db = sqlite3.connect(path)
    with db:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('next_id', ?)", (value,))
    db.close()


def test_store_bulk_adds_get_distinct_increasing_ids(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    a = uuid7()
    store = Store.open(path)
    ids = store.apply([("c", f"k{i}", b"%d" % i, [a]) for i in range(500)], [])
    assert ids == list(range(500))  # a new store starts at 0
    assert consistent(store) == 500
    more = store.apply([("c", "", b"x", [a]), ("c", "", b"nobody", []), ("c", "", b"y", [a])], [])
    assert more == [500, 501, 502]  # one nobody subscribed to takes an id, and is not kept
    assert consistent(store) == 502
    pending = store.pending_for(a)
    assert [p[0] for p in pending] == [*ids, 500, 502]  # in the order sent
    assert pending[7] == (7, "c", "k7", b"7")
    assert store.apply([], []) == []
    assert consistent(store) == 502
    store.close()
    store = Store.open(path)  # the counter and the count are kept
    assert consistent(store) == 502
    assert store.apply([("c", "", b"z", [a])] * 2, []) == [503, 504]
    assert consistent(store) == 504
    store.close()


def test_store_a_message_waits_for_every_remote(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    a, b = uuid7(), uuid7()
    store = Store.open(path)
    m = store.apply([("c", "", b"%d" % i, [a, b]) for i in range(4)], [])
    assert consistent(store) == 4

    def pending(remote: uuid.UUID) -> list[int]:
        return [row[0] for row in store.pending_for(remote)]

    store.apply([], [(m[0], a), (m[1], a), (m[1], b)])
    assert consistent(store) == 3  # m1 is gone; m0 waits for b
    assert pending(a) == [m[2], m[3]]
    assert pending(b) == [m[0], m[2], m[3]]
    # adds and acks together, an ack twice in one call
    (new,) = store.apply([("c", "", b"new", [b])], [(m[0], b), (m[2], a), (m[2], a)])
    assert consistent(store) == 3  # m2 (waits for b), m3, new
    assert pending(a) == [m[3]]
    assert pending(b) == [m[2], m[3], new]
    store.close()
    store = Store.open(path)
    assert consistent(store) == 3
    assert pending(b) == [m[2], m[3], new]
    store.apply([], [(m[2], b), (m[3], a)])
    assert consistent(store) == 2
    assert pending(a) == []
    store.apply([], [(m[3], b), (new, b)])
    assert consistent(store) == 0
    assert pending(b) == []
    store.close()


def test_store_acks_for_unknown_ids_change_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    a, b = uuid7(), uuid7()
    store = Store.open(path)
    m = store.apply([("c", "", b"one", [a]), ("c", "k", b"two", [a, b])], [])
    before = (store.unacked(), store.pending_for(a), store.pending_for(b))
    store.apply(
        [],
        [(12345, a), (m[0], b), (UNRELIABLE, a), (2**32 - 1, a), (m[1], uuid7()), (m[0], b)],
    )
    assert (store.unacked(), store.pending_for(a), store.pending_for(b)) == before
    assert consistent(store) == 2
    assert not store.ack(m[0], b)  # b was never sent m0
    assert not store.ack(999, a)
    assert store.ack(m[0], a)
    assert not store.ack(m[0], a)  # acked already
    assert consistent(store) == 1
    store.close()


def test_store_a_failed_apply_changes_nothing(tmp_path: Path) -> None:
    a = uuid7()
    store = Store.open(str(tmp_path / "s.db"))
    m = store.apply([("c", "", b"one", [a])], [])
    with pytest.raises(OverflowError):  # an id SQLite cannot hold: the transaction rolls back
        store.apply([("c", "", b"lost", [a])], [(m[0], a), (2**64, a)])
    assert consistent(store) == 1
    assert store.pending_for(a) == [(m[0], "c", "", b"one")]
    assert store.apply([("c", "", b"two", [a])], []) == [m[0] + 1]  # the id was not used up
    assert consistent(store) == 2
    store.close()


def test_store_ids_wrap_around_skipping_ids_in_use(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    a = uuid7()
    store = Store.open(path)
    low = store.apply([("c", "", b"low%d" % i, [a]) for i in range(6)], [])
    assert low == [0, 1, 2, 3, 4, 5]
    store.apply([], [(1, a), (4, a)])  # 0, 2, 3 and 5 still await an ack
    assert consistent(store) == 4
    store.close()
    set_next_id(path, 2**32 - 3)
    store = Store.open(path)
    assert consistent(store) == 4
    ids = store.apply([("c", "", b"w%d" % i, [a]) for i in range(6)], [])
    assert ids == [2**32 - 3, 2**32 - 2, 2**32 - 1, 1, 4, 6]
    assert consistent(store) == 10
    assert [row[0] for row in store.pending_for(a)] == [0, 2, 3, 5, *ids]  # in the order sent
    store.close()
    store = Store.open(path)
    assert store.apply([("c", "", b"next", [a])], []) == [7]  # the counter was kept
    assert consistent(store) == 11
    store.close()


def test_store_ids_skip_the_unreliable_marker_and_ids_in_use_in_bulk(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    a = uuid7()
    Store.open(path).close()
    set_next_id(path, UNRELIABLE + 1)
    store = Store.open(path)
    assert store.apply([("c", "", b"kept", [a])], []) == [UNRELIABLE + 1]
    store.close()
    set_next_id(path, UNRELIABLE - 2)
    store = Store.open(path)
    ids = store.apply([("c", "", b"%d" % i, [a]) for i in range(4)], [])
    assert ids == [UNRELIABLE - 2, UNRELIABLE - 1, UNRELIABLE + 2, UNRELIABLE + 3]
    assert consistent(store) == 5
    store.close()


# --------------------------------------------------------------------------- the instance


def messages(instance: Instance) -> AsyncGenerator[Delivery, None]:
    """``instance.messages()``, typed as what it is (an async generator: it has ``aclose``)."""
    stream = instance.messages()
    assert isinstance(stream, AsyncGenerator)
    return stream


def batches(instance: Instance, most: int = 1024) -> AsyncGenerator[list[Delivery], None]:
    stream = instance.batches(most)
    assert isinstance(stream, AsyncGenerator)
    return stream


async def take(instance: Instance, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    async with contextlib.aclosing(messages(instance)) as deliveries:
        async for delivery in deliveries:
            got.append(delivery)
            if len(got) >= n:
                break
    return got


async def barrier(sender: Instance, receiver: Instance) -> None:
    """An unreliable message from ``sender`` to ``receiver`` (subscribed to "barrier"), taken
    by ``receiver``'s application: whatever ``sender`` wrote to that connection before it (acks
    included) has been handled by ``receiver``'s connection."""
    await sender.send("barrier", "", b"sync", reliable=False)
    (got,) = await take(receiver, 1)
    assert (got.channel, got.body, got.id) == ("barrier", b"sync", UNRELIABLE)


def test_instance_send_many_delivers_every_body_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        a = Instance(str(tmp_path / "a.db"), resend_interval=60)  # no resends: no repeats
        b = Instance(str(tmp_path / "b.db"))
        b.subscribe("orders")
        try:
            await a.connect("127.0.0.1", await b.listen())
            bodies = [b"m%04d" % i for i in range(1500)]
            ids = await a.send_many("orders", "k", bodies)
            assert ids == list(range(1500))  # a new store: in turn from 0
            assert a.store.unacked() == 1500  # on disk before it returned; b acked nothing yet
            got: list[Delivery] = []
            async with contextlib.aclosing(batches(b, 256)) as lists:
                async for deliveries in lists:
                    assert 1 <= len(deliveries) <= 256
                    got += deliveries
                    if len(got) >= len(bodies):
                        break
            assert [d.body for d in got] == bodies
            assert [d.id for d in got] == ids
            assert {(d.sender, d.channel, d.key) for d in got} == {(a.instance_id, "orders", "k")}
            await until(lambda: a.store.unacked() == 0)
            # Two at once (one group commit): distinct ids, each call's bodies in its order.
            first, second = await asyncio.gather(
                a.send_many("orders", "", [b"a%d" % i for i in range(10)]),
                a.send_many("orders", "", [b"b%d" % i for i in range(10)]),
            )
            assert first == sorted(first)
            assert second == sorted(second)
            assert len(set(first) | set(second)) == 20
            got = await take(b, 20)
            assert [d.body for d in got if d.body[:1] == b"a"] == [b"a%d" % i for i in range(10)]
            assert [d.body for d in got if d.body[:1] == b"b"] == [b"b%d" % i for i in range(10)]
            assert {d.body: d.id for d in got} == {
                **{b"a%d" % i: first[i] for i in range(10)},
                **{b"b%d" % i: second[i] for i in range(10)},
            }
            # Nothing, unreliable ones, refused ones.
            assert await a.send_many("orders", "k", []) == []
            unreliable = await a.send_many("orders", "", [b"u1", b"u2"], reliable=False)
            assert unreliable == [UNRELIABLE, UNRELIABLE]
            assert [(d.body, d.id) for d in await take(b, 2)] == [
                (b"u1", UNRELIABLE), (b"u2", UNRELIABLE),
            ]  # fmt: skip
            with pytest.raises(LocalProtocolError, match="reserved"):
                await a.send_many(CONTROL_CHANNEL, "", [b"x"])
            with pytest.raises(LocalProtocolError, match="UTF-8"):
                await a.send_many("orders", "\ud800", [b"x"])
            await until(lambda: a.store.unacked() == 0)
        finally:
            await a.close()
            await b.close()

    run(main())


def test_batches_ack_a_list_when_the_application_asks_for_the_next(tmp_path: Path) -> None:
    async def main() -> None:
        a = Instance(str(tmp_path / "a.db"), resend_interval=60)
        b = Instance(str(tmp_path / "b.db"), inbox_limit=5, resend_interval=60)
        b.subscribe("jobs")
        a.subscribe("barrier")
        lists = batches(b)
        try:
            await a.connect("127.0.0.1", await b.listen())
            ids = await a.send_many("jobs", "", [b"j%d" % i for i in range(5)])
            await until(lambda: b.inbox.full())  # all five have arrived
            first = await anext(lists)
            assert [d.id for d in first] == ids
            assert [d.body for d in first] == [b"j%d" % i for i in range(5)]
            # b's application is handling the list: no ack has gone out.
            await barrier(b, a)
            assert a.links[b.instance_id].conn.unacked() == sorted(ids)
            assert a.store.unacked() == 5

            async def next_list() -> list[Delivery]:
                return await anext(lists)

            asking = asyncio.create_task(next_list())
            await until(lambda: a.store.unacked() == 0)  # asked for the next: acked
            assert not asking.done()  # (and waiting for one)
            last = await a.send_many("jobs", "", [b"last"])
            second = await asking
            assert [(d.id, d.body) for d in second] == [(last[0], b"last")]
            await barrier(b, a)
            assert a.store.unacked() == 1
            await lists.aclose()  # stops reading: acks the last list
            await until(lambda: a.store.unacked() == 0)
        finally:
            await lists.aclose()
            await a.close()
            await b.close()

    run(main())


def test_breaking_out_of_batches_acks_the_last_list(tmp_path: Path) -> None:
    async def main() -> None:
        a = Instance(str(tmp_path / "a.db"), resend_interval=60)
        b = Instance(str(tmp_path / "b.db"), inbox_limit=3)
        b.subscribe("jobs")
        a.subscribe("barrier")
        try:
            await a.connect("127.0.0.1", await b.listen())
            ids = await a.send_many("jobs", "k", [b"x", b"y", b"z"])
            await until(lambda: b.inbox.full())
            async with contextlib.aclosing(batches(b)) as lists:
                async for deliveries in lists:
                    assert [d.id for d in deliveries] == ids
                    await barrier(b, a)
                    assert a.store.unacked() == 3  # not while the application holds them
                    break
            await until(lambda: a.store.unacked() == 0)
        finally:
            await a.close()
            await b.close()

    run(main())


def test_messages_over_the_inbox_byte_bound_arrive_later_by_resend(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.tolliver")

    def refused() -> int:
        return sum("waits for the sender's resend" in r.getMessage() for r in caplog.records)

    async def main() -> None:
        a = Instance(str(tmp_path / "a.db"), resend_interval=0.05)
        b = Instance(str(tmp_path / "b.db"), inbox_bytes=10)
        b.subscribe("big")
        bodies = [b"123456", b"abcdef", b"X" * 50, b"ABCDEF"]
        try:
            await a.connect("127.0.0.1", await b.listen())
            ids = await a.send_many("big", "", bodies)
            # The first fits; the next ones (in the same write, before any resend) do not: left
            # unacked, for the sender to resend.
            await until(lambda: refused() >= 3)
            assert b.inbox.nbytes == 6
            assert a.store.unacked() == 4
            got: list[Delivery] = []
            async with contextlib.aclosing(messages(b)) as deliveries:
                async for delivery in deliveries:
                    # never over the bound, but for one alone (an empty inbox takes any size)
                    assert b.inbox.nbytes <= 10 or len(b.inbox) == 1
                    got.append(delivery)
                    if {d.body for d in got} == set(bodies):
                        break
            assert got[0].body == bodies[0]
            assert {(d.id, d.body) for d in got} == set(zip(ids, bodies, strict=True))
            await until(lambda: a.store.unacked() == 0)
        finally:
            await a.close()
            await b.close()

    run(main())


def test_a_send_whose_commit_outlasts_a_reconnect_reaches_the_new_connection(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        b = Instance(str(tmp_path / "b.db"))
        b.subscribe("t")
        port = await b.listen()
        a = Instance(str(tmp_path / "a.db"), resend_interval=0.05)
        gate = threading.Event()
        try:
            await a.connect("127.0.0.1", port)
            # The store's thread is busy (a slow commit): the send's commit waits behind it.
            # (Private on purpose: a public way to occupy the store's one thread would be an
            # API for tests only; a slow disk cannot be had on demand otherwise.)
            a._committer.submit(gate.wait, 10)
            sending = asyncio.create_task(a.send_many("t", "", [b"x"]))
            await until(lambda: a.committing)
            await a.connect("127.0.0.1", port)  # meanwhile, a new connection to b replaces it
            gate.set()
            (message_id,) = await sending
            assert a.store.pending_for(b.instance_id) == [(message_id, "t", "", b"x")]
            # kept for b: b's connection must send it, or resend it
            assert message_id in a.links[b.instance_id].conn.unacked()
            got = await take(b, 1)
            assert [d.body for d in got] == [b"x"]
            await until(lambda: a.store.unacked() == 0)
        finally:
            gate.set()
            await a.close()
            await b.close()

    run(main())
