"""Seguro's security and limits (issues 9 and 20) over real sockets: TLS end to end, mutual TLS
where the certificate names the point, the ACL (welcome, SAVE, SAVE MANY, READ), and the guard's
limits (connections per peer, handshake, idle and unfinished-message deadlines, event size).
Every refusal drops the connection (Seguro has no error reply), is logged naming the principal,
and leaves the other sessions working. Certificates are made by trustme at test time
(tests/certs.py); deadlines are driven by calling the listener's ``sweep`` with a chosen time,
never by sleeping.

Issue 20's attacks run against a real hub (``tidewire serve``, tests/security/harness.py) with a
well-behaved RS.io client publishing and subscribing alongside: a read-only principal trying to
take a point while its owner saves, and events declared larger than the memory budget allows
(or declared and never finished) from many connections at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import ssl
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from harness import RealHub, assert_served, bystander, real_hub
from seguro_attacks import huge_event, squatter, unfinished_event

from helpers import own_rss, run, until
from loops import logged
from seguro_hub import HOST, REFUSED, closed, point, seguro_hub, still_works
from tidewire.client.backoff import Retry
from tidewire.client.seguro import SeguroError, connect
from tidewire.model import Batch
from tidewire.protocols.seguro import Limits, Refused, Sent, ServerSession
from tidewire.protocols.seguro.patp import SUFFIXES
from tidewire.server.guard import ConnectionLimits
from tidewire.server.seguro import (
    READ_BATCH_BYTES,
    WRITE_HIGH_WATER,
)

if TYPE_CHECKING:
    from certs import Pki

# --------------------------------------------------------------------------- sans-IO


@pytest.mark.parametrize(
    ("may_read", "may_write", "line", "command"),
    [
        (True, False, b"SAVE 1 1000000\n", "SAVE"),
        (True, False, b"SAVE MANY 2 1 2\n", "SAVE MANY"),
        (False, True, b"READ 1 10\n", "READ"),
    ],
)
def test_the_session_refuses_a_command_on_its_line(
    may_read: bool, may_write: bool, line: bytes, command: str
) -> None:
    """What ``welcome`` allowed is enforced on the command line, before any data."""
    session = ServerSession()
    session.initiate()
    session.receive_data(b"HELLO 0\nPOINT ~zod\n")
    while session.next_event() is not None:
        pass
    session.welcome(None, may_read=may_read, may_write=may_write)
    assert session.data_to_send() == b"SEGURO 0\nIDENTIFY 0\nWELCOME ~zod\n"
    session.receive_data(line)
    assert session.next_event() == Refused(command)
    assert session.closed
    assert session.data_to_send() == b""
    allowed = ServerSession()  # the other flows are untouched
    allowed.receive_data(b"HELLO 0\nPOINT ~zod\n")
    while allowed.next_event() is not None:
        pass
    allowed.welcome(None, may_read=not may_read, may_write=not may_write)
    allowed.receive_data(line)
    assert not isinstance(allowed.next_event(), Refused)


# --------------------------------------------------------------------------- TLS


def test_tls_end_to_end_with_a_client_certificate_for_the_point(pki: Pki, tmp_path: Path) -> None:
    async def main() -> None:
        async with seguro_hub(tmp_path, tls=pki.server_context("required")) as s:
            zod = pki.client_context(pki.client("~zod"))
            async with connect(s.url, "~zod", ssl=zod) as ship:
                await ship.save(1, b"one")
                await ship.save_many([(2, b"two"), (3, b"three")])
                assert await ship.read(1, 10) == ([(1, b"one"), (2, b"two"), (3, b"three")],
                                                  Sent(3, 1, 3))  # fmt: skip
                (protocol,) = s.server.connections
                assert str(protocol.principal) == "cert:~zod"
            # seguros:// and a host name: the hub's certificate is for localhost too
            url = f"seguros://localhost:{s.server.port}"
            async with connect(url, "~zod", ssl=zod) as again:
                assert again.latest == 3
            assert s.hub.latest("~zod") == 3

    run(main())


def test_tls_with_optional_client_certificates_lets_anonymous_ships_in(
    pki: Pki, tmp_path: Path
) -> None:
    async def main() -> None:
        async with (
            seguro_hub(tmp_path, tls=pki.server_context("optional")) as s,
            connect(s.url, "~zod", ssl=pki.client_context()) as ship,
        ):
            await still_works(ship, 1)
            (protocol,) = s.server.connections
            assert str(protocol.principal) == "anonymous"

    run(main())


def test_the_client_verifies_the_hub(pki: Pki, tmp_path: Path) -> None:
    """A client that does not trust the hub's CA, or that expects another host name, refuses
    the hub (nothing is skipped)."""

    async def main() -> None:
        async with seguro_hub(tmp_path, tls=pki.server_context("none")) as s:
            with pytest.raises(ssl.SSLCertVerificationError):
                await connect(s.url, "~zod", ssl=ssl.create_default_context())
            with pytest.raises(ssl.SSLCertVerificationError):
                await asyncio.open_connection(HOST, s.server.port, ssl=pki.client_context(),
                                              server_hostname="example.org")  # fmt: skip
            async with connect(s.url, "~zod", ssl=pki.client_context()) as ship:
                await still_works(ship, 1)

    run(main())


@pytest.mark.parametrize("credentials", ["none", "expired", "untrusted"])
def test_bad_client_certificates_are_refused_at_the_tls_handshake(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture, credentials: str
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire")
    cert = {
        "none": None,
        "expired": pki.client("~zod", expired=True),
        "untrusted": pki.client("~zod", untrusted=True),
    }[credentials]
    reason = {"none": "certificate", "expired": "expired", "untrusted": "issuer"}[credentials]

    async def main() -> None:
        async with seguro_hub(tmp_path, tls=pki.server_context("required")) as s:
            good = pki.client_context(pki.client("~marzod"))
            async with connect(s.url, "~marzod", ssl=good) as other:
                await other.save(1, b"before")
                with pytest.raises(REFUSED):
                    await connect(s.url, "~zod", ssl=pki.client_context(cert))
                line = await logged(caplog, "tidewire.guard", "seguro", "TLS handshake failed")
                assert reason in line.lower(), line
                assert "~zod" not in s.server.points
                await still_works(other, 2)
            assert s.hub.latest("~zod") == 0

    run(main())


def test_a_certificate_for_another_point_is_dropped_before_welcome(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")

    async def main() -> None:
        async with seguro_hub(tmp_path, tls=pki.server_context("required")) as s:
            bus = pki.client_context(pki.client("~bus"))
            reader, writer = await asyncio.open_connection(HOST, s.server.port, ssl=bus)
            await point(reader, writer, "~zod")
            said = await closed(reader)
            writer.close()
            assert said == b""  # no WELCOME
            line = await logged(caplog, "tidewire.seguro", "cert:~bus", "~zod")
            assert "refused" in line
            with pytest.raises(SeguroError):
                await connect(s.url, "~zod", ssl=bus)
            # the point was never taken: its own certificate gets in
            async with connect(s.url, "~zod", ssl=pki.client_context(pki.client("~zod"))) as z:
                await still_works(z, 1)

    run(main())


# --------------------------------------------------------------------------- the ACL

ACL = """
[principal."cert:~zod"]        # its own log, read-only
read = ["~zod"]

