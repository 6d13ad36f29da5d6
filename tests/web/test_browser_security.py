"""The hub's pages under their Content-Security-Policy, and its writes against a page on another
site, in real headless Chromium (Debian's ``chromium``) driven by Playwright (issue 23).

* The dashboard and the live-tail page load with no CSP violation (their code and styles are
  files under ``/static``), and still work: the dashboard lists the streams and tails one over
  RS.io on Tube (WebSocket to the page's own origin: ``connect-src 'self'``), the tail page
  shows new events.
* A page served from another site (``http://localhost:<other port>``; the hub is on
  ``127.0.0.1``) posts a form to the hub's admin API, and ``fetch``es it with ``no-cors`` and
  with the admin header: nothing reaches the route; the form's answer is the hub's 403. The
  hub's own page, with the header, reaches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from playwright.async_api import ConsoleMessage, Page, async_playwright

from browser import CHROMIUM, FLAGS, WAIT_MS, page_until
from tidewire.hub import Hub
from tidewire.log import LogConfig
from tidewire.model import Batch
from tidewire.server.app import build_app, start_http_site
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.rsio_http import HttpSettings

# Every CSP violation the page reports (the event fires for each blocked load or inline code).
WATCH_CSP = """window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));"""


class Hit:
    """What reached the tests' own admin write (``POST /api/echo``)."""

    def __init__(self) -> None:
        self.count = 0


@asynccontextmanager
async def hub_app(path: Path) -> AsyncIterator[tuple[Hub, str, Hit]]:
    """The hub's app on a guarded site, plus ``POST /api/echo`` (an admin write of the tests'
    own, as the dashboard's admin actions will be) counting the requests that reach it."""
    hub = Hub.open(str(path), LogConfig(fsync=False))
    await hub.start()
    settings = HttpSettings()
    app = build_app(hub, settings)
    hit = Hit()

    async def echo(request: web.Request) -> web.Response:
        hit.count += 1
        return web.json_response({"ok": True})

    app.router.add_post("/api/echo", echo)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    port = await start_http_site(runner, "127.0.0.1", 0, admission=Admission(ConnectionLimits()),
                                 tls=None, settings=settings)  # fmt: skip
    try:
        yield hub, f"http://127.0.0.1:{port}", hit
    finally:
        await runner.cleanup()
        await hub.close()


@asynccontextmanager
async def other_site(html: str) -> AsyncIterator[str]:
    """A plain aiohttp server on 127.0.0.1 serving ``html`` at ``/``: its URL, by the name
    ``localhost`` (another site than the hub's ``127.0.0.1``)."""
    app = web.Application()

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html")

    app.router.add_get("/", page)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://localhost:{port}/"
    finally:
        await runner.cleanup()


def in_chromium(test: Callable[[Page, list[str]], Awaitable[None]]) -> None:
    """Run ``test`` on a fresh page watching for CSP violations, bounded in time; ``test`` gets
    the console's CSP complaints and uncaught errors."""
    if not Path(CHROMIUM).exists():
        pytest.fail("no chromium: ./tw test installs Debian's chromium package")

    async def main() -> None:
        async with asyncio.timeout(90), async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = await browser.new_page()
                page.set_default_timeout(WAIT_MS)
                await page.add_init_script(WATCH_CSP)
                problems: list[str] = []
                page.on("pageerror", lambda e: problems.append(f"error: {e}"))

                def console(message: ConsoleMessage) -> None:
                    if "Content Security Policy" in message.text:
                        problems.append(f"console: {message.text}")

                page.on("console", console)
                await test(page, problems)
            finally:
                await browser.close()

    asyncio.run(main())


async def no_violation(page: Page, problems: list[str]) -> None:
    assert await page.evaluate("window.__csp") == []
    assert problems == []


async def publish(hub: Hub, stream: str, values: list[bytes]) -> None:
    await hub.append(Batch.build(stream, values), assign_ids=True)


