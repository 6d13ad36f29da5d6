"""``/tube`` on the hub's aiohttp app: Tube (seed 001) over WebSocket, carrying RS.io.

One adapter, :class:`TubeCarrier`, drives two sans-IO machines layered as aioquic layers
HTTP/3 on QUIC: the Tube :class:`~tidewire.protocols.tube.Connection` and, above it, the RS.io
:class:`~tidewire.server.rsio_session.RsioSession` (the very session behind port 7400, whose
carrier this is). WebSocket messages in -> ``tube.receive_data(message, now)`` -> each
:class:`~tidewire.protocols.tube.MessageReceived` payload -> ``session.receive_data``; each
write of the session (a list of chunks, the log's zero-copy views among them) -> one Tube
message (``tube.send_chunks``: uncompressed, a WebSocket message within one chunk stays a view
of it; deflated, compressing makes one new buffer) -> ``tube.messages_to_send()`` -> every
WebSocket message queued framed here, all their frame heads, Tube headers and payload views in
one ``writelines`` per wake of the writer task (one ``writev``, no join). So subscribing with
demand, publishing (extension 1) and every limit of RS.io over TCP work over Tube unchanged.
One timer is armed from ``tube.next_deadline()``.

Who the peer is: the upgrade request's principal (``Authorization: Bearer``, else the client
certificate, else anonymous), settled by the app's middleware, which answers a bad token with
401 before any upgrade. The RS.io session starts as that principal (a browser, which cannot set
headers on a WebSocket, authenticates in-band: RS.io's extension 2) and checks every subscribe
and offer against the ACL itself.

Flow control: the Tube messages queued (in the machine and in the writer task, which sends
them in order) are bounded: past ``WRITE_HIGH_WATER`` bytes the session is paused (its pumps
wait, and it pauses reading the WebSocket), until the queue drains below ``WRITE_LOW_WATER``.
:meth:`TubeCarrier.get_write_buffer_size` says truthfully what waits (the queue and the HTTP
transport's buffer); it is the connection's ``outbound`` gauge in the hub's memory budget.

Hostile input (issue 20): what a message holds while it arrives (its fragments, a deflated one
until inflated, and its running inflated size) is the ``tube`` gauge of the connection's
:class:`~tidewire.hub.Share` (the RS.io session's, when it has one: one account per
connection; RS.io's own undecoded bytes are its ``inbound``), checked *before* each WebSocket
message is taken and at each inflated slice; refused, the WebSocket closes with 1009. A
deflated message is inflated a slice at a time (``Connection.next_event``) and RS.io gets its
bytes in slices sized to take well under a millisecond each, with a turn of the event loop
every ``TURN_SECONDS`` of such work (:meth:`TubeCarrier._deliver`), so a 12 KB message
inflating to megabytes of refused requests never holds the loop for long; the session's
answers meanwhile are gathered into few Tube messages. A message of several fragments, or an
RS.io frame, left unfinished for ``message_seconds`` is closed (1008: the deadlines, on this
carrier's timer, :meth:`TubeCarrier.sweep`). A peer asking for fragments under
``min_fragment_size`` is closed (1008). An upgrade whose ``Origin`` is not allowed
(:func:`origin_allowed`) is answered 403 before any WebSocket.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import WSMsgType, hdrs, web
from aiohttp.abc import AbstractStreamWriter

from ..hub import Hub, Share
from ..hub.access import Access
from ..observe.logs import connection_log
from ..observe.throttle import LogThrottle
from ..protocols.rsio_http import ERROR_HEADER
from ..protocols.tube import (
    Closed,
    Connection,
    Established,
    Event,
    Limits,
    MessageReceived,
    Role,
)
from .guard import refused
from .rsio_http import principal
from .rsio_session import RsioSession, RsioSettings

__all__ = ["TubeCarrier", "TubeSettings", "add_tube_route", "binary_frame_head", "origin_allowed",
           "writes_lines"]

log = logging.getLogger("tidewire.tube")

_HEAD16 = struct.Struct("!BBH")  # a WebSocket frame head with a 16-bit length
_HEAD64 = struct.Struct("!BBQ")  # ... with a 64-bit length

WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024
FEED_MIN = 64  # RS.io gets slices of these bounds (adapting to their cost, _deliver)
FEED_MAX = 64 * 1024
TURN_SECONDS = 0.0005  # the most handing RS.io bytes over goes without a turn of the loop
PAUSE_SECONDS = 0.001  # the turn after costly bytes: for other connections' several steps
GAUGE = "tube"  # what Tube holds of the peer's messages, in the connection's budget share
WRITE_BATCH_BYTES = 512 * 1024  # the most one writelines of the writer takes (then a drain)
COALESCE_BYTES = 64 * 1024  # the session's answers to input gathered into one Tube message
_TLS_INFO = frozenset({"peercert", "sslcontext", "cipher", "compression", "ssl_object"})
_DEFAULT_PORTS = {"http": ":80", "https": ":443", "ws": ":80", "wss": ":443"}
_refused_origins = LogThrottle()  # (one line per refused Origin would let a page flood the log)


@dataclass(frozen=True, slots=True)
class TubeSettings:
    """The ``tube.*`` settings (and ``limits.message_seconds``). ``allowed_origins``: the
    ``Origin`` values allowed besides the hub's own origin and none at all (``*``: any);
    ``message_seconds`` None: no deadline on an unfinished message."""

    fragment_size: int = 64 * 1024  # what the hub asks peers to split at
    max_message_bytes: int = 32 * 1024 * 1024  # (an RS.io element is at most 16 MiB)
    keepalive_seconds: float | None = 30.0  # ping after this much quiet; close after 3x silence
    compression: str = "smart"
    min_fragment_size: int = 4096  # the least a peer may ask the hub to split at (0 aside)
    message_seconds: float | None = 60.0
    allowed_origins: tuple[str, ...] = ()

    def limits(self) -> Limits:
        return Limits(max_message_bytes=self.max_message_bytes,
                      min_fragment_size=self.min_fragment_size,
                      message_seconds=self.message_seconds)  # fmt: skip


def _origin(value: str) -> str:
    """An origin as compared: lower case, without its scheme's default port."""
    value = value.strip().lower().rstrip("/")
    scheme = value.split("://", 1)[0]
    port = _DEFAULT_PORTS.get(scheme)
    return value[: -len(port)] if port and value.endswith(port) else value


