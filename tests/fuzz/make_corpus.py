"""Regenerate the fuzzers' seed corpus: ``python tests/fuzz/make_corpus.py``.

Writes ``tests/fuzz/corpus/<protocol>/<kind>-<name>.bin``: the golden vectors of
docs/protocols/*.md, byte for byte, and whole conversations in the shape the fuzz tests'
applications expect (which subscriber ids they use, which point, ...). The files are committed;
this script only rewrites the entries it makes (``*-crash-*.bin``, the inputs a fuzzer found a
bug with, are left alone). ``--check`` compares instead of writing (exit status 1 on a
difference).

Kinds (the prefix of a file name says which fuzz input it seeds):

* rsio: ``to-server`` / ``to-client`` (bytes a client / a hub sends), ``publisher`` (publisher
  and offered names, UTF-8), ``envelope`` (envelope elements, each a varint length then the
  element).
* rsio_http: ``lp`` (length-prefixed bodies), ``fixed`` (fixed-size bodies), ``query`` (raw
  query strings).
* tube: ``to-server`` / ``to-client``: WebSocket messages, each a u32 big-endian length then
  the payload.
* tolliver: ``to-acceptor`` / ``to-connector``.
* seguro: ``to-server`` / ``to-client``.
"""

from __future__ import annotations

import struct
import sys
import uuid
import zlib
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent / "src"))

from tidewire.model import Batch  # noqa: E402
from tidewire.protocols import rsio, tolliver, tube  # noqa: E402
from tidewire.protocols.rsio.envelopes import encode_envelopes  # noqa: E402
from tidewire.protocols.rsio.varint import push_varint  # noqa: E402

CORPUS = HERE / "corpus"


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def frames(*messages: rsio.Message, sizes: dict[int, int] | None = None) -> bytes:
    out = bytearray()
    for message in messages:
        size = 0
        if isinstance(message, rsio.OnNext | rsio.OnNextPacked):
            size = (sizes or {}).get(message.subscriber, 0)
        rsio.encode(message, size, out)
    return bytes(out)


# --------------------------------------------------------------------------- RS.io

# docs/protocols/rsio.md, "Messages" and the extensions, exactly
CLIENT_HELLO_DOC = h("00 00 02 01 ac 02")  # version 0, extensions [1, 300]
SERVER_HELLO_DOC = h("01 00 00")
GOODBYE_DOC = h("02 03 62 79 65")
SUBSCRIBE_DOC = h("03 0d 6f 72 64 65 72 73 3f 66 72 6f 6d 3d 33 01 0a")
REQUEST_DOC = h("04 01 ff ff ff ff ff ff ff ff 7f")
CANCEL_DOC = h("05 05")
SUBSCRIBED_DOC = h("06 01 10")
ON_NEXT_DOC = h("07 02 03 61 62 63")
ON_COMPLETE_DOC = h("09 01")
ON_ERROR_DOC = h("0a 03 07 62 6f 6f 6d 20 c3 a9")
HUB_HELLO = h("01 00 02 01 02")  # the hub's: extensions [1, 2]
CLIENT_HELLO_PUBLISH = h("00 00 01 01")
CLIENT_HELLO_TOKEN = h("00 00 02 01 02")
AUTHENTICATE_DOC = h("43 09 63 69 2e 73 33 63 72 33 74")
AUTHENTICATED_DOC = h("44 08 74 6f 6b 65 6e 3a 63 69")
ACK = h("02 14 67 6f 6f 64 62 79 65 20 61 63 6b 6e 6f 77 6c 65 64 67 65 64")
IDLE = h("02 0e 69 64 6c 65 20 66 6f 72 20 33 36 30 30 73")
PAYROLL = h("03 07 70 61 79 72 6f 6c 6c 01 0a")
OFFER_DOC = h("40 03 06 6f 72 64 65 72 73")
COMMITTED_DOC = h("41 03 e8 07 01 e8 07")
OFFER_ENDED_DOC = h("42 03 00")
# the value-format offer of `a`, `b` into `t` (hub ids 7, 8), both directions
OFFER_T = h("40 01 0e 74 3f 66 6f 72 6d 61 74 3d 76 61 6c 75 65")
HUB_SUBSCRIBES_T = h("03 0e 74 3f 66 6f 72 6d 61 74 3d 76 61 6c 75 65 01 80 40")
OFFER_T_CLIENT = h("06 01 00") + h("07 01 01 61") + h("07 01 01 62") + h("09 01")
OFFER_T_HUB = h("41 01 02 07 08") + h("04 01 02") + h("42 01 00")


