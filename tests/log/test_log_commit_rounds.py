"""The log's one committer (tidewire.log.committer): a round takes the queue of every stream and
ends with one journal fdatasync; a round takes at most a quarter of the ring; big groups and
logs without a journal commit each stream on its own; a failing stream fails alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tidewire.log import GroupItems, GroupWritten, Log, LogConfig, StreamLog
from tidewire.model import Batch, LogClosedError

STREAMS = [f"s{i:02d}" for i in range(16)]


def open_log(tmp_path: Path, **config: int | bool) -> Log:
    return Log.open(str(tmp_path), LogConfig(**config))  # type: ignore[arg-type]


@pytest.mark.parametrize("inline", [0, 65536])
def test_appends_to_many_streams_at_once_share_one_round(tmp_path: Path, inline: int) -> None:
    """16 streams, one append each, all queued before the committer runs: one round, one
    journal fdatasync, one committer task for all of them; every append durable and readable."""

    async def scenario() -> None:
        log = open_log(tmp_path, inline_commit_bytes=inline)
        assert log.journal is not None
        try:
            await asyncio.gather(
                *(log.append(Batch.build(s, [b"warm"]), assign_ids=True) for s in STREAMS)
            )  # (creates the streams)
            before = log.journal.fsyncs
            appends = [
                asyncio.ensure_future(log.append(Batch.build(s, [s.encode()]), assign_ids=True))
                for s in STREAMS
            ]
            await asyncio.sleep(0)  # (every append has queued)
            committers = {log.committer(s) for s in STREAMS}
            assert len(committers) == 1
            assert None not in committers
            stored = await asyncio.gather(*appends)
            assert log.journal.fsyncs - before == 1
            for s, batch in zip(STREAMS, stored, strict=True):
                assert list(batch.ids) == [2]
                assert [e.value for b in log.read(s, 1) for e in b] == [b"warm", s.encode()]
            assert all(log.committer(s) is None for s in STREAMS)  # (done: nothing queued)
        finally:
            await log.close()

    asyncio.run(scenario())


def test_a_round_takes_at_most_a_quarter_of_the_ring(tmp_path: Path) -> None:
    """With a 64 KiB ring, 8 streams queuing 6 KiB each (48 KiB) are cut into rounds of at
    most 16 KiB: several fsyncs, never a wait for a checkpoint inside a round; all durable."""

    async def scenario() -> None:
        log = open_log(tmp_path, journal_bytes=64 * 1024)
        assert log.journal is not None
        names = STREAMS[:8]
        try:
            await asyncio.gather(
                *(log.append(Batch.build(s, [b"warm"]), assign_ids=True) for s in names)
            )
            before, checkpoints = log.journal.fsyncs, log.journal.checkpoints
            value = bytes(6 * 1024)
            await asyncio.gather(
                *(log.append(Batch.build(s, [value]), assign_ids=True) for s in names)
            )
            rounds = log.journal.fsyncs - before
            assert 3 <= rounds <= 8
            for s in names:
                assert log.latest(s) == 2
            assert log.journal.checkpoints - checkpoints <= 1  # (at most the half-full one)
        finally:
            await log.close()

    asyncio.run(scenario())


def test_without_a_journal_each_stream_commits_on_its_own(tmp_path: Path) -> None:
    """``journal=False``: each stream fsyncs its own segment, so each has a task of its own
    (their fsyncs run in parallel threads, as before the journal)."""

    async def scenario() -> None:
        log = open_log(tmp_path, journal=False)
        assert log.journal is None
        try:
            appends = [asyncio.ensure_future(log.append(Batch.build(s, [b"x"]), assign_ids=True))
                       for s in STREAMS[:4]]  # fmt: skip
            await asyncio.sleep(0)
            committers = {log.committer(s) for s in STREAMS[:4]}
            assert len(committers) == 4
            assert None not in committers
            await asyncio.gather(*appends)
            assert all(log.latest(s) == 1 for s in STREAMS[:4])
        finally:
            await log.close()

    asyncio.run(scenario())


def test_a_stream_whose_write_fails_fails_alone_in_its_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One stream's write raises in a shared round: its appends fail (and the stream with
    them), the other streams of the same round commit."""

    async def scenario() -> None:
        log = open_log(tmp_path)
        original = log.write_group

        def write(stream: StreamLog, items: GroupItems) -> GroupWritten:
            if stream.name == "s03":
                stream.failed = OSError("emulated I/O error")
                raise OSError("emulated I/O error")
            return original(stream, items)

        try:
            await asyncio.gather(
                *(log.append(Batch.build(s, [b"warm"]), assign_ids=True) for s in STREAMS[:6])
            )
            monkeypatch.setattr(log, "write_group", write)
            results = await asyncio.gather(
                *(log.append(Batch.build(s, [b"x"]), assign_ids=True) for s in STREAMS[:6]),
                return_exceptions=True,
            )
            for s, result in zip(STREAMS[:6], results, strict=True):
                if s == "s03":
                    assert isinstance(result, LogClosedError)
                    assert log.latest(s) == 1
                else:
                    assert isinstance(result, Batch)
                    assert list(result.ids) == [2]
                    assert log.latest(s) == 2
        finally:
            await log.close()

    asyncio.run(scenario())
