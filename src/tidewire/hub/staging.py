"""Staged transaction parts: rows written by many writers, read by nobody until a commit.

The exactly-once Spark sink (docs/spark.md "Sink") has every executor task send its rows to
the hub itself, as a *part* of the micro-batch's transaction, and the driver commit the parts
that won (``Transactions.commit_staged`` in :mod:`.txn`). Delta's "add file, then name it in
the log" is the model: a part is a file nobody reads; the commit names it.

Where parts are kept is the storage's :class:`StagingArea`: :class:`Staging` below (files in
the embedded log's data directory), or ``tidewire.cluster.staging`` (a JetStream stream, in
cluster mode). The server writes a part through a :class:`PartSink` and commits with
:meth:`StagingArea.content`, the parts as a :class:`Content` for the transaction's ledger.

On disk (the embedded log's data directory; nothing here is held in memory)::

    <data_dir>/.txn-staging/<key hash>/<part>.log     a finished part
    <data_dir>/.txn-staging/<key hash>/<part>.<n>.tmp a part being received

``<key hash>`` is the first 32 hex digits of SHA-256 over ``principal NUL stream NUL txn``:
one directory per transaction key (:data:`~.txn.TxnKey`), so two principals' parts of the
same transaction id never meet. A part file is the offer's ``format=records`` elements back
to back, byte for byte (log records, docs/log.md "Record batch", whose ids are placeholders:
the commit gives the ids). Each element is checked (header and body CRC-32C) as it arrives.
At the offer's end the file is renamed to ``<part>.log``, **not fsynced** (**decision**): a
part is needed only until its commit, which appends its rows to the log durably; an
acknowledged part survives the hub's crash (the page cache keeps it), and one the machine's
crash tore or lost is found by the commit (a missing file, or a count or fingerprint that does
not match) and fails it with "not staged", so Spark replays the micro-batch and the tasks stage
again: exactly once either way, one fsync of every row fewer on each micro-batch's path (about
7 ms per 13 MB on this project's disk). A part's **fingerprint** is the CRC-32C of its file
(what its writer sent, so the writer computes it too without asking the hub): the commit
checks every named part's event count and fingerprint, so a part written by another attempt
under the same name, or half-written, is never taken for the one the driver names.

Garbage: a commit drops its key's directory once its ``done`` is recorded (parts the driver
did not name included: failed or speculative attempts); ``abort`` drops it; :meth:`Staging.sweep`
drops directories untouched for longer than a TTL (the hub calls it after each retention
pass) and ``*.tmp`` files left by a crash when the hub opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import mmap
import os
import shutil
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from crc32c import crc32c

from ..model import Batch, TidewireError
from ..record import HEADER_SIZE, HeaderError, decode_body, merge, parse_header
from .fingerprint import Fingerprint, fingerprint

if TYPE_CHECKING:
    from .storage import Storage

__all__ = [
    "STAGING_DIR", "STAGING_TTL_MS", "Content", "NamedPart", "PartSink", "PartWriter",
    "StagedInfo", "Staging", "StagingArea", "TxnPartMissing", "key_digest", "records_of",
]

STAGING_TTL_MS = 24 * 3600 * 1000
"""Staged parts untouched this long are dropped (a day; setting ``txn.staging_ttl_ms``)."""

log = logging.getLogger("tidewire.hub")

STAGING_DIR = ".txn-staging"
"""The staging directory's name in the data directory (the log skips names starting with
``.``)."""

_tmp_numbers = itertools.count(1)


class TxnPartMissing(TidewireError):
    """A part named by a commit is not staged (or holds other rows than named): the writer
    must stage it again (Spark replays the micro-batch)."""

    @classmethod
    def of(cls, named: NamedPart, txn: str, stream: str,
           found: tuple[int, int] | None) -> TxnPartMissing:  # fmt: skip
        """The error for ``named``: not staged (``found`` None), or found holding
        ``(count, fp)`` instead (every staging area says it the same way)."""
        where = f"part {named.part!r} of transaction {txn!r} into {stream!r}"
        if found is None:
            return cls(f"{where} is not staged (stage it again)")
        return cls(f"{where} holds {found[0]} event(s) of fingerprint {found[1]}, not the "
                   f"{named.count} of {named.fp} named")  # fmt: skip


class NamedPart(Protocol):
    """A part as a commit names it (``tidewire.protocols.rsio.staged.StagedPart``): its name,
    event count and fingerprint (the CRC-32C of its bytes)."""

    @property
    def part(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def fp(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Content:
    """What a commit stores: ``count`` events of fingerprint ``fp`` (about ``nbytes``), and
    how to append them as ids ``first``.. (returning the ids stored): one batch
    (:meth:`~.txn.Transactions.commit`), or staged parts that are never in memory at once
    (:meth:`StagingArea.content`)."""

    count: int
    fp: int
    append: Callable[[int], Awaitable[tuple[int, int]]]
    nbytes: int = 0


class PartSink(Protocol):
    """One part being received (a ``stage=`` offer): :meth:`write` its elements as they
    come (each one log record, checked: :class:`ValueError`), then :meth:`close`, or
    :meth:`discard` (the offer failed; never raises)."""

    async def write(self, elements: Sequence[bytes]) -> None: ...
    async def close(self) -> StagedInfo: ...
    def discard(self) -> None: ...


class StagingArea(Protocol):
    """Where a hub keeps staged parts: files in the embedded log's data directory
    (:class:`Staging`), or a JetStream stream in cluster mode
    (``tidewire.cluster.staging``). ``ttl_ms``: parts untouched this long are dropped."""

    ttl_ms: int

    def writer(self, principal: str | None, stream: str, txn: str, part: str) -> PartSink:
        """A new part of that transaction key (replacing one of the same name)."""
        ...

    async def content(self, principal: str | None, stream: str, txn: str,
                      parts: Sequence[NamedPart]) -> Content:  # fmt: skip
        """The named parts, in order, as a commit's :class:`Content` (each part checked
        against its count and fingerprint first: :class:`TxnPartMissing`)."""
        ...

    async def drop(self, principal: str | None, stream: str, txn: str) -> bool:
        """Forget every part of that key (committed, aborted); whether there were any."""
        ...

    def sweep(self, now_ms: int, keep: Sequence[tuple[str | None, str, str]]) -> int:
        """Drop parts untouched for :attr:`ttl_ms` (except those of the keys ``keep``:
        commits running); how many keys' (0 where the store expires them itself)."""
        ...

    def staged_bytes(self) -> int:
        """Bytes of staged parts (for the stats; as last known)."""
        ...


