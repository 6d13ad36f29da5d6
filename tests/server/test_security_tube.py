"""Security and limits (issue 9) of Tube (RS.io over WebSocket) on the guarded HTTP listener,
over real sockets on 127.0.0.1:

* the upgrade: a wrong or expired bearer token gets 401 (``X-Rsio-Error: true``,
  ``WWW-Authenticate``) before any WebSocket, and the client raises ``Unauthenticated``;
* the principal: the upgrade's token, else the client certificate (WSS with mutual TLS), else
  anonymous, is who the RS.io side runs as; a browser's way, RS.io's in-band ``authenticate``
  (extension 2), works over Tube as well;
* the ACL inside RS.io: subscribing to or publishing into a stream not granted is refused in
  RS.io's words (onError, the offer ended), logged naming the principal, and the connection's
  other subscriptions carry on;
* limits: Tube connections count against the connections per peer (one over: 503 on the
  upgrade, the others carry on); a message over the fragment size still closes with 1009.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import aiohttp
import pytest
from playwright.async_api import async_playwright

from certs import Pki
from helpers import until
from http_hub import (
    ALICE,
    BOB,
    OLD,
    Served,
    bearer,
    policy,
    secure_hub,
)
from loops import Run, logged
from tidewire.client import tube
from tidewire.client.rsio import RsioClient, RsioError
from tidewire.client.tube import TubeStream
from tidewire.hub.access import ANONYMOUS, Principal
from tidewire.model import Batch, Unauthenticated
from tidewire.protocols.rsio_http import ERROR_HEADER
from tidewire.protocols.tube import push_varint
from tidewire.server.app import TUBE_CONNECTIONS_KEY
from tidewire.server.guard import ConnectionLimits
from tidewire.server.tube import TubeSettings

Runner = Run


def tube_url(served: Served) -> str:
    return served.base.replace("http", "ws", 1) + "/tube"


def principals(served: Served) -> list[Principal]:
    return [p.principal for p in served.app[TUBE_CONNECTIONS_KEY]]


def values_of(batch: Batch) -> list[bytes]:
    return [e.value for e in batch]


async def read_all(client: RsioClient, stream: str, until_id: int) -> list[bytes]:
    out: list[bytes] = []
    async for batch in client.subscribe(stream, until_id=until_id):
        out += values_of(batch)
    return out


# --------------------------------------------------------------------------- the upgrade


@pytest.mark.parametrize("token", ["alice.not-the-secret", "expired", "Basic"])
def test_a_bad_token_on_the_upgrade_is_401(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture, token: str
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING, "tidewire.http")
        headers = {"expired": bearer(OLD), "Basic": {"Authorization": f"Basic {ALICE}"}}.get(
            token, bearer(token))  # fmt: skip
        async with secure_hub(tmp_path, access=policy()) as served:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(tube_url(served), headers=headers)
            assert refused.value.status == 401
            assert refused.value.headers is not None
            assert refused.value.headers[ERROR_HEADER] == "true"
            assert refused.value.headers["WWW-Authenticate"] == (
                'Bearer realm="tidewire", error="invalid_token"')  # fmt: skip
            await logged(caplog, "tidewire.http", "/tube", "401")
            if token != "Basic":
                with pytest.raises(Unauthenticated, match="401"):
                    await tube.connect(tube_url(served), token=OLD if token == "expired" else token)
            assert principals(served) == []
            async with tube.connect(tube_url(served), token=ALICE) as hub:  # the right one
                await hub.ready()
                assert principals(served) == [Principal("token:alice")]

    run(main())


def test_the_upgrade_token_is_the_rsio_principal(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with secure_hub(tmp_path, access=policy()) as served:
            async with tube.connect(tube_url(served), token=ALICE) as hub:
                receipt = await hub.publish("orders", [b"a", b"b"])
                assert await read_all(hub, "orders", receipt.last_id) == [b"a", b"b"]
                assert principals(served) == [Principal("token:alice")]
            async with tube.connect(tube_url(served)) as hub:  # no credentials
                await hub.ready()
                assert principals(served) == [ANONYMOUS]

    run(main())


def test_a_client_certificate_names_the_tube_principal(
    pki: Pki, tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        carol = pki.client_context(pki.client("carol"))
        async with secure_hub(tmp_path, tls=pki.server_context("optional"), access=policy(),
                              client_tls=carol) as served:  # fmt: skip
            url = tube_url(served)
            assert url.startswith("wss://")
            async with tube.connect(url, ssl=carol) as hub:
                receipt = await hub.publish("orders", [b"over", b"wss"])
                assert await read_all(hub, "orders", receipt.last_id) == [b"over", b"wss"]
                assert principals(served) == [Principal("cert:carol")]
            # A token names the peer over its certificate.
            async with tube.connect(url, ssl=carol, token=ALICE) as hub:
                await hub.ready()
                assert principals(served) == [Principal("token:alice")]
            # Without a certificate ("optional"): anonymous, which may read nothing here.
            async with tube.connect(url, ssl=pki.client_context(None)) as hub:
                await hub.ready()
                assert principals(served) == [ANONYMOUS]
                with pytest.raises(RsioError, match="forbidden"):
                    await read_all(hub, "orders", receipt.last_id)

    run(main())


def test_in_band_authenticate_over_tube(tmp_path: Path, run: Runner) -> None:
    """A browser cannot set headers on a WebSocket: RS.io's extension 2 names it instead."""

    async def main() -> None:
        async with secure_hub(tmp_path, access=policy()) as served:
            stream = await TubeStream.open(tube_url(served))
            client = RsioClient(stream, stream, token=ALICE)
            try:
                await client.ready()
                assert client.principal == "token:alice"
                receipt = await client.publish("orders", [b"in band"])
                assert await read_all(client, "orders", receipt.last_id) == [b"in band"]
            finally:
                await client.close()

    run(main())


