"""A subscription: follow one stream from an id, then live, as fast as demand allows.

Demand follows the Reactive Streams rules that every tidewire protocol maps onto: ``request(n)``
needs ``n >= 1``; outstanding demand saturates at 2**63-1, which means unbounded; no more events
are delivered than were requested. A subscription holds a *position* in the log (the next id),
never a queue: a slow subscriber costs the server nothing while it does not ask, whatever its
backlog. Each delivery is read from the log (from memory for a live tail) when demand allows.

Reads run ahead by up to ``readahead_bytes`` (default 1 MiB, never less than a delivery): the
log checks a whole record's CRC before handing out any of it, so a record bigger than one
delivery is read once and what is not delivered yet is kept (the *carry*) for the next
deliveries, instead of being read again for each. The carry is bounded by ``readahead_bytes``,
and by the connection's memory budget when the protocol gives the subscription an
:class:`Account` (:attr:`Subscription.account`): a read ahead is made only if the account lets
it hold ``readahead_bytes``; otherwise the subscription reads what it sends (one delivery), and
what it keeps in its carry is recorded there.

A protocol that writes for many subscriptions on one connection waits for each to be ready
(:meth:`Subscription.wait_ready`: demand and events, nothing read yet) and then takes one turn
at the connection's output to read and write one delivery (:meth:`Subscription.next`, which
then returns without waiting): what waits for a peer that does not read is one delivery per
connection, not one per subscription.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from ..model import MAX_ID, Batch, DataLossError, TidewireError
from .filters import filter_key
from .traffic import next_subscription_id

if TYPE_CHECKING:
    from .hub import Hub

__all__ = ["MAX_DEMAND", "Account", "RecordSubscription", "Subscription"]

MAX_DEMAND = 2**63 - 1
"""Demand at or above this is unbounded (Reactive Streams: Long.MAX_VALUE)."""

SMALL_DEMAND = 64
"""Below this many events wanted, a read fetches only those (no read-ahead)."""


class Account(Protocol):
    """Where a subscription's read-ahead is charged (one subscription's part of a connection's
    ``"readahead"`` gauge in the hub's memory budget)."""

    def try_hold(self, nbytes: int) -> bool:
        """Set this subscription's part to ``nbytes`` if it fits, else change nothing."""
        ...

    def hold(self, nbytes: int) -> None:
        """Set this subscription's part to ``nbytes`` (bytes already read) whatever it costs."""
        ...


