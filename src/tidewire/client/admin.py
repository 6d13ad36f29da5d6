"""An asyncio client for the hub's admin API (``/api/*`` on the HTTP listener; every path and
field is in docs/observability.md)::

    async with AdminClient("http://127.0.0.1:7480", token=...) as admin:
        overview = await admin.overview()
        print(overview["version"], overview["events_in_rate"])

aiohttp is the library (its client session, one per :class:`AdminClient`). Each method returns
the response's parsed JSON, typed with the TypedDicts below (as the hub sends it: nothing is
converted). A refusal (``401``: no or bad credentials, ``403``: not granted ``monitor``, or
``admin`` for a write, in the ACL), any other answer than the request's success, a hub that
cannot be reached or that does not answer in time raise :class:`AdminError`, with the HTTP
status (0 when there was no answer) and the hub's message (``tls`` when the TLS handshake
failed). ``token=`` is sent as ``Authorization: Bearer <token>``; ``ssl=`` is the TLS context
for ``https://`` (e.g. with a client certificate, ``tidewire.server.guard.client_context``).

The admin writes (issue 23; docs/observability.md, "Stream administration"), each allowed only
to a principal the hub's ACL grants ``admin`` on the stream (a hub without an ACL file refuses
them to everyone, ``403``)::

    async with AdminClient(url, token=ops_token) as admin:
        await admin.create_stream("orders", retention_ms=7 * 86_400_000, retention_bytes=None)
        await admin.set_retention("orders", retention_bytes=2**30)   # keeps retention_ms
        await admin.delete_stream("orders")

A retention argument that is not given is not sent (:data:`NOT_GIVEN`); ``None`` is sent as
``null``: no bound. A key not sent keeps the value that applies now (creating: the
configuration's); with either key sent, the stream's retention is its own (runtime), kept
over the configuration across restarts. The
writes carry the headers the hub's cross-site rules require of a script
(``X-Tidewire-Request: 1``, ``Content-Type: application/json``).
"""

from __future__ import annotations

import enum
import json
import ssl as _ssl
from http import HTTPStatus
from typing import Any, Final, Literal, TypedDict, cast
from urllib.parse import quote

import aiohttp

from ..model import TidewireError

__all__ = [
    "NOT_GIVEN",
    "AdminClient",
    "AdminError",
    "Connection",
    "Deleted",
    "NotGiven",
    "Overview",
    "Retention",
    "RetentionArg",
    "Stats",
    "Stream",
    "StreamRetention",
    "Subscription",
    "Tolliver",
    "TolliverPeer",
    "Traffic",
]


class AdminError(TidewireError):
    """The admin API refused or failed a request: ``status`` is the HTTP status (0: no answer,
    e.g. nothing listens at the URL) and ``message`` the hub's reason (its body)."""

    def __init__(self, status: int, message: str, url: str, *, tls: bool = False) -> None:
        super().__init__(f"{status} {_reason(status)}: {message}" if status else message)
        self.status = status
        self.message = message
        self.url = url
        self.tls = tls  # the TLS handshake failed (e.g. the hub's certificate is not trusted)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


class Traffic(TypedDict):
    """What this process counted for a stream over one protocol since it started."""

    events_in: int
    bytes_in: int
    events_out: int
    bytes_out: int


class Rates(Traffic):
    """Totals since the hub started, and per second over the last samples."""

    events_in_rate: float
    bytes_in_rate: float
    events_out_rate: float
    bytes_out_rate: float


class Overview(Rates):
    """``GET /api/overview``: the hub. ``connections`` (by listener protocol) and
    ``subscriptions`` (by protocol) hold every protocol as a key."""

    version: str
    started_at: int  # ms since the epoch
    uptime_seconds: float
    data_dir: str
    streams: int
    connections: dict[str, int]
    subscriptions: dict[str, int]


class NotGiven(enum.Enum):
    """The type of :data:`NOT_GIVEN`, the default of a retention argument: distinct from
    ``None`` (no bound), which is sent; a ``NOT_GIVEN`` argument is not."""

    NOT_GIVEN = "NOT_GIVEN"

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Final = NotGiven.NOT_GIVEN
"""A retention argument not given, so not sent: changing, the value that applies now is kept;
creating, see :meth:`AdminClient.create_stream`."""

RetentionArg = int | None | NotGiven


