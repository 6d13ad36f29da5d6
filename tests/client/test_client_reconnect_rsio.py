"""Clients that recover (issue 11), RS.io over TCP and over Tube: against an in-process hub whose
listener is stopped and started again on the same port (with the hub closed and reopened on the
same data directory, or not), or whose connections are cut, the client reconnects with backoff,
resumes subscriptions after the last id it handed out and offers again what the hub did not
acknowledge; every event reaches the subscriber once, in order, and every acknowledged batch is
stored once. Refused tokens and exhausted retries are final. Real sockets on 127.0.0.1, both
event loops; the backoff's sleep and clock are fakes wherever a delay is asserted."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import pytest
from aiohttp import web

from helpers import until
from loops import Run
from tidewire.client import rsio, tube
from tidewire.client.backoff import Backoff, GaveUp, Retry
from tidewire.client.resilient import Opener, ReconnectingClient
from tidewire.client.rsio import Receipt, RsioError
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.model import Batch, Unauthenticated
from tidewire.server.app import TUBE_CONNECTIONS_KEY, build_app
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.rsio import RsioServer, RsioSession, start_rsio_server

Transport = Literal["tcp", "tube"]
TRANSPORTS: list[Transport] = ["tcp", "tube"]
FAST = Retry(initial=0.002, maximum=0.02)  # the client's own pacing: short real waits


class Restartable:
    """A hub on one data directory behind one listener (RS.io over TCP, or the HTTP app that
    serves Tube) whose port stays the same when it is stopped and started again."""

    def __init__(self, path: Path, transport: Transport, access: Access | None = None,
                 admission: Admission | None = None) -> None:  # fmt: skip
        self.path = path
        self.transport = transport
        self.access = access
        self.admission = admission  # (TCP only)
        self.hub: Hub | None = None
        self.port = 0
        self.starts = 0
        self._server: RsioServer | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        if self.transport == "tcp":
            return f"rsio://127.0.0.1:{self.port}"
        return f"ws://127.0.0.1:{self.port}/tube"

    def the_hub(self) -> Hub:
        assert self.hub is not None
        return self.hub

    @property
    def connections(self) -> set[RsioSession]:
        if self._server is not None:
            return self._server.connections
        if self._runner is not None:
            return self._runner.app[TUBE_CONNECTIONS_KEY]
        return set()

    async def start(self) -> None:
        if self.hub is None:
            self.hub = Hub.open(str(self.path))
        if self.transport == "tcp":
            self._server = await start_rsio_server(self.hub, "127.0.0.1", self.port,
                                                   access=self.access,
                                                   admission=self.admission)  # fmt: skip
            self.port = self._server.port
        else:
            runner = web.AppRunner(build_app(self.hub, access=self.access), access_log=None,
                                   shutdown_timeout=5.0)  # fmt: skip
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._runner = runner
            self.port = runner.addresses[0][1]
        self.starts += 1

    async def stop(self, *, close_hub: bool = False) -> None:
        """Stop listening; every connection gets the hub's goodbye and is closed."""
        if self._server is not None:
            await self._server.close()
            self._server = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if close_hub and self.hub is not None:
            await self.hub.close()
            self.hub = None

    def cut(self) -> None:
        """Drop every connection without a word (as a reset would); the listener stays."""
        for session in list(self.connections):
            session.abort()

    async def stored(self, stream: str) -> list[tuple[int, bytes]]:
        """Every event of ``stream`` as the hub holds it: (id, value)."""
        out: list[tuple[int, bytes]] = []
        next_id = 1
        for _ in range(10_000):
            batches = await self.the_hub().read(stream, next_id, 4 * 1024 * 1024)
            if not batches:
                return out
            for batch in batches:
                out += [(e.id, e.value) for e in batch]
                next_id = batch.last_id + 1
        raise AssertionError("the stream did not end")


