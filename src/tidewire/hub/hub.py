"""The hub core: the registry of streams over the durable log, appends, reads, subscriptions.

Every protocol adapter talks to one :class:`Hub`; none touches the storage directly (the hub
holds it as :attr:`Hub.storage`, a :class:`~.storage.Storage`), so what is written through one
protocol is read through any other, and another backend can take the embedded log's place.
Retention runs here as a periodic task (:meth:`Hub.start`); :meth:`Hub.enforce_retention` takes
the time as an argument for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Literal

from ..log import Log, LogConfig, StreamDeleted
from ..model import (
    Batch,
    DataLossError,
    InvalidStreamName,
    TidewireError,
    UnknownStream,
    now_ms,
    validate_stream_name,
)
from .budget import Budget, Share
from .ingest import INGEST_DEFAULTS, Ingest, IngestLimits
from .ledger import Ledger
from .staging import STAGING_TTL_MS, PartSink
from .storage import ClusterStatus, EmbeddedStorage, Retention, Storage, StreamAdmin, StreamStats
from .subscription import RecordSubscription, Subscription
from .traffic import Metrics
from .txn import Content, Transactions, TxnReceipt

__all__ = ["Hub", "NotSupported", "Start", "StreamDeleted"]

log = logging.getLogger("tidewire.hub")

Start = int | Literal["earliest", "latest"]
"""Where a subscription starts: an id (inclusive), the first retained event, or after the
latest committed one (only new events)."""


RESERVED_PREFIX = "_tidewire."
"""Streams the hub keeps for itself (``_tidewire.txns``): readable, never written by clients."""


class NotSupported(TidewireError):
    """The storage cannot do this (stream administration on a storage without
    :class:`~.storage.StreamAdmin`)."""


def _writable(stream: str) -> None:
    validate_stream_name(stream)
    if stream.startswith(RESERVED_PREFIX):
        raise InvalidStreamName(f"stream {stream!r} is the hub's own (prefix {RESERVED_PREFIX!r})")


class Hub:
    """Streams, appends, reads and subscriptions over one :class:`~.storage.Storage` (a
    :class:`~tidewire.log.Log` given here is wrapped in :class:`~.storage.EmbeddedStorage`)."""

    def __init__(
        self,
        storage: Storage | Log,
        *,
        retention_interval_s: float = 60.0,
        clock: Callable[[], int] = now_ms,
        txn_expiration_ms: int | None = None,
        staging_ttl_ms: int = STAGING_TTL_MS,
    ) -> None:
        """``txn_expiration_ms``: forget a transaction id that long after its commit even if
        its events are retained (:mod:`.txn`; ``None``: only once retention removed them);
        ``staging_ttl_ms``: drop staged parts untouched that long (:mod:`.staging`)."""
        self.storage: Storage = (
            EmbeddedStorage(storage) if isinstance(storage, Log) else storage
        )
        # (the embedded log queues an append without a coroutine: :meth:`submit`)
        self._log = self.storage.log if isinstance(self.storage, EmbeddedStorage) else None
        self.retention_interval_s = retention_interval_s
        self.clock = clock
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self._retention_task: asyncio.Task[None] | None = None
        self._sampler_task: asyncio.Task[None] | None = None
        self.metrics = Metrics()
        self.storage.observe(append=self.metrics.append_seconds.observe,
                             fsync=self.metrics.fsync_seconds.observe)  # fmt: skip
        self._retention_run: asyncio.Future[int] | None = None
        self.ingest_limits: dict[str, IngestLimits] = dict(INGEST_DEFAULTS)
        """Per protocol (``via``), the limits :meth:`ingest` gives (``serve`` sets them from
        the ``ingest.*`` settings); a protocol not named gets :class:`IngestLimits()`."""
        self.txns = Transactions(self, expiration_ms=txn_expiration_ms)
        self.txns.staging_ttl_ms = staging_ttl_ms
        self.budget = Budget()
        """The memory budget every connection's :class:`~.budget.Share` draws on
        (``serve`` sets its limits from the ``memory.*`` settings)."""
        self.txns.load()

    @classmethod
    def open(
        cls,
        data_dir: str,
        config: LogConfig | None = None,
        *,
        retention_interval_s: float = 60.0,
        clock: Callable[[], int] = now_ms,
        txn_expiration_ms: int | None = None,
        staging_ttl_ms: int = STAGING_TTL_MS,
    ) -> Hub:
        """Open (and recover) the embedded log in ``data_dir`` and build a hub on it."""
        return cls(EmbeddedStorage.open(data_dir, config),
                   retention_interval_s=retention_interval_s, clock=clock,
                   txn_expiration_ms=txn_expiration_ms,
                   staging_ttl_ms=staging_ttl_ms)  # fmt: skip

    @classmethod
    async def connect(cls, opening: Callable[[], Awaitable[Storage]], **options: Any) -> Hub:
        """Build a hub on the storage ``opening()`` connects (a remote backend: the hub is
        built once it is connected, since building replays the reserved streams, which such
        a backend fetches while connecting); the storage is closed if the hub cannot be
        built. ``options``: :meth:`__init__`'s."""
        storage = await opening()
        try:
            return cls(storage, **options)
        except BaseException:
            await storage.close()
            raise

    def stage(self, principal: str, stream: str, txn: str, part: str) -> PartSink:
        """A new part ``part`` of ``principal``'s staged transaction ``txn`` into ``stream``
        (:mod:`.staging`: the storage's staging area keeps it until a commit or an abort);
        :class:`~tidewire.model.TidewireError` when the storage keeps none, ``OSError`` when
        the part cannot be begun."""
        _writable(stream)
        if self.txns.staging is None:
            raise TidewireError("this hub keeps no staged parts")
        return self.txns.staging.writer(principal, stream, txn, part)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the background tasks (retention, the metrics' rate samples)."""
        if self._retention_task is None:
            self._retention_task = asyncio.create_task(self._retention_loop())
        if self._sampler_task is None:
            self._sampler_task = asyncio.create_task(self.metrics.run_sampler())

    async def close(self) -> None:
        """Cancel every subscription, finish queued appends (flush + fsync), close the log."""
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention_task
            self._retention_task = None
        if self._sampler_task is not None:
            self._sampler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler_task
            self._sampler_task = None
        if self._retention_run is not None:  # a pass in its thread: let it finish first
            with contextlib.suppress(Exception):
                await self._retention_run
        for sub in list(self._subscriptions):
            sub.cancel()
        await self.storage.close()

    async def _retention_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.retention_interval_s)
            self._retention_run = loop.run_in_executor(None, self.storage.enforce_retention,
                                                       self.clock())  # fmt: skip
            try:
                await asyncio.shield(self._retention_run)
            except Exception:
                log.exception("retention failed")
            # (on the loop, not in the pass's thread: the registry is the loop's)
            self.txns.forget_removed()

    def enforce_retention(self, now: int | None = None) -> int:
        """Apply retention at time ``now`` (ms; default: the hub's clock), then forget the
        transaction ids whose events it removed; return how many units of storage (segments)
        were removed. Call it on the event loop's thread (or with no loop running)."""
        removed = self.storage.enforce_retention(self.clock() if now is None else now)
        self.txns.forget_removed()
        return removed

    # ------------------------------------------------------------------ streams

    def describe(self) -> str:
        """Where the storage keeps the data, for people (``serve``, the admin API)."""
        return self.storage.describe()

    def cluster_status(self) -> ClusterStatus | None:
        """The cluster the storage is replicated on, as it last saw it (``None``: embedded)."""
        return self.storage.cluster()

    def streams(self) -> list[StreamStats]:
        """Every stream's statistics, sorted by name (the hub's own included)."""
        return self.storage.stats()

    def stream_names(self) -> list[str]:
        """Every stream's name, sorted (the hub's own, ``_tidewire.*``, included)."""
        return self.storage.streams()

    def has_stream(self, stream: str) -> bool:
        """Whether ``stream`` exists (has had an append)."""
        return stream in self.storage

    def latest(self, stream: str) -> int:
        """The stream's last committed id; 0 when it has none (or does not exist)."""
        return self.storage.latest(stream)

    def start_id(self, stream: str) -> int:
        """The lowest id of ``stream`` still readable (1 unless retention removed the start)."""
        return self.storage.start_id(stream)

    def fence(self) -> int:
        """The storage's fence token (see :meth:`append`'s ``fence``); take it while none of
        your appends is in flight. :class:`~.ingest.Ingest` does this for the adapters."""
        return self.storage.fence()

    async def settled(self, stream: str) -> int:
        """Wait until every append of ``stream`` handed over so far is committed or failed;
        the latest committed id (e.g. an earlier, dropped session's appends)."""
        return await self.storage.settled(stream)

    async def wait_for(self, stream: str, after_id: int) -> None:
        """Return once ``stream`` has a committed id above ``after_id`` (a live tail's wait;
        cancelling it leaves nothing behind)."""
        await self.storage.wait_for(stream, after_id)

    def ledger(self, stream: str) -> Ledger:
        """The ledger (JSON records) kept in the hub's own stream ``stream``
        (``_tidewire.*``): how the hub and its instances keep their state."""
        if not stream.startswith(RESERVED_PREFIX):
            raise InvalidStreamName(f"a ledger lives in a stream named {RESERVED_PREFIX}*")
        return Ledger(self.storage, stream)

    # ------------------------------------------------------------------ administration

    def retention(self, stream: str) -> Retention | None:
        """The retention that applies to ``stream`` and its source; ``None`` when the storage
        does not say (one without :class:`~.storage.StreamAdmin`)."""
        return self.storage.retention(stream) if isinstance(self.storage, StreamAdmin) else None

    def _admin(self, stream: str) -> StreamAdmin:
        _writable(stream)  # (the hub's own streams are not the operators' to change)
        if not isinstance(self.storage, StreamAdmin):
            raise NotSupported("creating, deleting or re-configuring a stream is not supported "
                               f"by this storage ({type(self.storage).__name__})")  # fmt: skip
        return self.storage

    async def create_stream(self, stream: str, retention_ms: int | None = None,
                            retention_bytes: int | None = None, *,
                            runtime: bool = False) -> None:  # fmt: skip
        """Create ``stream``, empty; with ``runtime``, with this retention (``None``: no bound)
        instead of the configuration's, also after restarts. :class:`~tidewire.log.
        StreamExists` if it exists; :class:`NotSupported` on a storage without
        :class:`~.storage.StreamAdmin`."""
        await self._admin(stream).create_stream(stream, retention_ms, retention_bytes,
                                                runtime=runtime)  # fmt: skip

    async def set_retention(self, stream: str, retention_ms: int | None,
                            retention_bytes: int | None) -> None:  # fmt: skip
        """Give ``stream`` this retention from now on and after restarts, over the
        configuration's (the next retention pass applies it). :class:`UnknownStream` if
        there is no such stream; :class:`NotSupported` without :class:`~.storage.StreamAdmin`."""
        admin = self._admin(stream)
        if stream not in self.storage:
            raise UnknownStream(stream)
        await admin.set_retention(stream, retention_ms, retention_bytes)

    async def delete_stream(self, stream: str) -> None:
        """Delete ``stream`` and all its events: its exactly-once transactions are forgotten
        first (a stream made again under the name starts at id 1), and its live subscriptions
        end with :class:`StreamDeleted`. :class:`UnknownStream` if there is no such stream;
        :class:`NotSupported` without :class:`~.storage.StreamAdmin`."""
        admin = self._admin(stream)
        if stream not in self.storage:
            raise UnknownStream(stream)
        await self.txns.forget_stream(stream)
        await admin.delete_stream(stream)
        for sub in list(self._subscriptions):
            if sub.stream == stream and not sub.done:
                sub.fail(StreamDeleted(stream))

    @property
    def subscriptions(self) -> int:
        return len(self._subscriptions)

    def live_subscriptions(self) -> list[Subscription]:
        """The subscriptions not cancelled nor complete, oldest first."""
        return sorted((s for s in list(self._subscriptions) if not s.done), key=lambda s: s.id)

    # ------------------------------------------------------------------ write and read

    async def append(self, batch: Batch, *, assign_ids: bool = False, via: str = "api",
                     fence: int | None = None) -> Batch:  # fmt: skip
        """Append durably; returns the batch as stored (see :meth:`.Storage.append`, which
        also says what ``fence`` is for). ``via``: the protocol it came by, for the metrics."""
        _writable(batch.stream)
        stored = await self.storage.append(batch, assign_ids=assign_ids, fence=fence)
        self.metrics.received(via, stored.stream, len(stored), stored.nbytes)
        return stored

    def submit(self, batch: Batch, *, assign_ids: bool = False, via: str = "api",
               fence: int | None = None) -> asyncio.Future[Batch] | None:  # fmt: skip
        """:meth:`append` without a coroutine, where the storage can (the embedded log's
        :meth:`~tidewire.log.Log.submit`): the future of the batch as stored, or ``None`` when
        it cannot be queued at once (or the storage has no such path): then :meth:`append`.
        The same checks (raised here), order, durability and metrics; an adapter that ends a
        flow in a callback needs no task for it (:class:`~.ingest.Pipeline`)."""
        log = self._log
        if log is None:
            return None
        _writable(batch.stream)
        future = log.submit(batch, assign_ids=assign_ids, fence=fence)
        if future is not None:
            future.add_done_callback(partial(self._received, via))
        return future

    def _received(self, via: str, future: asyncio.Future[Batch]) -> None:
        if not future.cancelled() and future.exception() is None:
            stored = future.result()
            self.metrics.received(via, stored.stream, len(stored), stored.nbytes)

    def ingest(
        self,
        *,
        via: str,
        limits: IngestLimits | None = None,
        on_pause: Callable[[bool], None] | None = None,
        principal: str = "anonymous",
        share: Share | None = None,
    ) -> Ingest:
        """A connection's way in (:mod:`.ingest`): ordered, fenced, byte-bounded appends and
        transactions; ``on_pause(True)`` when the adapter must stop reading, ``(False)`` when
        it may read again. ``limits``: default :attr:`ingest_limits` of ``via``.
        ``principal``: whose transactions :meth:`Ingest.submit_txn` commits (settable later:
        :attr:`Ingest.principal`); ``share``: the connection's budget account, charged
        ``"ingest"`` with what waits for the log (its principal is then the principal)."""
        if limits is None:
            limits = self.ingest_limits.get(via) or IngestLimits()
        return Ingest(self, via=via, limits=limits, on_pause=on_pause, principal=principal,
                      share=share)  # fmt: skip

    async def commit(self, txn: str, batch: Batch, *, via: str = "api",
                     principal: str = "anonymous") -> TxnReceipt:  # fmt: skip
        """Append ``batch`` exactly once for the transaction id ``txn`` of ``principal`` into
        ``batch.stream`` (its ids are ignored): a repeated commit returns where the first one
        put the events (see :mod:`.txn`; another principal's ``txn`` is another transaction)."""
        _writable(batch.stream)
        receipt = await self.txns.commit(txn, batch, principal=principal)
        if not receipt.already:
            self.metrics.received(via, batch.stream, len(batch), batch.nbytes)
        return receipt

    async def commit_content(self, txn: str, stream: str, content: Content, nbytes: int, *,
                             via: str = "api",
                             principal: str = "anonymous") -> TxnReceipt:  # fmt: skip
        """:meth:`commit` of a :class:`~.txn.Content` of about ``nbytes`` (a staged
        transaction's bulk append, :meth:`~.txn.Transactions.commit_staged`)."""
        _writable(stream)
        receipt = await self.txns.commit_content(txn, stream, content, principal=principal)
        if not receipt.already:
            self.metrics.received(via, stream, content.count, nbytes)
        return receipt

    async def read(
        self, stream: str, from_id: int, max_bytes: int = 1024 * 1024,
        max_events: int = 2**63 - 1, *, via: str | None = None,
    ) -> list[Batch]:  # fmt: skip
        """Committed events from ``from_id``; ``via``: a protocol sending them to a peer,
        counted in the metrics as delivered."""
        validate_stream_name(stream)
        batches = await self.storage.read(stream, from_id, max_bytes, max_events)
        if via is not None and batches:
            self.metrics.sent(via, stream, sum(len(b) for b in batches),
                              sum(b.nbytes for b in batches))  # fmt: skip
        return batches

    async def find_time(self, stream: str, ms: int) -> int | None:
        """The first id of ``stream`` still readable whose timestamp is at least ``ms``;
        ``None`` when no event is that new (or no such stream). See :meth:`Storage.find_time
        <tidewire.hub.storage.Storage.find_time>`."""
        validate_stream_name(stream)
        return await self.storage.find_time(stream, ms)

    async def time_start(self, stream: str, ms: int) -> int:
        """Where a subscription from time ``ms`` starts (RS.io's ``from-time=``): the first id
        whose timestamp is at least ``ms``, else the id after the latest one as it was before
        the lookup (the subscription then waits for what comes next, whatever its time)."""
        latest = self.storage.latest(stream)  # (before: nothing committed meanwhile is missed)
        found = await self.find_time(stream, ms)
        return latest + 1 if found is None else found

    async def seek_time(self, sub: Subscription | RecordSubscription, ms: int) -> None:
        """Move ``sub``, made and not read yet, to :meth:`time_start` (a protocol's start by
        time, resolved once): :class:`DataLossError` if retention removed that id meanwhile
        (unless the subscription skips lost events)."""
        inner = sub.sub if isinstance(sub, RecordSubscription) else sub
        start = await self.time_start(inner.stream, ms)
        inner.next_id = self.resolve_start(inner.stream, start, skip_lost=inner.skip_lost)

    def resolve_start(self, stream: str, start: Start, *, skip_lost: bool = False) -> int:
        """The first id a subscription starting at ``start`` will deliver (0 = earliest)."""
        if start == "earliest" or start == 0:
            return self.storage.start_id(stream)
        if start == "latest":
            return self.storage.latest(stream) + 1
        if not isinstance(start, int) or start < 0:
            raise ValueError(f"bad start position {start!r}")
        first = self.storage.start_id(stream)
        if start < first:
            if first > 1 and not skip_lost:  # retention removed what was asked for
                raise DataLossError(stream, start, first)
            return first
        return start

    def subscribe(
        self,
        stream: str,
        start: Start = "earliest",
        *,
        until_id: int | None = None,
        key: bytes | None = None,
        skip_lost: bool = False,
        max_batch_bytes: int = 1024 * 1024,
        via: str = "api",
        connection: int | None = None,
        counted: bool = True,
    ) -> Subscription:
        """Follow ``stream`` from ``start``, then live. Deliveries wait for :meth:`request`.

        The stream need not exist yet: the subscription waits for its first events. ``via``
        (the protocol) and ``connection`` (the guard's connection id) are for the metrics and
        the admin API; ``counted=False`` when the protocol counts what it sends itself.
        """
        validate_stream_name(stream)
        sub = Subscription(
            self,
            stream,
            self.resolve_start(stream, start, skip_lost=skip_lost),
            until_id=until_id,
            key=key,
            skip_lost=skip_lost,
            max_batch_bytes=max_batch_bytes,
            via=via,
            connection=connection,
            counted=counted,
        )
        self._subscriptions.add(sub)
        return sub
