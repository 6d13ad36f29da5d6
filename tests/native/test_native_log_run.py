"""The log's run encoder, compiled (``native/_log.pxi``) against its pure twin
(``log.grouping.encode_run_py``, the specification): the same record bytes, the same record
batch and stored batches buffer for buffer (formats and read-only flags included), the same
refusals. Loads the extension directly, so it runs in the ``TIDEWIRE_PURE=1`` pass too."""

from __future__ import annotations

import importlib
from array import array
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewire.log.grouping import (
    RunEncoded,
    encode_group_runs_py,
    encode_run_py,
    owned_valid_py,
)
from tidewire.model import MAX_ID, Batch, InvalidBatch
from tidewire.record import HEADER_SIZE, decode_body, parse_header

try:
    K: ModuleType = importlib.import_module("tidewire.native._kernels")
except ImportError:  # pragma: no cover - the normal run fails in test_native_switch.py instead
    pytest.skip("the compiled kernels are not built", allow_module_level=True)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STAMPS = [0, -1, 1, 2**63 - 1, -(2**63), 1_764_000_000_000]

View = tuple[bytes, str, bool] | None


def layout(batch: Batch) -> tuple[str, View, View, View, View, View, View, View]:
    """Every buffer of ``batch``: bytes, format, read-only (``None`` for absent keys)."""

    def one(v: memoryview | None) -> View:
        return None if v is None else (v.tobytes(), v.format, v.readonly)

    return (batch.stream, one(batch.ids), one(batch.timestamps), one(batch.value_offsets),
            one(batch.values), one(batch.key_flags), one(batch.key_offsets),
            one(batch.keys))  # fmt: skip


def same(items: list[tuple[Batch, int | None]]) -> RunEncoded:
    pure = encode_run_py(items)
    compiled = K.encode_run(items)
    assert type(compiled[0]) is bytearray
    assert bytes(compiled[0]) == bytes(pure[0])
    assert layout(compiled[1]) == layout(pure[1])
    assert [layout(b) for b in compiled[2]] == [layout(b) for b in pure[2]]
    assert compiled[3:] == pure[3:]
    return pure


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[Batch, int | None]]:
    """Runs as the committer makes them: lone events (the common case) and small batches,
    keys or none or some flagged "no key" (empty or not), slices whose offsets do not start
    at 0, ids of their own or assigned."""
    items: list[tuple[Batch, int | None]] = []
    next_id = draw(st.integers(1, 2**40))
    for _ in range(draw(st.integers(1, 8))):
        n = draw(st.sampled_from([1, 1, 1, 2, 3, 7]))
        values = draw(st.lists(st.binary(max_size=30), min_size=n + 1, max_size=n + 1))
        keys = draw(st.none() | st.lists(st.none() | st.binary(max_size=9), min_size=n + 1,
                                         max_size=n + 1))  # fmt: skip
        stamps = draw(st.lists(st.sampled_from(STAMPS) | st.integers(-(2**63), 2**63 - 1),
                               min_size=n + 1, max_size=n + 1))  # fmt: skip
        assigned = draw(st.booleans())
        own = draw(st.integers(1, 2**40)) if assigned else next_id
        batch = Batch.build("run.s", values, ids=range(own, own + n + 1), keys=keys,
                            timestamps=stamps)  # fmt: skip
        start = draw(st.integers(0, 1))
        batch = batch.slice(start, start + n)
        items.append((batch, next_id if assigned else None))
        next_id = (next_id if assigned else own + start) + n + draw(st.integers(0, 3))
    return items


@FUZZ
@given(runs())
def test_runs_encode_the_same(items: list[tuple[Batch, int | None]]) -> None:
    data, record, stored, count, first, last, max_ts = same(items)
    header = parse_header(data)  # (and the record reads back as the batch stored)
    assert (header.count, header.base_id, header.last_id, header.max_timestamp) == (
        count, first, last, max_ts)  # fmt: skip
    assert decode_body("run.s", header, memoryview(data), 0) == record
    assert len(data) == header.length
    assert header.length % 8 == 0
    assert sum(len(b) for b in stored) == count == sum(len(b) for b, _ in items)


