"""The group committer of a :class:`~tidewire.log.Log`: one task per log, not one per stream.

Each round takes the queue of *every* stream that has appends waiting (and no group in flight),
writes each stream's group to its segment, and, with the write-ahead journal, waits once for the
journal entry of the round's last group: one ``fdatasync`` makes all of them durable. Then it
publishes every group and wakes its appenders. Small rounds (at most ``inline_commit_bytes``)
are written on the loop's thread, bigger ones by one worker-thread job for the whole round.

Why one task for all streams: with a task per stream, a round over N streams cost N task
creations, N turns of the loop to start them, N futures for the journal and N task resumptions
(profiled: docs/log.md, "Fixed cost per commit"); the round over N streams is now one of each.

Groups that go on their own (a task of their own, as every group did before): those bigger than
the journal takes (they fdatasync their segment themselves, so sharing a round would only
make the others wait for that fsync), and every group when there is no journal but an fsync
(each stream fsyncs its own segment; sharing a thread would serialise the fsyncs). A stream has
at most one group in flight at a time either way, so its queue's order is its write order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..model import Batch, LogClosedError, LogError, StorageFullError
from .stream import StreamLog, Unpublished

if TYPE_CHECKING:
    from .store import Log

__all__ = ["Committer", "GroupItems", "GroupWriter", "GroupWritten", "Pending", "StreamQueue"]

GroupItems = list[tuple[Batch, int | None]]
"""A group to commit: each batch with the first id the log assigns it (``None``: its own)."""
GroupWritten = tuple[list[Batch], list[Batch], float | None]
"""A group written: the batch stored per item, the records' batches, the fsync's seconds."""
GroupWriter = Callable[[StreamLog, GroupItems], GroupWritten]
"""What :attr:`Log.write_group` is: encode a group and write it durably, or raise."""

Outcome = tuple[GroupWritten, Unpublished | None] | BaseException
"""One stream's write in a round: what it wrote and its journal entry, or why it failed."""


@dataclass(slots=True)
class Pending:
    """One append waiting in its stream's queue."""

    batch: Batch
    first_id: int | None  # ids assigned by the log start here; None: the batch's own ids
    size: int
    future: asyncio.Future[Batch]


@dataclass(slots=True)
class StreamQueue:
    """Per-stream group-commit state (event-loop side)."""

    stream: StreamLog
    latest: int  # the latest id accepted, queued ones included
    recent: deque[Batch] = field(default_factory=deque)  # newest commits, bounded in bytes
    recent_bytes: int = 0
    queue: list[Pending] = field(default_factory=list)
    queued_bytes: int = 0
    inflight_bytes: int = 0  # the group being written
    busy: bool = False  # a group of this stream is in flight (in a round, or on its own)
    task: asyncio.Task[Any] | None = None  # the task committing it (shared or its own)
    room: asyncio.Event = field(default_factory=asyncio.Event)
    admission: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0  # appenders in the admission queue
    writing: asyncio.Future[Any] | None = None  # the round's (or bulk's) write, while it runs


