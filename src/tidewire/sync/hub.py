"""The blocking RS.io client: :func:`connect` gives a :class:`SyncHub` (over TCP or Tube),
whose calls run the asyncio client's on ``tidewire.sync``'s loop; :class:`SyncSubscription`
is a subscription as a blocking iterator."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import weakref
from collections.abc import AsyncGenerator, Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import urlsplit

from ..client.reconnect import gateway_urls
from ..client.rsio import Receipt, RsioClient, Values
from ..client.rsio import connect as rsio_connect
from ..model import Batch, LogClosedError, UnknownStream
from ..protocols.rsio.names import FromTime, start_position
from .runner import CLOSE_SECONDS, RUNNER, Bound, Running, close_later, opened, quietly, wait

if TYPE_CHECKING:
    from ..client.resilient import ReconnectingClient

__all__ = ["PREFETCH", "SyncHub", "SyncPublisher", "SyncSubscription", "connect"]

Item = TypeVar("Item")
T = TypeVar("T")

PREFETCH = 4096
"""Events a subscription asks for at once: the asyncio client's default."""


class SyncSubscription(Generic[Item]):
    """A subscription as a blocking iterator: each ``next()`` awaits one batch of the asyncio
    client's async generator on the loop, so demand and backpressure stay the asyncio
    client's (a consumer that stops calling ``next()`` stops the hub's sending once its
    prefetch is used).

    Unlike an async generator, which does nothing until its first ``anext()``, the
    subscription starts at once (its first ``anext()`` is under way on the loop when
    :meth:`SyncHub.subscribe` returns): a script that subscribes from "latest" and then
    publishes sees its own event. ``timeout``: the most one ``next()`` waits; a timeout (or
    Ctrl-C) cancels the generator, which ends the subscription, as cancelling ``anext()``
    would. :meth:`close` (or leaving a ``with`` block) cancels it on the hub; an iterator
    dropped unfinished (a ``break`` out of a ``for`` loop) is closed by its finalizer. One
    thread at a time iterates it (as one task at a time iterates an async generator)."""

    def __init__(self, owner: Bound, agen: AsyncGenerator[Item, None],
                 timeout: float | None) -> None:  # fmt: skip
        self._owner = owner
        self._agen = agen
        self.timeout = timeout
        self._done = False
        self._closer = _Aclose(agen)
        self._finalizer = weakref.finalize(self, close_later, owner.loop, owner.pid,
                                           self._closer)  # fmt: skip
        self._finalizer.atexit = False
        self._first: Running[Item | None] | None = owner.start(_next_item(agen))
        self._closer.pending = self._first

    def __iter__(self) -> SyncSubscription[Item]:
        return self

    def __next__(self) -> Item:
        if self._done:
            raise StopIteration
        running, self._first = self._first, None
        try:
            if running is None:
                running = self._owner.start(_next_item(self._agen))
            item = wait(running, self.timeout)
            self._closer.pending = None
        except BaseException:
            self._end()  # the generator ended with the error (or was cancelled)
            raise
        if item is None:
            self._end()
            raise StopIteration
        return item

    def _end(self) -> None:
        self._done = True
        self._finalizer.detach()

    def close(self) -> None:
        """Cancel the subscription (waits for the generator to close); idempotent."""
        if self._finalizer.detach() is None:
            return
        self._done = True
        with contextlib.suppress(LogClosedError):  # (the client is closed: so is this)
            self._owner.call(self._closer.close(), CLOSE_SECONDS)

    def __enter__(self) -> SyncSubscription[Item]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Aclose:
    """``close()`` for a subscription's async generator, on the loop (what :meth:`close`
    and :func:`close_later` call): its first ``anext()``, if still under way, is cancelled
    first (a running generator cannot be closed)."""

    def __init__(self, agen: AsyncGenerator[Any, None]) -> None:
        self.agen = agen
        self.pending: Running[Any] | None = None

    async def close(self) -> None:
        if self.pending is not None:
            await self.pending.stop()
        await quietly(self.agen.aclose())


async def _next_item(agen: AsyncGenerator[Item, None]) -> Item | None:
    """The generator's next item, ``None`` at its end."""
    try:
        return await anext(agen)
    except StopAsyncIteration:
        return None


