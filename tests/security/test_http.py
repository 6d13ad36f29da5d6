"""Security and limits (issue 9) of the HTTP listener: the admin endpoints and RS.io over HTTP
behind the guard, over real sockets on 127.0.0.1.

* TLS end to end (HTTPS for RS.io over HTTP, WSS for Tube publishing into it), with mutual TLS
  required: no certificate, an expired one, an untrusted one, each refused at the handshake and
  logged;
* bearer tokens: none, wrong, expired, malformed -> 401 with ``X-Rsio-Error: true`` and
  ``WWW-Authenticate``; the ACL: a stream not granted -> 403 and a log line naming the
  principal; a subscription URL used by another principal -> 403, its owner unharmed;
* limits, each just under (passes) and just over (refused in HTTP's words), others carrying on:
  connections per peer (503), slow headers (408, also on a later and a pipelined request), a
  slow body (408), a body over ``max_body_bytes`` (413, with a length and chunked), and 500
  slowloris connections: the process's RSS stays bounded and one sweep ends them all.

Deadlines are driven by calling the listener's ``sweep`` with a chosen time, never by sleeping;
every test runs under a time bound, on asyncio's loop and on uvloop. Certificates are made by
trustme at test time (tests/certs.py), tokens by ``mint_token``.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import re
import ssl
from pathlib import Path

import aiohttp
import pytest
from harness import RealHub, assert_served, bystander, real_hub
from http_attacks import (
    bad_requests,
    declared_bodies,
    never_fetched,
    raw_answer,
    secret_of,
    subscribe_many,
    token_urls,
)
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

import tidewire
from certs import Pki
from helpers import own_rss, run, until
from http_hub import (
    ALICE,
    BOB,
    HOST,
    OLD,
    TOKENS,
    KiB,
    MiB,
    append,
    bearer,
    eof,
    healthy,
    one_in,
    phase_of,
    policy,
    raw,
    refused,
    response,
    secure_hub,
    server_errors,
)
from loops import Run, logged, warnings
from tidewire.client import tube
from tidewire.client.backoff import Retry
from tidewire.client.http import HttpHub, HttpRsioError
from tidewire.hub import BudgetLimits, Hub
from tidewire.hub.access import Access
from tidewire.protocols.rsio.names import PublisherName
from tidewire.protocols.rsio_http import BadRequest, decode_body
from tidewire.server.app import RSIO_HTTP_KEY
from tidewire.server.guard import ConnectionLimits
from tidewire.server.rsio_http import HttpSettings, escaped, publisher_name

Runner = Run


# --------------------------------------------------------------------------- TLS


def test_https_end_to_end_with_client_certificates(pki: Pki, tmp_path: Path, run: Runner) -> None:
    """carol's certificate is her principal: she publishes over WSS and reads over HTTPS."""

    async def main() -> None:
        carol = pki.client_context(pki.client("carol"))
        async with secure_hub(tmp_path, tls=pki.server_context("required"), client_tls=carol,
                              access=policy()) as served:  # fmt: skip
            ws_url = served.base.replace("https://", "wss://") + "/tube"
            async with tube.connect(ws_url, ssl=carol) as hub:
                receipt = await hub.publish("orders", [b"one", b"two", b"three"])
            last = receipt.last_id
            async with HttpHub(served.base, ssl=carol) as http:
                got = [v async for vs in http.subscribe_values("orders", until_id=last)
                       for v in vs]  # fmt: skip
            assert got == [b"one", b"two", b"three"]
            answer = await served.put("/rsio/pub/orders?request=1")
            assert answer.status == 201, answer
            assert answer.headers["Location"].startswith(served.base + "/rsio/sub/")
            listing = await served.get("/streams")
            assert [s["name"] for s in json.loads(listing.body)] == ["orders"]

    run(main())


@pytest.mark.parametrize("certificate", ["none", "expired", "untrusted"])
def test_mutual_tls_refuses_a_bad_client_certificate_at_the_handshake(
    pki: Pki, tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture, certificate: str
) -> None:
    async def main() -> None:
        cert = {"none": None, "expired": pki.client("carol", expired=True),
                "untrusted": pki.client("carol", untrusted=True)}[certificate]  # fmt: skip
        caplog.set_level(logging.WARNING, "tidewire.guard")
        async with secure_hub(tmp_path, tls=pki.server_context("required"),
                              client_tls=pki.client_context(cert)) as served:  # fmt: skip
            with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                await served.get("/healthz")
            line = await logged(caplog, "tidewire.guard", "http", "TLS handshake failed")
            assert HOST in line
            await until(lambda: served.admission.total == 0, "the connection is released")
            good = pki.client_context(pki.client("carol"))  # (and a good one gets in)
            async with (
                aiohttp.ClientSession() as session,
                session.get(served.base + "/healthz", ssl=good) as answer,
            ):
                assert answer.status == 200

    run(main())


def test_https_without_trusting_the_hub_is_refused_by_the_client(
    pki: Pki, tmp_path: Path, run: Runner
) -> None:
    """Clients verify the hub too: the default context does not know the test CA."""

    async def main() -> None:
        async with (
            secure_hub(tmp_path, tls=pki.server_context("none")) as served,
            HttpHub(served.base, retries=0) as http,
        ):
            with pytest.raises(HttpRsioError, match="certificate"):
                async for _ in http.subscribe_values("orders"):
                    pass

    run(main())


# --------------------------------------------------------------------------- tokens


