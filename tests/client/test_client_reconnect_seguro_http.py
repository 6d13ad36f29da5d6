"""Issue 11, "Clients that recover", for the Seguro client and the RS.io-over-HTTP client, over
real sockets on 127.0.0.1 against an in-process hub that is stopped (its connections dropped)
and started again on the same ports, sometimes on a hub closed and reopened on the same data
directory.

* A Seguro ship (``connect(url, point, retry=...)``) saving with SAVE and SAVE MANY while the
  hub restarts: every acknowledged event is stored exactly once with its bytes, no id is
  missing; an RS.io-over-HTTP subscriber (``HttpHub(url, retry=...)``) reading meanwhile gets
  every event once, in order; the reconnect counters moved. ``subscribe_values``,
  ``format=records`` and ``from_id="latest"`` resume too (from the right id).
* Exactly where a connection is cut (a proxy that cuts at a chosen line): a SAVE stored but not
  acknowledged is not sent again, a SAVE MANY cut after a LATEST sends only the rest, a READ
  cut midway goes on after the last event, a point still held by its old session is retried;
  ``events(follow=True)`` polls through the injected sleep.
* Final errors stay final: a bad point, an ACL refusal (at POINT, on SAVE; on subscribe), an id
  not above the latest, an onError; ``GaveUp`` after ``attempts`` when the hub never comes
  back, with the waits of the backoff (an injected sleep records them: no test waits for a
  timer).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from helpers import until
from loops import Run
from tidewire.client.backoff import Backoff, GaveUp, Retry
from tidewire.client.http import HttpHub, HttpRsioError
from tidewire.client.seguro import (
    ReconnectingSeguroClient,
    SeguroClient,
    SeguroRefused,
    connect,
)
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl
from tidewire.log import LogConfig
from tidewire.model import MAX_ID, Batch, LocalProtocolError
from tidewire.protocols.seguro import InvalidPatp, Sent
from tidewire.record import decode_body, parse_header
from tidewire.server.app import RSIO_HTTP_KEY, build_app
from tidewire.server.rsio_http import HttpSettings, RsioHttp
from tidewire.server.seguro import SeguroServer, start_seguro_server

HOST = "127.0.0.1"
POINT = "~sampel-palnet"
FAST = Retry(initial=0.002, maximum=0.05, attempts=200)  # real waits, short (at most ~10 s)


# --------------------------------------------------------------------------- the hub


@dataclass
class Site:
    """A hub with its Seguro listener and its HTTP app, stopped and started again on the same
    ports (free ones, found the first time)."""

    path: Path
    access: Access | None = None
    hub: Hub | None = None
    seguro: SeguroServer | None = None
    runner: web.AppRunner | None = None
    seguro_port: int = 0
    http_port: int = 0
    starts: int = 0

    def open_hub(self) -> Hub:
        self.hub = Hub.open(str(self.path), LogConfig(fsync=False))
        return self.hub

    async def start(self) -> None:
        hub = self.hub if self.hub is not None else self.open_hub()
        self.seguro = await start_seguro_server(hub, HOST, self.seguro_port, access=self.access)
        self.seguro_port = self.seguro.port
        app = build_app(hub, HttpSettings(poll_seconds=2.0), access=self.access)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self.runner.setup()
        await web.TCPSite(self.runner, HOST, self.http_port).start()
        self.http_port = self.runner.addresses[0][1]
        self.starts += 1

    async def stop(self, *, reopen: bool = False) -> None:
        """Drop every Seguro connection at once (a reset), stop listening, shut the HTTP app
        down (waiting fetches get its 503); ``reopen``: close the hub and open it again."""
        if self.seguro is not None:
            for conn in list(self.seguro.connections):
                if conn.transport is not None:
                    conn.transport.abort()
            await self.seguro.close()
            self.seguro = None
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if reopen and self.hub is not None:
            await self.hub.close()
            self.open_hub()

    async def close(self) -> None:
        await self.stop()
        if self.hub is not None:
            await self.hub.close()
            self.hub = None

    @property
    def seguro_url(self) -> str:
        return f"seguro://{HOST}:{self.seguro_port}"

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def rsio(self) -> RsioHttp:
        assert self.runner is not None
        return self.runner.app[RSIO_HTTP_KEY]

    async def stored(self, stream: str = POINT) -> dict[int, bytes]:
        """Every event of ``stream``, read from the log (an id twice would fail the test)."""
        assert self.hub is not None
        got: dict[int, bytes] = {}
        next_id = 1
        for _ in range(100_000):
            batches = await self.hub.read(stream, next_id, 1 << 20)
            if not batches:
                return got
            for batch in batches:
                for i in range(len(batch)):
                    assert batch.ids[i] not in got, f"id {batch.ids[i]} stored twice"
                    got[batch.ids[i]] = batch.value(i)
                next_id = batch.last_id + 1
        raise AssertionError("the log does not end")


@asynccontextmanager
async def site(path: Path, access: Access | None = None) -> AsyncIterator[Site]:
    s = Site(path, access)
    await s.start()
    try:
        yield s
    finally:
        await s.close()


def payload(event_id: int, size: int) -> bytes:
    """Distinct bytes per event, with the newlines and NULs Seguro carries raw."""
    head = b"%d\n\n\x00" % event_id
    return (head * (size // len(head) + 1))[:size]


def free_port() -> int:
    """A port with nothing listening (bound, then closed: connections are refused)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Sleeps:
    """An injected sleep: records each wait, lets the loop run once, and runs ``then`` (if
    any) before returning, instead of waiting."""

    delays: list[float] = field(default_factory=list)
    then: Callable[[int], Awaitable[None]] | None = None

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)
        if self.then is not None:
            await self.then(len(self.delays))

    def pacing(self, retry: Retry) -> Backoff:
        return Backoff(retry, rng=lambda: 0.0, sleep=self)  # no jitter: exact waits