class Committer:
    """Runs the rounds of one log (see the module docstring). :meth:`ready` is all it is told."""

    def __init__(self, log: Log, refused: Callable[[StorageFullError], None],
                 notify: Callable[[str], None], remember: Callable[[StreamQueue, list[Batch]],
                                                                   None]) -> None:  # fmt: skip
        self._log = log
        self._refused = refused
        self._notify = notify
        self._remember = remember
        self._ready: dict[str, StreamQueue] = {}  # streams with a queue and no group in flight
        self.task: asyncio.Task[None] | None = None  # the shared task, while it has work
        self.solo: set[asyncio.Task[Any]] = set()  # groups on their own

    def tasks(self) -> list[asyncio.Task[Any]]:
        """The tasks committing now (a round that ends may start another: wait in a loop)."""
        return [*self.solo, *([self.task] if self.task is not None else [])]

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running event loop (call it from the loop's thread only): that of the shared
        task while it has work (the appenders woken by a round enqueue while it waits for
        them), so that an append asks Python for the running loop only when there is none:
        on Python 3.11 ``asyncio.get_running_loop`` calls ``getpid()``, a system call
        (~190 ns on this VM, ~3.5% of an append's CPU with 16 appenders on one stream)."""
        task = self.task
        return task.get_loop() if task is not None else asyncio.get_running_loop()

    def ready(self, queue: StreamQueue) -> None:
        """``queue`` has appends waiting: commit them in the next round (or on their own)."""
        if queue.busy:
            return  # (its round takes it back when it ends)
        if self._alone(queue):
            # (out of the next shared round if it was waiting for it: one group at a time)
            self._ready.pop(queue.stream.name, None)
            queue.busy = True
            queue.task = asyncio.create_task(self._round([queue]))
            self.solo.add(queue.task)
            queue.task.add_done_callback(self.solo.discard)
            return
        self._ready[queue.stream.name] = queue
        if self.task is None:
            self.task = asyncio.create_task(self._loop())
        queue.task = self.task

    def _alone(self, queue: StreamQueue) -> bool:
        journal, config = self._log.journal, self._log.config
        if journal is None:
            return config.fsync  # (each fsyncs its own segment: in parallel threads)
        return queue.queued_bytes > journal.max_payload

    async def _loop(self) -> None:
        try:
            while True:
                if not self._ready:
                    # Let the appenders just woken by the last round enqueue their next batch,
                    # so that they join the next round instead of each starting a new one.
                    await asyncio.sleep(0)
                    if not self._ready:
                        break
                queues = self._take()
                for queue in queues:
                    queue.busy = True
                await self._round(queues)
        finally:
            self.task = None
            if self._ready:  # (cancelled: the streams of the next round go on without it)
                self.task = asyncio.create_task(self._loop())
                for queue in self._ready.values():
                    queue.task = self.task

    def _take(self) -> list[StreamQueue]:
        """The streams of the next round, oldest first: all that are ready, up to a quarter of
        the journal's ring (the rest wait for the next round). A round never fills the ring
        then, so it never stops in the middle to wait for a checkpoint (the checkpointer is
        woken at half full): it fsyncs once, as it would have without the journal."""
        journal = self._log.journal
        room = journal.ring_bytes // 4 if journal is not None else 2**63
        taken: list[StreamQueue] = []
        for name, queue in list(self._ready.items()):
            if taken and queue.queued_bytes > room:
                break
            room -= queue.queued_bytes
            taken.append(queue)
            del self._ready[name]
        return taken

    async def _round(self, queues: list[StreamQueue]) -> None:
        """Write, make durable and publish one group of each of ``queues``."""
        log = self._log
        groups: list[list[Pending]] = []
        total = 0
        for queue in queues:
            groups.append(queue.queue)
            queue.queue = []
            queue.inflight_bytes, queue.queued_bytes = queue.queued_bytes, 0
            total += queue.inflight_bytes
        jobs = [(q.stream, [(p.batch, p.first_id) for p in group])
                for q, group in zip(queues, groups, strict=True)]  # fmt: skip
        write: asyncio.Future[list[Outcome]] | None = None
        try:
            if total <= log.config.inline_commit_bytes:  # small: on this thread, no future
                outcomes = self._write_all(jobs)
            else:
                write = asyncio.get_running_loop().run_in_executor(None, self._write_all, jobs)
                for queue in queues:
                    queue.writing = write
                # Shielded: the thread writes whatever happens to this task, which must know.
                outcomes = await asyncio.shield(write)
            await self._durable([q.stream for q in queues], outcomes)
        except BaseException as exc:  # (cancelled mid-write: every stream of the round fails)
            for queue, group in zip(queues, groups, strict=True):
                if queue.stream.failed is None:
                    queue.stream.failed = RuntimeError("the committer was cancelled mid-write")
                self._settle(queue, group, exc)
                queue.writing = write  # (Log.close waits for it: the thread may still write)
            raise
        for queue, group, outcome in zip(queues, groups, outcomes, strict=True):
            self._settle(queue, group, outcome)

    def _write_all(self, jobs: list[tuple[StreamLog, GroupItems]]) -> list[Outcome]:
        """Write each stream's group (on the loop's thread or in one worker thread); an error
        is that stream's outcome, not the round's."""
        outcomes: list[Outcome] = []
        journal = self._log.journal
        with journal.batch() if journal is not None else contextlib.nullcontext():
            self._write_each(jobs, outcomes)
        return outcomes

    def _write_each(self, jobs: list[tuple[StreamLog, GroupItems]],
                    outcomes: list[Outcome]) -> None:  # fmt: skip
        for stream, items in jobs:
            try:
                written = self._log.write_group(stream, items)
            except Exception as exc:
                outcomes.append(exc)
                continue
            unpublished, stream.unpublished = stream.unpublished, None
            outcomes.append((written, unpublished))

    async def _durable(self, streams: list[StreamLog], outcomes: list[Outcome]) -> None:
        """Wait until the journal has the round's entries (one future: the last entry's), then
        publish them (readers never see an event before it is durable). A failed journal fails
        the streams that wrote to it (their ids are not free again)."""
        journal = self._log.journal
        lsns = [o[1].lsn for o in outcomes if isinstance(o, tuple) and o[1] is not None]
        if journal is None or not lsns:
            return
        last = max(lsns)
        try:  # (not shielded: the future is this round's alone, and a shield costs a turn)
            # A round the loop's thread led is durable already (a lone stream's): no future.
            seconds = journal.durable_now(last)
            if seconds is None:
                seconds = await journal.durable(last)
        except Exception as exc:
            for i, (stream, outcome) in enumerate(zip(streams, outcomes, strict=True)):
                if isinstance(outcome, tuple) and outcome[1] is not None:
                    if stream.failed is None:
                        stream.failed = exc
                    outcomes[i] = exc
            return
        for i, (stream, outcome) in enumerate(zip(streams, outcomes, strict=True)):
            if isinstance(outcome, tuple) and outcome[1] is not None:
                written = outcome[0]
                stream.publish_written(outcome[1])
                outcomes[i] = ((written[0], written[1], seconds), None)
                seconds = None  # (one fsync: the metrics count it once)

    def _settle(self, queue: StreamQueue, group: list[Pending],
                outcome: Outcome) -> None:  # fmt: skip
        """Wake ``group``'s appenders with what was stored (or the error), and take the
        stream back for the next round if more is queued."""
        stream = queue.stream
        queue.inflight_bytes = 0
        queue.writing = None
        queue.busy = False
        queue.task = None
        queue.room.set()
        if isinstance(outcome, BaseException):
            error: LogError
            if isinstance(outcome, StorageFullError) and stream.failed is None:
                # Refused for want of space, nothing written: the stream stays open. What is
                # queued behind the group fails too (its ids were counted from the group's),
                # and so does any fenced append still on its way.
                error = outcome
                self._refused(outcome)
            else:
                error = LogClosedError(f"stream {stream.name!r}: append failed: {outcome!r}")
            for pending in (*group, *queue.queue):
                if not pending.future.done():
                    pending.future.set_exception(error)
            queue.queue, queue.queued_bytes = [], 0
            if stream.failed is None:  # nothing was written: the ids are free again
                queue.latest = stream.latest
            self._notify(stream.name)  # (those waiting for the queue to settle)
            return
        (stored, kept, fsync_seconds), _ = outcome
        on_fsync = self._log.on_fsync
        if fsync_seconds is not None and on_fsync is not None:
            on_fsync(fsync_seconds)
        for pending, batch in zip(group, stored, strict=True):
            if not pending.future.done():
                pending.future.set_result(batch)
        self._remember(queue, kept)
        self._notify(stream.name)
        if queue.queue:
            self.ready(queue)