@asynccontextmanager
async def restartable(
    path: Path, transport: Transport, access: Access | None = None,
    admission: Admission | None = None,
) -> AsyncIterator[Restartable]:  # fmt: skip
    served = Restartable(path, transport, access, admission)
    await served.start()
    try:
        yield served
    finally:
        await served.stop(close_hub=True)


def opener(served: Restartable, token: str | None = None) -> Opener:
    """One connection per call, to whatever listens on the served port now."""
    if served.transport == "tcp":
        return lambda: rsio.connect(served.url, token=token)
    return lambda: tube.connect(served.url, token=token)


class FakeTime:
    """The backoff's clock and sleep: sleeping records the delay and moves the clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.delays: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self.now += delay
        await asyncio.sleep(0)


class Progress:
    """A counter that tasks can wait on, without timers."""

    def __init__(self) -> None:
        self.value = 0
        self._changed = asyncio.Event()

    def add(self, n: int = 1) -> None:
        self.value += n
        self._changed.set()

    async def reach(self, n: int, worker: asyncio.Task[None]) -> None:
        """Wait until the count is ``n`` (or ``worker`` ended: its error is raised)."""
        while self.value < n:
            self._changed.clear()
            changed = asyncio.ensure_future(self._changed.wait())
            await asyncio.wait({changed, worker}, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            if worker.done():
                worker.result()
                raise AssertionError(f"the worker ended at {self.value} of {n}")


def values_of(k: int, n: int) -> list[bytes]:
    return [b"b%d-%d" % (k, i) for i in range(n)]


# --------------------------------------------------------------------------- riding it out


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_subscriber_and_a_publisher_ride_through_restarts(
    tmp_path: Path, run: Run, transport: Transport
) -> None:
    """Three restarts on the same port (the second with the hub closed and reopened on its
    data directory), while a subscriber follows and a publisher writes: the subscriber gets
    every event once, in order; every batch is stored once, where its receipt says."""
    batches, per, restarts = 120, 25, 3
    total = batches * per

    async def main() -> None:
        async with restartable(tmp_path, transport) as served:
            connect = rsio.connect if transport == "tcp" else tube.connect
            got: list[tuple[int, bytes]] = []
            acked = Progress()
            receipts: list[Receipt] = []
            async with (
                connect(served.url, retry=FAST) as sub_hub,
                connect(served.url, retry=FAST) as pub_hub,
            ):

                async def subscriber() -> None:
                    async for batch in sub_hub.subscribe("s", prefetch=40):
                        got.extend((e.id, e.value) for e in batch)
                        if len(got) >= total:
                            return

                async def publisher() -> None:
                    pub = await pub_hub.publisher("s", max_unacked_bytes=8 * 1024)
                    async with pub:
                        futures = []
                        for k in range(batches):
                            future = await pub.submit(values_of(k, per))
                            future.add_done_callback(lambda _: acked.add())
                            futures.append(future)
                        receipts.extend(await asyncio.gather(*futures))
                    assert pub.acked == batches
                    assert pub.unacked == 0
                    assert pub.unacked_bytes == 0

                reading = asyncio.create_task(subscriber())
                writing = asyncio.create_task(publisher())
                for r in range(restarts):
                    await acked.reach((r + 1) * batches // (restarts + 1), writing)
                    await served.stop(close_hub=r == 1)
                    await served.start()
                await writing
                await reading
                assert sub_hub.reconnects >= restarts
                assert sub_hub.lost >= restarts
                assert pub_hub.reconnects >= restarts
                assert pub_hub.lost >= restarts
                assert sub_hub.error is None
                assert pub_hub.error is None
            stored = await served.stored("s")
            expected = [v for k in range(batches) for v in values_of(k, per)]
            assert [v for _, v in stored] == expected  # each batch once, in order
            assert got == stored  # every event once, in order
            ids = dict(stored)
            for k, receipt in enumerate(receipts):
                assert receipt.count == per
                assert [ids[i] for i in range(receipt.first_id, receipt.last_id + 1)] == (
                    values_of(k, per))  # fmt: skip
            assert served.starts == restarts + 1

    run(main())


@pytest.mark.parametrize("mode", ["txn", "own_ids", "at_least_once"])
def test_an_acknowledgement_lost_after_the_commit(
    tmp_path: Path, run: Run, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection is cut right after the hub stored a batch, before its acknowledgement
    leaves: a transaction (hub ids) or own ids store it once; ``exactly_once=False`` stores it
    twice, as documented (at least once)."""

    async def main() -> None:
        async with restartable(tmp_path, "tcp") as served:
            hub = served.the_hub()
            cuts: list[str] = []
            name = "commit" if mode == "txn" else "append"
            original = getattr(hub, name)

            async def cut_after(*args: Any, **kwargs: Any) -> Any:
                result = await original(*args, **kwargs)
                if not cuts:
                    cuts.append(name)
                    served.cut()  # the acknowledgement is never written
                return result

            monkeypatch.setattr(hub, name, cut_after)
            async with ReconnectingClient(opener(served), backoff=Backoff(FAST)) as client:
                await client.connection()
                pub = await client.publisher("s", assign_ids=mode != "own_ids",
                                             exactly_once=mode != "at_least_once")  # fmt: skip
                first = Batch.build("s", values_of(0, 3), ids=[10, 11, 12])
                second = Batch.build("s", values_of(1, 2), ids=[20, 21])
                if mode == "own_ids":
                    one, two = await pub.send(first), await pub.send(second)
                    assert (one, two) == (Receipt(3, 10, 12), Receipt(2, 20, 21))
                else:
                    one, two = await pub.send(values_of(0, 3)), await pub.send(values_of(1, 2))
                await pub.close()
                assert cuts == [name]
                assert client.reconnects == 1
                assert client.lost == 1
                assert pub.offered_again == 1
                stored = await served.stored("s")
                if mode == "at_least_once":
                    assert [v for _, v in stored] == values_of(0, 3) * 2 + values_of(1, 2)
                    assert one == Receipt(3, 4, 6)  # the second copy's ids
                else:
                    assert [v for _, v in stored] == values_of(0, 3) + values_of(1, 2)
                    assert dict(stored)[one.first_id] == b"b0-0"
                    assert dict(stored)[two.last_id] == b"b1-1"
                assert pub.found_stored == (1 if mode == "own_ids" else 0)
                assert pub.txns == (2 if mode == "txn" else 0)

    run(main())


