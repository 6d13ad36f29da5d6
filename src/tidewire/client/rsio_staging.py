"""Staged transactions from the client side (docs/protocols/rsio.md "Staged transactions").

Many writers (Spark's executor tasks) each :func:`stage_part` their rows under one
transaction id, as parts nobody reads; one of them (Spark's driver) then :func:`commit_parts`
the parts that count, by name, event count and fingerprint, which appends them exactly once;
or :func:`abort_parts` drops them. A part's fingerprint is the CRC-32C of the records sent
(computed here, as they are sent: the hub's answer carries no fingerprint).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..model import Batch
from ..protocols.rsio.staged import StagedPart, encode_parts, part_fingerprint
from ..record import encode
from .rsio import Receipt, RsioClient

__all__ = ["RECORD_BYTES", "StagedPart", "abort_parts", "commit_parts", "stage_part"]

RECORD_BYTES = 4 * 1024 * 1024
"""A staged batch is sent as log records of about this many bytes at most (well within the
hub's ``max_element_bytes``, 16 MiB by default)."""


def _records(batches: Iterable[Batch], record_bytes: int) -> Iterable[tuple[bytes, int]]:
    for batch in batches:
        start, n = 0, len(batch)
        while start < n:
            stop = max(batch.fit(start, record_bytes), start + 1)
            piece = batch if (start, stop) == (0, n) else batch.slice(start, stop)
            yield bytes(encode(piece.with_ids(1)).data), stop - start
            start = stop


async def stage_part(client: RsioClient, stream: str, txn: str, part: str,
                     batches: Iterable[Batch], *, record_bytes: int = RECORD_BYTES,
                     max_queue_bytes: int = 8 * 1024 * 1024) -> StagedPart:  # fmt: skip
    """Stage ``batches`` (their ids are ignored) as part ``part`` of transaction ``txn``
    into ``stream``; return the part as a commit names it, once the hub has made it
    durable. Raises :class:`~.rsio_common.RsioError` if the hub refused it."""
    pub = await client.publisher(stream, format="records", txn=txn, stage=part,
                                 max_queue_bytes=max_queue_bytes)  # fmt: skip
    count = nbytes = fp = records = 0
    try:
        for record, n in _records(batches, record_bytes):
            fp = part_fingerprint([record], fp)
            count += n
            nbytes += len(record)
            records += 1
            await pub.submit([record])  # (waits for room: bounded by max_queue_bytes)
    finally:
        await pub.close()  # the part is durable once the offer ended without error
    return StagedPart(part, count, nbytes, fp, records)


async def commit_parts(client: RsioClient, stream: str, txn: str,
                       parts: Sequence[StagedPart]) -> Receipt | None:  # fmt: skip
    """Append the named ``parts`` of ``txn`` into ``stream``, in that order, exactly once;
    where they are (``None`` when they hold no event). A replay answers the first commit's
    ids. A part not staged (or not as named) fails the commit: stage it again."""
    if not any(p.count for p in parts):  # (nothing to append: the parts are dropped)
        await abort_parts(client, stream, txn)
        return None
    pub = await client.publisher(stream, txn=txn, action="commit")
    receipt = await pub.submit([encode_parts(parts)])
    try:
        await pub.close()  # (raises the hub's reason if the commit failed)
    finally:  # (the receipt fails with the same reason: retrieved, not reported again)
        receipt.add_done_callback(lambda f: f.cancelled() or f.exception())
    return await receipt


async def abort_parts(client: RsioClient, stream: str, txn: str) -> None:
    """Drop every staged part of ``txn`` into ``stream`` (none is appended)."""
    pub = await client.publisher(stream, txn=txn, action="abort")
    await pub.close()