def rsio_entries() -> Iterable[tuple[str, bytes]]:
    # What a client sends (the server role's input). The server application of
    # test_fuzz_rsio answers a subscribe ending in "size=4" with elementSize 4.
    yield "to-server-doc-frames", (CLIENT_HELLO_DOC + SUBSCRIBE_DOC + REQUEST_DOC + CANCEL_DOC
                                   + GOODBYE_DOC)  # fmt: skip
    yield "to-server-doc-publish", CLIENT_HELLO_PUBLISH + OFFER_T + OFFER_T_CLIENT
    yield "to-server-doc-auth", CLIENT_HELLO_TOKEN + AUTHENTICATE_DOC + PAYROLL + OFFER_DOC
    yield "to-server-subscribe", frames(
        rsio.ClientHello(0, (1, 2)),
        rsio.Subscribe("orders", 1, 10),
        rsio.Subscribe("ticks?size=4", 2, 3),
        rsio.Request(1, 5),
        rsio.Request(2, 2**63 - 1),
        rsio.Cancel(1),
        rsio.Subscribe("orders?from=latest", 1, 1),
        rsio.Request(1, 0),
        rsio.Goodbye("done"),
    )
    yield "to-server-offer-fixed", frames(
        rsio.ClientHello(0, (1,)),
        rsio.Offer(5, "ticks?format=value"),
        rsio.Subscribed(5, 4),
        rsio.OnNextPacked(5, 2, b"aaaabbbb"),
        rsio.OnNext(5, b"cccc"),
        rsio.OnComplete(5),
        sizes={5: 4},
    )
    yield "to-server-offer-envelopes", frames(
        rsio.ClientHello(0, (1,)),
        rsio.Offer(6, "orders"),
        rsio.Subscribed(6, 0),
        *(rsio.OnNext(6, e) for e in encode_envelopes(_batch(), with_ids=False)),
        rsio.OnError(6, "gave up"),
    )
    # What a hub sends (the client role's input). The client application of test_fuzz_rsio
    # subscribes with ids 1, 2 (variable size) and 7 ("ticks?size=4") at once, and offers id 3
    # ("t?format=value") once the hub's hello lists extension 1.
    on_error_2 = ON_ERROR_DOC.replace(b"\x0a\x03", b"\x0a\x02")
    yield "to-client-doc-frames", (SERVER_HELLO_DOC + h("06 01 00") + h("07 01 03 61 62 63")
                                   + ON_COMPLETE_DOC + on_error_2 + ACK)  # fmt: skip
    yield "to-client-doc-fixed", (SERVER_HELLO_DOC + h("06 07 04") + h("07 07 77 78 79 7a")
                                  + h("08 07 02 61 61 61 61 62 62 62 62") + IDLE)  # fmt: skip
    yield "to-client-doc-auth", HUB_HELLO + AUTHENTICATED_DOC + h("0a 01 00") + GOODBYE_DOC
    yield "to-client-doc-publish", (HUB_HELLO + HUB_SUBSCRIBES_T.replace(b"\x01\x80", b"\x03\x80")
                                    + COMMITTED_DOC.replace(b"\xe8\x07\x01\xe8\x07",
                                                            b"\x02\x07\x08")
                                    + h("04 03 02") + OFFER_ENDED_DOC)  # fmt: skip
    yield "to-client-envelopes", SERVER_HELLO_DOC + frames(
        rsio.Subscribed(1, 0),
        *(rsio.OnNext(1, e) for e in encode_envelopes(_batch())),
        rsio.Subscribed(2, 0),
        rsio.OnNext(2, b"plain"),
        rsio.OnComplete(1),
        rsio.OnError(2, "stream 'x' holds a value that is not 4 bytes"),
    )
    yield "to-client-packed", HUB_HELLO + frames(
        rsio.Subscribed(7, 4),
        rsio.OnNextPacked(7, 3, b"aaaabbbbcccc"),
        rsio.OnNext(7, b"dddd"),
        rsio.Subscribed(1, 0),
        rsio.OnNext(1, b""),
        rsio.Goodbye("bye"),
        sizes={7: 4},
    )
    # publisher and offered names (docs/protocols/rsio.md, "Publisher names")
    for i, name in enumerate((
        "orders", "orders?from=latest", "orders?from=1200&until=1500", "clicks?key=user%2F42",
        "ticks?size=16", "orders?format=records", "orders?from=earliest&format=value",
        "t?format=value", "orders?format=value&key=k%00&txn=spark%2F1", "%3F%26%25?from=0",
        "\u00f8rders?until=9223372036854775807",
    )):  # fmt: skip
        yield f"publisher-doc-{i:02d}", name.encode()
    # envelope elements, each as varint length + element
    for name, raw in (
        ("doc-5", h("05 01 00 76 31")),  # id 5, timestamp -1, no key, "v1"
        ("doc-300", h("ac 02 80 a0 ab fe f9 62 02 6b")),  # id 300, 1700000000000, key "k"
    ):
        yield f"envelope-{name}", _lengths([raw])
    yield "envelope-batch", _lengths(encode_envelopes(_batch()))
    yield "envelope-assign", _lengths(encode_envelopes(_batch(), with_ids=False))


