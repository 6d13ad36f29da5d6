"""Envelopes: the element format that carries a whole event (id, time, key, value).

::

    envelope = id varint | timestamp zigzag-varint (ms) | key | value
    key      = varint 0 ("no key") | varint 1 + length, then the key's bytes
    value    = the rest of the element

A subscriber can resume from the last id it saw; a publisher may leave every id 0 (the hub
assigns them) and a timestamp 0 (the hub's clock). The other element formats: ``format=value``
(the value's bytes only), ``format=records`` (one log record per element, docs/log.md) and
``size=N`` (fixed-size values, packed with ``onNextPacked``); see docs/protocols/rsio.md.

Codecs for one batch at a time: :func:`encode_envelopes` / :func:`envelopes_to_batch` (and
:func:`decode_envelopes` for what a publisher sends), :func:`envelope_parts` (headers and
zero-copy values), :func:`fixed_size_values`; :func:`columns_to_batch` is the one place a batch
is built from decoded columns (shared with the run decoders of :mod:`.runs`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate

from ...model import (
    Batch,
    InvalidBatch,
    RemoteProtocolError,
    TidewireError,
    check_ids,
    now_ms,
    validate_stream_name,
)
from ...native import kernel
from .varint import NeedData, pull_varint, varint_bytes

__all__ = [
    "columns_to_batch",
    "decode_envelope",
    "decode_envelopes",
    "encode_envelopes",
    "envelope_parts",
    "envelopes_to_batch",
    "envelopes_to_batch_py",
    "fixed_size_values",
    "pull_envelope_varint",
    "stamp_zero_timestamps",
]


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def encode_envelopes(batch: Batch, *, with_ids: bool = True) -> list[bytes]:
    """One envelope element per event of ``batch`` (see the module docstring); with
    ``with_ids=False`` every id is 0 (publishing: the hub assigns them)."""
    values = batch.values.tobytes()
    offsets = batch.value_offsets
    base = offsets[0]
    ids = batch.ids.tolist()
    stamps = batch.timestamps.tolist()
    varint = varint_bytes
    last_ts = None
    ts_bytes = b""
    out = []
    has_keys = batch.has_keys
    for i, event_id in enumerate(ids):
        ts = stamps[i]
        if ts != last_ts:  # stamps repeat within a batch: encode each once
            last_ts, ts_bytes = ts, varint((ts << 1) ^ (ts >> 63))
        if has_keys:
            key = batch.key(i)
            key_bytes = b"\x00" if key is None else varint(len(key) + 1) + key
        else:
            key_bytes = b"\x00"
        value = values[offsets[i] - base : offsets[i + 1] - base]
        id_bytes = varint(event_id) if with_ids else b"\x00"
        out.append(b"".join((id_bytes, ts_bytes, key_bytes, value)))
    return out


def pull_envelope_varint(element: bytes | bytearray, pos: int) -> tuple[int, int]:
    """A varint inside an envelope (``ValueError`` if it is cut short or too long: inside an
    element, either makes the element malformed, not the frame)."""
    try:
        return pull_varint(element, pos)
    except (NeedData, RemoteProtocolError):
        raise ValueError("bad envelope: a varint is cut short or too long") from None


def envelopes_to_batch_py(stream: str, elements: list[bytes]) -> Batch:
    """The batch of the envelope ``elements`` (as a subscriber receives them), decoded in one
    tight loop into the batch's column buffers. ``ValueError`` if one is malformed; ids must
    increase (:class:`InvalidBatch`) unless every id is 0 (publishing: assign them).

    Fast path: an envelope whose header is exactly the one expected after the previous
    envelope (next id, same timestamp, no key) is recognised with one ``startswith``; the
    expected header is kept up to date by bumping its first byte (a carry out of the id's low
    seven bits falls back to the full parse)."""
    ids: list[int] = []
    stamps: list[int] = []
    values: list[bytes] = []
    keyed: list[tuple[int, bytes]] = []  # (index, key) of the events that have a key
    expected = bytearray()  # the header expected next; empty: parse the next one in full
    hlen = 0
    event_id = ts = 0
    pull = pull_envelope_varint
    varint = varint_bytes
    try:
        for element in elements:
            if hlen and element.startswith(expected):
                values.append(element[hlen:])
                if event_id:  # (id 0, "assign it", repeats as it is)
                    event_id += 1
                    b = expected[0]
                    if b & 0x7F == 0x7F:  # the next id carries out of its low byte
                        hlen = 0
                    else:
                        expected[0] = b + 1
            else:
                b = element[0]
                event_id, pos = (b, 1) if b < 0x80 else pull(element, 0)
                ts_start = pos
                raw, pos = pull(element, pos)
                ts = (raw >> 1) ^ -(raw & 1)
                ts_raw = element[ts_start:pos]
                b = element[pos]
                if b == 0:
                    pos += 1
                else:
                    key_len, pos = pull(element, pos) if b >= 0x80 else (b, pos + 1)
                    if key_len:  # (a padded varint 0 is "no key" too)
                        key_len -= 1
                        if pos + key_len > len(element):
                            raise ValueError("bad envelope: the key runs past the element")
                        keyed.append((len(values), element[pos : pos + key_len]))
                        pos += key_len
                values.append(element[pos:])
                expected = bytearray(varint(event_id + 1 if event_id else 0) + ts_raw + b"\x00")
                hlen = len(expected)
            ids.append(event_id)
            stamps.append(ts)
    except IndexError:
        raise ValueError("bad envelope: cut short") from None
    return columns_to_batch(stream, ids, stamps, values, keyed)


def columns_to_batch(
    stream: str,
    ids: list[int],
    stamps: list[int],
    values: Sequence[bytes | bytearray],
    keyed: list[tuple[int, bytes]],
) -> Batch:
    if not ids:
        raise ValueError("no envelopes")
    try:
        id_array = array("Q", ids)
        stamp_array = array("q", stamps)
    except OverflowError:
        raise ValueError("bad envelope: an id or timestamp is out of range") from None
    id_view = memoryview(id_array).cast("B").cast("Q")
    if ids[0]:
        check_ids(id_view)
    elif any(ids):  # (id 0: "the hub assigns it", for every envelope or for none)
        raise InvalidBatch("envelopes either all carry ids or all leave them to the hub")
    offsets = array("I", accumulate(map(len, values), initial=0))
    key_flags = key_offsets = key_view = None
    if keyed:
        flags = bytearray(len(ids))
        key_lengths = [0] * len(ids)
        for i, key in keyed:
            flags[i] = 1
            key_lengths[i] = len(key)
        key_flags = memoryview(bytes(flags))
        key_offsets = memoryview(array("I", accumulate(key_lengths, initial=0))).cast("B").cast("I")
        key_view = memoryview(b"".join(key for _, key in keyed))
    return Batch(
        validate_stream_name(stream),
        id_view,
        memoryview(stamp_array).cast("B").cast("q"),
        memoryview(offsets).cast("B").cast("I"),
        memoryview(b"".join(values)),
        key_flags,
        key_offsets,
        key_view,
    )


def fixed_size_values(batch: Batch, size: int) -> memoryview:
    """``batch``'s values back to back, each checked to be ``size`` bytes (one comparison of
    the offsets, no loop per event); :class:`TidewireError` when one is not."""
    n = len(batch)
    base = batch.value_offsets[0]
    if batch.values.nbytes != n * size or (  # (then every offset below fits in 32 bits)
        batch.value_offsets.tobytes()
        != array("I", range(base, base + n * size + 1, size)).tobytes()
    ):
        raise TidewireError(f"stream {batch.stream!r} holds a value that is not {size} bytes")
    return batch.values


def envelope_parts(batch: Batch) -> tuple[list[bytes], list[memoryview]]:
    """The envelopes of ``batch`` as (headers, values): header ``i`` is ``id | timestamp |
    key`` and value ``i`` a zero-copy view of the batch's value; ``header + value`` is the
    envelope :func:`encode_envelopes` gives. For big values, where copying is the cost."""
    values = batch.values
    offsets = batch.value_offsets.tolist()
    base = offsets[0]
    varint = varint_bytes
    heads = []
    last_ts = None
    ts_bytes = b""
    for i, (event_id, ts) in enumerate(zip(batch.ids.tolist(), batch.timestamps.tolist(),
                                           strict=True)):  # fmt: skip
        if ts != last_ts:
            last_ts, ts_bytes = ts, varint((ts << 1) ^ (ts >> 63))
        key = batch.key(i) if batch.has_keys else None
        key_bytes = b"\x00" if key is None else varint(len(key) + 1) + key
        heads.append(varint(event_id) + ts_bytes + key_bytes)
    return heads, [values[offsets[i] - base : offsets[i + 1] - base] for i in range(len(heads))]


def decode_envelopes(
    stream: str, elements: list[bytes], now: int | None = None
) -> tuple[Batch, bool]:
    """A batch of the published envelopes ``elements`` and whether they carry their own ids
    (else the log assigns them, and the batch has ids 1..n). Timestamp 0 is the hub's clock:
    ``now`` (ms), read here only when not given. ``ValueError`` if one is malformed or the ids
    are partly given."""
    try:
        batch = envelopes_to_batch(stream, elements)
    except TidewireError as exc:
        raise ValueError(str(exc)) from None
    ids = batch.ids
    explicit = ids[0] != 0
    if not explicit and any(ids.tobytes()):
        raise ValueError("an offer's envelopes either all carry ids or all leave them to the hub")
    if 0 in batch.timestamps.tolist():
        batch = stamp_zero_timestamps(batch, now_ms() if now is None else now)
    if not explicit:
        assigned = array("Q", range(1, len(ids) + 1))
        batch = replace(batch, ids=memoryview(assigned).cast("B").cast("Q"))
    return batch, explicit


def stamp_zero_timestamps(batch: Batch, now: int) -> Batch:
    """``batch`` with every timestamp 0 replaced by ``now`` (ms: the hub's clock, passed in)."""
    stamps = batch.timestamps.tolist()
    if 0 not in stamps:
        return batch
    fixed = array("q", (t or now for t in stamps))
    return replace(batch, timestamps=memoryview(fixed).cast("B").cast("q"))


def decode_envelope(element: bytes) -> tuple[int, int, bytes | None, bytes]:
    """``(id, timestamp, key, value)`` of one envelope element; ``ValueError`` if malformed."""
    try:
        event_id, pos = pull_varint(element, 0)
        ts, pos = pull_varint(element, pos)
        key_len, pos = pull_varint(element, pos)
    except NeedData:
        raise ValueError("envelope cut short") from None
    except RemoteProtocolError as exc:
        raise ValueError(f"bad envelope: {exc}") from None
    key = None
    if key_len:
        end = pos + key_len - 1
        if end > len(element):
            raise ValueError("envelope key runs past the element")
        key, pos = element[pos:end], end
    return event_id, _unzigzag(ts), key, element[pos:]


# The compiled kernel when it is built and not switched off (tidewire.native), else the pure
# function above, its specification.
envelopes_to_batch = kernel("envelopes_to_batch", envelopes_to_batch_py)
