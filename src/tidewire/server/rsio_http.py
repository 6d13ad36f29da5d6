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

Per subscription a pump task moves the hub subscription's batches into a buffer; a fetch takes
what is there, within demand, as one response. Once the demand is delivered, the pump reads
the client's next request ahead (:mod:`.rsio_http_sub`), so that a fetch finds it read. The
response is written with a known ``Content-Length``; only once it is written in full does it
count, otherwise the next fetch gets it again (the seed's resend rule).

Bounded under hostile load (issue 20): HTTP has no long-lived connection, so each subscription
has its own :class:`~tidewire.hub.Share` of the hub's memory budget under its owner's name. Its
gauges are ``readahead`` (read from the log, not yet in a response: the pump's buffer and the
hub subscription's carry) and ``outbound`` (the unsent and the last delivery, kept for a
resend). The pump reads one delivery (half of ``max_response_bytes``) ahead and no more until a
fetch takes it, so a subscription nobody fetches holds at most about one response's worth; and
it reads nothing while its share refuses (the principal's or the hub's budget is spent): its
fetches then wait, as for an empty stream. A principal may hold at most
``max_subscriptions_per_principal`` of the hub's ``max_subscriptions`` (429 past it).
Subscription ids are 128 random bits (``secrets``); a refusal never echoes a query's text (a
token put in a URL) and never names a principal; peer strings are logged escaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from ..hub import Hub, RecordSubscription, Subscription
from ..hub.access import ANONYMOUS, Access, Principal
from ..model import Batch, Forbidden, RemoteProtocolError, TidewireError
from ..observe.logs import connection_log
from ..observe.throttle import LogThrottle
from ..protocols.rsio.names import FromTime, PublisherName, PublisherNameError
from ..protocols.rsio_http import (
    ERROR_HEADER,
    SEQUENCE_HEADER,
    BadRequest,
    Delivery,
    ServerSubscription,
    State,
    parse_count,
    split_query,
)
from ..record import encode as encode_record
from .rsio_http_sub import HttpSubscription, response_body

__all__ = ["PRINCIPAL_KEY", "HttpSettings", "RsioHttp", "escaped", "principal", "publisher_name"]

log = logging.getLogger("tidewire.rsio_http")

PAUSED_RETRY_SECONDS = 1.0  # a pump its share refused tries again this often (or at a fetch)
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
    max_subscriptions_per_principal: int = 1_000  # of one principal (anonymous is one), at once
    max_response_bytes: int = 4 * 1024 * 1024  # one response's elements (one element may be more)
    # the HTTP listener's own bounds (docs/protocols/rsio-http.md, "Security and limits")
    header_seconds: float = 10.0  # a request's headers, from its first byte
    body_seconds: float = 60.0  # a request's body, from the end of its headers
    max_body_bytes: int = 16 * 1024 * 1024  # a request's body (read and dropped: RS.io has none)
    max_refusals: int = 100  # refused requests in a row that close a connection (limits.*)


def escaped(text: str, limit: int = 200) -> str:
    """``text`` (at most ``limit`` characters) fit for a log line: every character that is not
    printable (newlines, ANSI escapes, bidi controls) written as a Python escape, so that a
    peer's string can never forge or hide a line."""
    cut = text[:limit]
    if cut.isprintable():
        return cut + ("..." if len(text) > limit else "")
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return out + ("..." if len(text) > limit else "")


_ARGUMENTS = {  # the publisher's arguments, and what a refused value of each is told
    "from": "from= is not an id (0 to 2^63-1), earliest or latest",
    "from-time": "from-time= is not a time in ms (0 to 2^63-1)",
    "until": "until= is not an id (0 to 2^63-1)",
    "key": "key= has a '%' not followed by two hex digits (write %25)",
    "format": "format must be envelope, value or records",
    "size": "size must be a number of bytes >= 1",
}
_SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,15}")  # short enough to be no secret


