"""The admin API and ``/metrics`` (docs/observability.md) over real HTTP on 127.0.0.1: every
path's documented keys and types, the hub's own streams only on request, ``no-store``, ``GET``
only; and the access rule: with an ACL, ``/metrics`` and ``/api/*`` need a principal granted
``monitor = true`` (anonymous: 401 asking for credentials, a bad token: 401, a principal without
``monitor``: 403, all with ``X-Rsio-Error: true``), while the dashboard and its scripts stay
open. ``monitor`` in the ACL file must be a boolean.

The hub with every listener comes from tests/stacks.py (:func:`stack`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import tidewire
from helpers import until
from loops import Run
from stacks import HOST, RawRemote, Samples, Stack, stack
from tidewire.client.admin import AdminClient, AdminError
from tidewire.client.rsio import RsioClient, RsioError
from tidewire.config import ConfigError, load_config
from tidewire.hub.access import Access, AccessFileError, Acl, Principal, Tokens, mint_token
from tidewire.model import Batch
from tidewire.observe.metrics import CONNECTION_PROTOCOLS, SUBSCRIPTION_PROTOCOLS
from tidewire.protocols.rsio_http import ERROR_HEADER
from tidewire.server.serve import security

PROM, PROM_TOML = mint_token("prometheus")
ALICE, ALICE_TOML = mint_token("alice")
OPS, OPS_TOML = mint_token("ops-1")
OLD, OLD_TOML = mint_token("old", days=-1)
TOKENS = Tokens.parse(PROM_TOML + ALICE_TOML + OPS_TOML + OLD_TOML)
ACL_TEXT = """
[principal."token:prometheus"]
monitor = true

[principal."token:alice"]
read = ["*"]
write = ["*"]
monitor = false

[principal."token:ops-*"]
monitor = true

