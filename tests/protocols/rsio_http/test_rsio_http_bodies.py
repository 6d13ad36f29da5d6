"""``length_prefixed_envelopes`` (the fetch response body built from batch columns in one
pass) against its specification, the envelopes one by one then length-prefixed: byte for byte,
for keys and none, negative and repeated timestamps, ids across varint sizes, sliced batches
(offsets above 0), empty values and a value of 64 KiB."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.model import Batch
from tidewire.protocols.rsio.envelopes import encode_envelopes
from tidewire.protocols.rsio_http import decode_length_prefixed, encode_length_prefixed
from tidewire.protocols.rsio_http.bodies import length_prefixed_envelopes


def spec(batches: list[Batch]) -> bytes:
    return encode_length_prefixed([e for b in batches for e in encode_envelopes(b)])


def build(first_id: int, values: list[bytes], keys: list[bytes | None] | None,
          stamps: list[int]) -> Batch:  # fmt: skip
    ids = range(first_id, first_id + len(values))
    return Batch.build("s", values, ids=ids, keys=keys, timestamps=stamps)


def test_golden_cases() -> None:
    cases = [
        [build(1, [b"a", b"", b"ccc"], None, [0, 0, 0])],
        [build(127, [b"x" * 10] * 4, [b"k", None, b"", b"key2"], [5, -5, -5, 2**40])],
        [build(2**35, [os.urandom(65536), b"z"], None, [-(2**63), 2**63 - 1])],
        [build(1, [b"v%d" % i for i in range(300)], None, [7] * 300).slice(100, 250),
         build(301, [b"w"], [b"kk"], [8])],
    ]  # fmt: skip
    for batches in cases:
        body = length_prefixed_envelopes(batches)
        assert body == spec(batches)
        assert len(decode_length_prefixed(body)) == sum(len(b) for b in batches)
    assert length_prefixed_envelopes([]) == b""


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=600),  # (small and large values: both ways of slicing)
            st.one_of(st.none(), st.binary(max_size=8)),
            st.integers(-(2**63), 2**63 - 1),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 2**62),
    st.data(),
)
def test_same_bytes_as_the_specification(
    events: list[tuple[bytes, bytes | None, int]], first_id: int, data: st.DataObject
) -> None:
    values = [v for v, _, _ in events]
    keys = [k for _, k, _ in events]
    stamps = [t for _, _, t in events]
    batch = build(first_id, values, keys if any(k is not None for k in keys) else None, stamps)
    start = data.draw(st.integers(0, len(batch) - 1))
    stop = data.draw(st.integers(start + 1, len(batch)))
    batches = [batch.slice(start, stop), batch]
    assert length_prefixed_envelopes(batches) == spec(batches)