def test_missing_wrong_expired_or_malformed_credentials_get_401(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING, "tidewire.http")
        async with secure_hub(tmp_path, access=policy()) as served:
            await append(served.hub, "orders", [b"a"])
            answer = await served.put("/rsio/pub/orders?request=1")  # anonymous: not granted
            refused(answer, 401)
            assert answer.headers["WWW-Authenticate"] == 'Bearer realm="tidewire"'
            assert answer.text == "refused: may not read stream 'orders'\n"  # (names no one)
            cases = {
                "wrong": {"Authorization": "Bearer alice.not-the-secret"},
                "unknown": {"Authorization": "Bearer mallory.secret"},
                "expired": {"Authorization": f"Bearer {OLD}"},
                "no name": {"Authorization": "Bearer nodot"},
                "not bearer": {"Authorization": f"Basic {ALICE}"},
                "empty": {"Authorization": "Bearer "},
            }
            for case, headers in cases.items():
                answer = await served.put("/rsio/pub/orders?request=1", headers=headers)
                refused(answer, 401)
                assert answer.headers["WWW-Authenticate"] == (
                    'Bearer realm="tidewire", error="invalid_token"'), (case, answer)  # fmt: skip
            assert "token:old expired" in (await served.put("/rsio/pub/orders", OLD)).text
            line = await logged(caplog, "tidewire.http", "401", "claimed token:alice")
            assert "/rsio/pub/orders" in line
            # The right token, at last.
            answer = await served.put("/rsio/pub/orders?request=1", ALICE)
            assert answer.status == 201, answer
            sub = answer.headers["Location"]
            refused(await served.put(sub, "alice.wrong"), 401)  # (the subscription lives on)
            answer = await served.put(sub, ALICE)
            assert answer.status == 200, answer

    run(main())


