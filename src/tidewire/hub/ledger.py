"""A ledger: the hub's own state as JSON records in one of its reserved streams.

The transaction registry (``_tidewire.txns``, :mod:`.txn`) and the Tolliver instance's state
(``_tidewire.tolliver``: its UUID, the remotes' offsets, the delivery ids reserved) are kept the
same way: each change is one JSON object appended durably (:meth:`Ledger.record` returns once it
is), and at open the owner folds every record still retained (:meth:`Ledger.load`) into its state.
Records are small and written rarely compared with the data; the stream is subject to retention
like any other (its owner says what it may lose, and how it copes).

**Several gateways** (cluster mode, docs/cluster.md) share one storage, hence one ledger
stream, and each folds it into its own memory. Two steps keep them in step, on one hub as on
many (one code path; on one hub they find nothing new and cost one empty read):

* :meth:`Ledger.catch_up`: the records appended after the last one this ledger has seen (by
  id), whoever appended them: the owner folds them in, oldest first;
* :meth:`Ledger.record_exclusive`: a compare-and-swap on the ledger: the record is appended with
  its own id, the one after the last seen, so it succeeds only if nothing was appended since
  this ledger last saw the stream's end (:class:`~tidewire.model.IdOrderError` otherwise: the
  owner catches up and decides again). The storage makes own-id appends conditional for every
  writer ("ids above the stream's latest, whoever appended it"), which is what makes this
  linearizable across gateways.

"Seen" means: loaded, caught up, or appended by this ledger right after the last record seen
(:meth:`record` and :meth:`record_many` advance it then, and only then; a record of this ledger
that landed after someone else's is returned again by the next :meth:`catch_up`: owners fold
records so that doing so is harmless). Appends to one stream land in order (the storage
interface's promise), so a record is never skipped for landing late; when nothing new is
committed but an append of this gateway is in flight above, a catch-up waits for it once
(:func:`past`).

A record that is not a JSON object is skipped with a warning (a hand edit, or a format from a
later version): the owner sees only well-formed objects.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from ..model import Batch, DataLossError
from .storage import Storage

__all__ = ["Ledger", "past"]

log = logging.getLogger("tidewire.hub")

READ_BYTES = 4 * 1024 * 1024  # per read while catching up


class Ledger:
    """The JSON records of one reserved stream of ``storage`` (names start ``_tidewire.``).

    :attr:`last_seen`: the id of the last record this ledger has seen (0: none); every id at
    or below it has been seen (module docstring)."""

    def __init__(self, storage: Storage, stream: str) -> None:
        self.storage = storage
        self.stream = stream
        self.last_seen = 0
        self._catching_up = asyncio.Lock()  # (one read at a time: the next finds the rest)

    def load(self) -> Iterator[dict[str, Any]]:
        """Every record retained, oldest first (once, when the owner starts)."""
        for _, record in self.load_numbered():
            yield record

    def load_numbered(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """As :meth:`load`, each record with its id in the stream (its place in the ledger)."""
        for batch in self.storage.replay(self.stream):
            yield from self._decode(batch)
            self.last_seen = max(self.last_seen, batch.last_id)

    async def catch_up(self) -> list[dict[str, Any]]:
        """The records appended since the last one seen, oldest first (module docstring);
        fold them in before awaiting anything else."""
        return [record for _, record in await self.catch_up_numbered()]

    async def catch_up_numbered(self) -> list[tuple[int, dict[str, Any]]]:
        """As :meth:`catch_up`, each record with its id."""
        async with self._catching_up:
            out: list[tuple[int, dict[str, Any]]] = []
            waited = False
            while True:
                try:
                    batches = await self.storage.read(self.stream, self.last_seen + 1,
                                                      READ_BYTES, 2**63 - 1)  # fmt: skip
                except DataLossError as exc:  # (retention removed records nobody had seen)
                    log.warning("%s: records lost to retention while catching up: %s",
                                self.stream, exc)  # fmt: skip
                    self.last_seen = self.storage.start_id(self.stream) - 1
                    continue
                if not batches:
                    if waited or self.storage.accepted_latest(self.stream) <= self.last_seen:
                        return out
                    waited = True  # (ours in flight above: wait for it, once)
                    await past(self.storage, self.stream, self.last_seen)
                    continue
                for batch in batches:
                    out += self._decode(batch)
                self.last_seen = max(self.last_seen, batches[-1].last_id)

    async def record(self, record: dict[str, Any]) -> int:
        """Append ``record`` durably (compact JSON); its id. Errors are the storage's."""
        return await self.record_many([record])

    async def record_many(self, records: list[dict[str, Any]]) -> int:
        """Append ``records`` durably as one batch (one commit, whatever their number); the
        id of the first."""
        stored = await self.storage.append(_batch(self.stream, records), assign_ids=True)
        if stored.first_id == self.last_seen + 1:  # (nothing of anyone else's in between)
            self.last_seen = stored.last_id
        return stored.first_id

    async def record_exclusive(self, record: dict[str, Any]) -> int:
        """Append ``record`` with the id after :attr:`last_seen`: only if nothing was appended
        since this ledger last saw the stream's end; its id. :class:`~tidewire.model.
        IdOrderError` otherwise (nothing appended: catch up, then decide again)."""
        at = self.last_seen + 1
        await self.storage.append(_batch(self.stream, [record]).with_ids(at))
        self.last_seen = max(self.last_seen, at)
        return at

    def _decode(self, batch: Batch) -> Iterable[tuple[int, dict[str, Any]]]:
        ids = batch.ids
        for i in range(len(batch)):
            try:
                record = json.loads(batch.value(i))
            except ValueError as exc:
                log.warning("ignoring a malformed record in %s: %s", self.stream, exc)
                continue
            if not isinstance(record, dict):
                log.warning("ignoring a record that is not an object in %s", self.stream)
                continue
            yield ids[i], record

    def __repr__(self) -> str:
        return f"Ledger({self.stream!r})"


async def past(storage: Storage, stream: str, after_id: int) -> None:
    """Return once ``stream`` has a committed id above ``after_id``, or nothing handed over
    is in flight any more (what was failed): whichever comes first. (:meth:`~.storage.
    Storage.settled` alone could wait for ever while others keep appending, and
    :meth:`~.storage.Storage.wait_for` alone while nobody does.)"""
    waits = {asyncio.ensure_future(storage.wait_for(stream, after_id)),
             asyncio.ensure_future(storage.settled(stream))}  # fmt: skip
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


def _batch(stream: str, records: list[dict[str, Any]]) -> Batch:
    return Batch.build(stream, [json.dumps(r, separators=(",", ":")).encode() for r in records])