def _batch() -> Batch:
    return Batch.build("orders", [b"hello", b"", b"\x00\xff", b"x" * 130],
                       keys=[b"k", None, b"", b"key"], ids=[1, 2, 127, 128],
                       timestamps=[1000, 1000, -1, 2**40])  # fmt: skip


def _lengths(elements: Iterable[bytes]) -> bytes:
    out = bytearray()
    for element in elements:
        push_varint(out, len(element))
        out += element
    return bytes(out)


# --------------------------------------------------------------------------- RS.io over HTTP


def rsio_http_entries() -> Iterable[tuple[str, bytes]]:
    # docs/protocols/rsio-http.md: two elements "a" and "bb"; "aa", "bb" at N = 2
    yield "lp-doc", h("00 00 00 01 61 00 00 00 02 62 62")
    yield "lp-empty-element", h("00 00 00 00") + h("00 00 00 03") + b"ccc"
    yield "lp-none", b""
    yield "fixed-doc", h("00 00 00 02 61 61 62 62")
    yield "fixed-one", h("00 00 00 04") + b"wxyz"
    for i, query in enumerate(("request=100", "format=value&request=100", "from=1&until=2",
                               "request=9223372036854775807", "key=a%26b&request=0",
                               "request=2&format=records")):  # fmt: skip
        yield f"query-doc-{i:02d}", query.encode()


# --------------------------------------------------------------------------- Tube


