"""The admin API's writes over real HTTP on 127.0.0.1 (server/admin_streams.py): create,
change retention, delete, each only with the ACL's ``admin`` right (never without an ACL),
each audited as a ``tidewire.audit`` line and a ``_tidewire.audit`` record; a cross-site
attempt refused before the route; live RS.io subscribers (over TCP and HTTP) told ``stream
deleted``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import tidewire
from browser import hub_app
from helpers import hub_server, run, until
from tidewire.client.http import HttpHub, HttpRsioError
from tidewire.client.rsio import RsioError
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.log import LogConfig, StreamSettings
from tidewire.model import Batch
from tidewire.server.admin_streams import AUDIT_STREAM

ADMIN = {"X-Tidewire-Request": "1", "Content-Type": "application/json"}
OPS, OPS_TABLE = mint_token("ops")
ALICE, ALICE_TABLE = mint_token("alice")
ACL = ('[principal."token:ops"]\nadmin = ["orders*"]\nmonitor = true\n'
       '[principal."token:alice"]\nread = ["*"]\nwrite = ["*"]\nmonitor = true\n')  # fmt: skip


def _access() -> Access:
    return Access(Acl.parse(ACL), Tokens.parse(OPS_TABLE + ALICE_TABLE))


def _as(token: str | None) -> dict[str, str]:
    return {**ADMIN, **({"Authorization": f"Bearer {token}"} if token else {})}


async def _call(http: aiohttp.ClientSession, method: str, url: str, token: str | None,
                body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:  # fmt: skip
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    async with http.request(method, url, data=data, headers=_as(token)) as response:
        text = await response.text()
        assert response.headers["Cache-Control"] == "no-store"
        return response.status, json.loads(text) if text else None


async def _audit(hub: Hub) -> list[dict[str, Any]]:
    batches = await hub.read(AUDIT_STREAM, 1)
    return [json.loads(b.value(i)) for b in batches for i in range(len(b))]


def test_admin_writes_with_the_right_and_their_audit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidewire.audit")

    async def main() -> None:
        async with hub_app(tmp_path / "d", _access(), sampler=False) as (hub, base), \
                aiohttp.ClientSession() as http:  # fmt: skip
            api = f"{base}/api/streams"
            status, body = await _call(http, "POST", api, OPS,
                                       {"name": "orders1", "retention_ms": 60000})  # fmt: skip
            assert status == 201, body
            assert body == {"name": "orders1",
                            "retention": {"ms": 60000, "bytes": None, "source": "runtime"}}
            assert hub.has_stream("orders1")
            # GET /api/streams says which retention applies
            async with http.get(api, headers={"Authorization": f"Bearer {OPS}"}) as response:
                listed = {s["name"]: s for s in await response.json()}
            assert listed["orders1"]["retention"]["source"] == "runtime"
            status, body = await _call(http, "PATCH", f"{api}/orders1", OPS,
                                       {"retention_bytes": 1 << 20})  # fmt: skip
            assert status == 200, body
            assert body["retention"] == {"ms": 60000, "bytes": 1 << 20, "source": "runtime"}
            await hub.append(Batch.build("orders1", [b"x"]), assign_ids=True)
            status, body = await _call(http, "DELETE", f"{api}/orders1", OPS)
            assert (status, body) == (200, {"deleted": "orders1"})
            assert not hub.has_stream("orders1")

            # refused: another stream, another principal, anonymous
            await hub.append(Batch.build("other", [b"x"]), assign_ids=True)
            status, body = await _call(http, "DELETE", f"{api}/other", OPS)
            assert status == 403
            assert body == {"error": "refused: may not admin stream 'other'"}
            status, _ = await _call(http, "PATCH", f"{api}/other", ALICE, {"retention_ms": 1})
            assert status == 403
            status, _ = await _call(http, "POST", api, None, {"name": "orders2"})
            assert status == 401
            assert hub.has_stream("other")
            assert not hub.has_stream("orders2")

            records = await _audit(hub)
            assert [(r["principal"], r["action"], r["stream"], r["result"][:7])
                    for r in records] == [
                ("token:ops", "create", "orders1", "ok"),
                ("token:ops", "set_retention", "orders1", "ok"),
                ("token:ops", "delete", "orders1", "ok"),
                ("token:ops", "delete", "other", "refused"),
                ("token:alice", "set_retention", "other", "refused"),
                ("anonymous", "create", "orders2", "refused"),
            ]  # fmt: skip
            assert records[1]["old"] == {"ms": 60000, "bytes": None, "source": "runtime"}
            assert records[1]["new"] == {"ms": 60000, "bytes": 1 << 20, "source": "runtime"}
            assert records[0]["peer"] == "127.0.0.1"
            assert all(isinstance(r["at"], int) for r in records)

    run(main())
    lines = [r.getMessage() for r in caplog.records if r.name == "tidewire.audit"]
    assert len(lines) == 6
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "tidewire.audit")
    assert "token:ops from 127.0.0.1: set_retention stream 'orders1': " in lines[1]
    assert '"bytes": null' in lines[1]
    assert '"bytes": 1048576' in lines[1]
    assert lines[3].endswith("refused: may not admin stream 'other'")
    text = "\n".join(lines)
    assert OPS not in text
    assert ALICE not in text
    assert OPS.split(".")[1] not in text


def test_a_retention_key_not_given_at_creation_is_the_configurations(tmp_path: Path) -> None:
    config = LogConfig(fsync=False, defaults=StreamSettings(retention_bytes=5 << 20),
                       streams={"orders-c": StreamSettings(retention_ms=3_600_000)})  # fmt: skip

    async def main() -> None:
        async with hub_app(tmp_path / "d", _access(), sampler=False, log=config) as (
                hub, base), aiohttp.ClientSession() as http:  # fmt: skip
            api = f"{base}/api/streams"
            status, body = await _call(http, "POST", api, OPS, {"name": "orders-a"})
            assert (status, body["retention"]) == (201, {"ms": None, "bytes": 5 << 20,
                                                         "source": "default"})  # fmt: skip
            status, body = await _call(http, "POST", api, OPS,
                                       {"name": "orders-b", "retention_ms": 60000})  # fmt: skip
            assert (status, body["retention"]) == (201, {"ms": 60000, "bytes": 5 << 20,
                                                         "source": "runtime"})  # fmt: skip
            status, body = await _call(http, "POST", api, OPS,
                                       {"name": "orders-c", "retention_bytes": None})  # fmt: skip
            assert (status, body["retention"]) == (201, {"ms": 3_600_000, "bytes": None,
                                                         "source": "runtime"})  # fmt: skip
            kept = hub.retention("orders-c")
            assert kept is not None
            assert kept.ms == 3_600_000

    run(main())


def test_without_an_acl_admin_is_refused_though_writes_are_open(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_app(tmp_path / "d", sampler=False) as (hub, base), \
                aiohttp.ClientSession() as http:  # fmt: skip
            status, body = await _call(http, "POST", f"{base}/api/streams", None,
                                       {"name": "orders"})  # fmt: skip
            assert status == 403
            assert "no ACL file grants admin" in body["error"]
            assert not hub.has_stream("orders")
            [record] = await _audit(hub)
            assert (record["principal"], record["result"][:7]) == ("anonymous", "refused")

    run(main())


def test_bad_requests_get_json_errors(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_app(tmp_path / "d", _access(), sampler=False) as (hub, base), \
                aiohttp.ClientSession() as http:  # fmt: skip
            api = f"{base}/api/streams"
            assert (await _call(http, "POST", api, OPS, {"name": "orders"}))[0] == 201
            cases: list[tuple[str, str, Any, bytes | None, int, str]] = [
                ("POST", api, {"name": "orders"}, None, 409, "exists already"),
                ("DELETE", f"{api}/orders-none", None, None, 404, "unknown stream"),
                ("PATCH", f"{api}/orders-none", {"retention_ms": 1}, None, 404, "unknown"),
                ("POST", api, None, b"{not json", 400, "not JSON"),
                ("POST", api, [1, 2], None, 400, "JSON object"),
                ("POST", api, {"retention_ms": 5}, None, 400, "must name the stream"),
                ("POST", api, {"name": "orders9", "ttl": 5}, None, 400, "unknown key"),
                ("POST", api, {"name": "orders9", "retention_ms": -1}, None, 400,
                 "non-negative"),
                ("POST", api, {"name": "orders9", "retention_ms": True}, None, 400,
                 "non-negative"),
                ("PATCH", f"{api}/orders", {}, None, 400, "nothing to change"),
                ("POST", api, {"name": "orders x"}, None, 400, "whitespace"),
            ]  # fmt: skip
            for method, url, body, raw, status, says in cases:
                got, answer = await _call(http, method, url, OPS, body, raw)
                assert got == status, (method, url, body, answer)
                assert says in answer["error"], answer
            # the body is bounded: 64 KiB
            big = json.dumps({"name": "orders9", "pad": "x" * 70000}).encode()
            async with http.post(api, data=big, headers=_as(OPS)) as response:
                assert response.status == 413
            assert not hub.has_stream("orders9")

    run(main())


def test_a_cross_site_attempt_is_refused_before_the_route(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_app(tmp_path / "d", _access(), sampler=False) as (hub, base), \
                aiohttp.ClientSession() as http:  # fmt: skip
            await hub.append(Batch.build("orders", [b"x"]), assign_ids=True)
            evil = {**_as(OPS), "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
            async with http.delete(f"{base}/api/streams/orders", headers=evil) as response:
                assert response.status == 403
            form = {"Authorization": f"Bearer {OPS}",
                    "Content-Type": "application/x-www-form-urlencoded"}  # fmt: skip
            async with http.post(f"{base}/api/streams", data=b"name=orders2",
                                 headers=form) as response:  # fmt: skip
                assert response.status == 403
                assert "X-Tidewire-Request" in await response.text()
            assert hub.has_stream("orders")
            assert not hub.has_stream("orders2")

    run(main())


def test_a_live_rsio_subscriber_is_told_the_stream_was_deleted(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_server(tmp_path) as (hub, _, url), await tidewire.connect(url) as client:
            await hub.append(Batch.build("s", [b"a"]), assign_ids=True)
            got: list[bytes] = []

            async def consume() -> None:
                async for batch in client.subscribe("s"):
                    got.extend(batch.value(i) for i in range(len(batch)))
                    if hub.has_stream("s"):  # (the first delivery: the subscription is live)
                        await until(lambda: hub.live_subscriptions() != [])
                        await hub.delete_stream("s")

            with pytest.raises(RsioError, match="stream deleted"):
                await consume()
            assert got == [b"a"]

    run(main())


def test_a_live_http_subscriber_is_told_the_stream_was_deleted(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_app(tmp_path / "d", sampler=False) as (hub, base), \
                HttpHub(base) as client:  # fmt: skip
            await hub.append(Batch.build("s", [b"a"]), assign_ids=True)
            got: list[bytes] = []

            async def consume() -> None:
                async for batch in client.subscribe("s"):
                    got.extend(batch.value(i) for i in range(len(batch)))
                    if hub.has_stream("s"):
                        await until(lambda: hub.live_subscriptions() != [])
                        await hub.delete_stream("s")

            with pytest.raises(HttpRsioError, match="stream deleted"):
                await consume()
            assert got == [b"a"]

    run(main())
