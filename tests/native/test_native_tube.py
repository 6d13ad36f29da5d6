"""The compiled Tube reassembly (tidewire/native/_tube.pxi) against its pure twin,
``protocols.tube.pieces.ReassemblyPy``: the same pieces put give the same ``bytes``, the same
refusals (a put past the capacity, any use after finish), and a result that is an ordinary
``bytes`` (equal, hashed and sliced as one built whole). Loads the extension directly, so it
runs in the ``TIDEWIRE_PURE=1`` pass too."""

from __future__ import annotations

import importlib
import pickle
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.protocols.tube.pieces import ReassemblyPy

try:
    K: ModuleType = importlib.import_module("tidewire.native._kernels")
except ImportError:  # pragma: no cover - the normal run fails in test_native_switch.py instead
    pytest.skip("the compiled kernels are not built", allow_module_level=True)


def run(kind: type, capacity: int, pieces: list[bytes]) -> tuple[object, ...]:
    """What a reassembly of ``kind`` does with ``pieces``: each put's outcome, then finish's."""
    joined = kind(capacity)
    steps: list[object] = []
    for i, piece in enumerate(pieces):
        data = memoryview(b"\xff" + piece)[1:] if i % 2 else piece  # (views and bytes)
        try:
            joined.put(data)
            steps.append(("put", joined.size))
        except ValueError:
            steps.append(("refused", joined.size))
    result = joined.finish()
    with pytest.raises(ValueError, match="finished"):
        joined.finish()
    with pytest.raises(ValueError, match="finished"):
        joined.put(b"x")
    return (*steps, type(result), result)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.binary(max_size=300), max_size=12),
       slack=st.integers(-200, 2000))  # fmt: skip
def test_compiled_reassembly_equals_the_join(pieces: list[bytes], slack: int) -> None:
    capacity = max(0, sum(map(len, pieces)) + slack)  # (some runs refuse a put: past it)
    assert run(K.Reassembly, capacity, pieces) == run(ReassemblyPy, capacity, pieces)


@pytest.mark.parametrize("capacity", [1 << 20, (1 << 20) + 70_000, 3 << 20])
def test_the_result_is_an_ordinary_bytes(capacity: int) -> None:
    """Cut in place (slack within an eighth) or given back by a realloc (more than that)."""
    payload = bytes(range(256)) * 4096  # 1 MiB
    joined = K.Reassembly(capacity)
    assert joined.held == capacity  # the whole buffer, from the start
    for start in range(0, len(payload), 65536):
        joined.put(memoryview(payload)[start : start + 65536])
    result = joined.finish()
    assert joined.held == 0
    assert type(result) is bytes
    assert len(result) == len(payload)
    assert result == payload
    assert hash(result) == hash(payload)
    assert result[-3:] == payload[-3:]
    assert bytes(memoryview(result)) == payload
    assert pickle.loads(pickle.dumps(result)) == payload
    assert result + b"!" == payload + b"!"


def test_nothing_put_is_the_empty_bytes() -> None:
    for capacity in (0, 1, 4096):
        joined = K.Reassembly(capacity)
        assert joined.finish() == b""
    assert len(b"") == 0  # (the shared empty bytes is untouched)
