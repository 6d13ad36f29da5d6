"""Regression tests for the hardening of the durable log (tidewire.log: store, stream, segment).

Each test turns one reviewer's reproduction into a check that fails against the old behaviour:
appends validate and own their batch; a cancelled committer fails its stream instead of letting
ids be reused; admission under backpressure is first come, first served; stream creation is
atomic; abandoned tail waits leave nothing behind; reads do their disk I/O outside the stream
lock (and survive retention); a demand-1 subscriber reads small chunks.

Writes and reads are held in their worker thread with ``threading.Event`` gates (never with
sleeps), and every wait is bounded.
"""

from __future__ import annotations

import asyncio
import gc
import mmap
import os
import shutil
import threading
from array import array
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import tidewire.log.segment as segmod
from helpers import run
from tidewire.hub import EmbeddedStorage, Hub
from tidewire.log import (
    GroupItems,
    GroupWriter,
    GroupWritten,
    Log,
    LogConfig,
    StreamLog,
    StreamSettings,
)
from tidewire.model import (
    MAX_ID,
    Batch,
    CorruptLogError,
    InvalidBatch,
    LogClosedError,
)

WAIT = 5.0
"""Bound, in seconds, of every wait for something that should happen at once."""
HOLD = 10.0
"""How long a held worker thread waits for its release before it gives up on its own."""
NO_LIMIT = 2**63 - 1
STREAM = "s"
STAGING_PREFIX = ".creating-"  # tidewire.log.stream.STAGING_PREFIX (spelled out: the contract)


# --------------------------------------------------------------------------- helpers


def events(log: Log, stream: str = STREAM) -> list[tuple[int, bytes]]:
    return [(e.id, e.value) for batch in log.read(stream, 1, NO_LIMIT) for e in batch]


def reopened(directory: Path, stream: str = STREAM) -> list[tuple[int, bytes]]:
    """What a fresh open of ``directory`` finds in ``stream`` (recovery included)."""
    log = Log.open(str(directory))
    try:
        return events(log, stream)
    finally:
        log.close_sync()


async def wait_event(event: threading.Event) -> None:
    """Wait (off the event loop, bounded) for a thread to set ``event``."""
    assert await asyncio.to_thread(event.wait, WAIT), "the worker thread never got there"


def raw_batch(
    stream: str,
    ids: list[int],
    values: list[bytes],
    *,
    timestamps: list[int] | None = None,
) -> Batch:
    """A batch over caller-owned, mutable machine arrays (a protocol's receive buffers)."""
    offsets = array("I", [0])
    for v in values:
        offsets.append(offsets[-1] + len(v))
    return Batch(
        stream,
        memoryview(array("Q", ids)),
        memoryview(array("q", timestamps if timestamps is not None else [0] * len(ids))),
        memoryview(offsets),
        memoryview(bytearray(b"".join(values))),
    )


class HeldWrite:
    """Stands in for ``Log.write_group`` on one log: the group commit enters the worker thread,
    signals ``entered`` and waits for ``release`` before it encodes and writes."""

    def __init__(self, log: Log) -> None:
        self.original: GroupWriter = log.write_group
        self.entered = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()

    def __call__(self, stream: StreamLog, items: GroupItems) -> GroupWritten:
        self.entered.set()
        if not self.release.wait(HOLD):
            raise RuntimeError("the test never released the held write")
        try:
            return self.original(stream, items)
        finally:
            self.done.set()


def hold_writes(log: Log, monkeypatch: pytest.MonkeyPatch) -> HeldWrite:
    held = HeldWrite(log)
    monkeypatch.setattr(log, "write_group", held)
    return held


