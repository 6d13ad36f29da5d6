"""Identity and hygiene under attack (issue 20, items 6 and 7 outside the protocols), against
a real hub (``tidewire serve``, tests/security/harness.py) unless a clock must be injected:

* a token that expires while its RS.io connection is open is refused at the next subscribe
  and offer (in process, with an injected clock: no waiting for the expiry);
* SIGHUP reloads the tokens and the ACL: a revoked token, and one whose new entry has expired,
  are refused at the open connection's next decision; a bad file keeps the old policy; a
  bystander publishing and subscribing meanwhile sees no stall;
* a token name holding a newline, a forged log line and ANSI escapes stays on its own line,
  escaped, in text and in JSON logs, and no secret is logged;
* ``read = ["*"]`` does not reach ``_tidewire.*``; a pattern naming it does;
* a stream name with a zero-width character or not in NFC is refused on the wire;
* connections count per network prefix (``limits.peer_prefix_v4``), from 127.0.0.1, .2, .3.

Every test is bounded in time (``run``'s timeout, ``asyncio.timeout``) and stops what it
starts; the hub listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

import aiohttp
import pytest
from harness import BYSTANDER_MAX_STALL_S, RealHub, bystander, real_hub

import tidewire
from helpers import run, until
from stacks import read_rsio, stack
from tidewire.client.rsio import RsioClient, RsioError
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.model import LogClosedError
from tidewire.protocols.rsio import EXT_AUTH, Authenticate, ClientHello, Decoder, encode
from tidewire.protocols.rsio.messages import Goodbye

EVERYONE = '[principal."token:*"]\nread = ["*"]\nwrite = ["*"]\n'
NOW = 1_800_000_000.0


async def _first(client: RsioClient, stream: str) -> bytes:
    """The first value of ``stream`` (which has one), or the subscription's error. (Each test
    subscribes at most once per connection before the refusal it expects: the client may
    reuse the id of a subscription left early before its cancel reaches the hub.)"""
    async with asyncio.timeout(10):
        async for batch in client.subscribe(stream):
            return bytes(batch.value(0))
    raise AssertionError("the subscription completed empty")


# --------------------------------------------------------------------------- expiry (in process)


def test_a_token_expiring_on_an_open_rsio_connection_is_refused_at_the_next_decision(
    tmp_path: Path,
) -> None:
    token, table = mint_token("ci", days=1, now=NOW)
    clock = [NOW]
    access = Access(Acl.parse(EVERYONE), Tokens.parse(table), clock=lambda: clock[0])

    async def main() -> None:
        async with stack(tmp_path, access=access) as s:
            url = f"rsio://127.0.0.1:{s.rsio.port}"
            async with await tidewire.connect(url, token=token) as client:
                await client.publish("orders", [b"first"])  # granted
                clock[0] = NOW + 86400  # the expiry: no timer, the next decision reads the clock
                with pytest.raises(RsioError, match=r"token:ci: its token expired"):
                    await _first(client, "orders")
                with pytest.raises(RsioError, match=r"unauthenticated: token:ci: its token exp"):
                    await client.publish("orders", [b"late"])
                assert s.hub.storage.latest("orders") == 1  # nothing written after the expiry
            with pytest.raises(LogClosedError, match="authentication failed: token:ci expired"):
                async with await tidewire.connect(url, token=token) as again:
                    await _first(again, "orders")

    run(main(), timeout=60)


# --------------------------------------------------------------------------- reload (real hub)


def _tables(hub: RealHub) -> dict[str, str]:
    """The tokens file the harness wrote, as its ``[token."<name>"]`` tables by name."""
    text = (hub.log_path.parent / "tokens.toml").read_text()
    out = {}
    for table in re.split(r"(?m)^(?=\[token\.)", text):
        match = re.match(r'\[token\."([^"]+)"\]', table)
        if match:
            out[match[1]] = table.strip() + "\n"
    return out


async def _logged(hub: RealHub, text: str, count: int = 1) -> None:
    """Until ``text`` is in the hub's log ``count`` times (the signal is handled by then)."""
    await until(lambda: hub.log_text().count(text) >= count, f"{text!r} in the hub's log",
                seconds=20, details=hub.log_text)  # fmt: skip


