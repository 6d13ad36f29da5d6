"""Exactly-once appends: a batch appended under a transaction id is stored once (for as long
as its events are retained: see below).

Spark's sinks replay a micro-batch after a failure; so may any client that lost the answer to an
append. :meth:`Transactions.commit` makes such an append idempotent. The hub keeps its own
stream, ``_tidewire.txns``, of JSON records:

* ``{"txn": T, "stream": S, "first": F, "count": N, "fp": X}``: the *intent*, written (and
  fsynced) before the data: ``T``'s ``N`` events go to ``S`` as ids ``F .. F+N-1``, and their
  content has the fingerprint ``X`` (CRC-32C of the values, value lengths, key flags and keys;
  timestamps are left out, since a replay may stamp them anew);
* ``{"txn": T, "done": true}``: written once the data is durable.

The data is appended with its own ids ``F..``: if another writer took ``F`` meanwhile, the append
fails and is retried under a new intent whose ``F`` leaves a gap for the others (ids may have gaps),
wider at each retry. Commits into one stream run one at a time (they would only collide), and a
commit runs to its end even if its caller goes away, so a retry waits for it and finds it done.
So after a crash, an intent without its ``done`` is
settled by reading ids ``F..F+N-1`` of ``S``: the transaction happened if and only if they are
there with the same fingerprint (nobody else can have written exactly those). A commit of a known
transaction returns the ids it got the first time and appends nothing.

The registry is in memory, rebuilt from the stream (a :class:`~.ledger.Ledger`) when the hub
opens; the stream is subject to retention like any other (its default is to keep everything).
Spark replays only a query's last micro-batch, so a retention of days is plenty.

**How long a transaction id is remembered** (what keeps the registry bounded; Kafka's
``transactional.id.expiration.ms`` is the model): as long as its events are retained. Once
retention has removed *all* of a transaction's events, its entry is forgotten (at the next
retention pass, or when the hub reopens): a replay of it then appends anew, which nobody could
tell apart from a first commit anyway, since the events it would be compared with are gone.
With ``txn_expiration_ms`` (setting ``txn.expiration_ms``, default -1: never) an entry is also
forgotten that long after its commit (or after the hub reopened, for entries loaded then),
whatever the data's retention. An entry costs about 150 bytes of memory.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crc32c import crc32c

from ..model import Batch, IdOrderError, TidewireError

if TYPE_CHECKING:
    from .hub import Hub

__all__ = ["TXN_STREAM", "Transactions", "TxnReceipt", "fingerprint"]

log = logging.getLogger("tidewire.hub")

TXN_STREAM = "_tidewire.txns"
MAX_TXN_BYTES = 1024
RETRIES = 16


@dataclass(frozen=True, slots=True)
class TxnReceipt:
    """Where a transaction's events are: ids ``first_id``..``last_id`` of ``stream``;
    ``already`` when an earlier commit stored them (nothing was appended now)."""

    stream: str
    count: int
    first_id: int
    last_id: int
    already: bool


@dataclass(slots=True)
class _Entry:
    stream: str
    first: int
    count: int
    fp: int
    done: bool
    at: int  # ms, the hub's clock: when committed (or loaded): for the age bound

    @property
    def last(self) -> int:
        return self.first + self.count - 1


def fingerprint(batch: Batch) -> int:
    """CRC-32C of what makes a transaction's content: values and their lengths, keys."""
    offsets = batch.value_offsets
    lengths = array("I", [offsets[i + 1] - offsets[i] for i in range(len(batch))])
    fp = crc32c(lengths.tobytes())
    fp = crc32c(batch.values, fp)
    flags = batch.key_flags
    # (key columns whose flags are all 0 mean "no key" as much as no key columns do: a batch
    # read back from a record shared with keyed events has them)
    if flags is not None and flags.tobytes().strip(b"\0") and batch.keys is not None and (
        batch.key_offsets is not None
    ):
        fp = crc32c(flags, fp)
        k = batch.key_offsets
        fp = crc32c(array("I", [k[i + 1] - k[i] for i in range(len(batch))]).tobytes(), fp)
        fp = crc32c(batch.keys, fp)
    return fp


