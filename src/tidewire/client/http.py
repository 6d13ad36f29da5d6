"""The asyncio RS.io-over-HTTP client (seed 002), over aiohttp's client:
``async with HttpHub("http://127.0.0.1:7480") as hub: async for batch in hub.subscribe("s")``.

It follows the seed's client rules (docs/protocols/rsio-http.md):

* subscribes with ``PUT <publisher url>?request=<demand>``, then long-polls the subscription
  URL, asking for more (``request=``) as the application consumes, so that at most ``demand``
  elements are asked for and not yet handed over; each next fetch goes out as a response's
  elements are handed to the application (as RS.io/TCP's client sends its ``Request`` before
  it yields), so that the hub answers it while the application works on them;
* ``204`` polls again (after ``Retry-After`` when the server gives one), ``410`` ends the
  iteration (onComplete);
* a 4xx/5xx with ``X-Rsio-Error`` ends it with :class:`HttpRsioError` (the server has cancelled);
  a 5xx without the header, or a failed connection, is retried with exponential backoff and
  jitter (:class:`~tidewire.client.backoff.Backoff`: ``retries`` times, or as ``retry=`` says);
  a 4xx without it (and 501, 502, 505) is final. Giving up sends the extra ``cancel`` the seed
  asks for;
* every fetch tells the hub the sequence number of the next element it expects
  (``X-Tidewire-Sequence``), and elements received twice after a resend are dropped.

With ``retry=`` a subscription also survives the hub: when the hub no longer has it (a fetch
answered ``404`` or ``503`` with ``X-Rsio-Error``: unknown, or the hub shutting down; or the
subscription URL failed to connect twice in a row), the client subscribes again from the last
id handed over + 1 (the publisher name's ``from=``), drops any element at or below that id,
and goes on: every event once, in order. That needs the ids, so it holds for envelopes
(``subscribe``; ``subscribe_values`` then subscribes to envelopes too) and records; a publisher
of bare values (``elements("s?format=value")``) cannot resume, and its lost subscription is
final as without ``retry=``. See docs/protocols/rsio-http.md, "Reconnecting clients".

Several gateways (cluster mode, where each serves every stream): ``HttpHub(["http://h1:7480",
"http://h2:7480"])``, or ``"http://h1:7480,http://h2:7480"`` / ``"http://h1:7480,h2:7480"``. A
request that fails on the current gateway (no connection, or an answer that is retried) moves
the client on to the next one, round robin (:attr:`HttpHub.url`), paced by the same backoff; a
subscription lives on the gateway that made it, so with ``retry=`` it is made again on the
next gateway from the last id handed over (as after a restart), and without ``retry=`` only
new subscriptions go there.

Credentials: ``token=`` is sent on every request as ``Authorization: Bearer <token>`` (a
refusal is a 401/403 onError: :class:`HttpRsioError`); ``ssl=`` is the TLS context for
``https://`` (e.g. with a client certificate, ``tidewire.server.guard.client_context``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import ssl as _ssl
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

import aiohttp
import yarl
from multidict import CIMultiDict, CIMultiDictProxy

from ..model import Batch, RemoteProtocolError, TidewireError, validate_stream_name
from ..protocols.rsio.envelopes import envelopes_to_batch
from ..protocols.rsio.names import FromTime, PublisherName, PublisherNameError, start_position
from ..protocols.rsio.varint import NeedData, pull_varint
from ..protocols.rsio_http import (
    ERROR_HEADER,
    FIXED_SIZE,
    LENGTH_PREFIXED,
    SEQUENCE_HEADER,
    ClientSubscription,
    decode_body,
    decode_fixed_size,
)
from ..protocols.rsio_http.codec import (
    MAX_DEMAND,
    count_length_prefixed,
    length_prefixed_envelopes_batch,
)
from ..record import parse_header
from .backoff import Backoff, GaveUp, Retry
from .reconnect import Reconnector, gateway_urls
from .rsio_http_fetch import FetchPool, Unsupported

__all__ = ["HttpHub", "HttpRsioError"]

FINAL_5XX = (501, 502, 505)  # the seed: final even without X-Rsio-Error
LOST_AFTER = 2  # failed connections in a row to a subscription URL before subscribing again


class HttpRsioError(TidewireError):
    """The subscription ended with an error: ``status`` (0: no HTTP answer) and the message;
    ``rsio`` when the hub said so itself (``X-Rsio-Error``)."""

    def __init__(self, status: int, message: str, *, rsio: bool) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.rsio = rsio


class HttpHub:
    """A hub's RS.io-over-HTTP endpoint (``base_url``: ``http://host:port``, or several
    gateways: a list or a comma-separated string, see the module).

    ``retries``, ``backoff``, ``max_backoff``: how one request is retried (``retries`` more
    tries, waits from ``backoff`` seconds doubling up to ``max_backoff``, 50-100 % of each);
    giving up is :class:`HttpRsioError`. ``retry``: a :class:`~tidewire.client.backoff.Retry`
    instead, which also makes subscriptions survive the hub (see the module docstring); the
    limit of one outage (``attempts``, ``give_up_after``) then ends a subscription with
    :class:`~tidewire.client.backoff.GaveUp`. ``pacing`` makes the
    :class:`~tidewire.client.backoff.Backoff` of each subscription (tests give their own sleep
    and clock). Counters: ``retried`` (requests tried again), ``resubscribed`` (subscriptions
    made again after the hub lost one)."""

    def __init__(self, base_url: str | Sequence[str], *,
                 session: aiohttp.ClientSession | None = None, retries: int = 6,
                 backoff: float = 0.05, max_backoff: float = 2.0,
                 poll_timeout: float = 90.0, token: str | None = None,
                 ssl: _ssl.SSLContext | None = None, retry: Retry | None = None,
                 pacing: Callable[[Retry], Backoff] = Backoff) -> None:  # fmt: skip
        urls = tuple(url.rstrip("/") for url in gateway_urls(base_url))
        self._auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
        self._ssl: _ssl.SSLContext | bool = ssl if ssl is not None else True  # True: verify
        self._own_session = session is None
        self._session = session
        # fetches on http:// of its own session: the lean path (rsio_http_fetch)
        self._lean = FetchPool(poll_timeout) if session is None else None
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.poll_timeout = poll_timeout  # longer than the hub's poll window (25 s by default)
        self.reconnecting = retry is not None
        self.retry = retry if retry is not None else Retry(
            initial=max(backoff, 1e-6), maximum=max(backoff, max_backoff, 1e-6), jitter=0.5,
            attempts=retries + 1,
        )  # fmt: skip
        self.pacing = pacing
        self.retried = 0
        self.resubscribed = 0
        # (only its URL rotation is used: each request's waits are its own Reconnector's)
        self._gateways: Reconnector[_Answer] = Reconnector(pacing(self.retry), "RS.io over "
                                                           "HTTP", urls=urls)  # fmt: skip

    @property
    def base_url(self) -> str:
        """The gateway new requests go to (``http://host:port``)."""
        url = self._gateways.url
        assert url is not None  # (gateway_urls gives one at least)
        return url

    @property
    def url(self) -> str:
        """The gateway new requests go to (the same as :attr:`base_url`)."""
        return self.base_url

    @property
    def urls(self) -> tuple[str, ...]:
        """Every gateway, in the order they are tried."""
        return self._gateways.urls

    @property
    def failovers(self) -> int:
        """Moves to the next gateway after a failed request."""
        return self._gateways.failovers

    async def __aenter__(self) -> HttpHub:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,  # X-Rsio-* "encodings" are the bodies' own layout
                timeout=aiohttp.ClientTimeout(total=None, sock_read=self.poll_timeout),
            )
        return self._session

    async def close(self) -> None:
        if self._lean is not None:
            self._lean.close()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ typed subscriptions

    async def subscribe(
        self, stream: str, *, from_id: int | str | FromTime = "earliest",
        until_id: int | None = None, key: bytes | None = None, demand: int = 1000,
    ) -> AsyncGenerator[Batch, None]:  # fmt: skip
        """Batches of ``stream`` (the envelope format: ids, keys, timestamps), from
        ``from_id`` ("earliest", "latest" or an id), live or up to ``until_id``."""
        validate_stream_name(stream)
        name = str(PublisherName(stream, start_position(from_id), until_id, key))
        if not 1 <= demand <= MAX_DEMAND:
            raise ValueError("demand is 1 to 2^63-1")
        resume = _Resume.of(name) if self.reconnecting else None
        responses = self._responses(name, demand, resume)
        async with contextlib.aclosing(responses):
            async for response in responses:
                try:  # (a length-prefixed body: parsed in place, each value copied once)
                    batch: Batch | None = response.batch(stream)
                except (ValueError, TidewireError) as exc:
                    raise HttpRsioError(0, f"a malformed envelope on {stream!r}: {exc}",
                                        rsio=False) from None  # fmt: skip
                if resume is not None and batch is not None:
                    batch = resume.take_batch(batch)
                if batch is not None:
                    yield batch

    async def subscribe_values(
        self, stream: str, *, size: int = 0, from_id: int | str | FromTime = "earliest",
        until_id: int | None = None, key: bytes | None = None, demand: int = 1000,
    ) -> AsyncGenerator[list[bytes], None]:  # fmt: skip
        """Values only (``format=value``; ``size=N``: fixed-size elements). With ``retry=``,
        envelopes are asked for (they carry the ids a new subscription resumes from) and the
        values taken out here; a value that is not ``size`` bytes ends it with
        :class:`HttpRsioError` (status 0), as the hub's 500 would."""
        if not self.reconnecting:
            name = PublisherName(stream, start_position(from_id), until_id, key, "value", size)
            async for elements in self.elements(str(name), demand=demand):
                yield elements
            return
        if size < 0:
            raise ValueError("size is 0 (any) or more")
        batches = self.subscribe(stream, from_id=from_id, until_id=until_id, key=key,
                                 demand=demand)  # fmt: skip
        async with contextlib.aclosing(batches):
            async for batch in batches:
                values = [batch.value(i) for i in range(len(batch))]
                if size and any(len(v) != size for v in values):
                    bad = next(i for i, v in enumerate(values) if len(v) != size)
                    raise HttpRsioError(0, f"event {batch.ids[bad]} of {stream!r} is "
                                        f"{len(values[bad])} bytes, not {size}",
                                        rsio=False)  # fmt: skip
                yield values

    # ------------------------------------------------------------------ the protocol

    async def elements(self, publisher: str, *, demand: int = 1000
                       ) -> AsyncGenerator[list[bytes], None]:  # fmt: skip
        """The elements of ``publisher`` (RS.io's publisher name: a percent-encoded stream and
        its arguments), a list per response, each element once."""
        if not 1 <= demand <= MAX_DEMAND:
            raise ValueError("demand is 1 to 2^63-1")
        resume = _Resume.of(publisher) if self.reconnecting else None
        responses = self._responses(publisher, demand, resume)
        async with contextlib.aclosing(responses):
            async for response in responses:
                fresh = response.elements()
                if resume is not None:
                    fresh = resume.take(fresh)
                if fresh:
                    yield fresh

    async def _responses(self, publisher: str, demand: int, resume: _Resume | None
                         ) -> AsyncGenerator[_Response, None]:  # fmt: skip
        """The 200 responses of ``publisher``'s subscription with elements not received
        before, each counted (not decoded: the caller decodes it as it needs, after the next
        fetch is on its way). ``resume``: where a subscription made again starts (with
        ``retry=``), kept up to date by the caller before it asks for the next response."""
        if resume is not None and resume.name.start == "latest":
            resume.name = await self._resolve_latest(resume.name)
        what = f"RS.io over HTTP {publisher!r} at {self.base_url}"
        pacing: Reconnector[_Answer] = Reconnector(self.pacing(self.retry), what)
        sub_url: str | None = None
        abandoned: str | None = None  # a subscription left behind that the hub may still have
        state = ClientSubscription()
        ahead: asyncio.Task[tuple[_Answer, int]] | None = None  # the next fetch, under way
        done = False

        def fetch(url: str) -> asyncio.Task[tuple[_Answer, int]]:
            """The next fetch on ``url`` (its answer and the demand it added), as a task:
            asking for more once half of the demand has arrived."""
            more = demand - state.outstanding if state.outstanding <= demand // 2 else 0
            target = f"{url}?request={more}" if more else url
            answer = self._put(target, pacing, what, headers={SEQUENCE_HEADER: str(state.next_seq)},
                               lost=(404, 503) if resume is not None else (),
                               lost_after=LOST_AFTER if resume is not None else None,
                               lean=True)  # fmt: skip
            return asyncio.ensure_future(_with(answer, more))

        try:
            while True:
                if sub_url is None:
                    if resume is not None and resume.finished:
                        done = True  # (until= reached: the 410 was what got lost)
                        return
                    source = publisher if resume is None else resume.publisher()
                    sub_url = await self._subscribe(source, demand, pacing, what)
                    if not self.reconnecting:  # (with retry=, one outage may span many)
                        pacing.reset()
                    if abandoned is not None:  # the hub answers again: release the old one
                        with contextlib.suppress(Exception):
                            await asyncio.shield(self._cancel(abandoned))
                        abandoned = None
                    state = ClientSubscription()
                    state.asked(demand)
                task, ahead = ahead or fetch(sub_url), None
                try:
                    response, more = await task
                except _Lost as lost:  # the hub no longer has it (or cannot be reached there)
                    self.resubscribed += 1
                    if not lost.error.rsio:
                        abandoned = sub_url
                    sub_url = None
                    continue
                state.asked(more)  # (the hub answered: it has counted them)
                if response.status == 200:
                    pacing.reset()
                    first = response.headers.get(SEQUENCE_HEADER)
                    body = _Response(response.headers.get("Content-Encoding"), response.body)
                    body.skip = state.received_count(int(first) if first is not None else None,
                                                     body.count)  # fmt: skip
                    if body.skip < body.count:
                        # The next fetch goes out as these are handed over (as RS.io/TCP's
                        # client sends its Request before it yields): the very request the
                        # loop would make once the application is back, so the hub answers
                        # it while the application works on these. Two loop turns put it on
                        # the wire first: one runs the task up to its write, and uvloop
                        # sends small writes only at the end of a turn.
                        ahead = fetch(sub_url)
                        await asyncio.sleep(0)
                        await asyncio.sleep(0)
                        yield body
                elif response.status == 204:
                    pacing.reset()
                    delay = _retry_after(response.headers.get("Retry-After"))
                    if delay:
                        await pacing.backoff.sleep(delay)
                elif response.status == 410:
                    done = True
                    return
                else:
                    raise HttpRsioError(response.status, "unexpected answer to a fetch",
                                        rsio=False)  # fmt: skip
        except HttpRsioError as exc:
            done = exc.rsio  # the hub cancelled it itself
            raise
        finally:
            if ahead is not None:  # the application stopped while the next fetch was out
                ahead.cancel()
                await asyncio.wait([ahead])  # (a cancel of this task itself still ends it)
                if not ahead.cancelled():
                    ahead.exception()  # (its answer or its failure is dropped: retrieved)
            # the application stopped, or the client gives up: the extra cancel (and one for a
            # subscription left behind when the hub could not be reached there)
            for url in (sub_url if not done else None, abandoned):
                if url is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self._cancel(url))

    async def _subscribe(self, publisher: str, demand: int, pacing: Reconnector[_Answer],
                         what: str) -> str:  # fmt: skip
        """``PUT <publisher>?request=<demand>``: the subscription URL (the 201's Location)."""
        path, _, query = publisher.partition("?")
        path = {".": "%2E", "..": "%2E%2E"}.get(path, path)  # (not dot segments of the URL)
        tail = f"/rsio/pub/{path}?{query + '&' if query else ''}request={demand}"
        # With retry=, a 503 with X-Rsio-Error (the hub shutting down, or full) is "later",
        # and so is a 429 (this principal's subscriptions at their limit, until one ends).
        # Each try goes to the gateway of the moment: a failed one moved it on.
        response = await self._put(lambda: self.base_url + tail, pacing, what,
                                   again=(429, 503) if self.reconnecting else ())  # fmt: skip
        if response.status != 201 or "Location" not in response.headers:
            raise HttpRsioError(response.status, "no subscription (201 with a Location) in "
                                "answer to the subscribe", rsio=False)  # fmt: skip
        return str(response.headers["Location"])

    async def _resolve_latest(self, name: PublisherName) -> PublisherName:
        """``from=latest`` as an id (the stream's latest + 1, from ``GET /streams``), so that a
        subscription made again resumes where the first began, not at a later "latest"; kept
        as it is when the hub does not say."""
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            async with asyncio.timeout(10):
                listing = f"{self.base_url}/streams?internal=1"  # (_tidewire.* streams too)
                async with self.session.get(listing, headers=self._auth,
                                            ssl=self._ssl) as response:  # fmt: skip
                    if response.status == 200:
                        listed = json.loads(await response.read())
                        latest = next((s.get("latest_id") for s in listed
                                       if s.get("name") == name.stream), None)  # fmt: skip
                        return replace(name, start=int(latest or 0) + 1)
        return name

    async def _cancel(self, sub_url: str) -> None:
        async with asyncio.timeout(5):
            async with self.session.put(sub_url + "/cancel", headers=self._auth,
                                        ssl=self._ssl) as response:  # fmt: skip
                await response.read()

    async def _request(self, url: str, headers: dict[str, str] | None, *,
                       lean: bool = False) -> _Answer:  # fmt: skip
        """One ``PUT``; a failed connection is status 0. ``lean``: a fetch, sent on the lean
        path when it applies (:mod:`.rsio_http_fetch`)."""
        target = yarl.URL(url, encoded=True)  # as written: no dot-segment removal
        if lean and self._lean is not None and target.scheme == "http":
            try:
                status, raw, got = await self._lean.put(target, {**self._auth, **(headers or {})})
                return _Answer(status, CIMultiDictProxy(CIMultiDict(raw)), got)
            except Unsupported:
                pass  # (an answer it does not read: the same request through aiohttp)
            except (OSError, TimeoutError) as exc:
                return _Answer(0, {}, str(exc).encode() or type(exc).__name__.encode())
        try:
            async with self.session.put(target, headers={**self._auth, **(headers or {})},
                                        ssl=self._ssl) as response:  # fmt: skip
                body = await response.read()
                return _Answer(response.status, response.headers, body)
        except aiohttp.ClientConnectorCertificateError as exc:  # trying again won't help
            raise HttpRsioError(0, f"the hub's certificate: {exc}", rsio=False) from None
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
            return _Answer(0, {}, str(exc).encode())

    async def _put(self, url: str | Callable[[], str], pacing: Reconnector[_Answer] | None = None,
                   what: str = "",
                   *, headers: dict[str, str] | None = None, again: tuple[int, ...] = (),
                   lost: tuple[int, ...] = (), lost_after: int | None = None,
                   lean: bool = False) -> _Answer:  # fmt: skip
        """One request, retried (paced by ``pacing``, the one reconnect helper; a fresh one
        with a fresh :class:`Backoff` if none) on a
        5xx without ``X-Rsio-Error``, a failed connection, and the ``again`` statuses with it;
        an onError or a final error raises :class:`HttpRsioError`. :class:`_Lost` (after a
        wait): the ``lost`` statuses with the header, or ``lost_after`` failed connections
        in a row. ``url``: or a function giving it at each try (a request to whichever
        gateway is current). A failure that is tried again, of a request to the current
        gateway, moves the client on to the next gateway first."""
        what = what or f"RS.io over HTTP at {self.base_url}"
        if pacing is None:
            pacing = Reconnector(self.pacing(self.retry), what)
        failed = 0  # connections in a row
        while True:
            target = url() if callable(url) else url
            answer = await self._request(target, headers, lean=lean)
            if 0 < answer.status < 400 or answer.status == 410:  # (410: onComplete)
                return answer
            message = answer.body.decode("utf-8", "replace").strip()[:500]
            rsio = answer.headers.get(ERROR_HEADER, "").lower() == "true"
            error = HttpRsioError(answer.status, message or "no answer", rsio=rsio)
            failed = failed + 1 if answer.status == 0 else 0
            gone = (rsio and answer.status in lost) or (
                lost_after is not None and failed >= lost_after
            )  # fmt: skip
            retriable = (rsio and answer.status in again) or (not rsio and (
                answer.status == 0 or (answer.status >= 500 and answer.status not in FINAL_5XX)
            ))  # fmt: skip
            if not gone and not retriable:
                raise error
            if target.startswith(self.base_url + "/"):  # (not a subscription on an old one)
                self._gateways.move_on()
            later = 0.0
            if rsio:  # (a 503 that says when: not before)
                later = min(_retry_after(answer.headers.get("Retry-After")), self.retry.maximum)
            try:
                await pacing.pause(error, at_least=later)
            except GaveUp:
                if self.reconnecting:
                    raise
                raise error from None  # (as before Retry: the last answer is the error)
            if gone:
                raise _Lost(error)
            self.retried += 1


