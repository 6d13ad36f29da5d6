"""What the dashboard's pages load, over real HTTP on 127.0.0.1 (no browser): ``GET
/api/history`` (docs/observability.md: its keys, ``since``, ``monitor`` as for ``/api/stats``,
each stream's largest subscription lag), the vendored uPlot served from the in-memory whitelist
(with the hashes web/vendor/README.md records), and the stream page at ``/stream``."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import aiohttp
from yarl import URL

from browser import hub_app
from helpers import run
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.hub.subscription import Subscription
from tidewire.model import Batch
from tidewire.server.admin import LagReader
from tidewire.server.app import WEB_DIR

T0 = 1_800_000_000.0
VENDOR = "vendor/uplot-1.6.32"


def test_history_over_http_with_since_and_the_largest_lag(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_app(tmp_path / "data", sampler=False) as (hub, base), \
                aiohttp.ClientSession() as http:  # fmt: skip
            # (a clock that does not move: the lags are read at every sample, whatever a read
            # costs on this machine; LagReader's pacing has its own test below)
            hub.metrics.lags = LagReader(hub, clock=lambda: 0.0)
            hub.metrics.sample(100.0, wall=T0)
            await hub.append(Batch.build("orders", [b"a", b"b", b"c", b"d"]), assign_ids=True)
            # two subscriptions of orders, at ids 1 and 3 (lags 4 and 2), without demand
            subs = [hub.subscribe("orders", start=start) for start in (1, 3)]
            assert all(isinstance(s, Subscription) for s in subs)
            hub.metrics.sample(101.0, wall=T0 + 1)
            hub.metrics.sample(102.0, wall=T0 + 2)
            async with http.get(f"{base}/api/history") as response:
                assert response.status == 200
                assert response.headers["Cache-Control"] == "no-store"
                body = await response.json()
            assert body["time"] == [int((T0 + 1) * 1000), int((T0 + 2) * 1000)]
            assert body["history_seconds"] == 900
            assert body["history_streams"] == 32
            assert body["interval_seconds"] == 1
            orders = body["streams"]["orders"]
            assert orders["events_in_rate"] == [4.0, 0.0]
            assert orders["max_lag"] == [4, 4]
            assert orders["bytes_in_rate"][0] > 0
            assert set(body["append_seconds"]) == {"p50", "p99"}
            assert body["append_seconds"]["p50"][0] is not None  # (the append was observed)
            assert set(body["fsync_seconds"]) == {"p50", "p99"}
            async with http.get(f"{base}/api/history?since={body['time'][0]}") as response:
                newer = await response.json()
            assert newer["time"] == body["time"][1:]
            async with http.get(f"{base}/api/history?since=yesterday") as response:
                assert response.status == 400
                assert "since must be an integer" in await response.text()
            for s in subs:
                s.cancel()

    run(main())


def test_history_needs_monitor_as_the_stats_do(tmp_path: Path) -> None:
    viewer, viewer_table = mint_token("viewer")
    reader, reader_table = mint_token("reader")
    acl = Acl.parse('[principal."token:viewer"]\nmonitor = true\n'
                    '[principal."token:reader"]\nread = ["*"]\n')  # fmt: skip
    access = Access(acl, Tokens.parse(viewer_table + reader_table))

    async def main() -> None:
        async with hub_app(tmp_path / "data", access, sampler=False) as (_, base), \
                aiohttp.ClientSession() as http:  # fmt: skip
            for headers, status in (({}, 401), ({"Authorization": f"Bearer {reader}"}, 403),
                                    ({"Authorization": f"Bearer {viewer}"}, 200)):  # fmt: skip
                async with http.get(f"{base}/api/history", headers=headers) as response:
                    assert response.status == status, headers
            # the pages and their code stay open
            for path in ("/stream?name=orders", f"/static/{VENDOR}/uPlot.esm.js",
                         "/static/charts.js", "/static/stream.js"):  # fmt: skip
                async with http.get(f"{base}{path}") as response:
                    assert response.status == 200, path

    run(main())


def test_vendored_uplot_is_served_from_the_whitelist_as_recorded(tmp_path: Path) -> None:
    readme = (WEB_DIR / "vendor" / "README.md").read_text()
    recorded = dict(re.findall(r"\| `([^`]+)` \| `package/[^`]+` \| `([0-9a-f]{64})` \|", readme))
    assert sorted(recorded) == ["LICENSE", "uPlot.esm.js", "uPlot.min.css"]
    types = {"uPlot.esm.js": "text/javascript", "uPlot.min.css": "text/css",
             "LICENSE": "application/octet-stream"}  # fmt: skip

    async def main() -> None:
        async with hub_app(tmp_path / "data", sampler=False) as (_, base), \
                aiohttp.ClientSession() as http:  # fmt: skip
            for name, digest in recorded.items():
                async with http.get(f"{base}/static/{VENDOR}/{name}") as response:
                    assert response.status == 200
                    assert response.content_type == types[name]
                    assert hashlib.sha256(await response.read()).hexdigest() == digest
            for path in (f"/static/{VENDOR}/../../dashboard.js", f"/static/{VENDOR}/nothing.js",
                         "/static/vendor/", f"/static/{VENDOR}/%2e%2e/%2e%2e/tube.js",
                         "/static/../server/app.py", "/static/..%2fserver%2fapp.py"):  # fmt: skip
                # (encoded: sent as written, not resolved by the client first)
                async with http.get(URL(f"{base}{path}", encoded=True)) as response:
                    assert response.status == 404, path
            async with http.get(f"{base}/stream?name=orders") as response:
                assert response.status == 200
                assert response.content_type == "text/html"
                page = await response.text()
            assert '<script type="module" src="/static/stream.js"></script>' in page
            assert "<style" not in page  # (no inline styles: CSP)
            assert "style=" not in page

    run(main())


def test_the_lag_is_read_at_most_a_share_of_the_time(tmp_path: Path) -> None:
    """A read that took 5 ms (the test's clock) is not made again within 500 ms at 1 %."""
    readings = [0.0, 0.005]  # the first read: from 0 to 5 ms
    now = [0.0]

    def clock() -> float:
        return readings.pop(0) if readings else now[0]

    async def main() -> None:
        async with hub_app(tmp_path / "data", sampler=False) as (hub, _):
            await hub.append(Batch.build("orders", [b"a", b"b"]), assign_ids=True)
            sub = hub.subscribe("orders", start=1)
            reader = LagReader(hub, share=0.01, clock=clock)
            assert reader() == {"orders": 2}
            assert reader.reads == 1
            await hub.append(Batch.build("orders", [b"c"]), assign_ids=True)
            now[0] = 0.4  # too soon: the last figures again
            assert reader() == {"orders": 2}
            assert reader.reads == 1
            now[0] = 0.6  # past 500 ms: read again (at no cost this time)
            assert reader() == {"orders": 3}
            assert reader.reads == 2
            assert reader() == {"orders": 3}  # (a read that cost nothing: due at once)
            assert reader.reads == 3
            sub.cancel()
            assert reader() == {}

    run(main())
