"""Staged transaction parts in cluster mode (docs/cluster.md "Staged parts").

Gateways keep no state, and a Spark task's part and the driver's commit may reach different
gateways, so the parts live in the cluster: one JetStream stream, ``TW_STAGE`` (subjects
``twstage.>``, file storage, the shard streams' replicas, ``max_age`` =
``txn.staging_ttl_ms``: parts nobody committed or aborted expire there, with no sweep of
ours). A part is the subject ``twstage.<key digest>.<part token>`` (the digest is the
embedded staging directory's name, :func:`~tidewire.hub.staging.key_digest`; the token is
the part's name as a subject token): one message per staged record, its bytes as the offer
sent them, with a header ``Tw-Part-Seq`` (0, 1, ...) that the commit checks, so a part whose
messages are missing or out of order is never taken for the one named; a publish is retried
through a failover (``append_timeout_s``) under its ``Nats-Msg-Id`` (``<part nonce>:<seq>``),
so JetStream stores it once, and a repeat the commit finds is skipped.

A part's first write purges its subject (a part of the same name staged before is replaced,
as the file is) and then publishes the offer's records with their acks awaited, a window at
a time; the fingerprint is the CRC-32C of the records, as for a file. A failed part's
subject is purged in the background (and expires anyway).

A commit (:meth:`JetStreamStaging.content`) reads each named part in order (batched direct
gets; a part that does not match its name is read again from the stream's leader, since a
replica may lag) to check it and fingerprint the content, then appends by reading the parts
again into one atomic batch (:mod:`.jsatomic`): readers see all of the transaction or none of
it, and a gateway that dies half-way leaves nothing. Commit and abort purge the key's
subjects.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any, Protocol

from crc32c import crc32c
from nats.errors import Error as NatsError

from ..hub.fingerprint import Fingerprint
from ..hub.staging import (
    STAGING_TTL_MS,
    Content,
    NamedPart,
    StagedInfo,
    TxnPartMissing,
    check_record,
    key_digest,
    records_of,
)
from ..model import Batch, LogError
from .jsapi import STREAM_NAME_IN_USE, Api, JetStreamError, retrying
from .jsatomic import Source
from .shards import MAX_MSG_SIZE
from .subjects import token

__all__ = ["PART_SEQ", "STAGE_STREAM", "JetStreamPart", "JetStreamStaging"]

log = logging.getLogger(__name__)

STAGE_STREAM = "TW_STAGE"
STAGE_PREFIX = "twstage"
PART_SEQ = "Tw-Part-Seq"
READ_BATCH = 64
READ_BYTES = 16 * 1024 * 1024


class StagingHost(Protocol):
    """What staging needs from the storage (:class:`~.jetstream.JetStreamStorage`)."""

    api: Api
    replicas: int
    startup_s: float
    append_timeout_s: float

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    async def append_atomic(self, stream: str, first_id: int, count: int,
                            source: Source) -> tuple[int, int]: ...  # fmt: skip


class JetStreamStaging:
    """The staging area of one gateway (every gateway's is the same stream)."""

    def __init__(self, host: StagingHost) -> None:
        self.host = host
        self.ttl_ms = STAGING_TTL_MS
        self._made_ttl: int | None = None  # the max_age the stream has, as made here
        self._making = asyncio.Lock()
        self._bytes = 0

    def config(self) -> dict[str, Any]:
        """The JetStream configuration of ``TW_STAGE``."""
        return {"name": STAGE_STREAM, "subjects": [f"{STAGE_PREFIX}.>"], "retention": "limits",
                "storage": "file", "num_replicas": self.host.replicas, "allow_direct": True,
                "max_msg_size": MAX_MSG_SIZE, "discard": "old",
                "max_age": self.ttl_ms * 1_000_000}  # fmt: skip

    async def ensure(self) -> None:
        """Make ``TW_STAGE`` (or bring its ``max_age`` to :attr:`ttl_ms`), once."""
        if self._made_ttl == self.ttl_ms:
            return
        async with self._making:
            if self._made_ttl == self.ttl_ms:
                return
            api, config = self.host.api, self.config()
            try:
                await retrying(lambda: api.call(f"$JS.API.STREAM.CREATE.{STAGE_STREAM}", config),
                               self.host.startup_s)  # fmt: skip
            except JetStreamError as exc:
                if exc.err_code != STREAM_NAME_IN_USE:
                    raise
                await retrying(lambda: api.call(f"$JS.API.STREAM.UPDATE.{STAGE_STREAM}", config),
                               self.host.startup_s)  # fmt: skip
            self._made_ttl = config["max_age"] // 1_000_000

    def subject(self, principal: str | None, stream: str, txn: str, part: str = "") -> str:
        """A part's subject (``part`` empty: every part of the key, ``...>``)."""
        return f"{STAGE_PREFIX}.{key_digest(principal, stream, txn)}.{token(part) if part else '>'}"

    def writer(self, principal: str | None, stream: str, txn: str, part: str) -> JetStreamPart:
        return JetStreamPart(self, self.subject(principal, stream, txn, part), part)

    async def purge(self, subject: str) -> int:
        """Purge ``subject``'s messages; how many there were."""
        await self.ensure()
        answer = await retrying(
            lambda: self.host.api.call(f"$JS.API.STREAM.PURGE.{STAGE_STREAM}",
                                       {"filter": subject}),
            self.host.append_timeout_s)  # fmt: skip
        return int(answer.get("purged", 0))

    async def drop(self, principal: str | None, stream: str, txn: str) -> bool:
        return await self.purge(self.subject(principal, stream, txn)) > 0

    def sweep(self, now_ms: int, keep: Sequence[tuple[str | None, str, str]] = ()) -> int:
        """Nothing to do: ``max_age`` expires old parts; the staged bytes are asked again."""
        if self._made_ttl is not None:
            self.host.spawn(self.refresh())
        return 0

    async def refresh(self) -> None:
        """Ask the stream's size (for :meth:`staged_bytes`)."""
        info = await self.host.api.call(f"$JS.API.STREAM.INFO.{STAGE_STREAM}")
        self._bytes = int(info.get("state", {}).get("bytes", 0))

    def staged_bytes(self) -> int:
        """``TW_STAGE``'s bytes, as last asked (after each retention pass)."""
        return self._bytes

    # ------------------------------------------------------------------ commits

    async def content(self, principal: str | None, stream: str, txn: str,
                      parts: Sequence[NamedPart]) -> Content:  # fmt: skip
        """The named parts, checked and fingerprinted by a first read; appended by a second
        into one atomic batch."""
        await self.ensure()
        subjects = [self.subject(principal, stream, txn, p.part) for p in parts]
        leader: set[int] = set()  # parts read from the leader (a replica lacked messages)
        while True:
            acc, nbytes, wrong = Fingerprint(), 0, None
            for i, named in enumerate(parts):
                count = fp = 0
                async for data in self._messages(subjects[i], i in leader):
                    fp = crc32c(data, fp)
                    nbytes += len(data)
                    for batch in records_of(stream, memoryview(data), verify=False):
                        acc.add(batch)
                        count += len(batch)
                if (count, fp) != (named.count, named.fp):
                    wrong = (i, count, fp)
                    break
            if wrong is None:
                break
            i, count, fp = wrong
            if i in leader:
                raise TxnPartMissing.of(parts[i], txn, stream, (count, fp) if count else None)
            leader.add(i)

        async def source() -> AsyncIterator[Batch]:
            for i, subject in enumerate(subjects):
                async for data in self._messages(subject, i in leader):
                    for batch in records_of(stream, memoryview(data), verify=False):
                        yield batch

        async def append(first: int) -> tuple[int, int]:
            return await self.host.append_atomic(stream, first, acc.count, source)

        return Content(acc.count, acc.value(), append, nbytes)

    async def _messages(self, subject: str, leader: bool) -> AsyncIterator[bytes]:
        """The part's messages' bytes in order, while their ``Tw-Part-Seq`` runs 0, 1, ...
        (one seen again is skipped; a gap ends them early: the part then does not match its
        name). Each read is retried through a failover (``append_timeout_s``)."""
        api, seq, expected = self.host.api, 1, 0

        async def fetch() -> list[tuple[dict[str, str], bytes]]:
            if leader:
                got = await api.leader_message(STAGE_STREAM, {"seq": seq,
                                                              "next_by_subj": subject})
                return [] if got is None else [got]
            msgs = await api.direct_messages(STAGE_STREAM, subject, seq, READ_BATCH, READ_BYTES)
            return [(dict(m.headers or {}), m.data) for m in msgs]

        while found := await retrying(fetch, self.host.append_timeout_s):
            for headers, data in found:
                n = int(headers.get(PART_SEQ, "-1"))
                if n > expected or n < 0:
                    return
                if n == expected:
                    expected += 1
                    yield data
            seq = int(found[-1][0]["Nats-Sequence"]) + 1


class JetStreamPart:
    """One part being received, into ``subject`` of ``TW_STAGE`` (see the module)."""

    def __init__(self, staging: JetStreamStaging, subject: str, part: str) -> None:
        self.staging = staging
        self.subject = subject
        self.part = part
        self.count = self.records = self.nbytes = self.fp = 0
        self._started = False
        self._nonce = uuid.uuid4().hex  # (Nats-Msg-Id: a publish tried again is stored once)

    async def _start(self) -> None:
        if not self._started:
            await self.staging.purge(self.subject)  # (a part of that name staged before)
            self._started = True

    async def write(self, elements: Sequence[bytes]) -> None:
        """Check each element (one log record), publish them all, and wait for every ack."""
        counts = [check_record(e) for e in elements]
        host = self.staging.host

        async def publish(data: bytes, n: int) -> int:
            headers = {PART_SEQ: str(n), "Nats-Msg-Id": f"{self._nonce}:{n}"}
            return await retrying(  # (through a failover: a duplicate is dropped by its id)
                lambda: host.api.publish(self.subject, data, headers, wait=host.api.timeout),
                host.append_timeout_s)  # fmt: skip

        try:
            await self._start()
            await asyncio.gather(*(publish(bytes(e), self.records + i)
                                   for i, e in enumerate(elements)))  # fmt: skip
        except (NatsError, TimeoutError) as exc:
            raise LogError(f"part {self.part!r}: no ack from JetStream in "
                           f"{host.append_timeout_s:g} s: {exc!r}") from None
        for element, count in zip(elements, counts, strict=True):
            self.fp = crc32c(element, self.fp)
            self.count += count
            self.nbytes += len(element)
            self.records += 1

    async def close(self) -> StagedInfo:
        await self._start()  # (an empty part replaces one of its name too)
        return StagedInfo(self.part, self.count, self.nbytes, self.fp, self.records)

    def discard(self) -> None:
        if self._started:
            self.staging.host.spawn(self.staging.purge(self.subject))

