"""RS.io over HTTP (seed 002) on the hub's aiohttp app: the thin adapter around the sans-IO
:mod:`tidewire.protocols.rsio_http`. Every request is ``PUT``; the URLs and every response are
in docs/protocols/rsio-http.md:

* ``PUT /rsio/pub/<publisher>?request=<n>`` -> ``201 Created``, ``Location: .../rsio/sub/<id>``
  (``<publisher>`` is RS.io/TCP's publisher name: a percent-encoded stream and its arguments).
* ``PUT /rsio/sub/<id>?request=<n>`` long-polls: ``200`` with one element or a batch, ``204``
  when the poll window passes, ``410`` once a bounded subscription has delivered everything.
* ``PUT /rsio/sub/<id>/requestMore=<n>`` and ``PUT /rsio/sub/<id>/cancel`` -> ``200``.
* onError: 4xx/5xx with ``X-Rsio-Error: true`` and a text/plain message.

Who asks (the principal, :data:`PRINCIPAL_KEY`) is settled before the routes run, by the app's
middleware (:mod:`.app`): a subscribe needs ``read`` on its stream, and a subscription answers
only the principal that made it. Both refusals are raised as
:class:`~tidewire.model.AccessError`, which the middleware turns into 401/403.

Per subscription a pump task moves the hub subscription's batches into a buffer bounded in
bytes (``max_response_bytes``); a fetch takes what is there, within demand, as one response. The
response is written with a known ``Content-Length``; only once it is written in full does it
count, otherwise the next fetch gets it again (the seed's resend rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from aiohttp import web

from ..hub import Hub, RecordSubscription, Subscription
from ..hub.access import ANONYMOUS, Access, Principal
from ..model import Batch, Forbidden, RemoteProtocolError, TidewireError
from ..observe.logs import connection_log
from ..protocols.rsio.envelopes import encode_envelopes, fixed_size_values
from ..protocols.rsio.names import PublisherName, PublisherNameError
from ..protocols.rsio_http import (
    ERROR_HEADER,
    FIXED_SIZE,
    LENGTH_PREFIXED,
    SEQUENCE_HEADER,
    BadRequest,
    Delivery,
    ServerSubscription,
    State,
    encode_length_prefixed,
    length_prefixed_values,
    parse_count,
    split_query,
)
from ..record import encode as encode_record

__all__ = ["PRINCIPAL_KEY", "HttpSettings", "RsioHttp", "principal"]

log = logging.getLogger("tidewire.rsio_http")

PUB_PREFIX = "/rsio/pub/"
SUB_PREFIX = "/rsio/sub/"
_ELEMENTS = web.ResponseKey("tidewire.rsio_elements", bool)  # Content-Type to drop
PRINCIPAL_KEY = web.RequestKey("tidewire.principal", Principal)  # set by the app's middleware
_CONDITIONAL = ("If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since",
                "If-Range")  # fmt: skip


@dataclass(frozen=True, slots=True)
class HttpSettings:
    poll_seconds: float = 25.0  # a fetch that finds nothing answers 204 after this
    idle_seconds: float = 300.0  # a subscription without requests for this long is cancelled
    max_subscriptions: int = 10_000  # on the hub, at once
    max_response_bytes: int = 4 * 1024 * 1024  # one response's elements (one element may be more)
    # the HTTP listener's own bounds (docs/protocols/rsio-http.md, "Security and limits")
    header_seconds: float = 10.0  # a request's headers, from its first byte
    body_seconds: float = 60.0  # a request's body, from the end of its headers
    max_body_bytes: int = 16 * 1024 * 1024  # a request's body (read and dropped: RS.io has none)


def principal(request: web.Request) -> Principal:
    """Who sent ``request`` (the app's middleware decided; anonymous when nothing did)."""
    who: Principal = request.get(PRINCIPAL_KEY, ANONYMOUS)
    return who


def _error(status: int, message: str, *, rsio: bool = True,
           headers: dict[str, str] | None = None) -> web.Response:  # fmt: skip
    """An error response; with ``X-Rsio-Error: true`` it is onError (the subscription is gone)."""
    headers = dict(headers or {})
    if rsio:
        headers[ERROR_HEADER] = "true"
    return web.Response(status=status, text=message + "\n", headers=headers)


class _Sub:
    def __init__(self, sid: str, name: PublisherName, source: Subscription | RecordSubscription,
                 now: float, owner: Principal) -> None:  # fmt: skip
        self.id = sid
        self.name = name
        self.owner = owner  # the principal that made it: the only one it answers
        self.source = source
        self.state = ServerSubscription(name.size)
        self.ready: deque[Batch] = deque()  # from the hub, not yet in a delivery
        self.ready_bytes = 0
        self.changed = asyncio.Event()  # ready, state or demand changed
        self.drained = asyncio.Event()  # the pump may read more
        self.last_seen = now
        self.fetching = 0  # fetches under way
        self.polls = 0  # the newest fetch's number: an older one still waiting answers 204
        self.pump: asyncio.Task[None] | None = None

    def touch(self) -> None:
        self.changed.set()


class RsioHttp:
    """The RS.io-over-HTTP subscriptions of one hub, and their routes."""

    def __init__(self, hub: Hub, settings: HttpSettings | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 access: Access | None = None) -> None:  # fmt: skip
        self.hub = hub
        self.settings = settings or HttpSettings()
        self.access = access if access is not None else Access()
        self.clock = clock
        self.subs: dict[str, _Sub] = {}
        self._serial = itertools.count(1)
        self._reaper: asyncio.TimerHandle | None = None
        self._closing = False

    def add_routes(self, app: web.Application) -> None:
        app.router.add_put(PUB_PREFIX + "{publisher:.*}", self._subscribe)
        app.router.add_put(SUB_PREFIX + "{sid}", self._fetch)
        app.router.add_put(SUB_PREFIX + "{sid}/{action}", self._action)
        app.on_response_prepare.append(_strip_content_type)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)

    async def _on_startup(self, app: web.Application) -> None:
        self._arm_reaper()

    async def _on_shutdown(self, app: web.Application) -> None:
        self.close()

    # ------------------------------------------------------------------ subscribe

    async def _subscribe(self, request: web.Request) -> web.StreamResponse:
        if (refused := _conditional(request)) is not None:
            return refused
        raw_path = request.rel_url.raw_path
        try:
            query, demand = split_query(request.rel_url.raw_query_string)
            text = raw_path[len(PUB_PREFIX) :] + ("?" + query if query else "")
            name = PublisherName.parse(text)
        except (BadRequest, PublisherNameError) as exc:
            return self._refuse(request, 400, str(exc))
        owner = principal(request)
        self.access.check(owner, "read", name.stream)  # Forbidden: the middleware answers
        if self._closing:
            return self._refuse(
                request, 503, "the hub is shutting down", headers={"Retry-After": "1"}
            )
        if len(self.subs) >= self.settings.max_subscriptions:
            limit = self.settings.max_subscriptions
            return self._refuse(request, 503, "too many subscriptions on this hub (the limit "
                                f"is {limit})", headers={"Retry-After": "1"})  # fmt: skip
        try:
            source: Subscription | RecordSubscription = self.hub.subscribe(
                name.stream, name.start, until_id=name.until, key=name.key,
                max_batch_bytes=self.settings.max_response_bytes, via="rsio-http",
            )  # fmt: skip
        except (TidewireError, ValueError) as exc:
            return self._refuse(request, 400, str(exc))
        if name.format == "records":
            source = RecordSubscription(cast(Subscription, source))
        sid = f"{next(self._serial):x}-{secrets.token_urlsafe(12)}"  # never reused
        sub = _Sub(sid, name, source, self.clock(), owner)
        self.subs[sid] = sub
        if demand:
            sub.state.request(demand)
            source.request(demand)
        sub.pump = asyncio.create_task(self._pump(sub))
        location = request.url.with_path(SUB_PREFIX + sid).with_query(None)
        return web.Response(status=201, headers={"Location": str(location)})

    def _refuse(self, request: web.Request, status: int, message: str, *, rsio: bool = True,
                headers: dict[str, str] | None = None) -> web.Response:  # fmt: skip
        connection_log(log, request.transport, "http").warning(
            "rsio-http %s %s: %d %s", request.method, request.rel_url.raw_path[:200], status,
            message)  # fmt: skip
        return _error(status, message, rsio=rsio, headers=headers)

    # ------------------------------------------------------------------ the pump

    async def _pump(self, sub: _Sub) -> None:
        """Move the hub subscription's batches into ``sub.ready``, at most about
        ``max_response_bytes`` ahead of the fetches."""
        limit = self.settings.max_response_bytes
        try:
            while True:
                while sub.ready_bytes >= limit:
                    sub.drained.clear()
                    await sub.drained.wait()
                batches = await sub.source.next()
                if batches is None:
                    if sub.source.complete:
                        sub.state.complete()
                    break
                sub.ready.extend(batches)
                sub.ready_bytes += sum(b.nbytes for b in batches)
                sub.touch()
        except asyncio.CancelledError:
            raise
        except TidewireError as exc:
            log.warning("rsio-http subscription %s (%s): %s", sub.id, sub.name, exc)
            sub.state.fail(500, str(exc))
        sub.touch()

    # ------------------------------------------------------------------ fetch

    async def _fetch(self, request: web.Request) -> web.StreamResponse:
        if (refused := _conditional(request)) is not None:
            return refused
        sub = self.subs.get(request.match_info["sid"])
        if sub is None:
            return _error(404, "no such subscription (cancelled, ended or never made)")
        _owned(request, sub)
        try:
            query, demand = split_query(request.rel_url.raw_query_string)
            if query:
                raise BadRequest(f"unknown query arguments {query[:80]!r} (only request=)")
            seen = request.headers.get(SEQUENCE_HEADER)
            expects = None if seen is None else parse_count(seen, SEQUENCE_HEADER)
        except BadRequest as exc:  # the subscription carries on
            return self._refuse(request, 400, str(exc), rsio=False)
        sub.last_seen = self.clock()
        state = sub.state
        if demand and state.state is State.OPEN:  # (first: a resend below spends none of it)
            state.request(demand)
            sub.source.request(demand)
        if expects is not None and sub.state.unsent is None:
            try:
                again = sub.state.received_up_to(expects)
            except RemoteProtocolError as exc:
                return self._refuse(request, 400, str(exc), rsio=False)
            if again is not None:  # written in full, and lost all the same: once more
                return await self._deliver(request, sub, again)
        sub.fetching += 1
        try:
            return await self._answer(request, sub)
        finally:
            sub.fetching -= 1
            sub.last_seen = self.clock()

    async def _answer(self, request: web.Request, sub: _Sub) -> web.StreamResponse:
        state = sub.state
        sub.polls += 1
        mine = sub.polls
        sub.touch()  # an older fetch still waiting answers 204 at once
        deadline = self.clock() + self.settings.poll_seconds
        while True:
            if sub.polls != mine:  # a newer fetch took over (it gets what there is)
                return web.Response(status=204)
            if state.state is State.FAILED:  # (before anything ready: nothing is skipped)
                assert state.error is not None
                self._drop(sub)
                return _error(*state.error)
            if state.unsent is not None:
                return await self._deliver(request, sub, state.unsent)
            if sub.ready and state.room > 0:
                try:
                    delivery = self._take(sub)
                except TidewireError as exc:  # e.g. a value that is not size=N bytes
                    log.warning("rsio-http subscription %s (%s): %s", sub.id, sub.name, exc)
                    state.fail(500, str(exc))
                    continue
                return await self._deliver(request, sub, delivery)
            if state.state is State.CANCELLED or sub.id not in self.subs:
                return _error(404, "the subscription was cancelled")
            if state.state is State.COMPLETE and not sub.ready:
                return web.Response(status=410)  # onComplete (kept until idle: 410 again)
            left = deadline - self.clock()
            if left <= 0:
                return web.Response(status=204, headers={"Retry-After": "0"})
            sub.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sub.changed.wait(), left)

    def _take(self, sub: _Sub) -> Delivery:
        """A new delivery from ``sub.ready``: at most the demand left and about
        ``max_response_bytes`` (at least one element)."""
        state, name = sub.state, sub.name
        room, budget = state.room, self.settings.max_response_bytes
        taken: list[Batch] = []
        count = 0
        while sub.ready and count < room:
            batch = sub.ready[0]
            if name.format == "records":  # one element per batch
                want = 1
            else:
                want = min(len(batch), room - count)
                fit = max(1, batch.fit(0, budget)) if taken == [] else batch.fit(0, budget)
                want = min(want, fit)
                if want == 0:
                    break
            if want < len(batch) and name.format != "records":
                taken.append(batch.slice(0, want))
                sub.ready[0] = batch.slice(want, len(batch))
            else:
                taken.append(sub.ready.popleft())
            budget -= taken[-1].nbytes
            count += want
            if budget <= 0:
                break
        sub.ready_bytes = sum(b.nbytes for b in sub.ready)
        sub.drained.set()
        return self._encode(state, name, taken, count)

    @staticmethod
    def _encode(state: ServerSubscription, name: PublisherName, batches: list[Batch],
                count: int) -> Delivery:  # fmt: skip
        if name.size:
            values = b"".join([bytes(fixed_size_values(b, name.size)) for b in batches])
            if count == 1:
                return state.prepared(values, 1, None)
            return state.prepared(name.size.to_bytes(4, "big") + values, count, FIXED_SIZE)
        if name.format == "records":
            return state.prepare([encode_record(b).data for b in batches])
        if name.format == "value":
            if count == 1:
                return state.prepared(batches[0].value(0), 1, None)
            body = b"".join([length_prefixed_values(b.values, b.value_offsets) for b in batches])
            return state.prepared(body, count, LENGTH_PREFIXED)
        envelopes: list[bytes] = [e for b in batches for e in encode_envelopes(b)]
        if count == 1:
            return state.prepared(envelopes[0], 1, None)
        return state.prepared(encode_length_prefixed(envelopes), count, LENGTH_PREFIXED)

    async def _deliver(self, request: web.Request, sub: _Sub,
                       delivery: Delivery) -> web.StreamResponse:  # fmt: skip
        response = web.StreamResponse(status=200)
        response[_ELEMENTS] = True
        response.content_length = len(delivery.body)
        response.headers[SEQUENCE_HEADER] = str(delivery.first)
        if delivery.encoding is not None:
            response.headers["Content-Encoding"] = delivery.encoding
        try:
            await response.prepare(request)
            await response.write(delivery.body)
            await response.write_eof()
        except ConnectionError as exc:  # kept as unsent: the next fetch gets it again
            log.info("rsio-http subscription %s: a response of %d element(s) was cut (%s); "
                     "it is resent on the next request", sub.id, delivery.count, exc)  # fmt: skip
            return response
        if sub.state.unsent is delivery:
            sub.state.sent(delivery)  # (else: a resend of the last one, counted already)
        return response

    # ------------------------------------------------------------------ requestMore, cancel

    async def _action(self, request: web.Request) -> web.StreamResponse:
        if (refused := _conditional(request)) is not None:
            return refused
        action = request.match_info["action"]
        sub = self.subs.get(request.match_info["sid"])
        if action != "cancel" and not action.startswith("requestMore="):
            return self._refuse(request, 404, f"unknown action {action[:40]!r} "
                                "(cancel or requestMore=<n>)", rsio=False)  # fmt: skip
        if sub is None:
            return _error(404, "no such subscription (cancelled, ended or never made)")
        _owned(request, sub)
        sub.last_seen = self.clock()
        if action == "cancel":
            self._drop(sub)
            return web.Response(status=200)
        try:
            n = parse_count(action.partition("=")[2], "requestMore")
        except BadRequest as exc:
            return self._refuse(request, 400, str(exc), rsio=False)
        if n == 0:  # Reactive Streams 3.9: onError, as over TCP
            self._drop(sub)
            return self._refuse(request, 400, "requestMore=0: demand must be at least 1 "
                                "(Reactive Streams 3.9)")  # fmt: skip
        if sub.state.state is State.OPEN:
            sub.state.request(n)
            sub.source.request(n)
            sub.touch()
        return web.Response(status=200)

    # ------------------------------------------------------------------ lifetime

    def _drop(self, sub: _Sub) -> None:
        if self.subs.get(sub.id) is sub:
            del self.subs[sub.id]
        if sub.state.state is not State.FAILED:
            sub.state.cancel()
        sub.source.cancel()
        if sub.pump is not None:
            sub.pump.cancel()
        sub.touch()

    def reap(self, now: float) -> int:
        """Cancel the subscriptions without a request for ``idle_seconds`` (and none under
        way); how many."""
        idle = [s for s in self.subs.values()
                if not s.fetching and now - s.last_seen > self.settings.idle_seconds]  # fmt: skip
        for sub in idle:
            log.info("rsio-http subscription %s (%s): idle for %.0f s, cancelled", sub.id,
                     sub.name, now - sub.last_seen)  # fmt: skip
            self._drop(sub)
        return len(idle)

    def _arm_reaper(self) -> None:
        every = max(0.5, min(30.0, self.settings.idle_seconds / 4))

        def tick() -> None:
            self.reap(self.clock())
            if not self._closing:
                self._reaper = asyncio.get_running_loop().call_later(every, tick)

        self._reaper = asyncio.get_running_loop().call_later(every, tick)

    def close(self) -> None:
        """Answer every waiting fetch (503 with ``X-Rsio-Error``: the subscriptions end with the
        hub) and stop the pumps."""
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
        for sub in list(self.subs.values()):
            sub.state.fail(503, "the hub is shutting down")
            sub.source.cancel()
            if sub.pump is not None:
                sub.pump.cancel()
            sub.touch()


def _owned(request: web.Request, sub: _Sub) -> None:
    """A subscription answers the principal that made it only (its URL alone is no right):
    another one is refused, and the subscription carries on for its owner."""
    asker = principal(request)
    if asker != sub.owner:
        raise Forbidden(f"{asker} may not use subscription {sub.id} (it belongs to {sub.owner})")


def _conditional(request: web.Request) -> web.Response | None:
    """The seed: RS.io requests never carry ``If-*`` headers; the server answers 412."""
    for header in _CONDITIONAL:
        if header in request.headers:
            return _error(412, f"{header}: RS.io requests are not conditional", rsio=False)
    return None


async def _strip_content_type(request: web.Request, response: web.StreamResponse) -> None:
    """Element responses carry no Content-Type (the seed), which aiohttp would add."""
    if response.get(_ELEMENTS):
        response.headers.popall("Content-Type", None)
