"""Stream names and the column-wise :class:`~tidewire.model.Batch` (tidewire.model)."""

from __future__ import annotations

import unicodedata
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.model import (
    MAX_ID,
    Batch,
    Event,
    InvalidBatch,
    InvalidStreamName,
    TidewireError,
    now_ms,
    validate_stored_stream_name,
    validate_stream_name,
)

# --------------------------------------------------------------------------- stream names


def _utf8_len(name: str) -> int:
    return len(name.encode("utf-8"))


VALID_NAMES = [
    "a",
    "orders",
    "a.b-c_d/e:f@g#h",
    "%2E",
    ".hidden",
    "日本語のストリーム",
    "x" * 255,
    "é" * 127 + "a",  # 2-byte chars: exactly 255 bytes
    "€" * 85,  # 3-byte chars: exactly 255 bytes (85 characters)
    "😀" * 63 + "abc",  # 4-byte chars: 252 + 3 = 255 bytes
    "caf\u00e9",  # NFC
    "\u0430pple",  # Cyrillic a: a look-alike, but a different name (docs/security.md)
    "\u05e9\u05dc\u05d5\u05dd",  # right-to-left letters themselves are fine
]

INVALID_NAMES = [
    ("", "empty"),
    ("x" * 256, "256 bytes"),
    ("é" * 128, "256 bytes"),  # 128 characters, 256 bytes
    ("é" * 127 + "ab", "256 bytes"),
    ("€" * 85 + "a", "256 bytes"),  # 86 characters
    ("😀" * 64, "256 bytes"),  # 64 characters
    ("😀" * 63 + "abcd", "256 bytes"),
    ("a b", "whitespace"),
    ("a\tb", "whitespace"),
    ("a\nb", "whitespace"),
    ("a\rb", "whitespace"),
    (" lead", "whitespace"),
    ("trail ", "whitespace"),
    ("a\u00a0b", "whitespace"),  # no-break space
    ("a\u2028b", "whitespace"),  # line separator
    ("a\u3000b", "whitespace"),  # ideographic space
    ("a\x00b", "whitespace or a control"),
    ("\x07", "whitespace or a control"),
    ("a\x7f", "whitespace or a control"),
    ("a\x9bb", "whitespace or a control"),  # C1 control
    ("a\ud800b", "UTF-8"),  # lone surrogate: not encodable
    ("pay\u200broll", "U+200B"),  # zero-width space (Cf)
    ("a\u200db", "U+200D"),  # zero-width joiner
    ("\ufeffbom", "U+FEFF"),  # byte order mark / zero-width no-break space
    ("evil\u202etxt.exe", "bidi-control"),  # right-to-left override
    ("a\u2066b", "bidi-control"),  # left-to-right isolate
    ("a\u061cb", "bidi-control"),  # Arabic letter mark
    ("soft\u00adhyphen", "U+00AD"),
    ("a\ufe0fb", "U+FE0F"),  # variation selector
    ("a\u034fb", "U+034F"),  # combining grapheme joiner
    ("\u3164", "U+3164"),  # Hangul filler
    ("a\U000e0041b", "U+E0041"),  # tag character
    ("a\ue000b", "private-use"),
    ("a\U0010fffeb", "unassigned"),  # a noncharacter
    ("cafe\u0301", "NFC"),  # e + combining acute: NFC is U+00E9
    ("\u212b", "NFC"),  # Angstrom sign: NFC is U+00C5
]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_stream_names(name: str) -> None:
    assert _utf8_len(name) <= 255
    assert validate_stream_name(name) == name


@pytest.mark.parametrize(("name", "why"), INVALID_NAMES)
def test_invalid_stream_names(name: str, why: str) -> None:
    with pytest.raises(InvalidStreamName) as info:
        validate_stream_name(name)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, TidewireError)
    message = str(info.value)
    if why == "256 bytes":
        assert "256 bytes" in message
        assert "255" in message
    else:
        assert why in message


