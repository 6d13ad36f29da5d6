"""Fuzzing RS.io over HTTP (docs/protocols/rsio-http.md): the batched bodies, the query and
the publisher name of a subscribe, and each side's subscription state.

Bodies and queries start from ``corpus/rsio_http`` and are mutated (tests/fuzz/mutate.py; the
4-byte lengths of the bodies are u32 big-endian, the counts of a query decimal). Properties:

* ``decode_body`` and its two decoders raise nothing but :class:`RemoteProtocolError`, and what
  they decode encodes back to the same bytes (every encoding is canonical);
* ``split_query`` and ``parse_count`` raise nothing but :class:`BadRequest`, and what the hub
  makes of a subscribe's path and query (``split_query``, then ``PublisherName.parse``) is a
  publisher or a 400 (``BadRequest``, ``PublisherNameError``), never anything else;
* :class:`ServerSubscription` and :class:`ClientSubscription`, driven with any calls and any
  numbers, raise only :class:`LocalProtocolError` (a misuse) or :class:`RemoteProtocolError`
  (the peer's), and keep their bounds (demand within 0..2^63-1, a delivery within demand);
* over a network that cuts responses and loses written ones, fetches with resends deliver
  every element to the client exactly once and in order.
"""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import corpus, decimal, fuzz, inputs, long_decimal, replays, u8, u32be