# --------------------------------------------------------------------------- restarts


def test_ship_and_subscriber_survive_restarts(tmp_path: Path, run: Run) -> None:
    """SAVE and SAVE MANY through four restarts (two of them reopen the hub), with an HTTP
    subscriber following the point: stored exactly once, received exactly once, in order."""
    rounds, restarts, many = 30, 4, 60

    async def main() -> None:
        async with site(tmp_path) as s:
            ship = await connect(s.seguro_url, POINT, retry=FAST)
            http = HttpHub(s.http_url, retry=FAST)
            plan: list[list[tuple[int, bytes]]] = []  # a SAVE, then two SAVE MANY, ...
            next_id = 1
            for r in range(rounds):
                if r % 3 == 0:
                    plan.append([(next_id, payload(next_id, 100 + r))])
                    next_id += 3
                else:  # ~400 KiB: two of the hub's chunks, a LATEST between them
                    plan.append([(next_id + 2 * i, payload(next_id + 2 * i, 4000 + 97 * i))
                                 for i in range(many)])  # fmt: skip
                    next_id = plan[-1][-1][0] + 5
            final = plan[-1][-1][0]
            acknowledged: dict[int, bytes] = {}
            finished = 0

            async def write() -> None:
                nonlocal finished
                for events in plan:
                    if len(events) == 1:
                        await ship.save(*events[0])
                    else:
                        await ship.save_many(events)
                    acknowledged.update(events)
                    finished += 1

            got: list[tuple[int, bytes]] = []

            async def read() -> None:
                batches = http.subscribe(POINT, demand=50)
                async with contextlib.aclosing(batches):
                    async for batch in batches:
                        got.extend((e.id, e.value) for e in batch)
                        if got[-1][0] >= final:
                            return
                raise AssertionError("the subscription ended")

            writer = asyncio.ensure_future(write())
            reader = asyncio.ensure_future(read())
            try:
                for n in range(restarts):
                    mark, seen = (n + 1) * rounds // (restarts + 1), len(got)

                    def going() -> bool:  # both clients work again, on their new connections
                        # (the ship's reconnect counted: a subscriber that catches up fast must
                        # not let the next restart come before the ship is back)
                        return (finished >= mark and len(got) > seen  # noqa: B023
                                and ship.reconnects >= n)  # noqa: B023  # fmt: skip

                    await until(going, "the ship saved more, the subscriber got more")
                    assert not writer.done()
                    failed, lost = ship.failures, http.resubscribed

                    def noticed() -> bool:  # the ship failed to reconnect, the subscriber lost
                        # its subscription (503 from the app shutting down, or no connection)
                        return ship.failures > failed + 1 and http.resubscribed > lost  # noqa: B023

                    await s.stop(reopen=n % 2 == 1)
                    await until(noticed, "both clients noticed")
                    await s.start()
                await asyncio.wait_for(writer, 15)
                await asyncio.wait_for(reader, 15)
            finally:
                for task in (writer, reader):
                    task.cancel()
                await asyncio.gather(writer, reader, return_exceptions=True)
                await http.close()

            ids = sorted(acknowledged)
            assert len(ids) == rounds // 3 + (rounds - rounds // 3) * many
            assert await s.stored() == acknowledged  # each once, with its bytes, none missing
            assert got == [(i, acknowledged[i]) for i in ids]  # each once, in order
            assert ship.latest == ids[-1]
            assert ship.reconnects >= restarts
            assert ship.connects == ship.reconnects + 1
            assert http.resubscribed >= restarts
            assert s.starts == restarts + 1
            # the ship reads it all back in pages, each event once
            back = [e async for e in ship.events(1, page=97)]
            assert back == [(i, acknowledged[i]) for i in ids]
            await ship.close()

    run(main())


