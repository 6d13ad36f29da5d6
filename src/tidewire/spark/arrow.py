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
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..model import Batch, InvalidBatch, now_ms, validate_stream_name
from ..native import kernel

__all__ = [
    "SCHEMA",
    "SCHEMA_DDL",
    "arrow_group",
    "arrow_group_py",
    "from_arrow",
    "group_to_arrow",
    "stream_column",
    "to_arrow",
]

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
_TIMESTAMP_RANGE = "a timestamp (ms) is beyond what Spark's microsecond timestamps hold"
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
        raise InvalidBatch(f"stream {batch.stream!r}: {_TIMESTAMP_RANGE}") from None
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


def _rebased(offsets: memoryview, running: int, what: str) -> memoryview:
    """``offsets[1:] - offsets[0] + running`` as int32 bytes (one batch's rows in a group)."""
    n = len(offsets) - 1
    column = pa.Array.from_buffers(pa.uint32(), n + 1, [None, pa.py_buffer(offsets)])
    base = offsets[0]
    if running + offsets[n] - base >= _INT32_END:
        raise InvalidBatch(f"more than 2 GiB of {what} in one Arrow batch")
    moved = pc.add(pc.cast(column, pa.int64()), pa.scalar(running - base, pa.int64()))
    return memoryview(moved.cast(pa.int32()).buffers()[1]).cast("B")[4 : 4 * (n + 1)]


def arrow_group_py(
    batches: list[Batch],
    ids_out: memoryview,
    stamps_out: memoryview,
    voffs_out: memoryview,
    vals_out: memoryview,
    valid_out: memoryview,
    koffs_out: memoryview,
    keys_out: memoryview,
) -> int:
    """The Arrow columns of ``batches`` (one stream's, in order; n rows in all) written into
    buffers sized for the group (format ``B``, writable): ids (8n: the u64 ids as int64),
    timestamps (8n: ms scaled to µs, int64), value offsets (4(n + 1): int32 from 0), values
    (the values' bytes back to back), and for keys, unless ``koffs_out`` is empty (no batch
    has keys): the validity bitmap (ceil(n / 8) bytes, bit i = row i has a key, the unused
    bits 0), offsets (4(n + 1)) and bytes. Returns the key column's null count (0 without
    keys). ``ValueError`` for buffers of the wrong sizes; :class:`InvalidBatch` for a
    timestamp beyond int64 µs, or 2 GiB of values or keys or more. The pure twin (and the
    specification) of the compiled ``arrow_group``."""
    rows = sum(len(b) for b in batches)
    keyed = len(koffs_out) > 0
    value_bytes = sum(b.values.nbytes for b in batches)
    key_bytes = sum(b.keys.nbytes for b in batches if b.keys is not None)
    if (len(ids_out) != 8 * rows or len(stamps_out) != 8 * rows
            or len(voffs_out) != 4 * (rows + 1) or len(vals_out) != value_bytes
            or len(keys_out) != key_bytes
            or (keyed and (len(koffs_out) != 4 * (rows + 1) or len(valid_out) != (rows + 7) // 8))
            or (not keyed and (key_bytes or len(valid_out)))):  # fmt: skip
        raise ValueError("the output buffers do not fit the batches")
    row = vpos = kpos = vend = kend = 0
    flags = bytearray(rows if keyed else 0)
    voffs_out[:4] = bytes(4)
    if keyed:
        koffs_out[:4] = bytes(4)
    for batch in batches:
        n = len(batch)
        stamps = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(batch.timestamps)])
        try:
            scaled = pc.multiply_checked(stamps, _MS_TO_US)
        except pa.ArrowInvalid:
            raise InvalidBatch(f"stream {batch.stream!r}: {_TIMESTAMP_RANGE}") from None
        stamps_out[8 * row : 8 * (row + n)] = memoryview(scaled.buffers()[1]).cast("B")[: 8 * n]
        ids_out[8 * row : 8 * (row + n)] = batch.ids.cast("B")
        voffs_out[4 * (row + 1) : 4 * (row + n + 1)] = _rebased(batch.value_offsets, vend, "values")
        vend += batch.value_offsets[n] - batch.value_offsets[0]
        vals_out[vpos : vpos + batch.values.nbytes] = batch.values
        vpos += batch.values.nbytes
        if keyed:
            if batch.key_flags is None or batch.key_offsets is None or batch.keys is None:
                koffs_out[4 * (row + 1) : 4 * (row + n + 1)] = array("i", [kend] * n).tobytes()
            else:
                koffs_out[4 * (row + 1) : 4 * (row + n + 1)] = _rebased(batch.key_offsets, kend,
                                                                        "keys")  # fmt: skip
                kend += batch.key_offsets[n] - batch.key_offsets[0]
                flags[row : row + n] = batch.key_flags
                keys_out[kpos : kpos + batch.keys.nbytes] = batch.keys
                kpos += batch.keys.nbytes
        row += n
    if not keyed:
        return 0
    flagged = pc.not_equal(pa.Array.from_buffers(pa.uint8(), rows, [None, pa.py_buffer(flags)]),
                           _NO_KEY)  # fmt: skip
    bitmap = bytearray(memoryview(flagged.buffers()[1]).cast("B")[: len(valid_out)])
    if rows % 8:  # (the bits past the last row: 0)
        bitmap[-1] &= (1 << (rows % 8)) - 1
    valid_out[:] = bitmap
    return rows - int(flagged.true_count)


