"""Publisher names the hub understands, and the element formats it publishes.

The seed leaves the ``publisher`` String to the recipient. tidewire's grammar::

    publisher = stream [ "?" param *( "&" param ) ]
    stream    = percent-encoded stream name (a literal "?", "&", "%" must be written %3F, %26, %25)
    param     = "from=" ( id | "earliest" | "latest" )   ; default: earliest
              | "until=" id                               ; bounded: onComplete after this id
              | "key=" percent-encoded bytes              ; only events with this key
              | "format=" ( "envelope" | "value" | "records" )  ; default: envelope
              | "size=" N                                 ; fixed-size values: N bytes each

Element formats:

* ``envelope`` (default): ``id varint | timestamp zigzag-varint (ms) | key | value`` where
  ``key`` is a varint 0 for "no key", else 1 + its length followed by its bytes, and ``value``
  is the rest of the element. A subscriber can resume from the last id it saw.
* ``value``: the value's bytes only.
* ``records``: each element is a whole batch of events, one log record as docs/log.md lays it
  out (48-byte header with CRC-32C, then the batch's columns): no work per event at either end,
  and the subscriber checks the hub's CRCs end to end. Demand counts records, not events.
* ``size=N`` (implies ``format=value``): fixed-size mode: the hub answers
  ``subscribed(elementSize=N)`` and may pack elements with ``onNextPacked``; an event whose value
  is not N bytes ends the subscription with ``onError``.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Literal
from urllib.parse import quote, unquote, unquote_to_bytes

from ...model import (
    MAX_ID,
    Batch,
    InvalidBatch,
    InvalidStreamName,
    RemoteProtocolError,
    TidewireError,
    check_ids,
    now_ms,
    validate_stream_name,
)
from .codec import RunDecoder
from .wire import NeedData, pull_varint, push_varint

__all__ = [
    "OfferName",
    "PublisherName",
    "decode_envelope",
    "decode_envelopes",
    "encode_envelopes",
    "envelope_frames",
    "envelope_parts",
    "envelope_run_decoder",
    "envelopes_to_batch",
    "fixed_size_values",
]

Format = Literal["envelope", "value", "records"]


class PublisherNameError(TidewireError, ValueError):
    """A publisher name that does not follow the grammar (answered with ``onError``)."""


@dataclass(frozen=True, slots=True)
class PublisherName:
    stream: str
    start: int | Literal["earliest", "latest"] = "earliest"
    until: int | None = None
    key: bytes | None = None
    format: Format = "envelope"
    size: int = 0  # > 0: fixed-size mode

    @classmethod
    def parse(cls, text: str) -> PublisherName:
        raw_stream, _, query = text.partition("?")
        try:
            stream = validate_stream_name(_unquote_strict(raw_stream))
        except (InvalidStreamName, UnicodeDecodeError) as exc:
            raise PublisherNameError(f"bad stream in publisher {text!r}: {exc}") from None
        fields: dict[str, str] = {}
        for param in query.split("&") if query else ():
            name, eq, value = param.partition("=")
            if not eq or name in fields:
                raise PublisherNameError(f"bad or repeated parameter {param!r} in {text!r}")
            fields[name] = value
        start: int | Literal["earliest", "latest"] = "earliest"
        until = None
        key = None
        fmt: Format = "envelope"
        size = 0
        for name, value in fields.items():
            if name == "from":
                start = value if value in ("earliest", "latest") else _id(value, text)  # type: ignore[assignment]
            elif name == "until":
                until = _id(value, text)
            elif name == "key":
                if _BAD_PERCENT.search(value):
                    raise PublisherNameError(f"a '%' not followed by two hex digits in the key "
                                             f"of {text!r} (write %25)")  # fmt: skip
                key = unquote_to_bytes(value)
            elif name == "format":
                if value not in ("envelope", "value", "records"):
                    raise PublisherNameError(
                        f"format must be envelope, value or records in {text!r}"
                    )
                fmt = value  # type: ignore[assignment]
            elif name == "size":
                size = _id(value, text)
                if size < 1:
                    raise PublisherNameError(f"size must be >= 1 in {text!r}")
            else:
                raise PublisherNameError(f"unknown parameter {name!r} in {text!r}")
        if size and "format" in fields and fmt != "value":
            raise PublisherNameError(f"size=N needs format=value in {text!r}")
        if size:
            fmt = "value"
        return cls(stream, start, until, key, fmt, size)

    def __str__(self) -> str:
        params = []
        if self.start != "earliest":
            params.append(f"from={self.start}")
        if self.until is not None:
            params.append(f"until={self.until}")
        if self.key is not None:
            params.append("key=" + quote(self.key, safe=""))
        if self.size:
            params.append(f"size={self.size}")
        elif self.format != "envelope":
            params.append(f"format={self.format}")
        name = quote(self.stream, safe="")
        return name + ("?" + "&".join(params) if params else "")


@dataclass(frozen=True, slots=True)
class OfferName:
    """The publisher a client offers with ``offer`` (publishing extension)::

        offer-name = stream [ "?" param *( "&" param ) ]
        param      = "format=" ( "envelope" | "value" )   ; default envelope
                   | "key=" percent-encoded bytes          ; format=value only: every event's key
                   | "txn=" percent-encoded UTF-8          ; exactly once: see below

    With ``envelope`` each element is ``id | timestamp | key | value`` as in subscriptions,
    where id 0 lets the hub assign the next id and timestamp 0 means "the hub's clock"; every
    element of one offer either carries its id or lets the hub assign it. With ``value`` each
    element is a value; ids are assigned, the hub stamps the time.
    """

    stream: str
    format: Format = "envelope"
    key: bytes | None = None
    txn: str | None = None  # a transaction id: the offer is stored exactly once, atomically

    @classmethod
    def parse(cls, text: str) -> OfferName:
        raw_stream, _, query = text.partition("?")
        try:
            stream = validate_stream_name(_unquote_strict(raw_stream))
        except (InvalidStreamName, UnicodeDecodeError) as exc:
            raise PublisherNameError(f"bad stream in offer {text!r}: {exc}") from None
        fmt: Format = "envelope"
        key = None
        txn = None
        seen: set[str] = set()
        for param in query.split("&") if query else ():
            name, eq, value = param.partition("=")
            if not eq or name in seen:
                raise PublisherNameError(f"bad or repeated parameter {param!r} in {text!r}")
            seen.add(name)
            if name == "format" and value in ("envelope", "value"):
                fmt = value  # type: ignore[assignment]
            elif name == "key":
                if _BAD_PERCENT.search(value):
                    raise PublisherNameError(f"a '%' not followed by two hex digits in the key "
                                             f"of {text!r} (write %25)")  # fmt: skip
                key = unquote_to_bytes(value)
            elif name == "txn" and value:
                try:
                    txn = unquote(value, errors="strict")
                except UnicodeDecodeError:
                    raise PublisherNameError(f"txn is not UTF-8 in offer {text!r}") from None
            else:
                raise PublisherNameError(f"bad parameter {param!r} in offer {text!r}")
        if key is not None and fmt != "value":
            raise PublisherNameError(f"key= needs format=value in offer {text!r}")
        return cls(stream, fmt, key, txn)

    def __str__(self) -> str:
        params = []
        if self.format != "envelope":
            params.append(f"format={self.format}")
        if self.key is not None:
            params.append("key=" + quote(self.key, safe=""))
        if self.txn is not None:
            params.append("txn=" + quote(self.txn, safe=""))
        name = quote(self.stream, safe="")
        return name + ("?" + "&".join(params) if params else "")


_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _unquote_strict(raw: str) -> str:
    """Percent-decoding that refuses a ``%`` not followed by two hex digits (urllib keeps
    those as text) and bytes that are not UTF-8."""
    if _BAD_PERCENT.search(raw):
        raise InvalidStreamName(f"a '%' not followed by two hex digits in {raw!r} (write %25)")
    return unquote(raw, errors="strict")


def _id(value: str, text: str) -> int:
    # ASCII digits only (str.isdigit also takes "²", which int() refuses), and no more of
    # them than an id has: int() refuses more than 4300 digits, leading zeros included
    digits = value.lstrip("0") or "0"
    if not (value.isascii() and value.isdigit()) or len(digits) > 19 or int(digits) > MAX_ID:
        raise PublisherNameError(f"{value!r} is not an id (0..2**63-1) in {text!r}")
    return int(digits)


# --------------------------------------------------------------------------- envelopes


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def encode_envelopes(batch: Batch, *, with_ids: bool = True) -> list[bytes]:
    """One envelope element per event of ``batch`` (see the module docstring); with
    ``with_ids=False`` every id is 0 (publishing: the hub assigns them)."""
    values = batch.values.tobytes()
    offsets = batch.value_offsets
    base = offsets[0]
    ids = batch.ids.tolist()
    stamps = batch.timestamps.tolist()
    varint = _varint
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


def _pull(element: bytes | bytearray, pos: int) -> tuple[int, int]:
    """A varint inside an envelope (``ValueError`` if it is cut short or too long)."""
    result = shift = 0
    for i in range(pos, min(pos + 10, len(element))):
        byte = element[i]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result >> 64:
                break
            return result, i + 1
        shift += 7
    raise ValueError("bad envelope: a varint is cut short or too long")


def envelopes_to_batch(stream: str, elements: list[bytes]) -> Batch:
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
    pull = _pull
    varint = _varint
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
    return _columns_to_batch(stream, ids, stamps, values, keyed)


def _columns_to_batch(
    stream: str,
    ids: list[int],
    stamps: list[int],
    values: list[bytes] | list[bytearray],
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


_LOW = [bytes((i | 0x80,)) for i in range(0x80)]


def envelope_frames(subscriber: int, batch: Batch) -> bytes:
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
    varint = _varint
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


def envelope_run_decoder(stream: str) -> RunDecoder:
    """A run decoder (see ``Connection.set_run_decoder``) for a subscription to ``stream`` in
    the envelope format: consecutive ``onNext`` frames become one :class:`Batch` straight from
    the receive buffer, with no object per element but its value's bytes."""

    def decode(
        buf: bytearray, pos: int, prefix: bytes, max_count: int, limit: int
    ) -> tuple[Batch | None, int, int]:
        return _envelope_frames_to_batch(stream, buf, pos, prefix, max_count, limit)

    return decode


