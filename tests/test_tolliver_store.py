"""The stand-alone Tolliver instance's store: its UUIDv7 kept across restarts, reliable
messages kept (on disk) until every subscribed remote acked them, ids never 2**31-1."""

from __future__ import annotations

import uuid
from pathlib import Path

from tidewire.protocols.tolliver import UNRELIABLE
from tidewire.tolliver import Store, uuid7


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
    store = Store.open(str(tmp_path / "t.db"))
    a = uuid7()
    store._next = UNRELIABLE - 1
    ids = [store.add("c", "", b"x", [a]) for _ in range(3)]
    assert ids == [UNRELIABLE - 1, UNRELIABLE + 1, UNRELIABLE + 2]
    store._next = 2**32 - 1
    assert [store.add("c", "", b"y", [a]) for _ in range(2)] == [2**32 - 1, 0]
    store.close()
