"""The dashboard's stream administration (web/admin.js, section "Manage streams") in real
headless Chromium through Playwright, against a hub with an ACL: create a stream with its
retention, change its retention, delete it after typing its name, and a refused action shown
to the user as the hub worded it. Every change is checked on the hub itself, not only on the
page. Screenshots go to ``$TIDEWIRE_ARTIFACTS``."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Page

from browser import hub_app, in_chromium, page_until, screenshot
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.model import Batch

ADMIN = "window.tidewireAdmin.state()"


async def result(page: Page, results: int) -> tuple[str, str]:
    """The ``results``-th answer shown: its text and class (``ok`` or ``error``)."""
    await page_until(page, f"{ADMIN}.results >= {results} && !{ADMIN}.busy")
    text = await page.inner_text("#admin-result")
    return text, await page.get_attribute("#admin-result", "class") or ""


def test_create_change_retention_delete_and_a_refusal(tmp_path: Path) -> None:
    ops, ops_table = mint_token("ops")
    acl = Acl.parse('[principal."token:ops"]\nmonitor = true\nadmin = ["orders*"]\n')
    access = Access(acl, Tokens.parse(ops_table))

    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data", access) as (hub, base):
            await hub.append(Batch.build("other", [b"x"]), assign_ids=True)
            await page.goto(f"{base}/?refresh=500")
            await page.wait_for_selector("#auth", state="visible")
            await page.fill("#token", ops)
            await page.click("#token-submit")
            await page.evaluate("window.tidewireAdmin.reload()")
            await page_until(page, f"{ADMIN}.streams.includes('other')")

            # Create, with a retention in ms (the bytes left to the configuration... none)
            await page.fill("#create-name", "orders")
            await page.fill("#create-ms", "60000")
            await page.click("#create-submit")
            text, cls = await result(page, 1)
            assert cls == "ok", text
            assert text.startswith("created orders: retention 60000 ms"), text
            retention = hub.retention("orders")
            assert retention is not None
            assert (retention.ms, retention.bytes, retention.source) == (60000, None, "runtime")
            await screenshot(page, "admin-created")

            # Change its retention: the current one is shown, a byte bound added
            await page_until(page, f"{ADMIN}.streams.includes('orders')")
            await page.select_option("#retention-stream", "orders")
            await page_until(page, "document.getElementById('retention-current').textContent"
                             ".includes('60000 ms')")  # fmt: skip
            await page.fill("#retention-bytes", "1048576")
            await page.click("#retention-submit")
            text, cls = await result(page, 2)
            assert cls == "ok", text
            assert "1048576 bytes (runtime)" in text
            retention = hub.retention("orders")
            assert retention is not None
            assert (retention.ms, retention.bytes) == (60000, 1048576)

            # A refused action: no admin right on "other"; the page shows the hub's words
            await page.select_option("#retention-stream", "other")
            await page.fill("#retention-ms", "1")
            await page.click("#retention-submit")
            text, cls = await result(page, 3)
            assert cls == "error"
            assert text == "403: refused: may not admin stream 'other'"
            retention = hub.retention("other")
            assert retention is not None
            assert retention.source == "default"
            await screenshot(page, "admin-refused")

            # Delete: only once the name is typed exactly
            await page.select_option("#delete-stream", "orders")
            assert await page.is_disabled("#delete-submit")
            await page.fill("#delete-confirm", "order")
            assert await page.is_disabled("#delete-submit")
            await page.fill("#delete-confirm", "orders")
            assert await page.is_enabled("#delete-submit")
            await screenshot(page, "admin-confirm-delete")
            await page.click("#delete-submit")
            text, cls = await result(page, 4)
            assert (text, cls) == ("deleted orders", "ok")
            assert not hub.has_stream("orders")
            assert hub.has_stream("other")
            await page_until(page, f"!{ADMIN}.streams.includes('orders')")
            assert await page.is_disabled("#delete-submit")
            # (the console's only errors: the refused requests' statuses, which Chromium logs)
            assert [e for e in errors if "status of 40" not in e] == []

    in_chromium(test)