# --------------------------------------------------------------------------- cut connections


@dataclass
class Cut:
    """Cut the hub's answer at the ``nth`` occurrence of ``pattern`` (before it, or after the
    line that holds it with ``keep_line``): what comes before reaches the ship, then both
    sides of that connection are reset."""

    pattern: bytes
    nth: int = 1
    keep_line: bool = False
    seen: int = 0
    carry: bytes = b""

    def feed(self, data: bytes) -> int | None:
        """Where to cut ``data`` (forward ``data[:i]``), or ``None``."""
        window = self.carry + data
        start = 0
        while (i := window.find(self.pattern, start)) >= 0:
            self.seen += 1
            if self.seen == self.nth:
                end = i
                if self.keep_line:
                    newline = window.find(b"\n", i)
                    end = len(window) if newline < 0 else newline + 1
                return max(0, end - len(self.carry))
            start = i + 1
        self.carry = window[-(len(self.pattern) - 1) :]
        return None


class Proxy:
    """A TCP proxy in front of the hub's Seguro port that applies the queued :class:`Cut`s to
    what the hub says, one per connection cut."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.cuts: list[Cut] = []
        self.connections = 0
        self.cut = 0
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"seguro://{HOST}:{self.server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, HOST, 0)

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.writers += [writer, up_writer]

        def reset() -> None:
            writer.transport.abort()
            up_writer.transport.abort()

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                       cutting: bool) -> None:  # fmt: skip
            with contextlib.suppress(OSError):
                while data := await src.read(1 << 16):
                    at = self.cuts[0].feed(data) if cutting and self.cuts else None
                    if at is not None:
                        self.cuts.pop(0)
                        self.cut += 1
                        dst.write(data[:at])
                        await dst.drain()
                        reset()
                        return
                    dst.write(data)
                    await dst.drain()
            reset()

        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))


@asynccontextmanager
async def proxied(s: Site) -> AsyncIterator[Proxy]:
    proxy = Proxy(s.seguro_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


def test_a_save_stored_but_not_acknowledged_is_not_sent_again(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with site(tmp_path) as s, proxied(s) as proxy:
            sleeps = Sleeps()
            ship = await connect(proxy.url, POINT, retry=FAST, pacing=sleeps.pacing)
            await ship.save(1, b"one")
            proxy.cuts.append(Cut(b"COMMITTED 5 "))  # the hub has it durable; the ship never hears
            await ship.save(5, b"five\n\n")
            assert (proxy.cut, ship.reconnects, ship.found_stored, ship.resent) == (1, 1, 1, 0)
            assert ship.welcome is not None
            assert ship.welcome.latest == 5
            await ship.save(7, b"seven")
            assert await s.stored() == {1: b"one", 5: b"five\n\n", 7: b"seven"}
            assert ship.latest == 7
            await ship.close()

    run(main())


def test_a_save_many_cut_after_latest_sends_only_the_rest(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with site(tmp_path) as s, proxied(s) as proxy:
            ship = await connect(proxy.url, POINT, retry=FAST, pacing=Sleeps().pacing)
            events = [(10 + i, payload(10 + i, 8000)) for i in range(100)]  # 800 KB: 4 chunks
            proxy.cuts.append(Cut(b"LATEST ", keep_line=True))  # the ship hears the first
            await ship.save_many(events)
            assert proxy.cut == 1
            assert ship.reconnects == 1
            assert ship.found_stored >= 1  # at least the first chunk: LATEST said so
            assert ship.found_stored + ship.resent == len(events)
            assert await s.stored() == dict(events)
            await ship.save_many([(200, b"a"), (201, b"b")])
            assert len(await s.stored()) == 102
            await ship.close()

    run(main())


def test_a_save_many_cut_before_any_latest_is_sent_again(tmp_path: Path, run: Run) -> None:
    """Cut on the first LATEST, not forwarded: what the hub stored meanwhile, WELCOME says."""

    async def main() -> None:
        async with site(tmp_path) as s, proxied(s) as proxy:
            ship = await connect(proxy.url, POINT, retry=FAST, pacing=Sleeps().pacing)
            events = [(1 + 3 * i, payload(1 + 3 * i, 9000 + i)) for i in range(80)]
            proxy.cuts.append(Cut(b"LATEST "))
            await ship.save_many(events)
            assert (proxy.cut, ship.reconnects) == (1, 1)
            assert ship.found_stored + ship.resent == len(events)
            assert ship.found_stored >= 1  # the LATEST was sent: that chunk was durable
            assert await s.stored() == dict(events)
            await ship.close()

    run(main())


def test_a_read_cut_midway_goes_on_after_the_last_event(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with site(tmp_path) as s, proxied(s) as proxy:
            assert s.hub is not None
            values = [payload(i, 50 + i) for i in range(1, 301)]
            await s.hub.append(Batch.build(POINT, values, ids=list(range(2, 602, 2))))
            ship = await connect(proxy.url, POINT, retry=FAST, pacing=Sleeps().pacing)
            proxy.cuts.append(Cut(b"EVENT ", nth=120))
            events, sent = await ship.read(3, 250)
            assert (proxy.cut, ship.reconnects) == (1, 1)
            assert events == [(2 * i, values[i - 1]) for i in range(2, 252)]
            assert (sent.count, sent.start, sent.end) == (250, 4, 502)
            # events(): the same through pages, and a cut in the middle of one
            proxy.cuts.append(Cut(b"EVENT ", nth=30))
            got = [e async for e in ship.events(1, page=64)]
            assert got == [(2 * i, values[i - 1]) for i in range(1, 301)]
            assert ship.reconnects == 2
            await ship.close()

    run(main())


def test_events_follows_the_point(tmp_path: Path, run: Run) -> None:
    """Caught up, ``events(follow=True)`` waits ``poll`` (through the injected sleep, during
    which the ship saves one more event) and reads again from the last id + 1."""

    async def main() -> None:
        async with site(tmp_path) as s:
            sleeps = Sleeps()
            ship = await connect(s.seguro_url, POINT, retry=FAST, pacing=sleeps.pacing)
            await ship.save_many([(1, b"a"), (2, b"b")])

            async def meanwhile(waits: int) -> None:
                if waits == 1:
                    await ship.save(4, b"d")

            sleeps.then = meanwhile
            got: list[tuple[int, bytes]] = []
            follow = ship.events(1, page=2, follow=True, poll=0.5)
            async for event in follow:
                got.append(event)
                if len(got) == 3:
                    break
            await follow.aclose()
            assert got == [(1, b"a"), (2, b"b"), (4, b"d")]
            assert sleeps.delays == [0.5]  # one poll: the READ of 3.. found nothing at first
            await ship.close()

    run(main())


def test_a_point_still_held_by_its_old_session_is_retried(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with site(tmp_path) as s:
            assert s.seguro is not None
            server = s.seguro
            holder = await connect(s.seguro_url, POINT)  # the "old session", still there

            async def release(waits: int) -> None:
                if waits == 2:  # after two drops: the old session goes, as after a reset
                    await holder.close()
                    await until(lambda: POINT not in server.points, "the hub let it go")

            sleeps = Sleeps(then=release)
            ship = await connect(s.seguro_url, POINT, retry=FAST, pacing=sleeps.pacing)
            assert (ship.point_drops, ship.failures, ship.connects) == (2, 2, 1)
            assert sleeps.delays == [0.002, 0.004]  # the backoff's first two waits
            await ship.save(1, b"x")
            await ship.close()

    run(main())


# --------------------------------------------------------------------------- final errors


ACL = """
[principal.anonymous]
read = ["~bus", "open"]
write = ["~marzod"]
"""


def test_seguro_final_errors_stay_final(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with site(tmp_path, Access(Acl.parse(ACL))) as s:
            sleeps = Sleeps()
            retry = Retry(initial=0.01, maximum=1.0, attempts=100)
            with pytest.raises(InvalidPatp):  # a bad point: nothing is even dialled
                await connect(s.seguro_url, "~zzz", retry=retry, pacing=sleeps.pacing)
            # neither read nor write on ~zod: dropped after POINT, refused_after times
            with pytest.raises(SeguroRefused, match="after POINT 3 times"):
                await connect(s.seguro_url, "~zod", retry=retry, pacing=sleeps.pacing,
                              refused_after=3)  # fmt: skip
            assert sleeps.delays == [0.01, 0.02]  # 3 tries: not the 100 attempts
            # read-only ~bus: welcomed, and every SAVE dropped on its line
            sleeps.delays.clear()
            bus = await connect(s.seguro_url, "~bus", retry=retry, pacing=sleeps.pacing,
                                refused_after=3)  # fmt: skip
            with pytest.raises(SeguroRefused, match="may not write"):
                await bus.save(1, b"no")
            assert (bus.resent, bus.found_stored, bus.connects) == (2, 0, 4)
            assert await s.stored("~bus") == {}
            assert await bus.read(1, 10) == ([], Sent(0, 0, 0))  # it still reads
            await bus.close()
            # mistakes of the caller: refused before anything is sent, the session goes on
            ship = await connect(s.seguro_url, "~marzod", retry=retry, pacing=sleeps.pacing)
            await ship.save(5, b"five")
            for bad in ([(5, b"again")], [(4, b"below")], [(MAX_ID + 1, b"too big")],
                        [(7, b"a"), (6, b"b")]):  # fmt: skip
                with pytest.raises(LocalProtocolError):
                    await (ship.save(*bad[0]) if len(bad) == 1 else ship.save_many(bad))
            with pytest.raises(LocalProtocolError):
                await ship.save_many([(9, b"one is a SAVE")])
            await ship.save_many([(6, b"b"), (8, b"c")])
            assert (ship.connects, ship.failures) == (1, 0)
            assert await s.stored("~marzod") == {5: b"five", 6: b"b", 8: b"c"}
            await ship.close()

    run(main())


def test_seguro_gives_up_when_the_hub_never_comes_back(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        retry = Retry(initial=0.1, maximum=1.0, attempts=4)
        sleeps = Sleeps()
        url = f"seguro://{HOST}:{free_port()}"
        with pytest.raises(GaveUp) as caught:
            await connect(url, POINT, retry=retry, pacing=sleeps.pacing)
        assert caught.value.attempts == 4
        assert isinstance(caught.value.last, OSError)
        assert sleeps.delays == [0.1, 0.2, 0.4]
        # connected, then the hub goes for good: the save in flight gives up
        async with site(tmp_path) as s:
            sleeps = Sleeps()
            ship = await connect(s.seguro_url, POINT, retry=retry, pacing=sleeps.pacing)
            await ship.save(1, b"kept")
            await s.stop()
            with pytest.raises(GaveUp) as caught:
                await ship.save(2, b"never")
            assert caught.value.attempts == 4  # the lost connection, then three refused
            assert sleeps.delays == [0.1, 0.2, 0.4]
            assert ship.failures == 4
            assert not ship.connected
            await s.start()  # a later call starts a new outage, and succeeds
            await ship.save(2, b"now")
            assert await s.stored() == {1: b"kept", 2: b"now"}
            assert ship.reconnects == 1
            await ship.close()

    run(main())


def test_without_retry_the_seguro_client_is_the_plain_one(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with site(tmp_path) as s:
            async with connect(s.seguro_url, POINT) as plain:
                assert type(plain) is SeguroClient
            async with connect(s.seguro_url, POINT, retry=FAST) as ship:
                assert type(ship) is ReconnectingSeguroClient

    run(main())


# --------------------------------------------------------------------------- HTTP


async def append(s: Site, stream: str, values: list[bytes]) -> None:
    assert s.hub is not None
    await s.hub.append(Batch.build(stream, values), assign_ids=True)


def test_a_subscription_from_latest_does_not_skip_what_came_while_down(
    tmp_path: Path, run: Run
) -> None:
    """``from_id="latest"`` is pinned to an id first, so the new subscription after a restart
    starts there, not at the restarted hub's "latest" (which would skip 4..6)."""

    async def main() -> None:
        async with site(tmp_path) as s, HttpHub(s.http_url, retry=FAST) as http:
            await append(s, "s", [b"1", b"2", b"3"])
            batches = http.subscribe("s", from_id="latest", demand=10)
            got: list[tuple[int, bytes]] = []

            async def read() -> None:
                async with contextlib.aclosing(batches):
                    async for batch in batches:
                        got.extend((e.id, e.value) for e in batch)
                        if got[-1][0] == 7:
                            return

            reader = asyncio.ensure_future(read())
            await until(lambda: len(s.rsio.subs) == 1, "the subscription is made")
            await s.stop(reopen=True)
            await append(s, "s", [b"4", b"5", b"6"])  # while the listeners are down
            await s.start()
            await append(s, "s", [b"7"])
            await asyncio.wait_for(reader, 10)
            assert got == [(4, b"4"), (5, b"5"), (6, b"6"), (7, b"7")]
            assert http.resubscribed >= 1

    run(main())


