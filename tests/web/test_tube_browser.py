"""The browser client in real headless Chromium (Debian's ``chromium``, installed by ``./tw
test``), driven by Playwright: the hub's live-tail page subscribes over RS.io on Tube on
WebSocket, shows events published after it opened, and applies backpressure (a paused page stops
asking, and the hub stops sending once the demand it had is used up)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from playwright.async_api import Page, async_playwright

from browser import CHROMIUM, FLAGS, page_until, screenshot
from tidewire.hub import Hub
from tidewire.log import LogConfig
from tidewire.model import Batch
from tidewire.server.app import TUBE_CONNECTIONS_KEY, build_app


@asynccontextmanager
async def hub_app(path: Path) -> AsyncIterator[tuple[Hub, web.Application, str]]:
    hub = Hub.open(str(path), LogConfig(fsync=False))
    await hub.start()
    app = build_app(hub)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]  # (host, port) of the one site
    try:
        yield hub, app, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await hub.close()


async def text(page: Page, element: str) -> str:
    return await page.inner_text(f"#{element}")


def test_the_tail_page_shows_new_events_and_applies_backpressure(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail("no chromium: ./tw test installs Debian's chromium package")

    async def main() -> None:
        async with hub_app(tmp_path / "data") as (hub, app, base), async_playwright() as pw:
            await hub.append(Batch.build("orders", [b"before the page"]), assign_ids=True)
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = await browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                await page.goto(f"{base}/tail?stream=orders&window=4")
                await page_until(page, "document.getElementById('status').textContent === 'live'")
                # The page's RS.io subscription exists on the hub before anything is published.
                protocols = app[TUBE_CONNECTIONS_KEY]
                while not any(p.pumps for p in protocols):  # noqa: ASYNC110 - bounded by timeout
                    await asyncio.sleep(0.01)

                await hub.append(Batch.build("orders", [b"hello", b"world"]), assign_ids=True)
                await page_until(page, "document.getElementById('count').textContent === '2'")
                shown = await text(page, "events")
                assert "hello" in shown
                assert "world" in shown
                assert "before the page" not in shown  # from=latest: only what came after

                # Backpressure: paused, the page asks for nothing more; the hub sends what the
                # page had asked for and then nothing, though the stream holds more.
                await page.evaluate("window.tidewireTail.pause()")
                state = await page.evaluate("window.tidewireTail.state()")
                await hub.append(Batch.build("orders", [b"e%d" % i for i in range(10)]),
                                 assign_ids=True)  # fmt: skip
                expected = 2 + state["outstanding"]
                await page_until(page, f"window.tidewireTail.state().count === {expected}")
                (protocol,) = [p for p in protocols if p.pumps]
                ((sub, _),) = protocol.pumps.values()
                while sub.demand:  # noqa: ASYNC110 - the hub's side of the page's demand
                    await asyncio.sleep(0.01)
                assert await page.evaluate("window.tidewireTail.state()") == {
                    "paused": True, "outstanding": 0, "count": expected}  # fmt: skip
                assert hub.latest("orders") == 13 > expected + 1  # more waits on the hub

                await page.evaluate("window.tidewireTail.resume()")
                await page_until(page, "window.tidewireTail.state().count === 12")
                shown = await text(page, "events")
                assert all(f"e{i}" in shown for i in range(10))
                await screenshot(page, "tail")
                assert errors == []
            finally:
                await browser.close()

    async def bounded() -> None:
        async with asyncio.timeout(90):
            await main()

    asyncio.run(bounded())
