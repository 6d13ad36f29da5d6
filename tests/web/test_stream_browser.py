"""The stream page (``/stream?name=``: web/stream.html and stream.js), a message browser over
RS.io on Tube, in real headless Chromium through Playwright: pages by id forwards and
backwards, the key filter (server-side, ``key=``; backwards through widening windows), values
as text, JSON and hex, copy to the clipboard, download of one value (its exact bytes) and of
the page (JSON Lines). Starting at a time needs the hub's time index (``from-time=``): the
control is there when the hub takes the argument and hidden when it refuses it. A principal
that may not read the stream is asked for a token. Screenshots go to ``$TIDEWIRE_ARTIFACTS``."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from playwright.async_api import Page

from browser import WAIT_MS, hub_app, in_chromium, page_until, screenshot
from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.model import Batch
from tidewire.protocols.rsio.names import PublisherName, PublisherNameError

STATE = "window.tidewireStream.state()"
ROWS = """() => [...document.querySelectorAll("#messages tbody tr")].map(
    (tr) => Object.fromEntries([...tr.cells].map((td) => [td.classList[0], td.textContent])))"""
T0 = 1_790_000_000_000  # ms: the first event's timestamp; each next one a second later


def hub_takes_from_time() -> bool:
    """Whether this tree's hub has the time index's ``from-time=`` (issue 23, item 1)."""
    try:
        PublisherName.parse("orders?from-time=0")
    except PublisherNameError:
        return False
    return True


async def ids(page: Page) -> list[int]:
    found: list[int] = (await page.evaluate(STATE))["ids"]
    return found


async def shown(page: Page, loads: int) -> list[int]:
    """The ids of the page once the ``loads``-th page is shown."""
    await page_until(page, f"{STATE}.loads >= {loads} && !{STATE}.busy")
    return await ids(page)


def key_of(i: int) -> bytes:
    return b"k1" if i % 3 == 0 else b"k2"


async def fill(hub: Hub) -> None:
    """orders 1..60: JSON values, keys k1 (every third id) and k2, one second apart; and at
    id 61 a binary value, at 62 markup, both without a key."""
    values = [json.dumps({"n": i, "name": f"order {i}"}).encode() for i in range(1, 61)]
    batch = Batch.build("orders", values, keys=[key_of(i) for i in range(1, 61)],
                        timestamps=[T0 + 1000 * (i - 1) for i in range(1, 61)])  # fmt: skip
    await hub.append(batch, assign_ids=True)
    await hub.append(Batch.build("orders", [bytes(range(256)), b"<b>bold</b>"]), assign_ids=True)


def test_browse_by_id_forwards_and_backwards_with_a_key_filter(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (hub, base):
            await fill(hub)
            await page.goto(f"{base}/stream?name=orders&size=10")
            assert await shown(page, 1) == list(range(53, 63))  # the newest page first
            assert await page.inner_text("#latest-id") == "62"
            assert await page.inner_text("#event-count") == "62"
            assert await page.is_disabled("#next")
            await page.click("#previous")
            assert await shown(page, 2) == list(range(43, 53))
            await page.click("#next")
            assert await shown(page, 3) == list(range(53, 63))
            await page.click("#first")
            assert await shown(page, 4) == list(range(1, 11))
            assert await page.is_disabled("#previous")

            # By id: mode "an id", id 20, page size 25.
            await page.select_option("#mode", "id")
            await page.fill("#from-id", "20")
            await page.select_option("#page-size", "25")
            await page.click("#show")
            assert await shown(page, 5) == list(range(20, 45))
            assert "from=20" in page.url
            rows = await page.evaluate(ROWS)
            assert rows[0]["key"] == "k2"
            assert rows[0]["time"] == "2026-09-21T14:13:39.000Z"  # T0 + 19 s
            assert json.loads(rows[0]["value"]) == {"n": 20, "name": "order 20"}

            # The key filter, forwards from id 20, then the newest k1 events (backwards,
            # through windows wider each time), then the page before them.
            await page.fill("#key", "k1")
            await page.select_option("#page-size", "10")
            await page.click("#show")
            k1 = [i for i in range(1, 61) if key_of(i) == b"k1"]
            assert await shown(page, 6) == [i for i in k1 if i >= 20][:10]
            assert {r["key"] for r in await page.evaluate(ROWS)} == {"k1"}
            await page.select_option("#mode", "newest")
            await page.click("#show")
            assert await shown(page, 7) == k1[-10:]
            await page.click("#previous")
            assert await shown(page, 8) == k1[:-10]
            assert "key=k1" in page.url
            assert f"from={k1[0]}" in page.url  # (a reload shows this page again)
            await page.reload()
            assert await shown(page, 1) == k1[:-10]
            assert await page.input_value("#key") == "k1"
            await page.fill("#key", "nobody")
            await page.click("#show")
            assert await shown(page, 2) == []
            assert await page.is_visible("#messages-empty")
            await screenshot(page, "stream-key-filter")
            assert errors == []

    in_chromium(test)


def test_values_as_text_json_and_hex_copy_and_download(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (hub, base):
            await fill(hub)
            await page.context.grant_permissions(["clipboard-read", "clipboard-write"],
                                                 origin=base)  # fmt: skip
            await page.goto(f"{base}/stream?name=orders&size=10")
            assert await shown(page, 1) == list(range(53, 63))
            value = "#messages tr[data-id='{}'] td.value"
            assert await page.inner_text(value.format(62)) == "<b>bold</b>"  # text, not markup
            assert await page.query_selector("#messages td.value b") is None
            binary = await page.inner_text(value.format(61))
            assert binary.startswith("\\x00\\x01\\x02")
            assert await page.inner_text(value.format(60)) == '{"n": 60, "name": "order 60"}'

            await page.check("input[name='view'][value='json']")
            await page_until(page, f"{STATE}.view === 'json'")
            assert await page.inner_text(value.format(60) + " pre") == (
                '{\n  "n": 60,\n  "name": "order 60"\n}')  # fmt: skip
            assert "not JSON" in await page.inner_text(value.format(62))
            await screenshot(page, "stream-json")

            await page.check("input[name='view'][value='hex']")
            hexdump = await page.inner_text(value.format(61) + " pre")
            lines = hexdump.split("\n")
            assert len(lines) == 16
            assert lines[0] == ("00000000  00 01 02 03 04 05 06 07  08 09 0a 0b 0c 0d 0e 0f "
                                " |................|")  # fmt: skip
            assert lines[4].endswith("|@ABCDEFGHIJKLMNO|")
            assert "view=hex" in page.url
            await screenshot(page, "stream-hex")

            # copy: the value as the view shows it
            await page.click("#messages tr[data-id='61'] button.copy")
            await page_until(page, "document.querySelector(\"tr[data-id='61'] td.actions\")"
                              ".classList.contains('copied')")  # fmt: skip
            assert await page.evaluate("navigator.clipboard.readText()") == hexdump
            await page.check("input[name='view'][value='text']")
            await page.click("#messages tr[data-id='60'] button.copy")
            await page_until(page, "document.querySelector(\"tr[data-id='60'] td.actions\")"
                              ".classList.contains('copied')")  # fmt: skip
            assert await page.evaluate("navigator.clipboard.readText()") == (
                '{"n": 60, "name": "order 60"}')  # fmt: skip

            # download: one value's exact bytes, then the page as JSON Lines
            async with page.expect_download() as info:
                await page.click("#messages tr[data-id='61'] button.download")
            download = await info.value
            assert download.suggested_filename == "orders-61.bin"
            saved = tmp_path / "value.bin"
            await download.save_as(saved)
            assert saved.read_bytes() == bytes(range(256))
            async with page.expect_download() as info:
                await page.click("#download-page")
            download = await info.value
            assert download.suggested_filename == "orders-53-62.jsonl"
            await download.save_as(tmp_path / "page.jsonl")
            records = [json.loads(x) for x in (tmp_path / "page.jsonl").read_text().splitlines()]
            assert [x["id"] for x in records] == list(range(53, 63))
            assert records[0] == {"id": 53, "timestamp": T0 + 52_000, "key": "k2",
                                  "value": '{"n": 53, "name": "order 53"}'}  # fmt: skip
            assert records[-2]["key"] is None
            assert base64.b64decode(records[-2]["value_base64"]) == bytes(range(256))
            assert records[-1]["value"] == "<b>bold</b>"
            assert errors == []

    in_chromium(test, downloads=True)


def test_the_time_control_follows_what_the_hub_takes(tmp_path: Path) -> None:
    takes = hub_takes_from_time()

    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data") as (hub, base):
            await fill(hub)
            await page.goto(f"{base}/stream?name=orders&size=10")
            await shown(page, 1)
            assert (await page.evaluate(STATE))["timeIndex"] is takes
            options = await page.eval_on_selector_all(
                "#mode option", "(os) => os.filter((o) => !o.hidden).map((o) => o.value)")
            if not takes:  # (this hub refuses from-time=: no control that cannot work)
                assert options == ["newest", "id"]
                assert await page.is_hidden("#from-time-label")
                return
            assert options == ["newest", "id", "time"]
            await page.select_option("#mode", "time")
            await page.fill("#from-time", "2026-09-21T14:13:50Z")  # T0 + 30 s: id 31
            await page.click("#show")
            assert await shown(page, 2) == list(range(31, 41))
            await page.fill("#from-time", str(T0 + 44_500))  # ms, between ids 45 and 46
            await page.click("#show")
            assert await shown(page, 3) == list(range(46, 56))
            assert errors == []

    in_chromium(test)


def test_a_reader_token_is_asked_for_when_the_hub_refuses_the_stream(tmp_path: Path) -> None:
    reader, reader_table = mint_token("reader")
    acl = Acl.parse('[principal."token:reader"]\nread = ["orders"]\n')
    access = Access(acl, Tokens.parse(reader_table))

    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data", access) as (hub, base):
            await fill(hub)
            await page.goto(f"{base}/stream?name=orders&size=10")
            await page.wait_for_selector("#auth", state="visible", timeout=WAIT_MS)
            assert "may not read" in await page.inner_text("#auth-message")
            assert await page.get_attribute("#status", "class") == "error"
            await page.fill("#token", reader)
            await page.click("#token-submit")
            assert await shown(page, 1) == list(range(53, 63))
            assert not await page.is_visible("#auth")
            assert await page.evaluate("sessionStorage.getItem('tidewire.token')") == reader
            await screenshot(page, "stream-token")
            # (the console shows no error of the page's own: a refused subscription is not one)
            assert [e for e in errors if "tube" in e.lower()] == []

    in_chromium(test)
