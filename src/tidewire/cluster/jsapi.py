"""The few JetStream API calls the backend makes, on a nats-py connection, as plain data.

nats-py's JetStream manager covers stream creation and info, but not batched direct gets nor
the headers the backend reads, so every call here is a raw request on the ``$JS.API``
subjects (docs/cluster.md "Design"), its JSON answer checked once: an ``error`` becomes
:class:`JetStreamError` with JetStream's ``err_code``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import (
    ConnectionReconnectingError,
    NoRespondersError,
    OutboundBufferLimitError,
    StaleConnectionError,
)
from nats.errors import TimeoutError as NatsTimeout

from ..model import CorruptLogError, LogError, TidewireError
from .subjects import DELETED, IDS, SUM, WRITE, RecordSum, parse_ids

__all__ = [
    "TRANSIENT",
    "WRONG_LAST_SEQUENCE",
    "Api",
    "CorruptRecordError",
    "JetStreamError",
    "StoredRecord",
    "Tombstone",
    "is_storage_full",
    "retrying",
]

T = TypeVar("T")

WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
"""Another writer's publish came first (the expected last sequence is stale): 10071 says the
actual last sequence, 10164 (nats-server 2.12+, some paths) does not."""
STREAM_NAME_IN_USE = 10058  # exists with another configuration
NOT_FOUND = 10059
# Refusals for want of space: insufficient resources, storage limits (account, server, stream).
_FULL_CODES = frozenset({10023, 10047, 10027, 10028, 10054})


TRANSIENT = (
    NatsTimeout,
    NoRespondersError,
    ConnectionReconnectingError,
    StaleConnectionError,
    OutboundBufferLimitError,
    asyncio.TimeoutError,
)
"""No answer (yet): a request that timed out, no responder while a leader is elected, a
connection being re-established."""


NO_PEERS = 10005
"""JetStream's ``err_code`` for "no suitable peers for placement" (too few servers online)."""


class JetStreamError(LogError):
    """A JetStream API call answered with an error: ``code`` (HTTP-like) and ``err_code``."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(f"JetStream error {err_code} ({code}): {description}")
        self.code = code
        self.err_code = err_code
        self.description = description


async def retrying(work: Callable[[], Awaitable[T]], seconds: float,
                   also: frozenset[int] = frozenset()) -> T:  # fmt: skip
    """``work()``, tried again with backoff while it gets no answer or JetStream says it is
    unavailable (a cluster starting, a stream electing its leader) or has too few peers online
    for a stream's replicas yet (a cluster whose servers are still meeting, a peer restarting:
    error 10005, which stays an error after ``seconds`` when the cluster is too small), or
    answers one of the error codes ``also`` (what the caller knows to be passing), for up to
    ``seconds``."""
    deadline = time.monotonic() + seconds
    delay = 0.05
    while True:
        try:
            return await work()
        except JetStreamError as exc:
            transient = exc.code == 503 or exc.err_code == NO_PEERS or exc.err_code in also
            if not transient or time.monotonic() + delay > deadline:
                raise
        except TRANSIENT:
            if time.monotonic() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


def is_storage_full(exc: JetStreamError) -> bool:
    """Whether JetStream refused for want of space (the backend's ``StorageFullError``)."""
    text = exc.description.lower()
    if exc.err_code in _FULL_CODES or "insufficient" in text:
        return True
    return "storage" in text and ("limit" in text or "exceeded" in text)


class CorruptRecordError(CorruptLogError):
    """A stored message that is not a sound tidewire record: headers missing or unreadable,
    or a record that does not decode or check (CRC, ids disagreeing with the headers)."""

    def __init__(self, jetstream: str, subject: str, seq: int, reason: str) -> None:
        super().__init__(f"JetStream {jetstream} subject {subject}", seq, reason)
        self.seq = seq

    def __str__(self) -> str:
        return f"corrupt record in {self.path}, message {self.seq}: {self.reason}"


class Tombstone(TidewireError):  # (a signal, caught in the package: a message not a record)
    """The message found is a deleted stream's tombstone (``Tw-Deleted``, :mod:`.subjects`),
    at ``seq``, written by ``write``: the stream has no record at or before it."""

    def __init__(self, seq: int, write: str) -> None:
        super().__init__(f"tombstone at {seq} ({write})")
        self.seq = seq
        self.write = write


def _record(jetstream: str, headers: Mapping[str, str], data: bytes = b"") -> StoredRecord:
    """The record of a message; :class:`Tombstone` for a tombstone,
    :class:`CorruptRecordError` for anything else that is not a record."""
    try:
        return StoredRecord.from_headers(headers, data)
    except (KeyError, ValueError) as exc:
        seq = headers.get("Nats-Sequence", "0")
        subject = headers.get("Nats-Subject", "?")
        reason = f"not a tidewire record's headers ({exc!r})"
        raise CorruptRecordError(jetstream, subject, int(seq) if seq.isdigit() else 0,
                                 reason) from None  # fmt: skip


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A message as the backend stored it: its JetStream sequence and its tidewire headers, and
    (from a direct get) its payload, the record's bytes."""

    seq: int
    first_id: int
    last_id: int
    sum: RecordSum
    write: str
    data: bytes = b""

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], data: bytes = b"") -> StoredRecord:
        """Parse the headers (``ValueError``/``KeyError`` when they are not the backend's;
        :class:`Tombstone` for a tombstone's)."""
        if DELETED in headers:
            raise Tombstone(int(headers["Nats-Sequence"]), headers[DELETED])
        first, last = parse_ids(headers[IDS])
        return cls(int(headers["Nats-Sequence"]), first, last, RecordSum.parse(headers[SUM]),
                   headers.get(WRITE, ""), data)  # fmt: skip


