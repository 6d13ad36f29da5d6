"""What a gateway knows of every stream without asking: its subject, head, first record.

The backend keeps one :class:`Head` per stream, fed by every record it learns of: its own
acks, direct gets, and the headers-only notifications JetStream republishes on ``twn.>`` for
every record any gateway stored. From them the cheap queries of the storage interface
(``latest``, ``start_id``, ``streams``, ``stats``) answer from memory, and :meth:`Catalog.wait`
wakes ``wait_for`` callers. A head only moves forward (a notification older than what a direct
get already showed changes nothing), except when the stream is deleted: :meth:`Catalog.fenced`
(its tombstone, :mod:`.subjects`) empties it in place (writers and readers holding the head see
it empty; the writers expect the tombstone as the subject's last message) and ends its waiters.
A head also keeps the stream's administration entry (created empty, runtime retention,
deleted: :class:`~.subjects.AdminEntry`). Nothing here does I/O.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..log import StreamDeleted, StreamStats
from ..model import LogClosedError, LogError
from .jsapi import StoredRecord
from .subjects import AdminEntry, RecordSum, admin_subject, shard_of, shard_stream, subject_of

__all__ = ["Catalog", "Head", "RecordPoint"]


@dataclass(frozen=True, slots=True)
class RecordPoint:
    """One record of a stream, as far as the catalog cares: its sequence, ids and sum."""

    seq: int
    first_id: int
    last_id: int
    sum: RecordSum

    @classmethod
    def of(cls, record: StoredRecord) -> RecordPoint:
        return cls(record.seq, record.first_id, record.last_id, record.sum)


@dataclass(slots=True)
class Head:
    """One stream: where it lives and what its first and last records are."""

    name: str
    jetstream: str  # TW_<k>
    subject: str  # tw.<k>.<token>
    last: RecordPoint | None = None
    first: RecordPoint | None = None  # None: not known yet (fetched in the background)
    records: int = 0  # messages on the subject, as far as this gateway saw
    admin_subject: str = ""  # tw.<k>.<token>.admin
    admin: AdminEntry | None = None  # its last administration entry, if it has one
    admin_seq: int = 0  # that entry's sequence (entries only move forward too)
    fence_seq: int = 0  # the latest tombstone known on the subject (0: none)

    @property
    def exists(self) -> bool:
        """Whether this is a stream: it has a record, or was created (and not deleted)."""
        return self.last is not None or (self.admin is not None and self.admin.live)

    @property
    def runtime(self) -> tuple[int | None, int | None] | None:
        """Its runtime retention (ms, bytes), set through the admin API; ``None``: none."""
        admin = self.admin
        return admin.runtime if admin is not None and admin.live else None

    @property
    def latest(self) -> int:
        return self.last.last_id if self.last is not None else 0

    @property
    def last_seq(self) -> int:
        """The subject's last message as known: the last record, else its tombstone, else 0
        (what an append expects, ``Nats-Expected-Last-Subject-Sequence``)."""
        return self.last.seq if self.last is not None else self.fence_seq

    @property
    def start_id(self) -> int:
        """The lowest id still readable: 1 unless retention removed records (then the id after
        the last removed record's last id)."""
        if self.first is None or self.first.sum.prev == 0:
            return 1
        return self.first.sum.prev + 1

    def stats(self) -> StreamStats:
        last, first = self.last, self.first
        if last is None:
            return StreamStats(self.name, 0, None, None, 0, 0)
        base_events = first.sum.events_before if first is not None else 0
        base_bytes = first.sum.bytes_before if first is not None else 0
        return StreamStats(self.name, last.sum.events_through - base_events,
                           first.first_id if first is not None else None, last.last_id,
                           last.sum.bytes_through - base_bytes, max(self.records, 1))  # fmt: skip


@dataclass(slots=True)
class _Tail:
    future: asyncio.Future[None]
    waiters: int = 0


@dataclass(slots=True)
class Catalog:
    """Every stream's :class:`Head`, and the ``wait_for`` waiters, on one event loop."""

    shards: int
    heads: dict[str, Head] = field(default_factory=dict)
    closed: bool = False
    _tails: dict[str, _Tail] = field(default_factory=dict)

    def head(self, stream: str) -> Head:
        """The stream's head, created (empty) on first use."""
        head = self.heads.get(stream)
        if head is None:
            k = shard_of(stream, self.shards)
            head = Head(stream, shard_stream(k), subject_of(stream, self.shards),
                        admin_subject=admin_subject(stream, self.shards))  # fmt: skip
            self.heads[stream] = head
        return head

    def known(self, stream: str) -> bool:
        """Whether the stream exists: it has a record, or was created and not deleted."""
        head = self.heads.get(stream)
        return head is not None and head.exists

    def configure(self, stream: str, entry: AdminEntry, seq: int) -> bool:
        """Learn of the stream's administration entry stored at ``seq``; True when it is newer
        than the one known (a ``delete`` entry only ends the entry's own state, created and
        runtime retention: the records' end is the tombstone's, :meth:`fenced`)."""
        head = self.head(stream)
        if seq <= head.admin_seq:
            return False
        head.admin, head.admin_seq = entry, seq
        return True

    def fenced(self, stream: str, seq: int) -> bool:
        """The stream was deleted: its tombstone is at ``seq``. Unless a later record is known
        already (the stream made again: it stays), empty its head in place, expect the
        tombstone as the subject's last message, and end the waiters with
        :class:`~tidewire.log.StreamDeleted`. True when the tombstone is news (what was read
        of the stream before it is then stale)."""
        head = self.head(stream)
        if seq <= head.fence_seq:
            return False
        head.fence_seq = seq
        if head.last is not None and head.last.seq > seq:
            if head.first is not None and head.first.seq < seq:
                head.first = None  # (a record of the stream deleted: its start is found again)
            return True
        self.emptied(stream)
        self._notify(stream, StreamDeleted(stream))
        return True

    def emptied(self, stream: str) -> None:
        """The stream's subject holds no record (the leader says so): forget its records, so
        that appends plan from nothing again (ids from 1)."""
        head = self.head(stream)
        head.last = head.first = None
        head.records = 0

    def advance(self, stream: str, point: RecordPoint) -> bool:
        """Learn of a stored record; True when it moved the head (waiters are woken)."""
        head = self.head(stream)
        if point.seq <= head.last_seq:
            if head.first is not None and point.seq < head.first.seq and point.sum.prev == 0:
                head.first = point  # (an older record seen after a newer one)
            return False
        if head.last is None:
            head.records = max(head.records, 1)
        else:
            head.records += 1
        head.last = point
        if head.first is None and point.sum.events_before == 0:
            head.first = point  # the stream's very first record
        self._notify(stream)
        return True

    def trimmed(self, stream: str, first: RecordPoint | None, purged: int = 0) -> None:
        """Retention removed the records before ``first`` (the stream's first record now)."""
        head = self.head(stream)
        if first is not None and (head.first is None or first.seq >= head.first.seq):
            head.first = first
        head.records = max(1, head.records - purged) if head.last is not None else 0

    # ------------------------------------------------------------------ waiting

    async def wait(self, stream: str, after_id: int) -> None:
        """Return once ``stream``'s head is above ``after_id``; :class:`LogClosedError` when
        the catalog closes; :class:`~tidewire.log.StreamDeleted` when the stream is deleted
        meanwhile, or was deleted (nothing stored since) and ``after_id`` is an id of it (a
        subscriber that was between two reads when the tombstone came). Waiters of a stream
        share one future, dropped with the last one."""
        while True:
            if self.closed:
                raise LogClosedError("the JetStream storage is closed")
            head = self.heads.get(stream)
            if head is not None and head.latest > after_id:
                return
            if head is not None and head.fence_seq and head.last is None and after_id > 0:
                raise StreamDeleted(stream)
            tail = self._tails.get(stream)
            if tail is None:
                tail = self._tails[stream] = _Tail(asyncio.get_running_loop().create_future())
            tail.waiters += 1
            try:
                await asyncio.shield(tail.future)
            finally:
                tail.waiters -= 1
                if tail.waiters == 0 and self._tails.get(stream) is tail:
                    del self._tails[stream]

    def waited(self) -> list[str]:
        """The streams someone waits on (to re-check after a reconnect)."""
        return list(self._tails)

    def _notify(self, stream: str, error: LogError | None = None) -> None:
        tail = self._tails.pop(stream, None)
        if tail is not None and not tail.future.done():
            if error is None:
                tail.future.set_result(None)
            else:  # (every waiter raises it; retrieved here so that none is left unheard)
                tail.future.set_exception(error)
                tail.future.exception()

    def close(self) -> None:
        """Wake every waiter with :class:`LogClosedError`."""
        self.closed = True
        for stream in list(self._tails):
            self._notify(stream)
