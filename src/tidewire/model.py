"""Events, batches and stream names shared by every part of tidewire; the error tree
(:mod:`tidewire.errors`) is re-exported here.

An *event* is (stream, id, key, value, timestamp). Ids are strictly increasing within a stream;
on the wire they are u64, but tidewire keeps them in 1..2**63-1 so that every id fits Spark's
``LongType`` and RS.io's ``Long`` (0 means "before the first event").

The unit of work is the :class:`Batch`: many events of one stream held column-wise in a few
contiguous buffers (ids, timestamps, value offsets + one values buffer, and optionally key flags,
key offsets + one keys buffer). The log stores these buffers as they are and hands them back as
zero-copy views, so moving a thousand events costs a handful of Python objects, not thousands.

Buffers are native little-endian machine arrays (``memoryview`` casts); tidewire refuses to
import on a big-endian machine rather than silently writing a log it could not read elsewhere.
"""

from __future__ import annotations

import itertools
import operator
import sys
import time
import unicodedata
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from .errors import (
    AccessError,
    CorruptLogError,
    DataLossError,
    Forbidden,
    IdOrderError,
    InvalidBatch,
    InvalidStreamName,
    LimitExceeded,
    LocalProtocolError,
    LogClosedError,
    LogError,
    ProtocolError,
    RemoteProtocolError,
    StorageFullError,
    TidewireError,
    Unauthenticated,
    UnknownStream,
)

__all__ = [
    "MAX_ID",
    "AccessError",
    "Batch",
    "CorruptLogError",
    "DataLossError",
    "Event",
    "Forbidden",
    "IdOrderError",
    "InvalidBatch",
    "InvalidStreamName",
    "LimitExceeded",
    "LocalProtocolError",
    "LogClosedError",
    "LogError",
    "ProtocolError",
    "RemoteProtocolError",
    "StorageFullError",
    "TidewireError",
    "Unauthenticated",
    "UnknownStream",
    "now_ms",
    "validate_stored_stream_name",
    "validate_stream_name",
]

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("tidewire's log format is little-endian; this machine is big-endian")

MAX_ID = 2**63 - 1
"""The largest event id (ids are 1..MAX_ID)."""

MAX_STREAM_NAME_BYTES = 255


# --------------------------------------------------------------------------- names and time


# Default_Ignorable_Code_Point (Unicode's DerivedCoreProperties.txt) outside the Cf category,
# which is refused as a whole: characters that render as nothing (fillers, variation
# selectors, the combining grapheme joiner), so two names that look the same differ in bytes.
_INVISIBLE = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
              (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
              (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))  # fmt: skip


def _invisible(ch: str) -> bool:
    code = ord(ch)
    return any(low <= code <= high for low, high in _INVISIBLE)


def validate_stream_name(name: str) -> str:
    """Return ``name`` if it is a valid stream name, else raise :class:`InvalidStreamName`.

    A name is 1-255 bytes of UTF-8, in Unicode normalisation form NFC, with no whitespace,
    no control characters (Cc), no format characters (Cf: zero-width characters, the bidi
    controls, the soft hyphen), no other invisible characters (variation selectors, fillers),
    no unassigned code points (Cn) and no private-use ones (Co). Names are bytes on every wire
    and in every ACL pattern, so a name that is not NFC is refused rather than normalised: a
    peer never gets a stream under bytes other than the ones it sent, and two names that render
    the same cannot both exist (look-alikes across scripts, Latin ``a`` and Cyrillic ``а``,
    remain distinct names: see docs/security.md).

    "Unassigned" is as of the Unicode version of the running Python's :mod:`unicodedata`
    (a character newer than it is refused until the hub runs on a newer Python).

    Streams created before this rule whose names break only its Unicode part still open:
    :func:`validate_stored_stream_name` is the log's rule for a name on disk.
    """
    if not isinstance(name, str):
        raise InvalidStreamName(f"stream name must be str, not {type(name).__name__}")
    return _validate_stream_name(name)


def validate_stored_stream_name(name: str) -> str:
    """The older, looser rule (1-255 bytes of UTF-8, no whitespace, no control characters)
    that a stream name already on disk must meet: the log recovers such a stream, lists it,
    reads it and applies retention, though no peer can name it any more."""
    if not isinstance(name, str):
        raise InvalidStreamName(f"stream name must be str, not {type(name).__name__}")
    return _validate_stored_stream_name(name)


