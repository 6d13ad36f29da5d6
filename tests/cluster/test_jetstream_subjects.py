"""The pure mapping of tidewire streams onto JetStream subjects and the records' headers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.cluster.subjects import (
    AdminEntry,
    RecordSum,
    admin_subject,
    notify_subject,
    parse_ids,
    shard_of,
    stream_of_admin_subject,
    stream_of_subject,
    subject_of,
    token,
    untoken,
)

names = st.text(min_size=1, max_size=80)


@given(names)
def test_a_token_round_trips_and_holds_only_safe_characters(name: str) -> None:
    try:
        name.encode()
    except UnicodeEncodeError:  # (lone surrogates: never a stream name)
        return
    text = token(name)
    assert untoken(text) == name
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-~")


def test_the_escapes_are_exact() -> None:
    assert token("a.b*c>d e~é") == "a~2Eb~2Ac~3Ed~20e~7E~C3~A9"
    assert token("_tidewire.txns") == "_tidewire~2Etxns"
    assert token("Seg-01_x") == "Seg-01_x"


@pytest.mark.parametrize("bad", ["~2", "~zz", "~41", "a.b", "é", "~FF"])
def test_an_untoken_of_what_token_never_makes_fails(bad: str) -> None:
    with pytest.raises(ValueError, match="subject token"):
        untoken(bad)


def test_subjects_and_shards() -> None:
    assert shard_of("orders", 16) == shard_of("orders", 16) < 16
    subject = subject_of("a.b", 16)
    assert subject == f"tw.{shard_of('a.b', 16)}.a~2Eb"
    assert notify_subject(subject) == "twn." + subject[3:]
    assert stream_of_subject(subject) == stream_of_subject(notify_subject(subject)) == "a.b"
    with pytest.raises(ValueError, match="not a tidewire subject"):
        stream_of_subject("other.1.x")
    spread = {shard_of(f"point-{i}", 16) for i in range(1000)}
    assert spread == set(range(16))  # (CRC-32C spreads names over every shard)


def test_the_ids_header() -> None:
    assert parse_ids("3-7") == (3, 7)
    for bad in ("7-3", "0-1", "5", "a-b"):
        with pytest.raises(ValueError, match=r"Tw-Ids|invalid literal"):
            parse_ids(bad)


@given(st.integers(0, 2**62), st.integers(0, 2**40), st.integers(0, 2**50),
       st.integers(1, 2**20), st.integers(1, 2**23), st.integers(-(2**62), 2**62))  # fmt: skip
def test_a_record_sum_round_trips(prev: int, events: int, size: int, count: int, nbytes: int,
                                  max_ts: int) -> None:  # fmt: skip
    record_sum = RecordSum(prev, events, size, count, nbytes, max_ts)
    assert RecordSum.parse(record_sum.header()) == record_sum
    following = record_sum.following(prev + count, 1, 8, max_ts - 1)
    assert following.events_before == events + count
    assert following.bytes_before == size + nbytes
    assert following.max_ts == max_ts  # (the running newest never goes back)


def test_a_bad_record_sum_is_refused() -> None:
    for bad in ("1 2 3", "1 2 3 0 5 6", "a b c d e f", "-1 0 0 1 1 0"):
        with pytest.raises(ValueError, match=r"Tw-Sum|invalid literal"):
            RecordSum.parse(bad)


@given(names)
def test_an_admin_subject_is_never_a_record_subject_and_round_trips(name: str) -> None:
    try:
        name.encode()
    except UnicodeEncodeError:
        return
    subject = admin_subject(name, 16)
    assert subject == subject_of(name, 16) + ".admin"
    assert stream_of_admin_subject(subject) == name
    assert stream_of_admin_subject("twn." + subject.removeprefix("tw.")) == name
    with pytest.raises(ValueError, match="not a tidewire subject"):
        stream_of_subject(subject)
    with pytest.raises(ValueError, match="not a tidewire admin subject"):
        stream_of_admin_subject(subject_of(name, 16))


def test_admin_entries_as_written_and_refused() -> None:
    created = AdminEntry("create", (86_400_000, None))
    assert created.header() == '{"op":"create","retention_ms":86400000,"retention_bytes":null}'
    assert AdminEntry("create").header() == '{"op":"create"}'
    assert AdminEntry("delete").header() == '{"op":"delete"}'
    assert AdminEntry("retention", (None, 4096)).header() == (
        '{"op":"retention","retention_ms":null,"retention_bytes":4096}')
    for entry in (created, AdminEntry("create"), AdminEntry("delete"),
                  AdminEntry("retention", (None, None))):  # fmt: skip
        assert AdminEntry.parse(entry.header()) == entry
    assert not AdminEntry("delete").live
    assert created.live
    for bad in ('{"op":"drop"}', '{"op":"retention"}', '{"op":"delete","retention_ms":1,'
                '"retention_bytes":null}', '{"op":"create","retention_ms":-1,'
                '"retention_bytes":null}', '{"op":"create","retention_ms":1}', "[]", "{",
                '{"op":"create","x":1}', '{"op":"create","retention_ms":true,'
                '"retention_bytes":null}'):  # fmt: skip
        with pytest.raises(ValueError, match="bad Tw-Admin header"):
            AdminEntry.parse(bad)
