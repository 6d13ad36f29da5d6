"""The storage interface the hub owns, and its first implementation, the embedded log.

Every byte a protocol writes or reads goes through the hub, and the hub reaches its storage only
through :class:`Storage`. The interface is shaped so that a remote, replicated backend (NATS
JetStream, issue 14) can implement it as well as the embedded :class:`~tidewire.log.Log`:

* anything that may do I/O is ``async`` and moves whole batches (append, read, waiting for
  commits, settling, closing);
* what the embedded log answers from memory is a cheap synchronous query (latest id, start id,
  the stream list and stats, membership, the fence); a remote backend keeps these from its own
  acknowledgements and subscriptions;
* no signature names a file or a directory: the data directory is an argument of
  :class:`EmbeddedStorage`'s constructor only, and :meth:`Storage.describe` is a human string
  for ``tidewire serve`` and the admin API;
* errors come from the one tree in :mod:`tidewire.model` (``LogError`` and its subclasses:
  ``IdOrderError``, ``StorageFullError``, ``LogClosedError``, ``DataLossError``; ``LimitExceeded``,
  ``InvalidBatch``, ``UnknownStream``).

:class:`EmbeddedStorage` is a thin wrapper rather than ``Log`` itself satisfying the Protocol:
``Log`` keeps its synchronous, thread-safe ``read`` for the offline tools and its own threads,
whereas the interface's ``read`` is asynchronous; the wrapper maps one onto the other without
renaming anything in the log (whose tests and tools stay as they are).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..log import Log, LogConfig, Retention, StreamStats
from ..model import Batch
from ..record import HEADER_SIZE
from .staging import STAGING_DIR, Staging, StagingArea

__all__ = [
    "BulkAppends",
    "ClusterStatus",
    "EmbeddedStorage",
    "GroupStatus",
    "ReplicaStatus",
    "Retention",
    "StagesParts",
    "Storage",
    "StreamAdmin",
    "StreamStats",
]

REPLAY_BYTES = 4 * 1024 * 1024
"""Bytes per read when :meth:`EmbeddedStorage.replay` walks a reserved stream."""


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """One server holding a replica of a replicated group, as its leader sees it."""

    name: str
    current: bool  # caught up with the leader
    offline: bool
    lag: int  # operations behind the leader
    active_s: float  # seconds since the leader last heard from it


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """One replicated unit of a remote backend (a JetStream stream): its leader, followers
    and content."""

    name: str
    leader: str | None  # None while it elects one
    replicas: tuple[ReplicaStatus, ...]  # the followers
    messages: int
    bytes: int
    first_seq: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """What a clustered backend knows of its cluster (``/metrics``, the dashboard): plain data,
    read when someone asks, as of ``at_ms``."""

    name: str  # the cluster's name
    connected: str  # the server this gateway is connected to
    servers: tuple[str, ...]  # every server's client URL known (the cluster's gossip)
    groups: tuple[GroupStatus, ...]
    at_ms: int


@runtime_checkable
class Storage(Protocol):
    """Durable, append-only streams of events with ids, as the hub needs them.

    Ids are per stream, increasing, with gaps allowed; ``0`` means "none". Appends to one
    stream are stored in the order the calls were made (on one event loop), which is what the
    hub's ingest pipeline and its fences rely on.
    """

    # ------------------------------------------------------------------ what it is

    def describe(self) -> str:
        """Where the data is, for people (a directory, a cluster URL); never parsed."""
        ...

    def cluster(self) -> ClusterStatus | None:
        """The cluster the data is replicated on, as last seen; ``None`` for a backend on one
        machine (the embedded log)."""
        ...

    def observe(
        self,
        *,
        append: Callable[[float], None] | None = None,
        fsync: Callable[[float], None] | None = None,
    ) -> None:
        """Latency observers (seconds): each append to its commit, each flush to stable
        storage. A backend without a flush of its own never calls ``fsync``."""
        ...

    # ------------------------------------------------------------------ cheap queries

    def streams(self) -> list[str]:
        """Every stream's name, sorted."""
        ...

    def stats(self) -> list[StreamStats]:
        """Per stream, sorted by name: events, first and latest id, bytes, segments (or the
        backend's unit of storage)."""
        ...

    def __contains__(self, stream: object) -> bool:
        """Whether the stream exists (has had an append)."""
        ...

    def latest(self, stream: str) -> int:
        """The stream's last committed id; 0 when it has none or does not exist."""
        ...

    def accepted_latest(self, stream: str) -> int:
        """The last id accepted for appending, appends in flight included: an append with its
        own ids must start above it."""
        ...

    def start_id(self, stream: str) -> int:
        """The lowest id still readable (1 unless retention removed the start)."""
        ...

    def fence(self) -> int:
        """A token that changes whenever an append is refused for want of space: pass the value
        taken while none of your appends was in flight as :meth:`append`'s ``fence``, and any
        append after a refusal is refused too."""
        ...

    def replay(self, stream: str) -> Iterator[Batch]:
        """The committed events of a *reserved* stream (``_tidewire.*``, small: the hub's own
        state) as they were when the storage was opened, oldest first; used once, at open. A
        remote backend fetches them in its own (async) connect and answers from that copy."""
        ...

    # ------------------------------------------------------------------ I/O

    async def append(
        self, batch: Batch, *, assign_ids: bool = False, fence: int | None = None
    ) -> Batch:
        """Append durably; return the batch as stored. ``assign_ids=False``: the batch's own
        ids, which must exceed :meth:`accepted_latest` (:class:`~tidewire.model.IdOrderError`).
        A refusal for want of space is :class:`~tidewire.model.StorageFullError`. The caller
        may reuse the batch's buffers once this returns or fails."""
        ...

    async def read(
        self, stream: str, from_id: int, max_bytes: int, max_events: int
    ) -> list[Batch]:
        """Committed events from ``from_id`` on: at most ``max_events``, about ``max_bytes``
        (at least one event when there is one). Empty when there are none (yet).
        :class:`~tidewire.model.DataLossError` when retention removed ``from_id``."""
        ...

    async def find_time(self, stream: str, ms: int) -> int | None:
        """The first id still readable whose event timestamp is at least ``ms`` (timestamps
        are the clients' and need not grow with the ids); ``None`` when no event is that new,
        or the stream does not exist. O(log n) (docs/log.md, "Time index")."""
        ...

    async def wait_for(self, stream: str, after_id: int) -> None:
        """Return once ``stream`` has a committed id above ``after_id``; cancelling the wait
        leaves nothing behind. :class:`~tidewire.model.LogClosedError` on close."""
        ...

    async def settled(self, stream: str) -> int:
        """Wait until every append handed over so far is committed or failed; return the
        latest committed id."""
        ...

    def enforce_retention(self, now_ms: int) -> int:
        """Apply every stream's retention at ``now_ms``; return how many units of storage were
        removed. The hub calls it in a worker thread; a backend whose server applies retention
        by itself returns 0."""
        ...

    async def close(self) -> None:
        """Finish what was handed over (durably), then release everything."""
        ...


