"""Clients that recover: RS.io (over TCP or over Tube) that reconnects, resumes and re-offers.

:class:`ReconnectingClient` holds one :class:`~tidewire.client.rsio.RsioClient` at a time, made
by an *opener* (``tidewire.client.rsio.connect(url, retry=...)`` and
``tidewire.client.tube.connect(url, retry=...)`` each give one, so both transports share this
module). When the connection is lost (EOF, a reset, the hub's ``goodbye`` at shutdown or at a
deadline), the next user of the client opens a new one, paced by a
:class:`~tidewire.client.backoff.Backoff`: at once after a connection that was *stable* (it
delivered or acknowledged something, or lived ``stable_after`` seconds), else after the
backoff's wait, so that a hub that accepts and drops at once (too many connections) is not
hammered. A refused token, a certificate that does not verify, a refused upgrade and protocol
errors are final: a retry cannot fix them, and every user of the client gets the error.

Subscriptions remember the last id handed to the application and resume at the next one. Ids
of a stream strictly increase, so the application sees every event once, in order, across
reconnects; ``from_id="latest"`` is pinned to an id (the stream's latest + 1) before the first
subscribe, so that a reconnect before the first event misses nothing either.

Publishing (:class:`ResilientPublisher`) keeps every submitted batch until the hub has
acknowledged it (bounded in bytes: ``submit`` waits for room) and offers what is left again, in
order, on the next connection. What the hub can tell apart decides the mode:

* hub-assigned ids (the default): each offer is a transaction, ``txn=<publisher uuid>-<n>``,
  holding the batches that were waiting when it started (so one commit is shared by everything
  that queued up meanwhile: client-side group commit). Re-offered under the same id, it is
  stored once, and the hub answers with the ids of the first commit: **exactly once**.
* own ids (``assign_ids=False``): plain offers; after a reconnect the stream's latest id tells
  which batches offered before were stored (ids only grow), and those are not offered again:
  **exactly once** for a publisher that is the only writer of its ids.
* ``exactly_once=False``: plain offers, offered again as they were: **at least once** (a batch
  stored whose acknowledgement was lost is stored twice), at the cost of a plain publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, cast

import aiohttp

from ..model import (
    AccessError,
    Batch,
    LogClosedError,
    TidewireError,
    Unauthenticated,
)
from ..protocols.rsio import ConnectionClosed
from ..protocols.rsio.names import FromTime, start_position
from .backoff import Backoff
from .opening import Opening
from .reconnect import Reconnector
from .resilient_publisher import ResilientPublisher
from .rsio import ConnectionLost, Receipt, RsioClient, RsioError, Values

__all__ = ["Opener", "Reconnect", "ReconnectingClient", "ResilientPublisher", "UrlOpener"]

Opener = Callable[[], Awaitable[RsioClient]]
"""Opens one new connection to the hub at each call."""

UrlOpener = Callable[[str], Awaitable[RsioClient]]
"""Opens one new connection to the gateway at the URL it is given (several gateways)."""

Start = int | str | FromTime
"""Where a subscription starts: an id, "earliest", "latest" or a time."""



class ReconnectingClient:
    """An RS.io client that outlives its connections (see the module docstring).

    Counters, for tests and soaks: ``connects`` (connections opened), ``reconnects`` (those
    after the first), ``lost`` (connections lost), ``failed_attempts`` (tries that failed),
    ``last_error`` (why the last connection or try failed), ``error`` (the final error, once
    there is one: the client is then unusable).
    """

    def __init__(self, open: Opener | UrlOpener, *, backoff: Backoff | None = None,
                 what: str = "the hub", connect_timeout: float = 10.0, stable_after: float = 1.0,
                 urls: Sequence[str] = ()) -> None:  # fmt: skip
        """``open``: makes one connection per call: an :data:`Opener`, or with ``urls`` a
        :data:`UrlOpener` called with the gateway to try. ``backoff``: the pacing (its
        ``retry`` bounds the tries of one outage; its clock, sleep and random source may be
        fakes). ``connect_timeout``: a try that has not finished its handshake by then failed.
        ``stable_after``: a connection that lived this long (by the backoff's clock) ends
        its outage even if it delivered nothing. ``urls``: gateways that all serve the same
        streams (cluster mode), tried round robin: a lost connection or a failed try goes on
        at the next one, resuming and re-offering as after a reconnect to the same hub."""
        self.open = open
        self.what = what
        self.connect_timeout = connect_timeout
        self.stable_after = stable_after
        self.client: RsioClient | None = None
        self.lost = 0
        self.failed_attempts = 0
        self.last_error: str | None = None
        self.error: Exception | None = None
        self._closing = False
        self._lock = asyncio.Lock()
        self._reconnector: Reconnector[RsioClient] = Reconnector(
            backoff if backoff is not None else Backoff(), what, stable_after=stable_after,
            final=self._final_try, closed=lambda: RsioError("this client is closed"), urls=urls,
        )  # fmt: skip
        self._disposing: set[asyncio.Task[None]] = set()
        self._publishers: set[ResilientPublisher] = set()

    # ------------------------------------------------------------------ the connection

    @property
    def backoff(self) -> Backoff:
        """The pacing of reconnects (a test may replace it between outages)."""
        return self._reconnector.backoff

    @backoff.setter
    def backoff(self, backoff: Backoff) -> None:
        self._reconnector.backoff = backoff

    @property
    def connects(self) -> int:
        """Connections opened."""
        return self._reconnector.connects

    @property
    def reconnects(self) -> int:
        """Connections opened after the first."""
        return self._reconnector.reconnects

    @property
    def connected(self) -> bool:
        return self.client is not None and self.client.closed is None

    @property
    def url(self) -> str | None:
        """The gateway of the current connection (or of the next try while there is none);
        ``None`` for a client made with an :data:`Opener` and no ``urls``."""
        return self._reconnector.url

    @property
    def urls(self) -> tuple[str, ...]:
        """Every gateway this client may use, in the order they are tried."""
        return self._reconnector.urls

    @property
    def failovers(self) -> int:
        """Moves to the next gateway (failed tries and lost connections, with several)."""
        return self._reconnector.failovers

    @property
    def principal(self) -> str | None:
        """What the hub's ``authenticated`` said on the current connection (with a token)."""
        return self.client.principal if self.client is not None else None

    async def connection(self) -> RsioClient:
        """The live connection: the current one, or a new one (paced by the backoff) once it
        is lost. Raises the final error (a refused token, :class:`~.backoff.GaveUp`, ...)."""
        while True:
            if self.error is not None:
                raise self.error
            if self._closing:
                raise RsioError("this client is closed")
            client = self.client
            if client is not None and client.closed is None:
                return client
            async with self._lock:  # one reconnect, however many users noticed the loss
                if self.client is client and self.error is None and not self._closing:
                    try:
                        await self._replace(client)
                    except Exception as exc:
                        if not self._closing:
                            self.error = exc
                        raise

    async def ready(self) -> None:
        """Wait for a live connection (handshake and, with a token, ``authenticated`` done)."""
        await (await self.connection()).ready()

    def made_progress(self, client: RsioClient) -> None:
        """``client`` delivered or acknowledged something: it counts as stable."""
        if client is self.client:
            self._reconnector.progressed()

    async def _replace(self, old: RsioClient | None) -> None:
        reconnector = self._reconnector
        if old is not None:
            self.client = None
            self.lost += 1
            self.last_error = old.closed
            self._dispose(old)
            final = _final(old.closed or "", old.closed_event)
            if final is not None:
                raise final
            if reconnector.lasted():
                reconnector.reset()  # a new outage: try at once
            else:  # it did not last: a failed try of the same outage
                await reconnector.pause(ConnectionLost(old.closed or "connection lost"))
        self.client = await reconnector.dial(self._attempt)

    def _final_try(self, exc: BaseException) -> BaseException | None:
        """A failed try: the error that ends the client, or ``None`` (counted; another try)."""
        final = _final_error(exc) if isinstance(exc, Exception) else exc
        if final is None:
            self.failed_attempts += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
        return final

    async def _attempt(self) -> RsioClient:
        url = self._reconnector.url
        async with asyncio.timeout(self.connect_timeout):
            if url is None:
                client = await cast(Opener, self.open)()
            else:
                client = await cast(UrlOpener, self.open)(url)
            try:
                await client.ready()  # the hello (and authenticated) arrived, else why not
            except BaseException:
                self._dispose(client)
                raise
        if self._closing:  # (closed while this try was under way)
            self._dispose(client)
            raise RsioError("this client is closed")
        return client

    def _dispose(self, client: RsioClient) -> None:
        """Close a dead connection in the background (a lost WebSocket may take its time)."""
        task = asyncio.create_task(client.close())
        self._disposing.add(task)
        task.add_done_callback(self._disposing.discard)

    async def close(self) -> None:
        """Close: publishers still holding batches fail them (close those first to flush),
        subscriptions end with :class:`RsioError`, a reconnect under way stops."""
        self._closing = True
        self._reconnector.close()
        for publisher in list(self._publishers):
            publisher._abort(RsioError("the client was closed"))
        client, self.client = self.client, None
        if client is not None:
            await client.close()
        if self._disposing:
            await asyncio.wait(self._disposing, timeout=10)

    async def __aenter__(self) -> ReconnectingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ subscribing

    async def _follow(
        self,
        stream: str,
        from_id: Start,
        until_id: int | None,
        open_sub: Callable[[RsioClient, Start], AsyncGenerator[Batch, None]],
    ) -> AsyncGenerator[Batch, None]:
        """Batches of ``open_sub``, resumed after the last id handed out on each connection
        (a ``FromTime`` is asked again on a new connection until an event was handed out)."""
        start: Start = start_position(from_id)
        last: int | None = None
        while True:
            client = await self.connection()
            try:
                if start == "latest":  # pin it, or a reconnect before the first event skips some
                    rows = await client.streams([stream])
                    if rows:  # (else the principal may not read it: the subscribe says so)
                        start = int(rows[0]["latest_id"]) + 1
                if last is not None:
                    start = last + 1
                if until_id is not None and isinstance(start, int) and start > until_id:
                    return
                async with contextlib.aclosing(open_sub(client, start)) as batches:
                    async for batch in batches:
                        if last is not None and batch.first_id <= last:  # (never, by from=)
                            if batch.last_id <= last:
                                continue
                            batch = batch.slice(batch.index_of(last + 1), len(batch))
                        last = batch.last_id
                        self.made_progress(client)
                        yield batch
                return
            except (ConnectionLost, LogClosedError):
                if client.closed is None:
                    raise  # not this connection's end: the hub ended the subscription
                # else: the next connection() replaces it (or raises the final error)

    def subscribe(
        self,
        stream: str,
        *,
        from_id: int | str | FromTime = "earliest",
        until_id: int | None = None,
        key: bytes | None = None,
        prefetch: int = 4096,
    ) -> AsyncGenerator[Batch, None]:
        """:meth:`RsioClient.subscribe <tidewire.client.rsio.RsioClient.subscribe>`, resumed
        across reconnects: every event once, in order."""

        def open_sub(client: RsioClient, start: Start) -> AsyncGenerator[Batch, None]:
            return client.subscribe(stream, from_id=start, until_id=until_id, key=key,
                                    prefetch=prefetch)  # fmt: skip

        return self._follow(stream, from_id, until_id, open_sub)

    def subscribe_records(
        self,
        stream: str,
        *,
        from_id: int | str | FromTime = "earliest",
        until_id: int | None = None,
        key: bytes | None = None,
        prefetch: int = 16,
    ) -> AsyncGenerator[Batch, None]:
        """:meth:`RsioClient.subscribe_records <tidewire.client.rsio.RsioClient.
        subscribe_records>` (whole log records, CRC-checked), resumed across reconnects."""

        def open_sub(client: RsioClient, start: Start) -> AsyncGenerator[Batch, None]:
            return client.subscribe_records(stream, from_id=start, until_id=until_id, key=key,
                                            prefetch=prefetch)  # fmt: skip

        return self._follow(stream, from_id, until_id, open_sub)

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
        """Values, as :meth:`RsioClient.subscribe_values
        <tidewire.client.rsio.RsioClient.subscribe_values>` gives them, resumed across
        reconnects. Values carry no ids, so underneath this subscribes to envelopes (the ids
        are what resuming needs; ``prefetch`` still counts events) and packs their values:
        with ``size=N``, a value of another size ends it with :class:`RsioError`, as the hub
        would."""
        if size < 0:
            raise ValueError("size is 0 (variable) or the fixed size of every value")

        def open_sub(client: RsioClient, start: Start) -> AsyncGenerator[Batch, None]:
            return client.subscribe(stream, from_id=start, until_id=until_id, key=key,
                                    prefetch=prefetch)  # fmt: skip

        async with contextlib.aclosing(self._follow(stream, from_id, until_id, open_sub)) as it:
            async for batch in it:
                yield _values(batch, size)

    async def ids_at(self, times: Mapping[str, int]) -> dict[str, int | None]:
        """:meth:`RsioClient.ids_at <tidewire.client.rsio.RsioClient.ids_at>`, asked again on
        a new connection if the answer was lost."""
        while True:
            client = await self.connection()
            try:
                return await client.ids_at(times)
            except (ConnectionLost, LogClosedError):
                if client.closed is None:
                    raise

    async def streams(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """:meth:`RsioClient.streams <tidewire.client.rsio.RsioClient.streams>`, asked again
        on a new connection if the answer was lost."""
        while True:
            client = await self.connection()
            try:
                return await client.streams(names)
            except (ConnectionLost, LogClosedError):
                if client.closed is None:
                    raise

    # ------------------------------------------------------------------ publishing

    async def publisher(
        self,
        stream: str,
        *,
        format: Literal["envelope", "value"] = "envelope",
        size: int = 0,
        key: bytes | None = None,
        assign_ids: bool = True,
        exactly_once: bool = True,
        max_unacked_bytes: int = 32 * 1024 * 1024,
        max_txn_bytes: int = 4 * 1024 * 1024,
    ) -> ResilientPublisher:
        """A :class:`ResilientPublisher` for ``stream`` (see there and the module docstring
        for what is exactly once)."""
        if self.error is not None:
            raise self.error
        if self._closing:
            raise RsioError("this client is closed")
        return ResilientPublisher(
            self, stream, format=format, size=size, key=key, assign_ids=assign_ids,
            exactly_once=exactly_once, max_unacked_bytes=max_unacked_bytes,
            max_txn_bytes=max_txn_bytes,
        )  # fmt: skip

    async def publish(
        self,
        stream: str,
        events: Batch | Sequence[bytes],
        *,
        assign_ids: bool = True,
        txn: str | None = None,
        exactly_once: bool = True,
    ) -> Receipt:
        """Publish ``events`` and return once they are durable, across reconnects. Exactly
        once (a transaction of its own, or own ids) unless ``exactly_once=False``. With
        ``txn``, that transaction id is used, and offered again until the hub answers."""
        if txn is not None:
            if not assign_ids:
                raise ValueError("a transaction's events get the hub's ids: assign_ids=False "
                                 "cannot be honoured")  # fmt: skip
            while True:
                client = await self.connection()
                try:
                    receipt = await client.publish(stream, events, txn=txn)
                except (ConnectionLost, LogClosedError):
                    if client.closed is None:
                        raise
                    continue
                self.made_progress(client)
                return receipt
        pub = await self.publisher(stream, assign_ids=assign_ids, exactly_once=exactly_once)
        try:
            future = await pub.submit(events)
        finally:
            with contextlib.suppress(TidewireError):  # (its error is the receipt's too)
                await pub.close()
        return await future


class Reconnect(Opening[ReconnectingClient]):
    """``connect(url, retry=...)``: awaitable (gives a connected :class:`ReconnectingClient`)
    and an async context manager (closes it). With ``urls``, ``open`` is a :data:`UrlOpener`."""

    def __init__(self, open: Opener | UrlOpener, backoff: Backoff, *, what: str,
                 urls: Sequence[str] = ()) -> None:  # fmt: skip
        self.open = open
        self.backoff = backoff
        self.what = what
        self.urls = tuple(urls)

    async def _open(self) -> ReconnectingClient:
        backoff = dataclasses.replace(self.backoff, failures=0, since=None)  # one per client
        client = ReconnectingClient(self.open, backoff=backoff, what=self.what, urls=self.urls)
        try:
            await client.connection()  # the first connection (tries paced as later ones)
        except BaseException:
            await client.close()
            raise
        return client


def _values(batch: Batch, size: int) -> Values:
    if not size:
        return Values(batch.stream, 0, items=tuple(batch.value(i) for i in range(len(batch))))
    offsets = batch.value_offsets
    base = offsets[0]
    if offsets.tolist() != list(range(base, base + (len(batch) + 1) * size, size)):
        raise RsioError(f"stream {batch.stream!r}: a value of ids {batch.first_id}.."
                        f"{batch.last_id} is not {size} bytes")  # fmt: skip
    return Values(batch.stream, size, bytes(batch.values))


def _final(reason: str, event: ConnectionClosed | None) -> TidewireError | None:
    """The error a lost connection ends the client with, if no retry can help."""
    if reason.startswith("authentication failed"):
        return Unauthenticated(reason)
    if reason.startswith(("protocol error", "the hub does not offer")):
        return RsioError(reason)
    if event is not None and event.error and not event.by_peer:  # the hub's bytes were wrong
        return RsioError(f"protocol error: {reason}")
    return None


def _final_error(exc: Exception) -> Exception | None:
    """What a failed try ends the client with, or ``None`` when another try may succeed."""
    if isinstance(exc, LogClosedError):  # the hub closed during the handshake: its reason
        return _final(str(exc), None)
    if isinstance(exc, AccessError | ssl.SSLCertVerificationError
                  | aiohttp.ClientConnectorCertificateError):  # fmt: skip
        return exc
    if isinstance(exc, aiohttp.ClientResponseError):  # a refused Tube upgrade
        return None if exc.status >= 500 or exc.status in (408, 429) else exc
    if isinstance(exc, OSError | aiohttp.ClientError | ConnectionLost):  # (and TimeoutError)
        return None
    return exc
