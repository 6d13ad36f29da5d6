"""tidewire batches <-> Arrow record batches, column by column (no object per row).

The source's schema is ``stream string, id long, key binary, value binary, timestamp
timestamp``. A :class:`~tidewire.model.Batch` already holds its columns in contiguous buffers,
so each Arrow column is built from those buffers: ids as they are (u64 ids < 2**63 read as
int64), timestamps scaled from ms to µs, values and keys from their offsets (rebased to 0 when a
batch is a slice) and data, a key's absence as Arrow's validity bitmap. Writing goes the other
way: a record batch's ``value``, ``key``, ``stream`` and ``timestamp`` columns become batches,
one per target stream.

The fixed cost per batch matters as much as the cost per row (issue 22; a Spark executor turns
one batch per log record, often 10,000 events, and a full scan is millions of rows): every
constant handed to a ``pyarrow.compute`` function is a prebuilt Arrow scalar (a Python ``int``
costs about 90 µs of type inference per call, the whole work on 10,000 rows about 10 µs),
timestamps are scaled once and then reinterpreted (``view``), offsets are reinterpreted when
they fit an int32 rather than cast, and the ``stream`` column is a slice of a cached column of
that name (:func:`stream_column`). ``to_arrow`` of 10,000 events of 100 B: 718 -> 44 µs (a
scratch ``timeit`` on this project's 2-core machine, shared with other work).
"""

from __future__ import annotations

from array import array

import pyarrow as pa
import pyarrow.compute as pc

from ..model import Batch, InvalidBatch, now_ms, validate_stream_name

__all__ = ["SCHEMA", "SCHEMA_DDL", "from_arrow", "stream_column", "to_arrow"]

SCHEMA_DDL = "stream string, id long, key binary, value binary, timestamp timestamp"
TIMESTAMP = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string()),
        pa.field("id", pa.int64()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", TIMESTAMP),
    ]
)


_MS_TO_US = pa.scalar(1000, pa.int64())
_NO_KEY = pa.scalar(0, pa.uint8())
_INT32_END = 2**31  # offsets from 0 below this read the same as int32

_STREAM_COLUMNS: dict[str, pa.Array] = {}
_STREAM_CACHE_BYTES = 16 * 1024 * 1024  # name bytes (and offsets) kept, at most
_stream_cache_used = 0


def stream_column(stream: str, n: int) -> pa.Array:
    """``stream`` repeated ``n`` times, as a string array: a zero-copy slice of a cached column
    (built by ``pa.repeat``, about 140 µs for 10,000 rows, once per name and size), or a new
    one if caching it would keep more than 16 MiB (then the cache starts again)."""
    global _stream_cache_used
    column = _STREAM_COLUMNS.get(stream)
    if column is not None and len(column) >= n:
        return column.slice(0, n)
    built: pa.Array = pa.repeat(stream, n).cast(pa.string())
    size = built.nbytes
    if size > _STREAM_CACHE_BYTES:
        return built
    if _stream_cache_used + size > _STREAM_CACHE_BYTES:
        _STREAM_COLUMNS.clear()
        _stream_cache_used = 0
    old = _STREAM_COLUMNS.get(stream)
    _stream_cache_used += size - (0 if old is None else old.nbytes)
    _STREAM_COLUMNS[stream] = built
    return built


def _offsets(view: memoryview, n: int) -> pa.Buffer:
    """u32 offsets (n + 1 of them, maybe starting above 0) as Arrow int32 offsets from 0."""
    offsets = pa.Array.from_buffers(pa.uint32(), n + 1, [None, pa.py_buffer(view)])
    base = view[0]
    if base:
        offsets = pc.subtract(offsets, pa.scalar(base, pa.uint32()))
    if view[n] - base < _INT32_END:  # (always, but for a batch of 2 GiB)
        return offsets.view(pa.int32()).buffers()[1]
    return offsets.cast(pa.int32()).buffers()[1]  # (raises: Arrow's binary holds < 2 GiB)


def to_arrow(batch: Batch) -> pa.RecordBatch:
    """``batch`` as a record batch of :data:`SCHEMA`."""
    n = len(batch)
    ids = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(batch.ids)])
    stamps = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(batch.timestamps)])
    try:
        stamps = pc.multiply_checked(stamps, _MS_TO_US).view(TIMESTAMP)
    except pa.ArrowInvalid:
        raise InvalidBatch(f"stream {batch.stream!r}: a timestamp (ms) is beyond what Spark's "
                           "microsecond timestamps hold") from None  # fmt: skip
    values = pa.Array.from_buffers(
        pa.binary(), n, [None, _offsets(batch.value_offsets, n), pa.py_buffer(batch.values)]
    )
    if batch.key_flags is not None and batch.key_offsets is not None and batch.keys is not None:
        flags = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(batch.key_flags)])
        valid = pc.not_equal(flags, _NO_KEY)
        keys = pa.Array.from_buffers(
            pa.binary(),
            n,
            [valid.buffers()[1], _offsets(batch.key_offsets, n), pa.py_buffer(batch.keys)],
        )
    else:
        keys = pa.nulls(n, pa.binary())
    streams = stream_column(batch.stream, n)
    return pa.RecordBatch.from_arrays([streams, ids, keys, values, stamps], schema=SCHEMA)


