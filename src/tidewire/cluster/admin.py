"""Stream administration in cluster mode (issue 23): create a stream with its retention,
change its retention, delete it, with every gateway agreeing (docs/cluster.md, "Stream
administration").

A stream's administration is kept in the cluster, beside its records: the last message of
the subject ``tw.<k>.<token>.admin`` of its shard stream ``TW_<k>`` carries its entry
(``Tw-Admin``, :class:`~.subjects.AdminEntry`: created, runtime retention, deleted). So it is
durable and replicated as the records are, survives every gateway's restart (each loads the
entries at connect), and reaches every gateway on the notification feed the records use
(``twn.<k>.<token>.admin``, headers only), in order with the stream's own records.

Every entry is written conditionally (``Nats-Expected-Last-Subject-Sequence``: the entry it
replaces), so two gateways changing one stream at once never both win: creating a stream that
another gateway creates at the same moment is :class:`~tidewire.log.StreamExists` for one of
them. Older entries are purged once a newer one is stored (one message per stream).

**Deleting** writes a tombstone on the stream's subject (``Tw-Deleted``, :mod:`.subjects`),
conditionally on the subject's last message as appends are, then purges the subject below it.
The tombstone is the fence: JetStream orders it with every conditional append, so an append
planned from the old records expects a sequence that is no longer the subject's last and is
refused, and its writer, finding the tombstone, plans from nothing (ids from 1, :mod:`.jswrite`).
Whatever is stored after the tombstone is the stream made again under the name, never a
continuation of the old one. (A purge alone is no fence: JetStream checks an append's expected
sequence when it proposes it, so an append racing the purge can be applied just after it, and
the old ids would go on: a test saw it.) Each gateway learns of the tombstone on the record
feed, in order with the records: it empties its head (ending its waiters with ``stream
deleted``) and forgets its read positions. Then the stream's administration entry, if it has a
live one, is replaced by a ``delete`` entry (its runtime retention goes with it).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..log import StreamExists
from ..model import LogError, StorageFullError, UnknownStream
from .catalog import Catalog, Head, RecordPoint
from .jsapi import (
    WRONG_LAST_SEQUENCE,
    Api,
    CorruptRecordError,
    JetStreamError,
    StoredRecord,
    Tombstone,
    is_storage_full,
    retrying,
)
from .subjects import ADMIN, DELETED, WRITE, AdminEntry

__all__ = [
    "ATTEMPTS",
    "AdminHost",
    "StoredEntry",
    "create",
    "delete",
    "entry_of",
    "read_entry",
    "set_retention",
]

log = logging.getLogger(__name__)

ATTEMPTS = 16
"""Conditional writes of one entry (or tombstone) before giving up: each refusal means another
gateway wrote meanwhile; a few at most, in practice. JetStream refuses a write whose expected
sequence another one in flight already took, before that one can be read: so after a refusal
the next attempt waits a little (:func:`_pause`), 10 ms doubling up to 0.5 s (~5 s in all)."""

Runtime = tuple[int | None, int | None]


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """An administration entry as stored: its sequence in the shard stream, and the
    ``Tw-Write`` of the publish that stored it (to recognise one's own after a lost ack)."""

    seq: int
    entry: AdminEntry
    write: str = ""


class AdminHost(Protocol):
    """What the administration needs from the storage (:class:`~.jetstream.
    JetStreamStorage`)."""

    api: Api
    catalog: Catalog
    append_timeout_s: float

    def next_write(self) -> str:
        """A ``Tw-Write`` value never used before."""
        ...

    def learn(self, stream: str, stored: StoredEntry) -> None:
        """Apply an entry of ``stream`` if newer than the one known."""
        ...

    def tombstoned(self, stream: str, seq: int) -> None:
        """``stream``'s tombstone is at ``seq``: forget its records (unless newer known)."""
        ...

    async def settled(self, stream: str) -> int:
        """Wait for this gateway's appends of ``stream`` handed over so far."""
        ...


def entry_of(jetstream: str, subject: str, headers: Mapping[str, str]) -> StoredEntry:
    """The entry in a message's headers (``Nats-Sequence`` included);
    :class:`~.jsapi.CorruptRecordError` when they do not hold one."""
    try:
        return StoredEntry(int(headers["Nats-Sequence"]), AdminEntry.parse(headers[ADMIN]),
                           headers.get(WRITE, ""))  # fmt: skip
    except (KeyError, ValueError) as exc:
        seq = headers.get("Nats-Sequence", "0")
        raise CorruptRecordError(jetstream, subject, int(seq) if seq.isdigit() else 0,
                                 f"not a tidewire admin entry ({exc!r})") from None  # fmt: skip


async def read_entry(api: Api, head: Head) -> StoredEntry | None:
    """The stream's last administration entry, as the leader of its shard says (never a
    lagging replica: a decision is made on it); ``None`` when it has none."""
    got = await api.leader_message(head.jetstream, {"last_by_subj": head.admin_subject})
    return None if got is None else entry_of(head.jetstream, head.admin_subject, got[0])


async def _last_record(host: AdminHost, head: Head) -> StoredRecord | None:
    """The stream's last record, from the leader (learnt by the catalog), or ``None`` (none,
    or a tombstone: learnt too)."""
    try:
        last = await host.api.leader_get(head.jetstream, {"last_by_subj": head.subject})
    except Tombstone as tomb:
        host.tombstoned(head.name, tomb.seq)
        return None
    if last is not None:
        host.catalog.advance(head.name, RecordPoint.of(last))
    return last


async def _write(host: AdminHost, head: Head, entry: AdminEntry, expected: int) -> int | None:
    """Store ``entry`` if the stream's last entry is still the one at ``expected`` (0: none);
    its sequence, or ``None`` when another entry came first. Retried while the cluster does
    not answer; a retry refused after an attempt that was stored without its ack finds it."""
    write = host.next_write()
    text = entry.header()
    headers = {ADMIN: text, WRITE: write, "Nats-Expected-Last-Subject-Sequence": str(expected)}
    api = host.api
    try:
        return await retrying(
            lambda: api.publish(head.admin_subject, text.encode(), headers, api.timeout),
            host.append_timeout_s,
        )
    except JetStreamError as exc:
        if exc.err_code in WRONG_LAST_SEQUENCE:
            now = await read_entry(api, head)
            return now.seq if now is not None and now.write == write else None
        if is_storage_full(exc):
            raise StorageFullError(head.name, errno.ENOSPC,
                                   f"writing to JetStream: {exc.description}") from None
        raise


async def _pause(attempt: int) -> None:
    """The wait before attempt ``attempt + 1`` after a refusal (:data:`ATTEMPTS`)."""
    await asyncio.sleep(min(0.01 * 2**attempt, 0.5))


Decide = Callable[[StoredEntry | None], Awaitable[AdminEntry]]


async def _store(host: AdminHost, head: Head, decide: Decide) -> StoredEntry:
    """Read the stream's entry, ``decide`` the next one from it (or raise), store it
    conditionally; again from the read when another gateway's entry came first."""
    for attempt in range(ATTEMPTS):
        if attempt:
            await _pause(attempt - 1)
        current = await retrying(lambda: read_entry(host.api, head), host.append_timeout_s)
        if current is not None:
            host.learn(head.name, current)
        entry = await decide(current)
        seq = await _write(host, head, entry, current.seq if current is not None else 0)
        if seq is not None:
            stored = StoredEntry(seq, entry)
            host.learn(head.name, stored)
            await _trim(host.api, head, seq)
            return stored
    raise LogError(f"stream {head.name!r}: its administration kept changing under "
                   f"{ATTEMPTS} attempts")  # fmt: skip


async def _trim(api: Api, head: Head, seq: int) -> None:
    """Purge the stream's entries older than ``seq`` (only the last one means anything)."""
    try:
        await api.call(f"$JS.API.STREAM.PURGE.{head.jetstream}",
                       {"filter": head.admin_subject, "seq": seq})  # fmt: skip
    except Exception as exc:  # (harmless: an older entry left is one message more)
        log.warning("stream %r: older administration entries not purged: %r", head.name, exc)


async def create(host: AdminHost, stream: str, runtime: Runtime | None) -> None:
    """Create ``stream``, empty (with its runtime retention, if given); :class:`StreamExists`
    when it has a record or a live entry in the cluster."""
    head = host.catalog.head(stream)
    if head.exists:
        raise StreamExists(f"stream {stream!r} exists already")
    if await retrying(lambda: _last_record(host, head), host.append_timeout_s) is not None:
        raise StreamExists(f"stream {stream!r} exists already")

    async def decide(current: StoredEntry | None) -> AdminEntry:
        if current is not None and current.entry.live:
            raise StreamExists(f"stream {stream!r} exists already")
        return AdminEntry("create", runtime)

    await _store(host, head, decide)
    log.info("created stream %r in the cluster (%s)", stream, head.admin_subject)


async def set_retention(host: AdminHost, stream: str, runtime: Runtime) -> None:
    """Give ``stream`` this runtime retention; :class:`UnknownStream` when it has neither a
    record nor a live entry in the cluster."""
    head = host.catalog.head(stream)

    async def decide(current: StoredEntry | None) -> AdminEntry:
        if current is None or not current.entry.live:  # (then it exists by its records)
            last = await retrying(lambda: _last_record(host, head), host.append_timeout_s)
            if last is None:
                raise UnknownStream(stream)
        return AdminEntry("retention", runtime)

    await _store(host, head, decide)
    log.info("stream %r: runtime retention %r", stream, runtime)


async def delete(host: AdminHost, stream: str) -> None:
    """Delete ``stream`` (the module's docstring): this gateway's appends handed over first,
    then its tombstone stored, the records below it purged, and its live administration entry
    replaced. :class:`UnknownStream` when the cluster has no such stream."""
    head = host.catalog.head(stream)
    await host.settled(stream)
    current = await retrying(lambda: read_entry(host.api, head), host.append_timeout_s)
    if current is not None:
        host.learn(stream, current)
    live = current is not None and current.entry.live
    if await retrying(lambda: _last_record(host, head), host.append_timeout_s) is None and not live:
        raise UnknownStream(stream)
    seq = await _tombstone(host, head)
    host.tombstoned(stream, seq)
    purge = {"filter": head.subject, "seq": seq}  # (below the tombstone: every record)
    answer = await retrying(
        lambda: host.api.call(f"$JS.API.STREAM.PURGE.{head.jetstream}", purge),
        host.append_timeout_s,
    )
    async def deleted(_: StoredEntry | None) -> AdminEntry:
        return AdminEntry("delete")

    if live:
        await _store(host, head, deleted)
    log.info("deleted stream %r: %s records purged from %s, tombstone at %d", stream,
             answer.get("purged", "?"), head.jetstream, seq)  # fmt: skip


async def _tombstone(host: AdminHost, head: Head) -> int:
    """Store the stream's tombstone after the subject's last message (conditionally, as an
    append: again after another gateway's append came first); its sequence."""
    write = host.next_write()
    api = host.api
    for attempt in range(ATTEMPTS):
        if attempt:
            await _pause(attempt - 1)
        expected = head.last_seq
        headers = {DELETED: write, "Nats-Expected-Last-Subject-Sequence": str(expected)}

        def publish(headers: dict[str, str] = headers) -> Awaitable[int]:
            return api.publish(head.subject, b"", headers, api.timeout)

        try:
            return await retrying(publish, host.append_timeout_s)
        except JetStreamError as exc:
            if exc.err_code not in WRONG_LAST_SEQUENCE:
                if is_storage_full(exc):
                    raise StorageFullError(head.name, errno.ENOSPC,
                                           f"writing to JetStream: {exc.description}") from None
                raise
        try:  # refused: another gateway appended meanwhile (or our unacked attempt landed)
            last = await api.leader_get(head.jetstream, {"last_by_subj": head.subject})
        except Tombstone as tomb:
            if tomb.write == write:
                return tomb.seq
            host.tombstoned(head.name, tomb.seq)  # (deleted by another gateway: ours goes after)
            continue
        if last is not None:
            host.catalog.advance(head.name, RecordPoint.of(last))
    raise LogError(f"stream {head.name!r}: appends kept coming before its tombstone under "
                   f"{ATTEMPTS} attempts")  # fmt: skip