def test_invalid_stream_name_message_points_at_the_character() -> None:
    with pytest.raises(InvalidStreamName, match=r"U\+0009 at position 3"):
        validate_stream_name("abc\tdef")


@pytest.mark.parametrize("name", [123, None, b"bytes", ["unhashable"]])
def test_non_str_stream_name(name: object) -> None:
    with pytest.raises(InvalidStreamName, match="must be str"):
        validate_stream_name(name)  # type: ignore[arg-type]


def test_multibyte_boundary_counts_bytes_not_characters() -> None:
    ok = "€" * 85
    too_long = "€" * 86
    assert len(ok) == 85
    assert len(too_long) == 86  # far fewer than 255 characters, yet too long
    assert validate_stream_name(ok) == ok
    with pytest.raises(InvalidStreamName):
        validate_stream_name(too_long)


def test_builders_validate_the_stream_name() -> None:
    with pytest.raises(InvalidStreamName):
        Batch.build("bad name", [b"x"])
    with pytest.raises(InvalidStreamName):
        Batch.build("", [b"x"])
    with pytest.raises(InvalidStreamName):
        Batch.from_events([Event("a\nb", 1, b"x")])
    batch = Batch.build("ok", [b"x"])
    with pytest.raises(InvalidStreamName):
        batch.with_stream("x" * 256)
    moved = batch.with_stream("é" * 127 + "a")
    assert moved.stream == "é" * 127 + "a"
    assert moved.values.obj is batch.values.obj


