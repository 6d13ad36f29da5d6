"""Every listener's front door: TLS, connection limits and the timers that drop abusive peers.

A :class:`Listener` wraps a protocol factory (RS.io's, Seguro's, Tolliver's, aiohttp's request
handler). Each accepted socket gets a :class:`GuardedConnection`, which is the loop's protocol
and, towards the wrapped protocol, its transport: the wrapped protocol never knows it is
guarded, except that it may call :func:`established` when its handshake is over.

What the guard enforces (settings ``limits.*`` and ``tls.*``, docs/configuration.md):

* **Admission**: connections in total and per peer (a network prefix: /32 for IPv4, /64 for
  IPv6 by default), counted over every listener together (:class:`Admission`). One over is
  refused with the protocol's own words (the listener's ``refuse(reason)`` bytes: an RS.io
  ``goodbye``, an HTTP 503), then closed.
* **TLS**, done here over memory BIOs rather than by ``create_server(ssl=...)`` so that a
  failed handshake (an untrusted or expired certificate, no certificate where one is required,
  plain text on a TLS port) is logged as one line naming the peer (asyncio logs those only in
  debug mode), the same on asyncio and uvloop. The standard library's :mod:`ssl` (OpenSSL)
  does the cryptography; only the plumbing is ours.
* **Handshake deadline**: TLS plus the protocol's own handshake (RS.io hellos, Seguro's
  ``POINT``, Tolliver's handshake, HTTP request headers: slowloris) must finish within
  ``limits.handshake_seconds``.
* **Idle**: nothing received and nothing sent for ``limits.idle_seconds``.
* **Unfinished messages**: a wrapped protocol that is :class:`Receiving` and has had a message
  begun and unfinished for ``limits.message_seconds``.
* **Refusals linger**: a wrapped protocol that refuses its peer says so with :func:`refused`;
  its close (or abort) then waits ``limits.refusal_close_seconds`` with reading paused (what
  it wrote, the refusal's words, still goes out), as Kafka delays the close of a failed
  authentication: a peer refused and reconnecting at once cannot make the hub accept, refuse
  and close connections at the pace of its own loop (its lingering connections count against
  the connection limits meanwhile).
* **Stalled output**: a peer that does not read while we have output for it (the transport
  stays above its high-water mark) for ``limits.write_stall_seconds`` is aborted: it cannot be
  told why, since it is not reading.

Deadlines are checked by :meth:`Listener.sweep`, which takes the time as an argument; the
listener calls it from one task about every second (``loop.time()``), tests call it with a fake
clock. A wrapped protocol with an ``expire(reason)`` method (RS.io: ``goodbye``) is asked to
end its connection in its own words; otherwise the transport is closed.

The TLS contexts (:mod:`.tls`: :func:`server_context`, :func:`client_context`; certificates
always verified, never skipped) and the connection counts (:mod:`.admission`) are their own
modules, re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast, runtime_checkable

from ..observe.logs import ConnectionContext, ConnectionLog
from .admission import Admission, ConnectionLimits
from .tls import TlsSettings, client_context, peer_certificate, server_context, tls_reason

__all__ = ["READ_BYTES", "Admission", "BufferedGuardedConnection", "ConnectionLimits", "Expirable",
           "GuardedConnection", "Listener", "Receiving", "TlsSettings", "client_context",
           "established", "peer_certificate", "refused", "server_context"]  # fmt: skip

log = logging.getLogger("tidewire.guard")


@runtime_checkable
class Expirable(Protocol):
    """A wrapped protocol that can end its connection in its own words."""

    def expire(self, reason: str) -> None: ...


@runtime_checkable
class Receiving(Protocol):
    """A wrapped protocol that knows when the inbound message it is receiving began."""

    def receiving_since(self) -> float | None:
        """``loop.time()`` when the unfinished inbound message's first byte (or header)
        arrived; ``None`` when no message is unfinished."""
        ...


class _State(enum.Enum):
    TLS = "tls"  # the TLS handshake runs
    HANDSHAKE = "handshake"  # the protocol's own handshake runs
    OPEN = "open"
    CLOSED = "closed"


_serials = itertools.count(1)

READ_BYTES = 256 * 1024
"""A buffered listener's receive buffer (the most one read hands over; uvloop's own size)."""

MAX_TLS_REFUSALS = 64
"""Refused connections a TLS listener handshakes with at once to tell them why; beyond it they
are closed without a word."""


class Listener:
    """One listening socket's guard: see the module docstring."""

    def __init__(
        self,
        name: str,
        factory: Callable[[], asyncio.BaseProtocol],
        admission: Admission,
        *,
        tls: ssl.SSLContext | None = None,
        refuse: Callable[[str], bytes] | None = None,
        expire: Callable[[GuardedConnection, str], None] | None = None,
        buffered: bool = False,
    ) -> None:
        """``buffered``: the loop reads into one buffer of the listener's, reused (no ``bytes``
        allocated per read), and the wrapped protocol's ``data_received`` gets a view of it,
        valid for the call only: only for protocols that copy what they keep (RS.io's)."""
        self.name = name
        self.factory = factory
        self.admission = admission
        self.limits = admission.limits
        self.tls = tls
        self.refuse = refuse
        self.expire = expire
        self.connections: set[GuardedConnection] = set()
        self.server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.refused = 0  # connections refused at admission (for tests and metrics)
        self.refusing = 0  # refused connections in their TLS handshake (to be told why)
        # One receive buffer for all the listener's connections: a read is handled in full
        # (copied where it is kept) before the loop asks for the buffer again.
        self.read_buffer = memoryview(bytearray(READ_BYTES)) if buffered else None

    def protocol(self) -> GuardedConnection:
        if self.read_buffer is not None:
            return BufferedGuardedConnection(self)
        return GuardedConnection(self)

    def open_connections(self) -> Iterator[GuardedConnection]:
        """The admitted connections, still open (the metrics and the admin API)."""
        return (c for c in list(self.connections) if c.admitted)

    async def start(self, host: str, port: int, **kwargs: Any) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self.protocol, host, port, **kwargs)
        self._sweeper = asyncio.create_task(self._sweep_forever())
        return self.server

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _sweep_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            self.sweep(loop.time())

    def sweep(self, now: float) -> None:
        """Drop every connection past a deadline at time ``now`` (``loop.time()``)."""
        for conn in list(self.connections):
            conn.check(now)

    def close(self) -> None:
        """Stop listening. Connections still in the TLS handshake are aborted; the others are
        the wrapped protocols' to end (each in its own words)."""
        if self.server is not None:
            self.server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            if conn.inner is None:
                conn.abort()
                conn._closed()

    async def wait_closed(self) -> None:
        if self._sweeper is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self.server is not None:
            await self.server.wait_closed()