class _Lost(Exception):
    """The subscription is gone from the hub, or unreachable at its URL: subscribe again."""

    def __init__(self, error: HttpRsioError) -> None:
        super().__init__(str(error))
        self.error = error


class _Resume:
    """Where a subscription made again starts: the id after the last element handed over,
    read from the elements (an envelope's first varint; a record's header)."""

    def __init__(self, name: PublisherName) -> None:
        self.name = name
        self.last: int | None = None  # the id of the last event handed over

    @classmethod
    def of(cls, publisher: str) -> _Resume | None:
        """``None`` when the elements carry no ids (``format=value``) or the name is not
        tidewire's grammar: such a subscription cannot resume."""
        try:
            name = PublisherName.parse(publisher)
        except PublisherNameError:
            return None
        return cls(name) if name.format in ("envelope", "records") else None

    @property
    def finished(self) -> bool:
        until, last = self.name.until, self.last
        return last is not None and until is not None and last >= until

    def publisher(self) -> str:
        return str(self.name if self.last is None else replace(self.name, start=self.last + 1))

    def _ids(self, element: bytes) -> tuple[int, int]:
        try:
            if self.name.format == "records":
                header = parse_header(element)
                return header.base_id, header.last_id
            event_id, _ = pull_varint(element, 0)
            return event_id, event_id
        except (ValueError, NeedData, TidewireError, IndexError) as exc:
            raise HttpRsioError(0, f"an element of {self.name.stream!r} without an id: {exc}",
                                rsio=False) from None  # fmt: skip

    def take_batch(self, batch: Batch) -> Batch | None:
        """:meth:`take` for a batch of envelopes (its ids increase): ``None`` when nothing
        of it is past the last id handed over."""
        ids = batch.ids
        if self.last is not None and ids[0] <= self.last:
            keep = bisect.bisect_right(ids, self.last)
            if keep == len(batch):
                return None
            batch = batch.slice(keep, len(batch))
        self.last = batch.ids[-1]
        return batch

    def take(self, elements: list[bytes]) -> list[bytes]:
        """``elements`` without those at or below the last id handed over (there are none
        unless the hub started below ``from=``); the last id moves on."""
        if not elements:
            return elements
        if self.last is not None and self._ids(elements[0])[0] <= self.last:
            last = self.last
            elements = [e for e in elements if self._ids(e)[1] > last]
            if not elements:
                return elements
        self.last = self._ids(elements[-1])[1]
        return elements


