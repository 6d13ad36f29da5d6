"""A transaction's fingerprint a batch at a time (hub/fingerprint.py) is the fingerprint of
the whole, however the events are split; its CRC-32C combine agrees with the crc32c package."""

from __future__ import annotations

from itertools import pairwise

from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.hub.fingerprint import Fingerprint, crc32c_combine, fingerprint
from tidewire.model import Batch

EVENTS = st.lists(st.tuples(st.binary(max_size=40), st.none() | st.binary(max_size=12)),
                  min_size=1, max_size=40)  # fmt: skip


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_combine_is_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)


def test_combine_over_a_long_second_part() -> None:
    a, b = b"tidewire", bytes(range(256)) * 4099
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)


def _batch(events: list[tuple[bytes, bytes | None]]) -> Batch:
    keys = [k for _, k in events]
    return Batch.build("s", [v for v, _ in events],
                       keys=keys if any(k is not None for k in keys) else None)  # fmt: skip


@settings(max_examples=200)
@given(EVENTS, st.lists(st.integers(min_value=1, max_value=40), max_size=6))
def test_any_split_has_the_whole_fingerprint(events: list[tuple[bytes, bytes | None]],
                                              cuts: list[int]) -> None:  # fmt: skip
    whole = fingerprint(_batch(events))
    bounds = sorted({0, len(events), *(c for c in cuts if c < len(events))})
    acc = Fingerprint()
    for lo, hi in pairwise(bounds):
        acc.add(_batch(events[lo:hi]))  # (a part with no key has no key columns at all)
    assert (acc.count, acc.value()) == (len(events), whole)
    sliced = Fingerprint()  # slices of one batch (offsets not starting at 0)
    batch = _batch(events)
    for lo, hi in pairwise(bounds):
        sliced.add(batch.slice(lo, hi))
    assert sliced.value() == whole


def test_content_tells_apart() -> None:
    a = fingerprint(Batch.build("s", [b"ab", b"c"]))
    assert a != fingerprint(Batch.build("s", [b"a", b"bc"]))  # (the lengths count)
    assert a != fingerprint(Batch.build("s", [b"ab", b"c"], keys=[b"k", None]))
    assert a == fingerprint(Batch.build("s", [b"ab", b"c"], keys=[None, None]))
