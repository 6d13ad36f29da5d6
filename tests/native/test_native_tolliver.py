"""Tolliver's runs (protocols/tolliver/runs.py): the compiled kernels against their pure twins,
byte for byte: what they return, what they append, what they leave in the names cache and what
they refuse (see test_native_equal.py)."""

from __future__ import annotations

import importlib
import struct
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewire.model import Batch, LocalProtocolError
from tidewire.protocols.tolliver.codec import Message
from tidewire.protocols.tolliver.runs import (
    NAMES_CACHED,
    ack_frames_py,
    message_frames_py,
    take_run_py,
    value_frames_py,
)
from tidewire.tolliver import uuid7
from tidewire.tolliver.inbox import Delivery, deliveries_py

try:
    K: ModuleType = importlib.import_module("tidewire.native._kernels")
except ImportError:  # pragma: no cover - the normal run fails in test_native_switch.py instead
    pytest.skip("the compiled kernels are not built", allow_module_level=True)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NAME = st.sampled_from([b"", b"ch", b"ch", b"bench.reliable", b"tolliver", b"k\xc3\xa9",
                        b"\xff\xfe", b"\xed\xa0\x80", b"x" * 9])  # fmt: skip


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """Message and ack frames, mostly whole and right; some names not UTF-8 or over a small
    limit, other codes, a frame cut short at the end."""
    out = b""
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["message", "message", "ack", "other"]))
        if kind == "ack":
            out += struct.pack(">BI", 4, draw(st.integers(0, 2**32 - 1)))
        elif kind == "other":
            out += bytes([draw(st.sampled_from([0, 1, 2, 5, 255]))])
        else:
            channel, key = draw(NAME), draw(NAME)
            body = draw(st.binary(max_size=12))
            blen = draw(st.just(len(body)) | st.sampled_from([len(body) + 3, 2**32 - 1]))
            out += struct.pack(">BIIII", 3, len(channel), len(key), blen,
                               draw(st.integers(0, 2**32 - 1)))  # fmt: skip
            out += channel + key + body
    cut = draw(st.integers(0, 3))
    return out[: len(out) - cut] if cut and draw(st.booleans()) else out


def cache(draw_size: int) -> dict[bytes, str]:
    """A names cache holding ``draw_size`` entries (at the bound: the next miss clears it)."""
    names = {b"ch": "ch"}
    names.update({f"n{i}".encode(): f"n{i}" for i in range(draw_size - 1)})
    return names


def run(fn: Any, buf: bytes | bytearray, pos: int, max_name: int, max_body: int,
        names: dict[bytes, str], skip: str) -> tuple[Any, ...]:  # fmt: skip
    messages: list[Message] = []
    acks: list[int] = []
    result = fn(buf, pos, max_name, max_body, names, skip, messages, acks, Message)
    return result, messages, acks, names


@FUZZ
@given(frames(), st.integers(0, 6), st.sampled_from([0, 2, 8, 4096]),
       st.sampled_from([0, 5, 16, 2**24]), st.sampled_from([1, 5, NAMES_CACHED]),
       st.sampled_from(["tolliver", "ch", ""]))  # fmt: skip
def test_runs_of_frames_parse_the_same(data: bytes, pos: int, max_name: int, max_body: int,
                                       cached: int, skip: str) -> None:  # fmt: skip
    """Channels and keys not UTF-8, over the limit, on the skipped channel; bodies over the
    limit or past the end; acks between messages; a cache that fills up."""
    for buf in (data, bytearray(data)):
        start = min(pos, len(buf))
        pure = run(take_run_py, buf, start, max_name, max_body, cache(cached), skip)
        compiled = run(K.tolliver_take_run, buf, start, max_name, max_body, cache(cached), skip)
        assert compiled == pure
        assert [type(m) for m in compiled[1]] == [Message] * len(compiled[1])


