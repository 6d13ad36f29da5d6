"""One stream's events, from a source, stored as one JetStream **atomic batch**: readers see
all of them or none, and a gateway that dies half-way leaves nothing (docs/cluster.md
"Atomic appends").

JetStream's atomic batch publish (nats-server 2.12+, ADR-50; the shard streams are made with
``allow_atomic``): every message carries ``Nats-Batch-Id`` and ``Nats-Batch-Sequence`` (1, 2,
...), the last one ``Nats-Batch-Commit: 1``; the server stages them and stores the whole batch
at the commit, or nothing (a gap, a failed check, a batch left without traffic for 10 s). The
first message carries ``Nats-Expected-Last-Subject-Sequence``, checked at the commit against
the stream as it was before the batch, so a batch lands only on the head it was planned on,
as every record the writers publish does (:mod:`.jswrite`).

Each message is one record of at most :data:`~.jswrite.RECORD_BYTES`, with the usual
``Tw-Ids``, ``Tw-Sum`` (chained from the head) and ``Tw-Write`` headers (the one ``Tw-Write``
of the batch on each of its messages: one is found only if all were stored). At most
:data:`MAX_MESSAGES` (the server's limit) messages: about 8 GB at 8 MiB records. The first
message and every :data:`ACK_EVERY`-th are requests (the server answers an error at once, and
it paces the publisher); the others are plain publishes; the commit's answer is the batch's
ack.

Used for what must not land in part: a transaction bigger than one record (an own-id append
of more than :data:`~.jswrite.RECORD_BYTES`, :meth:`JetStreamStorage.append
<tidewire.cluster.jetstream.JetStreamStorage.append>`) and a staged transaction's commit
(:mod:`.staging`).
"""

from __future__ import annotations

import asyncio
import errno
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from nats.errors import ConnectionClosedError
from nats.errors import Error as NatsError

from ..model import (
    Batch,
    IdOrderError,
    LimitExceeded,
    LogClosedError,
    LogError,
    StorageFullError,
)
from ..record import HEADER_SIZE, encode, merge
from .catalog import Catalog, Head, RecordPoint
from .jsapi import (
    WRONG_LAST_SEQUENCE,
    Api,
    JetStreamError,
    Tombstone,
    is_storage_full,
    retrying,
)
from .jswrite import RECORD_BYTES
from .subjects import IDS, SUM, WRITE, RecordSum

__all__ = ["ACK_EVERY", "MAX_MESSAGES", "AtomicHost", "Source", "append_atomic", "records"]

MAX_MESSAGES = 1000
"""The most messages in one atomic batch (nats-server's limit)."""

ACK_EVERY = 16
"""Every this many messages of a batch, one is a request (flow control, early errors)."""

_RETRY_DELAY = 0.05


class AtomicHost(Protocol):
    """What an atomic append needs from the storage."""

    api: Api
    catalog: Catalog
    append_timeout_s: float

    def next_write(self) -> str: ...

    def tombstoned(self, stream: str, seq: int) -> None: ...


Source = Callable[[], AsyncIterator[Batch]]
"""Gives the events to store, afresh at each call (each try reads them again)."""


async def records(source: AsyncIterator[Batch], first_id: int,
                  record_bytes: int = RECORD_BYTES
                  ) -> AsyncIterator[tuple[bytearray, int, int]]:  # fmt: skip
    """The events of ``source`` (their ids ignored) as records of at most ``record_bytes``,
    ids ``first_id``.. in order: (bytes, count, max timestamp). An event bigger than a record
    is :class:`~tidewire.model.LimitExceeded`."""
    room_of_record = record_bytes - HEADER_SIZE - 8
    pending: list[Batch] = []
    room, next_id = room_of_record, first_id

    def flush() -> tuple[bytearray, int, int]:
        nonlocal room, next_id, pending
        batch = pending[0] if len(pending) == 1 else merge([(b, None) for b in pending])
        record = encode(batch, next_id)
        next_id += record.count
        pending, room = [], room_of_record
        return record.data, record.count, record.max_timestamp

    async for batch in source:
        start = 0
        while start < len(batch):
            stop = batch.fit(start, room)
            if stop == start:
                if not pending:
                    size = batch.slice(start, start + 1).nbytes
                    raise LimitExceeded("event bytes in a JetStream record", room_of_record, size)
                yield flush()
                continue
            piece = batch if (start, stop) == (0, len(batch)) else batch.slice(start, stop)
            pending.append(piece)
            room -= piece.nbytes
            start = stop
    if pending:
        yield flush()


