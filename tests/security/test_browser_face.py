"""The HTTP face as a browser meets it (issue 23), over real sockets on 127.0.0.1: the headers of
every kind of answer (a page, a static file, the API, an error, a request the parser refused,
the WebSocket upgrade), ``Server`` without versions, HSTS over TLS only; cross-site writes
refused with 403 (a form POST as Chromium sends it, a fetch from ``Origin: http://evil.example``,
a rebound name) while the page's own requests and clients that are not browsers (tidewire's
RS.io-over-HTTP client) pass."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

from certs import Pki
from helpers import run
from http_hub import HOST, Answer, append, eof, response
from tidewire.client.http import HttpHub
from tidewire.hub import Hub
from tidewire.log import LogConfig
from tidewire.protocols.rsio_http import ERROR_HEADER
from tidewire.server.app import build_app, start_http_site
from tidewire.server.browser import CONTENT_SECURITY_POLICY
from tidewire.server.guard import Admission, ConnectionLimits, client_context
from tidewire.server.rsio_http import HttpSettings

ADMIN = {"X-Tidewire-Request": "1", "Content-Type": "application/json"}


class Face:
    """A hub's app on a guarded site, with one admin write of the tests' own (``POST
    /api/echo``, as the dashboard's admin actions will be) that counts what reaches it."""

    def __init__(self, hub: Hub, base: str, session: aiohttp.ClientSession,
                 tls: ssl.SSLContext | None) -> None:  # fmt: skip
        self.hub = hub
        self.base = base
        self.session = session
        self.tls = tls
        self.echoed: list[bytes] = []
        self.port = int(base.rsplit(":", 1)[1])

    async def request(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                      data: bytes | None = None) -> Answer:  # fmt: skip
        async with self.session.request(method, self.base + path, headers=headers, data=data,
                                        ssl=self.tls or True) as r:  # fmt: skip
            return Answer(r.status, r.headers, await r.read())


@asynccontextmanager
async def face(path: Path, *, tls: ssl.SSLContext | None = None,
               client_tls: ssl.SSLContext | None = None) -> AsyncIterator[Face]:  # fmt: skip
    hub = Hub.open(str(path / "hub"), LogConfig(fsync=False))
    settings = HttpSettings(poll_seconds=2.0)
    app = build_app(hub, settings)
    echoed: list[bytes] = []

    async def echo(request: web.Request) -> web.Response:  # (reached only past the guard)
        echoed.append(request.headers.get("Content-Type", "").encode())  # (the guard drops
        # bodies today: no route takes one)
        return web.json_response({"ok": True})

    app.router.add_post("/api/echo", echo)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    port = await start_http_site(runner, HOST, 0, admission=Admission(ConnectionLimits()),
                                 tls=tls, settings=settings)  # fmt: skip
    session = aiohttp.ClientSession(auto_decompress=False)
    served = Face(hub, f"{'https' if tls else 'http'}://{HOST}:{port}", session, client_tls)
    served.echoed = echoed
    try:
        yield served
    finally:
        await session.close()
        await runner.cleanup()
        await hub.close()


def assert_browser_headers(answer: Answer, *, api: bool = False, hsts: bool = False) -> None:
    h = answer.headers
    assert h.getall("Server") == ["tidewire"], answer
    assert h["X-Content-Type-Options"] == "nosniff", answer
    assert h["Referrer-Policy"] == "no-referrer", answer
    assert h["Content-Security-Policy"] == CONTENT_SECURITY_POLICY, answer
    assert h["X-Frame-Options"] == "DENY", answer
    assert ("Strict-Transport-Security" in h) == hsts, answer
    if api:
        assert h["Cache-Control"] == "no-store", answer
    for name, value in h.items():  # no library, no version, anywhere
        assert "aiohttp" not in value.lower(), (name, value)
        assert "python" not in value.lower(), (name, value)


async def raw_exchange(port: int, request: bytes) -> tuple[Answer, bool]:
    """Send ``request`` on a new connection: the answer's head (and body, by Content-Length),
    and whether the hub then closed the connection."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(request)
        answer = await asyncio.wait_for(response(reader), 10)
        closed = await asyncio.wait_for(eof(reader), 10) if answer.status != 101 else False
        return answer, closed
    finally:
        writer.close()


def test_every_kind_of_answer_carries_the_headers(tmp_path: Path) -> None:
    async def main() -> None:
        async with face(tmp_path) as hub:
            for path in ("/", "/static/dashboard.js", "/static/tail.html", "/healthz",
                         "/streams"):  # fmt: skip
                answer = await hub.request("GET", path)
                assert answer.status == 200, (path, answer)
                assert_browser_headers(answer)
            for path in ("/api/stats", "/api/overview"):
                answer = await hub.request("GET", path)
                assert answer.status == 200, (path, answer)
                assert_browser_headers(answer, api=True)
            for path in ("/static/nothing.js", "/api/nothing", "/nothing"):  # aiohttp's 404
                answer = await hub.request("GET", path)
                assert answer.status == 404, (path, answer)
                assert_browser_headers(answer, api=path.startswith("/api/"))
            answer = await hub.request("DELETE", "/healthz")  # aiohttp's 405
            assert answer.status == 405
            assert_browser_headers(answer)

            # A request the parser refuses: the custom handler's own 400 (no hook runs there)
            bad, closed = await raw_exchange(hub.port, b"GET /\x01 HTTP/1.1\r\nHost: h\r\n\r\n")
            assert bad.status == 400, bad
            assert closed
            assert bad.headers.getall("Server") == ["tidewire"], bad
            assert bad.headers["X-Content-Type-Options"] == "nosniff", bad

            # The WebSocket upgrade's 101
            key = base64.b64encode(b"0123456789abcdef").decode()
            upgrade = (f"GET /tube HTTP/1.1\r\nHost: {HOST}:{hub.port}\r\nUpgrade: websocket\r\n"
                       f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                       "Sec-WebSocket-Version: 13\r\n"
                       f"Origin: http://{HOST}:{hub.port}\r\n\r\n").encode()  # fmt: skip
            switched, _ = await raw_exchange(hub.port, upgrade)
            assert switched.status == 101, switched
            assert_browser_headers(switched)

    run(main(), 60)


def test_hsts_over_tls_only(tmp_path: Path, pki: Pki) -> None:
    async def main() -> None:
        tls, client = pki.server_context("none"), client_context(pki.ca_file)
        async with face(tmp_path / "tls", tls=tls, client_tls=client) as hub:
            for path in ("/", "/api/stats", "/static/nothing"):
                answer = await hub.request("GET", path)
                assert_browser_headers(answer, api=path.startswith("/api/"), hsts=True)
                assert answer.headers["Strict-Transport-Security"] == "max-age=31536000"
        async with face(tmp_path / "plain") as hub:
            assert_browser_headers(await hub.request("GET", "/"), hsts=False)

    run(main(), 60)


def refused_403(answer: Answer, says: str, *, api: bool = True) -> None:
    assert answer.status == 403, answer
    assert answer.headers.get(ERROR_HEADER) == "true", answer
    assert answer.text.startswith("refused: "), answer
    assert says in answer.text, answer
    assert_browser_headers(answer, api=api)


def test_cross_site_writes_are_refused_and_the_pages_own_pass(tmp_path: Path) -> None:
    async def main() -> None:
        async with face(tmp_path) as hub:
            own = f"http://{HOST}:{hub.port}"
            # What Chromium sends for a form on http://evil.example posting to the hub
            form = (f"POST /api/echo HTTP/1.1\r\nHost: {HOST}:{hub.port}\r\n"
                    "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 9\r\n"
                    "Origin: http://evil.example\r\nSec-Fetch-Site: cross-site\r\n"
                    "Sec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\n\r\n"
                    "name=evil").encode()  # fmt: skip
            answer, closed = await raw_exchange(hub.port, form)
            refused_403(answer, "Sec-Fetch-Site")
            assert closed  # (and its body never read)
            # A fetch from another origin, even with the header and JSON
            evil = {**ADMIN, "Origin": "http://evil.example"}
            answer = await hub.request("POST", "/api/echo", data=b"{}", headers=evil)
            refused_403(answer, "Origin")
            # A form cannot send the header: without it, refused even with no Origin at all
            answer = await hub.request("POST", "/api/echo", data=b"name=x",
                                       headers={"Content-Type": "text/plain"})  # fmt: skip
            refused_403(answer, "X-Tidewire-Request")
            # DNS rebinding: same-origin to the browser, but not a name of the hub's
            rebound = {**ADMIN, "Host": f"evil.example:{hub.port}",
                       "Origin": f"http://evil.example:{hub.port}"}  # fmt: skip
            refused_403(await hub.request("POST", "/api/echo", data=b"{}", headers=rebound),
                        "Host")  # fmt: skip
            assert hub.echoed == []

            # The hub's own page, and a script with the header: both reach the route
            same = {**ADMIN, "Origin": own, "Sec-Fetch-Site": "same-origin"}
            answer = await hub.request("POST", "/api/echo", data=b'{"a":1}', headers=same)
            assert answer.status == 200, answer
            answer = await hub.request("POST", "/api/echo", data=b'{"b":2}', headers=ADMIN)
            assert answer.status == 200, answer
            assert hub.echoed == [b"application/json"] * 2

    run(main(), 60)


def test_rsio_over_http_from_clients_that_are_not_browsers(tmp_path: Path) -> None:
    async def main() -> None:
        async with face(tmp_path) as hub:
            await append(hub.hub, "orders", [b"a", b"b", b"c"])
            async with HttpHub(hub.base) as client:  # no Origin, no Sec-Fetch-Site
                got: list[bytes] = []
                async for batch in client.subscribe("orders", until_id=3):
                    got += [batch.value(i) for i in range(len(batch))]
                assert got == [b"a", b"b", b"c"]
            # the same subscription from a page on another site: refused before it exists
            answer = await hub.request("PUT", "/rsio/pub/orders?request=4",
                                       headers={"Origin": "http://evil.example"})  # fmt: skip
            refused_403(answer, "Origin", api=False)
            answer = await hub.request("PUT", "/rsio/pub/orders?request=4",
                                       headers={"Origin": f"http://{HOST}:{hub.port}"})  # fmt: skip
            assert answer.status == 201, answer

    run(main(), 60)