def test_sighup_revokes_and_expires_tokens_on_open_connections(tmp_path: Path) -> None:
    with real_hub(tmp_path, tokens=["good", "ci", "etl"], acl=EVERYONE) as hub:
        tables = _tables(hub)
        tokens_file = hub.log_path.parent / "tokens.toml"
        acl_file = hub.log_path.parent / "acl.toml"

        async def attack() -> None:
            url = hub.rsio_url
            async with await tidewire.connect(url, token=hub.tokens["ci"]) as ci, \
                    await tidewire.connect(url, token=hub.tokens["etl"]) as etl:  # fmt: skip
                await ci.publish("orders", [b"v1"])
                await etl.publish("orders", [b"v2"])
                # a broken ACL file: not reloaded, the policy in force stays
                acl_file.write_text("[principal.x]\nread = 5\n")
                hub.signal(signal.SIGHUP)
                await _logged(hub, "SIGHUP: not reloaded, the policy in force stays")
                await ci.publish("orders", [b"v3"])
                # ci revoked, etl's entry now expired, the ACL back: reloaded
                acl_file.write_text(EVERYONE)
                expired = tables["etl"] + "expires = 2020-01-01T00:00:00Z\n"
                tokens_file.write_text(tables["good"] + expired)
                hub.signal(signal.SIGHUP)
                await _logged(hub, "SIGHUP: reloaded the access policy: 2 token(s), 1 ACL")
                with pytest.raises(RsioError, match=r"token:ci: its token was revoked"):
                    await _first(ci, "orders")
                with pytest.raises(RsioError, match=r"token:etl: its token expired"):
                    await _first(etl, "orders")
                with pytest.raises(RsioError, match=r"unauthenticated: token:ci: its token was"):
                    await ci.publish("orders", [b"after revocation"])
            with pytest.raises(LogClosedError, match=r"invalid token \(claimed token:ci\)"):
                async with await tidewire.connect(hub.rsio_url, token=hub.tokens["ci"]) as c:
                    await _first(c, "orders")

        async def main() -> None:
            _, report = await asyncio.gather(attack(), bystander(hub, 3.0,
                                                                 token=hub.tokens["good"]))
            assert report.errors == []
            assert report.max_stall_s < BYSTANDER_MAX_STALL_S + report.machine_stall_s, report

        run(main(), timeout=90)
        log = hub.log_text()
        for token in hub.tokens.values():
            assert token.rsplit(".", 1)[1] not in log  # no secret, ever


# --------------------------------------------------------------------------- log forgery


FORGED = "x\n2026-11-25 21:00:00,000 WARNING tidewire: \x1b[32madmin in\x1b[0m"
"""A token name that, logged raw, would end the line and print a green line of its own."""


async def _authenticate_raw(hub: RealHub, token: str) -> Goodbye:
    """A raw RS.io connection that presents ``token`` (which the client library would not
    send); the hub's goodbye."""
    reader, writer = await asyncio.open_connection("127.0.0.1", hub.rsio_port)
    try:
        writer.write(bytes(encode(ClientHello(extensions=(EXT_AUTH,)))))
        decoder = Decoder()
        await read_rsio(reader, decoder, 1)  # its hello
        writer.write(bytes(encode(Authenticate(token))))
        (goodbye,) = await read_rsio(reader, decoder, 1)
        assert isinstance(goodbye, Goodbye), goodbye
        return goodbye
    finally:
        writer.close()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_token_name_cannot_forge_a_log_line(tmp_path: Path, log_format: str) -> None:
    settings = {"log_format": log_format}
    with real_hub(tmp_path, tokens=["good"], acl=EVERYONE, settings=settings) as hub:
        goodbye = run(_authenticate_raw(hub, FORGED + ".topsecret"), timeout=30)
        assert "authentication failed: invalid token" in goodbye.reason
        run(_logged(hub, "authentication failed"), timeout=30)
        log = hub.log_text()
    assert "topsecret" not in log
    assert "\x1b" not in log
    lines = [line for line in log.splitlines() if "authentication failed" in line]
    assert len(lines) == 1, lines
    assert not any(line.startswith("2026-11-25 21:00:00,000") for line in log.splitlines())
    escaped = "claimed token:x\\n2026-11-25 21:00:00,000 WARNING tidewire: \\x1b[32madmin in"
    if log_format == "json":
        record = json.loads(lines[0])
        assert escaped in record["message"]
        assert record["principal"] == "anonymous"
    else:
        assert escaped in lines[0]