@runtime_checkable
class StreamAdmin(Protocol):
    """What a storage that lets operators create, delete and re-configure streams offers
    besides :class:`Storage` (the admin API, docs/observability.md): the embedded log and the
    JetStream backend (cluster mode: docs/cluster.md, "Stream administration"). A separate
    interface: a backend without it (the tests' memory storage) is refused by the hub with a
    clear error rather than made to pretend."""

    def retention(self, stream: str) -> Retention:
        """The retention that applies to ``stream`` and where it comes from (``runtime``,
        ``config``, ``default``); of a stream that does not exist: what it would get."""
        ...

    async def create_stream(self, stream: str, retention_ms: int | None = None,
                            retention_bytes: int | None = None, *,
                            runtime: bool = False) -> None:  # fmt: skip
        """Create ``stream``, empty, durably; with ``runtime``, with that retention (``None``:
        no bound) over the configuration's. :class:`~tidewire.log.StreamExists` if it exists.
        (Asynchronous: a remote backend stores the creation in its cluster.)"""
        ...

    async def set_retention(self, stream: str, retention_ms: int | None,
                            retention_bytes: int | None) -> None:  # fmt: skip
        """Give ``stream`` this retention from now on and after restarts (over the
        configuration's); :class:`~tidewire.model.UnknownStream` if there is no such stream."""
        ...

    async def delete_stream(self, stream: str) -> None:
        """Delete ``stream`` and every event of it, durably (appends handed over before
        finish first); a stream created later under the name starts at id 1 again.
        :class:`~tidewire.model.UnknownStream` if there is no such stream."""
        ...


@runtime_checkable
class BulkAppends(Protocol):
    """What a storage that appends one stream's events as a source gives them, visible all at
    once, offers besides :class:`Storage` (the embedded log: log/bulk.py): a staged
    transaction bigger than one append takes (hub/staging.py) is committed that way."""

    @property
    def bulk_from_bytes(self) -> int | None:
        """Commits bigger than this are bulk appends (the biggest one append takes); ``None``:
        none is (without the journal a crash could leave part of one)."""
        ...

    async def append_bulk(self, stream: str, first_id: int, count: int, size_hint: int,
                          source: Callable[[], Iterator[Batch]]) -> tuple[int, int]:  # fmt: skip
        """Append the ``count`` events ``source`` gives (called once, in a worker thread) as
        ids ``first_id``..; durable, and visible all at once, when it returns; the ids stored.
        :class:`~tidewire.model.IdOrderError` as :meth:`Storage.append`'s."""
        ...


