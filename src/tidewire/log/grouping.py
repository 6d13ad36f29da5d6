"""How a commit group becomes records: runs of small batches merge into one record each.

A run's record and the batch stored for each of its appends come from one function,
:func:`encode_run` (the compiled kernel, ``native/_log.pxi``, when it is built; else
:func:`encode_run_py`, its specification): 16 concurrent single-event appends cost one pass over
their columns, not a merged batch, its encode and 16 slices of it (docs/log.md, "Fixed cost per
commit").
"""

from __future__ import annotations

from ..model import MAX_ID, Batch, InvalidBatch
from ..native import kernel
from ..record import HEADER_SIZE, EncodedRecord, encode, merge

__all__ = [
    "MERGE_MAX_BYTES",
    "MERGE_MAX_EVENTS",
    "RunEncoded",
    "RunRecord",
    "encode_group",
    "encode_group_runs",
    "encode_group_runs_py",
    "encode_run",
    "encode_run_py",
    "owned_valid",
    "owned_valid_py",
]

MERGE_MAX_EVENTS = 64
"""Batches of at most this many events that are committed together share one record."""
MERGE_MAX_BYTES = 256 * 1024

RunEncoded = tuple[bytearray, Batch, list[Batch], int, int, int, int]
"""A run encoded: the record's bytes, its batch (views of them), the batch stored for each item
of the run (views of them too), and the record's count, first id, last id, largest timestamp."""


def encode_run_py(items: list[tuple[Batch, int | None]]) -> RunEncoded:
    """The record of a run of batches of one stream, each paired with the first id the log
    assigns it (``None``: its own ids, which the caller checked to increase across the run),
    and the batch stored for each: ``record.encode`` of the lone batch, or of ``record.merge``
    of the run (whose offsets start at 0), sliced back per item. :class:`InvalidBatch` when an
    assigned id would fall outside 1..2**63-1."""
    if not items:
        raise ValueError("a run holds at least one batch")
    for batch, first_id in items:
        if first_id is not None and not 1 <= first_id <= MAX_ID - len(batch) + 1:
            last = first_id + len(batch) - 1
            raise InvalidBatch(f"ids {first_id}..{last} are outside 1..2**63-1")
    if len(items) == 1:
        record = encode(*items[0])
        stored = [record.batch]
    else:
        record = encode(merge(items))
        stored = []
        start = 0
        for batch, _ in items:
            stored.append(record.batch.slice(start, start + len(batch)))
            start += len(batch)
    return (record.data, record.batch, stored, record.count, record.base_id, record.last_id,
            record.max_timestamp)  # fmt: skip


encode_run = kernel("encode_run", encode_run_py)


def owned_valid_py(batch: Batch) -> Batch:
    """What :meth:`Log.append` keeps of ``batch`` before it waits: ``batch.owned().validate()``
    (a batch whose buffers nobody can change, checked in full)."""
    return batch.owned().validate()


owned_valid = kernel("owned_valid", owned_valid_py)


RunRecord = tuple[bytearray, Batch, int, int, int, int]
"""One run's record: its bytes, its batch, its count, first id, last id, largest timestamp."""


def encode_group_runs_py(
    items: list[tuple[Batch, int | None]], limit: int, max_events: int
) -> tuple[list[RunRecord], list[Batch]]:
    """A commit group cut into runs, each encoded (:func:`encode_run_py`), and the batch stored
    for each item, in order: consecutive batches of at most ``max_events`` events and
    ``limit`` bytes each (as :attr:`Batch.nbytes` counts them) share a run of at most
    ``limit`` bytes; a larger batch is a run of its own."""
    runs: list[RunRecord] = []
    stored: list[Batch] = []

    def close(run: list[tuple[Batch, int | None]]) -> None:
        data, batch, kept, count, first, last, max_ts = encode_run_py(run)
        runs.append((data, batch, count, first, last, max_ts))
        stored.extend(kept)

    run: list[tuple[Batch, int | None]] = []
    run_bytes = 0
    for item in items:
        batch = item[0]
        size = batch.nbytes
        if len(batch) <= max_events and size <= limit:
            if run_bytes + size > limit:
                close(run)
                run, run_bytes = [], 0
            run.append(item)
            run_bytes += size
        else:
            if run:
                close(run)
                run = []
            run_bytes = 0
            close([item])
    if run:
        close(run)
    return runs, stored


encode_group_runs = kernel("encode_group_runs", encode_group_runs_py)


def encode_group(
    items: list[tuple[Batch, int | None]], max_record_bytes: int
) -> tuple[list[EncodedRecord], list[Batch]]:
    """Records for a group, and the batch stored for each item: runs of small batches merge
    into one record each (so many small appends cost one record, not one each); a larger
    batch is a record of its own."""
    limit = min(MERGE_MAX_BYTES, max_record_bytes - HEADER_SIZE - 64)
    runs, stored = encode_group_runs(items, limit, MERGE_MAX_EVENTS)
    records = [EncodedRecord(data, batch, len(data), count, first, last, max_ts)
               for data, batch, count, first, last, max_ts in runs]  # fmt: skip
    return records, stored
