"""The one ingest path: how every protocol hands what it receives to the hub.

A connection gets an :class:`Ingest` from :meth:`Hub.ingest <tidewire.hub.Hub.ingest>` and, for
each ordered flow of appends (an RS.io offer, a Seguro session, a Tolliver link), a
:class:`Pipeline` from it. The rules the adapters used to keep each in their own way:

* **Ordered receipts.** :meth:`Pipeline.submit` returns a future per batch; the futures resolve
  in submission order, whatever order the appends complete in, so an adapter acknowledges in
  order by awaiting them in order.
* **Appends in flight.** Up to ``appends_in_flight`` appends of a pipeline run at once (they
  share the storage's group commits). In a pipeline made with ``serial_own_ids`` (RS.io offers)
  a batch with its own ids waits until nothing is in flight, so that an append refused for its
  ids (``IdOrderError``) is never followed by a stored one. Batches beyond that wait in the
  pipeline (their bytes are counted, see below).
* **Fenced.** Each append carries the storage's fence taken when the pipeline had nothing in
  flight: after an append refused for want of space, the ones already in flight are refused
  too (by the storage), and so are those still waiting in the pipeline (here). A pipeline that
  has drained starts afresh with a new fence.
* **Bytes bounded, one pause signal.** :attr:`Ingest.pending_bytes` counts what the connection
  received and is not durable yet: bytes the adapter holds before it has a whole batch
  (:meth:`Ingest.hold`), and batches submitted (their ``held`` bytes, released when their append
  succeeds or fails). Above ``max_pending_bytes`` the adapter is told to pause reading
  (``on_pause(True)``); at or below half of it, to resume (``on_pause(False)``). With the
  connection's budget :class:`~.budget.Share` (``share=``), the same count is its ``"ingest"``
  gauge (bytes already in memory: recorded, never refused; the adapter checks the budget when
  the bytes are declared, before it reads them).
* **Transactions.** :meth:`Ingest.submit_txn` commits exactly once through the hub's registry
  (:mod:`.txn`), as the connection's :attr:`Ingest.principal`: transactions are keyed by
  (principal, stream, id), so the adapter keeps the principal current (or gives the share,
  whose principal follows :meth:`~.budget.Share.rebind`).

Everything runs on the event loop; there is no task of its own (completions drive it through
future callbacks), so an abandoned pipeline costs nothing once its appends are done.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..model import MAX_ID, Batch, InvalidBatch, now_ms
from ..registry import PROTOCOLS
from .txn import TxnReceipt

if TYPE_CHECKING:
    from .budget import Share
    from .hub import Hub

__all__ = [
    "INGEST_DEFAULTS",
    "Ingest",
    "IngestLimits",
    "Pipeline",
    "abandon",
    "one_event",
]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """One connection's inbound bounds (settings ``ingest.*``, docs/configuration.md).

    ``max_pending_bytes``: received and not yet durable, before reading pauses;
    ``appends_in_flight``: per pipeline, when the hub assigns the ids; ``commit_bytes``: about
    how much an adapter gathers into one append (records stay small enough for subscribers to
    read without waste, big enough for the group commit)."""

    max_pending_bytes: int = 16 * MiB
    appends_in_flight: int = 4
    commit_bytes: int = MiB

    def __post_init__(self) -> None:
        if self.max_pending_bytes < 1 or self.appends_in_flight < 1 or self.commit_bytes < 1:
            raise ValueError("ingest limits are positive")


INGEST_DEFAULTS: dict[str, IngestLimits] = {
    p.name: IngestLimits(p.ingest.max_pending_bytes, p.ingest.appends_in_flight,
                         p.ingest.commit_bytes)
    for p in PROTOCOLS
    if p.ingest is not None
}  # fmt: skip
"""Each protocol's limits when the settings do not say, from the one protocol registry
(:mod:`tidewire.registry`: the values each adapter had before they shared this
path; changing them would change what a peer sees when it floods the hub, or how many appends
share a group commit)."""


class Ingest:
    """One connection's way into the hub: byte accounting, the pause signal, pipelines."""

    def __init__(
        self,
        hub: Hub,
        *,
        via: str,
        limits: IngestLimits,
        on_pause: Callable[[bool], None] | None = None,
        principal: str = "anonymous",
        share: Share | None = None,
    ) -> None:
        self.hub = hub
        self.via = via
        self.limits = limits
        self.on_pause = on_pause
        self.share = share
        """The connection's budget account: :attr:`pending_bytes` is its ``"ingest"`` gauge."""
        self._principal = principal
        self._pending = 0
        self._paused = False

    @property
    def principal(self) -> str:
        """Who writes (its transactions are its own): the share's principal when there is a
        share, else the one given. Setting it rebinds the share (the peer authenticated)."""
        return self.share.principal if self.share is not None else self._principal

    @principal.setter
    def principal(self, name: str) -> None:
        self._principal = name
        if self.share is not None:
            self.share.rebind(name)

    @property
    def pending_bytes(self) -> int:
        """Bytes received and not yet durable (held, or in a pipeline)."""
        return self._pending

    @property
    def paused(self) -> bool:
        """Whether the adapter was told to stop reading (and not told to resume since)."""
        return self._paused

    def hold(self, nbytes: int) -> None:
        """Count ``nbytes`` just received (not yet submitted); may signal a pause."""
        self._pending += nbytes
        if self.share is not None:
            self.share.hold("ingest", self._pending)
        if not self._paused and self._pending > self.limits.max_pending_bytes:
            self._paused = True
            if self.on_pause is not None:
                self.on_pause(True)

    def release(self, nbytes: int) -> None:
        """Forget ``nbytes`` held (durable, failed or discarded); may signal a resume."""
        self._pending -= nbytes
        if self.share is not None:
            self.share.hold("ingest", self._pending)
        if self._paused and self._pending <= self.limits.max_pending_bytes // 2:
            self._paused = False
            if self.on_pause is not None:
                self.on_pause(False)

    def pipeline(self, *, serial_own_ids: bool = False) -> Pipeline:
        """A new ordered, fenced flow of appends (one per offer, session or link);
        ``serial_own_ids``: a batch with its own ids is appended alone (module docstring)."""
        return Pipeline(self, serial_own_ids=serial_own_ids)

    async def submit_txn(self, txn: str, batch: Batch) -> TxnReceipt:
        """Append ``batch`` exactly once for :attr:`principal`'s transaction id ``txn`` into
        its stream (:meth:`Hub.commit <tidewire.hub.Hub.commit>`): a replay returns where the
        first commit put it."""
        return await self.hub.commit(txn, batch, via=self.via, principal=self.principal)


