"""``SendQueue.write_envelopes``: the hub's one-pass path for big envelope values gives the
bytes of the ``onNext`` frames of ``encode_envelopes``, queues big values uncopied, and keeps
the queue's accounting (``pending``) and order (a tail queued before comes first)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.model import Batch
from tidewire.protocols.rsio import OnNext, encode
from tidewire.protocols.rsio.envelopes import encode_envelopes, envelope_parts
from tidewire.protocols.rsio.output import BIG_ELEMENT, SendQueue
from tidewire.protocols.rsio.varint import varint_bytes

SIZES = [0, 3, 127, BIG_ELEMENT - 1, BIG_ELEMENT, BIG_ELEMENT + 300]


@st.composite
def big_batches(draw: st.DrawFn) -> Batch:
    """Batches mixing small and big values, ids across varint widths, keys on some events,
    repeated and changing timestamps."""
    n = draw(st.integers(1, 12))
    ids = [draw(st.sampled_from([1, 120, 16_380, 2**35, 2**63 - 5_000]))]
    for _ in range(n - 1):
        ids.append(ids[-1] + draw(st.sampled_from([1, 1, 130])))
    sizes = [draw(st.sampled_from(SIZES)) for _ in range(n)]
    stamp = st.sampled_from([0, -1, 1_700_000_000_000, -(2**63), 2**63 - 1])
    return Batch.build(
        "s",
        [bytes([i % 251]) * size for i, size in enumerate(sizes)],
        ids=ids,
        keys=[draw(st.none() | st.binary(max_size=200)) for _ in range(n)],
        timestamps=draw(stamp) if draw(st.booleans()) else [draw(stamp) for _ in range(n)],
    )


@settings(max_examples=150, deadline=None)
@given(big_batches(), st.sampled_from([0, 1, 127, 128, 2**40]), st.binary(max_size=5))
def test_write_envelopes_is_the_onnext_frames_of_the_envelopes(
    batch: Batch, subscriber: int, before: bytes
) -> None:
    prefix = varint_bytes(7) + varint_bytes(subscriber)  # onNext, subscriber
    queue = SendQueue()
    queue.write(before)
    queue.write_envelopes(prefix, batch)
    frames = b"".join(bytes(encode(OnNext(subscriber, e))) for e in encode_envelopes(batch))
    assert queue.pending == len(before) + len(frames)
    chunks = queue.chunks()
    assert b"".join(chunks) == before + frames
    assert queue.pending == 0
    assert not queue
    # The same chunks as the two-step path it replaces (headers, then write_elements).
    other = SendQueue()
    other.write(before)
    heads, values = envelope_parts(batch)
    other.write_elements(prefix, values, heads)
    assert [bytes(c) for c in other.chunks()] == [bytes(c) for c in chunks]


def test_big_values_are_queued_as_views_of_the_batch() -> None:
    values = [b"a" * BIG_ELEMENT, b"bc", b"d" * (BIG_ELEMENT + 1)]
    batch = Batch.build("s", values, ids=[10, 11, 12], keys=[None, b"k", None], timestamps=5)
    queue = SendQueue()
    queue.write_envelopes(b"\x07\x01", batch)
    views = [c for c in queue.chunks() if isinstance(c, memoryview)]
    assert [bytes(v) for v in views] == [values[0], values[2]]
    assert all(v.obj is batch.values.obj for v in views)  # the batch's buffer, not a copy