def _expected_valid(name: str) -> bool:
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    if not 1 <= size <= 255:
        return False
    if any(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Cn", "Co") for ch in name):
        return False
    ignorable = [0x34F, 0x115F, 0x1160, 0x17B4, 0x17B5, *range(0x180B, 0x1810), 0x3164,
                 *range(0xFE00, 0xFE10), 0xFFA0, *range(0xFFF0, 0xFFF9), *range(0x1D173, 0x1D17B),
                 *range(0xE0000, 0xE1000)]  # fmt: skip
    if any(ord(ch) in ignorable for ch in name):
        return False
    return unicodedata.normalize("NFC", name) == name


def _expected_stored(name: str) -> bool:
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 1 <= size <= 255 and not any(
        ch.isspace() or unicodedata.category(ch) == "Cc" for ch in name
    )


@given(
    st.text(
        st.characters(codec=None, exclude_categories=()),
        max_size=140,
    )
    | st.text(st.sampled_from("aé€😀 \t\x00-"), min_size=50, max_size=130)
)
def test_stream_name_validation_matches_the_rule(name: str) -> None:
    if _expected_valid(name):
        assert validate_stream_name(name) == name
    else:
        with pytest.raises(InvalidStreamName):
            validate_stream_name(name)
    if _expected_stored(name):
        assert validate_stored_stream_name(name) == name
    else:
        with pytest.raises(InvalidStreamName):
            validate_stored_stream_name(name)


def test_a_refused_name_is_shown_escaped() -> None:
    """The refusal names the invisible character, and its message holds none (it is logged)."""
    with pytest.raises(InvalidStreamName) as info:
        validate_stream_name("pay\u200broll")
    assert "pay\\u200broll" in str(info.value)
    assert str(info.value).isascii()


@pytest.mark.parametrize("name", ["pay\u200broll", "evil\u202etxt.exe", "cafe\u0301"])
def test_the_stored_rule_accepts_what_older_releases_made(name: str) -> None:
    assert validate_stored_stream_name(name) == name
    with pytest.raises(InvalidStreamName):
        validate_stream_name(name)


# --------------------------------------------------------------------------- batches


def _sample() -> Batch:
    return Batch.build(
        "s",
        [b"zero", b"", b"two-2", b"three", b"\x00\xff"],
        ids=[3, 4, 10, 11, 2**40],
        keys=[b"k0", None, b"", b"k3", None],
        timestamps=[100, -5, 300, 300, 2**62],
    )


SAMPLE_EVENTS = [
    Event("s", 3, b"zero", b"k0", 100),
    Event("s", 4, b"", None, -5),
    Event("s", 10, b"two-2", b"", 300),
    Event("s", 11, b"three", b"k3", 300),
    Event("s", 2**40, b"\x00\xff", None, 2**62),
]


def test_build_and_iterate() -> None:
    batch = _sample()
    assert len(batch) == 5
    assert list(batch) == SAMPLE_EVENTS
    assert [batch.event(i) for i in range(5)] == SAMPLE_EVENTS
    assert batch.first_id == 3
    assert batch.last_id == 2**40
    assert batch.has_keys
    assert batch.ids.format == "Q"
    assert batch.timestamps.format == "q"
    assert batch.value_offsets.format == "I"
    assert list(batch.value_offsets) == [0, 4, 4, 9, 14, 16]
    assert bytes(batch.values) == b"zerotwo-2three\x00\xff"
    assert batch.key_flags is not None
    assert list(batch.key_flags) == [1, 0, 1, 1, 0]
    assert batch.keys is not None
    assert bytes(batch.keys) == b"k0k3"
    # 20 bytes of fixed columns per event + 4, then keys: 5 per event + 4.
    assert batch.nbytes == 20 * 5 + 4 + 16 + 5 * 5 + 4 + 4
    assert repr(batch) == f"Batch(stream='s', n=5, ids=3..{2**40}, values=16 B)"


def test_build_defaults() -> None:
    batch = Batch.build("s", [b"a", b"b", b"c"], timestamps=7)
    assert list(batch.ids) == [1, 2, 3]
    assert list(batch.timestamps) == [7, 7, 7]
    assert not batch.has_keys
    assert batch.key_flags is None
    assert batch.key_offsets is None
    assert batch.keys is None
    assert [batch.key(i) for i in range(3)] == [None, None, None]
    assert batch.nbytes == 20 * 3 + 4 + 3


def test_build_with_now_timestamps() -> None:
    before = now_ms()
    batch = Batch.build("s", [b"a", b"b"])
    after = now_ms()
    assert before <= batch.timestamps[0] == batch.timestamps[1] <= after


def test_keys_none_versus_empty() -> None:
    all_none = Batch.build("s", [b"a", b"b"], keys=[None, None])
    assert not all_none.has_keys
    assert [e.key for e in all_none] == [None, None]

    all_empty = Batch.build("s", [b"a", b"b"], keys=[b"", b""])
    assert all_empty.has_keys
    assert [e.key for e in all_empty] == [b"", b""]

    mixed = Batch.build("s", [b"a", b"b", b"c", b"d"], keys=[b"", None, b"", None])
    assert [e.key for e in mixed] == [b"", None, b"", None]
    assert all_none != all_empty  # a missing key is not an empty key


def test_from_events_round_trip() -> None:
    batch = Batch.from_events(SAMPLE_EVENTS)
    assert list(batch) == SAMPLE_EVENTS
    assert batch == _sample()
    assert Batch.from_events(list(batch)) == batch


def test_from_events_rejects_mixed_streams_and_empty() -> None:
    with pytest.raises(InvalidBatch, match="same stream"):
        Batch.from_events([Event("a", 1, b""), Event("b", 2, b"")])
    with pytest.raises(InvalidBatch):
        Batch.from_events([])


@pytest.mark.parametrize(
    "ids",
    [[2, 1], [1, 1], [5, 6, 6], [1, 3, 2], [0, 1], [-1, 1], [1, MAX_ID + 1], [2**64, 2**64 + 1]],
)
def test_build_rejects_bad_ids(ids: list[int]) -> None:
    with pytest.raises(InvalidBatch):
        Batch.build("s", [b"x"] * len(ids), ids=ids, timestamps=0)


def test_build_rejects_mismatched_columns() -> None:
    with pytest.raises(InvalidBatch):
        Batch.build("s", [])
    with pytest.raises(InvalidBatch):
        Batch.build("s", [b"a", b"b"], ids=[1])
    with pytest.raises(InvalidBatch):
        Batch.build("s", [b"a", b"b"], keys=[None])
    with pytest.raises(InvalidBatch):
        Batch.build("s", [b"a", b"b"], timestamps=[1, 2, 3])


def test_build_accepts_the_largest_id() -> None:
    batch = Batch.build("s", [b"a", b"b"], ids=[MAX_ID - 1, MAX_ID], timestamps=0)
    assert batch.last_id == MAX_ID
    assert batch.validate() is batch


def _events_of(batch: Batch) -> list[Event]:
    """Events read through the raw columns (not through Batch.value/key), as a cross-check."""
    n = len(batch)
    vbase = batch.value_offsets[0]
    out = []
    for i in range(n):
        value = bytes(batch.values)[
            batch.value_offsets[i] - vbase : batch.value_offsets[i + 1] - vbase
        ]
        key: bytes | None = None
        if batch.key_flags is not None and batch.key_offsets is not None and batch.keys is not None:
            kbase = batch.key_offsets[0]
            if batch.key_flags[i]:
                key = bytes(batch.keys)[
                    batch.key_offsets[i] - kbase : batch.key_offsets[i + 1] - kbase
                ]
        out.append(Event(batch.stream, int(batch.ids[i]), value, key, int(batch.timestamps[i])))
    return out


def test_slice_every_range_is_zero_copy_and_correct() -> None:
    batch = _sample()
    n = len(batch)
    for start in range(n):
        for stop in range(start + 1, n + 1):
            part = batch.slice(start, stop)
            assert list(part) == SAMPLE_EVENTS[start:stop], (start, stop)
            assert _events_of(part) == SAMPLE_EVENTS[start:stop], (start, stop)
            assert len(part) == stop - start
            assert part.first_id == SAMPLE_EVENTS[start].id
            assert part.last_id == SAMPLE_EVENTS[stop - 1].id
            # Zero copy: every buffer is a view of the original batch's buffers.
            assert part.ids.obj is batch.ids.obj
            assert part.timestamps.obj is batch.timestamps.obj
            assert part.value_offsets.obj is batch.value_offsets.obj
            assert part.values.obj is batch.values.obj
            assert part.keys is not None
            assert batch.keys is not None
            assert part.keys.obj is batch.keys.obj
            assert part == Batch.from_events(SAMPLE_EVENTS[start:stop])
            assert part.validate() is part


def test_slice_of_a_slice() -> None:
    batch = _sample()
    inner = batch.slice(1, 5).slice(1, 3)  # events 2 and 3 of the original
    assert list(inner) == SAMPLE_EVENTS[2:4]
    assert inner.value_offsets[0] == 4  # offsets are not rewritten
    assert inner.values.obj is batch.values.obj
    assert [e.key for e in inner] == [b"", b"k3"]
    # The keys of a slice that holds only None keys still read as None, not b"".
    assert [e.key for e in batch.slice(1, 2)] == [None]
    assert [e.key for e in batch.slice(4, 5)] == [None]


def test_slice_python_index_semantics() -> None:
    batch = _sample()
    assert list(batch.slice(-2, 5)) == SAMPLE_EVENTS[-2:]
    assert list(batch.slice(1, -1)) == SAMPLE_EVENTS[1:-1]
    assert list(batch.slice(3, 100)) == SAMPLE_EVENTS[3:]
    assert batch.slice(0, 5) is batch
    for start, stop in [(2, 2), (3, 1), (5, 9), (-1, -1)]:
        with pytest.raises(InvalidBatch):
            batch.slice(start, stop)


def test_slice_nbytes_counts_only_the_slice() -> None:
    batch = _sample()
    part = batch.slice(2, 4)  # values b"two-2", b"three"; keys b"", b"k3"
    assert part.nbytes == 20 * 2 + 4 + 10 + 5 * 2 + 4 + 2


def test_with_ids() -> None:
    batch = _sample()
    renumbered = batch.with_ids(1000)
    assert list(renumbered.ids) == [1000, 1001, 1002, 1003, 1004]
    assert [(e.value, e.key, e.timestamp) for e in renumbered] == [
        (e.value, e.key, e.timestamp) for e in SAMPLE_EVENTS
    ]
    assert renumbered.values.obj is batch.values.obj
    assert list(batch.ids) == [e.id for e in SAMPLE_EVENTS]  # the original is untouched
    part = batch.slice(1, 3).with_ids(7)
    assert list(part) == [
        Event("s", 7, b"", None, -5),
        Event("s", 8, b"two-2", b"", 300),
    ]
    assert batch.with_ids(MAX_ID - 4).last_id == MAX_ID
    for first in (0, -3, MAX_ID - 3):
        with pytest.raises(InvalidBatch):
            batch.with_ids(first)


def _raw(ids: list[int], offsets: list[int], values: bytes) -> Batch:
    return Batch(
        "s",
        memoryview(array("Q", ids)),
        memoryview(array("q", [0] * len(ids))),
        memoryview(array("I", offsets)),
        memoryview(values),
    )


@pytest.mark.parametrize("ids", [[1, 1], [2, 1], [1, 2, 2], [1, 3, 2, 4], [0, 1], [5, 4, 3]])
def test_validate_catches_non_increasing_ids(ids: list[int]) -> None:
    batch = _raw(ids, list(range(len(ids) + 1)), b"x" * len(ids))  # construction is O(1)
    with pytest.raises(InvalidBatch):
        batch.validate()


def test_validate_catches_ids_beyond_max_and_decreasing_offsets() -> None:
    with pytest.raises(InvalidBatch):
        _raw([1, MAX_ID + 1], [0, 1, 2], b"xy").validate()
    with pytest.raises(InvalidBatch, match="offsets"):
        _raw([1, 2, 3], [0, 2, 1, 3], b"xyz").validate()
    assert _raw([1, 2, 9], [0, 2, 2, 3], b"xyz").validate().last_id == 9


def test_constructor_checks_buffer_shapes() -> None:
    ids = memoryview(array("Q", [1, 2]))
    ts = memoryview(array("q", [0, 0]))
    offs = memoryview(array("I", [0, 1, 2]))
    vals = memoryview(b"ab")
    with pytest.raises(InvalidBatch):
        Batch(
            "s",
            memoryview(array("Q")),
            memoryview(array("q")),
            memoryview(array("I", [0])),
            vals[:0],
        )
    with pytest.raises(InvalidBatch):
        Batch("s", ids, memoryview(array("q", [0])), offs, vals)
    with pytest.raises(InvalidBatch):
        Batch("s", ids, ts, memoryview(array("I", [0, 1])), vals)
    with pytest.raises(InvalidBatch):
        Batch("s", ids, ts, offs, memoryview(b"abc"))  # offsets span 2 bytes, values hold 3
    with pytest.raises(InvalidBatch):
        Batch("s", ids, ts, offs, vals, key_flags=memoryview(b"\x01\x01"))  # keys come together
    with pytest.raises(InvalidBatch):
        Batch("s", memoryview(array("q", [1, 2])), ts, offs, vals)  # ids must be 'Q'
    good = Batch(
        "s",
        ids,
        ts,
        offs,
        vals,
        memoryview(b"\x01\x00"),
        memoryview(array("I", [0, 1, 1])),
        memoryview(b"k"),
    )
    assert [e.key for e in good] == [b"k", None]


def test_batches_are_not_hashable_and_compare_by_content() -> None:
    a = _sample()
    b = Batch.from_events(SAMPLE_EVENTS)
    assert a == b
    assert a != a.with_ids(1)
    assert a != a.with_stream("t")
    assert a.__eq__(object()) is NotImplemented
    with pytest.raises(TypeError):
        hash(a)


# --------------------------------------------------------------------------- property tests


@st.composite
def event_lists(draw: st.DrawFn) -> list[Event]:
    n = draw(st.integers(1, 20))
    ids = sorted(draw(st.sets(st.integers(1, MAX_ID), min_size=n, max_size=n)))
    keyed = draw(st.booleans())
    events = []
    for event_id in ids:
        value = draw(st.binary(max_size=40))
        key = draw(st.none() | st.binary(max_size=10)) if keyed else None
        ts = draw(st.integers(-(2**63), 2**63 - 1))
        events.append(Event("prop", event_id, value, key, ts))
    return events


@given(event_lists())
def test_build_round_trip_property(events: list[Event]) -> None:
    batch = Batch.build(
        "prop",
        [e.value for e in events],
        ids=[e.id for e in events],
        keys=[e.key for e in events],
        timestamps=[e.timestamp for e in events],
    )
    assert list(batch) == events
    assert _events_of(batch) == events
    assert batch.validate() is batch
    assert batch.has_keys == any(e.key is not None for e in events)
    assert Batch.from_events(list(batch)) == batch
    assert [batch.index_of(e.id) for e in events] == list(range(len(events)))
    assert batch.index_of(events[-1].id + 1) == len(events)


@given(event_lists(), st.data())
def test_slice_property(events: list[Event], data: st.DataObject) -> None:
    batch = Batch.from_events(events)
    n = len(events)
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, n))
    part = batch.slice(start, stop)
    assert list(part) == events[start:stop]
    assert _events_of(part) == events[start:stop]
    assert part == Batch.from_events(events[start:stop])
    assert part.values.obj is batch.values.obj
    renumbered = part.with_ids(1)
    assert [e.id for e in renumbered] == list(range(1, stop - start + 1))
    assert [(e.value, e.key) for e in renumbered] == [(e.value, e.key) for e in events[start:stop]]


