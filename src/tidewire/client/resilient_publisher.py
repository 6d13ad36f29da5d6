"""Publishing that survives lost connections (:class:`ResilientPublisher`, from
:meth:`tidewire.client.resilient.ReconnectingClient.publisher`): every submitted batch is kept
until the hub acknowledged it (bounded in bytes) and offered again, in order, on the next
connection; the modes (transactions, own ids, at least once) are in the docstring of
:mod:`tidewire.client.resilient`."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..model import Batch, LogClosedError, validate_stream_name
from .rsio import ConnectionLost, Receipt, RsioClient, RsioError

if TYPE_CHECKING:
    from .resilient import ReconnectingClient

__all__ = ["IN_DOUBT_TRIES", "QueuedBatch", "ResilientPublisher", "retrieved_quietly"]

_ID_ORDER = "is not greater than the latest id"  # the text of tidewire.model.IdOrderError
IN_DOUBT_TRIES = 8  # own ids: waits for the hub to finish appends of a lost connection


@dataclass(slots=True, eq=False)
class QueuedBatch:
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
        self._items: deque[QueuedBatch] = deque()
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

    def _item(self, events: Batch | Sequence[bytes]) -> QueuedBatch:
        """Check ``events`` now (a bad batch must fail its submit, not the publisher later)."""
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        if isinstance(events, Batch):
            if self.mode == "own_ids":
                events.validate()
            if self.size and any(len(events.value(i)) != self.size for i in range(len(events))):
                raise ValueError(f"every value must be {self.size} bytes")
            return QueuedBatch(events, len(events), events.nbytes, future, first_id=events.first_id)
        if self.mode == "own_ids":
            raise ValueError("assign_ids=False takes a Batch (its ids are the events' ids)")
        values = tuple(events)
        if not values:
            raise ValueError("nothing to publish")
        if self.size and any(len(v) != self.size for v in values):
            raise ValueError(f"every value must be {self.size} bytes")
        return QueuedBatch(values, len(values), sum(map(len, values)) + 20 * len(values), future)

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

    def _ack(self, item: QueuedBatch, receipt: Receipt, client: RsioClient) -> None:
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
                future.add_done_callback(retrieved_quietly)
                futures.append(future)
            await pub.close()  # the transaction commits when its offer completes
            for item, future in zip(group, futures, strict=True):
                self._ack(item, future.result(), client)
            self.txns += 1

    def _group(self) -> list[QueuedBatch]:
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
        inflight: deque[tuple[QueuedBatch, asyncio.Future[Receipt]]] = deque()
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
                future.add_done_callback(retrieved_quietly)
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


def retrieved_quietly(future: asyncio.Future[Any]) -> None:
    """An inner receipt whose failure is the publisher's to report (not asyncio's)."""
    if not future.cancelled():
        future.exception()