async def drain(elements: AsyncIterator[list[bytes]], into: list[bytes]) -> None:
    async for some in elements:
        into += some


def record_ids(stream: str, element: bytes) -> list[int]:
    view = memoryview(element)
    return list(decode_body(stream, parse_header(view, 0), view, 0).ids)


def test_subscribe_values_and_records_resume_too(tmp_path: Path, run: Run) -> None:
    """``subscribe_values`` (envelopes under the hood, with retry=) and ``format=records``
    (each element a record: its header has the ids) resume after a restart."""

    async def main() -> None:
        async with site(tmp_path) as s, HttpHub(s.http_url, retry=FAST) as http:
            await append(s, "v", [b"%03d" % i for i in range(1, 51)])
            values = http.subscribe_values("v", size=3, demand=8)
            got: list[bytes] = []
            starts: list[object] = []  # where the new subscription began
            first = 0  # the first id handed over from it
            async with contextlib.aclosing(values):
                async for vs in values:
                    if s.starts == 2 and not starts:
                        starts = [sub.name.start for sub in s.rsio.subs.values()]
                        first = int(vs[0])  # (ids are the values) the new one's first
                    got += vs
                    if len(got) >= 20 and s.starts == 1:
                        resumed_at = len(got) + 1  # (ids are 1..50)
                        await s.stop(reopen=True)
                        await s.start()
                    if len(got) >= 50:
                        break
            assert got == [b"%03d" % i for i in range(1, 51)]
            # From the last id handed over + 1, not from 1: the elements that arrived before
            # the restart (the next fetch goes out as a batch is handed over) are handed over
            # first, so it may begin after where the application stood at the stop.
            assert starts == [first]
            assert first >= resumed_at
            assert http.resubscribed == 1
            for first in range(1, 51, 10):  # five records
                await append(s, "r", [b"r%d" % i for i in range(first, first + 10)])
            ids: list[int] = []
            async for elements in http.elements("r?format=records&until=50", demand=2):
                ids += [i for element in elements for i in record_ids("r", element)]
                if s.starts == 2:
                    await s.stop()
                    await s.start()
            assert ids == list(range(1, 51))  # then 410, after the restart
            assert http.resubscribed == 2

    run(main())


