"""The pages' code under the hub's own Content-Security-Policy (no ``'unsafe-inline'``, no
``'unsafe-eval'``: server/browser.py, docs/security.md "Browsers"), in real Chromium: the page
reports each violation it meets. The stream page (its module, its stylesheet, RS.io on Tube
over ``connect-src 'self'``, a download) meets none; nor does the dashboard (its module, the
charts' module, the vendored uPlot, its stylesheets)."""

from __future__ import annotations

import json
from pathlib import Path

from playwright.async_api import Page

from browser import WAIT_MS, hub_app, in_chromium
from tidewire.model import Batch
from tidewire.server.browser import CONTENT_SECURITY_POLICY

WATCH = """window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__violations.push(
  {directive: e.effectiveDirective, blocked: e.blockedURI, source: e.sourceFile,
   sample: e.sample}));"""
VIOLATIONS = "window.__violations"


def test_the_stream_page_and_the_charts_run_under_a_strict_policy(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (hub, base):
            values = [json.dumps({"n": i}).encode() for i in range(30)]
            await hub.append(Batch.build("orders", values), assign_ids=True)
            await page.add_init_script(WATCH)

            response = await page.goto(f"{base}/stream?name=orders&size=10")
            assert response is not None
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            await page.wait_for_function("() => window.tidewireStream.state().loads === 1",
                                         timeout=WAIT_MS)  # fmt: skip
            assert (await page.evaluate("window.tidewireStream.state()"))["ids"] == list(
                range(21, 31))  # (read over the WebSocket: connect-src 'self' allows it)
            await page.check("input[name='view'][value='hex']")
            async with page.expect_download() as info:
                await page.click("#download-page")
            assert (await info.value).suggested_filename == "orders-21-30.jsonl"
            assert await page.evaluate(VIOLATIONS) == []
            assert errors == []
            # (the policy is in force: an inline style added now is refused, and reported)
            await page.evaluate("""() => { const s = document.createElement("style");
                s.textContent = "body { color: red; }"; document.head.append(s); }""")
            await page.wait_for_function("() => window.__violations.length === 1",
                                         timeout=WAIT_MS)  # fmt: skip
            assert (await page.evaluate(VIOLATIONS))[0]["directive"] == "style-src-elem"
            errors.clear()

            await page.goto(f"{base}/?refresh=200")
            await page.wait_for_function("() => window.tidewireCharts.state().charts === 5",
                                         timeout=WAIT_MS)  # fmt: skip
            assert await page.evaluate(VIOLATIONS) == []
            assert errors == []

    in_chromium(test, downloads=True)