def _envelope_frames_to_batch(
    stream: str, buf: bytearray, pos: int, prefix: bytes, max_count: int, limit: int
) -> tuple[Batch | None, int, int]:
    """Up to ``max_count`` complete frames ``prefix | length | envelope`` at ``buf[pos:]``.

    Fast path, per frame: the prefix, a one- or two-byte length, then the envelope's id and
    timestamp compared in one ``startswith`` with those expected after the previous frame
    (next id, same timestamp; the expected id is bumped in place, as in
    :func:`envelopes_to_batch`), then the key's one-byte length. Anything else takes the full
    parse. A malformed envelope ends the run before its frame, which is then decoded on its
    own (and reported there)."""
    start = pos
    ids: list[int] = []
    stamps: list[int] = []
    values: list[bytearray] = []
    keyed: list[tuple[int, bytes]] = []
    startswith = buf.startswith
    end_buf = len(buf)
    plen = len(prefix)
    varint = _varint
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
            event_id += 1
            b = expected[0]
            if b & 0x7F == 0x7F:  # the next id carries out of its low byte
                expected = bytearray()
            else:
                expected[0] = b + 1
        else:
            try:
                event_id, q = _pull(buf, p)
                ts_start = q
                raw, q = _pull(buf, q)
            except ValueError:
                break
            if event_id == 0 or q >= end:
                break
            ts = (raw >> 1) ^ -(raw & 1)
            next_id = varint(event_id + 1)
            expected = (bytearray(next_id + bytes(buf[ts_start:q]))
                        if len(next_id) == len(varint(event_id)) else bytearray())  # fmt: skip
        b = buf[q]
        if b == 0:
            q += 1
        else:
            if b < 0x80:
                key_len, q = b, q + 1
            else:
                try:
                    key_len, q = _pull(buf, q)
                except ValueError:
                    break
                if q > end:  # the varint ran on past the element
                    break
            if key_len:  # (a padded varint 0 is "no key" too)
                if q + key_len - 1 > end:
                    break
                keyed.append((count, bytes(buf[q : q + key_len - 1])))
                q += key_len - 1
        values.append(buf[q:end])
        ids.append(event_id)
        stamps.append(ts)
        count += 1
        pos = end
    if not count:
        return None, start, 0
    try:
        return _columns_to_batch(stream, ids, stamps, values, keyed), pos, count
    except (ValueError, TidewireError):
        return None, start, 0  # decoded frame by frame instead, where it is reported


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
    varint = _varint
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


def decode_envelopes(stream: str, elements: list[bytes]) -> tuple[Batch, bool]:
    """A batch of the published envelopes ``elements`` and whether they carry their own ids
    (else the log assigns them). Timestamp 0 is the hub's clock. ``ValueError`` if one is
    malformed or the ids are partly given."""
    try:
        batch = envelopes_to_batch(stream, elements)
    except TidewireError as exc:
        raise ValueError(str(exc)) from None
    ids = batch.ids
    explicit = ids[0] != 0
    if not explicit and any(ids.tobytes()):
        raise ValueError("an offer's envelopes either all carry ids or all leave them to the hub")
    stamps = batch.timestamps
    if 0 in stamps.tolist():
        now = now_ms()
        fixed = array("q", (t or now for t in stamps.tolist()))
        batch = replace(batch, timestamps=memoryview(fixed).cast("B").cast("q"))
    if not explicit:
        assigned = array("Q", range(1, len(ids) + 1))
        batch = replace(batch, ids=memoryview(assigned).cast("B").cast("Q"))
    return batch, explicit


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