def messages(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def tube_conversation(sender_size: int, receiver_size: int, items: list[bytes | str]) -> bytes:
    """The WebSocket messages a Tube side sends (after the peer's fragment size, which the
    receiving side has sent first): ``items`` are messages to send, or "ping"."""
    sender = tube.Connection(tube.Role.SERVER, fragment_size=sender_size, compression="smart")
    sender.receive_data(tube.push_varint(receiver_size), 0.0)
    for item in items:
        if item == "ping":
            sender.ping(0.0)
        elif isinstance(item, bytes):
            sender.send(item, 0.0)
    return messages(*sender.data_to_send())


def tube_entries() -> Iterable[tuple[str, bytes]]:
    # The fuzz tests' receivers ask for fragment size 64.
    zipped = zlib.compress(b"deflate me " * 40, 1)
    yield "to-client-doc", messages(
        h("80 80 08"),  # the hub's 65536
        h("01") + b"hello",
        h("80"),  # ping
        h("88"),  # pong
        h("48"),  # control 9: deflate is not supported
        h("09") + zipped,
        h("01"), b"",  # an empty message: the header alone, then an empty fragment
        h("03") + b"abc", b"def", b"ghi",  # 3 fragments
        h("00 10") + b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8",  # 8: the count varint
    )  # fmt: skip
    yield "to-server-doc", messages(
        h("80 01"),  # the client's 64
        h("02") + b"a" * 63, b"b" * 37,  # 100 bytes split at 64 (docs/protocols/tube.md)
        h("01"), b"literal reading",  # the seed's reading: header, then the fragment
        h("11") + b"compression id 2",  # answered 8 + 2
        h("f8"),  # control 31: ignored
    )  # fmt: skip
    server_payloads: list[bytes | str] = [b"x" * 300, b"", "ping", b"y" * 1000, b"z"]
    yield "to-client-conversation", tube_conversation(0, 64, server_payloads)
    client = tube.Connection(tube.Role.CLIENT, fragment_size=64, compression="always")
    client.receive_data(tube.push_varint(64), 0.0)
    for payload in (b"RS.io bytes", b"q" * 500, b""):
        client.send(payload, 0.0)
    yield "to-server-conversation", messages(*client.data_to_send())


# --------------------------------------------------------------------------- Tolliver

UUID_A = uuid.UUID("0192f3a4-5b6c-7d8e-9f00-112233445566")
UUID_B = uuid.UUID("0192ff00-0000-7000-8000-000000000001")


def tolliver_entries() -> Iterable[tuple[str, bytes]]:
    sub_orders = tolliver.SubscriptionEntry(0, "orders")
    control = bytes(tolliver.encode_entry(tolliver.SubscriptionEntry(0, "x", "k")))
    unsub = bytes(tolliver.encode_entry(tolliver.SubscriptionEntry(1, "x", "k")))
    doc_message = h("03 00 00 00 01 00 00 00 01 00 00 00 05 00 00 00 07 78 6b 68 65 6c 6c 6f")
    doc_request = (h("00 00 00 00 00 00 00 00 01") + UUID_A.bytes + h("00 00 00 01")
                   + h("00 00 00 00 06 00 00 00 00") + b"orders")  # fmt: skip
    unreliable = doc_message[:13] + h("7f ff ff ff") + doc_message[17:]

    def enc(*frames: tolliver.Frame) -> bytes:
        out = bytearray()
        for frame in frames:
            tolliver.encode(frame, out)
        return bytes(out)

    # The fuzz tests' machines speak version 2 and can speak 1; the connector application
    # sends reliable messages 1 and 2 once established.
    yield "to-acceptor-doc", doc_request + doc_message + unreliable + h("04 00 00 00 07")
    yield "to-acceptor-older", enc(
        tolliver.HandshakeRequest(3, UUID_A, (sub_orders,)),
        tolliver.HandshakeFinal(1),
        tolliver.Message("orders", "", b"v", 9),
        tolliver.Message("tolliver", "", control),
        tolliver.Message("tolliver", "", unsub),
        tolliver.Ack(1),
    )
    yield "to-acceptor-final-failure", enc(tolliver.HandshakeRequest(3, UUID_A)) + h("02 02")
    yield "to-acceptor-again", enc(
        tolliver.HandshakeRequest(2, UUID_A, (sub_orders, tolliver.SubscriptionEntry(0, "x"))),
        tolliver.Message("x", "k", b"\x00" * 20, 2**32 - 1),
        tolliver.HandshakeRequest(1, UUID_A, ()),
        tolliver.Ack(2**31 - 1),
    )
    yield "to-connector-equal", enc(
        tolliver.HandshakeResponse(2, UUID_B, 0, (sub_orders,)),
        tolliver.Ack(1),
        tolliver.Message("orders", "", b"hello", 7),
        tolliver.Message("tolliver", "", control),
        tolliver.Ack(2),
    )
    yield "to-connector-older", enc(
        tolliver.HandshakeResponse(1, UUID_B, 3, ()),
        tolliver.Message("x", "k", b"", tolliver.UNRELIABLE),
        tolliver.HandshakeResponse(1, UUID_B, 0, ()),  # unexpected: ignored
        tolliver.HandshakeFinal(2),  # unexpected: ignored
    )
    yield "to-connector-newer", enc(tolliver.HandshakeResponse(5, UUID_B, 1, ()))
    yield "to-connector-refused", enc(tolliver.HandshakeResponse(5, UUID_B, 2, ()))


# --------------------------------------------------------------------------- Seguro


def seguro_entries() -> Iterable[tuple[str, bytes]]:
    # docs/protocols/seguro.md, "Messages, exact bytes". The fuzz tests' ship is
    # ~sampel-palnet; its application saves latest + 1 (5 bytes) after WELCOME, then
    # latest + 1 and latest + 4 in a SAVE MANY, then reads 10 from 1.
    yield "to-server-doc", (b"HELLO 0\nPOINT ~sampel-palnet\nSAVE 43 5\nhello\n\n"
                            b"SAVE MANY 2 44 47\nEVENT 44 1\na\n\nEVENT 47 2\nbb\n\n"
                            b"STREAMED MANY 2 44 47\nREAD 1 10\n")  # fmt: skip
    yield "to-server-ranks", (b"HELLO 0\nPOINT ~dozzod-marzod-sampel-palnet--mapdes-lomled-"
                              b"sampel-palnet\nREAD 0 0\n"
                              b"READ 18446744073709551615 1\n")  # fmt: skip
    yield "to-server-galaxy", b"HELLO 00\nPOINT ~zod\nSAVE 1 0\n\n\nSAVE 2 3\n\n\n\n\n\n"
    yield "to-client-doc", (b"SEGURO 0\nIDENTIFY 0\nWELCOME ~sampel-palnet 42\nCOMMITTED 43 5\n"
                            b"LATEST 44\nCOMMITTED MANY 2 44 47\nEVENT 43 5\nhello\n\n"
                            b"EVENT 44 1\na\n\nEVENT 47 2\nbb\n\nSENT 3 43 47\n")  # fmt: skip
    yield "to-client-empty", (b"SEGURO 1 0 2\nIDENTIFY 0\nWELCOME ~sampel-palnet\n"
                              b"COMMITTED 1 5\nLATEST 3\nCOMMITTED MANY 2 2 5\n"
                              b"SENT 0 0 0\n")  # fmt: skip


# --------------------------------------------------------------------------- main

ENTRIES = {
    "rsio": rsio_entries,
    "rsio_http": rsio_http_entries,
    "tube": tube_entries,
    "tolliver": tolliver_entries,
    "seguro": seguro_entries,
}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    differ = 0
    for protocol, entries in ENTRIES.items():
        directory = CORPUS / protocol
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in entries():
            path = directory / f"{name}.bin"
            if check:
                if not path.exists() or path.read_bytes() != data:
                    print(f"differs: {path}")
                    differ += 1
            elif not path.exists() or path.read_bytes() != data:
                path.write_bytes(data)
                print(f"wrote {path} ({len(data)} bytes)")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
