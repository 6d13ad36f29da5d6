"""The HTTP client's lean path for fetches (``tidewire.client.rsio_http_fetch``) against a
scripted hub on 127.0.0.1 (a real socket, on asyncio's loop and on uvloop): keep-alive reuse, a
body received in pieces behind a long head, ``Connection: close``, a kept connection the hub
closed, a fetch cancelled mid-answer, and an answer it does not read (chunked), which
:class:`~tidewire.client.http.HttpHub` sends again through aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from yarl import URL

from loops import Run
from tidewire.client.http import HttpHub
from tidewire.client.rsio_http_fetch import MAX_BODY_BYTES, FetchPool, Unsupported
from tidewire.protocols.rsio_http import encode_length_prefixed

Answer = Callable[[asyncio.StreamWriter], Awaitable[bool]]  # True: keep the connection


class ScriptedHub:
    """Answers each request with the next of ``answers``; records every request's bytes."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0
        self.port = 0
        self.requested = asyncio.Event()  # a request came

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while self.answers:
                self.requests.append(await reader.readuntil(b"\r\n\r\n"))
                self.requested.set()
                if not await self.answers.pop(0)(writer):
                    break
        writer.close()


@asynccontextmanager
async def scripted(answers: list[Answer]) -> AsyncIterator[ScriptedHub]:
    hub = ScriptedHub(answers)
    server = await asyncio.start_server(hub.serve, "127.0.0.1", 0)
    hub.port = server.sockets[0].getsockname()[1]
    try:
        yield hub
    finally:
        server.close()


def answer(head: bytes, body: bytes = b"", *, piece: int = 0, keep: bool = True) -> Answer:
    async def write(writer: asyncio.StreamWriter) -> bool:
        data = head + b"\r\n\r\n" + body
        step = piece or len(data) or 1
        for at in range(0, len(data), step):
            writer.write(data[at : at + step])
            await writer.drain()
        return keep

    return write


def test_fetches_share_a_connection_and_a_body_comes_in_pieces(run: Run) -> None:
    body = bytes(range(256)) * 400  # 100 KiB, written 1000 bytes at a time
    long_head = b"HTTP/1.1 200 OK\r\nX-Long: " + b"x" * 6000 + b"\r\nContent-Length: %d" % len(body)

    async def main() -> None:
        no_content = answer(b"HTTP/1.1 204 No Content\r\nRetry-After: 0")
        async with scripted([answer(long_head, body, piece=1000), no_content]) as hub:
            pool = FetchPool(read_timeout=10)
            url = URL(f"http://127.0.0.1:{hub.port}/rsio/sub/abc?request=3", encoded=True)
            status, headers, got = await pool.put(url, {"X-Tidewire-Sequence": "0"})
            assert (status, bytes(got)) == (200, body)
            assert ("X-Long", "x" * 6000) in headers
            status, headers, got = await pool.put(url, {"X-Tidewire-Sequence": "400"})
            assert (status, got, hub.connections) == (204, bytearray(), 1)
            assert hub.requests[1] == (b"PUT /rsio/sub/abc?request=3 HTTP/1.1\r\n"
                                       b"Host: 127.0.0.1:%d\r\nX-Tidewire-Sequence: 400\r\n"
                                       b"Content-Length: 0\r\n\r\n" % hub.port)  # fmt: skip
            pool.close()

    run(main())


@pytest.mark.parametrize("how", ["connection-close", "hub-closes"])
def test_a_connection_that_ends_is_not_reused(run: Run, how: str) -> None:
    """``Connection: close`` from the hub, or a kept connection the hub closed while idle
    (the request then goes once more on a new connection, as aiohttp does)."""
    close = b"\r\nConnection: close" if how == "connection-close" else b""
    first = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1" + close, b"a", keep=False)

    async def main() -> None:
        async with scripted([first, answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1", b"b")]
                            ) as hub:  # fmt: skip
            pool = FetchPool(read_timeout=10)
            url = URL(f"http://127.0.0.1:{hub.port}/rsio/sub/abc", encoded=True)
            assert (await pool.put(url, {}))[2] == b"a"
            assert (await pool.put(url, {}))[2] == b"b"
            assert hub.connections == 2
            pool.close()

    run(main())


def test_a_fetch_cancelled_mid_answer_closes_its_connection(run: Run) -> None:
    release = asyncio.Event()

    async def half(writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        await release.wait()
        return False

    async def main() -> None:
        async with scripted([half, answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1", b"z")]
                            ) as hub:  # fmt: skip
            pool = FetchPool(read_timeout=10)
            url = URL(f"http://127.0.0.1:{hub.port}/rsio/sub/abc", encoded=True)
            task = asyncio.ensure_future(pool.put(url, {}))
            await hub.requested.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
            assert (await pool.put(url, {}))[2] == b"z"  # (a new connection: the old one is cut)
            assert hub.connections == 2
            pool.close()

    run(main())


def test_no_hub_is_a_connection_error(run: Run) -> None:
    async def main() -> None:
        async with scripted([]) as hub:
            port = hub.port
        with pytest.raises(ConnectionRefusedError):
            await FetchPool(read_timeout=10).put(URL(f"http://127.0.0.1:{port}/x"), {})

    run(main())


def test_an_answer_it_does_not_read_goes_through_aiohttp(run: Run) -> None:
    """A chunked answer (a proxy's, say): the same fetch is sent again through aiohttp, which
    reads it; the elements arrive once."""
    body = encode_length_prefixed([b"a", b"bb"])
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Tidewire-Sequence: 0\r\n"
            b"Content-Encoding: X-Rsio-LengthPrefixedElements")  # fmt: skip

    async def main() -> None:
        async with scripted([]) as hub:
            location = b"Location: http://127.0.0.1:%d/rsio/sub/abc" % hub.port
            hub.answers += [
                answer(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n" + location),
                answer(head, chunked), answer(head, chunked),
                answer(b"HTTP/1.1 410 Gone\r\nContent-Length: 0"),
                answer(b"HTTP/1.1 410 Gone\r\nContent-Length: 0"),
            ]  # fmt: skip
            got: list[list[bytes]] = []
            async with HttpHub(f"http://127.0.0.1:{hub.port}") as client:
                async for elements in client.elements("s?format=value", demand=10):
                    got.append(elements)
            assert got == [[b"a", b"bb"]]
            fetches = [r for r in hub.requests if r.startswith(b"PUT /rsio/sub/abc")]
            assert fetches[0].split(b"\r\n")[0] == fetches[1].split(b"\r\n")[0]  # the same one
            assert all(b"X-Tidewire-Sequence: 0\r\n" in r for r in fetches[:2])

    run(main())


def test_a_body_over_the_bound_is_left_to_aiohttp(run: Run) -> None:
    """No buffer is made on a header's word past ``MAX_BODY_BYTES``: such an answer is
    ``Unsupported`` (and its connection closed), so aiohttp reads it, a chunk at a time."""
    huge = b"HTTP/1.1 200 OK\r\nContent-Length: %d" % (MAX_BODY_BYTES + 1)

    async def main() -> None:
        async with scripted([answer(huge, b"x" * 10, keep=False)]) as hub:
            pool = FetchPool(read_timeout=10)
            url = URL(f"http://127.0.0.1:{hub.port}/rsio/sub/abc", encoded=True)
            with pytest.raises(Unsupported, match="a body of"):
                await pool.put(url, {})
            pool.close()

    run(main())
