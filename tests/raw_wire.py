"""Raw bytes on the wire for the tests that speak to a hub as a hostile peer would (tests/server
and tests/security): one copy of each small piece they share.

* RS.io: :data:`RSIO_HELLO` (a client's hello listing extensions 1 and 2), :func:`varint`, and
  :func:`decode_rsio` (every message in what a hub sent, decoded as a client would);
* Tube: :func:`tube_opened` (a raw WebSocket past the fragment-size exchange),
  :func:`tube_close_code` (read until the hub closes) and :func:`deflated_subscribes` (a
  deflated Tube message of refused subscribes: the deflate bomb of issue 20).
"""

from __future__ import annotations

import asyncio
import zlib

import aiohttp

from tidewire.protocols.rsio import ClientHello, Decoder, Subscribe, encode
from tidewire.protocols.rsio.varint import push_varint
from tidewire.protocols.tube import CODE_DEFLATE, encode_header

__all__ = ["RSIO_HELLO", "decode_rsio", "deflated_subscribes", "tube_close_code",
           "tube_opened", "varint"]  # fmt: skip

RSIO_HELLO = bytes(encode(ClientHello(0, (1, 2))))
CLOSED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED)


def varint(n: int) -> bytes:
    """``n`` as RS.io's unsigned varint."""
    out = bytearray()
    push_varint(out, n)
    return bytes(out)


def decode_rsio(data: bytes) -> list[object]:
    """Every whole RS.io message in ``data`` (what a hub sent a client)."""
    decoder = Decoder(publishing=True, auth=True)
    decoder.feed(data)
    out: list[object] = []
    while (message := decoder.next_message()) is not None:
        out.append(message)
    return out


async def tube_opened(session: aiohttp.ClientSession, url: str,
                      size: bytes = b"\x00") -> aiohttp.ClientWebSocketResponse:  # fmt: skip
    """A raw WebSocket past Tube's fragment-size exchange (this side asks for ``size``; the
    hub's answer within 10 seconds)."""
    ws = await session.ws_connect(url)
    await ws.send_bytes(size)
    message = await ws.receive(timeout=10)
    assert message.type == aiohttp.WSMsgType.BINARY, message
    return ws


async def tube_opened_or_refused(
    session: aiohttp.ClientSession, url: str, size: bytes = b"\x00"
) -> aiohttp.ClientWebSocketResponse | int:
    """As :func:`tube_opened`, for an attacker whose principal's share may already be full:
    the hub's close code when it refuses the fragment-size exchange (1009), else the socket."""
    ws = await session.ws_connect(url)
    await ws.send_bytes(size)
    message = await ws.receive(timeout=10)
    if message.type == aiohttp.WSMsgType.CLOSE:
        return int(message.data)
    assert message.type == aiohttp.WSMsgType.BINARY, message
    return ws


async def tube_close_code(ws: aiohttp.ClientWebSocketResponse,
                          seconds: float | None = None) -> int | None:  # fmt: skip
    """Read and drop until the hub closes (within ``seconds``, when given); its close code."""
    async with asyncio.timeout(seconds):
        while (await ws.receive()).type not in CLOSED:
            pass
    return ws.close_code


def deflated_subscribes(inflated: int) -> bytes:
    """A Tube message: ``inflated`` bytes of RS.io subscribes to a bad stream name (each one
    refused), deflated (about 2 KB a MiB)."""
    frame = encode(Subscribe("bad name!", 1, 1))
    return encode_header(CODE_DEFLATE, 1) + zlib.compress(frame * (inflated // len(frame)), 9)
