"""``Connection.receive_run`` (issue 22: message and ack frames parsed in runs, no object per
frame but the message): for any bytes, cut anywhere, a connection drained with runs then
``next_event`` gives the same messages, acks, other events (after as many messages and acks),
bytes to send and state as one drained with ``next_event`` alone, the way it always was."""

from __future__ import annotations

import struct
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.protocols.tolliver import (
    CONTROL_CHANNEL,
    UNRELIABLE,
    Acked,
    Connection,
    Limits,
    Message,
    Received,
    Role,
)
from tidewire.protocols.tolliver.codec import ACK, encode_control, encode_message

C_ID = uuid.UUID("01890a5d-ac96-774b-bcce-b302099a8057")
A_ID = uuid.UUID("01890a5d-ac96-7fff-8000-000000000001")
LIMITS = Limits(max_name_bytes=16, max_body_bytes=64)
SENT = 24  # ids 0..23 await acks on the side under test
MSG_HEAD = struct.Struct(">BIIII")

Outcome = tuple[list[tuple[str, str, bytes, int]], list[int], list[tuple[str, int, int]], bytes]


def established(auto_ack: bool) -> Connection:
    """The accepting side, established, with reliable ids 0..SENT-1 sent and awaiting acks."""
    c = Connection(Role.CONNECTOR, C_ID, 1, frozenset({1}), limits=LIMITS)
    a = Connection(Role.ACCEPTOR, A_ID, 1, frozenset({1}), limits=LIMITS, auto_ack=auto_ack)
    c.subscribe("c")
    c.initiate()
    a.receive_data(c.data_to_send())
    while a.next_event() is not None:
        pass
    assert a.established
    a.send_many("c", [(b"", b"x", i) for i in range(SENT)], 0.0)
    a.data_to_send()
    return a


def frames() -> st.SearchStrategy[bytes]:
    names = st.sampled_from([b"c", b"d", b"", b"\xc3\xa9t\xc3\xa9", b"\xff", b"n" * 17])
    message = st.builds(
        lambda channel, key, body, message_id: encode_message(channel, key, body, message_id),
        names, names, st.binary(max_size=70),
        st.sampled_from([0, 3, 7, 30, UNRELIABLE, 2**32 - 1]),
    )  # fmt: skip
    ack = st.integers(0, SENT + 4).map(lambda i: ACK.pack(4, i))
    control = st.sampled_from([encode_control(0, b"d", b""), encode_control(1, b"c", b"")])
    odd = st.sampled_from([b"\x02\x01", b"\x09", MSG_HEAD.pack(3, 1, 0, 10**6, 1)])
    return st.one_of(message, message, ack, ack, control, odd)


def drain(conn: Connection, chunks: list[bytes], runs: bool) -> Outcome:
    messages: list[tuple[str, str, bytes, int]] = []
    acks: list[int] = []
    others: list[tuple[str, int, int]] = []
    sent = bytearray()
    run: list[Message] = []
    acked: list[int] = []
    for chunk in chunks:
        conn.receive_data(chunk)
        while True:
            if runs and conn.receive_run(run, acked):
                messages += [(m.channel, m.key, m.body, m.id) for m in run]
                acks += acked
                run.clear()
                acked.clear()
            event = conn.next_event()
            if event is None:
                break
            if isinstance(event, Received):
                m = event.message
                messages.append((m.channel, m.key, m.body, m.id))
            elif isinstance(event, Acked):
                acks.append(event.id)
            else:
                others.append((repr(event), len(messages), len(acks)))
        sent += conn.data_to_send()
    others.append((f"{conn.state} {conn.frames_received} {conn.unacked()}", len(messages),
                   len(acks)))  # fmt: skip
    return messages, acks, others, bytes(sent)


@settings(max_examples=300, deadline=None)
@given(st.lists(frames(), max_size=30), st.lists(st.integers(1, 200), max_size=8),
       st.booleans())  # fmt: skip
def test_runs_give_what_next_event_gives(parts: list[bytes], cuts: list[int],
                                         auto_ack: bool) -> None:  # fmt: skip
    data = b"".join(parts)
    chunks, at = [], 0
    for cut in cuts:
        chunks.append(data[at : at + cut])
        at += cut
    chunks.append(data[at:])
    chunks = [chunk for chunk in chunks if chunk]
    expected = drain(established(auto_ack), chunks, runs=False)
    assert drain(established(auto_ack), chunks, runs=True) == expected


def test_a_run_takes_every_whole_frame_and_stops_at_the_rest() -> None:
    conn = established(auto_ack=True)
    body = b"b" * 10
    data = b"".join([encode_message(b"c", b"k", body, 1), ACK.pack(4, 2), ACK.pack(4, 99),
                     encode_message(b"c", b"", body, UNRELIABLE),
                     encode_control(0, b"d", b""), ACK.pack(4, 3)])  # fmt: skip
    conn.receive_data(data[:-2])  # (the last ack cut short)
    run: list[Message] = []
    acked: list[int] = []
    assert conn.receive_run(run, acked) == 4  # two messages and two acks (99 not awaited)
    assert run == [Message("c", "k", body, 1), Message("c", "", body, UNRELIABLE)]
    assert acked == [2]
    assert conn.data_to_send() == ACK.pack(4, 1)  # auto-acked, the unreliable one not
    assert conn.receive_run(run, acked) == 0  # a control message: next_event's
    assert conn.next_event() is not None  # (the peer's subscriptions changed)
    assert conn.next_event() is None
    assert conn.receive_run(run, acked) == 0  # the ack is not whole
    conn.receive_data(data[-2:])
    assert conn.receive_run(run, acked) == 1
    assert acked == [2, 3]
    assert CONTROL_CHANNEL not in {m.channel for m in run}
