"""The dashboard's charts (web/charts.js over uPlot, fed by ``GET /api/history``) in real
headless Chromium through Playwright. The test is the hub's clock: the hub's sampler is not
started and the test takes each sample itself (``Metrics.sample(now, wall)``), so what the
charts must show is known exactly. The page polls every 200 ms, the whole history first and
then only the newer points (``?since=``); each chart's canvas ends up with its streams' lines
drawn in their colours. Screenshots are kept in ``$TIDEWIRE_ARTIFACTS``."""

from __future__ import annotations

import time
from pathlib import Path

from playwright.async_api import Page

from browser import hub_app, in_chromium, page_until, screenshot
from tidewire.hub import Hub
from tidewire.model import Batch

CHARTS = "window.tidewireCharts.state()"
PANELS = ("chart-in", "chart-out", "chart-lag", "chart-append", "chart-fsync")
# How many pixels of a canvas are (nearly) the colour ``hex``, and how many are painted at all.
PIXELS = """([id, hex]) => {
  const canvas = document.querySelector(`#${id} canvas`);
  if (!canvas) return null;
  const { data } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
  const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  let near = 0, painted = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i + 3] === 0) continue;
    painted += 1;
    if (Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 40
        && data[i + 3] > 200) near += 1;
  }
  return { near, painted, width: canvas.width, height: canvas.height };
}"""


class Clock:
    """The hub's sampler, driven by the test: a sample each ``tick``, one second apart."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.second = 0
        self.wall = time.time() - 120  # (the charts' x axis: two minutes ago, on)

    def tick(self) -> None:
        self.hub.metrics.sample(1000.0 + self.second, wall=self.wall + self.second)
        self.second += 1


def test_the_charts_draw_rates_lag_and_latencies_and_poll_for_newer_points(
    tmp_path: Path,
) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data", sampler=False) as (hub, base):
            clock = Clock(hub)
            clock.tick()
            lagging = hub.subscribe("orders", start=1)  # never asks for anything: it lags
            for second in range(30):  # orders: 20 events a second; clicks: 5, from second 10
                await hub.append(Batch.build("orders", [b"o"] * 20), assign_ids=True)
                if second >= 10:
                    await hub.append(Batch.build("clicks", [b"c"] * 5), assign_ids=True)
                clock.tick()
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url) if "/api/history" in r.url
                    else None)  # fmt: skip
            await page.goto(f"{base}/?refresh=200")
            await page_until(page, f"{CHARTS}.charts === 5 && {CHARTS}.points === 30")
            state = await page.evaluate(CHARTS)
            assert state["streams"] == ["clicks", "orders"]
            assert state["error"] is None
            assert await page.inner_text("#charts-status") == "30 s of history"

            # Newer points arrive with the next polls, asked for with ?since=
            polls = state["polls"]
            for _ in range(5):
                await hub.append(Batch.build("orders", [b"o"] * 20), assign_ids=True)
                clock.tick()
            await page_until(page, f"{CHARTS}.points === 35 && {CHARTS}.polls > {polls}")
            assert requests[0].endswith("/api/history")  # the whole history, once
            assert all("/api/history?since=" in url for url in requests[1:])
            assert len(requests) >= 2

            # Every canvas is painted, and the per-stream charts carry each stream's colour.
            for panel in PANELS:
                found = await page.evaluate(f"({PIXELS})", [panel, "#000000"])
                assert found is not None, panel
                assert found["painted"] > 0, panel
            for panel, stream in (("chart-in", "orders"), ("chart-in", "clicks"),
                                  ("chart-lag", "orders")):  # fmt: skip
                colour = await page.evaluate("(n) => window.tidewireCharts.colour(n)", stream)
                found = await page.evaluate(f"({PIXELS})", [panel, colour])
                assert found["near"] > 50, (panel, stream, found)
            # clicks has no subscription, so no line in the lag chart unless its colour is
            # shared with orders' (a hash into 12 colours): then it is the same line's pixels
            legend = await page.inner_text("#chart-in .u-legend")
            assert "orders" in legend
            assert "clicks" in legend
            # the latency charts have p50 and p99, from the appends the hub observed
            assert "p99" in await page.inner_text("#chart-append .u-legend")
            p50 = await page.evaluate(f"({PIXELS})", ["chart-append", "#0072b2"])
            assert p50["near"] > 50
            await screenshot(page, "charts")
            lagging.cancel()
            assert errors == []

    in_chromium(test)


def test_the_charts_wait_for_a_first_point_and_say_so(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data", sampler=False) as (hub, base):
            await page.goto(f"{base}/?refresh=200")
            await page_until(page, f"{CHARTS}.polls >= 2")
            assert await page.is_visible("#charts-empty")
            assert (await page.evaluate(CHARTS))["points"] == 0
            clock = Clock(hub)
            clock.tick()
            await hub.append(Batch.build("orders", [b"x"]), assign_ids=True)
            clock.tick()
            await page_until(page, f"{CHARTS}.points === 1")
            assert not await page.is_visible("#charts-empty")
            assert errors == []

    in_chromium(test)
