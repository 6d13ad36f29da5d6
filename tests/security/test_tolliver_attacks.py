"""Tolliver's security and limits (issue 9) over real sockets: the hub's listener over mutual
TLS with instances that dial it with a client certificate naming their UUID, the ACL (read to
subscribe, write to send), and the limits (connections per peer, handshake and idle deadlines,
message size, subscriptions). Tolliver has no error message outside the handshake: every
refusal closes the connection (before any handshake response when it concerns the request),
is logged naming the principal, and leaves the other remotes working. Certificates are made
by trustme at test time (tests/certs.py); deadlines are driven by calling the listener's
``sweep`` with a chosen time, never by sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from harness import assert_served, bystander, real_hub
from tolliver_attacks import (
    Remote,
    channel_flood,
    never_acking,
    request,
    response_to,
    uuid_claims,
)

from helpers import own_rss, run
from loops import logged
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl
from tidewire.model import Batch
from tidewire.protocols.tolliver import (
    Acked,
    Closed,
    Connection,
    Established,
    HandshakeRequest,
    Limits,
    Received,
    Role,
    SubscriptionEntry,
    encode,
)
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.tolliver import TolliverServer, TolliverSettings, start_tolliver_server
from tidewire.tolliver import Delivery, Instance, uuid7
from tidewire.tolliver.store import Store

if TYPE_CHECKING:
    from certs import Pki

HOST = "127.0.0.1"


@dataclass
class Setup:
    hub: Hub
    server: TolliverServer
    tmp: Path

    @property
    def port(self) -> int:
        return self.server.port

    def instance(self, name: str) -> Instance:
        return Instance(str(self.tmp / f"{name}.db"))


@asynccontextmanager
async def tolliver_hub(
    path: Path,
    *,
    tls: ssl.SSLContext | None = None,
    acl: str | None = None,
    limits: ConnectionLimits | None = None,
    settings: TolliverSettings | None = None,
) -> AsyncIterator[Setup]:
    hub = Hub.open(str(path / "hub"))
    access = Access(Acl.parse(acl)) if acl is not None else None
    admission = Admission(limits or ConnectionLimits())
    server = await start_tolliver_server(hub, HOST, 0, settings, access=access,
                                         admission=admission, tls=tls)  # fmt: skip
    try:
        yield Setup(hub, server, path)
    finally:
        await server.close()
        await hub.close()


async def take(instance: Instance) -> Delivery:
    async for delivery in instance.messages():
        return delivery
    raise AssertionError("messages() ended")


def certified(pki: Pki, instance: uuid.UUID, name: str | None = None) -> ssl.SSLContext:
    """A client context whose certificate's CN is ``name`` (default: ``instance``)."""
    return pki.client_context(pki.client(name if name is not None else str(instance)))


# --------------------------------------------------------------------------- sans-IO


def test_the_connection_bounds_the_subscriptions_a_peer_holds() -> None:
    """Handshake entries and later subscribes together; one held already does not count, an
    unsubscribe frees one."""
    two = Limits(max_subscriptions=2)
    hub = Connection(Role.ACCEPTOR, uuid7(), 1, frozenset({1}), limits=two)
    peer = Connection(Role.CONNECTOR, uuid7(), 1, frozenset({1}), {("a", ""), ("b", "k")})
    peer.initiate()
    hub.receive_data(peer.data_to_send())
    assert isinstance(hub.next_event(), Established)
    peer.receive_data(hub.data_to_send())
    while peer.next_event() is not None:
        pass
    for change in (("sub", "a"), ("unsub", "a"), ("sub", "c"), ("sub", "c")):
        (peer.subscribe if change[0] == "sub" else peer.unsubscribe)(change[1])
        hub.receive_data(peer.data_to_send())
        while (event := hub.next_event()) is not None:
            assert not isinstance(event, Closed), event
    assert hub.peer_subscriptions == {("b", "k"), ("c", "")}
    peer.subscribe("d")
    hub.receive_data(peer.data_to_send())
    events = []
    while (event := hub.next_event()) is not None:
        events.append(event)
    assert events == [Closed("protocol error: more than 2 subscriptions", True)]
    three = (SubscriptionEntry(0, "a"), SubscriptionEntry(0, "b"), SubscriptionEntry(0, "c"))
    fresh = Connection(
        Role.ACCEPTOR, uuid7(), 1, frozenset({1}), limits=Limits(max_subscriptions=2)
    )
    fresh.receive_data(bytes(encode(HandshakeRequest(1, uuid7(), three))))
    assert fresh.next_event() == Closed(
        "protocol error: 3 subscriptions in a handshake, over 2", True
    )
    assert fresh.data_to_send() == b""  # no response


