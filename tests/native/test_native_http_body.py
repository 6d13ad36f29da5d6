"""RS.io over HTTP's body kernels (tidewire/native/_http.pxi) against their pure-Python twins,
the specification: a length-prefixed body of envelopes counted, and decoded straight into a
batch (leaving out the elements received before), with the same results byte for byte and the
same refusals. Loads the extension directly, so it runs in the ``TIDEWIRE_PURE=1`` pass too."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewire.model import MAX_ID, Batch, InvalidBatch, RemoteProtocolError
from tidewire.protocols.rsio.envelopes import encode_envelopes
from tidewire.protocols.rsio.varint import varint_bytes
from tidewire.protocols.rsio_http.codec import (
    count_length_prefixed_py,
    decode_length_prefixed_py,
    encode_length_prefixed,
    length_prefixed_envelopes_batch_py,
    length_prefixed_envelopes_py,
)
from tidewire.protocols.rsio_http.http11 import body_buffer_py

try:
    K: ModuleType = importlib.import_module("tidewire.native._kernels")
except ImportError:  # pragma: no cover - the normal run fails in test_native_switch.py instead
    pytest.skip("the compiled kernels are not built", allow_module_level=True)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STAMPS = [0, -1, 1, 63, 64, -65, 2**62, -(2**63), 2**63 - 1, 1_764_000_000_000]


def layout(batch: Batch) -> tuple[str | bytes | None, ...]:
    """Every buffer of ``batch`` as bytes (stricter than ``Batch.__eq__``)."""
    views = (batch.ids, batch.timestamps, batch.value_offsets, batch.values, batch.key_flags,
             batch.key_offsets, batch.keys)  # fmt: skip
    return (batch.stream, *(None if v is None else v.tobytes() for v in views))


def outcome(fn: object, *args: object) -> object:
    """What ``fn(*args)`` gives: a batch's buffers, a count, or its error's type and message."""
    try:
        result = fn(*args)  # type: ignore[operator]
    except Exception as exc:
        return type(exc), str(exc)
    return layout(result) if isinstance(result, Batch) else result


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    """Batches with ids at varint boundaries, keys or not (some empty), empty values."""
    n = draw(st.integers(1, 30))
    first = draw(st.sampled_from([1, 127, 128, 16383, 16384, 2**32, MAX_ID - 40]))
    ids = [first + i * draw(st.integers(1, 3)) for i in range(n)]
    ids = sorted(set(min(i, MAX_ID) for i in ids))
    values = draw(st.lists(st.binary(max_size=40) | st.just(b"v" * 3000), min_size=len(ids),
                           max_size=len(ids)))  # fmt: skip
    stamps = draw(st.lists(st.sampled_from(STAMPS), min_size=len(ids), max_size=len(ids)))
    keys = draw(st.none() | st.lists(st.none() | st.binary(max_size=20), min_size=len(ids),
                                     max_size=len(ids)))  # fmt: skip
    return Batch.build("fuzz.s", values, ids=ids, keys=keys, timestamps=stamps)


@FUZZ
@given(batches(), st.integers(0, 35), st.booleans(), st.binary(max_size=8), st.integers(0, 5),
       st.sampled_from(["s", "bad name\n"]))  # fmt: skip
def test_bodies_of_envelopes_decode_the_same(
    batch: Batch, skip: int, with_ids: bool, junk: bytes, cut: int, stream: str
) -> None:
    """What the hub sends (with ids, or ids 0), some elements skipped (all of them, or more
    than there are), junk added as an element or as bytes, the body cut short, a bad stream
    name: the same batch or the same error, and the same count."""
    elements = encode_envelopes(batch, with_ids=with_ids)
    body = length_prefixed_envelopes_py(batch) if with_ids else encode_length_prefixed(elements)
    for data in (body, body[: max(0, len(body) - cut)], body + junk,
                 body + encode_length_prefixed([junk])):  # fmt: skip
        want = outcome(length_prefixed_envelopes_batch_py, stream, data, skip)
        assert outcome(K.length_prefixed_envelopes_batch, stream, data, skip) == want
        assert outcome(K.count_length_prefixed, data) == outcome(count_length_prefixed_py, data)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from([0, 1, 5, 127, 128, 2**63, 2**64 - 1]),
                          st.sampled_from(STAMPS), st.none() | st.binary(max_size=3),
                          st.binary(max_size=6)),
                max_size=6), st.integers(0, 3))  # fmt: skip
def test_hand_made_bodies_decode_the_same(items: list[tuple[int, int, bytes | None, bytes]],
                                          skip: int) -> None:  # fmt: skip
    """Ids 0 mixed with ids, repeated, decreasing or past 2**63-1; empty elements; none."""
    elements = []
    for event_id, ts, key, value in items:
        envelope = varint_bytes(event_id) + varint_bytes(((ts << 1) ^ (ts >> 63)) % 2**64)
        envelope += b"\x00" if key is None else varint_bytes(len(key) + 1) + key
        elements.append(envelope + value)
    elements += [b""] if skip == 3 else []
    body = encode_length_prefixed(elements)
    want = outcome(length_prefixed_envelopes_batch_py, "s", body, skip % 3)
    assert outcome(K.length_prefixed_envelopes_batch, "s", body, skip % 3) == want


@FUZZ
@given(st.lists(st.binary(max_size=20), max_size=6), st.binary(max_size=6), st.integers(0, 3),
       st.sampled_from([0, 1, 3, 2**32]))  # fmt: skip
def test_bodies_count_the_same(elements: list[bytes], junk: bytes, cut: int,
                               max_elements: int) -> None:  # fmt: skip
    """Counting: whole bodies, cut inside a length or an element, junk after, over the limit;
    and the count is what the split gives."""
    body = encode_length_prefixed(elements)
    for data in (body, body[: max(0, len(body) - cut)], body + junk):
        want = outcome(count_length_prefixed_py, data, max_elements)
        assert outcome(K.count_length_prefixed, data, max_elements) == want
        split = outcome(lambda d: len(decode_length_prefixed_py(d, max_elements)), data)
        assert want == split


def test_the_refusals_are_the_twins() -> None:
    """A few refusals named: the body's framing first, then the envelopes, then the ids."""
    two = Batch.build("s", [b"a", b"b"], ids=[5, 6], timestamps=[7, 8])
    good = length_prefixed_envelopes_py(two)
    for fn in (K.length_prefixed_envelopes_batch, length_prefixed_envelopes_batch_py):
        with pytest.raises(RemoteProtocolError, match="cut inside a length"):
            fn("s", good + b"\x00\x00", 0)
        with pytest.raises(ValueError, match="no envelopes"):
            fn("s", good, 2)
        with pytest.raises(ValueError, match="never negative"):
            fn("s", good, -1)
        with pytest.raises(InvalidBatch):
            fn("s", good + good, 0)  # (ids 5, 6, 5, 6)
        assert layout(fn("s", good + good, 3)) == layout(
            Batch.build("s", [b"b"], ids=[6], timestamps=[8])
        )


@pytest.mark.parametrize("size", [0, 1, 4096, 1 << 20])
def test_a_body_buffer_is_the_twins_but_for_its_unwritten_bytes(size: int) -> None:
    """The receive buffer: a ``bytearray`` of the size asked (its bytes are unspecified until
    the receive writes them: the kernel does not zero them), writable, the same refusal."""
    got, want = K.body_buffer(size), body_buffer_py(size)
    assert (type(got), len(got)) == (type(want), len(want)) == (bytearray, size)
    memoryview(got)[:] = b"\x07" * size  # (what the receive does)
    assert got == b"\x07" * size
    for fn in (K.body_buffer, body_buffer_py):
        with pytest.raises(ValueError, match="negative count"):
            fn(-1)
