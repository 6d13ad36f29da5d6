"""Seguro under issue 20, over real sockets with an in-process hub: who may take a point from
whom, and the memory budget checked at an event's header.

* **Points.** One session per point; a session whose principal may write the point keeps it, a
  read-only one holds it only until a writer comes (docs/protocols/seguro.md, "Who holds a
  point"). The principals: ``cert:~zod`` (the owner, mutual TLS) and ``anonymous`` (read only).
* **Budget.** ``hub.budget`` with small shares: a declaration that does not fit is dropped on
  its line, before its data is read; what fits is charged and given back.

The deadline of an unfinished event, and the same attacks against a real hub with a well-behaved
client alongside, are in tests/security/test_seguro_attacks.py.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from helpers import run, until
from loops import logged
from memory_storage import MemoryStorage
from seguro_hub import HOST, REFUSED, closed, point, seguro_hub, still_works
from tidewire.client.seguro import SeguroError, connect
from tidewire.hub import Budget, BudgetLimits, Hub
from tidewire.observe.throttle import LogThrottle
from tidewire.protocols.seguro import Sent
from tidewire.server.seguro import start_seguro_server

if TYPE_CHECKING:
    from certs import Pki

MiB = 1024 * 1024

ACL = """
[principal."cert:~zod"]
read = ["~zod"]
write = ["~zod"]

[principal.anonymous]
read = ["~*"]
write = ["~bus"]
"""


# --------------------------------------------------------------------------- who holds a point


def test_a_writer_takes_the_point_from_a_read_only_session(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 20's reproduction: anonymous (read on ``~*``) takes ``~zod`` first; the owner's
    ship still gets in, and the reader is dropped."""
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")

    async def main() -> None:
        async with seguro_hub(tmp_path, tls=pki.server_context("optional"), acl=ACL) as s:
            anonymous = pki.client_context()
            owner = pki.client_context(pki.client("~zod"))
            async with connect(s.url, "~zod", ssl=anonymous) as reader:
                assert await reader.read(1, 1) == ([], Sent(0, 0, 0))
                async with connect(s.url, "~zod", ssl=owner) as ship:
                    await ship.save(1, b"mine")
                    line = await logged(caplog, "tidewire.seguro", "takes the point")
                    assert "cert:~zod, which may write stream '~zod'" in line
                    assert "anonymous, which may only read it" in line
                    with pytest.raises(REFUSED):
                        await reader.read(1, 1)
                    # and the reader cannot take it back while the owner is there
                    with pytest.raises(REFUSED):
                        await connect(s.url, "~zod", ssl=anonymous)
                    await still_works(ship, 2)
                    assert s.server.points["~zod"].may_write
            assert s.hub.latest("~zod") == 2

    run(main())


def test_a_session_that_may_write_keeps_the_point(pki: Pki, tmp_path: Path) -> None:
    """The owner first: a reader, and a second session of the owner, are dropped after
    POINT, with no WELCOME; the owner carries on."""

    async def main() -> None:
        async with seguro_hub(tmp_path, tls=pki.server_context("optional"), acl=ACL) as s:
            owner = pki.client_context(pki.client("~zod"))
            async with connect(s.url, "~zod", ssl=owner) as ship:
                await ship.save(1, b"one")
                for ctx in (pki.client_context(), owner):
                    reader, writer = await asyncio.open_connection(HOST, s.server.port, ssl=ctx)
                    await point(reader, writer, "~zod")
                    assert await closed(reader) == b""
                    writer.close()
                await still_works(ship, 2)

    run(main())


def test_a_read_only_session_never_displaces_another(tmp_path: Path) -> None:
    """Two read-only sessions of a point: the second is dropped (one session per point), the
    first keeps reading."""
    acl = '[principal.anonymous]\nread = ["~*"]\n'

    async def main() -> None:
        async with seguro_hub(tmp_path, acl=acl) as s, connect(s.url, "~zod") as first:
            reader, writer = await asyncio.open_connection(HOST, s.server.port)
            await point(reader, writer, "~zod")
            assert await closed(reader) == b""
            writer.close()
            assert await first.read(1, 1) == ([], Sent(0, 0, 0))

    run(main())


