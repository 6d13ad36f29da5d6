"""The compiled ``arrow_group`` (tidewire/native/_arrow_group.pxi) against its pure twin
``spark.arrow.arrow_group_py``: the same buffers byte for byte for the same groups of batches
(keys on some, none or all; slices whose offsets start above 0; timestamps at the edges of
what µs hold), the same refusals; and ``group_to_arrow`` gives the rows that ``to_arrow`` of
each batch, concatenated, gives (the Spark reader's path before the kernel)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewire.model import Batch, InvalidBatch
from tidewire.spark.arrow import arrow_group_py, group_to_arrow, to_arrow

try:
    K: ModuleType = importlib.import_module("tidewire.native._kernels")
except ImportError:  # pragma: no cover - the normal run fails in test_native_switch.py instead
    pytest.skip("the compiled kernels are not built", allow_module_level=True)

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MS_LIMIT = (2**63 - 1) // 1000  # the largest ms that µs hold
Outputs = list[memoryview]


@st.composite
def groups(draw: st.DrawFn) -> list[Batch]:
    """1-5 batches of consecutive ids, each keyed or not, some of them slices."""
    out: list[Batch] = []
    next_id = draw(st.integers(1, 2**40))
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(1, 30))
        values = draw(st.lists(st.binary(max_size=30), min_size=n, max_size=n))
        keys = draw(st.none() | st.lists(st.none() | st.binary(max_size=9), min_size=n,
                                         max_size=n))  # fmt: skip
        stamp = st.sampled_from([0, -1, MS_LIMIT, -MS_LIMIT]) | st.integers(-MS_LIMIT, MS_LIMIT)
        stamps = draw(st.lists(stamp, min_size=n, max_size=n))
        batch = Batch.build("g", values, ids=list(range(next_id, next_id + n)), keys=keys,
                            timestamps=stamps)  # fmt: skip
        start = draw(st.integers(0, n - 1))
        out.append(batch.slice(start, n))
        next_id += n
    return out


def outputs(group: list[Batch], *, keyed: bool | None = None) -> Outputs:
    """Writable buffers sized for ``group`` (filled with 0xAA: every byte must be written)."""
    rows = sum(len(b) for b in group)
    if keyed is None:
        keyed = any(b.key_flags is not None for b in group)
    sizes = [8 * rows, 8 * rows, 4 * (rows + 1), sum(b.values.nbytes for b in group),
             (rows + 7) // 8 if keyed else 0, 4 * (rows + 1) if keyed else 0,
             sum(b.keys.nbytes for b in group if b.keys is not None)]  # fmt: skip
    return [memoryview(bytearray(b"\xaa" * size)) for size in sizes]


def run(fill: Callable[..., int], group: list[Batch]) -> tuple[int, list[bytes]]:
    out = outputs(group)
    nulls = fill(group, *out)
    return nulls, [bytes(v) for v in out]


@FUZZ
@given(groups())
def test_the_kernel_writes_the_same_bytes_as_its_twin(group: list[Batch]) -> None:
    assert run(K.arrow_group, group) == run(arrow_group_py, group)


@FUZZ
@given(groups())
def test_group_to_arrow_is_to_arrow_of_each_concatenated(group: list[Batch]) -> None:
    whole = group_to_arrow(group)
    (expected,) = pa.Table.from_batches([to_arrow(b) for b in group]).combine_chunks().to_batches()
    assert whole.equals(expected)
    assert whole.column("key").null_count == expected.column("key").null_count
    assert group_to_arrow(group, pa.system_memory_pool()).equals(expected)  # (the reader's)


@pytest.mark.parametrize("fill", [K.arrow_group, arrow_group_py], ids=["kernel", "pure"])
@pytest.mark.parametrize("stamp", [MS_LIMIT + 1, -MS_LIMIT - 1, 2**63 - 1, -(2**63)])
def test_a_timestamp_beyond_microseconds_is_refused(fill: Callable[..., int],
                                                    stamp: int) -> None:  # fmt: skip
    group = [Batch.build("g", [b"a"], ids=[1]), Batch.build("g", [b"b", b"c"], ids=[2, 3],
                                                            timestamps=[0, stamp])]  # fmt: skip
    with pytest.raises(InvalidBatch, match="microsecond"):
        fill(group, *outputs(group))


@pytest.mark.parametrize("fill", [K.arrow_group, arrow_group_py], ids=["kernel", "pure"])
@pytest.mark.parametrize("wrong", range(7))
def test_buffers_of_the_wrong_size_are_refused(fill: Callable[..., int], wrong: int) -> None:
    """Each buffer one byte short (or, for the key buffers of a group without keys, one byte
    long): refused before anything is written."""
    group = [Batch.build("g", [b"ab", b"c"], ids=[1, 2], keys=[b"k", None])]
    out = outputs(group)
    out[wrong] = memoryview(bytearray(len(out[wrong]) - 1 if len(out[wrong]) else 1))
    with pytest.raises(ValueError, match="do not fit"):
        fill(group, *out)
    plain = [Batch.build("g", [b"ab"], ids=[1])]
    with pytest.raises(ValueError, match="do not fit"):
        fill(plain, *outputs(plain, keyed=True)[:5], memoryview(bytearray(0)),
             memoryview(bytearray(1)))  # fmt: skip
