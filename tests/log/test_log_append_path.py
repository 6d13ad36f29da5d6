"""The fixed cost per append (issue 22, round 3) changed how a round is built, not what it
stores: a queue that outgrows the journal while it waits for the shared round commits on its
own, once; a lone stream's round needs no journal future; appends keep their ids and bytes."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from tidewire.log import Log, LogConfig
from tidewire.log.journal import JOURNAL_DIR, RING_FILE
from tidewire.model import Batch


def test_a_queue_that_outgrows_the_journal_while_it_waits_commits_once_in_order(
    tmp_path: Path,
) -> None:
    """Appends queued in one turn of the loop: the first puts its stream in the next shared
    round, the later ones take its queue past what the journal copies (a group of its own,
    fdatasynced in its segment). The group goes once, on its own task, with every append in
    order; the records read back with the ids assigned, and the log reopens to the same."""
    value = bytes(range(256)) * 160  # 40 KiB: 8 of them are over the 256 KiB a journal copies

    async def scenario() -> None:
        log = Log.open(str(tmp_path), LogConfig(inline_commit_bytes=65536))
        assert log.journal is not None
        try:
            await log.append(Batch.build("big", [b"warm"]), assign_ids=True)
            await log.append(Batch.build("other", [b"warm"]), assign_ids=True)
            appends = [
                asyncio.ensure_future(log.append(Batch.build("big", [value]), assign_ids=True))
                for _ in range(8)
            ]
            appends.append(
                asyncio.ensure_future(log.append(Batch.build("other", [b"x"]), assign_ids=True))
            )
            await asyncio.sleep(0)  # (every append has queued)
            assert log.committer("big") is not log.committer("other")
            stored = await asyncio.gather(*appends)
            assert [list(b.ids) for b in stored] == [[i] for i in range(2, 10)] + [[2]]
            assert log.latest("big") == 9
            assert log.latest("other") == 2
        finally:
            await log.close()

    asyncio.run(scenario())
    log = Log.open(str(tmp_path))
    try:
        events = [e for b in log.read("big", 1, max_bytes=1 << 20) for e in b]
        assert [e.id for e in events] == list(range(1, 10))
        assert [e.value for e in events] == [b"warm"] + [value] * 8
    finally:
        log.close_sync()


def test_single_appends_to_one_stream_come_back_as_stored(tmp_path: Path) -> None:
    """16 appenders of one event each, several rounds: each gets its own event back, with the
    id the log gave it, as a view of the stored record; one journal fdatasync per round."""

    async def scenario() -> None:
        log = Log.open(str(tmp_path), LogConfig(inline_commit_bytes=65536))
        assert log.journal is not None
        try:
            await log.append(Batch.build("s", [b"warm"]), assign_ids=True)
            before = log.journal.fsyncs
            got: list[tuple[int, bytes, bytes | None]] = []

            async def writer(i: int) -> None:
                for round_ in range(5):
                    key = f"k{i}".encode()
                    sent = Batch.build("s", [f"{i}/{round_}".encode()], keys=[key])
                    stored = await log.append(sent, assign_ids=True)
                    assert len(stored) == 1
                    assert stored.values.readonly
                    got.append((stored.first_id, stored.value(0), stored.key(0)))

            await asyncio.gather(*(writer(i) for i in range(16)))
            assert log.journal.fsyncs - before <= 5 * 2  # (rounds of many appends each)
            assert sorted(i for i, _, _ in got) == list(range(2, 82))
            events = {e.id: (e.value, e.key) for b in log.read("s", 2) for e in b}
            assert {i: (v, k) for i, v, k in got} == events
        finally:
            await log.close()

    asyncio.run(scenario())


def test_a_kernel_without_rwf_dsync_gets_pwrite_and_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal writes each round with ``pwritev(RWF_DSYNC)``; where that flag is refused
    (before anything is written) it falls back, for good, to ``pwrite`` + ``fdatasync`` of the
    ring: every append is still acknowledged after a flush of the ring, and reads back."""
    real_pwritev, real_fdatasync = os.pwritev, os.fdatasync
    ring_path = str(tmp_path / JOURNAL_DIR / RING_FILE)
    calls = {"refused": 0, "ring fdatasync": 0}

    def no_dsync(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        if flags:
            calls["refused"] += 1
            raise OSError(errno.EOPNOTSUPP, "injected: no RWF_DSYNC here")
        return real_pwritev(fd, buffers, offset, flags)

    def counted(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == ring_path:
            calls["ring fdatasync"] += 1
        real_fdatasync(fd)

    monkeypatch.setattr("tidewire.log.journal.os.pwritev", no_dsync)
    monkeypatch.setattr("tidewire.log.journal.os.fdatasync", counted)

    async def scenario() -> None:
        log = Log.open(str(tmp_path), LogConfig(inline_commit_bytes=65536))
        assert log.journal is not None
        try:
            for i in range(5):
                await log.append(Batch.build("s", [f"v{i}".encode()]), assign_ids=True)
            assert calls["refused"] == 1  # (tried once, then never again)
            assert calls["ring fdatasync"] >= 5  # (one per round: five appends, one by one)
        finally:
            await log.close()

    asyncio.run(scenario())
    monkeypatch.undo()
    log = Log.open(str(tmp_path))
    try:
        assert [e.value for b in log.read("s", 1) for e in b] == [
            f"v{i}".encode() for i in range(5)
        ]
    finally:
        log.close_sync()


def test_the_latency_metric_counts_only_appends_begun_while_it_listened(tmp_path: Path) -> None:
    """``Log.append`` reads the clock only when ``on_append`` is set (issue 22, round 3): an
    append that began before the metric was set reports nothing (not a latency measured from
    zero); those begun after report each a plausible latency."""
    seen: list[float] = []

    async def scenario() -> None:
        log = Log.open(str(tmp_path), LogConfig(inline_commit_bytes=65536))
        try:
            early = asyncio.ensure_future(log.append(Batch.build("s", [b"a"]), assign_ids=True))
            await asyncio.sleep(0)  # (queued, not yet durable)
            assert not early.done()
            log.on_append = seen.append
            await early
            assert seen == []
            await asyncio.gather(*(log.append(Batch.build("s", [b"b"]), assign_ids=True)
                                   for _ in range(3)))  # fmt: skip
            assert len(seen) == 3
            assert all(0 <= s < 60 for s in seen)
        finally:
            await log.close()

    asyncio.run(scenario())


def test_one_log_appends_from_successive_event_loops(tmp_path: Path) -> None:
    """An append's future belongs to the running loop (the committer's task's loop while it has
    work, else the running one): a log whose committer went idle in one loop appends from the
    next loop, in order."""
    log = Log.open(str(tmp_path), LogConfig(inline_commit_bytes=65536))
    try:
        for n in range(3):
            stored = asyncio.run(log.append(Batch.build("s", [b"x" * n]), assign_ids=True))
            assert list(stored.ids) == [n + 1]
        assert [e.value for b in log.read("s", 1) for e in b] == [b"", b"x", b"xx"]
    finally:
        log.close_sync()
