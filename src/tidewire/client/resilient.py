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
import itertools
import ssl
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from ..model import (
    AccessError,
    Batch,
    LogClosedError,
    TidewireError,
    Unauthenticated,
    validate_stream_name,
)
from ..protocols.rsio import ConnectionClosed
from .backoff import Backoff
from .opening import Opening
from .reconnect import Reconnector
from .rsio import ConnectionLost, Receipt, RsioClient, RsioError, Values

__all__ = ["Opener", "Reconnect", "ReconnectingClient", "ResilientPublisher"]

Opener = Callable[[], Awaitable[RsioClient]]
"""Opens one new connection to the hub at each call."""

_ID_ORDER = "is not greater than the latest id"  # the text of tidewire.model.IdOrderError
IN_DOUBT_TRIES = 8  # own ids: waits for the hub to finish appends of a lost connection


class ReconnectingClient:
    """An RS.io client that outlives its connections (see the module docstring).

    Counters, for tests and soaks: ``connects`` (connections opened), ``reconnects`` (those
    after the first), ``lost`` (connections lost), ``failed_attempts`` (tries that failed),
    ``last_error`` (why the last connection or try failed), ``error`` (the final error, once
    there is one: the client is then unusable).
    """

    def __init__(self, open: Opener, *, backoff: Backoff | None = None, what: str = "the hub",
                 connect_timeout: float = 10.0, stable_after: float = 1.0) -> None:  # fmt: skip
        """``open``: makes one connection per call. ``backoff``: the pacing (its ``retry``
        bounds the tries of one outage; its clock, sleep and random source may be fakes).
        ``connect_timeout``: a try that has not finished its handshake by then failed.
        ``stable_after``: a connection that lived this long (by the backoff's clock) ends
        its outage even if it delivered nothing."""
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
            final=self._final_try, closed=lambda: RsioError("this client is closed"),
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
        async with asyncio.timeout(self.connect_timeout):
            client = await self.open()
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
        from_id: int | str,
        until_id: int | None,
        open_sub: Callable[[RsioClient, int | str], AsyncGenerator[Batch, None]],
    ) -> AsyncGenerator[Batch, None]:
        """Batches of ``open_sub``, resumed after the last id handed out on each connection."""
        if not isinstance(from_id, int) and from_id not in ("earliest", "latest"):
            raise ValueError(f"from_id must be an id, 'earliest' or 'latest', not {from_id!r}")
        start: int | str = from_id
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
        from_id: int | str = "earliest",
        until_id: int | None = None,
        key: bytes | None = None,
        prefetch: int = 4096,
    ) -> AsyncGenerator[Batch, None]:
        """:meth:`RsioClient.subscribe <tidewire.client.rsio.RsioClient.subscribe>`, resumed
        across reconnects: every event once, in order."""

        def open_sub(client: RsioClient, start: int | str) -> AsyncGenerator[Batch, None]:
            return client.subscribe(stream, from_id=start, until_id=until_id, key=key,
                                    prefetch=prefetch)  # fmt: skip

        return self._follow(stream, from_id, until_id, open_sub)

    def subscribe_records(
        self,
        stream: str,
        *,
        from_id: int | str = "earliest",
        until_id: int | None = None,
        key: bytes | None = None,
        prefetch: int = 16,
    ) -> AsyncGenerator[Batch, None]:
        """:meth:`RsioClient.subscribe_records <tidewire.client.rsio.RsioClient.
        subscribe_records>` (whole log records, CRC-checked), resumed across reconnects."""

        def open_sub(client: RsioClient, start: int | str) -> AsyncGenerator[Batch, None]:
            return client.subscribe_records(stream, from_id=start, until_id=until_id, key=key,
                                            prefetch=prefetch)  # fmt: skip

        return self._follow(stream, from_id, until_id, open_sub)

    async def subscribe_values(
        self,
        stream: str,
        *,
        size: int = 0,
        from_id: int | str = "earliest",
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

        def open_sub(client: RsioClient, start: int | str) -> AsyncGenerator[Batch, None]:
            return client.subscribe(stream, from_id=start, until_id=until_id, key=key,
                                    prefetch=prefetch)  # fmt: skip

        async with contextlib.aclosing(self._follow(stream, from_id, until_id, open_sub)) as it:
            async for batch in it:
                yield _values(batch, size)

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


@dataclass(slots=True, eq=False)
class _Item:
    """A submitted batch, held until the hub acknowledges it."""

    events: Batch | tuple[bytes, ...]
    count: int
    nbytes: int
    future: asyncio.Future[Receipt]
    first_id: int = 0  # own ids: the first id as submitted (a re-offer may send fewer)
    offered: int = 0  # offers it was handed to: after one, the hub may have stored it
    txn: str | None = None  # its transaction, fixed once chosen (re-offers must match)


class ResilientPublisher:
    """Publishes into one stream across reconnects: :meth:`submit` queues a batch (waiting
    while ``max_unacked_bytes`` are held) and returns the future of its
    :class:`~tidewire.client.rsio.Receipt`; :meth:`close` waits until every batch is
    acknowledged. Which mode is exactly once: the module docstring.

    Counters: ``acked`` batches, ``offered_again`` (batches offered on a later connection
    than their first), ``found_stored`` (own ids: found stored after a reconnect, not offered
    again), ``txns`` (transactions committed), ``error`` (the final error, once there is one).
    """

    def __init__(
        self,
        hub: ReconnectingClient,
        stream: str,
        *,
        format: Literal["envelope", "value"] = "envelope",
        size: int = 0,
        key: bytes | None = None,
        assign_ids: bool = True,
        exactly_once: bool = True,
        max_unacked_bytes: int = 32 * 1024 * 1024,
        max_txn_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        validate_stream_name(stream)
        if size and format != "value":
            raise ValueError("size=N needs format='value'")
        if key is not None and format != "value":
            raise ValueError("key= needs format='value' (envelopes carry their own keys)")
        if not assign_ids and format != "envelope":
            raise ValueError("values carry no ids: assign_ids=False needs format='envelope'")
        if max_unacked_bytes < 1 or max_txn_bytes < 1:
            raise ValueError("max_unacked_bytes and max_txn_bytes are at least 1")
        self.hub = hub
        self.stream = stream
        self.format = format
        self.size = size
        self.key = key
        self.mode: Literal["txn", "own_ids", "at_least_once"] = (
            "own_ids" if not assign_ids else "txn" if exactly_once else "at_least_once"
        )
        self.max_unacked_bytes = max_unacked_bytes
        self.max_txn_bytes = max_txn_bytes
        self.acked = 0
        self.offered_again = 0
        self.found_stored = 0
        self.txns = 0
        self.error: BaseException | None = None
        self._items: deque[_Item] = deque()
        self._unacked_bytes = 0
        self._last_own_id = 0
        self._room = asyncio.Event()
        self._wake = asyncio.Event()
        self._closing = False
        self._txn_prefix = uuid.uuid4().hex
        self._txn_seq = itertools.count(1)
        hub._publishers.add(self)
        self._task = asyncio.create_task(self._run())

    @property
    def unacked_bytes(self) -> int:
        return self._unacked_bytes

    @property
    def unacked(self) -> int:
        """Batches submitted and not yet acknowledged."""
        return len(self._items)

    # ------------------------------------------------------------------ the application's side

    async def submit(self, events: Batch | Sequence[bytes]) -> asyncio.Future[Receipt]:
        """Queue ``events`` (waiting while the unacknowledged bytes are at the bound) and
        return the future of their receipt. Own ids (``assign_ids=False``) need a
        :class:`~tidewire.model.Batch` whose ids are above those submitted before."""
        self._check()
        item = self._item(events)
        while self._unacked_bytes and self._unacked_bytes + item.nbytes > self.max_unacked_bytes:
            self._room.clear()
            await self._room.wait()
            self._check()
        if self.mode == "own_ids":
            assert isinstance(item.events, Batch)
            if item.first_id <= self._last_own_id:
                raise ValueError(f"own ids must grow: {item.first_id} after {self._last_own_id}")
            self._last_own_id = item.events.last_id
        self._items.append(item)
        self._unacked_bytes += item.nbytes
        self._wake.set()
        return item.future

    async def send(self, events: Batch | Sequence[bytes]) -> Receipt:
        """Publish ``events`` and return once they are durable (across reconnects)."""
        return await (await self.submit(events))

    async def close(self) -> None:
        """Wait until every submitted batch is acknowledged and end the offer; raise the
        publisher's final error (also each pending receipt's) if it has one."""
        self._closing = True
        self._wake.set()
        await asyncio.shield(self._task)
        if self.error is not None:
            raise self.error

    async def __aenter__(self) -> ResilientPublisher:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            self._abort(RsioError("the publisher was left on an error"))

    def _check(self) -> None:
        if self.error is not None:
            raise self.error
        if self._closing:
            raise RsioError("this publisher is closed")

    def _item(self, events: Batch | Sequence[bytes]) -> _Item:
        """Check ``events`` now (a bad batch must fail its submit, not the publisher later)."""
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        if isinstance(events, Batch):
            if self.mode == "own_ids":
                events.validate()
            if self.size and any(len(events.value(i)) != self.size for i in range(len(events))):
                raise ValueError(f"every value must be {self.size} bytes")
            return _Item(events, len(events), events.nbytes, future, first_id=events.first_id)
        if self.mode == "own_ids":
            raise ValueError("assign_ids=False takes a Batch (its ids are the events' ids)")
        values = tuple(events)
        if not values:
            raise ValueError("nothing to publish")
        if self.size and any(len(v) != self.size for v in values):
            raise ValueError(f"every value must be {self.size} bytes")
        return _Item(values, len(values), sum(map(len, values)) + 20 * len(values), future)

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        in_doubt = 0
        try:
            while self._items or not self._closing:
                client = await self.hub.connection()
                try:
                    if self.mode == "txn":
                        await self._drive_txns(client)
                    else:
                        await self._drive_offer(client)
                    return
                except (ConnectionLost, LogClosedError):
                    if client.closed is None:
                        raise
                    self.offered_again += sum(1 for item in self._items if item.offered)
                except RsioError as exc:
                    # Own ids: the hub may still be appending what a lost connection sent
                    # (its latest id then lags behind the ids it accepted): wait, look again.
                    head = self._items[0] if self._items else None
                    if not (self.mode == "own_ids" and _ID_ORDER in str(exc) and head is not None
                            and head.offered > 1 and in_doubt < IN_DOUBT_TRIES):  # fmt: skip
                        raise
                    in_doubt += 1
                    retry = self.hub.backoff.retry
                    await self.hub.backoff.sleep(min(retry.maximum, retry.initial * 2**in_doubt))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
        finally:
            self.hub._publishers.discard(self)

    def _ack(self, item: _Item, receipt: Receipt, client: RsioClient) -> None:
        head = self._items.popleft()
        assert head is item, "acknowledgements come in order"
        self._unacked_bytes -= item.nbytes
        self._room.set()
        self.acked += 1
        self.hub.made_progress(client)
        if not item.future.done():
            item.future.set_result(receipt)

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        while self._items:
            item = self._items.popleft()
            if not item.future.done():
                item.future.set_exception(exc)
        self._unacked_bytes = 0
        self._room.set()

    def _abort(self, exc: BaseException) -> None:
        if not self._task.done():
            self._task.cancel()
        if self.error is None:
            self._fail(exc)
        self.hub._publishers.discard(self)

    async def _drive_txns(self, client: RsioClient) -> None:
        """One transaction at a time, each holding what was waiting when it started."""
        while True:
            self._wake.clear()
            if not self._items:
                if self._closing:
                    return
                await self._wake.wait()
                continue
            group = self._group()
            pub = await client.publisher(self.stream, format=self.format, size=self.size,
                                         key=self.key, txn=group[0].txn)  # fmt: skip
            futures: list[asyncio.Future[Receipt]] = []
            for item in group:
                item.offered += 1
                future = await pub.submit(item.events)
                future.add_done_callback(_retrieved)
                futures.append(future)
            await pub.close()  # the transaction commits when its offer completes
            for item, future in zip(group, futures, strict=True):
                self._ack(item, future.result(), client)
            self.txns += 1

    def _group(self) -> list[_Item]:
        """The next transaction: the one offered before, if its answer was lost (the very
        same batches, under the same id), else the batches waiting, up to ``max_txn_bytes``."""
        head = self._items[0]
        if head.txn is None:
            txn = f"{self._txn_prefix}-{next(self._txn_seq)}"
            total = 0
            for item in self._items:
                if item.txn is not None or (total and total + item.nbytes > self.max_txn_bytes):
                    break
                item.txn = txn
                total += item.nbytes
        return list(itertools.takewhile(lambda item: item.txn == head.txn, self._items))

    async def _drive_offer(self, client: RsioClient) -> None:
        """One plain offer for this connection, batches pipelined into it."""
        if self.mode == "own_ids":
            await self._skip_stored(client)
        pub = await client.publisher(self.stream, format=self.format, size=self.size,
                                     key=self.key)  # fmt: skip
        pub.ended.add_done_callback(lambda _: self._wake.set())
        own_ids = self.mode == "own_ids"
        inflight: deque[tuple[_Item, asyncio.Future[Receipt]]] = deque()
        while True:
            self._wake.clear()
            while inflight and inflight[0][1].done():
                item, future = inflight.popleft()
                receipt = future.result()  # (a lost connection raises here)
                if own_ids:  # (a re-offer may have sent only the batch's tail)
                    receipt = Receipt(item.count, item.first_id, receipt.last_id)
                self._ack(item, receipt, client)
            if len(inflight) < len(self._items):
                item = self._items[len(inflight)]
                item.offered += 1
                future = await pub.submit(item.events, assign_ids=not own_ids)
                future.add_done_callback(_retrieved)
                future.add_done_callback(lambda _: self._wake.set())
                inflight.append((item, future))
                continue
            if pub.ended.done():
                pub.ended.result()  # the hub ended the offer: its reason
                raise RsioError(f"the offer for {self.stream!r} ended early")
            if self._closing and not self._items:
                break
            await self._wake.wait()
        await pub.close()

    async def _skip_stored(self, client: RsioClient) -> None:
        """Own ids, after a reconnect: the batches offered before whose ids are at or below
        the stream's latest were stored (by that offer: ids only grow, and this publisher
        writes them), so they are acknowledged, not offered again; one stored in part is
        offered from its first id above the latest."""
        if not (self._items and self._items[0].offered):
            return
        rows = await client.streams([self.stream])
        latest = int(rows[0]["latest_id"]) if rows else 0
        while self._items and self._items[0].offered:
            item = self._items[0]
            batch = item.events
            assert isinstance(batch, Batch)
            if batch.last_id > latest:
                if batch.first_id <= latest:
                    item.events = batch.slice(batch.index_of(latest + 1), len(batch))
                return
            self.found_stored += 1
            self._ack(item, Receipt(item.count, item.first_id, batch.last_id), client)


class Reconnect(Opening[ReconnectingClient]):
    """``connect(url, retry=...)``: awaitable (gives a connected :class:`ReconnectingClient`)
    and an async context manager (closes it)."""

    def __init__(self, open: Opener, backoff: Backoff, *, what: str) -> None:
        self.open = open
        self.backoff = backoff
        self.what = what

    async def _open(self) -> ReconnectingClient:
        backoff = dataclasses.replace(self.backoff, failures=0, since=None)  # one per client
        client = ReconnectingClient(self.open, backoff=backoff, what=self.what)
        try:
            await client.connection()  # the first connection (tries paced as later ones)
        except BaseException:
            await client.close()
            raise
        return client


def _retrieved(future: asyncio.Future[Any]) -> None:
    """An inner receipt whose failure is the publisher's to report (not asyncio's)."""
    if not future.cancelled():
        future.exception()


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