@runtime_checkable
class StagesParts(Protocol):
    """What a storage that keeps staged transaction parts (hub/staging.py: the Spark sink's)
    offers besides :class:`Storage`."""

    def staging_area(self) -> StagingArea:
        """Its staging area (one per hub: made once, by the hub's transactions)."""
        ...


class EmbeddedStorage:
    """:class:`Storage` on the embedded :class:`~tidewire.log.Log` of one data directory."""

    def __init__(self, log: Log) -> None:
        self.log = log

    @classmethod
    def open(cls, directory: str, config: LogConfig | None = None) -> EmbeddedStorage:
        """Open (creating and recovering it) the log in ``directory``, for writing."""
        return cls(Log.open(directory, config))

    @property
    def directory(self) -> str:
        """The data directory (absolute)."""
        return self.log.directory

    def staging_area(self) -> Staging:
        """Files under ``<data_dir>/.txn-staging`` (hub/staging.py)."""
        return Staging(os.path.join(self.log.directory, STAGING_DIR), self)

    def describe(self) -> str:
        return self.log.directory

    def cluster(self) -> ClusterStatus | None:
        return None

    def observe(
        self,
        *,
        append: Callable[[float], None] | None = None,
        fsync: Callable[[float], None] | None = None,
    ) -> None:
        self.log.on_append = append
        self.log.on_fsync = fsync

    def streams(self) -> list[str]:
        return self.log.streams()

    def stats(self) -> list[StreamStats]:
        return self.log.stats()

    def __contains__(self, stream: object) -> bool:
        return stream in self.log

    def latest(self, stream: str) -> int:
        return self.log.latest(stream)

    def accepted_latest(self, stream: str) -> int:
        return self.log.accepted_latest(stream)

    def start_id(self, stream: str) -> int:
        return self.log.start_id(stream)

    def fence(self) -> int:
        return self.log.fence()

    def replay(self, stream: str) -> Iterator[Batch]:
        if stream not in self.log:
            return
        next_id = self.log.start_id(stream)  # (retention may have trimmed it)
        while batches := self.log.read(stream, next_id, REPLAY_BYTES):
            yield from batches
            next_id = batches[-1].last_id + 1

    async def append(
        self, batch: Batch, *, assign_ids: bool = False, fence: int | None = None
    ) -> Batch:
        return await self.log.append(batch, assign_ids=assign_ids, fence=fence)

    @property
    def bulk_from_bytes(self) -> int | None:
        config = self.log.config
        if config.fsync and self.log.journal is None:
            return None
        return config.max_record_bytes - HEADER_SIZE

    async def append_bulk(self, stream: str, first_id: int, count: int, size_hint: int,
                          source: Callable[[], Iterator[Batch]]) -> tuple[int, int]:  # fmt: skip
        return await self.log.append_bulk(stream, first_id, count, size_hint, source)

    async def read(
        self, stream: str, from_id: int, max_bytes: int, max_events: int
    ) -> list[Batch]:
        return await self.log.read_async(stream, from_id, max_bytes, max_events)

    async def find_time(self, stream: str, ms: int) -> int | None:
        # In a worker thread, as a read that maps a segment is: the lookup may map one and
        # fault in a few pages of headers.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.log.find_time, stream, ms)

    async def wait_for(self, stream: str, after_id: int) -> None:
        await self.log.wait_for(stream, after_id)

    async def settled(self, stream: str) -> int:
        return await self.log.settled(stream)

    def enforce_retention(self, now_ms: int) -> int:
        return self.log.enforce_retention(now_ms)

    def retention(self, stream: str) -> Retention:
        return self.log.retention(stream)

    async def create_stream(self, stream: str, retention_ms: int | None = None,
                            retention_bytes: int | None = None, *,
                            runtime: bool = False) -> None:  # fmt: skip
        self.log.create_stream(stream, retention_ms, retention_bytes, runtime=runtime)

    async def set_retention(self, stream: str, retention_ms: int | None,
                            retention_bytes: int | None) -> None:  # fmt: skip
        await self.log.set_retention(stream, retention_ms, retention_bytes)

    async def delete_stream(self, stream: str) -> None:
        await self.log.delete_stream(stream)

    async def close(self) -> None:
        await self.log.close()

    def __repr__(self) -> str:
        return f"EmbeddedStorage({self.log!r})"


def _check(storage: EmbeddedStorage) -> Storage:  # mypy: the wrapper satisfies the Protocol
    return storage


def _check_admin(storage: EmbeddedStorage) -> StreamAdmin:  # (and the administration's)
    return storage