class Transactions:
    """The registry of one hub (``hub.txns``); ``expiration_ms``: the optional age bound
    (module docstring), ``None`` for none."""

    def __init__(self, hub: Hub, *, expiration_ms: int | None = None) -> None:
        self.hub = hub
        self.ledger = hub.ledger(TXN_STREAM)
        self.expiration_ms = expiration_ms
        self._entries: dict[str, _Entry] = {}
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # per txn: lock, users
        self._stream_locks: dict[str, asyncio.Lock] = {}

    def load(self) -> None:
        """Rebuild the registry from ``_tidewire.txns`` (at hub open), then forget what
        retention removed meanwhile."""
        now = self.hub.clock()
        for record in self.ledger.load():
            self._apply(record, now)
        self.forget_removed(now)

    def _apply(self, record: dict[str, Any], now: int) -> None:
        try:
            txn = record["txn"]
            if record.get("done"):
                entry = self._entries.get(txn)
                if entry is not None:
                    entry.done = True
                return
            self._entries[txn] = _Entry(sys.intern(record["stream"]), int(record["first"]),
                                        int(record["count"]), int(record["fp"]), False,
                                        now)  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring a malformed record in %s: %s", TXN_STREAM, exc)

    def __len__(self) -> int:
        return len(self._entries)

    def forget_removed(self, now: int | None = None) -> int:
        """Forget the transactions whose events retention removed (all of them), and those
        older than :attr:`expiration_ms`; return how many. Entries with a commit running (or
        an intent not settled) are kept. Called after each retention pass."""
        storage = self.hub.storage
        now = self.hub.clock() if now is None else now
        cutoff = None if self.expiration_ms is None else now - self.expiration_ms
        starts: dict[str, int] = {}
        gone = []
        for txn, entry in self._entries.items():
            if not entry.done or txn in self._locks:
                continue
            start = starts.get(entry.stream)
            if start is None:
                start = starts[entry.stream] = storage.start_id(entry.stream)
            if entry.last < start or (cutoff is not None and entry.at < cutoff):
                gone.append(txn)
        for txn in gone:
            del self._entries[txn]
        return len(gone)

    async def commit(self, txn: str, batch: Batch) -> TxnReceipt:
        """Append ``batch`` (its ids are ignored) unless ``txn`` was committed before; return
        where its events are either way."""
        if not txn or len(txn.encode()) > MAX_TXN_BYTES:
            raise TidewireError(f"a transaction id is 1..{MAX_TXN_BYTES} bytes")
        # Shielded: a caller that goes away (its connection dropped) does not stop a commit
        # half-way; a retry of the same transaction waits for it, then finds it done.
        return await asyncio.shield(self._locked_commit(txn, batch))

    async def _locked_commit(self, txn: str, batch: Batch) -> TxnReceipt:
        lock, users = self._locks.setdefault(txn, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock, self._stream_locks.setdefault(batch.stream, asyncio.Lock()):
                return await self._commit(txn, batch)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[txn]

    async def _commit(self, txn: str, batch: Batch) -> TxnReceipt:
        entry = self._entries.get(txn)
        if entry is not None and (entry.done or await self._settle(txn, entry)):
            if entry.stream != batch.stream or entry.count != len(batch):
                raise TidewireError(
                    f"transaction {txn!r} was committed to {entry.stream!r} with "
                    f"{entry.count} event(s), not to {batch.stream!r} with {len(batch)}"
                )
            last = entry.first + entry.count - 1
            return TxnReceipt(entry.stream, entry.count, entry.first, last, already=True)
        fp = fingerprint(batch)
        storage = self.hub.storage
        for attempt in range(RETRIES):
            # Other writers may take ids while the intent is written: after a collision, leave
            # them room (ids may have gaps), more each time.
            slack = 0 if attempt == 0 else 2 ** (attempt + 5)
            first = storage.accepted_latest(batch.stream) + 1 + slack
            intent = {"txn": txn, "stream": batch.stream, "first": first, "count": len(batch),
                      "fp": fp}  # fmt: skip
            await self.ledger.record(intent)
            self._entries[txn] = entry = _Entry(batch.stream, first, len(batch), fp, False,
                                                self.hub.clock())  # fmt: skip
            try:
                stored = await storage.append(batch.with_ids(first))
            except IdOrderError:
                continue  # another writer took those ids: a new intent
            await self.ledger.record({"txn": txn, "done": True})
            entry.done = True
            return TxnReceipt(batch.stream, len(batch), stored.first_id, stored.last_id, False)
        raise TidewireError(f"transaction {txn!r}: {batch.stream!r} is too busy (gave up)")

    async def _settle(self, txn: str, entry: _Entry) -> bool:
        """After a crash: did the intent's append happen? (The ids hold its content.)"""
        events: list[Batch] = []
        next_id, left = entry.first, entry.count
        while left > 0:
            got = await self.hub.storage.read(entry.stream, next_id, 8 * 1024 * 1024, left)
            if not got or got[0].first_id != next_id:
                return False
            events += got
            left -= sum(len(b) for b in got)
            next_id = got[-1].last_id + 1
        if any(b.last_id != b.first_id + len(b) - 1 for b in events):
            return False
        happened = all(len(b) for b in events) and _fingerprint_all(events) == entry.fp
        if happened:
            await self.ledger.record({"txn": txn, "done": True})
            entry.done = True
        return happened


def _fingerprint_all(batches: list[Batch]) -> int:
    if len(batches) == 1:
        return fingerprint(batches[0])
    values: list[bytes] = []
    keys: list[bytes | None] = []
    for b in batches:
        values += [b.value(i) for i in range(len(b))]
        keys += [b.key(i) for i in range(len(b))]
    merged = Batch.build(batches[0].stream, values,
                         keys=keys if any(k is not None for k in keys) else None)  # fmt: skip
    return fingerprint(merged)
