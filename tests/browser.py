"""What the browser tests share (tests/web/): the hub's app on a guarded site on 127.0.0.1 (as
``tidewire serve`` runs it), headless Chromium (Debian's ``chromium``) driven by Playwright,
and the folder where their screenshots are kept as test artifacts.

Screenshots go to ``$TIDEWIRE_ARTIFACTS`` (default ``test-artifacts/web/`` at the top of the
tree, git-ignored), named after the test, and are kept after the run: CI uploads the folder.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from playwright.async_api import Page, async_playwright

from helpers import TESTS
from tidewire.hub import Hub
from tidewire.hub.access import Access
from tidewire.log import LogConfig
from tidewire.server.app import build_app, start_http_site
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.rsio_http import HttpSettings

__all__ = ["CHROMIUM", "FLAGS", "WAIT_MS", "artifacts", "hub_app", "in_chromium", "screenshot"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
WAIT_MS = 20_000  # every wait for the page


def artifacts() -> Path:
    """The folder screenshots are kept in (made when missing)."""
    folder = Path(os.environ.get("TIDEWIRE_ARTIFACTS") or TESTS.parent / "test-artifacts" / "web")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def page_until(page: Page, script: str, timeout_ms: int = WAIT_MS) -> None:
    """Wait until ``script`` (a JavaScript expression) is true in ``page``. Given to Playwright
    as a function: it polls a bare expression with ``eval``, which the pages' Content-Security-
    Policy forbids."""
    await page.wait_for_function(f"() => ({script})", timeout=timeout_ms)


async def screenshot(page: Page, name: str) -> Path:
    """A full-page screenshot kept as ``<artifacts>/<name>.png`` (checked: not empty)."""
    path = artifacts() / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
    return path


@asynccontextmanager
async def hub_app(path: Path, access: Access | None = None, *, sampler: bool = True,
                  headers: Mapping[str, str] | None = None, log: LogConfig | None = None,
                  ) -> AsyncIterator[tuple[Hub, str]]:  # fmt: skip
    """A hub on ``path`` and its app on a guarded site on a free port: ``(hub, base URL)``.
    ``sampler=False``: the hub's background tasks are not started, so the test takes the
    metrics' samples itself (``hub.metrics.sample(now, wall)``: a fake clock). ``headers``:
    added to every response. ``log``: the log's configuration (default: no fsync)."""
    hub = Hub.open(str(path), log or LogConfig(fsync=False))
    if sampler:
        await hub.start()
    settings = HttpSettings()
    app = build_app(hub, settings, access=access)
    if headers:
        extra = dict(headers)

        async def add(request: web.Request, response: web.StreamResponse) -> None:
            response.headers.update(extra)

        app.on_response_prepare.append(add)
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           shutdown_timeout=5.0)  # fmt: skip
    await runner.setup()
    admission = Admission(ConnectionLimits())
    port = await start_http_site(runner, "127.0.0.1", 0, admission=admission, tls=None,
                                 settings=settings)  # fmt: skip
    try:
        yield hub, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await hub.close()


def in_chromium(test: Callable[[Page, list[str]], Awaitable[None]], *,
                downloads: bool = False, seconds: float = 90) -> None:  # fmt: skip
    """Run ``test`` with a fresh page of headless Chromium, bounded in time; the page's
    uncaught errors and console errors are collected in the list it is given.
    ``downloads``: the page may download files (``page.expect_download``)."""
    if not Path(CHROMIUM).exists():
        pytest.fail("no chromium: ./tw test installs Debian's chromium package")

    async def main() -> None:
        async with asyncio.timeout(seconds), async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                context = await browser.new_context(accept_downloads=downloads)
                page = await context.new_page()
                page.set_default_timeout(WAIT_MS)  # (clicks and fills wait for their element)
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                await test(page, errors)
            finally:
                await browser.close()

    asyncio.run(main())