def origin_allowed(request: web.BaseRequest, allowed: tuple[str, ...] = ()) -> bool:
    """Whether the upgrade ``request`` may open ``/tube``: no ``Origin`` header (not a browser,
    which always sends one on a WebSocket), the hub's own origin (the request's scheme and
    ``Host``: a page the hub served), or one of ``allowed`` (``*``: any). Several ``Origin``
    headers are refused (RFC 6454: one)."""
    origins = request.headers.getall(hdrs.ORIGIN, [])
    if not origins:
        return True
    if len(origins) > 1:
        return False
    origin = _origin(origins[0])
    if "*" in allowed or origin in {_origin(a) for a in allowed}:
        return True
    return origin == _origin(f"{request.scheme}://{request.host}")


class TubeCarrier:
    """One ``/tube`` WebSocket: the Tube machine ``tube`` and the RS.io ``session`` it
    carries, driven together by :meth:`run`; the session's
    :class:`~tidewire.server.rsio_session.Carrier`. ``peer`` is the peer's address, ``http``
    the HTTP connection under the WebSocket (the guard's connection, the TLS facts)."""

    def __init__(self, ws: web.WebSocketResponse, tube: Connection, session: RsioSession,
                 peer: str, http: asyncio.BaseTransport | None = None,
                 share: Share | None = None,
                 frames: AbstractStreamWriter | None = None) -> None:  # fmt: skip
        """``share``: the connection's share of the hub's memory budget (default: the
        session's own, when it has one, else a new one of ``session.hub.budget``, closed
        when :meth:`run` ends). ``frames``: what ``ws.prepare`` returned; with it (and
        ``http``) the queued WebSocket messages are framed here and written with one
        ``writelines`` per wake of the writer (:meth:`_send`), else handed to
        ``ws.send_bytes``."""
        self.ws = ws
        self.frames = frames
        self.tube = tube
        self.session = session
        self.peer = peer
        self.http = http
        self.log = connection_log(log, http, "tube")
        self.queued = 0  # bytes of Tube messages not yet handed to the WebSocket
        self.close_code = 1000
        self.close_reason = ""
        self._loop = asyncio.get_running_loop()
        self._closing = False
        self._started = False  # the fragment sizes are exchanged: the session is started
        self._paused = False  # the session's writing
        self._readable = asyncio.Event()
        self._readable.set()
        self._wake = asyncio.Event()  # the writer task has messages to send, or must close
        self._in_writer = 0  # bytes the writer task took and has not sent yet
        self._timer: asyncio.TimerHandle | None = None
        own: Share | None = getattr(session, "share", None)  # (an RS.io session's account)
        self._own_share = share is None and own is None
        self.share = share or own or session.hub.budget.share(str(session.principal), peer)
        self._draining = False  # run() is handing events to the session (it yields meanwhile)
        self._feed = FEED_MIN  # the slice RS.io gets next (adapts, _deliver)
        self._turn = time.perf_counter()  # when input handling last gave the loop a turn
        self._inflating = 0  # the running size of the deflated message being inflated
        self._held: list[bytes | memoryview] = []  # the session's writes while input is fed
        self._held_bytes = 0

    # ------------------------------------------------------------------ Carrier

    def write_chunks(self, chunks: list[bytes | memoryview]) -> None:
        """One Tube message of ``chunks`` (dropped once closing, as a closed socket would).
        While input is being handed to the session, its writes (answers: onError for each
        refused subscribe...) are gathered into one Tube message per turn of the loop, or
        per ``COALESCE_BYTES``, instead of one WebSocket message each."""
        if self._closing or not self.tube.established:
            return
        if self._draining:
            self._held += chunks
            self._held_bytes += sum(len(c) for c in chunks)
            if self._held_bytes >= COALESCE_BYTES:
                self._send_held()
            return
        self.tube.send_chunks(chunks, self._loop.time())
        self._flush()

    def _send_held(self) -> None:
        """The writes gathered while input was fed, as one Tube message."""
        if self._held:
            held, self._held, self._held_bytes = self._held, [], 0
            if self.tube.established:  # (else the connection broke meanwhile: dropped)
                self.tube.send_chunks(held, self._loop.time())
            self._flush()

    def pause_reading(self) -> None:
        self._readable.clear()

    def resume_reading(self) -> None:
        self._readable.set()

    def close(self) -> None:
        """The writer task sends what is queued, then closes the WebSocket."""
        if not self._closing and self.tube.established:
            self._send_held()  # (a goodbye among them)
        self._closing = True
        self._wake.set()
        self._readable.set()  # (nothing more is read: a reader waiting for it must see so)

    def abort(self) -> None:
        self.close()  # (a WebSocket has no reset; the close is immediate enough)

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``peername`` is the peer's address; ``guard`` and the TLS facts (``peercert``,
        ``sslcontext``, ``cipher``, ``ssl_object``) are the HTTP connection's."""
        if name == "peername":
            return self.peer
        if name == "budget_share":
            return self.share
        if (name == "guard" or name in _TLS_INFO) and self.http is not None:
            return self.http.get_extra_info(name, default)
        return default

    def get_write_buffer_size(self) -> int:
        """Bytes written and not yet sent: Tube messages queued (in the machine and the
        writer task) and what the HTTP transport under the WebSocket still buffers."""
        return self.queued + self._held_bytes + self._transport_buffered()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        """``(low, high)``: past ``high`` the session is paused, below ``low`` resumed."""
        return WRITE_LOW_WATER, WRITE_HIGH_WATER

    def _transport_buffered(self) -> int:
        http = self.http
        size = getattr(http, "get_write_buffer_size", None)
        if http is None or size is None or http.is_closing():
            return 0
        return int(size())

    @property
    def writing_paused(self) -> bool:
        """Whether the session is paused for want of the peer's reading: set once more than
        the high-water mark is queued, cleared once the queue is below the low-water mark
        again (what the transport holds meanwhile is not counted: it waits there)."""
        return self._paused

    def receiving_since(self) -> float | None:
        """``loop.time()`` when the unfinished inbound message's header came (None: none)."""
        return self.tube.receiving_since

    def established(self) -> None:
        """Nothing to tell: the guard's handshake deadline ended with the upgrade request."""

    def refused(self) -> None:
        """The session refuses the peer: the HTTP connection's close lingers (guard)."""
        refused(self.http)

    # ------------------------------------------------------------------ driving

    async def run(self) -> None:
        """Read WebSocket messages into the machines until either side closes."""
        writer = asyncio.create_task(self._write())
        try:
            self._arm()
            while not self._closing:
                await self._readable.wait()
                if self._closing:
                    break
                message = await self.ws.receive()
                if message.type == WSMsgType.BINARY:
                    data = message.data
                    # Checked before the machine takes it: what it will hold with this message.
                    if not self.share.try_hold(GAUGE, self.tube.buffered + len(data)):
                        self._refuse("a message past the connection's memory share", 1009)
                        break
                    self.tube.receive_data(data, self._loop.time())
                    await self._handle()
                elif message.type == WSMsgType.TEXT:
                    self.log.warning("a text WebSocket message (Tube is binary): closing")
                    await self.ws.close(code=1003, message=b"Tube messages are binary")
                    break
                elif message.type == WSMsgType.ERROR:
                    self.log.warning("%s", self.ws.exception())
                    break
                else:  # CLOSE, CLOSING, CLOSED
                    break
            if self._started:
                self.session.receive_data(b"")  # the end of the peer's RS.io stream
        finally:
            if self._timer is not None:
                self._timer.cancel()
            if self._started:
                self.session.connection_lost()
            self.close()
            await writer
            if self._own_share:
                self.share.close()

    async def _handle(self) -> None:
        """The Tube machine's events into the session (:meth:`_deliver`: in slices, with
        turns of the loop between); then send, and re-arm the timer."""
        self._draining = True
        try:
            while not self._closing and (event := self.tube.next_event()) is not None:
                if isinstance(event, MessageReceived):
                    if event.compressed and not self._charge(event):
                        break
                    await self._deliver(event.data)
                else:
                    self._on_event(event)
        finally:
            self._draining = False
            self._send_held()
        if not self.share.closed:
            self.share.hold(GAUGE, self.tube.buffered)  # (lowering: never refused)
        if str(self.session.principal) != self.share.principal:  # (an in-band authenticate)
            self.share.rebind(str(self.session.principal))
        self._flush()
        self._arm()

    def _charge(self, part: MessageReceived) -> bool:
        """Count a deflated message's part against the connection's share: its running size
        so far, and what is still compressed (False: refused, the connection is closing)."""
        self._inflating = 0 if part.final else self._inflating + len(part.data)
        running = self._inflating + (len(part.data) if part.final else 0)
        if self.share.try_hold(GAUGE, self.tube.buffered + running):
            return True
        self._refuse("a deflated message inflating past the connection's memory share", 1009)
        return False

    async def _deliver(self, data: bytes) -> None:
        """``data`` into the session in slices, none while the session has paused reading,
        with a turn of the loop once ``TURN_SECONDS`` of this work have gone without one.

        The slice adapts to what the bytes cost: halved while one takes over a quarter of a
        turn (megabytes of refused requests: down to ``FEED_MIN``), doubled while cheap (a
        large publish: up to ``FEED_MAX``). Cheap bytes get a single pass of the loop as
        their turn; costly ones a pause of ``PAUSE_SECONDS``, since another connection's
        request and answer need several passes: so input that costs far more than its size
        gets at most a third of the loop while others wait, and plain data is not slowed."""
        clock, pos = time.perf_counter, 0  # (not loop.time(): uvloop's is per pass, in ms)
        while pos < len(data):
            if clock() - self._turn >= TURN_SECONDS:
                self._send_held()
                await asyncio.sleep(PAUSE_SECONDS if self._feed < FEED_MAX else 0)
                self._turn = clock()
            if not self._readable.is_set():
                self._send_held()
                await self._readable.wait()
            if self._closing:
                return
            n = self._feed
            piece = data if pos == 0 and len(data) <= n else data[pos : pos + n]
            pos += len(piece)
            began = clock()
            self.session.receive_data(piece)
            took = clock() - began
            if took > TURN_SECONDS / 4:
                self._feed = max(FEED_MIN, n // 2)
            elif took < TURN_SECONDS / 16 and len(piece) == n:
                self._feed = min(FEED_MAX, n * 2)
            self._flush()

    def _on_event(self, event: Event) -> None:
        """Any event but a message: the session starts, or the connection closes."""
        if isinstance(event, Established):
            self._started = True
            self.session.start(self)
        elif isinstance(event, Closed):
            if event.error:
                self.log.warning("closing: %s", event.reason)
            self.close_code, self.close_reason = event.code, event.reason
            self.close()

    def _refuse(self, reason: str, code: int) -> None:
        """Close at once with ``code`` (Tube has no error message)."""
        self.log.warning("closing: %s", reason)
        refused(self.http)
        self.close_code, self.close_reason = code, reason
        self.tube.close(reason, code)
        self.close()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        deadlines = [d for d in (self.tube.next_deadline(), self._frame_deadline()) if d]
        self._timer = self._loop.call_at(min(deadlines), self.sweep) if deadlines else None

    def _frame_deadline(self) -> float | None:
        """When the RS.io frame the peer began and left unfinished is due (a session that
        tells, with ``receiving_since``): the same ``message_seconds`` as a Tube message's,
        since the guard's sweep does not reach connections under aiohttp."""
        seconds = self.tube.limits.message_seconds
        since_of = getattr(self.session, "receiving_since", None)
        since = since_of() if seconds is not None and since_of is not None else None
        return None if since is None or seconds is None else float(since) + seconds

    def sweep(self, now: float | None = None) -> None:
        """The deadlines at ``now`` (default: the loop's time): the machine's (keepalive,
        silence, an unfinished Tube message) and an unfinished RS.io frame's (what the
        timer calls; tests may call it with a later ``now``)."""
        now = self._loop.time() if now is None else now
        self.tube.handle_timer(now)
        frame = self._frame_deadline()
        if frame is not None and now >= frame and not self._closing:
            self._refuse(f"an RS.io frame unfinished after {self.tube.limits.message_seconds:g} s",
                         1008)  # fmt: skip
        if not self._draining:  # (else run() is handing events over and will meet these)
            while (event := self.tube.next_event()) is not None:
                if not isinstance(event, MessageReceived):  # (none comes from a timer)
                    self._on_event(event)
        self._flush()
        self._arm()

    def _flush(self) -> None:
        """Wake the writer task; past the high-water mark, pause the session."""
        self._wake.set()
        self.queued = self.tube.pending + self._in_writer + self._held_bytes
        self.share.hold("outbound", self.queued + self._transport_buffered())
        if not self._paused and self.queued > WRITE_HIGH_WATER:
            self._paused = True
            self.session.pause_writing()

    async def _send(self, messages: list[tuple[bytes | memoryview, ...]], sizes: list[int]) -> None:
        """The WebSocket binary messages ``messages`` (Tube messages: each its header, then
        views of the session's chunks; ``sizes`` their lengths), in order. Framed here: every
        frame head and every part of them go in one ``writelines`` (one ``writev``) per
        ``WRITE_BATCH_BYTES`` or so, with no join of any payload, and a ``drain`` after each
        waits while the transport is over its high-water mark. Not one write per WebSocket
        message: a 1 MiB Tube message split at 64 KiB is 17 messages, and writing them one
        at a time cost the sender a third more CPU per MiB and woke the reader per 64 KiB
        (docs/protocols/tube.md, "Sending"). The batch is bounded so that what the transport
        holds stays small next to the queue that pauses the session (``WRITE_HIGH_WATER``).
        Without the framing path (no ``frames``, or a transport without ``writelines``) each
        goes to ``ws.send_bytes``, joined."""
        http, frames = self.http, self.frames
        if frames is None or http is None or not writes_lines(http):
            for parts, size in zip(messages, sizes, strict=True):
                # (aiohttp takes any bytes-like object, a view too, though typed bytes)
                await self.ws.send_bytes(cast(bytes, parts[0] if len(parts) == 1
                                              else b"".join(parts)))  # fmt: skip
                self._in_writer -= size
            return
        lines: list[bytes | memoryview] = []
        batch, last = 0, len(messages) - 1
        for i, (parts, size) in enumerate(zip(messages, sizes, strict=True)):
            lines.append(binary_frame_head(size))
            lines += parts
            batch += size
            if batch >= WRITE_BATCH_BYTES or i == last:
                if self.ws.closed or http.is_closing():  # (no data frame after the close)
                    raise ConnectionResetError("the WebSocket is closing")
                cast(asyncio.WriteTransport, http).writelines(lines)
                # (handed to the transport: counted there now, _transport_buffered)
                self._in_writer -= batch
                self._account()
                await frames.drain()
                lines, batch = [], 0

    def _account(self) -> None:
        """What waits, after the writer handed messages over: the ``outbound`` gauge."""
        self.queued = self.tube.pending + self._in_writer
        self.share.hold("outbound", self.queued + self._transport_buffered())

    async def _write(self) -> None:
        """Send the queued Tube messages, in order; close the WebSocket once closing."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                messages = self.tube.messages_to_send()
                sizes = [sum(len(part) for part in parts) for parts in messages]
                self._in_writer = sum(sizes)
                if messages:
                    await self._send(messages, sizes)
                self._account()
                if self._paused and self.queued < WRITE_LOW_WATER:
                    self._paused = False
                    self.session.resume_writing()
                if self._closing and not self._wake.is_set():
                    break
        except (ConnectionError, RuntimeError) as exc:  # the peer went away mid-write
            self.log.info("writing stopped: %s", exc)
        finally:
            self._closing = True
            self._readable.set()
            if not self.ws.closed:
                await self.ws.close(code=self.close_code,
                                    message=self.close_reason[:120].encode())  # fmt: skip


def writes_lines(transport: asyncio.BaseTransport) -> bool:
    """Whether ``transport`` takes a message's parts in one ``writelines``: asyncio's and
    uvloop's TCP and TLS transports do. uvloop's are not subclasses of
    ``asyncio.WriteTransport`` (an ``isinstance`` test sent every message of a hub on uvloop,
    the way ``serve`` runs, down the joining fallback), so this looks for the method."""
    return callable(getattr(transport, "writelines", None))


def binary_frame_head(size: int) -> bytes:
    """RFC 6455 5.2: the head of an unmasked (server to client), final, binary frame."""
    if size < 126:
        return bytes((0x82, size))
    if size < 65536:
        return _HEAD16.pack(0x82, 126, size)
    return _HEAD64.pack(0x82, 127, size)


def add_tube_route(app: web.Application, hub: Hub, registry: set[RsioSession],
                   settings: TubeSettings | None = None,
                   rsio: RsioSettings | None = None,
                   access: Access | None = None) -> None:  # fmt: skip
    """Mount ``GET /tube`` (the WebSocket upgrade) on ``app``; its RS.io sessions join
    ``registry`` (so that shutdown says goodbye to them too) and obey ``access``."""
    settings = settings or TubeSettings()
    access = access if access is not None else Access()

    async def tube(request: web.Request) -> web.StreamResponse:
        if not origin_allowed(request, settings.allowed_origins):
            origin = ascii(request.headers.get(hdrs.ORIGIN))  # (escaped: a peer's string)
            _refused_origins.log(log, logging.WARNING, "refused /tube from %s: Origin %s",
                                 request.remote, origin)  # fmt: skip
            return web.Response(status=403, text="forbidden: this Origin may not open /tube\n",
                                headers={ERROR_HEADER: "true"})  # fmt: skip
        # WebSocket messages are Tube fragments, at most the fragment size the hub asked for
        # (the header counts against it); aiohttp closes with 1009 past that.
        limit = (
            settings.fragment_size + 1
            if settings.fragment_size
            else (settings.max_message_bytes + 16)
        )  # (aiohttp refuses a message of exactly its limit)
        # (compress=False: Tube deflates on its own, and this carrier frames its messages)
        ws = web.WebSocketResponse(max_msg_size=limit, compress=False, autoping=True)
        frames = await ws.prepare(request)
        machine = Connection(
            Role.SERVER, fragment_size=settings.fragment_size, limits=settings.limits(),
            compression=settings.compression,  # type: ignore[arg-type]
            keepalive=settings.keepalive_seconds, now=asyncio.get_running_loop().time(),
        )  # fmt: skip
        session = RsioSession(hub, registry, rsio, access=access, principal=principal(request),
                              via="tube")  # fmt: skip
        await TubeCarrier(ws, machine, session, f"{request.remote}", request.transport,
                          frames=frames).run()  # fmt: skip
        return ws

    app.router.add_get("/tube", tube)