def test_without_an_acl_the_first_session_keeps_the_point(tmp_path: Path) -> None:
    """Every principal may write every point: nobody displaces anybody (as before)."""

    async def main() -> None:
        async with seguro_hub(tmp_path) as s, connect(s.url, "~zod") as ship:
            with pytest.raises(SeguroError):
                await connect(s.url, "~zod")
            await still_works(ship, 1)

    run(main())


# --------------------------------------------------------------------------- the budget


SMALL = BudgetLimits(total=8 * MiB, principal=4 * MiB, connection=2 * MiB)


def test_a_declared_event_over_the_connections_share_is_dropped_on_its_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")

    async def main() -> None:
        async with seguro_hub(tmp_path, budget=SMALL) as s, connect(s.url, "~bus") as other:
            await other.save(1, b"before")
            reader, writer = await asyncio.open_connection(HOST, s.server.port)
            await point(reader, writer, "~zod")
            assert await reader.readline() == b"WELCOME ~zod\n"
            writer.write(b"SAVE 1 %d\n" % (3 * MiB))  # under seguro.max_event_bytes
            assert await closed(reader) == b""  # dropped without reading a byte of it
            writer.close()
            line = await logged(caplog, "tidewire.seguro", "does not fit the memory budget")
            assert "an event of 3145728 bytes" in line
            await still_works(other, 2)
            assert s.hub.latest("~zod") == 0
            await until(lambda: s.hub.budget.used_by("anonymous") == 0, "given back")

    run(main())


