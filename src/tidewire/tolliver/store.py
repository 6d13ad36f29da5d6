"""The durable state of a stand-alone Tolliver instance, in one small SQLite file (stdlib
``sqlite3``: a well-kept library for a few tables, where the hub's own instance uses its log).

* The instance's UUIDv7, generated once and kept across restarts (shared/seeds/README.md).
* The outbox: every reliable message this instance sent, with the remotes that have not acked it
  yet; a message is deleted once every one of them has. Ids are u32, never 2**31-1 (which marks
  an unreliable message), taken in turn and wrapping around. Its size (messages, bytes of
  bodies) is counted in memory, from the file at open, so that the instance can bound it.
* What the application has finished with (``Instance(dedupe=True)``): the (sender, id) of the
  latest reliable messages it handled, so that a repeat is dropped after a restart too. Only the
  newest ``keep_seen`` are kept (the table ``seen``, in the order they were handled).

Every change is committed before it returns (``synchronous=FULL``, WAL), so what a caller was
told is stored survives a crash of the process. :meth:`Store.apply` commits many new messages
and acks in one transaction: the instance runs it in a thread of its own (the event loop goes on
meanwhile) and groups what arrives while the previous commit runs. A lock serialises the
store's methods, so they may be called from any thread.

A transaction runs a few statements whatever the number of rows (**decision**, issue 22): rows
go in as multi-row ``INSERT ... VALUES`` of up to :data:`ROWS_PER_STATEMENT` rows and ids as one
JSON array per remote (``json_each``), not ``executemany``. ``sqlite3`` releases the GIL around
every statement step, and ``executemany`` steps once per row: in the committer thread, beside a
busy event loop, each of those releases hands the GIL over and waits to get it back, which made
a commit of about 220 new messages and 220 acks take 4.4 ms (median, ``tolliver_reliable.py``)
against about 2 ms alone. The rows, their order and the transaction are those of before.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import itemgetter

from ..protocols.tolliver import UNRELIABLE

__all__ = ["ROWS_PER_STATEMENT", "Store", "uuid7"]

ROWS_PER_STATEMENT = 128
"""Rows per multi-row ``INSERT`` (4 parameters each: far below SQLite's 32,766)."""


def uuid7(now_ms: int | None = None) -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48 bits of Unix time in ms, version 7, 74 random bits."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (7 << 76)  # version
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # variant 10
    return uuid.UUID(int=value)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY, seq INTEGER NOT NULL,
    channel TEXT NOT NULL, key TEXT NOT NULL, body BLOB NOT NULL, remote BLOB);