[principal."token:old"]
monitor = true
"""

API_PATHS = ("/api/overview", "/api/streams", "/api/connections", "/api/subscriptions",
             "/api/tolliver", "/api/stats")  # fmt: skip

OVERVIEW: dict[str, type | tuple[type, ...]] = {
    "version": str, "started_at": int, "uptime_seconds": (int, float), "data_dir": str,
    "streams": int, "events_in": int, "bytes_in": int, "events_out": int, "bytes_out": int,
    "events_in_rate": (int, float), "bytes_in_rate": (int, float),
    "events_out_rate": (int, float), "bytes_out_rate": (int, float),
    "connections": dict, "subscriptions": dict, "staged_bytes": int,
}  # fmt: skip
STREAM: dict[str, type | tuple[type, ...]] = {
    "name": str, "events": int, "first_id": (int, type(None)), "latest_id": (int, type(None)),
    "bytes": int, "segments": int,
    "events_in": int, "bytes_in": int, "events_out": int, "bytes_out": int,
    "events_in_rate": (int, float), "bytes_in_rate": (int, float),
    "events_out_rate": (int, float), "bytes_out_rate": (int, float), "protocols": dict,
    "retention": (dict, type(None)),  # (issue 23: which retention applies, and its source)
}  # fmt: skip
TRAFFIC: dict[str, type | tuple[type, ...]] = {"events_in": int, "bytes_in": int,
                                              "events_out": int, "bytes_out": int}
CONNECTION: dict[str, type | tuple[type, ...]] = {
    "id": int, "protocol": str, "peer": str, "principal": (str, type(None)), "opened_at": int,
    "bytes_in": int, "bytes_out": int, "tls": bool,
}  # fmt: skip
SUBSCRIPTION: dict[str, type | tuple[type, ...]] = {
    "id": int, "protocol": str, "stream": str, "connection": (int, type(None)), "next_id": int,
    "latest_id": int, "delivered": int, "demand": int, "unbounded": bool, "lag": int,
}  # fmt: skip
PEER: dict[str, type | tuple[type, ...]] = {
    "uuid": str, "address": (str, type(None)), "connected": bool, "channels": list,
    "unacked": int, "resends": int,
}  # fmt: skip


def shaped(obj: Any, shape: dict[str, type | tuple[type, ...]]) -> None:
    """``obj`` is a dict with exactly the keys of ``shape``, each of its type(s) (a bool is no
    int here)."""
    assert isinstance(obj, dict), obj
    assert set(obj) == set(shape), (sorted(obj), sorted(shape))
    for key, kind in shape.items():
        kinds = kind if isinstance(kind, tuple) else (kind,)
        value = obj[key]
        assert isinstance(value, kinds), (key, value, kind)
        if bool not in kinds:
            assert not isinstance(value, bool), (key, value)


def check_overview(o: Any) -> None:
    shaped(o, OVERVIEW)
    assert o["version"] == tidewire.__version__
    assert set(o["connections"]) >= set(CONNECTION_PROTOCOLS)
    assert set(o["subscriptions"]) >= set(SUBSCRIPTION_PROTOCOLS)
    assert all(isinstance(n, int) and n >= 0 for n in o["connections"].values())
    assert all(isinstance(n, int) and n >= 0 for n in o["subscriptions"].values())


def check_streams(rows: Any) -> None:
    assert isinstance(rows, list)
    for row in rows:
        shaped(row, STREAM)
        for traffic in row["protocols"].values():
            shaped(traffic, TRAFFIC)
    assert [r["name"] for r in rows] == sorted(r["name"] for r in rows)


def check_tolliver(t: Any) -> None:
    shaped(t, {"instance": (str, type(None)), "peers": list})
    for peer in t["peers"]:
        shaped(peer, PEER)
        assert all(isinstance(c, str) for c in peer["channels"])


async def busy(s: Stack) -> None:
    """Something on every list: streams, connections, subscriptions, a Tolliver peer."""
    await s.hub.append(Batch.build("orders", [b"o1", b"o2", b"o3"]), assign_ids=True)


# --------------------------------------------------------------------------- shapes


def test_every_path_has_the_documented_keys_and_types(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s, tidewire.connect(s.rsio_url) as client:
            remote = await RawRemote.open(s.tolliver.port, "orders")
            await until(lambda: remote.uuid in s.tolliver.by_peer, "the remote")
            await until(lambda: "orders" in s.tolliver.by_peer[remote.uuid].channels, "follow")
            await busy(s)  # (a remote gets what comes after its connection)
            await remote.until_received(3)
            stream = client.subscribe("orders", prefetch=2)
            first = await anext(stream)  # a live subscription, demand-limited
            assert len(first) >= 1
            started = time.time() * 1000

            for path in API_PATHS:
                answer = await s.get(path)
                assert answer.status == 200, (path, answer)
                assert answer.headers["Content-Type"] == "application/json; charset=utf-8"
                assert answer.headers["Cache-Control"] == "no-store", path

            overview = await s.api("/api/overview")
            check_overview(overview)
            assert overview["data_dir"] == s.hub.describe()
            assert overview["started_at"] <= started
            assert overview["uptime_seconds"] >= 0
            assert overview["streams"] == 1  # orders; not _tidewire.tolliver
            assert overview["events_in"] == 3
            assert overview["bytes_in"] > 0
            assert overview["events_out"] >= 3 + 1  # the Tolliver remote's and RS.io's
            assert overview["connections"]["rsio"] == 1
            assert overview["connections"]["tolliver"] == 1
            assert overview["subscriptions"]["rsio"] == 1
            assert overview["subscriptions"]["tolliver"] == 1

            streams = await s.api("/api/streams")
            check_streams(streams)
            (orders,) = streams
            assert (orders["name"], orders["events"], orders["first_id"],
                    orders["latest_id"]) == ("orders", 3, 1, 3)  # fmt: skip
            assert set(orders["protocols"]) == {"api", "rsio", "tolliver"}
            assert orders["protocols"]["api"]["events_in"] == 3

            connections = await s.api("/api/connections")
            assert isinstance(connections, list)
            assert connections
            for c in connections:
                shaped(c, CONNECTION)
                assert c["protocol"] in CONNECTION_PROTOCOLS
                assert c["peer"].startswith(f"{HOST}:")
            assert [c["id"] for c in connections] == sorted(c["id"] for c in connections)
            ids = {c["id"] for c in connections}

            subscriptions = await s.api("/api/subscriptions")
            assert {sub["protocol"] for sub in subscriptions} == {"rsio", "tolliver"}
            for sub in subscriptions:
                shaped(sub, SUBSCRIPTION)
                assert sub["connection"] in ids
                assert sub["lag"] == max(0, sub["latest_id"] - (sub["next_id"] - 1))
            assert [sub["id"] for sub in subscriptions] == sorted(
                sub["id"] for sub in subscriptions)

            tolliver = await s.api("/api/tolliver")
            check_tolliver(tolliver)
            assert [p["uuid"] for p in tolliver["peers"]] == [str(remote.uuid)]

            stats = await s.api("/api/stats")
            assert set(stats) == {"overview", "streams", "connections", "subscriptions",
                                  "tolliver"}  # fmt: skip
            check_overview(stats["overview"])
            check_streams(stats["streams"])
            assert stats["streams"] == streams
            assert stats["subscriptions"] == subscriptions
            assert stats["tolliver"] == tolliver
            assert [c["id"] for c in stats["connections"]] == [c["id"] for c in connections]

            # the same through the admin client
            async with AdminClient(s.base) as admin:
                assert (await admin.tolliver()) == tolliver
                assert [r["name"] for r in await admin.streams()] == ["orders"]
            await stream.aclose()
            remote.writer.close()

    run(main())


def test_every_protocol_is_a_key_when_idle(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s:
            overview = await s.api("/api/overview")
            assert overview["connections"] == {"rsio": 0, "http": 1, "tube": 0, "tolliver": 0,
                                               "seguro": 0}  # fmt: skip
            assert overview["subscriptions"] == dict.fromkeys(SUBSCRIPTION_PROTOCOLS, 0)
            assert overview["streams"] == 0
            assert (overview["events_in"], overview["events_out"]) == (0, 0)
            assert await s.api("/api/subscriptions") == []
            tolliver = await s.api("/api/tolliver")
            assert tolliver == {"instance": str(s.tolliver.instance), "peers": []}

    run(main())


def test_the_hubs_own_streams_only_on_request(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s:
            await busy(s)
            names = [r["name"] for r in await s.api("/api/streams")]
            assert names == ["orders"]
            for query in ("?internal=1", "?internal=true"):
                internal = [r["name"] for r in await s.api("/api/streams" + query)]
                assert "_tidewire.tolliver" in internal  # the hub's Tolliver state
                assert "orders" in internal
                assert internal == sorted(internal)
            assert [r["name"] for r in await s.api("/api/streams?internal=0")] == ["orders"]
            stats = await s.api("/api/stats")
            assert [r["name"] for r in stats["streams"]] == ["orders"]
            stats = await s.api("/api/stats?internal=1")
            assert "_tidewire.tolliver" in [r["name"] for r in stats["streams"]]
            assert stats["overview"]["streams"] == 1
            m = await s.metrics()  # the metrics show every stream
            assert m.one("tidewire_log_events", stream="_tidewire.tolliver") >= 1

    run(main())


def test_get_only_and_metrics_content_type(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path) as s:
            for path in (*API_PATHS, "/metrics"):
                answer = await s.get(path, method="POST")
                # (issue 23: under /api/ a write without X-Tidewire-Request is refused first)
                expected = 403 if path.startswith("/api/") else 405
                assert answer.status == expected, (path, answer.status)
            answer = await s.get("/metrics")
            assert answer.status == 200
            assert answer.headers["Content-Type"].startswith("text/plain")
            samples = Samples(answer.body.decode())
            assert "tidewire_events_received" in samples.families
            assert samples.families["tidewire_events_received"].type == "counter"
            assert samples.families["tidewire_connections"].type == "gauge"
            assert samples.families["tidewire_log_append_seconds"].type == "histogram"
            assert samples.one("process_open_fds") > 0
            assert (await s.get("/api/nothing")).status == 404

    run(main())


# --------------------------------------------------------------------------- access


def acl_stack(path: Path) -> Any:
    return stack(path, access=Access(Acl.parse(ACL_TEXT), TOKENS))


def test_with_an_acl_only_monitor_principals_see_metrics_and_the_api(
    tmp_path: Path, run: Run
) -> None:
    async def main() -> None:
        async with acl_stack(tmp_path) as s:
            await busy(s)
            for path in ("/metrics", *API_PATHS):
                anonymous = await s.get(path, anonymous=True)
                assert anonymous.status == 401, (path, anonymous)
                assert anonymous.headers[ERROR_HEADER] == "true"
                assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
                assert b"monitor" in anonymous.body

                bad = await s.get(path, "nobody.not-a-token")
                assert bad.status == 401, (path, bad)
                assert bad.headers[ERROR_HEADER] == "true"
                assert 'error="invalid_token"' in bad.headers["WWW-Authenticate"]

                expired = await s.get(path, OLD)  # granted monitor, but expired
                assert expired.status == 401, (path, expired)

                alice = await s.get(path, ALICE)  # reads and writes everything, no monitor
                assert alice.status == 403, (path, alice)
                assert alice.headers[ERROR_HEADER] == "true"
                assert "WWW-Authenticate" not in alice.headers
                assert b"monitor" in alice.body

                for token in (PROM, OPS):  # by name, and by a glob
                    ok = await s.get(path, token)
                    assert ok.status == 200, (path, token, ok)
            ok = await s.get("/api/stats", PROM)
            assert ok.headers["Cache-Control"] == "no-store"
            assert [r["name"] for r in ok.json()["streams"]] == ["orders"]
            samples = Samples((await s.get("/metrics", PROM)).body.decode())
            assert samples.one("tidewire_log_events", stream="orders") == 3
            # through the admin client: a refusal is an AdminError with the status
            async with AdminClient(s.base) as admin:
                with pytest.raises(AdminError) as refused:
                    await admin.overview()
                assert refused.value.status == 401
            async with AdminClient(s.base, token=ALICE) as admin:
                with pytest.raises(AdminError) as refused:
                    await admin.stats()
                assert refused.value.status == 403
            async with AdminClient(s.base, token=PROM) as admin:
                assert (await admin.overview())["streams"] == 1

    run(main())


def test_monitor_sees_figures_not_events(tmp_path: Path, run: Run) -> None:
    """``monitor`` shows every stream's figures; reading its events still needs ``read``."""

    async def main() -> None:
        async with acl_stack(tmp_path) as s:
            await busy(s)
            (row,) = (await s.get("/api/streams", PROM)).json()
            assert (row["name"], row["events"]) == ("orders", 3)
            assert (await s.get("/streams", PROM)).json() == []  # the readable ones: none
            refused = await s.get("/rsio/pub/orders?request=1", PROM, method="PUT")
            assert refused.status == 403
            acl = Acl.parse(ACL_TEXT)
            prom = Principal("token:prometheus")
            assert acl.allows(prom, "monitor", "")
            assert not acl.allows(prom, "read", "orders")
            assert not acl.allows(prom, "write", "orders")
            assert not acl.allows(Principal("token:alice"), "monitor", "")
            assert acl.allows(Principal("token:ops-2"), "monitor", "")
            assert not acl.allows(Principal("anonymous"), "monitor", "")

    run(main())