class Retention(TypedDict):
    """The retention that applies to a stream (``None``: no bound) and where it comes from:
    ``runtime`` (set through the admin API, kept over the configuration file across restarts),
    ``config`` (the stream's ``[log.streams."<name>"]`` table) or ``default`` (``[log]``'s)."""

    ms: int | None
    bytes: int | None
    source: Literal["runtime", "config", "default"]


class StreamRetention(TypedDict):
    """The answer to :meth:`AdminClient.create_stream` and :meth:`AdminClient.set_retention`:
    the stream and the retention that now applies (``None`` on a gateway of a cluster, where
    JetStream applies its own limits)."""

    name: str
    retention: Retention | None


class Deleted(TypedDict):
    """The answer to :meth:`AdminClient.delete_stream`."""

    deleted: str


class Stream(Rates):
    """One element of ``GET /api/streams``: the log's figures (``first_id``/``latest_id`` are
    None for an empty stream), then this process's traffic, in total and by protocol, and the
    retention that applies (``None`` on a gateway of a cluster)."""

    name: str
    events: int
    first_id: int | None
    latest_id: int | None
    bytes: int
    segments: int
    protocols: dict[str, Traffic]
    retention: Retention | None


class Connection(TypedDict):
    """One element of ``GET /api/connections``. ``principal`` is None until authenticated."""

    id: int
    protocol: str
    peer: str
    principal: str | None
    opened_at: int
    bytes_in: int
    bytes_out: int
    tls: bool


class Subscription(TypedDict):
    """One element of ``GET /api/subscriptions``. ``connection`` is None for RS.io over HTTP;
    ``lag``: committed events not yet handed to the subscriber."""

    id: int
    protocol: str
    stream: str
    connection: int | None
    next_id: int
    latest_id: int
    delivered: int
    demand: int
    unbounded: bool
    lag: int


class TolliverPeer(TypedDict):
    uuid: str
    address: str | None
    connected: bool
    channels: list[str]
    unacked: int
    resends: int


class Tolliver(TypedDict):
    """``GET /api/tolliver``: the hub's Tolliver instance and its peers."""

    instance: str | None
    peers: list[TolliverPeer]


class Stats(TypedDict):
    """``GET /api/stats``: every other answer in one object."""

    overview: Overview
    streams: list[Stream]
    connections: list[Connection]
    subscriptions: list[Subscription]
    tolliver: Tolliver


