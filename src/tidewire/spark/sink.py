"""The exactly-once sink's staged writes (docs/spark.md "Sink").

Spark's Python writer runs ``write()`` once per task on the executors and gives the driver's
``commit(messages, batchId)`` one commit message per partition, from the attempt that won; on
a failure it calls ``abort`` and later replays the micro-batch with the same query and batch
ids. Delta's "write files nobody reads, then name them in the log" is the model:

* ``write()`` (:func:`stage_task`) turns each Arrow batch into log records and sends them,
  per target stream, straight to that stream's hub as part ``<partitionId>.<taskAttemptId>``
  of the transaction ``<prefix>:<stream>`` (``stream?format=records&txn=..&stage=..``);
  the hub writes them to a staging file nobody reads. The commit message holds only the parts'
  names, event counts and fingerprints: no row reaches the driver.
* ``commit()`` (:func:`commit_parts`) names, per stream, the parts of the winning attempts in
  partition order (``stream?txn=..&commit``); the hub appends them exactly once under the
  transaction's ledger (``tidewire.hub.txn``): a replay adds nothing, and a part a hub lost
  fails the commit, so Spark replays and the tasks stage again.
* ``abort()`` (:func:`abort_parts`) drops what the tasks staged; parts of failed or
  speculative attempts are dropped by the commit, and the hub's TTL sweep drops the rest.

The prefix is ``spark:<query id>:<batch id>`` for a streaming query (the ids Spark replays
with; an executor reads them from the task's local properties) and ``spark-write:<uuid>`` for
a batch write.

Cluster mode (the option ``gateways``): every gateway serves every stream and the parts live
in the cluster (JetStream's ``TW_STAGE``, docs/cluster.md "Staged parts"), so a task stages at
the gateway its partition is dealt (``partition mod n``; the next ones if it does not answer)
and the driver commits each stream's parts at any gateway: at the next one if a gateway fails
(the transaction id makes a second try safe). The commit is one JetStream atomic batch:
readers see a micro-batch's rows of a stream all at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage

from ..client.rsio import Receipt, RsioClient, RsioError
from ..client.rsio_staging import PartStager, StagedPart, abort_parts
from ..client.rsio_staging import commit_parts as commit_staged
from ..model import TidewireError
from .arrow import from_arrow
from .hubs import HubError, HubSession, locate
from .planning import Options

__all__ = ["StagedParts", "abort_parts_of", "commit_parts", "stage_task"]

log = logging.getLogger("tidewire.spark")

T = TypeVar("T")


@dataclass(frozen=True)
class StagedParts(WriterCommitMessage):
    """What one task staged: per stream, its hub's URL and the part (name, count, fp)."""

    partition: int
    prefix: str | None  # the transaction prefix (None: the task could not tell it)
    parts: tuple[tuple[str, str, StagedPart], ...]  # (stream, url, part); url "": any gateway


def _on(session: HubSession, coro: Awaitable[T]) -> T:
    """Run ``coro`` on ``session``'s loop, within its timeout; errors as :class:`HubError`."""

    async def within() -> T:
        async with asyncio.timeout(session.timeout):
            return await coro

    try:
        return session.loop.run_until_complete(within())
    except TimeoutError:
        raise HubError(f"hub {session.url}: no answer within {session.timeout:g} s") from None
    except (OSError, RsioError, TidewireError) as exc:
        if isinstance(exc, HubError):
            raise
        raise HubError(f"hub {session.url}: {exc}") from exc


def _client(session: HubSession) -> RsioClient:
    session.open()
    assert isinstance(session.client, RsioClient)  # (one hub's or gateway's: no failover)
    return session.client


def task_prefix(fixed: str | None) -> tuple[int, str | None, str]:
    """This task's partition, transaction prefix (``fixed``, else the streaming query's and
    micro-batch's ids) and part name."""
    context = TaskContext.get()
    if context is None:  # (not in a Spark task: tests calling write() directly)
        return 0, fixed, "0.0"
    partition = context.partitionId()
    part = f"{partition}.{context.taskAttemptId()}"
    if fixed is not None:
        return partition, fixed, part
    query = context.getLocalProperty("sql.streaming.queryId")
    batch = context.getLocalProperty("streaming.sql.batchId")
    prefix = None if not query or batch is None else f"spark:{query}:{batch}"
    return partition, prefix, part