def publisher_name(stream: str, query: str) -> PublisherName:
    """The publisher of ``PUT /rsio/pub/<stream>?<query>`` (both still percent-encoded,
    ``request`` already taken out), or :class:`BadRequest`.

    A refusal about the stream quotes it (the path is the publisher's name); a refusal about
    the query never quotes a value, nor an argument's name unless it is a short identifier:
    a client that put its token in the URL must not find it echoed in the answer or the log.
    """
    try:
        name = PublisherName.parse(stream)
    except PublisherNameError as exc:
        raise BadRequest(str(exc)) from None
    if not query:
        return name
    try:
        return PublisherName.parse(stream + "?" + query)
    except PublisherNameError:
        pass
    seen: set[str] = set()
    for param in query.split("&"):  # which one: by its name only
        arg = param.partition("=")[0]
        if arg not in _ARGUMENTS:
            shown = repr(arg) if _SAFE_NAME.fullmatch(arg) else "(not echoed)"
            raise BadRequest(f"unknown parameter {shown}: a publisher takes "
                             f"{', '.join(a + '=' for a in _ARGUMENTS)}")  # fmt: skip
        if arg in seen:
            raise BadRequest(f"the parameter {arg}= is repeated")
        seen.add(arg)
        try:
            PublisherName.parse(stream + "?" + param)
        except PublisherNameError:
            raise BadRequest(_ARGUMENTS[arg]) from None
    if {"from", "from-time"} <= seen:  # (the two pairs the grammar refuses)
        raise BadRequest("from= and from-time= exclude each other")
    raise BadRequest("size=N needs format=value")


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


