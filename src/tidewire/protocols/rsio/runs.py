"""Frame runs: many ``onNext`` frames of one subscription, encoded or decoded in one pass.

A delivery of envelopes is the frames ``onNext | subscriber | length | envelope`` back to back;
the hot paths never build them one message at a time:

* :func:`envelope_frames` encodes a :class:`Batch` as those frames (the hub's delivery);
* :func:`envelope_run_decoder` decodes consecutive frames of a subscription straight from the
  shared :class:`~tidewire.protocols.buffer.ReceiveBuffer` (in place, from its ``view()``)
  into one :class:`Batch` (the client's subscription);
* :func:`offer_run_decoder` does the same for what a publisher offers (ids 0 are "the hub
  assigns them"), into an :class:`OfferRun` (the hub's ingest), and :func:`join_offer_parts`
  joins those runs into the batch one append stores.

Decoded runs cost no Python object per element but its value's bytes (kept as slices of the
receive buffer until the batch's values are joined).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate, chain, repeat
from operator import add

from ...model import Batch, InvalidBatch, RemoteProtocolError, TidewireError, check_ids
from ...native import kernel
from ..buffer import ReceiveBuffer
from .envelopes import (
    columns_to_batch,
    decode_envelopes,
    pull_envelope_varint,
    stamp_zero_timestamps,
)
from .varint import NeedData, pull_varint, push_varint, varint_bytes

__all__ = [
    "OfferRun",
    "RunDecoder",
    "envelope_frames",
    "envelope_frames_batch",
    "envelope_frames_batch_py",
    "envelope_frames_py",
    "envelope_run_decoder",
    "join_offer_parts",
    "offer_run_decoder",
    "placeholder_ids",
]

RunDecoder = Callable[[ReceiveBuffer, bytes, int, int], tuple[object, int]]
"""``(buf, prefix, max_count, max_element_bytes) -> (value, count)``: decode up to
``max_count`` complete variable-size ``onNext`` frames at ``buf.pos``, each starting with
``prefix`` (type and subscriber), into one value of the application's, and advance ``buf`` past
them (``buf.advance_to``); ``count`` 0 means "not even the first" (``buf`` is left as it was,
and that frame is then decoded as a plain ``OnNext``)."""


@dataclass(frozen=True, slots=True)
class OfferRun:
    """Consecutive envelopes of an offer, decoded: ``batch`` holds them (with ids 1..n when
    ``explicit_ids`` is false: the hub assigns the real ones; timestamps 0 still mean "the
    hub's clock", see :func:`.stamp_zero_timestamps`)."""

    batch: Batch
    explicit_ids: bool
    nbytes: int  # the frames' bytes on the wire (what holding the run stands for)


_SMALL = [bytes((i,)) for i in range(0x80)]


_LOW = [bytes((i | 0x80,)) for i in range(0x80)]


def envelope_frames_py(subscriber: int, batch: Batch) -> bytes:
    """The ``onNext`` frames (variable-size mode) carrying ``batch``'s envelopes to
    ``subscriber``, back to back: what encoding :func:`encode_envelopes` one ``OnNext`` at a
    time gives, built in one pass (the hub's hot path; see ``Connection.send_frames``).

    An id's varint is its low seven bits (with the continuation bit) followed by the varint of
    the rest, which changes once every 128 consecutive ids; frame heads and timestamps repeat."""
    head = bytearray((7,))  # onNext
    push_varint(head, subscriber)
    prefix = bytes(head)
    values = batch.values.tobytes()
    offsets = batch.value_offsets.tolist()
    base = offsets[0]
    stamps = batch.timestamps.tolist()
    keys = batch.has_keys
    varint = varint_bytes
    small, low = _SMALL, _LOW
    parts: list[bytes] = []
    append = parts.append
    last_ts: int | None = None
    ts_key = b""
    last_hi = -1
    tail = b""
    heads: dict[int, bytes] = {}
    for i, event_id in enumerate(batch.ids.tolist()):
        ts = stamps[i]
        if ts != last_ts:
            last_ts, ts_key = ts, varint((ts << 1) ^ (ts >> 63)) + b"\x00"
        if keys and (key := batch.key(i)) is not None:
            ts_key_i = ts_key[:-1] + varint(len(key) + 1) + key
        else:
            ts_key_i = ts_key
        if event_id < 0x80:
            id_low, tail = small[event_id], b""
            last_hi = 0
        else:
            hi = event_id >> 7
            if hi != last_hi:
                last_hi, tail = hi, varint(hi)
            id_low = low[event_id & 0x7F]
        value = values[offsets[i] - base : offsets[i + 1] - base]
        n = len(id_low) + len(tail) + len(ts_key_i) + len(value)
        frame_head = heads.get(n)
        if frame_head is None:
            frame_head = heads[n] = prefix + varint(n)
        append(frame_head)
        append(id_low)
        append(tail)
        append(ts_key_i)
        append(value)
    return b"".join(parts)


def _frames_to_batch(
    stream: str,
    buf: bytes | bytearray,
    pos: int,
    prefix: bytes,
    max_count: int,
    limit: int,
    *,
    offer: bool = False,
) -> tuple[Batch | OfferRun | None, int, int]:
    """Up to ``max_count`` complete frames ``prefix | length | envelope`` at ``buf[pos:]``, as
    a batch (``offer``: an :class:`OfferRun`), where they end and how many (0: none)."""
    batch, end, count = envelope_frames_batch(stream, buf, pos, prefix, max_count, limit, offer)
    if batch is None or not offer:
        return batch, end, count
    explicit = batch.ids[0] != 0
    batch = batch if explicit else placeholder_ids(batch)
    return OfferRun(batch, explicit_ids=explicit, nbytes=end - pos), end, count


def envelope_frames_batch_py(
    stream: str,
    buf: bytes | bytearray,
    pos: int,
    prefix: bytes,
    max_count: int,
    limit: int,
    offer: bool,
) -> tuple[Batch | None, int, int]:
    """Up to ``max_count`` complete frames ``prefix | length | envelope`` at ``buf[pos:]``:
    ``(batch, end, count)``, or ``(None, pos, 0)`` when not even the first one decodes.

    Fast path, per frame: the prefix, a one- or two-byte length, then the envelope's id and
    timestamp compared in one ``startswith`` with those expected after the previous frame
    (next id, same timestamp; the expected id is bumped in place, as in
    :func:`envelopes_to_batch`), then the key's one-byte length. Anything else takes the full
    parse. A malformed envelope ends the run before its frame, which is then decoded on its
    own (and reported there).

    ``offer``: the envelopes a publisher sends, where every id may be 0 ("the hub assigns it");
    a run holds envelopes that all carry ids or all leave them to the hub."""
    start = pos
    ids: list[int] = []
    stamps: list[int] = []
    values: list[bytes | bytearray] = []
    keyed: list[tuple[int, bytes]] = []
    startswith = buf.startswith
    end_buf = len(buf)
    plen = len(prefix)
    expected = bytearray()  # id varint + timestamp, expected next; empty: full parse
    event_id = ts = 0
    count = 0
    while count < max_count:
        if not startswith(prefix, pos):
            break
        p = pos + plen
        if p + 2 > end_buf:
            break
        size = buf[p]
        if size < 0x80:
            p += 1
        elif buf[p + 1] < 0x80:
            size = (size & 0x7F) | (buf[p + 1] << 7)
            p += 2
        else:
            try:
                size, p = pull_varint(buf, p)
            except (NeedData, RemoteProtocolError):
                break
        end = p + size
        if size > limit or end > end_buf:
            break
        if expected and startswith(expected, p) and p + len(expected) < end:
            q = p + len(expected)
            if event_id:  # (id 0, "assign it", repeats as it is)
                event_id += 1
                b = expected[0]
                if b & 0x7F == 0x7F:  # the next id carries out of its low byte
                    expected = bytearray()
                else:
                    expected[0] = b + 1
        else:
            header = _header(buf, p, end)
            if header is None or (header[0] == 0 and not offer):
                break
            if count and (header[0] == 0) != (ids[0] == 0):  # ids given, then not, or back
                break
            event_id, ts, q, expected = header
        b = buf[q]
        if b == 0:
            q += 1
        else:
            found = _key(buf, q, end)
            if found is None:
                break
            key, q = found
            if key is not None:
                keyed.append((count, key))
        values.append(buf[q:end])
        ids.append(event_id)
        stamps.append(ts)
        count += 1
        if offer and not event_id and b == 0:  # see below
            pos = _same_frames(buf, pos, end, q, max_count - count, values)
            same = len(values) - count
            ids += repeat(0, same)
            stamps += repeat(ts, same)
            count += same
        else:
            pos = end
    if not count:
        return None, start, 0
    try:
        batch = columns_to_batch(stream, ids, stamps, values, keyed)
    except (ValueError, TidewireError):
        return None, start, 0  # decoded frame by frame instead, where it is reported
    return batch, pos, count


def _header(buf: bytes | bytearray, p: int, end: int) -> tuple[int, int, int, bytearray] | None:
    """The full parse of an envelope's id and timestamp at ``buf[p:]`` (its element ends at
    ``end``): ``(id, timestamp, where the key starts, the id and timestamp expected next)``
    (that last empty when the next id's varint is longer); ``None`` if it is malformed."""
    try:
        event_id, q = pull_envelope_varint(buf, p)
        ts_start = q
        raw, q = pull_envelope_varint(buf, q)
    except ValueError:
        return None
    if q >= end:
        return None
    next_id = varint_bytes(event_id + 1 if event_id else 0)
    same_size = len(next_id) == len(varint_bytes(event_id))
    expected = bytearray(next_id + bytes(buf[ts_start:q])) if same_size else bytearray()
    return event_id, (raw >> 1) ^ -(raw & 1), q, expected


def _key(buf: bytes | bytearray, q: int, end: int) -> tuple[bytes | None, int] | None:
    """The key of the envelope whose key field starts at ``buf[q]`` (not a 0 byte) and whose
    element ends at ``end``, and where its value starts; ``None`` if it is malformed."""
    b = buf[q]
    if b < 0x80:
        key_len, q = b, q + 1
    else:
        try:
            key_len, q = pull_envelope_varint(buf, q)
        except ValueError:
            return None
        if q > end:  # the varint ran on past the element
            return None
    if not key_len:  # (a padded varint 0 is "no key" too)
        return None, q
    if q + key_len - 1 > end:
        return None
    return bytes(buf[q : q + key_len - 1]), q + key_len - 1


def _same_frames(
    buf: bytes | bytearray, pos: int, end: int, q: int, max_count: int,
    values: list[bytes | bytearray],
) -> int:
    """The frames after ``buf[pos:end]`` (an offer's, id 0 and no key, its value at ``q``)
    whose head is byte for byte the same, up to ``max_count`` of them: their values are
    appended to ``values``; returns where they end. The publisher's common case (the hub
    assigns the ids, one clock tick, values of one size) then costs one ``startswith`` and
    one slice per element."""
    head = bytes(buf[pos:q])
    skip, size = q - pos, end - pos
    startswith = buf.startswith
    append = values.append
    stop = len(buf) - size  # a whole frame must fit
    pos = end
    while max_count and pos <= stop and startswith(head, pos):
        append(buf[pos + skip : pos + size])
        pos += size
        max_count -= 1
    return pos


def envelope_run_decoder(stream: str) -> RunDecoder:
    """A run decoder (see ``Connection.set_run_decoder``) for a subscription to ``stream`` in
    the envelope format: consecutive ``onNext`` frames become one :class:`Batch` straight from
    the receive buffer, with no object per element but its value's bytes."""

    def decode(
        buf: ReceiveBuffer, prefix: bytes, max_count: int, limit: int
    ) -> tuple[Batch | None, int]:
        data, pos = buf.view()
        value, end, count = _frames_to_batch(stream, data, pos, prefix, max_count, limit)
        if count:
            buf.advance_to(end)
        return value, count  # type: ignore[return-value]

    return decode


def offer_run_decoder(stream: str) -> RunDecoder:
    """A run decoder for an offer into ``stream`` in the envelope format (the hub sets it with
    ``Connection.set_run_decoder`` once the publisher's ``subscribed`` arrives): runs of
    ``onNext`` frames become :class:`OfferRun` values, the ingest path's unit."""

    def decode(
        buf: ReceiveBuffer, prefix: bytes, max_count: int, limit: int
    ) -> tuple[OfferRun | None, int]:
        data, pos = buf.view()
        value, end, count = _frames_to_batch(
            stream, data, pos, prefix, max_count, limit, offer=True
        )
        if count:
            buf.advance_to(end)
        return value, count  # type: ignore[return-value]

    return decode


def placeholder_ids(batch: Batch) -> Batch:
    """``batch`` with ids 1..n (for envelopes that leave their ids to the hub)."""
    assigned = array("Q", range(1, len(batch) + 1))
    return replace(batch, ids=memoryview(assigned).cast("B").cast("Q"))


def join_offer_parts(
    stream: str, parts: Sequence[bytes | OfferRun], now_ms: int
) -> tuple[Batch, bool]:
    """The batch of an offer's gathered ``parts`` (decoded runs, and elements that came one
    frame at a time), and whether its envelopes carry their own ids; timestamps 0 become
    ``now_ms``. ``ValueError`` for a malformed envelope, or ids given by some and not others
    (what :func:`.decode_envelopes` says of the same elements). Columns are joined with no
    Python work per element."""
    batches: list[Batch] = []
    explicit: set[bool] = set()
    loose: list[bytes] = []
    for part in chain(parts, (None,)):
        if isinstance(part, bytes | bytearray | memoryview) and part is not None:
            loose.append(bytes(part))
            continue
        if loose:
            batch, given = decode_envelopes(stream, loose, now_ms)
            batches.append(batch)
            explicit.add(given)
            loose = []
        if isinstance(part, OfferRun):
            batches.append(part.batch)
            explicit.add(part.explicit_ids)
    if len(explicit) > 1:
        raise ValueError("an offer's envelopes either all carry ids or all leave them to the hub")
    given = explicit.pop()
    batch = _concat(batches, given)
    return stamp_zero_timestamps(batch, now_ms), given


def _concat(batches: list[Batch], explicit_ids: bool) -> Batch:
    """One batch of ``batches`` (same stream), ids checked to increase when ``explicit_ids``,
    else numbered 1..n."""
    if len(batches) == 1:
        return batches[0]
    ids = memoryview(b"".join(b.ids for b in batches)).cast("Q")
    if explicit_ids:
        try:
            check_ids(ids)
        except InvalidBatch as exc:
            raise ValueError(str(exc)) from None
    shifts = accumulate((b.values.nbytes for b in batches[:-1]), initial=0)
    offsets = array("I", [0])
    for batch, shift in zip(batches, shifts, strict=True):
        view = batch.value_offsets
        base = view[0]
        offsets.extend(map(add, view[1:].tolist(), repeat(shift - base)))
    key_flags = key_offsets = keys = None
    if any(b.has_keys for b in batches):
        flags = b"".join(b.key_flags if b.key_flags is not None else bytes(len(b))
                         for b in batches)  # fmt: skip
        key_lengths = array("I", [0])
        for batch in batches:
            if batch.key_offsets is None:
                key_lengths.extend(repeat(key_lengths[-1], len(batch)))
                continue
            base = batch.key_offsets[0]
            key_lengths.extend(map(add, batch.key_offsets[1:].tolist(),
                                   repeat(key_lengths[-1] - base)))  # fmt: skip
        key_flags = memoryview(flags)
        key_offsets = memoryview(key_lengths).cast("B").cast("I")
        keys = memoryview(b"".join(b.keys for b in batches if b.keys is not None))
    joined = Batch(
        batches[0].stream,
        ids,
        memoryview(b"".join(b.timestamps for b in batches)).cast("q"),
        memoryview(offsets).cast("B").cast("I"),
        memoryview(b"".join(b.values for b in batches)),
        key_flags,
        key_offsets,
        keys,
    )
    return joined if explicit_ids else placeholder_ids(joined)


# The compiled kernels when they are built and not switched off (tidewire.native), else the
# pure functions above, which are their specification.
envelope_frames = kernel("envelope_frames", envelope_frames_py)
envelope_frames_batch = kernel("envelope_frames_batch", envelope_frames_batch_py)
