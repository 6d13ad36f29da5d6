"""An in-process hub with a Seguro listener on 127.0.0.1, and the raw ship's steps the Seguro
tests share (tests/security and tests/server): one copy of each.

* :func:`seguro_hub`: a hub on a temporary directory with its Seguro server (TLS, an ACL, a
  memory budget, the guard's and Seguro's limits as a test asks), bounded in time, closed on
  exit;
* :func:`point`: a raw ship's handshake up to its ``POINT``; :func:`closed`: what the hub says
  until it drops the connection; :func:`still_works`: a ship's save and read still answered.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from tidewire.client.seguro import SeguroClient, SeguroError
from tidewire.hub import Budget, BudgetLimits, Hub
from tidewire.hub.access import Access, Acl
from tidewire.protocols.seguro import Limits
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.seguro import SeguroServer, start_seguro_server

__all__ = ["HOST", "REFUSED", "Setup", "closed", "point", "seguro_hub", "still_works"]

HOST = "127.0.0.1"
REFUSED = (SeguroError, OSError)  # dropped: EOF, a reset, or a TLS alert (ssl.SSLError)


@dataclass
class Setup:
    """The hub and its Seguro server."""

    hub: Hub
    server: SeguroServer

    @property
    def url(self) -> str:
        return f"seguro://{HOST}:{self.server.port}"


@asynccontextmanager
async def seguro_hub(
    path: Path,
    *,
    tls: ssl.SSLContext | None = None,
    acl: str | None = None,
    budget: BudgetLimits | None = None,
    limits: ConnectionLimits | None = None,
    seguro_limits: Limits | None = None,
    seconds: float = 20.0,
) -> AsyncIterator[Setup]:
    """A hub on ``path / "hub"`` with a Seguro server on 127.0.0.1 (any free port); the block
    is bounded by ``seconds``; both are closed on exit."""
    hub = Hub.open(str(path / "hub"))
    if budget is not None:
        hub.budget = Budget(budget)
    access = Access(Acl.parse(acl)) if acl is not None else None
    admission = Admission(limits or ConnectionLimits())
    server = await start_seguro_server(hub, HOST, 0, seguro_limits, access=access,
                                       admission=admission, tls=tls)  # fmt: skip
    try:
        async with asyncio.timeout(seconds):
            yield Setup(hub, server)
    finally:
        await server.close()
        await hub.close()


async def point(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str) -> None:
    """A raw ship's handshake up to its POINT (it waits for each reply, as it must)."""
    assert await reader.readline() == b"SEGURO 0\n"
    writer.write(b"HELLO 0\n")
    assert await reader.readline() == b"IDENTIFY 0\n"
    writer.write(b"POINT %s\n" % name.encode())


async def closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the hub says until it closes the connection."""
    got = bytearray()
    try:
        while data := await reader.read(65536):
            got += data
    except (ConnectionError, ssl.SSLError):
        pass
    return bytes(got)


async def still_works(client: SeguroClient, event_id: int) -> None:
    """``client`` saves an event at ``event_id`` and reads it back."""
    await client.save(event_id, b"still here")
    events, _ = await client.read(event_id, 1)
    assert events == [(event_id, b"still here")]
