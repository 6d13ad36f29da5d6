"""A ``SAVE MANY`` flow is queued whole (not copied through the session's output buffer):
what :meth:`ClientSession.data_to_send` returns and ``pending`` says stay those of one byte
queue, in order, whatever was queued before or after the flow."""

from __future__ import annotations

from tidewire.protocols.seguro import ClientSession, Committed, CommittedMany, Welcome

FLOW = (b"SAVE MANY 2 1 2\nEVENT 1 3\none\n\nEVENT 2 0\n\n\n"
        b"STREAMED MANY 2 1 2\n")  # fmt: skip


def welcomed() -> ClientSession:
    client = ClientSession("~zod")
    client.receive_data(b"SEGURO 0\nIDENTIFY 0\nWELCOME ~zod\n")
    assert [client.next_event() for _ in range(3)][-1] == Welcome("~zod", None)
    return client  # (HELLO and POINT still queued)


def test_a_flow_after_queued_bytes_comes_after_them() -> None:
    client = welcomed()
    before = client.pending
    assert before == len(b"HELLO 0\nPOINT ~zod\n")
    client.save_many([(1, b"one"), (2, b"")])
    assert client.pending == before + len(FLOW)
    assert client.data_to_send() == b"HELLO 0\nPOINT ~zod\n" + FLOW
    assert client.pending == 0
    assert client.data_to_send() == b""


def test_a_flow_queued_alone_then_more_after_it() -> None:
    client = welcomed()
    client.data_to_send()
    client.save_many([(1, b"one"), (2, b"")])
    assert client.pending == len(FLOW)
    client.receive_data(b"COMMITTED MANY 2 1 2\n")
    assert client.next_event() == CommittedMany(2, 1, 2)
    client.save(3, b"x")  # queued behind the flow, which has not been taken yet
    client.receive_data(b"COMMITTED 3 1\n")
    assert client.next_event() == Committed(3, 1)
    client.save_many([(4, b"a"), (5, b"b")])  # and a second flow behind both
    said = client.data_to_send()
    assert said == (FLOW + b"SAVE 3 1\nx\n\n" + b"SAVE MANY 2 4 5\nEVENT 4 1\na\n\nEVENT 5 1\n"
                    b"b\n\nSTREAMED MANY 2 4 5\n")  # fmt: skip
    assert client.pending == 0


def test_a_flow_queued_alone_is_sent_as_it_is() -> None:
    client = welcomed()
    client.data_to_send()
    client.save_many([(1, b"one"), (2, b"")])
    assert client.data_to_send() == FLOW
    assert client.data_to_send() == b""