from tidewire.model import LocalProtocolError, RemoteProtocolError
from tidewire.protocols.rsio.names import PublisherName, PublisherNameError
from tidewire.protocols.rsio_http import (
    FIXED_SIZE,
    LENGTH_PREFIXED,
    MAX_DEMAND,
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

BODIES = corpus("rsio_http", "lp") + corpus("rsio_http", "fixed")
QUERIES = corpus("rsio_http", "query")
ENCODINGS = (None, "", LENGTH_PREFIXED, FIXED_SIZE, LENGTH_PREFIXED.upper(), FIXED_SIZE.lower(),
             "gzip", "X-Rsio-Elements")  # fmt: skip

# --------------------------------------------------------------------------- bodies


def check_body(body: bytes, encoding: str | None, max_elements: int) -> None:
    try:
        elements = decode_length_prefixed(body, max_elements)
    except RemoteProtocolError:
        pass
    else:
        assert len(elements) <= max_elements
        assert encode_length_prefixed(elements) == body
    try:
        size, packed = decode_fixed_size(body)
    except RemoteProtocolError:
        pass
    else:
        assert size >= 1
        assert len(packed) % size == 0
        assert encode_fixed_size(size, packed) == body
    try:
        elements = decode_body(encoding, body)
    except RemoteProtocolError:
        assert encoding  # a body without an encoding is one element, whatever it holds
    else:
        if not encoding:
            assert elements == [body]


@fuzz(2)
@given(
    body=inputs(BODIES, (u32be, u8)),
    encoding=st.sampled_from(ENCODINGS),
    max_elements=st.sampled_from((0, 1, 2, 2**32)),
)
def test_bodies_decode_or_are_refused(body: bytes, encoding: str | None,
                                      max_elements: int) -> None:  # fmt: skip
    check_body(body, encoding, max_elements)


@replays("rsio_http", "lp")
def test_corpus_length_prefixed_bodies(raw: bytes) -> None:
    for encoding in ENCODINGS:
        check_body(raw, encoding, 2**32)
    assert decode_body(LENGTH_PREFIXED, raw) == decode_length_prefixed(raw)


@replays("rsio_http", "fixed")
def test_corpus_fixed_size_bodies(raw: bytes) -> None:
    for encoding in ENCODINGS:
        check_body(raw, encoding, 2**32)
    _, packed = decode_fixed_size(raw)
    assert b"".join(decode_body(FIXED_SIZE, raw)) == packed


@fuzz(2)
@given(elements=st.lists(st.binary(max_size=300), max_size=20), base=st.integers(0, 2**20))
def test_bodies_round_trip(elements: list[bytes], base: int) -> None:
    body = encode_length_prefixed(elements)
    assert decode_length_prefixed(body) == elements
    assert decode_body(LENGTH_PREFIXED, body) == elements
    offsets = array("I", [base])  # (a batch's value offsets may start above 0)
    for element in elements:
        offsets.append(offsets[-1] + len(element))
    assert length_prefixed_values(memoryview(b"".join(elements)), memoryview(offsets)) == body
    sizes = {len(e) for e in elements}
    if len(sizes) == 1 and 0 not in sizes:
        (size,) = sizes
        packed = b"".join(elements)
        assert decode_fixed_size(encode_fixed_size(size, packed)) == (size, memoryview(packed))
        assert decode_body(FIXED_SIZE, encode_fixed_size(size, packed)) == elements


# --------------------------------------------------------------------------- queries

PUBLISHER_PATHS = ("orders", "orders%3Fx", "%C3%B8rders", "t", "", "%", "a b", "..%2F")


def check_subscribe(path: str, query: str) -> None:
    """What the hub does with ``PUT /rsio/pub/<path>?<query>``: a publisher, or a 400."""
    try:
        kept, demand = split_query(query)
    except BadRequest:
        return
    assert 0 <= demand <= MAX_DEMAND
    assert all(p.partition("=")[0] not in ("", "request") for p in kept.split("&") if kept)
    again, same = split_query(kept + ("&" if kept else "") + f"request={demand}")
    assert (again, same) == (kept, demand)
    try:
        name = PublisherName.parse(path + ("?" + kept if kept else ""))
    except PublisherNameError:
        return
    assert PublisherName.parse(str(name)) == name


@fuzz(2)
@given(query=inputs(QUERIES, (decimal, long_decimal)), path=st.sampled_from(PUBLISHER_PATHS))
def test_a_subscribe_is_a_publisher_or_a_400(query: bytes, path: str) -> None:
    check_subscribe(path, query.decode("utf-8", "replace"))


@fuzz(2)
@given(text=st.text(max_size=25) | st.integers(-5, 2**64).map(str) | st.sampled_from(
    ("0", "00", "9223372036854775807", "9223372036854775808", "0" * 30 + "1", "²", "٣", "+1",
     " 1", "1 ", "1_000", "")))  # fmt: skip
def test_counts_parse_or_are_refused(text: str) -> None:
    try:
        value = parse_count(text)
    except BadRequest:
        return
    assert 0 <= value <= MAX_DEMAND
    assert text.isascii()
    assert text.isdigit()
    assert int(text) == value


@replays("rsio_http", "query")
def test_corpus_queries(raw: bytes) -> None:
    for path in PUBLISHER_PATHS:
        check_subscribe(path, raw.decode("utf-8", "replace"))


# --------------------------------------------------------------------------- the state

ints = st.sampled_from((-1, 0, 1, 2, 2**63 - 1, 2**63, -(2**63))) | st.integers(-10, 100)
calls = st.lists(
    st.one_of(
        st.tuples(st.just("request"), ints),
        st.tuples(st.just("prepare"), st.integers(0, 5)),
        st.tuples(st.just("prepare_wrong_size"), st.integers(1, 3)),
        st.tuples(st.just("prepared"), ints),
        st.tuples(st.just("sent"), st.booleans()),
        st.tuples(st.just("received_up_to"), ints),
        st.tuples(st.sampled_from(("complete", "fail", "cancel")), st.just(0)),
    ),
    max_size=30,
)


@fuzz(2)
@given(element_size=st.sampled_from((0, 1, 4)), calls_=calls)
def test_the_server_subscription_takes_any_calls(
    element_size: int, calls_: list[tuple[str, object]]
) -> None:
    sub = ServerSubscription(element_size)
    element = b"e" * (element_size or 3)
    foreign = Delivery(0, 1, b"x", None)
    for name, arg in calls_:
        before_seq = sub.next_seq
        try:
            if name == "request":
                assert isinstance(arg, int)
                sub.request(arg)
            elif name == "prepare":
                assert isinstance(arg, int)
                sub.prepare([element] * arg)
            elif name == "prepare_wrong_size":
                assert isinstance(arg, int)
                sub.prepare([element] * arg + [element + b"!"])
            elif name == "prepared":
                assert isinstance(arg, int)
                sub.prepared(b"body", arg, None)
            elif name == "sent":
                sub.sent(sub.unsent if arg and sub.unsent is not None else foreign)
            elif name == "received_up_to":
                assert isinstance(arg, int)
                again = sub.received_up_to(arg)
                assert again is None or again is sub.last
            elif name == "complete":
                sub.complete()
            elif name == "fail":
                sub.fail(500, "boom")
            else:
                sub.cancel()
        except LocalProtocolError:
            assert name != "received_up_to"
        except RemoteProtocolError:
            assert name == "received_up_to"
        assert 0 <= sub.demand <= MAX_DEMAND
        assert sub.room >= 0
        assert sub.next_seq >= before_seq
        if sub.unsent is not None:
            assert 0 < sub.unsent.count <= sub.demand
            assert sub.unsent.first == sub.next_seq
        if sub.state is State.FAILED:
            assert sub.error is not None


@fuzz(2)
@given(
    calls_=st.lists(
        st.one_of(
            st.tuples(st.just("asked"), st.integers(0, 2**63)),
            st.tuples(st.just("received"), st.none() | ints, st.integers(0, 6)),
        ),
        max_size=30,
    )
)
def test_the_client_subscription_takes_any_response(calls_: list[tuple[object, ...]]) -> None:
    sub = ClientSubscription()
    for call in calls_:
        before = sub.next_seq
        if call[0] == "asked":
            n = call[1]
            assert isinstance(n, int)
            sub.asked(n)
        else:
            first, count = call[1], call[2]
            assert first is None or isinstance(first, int)
            assert isinstance(count, int)
            elements = [b"%d" % i for i in range(count)]
            try:
                fresh = sub.received(first, elements)
            except RemoteProtocolError:
                assert first is not None
                assert first < 0 or first > before
                continue
            assert first is None or 0 <= first <= before
            skip = 0 if first is None else before - first
            assert fresh == elements[skip:]
            assert sub.next_seq == before + len(fresh)
        assert 0 <= sub.outstanding <= MAX_DEMAND
        assert sub.next_seq >= before


def test_a_negative_sequence_number_is_the_peers_error() -> None:
    """Found by the fuzzer: ``X-Tidewire-Sequence: -1`` (the client parses it with ``int``)
    made the client drop the first element as if it had it already."""
    sub = ClientSubscription()
    with pytest.raises(RemoteProtocolError):
        sub.received(-1, [b"a", b"b"])
    assert sub.next_seq == 0
    assert sub.received(0, [b"a", b"b"]) == [b"a", b"b"]


@fuzz()
@given(
    fates=st.lists(st.sampled_from(("ok", "ok", "cut", "lost")), max_size=40),
    asks=st.lists(st.integers(0, 5), max_size=40),
    element_size=st.sampled_from((0, 2)),
    header=st.booleans(),
)
def test_fetches_with_resends_deliver_each_element_once(
    fates: list[str], asks: list[int], element_size: int, header: bool
) -> None:
    """The hub's and the client's states over a network that cuts a response (not written in
    full: the hub resends it as it is) or loses a written one (the client's sequence header
    makes the hub send it again): the client's new elements are the source's, in order,
    each once. Without the header only cut responses are resent, so only those happen."""
    source = [bytes([i % 256]) * (element_size or 1 + i % 3) for i in range(200)]
    hub, client = ServerSubscription(element_size), ClientSubscription()
    got: list[bytes] = []
    for i, fate in enumerate(fates):
        if not header and fate == "lost":
            fate = "cut"
        n = asks[i] if i < len(asks) else 1
        hub.request(n)  # the fetch's request=n
        client.asked(n)
        delivery = hub.received_up_to(client.next_seq) if header else None  # never raises
        if delivery is None:
            delivery = hub.unsent
        if delivery is None and hub.room > 0:
            start = hub.next_seq
            delivery = hub.prepare(source[start : start + min(hub.room, 3)])
        if delivery is None:
            continue  # 204
        if delivery is hub.unsent and fate != "cut":
            hub.sent(delivery)  # written in full
        if fate == "ok":
            elements = decode_body(delivery.encoding, delivery.body)
            got += client.received(delivery.first, elements)
        assert got == source[: len(got)]
        assert hub.next_seq - client.next_seq <= 3
    assert got == source[: client.next_seq]