def test_http_final_errors_stay_final(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with site(tmp_path, Access(Acl.parse(ACL))) as s:
            assert s.hub is not None
            await append(s, "open", [b"ab", b"c"])
            await append(s, "secret", [b"x"])
            sleeps = Sleeps()
            async with HttpHub(s.http_url, retry=FAST, pacing=sleeps.pacing) as http:
                with pytest.raises(HttpRsioError) as caught:  # the ACL: anonymous may not
                    async for _ in http.subscribe("secret"):
                        pass
                assert (caught.value.status, caught.value.rsio) == (401, True)
                with pytest.raises(HttpRsioError) as caught:  # a bad publisher
                    async for _ in http.elements("open?nope=1"):
                        pass
                assert (caught.value.status, caught.value.rsio) == (400, True)
                got: list[bytes] = []
                with pytest.raises(HttpRsioError) as caught:  # onError: "c" is not 2 bytes
                    await drain(http.elements("open?size=2", demand=1), got)
                assert (caught.value.status, caught.value.rsio) == (500, True)
                assert got == [b"ab"]
                got.clear()
                with pytest.raises(HttpRsioError, match="not 2") as caught:  # (envelopes)
                    await drain(http.subscribe_values("open", size=2, demand=1), got)
                assert (caught.value.status, caught.value.rsio) == (0, False)
                assert got == [b"ab"]
                await until(lambda: s.rsio.subs == {}, "the extra cancel arrives")
                assert sleeps.delays == []  # no retry, no new subscription
                assert (http.resubscribed, http.retried) == (0, 0)

    run(main())


def test_http_gives_up_when_the_hub_never_comes_back(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        retry = Retry(initial=0.1, maximum=1.0, attempts=3)
        sleeps = Sleeps()
        async with HttpHub(f"http://{HOST}:{free_port()}", retry=retry,
                           pacing=sleeps.pacing) as http:  # fmt: skip
            with pytest.raises(GaveUp) as caught:
                async for _ in http.subscribe("s"):
                    pass
        assert caught.value.attempts == 3
        assert isinstance(caught.value.last, HttpRsioError)
        assert caught.value.last.status == 0
        assert sleeps.delays == [0.1, 0.2]
        async with site(tmp_path) as s:
            await append(s, "s", [b"1", b"2"])
            sleeps = Sleeps()
            async with HttpHub(s.http_url, retry=retry, pacing=sleeps.pacing) as http:
                got: list[int] = []

                async def follow() -> None:
                    async for batch in http.subscribe("s", demand=10):
                        got.extend(e.id for e in batch)
                        if got == [1, 2]:
                            await s.stop()  # for good

                with pytest.raises(GaveUp) as caught:
                    await follow()
                assert got == [1, 2]
                assert caught.value.attempts == 3
                assert sleeps.delays == [0.1, 0.2]
                assert http.resubscribed == 1  # then the new subscription is refused twice

    run(main())