_ONE = struct.Struct("=QqII")  # one event's id, timestamp and value offsets (array's Q, q, I)


def one_event(stream: str, event_id: int, value: bytes, timestamp: int | None = None) -> Batch:
    """The batch ``Batch.build(stream, [value], ids=[event_id], timestamps=timestamp)`` makes
    (stamped now by default), for a fifth of its cost: its id, timestamp and offsets packed in
    one ``bytes`` (a lone Seguro ``SAVE``'s batch; the builder's general path cost about 8 µs of
    a SAVE's ~80 µs on the hub, benchmarks/README.md, round 3). The stream's name is checked
    by the hub's append, as for every batch; the id here (1..2**63-1)."""
    if not 0 < event_id <= MAX_ID:
        raise InvalidBatch("ids must be within 1..2**63-1")
    packed = memoryview(_ONE.pack(event_id, now_ms() if timestamp is None else timestamp, 0,
                                  len(value)))  # fmt: skip
    return Batch(stream, packed[:8].cast("Q"), packed[8:16].cast("q"), packed[16:].cast("I"),
                 memoryview(value))  # fmt: skip


def _retrieved(future: asyncio.Future[Batch]) -> None:
    if not future.cancelled():
        future.exception()


def abandon(receipt: asyncio.Future[Batch]) -> None:
    """No one will await ``receipt`` (its connection went): its append still completes, and a
    failure, which the storage logs, is not reported again as never retrieved."""
    receipt.add_done_callback(_retrieved)