class SyncHub(Bound):
    """A blocking RS.io client (over TCP or Tube): what :func:`connect` returns. Its methods
    are the asyncio client's (:class:`~tidewire.client.rsio.RsioClient`, or with ``retry=``
    :class:`~tidewire.client.resilient.ReconnectingClient`), with the same arguments, results
    and exceptions, plus ``timeout=`` (seconds; ``None``: the one given to :func:`connect`).
    Safe to use from several threads at once (each call is one task on the loop)."""

    _client: RsioClient | ReconnectingClient

    @property
    def client(self) -> RsioClient | ReconnectingClient:
        """The asyncio client underneath; it lives on ``tidewire.sync``'s loop, so use it only
        in coroutines given to :func:`run`."""
        return self._client

    @property
    def principal(self) -> str | None:
        """Who the hub said this connection is (with a token), else ``None``."""
        return self._client.principal

    def publish(self, stream: str, values: Batch | Sequence[bytes], *, key: bytes | None = None,
                txn: str | None = None, assign_ids: bool = True,
                timeout: float | None = None) -> Receipt:  # fmt: skip
        """Publish ``values`` (a list of bytes, or a :class:`~tidewire.model.Batch`) to
        ``stream`` and return once they are durable: :meth:`RsioClient.publish
        <tidewire.client.rsio.RsioClient.publish>`. ``key``: every value keyed with it.
        ``txn``: stored exactly once for that transaction id. A timeout does not say whether
        the events were stored (as with the asyncio client): publish again under a ``txn``."""
        events = _events(stream, values, key)
        return self.call(self._client.publish(stream, events, assign_ids=assign_ids, txn=txn),
                          timeout)  # fmt: skip

    def read(self, stream: str, *, from_id: int | str | FromTime = "earliest",
             until_id: int | None = None, limit: int | None = None, key: bytes | None = None,
             timeout: float | None = None) -> list[Batch]:  # fmt: skip
        """The events of ``stream`` stored now from ``from_id`` (an id, "earliest", or
        ``FromTime(ms)``: the first event whose timestamp is at least ``ms``) up to
        ``until_id`` (default: the stream's latest id when the call starts), at most ``limit``
        of them (the last batch cut to fit), only those keyed ``key`` if given; never waits
        for events not stored yet (:meth:`subscribe` does). Raises
        :class:`~tidewire.model.UnknownStream` for a stream the hub does not have, and the
        asyncio client's :class:`~tidewire.client.rsio.RsioError` for what the hub refuses
        (ids removed by retention, a stream this principal may not read)."""
        start_position(from_id)  # (a bad one is a ValueError here, not on the loop)
        if limit is not None and limit < 1:
            raise ValueError(f"limit is at least 1, not {limit}")
        return self.call(_read(self._client, stream, from_id, until_id, limit, key), timeout)

    def subscribe(self, stream: str, *, from_id: int | str | FromTime = "earliest",
                  until_id: int | None = None, key: bytes | None = None,
                  prefetch: int = PREFETCH, timeout: float | None = None
                  ) -> SyncSubscription[Batch]:  # fmt: skip
        """Batches of ``stream`` from ``from_id`` ("earliest", "latest" or an id), then live
        (or up to ``until_id``): :meth:`RsioClient.subscribe
        <tidewire.client.rsio.RsioClient.subscribe>` as a blocking iterator. ``timeout``: the
        most one ``next()`` waits (default: for ever; a timeout ends the subscription)."""
        agen = self._client.subscribe(stream, from_id=from_id, until_id=until_id, key=key,
                                      prefetch=prefetch)  # fmt: skip
        return SyncSubscription(self, agen, timeout)

    def subscribe_values(self, stream: str, *, size: int = 0,
                         from_id: int | str | FromTime = "earliest",
                         until_id: int | None = None, key: bytes | None = None,
                         prefetch: int = 65536, timeout: float | None = None
                         ) -> SyncSubscription[Values]:  # fmt: skip
        """Values only, as :meth:`RsioClient.subscribe_values
        <tidewire.client.rsio.RsioClient.subscribe_values>` gives them, as a blocking
        iterator (``timeout`` as in :meth:`subscribe`)."""
        agen = self._client.subscribe_values(stream, size=size, from_id=from_id,
                                             until_id=until_id, key=key,
                                             prefetch=prefetch)  # fmt: skip
        return SyncSubscription(self, agen, timeout)

    def publisher(self, stream: str, *, timeout: float | None = None,
                  **options: Any) -> SyncPublisher:  # fmt: skip
        """An open offer for a steady flow (many batches in flight at once, where
        :meth:`publish` offers once per call): the asyncio client's ``publisher(stream,
        **options)`` (:meth:`RsioClient.publisher
        <tidewire.client.rsio.RsioClient.publisher>`: ``format``, ``size``, ``key``, ``txn``,
        ``max_queue_bytes``; with ``retry=``, :meth:`ReconnectingClient.publisher
        <tidewire.client.resilient.ReconnectingClient.publisher>`'s)."""
        pub = self.call(self._client.publisher(stream, **options), timeout)
        return SyncPublisher(self, pub)

    def streams(self, names: Sequence[str] | None = None, *,
                timeout: float | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """What the hub knows of ``names`` (default: every stream this principal may read):
        :meth:`RsioClient.streams <tidewire.client.rsio.RsioClient.streams>`."""
        return self.call(self._client.streams(names), timeout)

    def __enter__(self) -> SyncHub:
        return self


class SyncPublisher:
    """An open offer, blocking: :meth:`submit` queues a batch (waiting while the queue,
    bounded in bytes, has no room) and returns a ``concurrent.futures.Future`` of its
    :class:`~tidewire.client.rsio.Receipt`, resolved once the hub has committed it (cancelling
    that future does not withdraw the batch); :meth:`send` waits for the receipt;
    :meth:`close` (or leaving a ``with`` block) completes the offer and waits for the hub to
    end it (a transaction's events are stored then). Dropped unclosed, it is closed on the
    loop. Thread-safe, as the asyncio publisher is within its loop."""

    def __init__(self, owner: SyncHub, publisher: Any) -> None:
        self._owner = owner
        self._publisher = publisher
        self._finalizer = weakref.finalize(self, close_later, owner.loop, owner.pid, publisher)
        self._finalizer.atexit = False  # (at exit its client's close ends it)

    def submit(self, values: Batch | Sequence[bytes], *,
               timeout: float | None = None) -> concurrent.futures.Future[Receipt]:  # fmt: skip
        """Queue ``values`` (a list of bytes, or a batch); ``timeout`` bounds the wait for
        room, not the commit (wait on the future for that)."""
        events = _events("-", values, None)
        return self._owner.call(_handed_over(self._publisher.submit(events)), timeout)

    def send(self, values: Batch | Sequence[bytes], *,
             timeout: float | None = None) -> Receipt:  # fmt: skip
        """Publish ``values`` and return once they are durable."""
        receipt: Receipt = self._owner.call(self._publisher.send(_events("-", values, None)),
                                            timeout)  # fmt: skip
        return receipt

    def close(self, *, timeout: float | None = None) -> None:
        """Complete the offer once everything queued is sent, and wait for the hub to end it
        (raises the offer's error, if it failed); idempotent."""
        if self._finalizer.detach() is not None:
            self._owner.call(self._publisher.close(), timeout)

    def __enter__(self) -> SyncPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _handed_over(submitting: Awaitable[asyncio.Future[T]]
                       ) -> concurrent.futures.Future[T]:  # fmt: skip
    """On the loop: the asyncio future ``submitting`` gives, as a future another thread may
    wait on (its outcome copied over when it has one)."""
    future = await submitting
    out: concurrent.futures.Future[T] = concurrent.futures.Future()

    def copy(done: asyncio.Future[T]) -> None:
        if done.cancelled():
            out.cancel()
        elif (exc := done.exception()) is not None:
            out.set_exception(exc)
        else:
            out.set_result(done.result())

    future.add_done_callback(copy)
    return out


def _events(stream: str, values: Batch | Sequence[bytes], key: bytes | None
            ) -> Batch | Sequence[bytes]:  # fmt: skip
    if isinstance(values, bytes | bytearray | memoryview | str):
        raise TypeError("values is a list of events, not one value: publish(stream, [value])")
    if key is None:
        return values
    if isinstance(values, Batch):
        raise ValueError("key= keys plain values; a Batch carries its own keys")
    return Batch.build(stream, list(values), keys=[key] * len(values))


async def _read(client: RsioClient | ReconnectingClient, stream: str,
                from_id: int | str | FromTime, until_id: int | None, limit: int | None,
                key: bytes | None) -> list[Batch]:  # fmt: skip
    """:meth:`SyncHub.read` on the loop: the stream's latest id bounds the range, then a
    subscription up to it (cancelled once ``limit`` events are in)."""
    rows = await client.streams([stream])
    end = until_id
    if rows:  # (none: this principal may not read it, and the subscribe says so)
        if not rows[0]["exists"]:
            raise UnknownStream(stream)
        latest = int(rows[0]["latest_id"])
        end = latest if end is None else min(end, latest)
        if from_id == "latest" or end < 1 or (isinstance(from_id, int) and from_id > end):
            return []
    batches: list[Batch] = []
    count = 0
    prefetch = PREFETCH if limit is None else min(limit, PREFETCH)
    subscription = client.subscribe(stream, from_id=from_id, until_id=end, key=key,
                                    prefetch=prefetch)  # fmt: skip
    async with contextlib.aclosing(subscription) as batches_in:
        async for batch in batches_in:
            if limit is not None and count + len(batch) >= limit:
                batches.append(batch.slice(0, limit - count))
                break
            batches.append(batch)
            count += len(batch)
    return batches


def connect(url: str | Sequence[str], *, timeout: float | None = None,
            **options: Any) -> SyncHub:  # fmt: skip
    """A blocking RS.io client, connected: ``with tidewire.sync.connect("rsio://127.0.0.1:7400")
    as hub``. ``url``: ``rsio://`` or ``rsios://`` (:func:`tidewire.connect`), ``ws://`` or
    ``wss://`` (RS.io over Tube, :func:`tidewire.client.tube.connect`), or several gateways
    as those take them. ``options``: that function's own (``token``, ``ssl``, ``retry``, ...),
    with their meaning. ``timeout``: the default bound of every call, this connect included
    (``None``: no bound)."""
    first = gateway_urls(url)[0]
    scheme = urlsplit(first).scheme
    opening: Awaitable[RsioClient | ReconnectingClient]
    if scheme in ("rsio", "rsios"):
        opening = rsio_connect(url, **options)
    elif scheme in ("ws", "wss"):
        from ..client import tube  # (aiohttp: loaded only when used)

        opening = tube.connect(url, **options)
    else:
        raise ValueError(f"not an rsio://, rsios://, ws:// or wss:// URL: {first!r}")
    loop = RUNNER.loop()
    client = RUNNER.call(opened(opening), timeout, loop)
    return SyncHub(client, loop, timeout)
