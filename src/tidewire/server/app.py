"""The hub's aiohttp application: the admin endpoints, RS.io over HTTP (``/rsio/...``,
:mod:`.rsio_http`) and Tube over WebSocket carrying RS.io (``/tube``, :mod:`.tube`), and the
HTTP listener that serves it behind the guard (:mod:`.guard`).

aiohttp is the library for HTTP and WebSocket, server and client, throughout tidewire.

* ``GET /healthz`` -> ``200 ok`` (text/plain), always open
* ``GET /streams`` -> JSON list of ``{name, events, first_id, latest_id, bytes, segments}`` of
  the streams the principal may read; the hub's own streams (``_tidewire.*``: transactions,
  Tolliver state) only with ``?internal=1``
* ``/static/...`` (the browser client, pages and ``vendor/`` libraries), ``/tail``, the
  dashboard ``/`` and the stream page ``/stream``: open
  (code, not data)
* ``GET /metrics`` (Prometheus) and ``GET /api/...`` (the admin API): :mod:`.admin`,
  docs/observability.md; with an ACL, for principals granted ``monitor``

Security and limits (docs/protocols/rsio-http.md, "Security and limits"), in three places:

* :func:`start_http_site` puts aiohttp's request handler behind a :class:`~.guard.Listener`
  (TLS, connections in total and per peer, the handshake deadline, idle, stalled output). Each
  connection's handler is watched by a :class:`_HttpConnection`, which gives every request's
  headers ``header_seconds`` from its first byte (slowloris): past that, the guard's sweep
  answers ``408`` and closes. Its handler is aiohttp's, except that a request the parser
  refuses is answered (and logged) with the reason only, never the line it quotes (a token in
  the URL).
* :func:`_guard_middleware`, first for every request: the headers are complete (their
  deadline ends); the principal is settled (``Authorization: Bearer <token>``, else the
  verified client certificate, ``cert:<CN>``, else anonymous; the open paths skip this); the
  body is read within ``body_seconds``, ``max_body_bytes`` and the principal's share of the
  hub's memory budget (charged before a byte is read), and dropped, except an admin write's
  (:func:`~.admin_streams.takes_body`: at most 64 KiB of JSON, kept for its route);
  ``max_refusals`` refused requests in a row close the connection.
  ``/static`` is served from memory: aiohttp's file responses ``sendfile`` to the socket,
  which the guard (no socket transport) cannot offer.
* :func:`_guard_middleware` first refuses (``403``) what a web page could make a browser send
  here against the user's will (:mod:`.browser`: ``Origin``, ``Sec-Fetch-Site``, ``Host``, and
  ``X-Tidewire-Request`` on admin writes); every answer carries :mod:`.browser`'s headers
  (``Server: tidewire``, the Content-Security-Policy, ...), set as it is prepared.
* the routes check the ACL per stream and raise :class:`~tidewire.model.AccessError`, which the
  middleware turns, once, into 401/403 with ``X-Rsio-Error: true`` (a 403 names no one) and
  a log line naming the principal. Refusals' log lines are rate-limited and peer strings in
  them escaped (:func:`~.rsio_http.escaped`).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from http import HTTPStatus
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from ..hub import Hub
from ..hub.access import ANONYMOUS, Access, Principal, certificate_principal
from ..hub.hub import RESERVED_PREFIX
from ..model import AccessError, Unauthenticated
from ..observe.logs import connection_log
from ..observe.throttle import LogThrottle, Refusals
from ..protocols.rsio_http import ERROR_HEADER
from .admin import add_admin_routes
from .admin_streams import ADMIN_BODY_BYTES, BODY_KEY, takes_body
from .browser import BrowserPolicy, add_security_headers, cross_site, security_headers
from .guard import Admission, GuardedConnection, Listener, peer_certificate
from .rsio_http import PRINCIPAL_KEY, HttpSettings, RsioHttp, escaped, principal
from .rsio_session import RsioSession, RsioSettings
from .tube import TubeSettings, add_tube_route

__all__ = [
    "ACCESS_KEY",
    "BROWSER_KEY",
    "HUB_KEY",
    "REFUSAL_LOG_KEY",
    "RSIO_HTTP_KEY",
    "TUBE_CONNECTIONS_KEY",
    "GuardedSite",
    "build_app",
    "http_listener",
    "parser_reason",
    "start_http_site",
]

log = logging.getLogger("tidewire.http")

WEB_DIR = Path(__file__).resolve().parent.parent / "web"  # the browser client and pages
HUB_KEY = web.AppKey("hub", Hub)
ACCESS_KEY = web.AppKey("access", Access)
HTTP_SETTINGS_KEY = web.AppKey("http_settings", HttpSettings)
BROWSER_KEY = web.AppKey("browser", BrowserPolicy)  # the host names the hub serves
RSIO_HTTP_KEY = web.AppKey("rsio_http", RsioHttp)
TUBE_CONNECTIONS_KEY = web.AppKey("tube_connections", set[RsioSession])
REFUSAL_LOG_KEY = web.AppKey("refusal_log", LogThrottle)  # a flood of refusals: a few lines
REALM = 'Bearer realm="tidewire"'


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _streams(request: web.Request) -> web.Response:
    hub = request.app[HUB_KEY]
    access = request.app[ACCESS_KEY]
    who = principal(request)
    internal = request.query.get("internal") in ("1", "true")
    return web.json_response([asdict(s) for s in hub.streams()
                              if (internal or not s.name.startswith(RESERVED_PREFIX))
                              and access.may(who, "read", s.name)])  # fmt: skip


def build_app(hub: Hub, rsio_http: HttpSettings | None = None, tube: TubeSettings | None = None,
              rsio: RsioSettings | None = None,
              access: Access | None = None,
              browser: BrowserPolicy | None = None) -> web.Application:  # fmt: skip
    """The app. ``access``: the tokens and ACL (``None``: no ACL, and no token is valid);
    ``browser``: the names it serves (``None``: those of a hub bound to no name)."""
    settings = rsio_http or HttpSettings()
    access = access if access is not None else Access()
    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[_guard_middleware])  # fmt: skip
    app[HUB_KEY] = hub
    app[ACCESS_KEY] = access
    app[BROWSER_KEY] = browser if browser is not None else BrowserPolicy.serving(None)
    app.on_response_prepare.append(add_security_headers)
    app[HTTP_SETTINGS_KEY] = settings
    app[REFUSAL_LOG_KEY] = LogThrottle()
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/streams", _streams)
    app[RSIO_HTTP_KEY] = subscriptions = RsioHttp(hub, settings, access=access)
    subscriptions.add_routes(app)
    connections: set[RsioSession] = set()
    app[TUBE_CONNECTIONS_KEY] = connections
    add_tube_route(app, hub, connections, tube, rsio, access=access)

    async def goodbye(app: web.Application) -> None:  # RS.io over Tube, as over TCP
        for protocol in list(connections):
            protocol.shutdown("server shutting down")

    app.on_shutdown.append(goodbye)
    files = _web_files()
    app.router.add_get("/static/{name:.+}", functools.partial(_static, files))
    app.router.add_get("/tail", _tail)
    add_admin_routes(app, hub, {name: body for name, (body, _) in files.items()})
    return app


def _web_files() -> dict[str, tuple[bytes, str]]:
    """The browser's files by path under ``web/`` with their content type: the pages and
    modules at its top, and the vendored libraries under ``web/vendor/`` (a few hundred KiB).
    This is the whitelist: nothing else is served, and no request path reaches the disk."""
    types = {".js": "text/javascript", ".html": "text/html", ".css": "text/css"}
    paths = [*WEB_DIR.iterdir(), *(WEB_DIR / "vendor").rglob("*")]
    return {path.relative_to(WEB_DIR).as_posix():
            (path.read_bytes(), types.get(path.suffix, "application/octet-stream"))
            for path in sorted(paths)
            if path.is_file() and not path.is_symlink()}  # fmt: skip


async def _static(files: dict[str, tuple[bytes, str]], request: web.Request) -> web.Response:
    """``/static/<name>``, from memory: aiohttp's static route would ``sendfile`` to the
    socket, past the guard (which is no socket transport, so asyncio refuses)."""
    found = files.get(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound()
    body, content_type = found
    charset = "utf-8" if content_type.startswith("text/") else None
    return web.Response(body=body, content_type=content_type, charset=charset)


async def _tail(request: web.Request) -> web.StreamResponse:
    """The live-tail page (``/static/tail.html``), keeping the query (``?stream=...``)."""
    query = request.rel_url.raw_query_string
    raise web.HTTPFound("/static/tail.html" + (f"?{query}" if query else ""))


# --------------------------------------------------------------------------- the middleware


def _open_path(path: str) -> bool:
    """Paths served to anyone, whatever their credentials: health, and the browser's code."""
    return path in ("/", "/healthz", "/tail", "/stream") or path.startswith("/static/")