CREATE TABLE IF NOT EXISTS pending (
    id INTEGER NOT NULL, remote BLOB NOT NULL, PRIMARY KEY (id, remote)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS seen (
    seq INTEGER PRIMARY KEY, remote BLOB NOT NULL, id INTEGER NOT NULL, UNIQUE (remote, id));
"""


_OUTBOX_INSERTS: dict[tuple[int, int], str] = {}  # (rows, fields) -> its statement
_COLUMNS = ("id", "seq", "channel", "key", "body", "remote")


def _insert_outbox(db: sqlite3.Connection, fields: list[object], width: int) -> None:
    """Rows into the outbox, in order, a few statements in all; ``fields``: each row's
    ``width`` first columns of (id, seq, channel, key, body, remote), one after the other."""
    step = ROWS_PER_STATEMENT * width
    for at in range(0, len(fields), step):
        part = fields[at : at + step]
        rows = len(part) // width
        sql = _OUTBOX_INSERTS.get((rows, width))
        if sql is None:
            values = ", ".join(["(" + ", ".join(["?"] * width) + ")"] * rows)
            sql = _OUTBOX_INSERTS[rows, width] = (
                f"INSERT INTO outbox ({', '.join(_COLUMNS[:width])}) VALUES {values}"
            )
        db.execute(sql, part)


def _inline_remotes(adds: list[tuple[str, str, bytes, list[uuid.UUID]]]) -> list[bytes | None]:
    """Each new message's one remote (its UUID's bytes), or ``None`` if it has several (their
    acks are awaited in ``pending``). Messages sent together share their list of remotes
    (``Instance.send_many``): one ``UUID.bytes`` per run of them."""
    out: list[bytes | None] = []
    last: list[uuid.UUID] | None = None
    value: bytes | None = None
    for add in adds:
        if add[3] is not last:
            last = add[3]
            value = last[0].bytes if len(last) == 1 else None
        out.append(value)
    return out


def _by_remote(pairs: Iterable[tuple[int, uuid.UUID]]) -> dict[bytes, str]:
    """(id, remote) pairs as each remote's ids, a JSON array (for ``json_each``). A run of
    pairs with the same remote object is looked up once (a UUID's hash is Python code: too
    dear once a message, issue 22)."""
    ids: dict[uuid.UUID, list[int]] = {}
    last: uuid.UUID | None = None
    these: list[int] = []
    if isinstance(pairs, list) and pairs and len(set(map(id, map(itemgetter(1), pairs)))) == 1:
        ids[pairs[0][1]] = list(map(itemgetter(0), pairs))  # (one remote object: C loops)
        pairs = ()
    for message_id, remote in pairs:
        if remote is not last:
            these = ids.setdefault(remote, [])
            last = remote
        these.append(message_id)
    for these in ids.values():  # (as binding them one by one would: the transaction fails)
        if max(these) >= 2**63 or min(these) < -(2**63):
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
    return {remote.bytes: json.dumps(these) for remote, these in ids.items()}


def _pending_pairs(
    kept: list[tuple[int, tuple[str, str, bytes, list[uuid.UUID]]]],
) -> list[tuple[int, uuid.UUID]]:
    """(id, remote) for each remote of each new message, in order; messages sent together
    share their list of remotes (``Instance.send_many``): one remote is the common case."""
    pairs: list[tuple[int, uuid.UUID]] = []
    for i, add in kept:
        remotes = add[3]
        if len(remotes) == 1:
            pairs.append((i, remotes[0]))
        else:
            pairs += [(i, remote) for remote in remotes]
    return pairs


class Store:
    """An instance's durable state in one SQLite database: its UUID, the reliable messages kept
    until every remote acks them, and the (sender, id) pairs finished (dedupe)."""

    def __init__(self, db: sqlite3.Connection, *, next_id: int | None = None) -> None:
        """``next_id``: where reliable message ids go on from (kept in the store; default: where
        the store left off). Ids are 32-bit and wrap, so any start works: tests start near the
        wrap-around (2**32) or the unreliable marker (2**31-1) to reach them quickly."""
        self.db = db
        row = db.execute("SELECT value FROM meta WHERE name = 'instance'").fetchone()
        if row is None:
            self.instance = uuid7()
            with db:
                db.execute("INSERT INTO meta VALUES ('instance', ?)", (self.instance.bytes,))
        else:
            self.instance = uuid.UUID(bytes=bytes(row[0]))
        row = db.execute("SELECT value FROM meta WHERE name = 'next_id'").fetchone()
        self._next = int(row[0]) if row is not None else 0
        if next_id is not None:
            if not 0 <= next_id < 2**32:
                raise ValueError(f"next_id must be a 32-bit id, not {next_id}")
            self._next = next_id
        self._last_acked = 0
        count, nbytes, seq = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(body)), 0), COALESCE(MAX(seq), 0) FROM outbox"
        ).fetchone()  # fmt: skip
        self._unacked, self._unacked_bytes = int(count), int(nbytes)
        self._seq = int(seq) + 1  # the next message's place in the outbox (its order)
        # issue 22, round 3: a new file's outbox holds the one remote of a message that has one
        # (``remote``), so its add and its ack touch one row, not two (``pending`` is for
        # messages with several remotes); a file made before keeps ``pending`` for all
        columns = [str(row[1]) for row in db.execute("PRAGMA table_info(outbox)")]
        self._inline = "remote" in columns
        self._shared = int(db.execute("SELECT COUNT(*) FROM outbox" + (  # (rows in pending)
            " WHERE remote IS NULL" if self._inline else "")).fetchone()[0])  # fmt: skip
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str, *, next_id: int | None = None) -> Store:
        """Open (creating it if needed) the store in the SQLite file ``path``; ``next_id`` as in
        the constructor."""
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        return cls(db, next_id=next_id)

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def _take_ids(self, n: int) -> list[int]:
        """``n`` ids in turn, skipping 2**31-1 and those still awaiting acks after a
        wrap-around (one range query per run of ids)."""
        ids: list[int] = []
        looked = 0
        while len(ids) < n:
            if looked > n + 2**16:
                raise RuntimeError("no free reliable message id")
            start = self._next
            end = min(start + n - len(ids), 2**32)
            used = {row[0] for row in self.db.execute(
                "SELECT id FROM outbox WHERE id >= ? AND id < ?", (start, end))}  # fmt: skip
            ids += [i for i in range(start, end) if i != UNRELIABLE and i not in used]
            looked += end - start
            self._next = end % 2**32
        return ids

    def add(self, channel: str, key: str, body: bytes, remotes: Iterable[uuid.UUID]) -> int:
        """Keep a reliable message until every one of ``remotes`` acks it; its id."""
        (message_id,) = self.apply([(channel, key, body, list(remotes))], [])
        return message_id

    def ack(self, message_id: int, remote: uuid.UUID) -> bool:
        """``remote`` acked ``message_id``; whether it was awaited."""
        self.apply([], [(message_id, remote)])
        return self._last_acked > 0

    def apply(
        self,
        adds: list[tuple[str, str, bytes, list[uuid.UUID]]],
        acks: list[tuple[int, uuid.UUID]],
        seen: Sequence[tuple[uuid.UUID, int]] = (),
        keep_seen: int = 100_000,
    ) -> list[int]:
        """Several new messages and acks in one transaction (one fsync: group commit); the
        new messages' ids. ``seen``: (sender, id) of received messages the application has
        finished with, remembered (the newest ``keep_seen``) for :meth:`recent_seen`."""
        with self._lock:
            return self._apply(adds, acks, seen, keep_seen)

    def _apply(
        self,
        adds: list[tuple[str, str, bytes, list[uuid.UUID]]],
        acks: list[tuple[int, uuid.UUID]],
        seen: Sequence[tuple[uuid.UUID, int]] = (),
        keep_seen: int = 100_000,
    ) -> list[int]:
        db = self.db
        self._last_acked = 0
        next_before, seq_before, shared_before = self._next, self._seq, self._shared
        unacked, unacked_bytes = self._unacked, self._unacked_bytes
        db.execute("BEGIN")  # (autocommit mode: the transaction is explicit)
        try:
            ids = self._take_ids(len(adds)) if adds else []
            if all(map(itemgetter(3), adds)):  # (C loops: every message is kept, the rule)
                kept = list(zip(ids, adds, strict=True))
                kept_ids, kept_adds = ids, adds
            else:  # (a message nobody subscribed to is not kept)
                kept = [(i, add) for i, add in zip(ids, adds, strict=True) if add[3]]
                kept_ids, kept_adds = [i for i, _ in kept], [add for _, add in kept]
            if kept:
                bodies = list(map(itemgetter(2), kept_adds))
                self._add_rows(kept, kept_ids, kept_adds, bodies)
                unacked += len(kept)
                unacked_bytes += sum(map(len, bodies))
            if adds:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('next_id', ?)", (self._next,))
            if acks:
                gone, nbytes = self._ack_rows(acks)
                unacked -= gone
                unacked_bytes -= nbytes
            if seen:  # (one seen again moves to the newest place)
                db.executemany("INSERT OR REPLACE INTO seen (remote, id) VALUES (?, ?)",
                               [(sender.bytes, i) for sender, i in seen])  # fmt: skip
                db.execute("DELETE FROM seen WHERE seq <= (SELECT MAX(seq) FROM seen) - ?",
                           (max(0, keep_seen),))  # fmt: skip
            db.execute("COMMIT")
            self._unacked, self._unacked_bytes = unacked, unacked_bytes
        except BaseException:
            self.db.execute("ROLLBACK")
            self._next, self._seq, self._shared = next_before, seq_before, shared_before
            raise
        return ids

    def _add_rows(
        self,
        kept: list[tuple[int, tuple[str, str, bytes, list[uuid.UUID]]]],
        ids: list[int],
        adds: list[tuple[str, str, bytes, list[uuid.UUID]]],
        bodies: list[bytes],
    ) -> None:
        """The outbox rows of new messages (``kept``: (id, add); ``ids``, ``adds`` and
        ``bodies`` their columns), and the ``pending`` rows of those with several remotes (of
        every one, in a file made before the ``remote`` column)."""
        seqs = range(self._seq, self._seq + len(ids))
        self._seq += len(ids)
        columns = [ids, seqs, map(itemgetter(0), adds), map(itemgetter(1), adds), bodies]
        shared = kept
        if self._inline:
            remotes = _inline_remotes(adds)
            columns.append(remotes)
            shared = [(i, add) for i, add in kept if len(add[3]) != 1] if None in remotes else []
        rows = zip(*columns, strict=True)
        _insert_outbox(self.db, list(chain.from_iterable(rows)), len(columns))
        for remote, ids_json in _by_remote(_pending_pairs(shared)).items():
            self.db.execute("INSERT INTO pending SELECT value, ?1 FROM json_each(?2)",
                            (remote, ids_json))  # fmt: skip
        self._shared += len(shared)

    def _ack_rows(self, acks: list[tuple[int, uuid.UUID]]) -> tuple[int, int]:
        """Delete what ``acks`` (id, remote) leave unawaited; ``(messages, bytes of bodies)``
        gone from the outbox. :attr:`_last_acked`: how many acks were awaited."""
        db, gone = self.db, []
        groups = _by_remote(acks)
        if self._inline:  # (a message with one remote: its row, no pending row)
            for remote, ids_json in groups.items():
                rows = db.execute(
                    "DELETE FROM outbox WHERE remote = ?1 AND id IN "
                    "(SELECT value FROM json_each(?2)) RETURNING LENGTH(body)", (remote, ids_json),
                ).fetchall()  # fmt: skip
                self._last_acked += len(rows)
                gone += rows
        if self._shared:  # (messages with several remotes, or all in a file made before)
            for remote, ids_json in groups.items():
                cursor = db.execute(
                    "DELETE FROM pending WHERE remote = ?1 AND id IN "
                    "(SELECT value FROM json_each(?2))", (remote, ids_json),
                )  # fmt: skip
                self._last_acked += max(0, cursor.rowcount)
            rows = db.execute(
                "DELETE FROM outbox WHERE id IN (SELECT value FROM json_each(?)) AND NOT "
                "EXISTS (SELECT 1 FROM pending WHERE pending.id = outbox.id) "
                + ("AND remote IS NULL " if self._inline else "")
                + "RETURNING LENGTH(body)", (json.dumps(sorted(set(map(itemgetter(0), acks)))),),
            ).fetchall()  # fmt: skip
            self._shared -= len(rows)
            gone += rows
        return len(gone), sum(int(n) for (n,) in gone)

    def pending_for(self, remote: uuid.UUID) -> list[tuple[int, str, str, bytes]]:
        """The messages ``remote`` has not acked, oldest first (to resend on reconnect)."""
        shared = ("SELECT o.id, o.channel, o.key, o.body, o.seq FROM outbox o JOIN pending p "
                  "ON o.id = p.id WHERE p.remote = ?1")  # fmt: skip
        if self._inline:  # (and those whose one remote it is)
            shared += " UNION ALL SELECT id, channel, key, body, seq FROM outbox WHERE remote = ?1"
        with self._lock:
            rows = self.db.execute(shared + " ORDER BY 5", (remote.bytes,)).fetchall()
        return [(int(i), str(c), str(k), bytes(b)) for i, c, k, b, _ in rows]

    def recent_seen(self, limit: int) -> list[tuple[uuid.UUID, int]]:
        """The (sender, id) of the last ``limit`` messages recorded as handled, oldest first."""
        with self._lock:
            rows = self.db.execute("SELECT remote, id FROM seen ORDER BY seq DESC LIMIT ?",
                                   (max(0, limit),)).fetchall()  # fmt: skip
        return [(uuid.UUID(bytes=bytes(r)), int(i)) for r, i in reversed(rows)]

    def unacked(self) -> int:
        """Messages kept until some remote acks them (counted in memory: no query)."""
        return self._unacked

    def unacked_bytes(self) -> int:
        """The bytes of their bodies (counted in memory: no query)."""
        return self._unacked_bytes