# --------------------------------------------------------------------------- TLS


def test_instances_relay_through_the_hub_over_mutual_tls(pki: Pki, tmp_path: Path) -> None:
    async def main() -> None:
        async with tolliver_hub(tmp_path, tls=pki.server_context("required")) as s:
            a, b = s.instance("a"), s.instance("b")
            b.subscribe("news")
            try:
                hub_id = await b.connect(HOST, s.port, ssl=certified(pki, b.instance_id))
                assert hub_id == s.server.instance
                await a.connect("localhost", s.port, ssl=certified(pki, a.instance_id))
                deadline = time.monotonic() + 5
                while not any(("news", "") in link.conn.peer_subscriptions
                              for link in a.links.values()):  # fmt: skip
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.005)
                await a.send("news", "k", b"over tls")
                got = await take(b)
                assert (got.channel, got.key, got.body) == ("news", "k", b"over tls")
                while a.store.unacked():  # acked by the hub once stored
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.005)
                (stored,) = [e for batch in await s.hub.read("news", 1) for e in batch]
                assert stored.value == b"over tls"
                principals = {str(link.principal) for link in s.server.links}
                assert principals == {f"cert:{a.instance_id}", f"cert:{b.instance_id}"}
            finally:
                await a.close()
                await b.close()

    run(main())


