"""Attacks on a hub's Seguro listener (issue 20), as raw ships on 127.0.0.1. Each takes the
listener's port, is bounded in time (``asyncio.timeout``) and in what it sends, closes every
connection it opens (or hands it to its caller to close, where holding it open is the attack),
and returns what the hub answered.

* :func:`huge_event`: an event declared far larger than a connection's memory share, its data
  sent as fast as the hub takes it;
* :func:`unfinished_event`: an event declared within the share and never finished;
* :func:`squatter`: a principal that may only read a point, taking it again and again while its
  owner saves.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import Counter

from seguro_hub import HOST, closed, point

__all__ = ["huge_event", "raw_session", "squatter", "unfinished_event"]

MiB = 1024 * 1024


async def raw_session(port: int, name: str, ctx: ssl.SSLContext | None = None
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:  # fmt: skip
    """A raw ship's handshake: the reader, the writer, and the hub's answer to POINT (the
    WELCOME line, or ``b""`` when it dropped the connection)."""
    reader, writer = await asyncio.open_connection(HOST, port, ssl=ctx)
    await point(reader, writer, name)
    try:
        return reader, writer, await reader.readline()
    except (ConnectionError, ssl.SSLError):
        return reader, writer, b""


async def huge_event(port: int, name: str, declared: int = 60 * MiB, *,
                     ctx: ssl.SSLContext | None = None) -> int:  # fmt: skip
    """``SAVE`` of ``declared`` bytes on ``name`` and its data as fast as the hub takes it (for
    10 s at most): the bytes sent before the hub dropped the connection."""
    reader, writer, said = await raw_session(port, name, ctx)
    assert said == b"WELCOME %s\n" % name.encode()
    sent = 0
    writer.write(b"SAVE 1 %d\n" % declared)
    chunk = b"d" * MiB
    try:
        async with asyncio.timeout(10):
            while sent < declared and not writer.is_closing():
                # (a closed transport takes writes without a word: stop at the hub's drop)
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
    except (ConnectionError, ssl.SSLError, TimeoutError):
        pass
    async with asyncio.timeout(10):
        assert b"COMMITTED" not in await closed(reader)
    writer.close()
    return sent


async def unfinished_event(port: int, name: str, held: list[asyncio.StreamWriter], *,
                           declared: int = 3 * MiB, sent: int = 2 * MiB,
                           ctx: ssl.SSLContext | None = None) -> bool:  # fmt: skip
    """``SAVE`` of ``declared`` bytes on ``name`` with ``sent`` of them, then nothing: True when
    the hub took the declaration (the connection stays open, waiting; its writer is appended to
    ``held`` for the caller to close), False when it dropped it (closed here)."""
    reader, writer, said = await raw_session(port, name, ctx)
    assert said == b"WELCOME %s\n" % name.encode()
    writer.write(b"SAVE 1 %d\n" % declared + b"u" * sent)
    await writer.drain()
    try:
        async with asyncio.timeout(1.0):
            dropped = await reader.read(1) == b""
    except TimeoutError:
        dropped = False
    except (ConnectionError, ssl.SSLError):
        dropped = True
    if dropped:
        writer.close()
    else:
        held.append(writer)
    return not dropped


async def squatter(port: int, name: str, ctx: ssl.SSLContext | None, stop: asyncio.Event,
                   outcomes: Counter[str], *, hold: float = 10.0) -> None:  # fmt: skip
    """Until ``stop``: take the point ``name`` (a session of a principal that may only read
    it) and hold it until the hub drops it, at most ``hold`` seconds each time. Counts in
    ``outcomes``: ``welcomed`` (it got the point), ``displaced`` (then dropped by the hub),
    ``refused`` (the owner held it)."""
    while not stop.is_set():
        reader, writer, said = await raw_session(port, name, ctx)
        try:
            if not said.startswith(b"WELCOME"):
                outcomes["refused"] += 1  # the owner holds the point
                await asyncio.sleep(0.02)  # (a flood of connections is the guard's test)
                continue
            outcomes["welcomed"] += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(hold):
                    await closed(reader)  # holds it, until the owner comes
                    outcomes["displaced"] += 1
        finally:
            writer.close()
