"""RS.io over HTTP (seed 002, shared/seeds/README.md "RS.io over HTTP (002)") on the hub's aiohttp
app, in-process over real sockets on 127.0.0.1: every row of the seed's table (subscribe, fetch
with one element, a length-prefixed or fixed-size batch, 204, 410, requestMore, cancel, onError,
unknown subscriptions), the interoperability rules (``If-*`` -> 412, ``Range`` ignored, no
``ETag``/``Last-Modified``/``Content-Type`` on elements), the element formats, demand, the resend
of a cut response and of one written but lost, bad input, limits, the idle reaper, shutdown,
and the aiohttp client ``tidewire.client.http.HttpHub`` (also behind a reverse proxy that
answers 503 or 400 without ``X-Rsio-Error``).

Every test runs under a time bound (the ``run`` fixture); the server's poll window is a setting
(small where a test wants a 204), and the reaper is driven by ``RsioHttp.reap(now)``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDictProxy
from yarl import URL

from helpers import until
from tidewire.client.http import HttpHub, HttpRsioError
from tidewire.hub import Hub
from tidewire.log import LogConfig
from tidewire.model import Batch
from tidewire.protocols.rsio.envelopes import envelopes_to_batch
from tidewire.protocols.rsio_http import (
    ERROR_HEADER,
    FIXED_SIZE,
    LENGTH_PREFIXED,
    SEQUENCE_HEADER,
    decode_body,
)
from tidewire.record import decode_body as record_body
from tidewire.record import parse_header
from tidewire.server.app import RSIO_HTTP_KEY, build_app
from tidewire.server.rsio_http import HttpSettings, RsioHttp

Runner = Callable[[Coroutine[Any, Any, None]], None]


@dataclass
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    @property
    def rsio_error(self) -> bool:
        return self.headers.get(ERROR_HEADER) == "true"

    @property
    def elements(self) -> list[bytes]:
        assert self.status == 200, self
        return decode_body(self.headers.get("Content-Encoding"), self.body)

    @property
    def seq(self) -> int:
        return int(self.headers[SEQUENCE_HEADER])

    @property
    def text(self) -> str:
        return self.body.decode()


@dataclass
class Served:
    hub: Hub
    rsio: RsioHttp
    runner: web.AppRunner
    base: str
    session: aiohttp.ClientSession
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def put(self, url: str, headers: dict[str, str] | None = None,
                  method: str = "PUT") -> Answer:  # fmt: skip
        target = URL(url if url.startswith("http") else self.base + url, encoded=True)
        async with self.session.request(method, target, headers=headers) as response:
            return Answer(response.status, response.headers, await response.read())

    async def subscribe(self, publisher: str, request: int | None = None) -> str:
        """The subscription URL (absolute) of ``PUT /rsio/pub/<publisher>?request=<n>``."""
        answer = await self.put(pub(publisher, request))
        assert answer.status == 201, answer
        return answer.headers["Location"]

    async def fetch(self, sub_url: str, request: int | None = None,
                    headers: dict[str, str] | None = None) -> Answer:  # fmt: skip
        return await self.put(sub_url + ("" if request is None else f"?request={request}"),
                              headers)  # fmt: skip

    def spawn(self, coro: Coroutine[Any, Any, Answer]) -> asyncio.Task[Answer]:
        task = asyncio.ensure_future(coro)
        self.tasks.append(task)
        return task


def pub(publisher: str, request: int | None = None) -> str:
    if request is None:
        return "/rsio/pub/" + publisher
    sep = "&" if "?" in publisher else "?"
    return f"/rsio/pub/{publisher}{sep}request={request}"


def sid_of(sub_url: str) -> str:
    return sub_url.rsplit("/", 1)[1]


@asynccontextmanager
async def http_hub(path: Path, settings: HttpSettings | None = None) -> AsyncIterator[Served]:
    hub = Hub.open(str(path), LogConfig(fsync=False))
    app = build_app(hub, settings or HttpSettings(poll_seconds=5.0))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    session = aiohttp.ClientSession(auto_decompress=False)
    served = Served(hub, app[RSIO_HTTP_KEY], runner, f"http://127.0.0.1:{port}", session)
    try:
        yield served
    finally:
        for task in served.tasks:
            task.cancel()
        await asyncio.gather(*served.tasks, return_exceptions=True)
        await session.close()
        if runner.server is not None:
            await runner.cleanup()
        await hub.close()


async def append(hub: Hub, stream: str, values: list[bytes],
                 keys: list[bytes | None] | None = None) -> Batch:  # fmt: skip
    return await hub.append(Batch.build(stream, values, keys=keys), assign_ids=True)


async def collect(served: Served, sub_url: str, n: int, *, fetches: int = 50) -> list[Answer]:
    """Fetch (at most ``fetches`` times) until ``n`` elements came; every 200 is kept."""
    got: list[Answer] = []
    for _ in range(fetches):
        answer = await served.fetch(sub_url)
        assert answer.status in (200, 204), answer
        if answer.status == 200:
            got.append(answer)
        if sum(len(a.elements) for a in got) >= n:
            return got
    raise AssertionError(f"{n} elements not there after {fetches} fetches")


def no_caching_headers(answer: Answer) -> None:
    for header in ("ETag", "Last-Modified", "Content-Range", "Cache-Control", "Expires"):
        assert header not in answer.headers, (header, answer)


def onerror(answer: Answer, status: int) -> None:
    """An onError: ``status`` with ``X-Rsio-Error: true`` and a text/plain message."""
    assert answer.status == status, answer
    assert answer.rsio_error, answer
    assert answer.headers["Content-Type"] == "text/plain; charset=utf-8", answer
    assert answer.text.strip(), answer
    assert answer.text.count("\n") == 1, answer  # one line


def plain_error(answer: Answer, status: int) -> None:
    """An error that is no onError: ``status`` with a text/plain message and no
    ``X-Rsio-Error``."""
    assert answer.status == status, answer
    assert ERROR_HEADER not in answer.headers, answer
    assert answer.headers["Content-Type"] == "text/plain; charset=utf-8", answer
    assert answer.text.strip(), answer
    assert answer.text.count("\n") == 1, answer  # one line


# --------------------------------------------------------------------------- subscribe


def test_subscribe_gives_unique_absolute_locations_never_reused(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            first: list[str] = []
            for i in range(40):
                answer = await served.put(pub("s", i % 3) if i % 4 else pub("s"))
                assert answer.status == 201, answer
                assert answer.body == b""
                no_caching_headers(answer)
                location = answer.headers["Location"]
                assert location.startswith(served.base + "/rsio/sub/"), location
                assert URL(location).is_absolute()
                assert URL(location).query_string == ""
                first.append(location)
            assert len(set(first)) == 40
            assert set(served.rsio.subs) == {sid_of(u) for u in first}
            for location in first:
                assert (await served.put(location + "/cancel")).status == 200
            assert served.rsio.subs == {}
            again = [await served.subscribe("s", 1) for _ in range(40)]
            assert len(set(again)) == 40
            assert not set(again) & set(first)

    run(main())


# --------------------------------------------------------------------------- fetch


def test_fetch_one_element_has_no_encoding_and_no_content_type(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"only"], keys=[b"k"])
            sub = await served.subscribe("s", 1)
            answer = await served.fetch(sub)
            assert answer.status == 200
            assert "Content-Encoding" not in answer.headers
            assert "Content-Type" not in answer.headers
            assert answer.headers["Content-Length"] == str(len(answer.body))
            no_caching_headers(answer)
            assert answer.seq == 0
            (event,) = envelopes_to_batch("s", [answer.body])
            assert (event.id, event.key, event.value) == (1, b"k", b"only")
            sub_v = await served.subscribe("s?format=value", 1)
            answer = await served.fetch(sub_v)
            assert answer.body == b"only"
            assert "Content-Encoding" not in answer.headers
            assert "Content-Type" not in answer.headers

    run(main())


def test_fetch_a_length_prefixed_batch_within_demand(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            values = [b"v%d" % i for i in range(10)]
            await append(served.hub, "s", values)
            sub = await served.subscribe("s?format=value", 4)
            answer = await served.fetch(sub)
            assert answer.status == 200
            assert answer.headers["Content-Encoding"] == LENGTH_PREFIXED
            assert "Content-Type" not in answer.headers
            no_caching_headers(answer)
            assert answer.seq == 0
            # the exact bytes: [u32 BE length][value]...
            assert answer.body == b"".join(len(v).to_bytes(4, "big") + v for v in values[:4])
            # envelopes too
            env = await served.subscribe("s", 3)
            answer = await served.fetch(env)
            assert answer.headers["Content-Encoding"] == LENGTH_PREFIXED
            batch = envelopes_to_batch("s", answer.elements)
            assert [e.id for e in batch] == [1, 2, 3]
            assert [e.value for e in batch] == values[:3]

    run(main())


def test_fetch_a_fixed_size_batch(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            values = [b"%04d" % i for i in range(6)]
            await append(served.hub, "f", values)
            sub = await served.subscribe("f?size=4", 5)
            answer = await served.fetch(sub)
            assert answer.status == 200
            assert answer.headers["Content-Encoding"] == FIXED_SIZE
            assert "Content-Type" not in answer.headers
            assert answer.body == b"\x00\x00\x00\x04" + b"".join(values[:5])
            assert answer.elements == values[:5]
            # one element: as it is, no encoding
            answer = await served.fetch(sub, request=1)
            assert answer.status == 200
            assert "Content-Encoding" not in answer.headers
            assert (answer.body, answer.seq) == (values[5], 5)

    run(main())


def test_nothing_within_the_poll_window_is_204_with_retry_after(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=0.2)) as served:
            sub = await served.subscribe("s", 5)
            began = time.monotonic()
            answer = await served.fetch(sub)
            assert time.monotonic() - began >= 0.15  # it waited for the window
            assert answer.status == 204
            assert answer.body == b""
            assert answer.headers["Retry-After"] == "0"  # (the docs: "poll again now")
            no_caching_headers(answer)
            # no demand: also 204 although there are events
            await append(served.hub, "t", [b"x"])
            idle = await served.subscribe("t")
            assert (await served.fetch(idle)).status == 204
            assert (await served.fetch(idle, request=1)).body[-1:] == b"x"

    run(main())


def test_a_bounded_subscription_ends_with_410_and_410_again(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=0.2)) as served:
            await append(served.hub, "s", [b"a", b"b", b"c", b"d", b"e"])
            sub = await served.subscribe("s?until=3&format=value", 10)
            got = await collect(served, sub, 3)
            assert [e for a in got for e in a.elements] == [b"a", b"b", b"c"]
            for _ in range(3):
                answer = await served.fetch(sub)
                assert answer.status == 410
                assert ERROR_HEADER not in answer.headers
                no_caching_headers(answer)
            # exact demand: the 410 needs no more of it
            exact = await served.subscribe("s?until=2&format=value", 2)
            assert (await served.fetch(exact)).elements == [b"a", b"b"]
            assert (await served.fetch(exact)).status == 410
            # bounded below what was written, from later on
            late = await served.subscribe("s?from=5&until=5&format=value", 1)
            assert (await served.fetch(late)).body == b"e"
            assert (await served.fetch(late)).status == 410
            # kept (410 again) until reaped, then unknown
            rsio = served.rsio
            assert rsio.reap(rsio.clock() + rsio.settings.idle_seconds + 1) == 3
            onerror(await served.fetch(sub), 404)

    run(main())


# --------------------------------------------------------------------------- requestMore, cancel


def test_request_more_answers_200_and_wakes_a_waiting_fetch(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=10.0)) as served:
            await append(served.hub, "s", [b"a", b"b", b"c"])
            sub = await served.subscribe("s?format=value")
            sid = sid_of(sub)
            waiting = served.spawn(served.fetch(sub))
            await until(lambda: served.rsio.subs[sid].fetching == 1, "the fetch waits")
            answer = await served.put(sub + "/requestMore=2")
            assert answer.status == 200
            assert answer.body == b""
            no_caching_headers(answer)
            async with asyncio.timeout(3):  # well within the poll window of 10 s
                woken = await waiting
            assert woken.elements == [b"a", b"b"]
            assert (await served.put(sub + "/requestMore=1")).status == 200
            assert (await served.fetch(sub)).body == b"c"
            # demand beyond 2^63-1 saturates
            for _ in range(2):
                assert (await served.put(sub + f"/requestMore={2**63 - 1}")).status == 200
            assert served.rsio.subs[sid].state.demand == 2**63 - 1

    run(main())


def test_request_more_zero_is_an_error_that_ends_the_subscription(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            sub = await served.subscribe("s", 1)
            onerror(await served.put(sub + "/requestMore=0"), 400)
            assert sid_of(sub) not in served.rsio.subs
            onerror(await served.fetch(sub), 404)
            onerror(await served.put(sub + "/requestMore=1"), 404)

    run(main())


def test_cancel_answers_200_then_404(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"a"])
            sub = await served.subscribe("s", 1)
            answer = await served.put(sub + "/cancel")
            assert (answer.status, answer.body) == (200, b"")
            assert served.rsio.subs == {}
            onerror(await served.fetch(sub), 404)
            onerror(await served.put(sub + "/cancel"), 404)
            onerror(await served.put(sub + "/requestMore=3"), 404)

    run(main())


def test_cancel_answers_a_waiting_fetch(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=10.0)) as served:
            sub = await served.subscribe("s", 1)
            waiting = served.spawn(served.fetch(sub))
            await until(lambda: served.rsio.subs[sid_of(sub)].fetching == 1, "the fetch waits")
            assert (await served.put(sub + "/cancel")).status == 200
            async with asyncio.timeout(3):
                onerror(await waiting, 404)

    run(main())


def test_unknown_subscriptions_are_404_with_the_error_header(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            for url in ("/rsio/sub/nope", "/rsio/sub/1-abc", "/rsio/sub/nope/cancel",
                        "/rsio/sub/nope/requestMore=1", "/rsio/sub/nope?request=5"):  # fmt: skip
                onerror(await served.put(url), 404)

    run(main())


# --------------------------------------------------------------------------- onError


def test_a_value_of_the_wrong_size_is_on_error(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "f", [b"x"])
            sub = await served.subscribe("f?size=2", 2)
            answer = await served.fetch(sub)
            onerror(answer, 500)
            assert "not 2 bytes" in answer.text
            assert sid_of(sub) not in served.rsio.subs
            onerror(await served.fetch(sub), 404)

    run(main())


def test_a_wrong_size_value_is_never_skipped(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        # responses of about one event, so that the bad value is taken on its own
        settings = HttpSettings(poll_seconds=0.5, max_response_bytes=30)
        async with http_hub(tmp_path, settings) as served:
            await append(served.hub, "f", [b"x"])  # 1 byte: bad for size=2
            await append(served.hub, "f", [b"yy"])
            sub = await served.subscribe("f?size=2", 2)
            state = served.rsio.subs[sid_of(sub)]
            await until(lambda: bool(state.ready), "the first is ready (one read ahead)")
            answer = await served.fetch(sub)
            assert answer.status != 200, f"{answer.body!r} delivered after the bad value"
            onerror(answer, 500)

    run(main())


def test_other_subscriptions_carry_on_after_one_errors(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=0.2)) as served:
            await append(served.hub, "bad", [b"x"])
            await append(served.hub, "good", [b"aa", b"bb"])
            bad = await served.subscribe("bad?size=2", 5)
            good = await served.subscribe("good?size=2", 5)
            same_stream = await served.subscribe("bad?format=value", 5)
            assert (await served.fetch(good)).elements == [b"aa", b"bb"]
            onerror(await served.fetch(bad), 500)
            await append(served.hub, "good", [b"cc"])
            assert (await served.fetch(good)).body == b"cc"
            assert (await served.fetch(same_stream)).body == b"x"
            assert set(served.rsio.subs) == {sid_of(good), sid_of(same_stream)}
            assert (await served.put(pub("bad?size=2", 1))).status == 201  # subscribes still

    run(main())


# --------------------------------------------------------------------------- interoperability

CONDITIONAL = {
    "If-Match": '"x"',
    "If-None-Match": "*",
    "If-Modified-Since": "Sat, 01 Jan 2000 00:00:00 GMT",
    "If-Unmodified-Since": "Sat, 01 Jan 2000 00:00:00 GMT",
    "If-Range": '"x"',
}


def test_conditional_requests_are_412(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"a", b"b"])
            sub = await served.subscribe("s?format=value", 1)
            for header, value in CONDITIONAL.items():
                answer = await served.put(pub("s", 1), {header: value})
                plain_error(answer, 412)
                assert header in answer.text
                plain_error(await served.fetch(sub, 1, {header: value}), 412)
                plain_error(await served.put(sub + "/requestMore=1", {header: value}), 412)
                plain_error(await served.put(sub + "/cancel", {header: value}), 412)
            assert list(served.rsio.subs) == [sid_of(sub)]  # no subscription made
            # the subscription still works, with the demand of before only
            state = served.rsio.subs[sid_of(sub)].state
            assert state.demand == 1
            assert (await served.fetch(sub)).body == b"a"
            assert (await served.fetch(sub, 1)).body == b"b"

    run(main())


def test_range_is_ignored(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"%02d" % i for i in range(10)])
            plain = await served.subscribe("s?format=value", 4)
            ranged_url = await served.put(pub("s?format=value", 4), {"Range": "bytes=0-1"})
            assert ranged_url.status == 201
            ranged = ranged_url.headers["Location"]
            for request in (None, 3, 2):
                a = await served.fetch(plain, request)
                b = await served.fetch(ranged, request, {"Range": "bytes=2-5"})
                assert a.status == b.status == 200
                assert a.body == b.body
                assert a.seq == b.seq
                assert a.headers.get("Content-Encoding") == b.headers.get("Content-Encoding")
                assert "Content-Range" not in b.headers
            more = await served.put(ranged + "/requestMore=1", {"Range": "bytes=0-0"})
            assert more.status == 200

    run(main())


def test_no_etag_last_modified_or_content_type_on_elements(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=0.1)) as served:
            await append(served.hub, "s", [b"a", b"b", b"c"])
            answers = [await served.put(pub("s?until=3", 1))]
            sub = answers[0].headers["Location"]
            answers.append(await served.fetch(sub))  # one element
            answers.append(await served.fetch(sub, 2))  # a batch
            answers.append(await served.fetch(sub))  # 410
            answers.append(await served.put(sub + "/requestMore=1"))
            answers.append(await served.put(sub + "/cancel"))
            live = await served.subscribe("s?from=latest", 1)
            answers.append(await served.fetch(live))  # 204
            answers.append(await served.put("/rsio/sub/nope"))  # 404
            for answer in answers:
                no_caching_headers(answer)
            assert [a.status for a in answers] == [201, 200, 200, 410, 200, 200, 204, 404]
            for answer in answers[1:3]:
                assert "Content-Type" not in answer.headers

    run(main())


# --------------------------------------------------------------------------- element formats


def test_element_formats(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            keys: list[bytes | None] = [b"k" if i % 3 == 0 else None for i in range(9)]
            values = [b"v%d" % i for i in range(9)]
            stamped = Batch.build("s", values[:5], keys=keys[:5], timestamps=1_700_000_000_000)
            await served.hub.append(stamped, assign_ids=True)
            await append(served.hub, "s", values[5:], keys[5:])
            # the envelope (default): ids, keys, values, timestamps
            sub = await served.subscribe("s", 9)
            got = [e for a in await collect(served, sub, 9) for e in a.elements]
            batch = envelopes_to_batch("s", got)
            assert [e.id for e in batch] == list(range(1, 10))
            assert [e.key for e in batch] == keys
            assert [e.value for e in batch] == values
            assert [e.timestamp for e in batch][:5] == [1_700_000_000_000] * 5
            # format=value
            sub = await served.subscribe("s?format=value", 9)
            assert [e for a in await collect(served, sub, 9) for e in a.elements] == values
            # from= and key=
            sub = await served.subscribe("s?from=4&format=value", 3)
            assert [e for a in await collect(served, sub, 3) for e in a.elements] == values[3:6]
            sub = await served.subscribe("s?key=k", 10)
            keyed = envelopes_to_batch("s", [e for a in await collect(served, sub, 3)
                                             for e in a.elements])  # fmt: skip
            assert [(e.id, e.key) for e in keyed] == [(1, b"k"), (4, b"k"), (7, b"k")]
            sub = await served.subscribe("s?key=%6B&from=5&format=value", 10)  # %6B: "k"
            assert (await served.fetch(sub)).body == b"v6"
            # format=records: one element per record, demand in records
            sub = await served.subscribe("s?format=records", 1)
            answer = await served.fetch(sub)
            assert "Content-Encoding" not in answer.headers
            record = memoryview(answer.body)
            first = record_body("s", parse_header(record), record, 0)
            assert [e.id for e in first] == [1, 2, 3, 4, 5]
            assert [e.key for e in first] == keys[:5]
            answer = await served.fetch(sub, 5)
            assert answer.seq == 1
            (element,) = answer.elements
            record = memoryview(element)
            second = record_body("s", parse_header(record), record, 0)
            assert [e.value for e in second] == values[5:]

    run(main())


def test_bad_publishers_are_refused_with_the_error_header(tmp_path: Path, run: Runner) -> None:
    """A refused subscribe is onError (4xx with ``X-Rsio-Error``): there is no subscription
    to retry with, and no Location."""

    async def main() -> None:
        async with http_hub(tmp_path) as served:
            for publisher, words in [
                ("a%20b", "whitespace"),  # a bad stream name
                ("%FF", "bad stream"),  # not UTF-8
                ("", "empty"),
                ("s?nope=1", "unknown parameter 'nope'"),
                ("s?from=abc", "not an id"),
                ("s?until=-1", "not an id"),
                ("s?format=json", "format must be"),
                ("s?size=0", "size must be"),
                ("s?size=2&format=envelope", "needs format=value"),
                ("s?from=1&from=2", "repeated"),
            ]:
                answer = await served.put(pub(publisher, 1))
                onerror(answer, 400)
                assert words in answer.text, (publisher, answer.text)
                assert "Location" not in answer.headers
            assert served.rsio.subs == {}

    run(main())


# --------------------------------------------------------------------------- demand


def test_never_more_than_the_outstanding_demand(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=0.2)) as served:
            values = [b"e%d" % i for i in range(10)]
            await append(served.hub, "s", values)
            sub = await served.subscribe("s?format=value", 3)
            state = served.rsio.subs[sid_of(sub)].state
            got: list[bytes] = []
            first = await served.fetch(sub)
            assert (first.seq, first.elements) == (0, values[:3])
            got += first.elements
            # demand spent: nothing more, though 7 events wait
            for _ in range(2):
                assert (await served.fetch(sub)).status == 204
            assert state.demand == 0
            # the demand added on a fetch, by requestMore, and both
            plan = [(2, 0), (0, 1), (3, 0), (1, 5)]  # (request= on the fetch, requestMore before)
            for on_fetch, more in plan:
                if more:
                    assert (await served.put(sub + f"/requestMore={more}")).status == 200
                outstanding = state.demand + on_fetch
                answer = await served.fetch(sub, on_fetch)
                assert answer.status == 200
                assert answer.seq == len(got)
                assert 1 <= len(answer.elements) <= outstanding
                got += answer.elements
                assert state.demand == outstanding - len(answer.elements)
            assert got == values
            assert state.demand == 5  # 1 + 5 asked, 1 there
            await append(served.hub, "s", [b"late%d" % i for i in range(7)])
            answer = await served.fetch(sub)
            assert answer.elements == [b"late%d" % i for i in range(5)]
            assert (await served.fetch(sub)).status == 204
            assert (state.demand, state.next_seq) == (0, 15)

    run(main())


# --------------------------------------------------------------------------- resend


def test_a_cut_response_is_resent_and_spends_no_demand(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=10.0)) as served:
            sub = await served.subscribe("s?format=value")
            sid = sid_of(sub)
            state = served.rsio.subs[sid]
            assert served.runner.server is not None
            before = set(served.runner.server.connections)
            port = URL(served.base).port
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"PUT /rsio/sub/{sid}?request=5 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                         "Content-Length: 0\r\n\r\n".encode())  # fmt: skip
            await writer.drain()
            await until(lambda: state.fetching == 1, "the raw fetch waits")
            (raw_handler,) = set(served.runner.server.connections) - before
            writer.close()  # without reading anything
            await writer.wait_closed()
            await until(lambda: raw_handler.transport is None, "the server sees the close")
            values = [b"a", b"b", b"c", b"d", b"e"]
            await append(served.hub, "s", values)
            await until(lambda: state.state.unsent is not None and state.fetching == 0,
                        "the cut response is kept")  # fmt: skip
            assert (state.state.demand, state.state.next_seq) == (5, 0)
            answer = await served.fetch(sub)  # no X-Tidewire-Sequence: the unsent goes first
            assert answer.headers[SEQUENCE_HEADER] == "0"
            assert answer.elements == values
            assert (state.state.demand, state.state.next_seq) == (0, 5)
            assert state.state.unsent is None
            await append(served.hub, "s", [b"f"])
            answer = await served.fetch(sub, 1, {SEQUENCE_HEADER: "5"})
            assert (answer.seq, answer.body) == (5, b"f")

    run(main())


def test_a_response_written_but_lost_is_sent_again(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=0.2)) as served:
            values = [b"a", b"b", b"c"]
            await append(served.hub, "s", values)
            sub = await served.subscribe("s?format=value", 3)
            state = served.rsio.subs[sid_of(sub)].state
            first = await served.fetch(sub)
            assert (first.seq, first.elements) == (0, values)
            for _ in range(2):  # "I expect element 0": the last delivery again, as often
                again = await served.fetch(sub, headers={SEQUENCE_HEADER: "0"})
                assert again.status == 200
                assert (again.seq, again.body) == (0, first.body)
                assert again.headers["Content-Encoding"] == LENGTH_PREFIXED
            assert (state.demand, state.next_seq) == (0, 3)  # counted once
            assert (await served.fetch(sub, headers={SEQUENCE_HEADER: "3"})).status == 204
            for bad in ("0", "1", "2", "4", "99"):  # the last one arrived: no resend any more
                answer = await served.fetch(sub, headers={SEQUENCE_HEADER: bad})
                plain_error(answer, 400)
                assert "expects element" in answer.text
            for bad in ("abc", "-1", "", str(2**63)):
                plain_error(await served.fetch(sub, headers={SEQUENCE_HEADER: bad}), 400)
            # the subscription carries on
            await append(served.hub, "s", [b"d"])
            answer = await served.fetch(sub, 1, {SEQUENCE_HEADER: "3"})
            assert (answer.seq, answer.body) == (3, b"d")

    run(main())


def test_request_on_a_fetch_that_gets_a_resend_counts(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=0.3)) as served:
            await append(served.hub, "s", [b"a", b"b", b"c"])
            sub = await served.subscribe("s?format=value", 1)
            assert (await served.fetch(sub)).body == b"a"
            again = await served.fetch(sub, 2, {SEQUENCE_HEADER: "0"})
            assert (again.seq, again.body) == (0, b"a")
            answer = await served.fetch(sub, headers={SEQUENCE_HEADER: "1"})
            assert answer.status == 200, "request=2 on the resent fetch was dropped"
            assert answer.elements == [b"b", b"c"]

    run(main())


def test_a_newer_fetch_makes_an_older_one_answer_204_at_once(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=4.0)) as served:
            sub = await served.subscribe("s?format=value", 1)
            state = served.rsio.subs[sid_of(sub)]
            older = served.spawn(served.fetch(sub))
            await until(lambda: state.fetching == 1, "the older fetch waits")
            newer = served.spawn(served.fetch(sub))
            await until(lambda: state.polls == 2, "the newer fetch came")
            try:
                async with asyncio.timeout(1.5):
                    answer = await asyncio.shield(older)
            except TimeoutError:
                raise AssertionError("the older fetch still waits") from None
            assert answer.status == 204
            await append(served.hub, "s", [b"x"])
            async with asyncio.timeout(3):
                assert (await newer).body == b"x"

    run(main())


def test_a_newer_fetch_ends_the_older_one_within_its_window(tmp_path: Path, run: Runner) -> None:
    """With two fetches, the older is answered 204 (without Retry-After) before the newer,
    and the subscription carries on."""

    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=0.5)) as served:
            sub = await served.subscribe("s?format=value", 1)
            state = served.rsio.subs[sid_of(sub)]
            older = served.spawn(served.fetch(sub))
            await until(lambda: state.fetching == 1, "the older fetch waits")
            newer = served.spawn(served.fetch(sub))
            await until(lambda: state.polls == 2, "the newer fetch came")
            async with asyncio.timeout(3):
                first = await asyncio.wait({older, newer}, return_when=asyncio.FIRST_COMPLETED)
            assert older in first[0]
            assert older.result().status == 204
            assert "Retry-After" not in older.result().headers  # (a newer fetch took over)
            async with asyncio.timeout(3):
                assert (await newer).status == 204
            await append(served.hub, "s", [b"x"])
            assert (await served.fetch(sub)).body == b"x"

    run(main())


# --------------------------------------------------------------------------- bad input


def test_malformed_fetches_are_400_and_the_subscription_carries_on(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"a", b"b"])
            sub = await served.subscribe("s?format=value", 1)
            for query in [
                "request=-1",
                "request=abc",
                "request=99999999999999999999",
                f"request={2**63}",
                "request=1&request=2",
                "request=+1",
                "request",
                "request=1&x",  # an argument without "="
                "foo=1",  # unknown arguments on the fetch
                "request=1&from=2",
                "=1",
            ]:
                answer = await served.put(f"{sub}?{query}")
                plain_error(answer, 400)
            state = served.rsio.subs[sid_of(sub)].state
            assert state.demand == 1  # nothing of it counted
            assert (await served.fetch(sub)).body == b"a"
            for action in ("requestMore=-1", "requestMore=abc", "requestMore=",
                           f"requestMore={2**63}", "requestMore=1e3"):  # fmt: skip
                plain_error(await served.put(f"{sub}/{action}"), 400)
            assert (await served.fetch(sub, 1)).body == b"b"

    run(main())


def test_malformed_subscribes_are_400_with_the_error_header(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            for query in ["request=-1", "request=abc", "request=99999999999999999999",
                          "request=1&request=2", "request=1&x", "x"]:  # fmt: skip
                answer = await served.put(f"/rsio/pub/s?{query}")
                onerror(answer, 400)
            assert served.rsio.subs == {}
            assert (await served.put("/rsio/pub/s?request=0")).status == 201

    run(main())


def test_unknown_actions_and_other_methods(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            sub = await served.subscribe("s", 1)
            for action in ("foo", "requestmore=1", "Cancel", "request=1"):
                answer = await served.put(f"{sub}/{action}")
                plain_error(answer, 404)
                assert "unknown action" in answer.text
            plain_error(await served.put("/rsio/sub/nope/foo"), 404)
            for method in ("GET", "POST", "DELETE", "PATCH"):
                for url in (pub("s", 1), sub, sub + "/cancel", sub + "/requestMore=1"):
                    answer = await served.put(url, method=method)
                    assert answer.status == 405, (method, url, answer)
                    assert answer.headers["Allow"] == "PUT"
                    assert ERROR_HEADER not in answer.headers
            assert list(served.rsio.subs) == [sid_of(sub)]  # untouched by any of it
            assert served.rsio.subs[sid_of(sub)].state.demand == 1

    run(main())


def test_responses_and_read_ahead_are_bounded_in_bytes(tmp_path: Path, run: Runner) -> None:
    """About ``max_response_bytes`` per response (one bigger element alone) and read ahead of
    the fetches, whatever the demand."""

    async def main() -> None:
        limit = 4096
        async with http_hub(tmp_path, HttpSettings(max_response_bytes=limit)) as served:
            values = [b"%03d" % i + bytes(97) for i in range(200)]
            for i in range(0, 200, 10):
                await append(served.hub, "s", values[i : i + 10])
            await append(served.hub, "s", [b"B" * 3 * limit])
            sub = await served.subscribe("s?format=value", 10**6)
            state = served.rsio.subs[sid_of(sub)]
            await until(lambda: state.ready_bytes > 0, "the pump has read ahead")
            for _ in range(100):  # let the pump run, were it not held back
                await asyncio.sleep(0)
            # one delivery (half a response) read ahead, and the hub subscription's carry
            held = state.ready_bytes + state.source.held_bytes
            assert 0 < held <= limit
            assert state.share.gauges() == {"readahead": held}
            got: list[bytes] = []
            for _ in range(40):
                answer = await served.fetch(sub)
                assert answer.seq == len(got)
                assert len(answer.elements) * 120 <= limit + 120
                got += answer.elements
                if len(got) >= 200:
                    break
            assert got == values
            big = await served.fetch(sub)
            assert "Content-Encoding" not in big.headers
            assert big.body == b"B" * 3 * limit

    run(main())


# --------------------------------------------------------------------------- limits, reaper


def test_too_many_subscriptions_is_503_with_retry_after(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(max_subscriptions=2)) as served:
            first = await served.subscribe("s")
            await served.subscribe("t", 1)
            answer = await served.put(pub("u", 1))
            onerror(answer, 503)
            assert "limit is 2" in answer.text
            assert answer.headers["Retry-After"].isdigit()
            assert len(served.rsio.subs) == 2
            assert (await served.put(first + "/cancel")).status == 200
            assert (await served.put(pub("u", 1))).status == 201

    run(main())


def test_the_reaper_cancels_idle_subscriptions_only(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        settings = HttpSettings(poll_seconds=10.0, idle_seconds=60.0)
        async with http_hub(tmp_path, settings) as served:
            rsio = served.rsio
            idle = await served.subscribe("s", 1)
            busy = await served.subscribe("s?format=value", 1)
            waiting = served.spawn(served.fetch(busy))
            await until(lambda: rsio.subs[sid_of(busy)].fetching == 1, "the fetch waits")
            now = rsio.clock()
            assert rsio.reap(now + 30) == 0  # not idle for long enough
            assert rsio.reap(now + 61) == 1
            assert set(rsio.subs) == {sid_of(busy)}
            onerror(await served.fetch(idle), 404)
            # the fetch under way is untouched and gets its element
            await append(served.hub, "s", [b"x"])
            async with asyncio.timeout(3):
                assert (await waiting).body == b"x"
            # a request counts as activity; then idle again
            assert rsio.reap(rsio.clock() + 30) == 0
            assert rsio.reap(rsio.clock() + 61) == 1
            assert rsio.subs == {}
            onerror(await served.fetch(busy), 404)

    run(main())


# --------------------------------------------------------------------------- shutdown


def test_close_answers_a_waiting_fetch_at_once(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=10.0)) as served:
            sub = await served.subscribe("s", 1)
            waiting = served.spawn(served.fetch(sub))
            await until(lambda: served.rsio.subs[sid_of(sub)].fetching == 1, "the fetch waits")
            served.rsio.close()
            async with asyncio.timeout(3):
                answer = await waiting
            onerror(answer, 503)
            assert "shutting down" in answer.text
            answer = await served.put(pub("s", 1))
            onerror(answer, 503)
            assert "Retry-After" in answer.headers

    run(main())


def test_runner_cleanup_answers_a_waiting_fetch_at_once(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path, HttpSettings(poll_seconds=10.0)) as served:
            subs = [await served.subscribe("s", 1), await served.subscribe("t?format=value", 1)]
            waiting = [served.spawn(served.fetch(sub)) for sub in subs]
            await until(lambda: all(s.fetching == 1 for s in served.rsio.subs.values()),
                        "both fetches wait")  # fmt: skip
            began = time.monotonic()
            await served.runner.cleanup()
            assert time.monotonic() - began < 3  # not the poll window, not the shutdown timeout
            async with asyncio.timeout(3):
                for task in waiting:
                    onerror(await task, 503)

    run(main())


# --------------------------------------------------------------------------- the client


def test_client_subscribe_and_subscribe_values(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            keys: list[bytes | None] = [b"k", None] * 10
            await append(served.hub, "s", [b"v%d" % i for i in range(20)], keys)
            await append(served.hub, "f", [b"%03d" % i for i in range(30)])
            async with HttpHub(served.base) as client:
                events = [e async for b in client.subscribe("s", until_id=20, demand=6)
                          for e in b]  # fmt: skip
                assert [e.id for e in events] == list(range(1, 21))
                assert [e.key for e in events] == keys
                assert [e.value for e in events] == [b"v%d" % i for i in range(20)]
                keyed = [e.id async for b in client.subscribe("s", from_id=4, until_id=12,
                                                                 key=b"k") for e in b]  # fmt: skip
                assert keyed == [5, 7, 9, 11]
                fixed = client.subscribe_values("f", size=3, until_id=30, demand=4)
                values = [v async for vs in fixed for v in vs]
                assert values == [b"%03d" % i for i in range(30)]
                tail = client.subscribe_values("s", from_id=19, until_id=20)
                plain = [v async for vs in tail for v in vs]
                assert plain == [b"v18", b"v19"]
            # after a 410 the client sends nothing more; the hub keeps them (410 again) until idle
            assert len(served.rsio.subs) == 4
            assert {s.state.state.value for s in served.rsio.subs.values()} == {"complete"}

    run(main())


def test_client_stream_names_that_need_care(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            key = b"\x00\xff&=%/ ?"
            async with HttpHub(served.base) as client:
                for stream in ["ä/x?y&z%", "a%2Fb", "x=y", "%41", "a+b", "a#b", "...", "request"]:
                    await append(served.hub, stream, [b"1", b"2"], keys=[key, None])
                    got = [e async for b in client.subscribe(stream, until_id=2) for e in b]
                    assert [(e.stream, e.value) for e in got] == [(stream, b"1"), (stream, b"2")]
                    keyed = client.subscribe(stream, until_id=2, key=key)
                    assert [e.value async for b in keyed for e in b] == [b"1"]

    run(main())


def test_client_subscribes_to_dot_streams(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served, HttpHub(served.base) as client:
            for stream in ["..", "."]:
                await append(served.hub, stream, [b"1"])
                got = [e async for b in client.subscribe(stream, until_id=1) for e in b]
                assert [(e.stream, e.value) for e in got] == [(stream, b"1")]

    run(main())


def test_the_hub_serves_dot_streams(tmp_path: Path, run: Runner) -> None:
    """(The server side of the bug above: a raw request, with no URL normalisation, works.)"""

    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "..", [b"dd"])
            await append(served.hub, ".", [b"d"])
            port = URL(served.base).port
            for path, value in [("..", b"dd"), ("%2E%2E", b"dd"), (".", b"d"), ("%2E", b"d")]:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"PUT /rsio/pub/{path}?request=1&format=value HTTP/1.1\r\n"
                             f"Host: 127.0.0.1:{port}\r\nContent-Length: 0\r\n"
                             "Connection: close\r\n\r\n".encode())  # fmt: skip
                head = await reader.read()
                writer.close()
                assert head.startswith(b"HTTP/1.1 201 Created\r\n"), head
                (location,) = [line[10:] for line in head.split(b"\r\n")
                               if line.startswith(b"Location: ")]  # fmt: skip
                assert (await served.fetch(location.decode())).body == value

    run(main())


def test_client_history_then_live_in_order_exactly_once(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"h%d" % i for i in range(500)])

            async def take(n: int) -> list[tuple[int, bytes]]:
                got: list[tuple[int, bytes]] = []
                async with HttpHub(served.base) as client:
                    stream = client.subscribe("s", demand=7)
                    async with contextlib.aclosing(stream):
                        async for batch in stream:
                            assert len(batch) <= 7
                            got += [(e.id, e.value) for e in batch]
                            if len(got) >= n:
                                break
                return got

            reader = asyncio.ensure_future(take(1200))
            for chunk in range(7):
                await append(served.hub, "s", [b"l%d" % (chunk * 100 + i) for i in range(100)])
                await asyncio.sleep(0)
            async with asyncio.timeout(15):
                got = await reader
            assert [i for i, _ in got] == list(range(1, 1201))
            assert got[499] == (500, b"h499")
            assert got[500] == (501, b"l0")
            assert got[-1] == (1200, b"l699")

    run(main())


def test_client_break_sends_the_extra_cancel(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"x"] * 20)
            async with HttpHub(served.base) as client:
                async for _batch in client.subscribe_values("s", demand=2):
                    assert len(served.rsio.subs) == 1
                    break
                # the generator is finalised by the loop's asyncgen hook: the cancel follows
                await until(lambda: served.rsio.subs == {}, "the cancel arrives")
                stream = client.subscribe("s", demand=2)
                async with contextlib.aclosing(stream):
                    async for _ in stream:
                        break
                await until(lambda: served.rsio.subs == {}, "the cancel arrives")

    run(main())


def test_client_on_error_raises_with_rsio_true(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "f", [b"ab", b"c"])
            async with HttpHub(served.base, backoff=0.001) as client:
                got: list[bytes] = []

                async def consume() -> None:
                    async for values in client.subscribe_values("f", size=2, demand=1):
                        got.extend(values)

                with pytest.raises(HttpRsioError) as caught:
                    await consume()
                assert got == [b"ab"]
                assert caught.value.rsio
                assert caught.value.status == 500
                assert "not 2 bytes" in caught.value.message
                # a refused subscribe is onError too
                with pytest.raises(HttpRsioError) as caught:
                    async for _ in client.elements("f?nope=1"):
                        pass
                assert (caught.value.status, caught.value.rsio) == (400, True)
            assert served.rsio.subs == {}

    run(main())


# --------------------------------------------------------------------------- behind a proxy


@dataclass
class Proxy:
    """A reverse proxy in front of the hub (a real aiohttp server, forwarding with an aiohttp
    client and the original Host, so that Locations point at the proxy). It answers the first
    ``fail`` fetches itself with ``status`` and no ``X-Rsio-Error``."""

    target: str
    fail: int
    status: int = 503
    fetches: int = 0
    log: list[str] = field(default_factory=list)
    base: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.rel_url.raw_path
        if path.startswith("/rsio/pub/"):
            self.log.append("subscribe")
        elif path.count("/") == 3:
            self.log.append("fetch")
        else:
            self.log.append(path.rsplit("/", 1)[1])
        if self.log[-1] == "fetch":
            self.fetches += 1
            if self.fetches <= self.fail:
                self.log[-1] = "refused"
                return web.Response(status=self.status, text="the proxy says no")
        url = URL(self.target + str(request.rel_url), encoded=True)
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("content-length", "connection")}  # fmt: skip
        session = request.app[SESSION_KEY]
        async with session.request(request.method, url, headers=headers) as answer:
            body = await answer.read()
            out = {k: v for k, v in answer.headers.items()
                   if k.lower() not in ("content-length", "transfer-encoding", "connection",
                                        "date", "server", "content-type")}  # fmt: skip
            return web.Response(status=answer.status, body=body, headers=out)


SESSION_KEY = web.AppKey("session", aiohttp.ClientSession)


@asynccontextmanager
async def proxied(proxy: Proxy) -> AsyncIterator[Proxy]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    session = aiohttp.ClientSession(auto_decompress=False)
    app[SESSION_KEY] = session
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    proxy.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield proxy
    finally:
        await runner.cleanup()
        await session.close()


def test_client_retries_a_503_without_the_header(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served, proxied(Proxy(served.base, fail=3)) as proxy:
            await append(served.hub, "s", [b"v%d" % i for i in range(1000)])
            async with HttpHub(proxy.base, backoff=0.001, retries=4) as client:
                got = [v async for vs in client.subscribe_values("s", until_id=1000, demand=7)
                       for v in vs]  # fmt: skip
            assert got == [b"v%d" % i for i in range(1000)]
            assert proxy.log[:5] == ["subscribe", "refused", "refused", "refused", "fetch"]
            assert set(proxy.log[5:]) == {"fetch"}

    run(main())


def test_client_gives_up_after_its_retries_and_cancels(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served, proxied(Proxy(served.base, fail=3)) as proxy:
            await append(served.hub, "s", [b"x"])
            async with HttpHub(proxy.base, backoff=0.001, retries=2) as client:
                with pytest.raises(HttpRsioError) as caught:
                    async for _ in client.subscribe_values("s"):
                        pass
            assert (caught.value.status, caught.value.rsio) == (503, False)
            assert "the proxy says no" in caught.value.message
            assert proxy.log == ["subscribe", "refused", "refused", "refused", "cancel"]
            assert served.rsio.subs == {}  # the extra cancel reached the hub

    run(main())


def test_client_takes_a_400_without_the_header_as_final(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with (
            http_hub(tmp_path) as served,
            proxied(Proxy(served.base, fail=1, status=400)) as proxy,
        ):
            await append(served.hub, "s", [b"x"])
            async with HttpHub(proxy.base, backoff=0.001, retries=5) as client:
                with pytest.raises(HttpRsioError) as caught:
                    async for _ in client.subscribe_values("s"):
                        pass
            assert (caught.value.status, caught.value.rsio) == (400, False)
            assert proxy.log == ["subscribe", "refused", "cancel"]  # no retry
            assert served.rsio.subs == {}

    run(main())