class GuardedConnection(asyncio.BaseProtocol, asyncio.Transport):
    """The loop's protocol for one socket, and the wrapped protocol's transport.

    (An ``asyncio.Protocol`` by its methods, not by its class: uvloop reads into a protocol's
    buffer only if it is not an ``asyncio.Protocol`` instance, see
    :class:`BufferedGuardedConnection`.)

    TLS runs here on :class:`ssl.SSLObject` over memory BIOs (sans-IO TLS): ciphertext from
    the socket goes in, plaintext goes to the wrapped protocol, and what it writes is encrypted
    straight onto the socket's transport, so flow control (``pause_writing``) and the write
    buffer are the socket's own. Doing it here rather than with ``loop.start_tls`` gives the
    same behaviour on asyncio and uvloop (whose server-side ``start_tls`` hands the client's
    first bytes to the old protocol) and a log line for every failed handshake.
    """

    def __init__(self, listener: Listener) -> None:
        asyncio.Transport.__init__(self)
        self.serial = next(_serials)  # the connection's id in this process, in accept order
        self.listener = listener
        self.inner: asyncio.BaseProtocol | None = None
        self.raw: asyncio.Transport | None = None  # the socket's transport
        self.tls: ssl.SSLObject | None = None
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.host = "?"
        self.peer = "?"
        # Every line about the connection carries its id, protocol and peer (observe.logs); the
        # wrapped protocol logs on the same context, setting its protocol and principal.
        self.context = ConnectionContext(self.serial, listener.name, "?")
        self.log = ConnectionLog(log, self.context)
        self.opened_at = time.time()
        self.bytes_in = 0  # on the wire (TLS included)
        self.bytes_out = 0
        self.state = _State.TLS
        self.started = 0.0
        self.deadline: float | None = None  # the handshake (or an HTTP request's headers)
        self.deadline_reason = ""
        self.last_active = 0.0
        self.active = False  # bytes moved since the last sweep
        self.stalled_since: float | None = None  # output paused (the peer does not read)
        self.admitted = False
        self.refusing: str | None = None  # refused at admission: the reason, said after TLS
        self.lingers = False  # refused by the wrapped protocol: its close waits (refused())
        self.lingering = False  # ... and it waits now

    # ------------------------------------------------------------------ towards the loop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = cast(asyncio.Transport, transport)
        peername = transport.get_extra_info("peername")
        self.host = str(peername[0]) if isinstance(peername, tuple) else str(peername)
        self.peer = self.context.peer = _peer(peername)
        listener = self.listener
        now = asyncio.get_running_loop().time()
        self.started = self.last_active = now
        reason = listener.admission.admit(self.host)
        if reason is not None:
            listener.refused += 1
            self.log.warning("refused: %s", reason)
            if listener.refuse is not None and listener.tls is None:
                self.raw.write(listener.refuse(reason))
            elif listener.refuse is not None and listener.refusing < MAX_TLS_REFUSALS:
                assert listener.tls is not None
                # Over TLS the refusal can only be said after a handshake: do it, for a few
                # at a time (a flood of refused peers must not buy handshakes by the thousand).
                listener.refusing += 1
                self.refusing = reason
                listener.connections.add(self)  # for the handshake deadline
                self.deadline = now + (listener.limits.handshake_seconds or 10.0)
                self.deadline_reason = "no TLS handshake (refused connection)"
                self.tls = listener.tls.wrap_bio(self._incoming, self._outgoing, server_side=True)
                return
            self.state = _State.CLOSED
            self.raw.close()
            return
        self.admitted = True
        listener.connections.add(self)
        if listener.limits.handshake_seconds > 0:
            self.deadline = now + listener.limits.handshake_seconds
            self.deadline_reason = f"no handshake within {listener.limits.handshake_seconds:g}s"
        if listener.tls is not None:
            self.tls = listener.tls.wrap_bio(self._incoming, self._outgoing, server_side=True)
        else:
            self._open()

    def _open(self) -> None:
        self.state = _State.HANDSHAKE
        self.inner = self.listener.factory()
        self.inner.connection_made(self)

    @property
    def protocol(self) -> str:
        """What the connection speaks (the listener's name, or ``tube`` once upgraded)."""
        return self.context.protocol

    @property
    def principal(self) -> str | None:
        return self.context.principal

    @property
    def secure(self) -> bool:
        return self.tls is not None

    def data_received(self, data: bytes) -> None:
        self._received(data)

    def _received(self, data: bytes | memoryview) -> None:
        self.active = True
        self.bytes_in += len(data)
        if self.tls is None:
            if self.inner is not None:
                # (a view only on a buffered listener, whose protocols take bytes-likes)
                cast(asyncio.Protocol, self.inner).data_received(cast(bytes, data))
            return
        self._incoming.write(data)
        if self.state is _State.TLS and not self._handshake():
            return
        if self.inner is None:  # refused, and told so: nothing more is read
            return
        eof = False
        chunks: list[bytes] = []
        while True:
            try:
                chunk = self.tls.read(256 * 1024)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the peer's close_notify
                eof = True
                break
            except ssl.SSLError as exc:
                self.log.warning("TLS error: %s", tls_reason(exc))
                self.abort()
                return
            if not chunk:  # SSLObject.read() gives b"" for the peer's close_notify
                eof = True
                break
            chunks.append(chunk)
        self._send_tls()  # post-handshake records (session tickets, key updates)
        inner = cast(asyncio.Protocol, self.inner)
        for chunk in chunks:
            if self.state is _State.CLOSED:
                return
            inner.data_received(chunk)
        if eof and self.state is not _State.CLOSED and not inner.eof_received():
            self.close()

    def _handshake(self) -> bool:
        """Advance the TLS handshake; True once it is done (the protocol then starts)."""
        assert self.tls is not None
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            self._send_tls()
            return False
        except (ssl.SSLError, OSError) as exc:
            self.log.warning("TLS handshake failed: %s", tls_reason(exc))
            self._send_tls()  # the alert, so the peer knows why
            if self.raw is not None:
                self.raw.close()
            self._closed()
            return False
        self._send_tls()
        if self.refusing is not None:  # refused at admission: say why, in the protocol's words
            assert self.listener.refuse is not None
            self.state = _State.OPEN
            self.write(self.listener.refuse(self.refusing))
            self.close()
            return False
        self._open()
        return self.state is not _State.CLOSED

    def _send_tls(self) -> None:
        if self._outgoing.pending and self.raw is not None and not self.raw.is_closing():
            data = self._outgoing.read()
            self.bytes_out += len(data)
            self.raw.write(data)

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return cast(asyncio.Protocol, self.inner).eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.stalled_since = asyncio.get_running_loop().time()
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.stalled_since = None
        if self.inner is not None:
            self.inner.resume_writing()

    def _closed(self) -> None:
        self.state = _State.CLOSED
        self.listener.connections.discard(self)
        if self.admitted:
            self.admitted = False
            self.listener.admission.release(self.host)
        if self.refusing is not None:
            self.refusing = None
            self.listener.refusing -= 1

    # ------------------------------------------------------------------ deadlines

    def established(self) -> None:
        """The protocol's handshake is over: the handshake deadline no longer applies."""
        if self.state is _State.HANDSHAKE:
            self.state = _State.OPEN
        self.deadline = None

    def expect(self, seconds: float, reason: str) -> None:
        """Something (an HTTP request's headers) must arrive within ``seconds`` from now."""
        if seconds > 0:
            self.deadline = asyncio.get_running_loop().time() + seconds
            self.deadline_reason = reason

    def check(self, now: float) -> None:
        """End the connection if it is past a deadline at ``now``."""
        if self.state is _State.CLOSED:
            return
        limits = self.listener.limits
        if self.active:
            self.active = False
            self.last_active = now
        stall = limits.write_stall_seconds
        if self.stalled_since is not None and stall > 0 and now - self.stalled_since >= stall:
            self.log.warning("dropped: it read nothing for %gs with %d bytes waiting for it",
                             now - self.stalled_since, self.get_write_buffer_size())
            self.abort()
            return
        if self.deadline is not None and now >= self.deadline:
            self._expire(self.deadline_reason)
            return
        if limits.idle_seconds > 0 and now - self.last_active >= limits.idle_seconds:
            self._expire(f"idle for {limits.idle_seconds:g}s")
            return
        since = self.inner.receiving_since() if isinstance(self.inner, Receiving) else None
        if since is not None and limits.message_seconds > 0 and (
            now - since >= limits.message_seconds
        ):
            self._expire(f"a message unfinished for {limits.message_seconds:g}s")

    def _expire(self, reason: str) -> None:
        self.log.warning("closing: %s", reason)
        self.deadline = None
        self.last_active = float("inf")  # once
        if self.inner is None:  # still in the TLS handshake
            self.abort()
            self._closed()
            return
        if self.listener.expire is not None:
            self.listener.expire(self, reason)
        elif isinstance(self.inner, Expirable):
            self.inner.expire(reason)
        else:
            self.close()

    # ------------------------------------------------------------------ towards the protocol

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.active = True
        raw = self.raw
        if raw is None or raw.is_closing():
            return
        if self.tls is None:
            self.bytes_out += _size(data)
            raw.write(data)
            return
        try:
            self.tls.write(data)
        except ssl.SSLError as exc:  # pragma: no cover - only after a fatal TLS error
            self.log.warning("TLS error: %s", tls_reason(exc))
            self.abort()
            return
        self._send_tls()

    def writelines(self, list_of_data: Any) -> None:
        if self.tls is None:
            self.active = True
            if self.raw is not None and not self.raw.is_closing():
                data = list(list_of_data)
                self.bytes_out += sum(map(_size, data))
                self.raw.writelines(data)
            return
        for data in list_of_data:
            self.write(data)

    def close(self) -> None:
        if self.raw is None or self.raw.is_closing() or self._linger(self.close):
            return
        if self.tls is not None and self.state is not _State.TLS:
            with contextlib.suppress(ssl.SSLError, ValueError):
                self.tls.unwrap()  # close_notify
            self._send_tls()
        self.raw.close()

    def abort(self) -> None:
        if self.raw is not None and not self._linger(self.abort):
            self.raw.abort()

    def _linger(self, then: Callable[[], None]) -> bool:
        """A refused peer's close or abort: deferred ``limits.refusal_close_seconds`` with
        reading paused (True: the caller does nothing now); ``then`` ends it."""
        delay = self.listener.limits.refusal_close_seconds
        if self.lingering:
            return True
        if not self.lingers or delay <= 0 or self.raw is None:
            return False
        self.lingering = True
        self.raw.pause_reading()
        asyncio.get_running_loop().call_later(delay, self._lingered, then)
        return True

    def _lingered(self, then: Callable[[], None]) -> None:
        self.lingering = self.lingers = False
        then()

    def is_closing(self) -> bool:
        return self.raw is None or self.lingering or self.raw.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "guard":
            return self
        if self.tls is not None:
            if name == "peercert":
                return self.tls.getpeercert() if self.state is not _State.TLS else default
            if name == "ssl_object":
                return self.tls
            if name == "sslcontext":
                return self.tls.context
            if name == "cipher":
                return self.tls.cipher()
            if name == "compression":
                return self.tls.compression()
        return default if self.raw is None else self.raw.get_extra_info(name, default)

    def pause_reading(self) -> None:
        if self.raw is not None:
            self.raw.pause_reading()

    def resume_reading(self) -> None:
        if self.raw is not None and not self.lingering:
            self.raw.resume_reading()

    def is_reading(self) -> bool:
        return self.raw is not None and self.raw.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self.raw is not None:
            self.raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return 0 if self.raw is None else self.raw.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0) if self.raw is None else self.raw.get_write_buffer_limits()

    def can_write_eof(self) -> bool:
        return self.tls is None and self.raw is not None and self.raw.can_write_eof()

    def write_eof(self) -> None:
        if self.tls is not None:
            self.close()
        elif self.raw is not None:
            self.raw.write_eof()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.inner is not None
        return self.inner


class BufferedGuardedConnection(GuardedConnection, asyncio.BufferedProtocol):
    """A :class:`GuardedConnection` the loop reads into (``recv_into`` the listener's buffer):
    see ``Listener(buffered=True)``. TLS copies the ciphertext into its BIO, as before."""

    def get_buffer(self, sizehint: int) -> memoryview:
        assert self.listener.read_buffer is not None
        return self.listener.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        assert self.listener.read_buffer is not None
        self._received(self.listener.read_buffer[:nbytes])


def refused(transport: object) -> None:
    """Tell the guard (if ``transport`` is guarded) that the protocol refused its peer: its
    next close or abort lingers (module docstring)."""
    if isinstance(transport, GuardedConnection):
        transport.lingers = True


def established(transport: object) -> None:
    """Tell the guard (if ``transport`` is guarded) that the protocol's handshake is over."""
    if isinstance(transport, GuardedConnection):
        transport.established()


def _size(data: bytes | bytearray | memoryview) -> int:
    return data.nbytes if isinstance(data, memoryview) else len(data)


def _peer(peername: object) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        host = str(peername[0])
        return f"[{host}]:{peername[1]}" if ":" in host else f"{host}:{peername[1]}"
    return str(peername)