def test_a_decoded_message_is_a_message_like_any_other() -> None:
    """The slots set directly: equal, hashable and printable as one built by its constructor."""
    frame = struct.pack(">BIIII", 3, 2, 1, 3, 7) + b"chkabc"
    for fn in (take_run_py, K.tolliver_take_run):
        (_, end), (message,), _, _ = run(fn, frame, 0, 4096, 1024, {}, "tolliver")
        assert end == len(frame)
        assert message == Message("ch", "k", b"abc", 7)
        assert hash(message) == hash(Message("ch", "k", b"abc", 7))
        assert repr(message) == repr(Message("ch", "k", b"abc", 7))


def outcome(fn: Any, *args: Any) -> tuple[str, object]:
    try:
        return "ok", fn(*args)
    except LocalProtocolError as exc:
        return "refused", str(exc)


IDS = st.lists(st.integers(0, 2**32 - 1) | st.sampled_from([-1, 2**32, 2**64, 2**31 - 1]),
               max_size=6)  # fmt: skip


@FUZZ
@given(IDS)
def test_ack_frames_are_the_same(ids: list[int]) -> None:
    assert outcome(K.tolliver_ack_frames, ids) == outcome(ack_frames_py, ids)
    assert outcome(K.tolliver_ack_frames, tuple(ids)) == outcome(ack_frames_py, tuple(ids))


def test_ack_frames_refuse_what_is_not_an_int() -> None:
    for bad in ([1.0], ["1"], [None]):
        assert outcome(K.tolliver_ack_frames, bad)[0] == "refused"
        assert outcome(ack_frames_py, bad)[0] == "refused"


@FUZZ
@given(st.sampled_from([b"", b"ch", b"bench.reliable"]),
       st.lists(st.tuples(st.binary(max_size=5), st.binary(max_size=40), IDS.map(sum)),
                max_size=6),
       st.booleans())  # fmt: skip
def test_message_frames_are_the_same(channel: bytes, items: list[tuple[bytes, bytes, int]],
                                     mutable: bool) -> None:  # fmt: skip
    if mutable:  # (a bytearray body or key is copied as a bytes one is)
        items = [(bytearray(k), bytearray(b), i) for k, b, i in items]  # type: ignore[misc]
    assert outcome(K.tolliver_message_frames, channel, items) == outcome(
        message_frames_py, channel, items
    )


@FUZZ
@given(st.sampled_from([b"", b"ch"]), st.lists(st.binary(max_size=20), min_size=1, max_size=6),
       st.integers(0, 3),
       st.sampled_from([0, 5, 2**31, 2**32 - 3, 2**32 - 1, 2**32, -1]))  # fmt: skip
def test_value_frames_are_the_same(channel: bytes, values: list[bytes], cut: int,
                                   first_id: int) -> None:  # fmt: skip
    """A batch's value column, whole or a slice of it (offsets not from 0), ids that fit or
    would pass a u32."""
    batch = Batch.build("s", values)
    offsets, data = batch.value_offsets, batch.values
    if cut and len(values) > 1:  # (a slice: its offsets start where its first value does)
        start = min(cut, len(values) - 1)
        offsets = offsets[start:]
        data = data[offsets[0] :]
    assert outcome(K.tolliver_value_frames, channel, data, offsets, first_id) == outcome(
        value_frames_py, channel, data, offsets, first_id
    )


@FUZZ
@given(st.lists(st.tuples(NAME, NAME, st.binary(max_size=8), st.integers(0, 2**32 - 1)),
                max_size=6))  # fmt: skip
def test_deliveries_are_the_same(fields: list[tuple[bytes, bytes, bytes, int]]) -> None:
    """A run of received messages into the inbox's (delivery, link) items: equal, hashable
    and printable as deliveries built by their constructor."""
    sender, link = uuid7(), object()
    messages = [Message(c.decode("latin-1"), k.decode("latin-1"), b, i) for c, k, b, i in fields]
    pure = deliveries_py(Delivery, sender, messages, link)
    compiled = K.tolliver_deliveries(Delivery, sender, messages, link)
    assert compiled == pure
    expected = [(Delivery(sender, m.channel, m.key, m.body, m.id), link) for m in messages]
    assert pure == expected
    assert [hash(d) for d, _ in compiled] == [hash(d) for d, _ in expected]
    assert [repr(d) for d, _ in compiled] == [repr(d) for d, _ in expected]
    assert all(type(d) is Delivery and item_link is link for d, item_link in compiled)
