"""The asyncio RS.io-over-TCP client: ``async with tidewire.connect("rsio://host:7400") as hub``.

One reader task feeds the sans-IO :class:`~tidewire.protocols.rsio.Connection`; each
subscription keeps a small queue of received elements, bounded by its prefetch: the client asks
for ``prefetch`` elements, and for more only as the application consumes them, so a slow
consumer slows the hub down instead of filling memory.

Publishing uses tidewire's extension 1: :meth:`RsioClient.publisher` offers a publisher, the hub
subscribes to it and requests elements as it commits them; each ``committed`` resolves the
futures of the batches it covers. Queued elements are bounded in bytes (``max_queue_bytes``):
:meth:`Publisher.submit` waits for room.

When the connection is lost (EOF, a reset, the hub's ``goodbye``), every open subscription and
offer fails with :class:`ConnectionLost`; ``connect(url, retry=Retry(...))`` gives instead a
client that reconnects, resumes and re-offers (``tidewire.client.resilient``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from ssl import SSLCertVerificationError, SSLContext, create_default_context
from typing import TYPE_CHECKING, Any, Literal, overload
from urllib.parse import urlsplit

from ..model import Batch, LogClosedError, TidewireError, validate_stream_name
from ..protocols.rsio import (
    EXT_AUTH,
    EXT_PUBLISH,
    Authenticate,
    Authenticated,
    Cancel,
    Committed,
    Connection,
    ConnectionClosed,
    Goodbye,
    HandshakeCompleted,
    Offer,
    OfferEnded,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    Role,
    Subscribe,
)
from ..protocols.rsio.codec import OnNextDecoded, OnNextRun
from ..protocols.rsio.names import (
    FromTime,
    HubPublisher,
    OfferName,
    PublisherName,
    start_position,
)
from ..protocols.rsio.runs import RunDecoder, envelope_run_decoder

if TYPE_CHECKING:
    from .backoff import Retry
    from .resilient import Reconnect
from .opening import Opening
from .rsio_common import (
    ByteReader,
    ByteWriter,
    ConnectionLost,
    Receipt,
    RsioError,
    Values,
    envelopes_batch,
    record_to_batch,
)
from .rsio_publisher import Publisher
from .rsio_times import ids_from_rows, times_publisher
from .rsio_wire import WireProtocol

__all__ = [
    "ByteReader",
    "ByteWriter",
    "ConnectionLost",
    "Publisher",
    "Receipt",
    "RsioClient",
    "RsioError",
    "Values",
    "connect",
]


@dataclass(slots=True)
class _Inbox:
    name: PublisherName | HubPublisher
    elements: list[bytes] = field(default_factory=list)
    count: int = 0  # elements received, not yet handed out (a packed run counts each)
    done: str | None = None  # "complete", or the error
    lost: bool = False  # done because the connection closed (not the hub's onError)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class RsioClient:
    def __init__(
        self, reader: ByteReader | WireProtocol, writer: ByteWriter, token: str | None = None
    ) -> None:
        """``reader`` a :class:`~.rsio_wire.WireProtocol` (what :func:`connect` opens): reads
        are pushed and decoded in the loop's callback; any other ``ByteReader`` (a Tube
        connection, a test's stream) is read by a task.

        ``token``: authenticate with it (extension 2) as soon as the hub's hello arrives;
        until the hub answers, subscribing and publishing wait (they would otherwise run as
        the anonymous principal), and a refused token closes the client."""
        self.reader = reader
        self.writer = writer
        self.token = token
        self.principal: str | None = None  # what the hub's ``authenticated`` said
        self.closed_event: ConnectionClosed | None = None  # how the RS.io connection ended
        extensions = (EXT_PUBLISH,) if token is None else (EXT_PUBLISH, EXT_AUTH)
        self.conn = Connection(Role.CLIENT, extensions=extensions, runs=True)
        self.conn.initiate()
        self._inboxes: dict[int, _Inbox] = {}
        self._outlets: dict[int, Publisher] = {}
        self._closed: str | None = None
        self._handshake = asyncio.Event()
        self._task: asyncio.Future[None]
        if isinstance(reader, WireProtocol):
            # Reads are pushed (decoded in the loop's read callback, no reader task); the
            # "task" close() waits for is the end of the connection.
            self._task = asyncio.get_running_loop().create_future()
            reader.attach(self._received, self._lost)
        else:
            self._task = asyncio.create_task(self._read_loop())
        self._flush()

    def _flush(self) -> None:
        writer = self.writer
        if isinstance(writer, WireProtocol):  # big elements stay apart: one writev, no join
            chunks = self.conn.chunks_to_send()
            if len(chunks) == 1:
                writer.write(chunks[0])
            elif chunks:
                writer.writelines(chunks)
            return
        data = self.conn.data_to_send()
        if data:
            writer.write(data)

    async def _read_loop(self) -> None:
        reader = self.reader
        assert not isinstance(reader, WireProtocol)  # (pushed: see _received)
        try:
            while not self.conn.closed:
                data = await reader.read(256 * 1024)
                self.conn.receive_data(data)
                self._dispatch()
                self._flush()
                if not data:
                    break
        except (ConnectionError, OSError) as exc:
            self._closed = f"connection lost: {exc}"
        finally:
            self._end()

    def _received(self, data: memoryview | bytes) -> None:
        """A read pushed by the :class:`~.rsio_wire.WireProtocol` (a view valid only during
        this call: the connection's receive buffer copies what it keeps); ``b""``: EOF."""
        if self._task.done():
            return
        try:
            self.conn.receive_data(data)
            self._dispatch()
            self._flush()
        except BaseException:
            self._end()
            raise
        if not data or self.conn.closed:
            self._end()

    def _lost(self, exc: Exception | None) -> None:
        if exc is not None and self._closed is None:
            self._closed = f"connection lost: {exc}"
        self._end()

    def _end(self) -> None:
        """The connection is over: every open subscription and offer fails (once)."""
        pushed = not isinstance(self._task, asyncio.Task)
        if pushed and self._task.done():
            return
        self._closed = self._closed or "connection closed"
        self._handshake.set()
        for inbox in self._inboxes.values():
            if inbox.done is None:
                inbox.done, inbox.lost = self._closed, True
            inbox.wake.set()
        for outlet in list(self._outlets.values()):
            outlet._end(self._closed, lost=True)
        if pushed:
            self._task.set_result(None)

    @property
    def closed(self) -> str | None:
        """Why the connection closed (e.g. the hub's goodbye reason), ``None`` while open."""
        return self._closed

    def _dispatch(self) -> None:
        while (event := self.conn.next_event()) is not None:
            match event:
                case OnNextDecoded(subscriber, count, value):
                    inbox = self._inboxes.get(subscriber)
                    if inbox is not None:
                        inbox.elements.append(value)  # type: ignore[arg-type]  # a Batch
                        inbox.count += count
                        inbox.wake.set()
                case OnNextRun(subscriber, elements):
                    inbox = self._inboxes.get(subscriber)
                    if inbox is not None:
                        inbox.elements += elements
                        inbox.count += len(elements)
                        inbox.wake.set()
                case OnNext(subscriber, element):
                    inbox = self._inboxes.get(subscriber)
                    if inbox is not None:
                        inbox.elements.append(element)
                        inbox.count += 1
                        inbox.wake.set()
                case OnNextPacked(subscriber, count, elements):
                    inbox = self._inboxes.get(subscriber)
                    if inbox is not None:
                        inbox.elements.append(elements)
                        inbox.count += count
                        inbox.wake.set()
                case OnComplete(subscriber) | OnError(subscriber):
                    inbox = self._inboxes.get(subscriber)
                    if inbox is not None:
                        inbox.done = "complete" if isinstance(event, OnComplete) else event.error
                        inbox.wake.set()
                case Subscribe(_, subscriber):  # the hub takes up an offer
                    outlet = self._outlets.get(subscriber)
                    if outlet is None or outlet.subscribed:
                        self.conn.send(OnError(subscriber, "no such publisher"))
                    else:
                        outlet._on_subscribed()
                case Request(subscriber) | Cancel(subscriber):
                    outlet = self._outlets.get(subscriber)
                    if outlet is not None:
                        outlet.wake.set()
                case Committed(offer, count, first_id, last_id):
                    outlet = self._outlets.get(offer)
                    if outlet is not None:
                        outlet._on_committed(count, first_id, last_id)
                case OfferEnded(offer, error):
                    outlet = self._outlets.pop(offer, None)
                    if outlet is not None:
                        outlet._end(error)
                case HandshakeCompleted(_, extensions):
                    if self.token is None:
                        self._handshake.set()
                    elif EXT_AUTH in extensions:
                        self.conn.send(Authenticate(self.token))
                    else:
                        self._closed = "the hub does not offer authentication (extension 2)"
                        self.conn.send(Goodbye(self._closed))
                        self._handshake.set()
                case Authenticated(principal):
                    self.principal = principal
                    self._handshake.set()
                case ConnectionClosed(reason):
                    self.closed_event = event
                    self._closed = self._closed or reason  # (the first reason is the cause)

    def _free_id(self) -> int:
        subscriber = self.conn.free_subscriber_id()
        while subscriber in self._inboxes:
            subscriber += 1
            while not self.conn.can_subscribe(subscriber):
                subscriber += 1
        return subscriber

    # ------------------------------------------------------------------ subscribing

    async def _elements(
        self, name: PublisherName | HubPublisher, prefetch: int, decoder: RunDecoder | None = None,
        refill: int = 1,
    ) -> AsyncGenerator[tuple[list[bytes], int], None]:
        """The subscription's deliveries as ``(elements, count)``; demand is given back in
        ``Request`` frames of at least ``refill`` (1 <= refill <= prefetch, so the hub always
        has credit left or is owed a refill: no stall), one frame per delivery when 1."""
        if self.token is not None:
            await self.ready()
        if self._closed:
            raise LogClosedError(self._closed)
        subscriber = self._free_id()
        inbox = self._inboxes[subscriber] = _Inbox(name)
        self.conn.send(Subscribe(str(name), subscriber, prefetch))
        if decoder is not None:
            self.conn.set_run_decoder(subscriber, decoder)
        self._flush()
        refill = max(1, min(refill, prefetch))
        owed = 0  # delivered and not requested again yet
        try:
            while True:
                if not inbox.elements:
                    if inbox.done is not None:
                        if inbox.done == "complete":
                            return
                        raise (ConnectionLost if inbox.lost else RsioError)(inbox.done)
                    inbox.wake.clear()
                    await inbox.wake.wait()
                    continue
                elements, count = inbox.elements, inbox.count
                inbox.elements, inbox.count = [], 0
                owed += count
                if owed >= refill and inbox.done is None and self.conn.is_subscribed(subscriber):
                    self.conn.send(Request(subscriber, owed))  # refill the prefetch
                    self._flush()
                    owed = 0
                yield elements, count
        finally:
            if inbox.done is None and self.conn.is_subscribed(subscriber):
                self.conn.send(Cancel(subscriber))
                self._flush()
            del self._inboxes[subscriber]

    async def subscribe(
        self,
        stream: str,
        *,
        from_id: int | str | FromTime = "earliest",
        until_id: int | None = None,
        key: bytes | None = None,
        prefetch: int = 4096,
    ) -> AsyncGenerator[Batch, None]:
        """Batches of ``stream`` from ``from_id`` (an id, "earliest", "latest" or
        ``FromTime(ms)``: the first event whose timestamp is at least ``ms``), then live (or up
        to ``until_id``), with ids, keys and timestamps (the envelope format)."""
        name = PublisherName(stream, start_position(from_id), until_id, key)
        decoder = envelope_run_decoder(stream)
        async for items, _ in self._elements(name, prefetch, decoder):
            # Runs come decoded (Batch); a frame the run decoder left alone comes raw.
            raw: list[bytes] = []
            for item in items:
                if isinstance(item, Batch):
                    if raw:
                        yield envelopes_batch(stream, raw)
                        raw = []
                    yield item
                else:
                    raw.append(item)
            if raw:
                yield envelopes_batch(stream, raw)

    async def subscribe_records(
        self,
        stream: str,
        *,
        from_id: int | str | FromTime = "earliest",
        until_id: int | None = None,
        key: bytes | None = None,
        prefetch: int = 16,
    ) -> AsyncGenerator[Batch, None]:
        """Like :meth:`subscribe`, in ``format=records``: each element is a whole batch, one
        log record with its CRC-32C (checked here), so no work is done per event; ``prefetch``
        counts batches (of up to 1 MiB each), and demand is given back in ``Request`` frames of
        half of it (one small write per record cost an executor's read about a fifth of its
        time, mostly the kernel's work for the peer's data: docs/spark.md)."""
        name = PublisherName(stream, start_position(from_id), until_id, key, "records")
        async for elements, _ in self._elements(name, prefetch, refill=prefetch // 2):
            for element in elements:
                yield record_to_batch(stream, element)

    async def subscribe_values(
        self,
        stream: str,
        *,
        size: int = 0,
        from_id: int | str | FromTime = "earliest",
        until_id: int | None = None,
        key: bytes | None = None,
        prefetch: int = 65536,
    ) -> AsyncGenerator[Values, None]:
        """Values only (``format=value``); with ``size=N`` in fixed-size mode, packed
        ``onNextPacked`` runs handed over as one buffer per delivery."""
        name = PublisherName(stream, start_position(from_id), until_id, key, "value", size)
        async for elements, _ in self._elements(name, prefetch):
            if size:
                yield Values(stream, size, elements[0] if len(elements) == 1 else
                             b"".join(elements))  # fmt: skip
            else:
                yield Values(stream, 0, items=tuple(elements))

    async def streams(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """What the hub knows of ``names`` (default: every stream): dicts with ``stream``,
        ``exists``, ``first_id`` (None when empty), ``latest_id`` (0 when none), ``events`` and
        ``bytes``, from the hub's publisher ``?streams``."""
        query = HubPublisher(streams=None if names is None else tuple(names))
        rows: list[dict[str, Any]] = []
        async for elements, _ in self._elements(query, 1024):
            rows += [json.loads(e) for e in elements]
        return rows

    async def ids_at(self, times: Mapping[str, int]) -> dict[str, int | None]:
        """Per stream of ``times``, the first id whose timestamp is at least its time (ms),
        ``None`` when no event is that new: the hub's publisher ``?times=`` (an O(log n)
        lookup each). :class:`~tidewire.model.TidewireError` for a stream not answered."""
        rows: list[bytes] = []
        if times:
            async for elements, _ in self._elements(times_publisher(times), 1024):
                rows += elements
        return ids_from_rows(times, rows)

    # ------------------------------------------------------------------ publishing

    async def ready(self) -> None:
        """Wait for the hub's hello (and, with a token, its ``authenticated``); raise
        :class:`~tidewire.model.LogClosedError` with the hub's reason if it closed instead."""
        await self._handshake.wait()
        if self._closed:
            raise LogClosedError(self._closed)

    async def publisher(
        self,
        stream: str,
        *,
        format: Literal["envelope", "value", "records"] = "envelope",
        size: int = 0,
        key: bytes | None = None,
        txn: str | None = None,
        max_queue_bytes: int = 8 * 1024 * 1024,
        stage: str | None = None, action: Literal["commit", "abort"] | None = None,  # .rsio_staging
    ) -> Publisher:
        """Offer a publisher for ``stream`` (publishing extension). ``format="value"`` sends
        values only (ids and timestamps assigned by the hub, every event keyed ``key``); with
        ``size=N`` every value is N bytes and they travel packed. With ``txn``, everything
        sent before :meth:`Publisher.close` is stored at once and exactly once for that
        transaction id, however often it is offered again (docs/protocols/rsio.md)."""
        validate_stream_name(stream)  # before the hub hears of it
        if size and format != "value":
            raise ValueError("size=N needs format='value'")
        if key is not None and format != "value":
            raise ValueError("key= needs format='value' (envelopes carry their own keys)")
        await self._handshake.wait()
        if self._closed:
            raise LogClosedError(self._closed)
        if not self.conn.publishing:
            raise RsioError("the hub does not offer the publishing extension (1)")
        offer = self.conn.free_offer_id()
        while offer in self._outlets:
            offer += 1
        name = OfferName(stream, format, key, txn, stage, action)
        outlet = self._outlets[offer] = Publisher(self, offer, name, size, max_queue_bytes)
        self.conn.send(Offer(offer, str(name)))
        self._flush()
        return outlet

    async def publish(
        self,
        stream: str,
        events: Batch | Sequence[bytes],
        *,
        assign_ids: bool = True,
        txn: str | None = None,
    ) -> Receipt:
        """Publish ``events`` (a batch, or values) to ``stream`` and return once they are
        durable. With ``assign_ids=False`` a batch keeps its own ids (above the latest). With
        ``txn``, the events are stored exactly once for that transaction id: publishing again
        under it stores nothing and returns the ids of the first time."""
        if txn is not None and not assign_ids:
            raise ValueError("a transaction's events get the hub's ids: assign_ids=False "
                             "cannot be honoured")  # fmt: skip
        pub = await self.publisher(stream, txn=txn)
        try:
            receipt = await pub.submit(events, assign_ids=assign_ids)
        finally:
            with contextlib.suppress(RsioError):  # (its error is the receipt's too)
                await pub.close()  # a transaction is committed once the offer completes
        return await receipt

    async def close(self) -> None:
        if not self.conn.closed:
            with contextlib.suppress(TidewireError):
                self.conn.send(Goodbye("client closing"))
                self._flush()
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            await asyncio.wait_for(asyncio.shield(self._task), 5)
        self._task.cancel()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()

    async def __aenter__(self) -> RsioClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Connect(Opening[RsioClient]):
    """``connect(url)``: awaitable (gives the client) and an async context manager."""

    def __init__(self, url: str, token: str | None, ssl: SSLContext | None,
                 keepalive: bool = False) -> None:  # fmt: skip
        parts = urlsplit(url)
        if parts.scheme not in ("rsio", "rsios") or not parts.hostname:
            raise ValueError(f"not an rsio:// or rsios:// URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 7400
        self.token = token
        self.ssl = ssl if ssl is not None or parts.scheme == "rsio" else create_default_context()
        self.keepalive = keepalive

    async def _open(self) -> RsioClient:
        _, wire = await asyncio.get_running_loop().create_connection(
            WireProtocol, self.host, self.port, ssl=self.ssl
        )
        if self.keepalive:
            _tcp_keepalive(wire)
        client = RsioClient(wire, wire, self.token)
        if self.token is not None:
            try:
                await client.ready()  # a refused token fails here, not at the first subscribe
            except LogClosedError:
                await client.close()
                raise
        return client


def _tcp_keepalive(writer: WireProtocol) -> None:
    """TCP keepalive (Linux: probes after 15 s of silence, every 5 s, 3 of them), so that a
    subscriber waiting on a quiet stream notices a hub that vanished without a reset (its
    host died, a NAT forgot the flow) within about 30 s: RS.io has no ping of its own."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class _ConnectAny(Opening[RsioClient]):
    """``connect("rsio://h1:7400,rsio://h2:7400")`` without ``retry``: one try of each
    gateway in order, the first that connects (a refused token or certificate at once)."""

    def __init__(self, urls: Sequence[str], token: str | None, ssl: SSLContext | None) -> None:
        self.each = [_Connect(url, token, ssl) for url in urls]  # (their errors here)
        self.urls = tuple(urls)

    async def _open(self) -> RsioClient:
        from .reconnect import first_reachable

        by_url = dict(zip(self.urls, self.each, strict=True))
        return await first_reachable(self.urls, lambda url: by_url[url]._open(), _final_one)


def _final_one(exc: BaseException) -> BaseException | None:
    """A refused connection or a timeout: try the next gateway; not a certificate."""
    if isinstance(exc, OSError) and not isinstance(exc, SSLCertVerificationError):
        return None
    return exc


@overload
def connect(url: str | Sequence[str], *, token: str | None = None, ssl: SSLContext | None = None,
            retry: None = None) -> Opening[RsioClient]: ...  # fmt: skip
@overload
def connect(url: str | Sequence[str], *, token: str | None = None,
            ssl: SSLContext | None = None, retry: Retry) -> Reconnect: ...  # fmt: skip
def connect(url: str | Sequence[str], *, token: str | None = None,
            ssl: SSLContext | None = None, retry: Retry | None = None
            ) -> Opening[RsioClient] | Reconnect:  # fmt: skip
    """Open an RS.io connection to ``rsio://host:port`` (``rsios://`` or ``ssl=``: over TLS,
    the hub's certificate verified): ``async with connect(url) as hub`` (or
    ``hub = await connect(url)``, then ``await hub.close()``). ``token``: authenticate as that
    principal (extension 2); a refused token raises here. For mutual TLS, ``ssl`` carries the
    client certificate (``tidewire.server.guard.client_context``).

    Several gateways (cluster mode: each serves every stream): a list, or one string with
    commas, ``"rsio://h1:7400,rsio://h2:7400"`` or ``"rsio://h1:7400,h2:7400"``
    (:func:`~tidewire.client.reconnect.gateway_urls`). Without ``retry`` they are tried once
    each, in order, and the first that connects is used.

    With ``retry`` (a :class:`~tidewire.client.backoff.Retry`), the client is a
    :class:`~tidewire.client.resilient.ReconnectingClient`: it reconnects with backoff after a
    lost connection, resumes subscriptions after the last id handed out and re-offers what the
    hub has not acknowledged (docs/protocols/rsio.md, "Reconnecting clients"); with several
    gateways each new try goes to the next one, round robin (``client.url`` says which)."""
    from .reconnect import gateway_urls

    urls = gateway_urls(url)
    if retry is None:
        return _Connect(urls[0], token, ssl) if len(urls) == 1 else _ConnectAny(urls, token, ssl)
    from .backoff import Backoff  # (resilient builds on this module: imported when used)
    from .resilient import Reconnect

    for one in urls:
        _Connect(one, token, ssl)  # the URL's errors are raised here, not at the first try
    return Reconnect(lambda one: _Connect(one, token, ssl, keepalive=True)._open(),
                     Backoff(retry), what=",".join(urls), urls=urls)  # fmt: skip
