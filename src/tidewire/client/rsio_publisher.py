"""An open RS.io offer on the client side (tidewire's extension 1): :class:`Publisher`
queues batches (bounded in bytes), sends them as the hub requests elements, and resolves
each batch's future with its :class:`~.rsio_common.Receipt` once the hub has committed it.
Opened by :meth:`tidewire.client.rsio.RsioClient.publisher`."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model import Batch
from ..protocols.rsio import OnComplete, OnNextPacked, Subscribed
from ..protocols.rsio.envelopes import encode_envelopes
from ..protocols.rsio.names import OfferName
from ..record import encode
from .rsio_common import ConnectionLost, Receipt, RsioError

if TYPE_CHECKING:
    from .rsio import RsioClient

__all__ = ["PendingBatch", "Publisher"]


@dataclass(slots=True)
class PendingBatch:
    start: int  # the batch's elements are [start, end) of the offer
    end: int
    future: asyncio.Future[Receipt]
    own_ids: tuple[int, int] | None  # (first, last) when the batch keeps its own ids
    first_id: int = 0


class Publisher:
    """An open offer. :meth:`submit` queues a batch and returns a future that resolves, with its
    :class:`Receipt`, once the hub has committed it; :meth:`send` waits for that.
    :meth:`close` completes the offer and waits for the hub to end it."""

    def __init__(
        self, client: RsioClient, offer: int, name: OfferName, size: int, max_queue_bytes: int
    ) -> None:
        self.client = client
        self.offer = offer
        self.name = name
        self.size = size
        self.max_queue_bytes = max_queue_bytes
        self.subscribed = False
        self.wake = asyncio.Event()
        self._queue: deque[bytes] = deque()  # elements (or packed runs) not yet sent
        self._queue_counts: deque[int] = deque()  # with size=N: events in each queued run
        self._queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._submitted = 0
        self._committed = 0
        self._pending: deque[PendingBatch] = deque()
        self._closing = False
        self.error: RsioError | None = None  # why the hub ended the offer, once it has
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # The offer's error also fails every pending batch, which is where the application
        # sees it; a publisher dropped after that must not make asyncio report it again.
        self.ended.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._pump = asyncio.create_task(self._pump_loop())

    @property
    def queued_bytes(self) -> int:
        """Bytes submitted but not yet sent to the hub (envelopes, or packed values): at most
        ``max_queue_bytes``, or one batch's bytes when that batch alone is larger (a submit
        waits while anything is queued and the batch would not fit)."""
        return self._queued_bytes

    @property
    def queued_entries(self) -> int:
        """Entries the publisher holds for data not yet sent (queued elements or packed runs,
        and with ``size`` the event count of each run): 0 once all it was given is sent, so a
        long-lived offer keeps nothing per element."""
        return len(self._queue) + len(self._queue_counts)

    # called by the client's dispatcher
    def _on_subscribed(self) -> None:
        self.subscribed = True
        self.client.conn.send(Subscribed(self.offer, self.size))
        self.wake.set()

    def _on_committed(self, count: int, first_id: int, last_id: int) -> None:
        """Elements [c0, c1) are durable as ids first_id..last_id: contiguous when the hub
        assigned them; a batch with its own ids knows them already."""
        c0, c1 = self._committed, self._committed + count
        self._committed = c1
        contiguous = last_id - first_id + 1 == count
        while self._pending and self._pending[0].start < c1:
            head = self._pending[0]
            if not head.first_id:
                head.first_id = (head.own_ids[0] if head.own_ids is not None
                                 else first_id + max(0, head.start - c0))  # fmt: skip
            if head.end > c1:
                break
            self._pending.popleft()
            if head.own_ids is not None:
                last = head.own_ids[1]
            else:
                last = first_id + (head.end - 1 - c0) if contiguous else last_id
            if not head.future.done():
                head.future.set_result(Receipt(head.end - head.start, head.first_id, last))

    def _end(self, error: str, *, lost: bool = False) -> None:
        self.wake.set()
        self._room.set()
        self._pump.cancel()
        kind = ConnectionLost if lost else RsioError
        exc = kind(f"offer for {self.name.stream!r} ended: {error}") if error else None
        self.error = exc
        while self._pending:
            pending = self._pending.popleft()
            if not pending.future.done():
                pending.future.set_exception(
                    exc or RsioError("offer ended before this batch was committed"))
        if not self.ended.done():
            if exc is None:
                self.ended.set_result(None)
            else:
                self.ended.set_exception(exc)

    # the application's side
    async def submit(self, events: Batch | Sequence[bytes], *, assign_ids: bool = True
                     ) -> asyncio.Future[Receipt]:  # fmt: skip
        """Queue ``events`` (waiting for room) and return the future of their receipt."""
        if self.error is not None:
            raise self.error
        if self._closing or self.ended.done():
            raise RsioError("this publisher is closed")
        if not assign_ids and self.name.format == "value":
            raise ValueError("values carry no ids: assign_ids=False needs format='envelope'")
        parts, count, nbytes = self._encode(events, assign_ids)
        own_ids = None
        if isinstance(events, Batch) and not assign_ids and self.name.format == "envelope":
            own_ids = (events.first_id, events.last_id)
        while self._queued_bytes and self._queued_bytes + nbytes > self.max_queue_bytes:
            self._room.clear()
            await self._room.wait()
            if self.ended.done():
                raise self.error or RsioError("the offer ended")
        self._queue.extend(parts)
        if self.size:  # (the event counts of packed runs; variable values count one each)
            self._queue_counts.extend(len(p) // self.size for p in parts)
        self._queued_bytes += nbytes
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        pending = PendingBatch(self._submitted, self._submitted + count, future, own_ids)
        self._pending.append(pending)
        self._submitted += count
        self.wake.set()
        return future

    async def send(self, events: Batch | Sequence[bytes], *, assign_ids: bool = True) -> Receipt:
        """Publish ``events`` and return once they are durable. (A transaction's events are
        stored only when the offer completes: use :meth:`submit`, then :meth:`close`.)"""
        if self.name.txn is not None:
            raise RsioError("a transaction commits at close(): use submit() and close()")
        return await (await self.submit(events, assign_ids=assign_ids))

    def _encode(self, events: Batch | Sequence[bytes], assign_ids: bool
                ) -> tuple[list[bytes], int, int]:  # fmt: skip
        if self.name.format == "value":
            if isinstance(events, Batch):
                values = [events.value(i) for i in range(len(events))]
            else:
                values = list(events)
            if not values:
                raise ValueError("nothing to publish")
            if self.size:
                if any(len(v) != self.size for v in values):
                    raise ValueError(f"every value must be {self.size} bytes")
                data = b"".join(values)
                step = self.size * max(1, 256 * 1024 // self.size)  # runs of at most ~256 KiB
                return [data[i : i + step] for i in range(0, len(data), step)], len(values), \
                    len(data)  # fmt: skip
            return values, len(values), sum(map(len, values))
        if self.name.format == "records" or self.name.action is not None:
            # a staged part (log records, ids placeholders) or a commit (its JSON element):
            # bytes are sent as they are (.rsio_staging), a batch as one record
            raw = ([bytes(encode(events.with_ids(1)).data)] if isinstance(events, Batch)
                   else list(events))  # fmt: skip
            return raw, len(raw), sum(map(len, raw))
        batch = events if isinstance(events, Batch) else Batch.build(self.name.stream, events)
        elements = encode_envelopes(batch, with_ids=not assign_ids)
        if not assign_ids:
            batch.validate()
        return elements, len(elements), sum(map(len, elements))

    async def _pump_loop(self) -> None:
        conn = self.client.conn
        while True:
            if not self._queue or not conn.demand(self.offer):
                if self._closing and not self._queue and self.subscribed:
                    if conn.peer_subscribed(self.offer):  # else the hub cancelled: it ends it
                        conn.send(OnComplete(self.offer))
                        self.client._flush()
                    return
                self.wake.clear()
                await self.wake.wait()
                continue
            demand = conn.demand(self.offer)
            sent = 0
            queue = self._queue
            if not self.size:  # one onNext per element, framed in one go
                run: list[bytes] = []
                while queue and len(run) < demand and sent < 256 * 1024:
                    element = queue.popleft()
                    run.append(element)
                    sent += len(element)
                conn.send_elements(self.offer, run)
            while self.size and queue and demand and sent < 256 * 1024:
                count = self._queue_counts[0]
                part = queue[0]
                if count > demand:  # split a packed run at the demand
                    cut = demand * self.size
                    queue[0], part = part[cut:], part[:cut]
                    self._queue_counts[0] -= demand
                    count = demand
                else:
                    queue.popleft()
                    self._queue_counts.popleft()
                conn.send(OnNextPacked(self.offer, count, part))
                demand -= count
                sent += len(part)
            self._queued_bytes -= sent
            self._room.set()
            self.client._flush()
            await self.client.writer.drain()

    async def close(self) -> None:
        """Complete the offer once every queued element is sent; wait for the hub to end it
        (raises :class:`RsioError` if the offer failed)."""
        self._closing = True
        self.wake.set()
        await asyncio.shield(self.ended)

    async def __aenter__(self) -> Publisher:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            await self.close()
            return
        # Leaving on an error: complete the offer in the background; its end is not awaited
        # (and its error, if any, is the one already being raised).
        if not self.ended.done():
            self._closing = True
            self.wake.set()