@lru_cache(maxsize=4096)
def _validate_stored_stream_name(name: str) -> str:
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidStreamName(f"stream name {name!r} is not valid UTF-8") from exc
    if size == 0:
        raise InvalidStreamName("stream name is empty")
    if size > MAX_STREAM_NAME_BYTES:
        raise InvalidStreamName(
            f"stream name is {size} bytes of UTF-8; the limit is {MAX_STREAM_NAME_BYTES}"
        )
    for position, ch in enumerate(name):
        if ch.isspace() or unicodedata.category(ch) == "Cc":
            raise InvalidStreamName(
                f"stream name {name!r} holds whitespace or a control character "
                f"(U+{ord(ch):04X} at position {position})"
            )
    return name


@lru_cache(maxsize=4096)
def _validate_stream_name(name: str) -> str:
    _validate_stored_stream_name(name)
    if name.isascii():  # (the common case: printable ASCII is all of the rule below)
        return name
    for position, ch in enumerate(name):
        category = unicodedata.category(ch)
        if category in ("Cf", "Cn", "Co") or _invisible(ch):
            what = {"Cf": "an invisible or bidi-control", "Cn": "an unassigned",
                    "Co": "a private-use"}.get(category, "an invisible")  # fmt: skip
            raise InvalidStreamName(
                f"stream name {name!a} holds {what} character "
                f"(U+{ord(ch):04X} at position {position})"
            )
    if not unicodedata.is_normalized("NFC", name):
        raise InvalidStreamName(
            f"stream name {name!a} is not in Unicode normalisation form NFC (its NFC form "
            f"is {unicodedata.normalize('NFC', name)!a})"
        )
    return name


def now_ms() -> int:
    """Wall-clock time in milliseconds since the Unix epoch (event timestamps)."""
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- events and batches


@dataclass(frozen=True, slots=True)
class Event:
    """One event. Convenient for tests and tools; hot paths move :class:`Batch` instead."""

    stream: str
    id: int
    value: bytes
    key: bytes | None = None
    timestamp: int = 0


def _u64(values: Iterable[int]) -> memoryview:
    return _frozen(array("Q", values))


def _frozen(items: array[int]) -> memoryview:
    """A view of an immutable copy of ``items`` (see :meth:`Batch.owned`)."""
    return _cast(memoryview(items.tobytes()), items.typecode)


def _cast(view: memoryview, fmt: str) -> memoryview:
    return view.cast(fmt)  # type: ignore[call-overload,no-any-return]


