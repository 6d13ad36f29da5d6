"""The compiled kernels (tidewire/native/_kernels.pyx) against their pure-Python twins, which
are their specification: the same inputs, the same results byte for byte (every buffer of a
batch, where a run ends, how many frames), the same refusals.

These tests load the extension directly, so they run in the ``TIDEWIRE_PURE=1`` pass too; they
skip only where the extension is not built, and test_native_switch.py fails the normal run then.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tidewire.model import MAX_ID, Batch
from tidewire.protocols.rsio.envelopes import encode_envelopes, envelopes_to_batch_py
from tidewire.protocols.rsio.runs import envelope_frames_batch_py, envelope_frames_py
from tidewire.protocols.rsio.varint import varint_bytes
from tidewire.protocols.rsio_http.codec import (
    decode_length_prefixed_py,
    encode_length_prefixed,
    length_prefixed_envelopes_py,
)
from tidewire.record import id_range_py, max_timestamp_py

try:
    K: ModuleType = importlib.import_module("tidewire.native._kernels")
except ImportError:  # pragma: no cover - the normal run fails in test_native_switch.py instead
    pytest.skip("the compiled kernels are not built", allow_module_level=True)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BOUNDARIES = [1, 127, 128, 129, 16383, 16384, 2**21 - 1, 2**21, 2**32, 2**56, MAX_ID - 1, MAX_ID]
STAMPS = [0, -1, 1, 63, 64, -64, -65, 8191, 8192, 2**62, -(2**63), 2**63 - 1, 1_764_000_000_000]


def buffers(batch: Batch | None) -> tuple[str | bytes | None, ...] | None:
    """Every buffer of ``batch`` as bytes (``None`` for absent keys): byte-for-byte equality,
    stricter than ``Batch.__eq__`` (which compares values, not layouts)."""
    if batch is None:
        return None
    views = (batch.ids, batch.timestamps, batch.value_offsets, batch.values, batch.key_flags,
             batch.key_offsets, batch.keys)  # fmt: skip
    return (batch.stream, *(None if v is None else v.tobytes() for v in views))


@st.composite
def batches(draw: st.DrawFn, max_size: int = 40) -> Batch:
    """Batches with ids at varint boundaries, negative and varying timestamps, keys or not
    (some empty), empty values and now and then a large one."""
    n = draw(st.integers(1, max_size))
    first = draw(st.sampled_from(BOUNDARIES) | st.integers(1, MAX_ID))
    gaps = draw(st.lists(st.integers(1, 200), min_size=n - 1, max_size=n - 1))
    ids = [first]
    for gap in gaps:
        ids.append(ids[-1] + gap)
    assume(ids[-1] <= MAX_ID)
    small = st.binary(max_size=40)
    large = st.integers(16_380, 70_000).map(lambda size: bytes(range(256)) * (size // 256 + 1))
    values = draw(st.lists(small | st.sampled_from([b""]) | large, min_size=n, max_size=n))
    stamp = st.sampled_from(STAMPS) | st.integers(-(2**63), 2**63 - 1)
    stamps = draw(st.lists(stamp, min_size=n, max_size=n) | stamp.map(lambda s: [s] * n))
    keys = draw(st.none() | st.lists(st.none() | st.binary(max_size=20) | st.just(b"k" * 200),
                                     min_size=n, max_size=n))  # fmt: skip
    return Batch.build("fuzz.s", values, ids=ids, keys=keys, timestamps=stamps)


@FUZZ
@given(batches(), st.sampled_from([0, 1, 127, 128, 16383, 16384, 2**63 - 1, 2**64 - 1]),
       st.integers(0, 5))  # fmt: skip
def test_envelope_frames_are_the_same_bytes(batch: Batch, subscriber: int, start: int) -> None:
    """Encoding: whole batches and slices of them (offsets that do not start at 0)."""
    part = batch.slice(min(start, len(batch) - 1), len(batch))
    assert K.envelope_frames(subscriber, part) == envelope_frames_py(subscriber, part)


@FUZZ
@given(batches(), st.integers(0, 5))
def test_length_prefixed_envelopes_are_the_same_bytes(batch: Batch, start: int) -> None:
    """RS.io over HTTP's default body: whole batches and slices of them."""
    part = batch.slice(min(start, len(batch) - 1), len(batch))
    assert K.length_prefixed_envelopes(part) == length_prefixed_envelopes_py(part)


