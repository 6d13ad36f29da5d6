"""RS.io over HTTP, issue 22: what runs ahead so that neither side waits for the other.

* The hub reads the client's next request ahead: once a subscription has delivered all its
  demand, its pump reads the client's largest request yet once more (``HttpSubscription.
  read_ahead``), so that the next fetch finds its elements read; a fetch asking for more than
  that has the pump read once more first, so that its response holds what the demand allows.
* The client sends its next fetch as it hands a response's elements to the application (as
  RS.io/TCP's client sends its ``Request`` before it yields): the hub answers it while the
  application works.

In-process hub and real sockets on 127.0.0.1 (the helpers of test_rsio_http); what the
pump read is read from the subscription's public attributes, what the client sent from an
aiohttp ``TraceConfig`` on its session.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import aiohttp
from test_rsio_http import Runner, Served, append, http_hub, sid_of

from helpers import until
from tidewire.client.http import HttpHub
from tidewire.protocols.rsio.envelopes import envelopes_to_batch
from tidewire.protocols.rsio_http import length_prefixed_envelopes


def ready_ids(served: Served, sub_url: str) -> list[int]:
    """The ids the hub has read for the subscription at ``sub_url`` and not yet sent."""
    sub = served.rsio.subs[sid_of(sub_url)]
    return [i for batch in sub.ready for i in batch.ids]


def test_the_next_request_is_read_ahead_and_a_bigger_one_topped_up(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"v%d" % i for i in range(1, 11)])
            sub_url = await served.subscribe("s?format=value", 3)
            first = await served.fetch(sub_url)
            assert first.elements == [b"v1", b"v2", b"v3"]
            # No demand is left, and the hub has read the next request's worth all the same
            # (one request: 3 elements, no more).
            await until(lambda: ready_ids(served, sub_url) == [4, 5, 6], "read ahead")
            second = await served.fetch(sub_url, 3)
            assert (second.seq, second.elements) == (3, [b"v4", b"v5", b"v6"])
            await until(lambda: ready_ids(served, sub_url) == [7, 8, 9], "read ahead again")
            # Asking for more than was read ahead: the response holds what the demand allows
            # (here all that is left), not just what had been read.
            third = await served.fetch(sub_url, 5)
            assert (third.seq, third.elements) == (6, [b"v7", b"v8", b"v9", b"v10"])

    run(main())


def test_read_ahead_never_sends_past_the_demand(tmp_path: Path, run: Runner) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"v%d" % i for i in range(1, 11)])
            sub_url = await served.subscribe("s?format=value", 2)
            assert (await served.fetch(sub_url)).elements == [b"v1", b"v2"]
            await until(lambda: ready_ids(served, sub_url) == [3, 4], "read ahead")
            assert (await served.fetch(sub_url, 1)).elements == [b"v3"]  # (read, not sent)
            assert ready_ids(served, sub_url) == [4]

    run(main())


def test_the_client_sends_its_next_fetch_as_it_hands_a_batch_over(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"v%d" % i for i in range(1, 7)])
            fetches: list[str] = []

            async def started(_s: aiohttp.ClientSession, _c: SimpleNamespace,
                              params: aiohttp.TraceRequestStartParams) -> None:  # fmt: skip
                if "/rsio/sub/" in str(params.url):
                    fetches.append(str(params.url.query_string))

            trace = aiohttp.TraceConfig()
            trace.on_request_start.append(started)
            session = aiohttp.ClientSession(auto_decompress=False, trace_configs=[trace])
            async with session, HttpHub(served.base, session=session) as client:
                batches = client.subscribe("s", until_id=6, demand=2)
                async with contextlib.aclosing(batches):
                    got = [list((await anext(batches)).ids)]
                    # The application holds the first batch: the second fetch is out already,
                    # asking for the two it handed over.
                    assert fetches == ["", "request=2"]
                    (sub,) = served.rsio.subs.values()
                    await until(lambda: sub.state.next_seq == 4, "the hub answered it")
                    got += [list(b.ids) async for b in batches]
            assert got == [[1, 2], [3, 4], [5, 6]]  # each once, in order
            assert fetches == ["", "request=2", "request=2", "request=2"]  # the last: 410

    run(main())


def test_stopping_while_the_next_fetch_waits_cancels_it_and_the_subscription(
    tmp_path: Path, run: Runner
) -> None:
    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"a", b"b"])
            async with HttpHub(served.base) as client:
                batches = client.subscribe("s", demand=2)  # a live tail: the next fetch waits
                async with contextlib.aclosing(batches):
                    assert list((await anext(batches)).ids) == [1, 2]
                    (sub,) = served.rsio.subs.values()
                    await until(lambda: sub.fetching == 1, "the next fetch waits at the hub")
                await until(lambda: served.rsio.subs == {}, "the extra cancel arrives")
                # the client goes on as before
                await append(served.hub, "s", [b"c"])
                again = client.subscribe("s", from_id=3, until_id=3)
                assert [list(b.ids) async for b in again] == [[3]]

    run(main())


def test_the_body_read_ahead_is_encoded_ahead_and_used_only_whole(
    tmp_path: Path, run: Runner
) -> None:
    """The pump encodes the next response's body as it reads it ahead; a fetch that takes
    exactly that sends it as it is (the same bytes a fresh encoding gives), a fetch that
    takes less encodes what it takes."""

    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"v%d" % i for i in range(1, 11)], [b"k"] * 10)
            sub_url = await served.subscribe("s", 3)
            assert len((await served.fetch(sub_url)).elements) == 3
            sub = served.rsio.subs[sid_of(sub_url)]
            await until(lambda: sub.prebuilt is not None, "encoded ahead")
            prebuilt = sub.prebuilt
            assert prebuilt is not None
            assert prebuilt.count == 3
            assert prebuilt.body == b"".join(length_prefixed_envelopes(b) for b in sub.ready)
            second = await served.fetch(sub_url, 3)
            assert second.body == prebuilt.body  # what went out is what was encoded ahead
            assert sub.state.last is not None
            assert sub.state.last.body is prebuilt.body
            batch = envelopes_to_batch("s", second.elements)
            assert (list(batch.ids), batch.value(0), batch.key(0)) == ([4, 5, 6], b"v4", b"k")
            await until(lambda: sub.prebuilt is not None, "encoded ahead again")
            assert sub.prebuilt is not None
            assert sub.prebuilt.count == 3
            third = await served.fetch(sub_url, 1)  # takes less: encoded afresh, one element
            assert (third.seq, third.headers.get("Content-Encoding")) == (6, None)
            assert envelopes_to_batch("s", third.elements).ids.tolist() == [7]
            assert ready_ids(served, sub_url) == [8, 9]
            assert sub.prebuilt is None

    run(main())


def test_what_a_read_left_over_is_read_ahead_too(tmp_path: Path, run: Runner) -> None:
    """A demand of 64 or more reads the log a megabyte at a time (``hub.subscription``'s
    read-ahead): what one delivery did not take waits in the hub subscription's carry. The
    next request's worth is taken from there ahead of the fetch (and encoded), as from the
    log."""

    async def main() -> None:
        async with http_hub(tmp_path) as served:
            await append(served.hub, "s", [b"v%d" % i for i in range(1, 301)])  # one record
            sub_url = await served.subscribe("s", 100)
            assert len((await served.fetch(sub_url)).elements) == 100
            sub = served.rsio.subs[sid_of(sub_url)]
            await until(lambda: ready_ids(served, sub_url) == list(range(101, 201)),
                        "read ahead from the carry")  # fmt: skip
            await until(lambda: sub.prebuilt is not None, "encoded ahead")
            second = await served.fetch(sub_url, 100)
            assert second.seq == 100
            assert envelopes_to_batch("s", second.elements).ids.tolist() == list(range(101, 201))

    run(main())