def test_own_ids_wait_for_the_hub_to_finish_a_lost_connections_append(
    tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Own ids: after the cut, the stream's latest id still lags behind the append the lost
    connection made (the hub has accepted it, not yet reported it); the re-offer is refused
    with IdOrderError, and the publisher looks again instead of failing: stored once."""

    async def main() -> None:
        async with restartable(tmp_path, "tcp") as served:
            hub = served.the_hub()
            append, streams = hub.append, hub.streams
            lagging: list[int] = []  # answers that hid the lost connection's append

            async def cut_after(*args: Any, **kwargs: Any) -> Any:
                result = await append(*args, **kwargs)
                if not lagging:
                    lagging.append(0)
                    served.cut()
                return result

            def stale(*args: Any, **kwargs: Any) -> Any:
                if lagging and len(lagging) < 3:  # the first two answers after the cut lag
                    lagging.append(1)
                    return [dataclasses.replace(s, latest_id=0) for s in streams()]
                return streams()

            monkeypatch.setattr(hub, "append", cut_after)
            monkeypatch.setattr(hub, "streams", stale)
            async with ReconnectingClient(opener(served), backoff=Backoff(FAST)) as client:
                pub = await client.publisher("s", assign_ids=False)
                one = await pub.send(Batch.build("s", values_of(0, 3), ids=[10, 11, 12]))
                two = await pub.send(Batch.build("s", values_of(1, 2), ids=[20, 21]))
                await pub.close()
                assert (one, two) == (Receipt(3, 10, 12), Receipt(2, 20, 21))
                assert lagging == [0, 1, 1]
                assert pub.found_stored == 1
                assert client.reconnects == 1
                assert await served.stored("s") == list(
                    zip([10, 11, 12, 20, 21], values_of(0, 3) + values_of(1, 2), strict=True))

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_latest_is_pinned_before_the_first_event(
    tmp_path: Path, run: Run, transport: Transport
) -> None:
    """``from_id="latest"``: events appended while the hub is unreachable, before the
    subscriber saw any, are delivered after the reconnect (a new "latest" would skip them)."""

    async def main() -> None:
        async with restartable(tmp_path, transport) as served:
            hub = served.the_hub()
            await hub.append(Batch.build("s", [b"old1", b"old2"]), assign_ids=True)
            async with ReconnectingClient(opener(served), backoff=Backoff(FAST)) as client:
                got: list[tuple[int, bytes]] = []

                async def follow() -> None:
                    async for batch in client.subscribe("s", from_id="latest"):
                        got.extend((e.id, e.value) for e in batch)
                        if len(got) >= 2:
                            return

                following = asyncio.create_task(follow())
                await until(lambda: sum(len(c.pumps) for c in served.connections) == 1)
                await served.stop()
                await hub.append(Batch.build("s", [b"new1", b"new2"]), assign_ids=True)
                await served.start()
                await following
                assert got == [(3, b"new1"), (4, b"new2")]
                assert client.reconnects == 1

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_values_and_records_resume_after_the_last_id(
    tmp_path: Path, run: Run, transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values (which carry no ids) and records, across a restart and a cut: each event once,
    and the hub is asked to start right after the last id handed out (not at the start)."""
    starts: list[object] = []  # where the hub's subscriptions start
    subscribe = Hub.subscribe

    def recording(hub: Hub, stream: str, start: Any = "earliest", **kwargs: Any) -> Any:
        starts.append(start)
        return subscribe(hub, stream, start, **kwargs)

    monkeypatch.setattr(Hub, "subscribe", recording)

    async def main() -> None:
        async with restartable(tmp_path, transport) as served:
            hub = served.the_hub()
            for chunk in range(10):
                await hub.append(Batch.build("v", [b"%04d" % (chunk * 10 + i) for i in range(10)]),
                                 assign_ids=True)  # fmt: skip
            async with ReconnectingClient(opener(served), backoff=Backoff(FAST)) as client:
                values: list[bytes] = []
                resumed: list[int] = []  # the first id delivered after each reconnect
                async for packed in client.subscribe_values("v", size=4, prefetch=15):
                    if client.reconnects > len(resumed):
                        resumed.append(len(values) + 1)  # (value i has id i + 1)
                    values += list(packed)
                    if len(values) >= 30 and served.starts == 1:
                        await served.stop(close_hub=True)
                        await served.start()
                    if len(values) >= 100:
                        break
                assert values == [b"%04d" % i for i in range(100)]
                records: list[int] = []
                async for batch in client.subscribe_records("v", from_id=35, prefetch=2):
                    if client.reconnects > len(resumed):
                        resumed.append(batch.first_id)
                    records += [e.id for e in batch]
                    if len(records) == len(batch):  # after the first delivery
                        served.cut()
                    if records[-1] >= 100:
                        break
                assert records == list(range(35, 101))
                assert client.reconnects == 2
                assert starts[1:] == [resumed[0], 35, resumed[1]]
                assert 30 < resumed[0] < 100
                assert 40 < resumed[1] < 100

    run(main())


def test_a_fixed_size_subscription_refuses_a_value_of_another_size(
    tmp_path: Path, run: Run
) -> None:
    async def main() -> None:
        async with restartable(tmp_path, "tcp") as served:
            await served.the_hub().append(Batch.build("v", [b"abcd", b"abc"]), assign_ids=True)
            async with ReconnectingClient(opener(served), backoff=Backoff(FAST)) as client:
                with pytest.raises(RsioError, match=r"ids 1\.\.2 is not 4 bytes"):
                    async for _ in client.subscribe_values("v", size=4):
                        pass

    run(main())


# --------------------------------------------------------------------------- what is final


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_backoff_gives_up_when_the_hub_never_comes_back(
    tmp_path: Path, run: Run, transport: Transport
) -> None:
    async def main() -> None:
        async with restartable(tmp_path, transport) as served:
            await served.the_hub().append(Batch.build("s", [b"a", b"b"]), assign_ids=True)
            time = FakeTime()
            retry = Retry(initial=0.1, maximum=0.4, jitter=0.5, attempts=4)
            backoff = Backoff(retry, rng=lambda: 0.5, clock=time.clock, sleep=time.sleep)
            client = ReconnectingClient(opener(served), backoff=backoff, what=served.url)
            try:
                stream = client.subscribe("s")
                first = await anext(stream)
                assert [e.value for e in first] == [b"a", b"b"]
                await served.stop(close_hub=True)  # and it never comes back
                with pytest.raises(GaveUp) as info:
                    await anext(stream)
                assert info.value.attempts == 4
                assert served.url in str(info.value)
                # the lost connection had delivered: a new outage, a try at once, then waits
                # of initial * 2**n * (1 - jitter * 0.5), capped at the maximum
                assert time.delays == pytest.approx([0.075, 0.15, 0.3])
                assert client.failed_attempts == 4
                assert client.lost == 1
                assert client.error is info.value
                with pytest.raises(GaveUp):  # final: every later use gets it
                    await client.connection()
                with pytest.raises(GaveUp):
                    await client.publisher("s")
                await stream.aclose()
            finally:
                await client.close()

    run(main())


def test_the_first_connection_is_retried_then_given_up(run: Run) -> None:
    async def main() -> None:
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with pytest.raises(GaveUp) as info:
            await rsio.connect(f"rsio://127.0.0.1:{port}",
                               retry=Retry(initial=0.001, maximum=0.001, attempts=3))  # fmt: skip
        assert info.value.attempts == 3
        assert isinstance(info.value.last, OSError)

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_refused_token_is_final(tmp_path: Path, run: Run, transport: Transport) -> None:
    """At the first connection, and at a reconnect to a hub that no longer accepts it."""
    ci, table = mint_token("ci")

    async def main() -> None:
        access = Access(tokens=Tokens.parse(table))
        async with restartable(tmp_path, transport, access) as served:
            time = FakeTime()
            backoff = Backoff(Retry(attempts=5), clock=time.clock, sleep=time.sleep)
            bad = ReconnectingClient(opener(served, "ci.wrong"), backoff=backoff)
            with pytest.raises(Unauthenticated, match=r"invalid token|401"):
                await bad.connection()
            assert time.delays == []
            assert bad.failed_attempts == 0
            await bad.close()

            connect = rsio.connect if transport == "tcp" else tube.connect
            with pytest.raises(Unauthenticated):
                await connect(served.url, token="ci.wrong", retry=Retry(attempts=5))

            await served.the_hub().append(Batch.build("s", [b"a"]), assign_ids=True)
            good = ReconnectingClient(opener(served, ci), backoff=Backoff(FAST))
            try:
                stream = good.subscribe("s")
                assert [e.value for e in await anext(stream)] == [b"a"]
                # (over Tube the token rides on the upgrade: no in-band principal)
                assert good.principal == ("token:ci" if transport == "tcp" else None)
                await served.stop()
                served.access = Access(tokens=Tokens())  # the token is revoked meanwhile
                await served.start()
                with pytest.raises(Unauthenticated):
                    await anext(stream)
                assert good.reconnects == 0
            finally:
                await good.close()

    run(main())


def test_a_subscription_the_hub_refuses_is_not_retried(tmp_path: Path, run: Run) -> None:
    ci, table = mint_token("ci")
    acl = Acl.parse('[principal."token:ci"]\nread = ["pub.*"]\nwrite = ["pub.*"]\n')

    async def main() -> None:
        access = Access(acl, Tokens.parse(table))
        async with (
            restartable(tmp_path, "tcp", access) as served,
            ReconnectingClient(opener(served, ci), backoff=Backoff(FAST)) as client,
        ):
            with pytest.raises(RsioError, match="forbidden"):
                async for _ in client.subscribe("payroll"):
                    pass
            pub = await client.publisher("payroll")
            with pytest.raises(RsioError, match="forbidden"):
                await pub.send([b"x"])
            with pytest.raises(RsioError, match="forbidden"):
                await pub.close()
            assert client.connects == 1
            assert client.lost == 0
            assert client.error is None
            assert (await client.publish("pub.ok", [b"x"])).count == 1  # it carries on

    run(main())


def test_a_connection_that_drops_at_once_is_paced_by_the_backoff(
    tmp_path: Path, run: Run
) -> None:
    """A connection lost before it delivered anything, and young, is a failed try of the same
    outage: the waits between such tries grow, and the outage's bound holds."""

    async def main() -> None:
        async with (
            restartable(tmp_path, "tcp") as served,
            ReconnectingClient(opener(served), backoff=Backoff(FAST)) as client,
        ):
            await client.connection()
            time = FakeTime()
            client.backoff = Backoff(Retry(initial=0.1, maximum=10, jitter=0, attempts=4),
                                     clock=time.clock, sleep=time.sleep)  # fmt: skip
            for _ in range(3):  # accepted, then dropped at once, three times
                served.cut()
                await until(lambda: not client.connected)
                await client.connection()
            assert time.delays == [0.1, 0.2, 0.4]
            served.cut()
            await until(lambda: not client.connected)
            with pytest.raises(GaveUp):
                await client.connection()

    run(main())


def test_a_hub_refusing_the_connection_is_tried_again(tmp_path: Path, run: Run) -> None:
    """The hub's hello, then goodbye("too many connections ..."), is no final answer: tried
    again, paced by the backoff, until the hub admits the client."""

    async def main() -> None:
        admission = Admission(ConnectionLimits(max_connections_per_peer=1))
        async with restartable(tmp_path, "tcp", admission=admission) as served:
            blocker = await rsio.connect(served.url)
            await blocker.ready()
            time = FakeTime()

            async def sleep(delay: float) -> None:
                await time.sleep(delay)
                if len(time.delays) == 2:  # the hub has room again before the third try
                    await blocker.close()
                    await until(lambda: not served.connections)

            backoff = Backoff(Retry(initial=0.1, jitter=0, attempts=5), clock=time.clock,
                              sleep=sleep)  # fmt: skip
            async with ReconnectingClient(opener(served), backoff=backoff) as client:
                await client.connection()
                assert client.failed_attempts == 2
                assert time.delays == [0.1, 0.2]
                assert "too many connections from 127.0.0.1" in (client.last_error or "")
                assert (await client.publish("s", [b"in"])).count == 1

    run(main())


def test_close_ends_what_is_under_way(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with restartable(tmp_path, "tcp") as served:
            client = ReconnectingClient(opener(served), backoff=Backoff(FAST))
            pub = await client.publisher("s")
            await pub.send([b"x"])
            await served.stop()  # nobody listens: the publisher's batch waits for a hub
            pending = await pub.submit([b"y"])
            await client.close()  # (cuts the backoff's wait short)
            with pytest.raises(RsioError, match="closed"):
                await pending
            with pytest.raises(RsioError, match="closed"):
                await client.connection()

    run(main())
