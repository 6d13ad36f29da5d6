"""The stream page's admin controls (``/stream?name=``, section "Manage this stream": web/admin.js's
``streamAdmin``) in real headless Chromium through Playwright: the retention that applies and
where it comes from, changing it (checked on the hub and through ``GET /api/streams``),
deleting the stream after typing its name (a wrong name deletes nothing; the page then says the
stream is gone and links back to the dashboard), and refused actions shown with the hub's own
words: 401 (anonymous, and the page asks for a token), 403 (no ``admin`` right; no ACL file),
404 (deleted meanwhile by someone else), 501 (a gateway of a cluster, whose retention is
JetStream's). Screenshots go to ``$TIDEWIRE_ARTIFACTS``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web
from playwright.async_api import Page, Request

from browser import hub_app, in_chromium, page_until, screenshot
from clustered_storage import ClusteredStorage
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.model import Batch
from tidewire.server.app import build_app, start_http_site
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.rsio_http import HttpSettings

ADMIN = "window.tidewireAdmin.state()"
STREAM = "window.tidewireStream.state()"
REFUSED_BY_ACL = "403: refused: may not admin stream 'orders'"


async def orders(hub: Hub) -> None:
    """orders 1..30 (and "other", so the listing holds more than the page's stream)."""
    await hub.append(Batch.build("orders", [f"order {i}".encode() for i in range(1, 31)]),
                     assign_ids=True)  # fmt: skip
    await hub.append(Batch.build("other", [b"x"]), assign_ids=True)


async def shown(page: Page, loads: int) -> None:
    """Wait until the ``loads``-th page of events is shown."""
    await page_until(page, f"{STREAM}.loads >= {loads} && !{STREAM}.busy")


async def result(page: Page, results: int) -> tuple[str, str]:
    """The ``results``-th answer shown: its text and class (``ok`` or ``error``)."""
    await page_until(page, f"{ADMIN}.results >= {results} && !{ADMIN}.busy")
    text = await page.inner_text("#admin-result")
    return text, await page.get_attribute("#admin-result", "class") or ""


async def listed(base: str, token: str | None, stream: str) -> object:
    """The stream's ``retention`` as ``GET /api/streams`` gives it (to a client of its own)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http, \
            http.get(f"{base}/api/streams", headers=headers) as response:  # fmt: skip
        assert response.status == 200
        found = [s for s in await response.json() if s["name"] == stream]
    assert len(found) == 1
    return found[0]["retention"]


async def open_page(page: Page, base: str, token: str | None) -> None:
    """The stream page of orders, as the principal of ``token`` (given through the page's form
    when the hub asks for one), once its first page of events and the retention are shown."""
    await page.goto(f"{base}/stream?name=orders&size=10")
    if token is not None:
        await page.wait_for_selector("#auth", state="visible")
        await page.fill("#token", token)
        await page.click("#token-submit")
    await shown(page, 1)
    await page_until(page, f"{ADMIN}.retention !== undefined && {ADMIN}.retention !== null")


@asynccontextmanager
async def gateway(access: Access) -> AsyncIterator[tuple[Hub, str]]:
    """A hub on a storage that says it is a cluster but has no stream administration
    (tests/clustered_storage.py; JetStream's has one since issue 23: a storage that has none
    must say so) and its app on a guarded site: ``(hub, base URL)``."""
    hub = Hub(ClusteredStorage())
    settings = HttpSettings()
    runner = web.AppRunner(build_app(hub, settings, access=access), handle_signals=False,
                           access_log=None, shutdown_timeout=5.0)  # fmt: skip
    await runner.setup()
    port = await start_http_site(runner, "127.0.0.1", 0, admission=Admission(ConnectionLimits()),
                                 tls=None, settings=settings)  # fmt: skip
    try:
        yield hub, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await hub.close()


def test_change_retention_then_delete_with_the_typed_name(tmp_path: Path) -> None:
    ops, ops_table = mint_token("ops")
    acl = Acl.parse('[principal."token:ops"]\nmonitor = true\nread = ["orders*"]\n'
                    'admin = ["orders*"]\n')  # fmt: skip
    access = Access(acl, Tokens.parse(ops_table))

    async def test(page: Page, errors: list[str]) -> None:
        deletes: list[str] = []

        def sent(request: Request) -> None:
            if request.method == "DELETE":
                deletes.append(request.url)

        page.on("request", sent)
        async with hub_app(tmp_path / "data", access) as (hub, base):
            await orders(hub)
            await open_page(page, base, ops)
            # what applies, and where it comes from: [log]'s defaults (no bound)
            assert await page.inner_text("#retention-current") == "no time bound, no size bound"
            assert (await page.inner_text("#retention-source")).startswith("default: ")
            assert await listed(base, ops, "orders") == {"ms": None, "bytes": None,
                                                         "source": "default"}  # fmt: skip

            # change it: one day, then a size bound too (the time bound kept)
            await page.click("#manage summary")
            await page.fill("#retention-ms", "86400000")
            await page.click("#retention-submit")
            text, cls = await result(page, 1)
            assert cls == "ok", text
            assert text == "orders: retention now 86400000 ms, no size bound (runtime)"
            await page.fill("#retention-bytes", "1048576")
            await page.click("#retention-submit")
            text, cls = await result(page, 2)
            assert cls == "ok", text
            retention = hub.retention("orders")
            assert retention is not None
            assert (retention.ms, retention.bytes) == (86400000, 1048576)
            assert retention.source == "runtime"
            assert await listed(base, ops, "orders") == {"ms": 86400000, "bytes": 1048576,
                                                         "source": "runtime"}  # fmt: skip
            other = hub.retention("other")
            assert other is not None
            assert other.source == "default"  # (only this stream's)
            await page_until(page, "document.getElementById('retention-source').textContent"
                             ".startsWith('runtime: ')")  # fmt: skip
            assert await page.inner_text("#retention-current") == (
                "86400000 ms (1d 00h 00m), 1048576 bytes (1.0 MiB)")  # fmt: skip
            assert await page.input_value("#retention-ms") == ""  # (the form is cleared)
            await screenshot(page, "stream-admin-retention")

            # delete: not with a wrong name, neither by the button nor by Enter in the field
            assert await page.is_disabled("#delete-submit")
            for wrong in ("order", "Orders", "orders "):
                await page.fill("#delete-confirm", wrong)
                assert await page.is_disabled("#delete-submit"), wrong
            await page.press("#delete-confirm", "Enter")  # (no submission: the button is off)
            await page.evaluate("window.tidewireAdmin.reload()")  # (the page ran its handlers)
            assert hub.has_stream("orders")
            assert (await page.evaluate(ADMIN))["results"] == 2
            await page.fill("#delete-confirm", "orders")
            assert await page.is_enabled("#delete-submit")
            await screenshot(page, "stream-admin-confirm-delete")
            await page.click("#delete-submit")
            text, cls = await result(page, 3)
            assert (text, cls) == ("deleted orders", "ok")
            assert not hub.has_stream("orders")
            assert hub.has_stream("other")
            assert deletes == [f"{base}/api/streams/orders"]  # (the wrong names sent nothing)

            # the page says the stream is gone, reads no more, and links back to the dashboard
            assert await page.is_visible("#gone")
            assert await page.inner_text("#gone-name") == "orders"
            assert not await page.is_visible("#browser")
            assert not await page.is_visible("#manage")
            assert not await page.is_visible("#retention-line")  # (of a stream that is gone)
            assert (await page.evaluate(STREAM))["deleted"] is True
            assert (await page.evaluate(ADMIN))["deleted"] is True
            await screenshot(page, "stream-admin-deleted")
            await page.click("#gone-home")
            await page.wait_for_url(f"{base}/")
            # (the console's only errors: the refused requests' statuses, which Chromium logs)
            assert [e for e in errors if "status of 40" not in e] == []

    in_chromium(test)


def test_refused_actions_are_shown_with_the_hubs_words(tmp_path: Path) -> None:
    viewer, viewer_table = mint_token("viewer")
    ops, ops_table = mint_token("ops")
    acl = Acl.parse('[principal.anonymous]\nmonitor = true\nread = ["orders*"]\n'
                    '[principal."token:viewer"]\nmonitor = true\nread = ["orders*"]\n'
                    '[principal."token:ops"]\nmonitor = true\nread = ["orders*"]\n'
                    'admin = ["orders*"]\n')  # fmt: skip
    access = Access(acl, Tokens.parse(viewer_table + ops_table))

    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data", access) as (hub, base):
            await orders(hub)
            await open_page(page, base, None)  # (anonymous may read and list, not admin)
            await page.click("#manage summary")

            # 401: anonymous; the page says so and asks for a token
            await page.fill("#retention-ms", "1000")
            await page.click("#retention-submit")
            text, cls = await result(page, 1)
            assert cls == "error"
            assert text.startswith("401: refused: "), text
            assert "admin" in text
            assert await page.is_visible("#auth")
            assert "granted admin" in await page.inner_text("#auth-message")

            # 403: a principal without the admin right, for a change and for a delete
            await page.fill("#token", viewer)
            await page.click("#token-submit")
            await shown(page, 2)
            await page.click("#retention-submit")  # (the field still holds 1000)
            assert await result(page, 2) == (REFUSED_BY_ACL, "error")
            await page.fill("#delete-confirm", "orders")
            await page.click("#delete-submit")
            assert await result(page, 3) == (REFUSED_BY_ACL, "error")
            await screenshot(page, "stream-admin-refused")
            retention = hub.retention("orders")
            assert retention is not None
            assert retention.source == "default"
            assert hub.has_stream("orders")
            assert not await page.is_visible("#gone")
            assert await page.is_visible("#browser")

            # 404: someone else deleted it meanwhile (the tab's token is ops' now: the
            # dashboard and the stream page of a tab share it)
            await page.evaluate(f"sessionStorage.setItem('tidewire.token', '{ops}')")
            await page.reload()
            await shown(page, 1)
            await hub.delete_stream("orders")
            await page.click("#manage summary")
            await page.fill("#retention-bytes", "1000")
            await page.click("#retention-submit")
            text, cls = await result(page, 1)
            assert cls == "error"
            assert text.startswith("404: "), text
            assert "orders" in text
            assert not hub.has_stream("orders")
            assert [e for e in errors if "status of 40" not in e] == []

    in_chromium(test)


def test_a_hub_without_an_acl_file_refuses_admin_and_the_page_says_why(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (hub, base):
            await orders(hub)
            await open_page(page, base, None)  # (open: anyone reads and lists)
            await page.click("#manage summary")
            await page.fill("#delete-confirm", "orders")
            await page.click("#delete-submit")
            text, cls = await result(page, 1)
            assert cls == "error"
            assert text.startswith(REFUSED_BY_ACL + ": no ACL file grants admin"), text
            assert hub.has_stream("orders")
            assert not await page.is_visible("#auth")  # (a token would not help)
            assert [e for e in errors if "status of 40" not in e] == []

    in_chromium(test)


def test_a_storage_without_stream_administration_says_so(tmp_path: Path) -> None:
    ops, ops_table = mint_token("ops")
    acl = Acl.parse('[principal."token:ops"]\nmonitor = true\nread = ["orders*"]\n'
                    'admin = ["orders*"]\n')  # fmt: skip
    access = Access(acl, Tokens.parse(ops_table))

    async def test(page: Page, errors: list[str]) -> None:
        async with gateway(access) as (hub, base):
            await orders(hub)
            await page.goto(f"{base}/stream?name=orders&size=10")
            await page.wait_for_selector("#auth", state="visible")
            await page.fill("#token", ops)
            await page.click("#token-submit")
            await shown(page, 1)
            await page_until(page, f"{ADMIN}.retention === null && {ADMIN}.streams.length > 0")
            assert await page.inner_text("#retention-current") == (
                "not known (a storage without stream administration)")  # fmt: skip
            await page.click("#manage summary")
            await page.fill("#retention-ms", "1000")
            await page.click("#retention-submit")
            assert await result(page, 1) == (
                "501: creating, deleting or re-configuring a stream is not supported by this "
                "storage (ClusteredStorage)", "error")  # fmt: skip
            await page.fill("#delete-confirm", "orders")
            await page.click("#delete-submit")
            text, cls = await result(page, 2)
            assert (text[:4], cls) == ("501:", "error")
            assert hub.has_stream("orders")
            assert not await page.is_visible("#gone")
            await screenshot(page, "stream-admin-cluster")
            assert [e for e in errors if "status of 40" not in e and "status of 501" not in e] == []

    in_chromium(test)