def test_an_event_within_the_share_is_charged_while_it_comes_and_given_back(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with seguro_hub(tmp_path, budget=SMALL) as s:
            reader, writer = await asyncio.open_connection(HOST, s.server.port)
            await point(reader, writer, "~zod")
            assert await reader.readline() == b"WELCOME ~zod\n"
            size = MiB + 5
            writer.write(b"SAVE 1 %d\nabc" % size)
            (protocol,) = s.server.connections
            await until(lambda: protocol.share.gauge("inbound") == size + 2, "declared")
            assert s.hub.budget.used_by("anonymous") >= size + 2
            writer.write(b"x" * (size - 3) + b"\n\n")
            assert await reader.readline() == b"COMMITTED 1 %d\n" % size
            assert protocol.share.gauge("inbound") == 0
            assert protocol.share.gauge("ingest") == 0
            # SAVE MANY: each EVENT's length is checked the same way, one at a time
            writer.write(b"SAVE MANY 3 2 4\n")
            for i in (2, 3, 4):
                writer.write(b"EVENT %d %d\n" % (i, MiB) + b"e" * MiB + b"\n\n")
            writer.write(b"STREAMED MANY 3 2 4\n")
            said = b""
            while not said.endswith(b"COMMITTED MANY 3 2 4\n"):
                said += await reader.readline()
            writer.write(b"SAVE MANY 2 5 6\nEVENT 5 1\na\n\nEVENT 6 %d\n" % (2 * MiB))
            assert b"COMMITTED" not in await closed(reader)
            writer.close()
            await until(lambda: s.hub.budget.used == 0, "everything given back")
            # the event before the refused one was handed to the log first: stored (the next
            # WELCOME says so), as for any breach of a SAVE MANY
            assert s.hub.latest("~zod") == 5

    run(main())


def test_bytes_read_past_the_share_pause_reading_instead_of_dropping(tmp_path: Path) -> None:
    """A SAVE MANY of many small events streaming faster than they are parsed: bytes already
    read are never refused (they are in memory), reading pauses, and the flow completes."""

    async def main() -> None:
        budget = BudgetLimits(total=8 * MiB, principal=4 * MiB, connection=MiB)
        async with seguro_hub(tmp_path, budget=budget) as s:
            async with connect(s.url, "~zod") as ship:
                events = [(i, b"%08d" % i * 512) for i in range(1, 2001)]  # 8 MiB
                await ship.save_many(events)
                assert ship.latest == 2000
            await until(lambda: s.hub.budget.used == 0, "everything given back")
            assert s.hub.latest("~zod") == 2000

    run(main())


def test_a_declaration_waits_for_the_flows_own_appends_before_it_is_judged(
    tmp_path: Path,
) -> None:
    """In a SAVE MANY, an EVENT that fits only once the events before it are durable is not
    refused while the log is slow: the flow waits for its appends (their bytes are given
    back), then takes it. Appends complete when the test says (MemoryStorage)."""

    async def main() -> None:
        storage = MemoryStorage(hold=True)
        hub = Hub(storage)
        hub.budget = Budget(BudgetLimits(total=8 * MiB, principal=4 * MiB, connection=2 * MiB))
        server = await start_seguro_server(hub, HOST, 0)
        try:
            async with asyncio.timeout(20):
                reader, writer = await asyncio.open_connection(HOST, server.port)
                await point(reader, writer, "~zod")
                assert await reader.readline() == b"WELCOME ~zod\n"
                (protocol,) = server.connections
                size = MiB + MiB // 4
                writer.write(b"SAVE MANY 2 1 2\nEVENT 1 %d\n" % size + b"a" * size + b"\n\n")
                await until(lambda: len(storage.pending) == 1, "event 1 on its way to the log")
                assert protocol.share.gauge("ingest") == size
                writer.write(b"EVENT 2 %d\nbb" % size)  # with event 1's bytes: over the share
                await until(lambda: protocol.session.awaiting_data == size, "event 2 declared")
                for _ in range(20):
                    await asyncio.sleep(0)
                assert protocol.transport is not None
                assert not protocol.transport.is_closing()
                assert protocol.share.gauge("inbound") < size  # not taken yet
                assert protocol.receiving_since() is None  # the hub keeps it waiting
                storage.complete(0)
                assert await reader.readline() == b"LATEST 1\n"
                await until(lambda: protocol.share.gauge("inbound") == size + 2, "event 2 taken")
                writer.write(b"b" * (size - 2) + b"\n\nSTREAMED MANY 2 1 2\n")
                await until(lambda: len(storage.pending) == 1, "event 2 on its way to the log")
                storage.complete(0)
                said = await reader.readline()
                if said == b"LATEST 2\n":
                    said = await reader.readline()
                assert said == b"COMMITTED MANY 2 1 2\n"
                writer.close()
                assert hub.latest("~zod") == 2
        finally:
            await server.close()
            await hub.close()

    run(main())


def test_drop_lines_of_refusals_are_rate_limited_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer refused in a loop writes ``burst`` lines per interval, then one line counting
    the rest when the next interval begins (the throttle's clock is the test's)."""
    caplog.set_level(logging.WARNING, logger="tidewire.seguro")
    now = [0.0]

    async def main() -> None:
        async with seguro_hub(tmp_path) as s, connect(s.url, "~zod") as owner:
            s.server.refusals_log = LogThrottle(burst=3, interval=10.0, clock=lambda: now[0])
            for _ in range(6):
                reader, writer = await asyncio.open_connection(HOST, s.server.port)
                await point(reader, writer, "~zod")  # the point has a session
                assert await closed(reader) == b""
                writer.close()
            await until(lambda: s.server.listener.admission.total == 1, "the drops are done")
            lines = [r.getMessage() for r in caplog.records if r.name == "tidewire.seguro"]
            assert len(lines) == 3
            now[0] = 11.0
            reader, writer = await asyncio.open_connection(HOST, s.server.port)
            await point(reader, writer, "~zod")
            assert await closed(reader) == b""
            writer.close()
            line = await logged(caplog, "tidewire.seguro", "3 more like")
            assert "dropping the connection" in line
            await still_works(owner, 1)

    run(main())