def key_digest(principal: str | None, stream: str, txn: str) -> str:
    """The name of a transaction key's parts (32 hex digits of SHA-256)."""
    return hashlib.sha256(f"{principal}\0{stream}\0{txn}".encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class StagedInfo:
    """A part as staged: ``count`` events in ``records`` log records, ``nbytes`` bytes,
    fingerprint ``fp``."""

    part: str
    count: int
    nbytes: int
    fp: int
    records: int


def check_record(element: bytes | bytearray | memoryview) -> int:
    """The number of events in ``element``, which must be exactly one valid log record
    (:class:`ValueError` otherwise)."""
    view = memoryview(element).cast("B")
    if len(view) < HEADER_SIZE:
        raise ValueError(f"a staged element of {len(view)} bytes is not a log record")
    try:
        header = parse_header(view)
    except HeaderError as exc:
        raise ValueError(f"a staged element is not a log record: {exc}") from None
    if header.length != len(view):
        raise ValueError(f"a staged element holds {len(view)} bytes, its record {header.length}")
    decode_body("-", header, view, 0)  # (checks the body CRC and layout)
    return header.count


class PartWriter:
    """One part being received: :meth:`add` each element (checked, written through to the
    file: the page cache holds it, not this object), then :meth:`finish` (under its final
    name; not fsynced: see the module) or :meth:`discard`. Blocking file calls: small writes
    on the event loop's thread; ``finish`` belongs in a worker thread."""

    def __init__(self, directory: str, part: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.part = part
        self.tmp = os.path.join(directory, f"{part}.{os.getpid()}-{next(_tmp_numbers)}.tmp")
        self.fd: int | None = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.count = self.records = self.nbytes = self.fp = 0

    def add(self, element: bytes | bytearray | memoryview) -> None:
        """Check ``element`` (one log record) and append it to the part."""
        count = check_record(element)
        assert self.fd is not None, "the part is finished"
        view = memoryview(element).cast("B")
        while view:
            view = view[os.write(self.fd, view) :]
        self.fp = crc32c(element, self.fp)
        self.count += count
        self.records += 1
        self.nbytes += len(element)

    async def write(self, elements: Sequence[bytes]) -> None:
        """:meth:`add` each (small writes on the event loop's thread: the page cache's)."""
        for element in elements:
            self.add(element)

    async def close(self) -> StagedInfo:
        """:meth:`finish`, in a worker thread."""
        return await asyncio.to_thread(self.finish)

    def finish(self) -> StagedInfo:
        """Put the part under its final name (not fsynced: the module says why) and describe
        it."""
        assert self.fd is not None, "the part is finished"
        os.close(self.fd)
        self.fd = None
        os.replace(self.tmp, os.path.join(self.directory, f"{self.part}.log"))
        return StagedInfo(self.part, self.count, self.nbytes, self.fp, self.records)

    def discard(self) -> None:
        """Drop what was received (the offer failed)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


class Staging:
    """The staging area under ``root`` (``<data_dir>/.txn-staging``), committed into
    ``storage`` (the embedded log's: a transaction bigger than one append is a bulk append)."""

    def __init__(self, root: str, storage: Storage | None = None) -> None:
        self.root = root
        self.storage = storage
        self.ttl_ms = STAGING_TTL_MS

    def directory(self, principal: str | None, stream: str, txn: str) -> str:
        """Where the parts of that transaction key are."""
        return os.path.join(self.root, key_digest(principal, stream, txn))

    def writer(self, principal: str | None, stream: str, txn: str, part: str) -> PartWriter:
        return PartWriter(self.directory(principal, stream, txn), part)

    def size(self, principal: str | None, stream: str, txn: str,
             parts: Sequence[NamedPart]) -> int:  # fmt: skip
        """The bytes of the named parts' files (a missing one counts 0: :meth:`load` says)."""
        directory, total = self.directory(principal, stream, txn), 0
        for named in parts:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(directory, f"{named.part}.log")).st_size
        return total

    def load(self, principal: str | None, stream: str, txn: str,
             parts: Sequence[NamedPart], *, mapped: bool = False) -> Iterator[Batch]:  # fmt: skip
        """The batches of the named ``parts``, in order, each part checked against its count
        and fingerprint first (:class:`TxnPartMissing`). Blocking: call it in a thread. Each
        part's file is read whole (one part: one task's rows for one stream), or with
        ``mapped`` mapped (the page cache's pages, not a copy: a bulk commit's)."""
        directory = self.directory(principal, stream, txn)
        for named in parts:
            path = os.path.join(directory, f"{named.part}.log")
            try:
                with open(path, "rb") as f:
                    if mapped and os.fstat(f.fileno()).st_size:
                        data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
                    else:
                        data = memoryview(f.read())
            except FileNotFoundError:
                raise TxnPartMissing.of(named, txn, stream, None) from None
            # The fingerprint first: it covers the whole file, each record of which was
            # checked (header and body CRC) as it arrived, so a file that matches is what the
            # writer sent and its records are decoded without a second body CRC pass.
            fp = crc32c(data)
            batches = list(records_of(stream, data, verify=fp != named.fp))
            count = sum(len(b) for b in batches)
            if (count, fp) != (named.count, named.fp):
                raise TxnPartMissing.of(named, txn, stream, (count, fp))
            yield from batches

    async def content(self, principal: str | None, stream: str, txn: str,
                      parts: Sequence[NamedPart]) -> Content:  # fmt: skip
        """The named parts as one batch (read whole, in a worker thread), or, bigger than one
        append takes, as a bulk append (log/bulk.py) never all in memory."""
        from .storage import BulkAppends  # (storage.py imports this module's names)

        storage = self.storage
        assert storage is not None, "a staging area without a storage commits nothing"
        nbytes = self.size(principal, stream, txn, parts)
        limit = storage.bulk_from_bytes if isinstance(storage, BulkAppends) else None
        if limit is None or nbytes <= limit:
            batches = await asyncio.to_thread(
                lambda: list(self.load(principal, stream, txn, parts)))
            batch = merge([(b, None) for b in batches]) if len(batches) > 1 else batches[0]

            async def append_batch(first: int) -> tuple[int, int]:
                stored = await storage.append(batch.with_ids(first))
                return stored.first_id, stored.last_id

            return Content(len(batch), fingerprint(batch), append_batch, batch.nbytes)
        assert isinstance(storage, BulkAppends)

        def source() -> Iterator[Batch]:  # (the page cache's pages, mapped: not a copy)
            return self.load(principal, stream, txn, parts, mapped=True)

        def fingerprinted() -> Fingerprint:  # a first pass, which checks each part too
            acc = Fingerprint()
            for b in source():
                acc.add(b)
            return acc

        acc = await asyncio.to_thread(fingerprinted)

        async def append_bulk(first: int) -> tuple[int, int]:  # (the parts read again)
            return await storage.append_bulk(stream, first, acc.count, nbytes, source)

        return Content(acc.count, acc.value(), append_bulk, nbytes)

    async def drop(self, principal: str | None, stream: str, txn: str) -> bool:
        """Forget every part of that key (committed, aborted); whether there were any."""
        return await asyncio.to_thread(self._remove, self.directory(principal, stream, txn))

    @staticmethod
    def _remove(directory: str) -> bool:
        existed = os.path.isdir(directory)
        shutil.rmtree(directory, ignore_errors=True)
        return existed

    def sweep(self, now_ms: int, keep: Sequence[tuple[str | None, str, str]] = ()) -> int:
        """Drop the key directories whose newest file is older than :attr:`ttl_ms` at
        ``now_ms`` (wall clock ms), except those of the keys ``keep`` (commits running); how
        many."""
        dropped, ttl_ms = 0, self.ttl_ms
        kept = {self.directory(*key) for key in keep}
        for name, path in self._directories():
            if path in kept:
                continue
            try:
                newest = max((e.stat().st_mtime for e in os.scandir(path)),
                             default=os.stat(path).st_mtime)  # fmt: skip
            except FileNotFoundError:
                continue
            if newest * 1000 < now_ms - ttl_ms:
                log.info("dropping staged transaction parts %s, untouched for %d ms", name,
                         now_ms - newest * 1000)  # fmt: skip
                shutil.rmtree(path, ignore_errors=True)
                dropped += 1
        return dropped

    def remove_partial(self) -> int:
        """Remove the ``*.tmp`` files a crash left (at open: no offer is receiving); how many."""
        removed = 0
        for _, path in self._directories():
            for entry in os.scandir(path):
                if entry.name.endswith(".tmp"):
                    os.unlink(entry.path)
                    removed += 1
        return removed

    def staged_bytes(self) -> int:
        """Bytes of every staged file (for the stats)."""
        total = 0
        for _, path in self._directories():
            total += sum(e.stat().st_size for e in os.scandir(path))
        return total

    def _directories(self) -> Iterator[tuple[str, str]]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.is_dir():
                yield entry.name, entry.path


def records_of(stream: str, data: memoryview, *, verify: bool = True) -> Iterator[Batch]:
    """The batches of the log records back to back in ``data`` (:class:`TxnPartMissing`
    when one is damaged)."""
    pos = 0
    while pos < len(data):
        try:
            header = parse_header(data, pos)
            batch = decode_body(stream, header, data, pos, verify=verify)
        except (HeaderError, ValueError) as exc:
            raise TxnPartMissing(f"a staged part of {stream!r} is damaged: {exc}") from None
        yield batch
        pos += header.length