def stage_task(iterator: Iterator[pa.RecordBatch], options: Options,
               fixed_prefix: str | None = None) -> StagedParts:  # fmt: skip
    """``write()``: this task's rows, staged per stream on the stream's hub as they come
    (one Arrow batch in memory at a time, plus the publishers' bounded queues)."""
    partition, prefix, part = task_prefix(fixed_prefix)
    sessions: dict[str, HubSession] = {}
    if options.gateways:  # (one gateway for all the task's streams: "" in the message)
        sessions[""] = _answering(options.urls, partition)
    stagers: dict[str, tuple[str, PartStager]] = {}
    try:
        for record_batch in iterator:
            for batch in from_arrow(record_batch, options.stream):  # (checks the rows)
                if prefix is None:
                    raise RuntimeError("the streaming query id or batch id is unknown: cannot "
                                       "write exactly once")  # fmt: skip
                entry = stagers.get(batch.stream)
                if entry is None:
                    url = "" if options.gateways else _url(options, batch.stream)
                    session = sessions.get(url) or sessions.setdefault(url, HubSession(url))
                    stager = PartStager(_client(session), batch.stream,
                                        f"{prefix}:{batch.stream}", part)  # fmt: skip
                    entry = stagers[batch.stream] = (url, _on(session, stager.open()))
                _on(sessions[entry[0]], entry[1].send([batch]))
        staged = tuple((stream, url, _on(sessions[url], stager.close()))
                       for stream, (url, stager) in sorted(stagers.items()))  # fmt: skip
    finally:
        for session in sessions.values():
            session.close()
    return StagedParts(partition, prefix, staged)


def _answering(urls: Sequence[str], first: int) -> HubSession:
    """A session open at the first of the gateways ``urls`` that answers, from the
    ``first``-th (mod their number) on."""
    failure: HubError | None = None
    for i in range(len(urls)):
        session = HubSession(urls[(first + i) % len(urls)])
        try:
            return session.open()
        except HubError as exc:
            session.close()
            failure = exc
            log.warning("gateway %s does not answer: %s", session.url, exc)
    assert failure is not None
    raise failure


def _at_any(urls: Sequence[str], start: int, work: Callable[[HubSession], T]) -> T:
    """``work`` at the first gateway of ``urls`` that carries it through, from the
    ``start``-th on (each is tried once: ``work`` must be safe to do again)."""
    failure: HubError | None = None
    for i in range(len(urls)):
        try:
            with HubSession(urls[(start + i) % len(urls)]) as session:
                return work(session)
        except HubError as exc:
            failure = exc
            log.warning("%s; trying the next gateway", exc)
    assert failure is not None
    raise failure


def _url(options: Options, stream: str) -> str:
    if len(options.urls) == 1:
        return options.urls[0]
    return locate(options.urls, [stream])[stream].url


def _by_stream(messages: Sequence[WriterCommitMessage | None]
               ) -> dict[tuple[str, str], list[tuple[int, StagedPart]]]:  # fmt: skip
    found: dict[tuple[str, str], list[tuple[int, StagedPart]]] = defaultdict(list)
    for m in messages:
        if isinstance(m, StagedParts):
            for stream, url, part in m.parts:
                found[(stream, url)].append((m.partition, part))
    return found


def commit_parts(messages: Sequence[WriterCommitMessage | None], prefix: str,
                 gateways: Sequence[str] = ()) -> None:  # fmt: skip
    """``commit()``: per stream, the winning tasks' parts (in partition order) committed as
    one transaction ``<prefix>:<stream>``; at its hub, or at any of the ``gateways``."""
    sessions: dict[str, HubSession] = {}
    try:
        for n, ((stream, url), parts) in enumerate(sorted(_by_stream(messages).items())):
            named = [p for _, p in sorted(parts, key=lambda item: item[0])]
            txn = f"{prefix}:{stream}"

            def commit(session: HubSession, stream: str = stream, txn: str = txn,
                       named: list[StagedPart] = named) -> Receipt | None:  # fmt: skip
                return _on(session, commit_staged(_client(session), stream, txn, named))

            if url == "":
                receipt = _at_any(gateways, n, commit)
            else:
                receipt = commit(sessions.get(url) or sessions.setdefault(url, HubSession(url)))
            if receipt is not None:
                log.info("committed %d event(s) of %d part(s) to %r (ids %d..%d) for %s",
                         sum(p.count for p in named), len(named), stream, receipt.first_id,
                         receipt.last_id, prefix)  # fmt: skip
    finally:
        for session in sessions.values():
            session.close()


def abort_parts_of(messages: Sequence[WriterCommitMessage | None], prefix: str,
                   gateways: Sequence[str] = ()) -> None:  # fmt: skip
    """``abort()``: drop what the tasks that answered staged (best effort: the hub's sweep,
    or the staging stream's age limit, drops what this cannot reach)."""
    for stream, url in sorted(_by_stream(messages)):
        txn = f"{prefix}:{stream}"

        def abort(session: HubSession, stream: str = stream, txn: str = txn) -> None:
            _on(session, abort_parts(_client(session), stream, txn))

        try:
            if url == "":
                _at_any(gateways, 0, abort)
            else:
                with HubSession(url) as session:
                    abort(session)
        except HubError as exc:
            log.warning("could not drop the staged parts of %s:%s: %s", prefix, stream, exc)


def query_prefix(messages: Sequence[WriterCommitMessage | None]) -> str | None:
    """The transaction prefix the tasks used (they all share it)."""
    return next((m.prefix for m in messages if isinstance(m, StagedParts) and m.prefix), None)
