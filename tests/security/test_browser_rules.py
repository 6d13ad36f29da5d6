"""The browser rules of the HTTP face (tidewire.server.browser) as tables: which requests a page
on another site could make the browser send are refused, which pass (the hub's own pages,
clients that are not browsers), and the headers every answer carries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from tidewire.server.browser import (
    CONTENT_SECURITY_POLICY,
    BrowserPolicy,
    browser_policy,
    cross_site_refusal,
    request_host,
    security_headers,
)

POLICY = BrowserPolicy.serving("127.0.0.1", ["hub.example.com", ".corp.example"])
HOST = "127.0.0.1:7480"
ADMIN = {"X-Tidewire-Request": "1", "Content-Type": "application/json"}
SAME = {"Origin": "http://127.0.0.1:7480", "Sec-Fetch-Site": "same-origin"}


def refusal(method: str, path: str, headers: dict[str, str] | list[tuple[str, str]], *,
            host: str = HOST, secure: bool = False, has_body: bool = True,
            policy: BrowserPolicy = POLICY) -> str | None:  # fmt: skip
    return cross_site_refusal(method, path, CIMultiDict(headers), host=host, secure=secure,
                              has_body=has_body, policy=policy)  # fmt: skip


PASS = [
    # clients that are not browsers: no Origin, no Sec-Fetch-Site, whatever the Host
    ("PUT", "/rsio/pub/orders", {}, HOST),
    ("PUT", "/rsio/sub/abc?request=4", {}, "hub.elsewhere.example:7480"),
    ("PUT", "/rsio/pub/orders", {"Content-Type": "application/x-www-form-urlencoded"}, HOST),
    ("GET", "/api/stats", {}, "anything.example"),
    # the hub's own pages
    ("PUT", "/rsio/pub/orders", SAME, HOST),
    ("POST", "/api/streams", {**SAME, **ADMIN}, HOST),
    ("DELETE", "/api/streams/orders", {**SAME, **ADMIN}, HOST),
    ("PATCH", "/api/streams/orders", {**ADMIN, "Origin": "http://127.0.0.1:7480"}, HOST),
    ("POST", "/api/streams", {**ADMIN, "Sec-Fetch-Site": "none"}, HOST),  # typed by the user
    ("POST", "/api/streams", {**ADMIN, "Origin": "http://HUB.example.com"}, "hub.example.com:80"),
    ("POST", "/api/x", {**ADMIN, "Origin": "http://[::1]:7480"}, "[::1]:7480"),
    ("POST", "/api/x", {**ADMIN, "Origin": "http://a.corp.example:1"}, "a.corp.example:1"),
    ("POST", "/api/x", {**ADMIN, "Content-Type": "application/json; charset=utf-8"}, HOST),
    ("POST", "/api/x", ADMIN, "localhost:7480"),
    # behind a proxy that ends TLS: the page is https://, the hub's listener plain HTTP
    ("POST", "/api/x", {**ADMIN, "Origin": "https://hub.example.com"}, "hub.example.com"),
    # reads from another site are the browser's to keep from the page (no CORS answer)
    ("GET", "/api/stats", {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
     HOST),
    ("GET", "/tube", {"Origin": "http://127.0.0.1:7480"}, HOST),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "headers", "host"), PASS)
def test_passes(method: str, path: str, headers: dict[str, str], host: str) -> None:
    assert refusal(method, path, headers, host=host) is None


REFUSED = [
    # a cross-site form POST (what Chromium sends), and a fetch from another origin
    ("POST", "/api/streams", {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site",
                              "Content-Type": "application/x-www-form-urlencoded"}, HOST,
     "Sec-Fetch-Site"),
    ("POST", "/api/streams", {**ADMIN, "Origin": "http://evil.example"}, HOST, "Origin"),
    ("PUT", "/rsio/pub/orders", {"Origin": "http://evil.example"}, HOST, "Origin"),
    ("PUT", "/rsio/pub/orders", {"Sec-Fetch-Site": "same-site"}, HOST, "Sec-Fetch-Site"),
    ("PUT", "/rsio/pub/orders", {"Origin": "null"}, HOST, "Origin"),
    ("PUT", "/rsio/pub/orders", {"Origin": "http://127.0.0.2:7480"}, HOST, "Origin"),
    ("PUT", "/rsio/pub/orders", {"Origin": "http://127.0.0.1:7481"}, HOST, "Origin"),
    ("PUT", "/rsio/pub/orders", [("Origin", "http://127.0.0.1:7480")] * 2, HOST, "Origin"),
    ("DELETE", "/x", [("Sec-Fetch-Site", "same-origin"), ("Sec-Fetch-Site", "cross-site")],
     HOST, "Sec-Fetch-Site"),
    # admin writes: the header a form cannot send, a JSON body
    ("POST", "/api/streams", {"Content-Type": "application/json"}, HOST, "X-Tidewire-Request"),
    ("POST", "/api/streams", {**ADMIN, "X-Tidewire-Request": "yes"}, HOST,
     "X-Tidewire-Request"),
    ("POST", "/api/streams", {**ADMIN, "Content-Type": "text/plain"}, HOST, "application/json"),
    ("POST", "/api/streams", {"X-Tidewire-Request": "1"}, HOST, "application/json"),
    # DNS rebinding: same-origin to the browser, but a name the hub does not serve
    ("POST", "/api/streams", {**ADMIN, "Origin": "http://evil.example:7480"},
     "evil.example:7480", "Host"),
    ("POST", "/api/streams", ADMIN, "evil.example:7480", "Host"),
    ("PUT", "/rsio/pub/orders", {"Origin": "http://evil.example:7480"}, "evil.example:7480",
     "Host"),
    ("GET", "/tube", {"Origin": "http://evil.example:7480"}, "evil.example:7480", "Host"),
    ("POST", "/api/x", {**ADMIN, "Origin": "http://corp.example.evil"}, "corp.example.evil",
     "Host"),
    ("POST", "/api/x", ADMIN, "", "Host"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "headers", "host", "says"), REFUSED)
def test_refused(method: str, path: str, headers: dict[str, str], host: str, says: str) -> None:
    reason = refusal(method, path, headers, host=host)
    assert reason is not None
    assert says in reason


def test_a_body_less_admin_write_needs_no_content_type() -> None:
    assert refusal("DELETE", "/api/streams/x", {"X-Tidewire-Request": "1"},
                   has_body=False) is None  # fmt: skip


def test_over_tls_the_certificate_binds_the_name() -> None:
    rebound = {**ADMIN, "Origin": "https://evil.example:7480"}
    assert refusal("POST", "/api/x", rebound, host="evil.example:7480", secure=True) is None
    assert refusal("POST", "/api/x", rebound, host="evil.example:7480") is not None
    origin = {**ADMIN, "Origin": "https://hub.example.com"}
    assert refusal("POST", "/api/x", origin, host="hub.example.com:443", secure=True) is None
    downgraded = {**ADMIN, "Origin": "http://hub.example.com"}  # (an http page, a TLS hub)
    assert refusal("POST", "/api/x", downgraded, host="hub.example.com", secure=True) is not None


def test_allowed_hosts_from_the_settings() -> None:
    policy = browser_policy({"host": "0.0.0.0", "http.allowed_hosts": "a.example, b.example"})
    assert policy.serves("a.example")
    assert policy.serves("B.EXAMPLE.")
    assert policy.serves("localhost")
    assert policy.serves("10.1.2.3")
    assert policy.serves("::1")
    assert not policy.serves("c.example")
    assert not policy.serves("")
    assert browser_policy({"host": "hub.lan", "http.allowed_hosts": ""}).serves("hub.lan")
    anything = browser_policy({"host": "127.0.0.1", "http.allowed_hosts": "*"})
    assert anything.any_host
    assert anything.serves("evil.example")
    assert refusal("POST", "/api/x", ADMIN, host="evil.example", policy=anything) is None


@pytest.mark.parametrize(("host", "parts"), [
    ("127.0.0.1:7480", ("127.0.0.1", "7480")), ("[::1]:80", ("::1", "80")), ("[::1]", ("::1", "")),
    ("hub", ("hub", "")), ("::1", ("::1", "")),
])  # fmt: skip
def test_request_host(host: str, parts: tuple[str, str]) -> None:
    assert request_host(host) == parts


def test_security_headers() -> None:
    page = security_headers("/", secure=False)
    assert page["Server"] == "tidewire"
    assert page["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    assert "'unsafe-eval'" not in CONTENT_SECURITY_POLICY
    assert page["X-Content-Type-Options"] == "nosniff"
    assert page["Referrer-Policy"] == "no-referrer"
    assert "Cache-Control" not in page
    assert "Strict-Transport-Security" not in page
    api = security_headers("/api/stats", secure=True)
    assert api["Cache-Control"] == "no-store"
    assert api["Strict-Transport-Security"] == "max-age=31536000"


@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "BREW"]),
       path=st.sampled_from(["/", "/api/streams", "/rsio/pub/x", "/tube"]),
       host=st.text(max_size=40), origin=st.none() | st.text(max_size=40),
       site=st.none() | st.text(max_size=20), secure=st.booleans(), body=st.booleans())  # fmt: skip
def test_any_header_values_get_an_answer_never_an_exception(
    method: str, path: str, host: str, origin: str | None, site: str | None, secure: bool,
    body: bool,
) -> None:
    headers = [("X-Tidewire-Request", "1"), ("Content-Type", "application/json")]
    headers += [("Origin", origin)] if origin is not None else []
    headers += [("Sec-Fetch-Site", site)] if site is not None else []
    reason = refusal(method, path, headers, host=host, secure=secure, has_body=body)
    assert reason is None or reason.isprintable()
    if origin is None and site is None and not path.startswith("/api/"):
        assert reason is None  # not a browser, not an admin write: never refused
