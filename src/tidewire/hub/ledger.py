"""A ledger: the hub's own state as JSON records in one of its reserved streams.

The transaction registry (``_tidewire.txns``, :mod:`.txn`) and the Tolliver instance's state
(``_tidewire.tolliver``: its UUID, the remotes' offsets, the delivery ids reserved) are kept the
same way: each change is one JSON object appended durably (:meth:`Ledger.record` returns once it
is), and at open the owner folds every record still retained (:meth:`Ledger.load`) into its state.
Records are small and written rarely compared with the data; the stream is subject to retention
like any other (its owner says what it may lose, and how it copes).

A record that is not a JSON object is skipped with a warning at load (a hand edit, or a format
from a later version): the owner sees only well-formed objects.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from ..model import Batch
from .storage import Storage

__all__ = ["Ledger"]

log = logging.getLogger("tidewire.hub")


class Ledger:
    """The JSON records of one reserved stream of ``storage`` (names start ``_tidewire.``)."""

    def __init__(self, storage: Storage, stream: str) -> None:
        self.storage = storage
        self.stream = stream

    def load(self) -> Iterator[dict[str, Any]]:
        """Every record retained, oldest first (once, when the owner starts)."""
        for batch in self.storage.replay(self.stream):
            for i in range(len(batch)):
                try:
                    record = json.loads(batch.value(i))
                except ValueError as exc:
                    log.warning("ignoring a malformed record in %s: %s", self.stream, exc)
                    continue
                if not isinstance(record, dict):
                    log.warning("ignoring a record that is not an object in %s", self.stream)
                    continue
                yield record

    async def record(self, record: dict[str, Any]) -> None:
        """Append ``record`` durably (compact JSON); errors are the storage's."""
        data = json.dumps(record, separators=(",", ":")).encode()
        await self.storage.append(Batch.build(self.stream, [data]), assign_ids=True)

    async def record_many(self, records: list[dict[str, Any]]) -> None:
        """Append ``records`` durably as one batch (one commit, whatever their number)."""
        data = [json.dumps(r, separators=(",", ":")).encode() for r in records]
        await self.storage.append(Batch.build(self.stream, data), assign_ids=True)

    def __repr__(self) -> str:
        return f"Ledger({self.stream!r})"
