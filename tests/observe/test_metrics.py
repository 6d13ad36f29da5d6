"""The hub's metrics (issue 10) over real sockets on 127.0.0.1: every protocol's traffic counted
under its own label (RS.io over TCP, over HTTP, Tube, Tolliver, Seguro, and ``api`` for
in-process callers), subscriptions with their demand and lag, connections per protocol,
Tolliver's unacked deliveries and resends, the log's latency histograms and sizes, and the
rates, read back from ``/metrics`` (parsed with prometheus-client's own parser) and from the
admin API, both fetched over HTTP from the hub's guarded listener.

Nothing sleeps to wait for a timer: asynchronous effects are polled within a bound
(:func:`eventually`), the rates are sampled with a fake clock (``Metrics.sample(now)``; the
hub is never ``start()``-ed, so its own sampler does not run) and Tolliver's resends are driven
by calling the link's ``handle_timer`` with a time past the resend interval.

The harness (:func:`stack`, :class:`Stack`, :class:`Samples`, :func:`eventually`) is in
tests/stacks.py, shared with tests/server/test_admin_api.py and tests/observe/test_logs.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from prometheus_client import generate_latest

import tidewire
from helpers import until
from loops import Run
from stacks import (
    ALICE,
    HOST,
    MAX_DEMAND,
    RECEIVED,
    RECEIVED_BYTES,
    SENT,
    SENT_BYTES,
    TOKENS,
    RawRemote,
    Samples,
    eventually,
    local_port,
    protocols_of,
    read_rsio,
    stack,
    take_tolliver,
    traffic,
    values,
)
from tidewire.client import seguro, tube
from tidewire.client.http import HttpHub
from tidewire.hub import Budget, FairnessLimits, Hub, LoopShares
from tidewire.hub.access import Access
from tidewire.log import LogConfig
from tidewire.model import Batch
from tidewire.observe.metrics import (
    CONNECTION_PROTOCOLS,
    SUBSCRIPTION_PROTOCOLS,
    Metrics,
    registry,
    subscription_lag,
)
from tidewire.protocols.rsio import (
    Cancel,
    ClientHello,
    Decoder,
    OnNext,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
    encode,
)
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.rsio import start_rsio_server

# --------------------------------------------------------------------------- the harness


























# --------------------------------------------------------------------------- traffic by protocol


def test_rsio_tcp_publish_and_subscribe_are_counted(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s, tidewire.connect(s.rsio_url) as client:
            first, second = values("a", 7), values("b", 5)
            await client.publish("m.rsio", first)
            before = await s.metrics()
            assert before.one(RECEIVED, stream="m.rsio", protocol="rsio") == 7
            await client.publish("m.rsio", second)
            after = await s.metrics()
            ei0, bi0, _, _ = traffic(before, "m.rsio", "rsio")
            ei1, bi1, eo1, _ = traffic(after, "m.rsio", "rsio")
            assert ei1 - ei0 == 5
            assert bi1 - bi0 >= sum(map(len, second))
            assert eo1 == 0  # nothing delivered yet
            got: list[bytes] = []
            async for batch in client.subscribe("m.rsio"):
                got += [e.value for e in batch]
                if len(got) >= 12:
                    break
            assert got == first + second
            m = await s.metrics()
            _, bi, eo, bo = traffic(m, "m.rsio", "rsio")
            assert eo == 12
            assert bo >= sum(map(len, got))
            assert protocols_of(m, RECEIVED, "m.rsio") == {"rsio"}
            assert protocols_of(m, SENT, "m.rsio") == {"rsio"}
            (row,) = [r for r in await s.api("/api/streams") if r["name"] == "m.rsio"]
            assert row["protocols"]["rsio"] == {"events_in": 12, "bytes_in": int(bi),
                                                "events_out": 12, "bytes_out": int(bo)}  # fmt: skip
            assert (row["events_in"], row["events_out"]) == (12, 12)

    run(main())


def test_a_transaction_is_counted_once(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s, tidewire.connect(s.rsio_url) as client:
            events = values("t", 4)
            first = await client.publish("m.txn", events, txn="order-1")
            again = await client.publish("m.txn", events, txn="order-1")  # stored once
            assert (again.first_id, again.last_id) == (first.first_id, first.last_id) == (1, 4)
            m = await s.metrics()
            assert m.one(RECEIVED, stream="m.txn", protocol="rsio") == 4
            assert m.one("tidewire_log_events", stream="m.txn") == 4

    run(main())


def test_tube_publish_and_subscribe_are_counted_as_tube(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s, tube.connect(s.tube_url) as client:
            await client.publish("m.tube", values("a", 3))
            before = await s.metrics()
            await client.publish("m.tube", values("b", 9))
            after = await s.metrics()
            assert before.one(RECEIVED, stream="m.tube", protocol="tube") == 3
            assert after.one(RECEIVED, stream="m.tube", protocol="tube") == 12
            delta = (after.one(RECEIVED_BYTES, stream="m.tube", protocol="tube")
                     - before.one(RECEIVED_BYTES, stream="m.tube", protocol="tube"))  # fmt: skip
            assert delta >= sum(map(len, values("b", 9)))
            got = 0
            async for batch in client.subscribe("m.tube", until_id=10):
                got += len(batch)
            assert got == 10
            m = await s.metrics()
            assert m.one(SENT, stream="m.tube", protocol="tube") == 10
            assert m.one(SENT_BYTES, stream="m.tube", protocol="tube") > 0
            assert protocols_of(m, RECEIVED, "m.tube") == {"tube"}
            assert protocols_of(m, SENT, "m.tube") == {"tube"}

    run(main())


def test_seguro_save_and_read_are_counted_as_seguro(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s, seguro.connect(s.seguro_url, "~zod") as ship:
            await ship.save(1, b"one")
            before = await s.metrics()
            assert before.one(RECEIVED, stream="~zod", protocol="seguro") == 1
            many = [(i, b"many %d" % i) for i in range(2, 22)]
            await ship.save_many(many)
            after = await s.metrics()
            assert after.one(RECEIVED, stream="~zod", protocol="seguro") == 21
            grown = (after.one(RECEIVED_BYTES, stream="~zod", protocol="seguro")
                     - before.one(RECEIVED_BYTES, stream="~zod", protocol="seguro"))  # fmt: skip
            assert grown >= sum(len(v) for _, v in many)
            events, _ = await ship.read(5, 8)
            assert [i for i, _ in events] == list(range(5, 13))
            m = await s.metrics()
            assert m.one(SENT, stream="~zod", protocol="seguro") == 8
            assert m.one(SENT_BYTES, stream="~zod", protocol="seguro") >= sum(
                len(v) for _, v in events)
            assert protocols_of(m, RECEIVED, "~zod") == {"seguro"}
            assert protocols_of(m, SENT, "~zod") == {"seguro"}

    run(main())


def test_tolliver_messages_and_deliveries_are_counted_as_tolliver(
    tmp_path: Path, run: Run
) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s:
            sender, reader = s.instance("sender"), s.instance("reader")
            reader.subscribe("m.tol")
            await reader.connect(HOST, s.tolliver.port)
            await sender.connect(HOST, s.tolliver.port)  # the hub follows m.tol: sender sends
            await sender.send("m.tol", "", b"first")
            await until(lambda: sender.store.unacked() == 0, "the hub's ack")
            before = await s.metrics()
            assert before.one(RECEIVED, stream="m.tol", protocol="tolliver") == 1
            bodies = values("t", 6)
            for body in bodies:
                await sender.send("m.tol", "k", body)
            got = await take_tolliver(reader, 7)
            assert [d.body for d in got] == [b"first", *bodies]
            await until(lambda: sender.store.unacked() == 0, "the hub's acks")
            m = await s.metrics()
            assert m.one(RECEIVED, stream="m.tol", protocol="tolliver") == 7
            grown = (m.one(RECEIVED_BYTES, stream="m.tol", protocol="tolliver")
                     - before.one(RECEIVED_BYTES, stream="m.tol", protocol="tolliver"))  # fmt: skip
            assert grown >= sum(map(len, bodies))
            assert m.one(SENT, stream="m.tol", protocol="tolliver") == 7
            assert m.one(SENT_BYTES, stream="m.tol", protocol="tolliver") > 0
            assert protocols_of(m, RECEIVED, "m.tol") == {"tolliver"}

    run(main())


def test_rsio_http_subscription_and_in_process_appends_are_counted(
    tmp_path: Path, run: Run
) -> None:
    """RS.io over HTTP only reads (it has no publishing): events appended in-process count as
    ``api``, those it delivers as ``rsio-http``. Its subscription has no connection."""

    async def main() -> None:
        async with stack(tmp_path) as s, HttpHub(s.base) as http:
            await s.hub.append(Batch.build("m.http", values("a", 4)), assign_ids=True)
            before = await s.metrics()
            await s.hub.append(Batch.build("m.http", values("b", 6)), assign_ids=True)
            after = await s.metrics()
            assert before.one(RECEIVED, stream="m.http", protocol="api") == 4
            assert after.one(RECEIVED, stream="m.http", protocol="api") == 10
            assert (after.one(RECEIVED_BYTES, stream="m.http", protocol="api")
                    - before.one(RECEIVED_BYTES, stream="m.http", protocol="api")
                    >= sum(map(len, values("b", 6))))  # fmt: skip
            got = 0
            async for batch in http.subscribe("m.http", demand=100):
                got += len(batch)
                if got >= 10:
                    (sub,) = await s.subscriptions("m.http")
                    assert (sub["protocol"], sub["connection"]) == ("rsio-http", None)
                    assert (sub["delivered"], sub["lag"], sub["latest_id"]) == (10, 0, 10)
                    break
            m = await s.metrics()
            assert m.one(SENT, stream="m.http", protocol="rsio-http") == 10
            assert m.one(SENT_BYTES, stream="m.http", protocol="rsio-http") > 0
            assert protocols_of(m, SENT, "m.http") == {"rsio-http"}
            # the extra cancel ends it: gone from the API and from the metrics
            await eventually(lambda: s.subscriptions("m.http"), lambda subs: subs == [],
                             "the HTTP subscription to go")  # fmt: skip
            m = await s.metrics()
            assert m.find("tidewire_subscription_lag_events", stream="m.http") == []
            assert m.one("tidewire_subscriptions", protocol="rsio-http") == 0

    run(main())


# --------------------------------------------------------------------------- demand and lag


def test_lag_and_demand_of_a_demand_limited_subscriber(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s:
            reader, writer = await asyncio.open_connection(HOST, s.rsio.port)
            decoder = Decoder()
            try:
                hello = bytearray(encode(ClientHello()))
                encode(Subscribe("lag", 1, 3), out=hello)
                writer.write(bytes(hello))
                first = await read_rsio(reader, decoder, 2)
                assert isinstance(first[0], ServerHello)
                assert first[1] == Subscribed(1, 0)
                conn = (await s.connection(local_port(writer)))["id"]
                (sub,) = await s.subscriptions("lag")
                assert sub["protocol"] == "rsio"
                assert sub["connection"] == conn
                assert (sub["demand"], sub["unbounded"], sub["lag"]) == (3, False, 0)
                assert sub["latest_id"] == 0  # no stream yet

                await s.hub.append(Batch.build("lag", values("x", 10)), assign_ids=True)
                elements = await read_rsio(reader, decoder, 3)
                assert all(isinstance(e, OnNext) and e.subscriber == 1 for e in elements)

                def delivered(n: int) -> Callable[[list[dict[str, Any]]], bool]:
                    return lambda subs: len(subs) == 1 and subs[0]["delivered"] == n

                (sub,) = await eventually(lambda: s.subscriptions("lag"), delivered(3),
                                          "3 delivered")  # fmt: skip
                assert (sub["next_id"], sub["latest_id"]) == (4, 10)
                assert (sub["demand"], sub["lag"], sub["unbounded"]) == (0, 7, False)
                labels = {"subscription": str(sub["id"]), "protocol": "rsio", "stream": "lag",
                          "connection": str(conn)}  # fmt: skip
                m = await s.metrics()
                assert m.one("tidewire_subscription_lag_events", **labels) == 7
                assert m.one("tidewire_subscription_demand", **labels) == 0
                assert m.one("tidewire_subscriptions", protocol="rsio") == 1
                overview = await s.api("/api/overview")
                assert overview["subscriptions"]["rsio"] == 1

                writer.write(bytes(encode(Request(1, 7))))  # the rest
                rest = await read_rsio(reader, decoder, 7)
                assert len(rest) == 7
                (sub,) = await eventually(lambda: s.subscriptions("lag"), delivered(10),
                                          "10 delivered")  # fmt: skip
                assert (sub["lag"], sub["demand"], sub["next_id"]) == (0, 0, 11)
                m = await s.metrics()
                assert m.one("tidewire_subscription_lag_events", **labels) == 0

                writer.write(bytes(encode(Request(1, MAX_DEMAND))))
                (sub,) = await eventually(lambda: s.subscriptions("lag"),
                                          lambda subs: subs[0]["unbounded"], "unbounded demand")
                assert sub["demand"] == MAX_DEMAND
                m = await s.metrics()
                assert m.one("tidewire_subscription_demand", **labels) == float(MAX_DEMAND)

                writer.write(bytes(encode(Cancel(1))))
                await eventually(lambda: s.subscriptions("lag"), lambda subs: subs == [],
                                 "the cancelled subscription to go")  # fmt: skip
                m = await s.metrics()
                assert m.find("tidewire_subscription_lag_events", stream="lag") == []
                assert m.find("tidewire_subscription_demand", stream="lag") == []
                assert m.one("tidewire_subscriptions", protocol="rsio") == 0

                # one that is closed with its connection goes too
                writer.write(bytes(encode(Subscribe("lag", 2, 1))))
                await eventually(lambda: s.subscriptions("lag"),
                                 lambda subs: len(subs) == 1 and subs[0]["lag"] == 9,
                                 "a second subscription")  # fmt: skip
            finally:
                writer.close()
            await eventually(lambda: s.subscriptions("lag"), lambda subs: subs == [],
                             "the closed connection's subscription to go")  # fmt: skip
            overview = await s.api("/api/overview")
            assert overview["subscriptions"]["rsio"] == 0

    run(main())


# --------------------------------------------------------------------------- connections


def test_connections_per_protocol_rise_and_fall(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path, access=Access(None, TOKENS)) as s:
            gauge = "tidewire_connections"
            base = await s.metrics()
            baseline = {p: base.one(gauge, protocol=p) for p in CONNECTION_PROTOCOLS}
            assert baseline == {"rsio": 0, "http": 1, "tube": 0, "tolliver": 0, "seguro": 0}
            # (http: this test's own admin session)
            rsio_client = await tidewire.connect(s.rsio_url, token=ALICE)
            tube_client = await tube.connect(s.tube_url, token=ALICE)  # on the upgrade
            other = aiohttp.ClientSession()
            ship = await seguro.connect(s.seguro_url, "~zod")
            instance = s.instance("remote")
            try:
                await rsio_client.ready()
                async with other.get(s.base + "/healthz") as r:  # kept alive afterwards
                    assert r.status == 200
                await instance.connect(HOST, s.tolliver.port)
                opened = {"rsio": 1, "http": 2, "tube": 1, "tolliver": 1, "seguro": 1}

                async def counts() -> dict[str, float]:
                    m = await s.metrics()
                    return {p: m.one(gauge, protocol=p) for p in CONNECTION_PROTOCOLS}

                await eventually(counts, lambda c: c == opened, "a connection per protocol")
                overview = await s.api("/api/overview")
                assert overview["connections"] == opened

                await rsio_client.publish("c", [b"x"])  # bytes both ways
                entry = rsio_entry = await s.connection(local_port(rsio_client.writer))
                assert entry["protocol"] == "rsio"
                assert entry["principal"] == "token:alice"
                assert entry["bytes_in"] > 0
                assert entry["bytes_out"] > 0
                assert entry["tls"] is False
                assert abs(entry["opened_at"] - time.time() * 1000) < 60_000
                stream = cast(tube.TubeStream, tube_client.reader)
                entry = tube_entry = await s.connection(local_port(stream.ws))
                assert entry["protocol"] == "tube"
                assert entry["principal"] == "token:alice"
                assert entry["bytes_in"] > 0
                assert entry["bytes_out"] > 0
                entry = await s.connection(local_port(ship.writer))
                assert entry["protocol"] == "seguro"
                assert entry["principal"] == "anonymous"
                assert entry["bytes_in"] > 0
                assert entry["bytes_out"] > 0
                (link,) = instance.links.values()
                assert link.transport is not None
                entry = await s.connection(local_port(link.transport))
                assert entry["protocol"] == "tolliver"
                assert entry["bytes_in"] > 0
                assert entry["bytes_out"] > 0
                listed = await s.connections()
                assert len({c["id"] for c in listed}) == len(listed) == 6
                assert all(isinstance(c["id"], int) for c in listed)
                http = [c for c in listed if c["protocol"] == "http"]
                assert len(http) == 2
                assert all(c["principal"] is None for c in http)
                # each subscription names its connection
                over_rsio = rsio_client.subscribe("c")
                over_tube = tube_client.subscribe("c")
                assert len(await anext(over_rsio)) == len(await anext(over_tube)) == 1
                subs = {sub["protocol"]: sub["connection"] for sub in await s.subscriptions("c")}
                assert subs == {"rsio": rsio_entry["id"], "tube": tube_entry["id"]}
                await over_rsio.aclose()
                await over_tube.aclose()
            finally:
                await rsio_client.close()
                await tube_client.close()
                await other.close()
                await ship.close()
                await instance.close()
            await eventually(counts, lambda c: c == baseline, "every connection to close")
            assert [c["protocol"] for c in await s.connections()] == ["http"]

    run(main())


def test_refused_connections_are_counted_by_listener(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        hub = Hub.open(str(tmp_path), LogConfig(fsync=False))
        admission = Admission(ConnectionLimits(max_connections=1))
        server = await start_rsio_server(hub, HOST, 0, admission=admission)
        try:
            kept = await asyncio.open_connection(HOST, server.port)
            await until(lambda: len(list(server.listener.open_connections())) == 1, "admitted")
            reader, writer = await asyncio.open_connection(HOST, server.port)
            await reader.read()  # (until the hub closes it, after its refusal)
            writer.close()
            samples = Samples(generate_latest(registry(hub)).decode())
            assert samples.one("tidewire_connections_refused_total", listener="rsio") == 1
            assert samples.one("tidewire_connections", protocol="rsio") == 1
            kept[1].close()
        finally:
            await server.close()
            await hub.close()

    run(main())


# --------------------------------------------------------------------------- Tolliver




def test_tolliver_unacked_and_resends(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s:
            remote = await RawRemote.open(s.tolliver.port, "t.u")
            peer = str(remote.uuid)
            await until(lambda: remote.uuid in s.tolliver.by_peer, "the hub's link")
            link = s.tolliver.by_peer[remote.uuid]
            await until(lambda: "t.u" in link.channels, "the hub to follow t.u")
            await s.hub.append(Batch.build("t.u", values("u", 5)), assign_ids=True)
            await remote.until_received(5)
            m = await s.metrics()
            assert m.one("tidewire_tolliver_unacked", peer=peer) == 5
            resends_before = m.one("tidewire_tolliver_resends_total", peer=peer)
            assert m.one(SENT, stream="t.u", protocol="tolliver") == 5
            tolliver = await s.api("/api/tolliver")
            assert tolliver["instance"] == str(s.tolliver.instance)
            (entry,) = [p for p in tolliver["peers"] if p["uuid"] == peer]
            assert entry["connected"] is True
            assert entry["channels"] == ["t.u"]
            assert entry["unacked"] == 5
            assert entry["address"] == f"{HOST}:{local_port(remote.writer)}"
            (sub,) = await s.subscriptions("t.u")
            assert sub["protocol"] == "tolliver"
            conn = await s.connection(local_port(remote.writer))
            assert (conn["protocol"], sub["connection"]) == ("tolliver", conn["id"])

            # past the resend interval (a fake time): all five again, counted as resends
            link.handle_timer(time.monotonic() + 5 * link.conn.resend_interval)
            await remote.until_received(10)
            ids = [r.message.id for r in remote.received]
            assert len(set(ids[:5])) == 5
            assert set(ids[5:10]) == set(ids[:5])
            m = await s.metrics()
            assert m.one("tidewire_tolliver_resends_total", peer=peer) - resends_before >= 5
            assert m.one("tidewire_tolliver_unacked", peer=peer) == 5
            assert m.one(SENT, stream="t.u", protocol="tolliver") == 5  # resends are not events
            resends = m.one("tidewire_tolliver_resends_total", peer=peer)

            remote.ack(*ids[:2])  # the first two: the offset moves (kept for the next time)

            async def unacked() -> float:
                return (await s.metrics()).one("tidewire_tolliver_unacked", peer=peer)

            await eventually(unacked, lambda n: n == 3, "3 unacked")
            await until(lambda: s.tolliver.offsets.get((remote.uuid, "t.u")) == 3, "offset")
            remote.writer.close()
            await until(lambda: link not in s.tolliver.links, "the link to be gone")
            tolliver = await eventually(
                lambda: s.api("/api/tolliver"),
                lambda t: any(p["uuid"] == peer and not p["connected"] for p in t["peers"]),
                "the peer to be away")  # fmt: skip
            (entry,) = [p for p in tolliver["peers"] if p["uuid"] == peer]
            assert entry == {"uuid": peer, "address": None, "connected": False,
                             "channels": ["t.u"], "unacked": 0, "resends": entry["resends"]}
            assert entry["resends"] >= resends  # counted across its connections
            m = await s.metrics()
            assert m.one("tidewire_tolliver_unacked", peer=peer) == 0
            assert m.one("tidewire_tolliver_resends_total", peer=peer) == entry["resends"]
            assert (await s.subscriptions("t.u")) == []

    run(main())


def test_tolliver_resends_never_go_backwards_while_a_remote_leaves(
    tmp_path: Path, run: Run
) -> None:
    """The remote's EOF is handed to the hub's link as the loop would (``eof_received``); a
    scrape before the loop runs ``connection_lost`` must not see fewer resends."""

    async def main() -> None:
        async with stack(tmp_path) as s:
            remote = await RawRemote.open(s.tolliver.port, "t.r")
            peer = str(remote.uuid)
            await until(lambda: remote.uuid in s.tolliver.by_peer, "the hub's link")
            link = s.tolliver.by_peer[remote.uuid]
            await until(lambda: "t.r" in link.channels, "the hub to follow t.r")
            await s.hub.append(Batch.build("t.r", values("r", 3)), assign_ids=True)
            await remote.until_received(3)
            remote.ack(remote.received[0].message.id)  # an offset: listed once away
            await until(lambda: (remote.uuid, "t.r") in s.tolliver.offsets, "the offset")
            link.handle_timer(time.monotonic() + 5 * link.conn.resend_interval)
            await remote.until_received(5)

            def resends() -> float:
                samples = Samples(generate_latest(registry(s.hub)).decode())
                return samples.one("tidewire_tolliver_resends_total", peer=peer)

            before = resends()
            assert before >= 2
            link.eof_received()  # the remote closed its side
            assert resends() >= before
            remote.writer.close()

    run(main())


def test_tolliver_counts_only_what_a_keyed_remote_is_sent(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s:
            remote = await RawRemote.open(s.tolliver.port, "t.k", key="a")
            await until(lambda: remote.uuid in s.tolliver.by_peer, "the hub's link")
            link = s.tolliver.by_peer[remote.uuid]
            await until(lambda: "t.k" in link.channels, "the hub to follow t.k")
            await s.hub.append(Batch.build("t.k", [b"1", b"2", b"3", b"4"],
                                           keys=[b"a", b"b", b"a", b"b"]), assign_ids=True)
            await remote.until_received(2)
            assert [r.message.body for r in remote.received] == [b"1", b"3"]
            m = await s.metrics()
            assert m.one(SENT, stream="t.k", protocol="tolliver") == 2
            (sub,) = await s.subscriptions("t.k")
            assert sub["delivered"] == 2
            remote.writer.close()

    run(main())


# --------------------------------------------------------------------------- the log


def test_log_latency_histograms_and_sizes(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path, log=LogConfig(fsync=True)) as s:
            before = await s.metrics()
            appends = before.one("tidewire_log_append_seconds_count")
            fsyncs = before.one("tidewire_log_fsync_seconds_count")
            for i in range(6):
                await s.hub.append(Batch.build("h", values(str(i), 3)), assign_ids=True)
            m = await s.metrics()
            assert m.one("tidewire_log_append_seconds_count") - appends == 6
            assert 1 <= m.one("tidewire_log_fsync_seconds_count") - fsyncs <= 6
            assert m.one("tidewire_log_fsync_seconds_sum") > 0
            buckets = m.find("tidewire_log_append_seconds_bucket")
            assert {b.labels["le"] for b in buckets} >= {"0.001", "+Inf"}
            inf = m.one("tidewire_log_append_seconds_bucket", le="+Inf")
            assert inf == m.one("tidewire_log_append_seconds_count")
            (row,) = [r for r in await s.api("/api/streams") if r["name"] == "h"]
            assert m.one("tidewire_log_size_bytes", stream="h") == row["bytes"] > 0
            assert m.one("tidewire_log_events", stream="h") == row["events"] == 18
            assert m.one("tidewire_stream_latest_id", stream="h") == row["latest_id"] == 18
            assert row["segments"] >= 1
            assert m.one("process_resident_memory_bytes") > 0

    run(main())


def test_no_fsync_no_fsync_observations(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path, log=LogConfig(fsync=False)) as s:
            before = (await s.metrics()).one("tidewire_log_fsync_seconds_count")
            for _ in range(3):
                await s.hub.append(Batch.build("nf", [b"x"]), assign_ids=True)
            m = await s.metrics()
            assert m.one("tidewire_log_fsync_seconds_count") == before
            assert m.one("tidewire_log_events", stream="nf") == 3

    run(main())


# --------------------------------------------------------------------------- rates


def test_rates_are_deltas_over_the_sampled_seconds() -> None:
    m = Metrics(rate_window_seconds=10.0)
    assert m.rates() == (0.0, 0.0, 0.0, 0.0)
    m.received("rsio", "a", 100, 1000)
    m.sample(50.0)
    assert m.rates() == (0.0, 0.0, 0.0, 0.0)  # one sample: no rate yet
    assert m.rates("a") == (0.0, 0.0, 0.0, 0.0)
    m.received("rsio", "a", 30, 300)
    m.received("tube", "a", 10, 100)  # every protocol of the stream
    m.sent("seguro", "a", 8, 64)
    m.received("api", "b", 4, 40)
    m.sample(52.0)
    assert m.rates("a") == (20.0, 200.0, 4.0, 32.0)
    assert m.rates("b") == (2.0, 20.0, 0.0, 0.0)  # (b had no first sample: from zero)
    assert m.rates() == (22.0, 220.0, 4.0, 32.0)
    assert m.rates("nothing") == (0.0, 0.0, 0.0, 0.0)
    assert m.totals("a") == (140, 1400, 8, 64)


def test_two_samples_at_the_same_time_give_no_rate() -> None:
    m = Metrics()
    m.sample(5.0)
    m.received("rsio", "a", 10, 10)
    m.sample(5.0)
    assert m.rates() == (0.0, 0.0, 0.0, 0.0)


def test_the_window_drops_old_samples() -> None:
    m = Metrics(rate_window_seconds=10.0)
    for second in range(31):  # 10 events a second for 20 s, then nothing for 10 s
        m.sample(float(second))
        if second < 20:
            m.received("rsio", "a", 10, 100)
    assert m.rates("a") == (0.0, 0.0, 0.0, 0.0)  # the last 10 s saw nothing
    assert len(m.samples) == 11  # t=20..30
    m.received("rsio", "a", 50, 500)
    m.sample(31.0)
    assert m.rates("a") == (5.0, 50.0, 0.0, 0.0)  # 50 over the 10 s from t=21 to t=31
    # a long gap: the two newest samples are kept
    m.received("rsio", "a", 90, 900)
    m.sample(1000.0)
    assert len(m.samples) == 2
    assert m.rates("a") == pytest.approx((90 / 969, 900 / 969, 0.0, 0.0))


def test_lag_never_goes_below_zero() -> None:
    assert subscription_lag(10, 4) == 7
    assert subscription_lag(10, 11) == 0
    assert subscription_lag(10, 50) == 0  # a subscription from an id beyond the stream's end
    assert subscription_lag(0, 1) == 0


def test_the_memory_budget_is_exported(tmp_path: Path, run: Run) -> None:
    async def go() -> None:
        hub = Hub.open(str(tmp_path))
        try:
            held = hub.budget.share("token:a", "peer")
            held.hold("inbound", 1000)
            held.hold("outbound", 24)
            other = hub.budget.share()
            other.hold("inbound", 5)
            assert not other.try_hold("readahead", hub.budget.limits.connection)
            m = Samples(generate_latest(registry(hub)).decode())
            assert m.one("tidewire_memory_held_bytes", kind="inbound") == 1005
            assert m.one("tidewire_memory_held_bytes", kind="outbound") == 24
            assert m.one("tidewire_memory_refused_total") == 1
            assert m.one("tidewire_memory_budget_bytes", share="connection") \
                == hub.budget.limits.connection  # fmt: skip
            held.close()
            other.close()
            m = Samples(generate_latest(registry(hub)).decode())
            assert m.find("tidewire_memory_held_bytes") == []
        finally:
            await hub.close()

    run(go())


def test_the_api_shows_the_sampled_rates(tmp_path: Path, run: Run) -> None:
    """The hub is not started: its sampler does not run; the test samples with a fake clock."""

    async def main() -> None:
        async with stack(tmp_path) as s:
            overview = await s.api("/api/overview")
            assert overview["events_in_rate"] == 0.0  # no samples yet
            s.hub.metrics.sample(1000.0)
            await s.hub.append(Batch.build("r", values("r", 40)), assign_ids=True)
            s.hub.metrics.sample(1004.0)
            (row,) = [r for r in await s.api("/api/streams") if r["name"] == "r"]
            assert row["events_in_rate"] == 10.0
            assert row["bytes_in_rate"] == row["bytes_in"] / 4
            assert (row["events_out_rate"], row["bytes_out_rate"]) == (0.0, 0.0)
            overview = await s.api("/api/overview")
            assert overview["events_in_rate"] == 10.0
            assert overview["bytes_in_rate"] == row["bytes_in"] / 4

    run(main())


def test_every_protocol_has_a_zero_series(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s:
            m = await s.metrics()
            for p in SUBSCRIPTION_PROTOCOLS:
                assert m.one("tidewire_subscriptions", protocol=p) == 0
            for p in CONNECTION_PROTOCOLS:
                assert m.one("tidewire_connections", protocol=p) == (1 if p == "http" else 0)
            assert {s.labels["listener"] for s in m.find("tidewire_connections_refused_total")} \
                == {"http", "rsio", "tolliver", "seguro"}

    run(main())


def test_the_fair_shares_of_the_loop_are_exported(tmp_path: Path, run: Run) -> None:
    async def go() -> None:
        hub = Hub.open(str(tmp_path))
        now = [100.0]
        hub.budget = Budget(loop=LoopShares(FairnessLimits(busy=0.5), clock=lambda: now[0]))
        try:
            waits = 0.0
            for _ in range(200):  # 2 s: "token:a" at 80 % of the loop, anonymous at 15 %
                now[0] += 0.01
                waits += hub.budget.share("token:a").spend(0.008)
                hub.budget.share().spend(0.0015)
            m = Samples(generate_latest(registry(hub)).decode())
            assert m.one("tidewire_loop_share", principal="token:a") == pytest.approx(0.8, 0.05)
            assert m.one("tidewire_loop_share", principal="anonymous") == pytest.approx(0.15, 0.05)
            assert m.one("tidewire_loop_busy") == pytest.approx(0.95, 0.05)
            assert m.one("tidewire_fair_waits_total") > 0
            assert m.one("tidewire_fair_wait_seconds_total") == pytest.approx(waits)
        finally:
            await hub.close()

    run(go())
