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
from .rsio_publisher import Publisher

__all__ = [
    "RECORD_BYTES", "PartStager", "StagedPart", "abort_parts", "commit_parts", "stage_part",
]

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


class PartStager:
    """One part being staged: :meth:`open`, :meth:`send` batches (their ids are ignored) as
    they come, :meth:`close` for the part as a commit names it. The publisher's queue bounds
    what waits for the hub (``max_queue_bytes``)."""

    def __init__(self, client: RsioClient, stream: str, txn: str, part: str, *,
                 record_bytes: int = RECORD_BYTES,
                 max_queue_bytes: int = 8 * 1024 * 1024) -> None:  # fmt: skip
        self.client, self.stream, self.txn, self.part = client, stream, txn, part
        self.record_bytes = record_bytes
        self.max_queue_bytes = max_queue_bytes
        self.publisher: Publisher | None = None
        self.count = self.nbytes = self.fp = self.records = 0

    async def open(self) -> PartStager:
        self.publisher = await self.client.publisher(
            self.stream, format="records", txn=self.txn, stage=self.part,
            max_queue_bytes=self.max_queue_bytes)  # fmt: skip
        return self

    async def send(self, batches: Iterable[Batch]) -> None:
        """Queue ``batches`` as records (waiting for room in the queue)."""
        assert self.publisher is not None, "open() first"
        for record, n in _records(batches, self.record_bytes):
            self.fp = part_fingerprint([record], self.fp)
            self.count += n
            self.nbytes += len(record)
            self.records += 1
            await self.publisher.submit([record])

    async def close(self) -> StagedPart:
        """Complete the part; once the hub has made it durable, the part as a commit names
        it. Raises :class:`~.rsio_common.RsioError` with the hub's reason if it refused it."""
        assert self.publisher is not None, "open() first"
        await self.publisher.close()
        return StagedPart(self.part, self.count, self.nbytes, self.fp, self.records)


async def stage_part(client: RsioClient, stream: str, txn: str, part: str,
                     batches: Iterable[Batch], *, record_bytes: int = RECORD_BYTES,
                     max_queue_bytes: int = 8 * 1024 * 1024) -> StagedPart:  # fmt: skip
    """Stage ``batches`` (their ids are ignored) as part ``part`` of transaction ``txn`` into
    ``stream`` (:class:`PartStager`); return the part as a commit names it, once durable."""
    stager = await PartStager(client, stream, txn, part, record_bytes=record_bytes,
                              max_queue_bytes=max_queue_bytes).open()  # fmt: skip
    await stager.send(batches)  # (on an error the part is left open: never completed, it is
    return await stager.close()  # dropped with the connection, or by the sweep)


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
