"""``pull_bytes`` (RS.io bytes fields): the same field whatever holds the frame, and a big
field out of a ``bytearray`` store (a frame that spanned several reads) copied through a view
that does not outlive the call (issue 22: one copy of a log record, not two)."""

from __future__ import annotations

import pytest

from tidewire.protocols.rsio.varint import NeedData
from tidewire.protocols.rsio.wire import pull_bytes, push_bytes


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 1_300_000])
@pytest.mark.parametrize("holder", [bytes, bytearray, memoryview])
def test_the_same_field_from_any_holder(size: int, holder: type) -> None:
    field = bytes(i % 251 for i in range(size))
    frame = bytearray(b"\x07")  # a byte before the field: it starts at an offset
    push_bytes(frame, field)
    frame += b"tail"
    got, end = pull_bytes(holder(bytes(frame)), 1, size)
    assert type(got) is bytes
    assert got == field
    assert end == len(frame) - 4


def test_a_big_field_leaves_the_bytearray_free_to_grow() -> None:
    store = bytearray()
    push_bytes(store, b"x" * 100_000)
    got, end = pull_bytes(store, 0, 100_000)
    store += b"more"  # would raise BufferError if a view of the store were still exported
    del store[:end]  # (the receive buffer compacts in place)
    assert got == b"x" * 100_000
    assert store == b"more"


def test_a_field_not_all_received_asks_for_its_end() -> None:
    store = bytearray()
    push_bytes(store, b"y" * 10_000)
    with pytest.raises(NeedData):
        pull_bytes(store[:5000], 0, 10_000)
