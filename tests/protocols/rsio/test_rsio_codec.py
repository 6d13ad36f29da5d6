"""The RS.io frame codec (tidewire.protocols.rsio): golden bytes, incremental decoding, round
trips, hostile input and linear-time buffering.

The golden vectors below are written out by hand from the framing decided in
shared/seeds/README.md ("RS.io over TCP (000)"): a frame is the message type as a varint, then
the fields as protobuf primitives with no tags and no frame length; Id/varint/Long are unsigned
LEB128 varints (Long at most 2^63-1); String and bytes are a varint length then the bytes;
List[Id] is a varint count then the ids; in fixed-size mode onNext carries exactly elementSize
bytes with no length prefix and onNextPacked carries count x elementSize bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewire.model import LocalProtocolError, RemoteProtocolError
from tidewire.protocols.rsio import (
    Authenticate,
    Authenticated,
    Cancel,
    ClientHello,
    Committed,
    Decoded,
    Decoder,
    Goodbye,
    Limits,
    Message,
    MessageType,
    Offer,
    OfferEnded,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    OnNextRun,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
    SubscriptionProtocolError,
    encode,
)

MAX_ID = 2**64 - 1
MAX_LONG = 2**63 - 1

ElementSize = Callable[[int], int]


def _h(text: str) -> bytes:
    return bytes.fromhex(text)


def _sizes(mapping: Mapping[int, int]) -> ElementSize:
    """An ``element_size`` callback: the fixed size of each listed subscriber, 0 for others."""
    return lambda subscriber: mapping.get(subscriber, 0)


def _variable(subscriber: int) -> int:
    return 0


# --------------------------------------------------------------------------- golden vectors

# (id, message, fixed element sizes by subscriber, hand-written frame)
GOLDEN: list[tuple[str, Message, dict[int, int], bytes]] = [
    ("clientHello-empty-extensions", ClientHello(0, ()), {}, _h("00 00 00")),
    # 300 = 0b10_0101100 -> ac 02
    ("clientHello-extensions", ClientHello(0, (1, 300)), {}, _h("00 00 02 01 ac 02")),
    (
        "clientHello-max-ids",
        ClientHello(300, (64, MAX_ID)),
        {},
        _h("00 ac 02 02 40 ff ff ff ff ff ff ff ff ff 01"),
    ),
    ("serverHello-empty-extensions", ServerHello(0, ()), {}, _h("01 00 00")),
    ("serverHello-extensions", ServerHello(0, (127, 128)), {}, _h("01 00 02 7f 80 01")),
    ("goodbye-empty", Goodbye(""), {}, _h("02 00")),
    ("goodbye-ascii", Goodbye("bye"), {}, _h("02 03 62 79 65")),
    # é = c3 a9
    ("goodbye-non-ascii", Goodbye("é"), {}, _h("02 02 c3 a9")),
    (
        "subscribe-max-long",
        Subscribe("ticks", 300, MAX_LONG),
        {},
        _h("03 05 74 69 63 6b 73 ac 02 ff ff ff ff ff ff ff ff 7f"),
    ),
    # € = e2 82 ac, / = 2f, ü = c3 bc; initialDemand defaults to 0 and is always sent
    ("subscribe-non-ascii", Subscribe("€/ü", 1), {}, _h("03 06 e2 82 ac 2f c3 bc 01 00")),
    ("request", Request(1, 10), {}, _h("04 01 0a")),
    (
        "request-max",
        Request(MAX_ID, MAX_LONG),
        {},
        _h("04 ff ff ff ff ff ff ff ff ff 01 ff ff ff ff ff ff ff ff 7f"),
    ),
    ("cancel", Cancel(7), {}, _h("05 07")),
    # 16384 = 2^14 -> 80 80 01
    ("cancel-three-byte-id", Cancel(16384), {}, _h("05 80 80 01")),
    ("subscribed-variable", Subscribed(1, 0), {}, _h("06 01 00")),
    ("subscribed-fixed", Subscribed(300, 4), {}, _h("06 ac 02 04")),
    ("onNext-variable", OnNext(1, b"abc"), {}, _h("07 01 03 61 62 63")),
    ("onNext-variable-empty", OnNext(5, b""), {}, _h("07 05 00")),
    # 200 = c8 01
    ("onNext-variable-200", OnNext(2, b"x" * 200), {}, _h("07 02 c8 01") + b"x" * 200),
    ("onNext-fixed", OnNext(1, _h("00 01 02 03")), {1: 4}, _h("07 01 00 01 02 03")),
    ("onNext-fixed-1", OnNext(300, b"\xff"), {300: 1}, _h("07 ac 02 ff")),
    (
        "onNextPacked",
        OnNextPacked(1, 3, _h("01 02 03 04 05 06")),
        {1: 2},
        _h("08 01 03 01 02 03 04 05 06"),
    ),
    ("onNextPacked-one", OnNextPacked(9, 1, b"wxyz"), {9: 4}, _h("08 09 01 77 78 79 7a")),
    ("onComplete", OnComplete(300), {}, _h("09 ac 02")),
    # ☃ = e2 98 83
    ("onError", OnError(2, "bad ☃"), {}, _h("0a 02 07 62 61 64 20 e2 98 83")),
    ("onError-empty", OnError(0, ""), {}, _h("0a 00 00")),
]

GOLDEN_IDS = [case[0] for case in GOLDEN]


# Extension 1 (publishing, docs/protocols/rsio.md): decoded only once negotiated.
EXT_GOLDEN: list[tuple[str, Message, bytes]] = [
    # offer(3, "orders"): 40 03 06 "orders"
    ("offer", Offer(3, "orders"), _h("40 03 06 6f 72 64 65 72 73")),
    ("offer-value-format", Offer(1, "t?format=value"),
     _h("40 01 0e 74 3f 66 6f 72 6d 61 74 3d 76 61 6c 75 65")),
    # committed(3, 1000 = e8 07, 1, 1000)
    ("committed", Committed(3, 1000, 1, 1000), _h("41 03 e8 07 01 e8 07")),
    ("committed-max", Committed(1, 1, MAX_LONG, MAX_LONG),
     _h("41 01 01 ff ff ff ff ff ff ff ff 7f ff ff ff ff ff ff ff ff 7f")),
    ("offerEnded-ok", OfferEnded(3, ""), _h("42 03 00")),
    ("offerEnded-error", OfferEnded(2, "no"), _h("42 02 02 6e 6f")),
    # extension 2: authenticate("ci.s3cr3t"), authenticated("token:ci")
    ("authenticate", Authenticate("ci.s3cr3t"), _h("43 09 63 69 2e 73 33 63 72 33 74")),
    ("authenticated", Authenticated("token:ci"), _h("44 08 74 6f 6b 65 6e 3a 63 69")),
]


def test_golden_vectors_cover_every_message_type() -> None:
    covered = {frame[0] for _, _, _, frame in GOLDEN} | {f[0] for _, _, f in EXT_GOLDEN}
    assert covered == {int(kind) for kind in MessageType}
    assert len(MessageType) == 16


@pytest.mark.parametrize(("name", "message", "frame"), EXT_GOLDEN, ids=[c[0] for c in EXT_GOLDEN])
def test_extension_golden_vectors(name: str, message: Message, frame: bytes) -> None:
    assert bytes(encode(message)) == frame
    for chunk in (len(frame), 1):
        decoder = Decoder(publishing=True, auth=True)
        got: list[Decoded] = []
        for start in range(0, len(frame), chunk):
            decoder.feed(frame[start : start + chunk])
            got += _drain(decoder)
        assert got == [message]
        assert decoder.buffered == 0
    decoder = Decoder(publishing=True, auth=True)
    decoder.feed(frame + TAIL_FRAME)
    assert _drain(decoder) == [message, TAIL_MESSAGE]


@pytest.mark.parametrize("frame", [f for _, _, f in EXT_GOLDEN], ids=[c[0] for c in EXT_GOLDEN])
def test_extension_types_are_unknown_until_negotiated(frame: bytes) -> None:
    decoder = Decoder()
    decoder.feed(frame)
    with pytest.raises(RemoteProtocolError, match="unknown message type"):
        decoder.next_message()


def test_each_extension_is_decoded_only_when_it_is_negotiated() -> None:
    for publishing, auth, frame in ((True, False, _h("43 01 78")), (False, True, _h("42 03 00"))):
        decoder = Decoder(publishing=publishing, auth=auth)
        decoder.feed(frame)
        with pytest.raises(RemoteProtocolError, match="unknown message type"):
            decoder.next_message()


def test_committed_that_cannot_hold_is_a_breach() -> None:
    for frame in (_h("41 01 00 01 01"), _h("41 01 03 05 06"), _h("41 01 01 06 05")):
        decoder = Decoder(publishing=True)
        decoder.feed(frame)
        with pytest.raises(RemoteProtocolError):
            decoder.next_message()


def test_offer_with_invalid_utf8_is_refused_on_its_own() -> None:
    decoder = Decoder(publishing=True)
    decoder.feed(_h("40 05 02 c3 28") + _h("05 07"))
    with pytest.raises(SubscriptionProtocolError) as info:
        decoder.next_message()
    assert info.value.subscriber == 5
    assert decoder.next_message() == Cancel(7)


def _encode_with(message: Message, sizes: Mapping[int, int]) -> bytes:
    subscriber = getattr(message, "subscriber", None)
    size = sizes.get(subscriber, 0) if isinstance(subscriber, int) else 0
    return bytes(encode(message, size))


@pytest.mark.parametrize(("name", "message", "sizes", "frame"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_encode(name: str, message: Message, sizes: dict[int, int], frame: bytes) -> None:
    assert _encode_with(message, sizes) == frame


def test_encode_appends_to_a_given_buffer() -> None:
    out = bytearray(b"\x99")
    result = encode(Cancel(7), 0, out)
    assert result is out
    assert out == _h("99 05 07")


# --------------------------------------------------------------------------- three-way decoding


def _drain(decoder: Decoder) -> list[Decoded]:
    messages: list[Decoded] = []
    while (message := decoder.next_message()) is not None:
        messages.append(message)
    return messages


def _decode_all_at_once(frame: bytes, expected: Message, element_size: ElementSize) -> None:
    decoder = Decoder(element_size=element_size)
    decoder.feed(frame)
    assert decoder.next_message() == expected
    assert decoder.next_message() is None
    assert decoder.buffered == 0


def _decode_byte_by_byte(frame: bytes, expected: Message, element_size: ElementSize) -> None:
    decoder = Decoder(element_size=element_size)
    for i in range(len(frame) - 1):
        decoder.feed(frame[i : i + 1])
        assert decoder.next_message() is None, f"a message after {i + 1} of {len(frame)} bytes"
        assert decoder.buffered == i + 1
    decoder.feed(frame[-1:])
    assert decoder.next_message() == expected
    assert decoder.next_message() is None
    assert decoder.buffered == 0


# A partial next frame: request(1, 2^63-1) without its last byte.
TAIL_FRAME = _h("04 01 ff ff ff ff ff ff ff ff 7f")
TAIL_MESSAGE = Request(1, MAX_LONG)


def _decode_with_trailing_data(frame: bytes, expected: Message, element_size: ElementSize) -> None:
    decoder = Decoder(element_size=element_size)
    decoder.feed(frame + TAIL_FRAME[:-1])
    assert decoder.next_message() == expected
    assert decoder.next_message() is None
    assert decoder.buffered == len(TAIL_FRAME) - 1
    decoder.feed(TAIL_FRAME[-1:])
    assert decoder.next_message() == TAIL_MESSAGE
    assert decoder.next_message() is None
    assert decoder.buffered == 0


DECODE_WAYS = [_decode_all_at_once, _decode_byte_by_byte, _decode_with_trailing_data]


def _decode_three_ways(frame: bytes, expected: Message, element_size: ElementSize) -> None:
    for way in DECODE_WAYS:
        way(frame, expected, element_size)


@pytest.mark.parametrize(("name", "message", "sizes", "frame"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_decode(name: str, message: Message, sizes: dict[int, int], frame: bytes) -> None:
    _decode_three_ways(frame, message, _sizes(sizes))


def test_golden_frames_back_to_back() -> None:
    """Every golden frame in one stream, through one decoder. Subscriber 1 changes mode between
    vectors, so the callback answers with the sizes of the frame being decoded, as a connection
    that applies each message before asking for the next would."""
    stream = b"".join(frame for *_, frame in GOLDEN)
    expected = [message for _, message, _, _ in GOLDEN]
    current: list[dict[int, int]] = [{}]

    def element_size(subscriber: int) -> int:
        return current[0].get(subscriber, 0)

    for chunk_size in (len(stream), 1, 7):
        decoder = Decoder(element_size=element_size)
        got: list[Decoded] = []
        for start in range(0, len(stream), chunk_size):
            decoder.feed(stream[start : start + chunk_size])
            while True:
                current[0] = GOLDEN[len(got)][2] if len(got) < len(GOLDEN) else {}
                message = decoder.next_message()
                if message is None:
                    break
                got.append(message)
        assert got == expected
        assert decoder.buffered == 0


def test_non_canonical_varints_are_accepted() -> None:
    """Protobuf decoders accept padded varints (80 00 = 0); RS.io does not forbid them."""
    _decode_three_ways(_h("05 87 80 80 00"), Cancel(7), _variable)


def test_limits_are_inclusive() -> None:
    limits = Limits(max_string_bytes=3, max_element_bytes=2, max_extensions=1)
    decoder = Decoder(limits)
    decoder.feed(_h("02 03 62 79 65") + _h("07 01 02 61 62") + _h("00 00 01 05"))
    assert _drain(decoder) == [Goodbye("bye"), OnNext(1, b"ab"), ClientHello(0, (5,))]


# --------------------------------------------------------------------------- round trips

ids = st.integers(0, MAX_ID)
longs = st.integers(0, MAX_LONG)
texts = st.text(max_size=40)
blobs = st.binary(max_size=64)
fixed_sizes = st.dictionaries(ids, st.integers(1, 9), max_size=3)


def _message(draw: st.DrawFn, kind: MessageType, fixed: Mapping[int, int]) -> Message:
    variable_ids = ids.filter(lambda i: i not in fixed)
    if kind is MessageType.CLIENT_HELLO:
        return ClientHello(draw(ids), tuple(draw(st.lists(ids, max_size=5))))
    if kind is MessageType.SERVER_HELLO:
        return ServerHello(draw(ids), tuple(draw(st.lists(ids, max_size=5))))
    if kind is MessageType.GOODBYE:
        return Goodbye(draw(texts))
    if kind is MessageType.SUBSCRIBE:
        return Subscribe(draw(texts), draw(ids), draw(longs))
    if kind is MessageType.REQUEST:
        return Request(draw(ids), draw(longs))
    if kind is MessageType.CANCEL:
        return Cancel(draw(ids))
    if kind is MessageType.SUBSCRIBED:
        return Subscribed(draw(ids), draw(ids))
    if kind is MessageType.ON_NEXT:
        use_fixed: bool = draw(st.booleans())
        if fixed and use_fixed:
            subscriber = draw(st.sampled_from(sorted(fixed)))
            size = fixed[subscriber]
            return OnNext(subscriber, draw(st.binary(min_size=size, max_size=size)))
        return OnNext(draw(variable_ids), draw(blobs))
    if kind is MessageType.ON_NEXT_PACKED:
        subscriber = draw(st.sampled_from(sorted(fixed)))
        count = draw(st.integers(1, 6))
        total = count * fixed[subscriber]
        return OnNextPacked(subscriber, count, draw(st.binary(min_size=total, max_size=total)))
    if kind is MessageType.ON_COMPLETE:
        return OnComplete(draw(ids))
    if kind is MessageType.OFFER:
        return Offer(draw(ids), draw(texts))
    if kind is MessageType.COMMITTED:
        first = draw(st.integers(1, MAX_LONG))
        last = draw(st.integers(first, MAX_LONG))
        return Committed(draw(ids), draw(st.integers(1, min(last - first + 1, 10**6))), first, last)
    if kind is MessageType.OFFER_ENDED:
        return OfferEnded(draw(ids), draw(texts))
    if kind is MessageType.AUTHENTICATE:
        return Authenticate(draw(texts))
    if kind is MessageType.AUTHENTICATED:
        return Authenticated(draw(texts))
    assert kind is MessageType.ON_ERROR
    return OnError(draw(ids), draw(texts))


@st.composite
def streams(
    draw: st.DrawFn, kinds: Sequence[MessageType] = tuple(MessageType)
) -> tuple[dict[int, int], list[Message]]:
    fixed = draw(fixed_sizes)
    allowed = [k for k in kinds if fixed or k is not MessageType.ON_NEXT_PACKED]
    if not allowed:  # only onNextPacked was asked for: it needs a fixed-size subscriber
        fixed = {draw(ids): draw(st.integers(1, 9))}
        allowed = list(kinds)
    messages = [
        _message(draw, draw(st.sampled_from(allowed)), fixed)
        for _ in range(draw(st.integers(1, 8)))
    ]
    return fixed, messages


def _encode_stream(fixed: Mapping[int, int], messages: Sequence[Message]) -> bytes:
    return b"".join(_encode_with(message, fixed) for message in messages)


def _split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in pairwise(points)]


def _check_stream(fixed: dict[int, int], messages: list[Message], cut_data: st.DataObject) -> None:
    data = _encode_stream(fixed, messages)
    cuts = cut_data.draw(st.lists(st.integers(0, len(data)), max_size=12), label="cuts")
    decoder = Decoder(element_size=_sizes(fixed), publishing=True, auth=True)
    got: list[Decoded] = []
    for chunk in _split(data, cuts):
        decoder.feed(chunk)
        got += _drain(decoder)
    assert got == messages
    assert decoder.buffered == 0


ROUND_TRIP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("kind", list(MessageType), ids=[k.name for k in MessageType])
@ROUND_TRIP
@given(cut_data=st.data())
def test_round_trip_each_type(kind: MessageType, cut_data: st.DataObject) -> None:
    fixed, messages = cut_data.draw(streams(kinds=(kind,)), label="stream")
    _check_stream(fixed, messages, cut_data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), cut_data=st.data())
def test_round_trip_mixed_streams(
    stream: tuple[dict[int, int], list[Message]], cut_data: st.DataObject
) -> None:
    fixed, messages = stream
    _check_stream(fixed, messages, cut_data)


@ROUND_TRIP
@given(stream=streams())
def test_round_trip_byte_by_byte(stream: tuple[dict[int, int], list[Message]]) -> None:
    fixed, messages = stream
    data = _encode_stream(fixed, messages)
    decoder = Decoder(element_size=_sizes(fixed), publishing=True, auth=True)
    got: list[Decoded] = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        got += _drain(decoder)
    assert got == messages
    assert decoder.buffered == 0


# --------------------------------------------------------------------------- bad input


def _assert_dead(decoder: Decoder) -> None:
    """A decoder that hit a connection-level breach keeps refusing."""
    with pytest.raises(RemoteProtocolError):
        decoder.next_message()
    with pytest.raises(RemoteProtocolError):
        decoder.feed(_h("05 07"))
    with pytest.raises(RemoteProtocolError):
        decoder.next_message()


def _assert_breach(
    data: bytes,
    *,
    limits: Limits | None = None,
    element_size: ElementSize = _variable,
    match: str | None = None,
) -> RemoteProtocolError:
    decoder = Decoder(limits, element_size)
    decoder.feed(data)
    with pytest.raises(RemoteProtocolError, match=match) as info:
        decoder.next_message()
    assert not isinstance(info.value, SubscriptionProtocolError)
    _assert_dead(decoder)
    return info.value


@pytest.mark.parametrize(
    "frame",
    [_h("0b"), _h("40"), _h("40 00 00"), _h("80 01"), _h("ff ff ff ff ff ff ff ff ff 01")],
    ids=["11", "64", "64-with-body", "128", "max-varint"],
)
def test_unknown_message_type_kills_the_decoder(frame: bytes) -> None:
    _assert_breach(frame, match="unknown message type")


def test_unknown_message_type_after_good_frames() -> None:
    decoder = Decoder()
    decoder.feed(_h("05 07") + _h("0b 00") + _h("05 08"))
    assert decoder.next_message() == Cancel(7)
    with pytest.raises(RemoteProtocolError):
        decoder.next_message()
    _assert_dead(decoder)


@pytest.mark.parametrize(
    "data",
    [
        _h("05") + _h("ff") * 10 + _h("01"),  # an 11-byte id
        _h("05") + _h("80") * 10 + _h("00"),  # an 11-byte zero, padded
        _h("80") * 10 + _h("00"),  # an 11-byte message type
        _h("05") + _h("ff") * 10,  # the 10th byte still says "more": fails before an 11th
    ],
    ids=["id-ff", "id-padded-zero", "type", "no-11th-byte-yet"],
)
def test_varint_longer_than_ten_bytes(data: bytes) -> None:
    _assert_breach(data, match="longer than 10 bytes")


@pytest.mark.parametrize("last", [0x02, 0x03, 0x40, 0x7F])
def test_ten_byte_varint_above_64_bits(last: int) -> None:
    _assert_breach(_h("05") + _h("ff") * 9 + bytes([last]), match="exceeds 64 bits")
    _assert_breach(_h("09") + _h("80") * 9 + bytes([last]), match="exceeds 64 bits")


# 2^63 = 80 80 80 80 80 80 80 80 80 01; 2^64-1 = ff x 9, 01
LONG_2_63 = _h("80 80 80 80 80 80 80 80 80 01")
LONG_MAX_ID = _h("ff ff ff ff ff ff ff ff ff 01")


@pytest.mark.parametrize("value", [LONG_2_63, LONG_MAX_ID], ids=["2^63", "2^64-1"])
def test_long_above_2_63_minus_1_in_request(value: bytes) -> None:
    _assert_breach(_h("04 01") + value, match="Long")


@pytest.mark.parametrize("value", [LONG_2_63, LONG_MAX_ID], ids=["2^63", "2^64-1"])
def test_long_above_2_63_minus_1_in_subscribe(value: bytes) -> None:
    _assert_breach(_h("03 01 70 01") + value, match="Long")


def test_ids_and_sizes_up_to_2_64_minus_1_are_not_longs() -> None:
    """Only Long fields stop at 2^63-1: an Id or an elementSize may use all 64 bits."""
    _decode_three_ways(_h("06") + LONG_2_63 + LONG_MAX_ID, Subscribed(2**63, MAX_ID), _variable)


SMALL = Limits(max_string_bytes=8, max_element_bytes=16, max_packed_bytes=32, max_extensions=3)


@pytest.mark.parametrize(
    ("header", "element_size"),
    [
        (_h("02 09"), _variable),  # goodbye reason of 9 > 8 bytes
        (_h("02 ff ff ff ff 0f"), _variable),  # goodbye reason of 4 GiB
        (_h("03 09"), _variable),  # subscribe publisher
        (_h("0a 01 09"), _variable),  # onError error
        (_h("07 01 11"), _variable),  # onNext element of 17 > 16 bytes
        (_h("07 01 ff ff ff ff ff ff ff ff ff 01"), _variable),  # a 2^64-1 byte element
        (_h("07 01"), _sizes({1: 17})),  # fixed-size elements of 17 > 16 bytes
        (_h("08 01 03"), _sizes({1: 11})),  # packed 3 x 11 = 33 > 32 bytes
        (_h("08 01 ff ff ff ff 0f"), _sizes({1: 1})),  # packed 2^32-1 elements
        (_h("00 00 04"), _variable),  # clientHello with 4 > 3 extensions
        (_h("01 00 ff ff 03"), _variable),  # serverHello with 65535 extensions
    ],
    ids=[
        "goodbye",
        "goodbye-huge",
        "subscribe",
        "onError",
        "onNext",
        "onNext-huge",
        "onNext-fixed",
        "onNextPacked",
        "onNextPacked-huge-count",
        "clientHello",
        "serverHello",
    ],
)
def test_over_limit_length_fails_on_the_header_alone(
    header: bytes, element_size: ElementSize
) -> None:
    """Only the header is fed: the breach must show before any of the body is buffered."""
    _assert_breach(header, limits=SMALL, element_size=element_size, match="limit")


def test_default_limits_reject_a_huge_length_prefix_at_once() -> None:
    # a 1 GiB element (2^30 = 80 80 80 80 04) and a 1 MiB string (2^20 = 80 80 40)
    _assert_breach(_h("07 01 80 80 80 80 04"), match="limit")
    _assert_breach(_h("02 80 80 40"), match="limit")


def test_over_limit_header_fed_byte_by_byte_fails_when_the_length_completes() -> None:
    header = _h("07 01 11")
    decoder = Decoder(SMALL)
    for byte in header[:-1]:
        decoder.feed(bytes([byte]))
        assert decoder.next_message() is None
    decoder.feed(header[-1:])
    with pytest.raises(RemoteProtocolError, match="limit"):
        decoder.next_message()
    _assert_dead(decoder)


def test_on_next_packed_outside_fixed_size_mode() -> None:
    _assert_breach(_h("08 01 01 61"), match="not in fixed-size mode")
    # fixed-size mode is per subscriber: subscriber 2 is fixed, subscriber 1 is not
    _assert_breach(_h("08 01 01 61"), element_size=_sizes({2: 1}), match="fixed-size")


def test_on_next_packed_with_count_zero() -> None:
    _assert_breach(_h("08 01 00"), element_size=_sizes({1: 4}), match="count of 0")


INVALID_UTF8 = {
    "bad-continuation": _h("c3 28"),
    "lone-continuation": _h("80"),
    "overlong-nul": _h("c0 80"),
    "surrogate": _h("ed a0 80"),
    "truncated": _h("e2 82"),
    "ff": _h("ff"),
    "above-u10ffff": _h("f4 90 80 80"),
}


@pytest.mark.parametrize("bad", list(INVALID_UTF8.values()), ids=list(INVALID_UTF8))
def test_invalid_utf8_publisher_is_a_subscription_error(bad: bytes) -> None:
    frame = _h("03") + bytes([len(bad)]) + bad + _h("ac 02 05")  # subscriber 300, demand 5
    following = _h("05 07")  # cancel(7)
    decoder = Decoder()
    decoder.feed(frame + following)
    with pytest.raises(SubscriptionProtocolError) as info:
        decoder.next_message()
    assert info.value.subscriber == 300
    assert isinstance(info.value, RemoteProtocolError)
    assert decoder.buffered == len(following)  # the bad frame was consumed, no more
    assert decoder.next_message() == Cancel(7)
    assert decoder.next_message() is None
    assert decoder.buffered == 0
    decoder.feed(_h("09 01"))  # the decoder is still alive
    assert decoder.next_message() == OnComplete(1)


def test_invalid_utf8_publisher_fed_byte_by_byte() -> None:
    """The subscription error is raised once, when the whole frame (id and demand) is in."""
    frame = _h("03 02 c3 28 ac 02 ff ff ff ff ff ff ff ff 7f")
    decoder = Decoder()
    for i in range(len(frame) - 1):
        decoder.feed(frame[i : i + 1])
        assert decoder.next_message() is None
    decoder.feed(frame[-1:] + _h("05"))
    with pytest.raises(SubscriptionProtocolError) as info:
        decoder.next_message()
    assert info.value.subscriber == 300
    assert decoder.buffered == 1
    assert decoder.next_message() is None
    decoder.feed(_h("07"))
    assert decoder.next_message() == Cancel(7)


def test_invalid_utf8_publisher_then_bad_long_is_a_connection_breach() -> None:
    """The rest of the frame is still checked: a bad Long after a bad String kills the
    connection rather than being reported as a subscription error."""
    _assert_breach(_h("03 01 ff 01") + LONG_2_63, match="Long")


@pytest.mark.parametrize("bad", list(INVALID_UTF8.values()), ids=list(INVALID_UTF8))
@pytest.mark.parametrize("prefix", [_h("02"), _h("0a 03")], ids=["goodbye", "onError"])
def test_invalid_utf8_in_goodbye_or_on_error_is_a_connection_breach(
    prefix: bytes, bad: bytes
) -> None:
    _assert_breach(prefix + bytes([len(bad)]) + bad + _h("05 07"), match="UTF-8")


# --------------------------------------------------------------------------- encode-side checks


def test_encode_fixed_size_element_of_the_wrong_size() -> None:
    with pytest.raises(LocalProtocolError):
        encode(OnNext(1, b"abc"), element_size=4)
    with pytest.raises(LocalProtocolError):
        encode(OnNext(1, b"abcde"), element_size=4)
    with pytest.raises(LocalProtocolError):
        encode(OnNext(1, b""), element_size=1)


def test_encode_on_next_packed_needs_fixed_size_mode() -> None:
    with pytest.raises(LocalProtocolError):
        encode(OnNextPacked(1, 2, b"abcd"))
    with pytest.raises(LocalProtocolError):
        encode(OnNextPacked(1, 2, b"abcd"), element_size=0)
    with pytest.raises(LocalProtocolError):
        encode(OnNextPacked(1, 2, b"abcd"), element_size=4)  # 2 x 4 != 4 bytes


def test_failed_packed_encode_leaves_the_buffer_untouched() -> None:
    out = bytearray(b"\x01")
    with pytest.raises(LocalProtocolError):
        encode(OnNextPacked(1, 2, b"abcd"), 0, out)
    assert out == b"\x01"


def test_failed_on_next_encode_leaves_the_buffer_untouched() -> None:
    out = bytearray(b"\x01")
    with pytest.raises(LocalProtocolError):
        encode(OnNext(1, b"abc"), 4, out)
    assert out == b"\x01"


@pytest.mark.parametrize(
    "build",
    [
        lambda: ClientHello(-1),
        lambda: ClientHello(2**64),
        lambda: ClientHello(0, (1, 2**64)),
        lambda: ClientHello(0, (-1,)),
        lambda: ServerHello(2**64),
        lambda: ServerHello(0, (2**64,)),
        lambda: Subscribe("p", -1),
        lambda: Subscribe("p", 2**64),
        lambda: Subscribe("p", 1, 2**63),
        lambda: Subscribe("p", 1, -1),
        lambda: Request(2**64, 1),
        lambda: Request(1, 2**63),
        lambda: Request(1, 2**64 - 1),
        lambda: Request(1, -1),
        lambda: Cancel(2**64),
        lambda: Cancel(-1),
        lambda: Subscribed(2**64),
        lambda: Subscribed(1, 2**64),
        lambda: Subscribed(1, -1),
        lambda: OnNext(2**64, b""),
        lambda: OnNext(-1, b""),
        lambda: OnNextPacked(2**64, 1, b"a"),
        lambda: OnNextPacked(1, 0, b""),
        lambda: OnNextPacked(1, -1, b"a"),
        lambda: OnNextPacked(1, 2, b"abc"),
        lambda: OnComplete(2**64),
        lambda: OnComplete(-1),
        lambda: OnError(2**64, "x"),
        lambda: OnError(-1, "x"),
    ],
)
def test_constructors_reject_out_of_range_values(build: Callable[[], Message]) -> None:
    with pytest.raises(LocalProtocolError):
        build()


def test_constructors_accept_the_boundaries() -> None:
    assert Request(MAX_ID, MAX_LONG).demand == MAX_LONG
    assert Subscribe("", MAX_ID, MAX_LONG).initial_demand == MAX_LONG
    assert Subscribe("p", 0).initial_demand == 0
    assert ClientHello(MAX_ID, (0, MAX_ID)).extensions == (0, MAX_ID)
    assert ClientHello() == ClientHello(0, ())
    assert Subscribed(MAX_ID, MAX_ID).element_size == MAX_ID
    packed = OnNextPacked(MAX_ID, 3, b"aabbcc")
    assert (packed.element_size, packed.element(1)) == (2, b"bb")


@pytest.mark.parametrize(
    "build",
    [
        lambda: Goodbye("\ud800"),
        lambda: Subscribe("pub\udfff", 1),
        lambda: OnError(1, "x\ud83d"),
    ],
    ids=["goodbye", "subscribe", "onError"],
)
def test_string_that_is_not_utf8_encodable_is_a_local_protocol_error(
    build: Callable[[], Message],
) -> None:
    with pytest.raises(LocalProtocolError):
        encode(build())  # refusing it in the constructor or in encode are both fine


# --------------------------------------------------------------------------- linear buffering


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    # Wraps the private parse step on purpose: "never re-scan the buffer" is a property of the
    # algorithm, seen only as how often it parses; a public counter would serve tests alone,
    # and timing it instead would be flaky.
    calls = [0]
    original = Decoder._parse

    def counting(self: Decoder, buf: bytearray, pos: int) -> tuple[Decoded, int]:
        calls[0] += 1
        return original(self, buf, pos)

    monkeypatch.setattr(Decoder, "_parse", counting)
    return calls


FOUR_MIB = 4 * 1024 * 1024
KIB = 1024
# 2^22 = 80 80 80 02
BIG_CASES = [
    ("onNext-variable", _h("07 01 80 80 80 02"), {}, OnNext(1, b"\xab" * FOUR_MIB)),
    ("onNext-fixed", _h("07 01"), {1: FOUR_MIB}, OnNext(1, b"\xab" * FOUR_MIB)),
    (
        "onNextPacked",
        _h("08 01 80 80 01"),  # 16384 elements of 256 bytes
        {1: 256},
        OnNextPacked(1, 16384, b"\xab" * FOUR_MIB),
    ),
]


@pytest.mark.parametrize(
    ("name", "header", "sizes", "expected"), BIG_CASES, ids=[c[0] for c in BIG_CASES]
)
def test_big_frame_in_1_kib_chunks_is_parsed_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    header: bytes,
    sizes: dict[int, int],
    expected: Message,
) -> None:
    calls = _count_parses(monkeypatch)
    frame = header + b"\xab" * FOUR_MIB
    assert _encode_with(expected, sizes) == frame
    decoder = Decoder(element_size=_sizes(sizes))
    got: list[Decoded] = []
    chunks = 0
    for start in range(0, len(frame), KIB):
        decoder.feed(frame[start : start + KIB])
        chunks += 1
        got += _drain(decoder)
        if start + KIB < len(frame):
            assert got == []
    assert chunks >= 4096
    assert got == [expected]
    assert decoder.buffered == 0
    assert calls[0] < 20, f"{calls[0]} parse attempts for {chunks} chunks"


def test_max_size_string_byte_by_byte_is_parsed_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _count_parses(monkeypatch)
    reason = "é" * (32 * 1024)  # 64 KiB of UTF-8, the default limit; 2^16 = 80 80 04
    frame = _h("02 80 80 04") + reason.encode()
    decoder = Decoder()
    for i in range(len(frame) - 1):
        decoder.feed(frame[i : i + 1])
        assert decoder.next_message() is None
    decoder.feed(frame[-1:])
    assert decoder.next_message() == Goodbye(reason)
    # one attempt per header byte at most, then one wait for the body and the final parse
    assert calls[0] < 20


# --------------------------------------------------------------------------- element runs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), cut_data=st.data())
def test_runs_carry_the_same_elements_as_single_frames(
    stream: tuple[dict[int, int], list[Message]], cut_data: st.DataObject
) -> None:
    """A decoder made with ``runs=True`` coalesces consecutive variable-size onNext frames of
    one subscriber into an OnNextRun; expanded, the runs give back exactly the messages, in
    order, however the bytes are cut."""
    fixed, messages = stream
    extra = cut_data.draw(st.lists(st.binary(max_size=300), max_size=20), label="run")
    subscriber = cut_data.draw(st.sampled_from([1, 200]).filter(lambda s: s not in fixed))
    messages = messages + [OnNext(subscriber, e) for e in extra]
    data = _encode_stream(fixed, messages)
    cuts = cut_data.draw(st.lists(st.integers(0, len(data)), max_size=12), label="cuts")
    decoder = Decoder(element_size=_sizes(fixed), publishing=True, auth=True, runs=True)
    got: list[object] = []
    for chunk in _split(data, cuts):
        decoder.feed(chunk)
        while (message := decoder.next_message()) is not None:
            if isinstance(message, OnNextRun):
                got += [OnNext(message.subscriber, e) for e in message.elements]
            else:
                got.append(message)
    assert got == messages
    assert decoder.buffered == 0


def test_a_run_stops_at_another_subscriber_and_at_a_cut_frame() -> None:
    decoder = Decoder(runs=True)
    frames = [OnNext(1, b"a"), OnNext(1, b"b" * 200), OnNext(2, b"c"), OnNext(2, b"d")]
    data = b"".join(bytes(encode(m)) for m in frames)
    decoder.feed(data[:-1])
    assert decoder.next_message() == OnNextRun(1, [b"a", b"b" * 200])
    assert decoder.next_message() == OnNextRun(2, [b"c"])
    assert decoder.next_message() is None
    decoder.feed(data[-1:])
    assert decoder.next_message() == OnNextRun(2, [b"d"])