def keep_quiet_about_orphans(unretrieved: list[dict[str, Any]]) -> None:
    """Record, instead of logging, what the running loop reports from now on.

    A committer cancelled mid-write leaves its (shielded) write future behind; if that write
    fails, asyncio reports "Future exception was never retrieved" when the future is collected,
    possibly in the middle of an unrelated ``ast.parse`` (CPython 3.11's traceback formatting
    calls it, and its AST state is not reentrant). Recording keeps that report harmless."""
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unretrieved.append(ctx))


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def fds_to_deleted_files(directory: Path) -> list[str]:
    """Open fds of this process on files of ``directory`` that were unlinked."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(os.path.realpath(directory)) and target.endswith(" (deleted)"):
            out.append(target)
    return out


# --------------------------------------------------------------------------- 1. validation


def _decreasing() -> Batch:
    return raw_batch(STREAM, [5, 3], [b"five", b"three"])


def _equal() -> Batch:
    return raw_batch(STREAM, [4, 4], [b"x", b"y"])


def _zero() -> Batch:
    return raw_batch(STREAM, [0], [b"zero"])


def _max_plus_one() -> Batch:
    return raw_batch(STREAM, [MAX_ID + 1], [b"big"])


def _u64_max() -> Batch:
    return raw_batch(STREAM, [2**64 - 1], [b"huge"])


def _last_above_max() -> Batch:
    return raw_batch(STREAM, [MAX_ID - 1, MAX_ID + 1], [b"a", b"b"])


def _decreasing_offsets() -> Batch:
    return Batch(
        STREAM,
        memoryview(array("Q", [10, 11, 12])),
        memoryview(array("q", [0, 0, 0])),
        memoryview(array("I", [0, 3, 1, 4])),  # spans the 4 bytes, but goes backwards
        memoryview(bytearray(b"abcd")),
    )


def _key_flags_wrong_format() -> Batch:
    return Batch(
        STREAM,
        memoryview(array("Q", [10, 11])),
        memoryview(array("q", [0, 0])),
        memoryview(array("I", [0, 1, 2])),
        memoryview(bytearray(b"ab")),
        memoryview(array("I", [1, 1])),  # key flags are format 'B', one byte per event
        memoryview(array("I", [0, 1, 2])),
        memoryview(bytearray(b"kk")),
    )


def _strided_ids() -> Batch:
    # ids 20, 21 taken every other item of an immutable buffer: a valid-looking 'Q' view.
    return Batch(
        STREAM,
        memoryview(bytes(array("Q", [20, 99, 21, 99]))).cast("Q")[::2],
        memoryview(bytes(array("q", [0, 0]))).cast("q"),
        memoryview(bytes(array("I", [0, 1, 2]))).cast("I"),
        memoryview(b"ab"),
    )


def _strided_values() -> Batch:
    return Batch(
        STREAM,
        memoryview(array("Q", [20, 21])),
        memoryview(array("q", [0, 0])),
        memoryview(array("I", [0, 1, 2])),
        memoryview(bytearray(b"a-b-"))[::2],
    )


INVALID_BATCHES: list[tuple[str, Callable[[], Batch]]] = [
    ("decreasing ids", _decreasing),
    ("equal ids", _equal),
    ("id 0", _zero),
    ("id 2**63", _max_plus_one),
    ("id 2**64-1", _u64_max),
    ("last id above 2**63-1", _last_above_max),
    ("decreasing value offsets", _decreasing_offsets),
    ("key_flags of format 'I'", _key_flags_wrong_format),
    ("non-contiguous ids over bytes", _strided_ids),
    ("non-contiguous values over a bytearray", _strided_values),
]


def test_append_refuses_invalid_batches_before_writing(tmp_path: Path) -> None:
    """/tmp/tw/a_unvalidated_ids.py: a batch with ids going backwards or above 2**63-1 used to
    be acknowledged, written, and then refused by the next open."""

    async def scenario() -> None:
        log = Log.open(str(tmp_path))
        await log.append(Batch.build(STREAM, [b"a"], ids=[1]))
        segment = tmp_path / STREAM / f"{1:020d}.log"
        size = segment.stat().st_size
        files = sorted(os.listdir(tmp_path / STREAM))
        for what, make in INVALID_BATCHES:
            for assign_ids in (False, True):
                with pytest.raises(InvalidBatch):  # building may refuse it already
                    await log.append(make(), assign_ids=assign_ids)
                assert segment.stat().st_size == size, f"{what}: bytes were written"
                assert sorted(os.listdir(tmp_path / STREAM)) == files, what
                assert log.latest(STREAM) == 1, what
                assert events(log) == [(1, b"a")], what
        # An invalid first append to a new stream does not create the stream either.
        with pytest.raises(InvalidBatch):
            await log.append(raw_batch("fresh", [7, 2], [b"x", b"y"]))
        assert "fresh" not in log.streams()
        assert not (tmp_path / "fresh").exists()
        # The stream works on: a later valid append is accepted and acknowledged.
        stored = await log.append(Batch.build(STREAM, [b"b"], ids=[2]))
        assert list(stored.ids) == [2]
        stored = await log.append(Batch.build(STREAM, [b"c"]), assign_ids=True)
        assert list(stored.ids) == [3]
        await log.close()

    run(scenario())
    assert reopened(tmp_path) == [(1, b"a"), (2, b"b"), (3, b"c")]


def test_strided_batch_is_refused_and_does_not_fail_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-contiguous view over ``bytes`` is neither copied by ``owned()`` nor caught by
    ``validate()``; it used to reach ``encode()`` in the worker thread, whose TypeError failed
    every appender of the group with LogClosedError."""

    async def append_strided() -> Batch:
        return await log.append(_strided_ids())

    log = Log.open(str(tmp_path))

    async def scenario() -> None:
        held = hold_writes(log, monkeypatch)
        try:
            first = asyncio.create_task(log.append(Batch.build(STREAM, [b"a"], ids=[1])))
            await wait_event(held.entered)
            # The next group: an innocent append, then the strided one.
            good = asyncio.create_task(log.append(Batch.build(STREAM, [b"good"], ids=[10])))
            bad = asyncio.create_task(append_strided())
            for _ in range(5):
                await asyncio.sleep(0)
        finally:
            held.release.set()
        async with asyncio.timeout(WAIT):
            results = await asyncio.gather(first, good, bad, return_exceptions=True)
        assert isinstance(results[0], Batch), repr(results[0])
        # The innocent appender is acknowledged, whatever becomes of the strided batch ...
        assert isinstance(results[1], Batch), repr(results[1])
        # ... which is refused as invalid (when built, or when appended), or stored as given.
        if isinstance(results[2], Batch):
            assert list(results[2].ids) == [20, 21]
        else:
            assert isinstance(results[2], InvalidBatch), repr(results[2])
        await log.close()

    run(scenario())
    assert reopened(tmp_path)[:2] == [(1, b"a"), (10, b"good")]