def test_the_http_client_sends_its_token(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with secure_hub(tmp_path, access=policy()) as served:
            batch = await append(served.hub, "orders", [b"a", b"b"])
            async with HttpHub(served.base, token=ALICE) as http:
                got = [v async for vs in http.subscribe_values("orders", until_id=batch.last_id)
                       for v in vs]  # fmt: skip
                assert got == [b"a", b"b"]
            for token, status in (("alice.wrong", 401), (BOB, 403), (None, 401)):
                async with HttpHub(served.base, token=token) as http:
                    with pytest.raises(HttpRsioError) as failed:
                        async for _ in http.subscribe_values("orders"):
                            pass
                    assert (failed.value.status, failed.value.rsio) == (status, True)

    run(main())


def test_two_authorization_headers_are_refused(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with secure_hub(tmp_path, access=policy()) as served:
            reader, writer = await raw(served)
            writer.write(b"PUT /rsio/pub/orders HTTP/1.1\r\nHost: hub\r\n"
                         b"Authorization: Bearer " + ALICE.encode() + b"\r\n"
                         b"Authorization: Bearer " + BOB.encode() + b"\r\n\r\n")  # fmt: skip
            refused(await response(reader), 401)
            writer.close()

    run(main())


def test_without_an_acl_a_wrong_token_is_still_401(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with secure_hub(tmp_path, access=Access(tokens=TOKENS)) as served:
            assert (await served.put("/rsio/pub/orders")).status == 201  # open: anyone
            assert (await served.put("/rsio/pub/orders", BOB)).status == 201
            refused(await served.put("/rsio/pub/orders", "bob.wrong"), 401)

    run(main())


# --------------------------------------------------------------------------- the ACL


def test_reading_a_stream_not_granted_is_403_and_logged_with_the_principal(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING, "tidewire.http")
        async with secure_hub(tmp_path, access=policy()) as served:
            await append(served.hub, "orders", [b"secret"])
            await append(served.hub, "public.news", [b"hello"])
            for publisher in ("orders", "orders?format=value", "orders?format=records"):
                answer = await served.put(f"/rsio/pub/{publisher}", BOB)
                refused(answer, 403)
                assert "WWW-Authenticate" not in answer.headers
                assert answer.text == "refused: may not read stream 'orders'\n"  # names no one
            line = await logged(caplog, "tidewire.http", "403", "token:bob")
            assert "/rsio/pub/orders" in line
            assert HOST in line
            # What is granted works, for both.
            for token, stream, value in ((BOB, "public.news", b"hello"),
                                         (ALICE, "orders", b"secret")):  # fmt: skip
                answer = await served.put(f"/rsio/pub/{stream}?format=value&request=1", token)
                assert answer.status == 201, answer
                answer = await served.put(answer.headers["Location"], token)
                assert (answer.status, answer.body) == (200, value), answer

    run(main())


def test_a_subscription_answers_only_the_principal_that_made_it(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING, "tidewire.http")
        async with secure_hub(tmp_path, access=policy()) as served:
            await append(served.hub, "public.news", [b"a", b"b", b"c"])
            answer = await served.put("/rsio/pub/public.news?format=value&request=1", ALICE)
            assert answer.status == 201
            sub = answer.headers["Location"]
            # bob may read the stream, but this subscription is alice's
            for url in (sub, sub + "?request=5", sub + "/requestMore=5", sub + "/cancel"):
                answer = await served.put(url, BOB)
                refused(answer, 403)
                assert answer.text == ("refused: may not use this subscription (another "
                                       "principal made it)\n"), answer  # names no one
            refused(await served.put(sub), 401)  # anonymous: credentials would help
            await logged(caplog, "tidewire.http", "403", "refused token:bob")
            # alice's subscription is untouched: nothing was requested, nothing cancelled
            answer = await served.put(sub, ALICE)
            assert (answer.status, answer.body) == (200, b"a"), answer
            answer = await served.put(sub + "?request=2", ALICE)
            assert decode_body(answer.headers.get("Content-Encoding"), answer.body) == [
                b"b", b"c"]  # fmt: skip

    run(main())


def test_streams_lists_what_the_principal_may_read_and_open_paths_stay_open(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with secure_hub(tmp_path, access=policy()) as served:
            await append(served.hub, "orders", [b"x"])
            await append(served.hub, "public.news", [b"y"])

            async def names(token: str | None) -> list[str]:
                answer = await served.get("/streams", token)
                assert answer.status == 200, answer
                return sorted(s["name"] for s in json.loads(answer.body))

            assert await names(ALICE) == ["orders", "public.news"]
            assert await names(BOB) == ["public.news"]
            assert await names(None) == []
            refused(await served.get("/streams", "bob.wrong"), 401)
            for path in ("/healthz", "/static/tube.js", "/static/tail.html"):
                for token in (None, "bob.wrong"):
                    answer = await served.get(path, token)
                    assert answer.status == 200, (path, token, answer)
            answer = await served.put("/tail?stream=orders", method="GET")
            assert answer.status == 200  # (the redirect, followed)

    run(main())


# --------------------------------------------------------------------------- connections


def test_connections_per_peer_one_over_gets_503(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING, "tidewire.guard")
        limits = ConnectionLimits(max_connections_per_peer=3)
        async with secure_hub(tmp_path, limits=limits) as served:
            conns = [await raw(served) for _ in range(3)]  # just under: all served
            for reader, writer in conns:
                await healthy(reader, writer)
            reader, writer = await raw(served)  # one over
            answer = await response(reader)
            refused(answer, 503)
            assert answer.headers["Connection"] == "close"
            assert "too many connections from 127.0.0.1 (the limit is 3)" in answer.text
            assert await eof(reader)
            writer.close()
            assert served.listener.refused == 1
            await logged(caplog, "tidewire.guard", "refused", "too many connections")
            for reader, writer in conns:  # the first three carry on
                await healthy(reader, writer)
            conns[0][1].close()  # one leaves: one more may come
            await until(lambda: served.admission.total == 2, "the hub saw it leave")
            reader, writer = await raw(served)
            await healthy(reader, writer)
            for _, w in [*conns[1:], (reader, writer)]:
                w.close()

    run(main())


# --------------------------------------------------------------------------- slow clients


SLOW = HttpSettings(poll_seconds=5.0, header_seconds=5.0, body_seconds=7.0)
PATIENT = ConnectionLimits(handshake_seconds=30.0)  # (so that header_seconds decides)


def test_slow_headers_get_408_after_header_seconds_just_under_pass(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING, "tidewire.guard")
        async with secure_hub(tmp_path, settings=SLOW, limits=PATIENT) as served:
            other = await raw(served)
            await healthy(*other)
            reader, writer = await raw(served)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: hub\r\nX-Slow: a")
            conn = await one_in(served, "headers")
            assert conn.deadline is not None
            served.listener.sweep(conn.deadline - 0.01)  # just under
            writer.write(b"bc\r\n\r\n")
            answer = await response(reader)
            assert answer.status == 200, answer
            # The next request on the same connection gets header_seconds from its first byte.
            writer.write(b"GET /healthz HTTP/1.1\r\nHo")
            conn = await one_in(served, "headers")
            assert conn.deadline is not None
            first_byte = conn.deadline - SLOW.header_seconds
            assert first_byte <= asyncio.get_running_loop().time()
            served.listener.sweep(conn.deadline)  # just over
            answer = await response(reader)
            refused(answer, 408)
            assert answer.headers["Connection"] == "close"
            assert "request headers not complete within 5s" in answer.text
            assert await eof(reader)
            writer.close()
            await logged(caplog, "tidewire.guard", "closing", "request headers")
            await healthy(*other)  # the other connection carries on
            other[1].close()

    run(main())


def test_the_first_request_also_keeps_the_handshake_deadline(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        limits = ConnectionLimits(handshake_seconds=2.0)
        async with secure_hub(tmp_path, settings=SLOW, limits=limits) as served:
            reader, writer = await raw(served)
            await until(lambda: len(served.connections()) == 1, "the hub has the connection")
            (conn,) = served.connections()
            handshake = conn.deadline
            assert handshake is not None
            writer.write(b"GET /heal")
            await one_in(served, "headers")
            assert conn.deadline == handshake  # (sooner than the first byte + header_seconds)
            served.listener.sweep(handshake)
            refused(await response(reader), 408)
            assert await eof(reader)
            writer.close()
            # A connection that sends nothing at all is closed without an answer.
            reader, writer = await raw(served)
            await until(lambda: len(served.connections()) == 1, "the hub has the connection")
            (conn,) = served.connections()
            assert conn.deadline is not None
            served.listener.sweep(conn.deadline)
            assert await reader.read() == b""
            writer.close()

    run(main())


def test_a_pipelined_request_behind_a_long_poll_gets_its_header_deadline(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with secure_hub(tmp_path, settings=SLOW, limits=PATIENT) as served:
            answer = await served.put("/rsio/pub/s?format=value&request=1")
            sub_path = URL(answer.headers["Location"]).path
            reader, writer = await raw(served)
            writer.write(f"PUT {sub_path} HTTP/1.1\r\nHost: hub\r\n\r\n".encode())
            polling = await one_in(served, "handling")
            writer.write(b"GET /healthz HTTP/1.1\r\nX-")  # the next one, while it waits
            await until(lambda: getattr(polling.inner, "early", False), "the hub has its bytes")
            await append(served.hub, "s", [b"v"])
            answer = await response(reader)
            assert (answer.status, answer.body) == (200, b"v"), answer
            conn = await one_in(served, "headers")  # its deadline started when that ended
            assert conn.deadline is not None
            served.listener.sweep(conn.deadline)
            refused(await response(reader), 408)
            assert await eof(reader)
            writer.close()

    run(main())


def test_a_slow_body_gets_408_after_body_seconds(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with secure_hub(tmp_path, settings=SLOW, limits=PATIENT) as served:
            other = await raw(served)
            reader, writer = await raw(served)
            writer.write(b"PUT /rsio/pub/s HTTP/1.1\r\nHost: hub\r\nContent-Length: 100\r\n\r\n"
                         + bytes(10))  # fmt: skip
            conn = await one_in(served, "body")
            assert conn.deadline is not None
            served.listener.sweep(conn.deadline - 0.01)  # just under
            writer.write(bytes(80))
            await asyncio.sleep(0.01)
            assert phase_of(conn) == "body"
            served.listener.sweep(conn.deadline)  # just over
            answer = await response(reader)
            refused(answer, 408)
            assert "request body not complete within 7s" in answer.text
            assert answer.headers["Connection"] == "close"
            async with asyncio.timeout(2):  # at once: the rest of the body is not waited for
                assert await eof(reader)
            writer.close()
            # A body that comes in time is read (and dropped): the subscribe is answered.
            reader, writer = await raw(served)
            writer.write(b"PUT /rsio/pub/s HTTP/1.1\r\nHost: hub\r\nContent-Length: 100\r\n\r\n"
                         + bytes(10))  # fmt: skip
            conn = await one_in(served, "body")
            assert conn.deadline is not None
            served.listener.sweep(conn.deadline - 0.01)
            writer.write(bytes(90))
            assert (await response(reader)).status == 201
            await healthy(reader, writer)
            await healthy(*other)
            writer.close()
            other[1].close()

    run(main())
    assert not server_errors(caplog)


def test_a_body_over_max_body_bytes_gets_413_just_under_passes(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        settings = HttpSettings(max_body_bytes=4 * KiB)
        async with secure_hub(tmp_path, settings=settings) as served:
            assert (await served.put("/rsio/pub/s", data=bytes(4 * KiB))).status == 201
            answer = await served.put("/rsio/pub/s", data=bytes(4 * KiB + 1))
            refused(answer, 413)
            assert answer.text == "the request body is over 4096 bytes (http.max_body_bytes)\n"
            assert answer.headers["Connection"] == "close"
            # Refused by its length alone, at once: the body is neither waited for nor read.
            reader, writer = await raw(served)
            writer.write(b"PUT /rsio/pub/s HTTP/1.1\r\nHost: hub\r\n"
                         b"Content-Length: 1000000000\r\n\r\n" + bytes(100))  # fmt: skip
            refused(await response(reader), 413)
            async with asyncio.timeout(2):
                assert await eof(reader)
            writer.close()
            # Chunked: no length to refuse early; counted as it comes.
            for size, status in ((4 * KiB, 201), (4 * KiB + 1, 413)):
                reader, writer = await raw(served)
                writer.write(b"PUT /rsio/pub/s HTTP/1.1\r\nHost: hub\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
                for _ in range(size // 1024):
                    writer.write(b"400\r\n" + bytes(1024) + b"\r\n")
                if size % 1024:
                    writer.write(b"%x\r\n" % (size % 1024) + bytes(size % 1024) + b"\r\n")
                writer.write(b"0\r\n\r\n")
                answer = await response(reader)
                assert answer.status == status, answer
                if status == 413:
                    refused(answer, 413)
                    assert await eof(reader)
                else:
                    await healthy(reader, writer)
                writer.close()
            assert (await served.get("/healthz")).status == 200

    run(main())
    assert not server_errors(caplog)


# --------------------------------------------------------------------------- many at once


SLOWLORIS = 500
# What 500 connections that each sent part of their headers may add to this process (both
# ends: the hub's request handler, parser and guard per connection, and the test's stream
# reader and writer): measured at about 10-20 MiB. Unbounded would be a buffer growing with
# what each peer trickles in; aiohttp's parser caps a request line and a header at 8190 bytes.
SLOWLORIS_RSS_BOUND = 48 * MiB


def test_many_slowloris_connections_hold_bounded_memory_and_one_sweep_ends_them(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        limits = ConnectionLimits(max_connections_per_peer=SLOWLORIS + 10, handshake_seconds=30)
        async with secure_hub(tmp_path, settings=SLOW, limits=limits) as served:
            other = await raw(served)
            await healthy(*other)
            gc.collect()
            before = own_rss()
            slow = []
            for i in range(SLOWLORIS):
                reader, writer = await raw(served)
                writer.write(b"PUT /rsio/pub/s HTTP/1.1\r\nHost: hub\r\nX-Pad: "
                             + b"%d" % i + b"x" * 1000)  # fmt: skip
                slow.append((reader, writer))

            def all_waiting() -> bool:
                return sum(phase_of(c) == "headers" for c in served.connections()) == SLOWLORIS

            await until(all_waiting, f"{SLOWLORIS} connections wait for their headers")
            grown = own_rss() - before
            print(f"\nRSS with {SLOWLORIS} slowloris connections: +{grown / MiB:.1f} MiB")
            assert grown < SLOWLORIS_RSS_BOUND, grown
            await healthy(*other)  # meanwhile, others are served
            loop = asyncio.get_running_loop()
            served.listener.sweep(loop.time() + SLOW.header_seconds + 0.01)
            answers = await asyncio.gather(*(response(r) for r, _ in slow))
            assert {a.status for a in answers} == {408}
            assert all(await asyncio.gather(*(eof(r) for r, _ in slow)))
            await until(lambda: served.admission.total == 1, "every slow connection is gone")
            assert len(served.connections()) == 1
            for _, writer in slow:
                writer.close()
            await healthy(*other)
            other[1].close()

    run(main())


# --------------------------------------------------------------------------- issue 20: hostile load
#
# Each attack is a function of the hub's base URL (and the test's session), so that the same
# attack runs against this process's hub (budgets and pumps visible) and against a real
# `tidewire serve` child (its RSS measured, a bystander alongside) below.

SUB_ID = re.compile(r"[A-Za-z0-9_-]{22}")  # docs/protocols/rsio-http.md: 128 random bits
BIG_VALUE = 64 * KiB


async def fill(hub: Hub, stream: str, nbytes: int) -> None:
    """``nbytes`` of 64 KiB values in ``stream``, in appends of 1 MiB."""
    for start in range(0, nbytes, MiB):
        count = min(MiB, nbytes - start) // BIG_VALUE
        await append(hub, stream, [b"%08d" % (start + i) + bytes(BIG_VALUE - 8)
                                   for i in range(count)])  # fmt: skip


def test_never_fetched_subscriptions_read_ahead_one_response_and_within_the_budget(
    tmp_path: Path, run: Runner
) -> None:
    """40 subscriptions that ask for everything and are never fetched: each reads at most
    one delivery ahead, all of them within their principal's share; another principal's
    subscription is served meanwhile, and a paused one resumes once its principal frees."""

    async def main() -> None:
        settings = HttpSettings(poll_seconds=2.0, max_response_bytes=256 * KiB)
        budget = BudgetLimits(total=16 * MiB, principal=2 * MiB, connection=1 * MiB)
        async with secure_hub(tmp_path, settings=settings, budget=budget,
                              access=Access(None, TOKENS)) as served:  # fmt: skip
            await fill(served.hub, "big", 16 * MiB)  # (a delivery: one 64 KiB value)
            urls = await never_fetched(served.session, served.base, "big?format=value", 40)
            assert len(urls) == 40
            rsio = served.app[RSIO_HTTP_KEY]
            subs = [rsio.subs[URL(u).name] for u in urls]
            await until(lambda: all(s.ready or s.paused for s in subs), "every pump settled")
            for sub in subs:  # one delivery (half a response; one 64 KiB value over at most)
                assert sub.share.held <= settings.max_response_bytes, sub.share
            used = served.hub.budget.used_by("anonymous")
            assert used <= budget.principal, used
            paused = [s for s in subs if s.paused]
            assert paused, "2 MiB cannot hold 40 x 64 KiB: some wait"
            # Another principal is served meanwhile.
            answer = await served.put("/rsio/pub/big?format=value&request=3", ALICE)
            got = await served.put(answer.headers["Location"], ALICE)
            assert (got.status, got.body[:8]) == (200, b"00000000"), got
            # The attacker's own fetch of a paused subscription waits for its share; once the
            # principal frees some, it is served at once.
            for url in urls[:20]:
                assert (await served.put(url + "/cancel")).status == 200
            late = [s for s in subs[20:] if s.paused]
            assert late, "the last ones made are the ones that wait"
            got = await served.put(urls[subs.index(late[0])])
            assert got.status == 200, got
            assert served.hub.budget.used_by("anonymous") <= budget.principal
        assert served.hub.budget.used == 0  # every share returned with its subscription

    run(main())


def test_one_principal_cannot_take_every_subscription(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        settings = HttpSettings(poll_seconds=2.0, max_subscriptions=12,
                                max_subscriptions_per_principal=5)  # fmt: skip
        async with secure_hub(tmp_path, settings=settings,
                              access=Access(None, TOKENS)) as served:  # fmt: skip
            statuses = await subscribe_many(served.session, served.base, 8, BOB)
            assert statuses == [201] * 5 + [429] * 3
            answer = await served.put("/rsio/pub/grab0?request=1", BOB)
            refused(answer, 429)
            assert answer.text == "too many subscriptions of this principal (the limit is 5)\n"
            assert answer.headers["Retry-After"] == "1"
            # the others still get theirs, up to the hub's own limit
            assert await subscribe_many(served.session, served.base, 5, ALICE) == [201] * 5
            assert await subscribe_many(served.session, served.base, 3) == [201, 201, 503]
            # one of bob's ends: bob may make one more
            bobs = [s for s in served.app[RSIO_HTTP_KEY].subs.values()
                    if s.owner.name == "token:bob"]  # fmt: skip
            assert len(bobs) == 5
            cancel = served.base + "/rsio/sub/" + bobs[0].id + "/cancel"
            assert (await served.put(cancel, BOB)).status == 200
            assert (await served.put("/rsio/pub/grab0?request=1", BOB)).status == 201

    run(main())


def test_request_bodies_are_charged_to_the_budget_before_they_are_read(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    """A declared body the principal's share has no room for is refused at its header (503,
    nothing read); a chunked one as it comes; another principal carries on."""

    async def main() -> None:
        settings = HttpSettings(max_body_bytes=8 * MiB)
        budget = BudgetLimits(total=4 * MiB, principal=1 * MiB, connection=1 * MiB)
        async with secure_hub(tmp_path, settings=settings, budget=budget,
                              access=Access(None, TOKENS)) as served:  # fmt: skip
            head = "PUT /rsio/pub/s HTTP/1.1\r\nHost: hub\r\n{}\r\n"
            # One anonymous body of 768 KiB declared, half sent: held for its principal.
            slow_r, slow_w = await raw(served)
            slow_w.write(head.format("Content-Length: 786432\r\n").encode() + bytes(1000))
            await until(lambda: served.hub.budget.used_by("anonymous") == 768 * KiB,
                        "the declared body is charged")  # fmt: skip
            # Another anonymous one of 512 KiB does not fit: refused at its header.
            reader, writer = await raw(served)
            writer.write(head.format("Content-Length: 524288\r\n").encode())
            answer = await response(reader)
            refused(answer, 503)
            assert answer.headers["Retry-After"] == "1"
            assert "memory budget" in answer.text
            assert await eof(reader)
            writer.close()
            # Chunked: counted as it comes, refused once past what is left.
            reader, writer = await raw(served)
            writer.write(head.format("Transfer-Encoding: chunked\r\n").encode())
            for _ in range(3):
                writer.write(b"20000\r\n" + bytes(128 * KiB) + b"\r\n")  # 3 x 128 KiB
            refused(await response(reader), 503)
            writer.close()
            # alice is another principal: her share is her own.
            assert (await served.put("/rsio/pub/s", ALICE, data=bytes(512 * KiB))).status == 201
            # The first body completes: its bytes are returned.
            slow_w.write(bytes(786432 - 1000))
            assert (await response(slow_r)).status == 201
            assert served.hub.budget.used == 0
            slow_w.close()
            # Over max_body_bytes is still 413, by its length alone.
            answer = await served.put("/rsio/pub/s", headers={"Content-Length": str(9 * MiB)})
            refused(answer, 413)
            await logged(caplog, "tidewire.http", "503", "memory budget")

    run(main())


def test_a_token_in_the_url_is_never_echoed(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    """Not in a 400 of the hub's (a publisher argument, a fetch's query, requestMore=), nor
    in aiohttp's own 400 for a request its parser refuses, nor in any log line."""

    async def main() -> None:
        caplog.set_level(logging.DEBUG)
        secret = secret_of(ALICE)
        async with secure_hub(tmp_path, access=policy()) as served:
            answers = [await served.put(url) for url in token_urls(ALICE)]
            answer = await served.put("/rsio/pub/orders?request=1", ALICE)
            sub = answer.headers["Location"]
            answers.append(await served.put(f"{sub}?token={ALICE}", ALICE))
            answers.append(await served.put(f"{sub}/requestMore={ALICE}", ALICE))
            for answer in answers:
                assert answer.status == 400, answer
                assert secret not in answer.text, answer
                assert secret not in str(answer.headers), answer
            assert "unknown parameter 'access_token'" in answers[0].text  # (a name, no value)
            assert "unknown parameter (not echoed)" in answers[3].text
            for request in bad_requests(ALICE):
                data = await raw_answer(HOST, served.port, request)
                assert data.startswith(b"HTTP/1.1 400") or data.startswith(b"HTTP/1.0 400"), data
                assert secret.encode() not in data, data
        assert secret not in caplog.text
        assert "Invalid char in url query" in caplog.text  # (aiohttp's reason is kept)

    run(main())


def test_subscription_ids_are_random_and_unguessable(tmp_path: Path, run: Runner) -> None:
    """22 URL-safe characters, 128 bits from ``secrets``: no counter, no shared prefix, the
    bits balanced."""

    async def main() -> None:
        settings = HttpSettings(poll_seconds=2.0, max_subscriptions_per_principal=300)
        async with secure_hub(tmp_path, settings=settings) as served:
            urls = await never_fetched(served.session, served.base, "ids", 300)
            ids = [URL(u).name for u in urls]
            assert len(set(ids)) == 300
            assert all(SUB_ID.fullmatch(i) for i in ids), ids[:3]
            raw_ids = [base64.urlsafe_b64decode(i + "==") for i in ids]
            assert {len(r) for r in raw_ids} == {16}
            assert len({i[:8] for i in ids}) == 300  # (48 bits: no prefix in common)
            ones = sum(bin(int.from_bytes(r, "big")).count("1") for r in raw_ids)
            assert 0.47 < ones / (300 * 128) < 0.53
            assert ids != sorted(ids)

    run(main())


def test_peer_strings_are_logged_escaped(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream name with a bidi override and an escape, a token name with a bidi override:
    each log line stays one line, with the characters written as escapes."""

    async def main() -> None:
        caplog.set_level(logging.WARNING)
        async with secure_hub(tmp_path, access=policy()) as served:
            refused(await served.put("/rsio/pub/a%E2%80%AE%1B%5B2Jb"), 400)
            reader, writer = await raw(served)
            writer.write("PUT /rsio/pub/s HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer "
                         "ev\u202eil.x\r\n\r\n".encode())  # fmt: skip
            refused(await response(reader), 401)
            writer.close()
        messages = [r.getMessage() for r in caplog.records if r.name.startswith("tidewire")]
        assert any("\\u202e" in m and "\\x1b" in m for m in messages), messages
        assert any("claimed token:ev\\u202eil" in m for m in messages), messages
        for message in messages:
            assert message.isprintable(), message

    run(main())


def test_escaped_keeps_a_log_line_one_printable_line() -> None:
    assert escaped("plain /rsio/pub/s") == "plain /rsio/pub/s"
    assert escaped("a\nb\x1b[2J\u202ec\u200b") == "a\\nb\\x1b[2J\\u202ec\\u200b"
    assert escaped("é中") == "é中"  # (printable: as it is)
    assert escaped("x" * 300) == "x" * 200 + "..."


def test_refusals_in_a_row_close_the_connection_and_are_logged_a_few_at_a_time(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING)
        async with secure_hub(tmp_path, settings=HttpSettings(max_refusals=10)) as served:
            bad = b"PUT /rsio/pub/orders?nope=1 HTTP/1.1\r\nHost: hub\r\n\r\n"

            async def refusals(n: int, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> list[str | None]:  # fmt: skip
                closing = []
                for _ in range(n):
                    writer.write(bad)
                    answer = await response(reader)
                    assert answer.status == 400, answer
                    closing.append(answer.headers.get("Connection"))
                return closing

            reader, writer = await raw(served)
            await healthy(reader, writer)
            assert await refusals(10, reader, writer) == [None] * 9 + ["close"]
            assert await eof(reader)
            writer.close()
            # An answered request between breaks the run.
            reader, writer = await raw(served)
            assert await refusals(9, reader, writer) == [None] * 9
            await healthy(reader, writer)
            assert await refusals(9, reader, writer) == [None] * 9
            await healthy(reader, writer)
            writer.close()
            await logged(caplog, "tidewire.http", "closing after 10 refused requests in a row")
        lines = [m for m in warnings(caplog, "tidewire.rsio_http") if ": 400 " in m]
        assert len(lines) == 5, lines  # 28 refusals, 5 lines (then one a 10 s window)

    run(main())


# --------------------------------------------------------------------------- against a real hub
#
# The same attacks on a `tidewire serve` child (tests/security/harness.py) with small budgets,
# a well-behaved RS.io client (the bystander, another principal) publishing and subscribing
# alongside: the attacker is refused or bounded, the hub's resident memory stays within what
# the budget allows, and the bystander sees no stall over BYSTANDER_MAX_STALL_S.

REAL_BUDGET = {"memory.budget_bytes": 64 * MiB, "memory.principal_bytes": 16 * MiB,
               "memory.connection_bytes": 8 * MiB, "http.poll_seconds": 2}  # fmt: skip
RSS_SLACK = 48 * MiB  # the hub's own churn while attacked and serving (buffers, allocator)
BYSTANDER_SECONDS = 3.0


async def publish_big(hub: RealHub, stream: str, nbytes: int, token: str) -> None:
    """``nbytes`` of 64 KiB values into ``stream`` over RS.io, 1 MiB per publish."""
    async with await tidewire.connect(hub.rsio_url, token=token) as client:
        for start in range(0, nbytes, MiB):
            await client.publish(stream, [b"%08d" % (start + i) + bytes(BIG_VALUE - 8)
                                          for i in range(MiB // BIG_VALUE)])  # fmt: skip


async def metric(session: aiohttp.ClientSession, hub: RealHub, line: str) -> float:
    """The value of the Prometheus sample ``line`` (name and labels) on the hub's /metrics."""
    async with session.get(hub.http_base + "/metrics") as answer:
        text = await answer.text()
    for row in text.splitlines():
        if row.startswith(line + " "):
            return float(row.split()[-1])
    raise AssertionError(f"no {line} in /metrics")


def test_real_hub_never_fetched_subscriptions_stay_within_the_budget(tmp_path: Path) -> None:
    """40 subscriptions to 32 MiB, asking for everything, never fetched (issue 20: 300 MiB for
    5 minutes): what they read ahead stays within mallory's share, the hub's RSS within the
    budget, and the bystander is served throughout."""
    with real_hub(tmp_path, settings=REAL_BUDGET, tokens=["mallory", "good"]) as hub:

        async def main() -> None:
            mallory, good = hub.tokens["mallory"], hub.tokens["good"]
            await publish_big(hub, "big", 32 * MiB, good)
            before = hub.rss()
            async with aiohttp.ClientSession() as session:

                async def attack() -> list[str]:
                    urls = await never_fetched(session, hub.http_base, "big?format=value", 40,
                                               mallory)  # fmt: skip
                    held = "tidewire_memory_held_bytes{kind=\"readahead\"}"
                    for _ in range(20):  # sampled while the bystander runs and pumps read
                        assert await metric(session, hub, held) <= 16 * MiB
                        await asyncio.sleep(0.1)
                    return urls

                urls, report = await asyncio.gather(attack(),
                                                    bystander(hub, BYSTANDER_SECONDS, token=good))
                assert len(urls) == 40
                assert await metric(session, hub, "tidewire_memory_refused_total") > 0
                async with session.put(urls[-1], headers=bearer(mallory)) as answer:
                    assert answer.status in (200, 204)  # (paused: 204 after the poll window)
            assert_served(None, report)
            grown = hub.peak_rss() - before
            print(f"\nRSS with 40 never-fetched subscriptions: +{grown / MiB:.1f} MiB")
            assert grown < 16 * MiB + RSS_SLACK, grown

        run(main(), 60)


def test_real_hub_one_principal_cannot_take_every_subscription(tmp_path: Path) -> None:
    settings = {**REAL_BUDGET, "http.max_subscriptions": 60,
                "http.max_subscriptions_per_principal": 20}  # fmt: skip
    with real_hub(tmp_path, settings=settings, tokens=["mallory", "alice", "good"]) as hub:

        async def main() -> None:
            async with aiohttp.ClientSession() as session:
                statuses, report = await asyncio.gather(
                    subscribe_many(session, hub.http_base, 40, hub.tokens["mallory"]),
                    bystander(hub, BYSTANDER_SECONDS, token=hub.tokens["good"]))  # fmt: skip
                assert statuses == [201] * 20 + [429] * 20
                assert await subscribe_many(session, hub.http_base, 20,
                                            hub.tokens["alice"]) == [201] * 20  # fmt: skip
            assert_served(None, report)

        run(main(), 60)


def test_real_hub_declared_bodies_are_refused_before_they_are_read(tmp_path: Path) -> None:
    """8 anonymous connections each declaring a 15 MiB body (under http.max_body_bytes) and
    sending 1 MiB: the principal's 16 MiB share holds one; the others get 503 at once. One
    declaring 1 GiB gets 413. Nothing is buffered beyond the limits."""
    with real_hub(tmp_path, settings=REAL_BUDGET, tokens=["good"]) as hub:

        async def main() -> None:
            before = hub.rss()
            heads, report = await asyncio.gather(declared_bodies(HOST, hub.http_port),
                                                 bystander(hub, BYSTANDER_SECONDS,
                                                           token=hub.tokens["good"]))  # fmt: skip
            refused_503 = [h for h in heads[:8] if h.startswith(b"HTTP/1.1 503")]
            assert len(refused_503) >= 7, heads
            assert heads[8].startswith(b"HTTP/1.1 413"), heads[8]
            assert_served(None, report)
            assert hub.peak_rss() - before < 16 * MiB + RSS_SLACK

        run(main(), 60)


def test_real_hub_never_echoes_a_token_put_in_the_url(tmp_path: Path) -> None:
    with real_hub(tmp_path, settings=REAL_BUDGET, tokens=["alice", "good"]) as hub:
        alice = hub.tokens["alice"]

        async def attack() -> list[bytes]:
            answers = []
            async with aiohttp.ClientSession() as session:
                for url in token_urls(alice):
                    async with session.put(URL(hub.http_base + url, encoded=True)) as answer:
                        assert answer.status == 400
                        answers.append(await answer.read() + str(answer.headers).encode())
            for request in bad_requests(alice):
                answers.append(await raw_answer(HOST, hub.http_port, request))
            return answers

        async def main() -> None:
            answers, report = await asyncio.gather(attack(),
                                                   bystander(hub, BYSTANDER_SECONDS,
                                                             token=hub.tokens["good"]))  # fmt: skip
            for answer in answers:
                assert secret_of(alice).encode() not in answer, answer
            assert_served(None, report)

        run(main(), 60)
        assert "400" in hub.log_text()
        assert secret_of(alice) not in hub.log_text()


def test_real_hub_403s_name_no_one_and_ids_are_random(tmp_path: Path) -> None:
    acl = """
[principal."token:alice"]
read = ["orders"]

[principal."token:bob"]
read = ["public.*"]

[principal."token:good"]
read = ["bystander.*"]
write = ["bystander.*"]
"""
    with real_hub(tmp_path, settings=REAL_BUDGET, acl=acl,
                  tokens=["alice", "bob", "good"]) as hub:  # fmt: skip
        alice, bob = hub.tokens["alice"], hub.tokens["bob"]

        async def attack() -> None:
            async with aiohttp.ClientSession() as session:
                put = session.put
                async with put(hub.http_base + "/rsio/pub/orders", headers=bearer(bob)) as a:
                    assert (a.status, await a.text()) == (
                        403, "refused: may not read stream 'orders'\n")  # fmt: skip
                ids = []
                for _ in range(50):
                    async with put(hub.http_base + "/rsio/pub/orders?request=1",
                                   headers=bearer(alice)) as a:  # fmt: skip
                        assert a.status == 201
                        ids.append(URL(a.headers["Location"]).name)
                assert all(SUB_ID.fullmatch(i) for i in ids), ids
                assert len({i[:8] for i in ids}) == 50
                async with put(hub.http_base + "/rsio/sub/" + ids[0], headers=bearer(bob)) as a:
                    text = await a.text()
                    assert a.status == 403
                    assert "alice" not in text
                    assert "bob" not in text

        async def main() -> None:
            _, report = await asyncio.gather(attack(),
                                             bystander(hub, BYSTANDER_SECONDS,
                                                       token=hub.tokens["good"]))  # fmt: skip
            assert_served(None, report)

        run(main(), 60)
        assert "refused token:bob" in hub.log_text()  # (the log names who, for the operator)


SECRET = "Zq8v-Ts3cr3t_0123456789abcdef"


@pytest.mark.parametrize(
    ("stream", "query", "words"),
    [
        ("s", f"token={SECRET}", "unknown parameter 'token'"),
        ("s", f"{SECRET}=1", "unknown parameter (not echoed)"),
        ("s", f"from={SECRET}", "from= is not an id"),
        ("s", f"until={SECRET}", "until= is not an id"),
        ("s", f"key=%zz{SECRET}", "key= has a '%'"),
        ("s", f"format={SECRET}", "format must be"),
        ("s", f"size={SECRET}", "size must be"),
        ("s", f"from=1&from={SECRET}", "from= is repeated"),
        ("s", "size=2&format=envelope", "size=N needs format=value"),
    ],
)
def test_publisher_name_refusals_quote_no_query_value(stream: str, query: str,
                                                      words: str) -> None:  # fmt: skip
    with pytest.raises(BadRequest) as refused_with:
        publisher_name(stream, query)
    assert words in str(refused_with.value)
    assert SECRET not in str(refused_with.value)


def test_publisher_name_parses_what_the_grammar_allows() -> None:
    assert publisher_name("orders", "from=5&format=value") == PublisherName(
        "orders", 5, format="value")  # fmt: skip
    assert publisher_name("a%2Fb", "") == PublisherName("a/b")


@given(st.text())
def test_escaped_is_always_one_printable_line(text: str) -> None:
    out = escaped(text)
    assert out.isprintable()
    assert "\n" not in out


def test_a_reconnecting_client_waits_out_its_principals_limit(
    tmp_path: Path, run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    """``HttpHub(retry=...)`` takes a 429 (this principal's subscriptions at their limit) as
    "later", like the hub's 503, and subscribes once one of them has ended."""

    async def main() -> None:
        caplog.set_level(logging.WARNING, "tidewire.rsio_http")
        settings = HttpSettings(poll_seconds=2.0, max_subscriptions_per_principal=1)
        async with secure_hub(tmp_path, settings=settings) as served:
            await append(served.hub, "s", [b"a"])
            first = await served.put("/rsio/pub/other?request=1")
            assert first.status == 201
            retry = Retry(initial=0.01, maximum=0.05, attempts=1000)
            async with HttpHub(served.base, retry=retry) as http:
                values = http.subscribe_values("s")
                reading = asyncio.ensure_future(anext(aiter(values)))
                await logged(caplog, "tidewire.rsio_http", "429", "of this principal")
                assert not reading.done()
                assert (await served.put(first.headers["Location"] + "/cancel")).status == 200
                assert await reading == [b"a"]
                await values.aclose()

    run(main())
