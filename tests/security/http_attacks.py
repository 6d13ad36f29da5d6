"""Attacks on a hub's RS.io over HTTP (issue 20). Each takes the hub's base URL (or its host
and port, for raw bytes), is bounded in what it sends (and, where it waits for the hub, in
time), closes every connection it opens, and returns what the hub answered. The ones that take
an ``aiohttp.ClientSession`` use the caller's (closed by the caller), so that the same attack
runs against an in-process hub and a real ``tidewire serve``.

* :func:`never_fetched`: subscriptions asking for everything, never fetched;
* :func:`subscribe_many`: one principal asking for many subscriptions;
* :func:`declared_bodies`: bodies declared large, of which only a little is sent;
* :func:`token_urls` / :func:`bad_requests` with :func:`raw_answer`: a token put where it
  must never be echoed.
"""

from __future__ import annotations

import asyncio

import aiohttp
from yarl import URL

from http_hub import bearer

__all__ = ["bad_requests", "declared_bodies", "never_fetched", "raw_answer", "secret_of",
           "subscribe_many", "token_urls"]  # fmt: skip

MiB = 1024 * 1024


async def never_fetched(session: aiohttp.ClientSession, base: str, publisher: str, n: int,
                        token: str | None = None) -> list[str]:  # fmt: skip
    """The attack: ``n`` subscriptions asking for everything, none ever fetched. Their
    subscription URLs (a refused subscribe ends the list)."""
    urls: list[str] = []
    for _ in range(n):
        joint = "&" if "?" in publisher else "?"
        target = URL(f"{base}/rsio/pub/{publisher}{joint}request=1000000", encoded=True)
        async with session.put(target, headers=bearer(token)) as answer:
            if answer.status != 201:
                break
            urls.append(answer.headers["Location"])
    return urls


async def subscribe_many(session: aiohttp.ClientSession, base: str, n: int,
                         token: str | None = None) -> list[int]:  # fmt: skip
    """The attack: one principal asks for ``n`` subscriptions; the statuses it got."""
    statuses = []
    for i in range(n):
        target = URL(f"{base}/rsio/pub/grab{i % 7}?request=1", encoded=True)
        async with session.put(target, headers=bearer(token)) as answer:
            statuses.append(answer.status)
    return statuses


async def declared_body(host: str, port: int, length: int, *, sent: int = MiB,
                        wait: float = 10.0) -> bytes:  # fmt: skip
    """One anonymous ``PUT`` declaring a body of ``length`` bytes and sending ``sent`` of them:
    the head of the hub's answer, or ``b"(waiting for its body)"`` after ``wait`` seconds."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"PUT /rsio/pub/s HTTP/1.1\r\nHost: hub\r\n"
                     b"Content-Length: %d\r\n\r\n" % length + bytes(sent))  # fmt: skip
        async with asyncio.timeout(wait):
            return await reader.readuntil(b"\r\n\r\n")
    except TimeoutError:
        return b"(waiting for its body)"
    finally:
        writer.close()


async def declared_bodies(host: str, port: int, *, connections: int = 8,
                          length: int = 15 * MiB, huge: int = 2**30) -> list[bytes]:  # fmt: skip
    """``connections`` bodies of ``length`` declared at once (1 MiB of each sent) and one of
    ``huge``: the heads of the hub's answers, the huge one's last."""
    return list(await asyncio.gather(*(declared_body(host, port, length)
                                       for _ in range(connections)),
                                     declared_body(host, port, huge)))  # fmt: skip


def secret_of(token: str) -> str:
    """The part of a token that must never be echoed."""
    return token.partition(".")[2]


def token_urls(token: str) -> list[str]:
    """Every place in a URL's query where a careless client might put its token."""
    return [f"/rsio/pub/orders?access_token={token}", f"/rsio/pub/orders?{token}",
            f"/rsio/pub/orders?from={token}", f"/rsio/pub/orders?{token}=1",
            f"/rsio/pub/orders?format=value&request={token}",
            f"/rsio/pub/orders?size={token}", f"/rsio/pub/orders?key=%zz{token}"]  # fmt: skip


def bad_requests(token: str) -> list[bytes]:
    """Requests aiohttp's parser refuses, with ``token`` in the offending line."""
    return [f"PUT /rsio/pub/orders?token={token}\x01 HTTP/1.1\r\nHost: hub\r\n\r\n".encode(),
            f"PUT /rsio/pub/orders?token={token} x HTTP/1.1\r\nHost: hub\r\n\r\n".encode(),
            f"PUT /rsio/pub/s HTTP/1.1\r\nHost: hub\r\nContent-Length: {token}\r\n\r\n".encode(),
            f"PUT /rsio/pub/s?t={token} HTTP/9.9\r\nHost: hub\r\n\r\n".encode()]  # fmt: skip


async def raw_answer(host: str, port: int, request: bytes) -> bytes:
    """Everything the hub answers to ``request`` until it closes (bounded)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        async with asyncio.timeout(5):
            return await reader.read()
    finally:
        writer.close()
