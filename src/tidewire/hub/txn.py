"""Exactly-once appends: a batch appended under a transaction id is stored once (for as long
as its events are retained: see below).

Spark's sinks replay a micro-batch after a failure; so may any client that lost the answer to an
append. :meth:`Transactions.commit` makes such an append idempotent. A transaction is named by
its **key**: the principal that commits it, the stream it goes to, and its id (the client's
string). Two principals, or two streams, never share a transaction: a writer that reuses
another principal's id learns nothing of it (not its stream, not its count), cannot block it,
and its data is never taken for the other's "already done" (issue 20). The hub keeps its own
stream, ``_tidewire.txns``, of JSON records:

* ``{"txn": T, "stream": S, "principal": P, "first": F, "count": N, "fp": X}``: the *intent*,
  written (and fsynced) before the data: ``P``'s transaction ``T`` puts ``N`` events into ``S``
  as ids ``F .. F+N-1``, and their content has the fingerprint ``X`` (CRC-32C of the values,
  value lengths, key flags and keys; timestamps are left out, since a replay may stamp them
  anew);
* ``{"txn": T, "stream": S, "principal": P, "done": true}``: written once the data is durable.

**Records written before transactions had keys** (no ``"principal"``; a ``done`` record with
only ``"txn"``) load compatibly: their ``done`` marks the latest intent of that ``txn``, as it
always did, and such an entry belongs to *no* principal, so it matches a commit of the same
stream and id by *any* principal. A replay after an upgrade (the Spark sink's, under whatever
token it uses) thus still finds its transaction done and appends nothing; a principal that
could exploit this must be allowed to write that very stream, and learns only the ids already
there. New commits always write keyed records; the old entries age out with retention like
any other.

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

__all__ = ["TXN_STREAM", "Transactions", "TxnKey", "TxnReceipt", "fingerprint"]

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


TxnKey = tuple[str | None, str, str]
"""(principal, stream, transaction id); principal ``None``: a record from before keys, which
matches any principal (module docstring)."""


@dataclass(slots=True)
class _Entry:
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
        self._entries: dict[TxnKey, _Entry] = {}
        self._locks: dict[TxnKey, tuple[asyncio.Lock, list[int]]] = {}  # per key: lock, users
        self._stream_locks: dict[str, asyncio.Lock] = {}
        self._legacy: dict[str, TxnKey] = {}  # at load: a keyless done record's intent

    def load(self) -> None:
        """Rebuild the registry from ``_tidewire.txns`` (at hub open), then forget what
        retention removed meanwhile."""
        now = self.hub.clock()
        for record in self.ledger.load():
            self._apply(record, now)
        self._legacy.clear()
        self.forget_removed(now)

    def _apply(self, record: dict[str, Any], now: int) -> None:
        try:
            txn = record["txn"]
            if not isinstance(txn, str):
                raise TypeError(f"txn {txn!r} is not a string")
            if record.get("done"):
                if "stream" in record:
                    entry = self._entries.get(_key(record.get("principal"), record["stream"], txn))
                else:  # (before keys: the latest intent of that id)
                    legacy = self._legacy.get(txn)
                    entry = None if legacy is None else self._entries.get(legacy)
                if entry is not None:
                    entry.done = True
                return
            key = _key(record.get("principal"), record["stream"], txn)
            self._entries[key] = _Entry(int(record["first"]), int(record["count"]),
                                        int(record["fp"]), False, now)  # fmt: skip
            if key[0] is None:
                self._legacy[txn] = key
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
        for key, entry in self._entries.items():
            if not entry.done or key in self._locks:
                continue
            stream = key[1]
            start = starts.get(stream)
            if start is None:
                start = starts[stream] = storage.start_id(stream)
            if entry.last < start or (cutoff is not None and entry.at < cutoff):
                gone.append(key)
        for key in gone:
            del self._entries[key]
        return len(gone)

    async def commit(self, txn: str, batch: Batch, *,
                     principal: str = "anonymous") -> TxnReceipt:  # fmt: skip
        """Append ``batch`` (its ids are ignored) unless ``principal`` committed ``txn`` to
        ``batch.stream`` before; return where its events are either way. Another principal's
        transaction of the same id, or this one's into another stream, is another
        transaction."""
        if not txn or len(txn.encode()) > MAX_TXN_BYTES:
            raise TidewireError(f"a transaction id is 1..{MAX_TXN_BYTES} bytes")
        # Shielded: a caller that goes away (its connection dropped) does not stop a commit
        # half-way; a retry of the same transaction waits for it, then finds it done.
        return await asyncio.shield(self._locked_commit(_key(principal, batch.stream, txn), batch))

    async def _locked_commit(self, key: TxnKey, batch: Batch) -> TxnReceipt:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock, self._stream_locks.setdefault(batch.stream, asyncio.Lock()):
                return await self._commit(key, batch)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]

    def _find(self, key: TxnKey) -> tuple[TxnKey, _Entry] | None:
        """The entry of ``key``, else one from before keys for the same stream and id."""
        entry = self._entries.get(key)
        if entry is not None:
            return key, entry
        legacy = (None, key[1], key[2])
        entry = self._entries.get(legacy)
        return None if entry is None else (legacy, entry)

    async def _commit(self, key: TxnKey, batch: Batch) -> TxnReceipt:
        _, stream, txn = key
        found = self._find(key)
        if found is not None:
            known, entry = found
            if entry.done or await self._settle(known, entry):
                if entry.count != len(batch):
                    raise TidewireError(f"transaction {txn!r} was committed to {stream!r} with "
                                        f"{entry.count} event(s), not {len(batch)}")  # fmt: skip
                return TxnReceipt(stream, entry.count, entry.first, entry.last, already=True)
            if known != key:  # an old intent that did not happen: this commit is keyed
                del self._entries[known]
        fp = fingerprint(batch)
        storage = self.hub.storage
        for attempt in range(RETRIES):
            # Other writers may take ids while the intent is written: after a collision, leave
            # them room (ids may have gaps), more each time.
            slack = 0 if attempt == 0 else 2 ** (attempt + 5)
            first = storage.accepted_latest(stream) + 1 + slack
            intent = {"txn": txn, "stream": stream, "principal": key[0], "first": first,
                      "count": len(batch), "fp": fp}  # fmt: skip
            await self.ledger.record(intent)
            self._entries[key] = entry = _Entry(first, len(batch), fp, False, self.hub.clock())
            try:
                stored = await storage.append(batch.with_ids(first))
            except IdOrderError:
                continue  # another writer took those ids: a new intent
            await self.ledger.record(_done(key))
            entry.done = True
            return TxnReceipt(stream, len(batch), stored.first_id, stored.last_id, False)
        raise TidewireError(f"transaction {txn!r}: {stream!r} is too busy (gave up)")

    async def _settle(self, key: TxnKey, entry: _Entry) -> bool:
        """After a crash: did the intent's append happen? (The ids hold its content.)"""
        events: list[Batch] = []
        next_id, left = entry.first, entry.count
        while left > 0:
            got = await self.hub.storage.read(key[1], next_id, 8 * 1024 * 1024, left)
            if not got or got[0].first_id != next_id:
                return False
            events += got
            left -= sum(len(b) for b in got)
            next_id = got[-1].last_id + 1
        if any(b.last_id != b.first_id + len(b) - 1 for b in events):
            return False
        happened = all(len(b) for b in events) and _fingerprint_all(events) == entry.fp
        if happened:
            await self.ledger.record(_done(key))
            entry.done = True
        return happened


def _key(principal: object, stream: object, txn: str) -> TxnKey:
    """A record's key (interned: many entries share a principal and a stream)."""
    if not isinstance(stream, str) or not (principal is None or isinstance(principal, str)):
        raise TypeError(f"stream {stream!r} or principal {principal!r} is not a string")
    return (None if principal is None else sys.intern(principal), sys.intern(stream), txn)


def _done(key: TxnKey) -> dict[str, Any]:
    principal, stream, txn = key
    record: dict[str, Any] = {"txn": txn, "stream": stream, "done": True}
    if principal is not None:  # (an old entry stays keyless: it matches as before on reload)
        record["principal"] = principal
    return record


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