class _Response:
    """A 200's body: its ``Content-Encoding`` (``None``: one element), how many elements it
    holds (counted at once: the framing is checked then) and how many of the first to leave
    out (received before: a resend)."""

    __slots__ = ("body", "count", "encoding", "skip")

    def __init__(self, encoding: str | None, body: bytes | bytearray) -> None:
        self.encoding = encoding
        self.body = body
        self.skip = 0
        if not encoding:
            self.count = 1
        elif encoding.lower() == LENGTH_PREFIXED.lower():
            self.count = count_length_prefixed(body)
        elif encoding.lower() == FIXED_SIZE.lower():
            size, packed = decode_fixed_size(body)
            self.count = len(packed) // size
        else:
            raise RemoteProtocolError(f"unknown Content-Encoding {encoding!r}")

    def elements(self) -> list[bytes]:
        """The elements not received before, one ``bytes`` each."""
        if not self.encoding:
            return [bytes(self.body)]  # (no copy of a bytes body; the lean path's bytearray)
        elements = decode_body(self.encoding, self.body)
        return elements[self.skip :] if self.skip else elements

    def batch(self, stream: str) -> Batch:
        """The envelopes not received before, as one batch of ``stream``."""
        encoding = self.encoding
        if encoding and encoding.lower() == LENGTH_PREFIXED.lower():
            return length_prefixed_envelopes_batch(stream, self.body, self.skip)
        return envelopes_to_batch(stream, self.elements())


class _Answer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Any, body: bytes | bytearray) -> None:
        self.status = status
        self.headers = headers
        self.body = body


async def _with(answer: Awaitable[_Answer], more: int) -> tuple[_Answer, int]:
    return await answer, more


def _retry_after(value: str | None) -> float:
    if value is None or not value.strip().isdigit():
        return 0.0
    return min(30.0, float(value.strip()))