# --------------------------------------------------------------------------- the ACL


def test_subscribing_to_a_stream_not_granted_is_onerror(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING, "tidewire.rsio")
        async with secure_hub(tmp_path, access=policy()) as served:
            batch = await served.hub.append(Batch.build("public.news", [b"hi"]), assign_ids=True)
            await served.hub.append(Batch.build("orders", [b"secret"]), assign_ids=True)
            async with tube.connect(tube_url(served), token=BOB) as hub:
                with pytest.raises(RsioError, match="token:bob may not read stream 'orders'"):
                    await read_all(hub, "orders", 1)
                await logged(caplog, "tidewire.rsio", "token:bob", "orders")
                # the connection carries on with what bob may read
                assert await read_all(hub, "public.news", batch.last_id) == [b"hi"]

    run(main())


def test_publishing_into_a_stream_not_granted_is_refused(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING, "tidewire.rsio")
        async with secure_hub(tmp_path, access=policy()) as served:
            async with tube.connect(tube_url(served), token=BOB) as hub:
                with pytest.raises(RsioError, match="token:bob may not write stream 'orders'"):
                    await hub.publish("orders", [b"forged"])
                await logged(caplog, "tidewire.rsio", "token:bob", "write")
                assert served.hub.stream_names() == []  # nothing was written
            async with tube.connect(tube_url(served), token=ALICE) as hub:
                receipt = await hub.publish("orders", [b"fine"])
                assert receipt.count == 1

    run(main())


# --------------------------------------------------------------------------- limits


def test_tube_connections_count_against_the_connections_per_peer(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        limits = ConnectionLimits(max_connections_per_peer=2)
        async with secure_hub(tmp_path, limits=limits) as served:
            async with tube.connect(tube_url(served)) as one, tube.connect(tube_url(served)) as two:
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await tube.connect(tube_url(served))
                assert refused.value.status == 503
                assert refused.value.headers is not None
                assert refused.value.headers[ERROR_HEADER] == "true"
                for hub, value in ((one, b"1"), (two, b"2")):  # they carry on
                    receipt = await hub.publish("s", [value])
                    assert receipt.count == 1
            await until(lambda: served.admission.total == 0, "both are gone")
            async with tube.connect(tube_url(served)) as three:
                assert (await three.publish("s", [b"3"])).count == 1

    run(main())


def test_a_message_over_the_fragment_size_still_closes_1009(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with (
            secure_hub(tmp_path, tube=TubeSettings(fragment_size=1024)) as served,
            aiohttp.ClientSession() as session,
        ):
            async with session.ws_connect(tube_url(served)) as ws:
                await ws.send_bytes(push_varint(0))
                assert (await ws.receive(timeout=5)).type == aiohttp.WSMsgType.BINARY
                await ws.send_bytes(b"\x01" + bytes(2048))
                for _ in range(10):
                    message = await ws.receive(timeout=5)
                    if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                        break
                assert ws.close_code == 1009
            async with tube.connect(tube_url(served)) as hub:  # others carry on
                assert (await hub.publish("s", [b"x"])).count == 1

    run(main())


# --------------------------------------------------------------------------- the browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

# In the page: the hub's ES module, a token in-band, then what a subscription gets (or why not).
BROWSER_READ = """async ([url, token, stream, count]) => {
  const { RsioOverTube, decodeEnvelope } = await import("/static/tube.js");
  const hub = new RsioOverTube(url, { token });
  try { await hub.ready; } catch (e) { return { refused: String(e.message) }; }
  const values = await new Promise((resolve) => {
    const got = [];
    hub.subscribe(stream, count, (element) => {
      got.push(new TextDecoder().decode(decodeEnvelope(element).value));
      if (got.length === count) resolve(got);
    }, { onError: (reason) => resolve({ onError: reason }) });
  });
  const principal = hub.principal;
  hub.close();
  return { principal, values };
}"""


def test_a_browser_authenticates_in_band_over_tube(tmp_path: Path) -> None:
    """A browser cannot set ``Authorization`` on a WebSocket: tube.js sends the token in RS.io's
    ``authenticate`` (extension 2); the hub's ACL then applies to what it asks."""
    if not Path(CHROMIUM).exists():
        pytest.fail("no chromium: ./tw test installs Debian's chromium package")

    async def main() -> None:
        async with secure_hub(tmp_path, access=policy()) as served, async_playwright() as pw:
            await served.hub.append(Batch.build("orders", [b"one", b"two"]), assign_ids=True)
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = await browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                await page.goto(served.base + "/healthz")
                url = tube_url(served)
                got = await page.evaluate(BROWSER_READ, [url, ALICE, "orders", 2])
                assert got == {"principal": "token:alice", "values": ["one", "two"]}
                got = await page.evaluate(BROWSER_READ, [url, BOB, "orders", 2])
                assert got == {"principal": "token:bob", "values": {
                    "onError": "forbidden: token:bob may not read stream 'orders'"}}  # fmt: skip
                got = await page.evaluate(BROWSER_READ, [url, "bob.wrong", "orders", 2])
                assert "authentication failed" in got["refused"], got
                assert errors == []
            finally:
                await browser.close()

    async def bounded() -> None:
        async with asyncio.timeout(60):
            await main()

    asyncio.run(bounded())
