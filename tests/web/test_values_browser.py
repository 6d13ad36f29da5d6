"""The pages' shared modules (web/values.js: a value, a byte count, a time, a duration as text;
web/session.js: the tab's token), in real headless Chromium through Playwright: the functions
themselves, the same bytes shown the same on the dashboard's live tail, the stream page and the
live-tail page, and each helper defined once (no page keeps a copy of its own)."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.async_api import Page

from browser import hub_app, in_chromium, page_until
from tidewire.model import Batch
from tidewire.server.app import WEB_DIR

VALUES = """async () => {
  const v = await import("/static/values.js");
  const b = (xs) => new Uint8Array(xs);
  const utf8 = (s) => new TextEncoder().encode(s);
  return {
    binary: v.asText(b([0xff, 0x00, 0x5c, 0x41])), text: v.asText(utf8("été\\tx\\n")),
    control: v.asText(utf8("a\\u0007b")), none: v.asText(null),
    json: v.asJson(utf8('{"a":[1,2]}')), notJson: v.asJson(utf8("{")), badUtf8: v.asJson(b([0xff])),
    hex: v.asHex(utf8("0123456789abcdefXY")),
    bytes: [v.bytes(0), v.bytes(1023), v.bytes(1536), v.bytes(1048576), v.bytes(null)],
    time: [v.time(1790000000000), v.time(8.64e15 + 1)],  // (past Date's range)
    duration: [v.duration(42), v.duration(187), v.duration(7509), v.duration(604800)],
    positive: [v.positive("12.7", 5), v.positive("0", 5), v.positive("-1", 5), v.positive("x", 5),
               v.positive(null, 5)],
  };
}"""
# Binary, UTF-8 with a tab, a backslash: each shown the same wherever a value is shown.
EVENTS = [b"\xff\x00", "été\tx".encode(), b"a\\b"]
SHOWN = ["\\xff\\x00", "été\tx", "a\\b"]


def test_the_shared_functions(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        async with hub_app(tmp_path / "data", sampler=False) as (_, base):
            await page.goto(f"{base}/stream")  # (any page of the hub: the module's origin)
            got = await page.evaluate(VALUES)
            assert got["binary"] == "\\xff\\x00\\\\A"
            assert got["text"] == "été\tx\n"
            assert got["control"] == "a\\x07b"  # (a control character: shown as bytes)
            assert got["none"] == ""
            assert got["json"] == '{\n  "a": [\n    1,\n    2\n  ]\n}'
            assert got["notJson"] is None
            assert got["badUtf8"] is None
            assert got["hex"] == (
                "00000000  30 31 32 33 34 35 36 37  38 39 61 62 63 64 65 66  |0123456789abcdef|\n"
                "00000010  58 59                                             |XY|")  # fmt: skip
            assert got["bytes"] == ["0 B", "1023 B", "1.5 KiB", "1.0 MiB", "0 B"]
            assert got["time"] == ["2026-09-21T14:13:20.000Z", "8640000000000001"]
            assert got["duration"] == ["42s", "3m 07s", "2h 05m 09s", "7d 00h 00m"]
            assert got["positive"] == [12, 5, 5, 5, 5]
            assert errors == []

    in_chromium(test)


def test_the_same_bytes_read_the_same_on_every_page(tmp_path: Path) -> None:
    async def test(page: Page, errors: list[str]) -> None:
        loaded: list[str] = []
        page.on("request", lambda r: loaded.append(r.url.split("/static/", 1)[-1]))
        async with hub_app(tmp_path / "data", sampler=False) as (hub, base):
            await hub.append(Batch.build("mixed", EVENTS), assign_ids=True)

            await page.goto(f"{base}/stream?name=mixed")
            await page_until(page, "window.tidewireStream.state().loads === 1")
            values = await page.eval_on_selector_all(
                "#messages td.value pre", "(ps) => ps.map((p) => p.textContent)")
            assert values == SHOWN
            assert {"values.js", "session.js", "admin.js"} <= set(loaded)

            loaded.clear()
            await page.goto(f"{base}/tail?stream=mixed&from=earliest")
            await page_until(page, "window.tidewireTail.state().count === 3")
            rows = await page.eval_on_selector_all(
                "#events tr", "(trs) => trs.map((tr) => tr.cells[3].textContent)")
            assert rows == SHOWN[::-1]  # (the newest on top)
            assert "values.js" in loaded

            loaded.clear()
            await page.goto(f"{base}/?tail=mixed")
            await page_until(page, "window.tidewireDashboard.state().tail?.live === true")
            await hub.append(Batch.build("mixed", EVENTS), assign_ids=True)  # (tails from now)
            await page_until(page, "window.tidewireDashboard.state().tail?.count === 3")
            rows = await page.eval_on_selector_all(
                "#tail-events td.value", "(tds) => tds.map((td) => td.textContent)")
            assert rows == SHOWN[::-1]
            assert {"values.js", "session.js", "admin.js"} <= set(loaded)
            assert errors == []

    in_chromium(test)


def test_each_helper_is_defined_once() -> None:
    """A page that wants a value as text imports values.js; one that wants the token, session.js
    (a copy would drift: the same bytes would read differently from one page to the next)."""
    shared = {"values.js": ["bytes", "time", "duration", "utf8text", "asText", "asJson", "asHex",
                            "positive"],
              "session.js": ["token", "tubeUrl"]}  # fmt: skip
    pages = sorted(p for p in WEB_DIR.glob("*.js"))
    found = {p.name for p in pages}
    assert {"dashboard.js", "stream.js", "admin.js", "charts.js", "tail.js"} <= found
    for page in pages:
        source = page.read_text()
        for module, names in shared.items():
            if page.name == module:
                continue
            for name in names:
                assert not re.search(rf"function {name}\(", source), (page.name, name)
        if page.name != "session.js":
            assert "tidewire.token" not in source, page.name  # (the token's key: session.js)
