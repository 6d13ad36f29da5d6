"""The guard in front of every listener (tidewire.server.guard), with trivial protocols on
127.0.0.1 under the default loop and uvloop: admission counts, the handshake, idle and
stalled-output deadlines (driven by ``Listener.sweep(now)``, never by sleeping), TLS with and
without client certificates, and many idle connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import pytest

from helpers import until
from loops import Run, line
from tidewire.server.guard import (
    Admission,
    ConnectionLimits,
    GuardedConnection,
    Listener,
    established,
    peer_certificate,
)

if TYPE_CHECKING:
    from certs import Pki


# --------------------------------------------------------------------------- protocols


class Echo(asyncio.Protocol):
    """Echoes what it receives. Its handshake is the first bytes it receives (or none, with
    ``eager``): then it tells the guard it is established."""

    def __init__(self, registry: list[Echo], eager: bool = False) -> None:
        self.eager = eager
        self.transport: asyncio.Transport | None = None
        self.peercert: dict[str, Any] | None = None
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        registry.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.peercert = peer_certificate(transport)
        if self.eager:
            established(transport)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        established(self.transport)
        self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


class Flood(Echo):
    """Writes 64 KiB chunks until the transport says ``pause_writing``."""

    def __init__(self, registry: list[Echo]) -> None:
        super().__init__(registry, eager=True)
        self.paused = asyncio.Event()
        self.resumed = asyncio.Event()
        self.written = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        chunk = b"x" * 65536
        while not self.paused.is_set() and self.written < 512 * 1024 * 1024:
            self.transport.write(chunk)
            self.written += len(chunk)

    def pause_writing(self) -> None:
        self.paused.set()

    def resume_writing(self) -> None:
        self.resumed.set()


@asynccontextmanager
async def listening(
    limits: ConnectionLimits,
    make: Callable[[list[Echo]], Echo] = Echo,
    *,
    tls: ssl.SSLContext | None = None,
    refuse: Callable[[str], bytes] | None = None,
    admission: Admission | None = None,
) -> AsyncIterator[tuple[Listener, list[Echo]]]:
    protocols: list[Echo] = []
    listener = Listener(
        "test", lambda: make(protocols), admission or Admission(limits), tls=tls, refuse=refuse
    )
    await listener.start("127.0.0.1", 0)
    try:
        yield listener, protocols
    finally:
        listener.close()
        for conn in list(listener.connections):
            conn.abort()
        await listener.wait_closed()


async def connect(
    listener: Listener, ssl_ctx: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", listener.port, ssl=ssl_ctx)


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    """What arrives until the peer closes (a reset or a TLS alert ends it too)."""
    out = b""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while data := await reader.read(65536):
            out += data
    return out


async def echo(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes = b"ping"
) -> bytes:
    writer.write(data)
    return await reader.readexactly(len(data))


def guarded(listener: Listener) -> list[GuardedConnection]:
    return sorted(listener.connections, key=lambda c: c.serial)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [line(r) for r in caplog.records if r.name == "tidewire.guard"]


# --------------------------------------------------------------------------- admission


def test_admission_total_and_per_peer() -> None:
    admission = Admission(ConnectionLimits(max_connections=4, max_connections_per_peer=2))
    assert admission.admit("10.0.0.1") is None
    assert admission.admit("10.0.0.1") is None
    assert admission.admit("10.0.0.1") == "too many connections from 10.0.0.1 (the limit is 2)"
    assert admission.per_peer == {"10.0.0.1": 2}
    assert admission.admit("10.0.0.2") is None
    assert admission.admit("::1") is None
    assert admission.total == 4
    assert admission.admit("10.0.0.3") == "too many connections (the limit is 4)"
    assert admission.total == 4  # a refusal counts nothing
    admission.release("10.0.0.1")
    assert admission.per_peer == {"10.0.0.1": 1, "10.0.0.2": 1, "::/64": 1}
    assert admission.admit("10.0.0.3") is None
    for host in ("10.0.0.1", "10.0.0.2", "::1", "10.0.0.3"):
        admission.release(host)
    assert (admission.total, admission.per_peer) == (0, {})


def test_an_ipv6_peer_is_its_64_by_default() -> None:
    """A host handed a /64 cannot multiply its share by changing address within it."""
    admission = Admission(ConnectionLimits(max_connections_per_peer=2))
    assert admission.admit("2001:db8:1:2::1") is None
    assert admission.admit("2001:db8:1:2:ffff:ffff:ffff:ffff") is None
    assert admission.admit("2001:db8:1:2::7") == (
        "too many connections from 2001:db8:1:2::/64 (the limit is 2)"
    )
    assert admission.admit("2001:db8:1:3::1") is None  # the next /64 is another peer
    assert admission.per_peer == {"2001:db8:1:2::/64": 2, "2001:db8:1:3::/64": 1}
    for host in ("2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:3::1"):
        admission.release(host)
    assert (admission.total, admission.per_peer) == (0, {})


@pytest.mark.parametrize(
    ("host", "v4", "v6", "peer"),
    [
        ("192.0.2.77", 32, 64, "192.0.2.77"),
        ("192.0.2.77", 24, 64, "192.0.2.0/24"),
        ("192.0.2.77", 0, 64, "0.0.0.0/0"),
        ("::ffff:192.0.2.77", 24, 64, "192.0.2.0/24"),  # IPv4-mapped: counted as IPv4
        ("2001:db8::1", 32, 48, "2001:db8::/48"),
        ("2001:db8::1", 32, 128, "2001:db8::1"),
        ("fe80::1%eth0", 32, 64, "fe80::/64"),  # the zone is not part of the peer
        ("::1", 32, 64, "::/64"),
        ("?", 32, 64, "?"),  # not an address: itself
        ("/run/hub.sock", 32, 64, "/run/hub.sock"),
    ],
)
def test_peer_networks(host: str, v4: int, v6: int, peer: str) -> None:
    limits = ConnectionLimits(peer_prefix_v4=v4, peer_prefix_v6=v6)
    assert Admission(limits).peer(host) == peer


def test_peer_prefixes_are_checked() -> None:
    with pytest.raises(ValueError, match="peer_prefix_v4"):
        ConnectionLimits(peer_prefix_v4=33)
    with pytest.raises(ValueError, match="peer_prefix_v6"):
        ConnectionLimits(peer_prefix_v6=-1)


def test_an_ipv4_prefix_counts_neighbours_together(run: Run) -> None:
    """Real sockets from 127.0.0.1, .2 and .3 (all loopback) to a listener on 127.0.0.1:
    with ``peer_prefix_v4 = 24`` they are one peer."""
    limits = ConnectionLimits(max_connections_per_peer=2, peer_prefix_v4=24)

    async def main() -> None:
        async with listening(limits, refuse=lambda r: f"NO {r}\n".encode()) as (listener, _):
            port = listener.port
            clients = []
            for source in ("127.0.0.1", "127.0.0.2"):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, local_addr=(source, 0))  # fmt: skip
                assert await echo(reader, writer) == b"ping"
                clients.append(writer)
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                           local_addr=("127.0.0.3", 0))  # fmt: skip
            assert await read_to_end(reader) == (
                b"NO too many connections from 127.0.0.0/24 (the limit is 2)\n")  # fmt: skip
            writer.close()
            for w in clients:
                w.close()
            await until(lambda: listener.admission.total == 0)

    run(main())


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
def test_an_ipv6_peer_over_real_sockets_is_its_64(run: Run) -> None:
    """A listener on ::1 (the loopback): its peer is ``::/64``, named so in the refusal."""
    limits = ConnectionLimits(max_connections_per_peer=1)

    async def main() -> None:
        listener = Listener("test", lambda: Echo([]), Admission(limits),
                            refuse=lambda r: f"NO {r}\n".encode())  # fmt: skip
        await listener.start("::1", 0)
        try:
            reader, writer = await asyncio.open_connection("::1", listener.port)
            assert await echo(reader, writer) == b"ping"
            assert listener.admission.per_peer == {"::/64": 1}
            refused_reader, refused_writer = await asyncio.open_connection("::1", listener.port)
            assert await read_to_end(refused_reader) == (
                b"NO too many connections from ::/64 (the limit is 1)\n")  # fmt: skip
            refused_writer.close()
            writer.close()
            await until(lambda: listener.admission.total == 0)
        finally:
            listener.close()
            for conn in list(listener.connections):
                conn.abort()
            await listener.wait_closed()

    run(main())


def test_admission_is_shared_by_listeners_and_refuses_in_the_protocols_words(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "tidewire.guard")
    limits = ConnectionLimits(max_connections=10, max_connections_per_peer=3)
    admission = Admission(limits)

    async def main() -> None:
        refuse = lambda reason: f"NO {reason}\n".encode()  # noqa: E731
        async with (
            listening(limits, admission=admission, refuse=refuse) as (one, _),
            listening(limits, admission=admission) as (two, _),
        ):
            clients = [await connect(one), await connect(two), await connect(one)]
            for reader, writer in clients:
                assert await echo(reader, writer) == b"ping"
            assert admission.total == 3
            assert admission.per_peer == {"127.0.0.1": 3}
            # one over, on either listener: refused (with the refusal bytes where there are)
            reader, writer = await connect(one)
            assert await read_to_end(reader) == (
                b"NO too many connections from 127.0.0.1 (the limit is 3)\n"
            )
            writer.close()
            reader, writer = await connect(two)
            assert await read_to_end(reader) == b""  # no refuse(): just closed
            writer.close()
            assert (one.refused, two.refused) == (1, 1)
            assert admission.total == 3
            # a release frees a slot
            clients[0][1].close()
            await until(lambda: admission.total == 2)
            reader, writer = await connect(two)
            assert await echo(reader, writer) == b"ping"
            assert admission.total == 3
            for _, w in [*clients[1:], (reader, writer)]:
                w.close()
            await until(lambda: admission.total == 0)
            assert admission.per_peer == {}

    run(main())
    refused = [m for m in messages(caplog) if "refused" in m]
    assert len(refused) == 2
    assert all("too many connections from 127.0.0.1 (the limit is 3)" in m for m in refused)
    assert all(re.match(r"\[test #\d+ 127\.0\.0\.1:\d+\] ", m) for m in refused)


# --------------------------------------------------------------------------- deadlines


def test_handshake_deadline(run: Run, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "tidewire.guard")
    limits = ConnectionLimits(handshake_seconds=10, idle_seconds=0)

    async def main() -> None:
        async with listening(limits) as (listener, protocols):
            loop = asyncio.get_running_loop()
            done_r, done_w = await connect(listener)
            assert await echo(done_r, done_w) == b"ping"  # its handshake: established
            silent_r, silent_w = await connect(listener)
            await until(lambda: len(listener.connections) == 2)
            silent = guarded(listener)[1]
            assert silent.deadline == silent.started + 10
            listener.sweep(silent.started + 9.9)
            assert len(listener.connections) == 2
            listener.sweep(silent.started + 10)
            assert await read_to_end(silent_r) == b""  # closed by the guard
            await protocols[1].lost
            assert not protocols[0].lost.done()
            listener.sweep(loop.time() + 1000)  # no idle limit, and its handshake is over
            assert await echo(done_r, done_w, b"still here") == b"still here"
            assert listener.admission.total == 1
            done_w.close()
            silent_w.close()
            await until(lambda: listener.admission.total == 0)

    run(main())
    (closing,) = [m for m in messages(caplog) if "closing" in m]
    assert closing.endswith("closing: no handshake within 10s")


def test_idle_deadline_and_activity_resets_it(run: Run, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "tidewire.guard")
    limits = ConnectionLimits(handshake_seconds=0, idle_seconds=100, write_stall_seconds=0)

    async def main() -> None:
        async with listening(limits, lambda r: Echo(r, eager=True)) as (listener, protocols):
            loop = asyncio.get_running_loop()
            busy_r, busy_w = await connect(listener)
            assert await echo(busy_r, busy_w) == b"ping"
            await until(lambda: len(protocols) == 1)
            t0 = loop.time()
            listener.sweep(t0 + 50)  # activity seen: idle since t0 + 50
            listener.sweep(t0 + 149)
            assert not protocols[0].lost.done()
            assert await echo(busy_r, busy_w) == b"ping"
            listener.sweep(t0 + 200)  # activity again: idle since t0 + 200
            listener.sweep(t0 + 299)
            assert not protocols[0].lost.done()
            assert await echo(busy_r, busy_w) == b"ping"
            quiet_r, quiet_w = await connect(listener)
            await until(lambda: len(protocols) == 2)
            t1 = loop.time()
            listener.sweep(t1 + 100)  # the new, quiet one is idle; the busy one was active
            assert await read_to_end(quiet_r) == b""
            assert not protocols[0].lost.done()
            listener.sweep(t1 + 199)
            assert not protocols[0].lost.done()
            listener.sweep(t1 + 200)
            assert await read_to_end(busy_r) == b""
            await until(lambda: listener.admission.total == 0)
            busy_w.close()
            quiet_w.close()

    run(main())
    closing = [m for m in messages(caplog) if "closing" in m]
    assert len(closing) == 2
    assert all(m.endswith("closing: idle for 100s") for m in closing)


def test_stalled_output_is_aborted(run: Run, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "tidewire.guard")
    limits = ConnectionLimits(handshake_seconds=0, idle_seconds=0, write_stall_seconds=60)

    async def main() -> None:
        async with listening(limits, Flood) as (listener, protocols):
            _, writer = await connect(listener)  # and never read
            await until(lambda: len(protocols) == 1)
            flood = cast(Flood, protocols[0])
            assert flood.paused.is_set(), f"no pause_writing after {flood.written} bytes"
            (conn,) = listener.connections
            assert conn.stalled_since is not None
            assert conn.get_write_buffer_size() > 0
            listener.sweep(conn.stalled_since + 59.9)
            assert not flood.lost.done()
            listener.sweep(conn.stalled_since + 60)
            await flood.lost
            assert listener.connections == set()
            assert listener.admission.total == 0
            writer.close()

    run(main())
    (dropped,) = [m for m in messages(caplog) if "dropped" in m]
    assert "read nothing for 60s with" in dropped
    assert "bytes waiting for it" in dropped


def test_a_peer_that_reads_again_is_not_stalled(run: Run) -> None:
    limits = ConnectionLimits(handshake_seconds=0, idle_seconds=0, write_stall_seconds=60)

    async def main() -> None:
        async with listening(limits, Flood) as (listener, protocols):
            reader, writer = await connect(listener)
            await until(lambda: len(protocols) == 1)
            flood = cast(Flood, protocols[0])
            assert flood.paused.is_set()
            (conn,) = listener.connections
            got = 0
            while not flood.resumed.is_set():
                got += len(await reader.read(1 << 20))
            assert conn.stalled_since is None
            listener.sweep(asyncio.get_running_loop().time() + 1000)
            assert not flood.lost.done()
            writer.close()
            await flood.lost

    run(main())


def test_deadline_during_the_tls_handshake(
    run: Run, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "tidewire.guard")
    limits = ConnectionLimits(handshake_seconds=10)

    async def main() -> None:
        tls = pki.server_context("none")
        async with listening(limits, tls=tls) as (listener, protocols):
            reader, writer = await connect(listener)  # TCP only: never starts TLS
            await until(lambda: listener.admission.total == 1)
            listener.sweep(asyncio.get_running_loop().time() + 10)
            assert await read_to_end(reader) == b""
            await until(lambda: listener.admission.total == 0)
            assert listener.connections == set()
            assert protocols == []
            writer.close()

    run(main())
    assert any(m.endswith("closing: no handshake within 10s") for m in messages(caplog))


# --------------------------------------------------------------------------- TLS


def test_tls_gives_the_protocol_the_peer_certificate(run: Run, pki: Pki) -> None:
    alice = pki.client("alice")

    async def main() -> None:
        async with listening(ConnectionLimits(), tls=pki.server_context("required")) as (
            listener,
            protocols,
        ):
            reader, writer = await connect(listener, pki.client_context(alice))
            assert await echo(reader, writer, b"over tls") == b"over tls"
            big = bytes(range(256)) * 4096  # 1 MiB, many TLS records each way
            assert await echo(reader, writer, big) == big
            (protocol,) = protocols
            assert protocol.peercert is not None
            subject = dict(x[0] for x in protocol.peercert["subject"])
            assert subject["commonName"] == "alice"
            assert protocol.transport is not None
            assert protocol.transport.get_extra_info("ssl_object") is not None
            assert protocol.transport.get_extra_info("guard") in listener.connections
            writer.transport.abort()
            await protocol.lost
            await until(lambda: listener.admission.total == 0)

    run(main())


def test_tls_close_notify_ends_the_connection(run: Run, pki: Pki) -> None:
    """A client that closes TLS properly (close_notify, then waits for the hub's) is answered
    at once: the wrapped protocol sees the end, and the slot is free again."""

    async def main() -> None:
        async with listening(ConnectionLimits(), tls=pki.server_context("none")) as (
            listener,
            protocols,
        ):
            reader, writer = await connect(listener, pki.client_context())
            assert await echo(reader, writer) == b"ping"
            writer.close()
            try:
                await asyncio.wait_for(asyncio.shield(protocols[0].lost), 1.5)
                await asyncio.wait_for(writer.wait_closed(), 1.5)
            finally:
                writer.transport.abort()
            assert listener.admission.total == 0

    run(main())


def test_tls_optional_client_certificate(run: Run, pki: Pki) -> None:
    async def main() -> None:
        async with listening(ConnectionLimits(), tls=pki.server_context("optional")) as (
            listener,
            protocols,
        ):
            reader, writer = await connect(listener, pki.client_context())
            assert await echo(reader, writer) == b"ping"
            assert protocols[0].peercert is None  # anonymous
            writer.transport.abort()
            reader, writer = await connect(listener, pki.client_context(pki.client("bob")))
            assert await echo(reader, writer) == b"ping"
            assert protocols[1].peercert is not None
            writer.transport.abort()
            await until(lambda: listener.admission.total == 0)

    run(main())


def test_plain_text_to_a_tls_listener(run: Run, pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "tidewire.guard")

    async def main() -> None:
        async with listening(ConnectionLimits(), tls=pki.server_context("none")) as (
            listener,
            protocols,
        ):
            reader, writer = await connect(listener)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"HTTP" not in await read_to_end(reader)
            writer.close()
            await until(lambda: listener.admission.total == 0)
            assert protocols == []
            # the listener carries on
            reader, writer = await connect(listener, pki.client_context())
            assert await echo(reader, writer) == b"ping"
            writer.transport.abort()
            await until(lambda: listener.admission.total == 0)

    run(main())
    (failed,) = [m for m in messages(caplog) if "TLS handshake failed" in m]
    assert re.match(r"\[test #\d+ 127\.0\.0\.1:\d+\] ", failed)


@pytest.mark.parametrize(
    ("mode", "case", "words"),
    [
        ("required", "no certificate", ("certificate",)),
        ("required", "expired", ("certificate has expired",)),
        ("required", "untrusted", ("unable to get local issuer certificate", "unknown ca")),
        ("optional", "expired", ("certificate has expired",)),  # one that is sent must verify
        ("optional", "untrusted", ("unable to get local issuer certificate", "unknown ca")),
    ],
)
def test_bad_client_certificates_are_refused(
    run: Run,
    pki: Pki,
    caplog: pytest.LogCaptureFixture,
    mode: str,
    case: str,
    words: tuple[str, ...],
) -> None:
    caplog.set_level(logging.WARNING, "tidewire.guard")
    cert = {
        "no certificate": None,
        "expired": pki.client("eve", expired=True),
        "untrusted": pki.client("mallory", untrusted=True),
    }[case]

    async def main() -> None:
        async with listening(ConnectionLimits(), tls=pki.server_context(mode)) as (
            listener,
            protocols,
        ):
            try:
                reader, writer = await connect(listener, pki.client_context(cert))
            except (ssl.SSLError, ConnectionError):
                pass  # refused during the client's handshake (TLS 1.2)
            else:  # TLS 1.3: the server's verdict arrives after the client's handshake
                writer.write(b"ping")
                assert await read_to_end(reader) == b""
                writer.close()
            await until(lambda: any("TLS handshake failed" in m for m in messages(caplog)))
            await until(lambda: listener.admission.total == 0)
            assert listener.connections == set()
            assert protocols == []

    run(main())
    (failed,) = [m for m in messages(caplog) if "TLS handshake failed" in m]
    assert any(w in failed for w in words), failed


# --------------------------------------------------------------------------- many


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_many_idle_connections_cost_little_and_are_all_closed(run: Run) -> None:
    n = 300
    limits = ConnectionLimits(max_connections_per_peer=n, handshake_seconds=0, idle_seconds=100)

    async def main() -> None:
        async with listening(limits, lambda r: Echo(r, eager=True)) as (listener, protocols):
            warm = [await connect(listener) for _ in range(10)]  # allocator warm-up
            await until(lambda: len(listener.connections) == 10)
            before = rss_bytes()
            clients = [await connect(listener) for _ in range(n - 10)]
            await until(lambda: len(listener.connections) == n)
            grown = rss_bytes() - before
            assert grown < (n - 10) * 64 * 1024, f"{grown} bytes for {n - 10} connections"
            assert listener.admission.per_peer == {"127.0.0.1": n}
            # one more from the same peer is refused
            reader, writer = await connect(listener)
            assert await read_to_end(reader) == b""
            writer.close()
            assert listener.refused == 1
            listener.sweep(asyncio.get_running_loop().time() + 100)
            ends = await asyncio.gather(*(read_to_end(r) for r, _ in warm + clients))
            assert ends == [b""] * n
            await asyncio.gather(*(p.lost for p in protocols))
            assert listener.connections == set()
            assert (listener.admission.total, listener.admission.per_peer) == (0, {})
            for _, w in warm + clients:
                w.close()

    run(main())
