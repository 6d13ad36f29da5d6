"""The HTTP face as a browser sees it (issue 23): the headers every answer carries, and the
refusal of requests a web page the user visits could make the browser send (cross-site request
forgery, DNS rebinding). docs/security.md, "Browsers", says why each rule is there.

* :func:`security_headers`: ``Server: tidewire`` (no library versions), a
  ``Content-Security-Policy`` without ``'unsafe-inline'`` (the pages' code and styles are files
  under ``/static``), ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``,
  ``X-Frame-Options: DENY``; ``Cache-Control: no-store`` under ``/api/``;
  ``Strict-Transport-Security`` over TLS only.
* :func:`cross_site_refusal`: why a request is refused, or ``None``. A request that changes
  state (any method but ``GET``, ``HEAD``, ``OPTIONS``) is refused when its ``Sec-Fetch-Site``
  is present and not ``same-origin`` or ``none``, or its ``Origin`` is present and not the
  request's own origin (scheme and ``Host``; on a plain listener ``https://`` and ``Host`` too,
  for a proxy that ends TLS). An admin write (such a request under ``/api/``)
  must also carry ``X-Tidewire-Request: 1`` (a form cannot send it; a cross-site ``fetch`` that
  does needs a CORS preflight the hub never answers) and, with a body, ``Content-Type:
  application/json``. On a plain-HTTP listener, an admin write and any request a browser made
  (it has ``Origin`` or ``Sec-Fetch-Site``) must name in ``Host`` a host the hub serves
  (:class:`BrowserPolicy`): a page whose name was rebound to 127.0.0.1 is same-origin to the
  browser, but not to this check. Over TLS the certificate binds the name already.

Clients that are not browsers (tidewire's own, curl, Spark) send neither ``Origin`` nor
``Sec-Fetch-Site``: their RS.io-over-HTTP writes pass as before, whatever their ``Host``. The hub
sets no cookie, ever: nothing here is ambient but a TLS client certificate, which these rules
cover.

The decisions are pure functions of the request's method, path and headers, tested as tables;
:mod:`.app` applies them, first thing, in its middleware.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from ..observe.logs import connection_log
from ..observe.throttle import LogThrottle
from ..protocols.rsio_http import ERROR_HEADER
from .rsio_http import escaped

log = logging.getLogger("tidewire.http")

__all__ = [
    "BROWSER_HEADERS",
    "CONTENT_SECURITY_POLICY",
    "HSTS",
    "REQUEST_HEADER",
    "SAFE_METHODS",
    "BrowserPolicy",
    "add_security_headers",
    "browser_policy",
    "cross_site",
    "cross_site_refusal",
    "request_host",
    "security_headers",
]

BROWSER_HEADERS = ("Origin", "Sec-Fetch-Site")  # only browsers send them (non-browsers: neither)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
REQUEST_HEADER = "X-Tidewire-Request"  # "1" on every admin write (the dashboard's must send it)
# default-src 'none' and then only what the pages use: their own scripts and styles (files, no
# inline code), images from the page or data:/blob: (the favicon is data:), fetch and WebSocket
# to the hub itself ('self' covers same-origin ws:/wss: in CSP 3), no frames, no plugins.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HSTS = "max-age=31536000"  # a year; no includeSubDomains: the hub speaks for itself only
_FIXED = {
    "Server": "tidewire",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",  # (frame-ancestors' older twin)
}
_SAME = frozenset({"same-origin", "none"})  # Sec-Fetch-Site values of the hub's own pages
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def security_headers(path: str, *, secure: bool) -> dict[str, str]:
    """The headers an answer to ``path`` carries (``secure``: it goes over TLS)."""
    headers = dict(_FIXED)
    if path.startswith("/api/"):
        headers["Cache-Control"] = "no-store"
    if secure:
        headers["Strict-Transport-Security"] = HSTS
    return headers


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The app's ``on_response_prepare`` hook: :func:`security_headers` on every answer it
    prepares (the WebSocket ``101`` too), before aiohttp adds its own ``Server`` header (which
    it does only when none is set)."""
    response.headers.update(security_headers(request.path, secure=request.secure))


class Headers(Protocol):
    """What :func:`cross_site_refusal` reads of a request's headers (a ``CIMultiDictProxy``)."""

    def getall(self, key: str, default: list[str], /) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class BrowserPolicy:
    """The host names the hub serves, for the ``Host`` check (:meth:`serves`): ``names``
    exactly, a ``.example.com`` entry that domain and its subdomains, and any IP literal (a
    rebound name is never one); ``any_host``: the check is off (``http.allowed_hosts = "*"``)."""

    names: frozenset[str] = frozenset({"localhost"})
    any_host: bool = False

    @classmethod
    def serving(cls, bind_host: str | None, allowed: Iterable[str] = ()) -> BrowserPolicy:
        """The names of a hub bound to ``bind_host``: it, ``localhost``, this machine's host
        name and ``allowed`` (``*`` among them: any host)."""
        names = {"localhost", socket.gethostname()}
        if bind_host:
            names.add(bind_host)
        extra = {a.strip() for a in allowed if a.strip()}
        return cls(frozenset(_host_name(n) for n in names | extra if n != "*"), "*" in extra)

    def serves(self, host: str) -> bool:
        """Whether ``host`` (a ``Host`` header's name, without its port) is one of the hub's."""
        if self.any_host:
            return True
        name = _host_name(host)
        if not name:
            return False
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            pass
        return name in self.names or any(n.startswith(".") and (name.endswith(n) or
                                                                name == n[1:])
                                         for n in self.names)  # fmt: skip