def test_the_dashboard_stays_open(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with acl_stack(tmp_path) as s:
            page = await s.get("/", anonymous=True)
            assert page.status not in (401, 403), page
            if page.status == 200:
                assert page.headers["Content-Type"].startswith("text/html")
                assert b"<html" in page.body.lower() or b"<!doctype" in page.body.lower()
            static = await s.get("/static/dashboard.html", anonymous=True)
            assert static.status in (200, 404), static
            script = await s.get("/static/dashboard.js", anonymous=True)
            assert script.status in (200, 404), script
            assert (await s.get("/healthz", anonymous=True)).status == 200
            # even with a bad token: the open paths do not look at credentials
            assert (await s.get("/", "nobody.not-a-token")).status not in (401, 403)

    run(main())


def test_without_an_acl_everything_is_open(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with stack(tmp_path, access=Access(None, TOKENS)) as s:
            for path in ("/metrics", *API_PATHS):
                assert (await s.get(path, anonymous=True)).status == 200, path
                assert (await s.get(path, ALICE)).status == 200, path

    run(main())


# --------------------------------------------------------------------------- the ACL file


@pytest.mark.parametrize("value", ['"yes"', "1", "0", '["orders"]', '"true"', "{}"])
def test_monitor_must_be_a_boolean(value: str) -> None:
    with pytest.raises(AccessFileError, match="monitor"):
        Acl.parse(f'[principal."token:x"]\nmonitor = {value}\n')


def test_monitor_parses_and_unknown_rights_are_refused(tmp_path: Path) -> None:
    acl = Acl.parse(ACL_TEXT)
    grants = {g.principal: g.monitor for g in acl.grants}
    assert grants == {"token:prometheus": True, "token:alice": False, "token:ops-*": True,
                      "token:old": True}  # fmt: skip
    assert Acl.parse('[principal."token:x"]\nread = ["a"]\n').grants[0].monitor is False
    with pytest.raises(AccessFileError):
        Acl.parse('[principal."token:x"]\nadmin = true\n')
    path = tmp_path / "acl.toml"
    path.write_text('[principal."token:x"]\nmonitor = "on"\n')
    with pytest.raises(AccessFileError, match="monitor"):
        Acl.load(str(path))
    # and the server refuses to start with it, as a configuration error
    with pytest.raises(ConfigError, match="monitor"):
        security(load_config(None, {"auth.acl_file": str(path)}, environ={}))


def test_monitor_grants_nothing_on_the_other_listeners(tmp_path: Path, run: Run) -> None:
    """The admin API is the HTTP listener's; monitor reads and writes no stream anywhere."""

    async def first(client: RsioClient) -> None:
        async for _ in client.subscribe("orders"):
            break

    async def main() -> None:
        async with acl_stack(tmp_path) as s:
            await busy(s)
            async with tidewire.connect(s.rsio_url, token=PROM) as client:
                assert client.principal == "token:prometheus"
                with pytest.raises(RsioError, match="forbidden"):
                    await first(client)
                with pytest.raises(RsioError, match="forbidden"):
                    await client.publish("orders", [b"no"])
            assert s.hub.latest("orders") == 3

    run(main())
