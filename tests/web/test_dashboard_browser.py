"""The dashboard (``/``: web/dashboard.html and dashboard.js) in real headless Chromium (Debian's
``chromium``), driven by Playwright, against the hub's app in this process: it renders
``/api/stats`` (streams, subscriptions and their lag), tails a stream live over RS.io on Tube
with backpressure, says when the hub does not answer and recovers, and asks for a token when
the API refuses the page (an ACL with ``monitor``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from playwright.async_api import Page, Route, async_playwright

from browser import CHROMIUM, FLAGS, WAIT_MS, hub_app, page_until, screenshot
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.model import Batch

# The rows of a table of the page, each {cell class: text} ("#streams": name, events, ...).
ROWS = """(table) => [...document.querySelectorAll(`#${table} tbody tr`)].map(
    (tr) => Object.fromEntries([...tr.cells].map((td) => [td.classList[0], td.textContent])))"""
STATE = "window.tidewireDashboard.state()"


async def publish(hub: Hub, stream: str, values: list[bytes], key: bytes | None = None) -> None:
    keys = None if key is None else [key] * len(values)
    await hub.append(Batch.build(stream, values, keys=keys), assign_ids=True)


async def rows(page: Page, table: str) -> list[dict[str, str]]:
    found: list[dict[str, str]] = await page.evaluate(f"({ROWS})({table!r})")
    return found


def some_row(table: str, condition: str) -> str:
    """A script: some row ``r`` of ``table`` satisfies ``condition`` (JavaScript, on ``r``)."""
    return f"({ROWS})({table!r}).some((r) => {condition})"


def in_chromium(tmp_path: Path, test: Callable[[Page, list[str]], Awaitable[None]]) -> None:
    """Run ``test`` with a fresh page of headless Chromium, bounded in time; the page's
    uncaught errors are collected in the list it is given."""
    if not Path(CHROMIUM).exists():
        pytest.fail("no chromium: ./tw test installs Debian's chromium package")

    async def main() -> None:
        async with asyncio.timeout(90), async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = await browser.new_page()
                page.set_default_timeout(WAIT_MS)  # (clicks and fills wait for their element)
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                await test(page, errors)
            finally:
                await browser.close()

    asyncio.run(main())


def test_the_dashboard_lists_streams_and_tails_new_events(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (hub, base):
            await publish(hub, "orders", [b"a", b"b", b"c"])
            await publish(hub, "clicks", [b"before the page"])
            await page.goto(f"{base}/?refresh=200")
            await page_until(page, some_row("streams", "r.name === 'orders' && r.events === '3'"))
            streams = {r["name"]: r for r in await rows(page, "streams")}
            assert sorted(streams) == ["clicks", "orders"]  # by name, no _tidewire.* stream
            assert streams["orders"]["latest"] == "3"
            assert streams["clicks"]["events"] == "1"
            assert await page.inner_text("#version") != "?"
            assert await page.inner_text("#stream-count") == "2"
            assert await page.get_attribute("#status", "class") != "error"
            browse = '#streams tbody tr[data-stream="orders"] a.browse'  # (the stream page)
            assert await page.get_attribute(browse, "href") == "/stream?name=orders"

            # Tail "clicks" (its row's button), then switch to "orders": one subscription, the
            # page's, over Tube, on the stream chosen last.
            await page.click('#streams tbody tr[data-stream="clicks"] button.tail')
            await page_until(page, some_row("subscriptions", "r.stream === 'clicks'"))
            await page.click('#streams tbody tr[data-stream="orders"] button.tail')
            only_orders = f"({ROWS})('subscriptions').map((r) => r.stream).join() === 'orders'"
            await page_until(page, only_orders)
            assert await page.inner_text("#tail-stream") == "orders"
            assert await page.inner_text("#tail-status") == "live"
            assert page.url.endswith("/?refresh=200&tail=orders")  # a reload tails it again

            # The subscription (from=latest) is on the hub: what comes now is shown, not before.
            await publish(hub, "orders", [b"hello dashboard"], key=b"k1")
            await publish(hub, "clicks", [b"not tailed"])
            await page_until(page, "document.getElementById('tail-count').textContent === '1'")
            (event,) = await rows(page, "tail-events")
            assert event["id"] == "4"
            assert event["key"] == "k1"
            assert event["value"] == "hello dashboard"
            await publish(hub, "orders", [b"\xff\x00", "été".encode(), b"<b>bold</b>"])
            far = 9 * 10**15  # ms: a timestamp (under 2**53), past what a JavaScript Date holds
            await hub.append(Batch.build("orders", [b"far"], timestamps=far), assign_ids=True)
            await page_until(page, "document.getElementById('tail-count').textContent === '5'")
            shown = [r["value"] for r in await rows(page, "tail-events")]
            assert shown == ["far", "<b>bold</b>", "été", "\\xff\\x00", "hello dashboard"]
            assert await page.query_selector("#tail-events b") is None  # text, not markup
            assert (await rows(page, "tail-events"))[0]["time"] == str(far)
            await page_until(page, some_row("streams", "r.name === 'orders' && r.events === '8'"))

            await screenshot(page, "dashboard")
            body = await page.inner_text("body")
            for text in ("orders", "clicks", "hello dashboard", "été", "<b>bold</b>", "tube"):
                assert text in body
            for text in ("before the page", "not tailed"):
                assert text not in body
            state = await page.evaluate(STATE)
            assert state["tail"]["stream"] == "orders"
            assert state["tail"]["count"] == 5
            assert state["tail"]["lastId"] == 8
            assert state["refreshes"] >= 2
            assert state["error"] is None
            assert errors == []

    in_chromium(tmp_path, test)


def test_the_dashboard_shows_its_subscription_demand_and_lag(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (hub, base):
            await publish(hub, "orders", [b"a", b"b", b"c"])
            await page.goto(f"{base}/?refresh=200&tail=orders&window=4")
            await page_until(page, some_row("subscriptions", "r.protocol === 'tube'"))
            (sub,) = await rows(page, "subscriptions")
            assert sub["stream"] == "orders"
            assert sub["demand"] == "4"  # the page's window
            assert sub["lag"] == "0"
            connections = {r["id"]: r for r in await rows(page, "connections")}
            assert connections[sub["connection"]]["protocol"] == "tube"  # the page's own
            tube = "#subscriptions-by-protocol [data-protocol='tube'] .count"
            assert await page.inner_text(tube) == "1"

            # Paused, the page asks for nothing more: it receives the 4 events it had asked
            # for, and the other 6 wait on the hub, which the table shows as lag.
            await page.evaluate("window.tidewireDashboard.pause()")
            await publish(hub, "orders", [b"e%d" % i for i in range(10)])
            await page_until(page, f"{STATE}.tail.count === 4")
            await page_until(page, some_row("subscriptions", "r.lag === '6' && r.demand === '0'"))
            assert await page.inner_text("#tail-demand") == "0"
            assert await page.inner_text("#tail-status") == "paused"
            await screenshot(page, "lagging")

            await page.evaluate("window.tidewireDashboard.resume()")
            await page_until(page, f"{STATE}.tail.count === 10")
            await page_until(page, some_row("subscriptions", "r.lag === '0'"))
            shown = [r["value"] for r in await rows(page, "tail-events")]
            assert shown == [f"e{i}" for i in reversed(range(10))]  # newest first
            assert errors == []

    in_chromium(tmp_path, test)


def test_the_dashboard_says_when_the_hub_does_not_answer_and_recovers(tmp_path: Path) -> None:
    async def down(route: Route) -> None:
        await route.abort("connectionrefused")

    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (hub, base):
            await publish(hub, "orders", [b"a"])
            await page.goto(f"{base}/?refresh=200")
            await page_until(page, some_row("streams", "r.name === 'orders'"))
            await page.route("**/api/stats", down)  # as if the hub were gone
            await page_until(page, "document.getElementById('status').className === 'error'")
            assert "cannot get /api/stats" in await page.inner_text("#status")
            assert (await page.evaluate(STATE))["error"] is not None
            await publish(hub, "orders", [b"b"])
            await page.unroute("**/api/stats", down)  # the page kept trying
            await page_until(page, some_row("streams", "r.name === 'orders' && r.events === '2'"))
            assert await page.get_attribute("#status", "class") == ""
            assert "updated" in await page.inner_text("#status")
            assert errors == []

    in_chromium(tmp_path, test)


def test_the_dashboard_asks_for_a_token_when_the_api_wants_monitor(tmp_path: Path) -> None:
    viewer, viewer_table = mint_token("viewer")
    reader, reader_table = mint_token("reader")
    acl = Acl.parse('[principal."token:viewer"]\nmonitor = true\nread = ["orders"]\n'
                    '[principal."token:reader"]\nread = ["*"]\n')  # fmt: skip
    access = Access(acl, Tokens.parse(viewer_table + reader_table))

    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data", access) as (hub, base):
            await publish(hub, "orders", [b"a", b"b", b"c"])
            await publish(hub, "secret", [b"s"])
            await page.goto(f"{base}/?refresh=200&tail=orders")
            await page.wait_for_selector("#auth", state="visible", timeout=WAIT_MS)
            assert await page.get_attribute("#status", "class") == "error"
            assert await rows(page, "streams") == []
            await page_until(page, "document.getElementById('tail-status').textContent"
                              ".includes('anonymous may not read')")  # fmt: skip

            async def enter(token: str) -> None:
                await page.fill("#token", token)
                await page.click("#token-submit")

            await enter("viewer.wrong")  # refused (401): asked again
            await page_until(page, "document.getElementById('auth-message').textContent"
                              ".includes('401')")  # fmt: skip
            await enter(reader)  # may read, not monitor (403): asked again
            await page_until(page, "document.getElementById('auth-message').textContent"
                              ".includes('403')")  # fmt: skip
            assert await page.is_visible("#auth")
            await enter(viewer)
            await page_until(page, some_row("streams", "r.name === 'orders' && r.events === '3'"))
            names = [r["name"] for r in await rows(page, "streams")]
            assert names == ["orders", "secret"]  # monitor: the figures of every stream
            assert not await page.is_visible("#auth")
            assert await page.evaluate("sessionStorage.getItem('tidewire.token')") == viewer

            # The tail started again with each token: now as token:viewer, which may read
            # orders, on a connection of its own (the one of token:reader's tail is closed).
            on_its_connection = "r.stream === 'orders' && r.connection === c.id"
            viewers_tail = f"""(() => {{
                const c = ({ROWS})('connections').find((r) => r.principal === 'token:viewer');
                return c !== undefined && {some_row("subscriptions", on_its_connection)};
            }})()"""
            await page_until(page, viewers_tail)
            await page_until(page, "!" + some_row("connections", "r.principal === 'token:reader'"))
            await publish(hub, "orders", [b"for the viewer"])
            await page_until(page, f"{STATE}.tail.count === 1")
            assert "for the viewer" in await page.inner_text("#tail-events")
            await screenshot(page, "token")

            # Every stream's figures, but not the events of a stream it may not read.
            await page.click('#streams tbody tr[data-stream="secret"] button.tail')
            await page_until(page, "document.getElementById('tail-status').textContent"
                              ".includes('token:viewer may not read')")  # fmt: skip
            assert await rows(page, "tail-events") == []
            assert await page.inner_text("#tail-demand") == "0"

            # A reload keeps the token (the tab's sessionStorage): no question this time.
            await page.reload()
            await page_until(page, some_row("streams", "r.name === 'orders'"))
            assert not await page.is_visible("#auth")
            assert errors == []

    in_chromium(tmp_path, test)