arrow_group = kernel("arrow_group", arrow_group_py)


def _allocate(size: int, pool: pa.MemoryPool | None) -> tuple[pa.Buffer, memoryview]:
    buffer = pa.allocate_buffer(size, memory_pool=pool)
    return buffer, memoryview(buffer).cast("B")


def group_to_arrow(batches: Sequence[Batch], pool: pa.MemoryPool | None = None) -> pa.RecordBatch:
    """``batches`` (one stream's, in order) as one record batch of :data:`SCHEMA`: the rows
    ``to_arrow`` of each, concatenated, would give, each column written once into a buffer
    of the group's size (:func:`arrow_group`; one batch alone: :func:`to_arrow`, views),
    allocated from ``pool`` (default: Arrow's default pool)."""
    if len(batches) == 1:
        return to_arrow(batches[0])
    group = list(batches)
    rows = sum(len(b) for b in group)
    keyed = any(b.key_flags is not None for b in group)
    ids, ids_view = _allocate(8 * rows, pool)
    stamps, stamps_view = _allocate(8 * rows, pool)
    voffs, voffs_view = _allocate(4 * (rows + 1), pool)
    values, values_view = _allocate(sum(b.values.nbytes for b in group), pool)
    valid, valid_view = _allocate((rows + 7) // 8 if keyed else 0, pool)
    koffs, koffs_view = _allocate(4 * (rows + 1) if keyed else 0, pool)
    keys, keys_view = _allocate(sum(b.keys.nbytes for b in group if b.keys is not None), pool)
    nulls = arrow_group(group, ids_view, stamps_view, voffs_view, values_view, valid_view,
                        koffs_view, keys_view)  # fmt: skip
    key_column = (
        pa.Array.from_buffers(pa.binary(), rows, [valid, koffs, keys], null_count=nulls)
        if keyed
        else pa.nulls(rows, pa.binary())
    )
    return pa.RecordBatch.from_arrays(
        [
            stream_column(group[0].stream, rows),
            pa.Array.from_buffers(pa.int64(), rows, [None, ids]),
            key_column,
            pa.Array.from_buffers(pa.binary(), rows, [None, voffs, values]),
            pa.Array.from_buffers(TIMESTAMP, rows, [None, stamps]),
        ],
        schema=SCHEMA,
    )


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