def frame(prefix: bytes, event_id: int, ts: int, key: bytes | None, value: bytes) -> bytes:
    """One ``onNext`` frame written by hand (ids 0 and anything the encoder will not make)."""
    envelope = varint_bytes(event_id) + varint_bytes(((ts << 1) ^ (ts >> 63)) & (2**64 - 1))
    envelope += b"\x00" if key is None else varint_bytes(len(key) + 1) + key
    envelope += value
    return prefix + varint_bytes(len(envelope)) + envelope


def both(buf: bytes | bytearray, pos: int, prefix: bytes, max_count: int, limit: int,
         offer: bool) -> None:  # fmt: skip
    """Decode the same bytes both ways and compare everything that comes back."""
    py_batch, py_end, py_count = envelope_frames_batch_py("s", buf, pos, prefix, max_count,
                                                          limit, offer)  # fmt: skip
    c_batch, c_end, c_count = K.envelope_frames_batch("s", buf, pos, prefix, max_count, limit,
                                                      offer)  # fmt: skip
    assert (c_end, c_count) == (py_end, py_count)
    assert buffers(c_batch) == buffers(py_batch)


PREFIX = b"\x07\x03"  # onNext, subscriber 3


@FUZZ
@given(batches(), st.integers(0, 60), st.sampled_from([1, 100, 70_000, 2**31]), st.booleans(),
       st.binary(max_size=12), st.integers(0, 40))  # fmt: skip
@example(Batch.build("s", [b"v"] * 3, ids=[127, 128, 129], timestamps=-1), 9, 70_000, False,
         b"", 0)  # fmt: skip
def test_runs_decode_the_same(batch: Batch, max_count: int, limit: int, offer: bool,
                              junk: bytes, cut: int) -> None:  # fmt: skip
    """Decoding what the encoder makes, cut short, followed by junk, under element limits and
    counts that stop the run early, as a subscriber's run and as an offer's."""
    frames = envelope_frames_py(3, batch)
    data = b"\x99" + frames[: len(frames) - cut] + junk
    both(data, 1, PREFIX, max_count, limit, offer)
    both(bytearray(data), 1, PREFIX, max_count, limit, offer)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from([0, 0, 1, 5, 127, 128, 2**63, 2**64 - 1]),
                          st.sampled_from(STAMPS), st.none() | st.binary(max_size=3),
                          st.binary(max_size=6)),
                min_size=1, max_size=12),
       st.booleans(), st.binary(max_size=8))  # fmt: skip
def test_hand_made_runs_decode_the_same(items: list[tuple[int, int, bytes | None, bytes]],
                                        offer: bool, junk: bytes) -> None:  # fmt: skip
    """Ids 0 (an offer's "assign them"), ids past 2**63-1, repeated and decreasing ids, then
    junk: every way a run stops early or is refused as a whole."""
    data = b"".join(frame(PREFIX, *item) for item in items) + junk
    both(data, 0, PREFIX, 100, 1 << 20, offer)


@FUZZ
@given(st.binary(min_size=0, max_size=64), st.booleans(), st.integers(1, 5))
def test_garbage_decodes_the_same(tail: bytes, offer: bool, max_count: int) -> None:
    """Random bytes after the prefix: malformed lengths, varints over 10 bytes or 64 bits,
    keys longer than their element."""
    both(PREFIX + tail + PREFIX + tail, 0, PREFIX, max_count, 1 << 20, offer)


@FUZZ
@given(st.lists(st.binary(max_size=14), min_size=1, max_size=6), st.booleans())
def test_framed_garbage_decodes_the_same(elements: list[bytes], offer: bool) -> None:
    """Well-framed elements of random bytes: envelopes that end inside or right after their
    id or timestamp, keys that overrun, padded varints."""
    data = b"".join(PREFIX + varint_bytes(len(e)) + e for e in elements)
    both(data, 0, PREFIX, 10, 1 << 20, offer)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x07\x03\x02\x01\x00",  # an element that ends right after its timestamp
        b"\x07\x03\x02\x01\x00\x07\x03\x03\x02\x00\x00",
        b"\x07\x03\x80\x80\x80\x80\x80\x80\x80\x80\x80\x02",  # length over 64 bits
        b"\x07\x03\x04\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # id runs past the element
        b"\x07\x03\x04\x01\x00\x85\x00",  # key longer than its element
        b"\x07\x03\x05\x01\x00\x80\x00v",  # padded "no key"
        b"\x07\x03\x03\x01\x00\x01",  # empty key, empty value
        b"\x07\x03\x00",  # empty element
        b"",
    ],
)
@pytest.mark.parametrize("offer", [False, True])
def test_edge_frames_decode_the_same(raw: bytes, offer: bool) -> None:
    both(raw, 0, PREFIX, 10, 1 << 20, offer)
    both(raw + raw, 0, PREFIX, 10, 1 << 20, offer)


