"""The RS.io-over-TCP listener: a thin asyncio carrier between a socket and an
:class:`~tidewire.server.rsio_session.RsioSession` (which drives the sans-IO
:class:`~tidewire.protocols.rsio.Connection` and the :class:`~tidewire.hub.Hub`).

:class:`RsioServerProtocol` is the ``asyncio.Protocol`` behind the guard: bytes read (a view
into the listener's reused receive buffer: the guard is a ``BufferedProtocol``) go to the
session; the session's chunks go out with one ``writelines`` (uvloop: one ``writev``, no copy);
the transport's write-buffer water marks (high: ``WRITE_HIGH_WATER``) pause and resume the
session's pumps, so a slow reader holds a bounded buffer and a position in the log, never a
backlog in memory. It is :class:`~.guard.Receiving` (a frame left unfinished for
``limits.message_seconds`` ends the connection) and tells the session its output's size.
:class:`RsioServer` is the listener and the registry of live sessions.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, cast

from ..hub import Hub
from ..hub.access import Access
from ..protocols.rsio import EXT_AUTH, EXT_PUBLISH, PROTOCOL_VERSION, Goodbye, ServerHello, encode
from .guard import Admission, ConnectionLimits, Listener, established, refused
from .rsio_offers import OFFER_WINDOW
from .rsio_session import (
    MAX_DELIVERY_BYTES,
    MAX_INLET_BYTES,
    MAX_OFFERS,
    MAX_SUBSCRIPTIONS,
    MAX_TXN_BYTES,
    RsioSession,
    RsioSettings,
)

__all__ = [
    "MAX_DELIVERY_BYTES",
    "MAX_INLET_BYTES",
    "MAX_OFFERS",
    "MAX_SUBSCRIPTIONS",
    "MAX_TXN_BYTES",
    "OFFER_WINDOW",
    "RsioServer",
    "RsioServerProtocol",
    "RsioSession",
    "RsioSettings",
    "start_rsio_server",
]

WRITE_HIGH_WATER = 4 * 1024 * 1024


class RsioServerProtocol(asyncio.Protocol):
    """One RS.io connection over TCP: the carrier of :attr:`session`."""

    def __init__(self, session: RsioSession) -> None:
        self.session = session
        self.transport: asyncio.Transport | None = None

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.session.start(self)

    def data_received(self, data: bytes) -> None:
        # (a view into the listener's reused buffer: Listener(buffered=True))
        self.session.receive_data(data)

    def eof_received(self) -> bool | None:
        self.session.receive_data(b"")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.session.connection_lost()

    def pause_writing(self) -> None:
        self.session.pause_writing()

    def resume_writing(self) -> None:
        self.session.resume_writing()

    def expire(self, reason: str) -> None:
        """A deadline of the guard's (handshake, idle): goodbye with the reason, and close."""
        self.session.expire(reason)

    def receiving_since(self) -> float | None:
        """The guard's :class:`~.guard.Receiving`: since when a frame waits unfinished (the
        guard ends the connection after ``limits.message_seconds``)."""
        return self.session.receiving_since()

    # ------------------------------------------------------------------ Carrier

    def write_chunks(self, chunks: list[bytes | memoryview]) -> None:
        transport = self.transport
        if transport is None:
            return
        if len(chunks) == 1:
            transport.write(chunks[0])
        else:
            transport.writelines(chunks)  # uvloop: one writev, no copy

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def get_write_buffer_size(self) -> int:
        """Bytes written and not yet sent (charged to the budget as ``"outbound"``)."""
        return 0 if self.transport is None else self.transport.get_write_buffer_size()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The transport's (``peername``, ``guard``, TLS facts)."""
        return default if self.transport is None else self.transport.get_extra_info(name, default)

    def established(self) -> None:
        established(self.transport)

    def refused(self) -> None:
        refused(self.transport)


class RsioServer:
    """The listener (behind the guard: TLS, connection limits, deadlines) and its live
    sessions (so that shutdown can say goodbye to each)."""

    def __init__(
        self,
        hub: Hub,
        settings: RsioSettings | None = None,
        *,
        access: Access | None = None,
        admission: Admission | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.hub = hub
        self.settings = settings or RsioSettings()
        self.access = access if access is not None else Access()
        self.connections: set[RsioSession] = set()
        self.listener = Listener(
            "rsio", self._protocol, admission or Admission(ConnectionLimits()), tls=tls,
            refuse=_refusal, buffered=True,  # (the session's decoder copies what it keeps)
        )  # fmt: skip
        hub.metrics.listeners.append(self.listener)

    def _protocol(self) -> RsioServerProtocol:
        session = RsioSession(self.hub, self.connections, self.settings, access=self.access)
        return RsioServerProtocol(session)

    @property
    def port(self) -> int:
        return self.listener.port

    def quiesce(self) -> None:
        """Stop listening and stop reading every connection (see :meth:`RsioSession.
        quiesce`); :meth:`close` then says goodbye."""
        self.listener.close()
        for session in self.connections:
            session.quiesce()

    @property
    def busy(self) -> bool:
        return any(session.busy for session in self.connections)

    async def close(self) -> None:
        """Stop listening, say goodbye to every connection and close it."""
        self.listener.close()
        for session in list(self.connections):
            session.shutdown("server shutting down")
        await self.listener.wait_closed()


def _refusal(reason: str) -> bytes:
    """What a connection refused at admission gets: the hub's hello, then goodbye."""
    return bytes(encode(ServerHello(PROTOCOL_VERSION, (EXT_PUBLISH, EXT_AUTH)))
                 + encode(Goodbye(reason)))  # fmt: skip


async def start_rsio_server(
    hub: Hub,
    host: str,
    port: int,
    settings: RsioSettings | None = None,
    *,
    access: Access | None = None,
    admission: Admission | None = None,
    tls: ssl.SSLContext | None = None,
) -> RsioServer:
    """Listen for RS.io over TCP (over TLS with ``tls``) on ``host:port`` (0 = any free port)."""
    rsio = RsioServer(hub, settings, access=access, admission=admission, tls=tls)
    await rsio.listener.start(host, port)
    return rsio
