"""The HTTP/1.1 of the client's lean fetches (``tidewire.protocols.rsio_http.http11``): the
request's exact bytes, and which responses it reads (the rest go through aiohttp)."""

from __future__ import annotations

import pytest

from tidewire.protocols.rsio_http.http11 import Unsupported, parse_head, request_bytes


def test_a_fetch_is_a_put_without_a_body() -> None:
    sent = request_bytes("/rsio/sub/Or7D93lKYZp_qojPBQZnJw?request=500", "127.0.0.1:7480",
                         {"Authorization": "Bearer a.b", "X-Tidewire-Sequence": "120"})  # fmt: skip
    assert sent == (b"PUT /rsio/sub/Or7D93lKYZp_qojPBQZnJw?request=500 HTTP/1.1\r\n"
                    b"Host: 127.0.0.1:7480\r\nAuthorization: Bearer a.b\r\n"
                    b"X-Tidewire-Sequence: 120\r\nContent-Length: 0\r\n\r\n")  # fmt: skip
    for target, headers in (("no-slash", {}), ("/a b", {}), ("/a", {"X-A": "1\r\nX-B: 2"}),
                            ("/a", {"Bad Name": "1"})):  # fmt: skip
        with pytest.raises(ValueError, match=r"cannot be sent|encoded path"):
            request_bytes(target, "h", headers)


def test_the_heads_it_reads() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-Tidewire-Sequence: 0\r\n"
                      b"Content-Encoding: X-Rsio-LengthPrefixedElements")  # fmt: skip
    assert (head.status, head.length, head.keep_alive) == (200, 11, True)
    assert ("X-Tidewire-Sequence", "0") in head.headers
    assert parse_head(b"HTTP/1.1 204 No Content\r\nRetry-After: 0").length == 0
    assert not parse_head(b"HTTP/1.1 410 Gone\r\nContent-Length: 0\r\nConnection: close").keep_alive
    assert not parse_head(b"HTTP/1.0 200 OK\r\nContent-Length: 1").keep_alive
    assert parse_head(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive").keep_alive
    assert parse_head(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5").status == 503


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
    b"HTTP/1.1 200 OK",  # (a body up to the close)
    b"HTTP/1.1 100 Continue",
    b"HTTP/2 200",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
    b"HTTP/1.1 200 OK\r\n Folded: header\r\nContent-Length: 0",
    b"HTTP/1.1 200 OK\r\nno colon\r\nContent-Length: 0",
])  # fmt: skip
def test_the_heads_it_leaves_to_aiohttp(head: bytes) -> None:
    with pytest.raises(Unsupported):
        parse_head(head)
