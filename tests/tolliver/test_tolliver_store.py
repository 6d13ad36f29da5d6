"""The stand-alone Tolliver instance's store: its UUIDv7 kept across restarts, reliable
messages kept (on disk) until every subscribed remote acked them, ids never 2**31-1."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

from tidewire.protocols.tolliver import UNRELIABLE
from tidewire.tolliver import Store, uuid7
from tidewire.tolliver.store import ROWS_PER_STATEMENT


def test_uuid7_layout() -> None:
    u = uuid7(now_ms=0x0123456789AB)
    assert u.version == 7
    assert u.variant == uuid.RFC_4122
    assert u.int >> 80 == 0x0123456789AB
    assert uuid7() != uuid7()


def test_the_instance_uuid_is_generated_once_and_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "t.db")
    store = Store.open(path)
    first = store.instance
    assert first.version == 7
    store.close()
    store = Store.open(path)
    assert store.instance == first
    store.close()
    assert Store.open(str(tmp_path / "other.db")).instance != first


def test_messages_are_kept_until_every_remote_acked_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "t.db")
    a, b = uuid7(), uuid7()
    store = Store.open(path)
    m1 = store.add("orders", "k", b"one", [a, b])
    m2 = store.add("orders", "", b"two", [a])
    none = store.add("orders", "", b"nobody", [])
    assert len({m1, m2, none}) == 3
    assert store.unacked() == 2
    store.close()
    store = Store.open(path)  # a restart: the unacked messages and the id counter are kept
    assert store.pending_for(a) == [(m1, "orders", "k", b"one"), (m2, "orders", "", b"two")]
    assert store.pending_for(b) == [(m1, "orders", "k", b"one")]
    assert store.ack(m1, a)
    assert not store.ack(m1, a)  # already acked
    assert not store.ack(12345, a)  # never sent
    assert store.unacked() == 2
    assert store.ack(m1, b)
    assert store.unacked() == 1
    assert store.pending_for(b) == []
    assert store.add("x", "", b"three", [a]) not in (m1, m2, none)
    store.close()


def test_ids_skip_the_unreliable_marker_and_wrap(tmp_path: Path) -> None:
    path = str(tmp_path / "t.db")
    store = Store.open(path, next_id=UNRELIABLE - 1)
    a = uuid7()
    ids = [store.add("c", "", b"x", [a]) for _ in range(3)]
    assert ids == [UNRELIABLE - 1, UNRELIABLE + 1, UNRELIABLE + 2]
    store.close()
    store = Store.open(path, next_id=2**32 - 1)
    assert [store.add("c", "", b"y", [a]) for _ in range(2)] == [2**32 - 1, 0]
    store.close()
    store = Store.open(path)  # the store kept where the ids went on from
    assert store.add("c", "", b"z", [a]) == 1
    store.close()


# The schema of the first release (git history): outbox.seq AUTOINCREMENT, pending with a rowid.
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id INTEGER NOT NULL UNIQUE,
    channel TEXT NOT NULL, key TEXT NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS pending (
    id INTEGER NOT NULL, remote BLOB NOT NULL, PRIMARY KEY (id, remote));
"""


