"""An asyncio client for the hub's admin API (``/api/*`` on the HTTP listener; every path and
field is in docs/observability.md)::

    async with AdminClient("http://127.0.0.1:7480", token=...) as admin:
        overview = await admin.overview()
        print(overview["version"], overview["events_in_rate"])

aiohttp is the library (its client session, one per :class:`AdminClient`). Each method returns
the response's parsed JSON, typed with the TypedDicts below (as the hub sends it: nothing is
converted). A refusal (``401``: no or bad credentials, ``403``: not granted ``monitor`` in the
ACL), any other non-200 answer, a hub that cannot be reached or that does not answer in time
raise :class:`AdminError`, with the HTTP status (0 when there was no answer) and the hub's
message (``tls`` when the TLS handshake failed). ``token=`` is sent as ``Authorization: Bearer
<token>``; ``ssl=`` is the TLS context for ``https://`` (e.g. with a client certificate,
``tidewire.server.guard.client_context``).
"""

from __future__ import annotations

import json
import ssl as _ssl
from http import HTTPStatus
from typing import Any, TypedDict, cast

import aiohttp

from ..model import TidewireError

__all__ = [
    "AdminClient",
    "AdminError",
    "Connection",
    "Overview",
    "Stats",
    "Stream",
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


class Stream(Rates):
    """One element of ``GET /api/streams``: the log's figures (``first_id``/``latest_id`` are
    None for an empty stream), then this process's traffic, in total and by protocol."""

    name: str
    events: int
    first_id: int | None
    latest_id: int | None
    bytes: int
    segments: int
    protocols: dict[str, Traffic]


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

    async def _get(self, path: str, kind: type[Any]) -> Any:
        if self._session is None:
            raise RuntimeError("use AdminClient as an async context manager")
        url = self.base_url + path
        try:
            async with self._session.get(url, headers=self._headers, ssl=self._ssl) as response:
                body = await response.read()
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
        if status != 200:
            raise AdminError(status, _message(body), url)
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, kind):
            raise AdminError(status, f"{path} did not answer a JSON {kind.__name__}", url)
        return data


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