class Subscription:
    """Created by :meth:`tidewire.hub.Hub.subscribe`; read with :meth:`next`.

    ``until_id`` bounds the subscription (it completes after delivering the last event with an
    id <= ``until_id``); ``key`` keeps only the events with that key; ``skip_lost`` jumps over
    events removed by retention instead of failing with :class:`DataLossError`.
    """

    def __init__(
        self,
        hub: Hub,
        stream: str,
        next_id: int,
        *,
        until_id: int | None = None,
        key: bytes | None = None,
        skip_lost: bool = False,
        max_batch_bytes: int = 1024 * 1024,
        readahead_bytes: int = 1024 * 1024,
        via: str = "api",
        connection: int | None = None,
        counted: bool = True,
    ) -> None:
        self.id = next_subscription_id()
        self.via = via  # the protocol delivering it (metrics, admin API)
        self.counted = counted  # False: the protocol counts what it sends (a filter of its own)
        self.connection = connection  # the guard's connection id, if any
        self.hub = hub
        self.stream = stream
        self.next_id = next_id
        self.until_id = MAX_ID if until_id is None else until_id
        self.key = key
        self.skip_lost = skip_lost
        self.max_batch_bytes = max_batch_bytes
        self.readahead_bytes = max(readahead_bytes, max_batch_bytes)
        self._carry: list[Batch] = []  # read, not yet delivered; starts at next_id
        self.demand = 0
        self.cancelled = False
        self.error: TidewireError | None = None  # why it ended if it failed (:meth:`fail`)
        self.delivered = 0
        self.account: Account | None = None
        """Set by the protocol (after :meth:`Hub.subscribe`): where read-ahead is charged."""
        self._wake = asyncio.Event()

    # ------------------------------------------------------------------ demand

    def request(self, n: int) -> None:
        """Add ``n`` (>= 1) to the outstanding demand, saturating at :data:`MAX_DEMAND`."""
        if n < 1:
            raise ValueError(f"request({n}): demand must be at least 1 (Reactive Streams 3.9)")
        self.demand = min(MAX_DEMAND, self.demand + n)
        self._wake.set()

    def cancel(self) -> None:
        """Stop delivering; a pending :meth:`next` returns ``None``. Idempotent."""
        self.cancelled = True
        self._carry = []
        if self.account is not None:
            self.account.hold(0)
        self._wake.set()

    def fail(self, error: TidewireError) -> None:
        """End the subscription with ``error`` (its stream was deleted): the next :meth:`take`
        or :meth:`next` raises it, which the protocol sends as its error."""
        self.cancel()
        self.error = error

    @property
    def complete(self) -> bool:
        """True once every event up to ``until_id`` was delivered (bounded subscriptions)."""
        return self.next_id > self.until_id

    @property
    def done(self) -> bool:
        return self.cancelled or self.complete

    @property
    def held_bytes(self) -> int:
        """Bytes read from the log and not delivered yet (the carry), for a memory budget."""
        return sum(b.nbytes for b in self._carry)

    # ------------------------------------------------------------------ delivery

    def poll_ready(self) -> bool:
        """Whether :meth:`next` would find events without waiting for new commits."""
        return self.demand > 0 and self.hub.storage.latest(self.stream) >= self.next_id

    async def wait_ready(self) -> None:
        """Wait until :meth:`next` would find events without waiting for demand or commits (or
        the subscription is done); nothing is read. (:meth:`next` may still return after
        one read that a key filter emptied: then it waits again, as it does alone.)"""
        while not self.done:
            if self.demand <= 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.hub.storage.latest(self.stream) < self.next_id and not self._carry:
                await self._wait_for_commit(self.next_id - 1)
                continue
            return

    async def take(self) -> list[Batch] | None:
        """One delivery if :meth:`wait_ready` would return at once, read now; ``[]`` when
        there is nothing to deliver (no demand or events, or a key filter dropped what was
        read); ``None`` once done. Never waits for demand or commits: a protocol calls it in
        its turn at the connection's output, which a wait would hold from the others."""
        if self.error is not None:
            raise self.error
        if self.done:
            return None
        if self.demand <= 0 or (
            self.hub.storage.latest(self.stream) < self.next_id and not self._carry
        ):
            return []
        return await self._read()

    async def next(self) -> list[Batch] | None:
        """Wait for demand and for events, then deliver up to the demand (and about
        ``max_batch_bytes``) as batches, advancing the position and spending the demand.

        Returns ``None`` once the subscription is cancelled or complete. Raises
        :class:`DataLossError` when the position was removed by retention (unless
        ``skip_lost``), and whatever the log raises when it closes.
        """
        while True:
            if self.error is not None:
                raise self.error
            if self.done:
                return None
            if self.demand <= 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            latest = self.hub.storage.latest(self.stream)
            if latest < self.next_id and not self._carry:
                await self._wait_for_commit(self.next_id - 1)
                continue
            batches = await self._read()
            if batches:
                return batches
            # Nothing to deliver (a key filter dropped it all, or the memory tail lagged): yield
            # to the loop before the next read, so that a long run of non-matching events
            # never holds it.
            await asyncio.sleep(0)

    async def _wait_for_commit(self, after_id: int) -> None:
        """Wait for a commit past ``after_id``, or for a cancel."""
        self._wake.clear()
        commit = asyncio.ensure_future(self.hub.storage.wait_for(self.stream, after_id))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((commit, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (commit, woken):
                fut.cancel()
        if self.cancelled:  # the hub closing cancels us first: that is an end, not an error
            return
        if commit.done() and not commit.cancelled() and commit.exception() is not None:
            raise commit.exception()  # type: ignore[misc]

    async def _fetch(self, want: int) -> list[Batch]:
        """Batches from the position on: the carry, else one read of ``readahead_bytes`` (or,
        for a small demand without a key filter, of just the events wanted: a subscriber that
        asks for one event at a time does not make the log read a megabyte each time)."""
        if self._carry:
            carry, self._carry = self._carry, []
            first = self.hub.storage.start_id(self.stream)
            if first > self.next_id:  # retention removed it meanwhile: as if read now
                raise DataLossError(self.stream, self.next_id, first)
            return carry
        if want < SMALL_DEMAND and self.key is None:
            return await self.hub.storage.read(
                self.stream, self.next_id, self.max_batch_bytes, want
            )
        size = self.readahead_bytes
        account = self.account
        if account is not None and size > self.max_batch_bytes and not account.try_hold(size):
            size = self.max_batch_bytes  # no room in the budget to read ahead: read a delivery
        return await self.hub.storage.read(self.stream, self.next_id, size, MAX_DEMAND)

    async def _read(self) -> list[Batch]:
        """One delivery at the position; may return nothing when a key filter dropped
        everything.

        At most the demand and about ``max_batch_bytes`` are delivered; the rest of what was
        read stays in the carry. With a key filter the position stops right after the last
        event delivered once the demand is met, so nothing matching is skipped.
        """
        want = min(self.demand, self.until_id - self.next_id + 1)
        try:
            batches = await self._fetch(want)
        except DataLossError as exc:
            if self.account is not None:  # (the carry, if any, was dropped)
                self.account.hold(0)
            if not self.skip_lost:
                raise
            self.next_id = exc.first_id
            return []
        out: list[Batch] = []
        budget = want
        room = self.max_batch_bytes
        for i, batch in enumerate(batches):
            if self.cancelled:
                break
            if budget <= 0 or room <= 0:
                self._carry = batches[i:]
                break
            if batch.first_id > self.until_id:
                self.next_id = self.until_id + 1
                break
            if batch.last_id > self.until_id:
                batch = batch.slice(0, batch.index_of(self.until_id + 1))
            stop = batch.fit(0, room)
            if not stop:
                if out:  # not even one more event fits: next delivery
                    self._carry = [batch, *batches[i + 1 :]]
                    break
                stop = 1  # a delivery holds at least one event
            if self.key is None:
                stop = min(stop, budget)
            if stop < len(batch):  # the rest waits in the carry
                self._carry = [batch.slice(stop, len(batch)), *batches[i + 1 :]]
                batch = batch.slice(0, stop)
            next_id = batch.last_id + 1
            room -= batch.nbytes
            if self.key is not None:
                filtered = filter_key(batch, self.key)
                if filtered is None:
                    self.next_id = next_id
                    if self._carry:
                        break
                    continue
                batch = filtered
                if len(batch) > budget:
                    batch = batch.slice(0, budget)
                    next_id = batch.last_id + 1
                    # Read again from the new position: nothing read past it is kept, neither
                    # this batch's rest nor the batches after it.
                    self._carry = []
                    self.next_id = next_id
                    out.append(batch)
                    budget = 0
                    break
            self.next_id = next_id
            out.append(batch)
            budget -= len(batch)
            if self._carry:
                break
        if self.account is not None:  # what is kept for the next deliveries
            self.account.hold(sum(b.nbytes for b in self._carry))
        delivered = want - budget
        if self.demand < MAX_DEMAND:
            self.demand -= delivered
        self.delivered += delivered
        if out and self.counted:
            self.hub.metrics.sent(self.via, self.stream, delivered, sum(b.nbytes for b in out))
        return out

    def __repr__(self) -> str:
        return (
            f"Subscription({self.stream!r}, next_id={self.next_id}, demand={self.demand}, "
            f"cancelled={self.cancelled})"
        )


class RecordSubscription:
    """Record-unit reads: a subscription whose demand counts records (the batches the storage
    kept together, RS.io's ``format=records``), not events. The hub subscription underneath
    asks for every event; this hands out as many batches as were requested, keeping the rest
    of a delivery for the next call (at most one delivery, ``max_batch_bytes``)."""

    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        sub.request(MAX_DEMAND)
        self.demand = 0
        self._carry: list[Batch] = []
        self._wake = asyncio.Event()

    @property
    def complete(self) -> bool:
        return self.sub.complete and not self._carry

    @property
    def held_bytes(self) -> int:
        """Bytes read and not delivered yet, here and in the subscription underneath."""
        return self.sub.held_bytes + sum(b.nbytes for b in self._carry)

    def request(self, n: int) -> None:
        """``n`` more records."""
        self.demand = min(MAX_DEMAND, self.demand + n)
        self._wake.set()

    def cancel(self) -> None:
        self.sub.cancel()
        self._wake.set()

    async def wait_ready(self) -> None:
        """Wait until :meth:`next` would find records without waiting (see
        :meth:`Subscription.wait_ready`); nothing is read."""
        while not self.demand and not self.sub.cancelled:
            self._wake.clear()
            await self._wake.wait()
        if not self._carry:
            await self.sub.wait_ready()

    async def take(self) -> list[Batch] | None:
        """As :meth:`Subscription.take`: up to the demand in records if they can be had
        without waiting, ``[]`` if not, ``None`` once cancelled or complete."""
        if self.sub.error is not None:
            raise self.sub.error
        if self.sub.cancelled or self.complete:
            return None
        if not self.demand:
            return []
        if not self._carry:
            batches = await self.sub.take()
            if not batches:
                return batches
            self._carry = batches
        out, self._carry = self._carry[: self.demand], self._carry[self.demand :]
        self.demand -= len(out)
        return out

    async def next(self) -> list[Batch] | None:
        """Up to the demand in batches (one record each); ``None`` once cancelled or
        complete."""
        while not self.demand and not self.sub.cancelled:
            self._wake.clear()
            await self._wake.wait()
        if self.sub.error is not None:
            raise self.sub.error
        if self.sub.cancelled:
            return None
        if not self._carry:
            batches = await self.sub.next()
            if batches is None:
                return None
            self._carry = batches
        out, self._carry = self._carry[: self.demand], self._carry[self.demand :]
        self.demand -= len(out)
        return out