BAD_REQUESTS = [
    b"GET /rsio/pub/x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ci.SECRET1\x01\r\n\r\n",
    b"GET /x?token=ci.SECRET2\x7f HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /x?token=ci.SECRET3" + b"a" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
]


def test_a_request_the_http_parser_refuses_is_logged_without_its_bytes(tmp_path: Path) -> None:
    """aiohttp's parser quotes the refused line in its error; the hub's log line keeps only the
    reason, so a token in that line (a URL's query, an Authorization header) is not logged."""
    with real_hub(tmp_path) as hub:

        async def main() -> None:
            for request in BAD_REQUESTS:
                reader, writer = await asyncio.open_connection("127.0.0.1", hub.http_port)
                writer.write(request)
                async with asyncio.timeout(10):
                    assert (await reader.read()).startswith(b"HTTP/1.")
                writer.close()
            await _logged(hub, "(answered 4", len(BAD_REQUESTS))

        run(main(), timeout=30)
        log = hub.log_text()
    assert "SECRET" not in log
    assert "(answered 400): BadHttpMessage: Invalid header value char" in log
    assert "(answered 400): LineTooLong: Got more than" in log


# --------------------------------------------------------------------------- names and the ACL


def test_a_star_does_not_read_the_hubs_own_streams(tmp_path: Path) -> None:
    acl = EVERYONE + '[principal."token:ops"]\nread = ["_tidewire.*"]\n'
    with real_hub(tmp_path, tokens=["ci", "ops"], acl=acl) as hub:

        async def main() -> None:
            async with await tidewire.connect(hub.rsio_url, token=hub.tokens["ci"]) as ci:
                with pytest.raises(RsioError, match=r"forbidden: token:ci may not read stream "
                                                    r"'_tidewire\.tolliver'"):  # fmt: skip
                    await _first(ci, "_tidewire.tolliver")
            async with await tidewire.connect(hub.rsio_url, token=hub.tokens["ops"]) as ops:
                assert await _first(ops, "_tidewire.tolliver")  # the hub's Tolliver UUID

        run(main(), timeout=60)


@pytest.mark.parametrize(
    ("encoded", "why"),
    [
        ("pay%E2%80%8Broll", "U+200B"),  # zero-width space
        ("evil%E2%80%AEtxt", "U+202E"),  # right-to-left override
        ("cafe%CC%81", "NFC"),  # e + combining acute accent
    ],
)
def test_a_look_alike_stream_name_is_refused_on_the_wire(
    tmp_path: Path, encoded: str, why: str
) -> None:
    with real_hub(tmp_path) as hub:

        async def main() -> None:
            async with aiohttp.ClientSession() as session:
                url = f"{hub.http_base}/rsio/pub/{encoded}?request=1"
                async with session.put(url) as answer:
                    assert answer.status == 400
                    assert why in await answer.text()

        run(main(), timeout=30)


# --------------------------------------------------------------------------- admission


async def _rsio_from(hub: RealHub, source: str) -> tuple[asyncio.StreamReader,
                                                         asyncio.StreamWriter]:  # fmt: skip
    return await asyncio.open_connection("127.0.0.1", hub.rsio_port, local_addr=(source, 0))


def test_connections_count_per_network_prefix(tmp_path: Path) -> None:
    settings = {"limits.max_connections_per_peer": 2, "limits.peer_prefix_v4": 24}
    with real_hub(tmp_path, settings=settings) as hub:

        async def main() -> None:
            writers = []
            for source in ("127.0.0.1", "127.0.0.2"):
                reader, writer = await _rsio_from(hub, source)
                writer.write(bytes(encode(ClientHello())))
                await read_rsio(reader, Decoder(), 1)  # admitted: its hello
                writers.append(writer)
            reader, writer = await _rsio_from(hub, "127.0.0.3")  # another address, same /24
            async with asyncio.timeout(10):
                refused = await reader.read()
            writer.close()
            assert b"too many connections from 127.0.0.0/24 (the limit is 2)" in refused
            for w in writers:
                w.close()

        run(main(), timeout=30)
        assert "too many connections from 127.0.0.0/24" in hub.log_text()