def outcome(decode: object, stream: str, elements: list[bytes]) -> object:
    """What ``decode(stream, elements)`` gives: the batch's buffers, or its error's type and
    message."""
    try:
        result = decode(stream, elements)  # type: ignore[operator]
    except Exception as exc:
        return type(exc), str(exc)
    return buffers(result) if isinstance(result, Batch) else result


@FUZZ
@given(batches(), st.booleans(), st.lists(st.binary(max_size=12), max_size=3),
       st.integers(0, 3), st.sampled_from(["s", "bad name\n"]))  # fmt: skip
def test_envelope_elements_decode_the_same(batch: Batch, with_ids: bool, extra: list[bytes],
                                           cut: int, stream: str) -> None:  # fmt: skip
    """A subscriber's elements (RS.io over HTTP, or one at a time): what the encoder makes,
    with ids 0, random elements added, the last cut short, or an invalid stream name: the same
    batch or the same error."""
    elements = encode_envelopes(batch, with_ids=with_ids) + extra
    if cut and elements[-1]:
        elements[-1] = elements[-1][: max(0, len(elements[-1]) - cut)]
    want = outcome(envelopes_to_batch_py, stream, elements)
    assert outcome(K.envelopes_to_batch, stream, elements) == want
    views = [memoryview(e) for e in elements]  # (any buffer, not only bytes)
    assert outcome(K.envelopes_to_batch, stream, views) == want  # type: ignore[arg-type]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from([0, 1, 5, 127, 128, 2**63, 2**64 - 1]),
                          st.sampled_from(STAMPS), st.none() | st.binary(max_size=3),
                          st.binary(max_size=6)),
                max_size=6))  # fmt: skip
def test_hand_made_elements_decode_the_same(items: list[tuple[int, int, bytes | None,
                                                              bytes]]) -> None:  # fmt: skip
    """Ids 0 mixed with ids, repeated, decreasing or past 2**63-1; no elements at all."""
    elements = [encode_one(*item) for item in items]
    want = outcome(envelopes_to_batch_py, "s", elements)
    assert outcome(K.envelopes_to_batch, "s", elements) == want


@FUZZ
@given(st.lists(st.binary(max_size=20), max_size=6), st.binary(max_size=6), st.integers(0, 3),
       st.sampled_from([0, 1, 3, 2**32]))  # fmt: skip
def test_length_prefixed_bodies_decode_the_same(elements: list[bytes], junk: bytes, cut: int,
                                                max_elements: int) -> None:  # fmt: skip
    """Whole bodies, cut inside a length or an element, with junk after, over the limit."""
    body = encode_length_prefixed(elements)
    for data in (body, body[: max(0, len(body) - cut)], body + junk):
        want = outcome(lambda _, d: decode_length_prefixed_py(d, max_elements), "", data)  # type: ignore[arg-type]
        got = outcome(lambda _, d: K.decode_length_prefixed(d, max_elements), "", data)  # type: ignore[arg-type]
        assert got == want


def encode_one(event_id: int, ts: int, key: bytes | None, value: bytes) -> bytes:
    """One envelope element written by hand."""
    envelope = varint_bytes(event_id) + varint_bytes(((ts << 1) ^ (ts >> 63)) & (2**64 - 1))
    envelope += b"\x00" if key is None else varint_bytes(len(key) + 1) + key
    return envelope + value


@FUZZ
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50))
def test_max_timestamp_is_the_same(stamps: list[int]) -> None:
    view = memoryview(Batch.build("s", [b""] * len(stamps), timestamps=stamps).timestamps)
    assert K.max_timestamp(view) == max_timestamp_py(view)


@FUZZ
@given(st.sampled_from(BOUNDARIES) | st.integers(1, MAX_ID), st.integers(0, 300))
def test_id_range_is_the_same(first: int, n: int) -> None:
    assume(first + n - 1 <= MAX_ID)
    assert K.id_range(first, n) == id_range_py(first, n)


def test_refusals_are_the_same() -> None:
    """What the pure functions refuse, the kernels refuse."""
    batch = Batch.build("s", [b"v"], ids=[1], timestamps=0)
    for subscriber in (-1, 2**64):
        with pytest.raises(ValueError, match="outside"):
            envelope_frames_py(subscriber, batch)
        with pytest.raises(ValueError, match="outside"):
            K.envelope_frames(subscriber, batch)
    empty = memoryview(b"").cast("q")
    with pytest.raises(ValueError, match="empty"):
        max_timestamp_py(empty)
    with pytest.raises(ValueError, match="no timestamps"):
        K.max_timestamp(empty)