@pytest.mark.parametrize("credentials", ["none", "expired", "untrusted"])
def test_bad_client_certificates_are_refused_at_the_tls_handshake(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture, credentials: str
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire")
    reason = {"none": "certificate", "expired": "expired", "untrusted": "issuer"}[credentials]

    async def main() -> None:
        async with tolliver_hub(tmp_path, tls=pki.server_context("required")) as s:
            good_id = uuid7()
            good = await Remote.open(s.port, ssl=certified(pki, good_id), instance=good_id)
            bad = s.instance("bad")
            name = str(bad.instance_id)
            cert = {
                "none": None,
                "expired": pki.client(name, expired=True),
                "untrusted": pki.client(name, untrusted=True),
            }[credentials]
            try:
                await good.handshake()
                with pytest.raises((ssl.SSLError, ConnectionError)):
                    await bad.connect(HOST, s.port, ssl=pki.client_context(cert))
                line = await logged(caplog, "tidewire.guard", "tolliver", "TLS handshake failed")
                assert reason in line.lower(), line
                assert bad.instance_id not in s.server.by_peer
                await good.works(1)
            finally:
                good.close()
                await bad.close()

    run(main())


def test_a_certificate_for_another_uuid_is_closed_before_any_response(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.tolliver")

    async def main() -> None:
        async with tolliver_hub(tmp_path, tls=pki.server_context("required")) as s:
            claimed, other = uuid7(), uuid7()
            spoof = await Remote.open(s.port, ssl=certified(pki, other), instance=claimed)
            assert await spoof.refused()  # not even the handshake response
            spoof.close()
            line = await logged(caplog, "tidewire.tolliver", f"cert:{other}", str(claimed))
            assert "refused" in line
            assert claimed not in s.server.by_peer
            instance = s.instance("i")
            try:
                with pytest.raises(ConnectionError):
                    await instance.connect(HOST, s.port, ssl=certified(pki, other))
                # the UUID in capitals is the same UUID (compared case-insensitively)
                upper = certified(pki, instance.instance_id, str(instance.instance_id).upper())
                assert await instance.connect(HOST, s.port, ssl=upper) == s.server.instance
                link = s.server.by_peer[instance.instance_id]
                assert str(link.principal) == f"cert:{instance.instance_id}"  # (lower case)
            finally:
                await instance.close()

    run(main())


# --------------------------------------------------------------------------- the ACL


def acl_for(reader: uuid.UUID, writer: uuid.UUID) -> str:
    return f"""
[principal."cert:{reader}"]
read = ["news", "sport.*"]

[principal."cert:{writer}"]
read = ["news"]
write = ["news", "carry-on"]
"""


def test_a_subscription_the_acl_does_not_allow_is_refused(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.tolliver")
    reader_id, writer_id = uuid7(), uuid7()

    async def main() -> None:
        async with tolliver_hub(tmp_path, tls=pki.server_context("required"),
                                acl=acl_for(reader_id, writer_id)) as s:  # fmt: skip
            writer = await Remote.open(s.port, ssl=certified(pki, writer_id), instance=writer_id)
            try:
                await writer.handshake()
                # in the handshake request: closed before the response
                bad = await Remote.open(s.port, ssl=certified(pki, reader_id), instance=reader_id,
                                        subscriptions=["news", "secret"])  # fmt: skip
                assert await bad.refused()
                bad.close()
                await logged(caplog, "tidewire.tolliver", f"cert:{reader_id} may not read "
                             "stream 'secret' (a subscription to it)")  # fmt: skip
                # later, by a control message
                ctx = certified(pki, reader_id)
                late = await Remote.open(s.port, ssl=ctx, instance=reader_id,
                                         subscriptions=["sport.tennis"])  # fmt: skip
                await late.handshake()
                late.conn.subscribe("news")  # allowed
                late.conn.subscribe("orders")  # not
                late.flush()
                await late.closed()
                late.close()
                line = await logged(caplog, "tidewire.tolliver", "stream 'orders'")
                assert f"cert:{reader_id}" in line
                await writer.works(1)
            finally:
                writer.close()

    run(main())


def test_a_message_on_a_channel_the_acl_does_not_allow_is_refused(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.tolliver")
    reader_id, writer_id = uuid7(), uuid7()

    async def main() -> None:
        async with tolliver_hub(tmp_path, tls=pki.server_context("required"),
                                acl=acl_for(reader_id, writer_id)) as s:  # fmt: skip
            writer = await Remote.open(s.port, ssl=certified(pki, writer_id), instance=writer_id)
            reader = await Remote.open(s.port, ssl=certified(pki, reader_id), instance=reader_id,
                                       subscriptions=["news"])  # fmt: skip
            try:
                await writer.handshake()
                await reader.handshake()
                await writer.works(1, "news")  # allowed: stored and acked
                await reader.until(Received)  # and relayed
                await reader.send("news", b"not allowed", 7)
                await reader.closed()
                assert not any(isinstance(e, Acked) for e in reader.events)
                await logged(caplog, "tidewire.tolliver", f"cert:{reader_id} may not write "
                             "stream 'news' (a message)")  # fmt: skip
                assert [e.value for b in await s.hub.read("news", 1) for e in b] == [b"still here"]
                await writer.works(2, "news")
            finally:
                writer.close()
                reader.close()

    run(main())


def test_with_an_acl_plain_tcp_is_refused_unless_the_operator_allows_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without TLS a remote's UUID proves nothing: with an ACL, every connection is refused
    (no handshake response; an error at start says why and what to set)."""
    caplog.set_level(logging.WARNING, logger="tidewire.tolliver")

    async def main() -> None:
        async with tolliver_hub(tmp_path, acl='[principal.anonymous]\nread = ["*"]\n') as s:
            remote = await Remote.open(s.port, subscriptions=["public.news"])
            try:
                assert await remote.refused()
            finally:
                remote.close()
        assert "tolliver.allow_plaintext = true" in caplog.text
        assert "refused: an ACL is configured and this listener has no TLS" in caplog.text

    run(main())


def test_the_acl_applies_to_anonymous_remotes_over_plain_tcp(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``tolliver.allow_plaintext`` (the operator's explicit choice), remotes come in
    over plain TCP as ``anonymous``."""
    caplog.set_level(logging.WARNING, logger="tidewire.tolliver")
    acl = '[principal.anonymous]\nread = ["public.*"]\nwrite = ["carry-on"]\n'

    async def main() -> None:
        async with tolliver_hub(tmp_path, acl=acl,
                                settings=TolliverSettings(allow_plaintext=True)) as s:
            ok = await Remote.open(s.port, subscriptions=["public.news"])
            try:
                await ok.handshake()
                await ok.works(1)
                await ok.send("public.news", b"read-only", 2)
                await ok.closed()
                await logged(caplog, "tidewire.tolliver", "anonymous may not write stream "
                             "'public.news'")  # fmt: skip
            finally:
                ok.close()

    run(main())


# --------------------------------------------------------------------------- limits


def test_connections_per_peer(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.guard")
    limits = ConnectionLimits(max_connections_per_peer=2)

    async def main() -> None:
        async with tolliver_hub(tmp_path, limits=limits) as s:
            first, second = await Remote.open(s.port), await Remote.open(s.port)
            try:
                await first.handshake()
                await second.handshake()
                third = await Remote.open(s.port)
                assert await third.refused()
                third.close()
                await logged(caplog, "tidewire.guard", "tolliver", "too many connections from")
                await first.works(1)
                await second.works(1)
            finally:
                first.close()
                second.close()

    run(main())


def test_the_handshake_deadline(pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A remote that says nothing (after TLS, or before it) is closed by the sweep past the
    deadline; one established is not."""
    caplog.set_level(logging.WARNING, logger="tidewire.guard")
    limits = ConnectionLimits(handshake_seconds=5, idle_seconds=100)

    async def main() -> None:
        async with tolliver_hub(tmp_path, limits=limits, tls=pki.server_context()) as s:
            loop = asyncio.get_running_loop()
            good_id, silent_id = uuid7(), uuid7()
            good = await Remote.open(s.port, ssl=certified(pki, good_id), instance=good_id)
            silent = await Remote.open(s.port, ssl=certified(pki, silent_id), instance=silent_id)
            plain, writer = await asyncio.open_connection(HOST, s.port)  # never starts TLS
            try:
                await good.handshake()
                s.server.listener.sweep(loop.time() + 1)  # before the deadline: nothing
                await good.works(1)
                s.server.listener.sweep(loop.time() + 6)
                await silent.closed()
                assert await plain.read() == b""
                await logged(caplog, "tidewire.guard", "no handshake within 5s")
                await good.works(2)
            finally:
                good.close()
                silent.close()
                writer.close()

    run(main())


def test_the_idle_deadline(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Swept at ``t0 + idle``: the remote silent since ``t0`` is closed, the one that sent
    meanwhile is not (whenever the listener's own sweeps ran in between)."""
    caplog.set_level(logging.WARNING, logger="tidewire.guard")
    limits = ConnectionLimits(idle_seconds=10)

    async def main() -> None:
        async with tolliver_hub(tmp_path, limits=limits) as s:
            loop = asyncio.get_running_loop()
            idle, busy = await Remote.open(s.port), await Remote.open(s.port)
            try:
                await idle.handshake()
                await busy.handshake()
                t0 = loop.time()
                s.server.listener.sweep(t0)
                await asyncio.sleep(0.01)  # (time passes: a later sweep is later than t0)
                await busy.works(1)
                s.server.listener.sweep(t0 + 10)
                await idle.closed()
                await logged(caplog, "tidewire.guard", "idle for 10s")
                await busy.works(2)
            finally:
                idle.close()
                busy.close()

    run(main())


def test_message_size_just_under_passes_just_over_is_refused_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A body over ``max_message_bytes`` is refused from its header: the hub never reads it
    (32 MiB of it, here) into memory."""
    caplog.set_level(logging.WARNING, logger="tidewire.tolliver")
    limit = 64 * 1024
    settings = TolliverSettings(max_message_bytes=limit)

    async def main() -> None:
        async with tolliver_hub(tmp_path, settings=settings) as s:
            other, remote = await Remote.open(s.port), await Remote.open(s.port)
            try:
                await other.handshake()
                await remote.handshake()
                await remote.send("big", b"x" * limit, 1)  # at the limit
                await remote.until(Acked, id=1)
                await remote.send("big", b"x" * (limit + 1), 2)  # one over
                await remote.closed()
                line = await logged(caplog, "tidewire.tolliver",
                                    f"a body of {limit + 1} bytes, over {limit}")  # fmt: skip
                assert "anonymous" in line
                # a body of 32 MiB declared, then streamed: refused from the header
                before = own_rss()
                huge = await Remote.open(s.port)
                await huge.handshake()
                # code 3, channel length 3, key length 0, body length 32 MiB, id 9, "big"
                huge.writer.write(struct.pack(">BIIII", 3, 3, 0, 32 << 20, 9) + b"big")
                chunk = b"d" * (1 << 20)
                try:
                    for _ in range(32):
                        huge.writer.write(chunk)
                        await huge.writer.drain()
                except ConnectionError:
                    pass  # closed while it wrote
                await huge.closed()
                huge.close()
                assert own_rss() - before < 16 * 1024 * 1024
                assert [len(e.value) for b in await s.hub.read("big", 1) for e in b] == [limit]
                await other.works(1)
            finally:
                other.close()
                remote.close()

    run(main())


def test_subscriptions_just_under_pass_just_over_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.tolliver")
    settings = TolliverSettings(max_subscriptions=4)

    async def main() -> None:
        async with tolliver_hub(tmp_path, settings=settings) as s:
            four = await Remote.open(s.port, subscriptions=["a", "b", "c", "d"])
            five = await Remote.open(s.port, subscriptions=["a", "b", "c", "d", "e"])
            try:
                await four.handshake()  # at the limit
                four.conn.subscribe("a")  # held already: not one more
                four.conn.unsubscribe("d")
                four.conn.subscribe("e")  # four again
                four.flush()
                await four.works(1)
                assert await five.refused()  # one over, in the handshake: closed before a response
                await logged(caplog, "tidewire.tolliver", "5 subscriptions in a handshake, over 4")
                four.conn.subscribe("f")  # one over, later
                four.flush()
                await four.closed()
                await logged(caplog, "tidewire.tolliver", "more than 4 subscriptions")
                again = await Remote.open(s.port, subscriptions=["a"])
                await again.handshake()
                await again.works(2)
                again.close()
            finally:
                four.close()
                five.close()

    run(main())


def test_a_hub_relay_keeps_working_for_others_while_one_remote_is_refused(
    tmp_path: Path,
) -> None:
    """Refusals are per connection: events appended meanwhile reach the remote still there."""

    async def main() -> None:
        async with tolliver_hub(tmp_path, settings=TolliverSettings(max_subscriptions=1)) as s:
            ok = await Remote.open(s.port, subscriptions=["ticks"])
            greedy = await Remote.open(s.port, subscriptions=["ticks", "more"])
            try:
                await ok.handshake()
                greedy.conn.initiate()
                greedy.flush()
                await greedy.closed()
                await s.hub.append(Batch.build("ticks", [b"t1"]), assign_ids=True)
                await ok.until(Received)
            finally:
                ok.close()
                greedy.close()

    run(main())


def test_a_remote_that_never_reads_gets_nothing_more_and_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """16 MiB of events for a remote that reads nothing: the hub's buffer for it stays near
    the high-water mark (deliveries wait), and the sweep past the stall limit drops it."""
    caplog.set_level(logging.WARNING, logger="tidewire.guard")
    limits = ConnectionLimits(write_stall_seconds=30, idle_seconds=1000)

    async def main() -> None:
        async with tolliver_hub(tmp_path, limits=limits) as s:
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            sock.setblocking(False)
            await loop.sock_connect(sock, (HOST, s.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            deaf = Remote(reader, writer, Connection(Role.CONNECTOR, uuid7(), 1, frozenset({1}),
                                                     {("ticks", "")}))  # fmt: skip
            other = await Remote.open(s.port)
            try:
                await deaf.handshake()
                await other.handshake()
                (guarded,) = [c for c in s.server.listener.connections
                              if c.inner is s.server.by_peer[deaf.conn.instance]]  # fmt: skip
                value = b"v" * (64 * 1024)
                for _ in range(4):
                    await s.hub.append(Batch.build("ticks", [value] * 64), assign_ids=True)
                deadline = time.monotonic() + 5
                while guarded.stalled_since is None:
                    assert time.monotonic() < deadline, "the hub's output never backed up"
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.05)  # (what the hub would still write, it writes now)
                queued = guarded.get_write_buffer_size()
                assert queued < 1024 * 1024
                link = s.server.by_peer[deaf.conn.instance]
                assert link.conn.unacked()  # what it was sent, unread, unacked
                for seconds in (2, 4, 6):  # no resends pile up either
                    link.handle_timer(time.monotonic() + seconds)
                assert guarded.get_write_buffer_size() == queued
                s.server.listener.sweep(loop.time() + 31)
                await logged(caplog, "tidewire.guard", "tolliver", "read nothing for")
                assert guarded.is_closing()
                await other.works(1)
            finally:
                deaf.close()
                other.close()

    run(main())


# --------------------------------------------------------------------------- issue 20: real hubs
#
# Each attack runs against a real ``tidewire serve`` (tests/security/harness.py) with small
# memory budgets, a well-behaved RS.io client alongside (the bystander), and asserts that the
# attacker was refused or bounded, the hub's peak RSS stayed within a bound derived from the
# budget, and the bystander saw no stall over BYSTANDER_MAX_STALL_S.

MiB = 1024 * 1024
SMALL_BUDGET: dict[str, object] = {
    "memory.budget_bytes": 64 * MiB,
    "memory.principal_bytes": 32 * MiB,
    "memory.connection_bytes": 16 * MiB,
}
# what the hub costs at rest plus its budget and the log's own caches: what an attack may not pass
RSS_BOUND = 400 * MiB
ATTACK_SECONDS = 60.0  # every attack is bounded in time (asyncio.timeout)


def test_one_remote_cannot_poison_the_hubs_subscription_list(tmp_path: Path) -> None:
    """The issue's attack: an instance with ``read`` on one glob subscribes to thousands of
    channels, 4,000-byte names included, over many connections and UUIDs. Names that are not
    stream names are refused before the hub follows them; each remote's channels replace its
    earlier ones (the hub forgets an offset on a channel it stops following); the hub's own
    list stays within ``tolliver.max_channels``, so a new instance's handshake still works."""
    acl = ('[principal.anonymous]\nread = ["glob.*", "bystander.*"]\n'
           'write = ["glob.*", "bystander.*"]\n')  # fmt: skip
    settings = {**SMALL_BUDGET, "tolliver.allow_plaintext": True, "tolliver.max_channels": 1500}

    async def main() -> None:
        with real_hub(tmp_path, settings=settings, acl=acl) as hub:
            async with asyncio.timeout(ATTACK_SECONDS):
                (refused, taken), report = await asyncio.gather(
                    channel_flood(hub.tolliver_port), bystander(hub, 3.0))  # fmt: skip
                response = await response_to(hub.tolliver_port, request(uuid7(), ()))
            assert (refused, taken) == (5, 7)
            assert response is not None
            names = [e.channel for e in response.subscriptions]
            assert len(names) <= 1500  # (a remote that leaves at once leaves little behind)
            assert all(name.startswith("glob.") and len(name) < 256 for name in names)
            assert not any(name.startswith("glob.r0.") for name in names)  # forgotten
            assert "not a stream name" in hub.log_text()
            assert_served(None, report)
            assert hub.peak_rss() < RSS_BOUND

    run(main())


def test_a_certificate_cannot_take_over_another_instances_uuid(pki: Pki, tmp_path: Path) -> None:
    """The issue's takeover: a connection that claims a connected instance's UUID. Over TLS
    (with an ACL, Tolliver refuses plain TCP unless the operator allows it) a certificate
    names its instance: the attacker's own valid certificate, claiming the victim's UUID, is
    refused before any response, every time, and the victim keeps its session and what is
    delivered to it."""
    import tidewire

    store = Store.open(str(tmp_path / "victim.db"))  # (the victim's UUID, for the ACL)
    victim, attacker = store.instance, uuid7()
    store.close()
    acl = (f'[principal."cert:{victim}"]\nread = ["news"]\n'
           f'[principal."cert:{attacker}"]\nread = ["news"]\n'
           '[principal.anonymous]\nread = ["bystander.*"]\nwrite = ["bystander.*", "news"]\n')
    # (only Tolliver speaks TLS: the bystander's RS.io is plain TCP)
    settings = {**SMALL_BUDGET, "rsio.tls": False, "http.tls": False, "seguro.tls": False}
    tries = 20

    async def main() -> None:
        with real_hub(tmp_path, settings=settings, acl=acl, pki=pki) as hub:
            hub.scheme_tls = False
            owner = Instance(str(tmp_path / "victim.db"))
            owner.subscribe("news")
            try:
                async with asyncio.timeout(ATTACK_SECONDS):
                    await owner.connect(HOST, hub.tolliver_port, ssl=certified(pki, victim))
                    refused, report = await asyncio.gather(
                        uuid_claims(hub.tolliver_port, victim, certified(pki, attacker), tries),
                        bystander(hub, 2.0))  # fmt: skip
                    async with await tidewire.connect(hub.rsio_url) as client:
                        await client.publish("news", [b"still yours"])
                    assert (await take(owner)).body == b"still yours"
            finally:
                await owner.close()
            assert refused == tries
            assert f"may not be instance {victim}" in hub.log_text()
            assert_served(None, report)
            assert hub.peak_rss() < RSS_BOUND

    run(main())


def test_unacked_deliveries_are_bounded_by_bytes_and_resends_back_off(tmp_path: Path) -> None:
    """The issue's remote that never acks: it reads everything the hub sends but acks
    nothing. The hub delivers at most ``tolliver.max_unacked_bytes`` (plus one delivery per
    channel read meanwhile) and then nothing new; what it resends backs off (1 s, then 2 s)
    instead of coming every second."""
    import tidewire

    limit = 2 * MiB
    settings = {**SMALL_BUDGET, "tolliver.max_unacked_bytes": limit}
    channels = [f"flood.{i}" for i in range(4)]
    value = 64 * 1024

    async def fill(url: str) -> None:
        """4 MiB into each channel, over RS.io."""
        async with await tidewire.connect(url) as client:
            for channel in channels:
                for _ in range(4):  # 4 MiB per channel
                    await client.publish(channel, [bytes(value)] * 16)

    async def main() -> None:
        with real_hub(tmp_path, settings=settings) as hub:
            async with asyncio.timeout(ATTACK_SECONDS):
                (count, nbytes, frames), report = await asyncio.gather(
                    never_acking(hub.tolliver_port, channels, 4.0, lambda: fill(hub.rsio_url)),
                    bystander(hub, 3.0))  # fmt: skip
            assert MiB <= nbytes <= limit + len(channels) * (256 * 1024 + value)
            assert frames <= 3 * count  # sent, resent after 1 s, after 2 s more: no more
            assert_served(None, report)
            assert hub.peak_rss() < RSS_BOUND

    run(main())


def test_after_a_restart_the_hubs_list_is_still_within_its_bound(tmp_path: Path) -> None:
    """The issue's restart: remotes fill the hub's list (and its ledger of offsets) up to
    ``tolliver.max_channels`` and beyond; the hub restarts on the same data; the list it
    rebuilds is still within the bound, so instances are still accepted (until issue 20 it
    exceeded the handshake's 65,536 entries and every instance was refused)."""
    most = 1500
    settings = {**SMALL_BUDGET, "tolliver.max_channels": most,
                "data_dir": str(tmp_path / "data")}  # fmt: skip
    remotes = [request(uuid7(), (f"r{r}.c{i}" for i in range(1000))) for r in range(3)]

    async def fill(port: int) -> int:
        """Connect the remotes, and keep them until the hub lists ``most`` channels."""
        held = [await asyncio.open_connection(HOST, port) for _ in remotes]
        try:
            for (_, writer), data in zip(held, remotes, strict=True):
                writer.write(data)
            while True:
                response = await response_to(port, request(uuid7(), ()))
                assert response is not None
                if len(response.subscriptions) >= most:
                    return len(response.subscriptions)
                await asyncio.sleep(0.05)
        finally:
            for _, writer in held:
                writer.close()

    async def main() -> None:
        with real_hub(tmp_path, settings=settings) as hub:
            async with asyncio.timeout(ATTACK_SECONDS):
                assert await fill(hub.tolliver_port) == most
        with real_hub(tmp_path, settings=settings) as hub:
            instance = Instance(str(tmp_path / "after.db"))
            try:
                async with asyncio.timeout(ATTACK_SECONDS):
                    await instance.connect(HOST, hub.tolliver_port)
                    response, report = await asyncio.gather(
                        response_to(hub.tolliver_port, request(uuid7(), ())),
                        bystander(hub, 1.0))  # fmt: skip
            finally:
                await instance.close()
            assert response is not None
            assert 0 < len(response.subscriptions) <= most
            assert_served(None, report)
            assert hub.peak_rss() < RSS_BOUND

    run(main())
