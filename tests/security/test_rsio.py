"""RS.io over TCP with security on, over real sockets on 127.0.0.1 under the default loop and
uvloop: TLS and mutual TLS (the certificate names the principal), tokens (extension 2), the ACL
on subscribe, offer and ``?streams``, connections per peer, the handshake deadline, and the
exact bytes of extension 2 and of its breaches; and (issue 20) attacks on a real hub beside a
well-behaved client: element frames refused at their header, floods of refusals, a subscriber
that never reads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from harness import BystanderReport, alone, assert_served, bystander, real_hub
from rsio_attacks import Answer, never_reading, refused_subscribes, unknown_id_onnext

import tidewire
from helpers import hub_server, until
from helpers import run as helpers_run
from loops import Run
from loops import line as log_line
from raw_wire import decode_rsio
from tidewire.client.rsio import RsioClient, RsioError
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.model import Batch, LogClosedError, TidewireError
from tidewire.protocols.rsio import (
    Authenticate,
    Authenticated,
    ClientHello,
    Goodbye,
    Offer,
    ServerHello,
    Subscribe,
    Subscribed,
    encode,
)
from tidewire.server.guard import ConnectionLimits
from tidewire.server.rsio import RsioServer, start_rsio_server

if TYPE_CHECKING:
    from certs import Pki


async def values(client: RsioClient, stream: str, until_id: int) -> list[bytes]:
    return [e.value async for b in client.subscribe(stream, until_id=until_id) for e in b]


async def raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("rsio://").split(":")
    return await asyncio.open_connection(host, int(port))


async def read_all(reader: asyncio.StreamReader) -> bytes:
    """Every byte until the hub closes."""
    out = b""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            out += data
    return out


def logged(caplog: pytest.LogCaptureFixture, logger: str, words: str) -> list[str]:
    return [
        log_line(r)
        for r in caplog.records
        if r.name == logger and r.levelno >= logging.WARNING and words in r.getMessage()
    ]


def principals(server: RsioServer) -> list[str]:
    return sorted(c.principal.name for c in server.connections)


ALICE_ACL = """
[principal."cert:alice"]
read = ["a.*"]
write = ["a.*"]

[principal."token:ci"]
read = ["pub.*", "a.*"]
write = ["pub.*"]
"""


# --------------------------------------------------------------------------- TLS


def test_tls_end_to_end(tmp_path: Path, run: Run, pki: Pki) -> None:
    async def main() -> None:
        async with hub_server(tmp_path, tls=pki.server_context("none")) as (_, server, url):
            tls_url = url.replace("rsio://", "rsios://")
            async with tidewire.connect(tls_url, ssl=pki.client_context()) as client:
                receipt = await client.publish("s", [b"one", b"two"])
                assert (receipt.count, receipt.first_id, receipt.last_id) == (2, 1, 2)
                assert await values(client, "s", 2) == [b"one", b"two"]
                assert client.principal is None  # no token was sent
                assert principals(server) == ["anonymous"]
                # big enough for the hub to stop reading (inlet bound) and resume, over TLS
                big = [bytes([i % 251]) * 8192 for i in range(2000)]
                receipt = await client.publish("big", big)
                assert (receipt.first_id, receipt.last_id) == (1, 2000)
                assert await values(client, "big", 2000) == big
            # the client's default context does not trust the test CA
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await tidewire.connect(tls_url)

    run(main())


def test_mutual_tls_names_the_principal_and_the_acl_applies(
    tmp_path: Path, run: Run, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    access = Access(Acl.parse(ALICE_ACL))
    alice = pki.client_context(pki.client("alice"))

    async def main() -> None:
        tls = pki.server_context("required")
        async with hub_server(tmp_path, access=access, tls=tls) as (hub, server, url):
            await hub.append(Batch.build("a.x", [b"a1", b"a2"]), assign_ids=True)
            await hub.append(Batch.build("b.x", [b"b1"]), assign_ids=True)
            async with tidewire.connect(url, ssl=alice) as client:
                assert await values(client, "a.x", 2) == [b"a1", b"a2"]
                assert principals(server) == ["cert:alice"]
                with pytest.raises(RsioError) as info:
                    await values(client, "b.x", 1)
                assert str(info.value) == "forbidden: cert:alice may not read stream 'b.x'"
                # writing: granted on a.*, refused elsewhere (nothing stored)
                assert (await client.publish("a.y", [b"y"])).first_id == 1
                with pytest.raises(RsioError, match="forbidden: cert:alice may not write"):
                    await client.publish("b.x", [b"nope"])
                with pytest.raises(RsioError, match="forbidden: cert:alice may not write"):
                    await client.publish("b.x", [b"nope"], txn="t1")  # a transaction too
                assert await values(client, "a.x", 2) == [b"a1", b"a2"]  # still fine
            assert [s.latest_id for s in hub.streams() if s.name == "b.x"] == [1]

    run(main())
    refused = logged(caplog, "tidewire.rsio", "may not")
    assert any("cert:alice" in m and "'b.x'" in m and "read" in m for m in refused), refused
    assert any("cert:alice" in m and "write" in m for m in refused), refused


async def refused(url: str, ctx: ssl.SSLContext) -> None:
    """Connect and use the connection: the hub's refusal raises here."""
    client = await tidewire.connect(url, ssl=ctx)
    try:
        await client.ready()
        await client.streams()
    finally:
        await client.close()


