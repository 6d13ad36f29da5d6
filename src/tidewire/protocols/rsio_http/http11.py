"""The HTTP/1.1 of a fetch, as the client's lean path writes and reads it (issue 22): one
``PUT`` without a body, and a response with a ``Content-Length`` body (or none), on a
keep-alive connection. Sans-IO: bytes in, bytes out, no socket and no asyncio.

Only what RS.io over HTTP's fetches need (docs/protocols/rsio-http.md, "The client"): a
response this does not cover (a chunked or close-delimited body, a 1xx, a malformed head) is
:class:`Unsupported`, and the client sends that request again through aiohttp's full client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...model import RemoteProtocolError
from ...native import kernel

__all__ = [
    "MAX_HEAD_BYTES",
    "ResponseHead",
    "Unsupported",
    "body_buffer",
    "body_buffer_py",
    "parse_head",
    "request_bytes",
]

MAX_HEAD_BYTES = 65_536  # a response's status line and headers (aiohttp's own bounds are lower)

_STATUS = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class Unsupported(RemoteProtocolError):
    """A response the lean path does not read (the request goes through aiohttp instead)."""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """A response's status line and headers: ``headers`` as received (names as sent),
    ``length`` its body's bytes, ``keep_alive`` whether the connection may carry another
    request after the body."""

    status: int
    headers: list[tuple[str, str]]
    length: int
    keep_alive: bool


def request_bytes(target: str, host: str, headers: dict[str, str]) -> bytes:
    """``PUT <target> HTTP/1.1`` with ``Host``, ``headers`` and ``Content-Length: 0``.
    ``target``: the path and query, already percent-encoded (as the hub's URLs are)."""
    if not target.startswith("/") or any(c in target for c in " \r\n"):
        raise ValueError("a request target is an encoded path and query")
    lines = [f"PUT {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name) or "\r" in value or "\n" in value:
            raise ValueError(f"a header that cannot be sent: {name!r}")
        lines.append(f"{name}: {value}")
    lines.append("Content-Length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(head: bytes | bytearray | memoryview) -> ResponseHead:
    """The status line and headers ``head`` (without the blank line that ends them).
    :class:`Unsupported` for what the lean path does not read: another version than HTTP/1.x,
    a 1xx, ``Transfer-Encoding``, no ``Content-Length`` where a body may follow, a
    malformed line."""
    lines = bytes(head).split(b"\r\n")
    status = _STATUS.fullmatch(lines[0])
    if status is None:
        raise Unsupported("not an HTTP/1.x status line")
    code = int(status.group(2))
    if code < 200:
        raise Unsupported(f"a {code} response")
    headers: list[tuple[str, str]] = []
    length: int | None = None
    close = status.group(1) == b"0"  # (HTTP/1.0: closes unless it says keep-alive)
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise Unsupported("a malformed header line")
        key = name.decode("latin-1")
        text = value.strip(b" \t").decode("latin-1")
        lower = key.lower()
        if lower == "transfer-encoding":
            raise Unsupported("a body with a Transfer-Encoding")
        if lower == "content-length":
            if not text.isdigit() or (length is not None and int(text) != length):
                raise Unsupported("a malformed Content-Length")
            length = int(text)
        elif lower == "connection":
            tokens = {t.strip().lower() for t in text.split(",")}
            close = "close" in tokens or (close and "keep-alive" not in tokens)
        headers.append((key, text))
    if length is None:
        if code not in (204, 304):
            raise Unsupported("a body without a Content-Length")
        length = 0
    return ResponseHead(code, headers, length, not close)


def body_buffer_py(size: int) -> bytearray:
    """A buffer of ``size`` bytes for a response's body to be received into (the compiled
    twin leaves it unzeroed: the receive writes every byte before anything reads one)."""
    return bytearray(size)


body_buffer = kernel("body_buffer", body_buffer_py)