def browser_policy(values: Mapping[str, Any]) -> BrowserPolicy:
    """The policy of ``tidewire serve``'s settings: ``host`` and ``http.allowed_hosts``."""
    allowed = str(values.get("http.allowed_hosts", "")).replace(",", " ").split()
    return BrowserPolicy.serving(str(values.get("host", "")), allowed)


def _host_name(host: str) -> str:
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def request_host(host: str) -> tuple[str, str]:
    """A ``Host`` header's name and port (``""`` when none): ``[::1]:7480`` -> ``::1``,
    ``7480``."""
    host = host.strip()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest.removeprefix(":")
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        return name, port
    return host, ""


def _origin_of(scheme: str, host: str) -> str:
    """``scheme://host[:port]`` as origins compare: lower case, no default port."""
    name, port = request_host(host.lower())
    if ":" in name:
        name = f"[{name}]"
    return f"{scheme}://{name}" + (f":{port}" if port and port != _DEFAULT_PORTS[scheme] else "")


def _normal_origin(origin: str) -> str | None:
    """An ``Origin`` header as compared, or ``None`` (``null``, or not ``http(s)://host``)."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or scheme not in _DEFAULT_PORTS or not rest or "/" in rest:
        return None
    return _origin_of(scheme, rest)


def cross_site_refusal(method: str, path: str, headers: Headers, *, host: str, secure: bool,
                       has_body: bool, policy: BrowserPolicy) -> str | None:  # fmt: skip
    """Why the request is refused (``403``), in words for the peer and the log, or ``None``.

    ``host``: its ``Host`` header; ``secure``: it came over TLS; ``has_body``: it has a body.
    Several ``Origin`` or ``Sec-Fetch-Site`` headers are refused (each is one value).
    """
    unsafe = method.upper() not in SAFE_METHODS
    admin_write = unsafe and path.startswith("/api/")
    sites = headers.getall("Sec-Fetch-Site", [])
    origins = headers.getall("Origin", [])
    if unsafe and sites and (len(sites) > 1 or sites[0].strip().lower() not in _SAME):
        return "a cross-site request (Sec-Fetch-Site) may not change anything"
    if unsafe and origins:
        # The page's own origin; on a plain listener its https twin too: behind a proxy that
        # ends TLS, the hub's pages are https:// while the hub sees http (the same host, and
        # an https origin is no less the host's own)
        own = {_origin_of("https", host)} | ({_origin_of("http", host)} if not secure else set())
        if len(origins) > 1 or _normal_origin(origins[0]) not in own:
            return "a request from another origin (Origin) may not change anything"
    if admin_write:
        if [v.strip() for v in headers.getall(REQUEST_HEADER, [])] != ["1"]:
            return f"an admin request needs the header {REQUEST_HEADER}: 1"
        content_type = [v.split(";", 1)[0].strip().lower()
                        for v in headers.getall("Content-Type", [])]  # fmt: skip
        if has_body and content_type != ["application/json"]:
            return "an admin request's body must be Content-Type: application/json"
    browser = bool(sites or origins)
    if not secure and (admin_write or browser) and not policy.serves(request_host(host)[0]):
        return "the Host is not a name this hub serves (http.allowed_hosts)"
    return None


def cross_site(request: web.Request, policy: BrowserPolicy,
               refusals: LogThrottle) -> web.Response | None:  # fmt: skip
    """The ``403`` answer to ``request`` if :func:`cross_site_refusal` refuses it (logged,
    rate-limited by ``refusals``, with the peer's strings escaped), else ``None``."""
    host = request.headers.get("Host", "")
    reason = cross_site_refusal(request.method, request.path, request.headers, host=host,
                                secure=request.secure, has_body=request.body_exists,
                                policy=policy)  # fmt: skip
    if reason is None:
        return None
    seen = [escaped(",".join(request.headers.getall(h, ["-"]))) for h in BROWSER_HEADERS]
    refusals.log(connection_log(log, request.transport, "http"), logging.WARNING,
                 "%s %s: 403 %s (Host %s, Origin %s, Sec-Fetch-Site %s)", request.method,
                 escaped(request.rel_url.raw_path), reason, escaped(host), *seen)  # fmt: skip
    return web.Response(status=403, text=f"refused: {reason}\n", headers={ERROR_HEADER: "true"})