def _binary(column: pa.Array, name: str) -> pa.Array:
    if pa.types.is_large_binary(column.type) or pa.types.is_string(column.type) or (
        pa.types.is_large_string(column.type)
    ):
        return column.cast(pa.binary())
    if not pa.types.is_binary(column.type):
        raise InvalidBatch(f"column {name!r} must be binary or string, not {column.type}")
    return column


def _u32_offsets(array: pa.Array) -> memoryview:
    """The n + 1 offsets of a binary array (honouring its slice offset), read as u32."""
    n = len(array)
    raw = memoryview(array.buffers()[1]).cast("B")
    return raw[4 * array.offset : 4 * (array.offset + n + 1)].cast("I")


def _int64s(array: pa.Array) -> memoryview:
    """The values of a null-free int64 array as a ``q`` view."""
    raw = memoryview(array.buffers()[1]).cast("B")
    return raw[8 * array.offset : 8 * (array.offset + len(array))].cast("q")


def _column_bytes(array: pa.Array) -> tuple[memoryview, memoryview]:
    """Offsets (u32, n + 1, from the array's first offset) and the bytes they span."""
    offsets = _u32_offsets(array)
    data = array.buffers()[2]
    first, last = offsets[0], offsets[len(array)]
    values = memoryview(data if data is not None else b"").cast("B")[first:last]
    return offsets, values


def from_arrow(
    record_batch: pa.RecordBatch, default_stream: str | None
) -> list[Batch]:
    """Rows of ``record_batch`` (a ``value`` column; optional ``key``, ``stream``,
    ``timestamp``) as batches, one per stream, rows kept in order within each stream."""
    names = record_batch.schema.names
    if "value" not in names:
        raise InvalidBatch(f"rows to write need a 'value' column (got {names})")
    if record_batch.num_rows == 0:
        return []
    if "stream" in names:
        streams = record_batch.column("stream")
        if streams.null_count:
            raise InvalidBatch("the 'stream' column holds a null")
        if not (pa.types.is_string(streams.type) or pa.types.is_large_string(streams.type)):
            try:
                streams = streams.cast(pa.string())  # binary names: UTF-8 checked here
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidBatch(f"the 'stream' column must hold UTF-8 names: {exc}") from None
        out = []
        for name in pc.unique(streams).to_pylist():
            part = record_batch.filter(pc.equal(streams, name))
            out.append(_one_stream(part, str(name)))
        return out
    if default_stream is None:
        raise InvalidBatch("rows need a 'stream' column, or the option 'stream'")
    return [_one_stream(record_batch, default_stream)]


def _one_stream(rb: pa.RecordBatch, stream: str) -> Batch:
    validate_stream_name(stream)
    n = rb.num_rows
    values = _binary(rb.column("value"), "value")
    if values.null_count:
        raise InvalidBatch("the 'value' column holds a null (tidewire values are bytes)")
    value_offsets, value_bytes = _column_bytes(values)
    key_flags = key_offsets = keys = None
    if "key" in rb.schema.names:
        key_col = _binary(rb.column("key"), "key")
        if key_col.null_count < n:
            key_col_filled = pc.fill_null(key_col, b"")
            key_offsets, keys = _column_bytes(key_col_filled)
            flags = pc.is_valid(key_col).cast(pa.uint8())
            key_flags = memoryview(flags.buffers()[1]).cast("B")[flags.offset : flags.offset + n]
    if "timestamp" in rb.schema.names:
        column = rb.column("timestamp")
        if not pa.types.is_timestamp(column.type):
            raise InvalidBatch(f"column 'timestamp' must be a timestamp, not {column.type}")
        micros = column.cast(TIMESTAMP, safe=False)  # (nanoseconds are truncated)
        ms = pc.divide(micros.cast(pa.int64()), 1000)
        stamps = _int64s(pc.fill_null(ms, now_ms()))
    else:
        stamps = memoryview(array("q", [now_ms()]) * n)
    ids = memoryview(array("Q", range(1, n + 1)))
    return Batch(stream, ids, stamps, value_offsets, value_bytes, key_flags, key_offsets, keys)
