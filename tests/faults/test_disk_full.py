"""The hub on a full disk (issue 11): ``tidewire serve`` on a real 8 MiB tmpfs
(tests/smallfs.py), filled by a ballast file while RS.io, Tolliver and Seguro clients write.

Each protocol refuses the writes in its own words (docs/protocols/*.md, "Disk full"):

* RS.io: the offer ends with ``offerEnded(offer, "stream '...': disk full (ENOSPC: ...")``,
  which the client raises; the connection and its other subscriptions carry on;
* Tolliver: the message is not acked (the hub logs a warning), and the sender's resends are
  refused the same way until space returns, then stored and acked;
* Seguro: the session is dropped (no error reply exists), logged; the ship reconnects and
  ``WELCOME`` says the last id stored.

Meanwhile the hub stays up and serves reads. Once the ballast is deleted, writes are accepted
again without a restart. Finally the hub is stopped (SIGTERM) and restarted on the same tmpfs:
every acknowledged event is there exactly once, with strictly increasing ids, byte for byte,
and nothing refused was stored (Tolliver is at-least-once: its messages are there, each one
sent).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from helpers import until
from hubproc import HubProcess
from smallfs import SmallFs, Unavailable
from tidewire.client import rsio, seguro
from tidewire.model import Batch
from tidewire.tolliver import Instance

SIZE = 8 * 1024 * 1024
BIG = 256 * 1024  # never fits in what a full disk has left (the slack of a page)
BOUND = 60.0
RSIO, TOLLIVER, POINT = "df-rsio", "df-tolliver", "~zod"

Events = list[tuple[int, bytes]]


def value(tag: str, n: int) -> bytes:
    return f"{tag}-{n:06d}-".encode() + bytes([n % 251]) * (n % 200)


async def read_rsio(client: rsio.RsioClient, stream: str) -> Events:
    latest = (await client.streams([stream]))[0]["latest_id"]
    events: Events = []
    if latest:
        async for batch in client.subscribe(stream, from_id=1, until_id=latest):
            events += [(e.id, e.value) for e in batch]
    return events


async def read_seguro(url: str) -> Events:
    saved: Events = []
    async with seguro.connect(url, POINT) as ship:
        start = 1
        for _ in range(1000):  # bounded: 1000 reads of 1000
            got, _ = await ship.read(start, 1000)
            if not got:
                break
            saved += got
            start = got[-1][0] + 1
    return saved


class Writers:
    """The three clients, and what each was told is durable."""

    def __init__(self, urls: dict[str, str], tmp: Path) -> None:
        self.urls = urls
        self.rsio_acked: Events = []
        self.seguro_acked: Events = []
        self.tolliver_sent: list[bytes] = []
        address = urlsplit(urls["tolliver"])
        self.tolliver_at = (address.hostname or "127.0.0.1", address.port or 0)
        # Subscribed to its channel, so that the hub subscribes to it too (and is sent to).
        self.instance = Instance(str(tmp / "tolliver.db"), resend_interval=0.2)
        self.instance.subscribe(TOLLIVER)

    async def publish(self, client: rsio.RsioClient, n: int, start: int) -> None:
        pub = await client.publisher(RSIO)
        batches = [[value("r", start + 10 * b + i) for i in range(10)] for b in range(n)]
        futures = [await pub.submit(values) for values in batches]  # several in flight
        for future, values in zip(futures, batches, strict=True):
            receipt = await future
            ids = range(receipt.first_id, receipt.last_id + 1)
            self.rsio_acked += zip(ids, values, strict=True)
        await pub.close()

    async def save(self, n: int) -> None:
        async with seguro.connect(self.urls["seguro"], POINT) as ship:
            first = ship.latest + 1
            events = [(first + i, value("s", first + i)) for i in range(n)]
            await ship.save_many(events)
            self.seguro_acked += events

    async def send(self, n: int) -> None:
        for _ in range(n):
            body = value("t", len(self.tolliver_sent))
            await self.instance.send(TOLLIVER, "", body)
            self.tolliver_sent.append(body)


@pytest.mark.timeout(120)
def test_a_full_disk_is_refused_in_each_protocol_and_service_resumes(tmp_path: Path) -> None:
    fs = SmallFs(tmp_path / "mnt", SIZE)
    try:
        fs.start()
    except Unavailable as exc:
        pytest.skip(f"no small file system to fill: {exc}")
    hub = HubProcess(fs.root / "data", tmp_path / "hub.log")
    try:
        urls = hub.start()
        pid = hub.proc.pid if hub.proc is not None else 0
        w = Writers(urls, tmp_path)

        async def scenario() -> None:
            try:
                await w.instance.connect(*w.tolliver_at)
                async with rsio.connect(urls["rsio"]) as client:
                    # A live subscriber on this connection: it carries on through the refusals.
                    tail: Events = []

                    async def follow() -> None:
                        async for batch in client.subscribe(RSIO, from_id=1):
                            tail.extend((e.id, e.value) for e in batch)

                    follower = asyncio.create_task(follow())
                    try:
                        await disk_fills_and_empties(client, tail)
                    finally:
                        follower.cancel()
            finally:
                await w.instance.close()

        async def disk_fills_and_empties(client: rsio.RsioClient, tail: Events) -> None:
            # 1. Space: every protocol writes.
            await w.publish(client, 3, 0)
            await w.save(20)
            await w.send(5)
            await until(lambda: w.instance.store.unacked() == 0, "Tolliver's acks")

            # 2. The disk fills up.
            fs.fill()
            assert fs.available() == 0
            # RS.io: the offer ends with the hub's reason, raised to the client.
            pub = await client.publisher(RSIO)
            with pytest.raises(rsio.RsioError) as refused:
                await pub.send([b"x" * BIG] * 4)
            reason = str(refused.value)
            assert reason.startswith(
                f"offer for {RSIO!r} ended: stream {RSIO!r}: disk full "
                "(ENOSPC: No space left on device) writing "
            ), reason
            assert "appends resume once there is space" in reason
            # Tolliver: not acked, resent, refused again; each refusal a warning line.
            await w.instance.send(TOLLIVER, "", b"t" * BIG)
            refusal = f"1 message(s) on {TOLLIVER!r} refused: stream {TOLLIVER!r}: disk full"
            await until(lambda: hub.log().count(refusal) >= 2, "a Tolliver resend refused")
            assert w.instance.store.unacked() == 1
            # Seguro: the session is dropped; the ship learns from WELCOME what is stored.
            with pytest.raises(seguro.SeguroError):
                async with seguro.connect(urls["seguro"], POINT) as ship:
                    await ship.save(ship.latest + 1, b"s" * BIG)
            await until(lambda: f"dropping the connection: the hub failed: stream {POINT!r}: "
                        "disk full" in hub.log(), "Seguro's drop in the log")  # fmt: skip
            async with seguro.connect(urls["seguro"], POINT) as ship:
                assert ship.latest == w.seguro_acked[-1][0]
            # The hub is up and serves reads; the log says why writes are refused.
            assert hub.proc is not None
            assert hub.proc.poll() is None
            assert await read_rsio(client, RSIO) == w.rsio_acked
            assert await read_seguro(urls["seguro"]) == w.seguro_acked
            assert f"stream {RSIO!r}: disk full (ENOSPC" in hub.log()
            assert "the stream stays open" in hub.log()

            # 3. Space returns: writes are accepted again, without a restart.
            fs.free()
            await w.publish(client, 3, 1000)
            await w.save(20)
            await until(lambda: w.instance.store.unacked() == 0, "the resent message acked")
            w.tolliver_sent.append(b"t" * BIG)
            await w.send(5)
            await until(lambda: w.instance.store.unacked() == 0, "Tolliver's acks")
            await until(lambda: len(tail) >= len(w.rsio_acked), "the live subscriber")
            assert tail == w.rsio_acked
            assert f"stream {RSIO!r}: writes succeed again" in hub.log()
            assert hub.proc is not None
            assert hub.proc.pid == pid
            assert hub.starts == 1

        asyncio.run(asyncio.wait_for(scenario(), BOUND))

        # 4. SIGTERM, restart on the same tmpfs: everything acknowledged, once, intact.
        code, _ = hub.terminate()
        assert code == 0, hub.log()
        hub.start()

        async def read_back() -> tuple[Events, Events, Events]:
            async with rsio.connect(hub.urls["rsio"]) as client:
                return (await read_rsio(client, RSIO), await read_rsio(client, TOLLIVER),
                        await read_seguro(hub.urls["seguro"]))  # fmt: skip

        stored, relayed, saved = asyncio.run(asyncio.wait_for(read_back(), BOUND))
        assert stored == w.rsio_acked  # exactly: nothing refused was stored
        assert saved == w.seguro_acked
        ids = [i for i, _ in relayed]
        assert ids == sorted(set(ids))
        assert {v for _, v in relayed} == set(w.tolliver_sent)  # at least once, each one sent
        assert "corrupt" not in hub.log()

        # 5. A hub (re)started on a full disk serves what it has and refuses writes.
        fs.fill()
        code, _ = hub.terminate()
        assert code == 0, hub.log()
        hub.start()

        async def full_start() -> None:
            async with rsio.connect(hub.urls["rsio"]) as client:
                assert await read_rsio(client, RSIO) == w.rsio_acked
                with pytest.raises(rsio.RsioError, match="disk full"):
                    await client.publish(RSIO, [b"x" * BIG])

        asyncio.run(asyncio.wait_for(full_start(), BOUND))
        code, _ = hub.terminate()
        assert code == 0, hub.log()
    finally:
        hub.stop()
        fs.stop()


def test_values_are_distinct() -> None:
    batch = Batch.build(RSIO, [value("r", n) for n in range(500)])
    assert len({batch.value(i) for i in range(len(batch))}) == 500
