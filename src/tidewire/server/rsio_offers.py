"""Publishing (RS.io extension 1) on one RS.io session, whatever carries it (TCP or Tube).

For each ``offer`` the hub subscribes to the client's publisher with subscriber id = the offer
id and a window of ``OFFER_WINDOW`` elements. What arrives is gathered per offer; one committer
task per offer hands everything gathered so far to the hub's ingest path
(:mod:`tidewire.hub.ingest`, one pipeline per offer) as one batch (so the log's group commit
sees big batches), then sends ``committed`` and requests as many elements as it has just
stored: the disk drives the backpressure. Bytes received and not yet committed are bounded per
connection by the ingest (``max_pending_bytes``), whose pause signal the session turns into
"stop reading". A transaction offer (``txn=``) is held whole, within ``max_txn_bytes`` per
connection and within the connection's budget share (gauge ``"txn"``: an element that does not
fit fails the offer with ``offerEnded``), and committed once at its onComplete
(``Ingest.submit_txn``). The session is told (``on_ingest``) whenever the ingest's pending bytes
may have changed, to charge them to its share (gauge ``"ingest"``).

Staged transactions (docs/protocols/rsio.md "Staged transactions", :mod:`tidewire.hub.staging`):
a ``stage=`` offer's records are checked and written through to the hub's staging area (files,
or JetStream in cluster mode) by the offer's task, :data:`STAGE_WINDOW` elements requested
ahead of what is written (held meanwhile within the connection's budget share, gauge
``"stage"``; never ``max_txn_bytes``: a part is not held whole), closed at onComplete and
acknowledged with one
``committed(offer, records, 1, events)``; a ``commit`` offer's one JSON element names the
parts (held as a transaction offer's elements are) and is committed at onComplete
(``Transactions.commit_staged``); an ``abort`` offer drops the parts at onComplete.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from ..hub import Ingest, PartSink, Pipeline, Share, abandon
from ..model import Batch, TidewireError, now_ms
from ..observe.logs import ConnectionLog
from ..protocols.rsio import Cancel, Committed, Connection, OfferEnded, Request, Subscribe
from ..protocols.rsio.names import OfferName
from ..protocols.rsio.runs import OfferRun, join_offer_parts, offer_run_decoder
from ..protocols.rsio.staged import parse_parts

__all__ = ["OFFER_WINDOW", "STAGE_WINDOW", "Inlet", "Offers"]

OFFER_WINDOW = 8192  # elements requested ahead of what is committed, per offer
STAGE_WINDOW = 4  # a stage= offer's records (a few MiB each) requested ahead of those written



@dataclass(slots=True, eq=False)
class Inlet:
    """One offer being received: elements gathered for the next commit."""

    offer: int
    name: OfferName
    element_size: int = 0  # from the client's subscribed
    # elements, packed runs of them, or decoded runs of envelopes
    parts: list[bytes | OfferRun] = field(default_factory=list)
    count: int = 0  # elements in parts
    nbytes: int = 0
    ended: str | None = None  # None: open; "": onComplete; else the publisher's onError
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    explicit_ids: bool | None = None  # decided by the offer's first envelope batch
    failed: str | None = None  # the hub gave up on the offer (a transaction too big)
    part: PartSink | None = None  # a stage= offer's part


class Offers:
    """The offers of one connection: ``conn`` is its RS.io machine, ``ingest`` the hub's
    ingest path for it, ``flush`` hands what ``conn`` queued to the carrier. The session calls
    :meth:`open` for an ``offer`` it allowed and routes the offer subscriptions' events here
    (:meth:`subscribed`, :meth:`element`, :meth:`packed`, :meth:`run`, :meth:`decoded`,
    :meth:`end`); :meth:`cancel_all` when the connection ends."""

    def __init__(self, conn: Connection, ingest: Ingest, log: ConnectionLog,
                 flush: Callable[[], None], *, max_offers: int, max_txn_bytes: int,
                 share: Share | None = None,
                 on_ingest: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.conn = conn
        self.ingest = ingest
        self.log = log  # (the session replaces it once the carrier names the connection)
        self.flush = flush
        self.max_offers = max_offers
        self.max_txn_bytes = max_txn_bytes
        self.inlets: dict[int, Inlet] = {}
        self.txn_bytes = 0  # held by this connection's open transaction offers
        self.stage_bytes = 0  # staged records held until written (gauge "stage")
        self.share = share
        self.on_ingest = on_ingest

    # ------------------------------------------------------------------ the session's calls

    def open(self, offer: int, publisher: str, name: OfferName) -> str | None:
        """Subscribe to the peer's ``publisher`` (parsed: ``name``) for ``offer`` (the
        principal may write its stream: the session checked), or refuse it: the reason
        (sent with ``offerEnded``; the session logs and counts it), else ``None``."""
        reason = None
        if len(self.inlets) >= self.max_offers:
            reason = f"too many offers on this connection (the limit is {self.max_offers})"
        elif not self.conn.can_subscribe(offer):  # a cancelled subscription's id, unconfirmed
            reason = f"offer id {offer} is still in use"
        if reason is not None:
            self.refuse(offer, reason)
            return reason
        part = None
        if name.stage is not None and name.txn is not None:
            try:
                part = self.ingest.hub.stage(self.ingest.principal, name.stream, name.txn,
                                             name.stage)  # fmt: skip
            except TidewireError as exc:
                reason = str(exc)
            except OSError as exc:
                reason = f"cannot stage part {name.stage!r}: {exc}"
            if reason is not None:
                self.refuse(offer, reason)
                return reason
        self.conn.send(Subscribe(publisher, offer, OFFER_WINDOW if part is None else STAGE_WINDOW))
        inlet = self.inlets[offer] = Inlet(offer, name, part=part)
        inlet.task = asyncio.create_task(self._commit_loop(inlet))
        return None

    def refuse(self, offer: int, reason: str) -> None:
        """``offerEnded(offer, reason)`` (the caller logs and counts the refusal)."""
        self.conn.send(OfferEnded(offer, reason))

    def cancel_all(self) -> None:
        for inlet in list(self.inlets.values()):
            if inlet.task is not None:
                inlet.task.cancel()  # an append in flight still completes (the log shields it)
            if inlet.part is not None:
                inlet.part.discard()
        self.inlets.clear()

    def subscribed(self, subscriber: int, size: int) -> None:
        """The peer's ``subscribed``: its element size; envelopes get a run decoder."""
        inlet = self.inlets.get(subscriber)
        if inlet is not None:
            inlet.element_size = size
            if not size and inlet.name.format == "envelope" and inlet.name.action is None:
                self.conn.set_run_decoder(subscriber, offer_run_decoder(inlet.name.stream))

    def end(self, subscriber: int, error: str | None) -> None:
        """The peer's onComplete (``error`` None) or onError."""
        inlet = self.inlets.get(subscriber)
        if inlet is not None:
            inlet.ended = "" if error is None else error
            inlet.wake.set()

    def element(self, subscriber: int, data: bytes, count: int = 1) -> None:
        """One element, or ``count`` packed fixed-size ones."""
        inlet = self.inlets.get(subscriber)
        if inlet is None:
            return
        if inlet.part is not None:
            self._stage(inlet, [data])
            return
        if inlet.name.txn is not None:
            self._gather_txn(inlet, [data], count, len(data))
            return
        self._gather(inlet, [data], count, len(data))

    def run(self, subscriber: int, elements: list[bytes]) -> None:
        """A run of elements taken from one read."""
        inlet = self.inlets.get(subscriber)
        if inlet is None:
            return
        if inlet.part is not None:
            self._stage(inlet, elements)
            return
        nbytes = sum(map(len, elements))
        if inlet.name.txn is not None:
            self._gather_txn(inlet, elements, len(elements), nbytes)
            return
        self._gather(inlet, elements, len(elements), nbytes)

    def decoded(self, subscriber: int, run: OfferRun) -> None:
        """A run of envelopes decoded straight from the receive buffer (no object per
        element): gathered as one part, counted by its bytes on the wire."""
        inlet = self.inlets.get(subscriber)
        if inlet is None:
            return
        if inlet.name.txn is not None:
            self._gather_txn(inlet, [run], len(run.batch), run.nbytes)
            return
        self._gather(inlet, [run], len(run.batch), run.nbytes)

    # ------------------------------------------------------------------ gathering

    def _gather(self, inlet: Inlet, parts: Sequence[bytes | OfferRun], count: int,
                nbytes: int) -> None:  # fmt: skip
        inlet.parts += parts
        inlet.count += count
        inlet.nbytes += nbytes
        inlet.wake.set()
        self.ingest.hold(nbytes)
        if self.on_ingest is not None:
            self.on_ingest()

    def _gather_txn(self, inlet: Inlet, parts: Sequence[bytes | OfferRun], count: int,
                    nbytes: int) -> None:  # fmt: skip
        """A transaction's elements are held until its onComplete (then appended at once),
        within ``max_txn_bytes`` per connection; more are requested as they arrive."""
        if inlet.failed is not None:
            return
        if self.share is not None and not self.share.try_hold("txn", self.txn_bytes + nbytes):
            self._fail_txn(inlet, "transactions on this connection exceed its memory budget")
            return
        inlet.parts += parts
        inlet.count += count
        inlet.nbytes += nbytes
        self.txn_bytes += nbytes
        if self.txn_bytes > self.max_txn_bytes:
            self._fail_txn(inlet, f"transactions on this connection exceed "
                                  f"{self.max_txn_bytes} bytes")  # fmt: skip
            return
        if self.conn.is_subscribed(inlet.offer):
            self.conn.send(Request(inlet.offer, count))
        inlet.wake.set()

    def _stage(self, inlet: Inlet, elements: Sequence[bytes]) -> None:
        """A staged part's records: held until the offer's task has written them to the
        staging area (at most the :data:`STAGE_WINDOW` requested), then as many requested
        again."""
        if inlet.failed is not None or inlet.part is None:
            return
        nbytes = sum(map(len, elements))
        if self.share is not None and not self.share.try_hold("stage", self.stage_bytes + nbytes):
            inlet.failed = "staged parts on this connection exceed its memory budget"
        else:
            inlet.parts += elements
            inlet.count += len(elements)
            inlet.nbytes += nbytes
            self.stage_bytes += nbytes
        inlet.wake.set()

    def fail_open_txns(self, reason: str) -> bool:
        """Give up every transaction offer still receiving that has staged elements (each
        ends with ``offerEnded(reason)``, its staged bytes freed at once); ``True`` if any was.
        For a frame that does not fit the connection's budget beside them: the transaction is
        what overflows it, so it fails, not the connection (which carries on)."""
        failed = False
        for inlet in self.inlets.values():
            if (inlet.name.txn is not None and inlet.part is None and inlet.ended is None
                    and inlet.failed is None and inlet.nbytes):  # fmt: skip
                self._fail_txn(inlet, reason)
                failed = True
        return failed

    def _fail_txn(self, inlet: Inlet, reason: str) -> None:
        """Give up a transaction offer: what it staged is dropped at once (its elements will
        never be committed), and its task ends it with ``offerEnded(reason)``."""
        inlet.failed = reason
        self.txn_bytes -= inlet.nbytes
        inlet.parts, inlet.count, inlet.nbytes = [], 0, 0
        if self.share is not None:
            self.share.hold("txn", self.txn_bytes)
        inlet.wake.set()

    def _batch(self, inlet: Inlet, parts: list[bytes | OfferRun]) -> tuple[Batch, bool]:
        name, size = inlet.name, inlet.element_size
        if name.format == "value":  # (no run decoder: every part is bytes)
            values = cast(list[bytes], parts)
            if size:
                return Batch.fixed(name.stream, b"".join(values), size, key=name.key), False
            keys = None if name.key is None else [name.key] * len(values)
            return Batch.build(name.stream, values, keys=keys), False
        if size:  # fixed-size envelopes: split the packed runs
            packed = cast(list[bytes], parts)
            parts = [p[i : i + size] for p in packed for i in range(0, len(p), size)]
        return join_offer_parts(name.stream, parts, now_ms())

    def _take(self, inlet: Inlet) -> tuple[list[bytes | OfferRun], int, int]:
        """The oldest gathered parts, about ``commit_bytes`` of them (at least one)."""
        size = inlet.element_size
        chunk = self.ingest.limits.commit_bytes
        if inlet.nbytes <= chunk:
            taken = (inlet.parts, inlet.count, inlet.nbytes)
            inlet.parts, inlet.count, inlet.nbytes = [], 0, 0
            return taken
        nbytes = count = stop = 0
        while nbytes < chunk:
            part = inlet.parts[stop]
            stop += 1
            if isinstance(part, OfferRun):
                nbytes += part.nbytes
                count += len(part.batch)
                continue
            nbytes += len(part)
            count += len(part) // size if size else 1
        parts, inlet.parts = inlet.parts[:stop], inlet.parts[stop:]
        inlet.count -= count
        inlet.nbytes -= nbytes
        return parts, count, nbytes

    # ------------------------------------------------------------------ committing

    def _ended(self, offer: int, reason: str, *, cancel: bool) -> None:
        """Tell the peer the offer is over (``reason`` "" for success)."""
        if self.conn.closed:
            return
        if cancel and self.conn.is_subscribed(offer):
            self.conn.send(Cancel(offer))
        self.conn.send(OfferEnded(offer, reason))
        self.flush()

    def _acknowledge(self, inlet: Inlet,
                     receipts: deque[tuple[asyncio.Future[Batch], int]]) -> bool:  # fmt: skip
        """``committed`` (and a request for as many) for each receipt that came, in order;
        False once the connection is closed."""
        offer = inlet.offer
        while receipts and receipts[0][0].done():
            receipt, count = receipts.popleft()
            stored = receipt.result()
            if self.conn.closed:
                return False
            self.conn.send(Committed(offer, count, stored.first_id, stored.last_id))
            if inlet.ended is None and self.conn.is_subscribed(offer):
                self.conn.send(Request(offer, count))
            self.flush()
            if self.on_ingest is not None:  # (acknowledged: the pending bytes went down)
                self.on_ingest()
        return True

    async def _commit_loop(self, inlet: Inlet) -> None:
        """Append what arrives, in chunks of about ``commit_bytes`` (records stay small enough
        for subscribers to read without waste), through the offer's ingest pipeline: several
        appends in flight when the hub assigns the ids (so they share group commits), one at a
        time when the envelopes carry ids, fenced, receipts in order. Acknowledge in order."""
        offer = inlet.offer
        if inlet.name.txn is not None:
            if inlet.part is not None:
                await self._finish_stage(inlet, inlet.part)
            else:
                await self._commit_txn(inlet, inlet.name.txn)
            return
        pipeline = self.ingest.pipeline(serial_own_ids=True)
        receipts: deque[tuple[asyncio.Future[Batch], int]] = deque()
        try:
            while True:
                if not self._acknowledge(inlet, receipts):
                    return
                # (while the pipeline is full, elements gather into the next, bigger, batch)
                if inlet.parts and pipeline.has_room(not inlet.explicit_ids):
                    self._submit(inlet, pipeline, receipts)
                    continue
                if not inlet.parts and not receipts and inlet.ended is not None:
                    break
                inlet.wake.clear()
                await inlet.wake.wait()
            if inlet.ended and not self.conn.closed:
                self.log.info("offer %d: the publisher failed: %s", offer, inlet.ended)
            self._ended(offer, "", cancel=False)
        except asyncio.CancelledError:
            raise
        except (TidewireError, ValueError) as exc:
            self.log.warning("offer %d into %r failed: %s", offer, inlet.name.stream, exc)
            self._ended(offer, str(exc), cancel=True)
        finally:
            pipeline.close()  # the storage finishes what it has; nothing more is acked
            for receipt, _ in receipts:
                abandon(receipt)
            if self.inlets.get(offer) is inlet:
                del self.inlets[offer]
            self.ingest.release(inlet.nbytes)  # gathered, never submitted
            inlet.parts, inlet.count, inlet.nbytes = [], 0, 0

    def _submit(self, inlet: Inlet, pipeline: Pipeline,
                receipts: deque[tuple[asyncio.Future[Batch], int]]) -> None:  # fmt: skip
        """The oldest gathered chunk, as one batch, into the pipeline."""
        parts, count, nbytes = self._take(inlet)
        try:
            batch, explicit = self._batch(inlet, parts)
            if inlet.explicit_ids is None:
                inlet.explicit_ids = explicit
            elif explicit != inlet.explicit_ids:
                raise ValueError("an offer's envelopes either all carry ids or none does")
        except (TidewireError, ValueError):
            self.ingest.release(nbytes)
            raise
        receipt = pipeline.submit(batch, assign_ids=not explicit, held=nbytes)
        receipt.add_done_callback(lambda _: inlet.wake.set())
        receipts.append((receipt, count))

    async def _commit_txn(self, inlet: Inlet, txn: str) -> None:
        """A transaction offer: everything, once, at onComplete (``Hub.commit``)."""
        offer = inlet.offer
        try:
            reason = await _completed(inlet, "transaction")
            if reason is None and inlet.name.action is not None:
                await self._staged_action(inlet, txn)
            elif reason is None and inlet.count:
                batch, _ = self._batch(inlet, inlet.parts)  # (its own ids do not matter)
                receipt = await self.ingest.submit_txn(txn, batch)
                if receipt.already:
                    self.log.info("transaction %r was committed before: not appended again", txn)
                if not self.conn.closed:
                    self.conn.send(Committed(offer, inlet.count, receipt.first_id,
                                             receipt.last_id))  # fmt: skip
            if reason is not None:
                self.log.warning("offer %d (transaction %r) failed: %s", offer, txn, reason)
            self._ended(offer, reason or "", cancel=True)
        except asyncio.CancelledError:
            raise
        except (TidewireError, ValueError, OSError) as exc:
            self.log.warning("transaction %r into %r failed: %s", txn, inlet.name.stream, exc)
            self._ended(offer, str(exc), cancel=True)
        finally:
            self.txn_bytes -= inlet.nbytes
            inlet.nbytes = 0
            if self.share is not None:
                self.share.hold("txn", self.txn_bytes)
            if self.inlets.get(offer) is inlet:
                del self.inlets[offer]

    async def _staged_action(self, inlet: Inlet, txn: str) -> None:
        """A ``commit`` offer (its one element names the parts) or an ``abort`` (none)."""
        name, txns = inlet.name, self.ingest.hub.txns
        principal = self.ingest.principal
        if name.action == "abort":
            if inlet.count:
                raise ValueError("abort takes no element")
            if await txns.abort_staged(txn, name.stream, principal=principal):
                self.log.info("transaction %r into %r aborted: staged parts dropped", txn,
                              name.stream)  # fmt: skip
            return
        if inlet.count != 1:
            raise ValueError(f"commit takes one element (the parts), not {inlet.count}")
        parts = parse_parts(cast(bytes, inlet.parts[0]))
        receipt = await txns.commit_staged(txn, name.stream, parts, principal=principal,
                                           via=self.ingest.via)  # fmt: skip
        if receipt.already:
            self.log.info("transaction %r was committed before: not appended again", txn)
        if not receipt.count:  # (no ids to answer: its element cannot be acknowledged)
            raise ValueError("the named parts hold no event: nothing to commit")
        if not self.conn.closed:
            self.conn.send(Committed(inlet.offer, 1, receipt.first_id, receipt.last_id))

    async def _finish_stage(self, inlet: Inlet, part: PartSink) -> None:
        """A ``stage=`` offer: its records written as they come (:meth:`_write_stage`), then
        the part closed, ``committed(offer, records, 1, events)`` (when it has records),
        ``offerEnded``; or the part dropped."""
        offer = inlet.offer
        try:
            reason = await self._write_stage(inlet, part)
            if reason is None:
                staged = await part.close()
                if staged.records and not self.conn.closed:
                    self.conn.send(Committed(offer, staged.records, 1,
                                             max(staged.count, staged.records)))  # fmt: skip
            else:
                part.discard()
                self.log.warning("offer %d (part %r of %r) failed: %s", offer, inlet.name.stage,
                                 inlet.name.txn, reason)  # fmt: skip
            self._ended(offer, reason or "", cancel=reason is not None)
        except asyncio.CancelledError:
            part.discard()
            raise
        except (OSError, TidewireError) as exc:
            part.discard()
            self.log.warning("offer %d: staging part %r failed: %s", offer, inlet.name.stage, exc)
            self._ended(offer, f"part not staged: {exc}", cancel=True)
        finally:
            self._unstage(inlet.nbytes)
            inlet.parts, inlet.nbytes = [], 0
            if self.inlets.get(offer) is inlet:
                del self.inlets[offer]

    def _unstage(self, nbytes: int) -> None:
        self.stage_bytes -= nbytes
        if self.share is not None:
            self.share.hold("stage", self.stage_bytes)

    async def _write_stage(self, inlet: Inlet, part: PartSink) -> str | None:
        """Write the part's records as they arrive, requesting as many again once written,
        until the publisher ends: ``None`` when it completed, else why the part is not
        staged."""
        while True:
            if inlet.failed is not None:
                return inlet.failed
            if inlet.parts:
                taken, nbytes = cast(list[bytes], inlet.parts), inlet.nbytes
                inlet.parts, inlet.nbytes = [], 0
                try:
                    await part.write(taken)
                except ValueError as exc:
                    return f"part {inlet.name.stage!r} not staged: {exc}"
                finally:
                    self._unstage(nbytes)
                if inlet.ended is None and self.conn.is_subscribed(inlet.offer):
                    self.conn.send(Request(inlet.offer, len(taken)))
                    self.flush()
                continue
            if inlet.ended is not None:
                return f"part abandoned: the publisher failed: {inlet.ended}" if inlet.ended \
                    else None  # fmt: skip
            inlet.wake.clear()
            await inlet.wake.wait()


async def _completed(inlet: Inlet, what: str) -> str | None:
    """Wait for the end of an offer taken whole at its end (a transaction, a staged part):
    ``None`` when the publisher completed it, else why it cannot be taken (it failed here, or
    the publisher failed: ``what`` names what that abandons)."""
    while inlet.ended is None and inlet.failed is None:
        inlet.wake.clear()
        await inlet.wake.wait()
    if inlet.failed is not None:
        return inlet.failed
    return f"{what} abandoned: the publisher failed: {inlet.ended}" if inlet.ended else None