def _status(msg: Msg) -> str | None:
    return msg.headers.get("Status") if msg.headers else None


class Api:
    """Requests on one connection; ``timeout`` bounds each request (seconds)."""

    def __init__(self, nc: Client, timeout: float = 5.0) -> None:
        self.nc = nc
        self.timeout = timeout

    async def call(
        self, subject: str, body: Mapping[str, Any] | None = None, wait: float | None = None
    ) -> dict[str, Any]:
        """One ``$JS.API`` request (``wait`` seconds for the answer, default ``timeout``); its
        answer, or :class:`JetStreamError`."""
        payload = json.dumps(body).encode() if body is not None else b""
        msg = await self.nc.request(subject, payload, timeout=wait or self.timeout)
        answer: dict[str, Any] = json.loads(msg.data)
        error = answer.get("error")
        if error:
            raise JetStreamError(int(error.get("code", 0)), int(error.get("err_code", 0)),
                                 str(error.get("description", "")))  # fmt: skip
        return answer

    async def publish(
        self, subject: str, payload: bytes, headers: dict[str, str], wait: float
    ) -> int:
        """Publish and wait for the ack (``wait`` seconds): the stored message's sequence. Raises
        :class:`JetStreamError` for a refusal, nats-py's ``TimeoutError``/``NoRespondersError``
        when no ack came (the message may still have been stored)."""
        msg = await self.nc.request(subject, payload, timeout=wait, headers=headers)
        answer = json.loads(msg.data)
        error = answer.get("error")
        if error:
            raise JetStreamError(int(error.get("code", 0)), int(error.get("err_code", 0)),
                                 str(error.get("description", "")))  # fmt: skip
        return int(answer["seq"])

    async def direct_get(self, stream: str, body: Mapping[str, Any]) -> StoredRecord | None:
        """One direct get (``last_by_subj``, or ``seq`` + ``next_by_subj``); ``None`` when no
        message matches. A tombstone found by ``next_by_subj`` is skipped (the next record
        after it is asked for); found by ``last_by_subj``, it is raised (:class:`Tombstone`)."""
        while True:
            payload = json.dumps(body).encode()
            msg = await self.nc.request(f"$JS.API.DIRECT.GET.{stream}", payload,
                                        timeout=self.timeout)  # fmt: skip
            status = _status(msg)
            if status == "404":
                return None
            if status is not None or not msg.headers:
                raise JetStreamError(int(status or 0), 0, f"direct get {body}: status {status}")
            try:
                return _record(stream, msg.headers, msg.data)
            except Tombstone as tomb:
                if "next_by_subj" not in body:
                    raise
                body = {**body, "seq": tomb.seq + 1}

    async def leader_message(self, stream: str, body: Mapping[str, Any]
                             ) -> tuple[dict[str, str], bytes] | None:  # fmt: skip
        """A message get answered by the stream's leader (never a lagging replica, unlike a
        direct get): the message's headers (``Nats-Sequence`` and ``Nats-Subject`` included)
        and data; ``None`` when no message matches."""
        try:
            answer = await self.call(f"$JS.API.STREAM.MSG.GET.{stream}", body)
        except JetStreamError as exc:
            if exc.code == 404:
                return None
            raise
        message = answer["message"]
        headers = parse_header_block(base64.b64decode(message.get("hdrs", "")))
        headers["Nats-Sequence"] = str(message["seq"])
        headers.setdefault("Nats-Subject", str(message.get("subject", "?")))
        return headers, base64.b64decode(message.get("data", ""))

    async def leader_get(self, stream: str, body: Mapping[str, Any]) -> StoredRecord | None:
        """:meth:`leader_message`'s record: used where a stale answer could store a record
        twice. ``None`` when no message matches. Tombstones as in :meth:`direct_get`."""
        while True:
            got = await self.leader_message(stream, body)
            if got is None:
                return None
            try:
                return _record(stream, *got)
            except Tombstone as tomb:
                if "next_by_subj" not in body:
                    raise
                body = {**body, "seq": tomb.seq + 1}

    async def direct_batch(
        self, stream: str, subject: str, seq: int, batch: int, max_bytes: int
    ) -> list[StoredRecord]:
        """Up to ``batch`` records of ``subject`` from ``seq`` on (about ``max_bytes``, at
        least one), in one batched direct get (:meth:`direct_messages`); tombstones left
        out."""
        out: list[StoredRecord] = []
        for msg in await self.direct_messages(stream, subject, seq, batch, max_bytes):
            try:
                out.append(_record(stream, msg.headers or {}, msg.data))
            except Tombstone:
                continue  # (a deleted stream's mark: no record, and nothing before it)
        return out

    async def direct_messages(
        self, stream: str, subject: str, seq: int, batch: int, max_bytes: int
    ) -> list[Msg]:
        """Up to ``batch`` messages of ``subject`` from ``seq`` on (about ``max_bytes``, at
        least one), in one batched direct get: answered message by message on an inbox and
        closed by a ``Status: 204`` (end of batch) or ``404`` (none). Each has its headers
        (``Nats-Sequence`` among them)."""
        inbox = self.nc.new_inbox()
        got: asyncio.Queue[Msg] = asyncio.Queue()
        sub = await self.nc.subscribe(inbox, cb=got.put)
        out: list[Msg] = []
        try:
            body = {"seq": seq, "next_by_subj": subject, "batch": batch, "max_bytes": max_bytes}
            await self.nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(body).encode(),
                                  reply=inbox)  # fmt: skip
            while True:
                msg = await asyncio.wait_for(got.get(), self.timeout)
                status = _status(msg)
                if status in ("204", "404"):
                    return out
                if status is not None or not msg.headers:
                    raise JetStreamError(int(status or 0), 0, f"direct get batch: {status}")
                out.append(msg)
        finally:
            await sub.unsubscribe()


def parse_header_block(raw: bytes) -> dict[str, str]:
    """The headers of a ``NATS/1.0`` header block (as the non-direct message get returns it,
    base64-decoded)."""
    lines = raw.decode("utf-8", "replace").split("\r\n")
    out: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out