@dataclass(slots=True, eq=False)
class _Item:
    batch: Batch
    assign_ids: bool
    held: int
    receipt: asyncio.Future[Batch] | None  # (None: started by :meth:`Pipeline.begin`)
    append: asyncio.Future[Batch] | None = field(default=None)


class Pipeline:
    """An ordered flow of appends of one :class:`Ingest` (see the module docstring)."""

    def __init__(self, ingest: Ingest, *, serial_own_ids: bool = False) -> None:
        self.ingest = ingest
        self.serial_own_ids = serial_own_ids
        self._items: deque[_Item] = deque()  # submission order: started ones first
        self._started = 0
        self._explicit = False  # an append with its own ids is in flight
        self._fence = 0
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Appends handed to the storage whose receipt has not resolved yet."""
        return self._started

    def __len__(self) -> int:
        """Batches submitted whose receipt has not resolved yet (in flight or waiting)."""
        return len(self._items)

    def has_room(self, assign_ids: bool = True) -> bool:
        """Whether a batch submitted now would start at once (adapters that gather while
        appends run use it to make bigger batches instead of queueing small ones)."""
        if assign_ids or not self.serial_own_ids:
            return len(self._items) < self.ingest.limits.appends_in_flight
        return not self._items

    def submit(
        self, batch: Batch, *, assign_ids: bool = False, held: int = 0
    ) -> asyncio.Future[Batch]:
        """Queue ``batch`` for appending; the future resolves to it as stored (or fails),
        after every batch submitted before it. ``held``: bytes of it the adapter counted with
        :meth:`Ingest.hold`, released when its append succeeds or fails. Cancelling the
        future does not stop an append already handed to the storage."""
        receipt: asyncio.Future[Batch] = asyncio.get_running_loop().create_future()
        if self._closed:
            self.ingest.release(held)
            receipt.cancel()
            return receipt
        self._items.append(_Item(batch, assign_ids, held, receipt))
        self._advance()
        return receipt

    async def append(self, batch: Batch, *, assign_ids: bool = False, held: int = 0) -> Batch:
        """:meth:`submit` ``batch`` and wait for its receipt (the same order, fences and
        bytes). When it may start at once, its append runs in the caller's task: no task of
        its own and no extra turn of the loop, which is what a lone append waits for (a
        Seguro ``SAVE``, a Tolliver chunk); when an earlier append is still in flight, it
        then waits for that one's receipt before returning its own."""
        if self._closed or len(self._items) > self._started or not self._may_start(assign_ids):
            return await self.submit(batch, assign_ids=assign_ids, held=held)
        loop = asyncio.get_running_loop()
        item = _Item(batch, assign_ids, held, loop.create_future(), loop.create_future())
        receipt = item.receipt
        assert receipt is not None
        receipt.add_done_callback(_retrieved)  # (an error is raised here, not there)
        self._items.append(item)
        fence = self._begin(item)
        done = item.append
        assert done is not None
        hub, via = self.ingest.hub, self.ingest.via
        try:
            # The storage's own future when it can queue at once (no coroutine per layer).
            queued = hub.submit(batch, assign_ids=assign_ids, via=via, fence=fence)
            stored = await (queued if queued is not None else
                            hub.append(batch, assign_ids=assign_ids, via=via,
                                       fence=fence))  # fmt: skip
        except asyncio.CancelledError:
            done.cancel()  # (the storage still finishes the write: as with submit)
            self._advance()
            raise
        except Exception as exc:
            done.set_exception(exc)
            self._advance()
            raise
        done.set_result(stored)
        self._advance()
        return stored if receipt.done() else await receipt

    def begin(self, batch: Batch, *, assign_ids: bool = False,
              held: int = 0) -> asyncio.Future[Batch] | None:  # fmt: skip
        """Hand ``batch`` to the storage at once, with no task and no receipt of its own, when
        nothing of this pipeline is in flight or waiting and the storage can queue it so
        (:meth:`Hub.submit <tidewire.hub.Hub.submit>`): the append's own future, which
        resolves once the batch is stored, or fails. The pipeline's bookkeeping (the ``held``
        bytes, the fence, the order of what is submitted after it) runs in a callback added
        before the caller's, so a callback the caller adds sees it done. ``None``: nothing was
        done (use :meth:`append` or :meth:`submit`). The caller retrieves the future's
        outcome (a lone Seguro ``SAVE`` answers in its callback)."""
        if self._closed or self._items or not self._may_start(assign_ids):
            return None
        ingest = self.ingest
        hub = ingest.hub
        fence = hub.fence()  # (nothing in flight: as :meth:`_begin` takes it)
        queued = hub.submit(batch, assign_ids=assign_ids, via=ingest.via, fence=fence)
        if queued is None:
            return None
        item = _Item(batch, assign_ids, held, None, queued)
        self._items.append(item)
        self._fence = fence
        self._started += 1
        self._explicit = self.serial_own_ids and not assign_ids
        queued.add_done_callback(self._advance)
        return queued

    def close(self) -> None:
        """The flow is over (its connection went): batches not handed to the storage yet are
        dropped (their receipts cancelled, their bytes released); those in flight complete."""
        self._closed = True
        while self._items and self._items[-1].append is None:
            item = self._items.pop()
            self.ingest.release(item.held)
            if item.receipt is not None:
                item.receipt.cancel()

    # ------------------------------------------------------------------ internals

    def _advance(self, _: object = None) -> None:
        """Resolve the receipts at the head whose appends are done, then start what may."""
        items = self._items
        while items and items[0].append is not None and items[0].append.done():
            item = items.popleft()
            append = item.append
            assert append is not None
            self._started -= 1
            if self.serial_own_ids and not item.assign_ids:
                self._explicit = False
            self.ingest.release(item.held)
            failure = None if append.cancelled() else append.exception()
            receipt = item.receipt
            if append.cancelled():
                if receipt is not None:
                    receipt.cancel()
            elif failure is not None:
                if receipt is not None and not receipt.done():
                    receipt.set_exception(failure)
                self._fail_waiting(failure)
            elif receipt is not None and not receipt.done():
                receipt.set_result(append.result())
        for item in items:
            if item.append is not None:
                continue
            if not self._may_start(item.assign_ids):
                break
            self._start(item)

    def _may_start(self, assign_ids: bool) -> bool:
        """Whether an append may start now (behind those in flight)."""
        if self._started and self.serial_own_ids and (self._explicit or not assign_ids):
            return False
        return self._started < self.ingest.limits.appends_in_flight

    def _begin(self, item: _Item) -> int:
        """Count ``item`` as in flight; the fence its append carries."""
        if not self._started:  # everything before is settled: a refusal from now on counts
            self._fence = self.ingest.hub.fence()
        self._started += 1
        self._explicit = self._explicit or (self.serial_own_ids and not item.assign_ids)
        return self._fence

    def _start(self, item: _Item) -> None:
        ingest = self.ingest
        fence = self._begin(item)
        # A task, not Hub.submit: the append starts a turn later, when more of the flow may
        # have come, so that a flow's chunks share one commit round (measured: queued at once,
        # a SAVE MANY of 1000 x 1 KiB cost the hub 10% more CPU per flow, and fewer flows/s).
        item.append = asyncio.ensure_future(ingest.hub.append(
            item.batch, assign_ids=item.assign_ids, via=ingest.via, fence=fence))  # fmt: skip
        item.append.add_done_callback(self._advance)

    def _fail_waiting(self, failure: BaseException) -> None:
        """An append failed: what waits behind it is refused with the same error (as the
        storage refuses what is in flight behind a refusal), not appended after it."""
        while self._items and self._items[-1].append is None:
            item = self._items.pop()
            self.ingest.release(item.held)
            if item.receipt is not None and not item.receipt.done():
                item.receipt.set_exception(failure)
