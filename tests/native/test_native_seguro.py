"""Seguro's bulk parse of a ``SAVE MANY``'s ``EVENT`` frames: the compiled kernel against
``codec.many_run_py``, its specification, byte for byte (see test_native_equal.py)."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewire.protocols.seguro.codec import SaveMany, many_run_py

try:
    K: ModuleType = importlib.import_module("tidewire.native._kernels")
except ImportError:  # pragma: no cover - the normal run fails in test_native_switch.py instead
    pytest.skip("the compiled kernels are not built", allow_module_level=True)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ID = st.sampled_from([b"1", b"2", b"3", b"5", b"01", b"0", b"18446744073709551615",
                      b"18446744073709551616", b"99999999999999999999", b"123456789012345678901",
                      b"", b"-1", b"1 ", b"\xd9\xa1"])  # fmt: skip
SIZE = st.sampled_from([b"0", b"1", b"3", b"4", b"07", b"", b"x", b"18446744073709551616"])


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """``EVENT <id> <size>\\n<data>\\n\\n`` frames, mostly right, sometimes not in one place."""
    out = b""
    for _ in range(draw(st.integers(1, 6))):
        event_id = draw(ID | st.integers(1, 12).map(lambda i: b"%d" % i))
        data = draw(st.binary(max_size=5))
        size = draw(st.just(b"%d" % len(data)) | SIZE)
        head = draw(st.sampled_from([b"EVENT ", b"EVENT ", b"EVENT  ", b"EVEN "]))
        tail = draw(st.sampled_from([b"\n\n", b"\n\n", b"\n", b"\nx"]))
        out += head + event_id + b" " + size + b"\n" + data + tail
    return out + draw(st.binary(max_size=4))


@FUZZ
@given(frames(), st.integers(0, 3), st.sampled_from([8, 20, 40, 64]),
       st.sampled_from([0, 3, 4, 64]), st.integers(0, 2), st.integers(0, 4),
       st.sampled_from([(1, 3, 3), (1, 5, 12), (2, 6, 2), (1, 2**63 - 1, 4)]))  # fmt: skip
def test_save_many_runs_parse_the_same(data: bytes, pos: int, max_line: int, max_event: int,
                                       seen: int, last: int,
                                       many: tuple[int, int, int]) -> None:  # fmt: skip
    """Ids out of order, off the announced span, over 2**64-1, with leading zeros; sizes over
    the limit or past the buffer; lines over the limit; broken terminators."""
    start, end, count = many
    save = SaveMany(count, start, end)
    for buf in (data, bytearray(data)):
        pure = many_run_py(buf, min(pos, len(buf)), max_line, max_event, seen, last, save)
        compiled = K.seguro_many_run(buf, min(pos, len(buf)), max_line, max_event, seen, last,
                                     save)  # fmt: skip
        assert compiled == pure


def test_a_whole_flow_parses_the_same() -> None:
    data = b"".join(b"EVENT %d 3\n%03d\n\n" % (i, i) for i in range(1, 4)) + b"STREAMED"
    want = ([1, 2, 3], [b"001", b"002", b"003"], len(data) - 8, 3, 3)
    save = SaveMany(3, 1, 3)
    assert many_run_py(data, 0, 64, 64, 0, 0, save) == want
    assert K.seguro_many_run(data, 0, 64, 64, 0, 0, save) == want