def test_a_file_with_the_old_schema_opens_as_it_is_and_works(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    instance, a, b = uuid7(), uuid7(), uuid7()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(OLD_SCHEMA)
    with db:
        db.execute("INSERT INTO meta VALUES ('instance', ?)", (instance.bytes,))
        db.execute("INSERT INTO meta VALUES ('next_id', ?)", (10,))
        db.executemany(
            "INSERT INTO outbox (id, channel, key, body) VALUES (?, ?, ?, ?)",
            [(7, "c", "", b"seven"), (9, "c", "k", b"nine"), (8, "d", "", b"eight")],
        )
        db.executemany(
            "INSERT INTO pending VALUES (?, ?)",
            [(7, a.bytes), (9, a.bytes), (9, b.bytes), (8, b.bytes)],
        )
    db.close()

    def count(store: Store) -> int:
        return int(store.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    store = Store.open(path)
    assert store.instance == instance
    assert store.unacked() == count(store) == 3
    seven, eight, nine = (7, "c", "", b"seven"), (8, "d", "", b"eight"), (9, "c", "k", b"nine")
    assert store.pending_for(a) == [seven, nine]
    assert store.pending_for(b) == [nine, eight]  # in the order stored, not by id
    ids = store.apply([("c", "", b"ten", [a, b]), ("e", "", b"eleven", [b])], [(7, a), (9, b)])
    assert ids == [10, 11]  # the stored counter goes on
    assert store.unacked() == count(store) == 4
    assert store.ack(9, a)
    assert store.unacked() == count(store) == 3
    store.close()
    db = sqlite3.connect(path)
    tables = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    db.close()
    assert "AUTOINCREMENT" in tables["outbox"]  # kept as it was
    assert "WITHOUT ROWID" not in tables["pending"]
    store = Store.open(path)
    assert store.unacked() == count(store) == 3
    ten, eleven = (10, "c", "", b"ten"), (11, "e", "", b"eleven")
    assert store.pending_for(a) == [ten]
    assert store.pending_for(b) == [eight, ten, eleven]
    assert store.add("c", "", b"twelve", [a]) == 12
    store.apply([], [(10, a), (10, b), (8, b), (11, b), (12, a)])
    assert store.unacked() == count(store) == 0
    store.close()


def test_a_new_file_has_the_new_schema(tmp_path: Path) -> None:
    path = str(tmp_path / "new.db")
    Store.open(path).close()
    db = sqlite3.connect(path)
    tables = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    indexes = [name for (name,) in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'outbox'")]  # fmt: skip
    db.close()
    assert "AUTOINCREMENT" not in tables["outbox"]
    assert "WITHOUT ROWID" in tables["pending"]
    # issue 22, round 3: the outbox is keyed by the message's id (one B-tree a row, no index)
    assert "id INTEGER PRIMARY KEY" in tables["outbox"]
    assert indexes == []


# The schema of issue 22's second session: outbox keyed by seq, with a unique index on id.
SEQ_KEYED_OUTBOX = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY, id INTEGER NOT NULL UNIQUE,
    channel TEXT NOT NULL, key TEXT NOT NULL, body BLOB NOT NULL);
"""


def test_a_file_whose_outbox_is_keyed_by_seq_opens_as_it_is_and_works(tmp_path: Path) -> None:
    """The order of the outbox (``pending_for``) goes on after the rows it had, ids wrap and
    acks delete, whichever column the table is keyed by."""
    path = str(tmp_path / "seq.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(SEQ_KEYED_OUTBOX)
    db.close()
    a = uuid7()
    store = Store.open(path, next_id=2**32 - 2)
    ids = store.apply([("c", "", b"one", [a]), ("c", "", b"two", [a]), ("c", "", b"3", [a])], [])
    assert ids == [2**32 - 2, 2**32 - 1, 0]  # (wrapped: order by seq, not by id)
    store.close()
    store = Store.open(path)
    assert store.unacked() == 3
    assert store.unacked_bytes() == 7
    assert store.add("c", "k", b"four", [a]) == 1
    expected = [(2**32 - 2, "c", "", b"one"), (2**32 - 1, "c", "", b"two"), (0, "c", "", b"3"),
                (1, "c", "k", b"four")]  # fmt: skip
    assert store.pending_for(a) == expected
    store.apply([], [(2**32 - 1, a), (0, a)])
    assert store.pending_for(a) == [expected[0], expected[3]]
    assert store.unacked() == 2
    assert store.unacked_bytes() == 7
    store.close()
    db = sqlite3.connect(path)
    tables = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    db.close()
    assert "seq INTEGER PRIMARY KEY" in tables["outbox"]  # kept as it was


def test_the_order_of_the_outbox_survives_a_reopen_after_its_newest_are_acked(
    tmp_path: Path,
) -> None:
    """The next row's place starts after the largest one kept: messages added after a reopen
    come after every one kept, even when ids wrapped (the new schema orders by ``seq``)."""
    path = str(tmp_path / "t.db")
    a, b = uuid7(), uuid7()
    store = Store.open(path, next_id=2**32 - 1)
    first, second, third = store.apply([("c", "", b"x", [a]), ("c", "", b"y", [b]),
                                        ("c", "", b"z", [b])], [])  # fmt: skip
    store.apply([], [(second, b), (third, b)])
    store.close()
    store = Store.open(path)
    (fourth,) = store.apply([("c", "", b"w", [a])], [])
    assert (first, fourth) == (2**32 - 1, 2)
    assert store.pending_for(a) == [(first, "c", "", b"x"), (fourth, "c", "", b"w")]
    store.close()


def test_a_transaction_runs_a_few_statements_whatever_its_rows(tmp_path: Path) -> None:
    """Issue 22: no statement per row (``executemany`` releases and takes back the GIL at every
    row, which the committer thread pays for beside a busy event loop); the rows and their order
    are those of one statement per row."""
    store = Store.open(str(tmp_path / "t.db"))
    a, b = uuid7(), uuid7()
    statements: list[str] = []
    store.db.set_trace_callback(statements.append)
    n = 2 * ROWS_PER_STATEMENT + 3  # (three multi-row INSERTs, the last one shorter)
    adds = [("c", f"k{i % 3}", b"body %d" % i, [a, b] if i % 2 else [a]) for i in range(n)]
    ids = store.apply(adds, [])
    assert len(statements) <= 10
    statements.clear()
    store.apply([], [(i, a) for i in ids] + [(ids[1], b), (12345, b)])
    # (BEGIN, COMMIT; per remote, the rows of the messages it was the one remote of, and its
    # pending rows; then the rows no remote awaits any more: two remotes, 7)
    assert len(statements) <= 7
    store.db.set_trace_callback(None)
    odd = [(i, "c", f"k{j % 3}", b"body %d" % j) for j, i in enumerate(ids) if j % 2]
    assert store.pending_for(b) == odd[1:]  # in the order sent; ids[1] acked by b
    assert store.pending_for(a) == []
    assert store.unacked() == len(odd) - 1
    assert store.unacked_bytes() == sum(len(body) for *_, body in odd[1:])
    assert store.ack(ids[3], b)
    assert not store.ack(ids[3], b)  # (already acked)
    store.close()


def test_a_message_with_one_remote_is_awaited_in_its_outbox_row(tmp_path: Path) -> None:
    """Issue 22, round 3: in a new file a message with one remote keeps it in its outbox row
    (no ``pending`` row: an add and an ack touch one row each); one with several remotes is
    awaited in ``pending`` as before. Both come back in the order sent, across a reopen."""
    path = str(tmp_path / "t.db")
    a, b = uuid7(), uuid7()
    store = Store.open(path)
    one, both, two = store.apply([("c", "", b"1", [a]), ("c", "k", b"22", [a, b]),
                                  ("d", "", b"333", [b])], [])  # fmt: skip

    def pending_rows() -> int:
        return int(store.db.execute("SELECT COUNT(*) FROM pending").fetchone()[0])

    assert pending_rows() == 2  # (the message sent to a and b only)
    assert store.pending_for(a) == [(one, "c", "", b"1"), (both, "c", "k", b"22")]
    assert store.pending_for(b) == [(both, "c", "k", b"22"), (two, "d", "", b"333")]
    assert not store.ack(one, b)  # (b was not awaited for it)
    assert store.unacked() == 3
    store.close()
    store = Store.open(path)
    assert (store.unacked(), store.unacked_bytes()) == (3, 6)
    (three,) = store.apply([("c", "", b"4444", [a])], [(one, a), (both, b)])
    assert store.pending_for(a) == [(both, "c", "k", b"22"), (three, "c", "", b"4444")]
    assert store.pending_for(b) == [(two, "d", "", b"333")]
    assert (store.unacked(), store.unacked_bytes()) == (3, 9)
    assert store.ack(both, a)  # (its last remote: the message goes)
    assert pending_rows() == 0
    store.apply([], [(two, b), (three, a)])
    assert (store.unacked(), store.unacked_bytes()) == (0, 0)
    assert int(store.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]) == 0
    store.close()


def test_a_failed_transaction_leaves_the_counts_as_they_were(tmp_path: Path) -> None:
    """An ack run that fails (an id SQLite cannot hold) rolls back: what it would have
    deleted is kept, in the file and in the counts (a later ack of it still works)."""
    store = Store.open(str(tmp_path / "t.db"))
    a, b = uuid7(), uuid7()
    ids = store.apply([("c", "", b"x", [a, b]), ("c", "", b"y", [a])], [])
    try:
        store.apply([], [(ids[0], a), (ids[0], b), (ids[1], a), (2**64, a)])
    except OverflowError:
        pass
    else:
        raise AssertionError("an id over 64 bits must fail the transaction")
    assert store.unacked() == 2
    assert store.pending_for(a) == [(ids[0], "c", "", b"x"), (ids[1], "c", "", b"y")]
    store.apply([], [(ids[0], a), (ids[0], b), (ids[1], a)])
    assert (store.unacked(), store.unacked_bytes()) == (0, 0)
    store.close()
