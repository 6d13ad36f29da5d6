"""Early write-back of segments (log/segment.py, ``WRITEBACK_BYTES``): every 8 MiB written to a
segment the kernel is told to start writing them out, so that the seal at a roll has little
left to flush on the stream's append path (before: 80 ms for a 128 MiB segment here, seen by
the security tests' bystander as a stall). What is checked here is what the log tells the
kernel, and that a refused hint changes nothing; how long a seal takes is a benchmark's
(benchmarks/README.md, "segment write-back")."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from helpers import run
from tidewire.log import Log, LogConfig
from tidewire.log.segment import WRITEBACK_BYTES, start_writeback
from tidewire.model import Batch


def test_write_back_is_started_every_eight_mib_and_at_no_other_time(tmp_path: Path) -> None:
    value = b"v" * 1000

    async def scenario() -> list[tuple[int, int]]:
        log = Log.open(str(tmp_path), LogConfig(fsync=False))  # (128 MiB segments: no roll)
        seen: list[tuple[int, int]] = []
        try:
            for _ in range(40):  # ~40 MB: write-back started four times, at 8 MiB steps
                await log.append(Batch.build("s", [value] * 1000), assign_ids=True)
                segment = log.stream("s").segments[-1]
                seen.append((segment.size, segment.written_back))
        finally:
            await log.close()
        return seen

    seen = run(scenario())
    for size, written_back in seen:
        assert size - written_back < WRITEBACK_BYTES + 1_100_000  # (at most one append over)
    steps = sorted({w for _, w in seen})
    assert steps[0] == 0
    assert len(steps) == 5, steps
    assert all(b - a >= WRITEBACK_BYTES for a, b in itertools.pairwise(steps))


def test_a_hint_the_kernel_refuses_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"x" * 4096)
        start_writeback(fd, 0, 4096)
        start_writeback(fd, -1, 4096)  # (EINVAL: ignored)
    finally:
        os.close(fd)
    start_writeback(fd, 0, 4096)  # (EBADF: ignored)
    assert path.read_bytes() == b"x" * 4096
