"""A ``js`` example of the docs run as a browser would: an ES module in real headless Chromium
(Debian's ``chromium``, driven by Playwright, as tests/web/ does), on a page of the hub's own
origin so that ``import ... from "/static/tube.js"`` resolves as it does for a page the hub
serves. What it logs (``console.log``, ``console.info``) is its output; an uncaught error or a
rejected promise (``pageerror``) is its failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from playwright.async_api import Browser, ConsoleMessage, Error, async_playwright

from browser import CHROMIUM, FLAGS

__all__ = ["CHROMIUM", "chromium", "run_module"]

DONE = "\nwindow.__tidewireExampleDone = true;\n"
"""Appended to a ``run`` block: set only if the module ran to its end (top-level ``await``
included) without throwing."""


class _Console:
    """What the page said: the block's output, what it threw, and the browser's own lines (a
    favicon's 404), kept for the report only."""

    def __init__(self) -> None:
        self.logged: list[str] = []
        self.thrown: list[str] = []
        self.other: list[str] = []
        self.said = asyncio.Event()  # the first line logged, or the first error
        self.threw = asyncio.Event()

    def message(self, message: ConsoleMessage) -> None:
        if message.type in ("log", "info"):
            self.logged.append(message.text)
            self.said.set()
        else:
            self.other.append(f"{message.type}: {message.text}")

    def error(self, error: Error) -> None:
        self.thrown.append(str(error))
        self.said.set()
        self.threw.set()

    def report(self, what: str) -> str:
        return "\n".join([what, "--- logged:", *self.logged, "--- thrown:", *self.thrown,
                          "--- the browser's other console lines:", *self.other])  # fmt: skip


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Headless Chromium, closed on exit."""
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            await browser.close()


async def run_module(browser: Browser, text: str, page_url: str, *, until: float | None,
                     run_seconds: float, output_seconds: float) -> str | None:  # fmt: skip
    """Run ``text`` as a module on ``page_url``, in a new context of ``browser``.
    ``until=None``: it must run to its end within ``run_seconds``, throwing nothing;
    ``until=N``: it must throw nothing for N seconds and log something (a first line may come
    up to ``output_seconds`` later). What went wrong, or ``None``."""
    console = _Console()
    # The block is an inline script: a Content-Security-Policy meant for the hub's own pages
    # would refuse it, which says nothing about the example.
    context = await browser.new_context(bypass_csp=True)
    try:
        page = await context.new_page()
        page.on("console", console.message)
        page.on("pageerror", console.error)
        await page.goto(page_url)
        await page.add_script_tag(content=text + (DONE if until is None else ""),
                                  type="module")  # fmt: skip
        if until is None:
            done = asyncio.ensure_future(page.wait_for_function(
                "window.__tidewireExampleDone === true", timeout=run_seconds * 1000))
            threw = asyncio.ensure_future(console.threw.wait())
            await asyncio.wait({done, threw}, return_when=asyncio.FIRST_COMPLETED)
            for task in (done, threw):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Error):
                    await task
            if console.thrown:
                return console.report("threw")
            if not done.done() or done.cancelled() or done.exception() is not None:
                return console.report(f"did not run to its end in {run_seconds:.0f} s")
            return None
        await asyncio.sleep(until)  # the mode itself: N seconds alive
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(console.said.wait(), output_seconds)
        if console.thrown:
            return console.report("threw")
        return None if console.logged else console.report("logged nothing")
    finally:
        await context.close()