@pytest.mark.parametrize("case", ["no certificate", "expired", "untrusted"])
def test_bad_client_certificates_fail_and_are_logged(
    tmp_path: Path, run: Run, pki: Pki, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    caplog.set_level(logging.WARNING)
    cert = {
        "no certificate": None,
        "expired": pki.client("alice", expired=True),
        "untrusted": pki.client("alice", untrusted=True),
    }[case]

    async def main() -> None:
        tls = pki.server_context("required")
        async with hub_server(tmp_path, tls=tls) as (_, server, url):
            with pytest.raises((TidewireError, OSError)):
                await refused(url, pki.client_context(cert))
            await until(lambda: bool(logged(caplog, "tidewire.guard", "TLS handshake failed")))
            await until(lambda: server.listener.admission.total == 0)
            assert server.connections == set()

    run(main())
    (line,) = logged(caplog, "tidewire.guard", "TLS handshake failed")
    assert re.match(r"\[rsio #\d+ 127\.0\.0\.1:\d+\] ", line)


# --------------------------------------------------------------------------- tokens


def test_tokens_name_the_principal(
    tmp_path: Path, run: Run, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    ci, ci_table = mint_token("ci")
    old, old_table = mint_token("old", days=-1)
    access = Access(Acl.parse(ALICE_ACL), Tokens.parse(ci_table + old_table))

    async def main() -> None:
        async with hub_server(tmp_path, access=access) as (hub, server, url):
            await hub.append(Batch.build("pub.a", [b"p"]), assign_ids=True)
            async with tidewire.connect(url, token=ci) as client:
                assert client.principal == "token:ci"
                assert principals(server) == ["token:ci"]
                assert await values(client, "pub.a", 1) == [b"p"]
                assert (await client.publish("pub.a", [b"q"])).first_id == 2
            with pytest.raises(LogClosedError, match=r"authentication failed: invalid token "
                               r"\(claimed token:ci\)"):  # fmt: skip
                await tidewire.connect(url, token=ci + "x")
            with pytest.raises(LogClosedError, match="authentication failed: token:old expired"):
                await tidewire.connect(url, token=old)
            with pytest.raises(LogClosedError, match="authentication failed"):
                await tidewire.connect(url, token="nodot")
            await until(lambda: server.connections == set())
            assert server.listener.admission.total == 0

    run(main())
    failures = logged(caplog, "tidewire.rsio", "authentication failed")
    assert len(failures) == 3
    assert "claimed token:ci" in failures[0]
    assert "token:old expired" in failures[1]
    assert ci.split(".", 1)[1] not in "\n".join(r.getMessage() for r in caplog.records)


def test_a_token_for_a_hub_without_extension_2(tmp_path: Path, run: Run) -> None:
    """A hub whose hello does not list extension 2 cannot check a token: the client says
    goodbye and connect() raises, rather than carrying on as anonymous."""

    async def main() -> None:
        heard: list[bytes] = []

        async def old_hub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(bytes.fromhex("01 00 01 01"))  # serverHello [1]
            data = b""
            while not any(isinstance(m, Goodbye) for m in decode_rsio(data)):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                data += chunk
            heard.append(data)
            writer.close()  # (a real hub would acknowledge the goodbye first)

        listener = await asyncio.start_server(old_hub, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        async with listener:
            with pytest.raises(LogClosedError, match="does not offer authentication"):
                await tidewire.connect(f"rsio://127.0.0.1:{port}", token="ci.secret")
            await until(lambda: bool(heard))
        messages = decode_rsio(heard[0])
        assert messages[0] == ClientHello(0, (1, 2))
        assert isinstance(messages[1], Goodbye)
        assert b"ci.secret" not in heard[0]  # the token never left the client

    run(main())


def test_a_token_over_mutual_tls_takes_over_from_the_certificate(
    tmp_path: Path, run: Run, pki: Pki
) -> None:
    ci, table = mint_token("ci")
    access = Access(Acl.parse(ALICE_ACL), Tokens.parse(table))
    alice = pki.client_context(pki.client("alice"))

    async def main() -> None:
        tls = pki.server_context("required")
        async with hub_server(tmp_path, access=access, tls=tls) as (hub, server, url):
            await hub.append(Batch.build("pub.a", [b"p"]), assign_ids=True)
            async with tidewire.connect(url, token=ci, ssl=alice) as client:
                assert client.principal == "token:ci"
                assert principals(server) == ["token:ci"]
                assert await values(client, "pub.a", 1) == [b"p"]  # ci may, alice may not

    run(main())


def test_anonymous_gets_nothing_the_acl_does_not_grant(
    tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    access = Access(Acl.parse(ALICE_ACL))

    async def main() -> None:
        async with hub_server(tmp_path, access=access) as (hub, server, url):
            await hub.append(Batch.build("pub.a", [b"p"]), assign_ids=True)
            async with tidewire.connect(url) as client:
                with pytest.raises(RsioError) as info:
                    await values(client, "pub.a", 1)
                assert str(info.value) == "forbidden: anonymous may not read stream 'pub.a'"
                no_write = r"forbidden: anonymous may not write stream 'pub\.a'$"
                with pytest.raises(RsioError, match=no_write):
                    await client.publish("pub.a", [b"nope"])
                assert await client.streams() == []
                assert principals(server) == ["anonymous"]
            assert [s.latest_id for s in hub.streams() if s.name == "pub.a"] == [1]

    run(main())
    assert logged(caplog, "tidewire.rsio", "anonymous may not read stream 'pub.a'")
    assert logged(caplog, "tidewire.rsio", "anonymous may not write stream 'pub.a'")


def test_streams_lists_only_readable_streams(tmp_path: Path, run: Run) -> None:
    ci, table = mint_token("ci")
    access = Access(Acl.parse(ALICE_ACL), Tokens.parse(table))

    async def main() -> None:
        async with hub_server(tmp_path, access=access) as (hub, _, url):
            for name in ("pub.a", "pub.b", "priv.c", "a.1"):
                await hub.append(Batch.build(name, [b"x"]), assign_ids=True)
            async with tidewire.connect(url, token=ci) as client:
                assert [r["stream"] for r in await client.streams()] == ["a.1", "pub.a", "pub.b"]
                rows = await client.streams(["priv.c", "pub.b", "pub.none"])
                assert [(r["stream"], r["exists"]) for r in rows] == [
                    ("pub.b", True),
                    ("pub.none", False),
                ]
        async with hub_server(tmp_path) as (_, _, url), tidewire.connect(url) as client:
            names = [r["stream"] for r in await client.streams()]  # no ACL: everything
            assert [n for n in names if n[0] != "_"] == ["a.1", "priv.c", "pub.a", "pub.b"]

    run(main())


# --------------------------------------------------------------------------- limits


def test_connections_per_peer(tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    limits = ConnectionLimits(max_connections_per_peer=3)

    async def main() -> None:
        async with hub_server(tmp_path, limits=limits) as (hub, server, url):
            await hub.append(Batch.build("s", [b"x"]), assign_ids=True)
            clients = [await tidewire.connect(url) for _ in range(3)]
            for client in clients:
                assert await values(client, "s", 1) == [b"x"]
            reader, writer = await raw(url)
            data = await read_all(reader)
            writer.close()
            assert decode_rsio(data) == [
                ServerHello(0, (1, 2)),
                Goodbye("too many connections from 127.0.0.1 (the limit is 3)"),
            ]
            # the tidewire client hears the same
            refused = await tidewire.connect(url)
            with pytest.raises(LogClosedError, match=r"too many connections from 127\.0\.0\.1"):
                await refused.ready()
            await refused.close()
            assert server.listener.refused == 2
            for i, client in enumerate(clients):
                assert (await client.publish("s", [b"%d" % i])).first_id == i + 2
            await clients[0].close()
            await until(lambda: server.listener.admission.total == 2)
            async with tidewire.connect(url) as again:  # the slot is free again
                assert await values(again, "s", 1) == [b"x"]
            for client in clients[1:]:
                await client.close()

    run(main())
    assert len(logged(caplog, "tidewire.guard", "too many connections from 127.0.0.1")) == 2


def test_connections_per_peer_over_tls_are_told_why(tmp_path: Path, run: Run, pki: Pki) -> None:
    limits = ConnectionLimits(max_connections_per_peer=1)

    async def main() -> None:
        tls = pki.server_context("none")
        async with hub_server(tmp_path, limits=limits, tls=tls) as (hub, server, url):
            await hub.append(Batch.build("s", [b"x"]), assign_ids=True)
            async with tidewire.connect(url, ssl=pki.client_context()) as first:
                refused = await tidewire.connect(url, ssl=pki.client_context())
                with pytest.raises(LogClosedError, match=r"too many connections from 127"):
                    await refused.ready()
                await refused.close()
                await until(lambda: server.listener.refusing == 0)
                assert server.listener.refused == 1
                assert await values(first, "s", 1) == [b"x"]
            await until(lambda: server.listener.admission.total == 0)
            assert len(server.listener.connections) == 0

    run(main())


def test_handshake_deadline(tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)

    async def main() -> None:
        async with hub_server(tmp_path) as (hub, server, url):
            await hub.append(Batch.build("s", [b"x"]), assign_ids=True)
            async with tidewire.connect(url) as client:
                assert await values(client, "s", 1) == [b"x"]
                reader, writer = await raw(url)  # sends nothing
                await until(lambda: len(server.connections) == 2)
                server.listener.sweep(asyncio.get_running_loop().time() + 11)
                data = await read_all(reader)
                writer.close()
                assert decode_rsio(data) == [
                    ServerHello(0, (1, 2)),
                    Goodbye("no handshake within 10s"),
                ]
                assert len(server.connections) == 1
                assert await values(client, "s", 1) == [b"x"]
                assert (await client.publish("s", [b"y"])).first_id == 2

    run(main())
    assert logged(caplog, "tidewire.guard", "closing: no handshake within 10s")


def test_handshake_deadline_over_tls(
    tmp_path: Path, run: Run, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    """TLS done, no RS.io hello: the goodbye goes out encrypted; a peer that does not even
    start TLS is cut off."""
    caplog.set_level(logging.WARNING)

    async def main() -> None:
        async with hub_server(tmp_path, tls=pki.server_context("none")) as (_, server, url):
            host, port = url.removeprefix("rsio://").split(":")
            reader, writer = await asyncio.open_connection(
                host, int(port), ssl=pki.client_context()
            )
            tcp_reader, tcp_writer = await raw(url)
            await until(lambda: len(server.connections) == 1)
            await until(lambda: server.listener.admission.total == 2)
            server.listener.sweep(asyncio.get_running_loop().time() + 10)
            data = await read_all(reader)
            assert decode_rsio(data) == [ServerHello(0, (1, 2)), Goodbye("no handshake within 10s")]
            assert await read_all(tcp_reader) == b""
            writer.transport.abort()
            tcp_writer.close()
            await until(lambda: server.listener.admission.total == 0)

    run(main())
    assert len(logged(caplog, "tidewire.guard", "closing: no handshake within 10s")) == 2


def test_idle_connections_are_told_why(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, server, url):
            await hub.append(Batch.build("s", [b"x"]), assign_ids=True)
            async with tidewire.connect(url) as client:
                assert await values(client, "s", 1) == [b"x"]
                (protocol,) = server.connections
                now = asyncio.get_running_loop().time()
                server.listener.sweep(now)  # the subscription above was activity
                server.listener.sweep(now + 3599)
                assert server.connections == {protocol}
                # A frame of the client's still on its way at the first sweep (a busy machine)
                # counts as activity at the second: idle for 3600 s after that one at the latest.
                server.listener.sweep(now + 3599 + 3600)
                await until(lambda: server.connections == set())
                with pytest.raises((RsioError, LogClosedError), match="idle for 3600s"):
                    await values(client, "s", 1)

    run(main())


def test_shutdown_says_goodbye_to_a_connection_in_its_handshake(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        server = await start_rsio_server(hub, "127.0.0.1", 0)
        reader, writer = await raw(f"rsio://127.0.0.1:{server.port}")  # sends nothing
        await until(lambda: len(server.connections) == 1)
        await asyncio.wait_for(server.close(), 2)
        data = await asyncio.wait_for(read_all(reader), 2)
        assert decode_rsio(data) == [ServerHello(0, (1, 2)), Goodbye("server shutting down")]
        assert server.listener.admission.total == 0
        writer.close()
        await hub.close()

    run(main())


def test_shutdown_closes_connections_still_in_the_tls_handshake(
    tmp_path: Path, run: Run, pki: Pki
) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path))
        server = await start_rsio_server(hub, "127.0.0.1", 0, tls=pki.server_context("none"))
        reader, writer = await raw(f"rsio://127.0.0.1:{server.port}")  # never starts TLS
        try:
            await until(lambda: server.listener.admission.total == 1)
            await asyncio.wait_for(server.close(), 1)  # (Python >= 3.12: waits for the peer)
            assert await asyncio.wait_for(read_all(reader), 1) == b""
            assert server.listener.admission.total == 0
        finally:
            writer.close()
            await hub.close()

    run(main())


# --------------------------------------------------------------------------- exact bytes


def test_extension_2_golden_bytes(tmp_path: Path, run: Run) -> None:
    ci, table = mint_token("ci")
    access = Access(Acl.parse(ALICE_ACL), Tokens.parse(table))
    assert bytes(encode(Authenticate("ci.x"))) == bytes.fromhex("43 04 63 69 2e 78")
    assert bytes(encode(Authenticated("token:ci"))) == bytes.fromhex(
        "44 08 74 6f 6b 65 6e 3a 63 69"
    )

    async def main() -> None:
        async with hub_server(tmp_path, access=access) as (hub, _, url):
            await hub.append(Batch.build("pub.a", [b"p"]), assign_ids=True)
            reader, writer = await raw(url)
            hello = bytes.fromhex("00 00 02 01 02")  # clientHello, extensions [1, 2]
            subscribe = bytes(encode(Subscribe("pub.a?until=1", 1, 1)))
            writer.write(hello + bytes(encode(Authenticate(ci))) + subscribe)
            expected = bytes.fromhex("01 00 02 01 02")  # serverHello [1, 2]
            expected += bytes.fromhex("44 08") + b"token:ci"  # authenticated
            expected += bytes.fromhex("06 01 00")  # subscribed(1, 0)
            got = await reader.readexactly(len(expected))
            assert got == expected
            writer.close()

    run(main())


@pytest.mark.parametrize(
    ("hello", "then", "reason"),
    [
        # authenticate before the hub's hello lists 2 (the client did not list it): unknown
        ("00 00 01 01", "43 04 63 69 2e 78", "unknown message type 67"),
        ("00 00 00", "43 04 63 69 2e 78", "unknown message type 67"),
        # authenticated is the hub's to send
        ("00 00 02 01 02", "44 02 6d 65", "authenticated sent to the hub"),
        # before any hello
        ("", "43 04 63 69 2e 78", "unknown message type 67"),
    ],
)
def test_extension_2_breaches(tmp_path: Path, run: Run, hello: str, then: str, reason: str) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (_, _, url):
            reader, writer = await raw(url)
            writer.write(bytes.fromhex(hello) + bytes.fromhex(then))
            messages = decode_rsio(await read_all(reader))
            writer.close()
            assert messages[0] == ServerHello(0, (1, 2))
            assert len(messages) == 2
            assert isinstance(messages[1], Goodbye)
            assert messages[1].reason.startswith("protocol error: ")
            assert reason in messages[1].reason

    run(main())


def test_authenticate_twice_is_a_breach(tmp_path: Path, run: Run) -> None:
    ci, table = mint_token("ci")
    access = Access(tokens=Tokens.parse(table))

    async def main() -> None:
        async with hub_server(tmp_path, access=access) as (_, _, url):
            reader, writer = await raw(url)
            writer.write(
                bytes(encode(ClientHello(0, (1, 2)))) + bytes(encode(Authenticate(ci))) * 2
            )
            messages = decode_rsio(await read_all(reader))
            writer.close()
            assert messages[:2] == [ServerHello(0, (1, 2)), Authenticated("token:ci")]
            assert isinstance(messages[2], Goodbye)
            assert "a second authenticate" in messages[2].reason

    run(main())


def test_a_bad_token_gets_goodbye_bytes(tmp_path: Path, run: Run) -> None:
    _, table = mint_token("ci")
    access = Access(tokens=Tokens.parse(table))

    async def main() -> None:
        async with hub_server(tmp_path, access=access) as (_, server, url):
            reader, writer = await raw(url)
            writer.write(bytes.fromhex("00 00 02 01 02") + bytes(encode(Authenticate("ci.x"))))
            messages = decode_rsio(await read_all(reader))
            writer.close()
            assert messages == [
                ServerHello(0, (1, 2)),
                Goodbye("authentication failed: invalid token (claimed token:ci)"),
            ]
            await until(lambda: server.listener.admission.total == 0)

    run(main())


# --------------------------------------------------------------------------- hostile load
# (issue 20) Attacks against a real hub (tests/security/harness.py) with a small budget, each
# beside a well-behaved client: the attacker is refused or bounded, the hub's RSS stays within
# a bound derived from the budget, and the bystander sees no stall over the promise.

MiB = 1024 * 1024
BUDGET = {"memory.budget_bytes": 64 * MiB, "memory.principal_bytes": 32 * MiB,
          "memory.connection_bytes": 16 * MiB}  # fmt: skip
ATTACK_ACL = """
[principal.anonymous]
read = ["open.*"]

[principal."token:good"]
read = ["*"]
write = ["*"]
"""


def test_an_unfinished_element_has_a_deadline(tmp_path: Path, run: Run) -> None:
    """An offer's element declared (1000 bytes) and never finished: the guard's sweep ends the
    connection ``limits.message_seconds`` (60 s) after it began, not before (in process: the
    sweep is called with the time, nothing sleeps)."""

    async def main() -> None:
        async with hub_server(tmp_path) as (_, server, url):
            reader, writer = await raw(url)
            writer.write(bytes(encode(ClientHello(0, (1, 2))) + encode(Offer(1, "s"))
                               + encode(Subscribed(1, 0))) + b"\x07\x01\xe8\x07abc")  # fmt: skip
            await until(lambda: len(server.connections) == 1)
            (session,) = server.connections
            await until(lambda: session.receiving_since() is not None)
            since = session.receiving_since()
            assert since is not None
            server.listener.sweep(since + 59.9)
            assert server.connections
            server.listener.sweep(since + 60)
            data = await read_all(reader)
            writer.close()
            assert decode_rsio(data)[-1] == Goodbye("a message unfinished for 60s")
            assert data.endswith(bytes.fromhex(
                "02 1c 61 20 6d 65 73 73 61 67 65 20 75 6e 66 69 6e 69 73 68 65 64 20 66 6f"
                "72 20 36 30 73"))  # fmt: skip

    run(main())


def test_onnext_for_an_id_never_made_is_refused_at_its_header(tmp_path: Path) -> None:
    """8 connections each declare a 16 MiB element for subscription 7 (never made) and send
    up to 15 MiB of it: each is told goodbye at the header (or reset while still writing);
    the hub buffers none of it (before: +123-131 MiB)."""
    with real_hub(tmp_path, settings=BUDGET, tokens=["good"]) as hub:
        solo = alone(hub, 3, token=hub.tokens["good"])  # (as long as under attack)
        before = hub.rss()

        async def main() -> tuple[list[Answer], BystanderReport]:
            async with asyncio.timeout(60):
                answers, report = await asyncio.gather(
                    unknown_id_onnext(hub.rsio_port),
                    bystander(hub, 3, token=hub.tokens["good"]))  # fmt: skip
                return answers, report

        answers, report = helpers_run(main())
        for answer in answers:
            assert answer.reset or answer.goodbye == (
                "protocol error: elements for subscriber 7, which is not subscribed")
        assert hub.log_text().count("elements for subscriber 7, which is not subscribed") == 8
        growth = hub.peak_rss() - before
        assert growth <= BUDGET["memory.connection_bytes"], f"+{growth >> 20} MiB"
        assert_served(solo, report)


def test_refused_subscribes_end_the_connection_and_their_log_lines_are_aggregated(
    tmp_path: Path,
) -> None:
    """20 connections at once each send 8 MiB of subscribes to a stream the ACL forbids: each
    gets 100 onErrors, then goodbye (``limits.max_refusals``); the log has a handful of lines,
    not one per refusal (before: 1.2 M lines)."""
    with real_hub(tmp_path, settings=BUDGET, acl=ATTACK_ACL, tokens=["good"]) as hub:
        solo = alone(hub, 3, token=hub.tokens["good"])  # (as long as under attack)

        async def main() -> tuple[list[Answer], BystanderReport]:
            async with asyncio.timeout(60):
                answers, report = await asyncio.gather(
                    refused_subscribes(hub.rsio_port, count=400_000, connections=20),
                    bystander(hub, 3, token=hub.tokens["good"]))  # fmt: skip
                return answers, report

        answers, report = helpers_run(main())
        for answer in answers:
            assert answer.errors == 100 or answer.reset, answer.errors
            if not answer.reset:
                assert answer.goodbye == "too many refusals in a row (the limit is 100)"
        refusal_lines = [line for line in hub.log_text().splitlines()
                         if "tidewire.rsio" in line and "refus" in line]  # fmt: skip
        assert 1 <= len(refusal_lines) <= 10, refusal_lines  # (a burst of 5 per 10 s)
        assert_served(solo, report)


def test_a_flood_of_refusals_never_holds_the_hub(tmp_path: Path) -> None:
    """With ``limits.max_refusals`` out of the way, 8 MiB of refused subscribes (about 400,000)
    are all answered, a slice at a time: the bystander sees no stall (before: 9-22 s)."""
    settings = {**BUDGET, "limits.max_refusals": 10**9}
    with real_hub(tmp_path, settings=settings, acl=ATTACK_ACL, tokens=["good"]) as hub:
        solo = alone(hub, 4, token=hub.tokens["good"])  # (as long as under attack)

        async def main() -> tuple[list[Answer], BystanderReport]:
            async with asyncio.timeout(90):
                answers, report = await asyncio.gather(
                    refused_subscribes(hub.rsio_port, count=400_000),
                    bystander(hub, 4, token=hub.tokens["good"]))  # fmt: skip
                return answers, report

        (answer,), report = helpers_run(main(), timeout=120)
        assert answer.errors == 400_000
        assert_served(solo, report)
        lines = [line for line in hub.log_text().splitlines()
                 if "tidewire.rsio" in line and "refus" in line]  # fmt: skip
        # a burst of 5 and then a line saying how many more, per 10 s (the attack lasts 5-20 s)
        assert len(lines) <= 20, lines[:30]


def test_a_subscriber_that_never_reads_costs_the_mark_and_one_delivery(tmp_path: Path) -> None:
    """100 subscriptions with unbounded demand on one connection that reads nothing: the hub
    grows by at most its high-water mark (4 MiB) and one delivery (1 MiB), plus slack for the
    log's reads (before: +34-243 MiB)."""
    with real_hub(tmp_path, settings=BUDGET, tokens=["good"]) as hub:

        async def fill() -> None:
            async with await tidewire.connect(hub.rsio_url, token=hub.tokens["good"]) as client:
                for _ in range(32):
                    await client.publish("big", [b"v" * 65536] * 16)  # 32 MiB in all

        helpers_run(fill())
        solo = alone(hub, 3, token=hub.tokens["good"])  # (as long as under attack)
        before = hub.rss()

        async def main() -> BystanderReport:
            async with asyncio.timeout(60):
                _, report = await asyncio.gather(
                    never_reading(hub.rsio_port, "big", seconds=4),
                    bystander(hub, 3, token=hub.tokens["good"]))  # fmt: skip
                return report

        report = helpers_run(main())
        growth = hub.peak_rss() - before
        assert growth <= 4 * MiB + 1 * MiB + 8 * MiB, f"+{growth >> 20} MiB"
        assert_served(solo, report)
