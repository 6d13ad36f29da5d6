"""Attacks on a hub's Tube endpoint (``/tube``, RS.io over WebSocket) and a probe of its
``/healthz`` (issue 20). Each takes the endpoint's URL, is bounded in time
(:data:`ATTACK_SECONDS`) and in what it sends, closes every connection it opens, and returns
what the hub answered (close codes, HTTP statuses).

* :func:`deflate_bomb`: one message of about 16 KB inflating to 8 MiB of refused subscribes;
* :func:`unfinished`: messages begun and never finished, over several connections;
* :func:`tiny_fragments`: peers asking the hub for 8-byte fragments;
* :func:`never_reading`: many subscriptions with ample demand on a connection that reads
  nothing;
* :func:`foreign_origins`: upgrades from a foreign ``Origin``;
* :func:`healthz`: not an attack, the probe beside one: the slowest ``/healthz`` answer.
"""

from __future__ import annotations

import asyncio
import http.client
import time

import aiohttp

from raw_wire import deflated_subscribes, tube_close_code, tube_opened_or_refused
from tidewire.protocols.rsio import ClientHello, Subscribe, encode
from tidewire.protocols.tube import CODE_PLAIN, encode_header, push_varint

__all__ = ["ATTACK_SECONDS", "deflate_bomb", "foreign_origins", "healthz",
           "never_reading", "tiny_fragments", "unfinished"]  # fmt: skip

MiB = 1024 * 1024
ATTACK_SECONDS = 30.0
"""How long any one attack may take before it is cut short (it fails, rather than hangs)."""


async def deflate_bomb(url: str) -> tuple[int, int | None, float]:
    """One anonymous Tube message of about 16 KB inflating to 8 MiB of RS.io subscribes to a
    bad stream name (each refused): its size, the hub's close code, and how long it took."""
    bomb = deflated_subscribes(8 * MiB)
    async with aiohttp.ClientSession() as session:
        began = time.monotonic()
        ws = await tube_opened_or_refused(session, url)
        if isinstance(ws, int):  # (the anonymous share was already full: refused at once)
            return len(bomb), ws, time.monotonic() - began
        await ws.send_bytes(encode_header(CODE_PLAIN, 1) + encode(ClientHello()))
        await ws.send_bytes(bomb)
        async with asyncio.timeout(ATTACK_SECONDS):
            code = await tube_close_code(ws)
        return len(bomb), code, time.monotonic() - began


async def unfinished(url: str, connections: int, fragments: int) -> list[int | None]:
    """``connections`` anonymous Tube connections, each beginning a message of 400 fragments
    of 64 KiB, sending ``fragments`` of them and then nothing: each one's close code."""
    fragment = bytes(64 * 1024)
    async with aiohttp.ClientSession() as session:

        async def one() -> int | None:
            ws = await tube_opened_or_refused(session, url)
            if isinstance(ws, int):  # (the anonymous share was already full: refused at once)
                return ws
            await ws.send_bytes(encode_header(CODE_PLAIN, 400) + fragment[:-3])
            for _ in range(fragments - 1):
                await ws.send_bytes(fragment)
            return await tube_close_code(ws)

        async with asyncio.timeout(ATTACK_SECONDS):
            return list(await asyncio.gather(*(one() for _ in range(connections))))


async def tiny_fragments(url: str, connections: int) -> list[int | None]:
    """Peers asking the hub for 8-byte fragments: each one's close code."""
    async with aiohttp.ClientSession() as session:

        async def one() -> int | None:
            ws = await session.ws_connect(url)
            await ws.send_bytes(push_varint(8))
            return await tube_close_code(ws)

        async with asyncio.timeout(ATTACK_SECONDS):
            return list(await asyncio.gather(*(one() for _ in range(connections))))


async def never_reading(url: str, subscriptions: int, seconds: float,
                        stream: str = "big") -> None:  # fmt: skip
    """One anonymous Tube connection subscribing ``subscriptions`` times to ``stream`` from
    its start with ample demand and reading nothing for ``seconds``."""
    async with aiohttp.ClientSession() as session:
        ws = await tube_opened_or_refused(session, url)
        if isinstance(ws, int):  # (the anonymous share was already full: refused at once)
            return
        frames = encode(ClientHello()) + b"".join(
            encode(Subscribe(f"{stream}?from=earliest", i, 10_000)) for i in range(subscriptions)
        )
        await ws.send_bytes(encode_header(CODE_PLAIN, 1) + frames)
        await asyncio.sleep(seconds)  # (the attack: not reading, for this long)
        await ws.close()


async def foreign_origins(url: str, origin: str, times: int) -> list[int]:
    """Upgrades with ``Origin: origin``: each one's HTTP status (101 when let in)."""
    statuses: list[int] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(times):
            try:
                ws = await session.ws_connect(url, headers={"Origin": origin})
            except aiohttp.WSServerHandshakeError as refused:
                statuses.append(refused.status)
            else:
                statuses.append(101)
                await ws.close()
    return statuses


async def healthz(base: str, seconds: float) -> float:
    """``GET /healthz`` every 20 ms for ``seconds`` (in a thread, as the bystander: the
    attacker's work in this loop is not the hub's): the slowest answer, in seconds."""
    host, port = base.removeprefix("http://").split(":")

    def probe() -> float:
        slowest = 0.0
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                began = time.monotonic()
                connection.request("GET", "/healthz")
                answer = connection.getresponse()
                answer.read()
                assert answer.status == 200
                slowest = max(slowest, time.monotonic() - began)
                time.sleep(0.02)
        finally:
            connection.close()
        return slowest

    return await asyncio.to_thread(probe)
