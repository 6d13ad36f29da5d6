"""The dashboard's "Cluster" section (issue 21) in real headless Chromium: on a gateway (a hub
whose storage reports a :class:`ClusterStatus`: tests/clustered_storage.py, a real Storage in
memory) it shows the nodes, each group's leader and its replicas, current or behind (with
their lag) or offline, and follows the status as it changes; on an embedded hub it is hidden.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web
from playwright.async_api import Page
from test_dashboard_browser import STATE, in_chromium, rows, some_row

from browser import hub_app, page_until, screenshot
from clustered_storage import N2_OK, N3_OK, STATUS, TW_1, URLS, ClusteredStorage
from tidewire.hub import Hub
from tidewire.server.app import build_app, start_http_site
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.rsio_http import HttpSettings


@asynccontextmanager
async def gateway_app(storage: ClusteredStorage) -> AsyncIterator[str]:
    """The app of a hub on ``storage``, on a guarded site, as ``tidewire serve`` runs it."""
    hub = Hub(storage)
    await hub.start()
    settings = HttpSettings()
    runner = web.AppRunner(build_app(hub, settings), handle_signals=False, access_log=None,
                           shutdown_timeout=5.0)  # fmt: skip
    await runner.setup()
    port = await start_http_site(runner, "127.0.0.1", 0, admission=Admission(ConnectionLimits()),
                                 tls=None, settings=settings)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await hub.close()


async def replicas(page: Page, group: str) -> dict[str, list[str]]:
    """Each replica of ``group``'s row: its text and its class (current, behind, offline)."""
    found: dict[str, list[str]] = await page.evaluate(
        """(group) => Object.fromEntries([...document.querySelectorAll(
               `#cluster-groups tr[data-group="${group}"] td.replicas span`)].map(
               (s) => [s.dataset.replica, [s.textContent, s.className]]))""",
        group,
    )
    return found


def test_the_dashboard_shows_the_cluster_of_a_gateway(tmp_path: Path) -> None:
    storage = ClusteredStorage()

    async def test(page: Page, errors: list[str]) -> None:
        async with gateway_app(storage) as base:
            await page.goto(f"{base}/?refresh=200")
            await page_until(page, some_row("cluster-groups", "r.group === 'TW_1'"))
            assert await page.is_visible("#cluster")
            assert await page.inner_text("#cluster-name") == "tidewire"
            assert await page.inner_text("#cluster-connected") == URLS[0]
            assert await page.inner_text("#cluster-servers") == ", ".join(URLS)
            nodes = await rows(page, "cluster-nodes")
            assert nodes == [
                {"node": "n1", "leads": "1", "current": "0", "behind": "0", "offline": "1"},
                {"node": "n2", "leads": "0", "current": "1", "behind": "0", "offline": "0"},
                {"node": "n3", "leads": "0", "current": "1", "behind": "1", "offline": "0"},
            ]
            groups = {r["group"]: r for r in await rows(page, "cluster-groups")}
            assert groups["TW_0"]["leader"] == "n1"
            assert groups["TW_0"]["replicas"] == "n2 · n3 lag 7"
            assert groups["TW_0"]["messages"] == "12"
            assert groups["TW_0"]["bytes"] == "4.0 KiB"
            assert groups["TW_0"]["last-seq"] == "12"
            assert groups["TW_1"]["leader"] == "none (electing)"
            assert await replicas(page, "TW_0") == {"n2": ["n2", "current"],
                                                    "n3": ["n3 lag 7", "behind"]}  # fmt: skip
            assert await replicas(page, "TW_1") == {"n1": ["n1 offline", "offline"],
                                                    "n3": ["n3", "current"]}  # fmt: skip
            leaderless = "#cluster-groups tr.leaderless"
            assert await page.eval_on_selector(leaderless, "tr => tr.dataset.group") == "TW_1"
            await screenshot(page, "cluster")

            # n2 is elected for TW_1, n3 caught up on TW_0: the page follows.
            caught_up = dataclasses.replace(STATUS.groups[0], replicas=(N2_OK, N3_OK))
            elected = dataclasses.replace(TW_1, leader="n2", replicas=(N3_OK,))
            storage.status = dataclasses.replace(STATUS, groups=(caught_up, elected))
            for shown in ("r.group === 'TW_1' && r.leader === 'n2'",
                          "r.group === 'TW_0' && r.replicas === 'n2 · n3'"):  # fmt: skip
                await page_until(page, some_row("cluster-groups", shown))
            assert await page.query_selector(leaderless) is None
            assert {r["node"]: r["leads"] for r in await rows(page, "cluster-nodes")} == {
                "n1": "1", "n2": "1", "n3": "0"}  # (n1: no longer anyone's replica)
            assert (await page.evaluate(STATE))["error"] is None
            assert errors == []

    in_chromium(tmp_path, test)


def test_the_cluster_section_is_hidden_on_an_embedded_hub(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (_, base):
            await page.goto(f"{base}/?refresh=200")
            await page_until(page, f"{STATE}.refreshes >= 2")
            assert not await page.is_visible("#cluster")
            assert await rows(page, "cluster-groups") == []
            assert errors == []

    in_chromium(tmp_path, test)
