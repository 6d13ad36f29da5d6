"""The receive buffer's large-frame path (ReceiveBuffer.reserve / filled): bytes written into
the reserved view are buffered exactly as appended ones would be, in the same store, and any
mix of appends, reserves (partly filled or not at all) and takes gives the same bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.protocols.buffer import ReceiveBuffer


def fill(buf: ReceiveBuffer, size: int, data: bytes) -> int:
    view = buf.reserve(size)
    assert view is not None
    n = min(len(view), len(data))
    view[:n] = data[:n]
    buf.filled(n)
    return n


def test_a_reserved_frame_is_received_into_the_store_itself() -> None:
    buf = ReceiveBuffer(1 << 20)
    buf.append(b"head")
    buf.skip(2)  # "ad" is a frame's head, its body of 10 bytes awaited
    view = buf.reserve(10)
    assert view is not None
    assert len(view) == 10
    view[:6] = b"012345"
    buf.filled(6)
    assert buf.buffered == len(buf) == 8  # the unwritten 4 bytes are not buffered
    rest = buf.reserve(3)  # the same store's rest (as it holds what is asked)
    assert rest is not None
    assert len(rest) == 4
    rest[:] = b"6789"
    buf.filled(4)
    data, pos = buf.view()
    assert isinstance(data, bytearray)
    assert bytes(data[pos:]) == b"ad0123456789"
    assert view.obj is data  # the reader wrote into the store: no copy after the read
    assert buf.take(12) == b"ad0123456789"
    assert not buf


def test_room_ahead_of_the_frame_takes_the_next_frames_beginning() -> None:
    buf = ReceiveBuffer(1000)
    view = buf.reserve(4, ahead=6)
    assert view is not None
    assert len(view) == 10
    view[:7] = b"abcdXYZ"  # the frame, then the next one's first bytes
    buf.filled(7)
    assert buf.take(4) == b"abcd"
    bigger = buf.reserve(5)  # more than the room left: a new store, "XYZ" copied in
    assert bigger is not None
    assert len(bigger) == 5
    assert bigger.obj is not view.obj
    bigger[:] = b"12345"
    buf.filled(5)
    assert buf.take_all() == b"XYZ12345"
    limited = buf.reserve(990, ahead=100)  # the room ahead stops at the limit
    assert limited is not None
    assert len(limited) == 1000


def test_a_partly_filled_reserve_settles_for_a_parser_and_an_append() -> None:
    buf = ReceiveBuffer(100)
    fill(buf, 10, b"abc")
    assert buf.take(4) is None  # only 3 buffered
    assert buf.view()[0] == bytearray(b"abc")  # the unwritten end dropped
    buf.append(b"de")
    assert buf.take_all() == b"abcde"


def test_reserve_refuses_past_the_limit_and_nothing_changes() -> None:
    buf = ReceiveBuffer(10)
    buf.append(b"123")
    assert buf.reserve(8) is None
    assert buf.reserve(0) is None
    assert buf.buffered == 3
    assert fill(buf, 7, b"4567890") == 7
    assert buf.take_all() == b"1234567890"


def test_filled_beyond_the_reserve_is_refused() -> None:
    buf = ReceiveBuffer(100)
    assert buf.reserve(4) is not None
    with pytest.raises(ValueError, match="filled"):
        buf.filled(5)
    buf.filled(0)
    assert buf.buffered == 0
    assert buf.take(1) is None


def test_a_view_of_the_reserve_kept_past_filled_does_not_break_the_buffer() -> None:
    buf = ReceiveBuffer(100)
    view = buf.reserve(8)
    assert view is not None
    view[:2] = b"xy"
    buf.filled(2)
    assert buf.take_all() == b"xy"  # settling could not shrink the exported store
    view.release()


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "reserve", "take", "take_all"]), st.binary(max_size=40)
        ),
        max_size=30,
    )
)
def test_any_mix_of_appends_and_reserves_keeps_the_byte_stream(
    steps: list[tuple[str, bytes]],
) -> None:
    buf = ReceiveBuffer(1000)
    model = bytearray()  # what is buffered, by the simplest means
    for op, data in steps:
        if op == "append":
            buf.append(data)
            model += data
        elif op == "reserve":
            n = fill(buf, len(data) + 5, data)  # (a reserve left partly unwritten too)
            model += data[:n]
        elif op == "take":
            size = len(data)
            got = buf.take(size)
            if size > len(model):
                assert got is None
            else:
                assert got == bytes(model[:size])
                del model[:size]
        else:
            assert buf.take_all() == bytes(model)
            model.clear()
        assert buf.buffered == len(model)
    assert buf.take_all() == bytes(model)


def test_the_next_big_frame_reuses_the_free_store_and_spares_a_kept_one() -> None:
    buf = ReceiveBuffer(1000)
    first = buf.reserve(100)
    assert first is not None
    store = first.obj
    first[:] = b"a" * 100
    buf.filled(100)
    first.release()
    assert buf.take(100) == b"a" * 100
    buf.append(b"hd")  # the next frame's head, then its body in place
    second = buf.reserve(60)
    assert second is not None
    assert second.obj is store
    assert len(second) == 60
    second[:] = b"b" * 60
    buf.filled(60)
    assert buf.take(62) == b"hd" + b"b" * 60
    kept = memoryview(buf.data)  # a view of that store kept: the store is not free
    buf.append(b"h")
    third = buf.reserve(10)
    assert third is not None
    assert third.obj is not store
    third[:] = b"c" * 10
    buf.filled(10)
    assert buf.take_all() == b"h" + b"c" * 10
    assert bytes(kept[2:62]) == b"b" * 60  # untouched