def _offsets(chunks: Sequence[bytes]) -> tuple[memoryview, memoryview]:
    """Offsets (n+1, u32) and the concatenated bytes of ``chunks``."""
    lengths = [len(c) for c in chunks]
    offsets = array("I", [0])
    total = 0
    for n in lengths:
        total += n
        offsets.append(total)  # OverflowError past 4 GiB: a batch is far smaller than that
    return _frozen(offsets), memoryview(b"".join(chunks))


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """Events ``[0, n)`` of one stream, column-wise in contiguous buffers.

    * ``ids`` (format ``Q``) and ``timestamps`` (format ``q``, ms): ``n`` items each.
    * ``value_offsets`` (format ``I``): ``n + 1`` items; event ``i``'s value is
      ``values[value_offsets[i] - value_offsets[0] : value_offsets[i + 1] - value_offsets[0]]``.
      Offsets may start above zero so that slicing a batch never rewrites them.
    * ``key_flags`` (format ``B``, 1 = the event has a key), ``key_offsets`` and ``keys``: the same
      layout for keys, or all three ``None`` when no event has a key.

    Construction checks only what is O(1) (buffer sizes and formats); the builders check id order,
    and :meth:`validate` checks a batch that came from an untrusted peer.
    """

    stream: str
    ids: memoryview
    timestamps: memoryview
    value_offsets: memoryview
    values: memoryview
    key_flags: memoryview | None = None
    key_offsets: memoryview | None = None
    keys: memoryview | None = None

    def __post_init__(self) -> None:
        n = len(self.ids)
        if n == 0:
            raise InvalidBatch("a batch holds at least one event")
        if self.ids.format != "Q" or self.timestamps.format != "q":
            raise InvalidBatch("ids must be format 'Q' and timestamps format 'q'")
        if self.value_offsets.format != "I":
            raise InvalidBatch("value offsets must be format 'I'")
        if len(self.timestamps) != n or len(self.value_offsets) != n + 1:
            raise InvalidBatch("ids, timestamps and value offsets disagree in length")
        if self.values.format != "B":
            raise InvalidBatch("values must be format 'B'")
        if not (
            self.ids.c_contiguous
            and self.timestamps.c_contiguous
            and self.value_offsets.c_contiguous
            and self.values.c_contiguous
            and (self.keys is None or self.keys.c_contiguous)
            and (self.key_flags is None or self.key_flags.c_contiguous)
            and (self.key_offsets is None or self.key_offsets.c_contiguous)
        ):
            raise InvalidBatch("a batch's buffers must be C-contiguous")
        if self.value_offsets[n] - self.value_offsets[0] != self.values.nbytes:
            raise InvalidBatch("value offsets do not span the values buffer")
        has = (self.key_flags is not None, self.key_offsets is not None, self.keys is not None)
        if any(has) and not all(has):
            raise InvalidBatch("key flags, key offsets and keys come together or not at all")
        if self.key_flags is not None and self.key_offsets is not None and self.keys is not None:
            if len(self.key_flags) != n or len(self.key_offsets) != n + 1:
                raise InvalidBatch("key flags or key offsets disagree with the ids in length")
            if self.key_offsets.format != "I" or self.key_flags.format != "B":
                raise InvalidBatch("key offsets must be format 'I' and key flags format 'B'")
            if self.keys.format != "B":
                raise InvalidBatch("keys must be format 'B'")
            if self.key_offsets[n] - self.key_offsets[0] != self.keys.nbytes:
                raise InvalidBatch("key offsets do not span the keys buffer")

    # ------------------------------------------------------------------ builders

    @classmethod
    def build(
        cls,
        stream: str,
        values: Sequence[bytes],
        *,
        ids: Sequence[int] | None = None,
        keys: Sequence[bytes | None] | None = None,
        timestamps: Sequence[int] | int | None = None,
    ) -> Batch:
        """Build a batch from Python values (an edge of the system, so per-event work is fine).

        ``ids`` default to 1..n (the log reassigns them when it assigns ids); ``timestamps``
        default to now, and a single int stamps every event with it.
        """
        validate_stream_name(stream)
        n = len(values)
        if n == 0:
            raise InvalidBatch("a batch holds at least one event")
        if ids is None:
            id_view = _u64(range(1, n + 1))
        else:
            if len(ids) != n:
                raise InvalidBatch(f"{len(ids)} ids for {n} values")
            try:
                id_view = _u64(ids)
            except OverflowError as exc:
                raise InvalidBatch("ids must be within 1..2**63-1") from exc
            check_ids(id_view)
        if timestamps is None or isinstance(timestamps, int):
            ts = now_ms() if timestamps is None else timestamps
            ts_array = array("q", [ts]) * n
        else:
            if len(timestamps) != n:
                raise InvalidBatch(f"{len(timestamps)} timestamps for {n} values")
            ts_array = array("q", timestamps)
        value_offsets, value_bytes = _offsets(values)
        key_flags = key_offsets = key_bytes = None
        if keys is not None:
            if len(keys) != n:
                raise InvalidBatch(f"{len(keys)} keys for {n} values")
            if any(k is not None for k in keys):
                key_flags = memoryview(bytes(0 if k is None else 1 for k in keys))
                key_offsets, key_bytes = _offsets([b"" if k is None else k for k in keys])
        return cls(
            stream,
            id_view,
            _frozen(ts_array),
            value_offsets,
            value_bytes,
            key_flags,
            key_offsets,
            key_bytes,
        )

    @classmethod
    def fixed(
        cls,
        stream: str,
        data: bytes | bytearray | memoryview,
        size: int,
        *,
        key: bytes | None = None,
        timestamp: int | None = None,
    ) -> Batch:
        """A batch of ``len(data) // size`` values of ``size`` bytes each, packed back to back in
        ``data`` (ids 1..n, every event stamped ``timestamp`` (default now) and keyed ``key``).
        No per-event Python: this is how packed elements become a batch."""
        validate_stream_name(stream)
        n, rest = divmod(len(data), size) if size > 0 else (0, 1)
        if n == 0 or rest:
            raise InvalidBatch(f"{len(data)} bytes are not a whole number of {size}-byte values")
        key_flags = key_offsets = keys = None
        if key is not None:
            key_flags = memoryview(b"\x01" * n)
            step = len(key)
            key_offsets = _frozen(
                array("I", range(0, n * step + 1, step)) if step else array("I", [0]) * (n + 1)
            )
            keys = memoryview(key * n)
        return cls(
            stream,
            _u64(range(1, n + 1)),
            _frozen(array("q", [now_ms() if timestamp is None else timestamp]) * n),
            _frozen(array("I", range(0, n * size + 1, size))),
            memoryview(bytes(data)),
            key_flags,
            key_offsets,
            keys,
        )

    @classmethod
    def from_events(cls, events: Sequence[Event]) -> Batch:
        """A batch of events that all belong to one stream."""
        if not events:
            raise InvalidBatch("a batch holds at least one event")
        stream = events[0].stream
        if any(e.stream != stream for e in events):
            raise InvalidBatch("every event of a batch belongs to the same stream")
        return cls.build(
            stream,
            [e.value for e in events],
            ids=[e.id for e in events],
            keys=[e.key for e in events],
            timestamps=[e.timestamp for e in events],
        )

    # ------------------------------------------------------------------ accessors

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def first_id(self) -> int:
        return int(self.ids[0])

    @property
    def last_id(self) -> int:
        return int(self.ids[-1])

    @property
    def has_keys(self) -> bool:
        return self.key_flags is not None

    @property
    def nbytes(self) -> int:
        """Bytes held by the batch's buffers (what it costs to keep or send)."""
        n = len(self.ids)
        size = 20 * n + 4 + self.values.nbytes
        if self.keys is not None:
            size += 5 * n + 4 + self.keys.nbytes
        return size

    def value(self, i: int) -> bytes:
        base = self.value_offsets[0]
        return bytes(self.values[self.value_offsets[i] - base : self.value_offsets[i + 1] - base])

    def key(self, i: int) -> bytes | None:
        if self.key_flags is None or self.key_offsets is None or self.keys is None:
            return None
        if not self.key_flags[i]:
            return None
        base = self.key_offsets[0]
        return bytes(self.keys[self.key_offsets[i] - base : self.key_offsets[i + 1] - base])

    def event(self, i: int) -> Event:
        return Event(
            self.stream, int(self.ids[i]), self.value(i), self.key(i), int(self.timestamps[i])
        )

    def __iter__(self) -> Iterator[Event]:
        """Per-event objects: for tools and tests, never for hot paths."""
        for i in range(len(self.ids)):
            yield self.event(i)

    def index_of(self, event_id: int) -> int:
        """Index of the first event whose id is >= ``event_id`` (``len(self)`` if none)."""
        return bisect_left(self.ids, event_id)

    def fit(self, start: int, max_bytes: int) -> int:
        """The largest ``stop`` such that events ``[start, stop)`` take at most ``max_bytes``
        (as :attr:`nbytes` counts them); ``start`` itself when not even one event fits."""
        n = len(self.ids)
        vo, ko = self.value_offsets, self.key_offsets
        v0 = vo[start]
        if ko is None:

            def size(stop: int) -> int:
                return 20 * (stop - start) + 4 + vo[stop] - v0

        else:
            k0 = ko[start]

            def size(stop: int) -> int:
                return 25 * (stop - start) + 8 + vo[stop] - v0 + ko[stop] - k0

        return start + bisect_right(range(start + 1, n + 1), max_bytes, key=size)

    # ------------------------------------------------------------------ derived batches

    def slice(self, start: int, stop: int) -> Batch:
        """Events ``[start, stop)`` as a zero-copy view (a non-empty range)."""
        n = len(self.ids)
        if not 0 <= start < stop <= n:
            start, stop, _ = slice(start, stop).indices(n)
        if stop <= start:
            raise InvalidBatch("a slice of a batch holds at least one event")
        if start == 0 and stop == n:
            return self
        vbase = self.value_offsets[0]
        values = self.values[self.value_offsets[start] - vbase : self.value_offsets[stop] - vbase]
        key_flags = key_offsets = keys = None
        if self.key_flags is not None and self.key_offsets is not None and self.keys is not None:
            kbase = self.key_offsets[0]
            key_flags = self.key_flags[start:stop]
            key_offsets = self.key_offsets[start : stop + 1]
            keys = self.keys[self.key_offsets[start] - kbase : self.key_offsets[stop] - kbase]
        # A slice of a valid batch is valid: skip the checks of __post_init__ (hot path).
        view = object.__new__(Batch)
        for name, value in (
            ("stream", self.stream),
            ("ids", self.ids[start:stop]),
            ("timestamps", self.timestamps[start:stop]),
            ("value_offsets", self.value_offsets[start : stop + 1]),
            ("values", values),
            ("key_flags", key_flags),
            ("key_offsets", key_offsets),
            ("keys", keys),
        ):
            object.__setattr__(view, name, value)
        return view

    def with_ids(self, first_id: int) -> Batch:
        """The same events renumbered ``first_id, first_id + 1, ...`` (log-assigned ids)."""
        last = first_id + len(self.ids) - 1
        if first_id < 1 or last > MAX_ID:
            raise InvalidBatch(f"ids {first_id}..{last} are outside 1..2**63-1")
        return Batch(
            self.stream,
            _u64(range(first_id, last + 1)),
            self.timestamps,
            self.value_offsets,
            self.values,
            self.key_flags,
            self.key_offsets,
            self.keys,
        )

    def with_stream(self, stream: str) -> Batch:
        """The same events in another stream (buffers shared)."""
        validate_stream_name(stream)
        return Batch(
            stream,
            self.ids,
            self.timestamps,
            self.value_offsets,
            self.values,
            self.key_flags,
            self.key_offsets,
            self.keys,
        )

    def owned(self) -> Batch:
        """This batch, or a copy of it, whose buffers nobody can change: every buffer a view of
        ``bytes``. The log takes one before it waits, so that a caller's receive buffer is free
        again at once, even if the append is cancelled."""
        if (
            type(self.ids.obj) is bytes
            and type(self.timestamps.obj) is bytes
            and type(self.value_offsets.obj) is bytes
            and type(self.values.obj) is bytes
            and (self.keys is None or type(self.keys.obj) is bytes)
            and (self.key_flags is None or type(self.key_flags.obj) is bytes)
            and (self.key_offsets is None or type(self.key_offsets.obj) is bytes)
        ):
            return self
        buffers = (self.ids, self.timestamps, self.value_offsets, self.values,
                   self.key_flags, self.key_offsets, self.keys)  # fmt: skip

        def copy(view: memoryview | None) -> memoryview | None:
            return None if view is None else _cast(memoryview(view.tobytes()), view.format)

        return Batch(self.stream, *(copy(b) for b in buffers))  # type: ignore[arg-type]

    def validate(self) -> Batch:
        """Check every O(n) invariant: ids strictly increasing in 1..MAX_ID, offsets monotone."""
        check_ids(self.ids)
        _check_monotone(self.value_offsets, "value offsets")
        if self.key_offsets is not None:
            _check_monotone(self.key_offsets, "key offsets")
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        return (
            self.stream == other.stream
            and self.ids == other.ids
            and self.timestamps == other.timestamps
            and self.values == other.values
            and _value_lengths(self.value_offsets) == _value_lengths(other.value_offsets)
            and [self.key(i) for i in range(len(self))] == [other.key(i) for i in range(len(other))]
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Batch(stream={self.stream!r}, n={len(self.ids)}, "
            f"ids={self.first_id}..{self.last_id}, values={self.values.nbytes} B)"
        )


def check_ids(ids: memoryview) -> None:
    """``InvalidBatch`` unless the ids (u64) are within 1..2**63-1 and strictly increasing."""
    if ids[0] < 1 or ids[-1] > MAX_ID:
        raise InvalidBatch("ids must be within 1..2**63-1")
    if len(ids) > 1 and not all(map(operator.lt, ids[:-1], ids[1:])):  # the loop runs in C
        previous, i = next((a, b) for a, b in itertools.pairwise(ids) if a >= b)
        raise InvalidBatch(f"ids must be strictly increasing ({previous} then {i})")


def _check_monotone(offsets: memoryview, what: str) -> None:
    if len(offsets) == 2:
        if offsets[0] > offsets[1]:
            raise InvalidBatch(f"{what} must not decrease")
    elif not all(map(operator.le, offsets[:-1], offsets[1:])):
        raise InvalidBatch(f"{what} must not decrease")


def _value_lengths(offsets: memoryview) -> list[int]:
    return [offsets[i + 1] - offsets[i] for i in range(len(offsets) - 1)]
