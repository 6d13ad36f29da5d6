"""Tube's "smart" compression (protocols/tube/smart.py): a message is deflated only when that
shrinks it by an eighth, and a large one is probed first (its first 16 KiB), so incompressible
megabytes are not deflated whole to find out (issue 22: a hub sending 1 MiB random values over
Tube spent nearly all its time there)."""

from __future__ import annotations

import os
import zlib

from tidewire.protocols.tube import Connection, MessageReceived, Role, push_varint
from tidewire.protocols.tube.smart import (
    PROBE_BYTES,
    PROBE_FROM,
    SMART_MIN_BYTES,
    deflate,
    deflated_if_it_pays,
)


def views(*chunks: bytes) -> list[memoryview]:
    return [memoryview(c) for c in chunks]


def test_deflate_is_zlib_level_1_of_the_join() -> None:
    chunks = [b"abc" * 1000, b"", os.urandom(100), b"x" * 5000]
    assert deflate(views(*chunks)) == zlib.compress(b"".join(chunks), 1)


def test_what_pays_is_deflated_whole_as_before() -> None:
    rows = b"".join(b'{"id": %d, "action": "click"},' % i for i in range(20_000))
    assert len(rows) > PROBE_FROM
    half = len(rows) // 2
    assert deflated_if_it_pays(views(rows[:half], rows[half:]), len(rows)) == \
        zlib.compress(rows, 1)  # fmt: skip


def test_what_does_not_pay_is_plain() -> None:
    small = os.urandom(SMART_MIN_BYTES - 1)
    assert deflated_if_it_pays(views(small), len(small)) is None
    assert deflated_if_it_pays(views(b"a" * 255), 255) is None  # under the floor: not tried
    for size in (SMART_MIN_BYTES, PROBE_FROM - 1, PROBE_FROM, 1 << 20):
        noise = os.urandom(size)
        assert deflated_if_it_pays(views(noise), size) is None


def test_a_large_message_is_judged_by_its_start() -> None:
    # (**decision**) incompressible first 16 KiB, then zeros: the whole would pay, the probe
    # says plain; under PROBE_FROM the same shape is deflated whole, as before.
    big = os.urandom(PROBE_BYTES) + bytes(PROBE_FROM)
    assert len(zlib.compress(big, 1)) < len(big) // 2
    assert deflated_if_it_pays(views(big[:100], big[100:]), len(big)) is None
    under = os.urandom(PROBE_BYTES) + bytes(PROBE_FROM - PROBE_BYTES - 1)
    assert deflated_if_it_pays(views(under), len(under)) == zlib.compress(under, 1)


def test_a_smart_sender_sends_random_megabytes_plain() -> None:
    sender = Connection(Role.SERVER, compression="smart")
    sender.receive_data(push_varint(0), 0.0)
    sender.next_event()
    sender.data_to_send()
    payload = os.urandom(1 << 20)
    sender.send_chunks([payload[:5], payload[5:]], 0.0)
    (message,) = sender.data_to_send()
    assert message[:1] == b"\x01"  # plain (code 0), one fragment
    receiver = Connection(Role.CLIENT)
    receiver.data_to_send()
    receiver.receive_data(push_varint(0), 0.0)
    receiver.next_event()
    receiver.receive_data(message, 0.0)
    assert receiver.next_event() == MessageReceived(payload, False)