async def append_atomic(host: AtomicHost, head: Head, first_id: int, count: int, source: Source,
                        record_bytes: int = RECORD_BYTES) -> tuple[int, int]:  # fmt: skip
    """Store the ``count`` events of ``source()`` (called again for each try) as ids
    ``first_id``.. of ``head``'s stream, as one atomic batch of records of at most
    ``record_bytes``; the ids stored.
    :class:`~tidewire.model.IdOrderError` once the stream's head is at or above
    ``first_id``; retried (a conflict below ``first_id``, no answer) until
    ``append_timeout_s``."""
    deadline = time.monotonic() + host.append_timeout_s
    write = host.next_write()
    unsure = False  # a commit without an answer may have been stored
    while True:
        if head.latest >= first_id:
            left = max(0.05, deadline - time.monotonic())
            if unsure and await retrying(lambda: _landed(host, head, write), left):
                return first_id, first_id + count - 1
            raise IdOrderError(head.name, first_id, head.latest)
        try:
            return await _publish(host, head, first_id, count, source, write, record_bytes)
        except JetStreamError as exc:
            if is_storage_full(exc):
                raise StorageFullError(head.name, errno.ENOSPC,
                                       f"writing to JetStream: {exc.description}") from None
            if exc.err_code not in WRONG_LAST_SEQUENCE and exc.code != 503:
                raise
        except ConnectionClosedError:
            raise LogClosedError("the JetStream connection is closed") from None
        except (TimeoutError, NatsError) as exc:  # no answer: maybe stored
            unsure = True
            if time.monotonic() > deadline:
                raise LogError(f"stream {head.name!r}: no ack for an atomic batch from "
                               f"JetStream in {host.append_timeout_s:g} s: {exc!r}") from None
        left = max(0.05, deadline - time.monotonic())
        if await retrying(lambda: _landed(host, head, write), left):  # (refreshes the head)
            return first_id, first_id + count - 1
        if time.monotonic() > deadline:
            raise LogError(f"stream {head.name!r}: an atomic batch was not stored in "
                           f"{host.append_timeout_s:g} s")  # fmt: skip
        await asyncio.sleep(_RETRY_DELAY)


async def _publish(host: AtomicHost, head: Head, first_id: int, count: int,
                   source: Source, write: str, record_bytes: int) -> tuple[int, int]:  # fmt: skip
    api, nc = host.api, host.api.nc
    batch_id = uuid.uuid4().hex
    expected = head.last_seq
    last_sum = head.last.sum if head.last is not None else None
    prev_last = head.latest  # (the last id before the next record: ids may have gaps)
    last_id, stored = first_id - 1, 0
    points: list[tuple[int, int, RecordSum]] = []  # (first id, last id, sum) per message
    queued: tuple[bytearray, dict[str, str]] | None = None

    async def send(data: bytearray, headers: dict[str, str], *, commit: bool) -> None:
        n = int(headers["Nats-Batch-Sequence"])
        if len(points) > MAX_MESSAGES:  # (before the last message allowed: none is stored)
            raise LimitExceeded("records in one atomic JetStream batch", MAX_MESSAGES,
                                len(points))  # fmt: skip
        if commit:
            headers["Nats-Batch-Commit"] = "1"
        if commit or n == 1 or n % ACK_EVERY == 0:
            msg = await nc.request(head.subject, bytes(data), timeout=api.timeout,
                                   headers=headers)  # fmt: skip
            if msg.data:  # (an empty answer: staged so far)
                answer = json.loads(msg.data)
                error = answer.get("error")
                if error:
                    raise JetStreamError(int(error.get("code", 0)), int(error.get("err_code", 0)),
                                         str(error.get("description", "")))  # fmt: skip
                if commit:
                    _learn(host, head, int(answer["seq"]), points)
        else:
            await nc.publish(head.subject, bytes(data), headers=headers)

    async for data, n, max_ts in records(source(), first_id, record_bytes):
        if queued is not None:
            await send(*queued, commit=False)
        a, b = last_id + 1, last_id + n
        record_sum = (RecordSum(0, 0, 0, n, len(data), max_ts) if last_sum is None
                      else last_sum.following(prev_last, n, len(data), max_ts))  # fmt: skip
        points.append((a, b, record_sum))
        last_sum, prev_last = record_sum, b
        headers = {IDS: f"{a}-{b}", WRITE: write, SUM: record_sum.header(),
                   "Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(len(points))}  # fmt: skip
        if len(points) == 1:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected)
        queued = (data, headers)
        last_id, stored = b, stored + n
    if stored != count or queued is None:
        raise LogError(f"stream {head.name!r}: the source gave {stored} event(s), not {count}")
    await send(*queued, commit=True)
    return first_id, last_id


def _learn(host: AtomicHost, head: Head, last_seq: int,
           points: list[tuple[int, int, RecordSum]]) -> None:  # fmt: skip
    """The batch is stored, its last message at ``last_seq``: the catalog learns each."""
    first_seq = last_seq - len(points) + 1
    for i, (a, b, record_sum) in enumerate(points):
        host.catalog.advance(head.name, RecordPoint(first_seq + i, a, b, record_sum))


async def _landed(host: AtomicHost, head: Head, write: str) -> bool:
    """Whether the stream's last record (asked of the leader) is this batch's; the head is
    refreshed either way (a deletion found: the head starts again, after the tombstone)."""
    try:
        last = await host.api.leader_get(head.jetstream, {"last_by_subj": head.subject})
    except Tombstone as tomb:
        host.tombstoned(head.name, tomb.seq)
        return False
    if last is None:
        if head.last is not None:
            host.catalog.emptied(head.name)
        return False
    host.catalog.advance(head.name, RecordPoint.of(last))
    return last.write == write