class RsioHttp:
    """The RS.io-over-HTTP subscriptions of one hub, and their routes."""

    def __init__(self, hub: Hub, settings: HttpSettings | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 access: Access | None = None) -> None:  # fmt: skip
        self.hub = hub
        self.settings = settings or HttpSettings()
        self.access = access if access is not None else Access()
        self.clock = clock
        self.subs: dict[str, HttpSubscription] = {}
        self.by_principal: dict[str, int] = {}  # subscriptions per owner's name, at once
        self.refusal_log = LogThrottle(clock=clock)  # a flood of refusals: a few lines, a count
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
        try:
            query, demand = split_query(request.rel_url.raw_query_string)
            name = publisher_name(request.rel_url.raw_path[len(PUB_PREFIX) :], query)
        except BadRequest as exc:
            return self._refuse(request, 400, str(exc))
        owner = principal(request)
        self.access.check(owner, "read", name.stream)  # Forbidden: the middleware answers
        if (full := self._full(owner)) is not None:
            return self._refuse(request, *full, headers={"Retry-After": "1"})
        batch = max(1, self.settings.max_response_bytes // 2)  # one delivery read ahead
        try:
            start = name.start  # from-time=: resolved once, here (docs/protocols/rsio.md)
            if isinstance(start, FromTime):
                start = await self.hub.time_start(name.stream, start.ms)
            hub_sub = self.hub.subscribe(name.stream, start, until_id=name.until,
                                         key=name.key, max_batch_bytes=batch, via="rsio-http")
        except (TidewireError, ValueError) as exc:
            return self._refuse(request, 400, str(exc))
        hub_sub.readahead_bytes = batch  # (a read past one delivery waits in its carry)
        source: Subscription | RecordSubscription = hub_sub
        if name.format == "records":
            source = RecordSubscription(hub_sub)
        sid = secrets.token_urlsafe(16)  # 128 random bits: never guessed, never reused
        while sid in self.subs:  # pragma: no cover - 2**-128
            sid = secrets.token_urlsafe(16)
        share = self.hub.budget.share(owner.name, f"rsio-http {request.remote}")
        sub = HttpSubscription(sid, name, source, self.clock(), owner, share)
        self.subs[sid] = sub
        self.by_principal[owner.name] = self.by_principal.get(owner.name, 0) + 1
        if demand:
            sub.ask(demand)
        sub.pump = asyncio.create_task(self._pump(sub))
        location = request.url.with_path(SUB_PREFIX + sid).with_query(None)
        return web.Response(status=201, headers={"Location": str(location)})

    def _full(self, owner: Principal) -> tuple[int, str] | None:
        """Why no subscription more may be made for ``owner`` now (status, reason), if so."""
        settings = self.settings
        if self._closing:
            return 503, "the hub is shutting down"
        if len(self.subs) >= settings.max_subscriptions:
            return 503, ("too many subscriptions on this hub (the limit is "
                         f"{settings.max_subscriptions})")  # fmt: skip
        if self.by_principal.get(owner.name, 0) >= settings.max_subscriptions_per_principal:
            return 429, ("too many subscriptions of this principal (the limit is "
                         f"{settings.max_subscriptions_per_principal})")  # fmt: skip
        return None

    def _refuse(self, request: web.Request, status: int, message: str, *, rsio: bool = True,
                headers: dict[str, str] | None = None) -> web.Response:  # fmt: skip
        path = request.rel_url.raw_path
        if path.startswith(SUB_PREFIX):  # (an action's argument is no more logged than a query)
            path = path.partition("=")[0]
        self.refusal_log.log(connection_log(log, request.transport, "http"), logging.WARNING,
                             "rsio-http %s %s: %d %s", request.method, escaped(path), status,
                             escaped(message))  # fmt: skip
        return _error(status, message, rsio=rsio, headers=headers)

    # ------------------------------------------------------------------ the pump

    async def _pump(self, sub: HttpSubscription) -> None:
        """Move the hub subscription's deliveries into ``sub.ready``: one at a time, the next
        once a fetch has taken all of it, and each read only once the subscription's share
        has granted its bytes (a read is never made unreserved)."""
        source, hub_sub = sub.source, sub.hub_sub
        try:
            while True:
                sub.drained.clear()
                if sub.ready and not sub.topup:
                    await sub.drained.wait()  # a fetch took it (or wants it topped up)
                    continue
                if not hub_sub.done and source.demand <= 0 and (
                        sub.ready or not sub.read_ahead()):  # (else: read the next one ahead)
                    await sub.drained.wait()  # demand came (a carry, if any, waits for it too)
                    continue
                if not (source.held_bytes or hub_sub.done or hub_sub.poll_ready()):
                    await self.hub.wait_for(hub_sub.stream, hub_sub.next_id - 1)
                    continue  # (a live tail holds nothing while it waits)
                if not (source.held_bytes or hub_sub.done or sub.share.try_hold(
                        "readahead", hub_sub.readahead_bytes)):  # fmt: skip
                    sub.paused = True  # until a fetch, or a second passes: then again
                    sub.topup = False
                    sub.touch()  # (a fetch waiting for a top-up sends what it has)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(sub.drained.wait(), PAUSED_RETRY_SECONDS)
                    continue
                sub.paused = False
                sub.topup = False
                guessed = sub.ahead > 0
                batches = await source.next()  # (at once: events, demand or a carry are there)
                if batches is None:
                    if source.complete:
                        sub.state.complete()
                    break
                fresh = not sub.ready
                if fresh:
                    sub.guessed = guessed
                sub.ready.extend(batches)
                sub.ready_bytes += sum(b.nbytes for b in batches)
                if fresh and guessed:  # the client's next response, most likely: encoded now
                    sub.prebuild(self.settings.max_response_bytes)
                sub.account()
                sub.touch()
        except asyncio.CancelledError:
            raise
        except TidewireError as exc:
            log.warning("rsio-http subscription %s (%s): %s", sub.id, escaped(str(sub.name)),
                        exc)  # fmt: skip
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
                raise BadRequest("a fetch takes no query argument but request= (the others "
                                 "are not echoed)")
            seen = request.headers.get(SEQUENCE_HEADER)
            expects = None if seen is None else parse_count(seen, SEQUENCE_HEADER)
        except BadRequest as exc:  # the subscription carries on
            return self._refuse(request, 400, str(exc), rsio=False)
        sub.last_seen = self.clock()
        state = sub.state
        if demand and state.state is State.OPEN:  # (first: a resend below spends none of it)
            sub.ask(demand)
        sub.drained.set()  # the pump may wait for demand, or for its share: try now
        if expects is not None and sub.state.unsent is None:
            try:
                again = sub.state.received_up_to(expects)
            except RemoteProtocolError as exc:
                return self._refuse(request, 400, str(exc), rsio=False)
            if again is not None:  # written in full, and lost all the same: once more
                return await self._deliver(request, sub, again)
            sub.account()  # (the last delivery arrived: no longer kept)
        sub.fetching += 1
        try:
            return await self._answer(request, sub)
        finally:
            sub.fetching -= 1
            sub.last_seen = self.clock()

    async def _answer(self, request: web.Request, sub: HttpSubscription) -> web.StreamResponse:
        state = sub.state
        sub.polls += 1
        mine = sub.polls
        sub.touch()  # an older fetch still waiting answers 204 at once
        deadline = self.clock() + self.settings.poll_seconds
        topped = False
        while True:
            if sub.polls != mine:  # a newer fetch took over (it gets what there is)
                return web.Response(status=204)
            if state.state is State.FAILED:  # (before anything ready: nothing is skipped)
                assert state.error is not None
                self._drop(sub)
                return _error(*state.error)
            if state.unsent is not None:
                return await self._deliver(request, sub, state.unsent)
            if not topped and state.room > 0 and sub.short(self.settings.max_response_bytes):
                topped = True  # (once: then it sends what there is)
                sub.topup = True  # the pump reads once more (read_ahead guessed too few)
                sub.drained.set()
                sub.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sub.changed.wait(), max(0.0, deadline - self.clock()))
                continue
            if sub.ready and state.room > 0:
                try:
                    delivery = self._take(sub)
                except TidewireError as exc:  # e.g. a value that is not size=N bytes
                    log.warning("rsio-http subscription %s (%s): %s", sub.id,
                                escaped(str(sub.name)), exc)  # fmt: skip
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

    def _take(self, sub: HttpSubscription) -> Delivery:
        """A new delivery from ``sub.ready``: at most the demand left and about
        ``max_response_bytes`` (at least one element)."""
        state, name = sub.state, sub.name
        room, budget = state.room, self.settings.max_response_bytes
        pre, sub.prebuilt = sub.prebuilt, None
        if pre is not None and pre.count <= room and len(pre.batches) == len(sub.ready) and (
                all(a is b for a, b in zip(pre.batches, sub.ready, strict=True))):  # fmt: skip
            sub.ready.clear()  # (what the loop below would take: all of it, encoded already)
            sub.ready_bytes = 0
            sub.drained.set()
            delivery = state.prepared(pre.body, pre.count, pre.encoding)
            sub.account()
            return delivery
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
        delivery = self._encode(state, name, taken, count)
        sub.account()
        return delivery

    @staticmethod
    def _encode(state: ServerSubscription, name: PublisherName, batches: list[Batch],
                count: int) -> Delivery:  # fmt: skip
        if name.format == "records":
            return state.prepare([encode_record(b).data for b in batches])
        body, encoding = response_body(name, batches, count)
        return state.prepared(body, count, encoding)

    async def _deliver(self, request: web.Request, sub: HttpSubscription,
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
            sub.account()
        return response

    # ------------------------------------------------------------------ requestMore, cancel

    async def _action(self, request: web.Request) -> web.StreamResponse:
        if (refused := _conditional(request)) is not None:
            return refused
        action = request.match_info["action"]
        sub = self.subs.get(request.match_info["sid"])
        if action != "cancel" and not action.startswith("requestMore="):
            return self._refuse(request, 404, "unknown action (cancel or requestMore=<n>)",
                                rsio=False)  # fmt: skip
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
            sub.ask(n)
            sub.drained.set()
            sub.touch()
        return web.Response(status=200)

    # ------------------------------------------------------------------ lifetime

    def _drop(self, sub: HttpSubscription) -> None:
        if self.subs.get(sub.id) is sub:
            del self.subs[sub.id]
            left = self.by_principal.get(sub.owner.name, 0) - 1
            if left > 0:
                self.by_principal[sub.owner.name] = left
            else:
                self.by_principal.pop(sub.owner.name, None)
        sub.share.close()
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
                     escaped(str(sub.name)), now - sub.last_seen)  # fmt: skip
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
            sub.share.close()
            if sub.pump is not None:
                sub.pump.cancel()
            sub.touch()


def _owned(request: web.Request, sub: HttpSubscription) -> None:
    """A subscription answers the principal that made it only (its URL alone is no right):
    another one is refused, and the subscription carries on for its owner."""
    asker = principal(request)
    if asker != sub.owner:  # (the owner is named in the log only, never to the asker)
        connection_log(log, request.transport, "http").info(
            "rsio-http subscription %s of %s: refused %s", sub.id, escaped(sub.owner.name),
            escaped(asker.name))  # fmt: skip
        raise Forbidden(f"{asker} may not use this subscription (another principal made it)")


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
