"""The JetStream storage backend: :class:`JetStreamStorage`, the hub's storage on a NATS
JetStream cluster, so that any number of gateways serve the same streams (docs/cluster.md).

The work is split by concern: :mod:`.subjects` maps names to subjects and headers (pure),
:mod:`.catalog` keeps every stream's head in memory, :mod:`.jswrite` publishes appends,
:mod:`.jsread` reads, :mod:`.retention` purges, :mod:`.admin` creates, re-configures and
deletes streams and :mod:`.status` describes the cluster. This module connects them: it creates
the shard streams, loads the catalog at connect, follows the stored-record notifications
(``twn.>``), and runs the background passes (retention, status).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from ..hub.storage import ClusterStatus, Storage, StreamAdmin, StreamStats
from ..log import LogConfig, Retention
from ..model import (
    Batch,
    IdOrderError,
    LogClosedError,
    LogError,
    StorageFullError,
    now_ms,
    validate_stream_name,
)
from ..record import HEADER_SIZE
from . import admin
from .admin import StoredEntry
from .catalog import Catalog, Head, RecordPoint
from .jsapi import (
    TRANSIENT,
    Api,
    CorruptRecordError,
    JetStreamError,
    StoredRecord,
    Tombstone,
    retrying,
)
from .jsatomic import Source, append_atomic
from .jsread import Reader, find_time
from .jswrite import RECORD_BYTES, StreamWriter
from .notices import Notices
from .retention import enforce
from .shards import FIRST_WAIT, STARTING, ensure_shard
from .staging import JetStreamStaging
from .status import cluster_status
from .subjects import shard_stream, stream_of_admin_subject, stream_of_subject

__all__ = ["JetStreamStorage"]

log = logging.getLogger(__name__)

MiB = 1024 * 1024
RESERVED_PREFIX = "_tidewire."
CONNECT_ATTEMPTS = 8  # per server, 0.25 s apart, before connect gives up
NOTIFY_PENDING_BYTES = 64 * MiB  # the notification subscription's bound (headers only)
ATOMIC_FROM = RECORD_BYTES - HEADER_SIZE - 8  # an own-id append bigger than one record


class JetStreamStorage:
    """:class:`~tidewire.hub.storage.Storage` and :class:`~tidewire.hub.storage.StreamAdmin`
    on NATS JetStream: make one with :meth:`connect`. Several of them (gateways, processes)
    may write and read the same streams at once: appends to a stream are conditional on its
    head, so ids stay strictly increasing across gateways (docs/cluster.md "Design"); so are
    the streams' administration entries (:mod:`.admin`)."""

    def __init__(
        self,
        nc: Client,
        urls: Sequence[str],
        *,
        shards: int,
        replicas: int,
        config: LogConfig,
        append_timeout_s: float,
        retention_interval_s: float,
        status_interval_s: float,
        request_timeout_s: float,
        max_queued_bytes: int,
    ) -> None:
        self.nc = nc
        self.urls = list(urls)
        self.shards = shards
        self.replicas = replicas
        self.config = config
        self.append_timeout_s = append_timeout_s
        self.retention_interval_s = retention_interval_s
        self.status_interval_s = status_interval_s
        self.max_queued_bytes = max_queued_bytes
        self.startup_s = append_timeout_s  # how long connecting waits for leaders
        self.api = Api(nc, request_timeout_s)
        self.catalog = Catalog(shards)
        self.reader = Reader(self.api, self.catalog)
        self.writers: dict[str, StreamWriter] = {}
        self.refusals = 0  # appends refused for want of space, ever (the fence)
        self.on_append: Callable[[float], None] | None = None
        self.gateway = uuid.uuid4().hex
        self._writes = itertools.count(1)
        self._reserved: dict[str, list[Batch]] = {}
        self._status: ClusterStatus | None = None
        self.notices = Notices()  # (what the stored-record feed said: lost notifications)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._finding_first: set[str] = set()  # streams whose first record is being read
        self._closed = False

    # ------------------------------------------------------------------ connecting

    @classmethod
    async def connect(
        cls,
        urls: Sequence[str],
        *,
        shards: int = 16,
        replicas: int = 3,
        name: str = "tidewire gateway",
        config: LogConfig | None = None,
        append_timeout_s: float = 30.0,
        retention_interval_s: float = 60.0,
        status_interval_s: float = 5.0,
        request_timeout_s: float = 5.0,
        max_queued_bytes: int = 64 * MiB,
        load_concurrency: int = 256,
    ) -> JetStreamStorage:
        """Connect to the cluster at ``urls`` (``nats://host:port``), create the ``shards``
        shard streams if they are missing (R ``min(replicas, servers)``), load every stream's
        head and the reserved streams, and start following the cluster. ``config`` gives the
        per-stream retention (``LogConfig``'s stream settings; the rest is the embedded log's).
        :class:`~tidewire.model.LogError` when the cluster cannot be reached or its shard
        streams are not usable."""
        if shards < 1 or replicas < 1:
            raise ValueError("shards and replicas must be at least 1")
        storage: JetStreamStorage | None = None

        async def reconnected() -> None:
            if storage is not None:
                storage._spawn(storage._load_catalog(load_concurrency))

        async def error(exc: Exception) -> None:
            log.warning("NATS connection: %r", exc)
            if storage is not None and isinstance(exc, nats.errors.SlowConsumerError):
                # Notifications were dropped: the heads may be behind; read them again.
                storage._spawn(storage._load_catalog(load_concurrency))

        try:
            nc = await nats.connect(servers=list(urls), name=name,
                                    max_reconnect_attempts=CONNECT_ATTEMPTS,
                                    reconnect_time_wait=0.25, connect_timeout=5,
                                    reconnected_cb=reconnected, error_cb=error)  # fmt: skip
        except Exception as exc:
            raise LogError(f"cannot reach JetStream at {','.join(urls)}: {exc!r}") from exc
        # Connected: from now on a lost connection is retried for ever (a gateway outlives
        # a cluster restart); nats-py reads the option at each reconnect.
        nc.options["max_reconnect_attempts"] = -1
        storage = cls(nc, urls, shards=shards, replicas=replicas, config=config or LogConfig(),
                      append_timeout_s=append_timeout_s,
                      retention_interval_s=retention_interval_s,
                      status_interval_s=status_interval_s,
                      request_timeout_s=request_timeout_s,
                      max_queued_bytes=max_queued_bytes)  # fmt: skip
        try:
            await storage._start(load_concurrency)
        except BaseException as exc:
            await nc.close()
            if isinstance(exc, TRANSIENT):
                raise LogError(f"JetStream at {','.join(urls)} did not answer: {exc!r}") from exc
            raise
        return storage

    async def _start(self, load_concurrency: int) -> None:
        servers = max(len(self.urls), len(self.nc.servers))
        self.replicas = min(self.replicas, servers)
        await asyncio.gather(*(ensure_shard(self.api, k, self.replicas, self.startup_s)
                               for k in range(self.shards)))  # fmt: skip
        # Follow first, then load: a record stored meanwhile is seen by one or the other.
        await self.nc.subscribe("twn.>", cb=self._on_notify,
                                pending_bytes_limit=NOTIFY_PENDING_BYTES)  # fmt: skip
        await self._load_catalog(load_concurrency)
        # (a copy: a notification handled during the reads below adds heads of new streams)
        for stream in [s for s in self.catalog.heads if s.startswith(RESERVED_PREFIX)]:
            if self.catalog.known(stream):
                self._reserved[stream] = await self._read_all(stream)
        self._spawn(self._every(self.status_interval_s, self.refresh_status))
        # (always: a runtime retention may be set on any stream, by any gateway, at any time;
        # a pass over streams without limits reads nothing)
        self._spawn(self._every(self.retention_interval_s, self.retention_pass, wait=True))

    async def _load_catalog(self, concurrency: int) -> None:
        """Every stream of every shard: its administration entry, then its first and last
        records (concurrently, at most ``concurrency`` requests in flight)."""
        found: list[tuple[Head, int]] = []
        administered: list[Head] = []
        for shard in range(self.shards):
            for subject, count in (await self._subjects(shard)).items():
                try:
                    found.append((self.catalog.head(stream_of_subject(subject)), count))
                    continue
                except ValueError:
                    pass
                try:
                    administered.append(self.catalog.head(stream_of_admin_subject(subject)))
                except ValueError:
                    log.warning("ignoring subject %r (not a tidewire stream)", subject)
        gate = asyncio.Semaphore(concurrency)

        async def load_entry(head: Head) -> None:
            async with gate:
                try:
                    stored = await retrying(lambda: admin.read_entry(self.api, head),
                                            self.startup_s)  # fmt: skip
                except CorruptRecordError as exc:
                    log.error("stream %r: %s", head.name, exc)
                    return
                if stored is not None:
                    self.learn(head.name, stored)

        await asyncio.gather(*(load_entry(h) for h in administered))
        heads = [head for head, _ in found]
        for head, count in found:
            head.records = count

        async def load(head: Head) -> None:
            async with gate:
                try:
                    await retrying(lambda: self.refresh_head(head), self.startup_s)
                except CorruptRecordError as exc:  # (the stream's reads will say so too)
                    log.error("stream %r: %s", head.name, exc)

        await asyncio.gather(*(load(h) for h in heads))

    async def _subjects(self, shard: int) -> dict[str, int]:
        """The subjects of shard stream ``shard`` and their message counts (paged)."""
        subjects: dict[str, int] = {}
        while True:
            body = {"subjects_filter": f"tw.{shard}.>", "offset": len(subjects)}
            info = await retrying(
                functools.partial(
                    self.api.call, f"$JS.API.STREAM.INFO.{shard_stream(shard)}", body, FIRST_WAIT
                ),
                self.startup_s, also=STARTING,
            )
            page = (info.get("state") or {}).get("subjects") or {}
            subjects.update(page)
            if not page or len(subjects) >= int(info.get("total", 0)):
                return subjects

    async def refresh_head(self, head: Head) -> None:
        """Read the stream's last (and, if unknown, first) record from JetStream."""
        try:
            last = await self.api.direct_get(head.jetstream, {"last_by_subj": head.subject})
        except Tombstone as tomb:  # (deleted, not made again)
            self.tombstoned(head.name, tomb.seq)
            return
        if last is None:
            return
        self.catalog.advance(head.name, RecordPoint.of(last))
        if head.first is None or head.first.sum.prev > 0:
            first = await self.api.direct_get(
                head.jetstream, {"seq": 0, "next_by_subj": head.subject}
            )
            if first is not None:
                self.catalog.trimmed(head.name, RecordPoint.of(first))  # fmt: skip

    async def _on_notify(self, msg: Msg) -> None:
        self.notices.hear(msg.headers or {})
        if msg.subject.count(".") == 3:  # twn.<k>.<token>.admin (a record's has 2 dots)
            self._on_admin(msg)
            return
        try:
            stream = stream_of_subject(msg.subject)
            record = StoredRecord.from_headers(msg.headers or {})
        except Tombstone as tomb:
            self.tombstoned(stream, tomb.seq)
            return
        except (KeyError, ValueError):
            return  # (not a record of ours: nothing to learn)
        self.catalog.advance(stream, RecordPoint.of(record))
        head = self.catalog.heads[stream]
        if head.first is None and stream not in self._finding_first and not self._closed:
            # A stream first heard of by a later record (a notification dropped, or older
            # records purged): its first record gives its start id and counts.
            self._finding_first.add(stream)
            self._spawn(self._find_first(head))

    def _on_admin(self, msg: Msg) -> None:
        try:
            stream = stream_of_admin_subject(msg.subject)
            head = self.catalog.head(stream)
            stored = admin.entry_of(head.jetstream, head.admin_subject, msg.headers or {})
        except (ValueError, CorruptRecordError) as exc:
            log.warning("ignoring an administration notification on %r: %s", msg.subject, exc)
            return
        self.learn(stream, stored)

    def learn(self, stream: str, stored: StoredEntry) -> None:
        """Apply ``stream``'s administration entry ``stored`` if it is newer than the one
        known (created, runtime retention, or neither any more: deleted)."""
        self.catalog.configure(stream, stored.entry, stored.seq)

    def tombstoned(self, stream: str, seq: int) -> None:
        """``stream`` was deleted, its tombstone at ``seq``: unless a later record is known,
        its head is emptied and its waiters ended (:meth:`Catalog.fenced`); its read
        positions are forgotten and its queued appends' ids planned from the head again."""
        if not self.catalog.fenced(stream, seq):
            return
        self.reader.forget(stream)
        writer = self.writers.get(stream)
        if writer is not None:
            writer.rebase()

    async def _find_first(self, head: Head) -> None:
        try:
            first = await retrying(
                lambda: self.api.direct_get(
                    head.jetstream, {"seq": 0, "next_by_subj": head.subject}
                ),
                self.append_timeout_s,
            )
            if first is not None:
                self.catalog.trimmed(head.name, RecordPoint.of(first))
        finally:
            self._finding_first.discard(head.name)

    async def _read_all(self, stream: str) -> list[Batch]:
        out: list[Batch] = []
        next_id = self.start_id(stream)
        while batches := await self.reader.read(stream, next_id, 4 * MiB, 2**62):
            out.extend(batches)
            next_id = batches[-1].last_id + 1
        return out

    # ------------------------------------------------------------------ background passes

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` in the background (cancelled at close; a failure is logged)."""
        self._spawn(work)

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("JetStream background task failed: %r", task.exception())

    async def _every(
        self, seconds: float, work: Callable[[], Coroutine[Any, Any, Any]], *, wait: bool = False
    ) -> None:
        """``work()`` every ``seconds`` (after waiting once, with ``wait``) until closed."""
        if wait:
            await asyncio.sleep(seconds)
        while not self._closed:
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # (the cluster may be electing: try again next time)
                log.warning("JetStream background pass %s failed: %r", work.__name__, exc)
            if self._closed:  # (a cancel landing as a request completes can be lost: 3.11's
                return  # wait_for, inside nats-py, returns the result instead)
            await asyncio.sleep(seconds)

    async def retention_pass(self, now: int | None = None) -> int:
        """Apply every stream's retention at ``now`` (ms; default the clock): purge whole
        records; return how many. Runs every ``retention_interval_s`` on its own."""
        return await enforce(self.api, self.catalog, self.config, now_ms() if now is None else now)

    async def refresh_status(self) -> ClusterStatus:
        """Ask every shard stream's leader for its state; :meth:`cluster` returns it since."""
        infos = []
        for shard in range(self.shards):
            try:
                infos.append(await self.api.call(f"$JS.API.STREAM.INFO.{shard_stream(shard)}"))
            except (JetStreamError, TimeoutError, nats.errors.TimeoutError) as exc:
                log.debug("no info for shard %d: %r", shard, exc)
        connected = self.nc.connected_url
        here = f"{connected.hostname}:{connected.port}" if connected else ""
        servers = [f"{u.hostname}:{u.port}" for u in self.nc.servers]
        self._status = cluster_status(infos, here, servers, now_ms())
        for suspect in self.notices.suspects(infos, time.time()):  # (a notification lost?)
            for stream in self.catalog.waited():
                if (head := self.catalog.head(stream)).jetstream == suspect:
                    self._spawn(self.refresh_head(head))
        return self._status

    # ------------------------------------------------------------------ what it is

    def describe(self) -> str:
        return f"{','.join(self.urls)} (JetStream, {self.shards} shards, R{self.replicas})"

    def cluster(self) -> ClusterStatus | None:
        return self._status

    def observe(
        self,
        *,
        append: Callable[[float], None] | None = None,
        fsync: Callable[[float], None] | None = None,
    ) -> None:
        self.on_append = append  # (no flush of our own: JetStream fsyncs, fsync is never called)

    # ------------------------------------------------------------------ cheap queries

    def streams(self) -> list[str]:
        return sorted(name for name in self.catalog.heads if self.catalog.known(name))

    def stats(self) -> list[StreamStats]:
        return [self.catalog.heads[name].stats() for name in self.streams()]

    def __contains__(self, stream: object) -> bool:
        return isinstance(stream, str) and self.catalog.known(stream)

    def latest(self, stream: str) -> int:
        head = self.catalog.heads.get(stream)
        return head.latest if head is not None else 0

    def accepted_latest(self, stream: str) -> int:
        writer = self.writers.get(stream)
        latest = self.latest(stream)
        return max(writer.accepted, latest) if writer is not None else latest

    def start_id(self, stream: str) -> int:
        head = self.catalog.heads.get(stream)
        return head.start_id if head is not None else 1

    def fence(self) -> int:
        return self.refusals

    def replay(self, stream: str) -> Iterator[Batch]:
        yield from self._reserved.get(stream, [])

    # ------------------------------------------------------------------ the writer's host

    def next_write(self) -> str:
        return f"{self.gateway}:{next(self._writes)}"

    def refused(self, exc: StorageFullError) -> None:
        log.warning("%s", exc)
        self.refusals += 1

    # ------------------------------------------------------------------ I/O

    async def append(
        self, batch: Batch, *, assign_ids: bool = False, fence: int | None = None
    ) -> Batch:
        if self._closed:
            raise LogClosedError("the JetStream storage is closed")
        batch = batch.owned().validate()
        if fence is not None and fence != self.refusals:
            raise StorageFullError(batch.stream, errno.ENOSPC, "after an earlier append was "
                                   "refused")  # fmt: skip
        if not assign_ids and batch.nbytes > ATOMIC_FROM:  # (more than one record: at once)
            if batch.first_id <= self.accepted_latest(batch.stream):
                raise IdOrderError(batch.stream, batch.first_id, self.accepted_latest(batch.stream))

            async def whole() -> AsyncIterator[Batch]:
                yield batch

            await self.append_atomic(batch.stream, batch.first_id, len(batch), whole)
            return batch
        writer = self.writers.get(batch.stream)
        if writer is None:
            head = self.catalog.head(batch.stream)
            writer = self.writers[batch.stream] = StreamWriter(self, head, self.max_queued_bytes)
        return await writer.append(batch, assign_ids, fence)

    async def append_atomic(self, stream: str, first_id: int, count: int, source: Source,
                            record_bytes: int = RECORD_BYTES) -> tuple[int, int]:  # fmt: skip
        """Store the ``count`` events of ``source()`` as ids ``first_id``.. of ``stream``,
        all visible at once or none (:mod:`.jsatomic`, records of at most ``record_bytes``),
        after this gateway's appends queued before; the ids stored."""
        self._check_open()
        writer = self.writers.get(stream)
        if writer is not None:
            await writer.idle.wait()
        return await append_atomic(self, self.catalog.head(stream), first_id, count, source,
                                   record_bytes)  # fmt: skip

    def staging_area(self) -> JetStreamStaging:
        """Staged parts in ``TW_STAGE`` (:mod:`.staging`)."""
        return JetStreamStaging(self)

    async def read(self, stream: str, from_id: int, max_bytes: int, max_events: int) -> list[Batch]:
        if self._closed:
            raise LogClosedError("the JetStream storage is closed")
        try:  # (through a failover: the replicas answer again once a leader is elected)
            return await retrying(
                lambda: self.reader.read(stream, from_id, max_bytes, max_events),
                self.append_timeout_s,
            )
        except TRANSIENT as exc:
            raise LogError(f"stream {stream!r}: JetStream did not answer a read: {exc!r}") from exc

    async def find_time(self, stream: str, ms: int) -> int | None:
        if self._closed:
            raise LogClosedError("the JetStream storage is closed")
        head = self.catalog.heads.get(stream)
        if head is None or head.last is None:
            return None
        try:  # (through a failover, as a read)
            return await retrying(lambda: find_time(self.api, head, ms), self.append_timeout_s)
        except TRANSIENT as exc:
            raise LogError(f"stream {stream!r}: JetStream did not answer a time lookup: "
                           f"{exc!r}") from exc  # fmt: skip

    async def wait_for(self, stream: str, after_id: int) -> None:
        await self.catalog.wait(stream, after_id)

    async def settled(self, stream: str) -> int:
        writer = self.writers.get(stream)
        if writer is not None:
            await writer.idle.wait()
        return self.latest(stream)

    def enforce_retention(self, now_ms: int) -> int:
        return 0  # (the backend's own pass on the loop: retention_pass)

    # ------------------------------------------------------------------ administration

    def retention(self, stream: str) -> Retention:
        head = self.catalog.heads.get(stream)
        runtime = head.runtime if head is not None else None
        if runtime is not None:
            return Retention(runtime[0], runtime[1], "runtime")
        own = self.config.for_stream(stream)
        source = "config" if stream in self.config.streams else "default"
        return Retention(own.retention_ms, own.retention_bytes, source)

    async def create_stream(self, stream: str, retention_ms: int | None = None,
                            retention_bytes: int | None = None, *,
                            runtime: bool = False) -> None:  # fmt: skip
        self._check_open()
        validate_stream_name(stream)
        await admin.create(self, stream, (retention_ms, retention_bytes) if runtime else None)

    async def set_retention(self, stream: str, retention_ms: int | None,
                            retention_bytes: int | None) -> None:  # fmt: skip
        self._check_open()
        await admin.set_retention(self, stream, (retention_ms, retention_bytes))

    async def delete_stream(self, stream: str) -> None:
        self._check_open()
        await admin.delete(self, stream)

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("the JetStream storage is closed")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        pending = [w.idle.wait() for w in self.writers.values() if not w.idle.is_set()]
        if pending:
            await asyncio.wait_for(asyncio.gather(*pending), self.append_timeout_s + 5)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.catalog.close()
        try:  # (every append was acked above: flushing what is buffered is all that is left)
            await self.nc.flush(timeout=2)
        except Exception as exc:  # (a connection already gone has nothing to flush)
            log.debug("flush at close: %r", exc)
        await self.nc.close()

    def __repr__(self) -> str:
        return f"JetStreamStorage({self.describe()!r}, streams={len(self.streams())})"


def _check(storage: JetStreamStorage) -> Storage:  # mypy: the backend satisfies the Protocol
    return storage


def _check_admin(storage: JetStreamStorage) -> StreamAdmin:  # (and the administration's)
    return storage