class AdminClient:
    """The admin API of the hub at ``base_url`` (``http://host:port`` or ``https://...``).
    Use it as an async context manager (it owns an aiohttp session)."""

    def __init__(self, base_url: str, token: str | None = None,
                 ssl: _ssl.SSLContext | None = None, *, timeout: float = 10.0) -> None:  # fmt: skip
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"not an http:// or https:// URL: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._ssl: _ssl.SSLContext | bool = ssl if ssl is not None else True  # True: verify
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AdminClient:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def overview(self) -> Overview:
        return cast(Overview, await self._get("/api/overview", dict))

    async def streams(self, internal: bool = False) -> list[Stream]:
        """The streams (sorted by name); the hub's own (``_tidewire.*``) with ``internal``."""
        path = "/api/streams?internal=1" if internal else "/api/streams"
        return cast(list[Stream], await self._get(path, list))

    async def connections(self) -> list[Connection]:
        return cast(list[Connection], await self._get("/api/connections", list))

    async def subscriptions(self) -> list[Subscription]:
        return cast(list[Subscription], await self._get("/api/subscriptions", list))

    async def tolliver(self) -> Tolliver:
        return cast(Tolliver, await self._get("/api/tolliver", dict))

    async def stats(self) -> Stats:
        return cast(Stats, await self._get("/api/stats", dict))

    # ------------------------------------------------------------------- the admin writes

    async def create_stream(
        self,
        name: str,
        *,
        retention_ms: RetentionArg = NOT_GIVEN,
        retention_bytes: RetentionArg = NOT_GIVEN,
    ) -> StreamRetention:
        """Create the stream ``name`` (``POST /api/streams``), empty; returns the retention that
        applies to it. Given neither retention argument, the configuration's applies; given
        either (``None``: no bound), both are its runtime retention, the one not given taking
        the configuration's value. :class:`AdminError` ``409`` if it exists, ``400`` for a name
        the hub refuses (``_tidewire.*`` included), ``403`` without the ``admin`` right on
        it."""
        body: dict[str, Any] = {"name": name, **_retention_body(retention_ms, retention_bytes)}
        return cast(StreamRetention, await self._call("POST", "/api/streams", dict, body, 201))

    async def set_retention(
        self,
        name: str,
        *,
        retention_ms: RetentionArg = NOT_GIVEN,
        retention_bytes: RetentionArg = NOT_GIVEN,
    ) -> StreamRetention:
        """Change the retention of the stream ``name`` (``PATCH /api/streams/<name>``): what
        is given (``None``: no bound) becomes its runtime retention, what is not keeps the
        value that applies now; applied from the hub's next retention pass. Returns the
        retention that now applies. :class:`ValueError` if neither is given;
        :class:`AdminError` ``404`` if there is no such stream, ``403`` without the right."""
        body = _retention_body(retention_ms, retention_bytes)
        if not body:
            raise ValueError("nothing to change: give retention_ms and/or retention_bytes")
        return cast(StreamRetention, await self._call("PATCH", _stream_path(name), dict, body))

    async def delete_stream(self, name: str) -> Deleted:
        """Delete the stream ``name`` and every event of it, at once and for good
        (``DELETE /api/streams/<name>``): its live subscribers are told ``stream deleted``,
        and a stream created later under the name starts again at id 1.
        :class:`AdminError` ``404`` if there is no such stream, ``403`` without the right."""
        return cast(Deleted, await self._call("DELETE", _stream_path(name), dict))

    async def _get(self, path: str, kind: type[Any]) -> Any:
        return await self._call("GET", path, kind)

    async def _call(self, method: str, path: str, kind: type[Any],
                    body: dict[str, Any] | None = None, ok: int = 200) -> Any:  # fmt: skip
        """One request; the answer's JSON if its status is ``ok`` and it is a ``kind``, else
        :class:`AdminError`. A write carries the headers of the hub's cross-site rules."""
        if self._session is None:
            raise RuntimeError("use AdminClient as an async context manager")
        url = self.base_url + path
        headers = self._headers
        data: bytes | None = None
        if method != "GET":
            headers = {**headers, "X-Tidewire-Request": "1"}
            if body is not None:
                headers["Content-Type"] = "application/json"
                data = json.dumps(body).encode()
        try:
            async with self._session.request(method, url, data=data, headers=headers,
                                             ssl=self._ssl) as response:  # fmt: skip
                answer = await response.read()
                status = response.status
        except aiohttp.ClientSSLError as exc:
            why = getattr(exc, "certificate_error", None) or exc.os_error
            raise AdminError(0, f"TLS with the hub at {self.base_url} failed: {why}", url,
                             tls=True) from None  # fmt: skip
        except aiohttp.ClientConnectorError as exc:
            why = "connection refused" if isinstance(exc.os_error, ConnectionRefusedError) \
                else str(exc)  # fmt: skip
            raise AdminError(0, f"cannot reach the hub at {self.base_url}: {why}", url) from None
        except aiohttp.ClientError as exc:
            raise AdminError(0, f"{self.base_url}: {exc or type(exc).__name__}", url) from None
        except TimeoutError:  # (asyncio.TimeoutError is TimeoutError since 3.11)
            raise AdminError(0, f"no answer from the hub at {self.base_url} within "
                             f"{self.timeout:g} s", url) from None  # fmt: skip
        if status != ok:
            raise AdminError(status, _message(answer), url)
        try:
            parsed = json.loads(answer)
        except ValueError:
            parsed = None
        if not isinstance(parsed, kind):
            shown = path.split("?")[0]
            raise AdminError(status, f"{method} {shown} did not answer a JSON {kind.__name__}",
                             url)  # fmt: skip
        return parsed


def _retention_body(ms: RetentionArg, nbytes: RetentionArg) -> dict[str, int | None]:
    """The retention keys of a write: the arguments given (``None`` sent as ``null``)."""
    body: dict[str, int | None] = {}
    for key, value in (("retention_ms", ms), ("retention_bytes", nbytes)):
        if value is NOT_GIVEN:
            continue
        if value is not None and (type(value) is not int or value < 0):
            raise ValueError(f"{key} must be a non-negative int, None or NOT_GIVEN, "
                             f"not {value!r:.40}")  # fmt: skip
        body[key] = value
    return body


def _stream_path(name: str) -> str:
    """``/api/streams/<name>``, the name percent-encoded (every byte but unreserved ones)."""
    if not name:
        raise ValueError("a stream name is not empty")
    return "/api/streams/" + quote(name, safe="")


def _message(body: bytes) -> str:
    """The hub's reason: its text body (a JSON body's ``error`` or ``message``)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for key in ("error", "message"):
            if isinstance(data.get(key), str):
                return cast(str, data[key])
    return text[:500] or "(no message)"

