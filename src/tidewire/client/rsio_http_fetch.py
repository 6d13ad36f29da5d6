"""The HTTP client's lean path for fetches (issue 22): a fetch written as one small ``PUT`` on
a keep-alive connection of its own, and its response's body received straight into one buffer
of its ``Content-Length`` (:class:`asyncio.BufferedProtocol`), which the compiled decoder then
parses in place into a batch.

Why: aiohttp's client costs, per response, a request object, its chunk queue and a join of the
chunks into a new ``bytes`` (the receive copies a 1 MiB body three times before it is decoded);
over HTTP the client's CPU per 1 KiB element was twice TCP's (benchmarks/README.md,
``http_throughput.py``). The bytes on the wire are the same requests and responses
(docs/protocols/rsio-http.md): the request carries ``Host``, the caller's headers and
``Content-Length: 0``, and nothing else.

Used only where aiohttp would add nothing: plain ``http://``, a session the
:class:`~tidewire.client.http.HttpHub` made itself (a caller's session has its own settings),
and responses :mod:`~tidewire.protocols.rsio_http.http11` reads (else :class:`Unsupported`:
the same request goes through aiohttp). A connection is used by one request at a time and kept
for the next (at most :data:`IDLE_PER_HOST` idle per host); a request on a kept connection that
the hub closed meanwhile is sent once more on a new one, as aiohttp does for idempotent
methods (a fetch is: the hub resends what it sent last, ``X-Tidewire-Sequence``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import cast

import yarl

from ..protocols.rsio_http.http11 import (
    MAX_HEAD_BYTES,
    ResponseHead,
    Unsupported,
    body_buffer,
    parse_head,
    request_bytes,
)

__all__ = ["IDLE_PER_HOST", "MAX_BODY_BYTES", "FetchPool", "Unsupported"]

IDLE_PER_HOST = 4  # kept connections per host:port (each subscription uses one at a time)
MAX_BODY_BYTES = 64 * 1024 * 1024  # a longer body is read by aiohttp, a chunk at a time
HEAD_CHUNK = 4096  # the first read of a response: its head and the start of its body


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive connection, one request at a time: the head is read into a small
    buffer, the body straight into a ``bytearray`` of its length."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.got_bytes = False  # (for this request: whether the hub answered at all)
        self._head = bytearray(HEAD_CHUNK)
        self._head_len = 0
        self._parsed: ResponseHead | None = None
        self._body = bytearray()
        self._view = memoryview(self._body)
        self._filled = 0
        self._done: asyncio.Future[tuple[ResponseHead, bytearray]] | None = None
        self.touched = False  # bytes came since the last look (the read timeout's clock)

    # ------------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(ConnectionResetError(str(exc) if exc else "the hub closed the connection"))

    def eof_received(self) -> bool | None:
        self.lost = True
        self._fail(ConnectionResetError("the hub closed the connection"))
        return None

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._parsed is None:
            if self._head_len == len(self._head):
                if len(self._head) >= MAX_HEAD_BYTES:  # (read and dropped, then through aiohttp)
                    self._fail(Unsupported("a response head over 64 KiB"))
                    self._head_len = 0
                self._head.extend(bytes(len(self._head)))  # (doubled: a head this long is rare)
            return memoryview(self._head)[self._head_len :]
        return self._view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.got_bytes = self.touched = True
        if self._done is None:  # bytes nobody asked for (or after a failure): never reused
            self._head_len = 0
            self.close()
            return
        if self._parsed is not None:
            self._filled += nbytes
            self._finish_if_complete()
            return
        self._head_len += nbytes
        end = self._head.find(b"\r\n\r\n", 0, self._head_len)
        if end < 0:
            return
        try:
            head = parse_head(memoryview(self._head)[:end])
        except Unsupported as exc:
            self._fail(exc)
            return
        if head.length > MAX_BODY_BYTES:  # (no buffer that size on a header's word)
            self._fail(Unsupported(f"a body of {head.length} bytes"))
            return
        self._parsed = head
        self._body = body_buffer(head.length)  # (not zeroed: the receive fills all of it)
        self._view = memoryview(self._body)
        extra = self._head_len - (end + 4)
        if extra > head.length:
            self._fail(Unsupported("bytes after a response (nothing was asked for them)"))
            return
        self._view[:extra] = memoryview(self._head)[end + 4 : self._head_len]
        self._filled = extra
        self._finish_if_complete()

    # ------------------------------------------------------------------ the request's side

    def start(self, request: bytes) -> asyncio.Future[tuple[ResponseHead, bytearray]]:
        """Send ``request``; the future gets the response's head and body."""
        assert self.transport is not None
        assert self._done is None
        self._done = asyncio.get_running_loop().create_future()
        self._head_len = self._filled = 0
        self._parsed = None
        self.got_bytes = False
        self.transport.write(request)
        return self._done

    def _finish_if_complete(self) -> None:
        head = self._parsed
        if head is None or self._filled < head.length:
            return
        done, self._done = self._done, None
        body, self._body, self._view = self._body, bytearray(), memoryview(bytearray())
        self._parsed = None
        self._head_len = 0
        if len(self._head) > HEAD_CHUNK:
            self._head = bytearray(HEAD_CHUNK)
        if done is not None and not done.done():
            done.set_result((head, body))

    def _fail(self, exc: Exception) -> None:
        done, self._done = self._done, None
        if done is not None and not done.done():
            done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()
        self.lost = True

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class FetchPool:
    """Keep-alive connections to the hubs' ``http://`` URLs, for fetches."""

    def __init__(self, read_timeout: float) -> None:
        self.read_timeout = read_timeout  # no byte for this long: the request failed
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}

    async def put(self, url: yarl.URL, headers: dict[str, str]
                  ) -> tuple[int, list[tuple[str, str]], bytearray]:  # fmt: skip
        """``PUT url`` with ``headers``: the status, headers and body of the answer.
        ``ConnectionError``/``TimeoutError`` when the hub cannot be reached or does not
        answer in full; :class:`Unsupported` for an answer to read through aiohttp."""
        host, port = url.raw_host or "", url.port or 80
        key = (host, port)
        host_header = url.host_port_subcomponent or host  # (no userinfo; a default port left out)
        request = request_bytes(url.raw_path_qs, host_header, headers)
        kept = self._idle.get(key)
        while kept:  # a kept one first; if the hub closed it meanwhile, once more anew
            conn = kept.pop()
            if conn.lost:
                continue
            try:
                return await self._exchange(key, conn, request)
            except ConnectionError:
                if conn.got_bytes:
                    raise
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, host, port)
        return await self._exchange(key, conn, request)

    async def _exchange(self, key: tuple[str, int], conn: _Connection, request: bytes
                        ) -> tuple[int, list[tuple[str, str]], bytearray]:  # fmt: skip
        done = conn.start(request)
        try:
            while True:  # (a read timeout: no byte at all for read_timeout seconds)
                conn.touched = False
                finished, _ = await asyncio.wait([done], timeout=self.read_timeout)
                if finished:
                    break
                if not conn.touched:
                    raise TimeoutError(f"no answer within {self.read_timeout:g} s")
            head, body = done.result()
        except BaseException:
            conn.close()  # (a cancelled fetch: its answer may still come; never reused)
            if not done.done():
                done.cancel()
            elif not done.cancelled():
                done.exception()  # (retrieved: the caller has it)
            raise
        if head.keep_alive and not conn.lost:
            idle = self._idle.setdefault(key, deque())
            if len(idle) < IDLE_PER_HOST:
                idle.append(conn)
            else:
                conn.close()
        else:
            conn.close()
        return head.status, head.headers, body

    def close(self) -> None:
        """Close every kept connection."""
        for idle in self._idle.values():
            for conn in idle:
                with contextlib.suppress(Exception):
                    conn.close()
        self._idle.clear()