def test_the_pages_run_under_the_csp_with_no_violation(tmp_path: Path) -> None:
    async def test(page: Page, problems: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (hub, base, _):
            await publish(hub, "orders", [b"a", b"b"])
            answer = await page.goto(f"{base}/?refresh=200")
            assert answer is not None
            assert "'unsafe-inline'" not in answer.headers["content-security-policy"]
            await page_until(page,
                             "[...document.querySelectorAll('#streams tbody tr')].length === 1")
            # the stylesheet applied (a file: an inline one would have been blocked)
            weight = "getComputedStyle(document.querySelector('th')).fontWeight"
            assert await page.evaluate(weight) == "600"
            await page.click('#streams tbody tr[data-stream="orders"] button.tail')
            await page_until(page, "document.getElementById('tail-status').textContent === 'live'")
            await publish(hub, "orders", [b"over tube"])
            await page_until(page, "document.getElementById('tail-count').textContent === '1'")
            await no_violation(page, problems)

            await page.goto(f"{base}/tail?stream=orders&window=4")
            await page_until(page, "window.tidewireTail !== undefined")
            await page_until(page, "document.getElementById('status').textContent === 'live'")
            await publish(hub, "orders", [b"tailed"])
            await page_until(page, "window.tidewireTail.state().count === 1")
            assert "tailed" in await page.inner_text("#events")
            margin = "getComputedStyle(document.querySelector('table')).marginTop"
            assert await page.evaluate(margin) != "0px"  # tail.css applied
            await no_violation(page, problems)

    in_chromium(test)


def test_the_inline_code_the_policy_refuses_is_reported(tmp_path: Path) -> None:
    """The watch itself works: inline code put into a hub page is blocked and reported."""

    async def test(page: Page, problems: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (_, base, _hit):
            await page.goto(f"{base}/")
            await page.evaluate("""() => { const s = document.createElement("script");
                s.textContent = "window.__ran = true"; document.head.appendChild(s); }""")
            await page_until(page, "window.__csp.length > 0")
            assert await page.evaluate("window.__ran === undefined")
            assert (await page.evaluate("window.__csp"))[0].startswith("script-src")

    in_chromium(test)


FORM = """<!doctype html><html><body>
<form id="f" method="POST" action="{hub}/api/echo"><input name="name" value="evil"></form>
<script>
window.attempts = Promise.allSettled([
  fetch("{hub}/api/echo", {{method: "POST", mode: "no-cors", body: "name=evil"}}),
  fetch("{hub}/api/echo", {{method: "POST", body: "{{}}",
    headers: {{"X-Tidewire-Request": "1", "Content-Type": "application/json"}}}}),
]).then((r) => r.map((x) => x.status));
</script></body></html>"""


def test_a_page_on_another_site_cannot_write_and_the_hubs_own_page_can(tmp_path: Path) -> None:
    async def test(page: Page, problems: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (_, base, hit), \
                other_site(FORM.format(hub=base)) as evil:  # fmt: skip
            await page.goto(evil)
            # no-cors: sent, answered 403 (opaque to the page); with the header: the preflight
            # is not answered, so the POST is never sent
            assert await page.evaluate("window.attempts") == ["fulfilled", "rejected"]
            async with page.expect_navigation():
                await page.evaluate("document.getElementById('f').submit()")
            assert page.url == f"{base}/api/echo"
            assert (await page.inner_text("body")).startswith("refused: a cross-site request")
            assert hit.count == 0

            await page.goto(f"{base}/")
            status = await page.evaluate("""() => fetch("/api/echo", {method: "POST", body: "{}",
                headers: {"X-Tidewire-Request": "1", "Content-Type": "application/json"}})
                .then((r) => r.status)""")
            assert status == 200
            assert hit.count == 1
            no_header = await page.evaluate("""() => fetch("/api/echo", {method: "POST",
                body: "{}", headers: {"Content-Type": "application/json"}})
                .then((r) => r.status)""")
            assert no_header == 403
            assert hit.count == 1

    in_chromium(test)
