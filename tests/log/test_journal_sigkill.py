"""SIGKILL test of the write-ahead journal (issue 22): one appender per stream on 16 and on
1,000 streams (journal_crash_child.py), killed after a random number of acknowledgements,
sometimes before it has even finished recovering; some rounds also emulate a power loss (the
active segments cut back to the checkpoint) before the parent reopens. After each round every
acknowledged event is there with its value, each stream's ids run 1, 2, 3, ... without a gap or
a repeat, and the child goes on from there.

Set ``TIDEWIRE_CRASH_SEED`` to replay a run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from journal_crash_child import CONFIG, power_loss, stream_name, value

from helpers import child_env
from tidewire.log import Log

CHILD = Path(__file__).with_name("journal_crash_child.py")
SEED = int(os.environ.get("TIDEWIRE_CRASH_SEED", "20261126"))
LINE_TIMEOUT = 60.0


def run_child(
    directory: Path,
    streams: int,
    inline: int,
    kill_after: int,
    err: Path,
    kill_at: float = LINE_TIMEOUT,
) -> list[str]:
    """Start the child, SIGKILL it after ``kill_after`` lines (READY included), or ``kill_at``
    seconds after its start if that comes first; its lines."""
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), str(streams), str(inline)],
            stdout=subprocess.PIPE, stderr=stderr, env=child_env(),
        )  # fmt: skip
    assert proc.stdout is not None
    lines: list[bytes] = []
    timer = threading.Timer(kill_at, proc.kill)  # (also: a child that hangs ends the round)
    timer.start()
    try:
        while len(lines) < kill_after:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
    finally:
        timer.cancel()
        proc.send_signal(signal.SIGKILL)
        lines.extend(proc.stdout.readlines())  # what it printed before it died counts too
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, err.read_text(errors="replace")
    if kill_at == LINE_TIMEOUT and len(lines) < kill_after:
        pytest.fail(f"the child hung or died; stderr:\n{err.read_text(errors='replace')}")
    return [raw.decode() for raw in lines if raw.endswith(b"\n")]


def verify(directory: Path, streams: int, acked: dict[int, int]) -> dict[int, int]:
    """Reopen (recover) and check every stream; the latest id of each."""
    log = Log.open(str(directory), CONFIG)
    latest: dict[int, int] = {}
    try:
        for i in range(streams):
            name = stream_name(i)
            if name not in log:
                assert i not in acked, f"stream {name} with acknowledged events is gone"
                continue
            events = [e for b in log.read(name, 1, 2**63 - 1) for e in b]
            ids = [e.id for e in events]
            assert ids == list(range(1, len(ids) + 1)), f"{name}: ids not 1, 2, 3, ..."
            for e in events:
                assert e.value == value(i, e.id), f"{name} id {e.id}: wrong value"
            assert len(ids) >= acked.get(i, 0), f"{name}: acknowledged ids lost"
            assert log.latest(name) == len(ids)
            latest[i] = len(ids)
    finally:
        log.close_sync()
    return latest


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("streams", "rounds", "max_lines", "inline"),
    [(16, 8, 3000, 0), (16, 6, 3000, 65536), (1000, 3, 24000, 0), (1000, 3, 24000, 65536)],
)
def test_acknowledged_appends_on_many_streams_survive_sigkill_and_power_loss(
    tmp_path: Path, streams: int, rounds: int, max_lines: int, inline: int
) -> None:
    rng = random.Random(SEED + streams + inline)
    directory = tmp_path / "data"
    acked: dict[int, int] = {}  # stream index -> highest id acknowledged
    cut_total = 0
    for round_no in range(rounds):
        err = tmp_path / f"child-{round_no}.err"
        if round_no == 1:  # killed at a random moment of its start: during recovery, mostly
            lines = run_child(directory, streams, inline, 2**62, err, rng.uniform(0.2, 1.0))
        else:
            kill_after = rng.randint(max_lines // 3, max_lines)
            lines = run_child(directory, streams, inline, kill_after, err)
        for line in lines:
            kind, *fields = line.split()
            if kind == "ACK":
                stream, event_id = int(fields[0]), int(fields[1])
                acked[stream] = max(acked.get(stream, 0), event_id)
        if round_no % 2 == 0:
            cut_total += power_loss(directory)
        latest = verify(directory, streams, acked)
        for i, top in acked.items():
            acked[i] = max(top, latest.get(i, 0))  # later rounds continue from there
    assert sum(acked.values()) >= rounds * 10, "too few acknowledged events to mean anything"
    assert cut_total > 0, "the power-loss emulation never cut anything"
    rolled = [d for d in directory.iterdir() if len(list(d.glob("*.log"))) > 1]
    assert rolled, "no segment was rolled"
