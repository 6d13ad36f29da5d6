"""RS.io over Tube over WebSocket, from Python: ``async with tidewire.client.tube.connect(
"ws://127.0.0.1:7480/tube") as hub`` gives the same :class:`~tidewire.client.rsio.RsioClient`
as ``tidewire.connect("rsio://...")`` (subscribe with demand, publish), its bytes carried as Tube
messages (seed 001) over aiohttp's WebSocket client.

:class:`TubeStream` is the adapter: the RS.io client reads the payloads of Tube messages and
each of its writes is one Tube message (a write over ``MESSAGE_BYTES`` several: RS.io is a byte
stream, and a hub refuses messages over its ``tube.max_message_bytes``); a writer task sends
them in order, and ``drain()`` waits while more than ``WRITE_HIGH_WATER`` bytes are queued.
Tube's keepalive (ping after ``keepalive`` seconds of quiet, close a peer silent for three
times that) runs on the read side's timeouts.

Credentials: ``token=`` goes in the upgrade request's ``Authorization: Bearer`` header (a hub
that refuses it answers 401 before the upgrade: :class:`~tidewire.model.Unauthenticated` here);
``ssl=`` is the TLS context for ``wss://`` (e.g. with a client certificate,
``tidewire.server.guard.client_context``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as _ssl
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import aiohttp

from ..model import AccessError, Forbidden, Unauthenticated
from ..protocols.tube import Closed, Connection, Limits, MessageReceived, Role
from .opening import Opening
from .rsio import RsioClient

if TYPE_CHECKING:
    from .backoff import Retry
    from .resilient import Reconnect

__all__ = ["PREALLOC_BYTES", "TubeStream", "connect"]

WRITE_HIGH_WATER = 4 * 1024 * 1024
MESSAGE_BYTES = 1024 * 1024  # the largest Tube message a write becomes (a hub takes 32 MiB,
# as its connection's memory share allows: 1 MiB at least)
PREALLOC_BYTES = 4 * 1024 * 1024
"""A message from the hub of several fragments that may be this big at most is put together in
one buffer allocated at its header (``Limits.prealloc_bytes``: the client trusts its hub's
declared sizes; a bigger one is kept and joined at its last fragment)."""


class TubeStream:
    """A byte stream (``read`` / ``write`` / ``drain`` / ``close``) over one Tube connection."""

    def __init__(self, session: aiohttp.ClientSession | None,
                 ws: aiohttp.ClientWebSocketResponse, tube: Connection) -> None:  # fmt: skip
        self.session = session  # closed with the stream when this side made it
        self.ws = ws
        self.tube = tube
        self.closed_reason: str | None = None
        self._loop = asyncio.get_running_loop()
        self._received: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._queued = 0
        self._writer = asyncio.create_task(self._write_loop())

    @classmethod
    async def open(cls, url: str, *, fragment_size: int = 64 * 1024,
                   compression: Literal["never", "always", "smart"] = "smart",
                   keepalive: float | None = 30.0,
                   max_message_bytes: int = 128 * 1024 * 1024,
                   session: aiohttp.ClientSession | None = None, token: str | None = None,
                   ssl: _ssl.SSLContext | None = None) -> TubeStream:  # fmt: skip
        """Connect (with ``Authorization: Bearer <token>`` when ``token`` is given; over TLS
        with ``ssl`` as the context, else the default one) and exchange fragment sizes."""
        own = session is None
        session = session or aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        try:
            limit = fragment_size + 1 if fragment_size else max_message_bytes + 16
            try:
                ws = await session.ws_connect(url, max_msg_size=limit, autoping=True,
                                              headers=headers,
                                              ssl=ssl if ssl is not None else True)  # fmt: skip
            except aiohttp.WSServerHandshakeError as exc:
                refusal = _refusal(exc)
                if refusal is None:
                    raise
                raise refusal from None
            tube = Connection(Role.CLIENT, fragment_size=fragment_size,
                              limits=Limits(max_message_bytes=max_message_bytes,
                                            prealloc_bytes=PREALLOC_BYTES),
                              compression=compression, keepalive=keepalive,
                              now=asyncio.get_running_loop().time())  # fmt: skip
            stream = cls(session if own else None, ws, tube)
            stream._kick()
            while not tube.established:  # the server's fragment size
                if not await stream._receive_one():
                    raise ConnectionError(f"the Tube handshake failed: {stream.closed_reason}")
            return stream
        except BaseException:
            if own:
                await session.close()
            raise

    # ------------------------------------------------------------------ reading

    async def read(self, n: int = -1) -> bytes:
        """The next Tube message's payload (``b""`` once the connection is closed)."""
        while not self._received:
            if not await self._receive_one():
                return b""
        return self._received.popleft()

    async def _receive_one(self) -> bool:
        """Take one WebSocket message (or a timer); False once closed."""
        tube, loop = self.tube, self._loop
        if self.closed_reason is not None:
            return False
        deadline = tube.next_deadline()
        timeout = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            message = await self.ws.receive(timeout=timeout)
        except TimeoutError:
            tube.handle_timer(loop.time())
        else:
            if message.type == aiohttp.WSMsgType.BINARY:
                tube.receive_data(message.data, loop.time())
            elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                                  aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):  # fmt: skip
                self.closed_reason = f"the WebSocket closed ({message.data!r})"
            else:
                tube.close("a text WebSocket message (Tube is binary)", 1003)
        while (event := tube.next_event()) is not None:
            if isinstance(event, MessageReceived):
                if event.data:  # (an empty message is no end of stream)
                    self._received.append(event.data)
            elif isinstance(event, Closed):
                self.closed_reason = event.reason
                await self.ws.close(code=event.code, message=event.reason[:120].encode())
        self._kick()
        return self.closed_reason is None or bool(self._received)

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        if self.closed_reason is None and data:
            view, now = memoryview(data), self._loop.time()
            for start in range(0, len(data), MESSAGE_BYTES):
                self.tube.send(view[start : start + MESSAGE_BYTES], now)
            self._kick()

    def _kick(self) -> None:
        self._queued = self.tube.pending
        if self._queued:
            self._idle.clear()
            self._wake.set()

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                for message in self.tube.data_to_send():
                    await self.ws.send_bytes(message)
                self._queued = self.tube.pending
                if not self._queued:
                    self._idle.set()
        except (ConnectionError, RuntimeError) as exc:
            self.closed_reason = self.closed_reason or f"writing failed: {exc}"
            self._idle.set()

    async def drain(self) -> None:
        if self._queued > WRITE_HIGH_WATER:
            await self._idle.wait()

    def close(self) -> None:
        self.tube.close("client closing")

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 5)
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
        if not self.ws.closed:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()