[principal."cert:~bus"]        # write-only
write = ["~bus"]

[principal."cert:~nec"]        # rights on another stream only
read = ["~zod"]
write = ["~zod"]

[principal."cert:~marzod"]
read = ["~marzod"]
write = ["~marzod"]
"""


@pytest.mark.parametrize(
    ("name", "flow", "fragment"),
    [
        ("~zod", b"SAVE 1 1000000\n", "cert:~zod may not write stream '~zod' (SAVE)"),
        ("~zod", b"SAVE MANY 2 1 2\n", "cert:~zod may not write stream '~zod' (SAVE MANY)"),
        ("~bus", b"READ 1 10\n", "cert:~bus may not read stream '~bus' (READ)"),
        ("~nec", b"", "cert:~nec may neither read nor write stream '~nec'"),
    ],
)
def test_the_acl_refuses_a_flow_at_its_command_line(
    pki: Pki,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    name: str,
    flow: bytes,
    fragment: str,
) -> None:
    """The SAVE declares a megabyte it never sends: it is refused on its command line."""
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")

    async def main() -> None:
        async with seguro_hub(tmp_path, tls=pki.server_context("required"), acl=ACL) as s:
            marzod = pki.client_context(pki.client("~marzod"))
            async with connect(s.url, "~marzod", ssl=marzod) as other:
                await other.save(1, b"before")
                ctx = pki.client_context(pki.client(name))
                reader, writer = await asyncio.open_connection(HOST, s.server.port, ssl=ctx)
                await point(reader, writer, name)
                if flow:
                    assert await reader.readuntil(b"WELCOME %s\n" % name.encode())
                    writer.write(flow)
                said = await closed(reader)
                writer.close()
                assert b"COMMITTED" not in said
                assert b"SENT" not in said
                assert b"WELCOME" not in said  # (read above when the flow needed it)
                line = await logged(caplog, "tidewire.seguro", fragment)
                assert "dropping the connection" in line
                await still_works(other, 2)
            assert s.hub.latest(name) == 0

    run(main())


def test_allowed_principals_work_and_the_client_sees_a_refusal(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")

    async def main() -> None:
        async with seguro_hub(tmp_path, tls=pki.server_context("required"), acl=ACL) as s:
            bus = pki.client_context(pki.client("~bus"))
            async with connect(s.url, "~bus", ssl=bus) as ship:  # write-only: welcomed
                await ship.save(1, b"one")
                await ship.save_many([(2, b"two"), (3, b"three")])
                with pytest.raises(SeguroError):
                    await ship.read(1, 10)
            assert s.hub.latest("~bus") == 3
            zod = pki.client_context(pki.client("~zod"))
            async with connect(s.url, "~zod", ssl=zod) as ship:  # read-only: welcomed
                assert await ship.read(1, 10) == ([], Sent(0, 0, 0))
                with pytest.raises(SeguroError):
                    await ship.save(1, b"no")
            assert s.hub.latest("~zod") == 0
            await logged(caplog, "tidewire.seguro", "cert:~bus", "(READ)")
            await logged(caplog, "tidewire.seguro", "cert:~zod", "(SAVE)")

    run(main())


def test_the_acl_applies_to_anonymous_ships_over_plain_tcp(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")
    acl = '[principal.anonymous]\nread = ["~*"]\nwrite = ["~marzod"]\n'

    async def main() -> None:
        async with seguro_hub(tmp_path, acl=acl) as s:
            async with connect(s.url, "~marzod") as ship:
                await still_works(ship, 1)
            async with connect(s.url, "~zod") as ship:
                assert await ship.read(1, 1) == ([], Sent(0, 0, 0))
                with pytest.raises(SeguroError):
                    await ship.save(1, b"no")
            await logged(caplog, "tidewire.seguro", "anonymous may not write stream '~zod'")

    run(main())


# --------------------------------------------------------------------------- limits


def test_connections_per_peer(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.guard")
    limits = ConnectionLimits(max_connections_per_peer=2)

    async def main() -> None:
        async with seguro_hub(tmp_path, limits=limits) as s:
            async with connect(s.url, "~zod") as zod, connect(s.url, "~bus") as bus:
                with pytest.raises(SeguroError):  # closed before SEGURO
                    await connect(s.url, "~nec")
                await logged(caplog, "tidewire.guard", "seguro", "too many connections from")
                assert "~nec" not in s.server.points
                await still_works(zod, 1)
                await still_works(bus, 1)
            # once they are gone, there is room again
            deadline = time.monotonic() + 5
            while s.server.listener.admission.total:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            async with connect(s.url, "~nec") as nec:
                await still_works(nec, 1)

    run(main())


def test_the_handshake_deadline(pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A ship that says nothing (over plain TCP or TLS, before or after TLS) is closed by the
    sweep past the deadline; one welcomed is not."""
    caplog.set_level(logging.WARNING, logger="tidewire.guard")
    limits = ConnectionLimits(handshake_seconds=5, idle_seconds=100)

    async def main() -> None:
        async with seguro_hub(tmp_path, limits=limits, tls=pki.server_context("optional")) as s:
            loop = asyncio.get_running_loop()
            ctx = pki.client_context()
            async with connect(s.url, "~zod", ssl=ctx) as ship:
                silent, w1 = await asyncio.open_connection(HOST, s.server.port, ssl=ctx)
                assert await silent.readline() == b"SEGURO 0\n"  # TLS done, no HELLO
                halfway, w2 = await asyncio.open_connection(HOST, s.server.port, ssl=ctx)
                w2.write(b"HELLO 0\n")
                assert await halfway.readuntil(b"IDENTIFY 0\n")
                plain, w3 = await asyncio.open_connection(HOST, s.server.port)  # no TLS
                s.server.listener.sweep(loop.time() + 1)  # before the deadline: nothing
                await still_works(ship, 1)
                s.server.listener.sweep(loop.time() + 6)
                for reader in (silent, halfway, plain):
                    assert await closed(reader) in (b"", b"SEGURO 0\n")
                for writer in (w1, w2, w3):
                    writer.close()
                await logged(caplog, "tidewire.guard", "no handshake within 5s")
                await still_works(ship, 2)

    run(main())


