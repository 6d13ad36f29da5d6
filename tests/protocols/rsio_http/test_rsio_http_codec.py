"""RS.io over HTTP, sans-IO (seed 002 and shared/seeds/README.md "RS.io over HTTP (002)"): the
two batched bodies byte for byte (4-byte unsigned big-endian lengths and N), ``decode_body``,
the query's ``request`` argument (``parse_count``, ``split_query``), and each side's
subscription state: the server's demand, deliveries that count only once written in full, the
resend of the last delivery, and the client's de-duplication after a resend. No sockets."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.model import Batch, LocalProtocolError, RemoteProtocolError
from tidewire.protocols.rsio_http import (
    ERROR_HEADER,
    FIXED_SIZE,
    LENGTH_PREFIXED,
    MAX_DEMAND,
    SEQUENCE_HEADER,
    BadRequest,
    ClientSubscription,
    Delivery,
    ServerSubscription,
    State,
    decode_body,
    decode_fixed_size,
    decode_length_prefixed,
    encode_fixed_size,
    encode_length_prefixed,
    length_prefixed_values,
    parse_count,
    split_query,
)


def h(text: str) -> bytes:
    """Bytes from hex written with spaces between the fields."""
    return bytes.fromhex(text)


# --------------------------------------------------------------------------- names


def test_header_and_encoding_names_are_the_seeds() -> None:
    assert LENGTH_PREFIXED == "X-Rsio-LengthPrefixedElements"
    assert FIXED_SIZE == "X-Rsio-FixedSizeElements"
    assert ERROR_HEADER == "X-Rsio-Error"
    assert SEQUENCE_HEADER == "X-Tidewire-Sequence"
    assert MAX_DEMAND == 2**63 - 1


# --------------------------------------------------------------------------- golden bodies


def test_length_prefixed_golden_bytes() -> None:
    wire = h("00000002 6162 00000000 00000003 78797a")
    assert encode_length_prefixed([b"ab", b"", b"xyz"]) == wire
    assert decode_length_prefixed(wire) == [b"ab", b"", b"xyz"]
    assert decode_body(LENGTH_PREFIXED, wire) == [b"ab", b"", b"xyz"]
    # Big-endian: 258 is 00 00 01 02, never 02 01 00 00.
    big = h("00000102") + b"q" * 258
    assert encode_length_prefixed([b"q" * 258]) == big
    assert decode_length_prefixed(big) == [b"q" * 258]
    # Unsigned: a length with the top bit set is a (huge) length, cut short here.
    with pytest.raises(RemoteProtocolError, match="cut short"):
        decode_length_prefixed(h("80000000 00"))
    # bytearray and memoryview elements encode the same as bytes
    assert encode_length_prefixed([bytearray(b"ab"), memoryview(b"xyz")]) == h(
        "00000002 6162 00000003 78797a"
    )
    assert encode_length_prefixed([]) == b""
    assert decode_length_prefixed(b"") == []


def test_the_documented_examples() -> None:
    """docs/protocols/rsio-http.md: two elements ``a`` and ``bb``; ``aa`` and ``bb`` with N=2."""
    wire = h("00000001 61 00000002 6262")
    assert encode_length_prefixed([b"a", b"bb"]) == wire
    assert decode_body(LENGTH_PREFIXED, wire) == [b"a", b"bb"]
    wire = h("00000002 6161 6262")
    assert encode_fixed_size(2, b"aabb") == wire
    assert decode_body(FIXED_SIZE, wire) == [b"aa", b"bb"]


def test_fixed_size_golden_bytes() -> None:
    wire = h("00000003 616263 646566")
    assert encode_fixed_size(3, b"abcdef") == wire
    size, packed = decode_fixed_size(wire)
    assert (size, bytes(packed)) == (3, b"abcdef")
    assert decode_body(FIXED_SIZE, wire) == [b"abc", b"def"]
    big = h("00000102") + bytes(range(256)) * 2 + b"\x00\x01" * 2  # N = 258, two elements
    assert encode_fixed_size(258, big[4:]) == big
    assert decode_body(FIXED_SIZE, big) == [big[4:262], big[262:]]
    assert encode_fixed_size(1, b"") == h("00000001")
    assert encode_fixed_size(2, bytearray(b"abcd")) == h("00000002 61626364")
    assert encode_fixed_size(2, memoryview(b"abcd")) == h("00000002 61626364")


def test_encode_fixed_size_refuses_what_is_not_whole_elements() -> None:
    with pytest.raises(ValueError, match="not whole elements"):
        encode_fixed_size(2, b"abc")
    with pytest.raises(ValueError, match="not whole elements"):
        encode_fixed_size(0, b"")
    with pytest.raises(ValueError, match="not whole elements"):
        encode_fixed_size(-1, b"ab")


def test_decode_body_of_a_single_element_and_unknown_encodings() -> None:
    assert decode_body(None, b"\x00\x00\x00\x02ab") == [b"\x00\x00\x00\x02ab"]  # as it is
    assert decode_body(None, b"") == [b""]
    assert decode_body("", b"abc") == [b"abc"]
    # HTTP header values compare without regard to case
    assert decode_body("x-rsio-lengthprefixedelements", h("00000001 61")) == [b"a"]
    assert decode_body("X-RSIO-FIXEDSIZEELEMENTS", h("00000001 6162")) == [b"a", b"b"]
    for encoding in ("gzip", "identity", "X-Rsio-Elements", f"{LENGTH_PREFIXED}, gzip"):
        with pytest.raises(RemoteProtocolError, match="unknown Content-Encoding"):
            decode_body(encoding, b"")


@pytest.mark.parametrize(
    "body",
    [
        h("00"),  # inside the first length
        h("000000"),
        h("00000005 61626364"),  # an element cut short
        h("00000001 61 0000"),  # the second length cut
        h("00000001 61 00000002 62"),  # the second element cut
        h("ffffffff"),
    ],
)
def test_truncated_length_prefixed_bodies_raise(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_length_prefixed(body)
    with pytest.raises(RemoteProtocolError):
        decode_body(LENGTH_PREFIXED, body)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"", "without its size"),
        (h("000000"), "without its size"),
        (h("00000000"), "elements of 0"),  # N = 0
        (h("00000000 616263"), "elements of 0"),
        (h("00000002 616263"), "not whole elements of 2"),  # 3 bytes, N = 2
        (h("00000004 616263"), "not whole elements of 4"),
    ],
)
def test_truncated_or_zero_size_fixed_bodies_raise(body: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        decode_fixed_size(body)
    with pytest.raises(RemoteProtocolError, match=match):
        decode_body(FIXED_SIZE, body)


def test_decode_length_prefixed_bounds_the_element_count() -> None:
    body = encode_length_prefixed([b""] * 3)
    assert decode_length_prefixed(body, max_elements=3) == [b""] * 3
    with pytest.raises(RemoteProtocolError, match="more than 2 elements"):
        decode_length_prefixed(body, max_elements=2)


# --------------------------------------------------------------------------- round trips

elements = st.lists(st.binary(max_size=40), max_size=20)


@settings(max_examples=200, deadline=None)
@given(elements)
def test_length_prefixed_round_trip(values: list[bytes]) -> None:
    body = encode_length_prefixed(values)
    assert len(body) == 4 * len(values) + sum(map(len, values))
    assert decode_length_prefixed(body) == values
    assert decode_body(LENGTH_PREFIXED, body) == values
    # the layout, independently: [u32 BE length][element]...
    pos = 0
    for value in values:
        (size,) = struct.unpack_from(">I", body, pos)
        assert body[pos + 4 : pos + 4 + size] == value
        pos += 4 + size
    assert pos == len(body)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9), st.data())
def test_fixed_size_round_trip(size: int, data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 12))
    packed = data.draw(st.binary(min_size=n * size, max_size=n * size))
    body = encode_fixed_size(size, packed)
    assert body[:4] == size.to_bytes(4, "big")
    got_size, got = decode_fixed_size(body)
    assert (got_size, bytes(got)) == (size, packed)
    assert decode_body(FIXED_SIZE, body) == [packed[i : i + size] for i in range(0, n * size, size)]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_decoders_take_any_bytes_without_crashing(body: bytes) -> None:
    """Whatever arrives either decodes (and then encodes back to itself) or is a
    RemoteProtocolError: never another exception."""
    try:
        values = decode_length_prefixed(body)
    except RemoteProtocolError:
        pass
    else:
        assert encode_length_prefixed(values) == body
    try:
        size, packed = decode_fixed_size(body)
    except RemoteProtocolError:
        pass
    else:
        assert encode_fixed_size(size, packed) == body


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=30), min_size=1, max_size=20), st.data())
def test_length_prefixed_values_from_a_batchs_columns(
    values: list[bytes], data: st.DataObject
) -> None:
    batch = Batch.build("s", values)
    assert length_prefixed_values(batch.values, batch.value_offsets) == encode_length_prefixed(
        values
    )
    start = data.draw(st.integers(0, len(values) - 1))
    stop = data.draw(st.integers(start + 1, len(values)))
    part = batch.slice(start, stop)
    assert part.value_offsets[0] == sum(map(len, values[:start]))  # above 0 when sliced
    assert length_prefixed_values(part.values, part.value_offsets) == encode_length_prefixed(
        values[start:stop]
    )


def test_length_prefixed_values_of_a_slice_starting_above_zero() -> None:
    batch = Batch.build("s", [b"first", b"", b"third", b"4"])
    part = batch.slice(1, 4)
    assert part.value_offsets[0] == 5
    assert length_prefixed_values(part.values, part.value_offsets) == h(
        "00000000 00000005 7468697264 00000001 34"
    )
    part = batch.slice(2, 3)
    assert length_prefixed_values(part.values, part.value_offsets) == h("00000005 7468697264")


# --------------------------------------------------------------------------- request=


def test_parse_count_accepts_decimal_counts_up_to_2_63_minus_1() -> None:
    assert parse_count("0") == 0
    assert parse_count("1") == 1
    assert parse_count("007") == 7
    assert parse_count(str(2**63 - 1)) == 2**63 - 1
    assert parse_count("0" * 19) == 0


@pytest.mark.parametrize(
    "text",
    [
        str(2**63),  # 19 digits, one over
        "-1",
        "+5",
        "1e3",
        "",
        "1" * 20,
        "0" * 20,  # 20 digits even when small
        "abc",
        " 5",
        "5 ",
        "0x10",
        "1.0",
        "\uff15",  # a fullwidth 5: int() would take it
        "5\n",
    ],
)
def test_parse_count_refuses(text: str) -> None:
    with pytest.raises(BadRequest, match="request="):
        parse_count(text)
    with pytest.raises(BadRequest, match="requestMore="):
        parse_count(text, "requestMore")
    assert issubclass(BadRequest, ValueError)


def test_split_query() -> None:
    assert split_query("") == ("", 0)
    assert split_query("request=0") == ("", 0)
    assert split_query("request=12") == ("", 12)
    assert split_query(f"request={2**63 - 1}") == ("", 2**63 - 1)
    # the other arguments stay as they came: percent-encoded, in order, values may be empty
    assert split_query("from=5&key=a%26b%3D&until=9") == ("from=5&key=a%26b%3D&until=9", 0)
    assert split_query("z=1&request=3&a=%20&m=") == ("z=1&a=%20&m=", 3)
    assert split_query("request=3&b=2&a=1") == ("b=2&a=1", 3)
    # only the exact name "request" is the demand
    assert split_query("Request=5&requests=2&request%3D=1") == (
        "Request=5&requests=2&request%3D=1",
        0,
    )
    # names other than request may repeat: the publisher decides
    assert split_query("a=1&a=2") == ("a=1&a=2", 0)


@pytest.mark.parametrize(
    "query",
    [
        f"request={2**63}",
        "request=-1",
        "request=+5",
        "request=1e3",
        "request=",
        "request=" + "9" * 20,
        "request=1&request=2",
        "request=1&request=1",
        "request=0&request=0",
        "request=abc",
        "from",  # an argument without "="
        "a=1&b",
        "request",
        "=5",
        "a=1&&b=2",
        "a=1&",
        "&",
    ],
)
def test_split_query_refuses(query: str) -> None:
    with pytest.raises(BadRequest):
        split_query(query)


# --------------------------------------------------------------------------- ServerSubscription


def test_server_demand_saturates_at_2_63_minus_1() -> None:
    sub = ServerSubscription()
    assert (sub.demand, sub.next_seq, sub.unsent, sub.last) == (0, 0, None, None)
    assert sub.state is State.OPEN
    sub.request(0)  # a fetch may carry request=0
    assert sub.demand == 0
    sub.request(MAX_DEMAND - 1)
    sub.request(5)
    assert sub.demand == MAX_DEMAND
    sub.request(MAX_DEMAND)
    assert sub.demand == MAX_DEMAND
    with pytest.raises(LocalProtocolError):
        sub.request(-1)
    assert sub.demand == MAX_DEMAND


def test_server_prepares_within_demand_only() -> None:
    sub = ServerSubscription()
    with pytest.raises(LocalProtocolError):
        sub.prepare([b"a"])  # no demand
    sub.request(2)
    with pytest.raises(LocalProtocolError):
        sub.prepare([b"a", b"b", b"c"])
    with pytest.raises(LocalProtocolError):
        sub.prepare([])
    with pytest.raises(LocalProtocolError):
        sub.prepared(b"abc", 3, LENGTH_PREFIXED)
    with pytest.raises(LocalProtocolError):
        sub.prepared(b"", 0, None)
    assert (sub.demand, sub.unsent) == (2, None)
    one = sub.prepare([b"a"])
    assert one == Delivery(0, 1, b"a", None)  # a single element: its bytes, no encoding
    assert sub.unsent is one
    assert sub.room == 1
    with pytest.raises(LocalProtocolError, match="unsent"):
        sub.prepare([b"b"])  # the unsent one goes first
    with pytest.raises(LocalProtocolError, match="unsent"):
        sub.prepared(b"b", 1, None)


def test_server_batches_by_element_size() -> None:
    sub = ServerSubscription()
    sub.request(10)
    d = sub.prepare([b"ab", b"", b"c"])
    assert d == Delivery(0, 3, h("00000002 6162 00000000 00000001 63"), LENGTH_PREFIXED)
    sub.sent(d)
    fixed = ServerSubscription(element_size=2)
    assert fixed.element_size == 2
    fixed.request(10)
    d = fixed.prepare([b"ab", bytearray(b"cd"), memoryview(b"ef")])
    assert d == Delivery(0, 3, h("00000002 616263646566"), FIXED_SIZE)
    fixed.sent(d)
    d = fixed.prepare([b"gh"])
    assert d == Delivery(3, 1, b"gh", None)
    fixed.sent(d)
    # a body the caller encoded itself (straight from a batch's columns) is kept as it is
    d = fixed.prepared(b"body", 2, FIXED_SIZE)
    assert d == Delivery(4, 2, b"body", FIXED_SIZE)


def test_server_prepare_refuses_elements_of_the_wrong_size() -> None:
    sub = ServerSubscription(element_size=2)
    sub.request(5)
    with pytest.raises((LocalProtocolError, ValueError)):
        sub.prepare([b"a", b"b"])


def test_a_delivery_counts_only_once_sent() -> None:
    sub = ServerSubscription()
    sub.request(5)
    d = sub.prepare([b"a", b"b"])
    assert (d.first, d.count) == (0, 2)
    # written, not known to have arrived: demand and sequence are unchanged
    assert (sub.demand, sub.next_seq, sub.room, sub.last) == (5, 0, 3, None)
    with pytest.raises(LocalProtocolError, match="not the delivery in flight"):
        sub.sent(Delivery(0, 2, d.body, d.encoding))  # equal, but not the one in flight
    assert sub.unsent is d
    sub.sent(d)
    assert sub.unsent is None
    assert (sub.demand, sub.next_seq, sub.room, sub.last) == (3, 2, 3, d)
    with pytest.raises(LocalProtocolError):
        sub.sent(d)  # twice
    e = sub.prepare([b"c", b"d", b"e"])
    assert e.first == 2
    sub.sent(e)
    assert (sub.demand, sub.next_seq, sub.room) == (0, 5, 0)
    with pytest.raises(LocalProtocolError):
        sub.prepare([b"f"])


def test_received_up_to() -> None:
    sub = ServerSubscription()
    assert sub.received_up_to(0) is None  # nothing sent yet: 0 is the next
    with pytest.raises(RemoteProtocolError):
        sub.received_up_to(1)
    sub.request(10)
    d = sub.prepare([b"a", b"b"])
    sub.sent(d)
    # the client never got d (written in full, lost all the same): d again, as often as asked
    assert sub.received_up_to(0) is d
    assert sub.received_up_to(0) is d
    assert (sub.demand, sub.next_seq) == (8, 2)  # (a resend does not count again)
    for seq in (1, 3, 10**6):  # neither the next nor the last delivery's first
        with pytest.raises(RemoteProtocolError, match=f"expects element {seq}"):
            sub.received_up_to(seq)
    assert sub.received_up_to(2) is None  # it arrived: no longer kept
    assert sub.last is None
    with pytest.raises(RemoteProtocolError):
        sub.received_up_to(0)
    # while a delivery is unsent, the last one is not offered again
    e = sub.prepare([b"c"])
    sub.sent(e)
    f = sub.prepare([b"d"])
    with pytest.raises(RemoteProtocolError):
        sub.received_up_to(e.first)
    assert sub.unsent is f
    assert sub.received_up_to(3) is None  # the next one


def state(sub: ServerSubscription) -> State:
    return sub.state


def test_state_transitions_and_cancel() -> None:
    sub = ServerSubscription()
    sub.request(3)
    sub.prepare([b"a"])
    sub.complete()
    assert state(sub) is State.COMPLETE
    sub.fail(500, "boom")  # an error after completion still fails it
    assert state(sub) is State.FAILED
    assert sub.error == (500, "boom")
    sub.fail(503, "later")  # the first error stays
    assert sub.error == (500, "boom")
    sub.cancel()
    assert state(sub) is State.CANCELLED
    assert (sub.unsent, sub.last) == (None, None)
    sub.complete()
    sub.fail(500, "x")
    assert state(sub) is State.CANCELLED
    assert sub.error == (500, "boom")
    other = ServerSubscription()
    other.request(1)
    other.sent(other.prepare([b"a"]))
    other.cancel()
    assert (state(other), other.last) == (State.CANCELLED, None)


# --------------------------------------------------------------------------- ClientSubscription


def test_client_drops_what_it_saw_before_and_counts_outstanding() -> None:
    sub = ClientSubscription()
    assert (sub.outstanding, sub.next_seq) == (0, 0)
    sub.asked(5)
    assert sub.received(0, [b"a", b"b"]) == [b"a", b"b"]
    assert (sub.outstanding, sub.next_seq) == (3, 2)
    # a resend of the same elements, batched differently, with one more
    assert sub.received(0, [b"a", b"b", b"c"]) == [b"c"]
    assert (sub.outstanding, sub.next_seq) == (2, 3)
    assert sub.received(1, [b"b", b"c"]) == []  # all seen before
    assert (sub.outstanding, sub.next_seq) == (2, 3)
    assert sub.received(3, [b"d"]) == [b"d"]
    with pytest.raises(RemoteProtocolError, match="elements from 6, but 4"):
        sub.received(6, [b"g"])  # a gap: 4 and 5 never came
    assert (sub.outstanding, sub.next_seq) == (1, 4)
    # more than asked for: outstanding stays at 0
    assert sub.received(4, [b"e", b"f"]) == [b"e", b"f"]
    assert (sub.outstanding, sub.next_seq) == (0, 6)
    # unnumbered responses are all new
    assert sub.received(None, [b"x", b"y"]) == [b"x", b"y"]
    assert sub.next_seq == 8
    sub.asked(MAX_DEMAND)
    sub.asked(MAX_DEMAND)
    assert sub.outstanding == MAX_DEMAND


operations = st.lists(
    st.tuples(st.sampled_from(["request", "deliver", "cut", "lost"]), st.integers(1, 6)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_server_and_client_agree_through_cuts_and_losses(ops: list[tuple[str, int]]) -> None:
    """The server's state and the client's, with responses cut while written (``cut``: resent
    as they are on the next fetch) and written but lost (``lost``: the client asks for the last
    delivery's first again): the client gets every element exactly once, in order, and the
    server never delivers more than was requested."""
    server, client = ServerSubscription(), ClientSubscription()
    source = (b"e%d" % i for i in range(10**6))
    produced: list[bytes] = []
    got: list[bytes] = []
    requested = 0
    lost: Delivery | None = None
    for op, n in ops:
        if op == "request":
            server.request(n)
            client.asked(n)
            requested += n
            continue
        if lost is not None:  # the client's next fetch names the next element it expects
            again = server.received_up_to(client.next_seq)
            assert again is lost
            got += client.received(again.first, decode_body(again.encoding, again.body))
            assert server.received_up_to(client.next_seq) is None
            lost = None
        if server.unsent is not None:
            delivery = server.unsent  # resent as it is
        elif server.room > 0:
            new = [next(source) for _ in range(min(n, server.room))]
            produced += new
            delivery = server.prepare(new)
        else:
            continue
        assert delivery.first + delivery.count <= requested
        if op == "cut":
            continue  # not written in full: still unsent
        server.sent(delivery)
        if op == "lost":
            lost = delivery
            continue
        got += client.received(delivery.first, decode_body(delivery.encoding, delivery.body))
    if lost is not None:
        got += client.received(lost.first, decode_body(lost.encoding, lost.body))
    assert server.next_seq <= requested
    assert server.demand == requested - server.next_seq
    assert got == produced[: server.next_seq]
    assert client.next_seq == server.next_seq
    assert client.outstanding == requested - server.next_seq