# --------------------------------------------------------------------------- 2. own buffers


def test_mutating_buffers_after_append_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/tmp/tw/h_cancel_then_reuse.py: the committer used to read the caller's buffers when it
    encoded, in the worker thread, long after ``append`` was called (or cancelled)."""

    async def scenario() -> None:
        log = Log.open(str(tmp_path))
        await log.append(Batch.build(STREAM, [b"x"], ids=[5], timestamps=1))

        # (a) Mutated as soon as the append has been called, before the committer even ran.
        ids = array("Q", [6, 7])
        stamps = array("q", [60, 70])
        offsets = array("I", [0, 2, 4])
        values = bytearray(b"abcd")
        batch = Batch(
            STREAM, memoryview(ids), memoryview(stamps), memoryview(offsets), memoryview(values)
        )
        task = asyncio.create_task(log.append(batch))
        await asyncio.sleep(0)  # the append ran up to its first wait
        ids[0], ids[1] = 3, 4
        stamps[0] = -1
        offsets[1] = 1
        values[:] = b"ZZZZ"
        async with asyncio.timeout(WAIT):
            stored = await task
        assert [(e.id, e.value, e.timestamp) for e in stored] == [(6, b"ab", 60), (7, b"cd", 70)]

        held = hold_writes(log, monkeypatch)
        try:
            # (b) Mutated while the write is held in the worker thread.
            ids = array("Q", [10, 11])
            values = bytearray(b"efgh")
            batch = Batch(
                STREAM,
                memoryview(ids),
                memoryview(array("q", [100, 110])),
                memoryview(array("I", [0, 2, 4])),
                memoryview(values),
            )
            task = asyncio.create_task(log.append(batch))
            await wait_event(held.entered)
            ids[0], ids[1] = 3, 4  # ids that would go backwards on disk
            values[:] = b"WXYZ"
            held.entered.clear()
            held.release.set()
            async with asyncio.timeout(WAIT):
                stored = await task
            assert [(e.id, e.value) for e in stored] == [(10, b"ef"), (11, b"gh")]

            # (c) The same, after the appender was cancelled (its client went away and the
            # protocol reuses the receive buffer at once).
            held.release.clear()
            ids = array("Q", [20, 21])
            values = bytearray(b"ijkl")
            batch = Batch(
                STREAM,
                memoryview(ids),
                memoryview(array("q", [200, 210])),
                memoryview(array("I", [0, 2, 4])),
                memoryview(values),
            )
            task = asyncio.create_task(log.append(batch))
            await wait_event(held.entered)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(WAIT):
                    await task
            ids[0], ids[1] = 3, 4
            values[:] = b"QRST"
        finally:
            held.release.set()
        # The cancelled append was written all the same; the next one follows it.
        async with asyncio.timeout(WAIT):
            stored = await log.append(Batch.build(STREAM, [b"y"], ids=[30], timestamps=300))
        assert list(stored.ids) == [30]
        expected = [
            (5, b"x"),
            (6, b"ab"),
            (7, b"cd"),
            (10, b"ef"),
            (11, b"gh"),
            (20, b"ij"),
            (21, b"kl"),
            (30, b"y"),
        ]
        assert events(log) == expected
        await log.close()

        log = Log.open(str(tmp_path))
        stamps_on_disk = [
            (e.id, e.timestamp) for batch in log.read(STREAM, 1, NO_LIMIT) for e in batch
        ]
        assert stamps_on_disk == [
            (5, 1),
            (6, 60),
            (7, 70),
            (10, 100),
            (11, 110),
            (20, 200),
            (21, 210),
            (30, 300),
        ]
        assert events(log) == expected
        log.close_sync()

    run(scenario())


# --------------------------------------------------------------------------- 3. committer


class HeldPwritev:
    """Stands in for ``os.pwritev`` in tidewire.log.segment: the write whose buffers hold
    ``marker`` is held *inside* the system call (as on a slow disk) until ``release``.

    The fd is duplicated on entry, as the kernel keeps its own reference to the open file
    while a call is in progress: the held write lands in the file even if the log closes it."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.real = os.pwritev
        self.entered = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()

    def __call__(self, fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        # (flags: the journal's round writes with RWF_DSYNC through the same os.pwritev)
        if not any(self.marker in bytes(b) for b in buffers):
            return self.real(fd, buffers, offset, flags)
        own = os.dup(fd)
        try:
            self.entered.set()
            if not self.release.wait(HOLD):
                raise OSError("the test never released the held pwritev")
            return self.real(own, buffers, offset, flags)
        finally:
            os.close(own)
            self.done.set()


@pytest.mark.parametrize("where", ["before encode", "inside pwritev"])
def test_cancelled_committer_fails_the_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """/tmp/tw/g2_cancel_committer.py: a cancelled committer used to let the next append take
    the same id while the first write was still in flight, and that write then replaced the
    acknowledged event on disk."""
    unretrieved: list[dict[str, Any]] = []

    async def scenario() -> None:
        keep_quiet_about_orphans(unretrieved)
        log = Log.open(str(tmp_path))
        await log.append(Batch.build(STREAM, [b"first"]), assign_ids=True)
        # The write as a whole (encode, write, publish) is tracked by ``whole``; ``gate`` holds
        # it before it encodes, or inside its pwritev.
        whole = hold_writes(log, monkeypatch)
        gate: HeldWrite | HeldPwritev = whole
        if where == "inside pwritev":
            whole.release.set()
            gate = HeldPwritev(b"A-payload")
            monkeypatch.setattr("tidewire.log.segment.os.pwritev", gate)
        try:
            a = asyncio.create_task(
                log.append(Batch.build(STREAM, [b"A-payload"]), assign_ids=True)
            )
            await wait_event(gate.entered)
            committer = log.committer(STREAM)
            assert committer is not None
            committer.cancel()
            async with asyncio.timeout(WAIT):
                await asyncio.wait({committer})
                with pytest.raises(LogClosedError):
                    await a
                # The stream is failed: appends are refused at once (none is queued behind the
                # write, none is acknowledged), so no id is handed out twice.
                for assign_ids in (True, False):
                    with pytest.raises(LogClosedError):
                        await log.append(
                            Batch.build(STREAM, [b"B-payload"], ids=[2]), assign_ids=assign_ids
                        )
        finally:
            gate.release.set()
        assert await asyncio.to_thread(whole.done.wait, WAIT)  # written and published, or not
        written = events(log)
        await log.close()
        assert written[0] == (1, b"first")
        # The held write either never happened (the stream failed first) or landed whole.
        assert written in ([(1, b"first")], [(1, b"first"), (2, b"A-payload")])
        on_disk = reopened(tmp_path)
        if where == "inside pwritev":
            # Issue 22: the write landed and went to the journal, but its committer, which
            # publishes after the journal's fsync, was gone: nobody published it in this
            # process; the restart's replay finds it whole.
            assert on_disk == [(1, b"first"), (2, b"A-payload")]
        else:
            assert on_disk == written
        assert all(value != b"B-payload" for _, value in on_disk)

    run(scenario())
    gc.collect()
    assert unretrieved == []  # close() collected the orphaned write's outcome
    # After a restart the stream works again, after whatever is on disk.
    log = Log.open(str(tmp_path))
    latest = log.latest(STREAM)
    stored = run(log.append(Batch.build(STREAM, [b"after"]), assign_ids=True))
    assert list(stored.ids) == [latest + 1]
    log.close_sync()


def test_close_after_cancelled_committer_waits_for_the_write_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committer cancelled mid-write leaves its write running in the worker thread. ``close``
    used to close the files and release the directory lock at once: a log reopened on the
    directory (a restart) then acknowledged an event that the orphaned write overwrote."""
    gate = HeldPwritev(b"A-payload")
    monkeypatch.setattr("tidewire.log.segment.os.pwritev", gate)
    unretrieved: list[dict[str, Any]] = []

    async def restart_and_append(acked: list[tuple[int, bytes]]) -> Log:
        log2 = Log.open(str(tmp_path))
        stored = await log2.append(Batch.build(STREAM, [b"B-payload"]), assign_ids=True)
        acked.append((stored.first_id, stored.value(0)))
        return log2

    async def scenario() -> tuple[list[tuple[int, bytes]], bool]:
        keep_quiet_about_orphans(unretrieved)
        acked: list[tuple[int, bytes]] = []
        log = Log.open(str(tmp_path))
        stored = await log.append(Batch.build(STREAM, [b"first"]), assign_ids=True)
        acked.append((stored.first_id, stored.value(0)))
        log2: Log | None = None
        try:
            a = asyncio.create_task(
                log.append(Batch.build(STREAM, [b"A-payload"]), assign_ids=True)
            )
            await wait_event(gate.entered)
            committer = log.committer(STREAM)
            assert committer is not None
            committer.cancel()
            async with asyncio.timeout(WAIT):
                await asyncio.wait({committer})
                with pytest.raises(LogClosedError):
                    await a
            closing = asyncio.create_task(log.close())
            for _ in range(20):
                await asyncio.sleep(0)
            closed_early = closing.done()
            if closed_early:  # the old behaviour: the directory is free, a restart writes on
                log2 = await restart_and_append(acked)
        finally:
            gate.release.set()
        assert await asyncio.to_thread(gate.done.wait, WAIT)
        async with asyncio.timeout(WAIT):
            await closing  # once the orphaned write is done
        if log2 is None:
            log2 = await restart_and_append(acked)
        await log2.close()
        gc.collect()
        return acked, closed_early

    acked, closed_early = run(scenario())
    on_disk = dict(reopened(tmp_path))
    for event_id, value in acked:
        assert on_disk.get(event_id) == value, f"acknowledged event {event_id} was replaced"
    assert not closed_early, "close() returned while a write was still in flight"
    assert on_disk == {1: b"first", 2: b"A-payload", 3: b"B-payload"}
    gc.collect()
    assert unretrieved == []  # close() collected the orphaned write's outcome


# --------------------------------------------------------------------------- 4. FIFO admission


@pytest.mark.parametrize("assign_ids", [False, True], ids=["caller-ids", "assigned-ids"])
def test_backpressure_admits_in_call_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, assign_ids: bool
) -> None:
    """/tmp/tw/o_backpressure_reorder.py: a later, smaller append used to overtake an earlier
    one waiting for room (IdOrderError with caller ids; assigned ids out of call order)."""

    async def scenario() -> None:
        log = Log.open(str(tmp_path), LogConfig(max_pending_bytes=10_000))
        held = hold_writes(log, monkeypatch)

        def append(value: bytes, event_id: int) -> asyncio.Task[Batch]:
            batch = Batch.build(STREAM, [value], ids=[event_id])
            return asyncio.create_task(log.append(batch, assign_ids=assign_ids))

        async def settle() -> None:
            for _ in range(5):  # nothing else can move while the write is held
                await asyncio.sleep(0)

        try:
            first = append(b"0", 1)
            await wait_event(held.entered)  # its group is being written
            fill = [append(b"f" * 4000, 2), append(b"g" * 4000, 3)]
            await settle()
            big = append(b"B" * 5000, 10)  # called first: must wait for room
            await settle()
            assert not big.done()
            small = append(b"s", 11)  # called second: would fit, but must not overtake
            await settle()
            assert not small.done()
        finally:
            held.release.set()
        async with asyncio.timeout(WAIT):
            results = await asyncio.gather(first, *fill, big, small, return_exceptions=True)
        for r in results:
            assert isinstance(r, Batch), r  # no spurious IdOrderError
        want = [1, 2, 3, 4, 5] if assign_ids else [1, 2, 3, 10, 11]
        assert [r.first_id for r in results if isinstance(r, Batch)] == want
        expected = list(zip(want, [b"0", b"f" * 4000, b"g" * 4000, b"B" * 5000, b"s"], strict=True))
        assert events(log) == expected
        await log.close()
        assert reopened(tmp_path) == expected

    run(scenario())


@pytest.mark.parametrize("assign_ids", [False, True], ids=["caller-ids", "assigned-ids"])
def test_backpressure_admission_handoff_is_fifo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, assign_ids: bool
) -> None:
    """Between the admitted appender's release of the admission lock and the wake-up of the
    next waiter, the lock is free: a newcomer that fits used to enter there, ahead of it."""

    async def scenario() -> None:
        log = Log.open(str(tmp_path), LogConfig(max_pending_bytes=10_000))
        held = hold_writes(log, monkeypatch)

        def append(value: bytes, event_id: int) -> Coroutine[Any, Any, Batch]:
            batch = Batch.build(STREAM, [value], ids=[event_id])
            return log.append(batch, assign_ids=assign_ids)

        async def producer() -> tuple[Batch, Batch]:
            # A client that appends again as soon as its previous append is acknowledged.
            one = await append(b"f" * 4000, 2)
            return one, await append(b"d", 13)  # called after the waiting appender below

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        try:
            first = asyncio.create_task(append(b"0", 1))
            await wait_event(held.entered)
            fill = asyncio.create_task(producer())
            fill2 = asyncio.create_task(append(b"g" * 4000, 3))
            await settle()
            waiting_a = asyncio.create_task(append(b"A" * 5000, 10))  # waits for room
            await settle()
            waiting_b = asyncio.create_task(append(b"B" * 5000, 11))  # waits behind A
            await settle()
        finally:
            held.release.set()
        async with asyncio.timeout(WAIT):
            results = await asyncio.gather(
                first, fill, fill2, waiting_a, waiting_b, return_exceptions=True
            )
        await log.close()
        for r in results:
            assert not isinstance(r, BaseException), repr(r)
        order = [value[:1] for _, value in reopened(tmp_path)]
        # B was called before D: it must be stored before it.
        assert order == [b"0", b"f", b"g", b"A", b"B", b"d"]

    run(scenario())


# --------------------------------------------------------------------------- 5. creation


def _staged(root: Path, name: str, content: bytes) -> Path:
    staging = root / (STAGING_PREFIX + name)
    staging.mkdir(parents=True)
    (staging / "stream.name").write_bytes(content)
    (staging / f"{1:020d}.log").write_bytes(b"\0" * 100)
    return staging


@pytest.mark.parametrize("content", [b"orders", b""], ids=["complete", "empty-name"])
def test_leftover_staging_directory_is_removed_at_open(tmp_path: Path, content: bytes) -> None:
    """/tmp/tw/k_create_crash.py: a crash inside stream creation leaves only a staging
    directory now, which the next (writable) open removes."""
    staging = _staged(tmp_path, "orders", content)
    # A read-only open (an offline tool) repairs nothing ...
    log = Log.open(str(tmp_path), read_only=True)
    assert log.streams() == []
    log.close_sync()
    assert staging.exists()
    # ... a writable one removes the unfinished creation, and the stream can then be created.
    log = Log.open(str(tmp_path))
    assert log.streams() == []
    assert not staging.exists()
    stored = run(log.append(Batch.build("orders", [b"x"]), assign_ids=True))
    assert list(stored.ids) == [1]
    log.close_sync()
    assert (tmp_path / "orders" / "stream.name").read_bytes() == b"orders"
    assert not [e for e in os.listdir(tmp_path) if e.startswith(STAGING_PREFIX)]
    assert reopened(tmp_path, "orders") == [(1, b"x")]


def test_stream_creation_that_fails_leaves_no_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(directory: str, base_id: int) -> segmod.Segment:
        raise OSError("simulated crash while creating the first segment")

    log = Log.open(str(tmp_path))
    with monkeypatch.context() as m:
        m.setattr(segmod.Segment, "create", crash)
        with pytest.raises(OSError, match="simulated crash"):
            run(log.append(Batch.build("orders", [b"x"]), assign_ids=True))
    # The stream does not exist, half made: not in the log, not under its final name.
    assert "orders" not in log.streams()
    assert not (tmp_path / "orders").exists()
    stored = run(log.append(Batch.build("orders", [b"y"]), assign_ids=True))
    assert list(stored.ids) == [1]
    log.close_sync()
    assert reopened(tmp_path, "orders") == [(1, b"y")]
    assert not [e for e in os.listdir(tmp_path) if e.startswith(STAGING_PREFIX)]


@pytest.mark.parametrize(
    "content",
    [b"", b"two words", b"tab\there", b"\xff\xfe", b"nul\x00", b"x" * 256],
    ids=["empty", "space", "tab", "not-utf8", "control", "too-long"],
)
def test_invalid_stream_name_file_is_corruption(tmp_path: Path, content: bytes) -> None:
    """/tmp/tw/k_create_crash.py: an empty stream.name used to register a stream named "",
    after which every append to the real stream failed."""
    Log.open(str(tmp_path)).close_sync()
    (tmp_path / "orders").mkdir()
    name_file = tmp_path / "orders" / "stream.name"
    name_file.write_bytes(content)
    with pytest.raises(CorruptLogError) as info:
        Log.open(str(tmp_path))
    assert info.value.path == str(name_file)
    assert str(name_file) in str(info.value)
    # The failed open released the directory lock and every file: once the damage is
    # removed, the log opens and the stream can be created.
    shutil.rmtree(tmp_path / "orders")
    log = Log.open(str(tmp_path))
    stored = run(log.append(Batch.build("orders", [b"x"]), assign_ids=True))
    assert list(stored.ids) == [1]
    log.close_sync()


# --------------------------------------------------------------------------- 6. tail waiters


def test_cancelled_waits_leave_no_tail_entry(tmp_path: Path) -> None:
    """/tmp/tw/f_tails_leak.py: the log's tail waiters (``Log.tail_waits``) used to keep one
    entry per stream name ever waited on, dropped only by a commit to that stream."""

    async def scenario() -> None:
        log = Log.open(str(tmp_path))
        for i in range(2000):
            waiter = asyncio.create_task(log.wait_for(f"nope-{i}", 0))
            await asyncio.sleep(0)
            assert not waiter.done()
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        assert log.tail_waits == 0

        # Waiters of one stream share the tail: one leaving does not strand the other, which
        # is woken by the next commit; then nothing is left behind either.
        stay = asyncio.create_task(log.wait_for(STREAM, 0))
        leave = asyncio.create_task(log.wait_for(STREAM, 0))
        await asyncio.sleep(0)
        leave.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leave
        assert not stay.done()
        await log.append(Batch.build(STREAM, [b"x"]), assign_ids=True)
        async with asyncio.timeout(WAIT):
            await stay
        assert log.tail_waits == 0
        await log.close()

    run(scenario())


def test_cancelled_subscriptions_leave_no_tail_entry(tmp_path: Path) -> None:
    async def scenario() -> None:
        hub = Hub.open(str(tmp_path))
        for i in range(500):
            sub = hub.subscribe(f"nope-{i}", "latest")
            sub.request(1)
            task = asyncio.create_task(sub.next())
            await asyncio.sleep(0)
            sub.cancel()
            async with asyncio.timeout(WAIT):
                assert await task is None
        assert isinstance(hub.storage, EmbeddedStorage)
        assert hub.storage.log.tail_waits == 0
        await hub.close()

    run(scenario())


# --------------------------------------------------------------------------- 7. reads


class HeldMap:
    """Stands in for ``mmap.mmap`` as tidewire.log.segment maps a segment to read it: in the
    reader thread only, the first call signals ``entered`` (with its fd) and every call waits
    for ``release``."""

    def __init__(self) -> None:
        self.real = mmap.mmap
        self.reader: threading.Thread | None = None
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fd = -1

    def __call__(self, fd: int, length: int, **kwargs: Any) -> mmap.mmap:
        if threading.current_thread() is self.reader:
            if not self.entered.is_set():
                self.fd = fd
                self.entered.set()
            if not self.release.wait(HOLD):
                raise OSError("the test never released the held mapping")
        return self.real(fd, length, **kwargs)


class Reader:
    """``log.read(stream, 1)`` in a thread of its own, its mapping held by ``gate``."""

    def __init__(self, log: Log, gate: HeldMap) -> None:
        self.result: list[Batch] | BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(log,), name="cold-reader")
        gate.reader = self.thread

    def _run(self, log: Log) -> None:
        try:
            self.result = log.read(STREAM, 1, NO_LIMIT)
        except BaseException as exc:
            self.result = exc

    def events(self) -> list[tuple[int, bytes]]:
        assert isinstance(self.result, list), self.result
        return [(e.id, e.value) for batch in self.result for e in batch]


def test_append_and_latest_do_not_wait_for_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/tmp/tw/d_lock_held_during_io.py: reads used to hold the stream lock across their
    preads, stalling commits and the event loop (Log.latest) behind a cold disk."""
    values = [f"v{i}".encode() for i in range(1, 101)]

    async def scenario() -> None:
        log = Log.open(str(tmp_path))
        await log.append(Batch.build(STREAM, values), assign_ids=True)
        gate = HeldMap()
        monkeypatch.setattr("tidewire.log.segment.mmap.mmap", gate)
        reader = Reader(log, gate)
        reader.thread.start()
        try:
            await wait_event(gate.entered)  # the read is mapping the segment
            async with asyncio.timeout(WAIT):
                stored = await log.append(Batch.build(STREAM, [b"w"]), assign_ids=True)
            assert list(stored.ids) == [101]
            # Log.latest is what every Subscription.next() asks on the event loop: it must
            # answer while the read is held (asked from a helper thread so a regression cannot
            # hang the loop).
            answers: list[int] = []
            asker = threading.Thread(target=lambda: answers.append(log.latest(STREAM)))
            asker.start()
            asker.join(WAIT)
            assert answers == [101]
            assert reader.thread.is_alive()  # the read was held all along
        finally:
            gate.release.set()
            await asyncio.to_thread(reader.thread.join, WAIT)
        assert not reader.thread.is_alive()
        # The read saw the stream as it was when it started.
        assert reader.events() == list(enumerate(values, start=1))
        assert events(log)[-1] == (101, b"w")
        await log.close()

    run(scenario())


def test_retention_during_a_read_keeps_its_fd_until_the_read_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With reads outside the lock, retention may drop a segment under a read: its fd must stay
    open (on the unlinked file) until the read ends, then be closed."""
    config = LogConfig(defaults=StreamSettings(segment_bytes=4096, retention_bytes=0))
    expected: list[tuple[int, bytes]] = []

    async def fill() -> None:
        log = Log.open(str(tmp_path), config)
        for i in range(6):  # one ~2 KiB record per segment: six segments
            values = [f"{i}.{j}:".encode() + b"x" * 200 for j in range(10)]
            stored = await log.append(Batch.build(STREAM, values), assign_ids=True)
            expected.extend((e.id, e.value) for e in stored)
        await log.close()

    run(fill())
    log = Log.open(str(tmp_path), config)
    assert log.stats()[0].segments == 6
    first_segment = os.path.realpath(tmp_path / STREAM / f"{1:020d}.log")
    gate = HeldMap()
    monkeypatch.setattr("tidewire.log.segment.mmap.mmap", gate)
    reader = Reader(log, gate)
    baseline = fd_count()
    removed: list[int] = []
    reader.thread.start()
    try:
        assert gate.entered.wait(WAIT)  # the read is mapping the first segment
        assert os.readlink(f"/proc/self/fd/{gate.fd}") == first_segment
        # Retention runs in a thread of its own, so that a regression cannot hang the test.
        retention = threading.Thread(target=lambda: removed.append(log.enforce_retention(0)))
        retention.start()
        retention.join(WAIT)
        assert removed == [5], "retention waited for the read"
        assert not os.path.exists(first_segment)
        assert log.start_id(STREAM) == 51
        # The read's fd is still open, on the unlinked file.
        assert os.readlink(f"/proc/self/fd/{gate.fd}") == first_segment + " (deleted)"
        assert reader.thread.is_alive()
    finally:
        gate.release.set()
        reader.thread.join(WAIT)
    assert not reader.thread.is_alive()
    assert reader.events() == expected  # the read was not broken by the deletion
    # Once the read ended, the segments' own fds were closed; the batches it returned view
    # the mappings of the deleted files (each holding the dup'd fd of Python's mmap), which
    # stay readable until the last batch goes, and are unmapped then.
    assert len(fds_to_deleted_files(tmp_path)) == 5
    reader.result = None
    gc.collect()
    assert fds_to_deleted_files(tmp_path) == []
    assert fd_count() == baseline - 5 + 1  # the live segment stays mapped for the next read
    assert [(e.id, e.value) for b in log.read(STREAM, 51, NO_LIMIT) for e in b] == expected[50:]
    log.close_sync()


# --------------------------------------------------------------------------- 8. small reads


def test_demand_one_subscriber_reads_small_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/tmp/tw/p_demand1_reads.py: each delivery of one event used to pread about a megabyte
    (max_batch_bytes + 256 KiB, bounded by the segment end). Reads now view the mapped
    segment (docs/log.md, "Reads"): no delivery preads (copies) anything."""
    config = LogConfig(recent_bytes=0)  # no memory tail: every delivery reads the disk

    async def fill() -> None:
        hub = Hub.open(str(tmp_path), config)
        for _ in range(50):  # 5000 events, ~600 KB in one segment
            await hub.append(Batch.build(STREAM, [b"x" * 100] * 100), assign_ids=True)
        await hub.close()

    async def consume(start: int, count: int) -> list[int]:
        requested: list[int] = []
        real = os.pread

        def counting(fd: int, n: int, offset: int) -> bytes:
            requested.append(n)
            return real(fd, n, offset)

        hub = Hub.open(str(tmp_path), config)  # reopened: nothing in memory
        with monkeypatch.context() as m:
            m.setattr("tidewire.log.segment.os.pread", counting)
            sub = hub.subscribe(STREAM, start)
            for i in range(count):
                sub.request(1)
                async with asyncio.timeout(WAIT):
                    batches = await sub.next()
                assert batches is not None
                assert [e.id for b in batches for e in b] == [start + i]
        await hub.close()
        return requested

    run(fill())
    for start in (1, 2500):
        requested = run(consume(start, 300))
        assert requested == [], f"{sum(requested)} bytes pread for 300 deliveries"


# --------------------------------------------------------------------------- close


def test_close_with_appends_waiting_for_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/tmp/tw/q_close_pending.py: closing while appends wait for room in several streams
    ends every one of them, and what was acknowledged is exactly what is on disk."""

    async def scenario() -> set[tuple[str, int]]:
        log = Log.open(str(tmp_path), LogConfig(max_pending_bytes=5000))
        held = hold_writes(log, monkeypatch)
        try:
            tasks = [
                asyncio.create_task(
                    log.append(
                        Batch.build(f"s{i % 3}", [b"%03d" % i + b"x" * 997]), assign_ids=True
                    )
                )
                for i in range(30)
            ]
            await wait_event(held.entered)
            closing = asyncio.create_task(log.close())
            await asyncio.sleep(0)
        finally:
            held.release.set()
        async with asyncio.timeout(WAIT):
            await closing
            results = await asyncio.gather(*tasks, return_exceptions=True)
        acked: set[tuple[str, int]] = set()
        for r in results:
            if isinstance(r, Batch):
                acked.add((r.stream, r.first_id))
            else:
                assert isinstance(r, LogClosedError), repr(r)
        assert log.closed
        with pytest.raises(LogClosedError):
            await log.append(Batch.build(STREAM, [b"late"]), assign_ids=True)
        return acked

    acked = run(scenario())
    log = Log.open(str(tmp_path))
    on_disk = {(name, e.id) for name in log.streams() for b in log.read(name, 1) for e in b}
    log.close_sync()
    assert on_disk == acked  # every acknowledged append is durable, nothing else was written
    assert len(acked) == 30


def test_segments_without_a_stream_name_are_corruption(tmp_path: Path) -> None:
    """A stream directory that lost its name file is reported, not skipped (skipping it would
    make every later append to that stream fail on the existing directory)."""
    directory = tmp_path / "orders"
    directory.mkdir()
    (directory / "00000000000000000001.log").write_bytes(b"")
    with pytest.raises(CorruptLogError, match="segments without a stream name") as info:
        Log.open(str(tmp_path))
    assert str(directory / "stream.name") in str(info.value)
    (tmp_path / "notes").mkdir()  # a foreign directory with no segment is left alone
    (directory / "00000000000000000001.log").unlink()
    Log.open(str(tmp_path)).close_sync()


@pytest.mark.parametrize("inline", [0, 64 * 1024], ids=["thread", "inline"])
def test_small_groups_commit_on_the_loop_or_in_a_thread_alike(tmp_path: Path, inline: int) -> None:
    """``inline_commit_bytes``: small groups are written on the event loop's thread, big ones
    in a worker; either way every append is acknowledged with its ids, in order, and durable
    (the log reopened holds them)."""

    async def scenario() -> None:
        log = Log.open(str(tmp_path), LogConfig(inline_commit_bytes=inline))
        small = [log.append(Batch.build(STREAM, [b"s%d" % i]), assign_ids=True) for i in range(20)]
        big = log.append(Batch.build(STREAM, [b"x" * 100_000]), assign_ids=True)
        stored = await asyncio.gather(*small, big)
        assert [b.first_id for b in stored] == list(range(1, 22))
        await log.close()
        log = Log.open(str(tmp_path))
        values = [e.value for b in log.read(STREAM, 1, 1 << 30) for e in b]
        assert values == [b"s%d" % i for i in range(20)] + [b"x" * 100_000]
        await log.close()

    asyncio.run(scenario())
