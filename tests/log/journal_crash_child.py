"""The child process of tests/log/test_journal_sigkill.py: one appender per stream, on many
streams, through the write-ahead journal, until it is killed.

Usage: ``python journal_crash_child.py DIRECTORY STREAMS INLINE``

``INLINE`` is ``inline_commit_bytes``: 0 writes every committer round in a worker thread (which
then runs the journal round itself), 65536 on the loop (the journal round run by the syncer
thread when it holds several streams' entries or one is in progress, else on the loop): both
paths of docs/log.md, "The commit path".

Prints ``READY`` once the log is open (recovery done), then ``ACK <stream index> <id>`` once each
append has returned (the event is durable). Each appender gives its events their own ids,
latest + 1, and the value of event ``id`` of stream ``i`` is :func:`value` (i, id), so the parent
can check every event on disk. Segments, journal and checkpoint interval are tiny so that rolls,
checkpoints and the ring's reuse all happen within a second.

:func:`power_loss` (used by the parent) emulates what a power cut takes on top of a crash.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path

from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.log.journal import CHECKPOINT_FILES, JOURNAL_DIR
from tidewire.log.journal_codec import decode_checkpoint
from tidewire.model import Batch

CONFIG = LogConfig(
    defaults=StreamSettings(segment_bytes=4096, index_interval_bytes=512),
    journal_bytes=64 * 1024,
    checkpoint_interval_s=0.05,
)


def stream_name(i: int) -> str:
    return f"s{i:04d}"


def value(i: int, event_id: int) -> bytes:
    return f"{i}:{event_id}:".encode() * (4 + (i + event_id) % 20)


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def appender(log: Log, i: int) -> None:
    name = stream_name(i)
    next_id = log.latest(name) + 1
    while True:
        await log.append(Batch.build(name, [value(i, next_id)], ids=[next_id]))
        emit(f"ACK {i} {next_id}")
        next_id += 1


async def main(directory: str, streams: int, inline: int) -> None:
    log = Log.open(directory, dataclasses.replace(CONFIG, inline_commit_bytes=inline))
    emit("READY")
    try:
        await asyncio.gather(*(appender(log, i) for i in range(streams)))
    finally:
        await log.close()


def power_loss(directory: Path) -> int:
    """Cut each active segment to what the newest checkpoint made durable (nothing of it if
    the checkpoint names an older segment): what a power cut after the crash could take.
    Returns the bytes cut."""
    found = [decode_checkpoint((directory / JOURNAL_DIR / n).read_bytes()) for n in CHECKPOINT_FILES
             if (directory / JOURNAL_DIR / n).exists()]  # fmt: skip
    cps = [c for c in found if c is not None]
    if not cps:
        return 0
    cp = max(cps, key=lambda c: c.seq)
    cut = 0
    for entry in os.scandir(directory):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        logs = sorted(Path(entry.path).glob("*.log"))
        if not logs:
            continue
        base, size = cp.streams.get(entry.name, (0, 0))
        keep = size if int(logs[-1].name[:-4]) == base else 0
        length = logs[-1].stat().st_size
        if length > keep:
            os.truncate(logs[-1], keep)
            cut += length - keep
    return cut


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
