"""Publisher names (the grammar in docs/protocols/rsio.md) and the envelope element format."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.model import MAX_ID, Batch, InvalidStreamName, validate_stream_name
from tidewire.protocols.rsio import Decoder, OnNext, OnNextDecoded, RunDecoder, encode
from tidewire.protocols.rsio.envelopes import (
    decode_envelope,
    decode_envelopes,
    encode_envelopes,
    envelope_parts,
    envelopes_to_batch,
)
from tidewire.protocols.rsio.names import (
    FromTime,
    HubPublisher,
    PublisherName,
    PublisherNameError,
)
from tidewire.protocols.rsio.runs import (
    OfferRun,
    envelope_frames,
    envelope_run_decoder,
    join_offer_parts,
    offer_run_decoder,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("orders", PublisherName("orders")),
        ("orders?from=latest", PublisherName("orders", "latest")),
        ("orders?from=0", PublisherName("orders", 0)),
        ("orders?from=5&until=9", PublisherName("orders", 5, 9)),
        ("orders?key=a%20b%00", PublisherName("orders", key=b"a b\x00")),
        ("orders?format=value", PublisherName("orders", format="value")),
        ("ticks?size=16", PublisherName("ticks", format="value", size=16)),
        ("ticks?size=16&format=value", PublisherName("ticks", format="value", size=16)),
        ("a%3Fb%26c", PublisherName("a?b&c")),
        ("caf%C3%A9", PublisherName("café")),
        ("orders?from-time=1700000000000", PublisherName("orders", FromTime(1700000000000))),
        ("orders?from-time=0&until=9", PublisherName("orders", FromTime(0), 9)),
        (f"orders?format=records&from-time={MAX_ID}",
         PublisherName("orders", FromTime(MAX_ID), format="records")),
    ],
)
def test_parse(text: str, expected: PublisherName) -> None:
    assert PublisherName.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("or ders", "whitespace"),
        ("%ff", "bad stream"),
        ("orders?nope=1", "unknown parameter"),
        ("orders?from", "bad or repeated"),
        ("orders?from=1&from=2", "bad or repeated"),
        ("orders?from=-1", "not an id"),
        (f"orders?from={MAX_ID + 1}", "not an id"),
        ("orders?from=soon", "not an id"),
        ("orders?size=0", "size must be >= 1"),
        ("orders?size=4&format=envelope", "needs format=value"),
        ("orders?format=json", "envelope, value or records"),
        ("orders?from-time=-1", "not an id"),
        ("orders?from-time=1.5", "not an id"),
        ("orders?from-time=", "not an id"),
        ("orders?from-time=2026-11-26T10:00:00Z", "not an id"),
        (f"orders?from-time={MAX_ID + 1}", "not an id"),
        ("orders?from-time=5&from=1", "exclude each other"),
        ("orders?from=latest&from-time=5", "exclude each other"),
        ("orders?from-time=5&from-time=6", "bad or repeated"),
    ],
)
def test_refused(text: str, why: str) -> None:
    with pytest.raises(PublisherNameError, match=why):
        PublisherName.parse(text)


def _valid_stream(name: str) -> bool:
    try:
        validate_stream_name(name)
    except InvalidStreamName:
        return False
    return True


names = st.builds(
    PublisherName,
    stream=st.text(
        st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1, max_size=20
    ).filter(lambda s: _valid_stream(s)),
    start=st.one_of(st.just("earliest"), st.just("latest"), st.integers(0, MAX_ID),
                    st.builds(FromTime, st.integers(0, MAX_ID))),
    until=st.none() | st.integers(0, MAX_ID),
    key=st.none() | st.binary(max_size=8),
    format=st.sampled_from(["envelope", "value"]),
)


@given(names)
def test_round_trip(name: PublisherName) -> None:
    assert PublisherName.parse(str(name)) == name


def test_from_time_is_written_as_its_exact_bytes() -> None:
    name = PublisherName("a b", FromTime(1700000000000), until=7)
    assert str(name).encode() == b"a%20b?from-time=1700000000000&until=7"
    with pytest.raises(ValueError, match="from-time"):
        FromTime(-1)


def test_envelope_golden_bytes() -> None:
    batch = Batch.build("s", [b"v1", b""], keys=[None, b"k"], ids=[5, 300],
                        timestamps=[-1, 1700000000000])  # fmt: skip
    assert [e.hex(" ") for e in encode_envelopes(batch)] == [
        "05 01 00 76 31",  # id 5, timestamp -1 (zigzag 1), no key, value "v1"
        "ac 02 80 a0 ab fe f9 62 02 6b",  # id 300, ts 1700000000000, key "k" (1 + 1), empty value
    ]


@given(
    st.lists(
        st.tuples(
            st.binary(max_size=20),
            st.none() | st.binary(max_size=5),
            st.integers(-(2**63), 2**63 - 1),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_envelope_round_trip(events: list[tuple[bytes, bytes | None, int]]) -> None:
    batch = Batch.build(
        "s",
        [v for v, _, _ in events],
        ids=list(range(1, len(events) + 1)),
        keys=[k for _, k, _ in events],
        timestamps=[t for _, _, t in events],
    )
    decoded = [decode_envelope(e) for e in encode_envelopes(batch)]
    assert decoded == [(i + 1, t, k, v) for i, (v, k, t) in enumerate(events)]


@pytest.mark.parametrize("element", [b"", b"\x05", b"\x05\x01", b"\x05\x01\x09ab", b"\xff" * 11])
def test_malformed_envelopes(element: bytes) -> None:
    with pytest.raises(ValueError, match="envelope"):
        decode_envelope(element)


@st.composite
def envelope_batches(draw: st.DrawFn) -> Batch:
    """Batches that exercise the bulk decoder's fast path and every way out of it: runs of
    consecutive ids across the low byte's carry (127->128, 255->256, 16383->16384), id jumps,
    repeated and changing timestamps, keys on some events."""
    n = draw(st.integers(1, 160))
    start = draw(st.sampled_from([1, 100, 120, 250, 16_300, 2**35 - 5, 2**63 - 50_000]))
    ids = [start]
    for _ in range(n - 1):
        ids.append(ids[-1] + draw(st.sampled_from([1, 1, 1, 1, 2, 130])))
    stamp = st.sampled_from([0, -1, 1_700_000_000_000, -(2**63), 2**63 - 1])
    same_stamp = draw(st.booleans())
    first = draw(stamp)
    return Batch.build(
        "s",
        [draw(st.binary(max_size=3)) for _ in range(n)],
        ids=ids,
        keys=[draw(st.none() | st.none() | st.binary(max_size=3)) for _ in range(n)],
        timestamps=first if same_stamp else [draw(stamp) for _ in range(n)],
    )


@settings(max_examples=120, deadline=None)
@given(envelope_batches())
def test_bulk_envelope_decoding_matches_one_by_one(batch: Batch) -> None:
    elements = encode_envelopes(batch)
    bulk = envelopes_to_batch("s", elements)
    assert bulk == batch
    assert [decode_envelope(e) for e in elements] == [
        (e.id, e.timestamp, e.key, e.value) for e in batch
    ]


@pytest.mark.parametrize(
    "elements",
    [[b""], [b"\x05"], [b"\x05\x01"], [b"\x05\x01\x09ab"], [b"\xff" * 11], [b"\x05\x02\x00", b""],
     [b"\x05\x02\x00", b"\x06\x02"], []],
)  # fmt: skip
def test_bulk_decoding_refuses_malformed_envelopes(elements: list[bytes]) -> None:
    with pytest.raises(ValueError, match="envelope"):
        envelopes_to_batch("s", elements)


@settings(max_examples=120, deadline=None)
@given(envelope_batches(), st.sampled_from([0, 1, 127, 128, 300, 2**40]))
def test_envelope_frames_are_the_onnext_frames_of_the_envelopes(
    batch: Batch, subscriber: int
) -> None:
    expected = b"".join(bytes(encode(OnNext(subscriber, e))) for e in encode_envelopes(batch))
    assert envelope_frames(subscriber, batch) == expected
    heads, values = envelope_parts(batch)
    assert [h + bytes(v) for h, v in zip(heads, values, strict=True)] == encode_envelopes(batch)


def _decode_frames(
    data: bytes, cuts: list[int], subscriber: int, demand: int
) -> tuple[list[Batch], list[bytes]]:
    """Feed ``data`` through a decoder whose subscription ``subscriber`` decodes runs with
    ``envelope_run_decoder`` (demand caps each run), cut at ``cuts``: decoded batches, and
    raw elements the run decoder left alone."""
    left = [demand]

    def run_decoder(sub: int) -> tuple[RunDecoder, int] | None:
        return (envelope_run_decoder("s"), left[0]) if sub == subscriber and left[0] else None

    decoder = Decoder(run_decoder=run_decoder)
    batches: list[Batch] = []
    raw: list[bytes] = []
    points = [0, *sorted(cuts), len(data)]
    for a, b in itertools.pairwise(points):
        decoder.feed(data[a:b])
        while (message := decoder.next_message()) is not None:
            if isinstance(message, OnNextDecoded):
                assert isinstance(message.value, Batch)
                assert len(message.value) == message.count <= left[0]
                left[0] -= message.count
                batches.append(message.value)
            else:
                assert isinstance(message, OnNext)
                left[0] -= 1
                raw.append(message.element)
    assert decoder.buffered == 0
    return batches, raw


@settings(max_examples=150, deadline=None)
@given(envelope_batches(), st.sampled_from([1, 300]), st.data())
def test_run_decoding_gives_back_the_batch(
    batch: Batch, subscriber: int, data: st.DataObject
) -> None:
    frames = envelope_frames(subscriber, batch)
    cuts = data.draw(st.lists(st.integers(0, len(frames)), max_size=8))
    demand = data.draw(st.integers(len(batch), len(batch) + 3))
    batches, raw = _decode_frames(frames, cuts, subscriber, demand)
    assert raw == []
    ids = [e.id for b in batches for e in b]
    assert ids == [e.id for e in batch]
    assert [e for b in batches for e in b] == list(batch)


def test_run_decoding_stops_at_demand_and_before_a_bad_envelope() -> None:
    batch = Batch.build("s", [b"a", b"b", b"c"], ids=[1, 2, 3], timestamps=5)
    frames = envelope_frames(1, batch)
    batches, raw = _decode_frames(frames, [], 1, 2)  # demand 2: a run of 2, then none
    assert [len(b) for b in batches] == [2]
    assert raw == [encode_envelopes(batch)[2]]  # (the connection would breach here)
    bad = bytes(encode(OnNext(1, b"\x09\x01")))  # id 9, timestamp cut short
    batches, raw = _decode_frames(frames + bad + frames, [], 1, 100)
    assert [len(b) for b in batches] == [3, 3]
    assert raw == [b"\x09\x01"]


# --------------------------------------------------------------------------- offers' runs

NOW = 1_234_567


def _offer_parts(elements: list[bytes], cuts: list[int], demand: int) -> list[bytes | OfferRun]:
    """The parts the hub gathers for an offer: ``elements`` framed as ``onNext`` for offer 3,
    fed cut at ``cuts`` through a decoder whose run decoder is ``offer_run_decoder``."""
    data = b"".join(bytes(encode(OnNext(3, e))) for e in elements)
    left = [demand]

    def run_decoder(sub: int) -> tuple[RunDecoder, int] | None:
        return (offer_run_decoder("s"), left[0]) if sub == 3 and left[0] else None

    decoder = Decoder(run_decoder=run_decoder)
    parts: list[bytes | OfferRun] = []
    points = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for a, b in itertools.pairwise(points):
        decoder.feed(data[a:b])
        while (message := decoder.next_message()) is not None:
            if isinstance(message, OnNextDecoded):
                assert isinstance(message.value, OfferRun)
                assert len(message.value.batch) == message.count <= left[0]
                left[0] -= message.count
                parts.append(message.value)
            else:
                assert isinstance(message, OnNext)
                left[0] -= 1
                parts.append(message.element)
    assert decoder.buffered == 0
    return parts


@settings(max_examples=150, deadline=None)
@given(envelope_batches(), st.booleans(), st.lists(st.integers(0, 10_000), max_size=6))
def test_offer_runs_join_into_what_decode_envelopes_gives(
    batch: Batch, with_ids: bool, cuts: list[int]
) -> None:
    elements = encode_envelopes(batch, with_ids=with_ids)
    parts = _offer_parts(elements, cuts, len(elements))
    got, explicit = join_offer_parts("s", parts, NOW)
    want, want_explicit = decode_envelopes("s", elements)
    assert explicit == want_explicit == with_ids
    assert got.ids.tolist() == want.ids.tolist()
    assert [(e.key, e.value) for e in got] == [(e.key, e.value) for e in want]
    assert got.timestamps.tolist() == [t or NOW for t in batch.timestamps.tolist()]


def test_offer_runs_of_same_frames_and_demand() -> None:
    """The publisher's common case (ids left to the hub, one timestamp, one value size) takes
    the same-frame path, within demand; a value of another size ends nothing."""
    batch = Batch.build("s", [b"abc"] * 300 + [b"de"] + [b"fgh"] * 5, timestamps=7)
    elements = encode_envelopes(batch, with_ids=False)
    parts = _offer_parts(elements, [], 250)  # demand 250: one run, then frames one by one
    assert isinstance(parts[0], OfferRun)
    assert len(parts[0].batch) == 250
    assert all(isinstance(p, bytes) for p in parts[1:])
    got, explicit = join_offer_parts("s", parts, NOW)
    assert not explicit
    assert [e.value for e in got] == [e.value for e in batch]
    assert got.ids.tolist() == list(range(1, len(batch) + 1))
    parts = _offer_parts(elements, [5, 900], 10_000)
    assert all(isinstance(p, OfferRun) for p in parts)
    assert join_offer_parts("s", parts, NOW)[0] == got


def test_offer_parts_either_all_carry_ids_or_none() -> None:
    with_ids = encode_envelopes(Batch.build("s", [b"a"], ids=[5], timestamps=1))
    without = encode_envelopes(Batch.build("s", [b"b"], timestamps=1), with_ids=False)
    parts = _offer_parts(with_ids + without, [], 10)
    with pytest.raises(ValueError, match="either all carry ids"):
        join_offer_parts("s", parts, NOW)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("?streams", HubPublisher()),
        ("?streams=", HubPublisher()),
        ("?streams=a,b%2Cc", HubPublisher(streams=("a", "b,c"))),
        ("?times=orders%3D1700000000000", HubPublisher(times=(("orders", 1700000000000),))),
        ("?times=orders=5,a%2Cb%3D0", HubPublisher(times=(("orders", 5), ("a,b", 0)))),
        ("?times=x%3Dy%3D7", HubPublisher(times=(("x=y", 7),))),
    ],
)
def test_hub_publishers_parse(text: str, expected: HubPublisher) -> None:
    assert HubPublisher.parse(text) == expected


@given(st.lists(st.tuples(names.map(lambda n: n.stream), st.integers(0, MAX_ID)), min_size=1,
                max_size=4))  # fmt: skip
def test_hub_publisher_times_round_trip(pairs: list[tuple[str, int]]) -> None:
    own = HubPublisher(times=tuple(pairs))
    assert HubPublisher.parse(str(own)) == own
    assert str(own).isascii()
    assert "=" not in str(own).removeprefix("?times=")