# --------------------------------------------------------------------------- fit


def test_fit_basics() -> None:
    batch = Batch.build("s", [b"x" * 10] * 5, timestamps=0)  # 30 bytes per event, + 4 per batch
    assert batch.fit(0, 10**9) == 5
    assert batch.fit(0, 0) == 0  # not even one event fits: start itself
    assert batch.fit(3, 10**9) == 5
    assert batch.fit(4, 1) == 4
    assert batch.slice(0, batch.fit(0, 10**9)).nbytes == batch.nbytes


@given(event_lists(), st.data())
def test_fit_is_maximal(events: list[Event], data: st.DataObject) -> None:
    batch = Batch.from_events(events)
    n = len(batch)
    start = data.draw(st.integers(0, n - 1))
    max_bytes = data.draw(st.integers(0, batch.nbytes + 10))
    stop = batch.fit(start, max_bytes)
    assert start <= stop <= n
    if stop < n:  # one more event would not fit
        assert batch.slice(start, stop + 1).nbytes > max_bytes


@pytest.mark.parametrize("keyed", [False, True])
def test_fit_never_exceeds_max_bytes(keyed: bool) -> None:
    keys: list[bytes | None] | None = [b"k"] * 5 if keyed else None
    batch = Batch.build("s", [b"x" * 10] * 5, keys=keys, timestamps=0)
    over = []
    for max_bytes in range(batch.nbytes + 1):
        stop = batch.fit(0, max_bytes)
        if stop and batch.slice(0, stop).nbytes > max_bytes:
            over.append((max_bytes, stop, batch.slice(0, stop).nbytes))
    assert over == []  # e.g. fit(0, 63) takes 2 events, whose slice is 64 bytes
