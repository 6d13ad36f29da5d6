"""Stream administration in cluster mode (issue 23; cluster/admin.py, docs/cluster.md "Stream
administration"): two gateways (JetStreamStorage, then hubs with the admin API on 127.0.0.1)
over the session's 3-node cluster; what one creates, re-configures or deletes, the other sees,
a gateway connecting later too; runtime retention applied by the other's retention pass;
delete then create again starts at id 1, also while another gateway keeps appending."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import tidewire
from cluster_procs import unique, with_storages
from helpers import run, until
from tidewire.client.rsio import RsioError
from tidewire.cluster.jetstream import JetStreamStorage
from tidewire.cluster.local import LocalCluster, free_port
from tidewire.cluster.subjects import admin_subject
from tidewire.hub import Hub, StreamDeleted
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.log import LogConfig, StreamExists, StreamSettings
from tidewire.model import Batch, UnknownStream
from tidewire.server.app import build_app
from tidewire.server.rsio import start_rsio_server

SECONDS = 20.0  # a notification between gateways on one machine: milliseconds; bounded


def name(what: str) -> str:
    return unique(f"adm.{what}")


async def ids(storage: JetStreamStorage, stream: str) -> list[int]:
    out: list[int] = []
    next_id = storage.start_id(stream)
    while batches := await storage.read(stream, next_id, 1 << 20, 10_000):
        out += [int(i) for b in batches for i in b.ids]
        next_id = batches[-1].last_id + 1
    return out


def test_a_stream_created_through_one_gateway_exists_on_the_other_and_after_a_restart(
    cluster: LocalCluster,
) -> None:
    made, plain, written = name("made"), name("plain"), name("written")
    config = LogConfig(streams={plain: StreamSettings(retention_ms=5000)})

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        await a.create_stream(made, 60_000, None, runtime=True)
        await a.create_stream(plain)
        assert made in a
        assert a.latest(made) == 0
        await until(lambda: made in b and plain in b, "the other gateway knows them", SECONDS)
        assert b.retention(made) == a.retention(made)
        assert (b.retention(made).ms, b.retention(made).bytes) == (60_000, None)
        assert b.retention(made).source == "runtime"
        assert (b.retention(plain).ms, b.retention(plain).source) == (5000, "config")
        assert {made, plain} <= set(b.streams())
        assert next(x for x in b.stats() if x.name == made).events == 0
        with pytest.raises(StreamExists):  # through the other gateway
            await b.create_stream(made)
        await b.append(Batch.build(written, [b"x"]), assign_ids=True)  # (on first append)
        with pytest.raises(StreamExists):  # records, no entry: exists too
            await a.create_stream(written)
        first = await b.append(Batch.build(made, [b"one", b"two"]), assign_ids=True)
        assert first.first_id == 1  # a created stream starts at id 1 as any other
        # a gateway connecting later (a restarted one) loads the entries
        c = await JetStreamStorage.connect(cluster.urls, config=config)
        try:
            assert made in c
            assert plain in c
            assert c.retention(made).source == "runtime"
            assert c.latest(made) == 2
            assert c.retention(plain).source == "config"
        finally:
            await c.close()

    with_storages(cluster, 2, body, config=config)


def test_two_gateways_creating_one_stream_at_once_one_wins(cluster: LocalCluster) -> None:
    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        for round_ in range(5):
            s = name(f"race{round_}")
            results = await asyncio.gather(a.create_stream(s, 1000, None, runtime=True),
                                           b.create_stream(s), return_exceptions=True)  # fmt: skip
            assert sorted(type(r).__name__ for r in results) == ["NoneType", "StreamExists"]
            source = "runtime" if results.index(None) == 0 else "default"

            def agree(s: str = s, source: str = source) -> bool:
                return a.retention(s).source == b.retention(s).source == source

            await until(agree, "both gateways agree on the winner", SECONDS)

    with_storages(cluster, 2, body, 120)


def test_runtime_retention_set_through_one_gateway_is_applied_by_the_other(
    cluster: LocalCluster,
) -> None:
    s, unknown = name("kept"), name("none")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        for i in range(20):
            await a.append(Batch.build(s, [b"%04d" % i * 100]), assign_ids=True)
        assert a.retention(s).source == "default"
        assert await b.retention_pass(now=20_000) == 0  # no limit yet
        await a.set_retention(s, None, 3000)
        assert (a.retention(s).bytes, a.retention(s).source) == (3000, "runtime")
        await until(lambda: b.retention(s).source == "runtime", "b learns it", SECONDS)
        assert (b.retention(s).ms, b.retention(s).bytes) == (None, 3000)
        assert await b.retention_pass(now=20_000) > 0  # the other gateway's pass applies it
        start = b.start_id(s)
        assert 1 < start <= 20
        assert await ids(b, s) == list(range(start, 21))
        (stats,) = [x for x in b.stats() if x.name == s]
        assert 3000 <= stats.bytes < 3000 + 600  # whole records: at least the limit kept
        await b.set_retention(s, 1000, None)  # changed again, through the other one
        await until(lambda: a.retention(s).ms == 1000, "a learns the change", SECONDS)
        assert a.retention(s).bytes is None
        with pytest.raises(UnknownStream):
            await a.set_retention(unknown, 1, 1)
        # a restarted gateway keeps it: it is in the cluster, not in a gateway
        c = await JetStreamStorage.connect(cluster.urls)
        try:
            assert (c.retention(s).ms, c.retention(s).bytes, c.retention(s).source) == (
                1000, None, "runtime")  # fmt: skip
        finally:
            await c.close()
        # one message per stream: older entries are purged when a newer one is stored
        info = await a.api.call(f"$JS.API.STREAM.INFO.{a.catalog.head(s).jetstream}",
                                {"subjects_filter": admin_subject(s, a.shards)})  # fmt: skip
        assert info["state"]["subjects"] == {admin_subject(s, a.shards): 1}

    with_storages(cluster, 2, body, 120)


def test_delete_through_one_gateway_ends_the_others_waiters_and_starts_again_at_one(
    cluster: LocalCluster,
) -> None:
    s, unknown = name("gone"), name("never")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        await a.create_stream(s, None, 1 << 20, runtime=True)
        for i in range(10):
            await a.append(Batch.build(s, [b"old%d" % i]), assign_ids=True)
        await until(lambda: b.latest(s) == 10, "b follows", SECONDS)
        assert await ids(b, s) == list(range(1, 11))  # (b remembers read positions)
        waiter = asyncio.ensure_future(b.wait_for(s, 10))
        await asyncio.sleep(0)
        await a.delete_stream(s)
        assert s not in a
        assert a.latest(s) == 0
        with pytest.raises(StreamDeleted):
            await asyncio.wait_for(waiter, SECONDS)
        assert s not in b
        assert b.latest(s) == 0
        assert s not in b.streams()
        assert b.retention(s).source == "default"  # its runtime retention went with it
        with pytest.raises(UnknownStream):
            await b.delete_stream(s)
        with pytest.raises(UnknownStream):
            await a.delete_stream(unknown)
        # made again, through the other gateway: from id 1, none of the old events
        stored = await b.append(Batch.build(s, [b"new1", b"new2"]), assign_ids=True)
        assert (stored.first_id, stored.last_id) == (1, 2)
        await until(lambda: a.latest(s) == 2, "a sees the new stream", SECONDS)
        assert await ids(a, s) == [1, 2]
        batches = await a.read(s, 1, 1 << 20, 100)
        assert [bytes(b.value(i)) for b in batches for i in range(len(b))] == [b"new1", b"new2"]
        await a.delete_stream(s)
        await a.create_stream(s)
        await until(lambda: s in b and b.latest(s) == 0, "b: created again, empty", SECONDS)
        assert (await b.append(Batch.build(s, [b"x"]), assign_ids=True)).first_id == 1
        c = await JetStreamStorage.connect(cluster.urls)  # (and a later gateway agrees)
        try:
            assert c.latest(s) == 1
            assert c.start_id(s) == 1
        finally:
            await c.close()

    with_storages(cluster, 2, body, 120)


def test_a_delete_racing_appends_through_the_other_gateway_leaves_a_stream_from_id_one(
    cluster: LocalCluster,
) -> None:
    s = name("race")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        for i in range(50):
            await b.append(Batch.build(s, [b"old%d" % i]), assign_ids=True)
        stop = asyncio.Event()
        stored: list[tuple[int, int]] = []

        async def keep_appending() -> None:
            n = 0
            while not stop.is_set() and n < 20_000:  # (the delete may take 2,000 of them)
                batch = await b.append(Batch.build(s, [b"v%d" % n]), assign_ids=True)
                stored.append((batch.first_id, n))
                n += 1

        appender = asyncio.ensure_future(keep_appending())
        await until(lambda: len(stored) >= 20, "appends flowing", SECONDS)
        await a.delete_stream(s)
        after = len(stored)
        await until(lambda: len(stored) >= after + 20 or appender.done(),
                    "appends after the delete", SECONDS)  # fmt: skip
        if appender.done():
            raise AssertionError(f"the appender ended after {len(stored)} appends: "
                                 f"{appender.exception()!r}")  # fmt: skip
        stop.set()
        await asyncio.wait_for(appender, SECONDS)
        # whatever landed after the purge is a stream from id 1: contiguous, never a
        # continuation of the old ids
        await until(lambda: a.latest(s) == b.latest(s), "both agree on the head", SECONDS)
        got = await ids(a, s)
        assert got == list(range(1, len(got) + 1)), got[:5]
        assert len(got) >= 20
        assert b.start_id(s) == a.start_id(s) == 1
        restarted = [n for first, n in stored if first == 1]
        assert len(restarted) == 1, restarted  # the new stream's first append, once

    with_storages(cluster, 2, body, 120)


# ---------------------------------------------------------------------- the admin API

OPS, OPS_TABLE = mint_token("ops")
ACL = '[principal."token:ops"]\nadmin = ["adm.*"]\nmonitor = true\nread = ["*"]\n'
HEADERS = {"X-Tidewire-Request": "1", "Content-Type": "application/json",
           "Authorization": f"Bearer {OPS}"}  # fmt: skip


@asynccontextmanager
async def gateway(cluster: LocalCluster) -> AsyncIterator[tuple[Hub, str]]:
    """A hub on JetStream with its HTTP app on a free port: ``(hub, base URL)``."""
    hub = Hub(await JetStreamStorage.connect(cluster.urls))
    runner = web.AppRunner(build_app(hub, access=Access(Acl.parse(ACL),
                                                        Tokens.parse(OPS_TABLE))),
                           handle_signals=False, access_log=None)  # fmt: skip
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield hub, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await hub.close()


async def call(http: aiohttp.ClientSession, method: str, url: str,
               body: Any = None) -> tuple[int, Any]:  # fmt: skip
    data = None if body is None else json.dumps(body).encode()
    async with http.request(method, url, data=data, headers=HEADERS) as response:
        text = await response.text()
        return response.status, json.loads(text) if text else None


def test_the_admin_api_in_cluster_mode_answers_through_either_gateway(
    cluster: LocalCluster,
) -> None:
    s = name("api")

    async def main() -> None:
        async with gateway(cluster) as (hub_a, a), gateway(cluster) as (hub_b, b), \
                aiohttp.ClientSession() as http:  # fmt: skip
            status, body = await call(http, "POST", f"{a}/api/streams",
                                      {"name": s, "retention_ms": 3_600_000})  # fmt: skip
            assert status == 201, body
            assert body == {"name": s, "retention": {"ms": 3_600_000, "bytes": None,
                                                     "source": "runtime"}}  # fmt: skip
            await until(lambda: hub_b.has_stream(s), "gateway b knows it", SECONDS)
            status, body = await call(http, "POST", f"{b}/api/streams", {"name": s})
            assert status == 409, body
            status, body = await call(http, "PATCH", f"{b}/api/streams/{s}",
                                      {"retention_bytes": 4096})  # fmt: skip
            assert status == 200, body
            assert body["retention"] == {"ms": 3_600_000, "bytes": 4096, "source": "runtime"}
            await until(lambda: (r := hub_a.retention(s)) is not None and r.bytes == 4096,
                        "gateway a learns the change", SECONDS)  # fmt: skip
            async with http.get(f"{a}/api/streams", headers=HEADERS) as response:
                listed = {x["name"]: x for x in await response.json()}
            assert listed[s]["retention"] == {"ms": 3_600_000, "bytes": 4096,
                                              "source": "runtime"}  # fmt: skip
            await hub_a.append(Batch.build(s, [b"x"]), assign_ids=True)
            status, body = await call(http, "DELETE", f"{b}/api/streams/{s}")
            assert (status, body) == (200, {"deleted": s})
            await until(lambda: not hub_a.has_stream(s), "gateway a forgets it", SECONDS)
            status, body = await call(http, "DELETE", f"{a}/api/streams/{s}")
            assert status == 404, body
            status, body = await call(http, "PATCH", f"{a}/api/streams/{s}",
                                      {"retention_ms": 1})  # fmt: skip
            assert status == 404, body

    run(main(), 120)


def test_a_live_rsio_subscriber_of_the_other_gateway_is_told_the_stream_was_deleted(
    cluster: LocalCluster,
) -> None:
    s = name("sub")

    async def main() -> None:
        hub_a = Hub(await JetStreamStorage.connect(cluster.urls))
        hub_b = Hub(await JetStreamStorage.connect(cluster.urls))
        server = await start_rsio_server(hub_b, "127.0.0.1", 0)
        try:
            await hub_a.append(Batch.build(s, [b"a"]), assign_ids=True)
            got: list[bytes] = []
            async with await tidewire.connect(f"rsio://127.0.0.1:{server.port}") as client:

                async def consume() -> None:
                    async for batch in client.subscribe(s):
                        got.extend(batch.value(i) for i in range(len(batch)))
                        await until(lambda: hub_b.live_subscriptions() != [], "live", SECONDS)
                        await hub_a.delete_stream(s)  # (through the other gateway)

                with pytest.raises(RsioError, match="stream deleted"):
                    await asyncio.wait_for(consume(), SECONDS)
            assert got == [b"a"]
        finally:
            await server.close()
            for hub in (hub_a, hub_b):
                await hub.close()

    run(main(), 120)


def test_a_gateway_that_missed_the_tombstone_finds_it_on_its_next_append(
    cluster: LocalCluster,
) -> None:
    s = name("missed")

    async def body(a: JetStreamStorage, b: JetStreamStorage) -> None:
        for i in range(5):
            await b.append(Batch.build(s, [b"old%d" % i]), assign_ids=True)
        await until(lambda: a.latest(s) == 5, "a follows", SECONDS)
        head = b.catalog.heads[s]
        stale = (head.last, head.first, head.records)
        await a.delete_stream(s)
        await until(lambda: s not in b, "b hears of it", SECONDS)
        # as if b had never heard (a notification lost): its head says the old records
        head.last, head.first, head.records = stale
        head.fence_seq = 0
        assert b.latest(s) == 5
        c = await JetStreamStorage.connect(cluster.urls)  # (a gateway starting now)
        try:
            assert s not in c
            assert c.latest(s) == 0
            stored = await b.append(Batch.build(s, [b"new"]), assign_ids=True)
            assert stored.first_id == 1  # the tombstone, found by the refused append
            assert head.fence_seq > 0
            await until(lambda: c.latest(s) == 1, "c sees the new stream", SECONDS)
            assert c.start_id(s) == 1
            got = await c.read(s, 1, 1 << 20, 10)
            assert [bytes(x.value(i)) for x in got for i in range(len(x))] == [b"new"]
        finally:
            await c.close()

    with_storages(cluster, 2, body, 120)