def test_the_idle_deadline(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Swept at ``t0 + idle``: the ship silent since ``t0`` is closed, the one that saved
    meanwhile is not (whenever the listener's own sweeps ran in between)."""
    caplog.set_level(logging.WARNING, logger="tidewire.guard")
    limits = ConnectionLimits(idle_seconds=10)

    async def main() -> None:
        async with seguro_hub(tmp_path, limits=limits) as s:
            loop = asyncio.get_running_loop()
            async with connect(s.url, "~zod") as idle, connect(s.url, "~bus") as busy:
                t0 = loop.time()
                s.server.listener.sweep(t0)
                await asyncio.sleep(0.01)  # (time passes: a later sweep is later than t0)
                await busy.save(1, b"busy")
                s.server.listener.sweep(t0 + 10)
                await logged(caplog, "tidewire.guard", "idle for 10s")
                with pytest.raises(REFUSED):
                    await idle.save(1, b"too late")
                await still_works(busy, 2)

    run(main())


def test_event_size_just_under_passes_just_over_is_refused_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An event over ``max_event_bytes`` is refused from its SAVE line: the hub never reads
    the data (32 MiB of it, here) into memory."""
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")
    limit = 64 * 1024

    async def main() -> None:
        async with seguro_hub(tmp_path, seguro_limits=Limits(max_event_bytes=limit)) as s:
            async with connect(s.url, "~bus") as other:
                async with connect(s.url, "~zod") as ship:
                    await ship.save(1, b"x" * limit)  # just under (at) the limit
                    await ship.save_many([(2, b"y" * limit), (3, b"z")])
                before = own_rss()
                reader, writer = await asyncio.open_connection(HOST, s.server.port)
                await point(reader, writer, "~zod")
                assert await reader.readline() == b"WELCOME ~zod 3\n"
                writer.write(b"SAVE 4 %d\n" % (32 * 1024 * 1024))
                chunk = b"d" * (1024 * 1024)
                try:
                    for _ in range(32):
                        writer.write(chunk)
                        await writer.drain()
                except ConnectionError:
                    pass  # dropped while it wrote
                async with asyncio.timeout(5):
                    assert b"COMMITTED" not in await closed(reader)
                writer.close()
                assert own_rss() - before < 16 * 1024 * 1024
                await logged(caplog, "tidewire.seguro", f"exceeds the limit of {limit}")
                await still_works(other, 1)
            assert s.hub.latest("~zod") == 3

    run(main())


def test_a_ship_that_never_reads_is_sent_no_more_and_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A READ of 16 MiB by a ship that reads nothing: the hub's buffer for it stays within
    its high-water mark and one read batch, and the sweep past the stall limit drops it."""
    caplog.set_level(logging.WARNING, logger="tidewire.guard")
    limits = ConnectionLimits(write_stall_seconds=30, idle_seconds=1000)

    async def main() -> None:
        async with seguro_hub(tmp_path, limits=limits) as s:
            loop = asyncio.get_running_loop()
            value = b"v" * (512 * 1024)
            await s.hub.append(Batch.build("~zod", [value] * 32, ids=list(range(1, 33))))
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            sock.setblocking(False)
            await loop.sock_connect(sock, (HOST, s.server.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            async with connect(s.url, "~bus") as other:
                await point(reader, writer, "~zod")
                assert await reader.readline() == b"WELCOME ~zod 32\n"
                writer.write(b"READ 1 32\n")
                (guarded,) = [c for c in s.server.listener.connections
                              if c.inner is s.server.points["~zod"]]  # fmt: skip
                deadline = time.monotonic() + 5
                while guarded.stalled_since is None:
                    assert time.monotonic() < deadline, "the hub's output never backed up"
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.05)  # (what the hub would still write, it writes now)
                assert guarded.get_write_buffer_size() <= WRITE_HIGH_WATER + READ_BATCH_BYTES
                s.server.listener.sweep(loop.time() + 31)
                await logged(caplog, "tidewire.guard", "seguro", "read nothing for")
                assert guarded.is_closing()
                writer.close()
                await still_works(other, 1)

    run(main())


# --------------------------------------------------------------------------- issue 20: in-process


def test_an_event_begun_and_never_finished_is_closed_at_the_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``SAVE`` with half its data, then nothing: swept past ``limits.message_seconds`` it is
    closed; a ship idle between two events of a ``SAVE MANY`` (nothing unfinished) and a
    welcomed ship are not."""
    caplog.set_level(logging.WARNING, logger="tidewire.guard")
    limits = ConnectionLimits(message_seconds=5, idle_seconds=1000)

    async def main() -> None:
        async with seguro_hub(tmp_path, limits=limits) as s:
            loop = asyncio.get_running_loop()
            async with connect(s.url, "~bus") as ship:
                half, w1 = await asyncio.open_connection(HOST, s.server.port)
                await point(half, w1, "~zod")
                assert await half.readline() == b"WELCOME ~zod\n"
                between, w2 = await asyncio.open_connection(HOST, s.server.port)
                await point(between, w2, "~nec")
                assert await between.readline() == b"WELCOME ~nec\n"
                w2.write(b"SAVE MANY 2 1 2\nEVENT 1 1\na\n\n")
                w1.write(b"SAVE 1 100\n" + b"x" * 50)
                zod = next(p for p in s.server.connections if p.point == "~zod")
                nec = next(p for p in s.server.connections if p.point == "~nec")
                await until(lambda: zod.receiving_since() is not None, "the SAVE began")
                await until(lambda: nec.share.gauge("ingest") == 0 and nec.session.buffered == 0,
                            "the first event is stored")  # fmt: skip
                assert nec.receiving_since() is None
                since = zod.receiving_since()
                assert since is not None
                s.server.listener.sweep(since + 4)  # before the deadline: nothing
                await still_works(ship, 1)
                assert zod.transport is not None
                assert not zod.transport.is_closing()
                s.server.listener.sweep(since + 5)
                await logged(caplog, "tidewire.guard", "a message unfinished for 5s")
                assert b"COMMITTED" not in await closed(half)
                w1.close()
                w2.write(b"EVENT 2 1\nb\n\nSTREAMED MANY 2 1 2\n")
                assert await between.readline() in (b"LATEST 1\n", b"LATEST 2\n",
                                                    b"COMMITTED MANY 2 1 2\n")  # fmt: skip
                w2.close()
                await still_works(ship, 2)
                assert loop.time() < since + 5  # (no real time passed: the sweep said so)
            assert s.hub.latest("~zod") == 0

    run(main())


# --------------------------------------------------------------------------- issue 20: a real hub

MiB = 1024 * 1024

OWNER_ACL = """
[principal."cert:~zod"]
read = ["~zod"]
write = ["~zod"]

[principal.anonymous]                # reads every point; writes only the bystander's streams
read = ["~*", "bystander.*"]
write = ["bystander.*"]
"""


def plain_rsio(hub: RealHub) -> RealHub:
    """The same hub as the bystander sees it: RS.io without TLS (``rsio.tls = false``)."""
    return dataclasses.replace(hub, scheme_tls=False)


def test_a_read_only_principal_cannot_take_a_point_from_its_owner(pki: Pki, tmp_path: Path) -> None:
    """Issue 20: anonymous may read every point. It takes ``~zod`` before its owner comes, and
    keeps trying while the owner saves, reconnecting every 20 events: every owner's session
    gets in (the squatter is dropped), every save is stored; a squatter never displaces the
    owner; the bystander sees no stall."""
    seconds = 3.0
    settings = {"rsio.tls": False}

    async def owner(url: str) -> int:
        ctx = pki.client_context(pki.client("~zod"))
        saved = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            async with connect(url, "~zod", ssl=ctx, retry=Retry(attempts=50)) as ship:
                for _ in range(20):
                    await ship.save(ship.latest + 1, b"owner %d" % saved)
                    saved += 1
        return saved

    async def main(hub: RealHub) -> None:
        url = f"seguro://{HOST}:{hub.seguro_port}"
        outcomes: Counter[str] = Counter()
        stop = asyncio.Event()
        first = asyncio.create_task(squatter(hub.seguro_port, "~zod", pki.client_context(),
                                             stop, outcomes, hold=seconds + 5))  # fmt: skip
        await until(lambda: outcomes["welcomed"] == 1, "the squatter took the free point")
        saving = asyncio.create_task(owner(url))
        report = await bystander(plain_rsio(hub), seconds + 0.5)
        saved = await saving
        stop.set()
        ctx = pki.client_context(pki.client("~zod"))
        async with connect(url, "~zod", ssl=ctx, retry=Retry(attempts=50)) as ship:
            # (this session takes the point from the squatter, if it holds it now)
            assert ship.latest == saved
            events, sent = await ship.read(1, saved + 10)
            async with asyncio.timeout(10):
                await first
        assert [data for _, data in events] == [b"owner %d" % i for i in range(saved)]
        assert sent.count == saved > 0
        assert outcomes["welcomed"] >= 1  # the free point, at least
        assert outcomes["displaced"] == outcomes["welcomed"], outcomes  # each by the owner
        assert "takes the point from this session of anonymous" in hub.log_text()
        assert_served(None, report)

    with real_hub(tmp_path, settings=settings, acl=OWNER_ACL, pki=pki) as hub:
        run(main(hub), timeout=60)


def galaxies(n: int) -> list[str]:
    return [f"~{s}" for s in SUFFIXES[:n]]


def test_declared_events_are_bounded_by_the_budget_before_their_data(tmp_path: Path) -> None:
    """Issue 20: 16 anonymous ships each declare an event the protocol allows (60 MiB, under
    ``seguro.max_event_bytes``) and send its data as fast as they can; 16 more declare 3 MiB
    (within a connection's 8 MiB share) and never finish it. With a 64 MiB budget (32 MiB for
    anonymous) the 60 MiB declarations are dropped on their line, and of the small ones only
    what fits the principal's share is taken (the rest dropped on their line too): the hub
    grows by less than the budget, and the bystander sees no stall."""
    settings = {"memory.budget_bytes": 64 * MiB, "memory.principal_bytes": 32 * MiB,
                "memory.connection_bytes": 8 * MiB}  # fmt: skip
    seconds = 3.0

    async def main(hub: RealHub) -> None:
        before = hub.rss()
        held: list[asyncio.StreamWriter] = []
        points = galaxies(32)
        attack = asyncio.gather(
            *(huge_event(hub.seguro_port, p) for p in points[:16]),
            *(unfinished_event(hub.seguro_port, p, held) for p in points[16:]),
        )
        report, results = await asyncio.gather(bystander(hub, seconds), attack)
        sent, taken = results[:16], results[16:]
        assert max(sent) < 16 * MiB  # dropped long before 60 MiB: on the SAVE line
        assert 0 < sum(taken) < 16  # the anonymous share took some, not all
        assert sum(taken) * 3 * MiB <= 32 * MiB
        grown = hub.peak_rss() - before
        assert grown < 64 * MiB, f"the hub grew by {grown / MiB:.0f} MiB"
        log = hub.log_text()
        assert "does not fit the memory budget" in log
        assert "COMMITTED" not in log
        for writer in held:
            writer.close()
        assert_served(None, report)

    with real_hub(tmp_path, settings=settings) as hub:
        run(main(hub), timeout=60)
