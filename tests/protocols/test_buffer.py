"""The shared receive buffer (tidewire.protocols.buffer): limits, transactions, zero-copy of a
lone chunk, and a delimiter search that stays linear however thinly bytes arrive."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.model import RemoteProtocolError
from tidewire.protocols.buffer import BufferFull, ReceiveBuffer


def test_a_lone_chunk_is_handed_back_uncopied() -> None:
    buf = ReceiveBuffer(100)
    chunk = b"hello world"
    buf.append(chunk)
    assert buf.buffered == len(buf) == 11
    assert buf.take(len(chunk)) is chunk
    assert buf.buffered == 0
    assert not buf


def test_take_waits_for_enough_bytes_and_consumes_nothing_meanwhile() -> None:
    buf = ReceiveBuffer(100)
    buf.append(b"abc")
    assert buf.take(4) is None
    assert buf.buffered == 3
    buf.append(b"def")
    assert buf.take(4) == b"abcd"
    assert buf.take_all() == b"ef"


def test_the_limit_counts_unparsed_bytes_and_refuses_before_keeping() -> None:
    buf = ReceiveBuffer(8)
    buf.append(b"12345")
    with pytest.raises(BufferFull) as caught:
        buf.append(b"6789")
    assert isinstance(caught.value, RemoteProtocolError)
    assert (caught.value.limit, caught.value.got) == (8, 9)
    assert buf.buffered == 5  # nothing of the refused chunk kept
    buf.skip(5)
    buf.append(b"12345678")  # parsed bytes do not count
    assert buf.buffered == 8


def test_rollback_gives_back_a_partial_frame() -> None:
    buf = ReceiveBuffer(100)
    buf.append(b"\x03abc")
    size = buf.take(1)
    assert size == b"\x03"
    assert buf.take(size[0] + 1) is None  # half a frame: give the header back
    buf.rollback()
    assert buf.buffered == 4
    buf.append(b"de")
    head = buf.take(1)
    assert head is not None
    assert buf.take(head[0]) == b"abc"
    buf.commit()
    buf.rollback()  # nothing since the commit
    assert buf.take_all() == b"de"


def test_take_until_finds_lines_and_bounds_them() -> None:
    buf = ReceiveBuffer(100)
    buf.append(b"SAVE 1 2\nEV")
    assert buf.take_until(b"\n", 10) == b"SAVE 1 2"
    assert buf.take_until(b"\n", 10) is None
    buf.append(b"ENT\n")
    assert buf.take_until(b"\n", 10) == b"EVENT"
    buf.append(b"x" * 11)
    with pytest.raises(RemoteProtocolError):
        buf.take_until(b"\n", 10)


def test_a_search_resumes_where_it_stopped() -> None:
    """Byte by byte, a 2-byte delimiter split across appends is still found (the resumed
    search backs up by the delimiter's overlap), and after a rollback the bytes given back are
    searched again."""
    buf = ReceiveBuffer(1000)
    for byte in b"a" * 50 + b"\n":
        buf.append(bytes([byte]))
        assert buf.find(b"\n\n", 500) == -1
    buf.append(b"\n")
    assert buf.find(b"\n\n", 500) == 50
    rolled = ReceiveBuffer(100)
    rolled.append(b"a\nbcd")
    rolled.skip(2)
    assert rolled.find(b"\n", 50) == -1
    rolled.rollback()
    assert rolled.find(b"\n", 50) == 1


def test_in_place_parsing_through_data_and_advance_to() -> None:
    buf = ReceiveBuffer(100)
    buf.append(b"\x00\x02hi\x00\x01!")
    data, pos = buf.data, buf.pos
    end = pos + 2 + data[pos + 1]
    assert bytes(data[pos + 2 : end]) == b"hi"
    buf.advance_to(end)
    assert buf.buffered == 3
    with pytest.raises(AssertionError, match="outside"):
        buf.advance_to(0)


def test_the_consumed_prefix_is_dropped_as_it_grows() -> None:
    buf = ReceiveBuffer(1 << 20)
    buf.append(b"x")
    for _ in range(1000):
        buf.append(b"y" * 200)
        buf.skip(200)
    assert len(buf.data) < 200_000  # compacted, not 200 kB of parsed bytes kept
    assert buf.take_all() == b"y"


@given(st.binary(max_size=300), st.lists(st.integers(1, 40), max_size=20))
def test_lines_split_anywhere_read_the_same(data: bytes, cuts: list[int]) -> None:
    whole = ReceiveBuffer(10_000)
    whole.append(data)
    expected = []
    while (line := whole.take_until(b"\n", 1000)) is not None:
        expected.append(line)
    thin = ReceiveBuffer(10_000)
    got = []
    pos = 0
    for cut in [*cuts, len(data)]:
        thin.append(data[pos : pos + cut])
        pos += cut
        while (line := thin.take_until(b"\n", 1000)) is not None:
            got.append(line)
        if pos >= len(data):
            break
    thin.append(data[pos:])
    while (line := thin.take_until(b"\n", 1000)) is not None:
        got.append(line)
    assert got == expected
    assert thin.buffered == whole.buffered


@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=30),
       st.lists(st.integers(0, 50), min_size=1, max_size=30))  # fmt: skip
def test_a_streaming_buffer_hands_out_the_same_bytes_as_one_that_is_not(
    chunks: list[bytes], takes: list[int]
) -> None:
    """``streaming=True`` only changes where the bytes are kept (one store, copied in as they
    come), never which bytes a parser gets."""
    got: list[list[bytes | None]] = []
    for streaming in (False, True):
        buf = ReceiveBuffer(10_000, streaming=streaming)
        out: list[bytes | None] = []
        for chunk, n in zip(chunks, takes * len(chunks), strict=False):
            buf.append(chunk)
            data, pos = buf.view()  # (joins: the store is a bytearray from here on)
            out.append(bytes(data[pos:pos + n]) if len(data) - pos >= n else None)
            if len(data) - pos >= n:
                buf.advance_to(pos + n)
        out.append(buf.take_all())
        got.append(out)
    assert got[0] == got[1]