def test_a_key_flagged_none_with_bytes_keeps_them_only_outside_a_run_of_lone_events() -> None:
    """``merge``'s two paths differ there (a lone event's key flagged 0 keeps no bytes when
    every batch of the run is a lone event): the kernel follows each."""
    flagged = Batch.build("s", [b"v"], ids=[1], keys=[b"kk"])
    raw = flagged.key_flags
    assert raw is not None
    zero = memoryview(b"\x00")  # the same batch, its key flagged "no key" but its bytes kept
    odd = Batch(flagged.stream, flagged.ids, flagged.timestamps, flagged.value_offsets,
                flagged.values, zero, flagged.key_offsets, flagged.keys)  # fmt: skip
    pair = Batch.build("s", [b"a", b"b"], ids=[5, 6], keys=[b"x", None])
    runs: list[list[tuple[Batch, int | None]]] = [
        [(odd, 7)],
        [(odd, 7), (odd, 8)],
        [(odd, 7), (pair, 8)],
        [(pair, None)],
    ]
    for items in runs:
        same(items)


def test_refusals_are_the_same() -> None:
    lone = Batch.build("s", [b"v", b"w"], ids=[1, 2])
    for first in (0, -1, MAX_ID, 2**64):
        refused: list[list[tuple[Batch, int | None]]] = [
            [(lone, first)],
            [(lone, 1), (lone, first)],
        ]
        for items in refused:
            with pytest.raises(InvalidBatch) as pure:
                encode_run_py(items)
            with pytest.raises(InvalidBatch) as compiled:
                K.encode_run(items)
            assert str(compiled.value) == str(pure.value)
    same([(lone, MAX_ID - 1)])
    for fn in (encode_run_py, K.encode_run):
        with pytest.raises(ValueError, match="at least one batch"):
            fn([])


def test_a_record_is_padded_with_zeros() -> None:
    for size in range(9):
        data = same([(Batch.build("s", [b"x" * size], ids=[1]), None)])[0]
        body = int.from_bytes(data[12:16], "little")
        assert data[HEADER_SIZE + body :] == bytes(len(data) - HEADER_SIZE - body)


@FUZZ
@given(runs(), st.integers(60, 400), st.integers(1, 4))
def test_groups_cut_and_encode_the_same(
    items: list[tuple[Batch, int | None]], limit: int, max_events: int
) -> None:
    """A group cut into runs by bytes and by events (small limits: many cuts, batches of
    their own), each run's record and every item's stored batch the same both ways."""
    pure_runs, pure_stored = encode_group_runs_py(items, limit, max_events)
    runs_, stored = K.encode_group_runs(items, limit, max_events)
    assert len(runs_) == len(pure_runs)
    for got, want in zip(runs_, pure_runs, strict=True):
        assert bytes(got[0]) == bytes(want[0])
        assert layout(got[1]) == layout(want[1])
        assert got[2:] == want[2:]
    assert [layout(b) for b in stored] == [layout(b) for b in pure_stored]
    assert K.encode_group_runs([], limit, max_events) == encode_group_runs_py([], 1, 1)


def test_an_append_keeps_the_same_batch_or_the_same_copy_or_the_same_refusal() -> None:
    """``owned_valid``: a batch of ``bytes`` views comes back as itself; one of a reusable
    buffer as an equal copy of ``bytes``; a bad one with the model's own error."""
    good = Batch.build("s", [b"a", b"bc"], ids=[3, 9], keys=[b"k", None])
    assert K.owned_valid(good) is good
    assert owned_valid_py(good) is good
    buffer = bytearray(b"xyz")
    borrowed = Batch.build("s", [b"xyz"], ids=[4])
    borrowed = Batch(borrowed.stream, borrowed.ids, borrowed.timestamps,
                     borrowed.value_offsets, memoryview(buffer), None, None, None)  # fmt: skip
    copy = K.owned_valid(borrowed)
    assert copy is not borrowed
    assert layout(copy) == layout(owned_valid_py(borrowed))
    assert type(copy.values.obj) is bytes
    ids = memoryview(bytes(memoryview(array("Q", [5, 5])))).cast("Q")
    offsets = memoryview(bytes(memoryview(array("I", [0, 2, 1])))).cast("I")
    bad = [
        Batch(good.stream, ids, good.timestamps, good.value_offsets, good.values),
        Batch(
            good.stream,
            memoryview(bytes(8)).cast("Q")[:1],
            good.timestamps[:1],
            good.value_offsets[:2],
            good.values[:1],
        ),
        Batch(good.stream, good.ids, good.timestamps, offsets, good.values[:1]),
    ]
    for batch in bad:
        with pytest.raises(InvalidBatch) as pure:
            owned_valid_py(batch)
        with pytest.raises(InvalidBatch) as compiled:
            K.owned_valid(batch)
        assert str(compiled.value) == str(pure.value)
