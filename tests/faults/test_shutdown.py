"""Graceful shutdown of ``tidewire serve`` (issue 11): SIGTERM while RS.io (TCP and Tube),
Seguro and Tolliver clients write and read. The hub says RS.io ``goodbye`` on both transports,
finishes the appends it had read (acknowledging them), fsyncs and exits 0 within
``shutdown_seconds`` plus start-up slack; restarted on the same directory, it serves every
event it acknowledged, exactly once and intact. A client that never reads does not hold the
shutdown past its bound.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from helpers import until
from hubproc import HubProcess
from tidewire.client import rsio, seguro, tube
from tidewire.model import TidewireError
from tidewire.tolliver import Instance

SHUTDOWN_SECONDS = 3.0
EXIT_SLACK = 5.0  # process start-up and interpreter exit, on a loaded machine
BOUND = 60.0  # every test's whole run


def value(n: int) -> bytes:
    return f"event-{n:08d}-".encode() + bytes([n % 251]) * (n % 97)


class Load:
    """Clients writing and reading until the hub goes away; what each was acknowledged."""

    def __init__(self, urls: dict[str, str], tmp: Path) -> None:
        self.urls = urls
        self.tmp = tmp
        self.rsio_acked: list[tuple[int, int, list[bytes]]] = []  # (first, last, values)
        self.seguro_acked: list[int] = []
        self.tolliver_sent = 0
        self.ends: dict[str, str] = {}
        self.tail: list[int] = []  # ids the Tube subscriber received

    async def publish_rsio(self) -> None:
        n = 0
        try:
            async with rsio.connect(self.urls["rsio"]) as client:
                pub = await client.publisher("sd-rsio")
                pending: list[tuple[asyncio.Future[rsio.Receipt], list[bytes]]] = []
                while True:  # several batches in flight, so SIGTERM finds some mid-commit
                    values = [value(n + i) for i in range(50)]
                    n += 50
                    pending.append((await pub.submit(values), values))
                    if len(pending) >= 4:
                        future, sent = pending.pop(0)
                        receipt = await future
                        self.rsio_acked.append((receipt.first_id, receipt.last_id, sent))
        except (TidewireError, OSError) as exc:
            self.ends["rsio"] = str(exc)

    async def tail_tube(self) -> None:
        try:
            async with tube.connect(self.urls["ws"]) as client:
                async for batch in client.subscribe("sd-rsio", from_id=1):
                    self.tail.extend(batch.ids.tolist())
        except (TidewireError, OSError) as exc:
            self.ends["tube"] = str(exc)

    async def save_seguro(self) -> None:
        next_id = 1
        try:
            async with seguro.connect(self.urls["seguro"], "~zod") as ship:
                while True:
                    events = [(next_id + i, value(next_id + i)) for i in range(20)]
                    await ship.save_many(events)
                    self.seguro_acked.extend(i for i, _ in events)
                    next_id += 20
        except (TidewireError, OSError, asyncio.IncompleteReadError) as exc:
            self.ends["seguro"] = repr(exc)

    async def send_tolliver(self) -> None:
        address = urlsplit(self.urls["tolliver"])
        instance = Instance(str(self.tmp / "tolliver.db"))
        try:
            await instance.connect(address.hostname or "127.0.0.1", address.port or 0)
            for i in range(1_000_000):
                await instance.send("sd-tolliver", "", value(i))
                self.tolliver_sent += 1
                if self.tolliver_sent % 50 == 0:
                    await asyncio.sleep(0)
                if "rsio" in self.ends and "seguro" in self.ends:
                    break
        except (TidewireError, OSError) as exc:
            self.ends["tolliver"] = str(exc)
        finally:
            await instance.close()


Events = list[tuple[int, bytes]]


async def read_back(urls: dict[str, str]) -> tuple[Events, Events]:
    """Every event of sd-rsio (over RS.io) and of the ship (over Seguro READ)."""
    events: list[tuple[int, bytes]] = []
    async with rsio.connect(urls["rsio"]) as client:
        latest = (await client.streams(["sd-rsio"]))[0]["latest_id"]
        async for batch in client.subscribe("sd-rsio", from_id=1, until_id=latest):
            events.extend(zip(batch.ids.tolist(), (batch.value(i) for i in range(len(batch))),
                              strict=True))  # fmt: skip
    saved: list[tuple[int, bytes]] = []
    async with seguro.connect(urls["seguro"], "~zod") as ship:
        start = 1
        while True:
            got, _ = await ship.read(start, 1000)
            if not got:
                break
            saved.extend(got)
            start = got[-1][0] + 1
    return events, saved


@pytest.mark.timeout(120)
def test_sigterm_under_load_acknowledged_events_survive(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "data", tmp_path / "hub.log",
                     "--set", f"shutdown_seconds={SHUTDOWN_SECONDS}")  # fmt: skip
    try:
        urls = hub.start()
        load = Load(urls, tmp_path)

        async def main() -> tuple[int, float]:
            tasks = [asyncio.create_task(c()) for c in (
                load.publish_rsio, load.tail_tube, load.save_seguro, load.send_tolliver)]
            await until(lambda: len(load.rsio_acked) >= 5 and len(load.seguro_acked) >= 100
                        and len(load.tail) >= 100 and load.tolliver_sent >= 10,
                        "every client to be under way")  # fmt: skip
            code, seconds = await asyncio.to_thread(hub.terminate)
            async with asyncio.timeout(15):
                await asyncio.gather(*tasks)
            return code, seconds

        code, seconds = asyncio.run(asyncio.wait_for(main(), BOUND))
        assert code == 0, hub.log()
        assert seconds < SHUTDOWN_SECONDS + EXIT_SLACK
        assert "stopped: every acknowledged event is on disk" in hub.stdout
        # RS.io said goodbye on both transports (the reason reaches the application).
        assert "server shutting down" in load.ends["rsio"], load.ends
        assert "server shutting down" in load.ends["tube"], load.ends
        assert "seguro" in load.ends

        hub.start()
        events, saved = asyncio.run(asyncio.wait_for(read_back(hub.urls), BOUND))
        ids = [i for i, _ in events]
        assert ids == sorted(set(ids)), "ids repeat or go back"
        stored = dict(events)
        for first, last, values in load.rsio_acked:  # every acknowledged batch, intact
            assert [stored.get(i) for i in range(first, last + 1)] == values
        # The Tube tail saw a prefix of the stream, in order, once each.
        assert load.tail == ids[: len(load.tail)]
        saved_ids = [i for i, _ in saved]
        assert saved_ids == sorted(set(saved_ids))
        assert set(load.seguro_acked) <= set(saved_ids)
        kept = dict(saved)
        assert all(kept[i] == value(i) for i in load.seguro_acked)
    finally:
        hub.stop()


class StallingReader:
    """A stream reader that stops reading for good after ``limit`` bytes (a stuck peer)."""

    def __init__(self, reader: asyncio.StreamReader, limit: int) -> None:
        self.reader = reader
        self.left = limit
        self.never = asyncio.Event()

    async def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            await self.never.wait()
        data = await self.reader.read(min(n, self.left) if n > 0 else self.left)
        self.left -= len(data)
        return data


@pytest.mark.timeout(120)
def test_sigterm_is_bounded_by_a_client_that_never_reads(tmp_path: Path) -> None:
    """A subscriber that stops reading with megabytes on their way to it, a connection that
    never says hello, and a Seguro ship that leaves a ``SAVE`` half sent: the hub still exits
    0 within its bound."""
    hub = HubProcess(tmp_path / "data", tmp_path / "hub.log", "--set", "shutdown_seconds=1")
    try:
        urls = hub.start()
        rsio_at = urlsplit(urls["rsio"])
        seguro_at = urlsplit(urls["seguro"])

        async def fill_and_stall() -> None:
            async with rsio.connect(urls["rsio"]) as client:
                for _ in range(20):
                    await client.publish("stuck", [b"x" * 4000] * 250)  # 20 MB
            silent = socket.create_connection((rsio_at.hostname or "", rsio_at.port or 0))
            half = socket.create_connection((seguro_at.hostname or "", seguro_at.port or 0))
            reader, writer = await asyncio.open_connection(rsio_at.hostname, rsio_at.port)
            stalled = rsio.RsioClient(StallingReader(reader, 64 * 1024), writer)
            try:
                records = stalled.subscribe("stuck", from_id=1, prefetch=1_000_000)
                await anext(aiter(records))  # the first batch, then the client reads no more
                half.sendall(b"HELLO 0\nPOINT ~zod\n")
                half.sendall(b"SAVE 1 100\n" + b"y" * 50)
                code, seconds = await asyncio.to_thread(hub.terminate)
                assert code == 0, hub.log()
                assert seconds < 1 + EXIT_SLACK
            finally:
                writer.close()
                silent.close()
                half.close()

        asyncio.run(asyncio.wait_for(fill_and_stall(), BOUND))
    finally:
        hub.stop()
