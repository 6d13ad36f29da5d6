"""How a commit group becomes records: runs of small batches merge into one record each."""

from __future__ import annotations

from ..model import Batch
from ..record import HEADER_SIZE, EncodedRecord, encode, merge

__all__ = ["MERGE_MAX_BYTES", "MERGE_MAX_EVENTS", "encode_group"]

MERGE_MAX_EVENTS = 64
"""Batches of at most this many events that are committed together share one record."""
MERGE_MAX_BYTES = 256 * 1024


def encode_group(
    items: list[tuple[Batch, int | None]], max_record_bytes: int
) -> tuple[list[EncodedRecord], list[Batch]]:
    """Records for a group, and the batch stored for each item: runs of small batches merge
    into one record each (so many small appends cost one record, not one each); a larger
    batch is a record of its own."""
    limit = min(MERGE_MAX_BYTES, max_record_bytes - HEADER_SIZE - 64)
    records: list[EncodedRecord] = []
    stored: list[Batch] = []
    run: list[tuple[Batch, int | None]] = []
    run_bytes = 0

    def close_run() -> None:
        if len(run) == 1:
            record = encode(*run[0])
            records.append(record)
            stored.append(record.batch)
        elif run:
            record = encode(merge(run))
            records.append(record)
            start = 0
            for batch, _ in run:
                stored.append(record.batch.slice(start, start + len(batch)))
                start += len(batch)
        run.clear()

    for batch, first_id in items:
        size = batch.nbytes
        if len(batch) <= MERGE_MAX_EVENTS and size <= limit:
            if run_bytes + size > limit:
                close_run()
                run_bytes = 0
            run.append((batch, first_id))
            run_bytes += size
        else:
            close_run()
            run_bytes = 0
            record = encode(batch, first_id)
            records.append(record)
            stored.append(record.batch)
    close_run()
    return records, stored