class _BodyDropped(TimeoutError):
    """Set on a request body the hub will not read (any more). After the response, aiohttp
    reads what is left of an unread body ("lingering", up to 10 s) unless reading fails with a
    timeout, in which case it closes the connection at once, which is what a refusal wants."""


class _BodyTimeout(_BodyDropped):
    """The guard's sweep found a request body late (raised into the body's reader)."""


def _stop_reading(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """``response`` ends the connection; the rest of the request body is not read."""
    response.force_close()
    if request.body_exists and not request.content.is_eof():
        request.content.set_exception(_BodyDropped("the request body is not read"))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    watch = _watch_of(request)
    if watch is not None:
        watch.headers_done(request)
    try:
        response = await _guarded(request, handler, watch)
    except web.HTTPException as exc:  # (aiohttp's 404 and 405, raised as responses)
        _counted(request, exc, watch)
        raise
    return _counted(request, response, watch)


def _counted(request: web.Request, response: web.StreamResponse,
             watch: _HttpConnection | None) -> web.StreamResponse:  # fmt: skip
    """Count a refusal (4xx/5xx) on the connection; ``limits.max_refusals`` of them in a row,
    with no request answered well between, and this answer closes it (``Connection: close``):
    a peer that only sends what is refused gets a new TCP (and TLS) handshake every so often."""
    if watch is None:
        return response
    if response.status < 400:
        watch.refusals.succeed()
    elif watch.refusals.refuse() and response.keep_alive is not False:
        response.force_close()
        connection_log(log, request.transport, "http").warning(
            "closing after %d refused requests in a row", watch.refusals.in_a_row)
    return response


async def _guarded(request: web.Request, handler: Handler,
                   watch: _HttpConnection | None) -> web.StreamResponse:  # fmt: skip
    settings = request.app[HTTP_SETTINGS_KEY]
    who: Principal | None = None
    try:
        refused = cross_site(request, request.app[BROWSER_KEY], request.app[REFUSAL_LOG_KEY])
        if refused is not None:
            _stop_reading(request, refused)  # (its body, if any, is not read)
            return refused
        if not _open_path(request.path):
            request[PRINCIPAL_KEY] = who = _authenticate(request, request.app[ACCESS_KEY])
        if request.body_exists:
            refused = await _drop_body(request, settings, watch, who or ANONYMOUS)
            if refused is not None:
                return refused
        if watch is not None:
            watch.body_done()
        return await handler(request)
    except AccessError as exc:
        return _refuse_access(request, exc, who)


def _authenticate(request: web.Request, access: Access) -> Principal:
    """``Authorization: Bearer <token>``, else the client certificate, else anonymous."""
    headers = request.headers.getall("Authorization", [])
    if len(headers) > 1:
        raise Unauthenticated("more than one Authorization header")
    fallback = certificate_principal(peer_certificate(request.transport)) or ANONYMOUS
    return access.bearer(headers[0] if headers else None, fallback=fallback)


def _public_reason(exc: AccessError, who: Principal | None) -> str:
    """What the refused peer is told: a 401 says what was wrong with the credentials it sent;
    a refusal by the ACL names no principal (neither the asker nor another one, e.g. a
    subscription's owner): ``refused: may not read stream 'orders'``. The log says who."""
    message = str(exc)
    if isinstance(exc, Unauthenticated):
        return message
    if who is not None and message.startswith(f"{who.name} "):
        return "refused: " + message[len(who.name) + 1 :]
    return "refused: the ACL does not allow this request"


def _refuse_access(request: web.Request, exc: AccessError,
                   who: Principal | None) -> web.Response:  # fmt: skip
    """401 (no or bad credentials, RFC 6750) or 403 (the ACL), as RS.io's onError."""
    status, message = exc.status, _public_reason(exc, who)
    headers = {ERROR_HEADER: "true"}
    if isinstance(exc, Unauthenticated):
        headers["WWW-Authenticate"] = f'{REALM}, error="invalid_token"'
    elif who is not None and who.anonymous:  # credentials would help: ask for them
        status = 401
        headers["WWW-Authenticate"] = REALM
    request.app[REFUSAL_LOG_KEY].log(
        connection_log(log, request.transport, "http"), logging.WARNING,
        "%s %s: %d, refused %s: %s", request.method, escaped(request.rel_url.raw_path), status,
        escaped(who.name) if who is not None else "the credentials", escaped(str(exc)))  # fmt: skip
    response = web.Response(status=status, text=message + "\n", headers=headers)
    if request.body_exists:
        _stop_reading(request, response)  # (rather than read a body nobody will look at)
    return response


def _too_large(request: web.Request, limit: int) -> web.Response:
    message = f"the request body is over {limit} bytes (http.max_body_bytes)"
    request.app[REFUSAL_LOG_KEY].log(
        connection_log(log, request.transport, "http"), logging.WARNING,
        "%s %s: 413 %s", request.method, escaped(request.rel_url.raw_path), message)
    response = web.Response(status=413, text=message + "\n", headers={ERROR_HEADER: "true"})
    _stop_reading(request, response)
    return response


def _no_room(request: web.Request, nbytes: int) -> web.Response:
    message = "the hub's memory budget has no room for this request body now (memory.*)"
    request.app[REFUSAL_LOG_KEY].log(
        connection_log(log, request.transport, "http"), logging.WARNING,
        "%s %s: 503 %s (%d bytes)", request.method, escaped(request.rel_url.raw_path), message,
        nbytes)  # fmt: skip
    response = web.Response(status=503, text=message + "\n",
                            headers={ERROR_HEADER: "true", "Retry-After": "1"})  # fmt: skip
    _stop_reading(request, response)
    return response


async def _drop_body(request: web.Request, settings: HttpSettings, watch: _HttpConnection | None,
                     who: Principal) -> web.Response | None:  # fmt: skip
    """Read and drop the request's body within ``max_body_bytes``, ``body_seconds`` and the
    hub's memory budget; or the refusal (413, 408, 503). An admin write's body (the only
    route that takes one, :func:`~.admin_streams.takes_body`) is kept as ``request[BODY_KEY]``,
    within ``ADMIN_BODY_BYTES``.

    The body is charged to its principal's share (gauge ``body``) before a byte of it is
    read: a declared ``Content-Length`` whole, a chunked body as its bytes come.
    """
    keep = takes_body(request.method, request.path)
    kept = bytearray()
    limit = min(settings.max_body_bytes, ADMIN_BODY_BYTES) if keep else settings.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        return _too_large(request, limit)
    share = request.app[HUB_KEY].budget.share(who.name, f"http body {request.remote}")
    try:
        if length is not None and not share.try_hold("body", length):
            return _no_room(request, length)
        if watch is not None:
            watch.body_expected(settings.body_seconds)
        total = 0
        while chunk := await request.content.readany():
            total += len(chunk)
            if total > limit:  # (a chunked body: no length to refuse it early)
                return _too_large(request, limit)
            if length is None and not share.try_hold("body", total):
                return _no_room(request, total)
            if keep:
                kept += chunk
    except _BodyTimeout as exc:  # (the guard has logged it)
        response = web.Response(status=408, text=f"{exc}\n", headers={ERROR_HEADER: "true"})
        _stop_reading(request, response)
        return response
    finally:
        share.close()
    if keep:
        request[BODY_KEY] = bytes(kept)
    return None


# --------------------------------------------------------------------------- the listener


class _Phase(enum.Enum):
    IDLE = "idle"  # between requests: no byte of the next one yet
    HEADERS = "headers"  # a request's first bytes came, not all of its headers (deadline)
    BODY = "body"  # its headers came, its body is being read (deadline)
    HANDLING = "handling"  # handled, answered, or a WebSocket (no deadline)


class _HttpConnection(asyncio.Protocol):
    """The guard's inner protocol for one HTTP connection: aiohttp's request handler, with the
    deadlines of each request's headers and body kept on the guard.

    Between requests (``IDLE``), the first byte that arrives starts the next request's header
    deadline. The middleware ends it (:meth:`headers_done`); when the request's task is over
    (its response written), the connection is idle again, or, if bytes came meanwhile (a
    pipelined request), the next request's deadline starts at once.
    """

    def __init__(self, handler: asyncio.Protocol, header_seconds: float,
                 max_refusals: int = 100) -> None:  # fmt: skip
        self.handler = handler
        self.header_seconds = header_seconds
        self.refusals = Refusals(max_refusals)  # requests refused in a row (the middleware)
        self.guard: GuardedConnection | None = None
        self.phase = _Phase.IDLE
        self.early = False  # bytes came while a request was handled
        self.requests = 0
        self.request: web.BaseRequest | None = None  # the one whose body is being read

    # the loop's side (through the guard)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, GuardedConnection):
            self.guard = transport
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.phase is _Phase.IDLE:
            self._expect_headers()
        elif self.phase is _Phase.HANDLING:
            self.early = True
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.request = None
        self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    # the request's side (from the middleware)

    def _expect_headers(self) -> None:
        self.phase = _Phase.HEADERS
        guard = self.guard
        if guard is None:
            return
        seconds = self.header_seconds
        # The first request also keeps the guard's handshake deadline, if that one is sooner.
        if guard.deadline is None or guard.deadline > asyncio.get_running_loop().time() + seconds:
            guard.expect(seconds, f"request headers not complete within {seconds:g}s")
        else:
            handshake = guard.listener.limits.handshake_seconds
            guard.deadline_reason = (f"request headers not complete within {handshake:g}s of "
                                     "the connection")  # fmt: skip

    def headers_done(self, request: web.BaseRequest) -> None:
        self.requests += 1
        self.phase = _Phase.HANDLING
        self.early = False
        if self.guard is not None:
            self.guard.established()
        task = asyncio.current_task()  # aiohttp's task for this request, response included
        if task is not None:
            task.add_done_callback(functools.partial(self._request_over, self.requests))
        self.request = request

    def body_expected(self, seconds: float) -> None:
        self.phase = _Phase.BODY
        if self.guard is not None:
            self.guard.expect(seconds, f"request body not complete within {seconds:g}s")

    def body_done(self) -> None:
        if self.phase is _Phase.BODY and self.guard is not None:
            self.guard.established()  # (ends the body's deadline)
        self.phase = _Phase.HANDLING
        self.request = None

    def _request_over(self, number: int, task: object) -> None:
        if number != self.requests:  # a later request has started already
            return
        self.request = None
        self.phase = _Phase.IDLE
        if self.early:
            self.early = False
            self._expect_headers()

    def expire(self, conn: GuardedConnection, reason: str) -> None:
        """The guard's sweep found this connection past a deadline (or idle)."""
        if self.phase is _Phase.HEADERS:  # nothing was sent for this request: say why
            conn.write(_raw_response(408, reason))
            conn.close()
        elif self.phase is _Phase.BODY and self.request is not None:
            self.request.content.set_exception(_BodyTimeout(reason))  # the middleware: 408
        else:
            conn.close()


def _watch_of(request: web.BaseRequest) -> _HttpConnection | None:
    guard = request.transport.get_extra_info("guard") if request.transport else None
    inner = guard.inner if isinstance(guard, GuardedConnection) else None
    return inner if isinstance(inner, _HttpConnection) else None


def _raw_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response, for the guard to write before closing (no request
    handler is involved): the connection limits' 503 and the request headers' 408."""
    body = (message.replace("\r", " ").replace("\n", " ") + "\n").encode("utf-8", "replace")
    phrase = HTTPStatus(status).phrase
    return (f"HTTP/1.1 {status} {phrase}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"{ERROR_HEADER}: true\r\n"
            "Connection: close\r\n"
            "\r\n").encode("ascii") + body  # fmt: skip


class _QuietErrors(RequestHandler):
    """aiohttp's request handler, except that its answer to a request its parser refused
    does not quote the offending line (a token put in the URL, or in a malformed header), in
    the 400 nor in its log line: the reason only (``Invalid char in url query``)."""

    __slots__ = ()

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:  # fmt: skip
        if isinstance(exc, HttpProcessingError):
            reason = parser_reason(str(exc.message))
            exc.message = reason
            exc.args = (reason,)
            message = reason
        response = super().handle_error(request, status, exc, message)
        response.headers.update(security_headers("", secure=request.secure))  # (no hook here)
        return response


def parser_reason(message: str) -> str:
    """The reason of an HTTP parser error without the request bytes it quotes: llhttp's
    ``Invalid header value char:\n\n  b'Authorization: Bearer ...'`` and aiohttp's
    ``Got more than 8190 bytes when reading: b'...'`` (or ``...bytearray(b'...')``) keep
    what is before the quote."""
    reason = message.strip()
    for quote in ("\n", "b'", 'b"', "bytearray(", "'", '"'):  # where quoted bytes begin
        reason = reason.split(quote, 1)[0]
    return reason.rstrip(" :.")[:200] or "a malformed request"


def _refuse_connection(reason: str) -> bytes:
    return _raw_response(503, reason)


def _expire(conn: GuardedConnection, reason: str) -> None:
    if isinstance(conn.inner, _HttpConnection):
        conn.inner.expire(conn, reason)
    else:  # pragma: no cover - every inner protocol here is one
        conn.close()


class GuardedSite(web.BaseSite):
    """An aiohttp site on a guard :class:`~.guard.Listener` (``listener``): ``runner.cleanup()``
    stops it like any other site."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, admission: Admission,
                 tls: ssl.SSLContext | None, settings: HttpSettings) -> None:  # fmt: skip
        super().__init__(runner, ssl_context=tls)
        self.host = host
        self.requested_port = port
        self.settings = settings
        self.listener = Listener("http", self._connection, admission, tls=tls,
                                 refuse=_refuse_connection, expire=_expire)  # fmt: skip
        app = getattr(runner, "app", None)
        if isinstance(app, web.Application) and HUB_KEY in app:
            app[HUB_KEY].metrics.listeners.append(self.listener)

    @property
    def name(self) -> str:
        scheme = "https" if self.listener.tls is not None else "http"
        port = self.listener.port if self.listener.server is not None else self.requested_port
        return f"{scheme}://{self.host}:{port}"

    def _connection(self) -> _HttpConnection:
        server = self._runner.server
        assert server is not None
        handler = server()
        # web.Server makes the handlers (with the runner's settings) and takes no class of
        # ours: the one it made becomes the subclass that adds nothing but the method.
        handler.__class__ = _QuietErrors
        return _HttpConnection(handler, self.settings.header_seconds, self.settings.max_refusals)

    async def start(self) -> None:
        await super().start()
        server = await self.listener.start(self.host, self.requested_port, reuse_address=True,
                                           backlog=self._backlog)  # fmt: skip
        self._server = server

    async def stop(self) -> None:
        # (Not listener.wait_closed(): from Python 3.12 it waits for every connection, which
        # the runner closes only after the sites are stopped.)
        self.listener.close()
        await super().stop()


async def start_http_site(runner: web.BaseRunner, host: str, port: int, *, admission: Admission,
                          tls: ssl.SSLContext | None, settings: HttpSettings) -> int:  # fmt: skip
    """Serve ``runner``'s app on ``host:port`` behind the guard; the port it listens on."""
    site = GuardedSite(runner, host, port, admission=admission, tls=tls, settings=settings)
    await site.start()
    return site.listener.port


def http_listener(runner: web.BaseRunner) -> Listener:
    """The guard of ``runner``'s :class:`GuardedSite` (tests sweep it with a fake clock)."""
    for site in runner.sites:
        if isinstance(site, GuardedSite):
            return site.listener
    raise LookupError("no guarded HTTP site on this runner")
