"""The asyncio Seguro client: ``async with tidewire.client.seguro.connect(url, "~zod") as ship``.

One connection is one point's session (the handshake runs in ``connect``); flows run one at a
time, as the seed requires: ``save`` returns once the hub said COMMITTED, ``save_many`` once it
said COMMITTED MANY (``latest`` follows the LATEST notifications meanwhile), ``read`` returns
the events and the SENT summary.

TLS: ``seguros://host:port`` (or ``ssl=`` a client context with ``seguro://``). The hub's
certificate is always verified, host name included; a context with a client certificate
(mutual TLS) proves the point: its subject CN must be the point's ``@p``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as _ssl
from collections.abc import Generator, Sequence
from typing import Any
from urllib.parse import urlsplit

from ..model import TidewireError
from ..protocols.seguro import (
    Breach,
    ClientSession,
    Committed,
    CommittedMany,
    ManyEvent,
    Sent,
    Welcome,
)

__all__ = ["SeguroClient", "SeguroError", "connect"]


class SeguroError(TidewireError):
    """The hub broke the protocol, or dropped the connection (Seguro has no error replies)."""


class SeguroClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 point: str) -> None:  # fmt: skip
        self.reader = reader
        self.writer = writer
        self.session = ClientSession(point)
        self.welcome: Welcome | None = None

    @property
    def latest(self) -> int:
        """The highest id the hub said is committed (0 if none)."""
        return self.session.latest

    async def _until(self, kinds: tuple[type, ...]) -> list[Any]:
        """Events until one of ``kinds`` (inclusive)."""
        self._flush()
        got: list[Any] = []
        while True:
            event = self.session.next_event()
            if event is None:
                try:
                    data = await self.reader.read(1 << 20)
                except (ConnectionError, _ssl.SSLError) as exc:
                    raise SeguroError(f"the connection failed: {exc}") from None
                self.session.receive_data(data)
                if not data and self.session.next_event() is None:
                    raise SeguroError("the hub closed the connection (a breach, the point has "
                                      "a session already, or this peer was refused)")  # fmt: skip
                continue
            if isinstance(event, Breach):
                raise SeguroError(f"the hub broke the protocol: {event.reason}")
            got.append(event)
            self._flush()
            if isinstance(event, kinds):
                return got

    def _flush(self) -> None:
        data = self.session.data_to_send()
        if data:
            self.writer.write(data)

    async def handshake(self) -> Welcome:
        (*_, welcome) = await self._until((Welcome,))
        self.welcome = welcome
        return welcome  # type: ignore[no-any-return]

    async def save(self, event_id: int, data: bytes) -> None:
        self.session.save(event_id, data)
        await self._until((Committed,))

    async def save_many(self, events: Sequence[tuple[int, bytes]]) -> None:
        self.session.save_many(events)
        await self._until((CommittedMany,))

    async def read(self, start: int, limit: int) -> tuple[list[tuple[int, bytes]], Sent]:
        self.session.read(start, limit)
        got = await self._until((Sent,))
        return [(e.id, e.data) for e in got if isinstance(e, ManyEvent)], got[-1]

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class _Connect:
    def __init__(self, url: str, point: str, ssl: _ssl.SSLContext | None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("seguro", "seguros") or not parts.hostname:
            raise ValueError(f"not a seguro:// or seguros:// URL: {url!r}")
        self.host, self.port, self.point = parts.hostname, parts.port or 7403, point
        if ssl is None and parts.scheme == "seguros":
            ssl = _ssl.create_default_context()  # the system's CAs; verifies the host name
            ssl.minimum_version = _ssl.TLSVersion.TLSv1_2
        self.ssl = ssl
        self.client: SeguroClient | None = None

    async def _open(self) -> SeguroClient:
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20,
                                                       ssl=self.ssl)  # fmt: skip
        client = SeguroClient(reader, writer, self.point)
        try:
            await client.handshake()
        except BaseException:
            await client.close()
            raise
        return client

    def __await__(self) -> Generator[Any, None, SeguroClient]:
        return self._open().__await__()

    async def __aenter__(self) -> SeguroClient:
        self.client = await self._open()
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.close()


def connect(url: str, point: str, *, ssl: _ssl.SSLContext | None = None) -> _Connect:
    """A Seguro session for ``point`` at ``seguro://host:port`` (handshake included).

    ``ssl``: a client context (TLS; ``seguros://`` without one uses the system's CAs). The
    hub's certificate and host name are verified; for mutual TLS the context's certificate
    must name ``point`` (its subject CN)."""
    return _Connect(url, point, ssl)
