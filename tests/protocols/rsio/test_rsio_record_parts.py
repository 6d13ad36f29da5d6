"""``records.record_parts`` and ``SendQueue.write_element_parts``: the hub's ``format=records``
path sends the bytes ``record.encode`` would make (for whole records read from a log: the
stored bytes), for any batch (slices, keys or none, offsets above 0), with the body's big
buffers queued uncopied."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.log import Log, LogConfig
from tidewire.model import Batch
from tidewire.protocols.rsio import OnNext, encode
from tidewire.protocols.rsio.output import BIG_ELEMENT, SendQueue
from tidewire.protocols.rsio.records import record_parts
from tidewire.protocols.rsio.varint import varint_bytes
from tidewire.record import encode as encode_record
from tidewire.record import parse_header


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    """Batches with and without keys, values small and big, then maybe sliced (offsets that
    start above 0, a record of a piece of a batch)."""
    n = draw(st.integers(1, 40))
    first = draw(st.sampled_from([1, 1000, 2**62]))
    sizes = [draw(st.sampled_from([0, 1, 7, 100, BIG_ELEMENT + 3])) for _ in range(n)]
    keyed = draw(st.booleans())
    batch = Batch.build(
        "s",
        [bytes([i % 251]) * size for i, size in enumerate(sizes)],
        ids=list(range(first, first + n)),
        keys=[draw(st.none() | st.binary(max_size=30)) for _ in range(n)] if keyed else None,
        timestamps=[draw(st.integers(-(2**40), 2**40)) for _ in range(n)],
    )
    start = draw(st.integers(0, n - 1))
    stop = draw(st.integers(start + 1, n))
    return batch.slice(start, stop)


@settings(max_examples=200, deadline=None)
@given(batches())
def test_record_parts_join_to_the_encoded_record(batch: Batch) -> None:
    parts = record_parts(batch)
    assert b"".join(parts) == bytes(encode_record(batch).data)
    assert len(parts[0]) == 48  # the header: the only bytes made
    assert all(isinstance(p, memoryview) for p in parts[1:4])  # ids, timestamps, offsets


def test_a_whole_record_read_from_the_log_is_sent_as_stored(tmp_path: Path) -> None:
    """Read back from a segment, a record's parts are its bytes in the segment file."""

    async def run() -> list[Batch]:
        log = Log.open(str(tmp_path), LogConfig(fsync=False))
        try:
            for start in (0, 3):
                await log.append(
                    Batch.build("s", [b"v%d" % i * 40 for i in range(start, start + 3)],
                                keys=[b"k", None, b""], timestamps=1_700_000_000_000 + start),
                    assign_ids=True,
                )  # fmt: skip
            return log.read("s", 1, 1 << 20)
        finally:
            await log.close()

    batches = asyncio.run(run())
    (directory,) = [d for d in os.listdir(tmp_path) if not d.startswith((".", "_"))]
    segment = next(f for f in os.listdir(tmp_path / directory) if f.endswith(".log"))
    stored = (tmp_path / directory / segment).read_bytes()
    assert len(batches) == 2
    pos = 0
    for batch in batches:
        length = parse_header(stored, pos).length
        assert b"".join(record_parts(batch)) == stored[pos : pos + length]
        pos += length
    assert pos == len(stored)


@pytest.mark.parametrize("before", [b"", b"\x01\x02"])
def test_write_element_parts_is_one_onnext_frame(before: bytes) -> None:
    """One frame: prefix, the total length, the parts; big parts queued by reference, small
    ones copied; the tail written before comes first; ``pending`` counts every byte."""
    big = memoryview(bytes(range(256)) * (BIG_ELEMENT // 256 + 1))
    parts: list[bytes | memoryview] = [b"head", big, b"xy", memoryview(b"z" * 5), big[:10]]
    queue = SendQueue()
    queue.write(before)
    prefix = varint_bytes(7) + varint_bytes(300)  # onNext, subscriber 300
    queue.write_element_parts(prefix, parts)
    element = b"".join(parts)
    expected = before + bytes(encode(OnNext(300, element)))
    assert queue.pending == len(expected)
    chunks = queue.chunks()
    assert b"".join(chunks) == expected
    assert any(c is big for c in chunks)  # the big part itself, not a copy
    assert queue.pending == 0