def _refusal(exc: aiohttp.WSServerHandshakeError) -> AccessError | None:
    """A 401/403 answer to the upgrade as tidewire's access error (else ``None``)."""
    kinds: dict[int, type[AccessError]] = {401: Unauthenticated, 403: Forbidden}
    kind = kinds.get(exc.status)
    if kind is None:
        return None
    return kind(f"the hub refused the Tube upgrade: {exc.status} {exc.message}")


class _Connect(Opening[RsioClient]):
    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.url = url
        self.options = options

    async def _open(self) -> RsioClient:
        stream = await TubeStream.open(self.url, **self.options)
        return RsioClient(stream, stream)


@overload
def connect(url: str | Sequence[str], token: str | None = None,
            ssl: _ssl.SSLContext | None = None, *, retry: None = None,
            **options: Any) -> Opening[RsioClient]: ...  # fmt: skip
@overload
def connect(url: str | Sequence[str], token: str | None = None,
            ssl: _ssl.SSLContext | None = None, *, retry: Retry,
            **options: Any) -> Reconnect: ...  # fmt: skip
def connect(url: str | Sequence[str], token: str | None = None,
            ssl: _ssl.SSLContext | None = None, *, retry: Retry | None = None,
            **options: Any) -> Opening[RsioClient] | Reconnect:  # fmt: skip
    """RS.io over Tube at ``ws://host:port/tube`` (``wss://``: over TLS, ``ssl`` its context):
    ``async with connect(url) as hub``. ``token``: sent as ``Authorization: Bearer`` on the
    upgrade (a refused one raises :class:`~tidewire.model.Unauthenticated` here). Options:
    ``fragment_size``, ``compression``, ``keepalive``, ``max_message_bytes``, ``session``.

    Several gateways: a list or ``"ws://h1:7480/tube,ws://h2:7480/tube"`` (an entry without
    a scheme takes the first one's scheme and path: ``"ws://h1:7480/tube,h2:7480"``). Without
    ``retry`` each is tried once, in order, the first that connects used.

    With ``retry`` (a :class:`~tidewire.client.backoff.Retry`), the client is a
    :class:`~tidewire.client.resilient.ReconnectingClient` over Tube: it reconnects with
    backoff, resumes subscriptions and re-offers what was not acknowledged, exactly as over
    TCP (docs/protocols/rsio.md, "Reconnecting clients"), each new try at the next gateway."""
    from .reconnect import first_reachable, gateway_urls

    urls = gateway_urls(url)
    opts = {**options, "token": token, "ssl": ssl}
    if retry is None:
        if len(urls) == 1:
            return _Connect(urls[0], opts)
        return _Opened(lambda: first_reachable(urls, lambda one: _Connect(one, opts)._open(),
                                               _final_try))  # fmt: skip
    from .backoff import Backoff  # (resilient builds on the RS.io client: imported when used)
    from .resilient import Reconnect

    return Reconnect(lambda one: _Connect(one, opts)._open(), Backoff(retry),
                     what=",".join(urls), urls=urls)  # fmt: skip


class _Opened(Opening[RsioClient]):
    def __init__(self, open: Callable[[], Awaitable[RsioClient]]) -> None:
        self.open = open

    async def _open(self) -> RsioClient:
        return await self.open()


def _final_try(exc: BaseException) -> BaseException | None:
    """Without ``retry``, several gateways: a refused connection or upgrade answered 5xx
    moves on to the next; a refused token or certificate does not."""
    if isinstance(exc, AccessError | _ssl.SSLCertVerificationError
                  | aiohttp.ClientConnectorCertificateError):  # fmt: skip
        return exc
    if isinstance(exc, aiohttp.ClientResponseError):
        return None if exc.status >= 500 else exc
    if isinstance(exc, OSError | aiohttp.ClientError):
        return None
    return exc
