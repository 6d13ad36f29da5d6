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
wider at each retry. Commits into one stream run one at a time on one hub (they would only
collide), and a commit runs to its end even if its caller goes away, so a retry waits for it
and finds it done. A commit of a known transaction returns the ids it got the first time and
appends nothing.

**Several gateways** (cluster mode: hubs sharing one storage, docs/cluster.md "Transactions and
the hub's state with several gateways"). Each gateway folds the ledger into its memory, and
another may commit the same key at the same moment, or die half-way. One code path serves one
hub and many:

1. A commit of a key not known here as done first **catches up** the ledger
   (:meth:`~.ledger.Ledger.catch_up`; on one hub: one empty read).
2. It **settles** the key's latest intent ``E`` if not done: reading ids ``E.first..`` of
   ``S`` tells DONE (an intent of the key at ``E.first`` is stored there: its content, by
   fingerprint), DEAD (something else is stored at or above ``E.first``: committed ids never
   change, so no intent at ``E.first`` can land any more) or OPEN (nothing committed at or
   above ``E.first`` yet).
3. DONE: answer its ids (``already``). OPEN with the same content: **append at ``E``'s ids**,
   under no new intent (completing ``E``, whoever wrote it). OPEN with other content: a
   **rival** intent at the same ``E.first``. DEAD, or no intent: a fresh intent at
   ``max(accepted latest, highest id read) + 1`` (+ a gap after collisions).
4. Every intent is written with :meth:`~.ledger.Ledger.record_exclusive` (a compare-and-swap
   on the ledger: refused if anything was recorded since this gateway last caught up), after
   checking that the decision was made on the registry as it still is; a refusal, of the
   intent or of the data (``IdOrderError``), goes back to 1.

*Why a transaction is stored at most once.* Invariant: **all the live intents of a key (those
that may still land) start at the same id.** A fresh intent is written only when every earlier
intent of the key is DEAD or absent, by a writer that saw all of them (the exclusive write
fails otherwise; DEAD is for ever, so by induction checking the latest intent and its rivals
is enough); a rival is written at the live intents' id. Own-id appends are conditional
(the storage refuses ids not above the stream's latest, whoever wrote it), so at most one batch
ever lands at that id: at most one intent of the key lands, once. Data is appended only under
an intent of its key (its own, or the one it completes), so no other copy exists.

*Why it is stored at least once, and answered the first ids.* A dead gateway leaves at most an
intent (and maybe its data): the next commit of the key through any gateway settles it: the
data there is DONE (its ids answered), an OPEN intent is completed at its own ids (same
content: the ids the first commit would have answered), a DEAD one gives way. A settled
outcome is recorded (a ``done`` record; with rivals it names the fingerprint, ``"fp"``, since
the count and ids alone do not say which of them landed); a gateway reading a ``done`` that
is ambiguous to it simply settles again by reading. The registry is folded in ledger order by
ledger id, so a gateway reading its own records again (they landed after another's) ends
where it was. (An unsettled intent from before keys, whose writer predates clusters, is taken
as dead unless its data is there, as before.)

What a storage must give for this (the embedded log and JetStream both do): own-id appends
refused unless above the stream's latest id, whoever appended it; appends of one stream
landing in order; and a read, after a refusal, seeing what caused it (committed data is what
DEAD is judged on; an append still in flight is waited for, :func:`~.ledger.past`).

The registry is in memory, rebuilt from the stream (a :class:`~.ledger.Ledger`) when the hub
opens and caught up as above; the stream is subject to retention like any other (its default
is to keep everything).
Spark replays only a query's last micro-batch, so a retention of days is plenty.

**How long a transaction id is remembered** (what keeps the registry bounded; Kafka's
``transactional.id.expiration.ms`` is the model): as long as its events are retained. Once
retention has removed *all* of a transaction's events, its entry is forgotten (at the next
retention pass, or when the hub reopens): a replay of it then appends anew, which nobody could
tell apart from a first commit anyway, since the events it would be compared with are gone.
With ``txn_expiration_ms`` (setting ``txn.expiration_ms``, default -1: never) an entry is also
forgotten that long after its commit (or after the hub reopened, for entries loaded then),
whatever the data's retention. An entry costs about 150 bytes of memory. Each gateway forgets
by its own clock and retention passes: a key one gateway forgot is a new transaction there.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..model import Batch, IdOrderError, TidewireError
from .fingerprint import Fingerprint, fingerprint
from .ledger import past
from .staging import STAGING_TTL_MS, Content, NamedPart, Staging, StagingArea
from .storage import StagesParts

if TYPE_CHECKING:
    from .hub import Hub

__all__ = [
    "STAGING_TTL_MS", "TXN_STREAM", "Content", "Transactions", "TxnKey", "TxnReceipt",
    "fingerprint",
]

log = logging.getLogger("tidewire.hub")

TXN_STREAM = "_tidewire.txns"
MAX_TXN_BYTES = 1024
RETRIES = 16  # collisions with other writers' ids (each leaves a wider gap) before giving up
TRIES = 256  # decisions (each after a catch-up) before giving up: see _commit


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


@dataclass(slots=True, eq=False)
class _Entry:
    first: int
    count: int
    fp: int
    done: bool
    at: int  # ms, the hub's clock: when committed (or loaded): for the age bound
    seq: int = 0  # the ledger id of the last record folded into it
    rivals: tuple[tuple[int, int], ...] = ()  # (count, fp): other live intents at ``first``

    @property
    def last(self) -> int:
        return self.first + self.count - 1


class _Outcome(Enum):
    OPEN = "open"  # nothing stored at or above the intent's first id yet: it may still land
    DONE = "done"  # one of the key's intents at that id is stored there
    DEAD = "dead"  # something else is stored there: none of them can ever land


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
        storage = hub.storage
        self.staging: StagingArea | None = (storage.staging_area()
                                            if isinstance(storage, StagesParts) else None)
        """Staged parts (:mod:`.staging`): the storage's (files in the embedded log's data
        directory, a JetStream stream in cluster mode); ``None`` where it keeps none."""

    @property
    def staging_ttl_ms(self) -> int:
        """Staged parts untouched this long are dropped (setting ``txn.staging_ttl_ms``)."""
        return self.staging.ttl_ms if self.staging is not None else STAGING_TTL_MS

    @staging_ttl_ms.setter
    def staging_ttl_ms(self, value: int) -> None:
        if self.staging is not None:
            self.staging.ttl_ms = value

    def load(self) -> None:
        """Rebuild the registry from ``_tidewire.txns`` (at hub open), then forget what
        retention removed meanwhile."""
        now = self.hub.clock()
        for seq, record in self.ledger.load_numbered():
            self._apply(record, now, seq)
        self._legacy.clear()
        self.forget_removed(now)
        if isinstance(self.staging, Staging) and not getattr(getattr(self.hub.storage, "log",
                                                                     None), "read_only", False):
            self.staging.remove_partial()

    async def catch_up(self) -> int:
        """Fold in what other gateways (or this hub, out of order) recorded since the last
        record seen; how many records."""
        now = self.hub.clock()
        records = await self.ledger.catch_up_numbered()
        for seq, record in records:
            self._apply(record, now, seq)
        return len(records)

    def _apply(self, record: dict[str, Any], now: int, seq: int) -> None:
        """Fold in one record, ``seq`` its id in the ledger. Idempotent, and a record older
        than what an entry holds changes nothing: a gateway reading its own records again
        (they landed after another's) ends where it was."""
        try:
            if "forget_stream" in record:  # (the stream was deleted: its ids start again)
                self._forget_stream(str(record["forget_stream"]), seq)
                return
            txn = record["txn"]
            if not isinstance(txn, str):
                raise TypeError(f"txn {txn!r} is not a string")
            if record.get("done"):
                if "stream" in record:
                    entry = self._entries.get(_key(record.get("principal"), record["stream"], txn))
                else:  # (before keys: the latest intent of that id)
                    legacy = self._legacy.get(txn)
                    entry = None if legacy is None else self._entries.get(legacy)
                if entry is not None and seq > entry.seq:
                    fp = record.get("fp")
                    _settle_entry(entry, None if fp is None else int(fp), seq)
                return
            key = _key(record.get("principal"), record["stream"], txn)
            first, count, fp = int(record["first"]), int(record["count"]), int(record["fp"])
            old = self._entries.get(key)
            if old is not None and seq <= old.seq:
                return  # (folded already)
            rivals: tuple[tuple[int, int], ...] = ()
            if old is not None and not old.done and old.first == first:  # (module docstring)
                rivals = tuple(c for c in ((old.count, old.fp), *old.rivals) if c != (count, fp))
            self._entries[key] = _Entry(first, count, fp, False, now, seq, rivals)
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
        if self.staging is not None:  # (staged parts nobody committed or aborted)
            self.staging.sweep(now, list(self._locks))
        return len(gone)

    async def commit_staged(
        self, txn: str, stream: str, parts: Sequence[NamedPart], *,
        principal: str = "anonymous", via: str = "api",
    ) -> TxnReceipt:  # fmt: skip
        """Append the staged ``parts`` of ``principal``'s transaction ``txn`` into ``stream``,
        in the order named, exactly once (:meth:`commit`, whose ledger protocol it uses: the
        data of the named parts is one batch, one intent, one append), then drop every staged
        part of that key. A transaction committed before answers its ids and appends nothing
        (a replay; its parts are dropped). A named part not staged, or holding other rows
        than named (count, fingerprint): :class:`~.staging.TxnPartMissing` (stage it again).
        Empty ``parts`` or parts of no event: a receipt of count 0."""
        staging = self.staging
        if staging is None:
            raise TidewireError("this hub's storage keeps no staged parts")
        if not txn or len(txn.encode()) > MAX_TXN_BYTES:
            raise TidewireError(f"a transaction id is 1..{MAX_TXN_BYTES} bytes")
        key = _key(principal, stream, txn)
        count = sum(p.count for p in parts)
        found = self._find(key)
        if found is None or not found[1].done:
            await self.catch_up()
            found = self._find(key)
        if found is not None and found[1].done:  # a replay: nothing to read
            await staging.drop(principal, stream, txn)
            return _already(found[1], stream, txn, count)
        if not count:
            await staging.drop(principal, stream, txn)
            return TxnReceipt(stream, 0, 0, 0, already=False)
        # (a running commit of the key is waited for in commit_content, which then answers
        # DONE; the parts are read, and checked, first)
        content = await staging.content(principal, stream, txn, parts)
        receipt = await self.hub.commit_content(txn, stream, content, content.nbytes, via=via,
                                                principal=principal)  # fmt: skip
        await staging.drop(principal, stream, txn)
        return receipt

    async def abort_staged(self, txn: str, stream: str, *, principal: str = "anonymous") -> bool:
        """Drop the staged parts of that key unless a commit of it is running; whether any
        were dropped (nothing is appended, a committed transaction stays committed)."""
        key = _key(principal, stream, txn)
        if self.staging is None or key in self._locks:
            return False
        return await self.staging.drop(principal, stream, txn)

    def staged_bytes(self) -> int:
        """Bytes of staged parts waiting for a commit or an abort (0 without staging)."""
        return 0 if self.staging is None else self.staging.staged_bytes()

    async def forget_stream(self, stream: str) -> int:
        """Forget every transaction of ``stream`` (about to be deleted: a stream made again
        under its name reuses its ids), durably: a ledger record that reloads fold in too."""
        seq = await self.ledger.record({"forget_stream": stream})
        return self._forget_stream(stream, seq)

    def _forget_stream(self, stream: str, seq: int) -> int:
        gone = [k for k, e in self._entries.items() if k[1] == stream and e.seq < seq]
        for key in gone:
            del self._entries[key]
        return len(gone)

    async def commit(self, txn: str, batch: Batch, *,
                     principal: str = "anonymous") -> TxnReceipt:  # fmt: skip
        """Append ``batch`` (its ids are ignored) unless ``principal`` committed ``txn`` to
        ``batch.stream`` before; return where its events are either way. Another principal's
        transaction of the same id, or this one's into another stream, is another
        transaction."""
        storage = self.hub.storage

        async def append(first: int) -> tuple[int, int]:
            stored = await storage.append(batch.with_ids(first))
            return stored.first_id, stored.last_id

        return await self.commit_content(txn, batch.stream, Content(len(batch), fingerprint(batch),
                                                                    append), principal=principal)

    async def commit_content(self, txn: str, stream: str, content: Content, *,
                             principal: str = "anonymous") -> TxnReceipt:  # fmt: skip
        """:meth:`commit` of any :class:`Content`."""
        if not txn or len(txn.encode()) > MAX_TXN_BYTES:
            raise TidewireError(f"a transaction id is 1..{MAX_TXN_BYTES} bytes")
        # Shielded: a caller that goes away (its connection dropped) does not stop a commit
        # half-way; a retry of the same transaction waits for it, then finds it done.
        return await asyncio.shield(self._locked_commit(_key(principal, stream, txn), content))

    async def _locked_commit(self, key: TxnKey, content: Content) -> TxnReceipt:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock, self._stream_locks.setdefault(key[1], asyncio.Lock()):
                return await self._commit(key, content)
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

    async def _commit(self, key: TxnKey, content: Content) -> TxnReceipt:
        """One decision per turn (module docstring, "Several gateways"): catch up unless the
        key is known done; settle its live intent; then complete that intent (same content),
        or write an intent at its first id (other content), or a fresh intent (none live),
        the last two only with :meth:`~.ledger.Ledger.record_exclusive`; append the data at
        the intent's ids; a refusal of either starts the next turn."""
        _, stream, txn = key
        fp, count = content.fp, content.count
        storage = self.hub.storage
        collisions = 0
        for _ in range(TRIES):
            found = self._find(key)
            if found is None or not found[1].done:
                await self.catch_up()
                found = self._find(key)
            outcome, seen = _Outcome.DEAD, 0
            if found is not None:
                known, entry = found
                if not entry.done:
                    outcome, seen = await self._settle(known, entry)
                if entry.done:
                    return _already(entry, stream, txn, count)
                if self._find(key) != found:
                    continue  # (a catch-up meanwhile brought a newer intent: decide again)
                if known != key:  # an old intent that did not happen: now keyed (its
                    del self._entries[known]  # writer, from before clusters, is gone)
                    outcome = _Outcome.DEAD
            target = key  # whose intent the data completes
            if outcome is _Outcome.OPEN and found is not None and (
                (found[1].count, found[1].fp) == (count, fp)
            ):
                target, first = found[0], found[1].first  # the same: complete that intent
            else:
                if outcome is _Outcome.OPEN and found is not None:
                    first = found[1].first  # a rival: whichever lands first is the one
                else:  # after a collision, leave other writers room (ids may have gaps)
                    slack = 0 if collisions == 0 else 2 ** (collisions + 5)
                    first = max(storage.accepted_latest(stream), seen) + 1 + slack
                intent = {"txn": txn, "stream": stream, "principal": key[0], "first": first,
                          "count": count, "fp": fp}  # fmt: skip
                try:  # (no await since the registry was last looked at: the decision stands)
                    seq = await self.ledger.record_exclusive(intent)
                except IdOrderError:
                    continue  # someone recorded something: catch up, decide again
                self._apply(intent, self.hub.clock(), seq)
            try:
                first_id, last_id = await content.append(first)
            except IdOrderError:
                collisions += 1
                if collisions > RETRIES:
                    break
                continue  # another writer took those ids: the next turn settles them
            if (done := self._entries.get(target)) is not None:
                await self._record_done(target, done, fp)
            return TxnReceipt(stream, count, first_id, last_id, False)
        raise TidewireError(f"transaction {txn!r}: {stream!r} is too busy (gave up)")

    async def _settle(self, key: TxnKey, entry: _Entry) -> tuple[_Outcome, int]:
        """Whether the key's live intents at ``entry.first`` landed (:attr:`_Outcome.DONE`:
        the entry is done, recorded so), cannot any more (``DEAD``) or may yet (``OPEN``);
        and the highest id seen at or above it."""
        storage, stream = self.hub.storage, key[1]
        candidates = [(entry.count, entry.fp), *entry.rivals]
        counts = {c for c, _ in candidates}
        fps, seen = await self._run(stream, entry.first, counts)
        if seen == 0 and storage.accepted_latest(stream) >= entry.first:
            await past(storage, stream, entry.first - 1)  # (in flight there: its outcome)
            fps, seen = await self._run(stream, entry.first, counts)
        if seen == 0:
            return _Outcome.OPEN, 0
        for count, fp in candidates:
            if fps.get(count) == fp:
                if not entry.done:
                    entry.count, entry.fp = count, fp
                    await self._record_done(key, entry, fp)
                return _Outcome.DONE, seen
        return _Outcome.DEAD, seen

    async def _run(self, stream: str, first: int,
                   counts: set[int]) -> tuple[dict[int, int], int]:  # fmt: skip
        """The fingerprint of the first ``c`` events at ids ``first``, ``first + 1``, ... (no
        gap) for each ``c`` of ``counts`` that many are stored, and the highest id read (0:
        nothing stored at or above ``first``). Read a chunk at a time: a transaction of any
        size is fingerprinted with one read's batches in memory."""
        sums = {c: Fingerprint() for c in counts}
        next_id, read, seen, left = first, 0, 0, max(counts)
        while left > 0:
            got = await self.hub.storage.read(stream, next_id, 8 * 1024 * 1024, left)
            if not got:
                break
            seen = max(seen, got[-1].last_id)
            for b in got:
                if b.first_id != next_id or b.last_id != b.first_id + len(b) - 1 or not len(b):
                    left = 0
                    break
                for c, acc in sums.items():
                    if read < c:
                        acc.add(b if read + len(b) <= c else b.slice(0, c - read))
                read += len(b)
                left -= len(b)
                next_id = b.last_id + 1
        return {c: acc.value() for c, acc in sums.items() if acc.count == c}, seen

    async def _record_done(self, key: TxnKey, entry: _Entry, fp: int) -> None:
        """Record that ``key``'s intent of fingerprint ``fp`` is stored, and fold it in."""
        record = _done(key)
        if entry.rivals:  # (which of them: others cannot tell otherwise)
            record["fp"] = fp
        seq = await self.ledger.record(record)
        if self._entries.get(key) is entry:
            _settle_entry(entry, fp, seq)


def _settle_entry(entry: _Entry, fp: int | None, seq: int) -> None:
    """A done record (ledger id ``seq``): for the intent of fingerprint ``fp``, else the only
    one (with rivals and no ``fp`` it is left for a commit to settle by reading)."""
    if fp is None and entry.rivals:
        return
    if fp is not None and fp != entry.fp:
        chosen = [c for c in entry.rivals if c[1] == fp]
        if not chosen:
            return
        entry.count = chosen[0][0]
        entry.fp = fp
    entry.rivals = ()
    entry.done = True
    entry.seq = seq


def _already(entry: _Entry, stream: str, txn: str, count: int) -> TxnReceipt:
    if entry.count != count:
        raise TidewireError(f"transaction {txn!r} was committed to {stream!r} with "
                            f"{entry.count} event(s), not {count}")  # fmt: skip
    return TxnReceipt(stream, entry.count, entry.first, entry.last, already=True)


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
