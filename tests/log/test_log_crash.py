"""Crash test of the durable log: SIGKILL a writer at random moments, then check every
acknowledged event survived, byte for byte.

Each round starts ``crash_child.py`` on the same directory; it appends with several concurrent
appenders (group commit) and reports every batch before (``SEND``) and after (``ACK``) its append.
The parent kills it with SIGKILL after a random number of lines, reopens the directory itself
(recovery) and checks:

* every acknowledged batch is there, with the ids it was acknowledged with, byte for byte;
* every batch on disk is one some appender sent (acknowledged or not), each at most once (small
  batches committed together share a record: they are told apart by their tokens);
* ids run 1, 2, 3, ... without gaps (the log assigned them all) and ``latest`` agrees.

Set ``TIDEWIRE_CRASH_SEED`` to replay a run.
"""

from __future__ import annotations

import asyncio
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from crash_child import CONFIG, STREAM, make_batch

from tidewire.log import Log
from tidewire.model import Batch, Event

CHILD = Path(__file__).with_name("crash_child.py")
SEED = int(os.environ.get("TIDEWIRE_CRASH_SEED", "20240611"))
ROUNDS = 10
ROUND_TIMEOUT = 60.0
MAX_LINES = 400


class Ledger:
    """What the children said: every batch sent, and the ids of those acknowledged."""

    def __init__(self) -> None:
        self.sent: set[int] = set()
        self.acked: dict[int, tuple[int, int]] = {}

    def take(self, line: str) -> None:
        kind, *fields = line.split()
        if kind == "SEND":
            token = int(fields[0])
            assert token not in self.sent, f"token {token} sent twice"
            self.sent.add(token)
        elif kind == "ACK":
            token, first, last = (int(f) for f in fields)
            assert token in self.sent, f"ACK of a batch never sent: {line!r}"
            assert token not in self.acked, f"token {token} acknowledged twice"
            assert last - first + 1 == len(make_batch(token))
            self.acked[token] = (first, last)
        else:
            assert kind in ("READY", "DONE"), line


def run_child(directory: Path, seed: int, kill_after: int, stderr_path: Path) -> list[str]:
    """Run one child; SIGKILL it once it has printed ``kill_after`` lines; return every complete
    line it printed (including those printed between our decision and its death)."""
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), str(seed)],
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    received: list[bytes] = []
    failure: str | None = None
    try:
        deadline = time.monotonic() + ROUND_TIMEOUT
        while len(received) < kill_after:
            try:
                raw = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                failure = f"the child printed only {len(received)} lines in {ROUND_TIMEOUT} s"
                break
            if raw is None:
                failure = f"the child exited on its own after {len(received)} lines"
                break
            received.append(raw)
    finally:
        proc.kill()  # SIGKILL: no chance to flush or close anything
        try:
            proc.wait(timeout=30)
        finally:
            reader.join(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
    while True:  # what the child printed before it died is acknowledged too
        try:
            raw = lines.get_nowait()
        except queue.Empty:
            break
        if raw is not None:
            received.append(raw)
    if failure is not None:
        pytest.fail(f"{failure}; stderr:\n{stderr_path.read_text(errors='replace')}")
    assert proc.returncode == -signal.SIGKILL, stderr_path.read_text(errors="replace")
    # A line cut short by the kill (no newline) cannot be parsed: drop it.
    return [raw.decode() for raw in received if raw.endswith(b"\n")]


def appended_batches(records: list[Batch]) -> list[Batch]:
    """Split record batches into the appended batches they hold: small batches committed
    together share a record, and the events of a sent batch carry timestamps token, token + 1,
    ... (tokens are random 63-bit numbers, so a neighbour never continues the sequence)."""
    out: list[Batch] = []
    for record in records:
        start = 0
        for i in range(1, len(record) + 1):
            if i == len(record) or record.timestamps[i] != record.timestamps[i - 1] + 1:
                out.append(record.slice(start, i))
                start = i
    return out


def verify(directory: Path, ledger: Ledger) -> int:
    """Reopen (recover) the log and check it against the ledger; return the latest id."""
    log = Log.open(str(directory), CONFIG)
    try:
        if STREAM not in log:
            assert not ledger.acked
            return 0
        seen: set[int] = set()
        next_id = 1
        # One read with no byte limit: every record comes back whole, one batch each.
        everything = log.read(STREAM, 1, 2**63 - 1)
        # The same events again, in reads of 16 KiB (records sliced to fit).
        chunked: list[Event] = []
        while (done := chunked[-1].id if chunked else 0) < log.latest(STREAM):
            batches = log.read(STREAM, done + 1, 16 * 1024)
            assert batches, "a read below the latest id gave nothing"
            chunked.extend(e for b in batches for e in b)
        assert chunked == [e for b in everything for e in b]
        for batch in appended_batches(everything):
            token = int(batch.timestamps[0])
            assert token in ledger.sent, f"ids {batch.first_id}..: a batch nobody sent"
            assert token not in seen, f"batch {token} stored twice"
            seen.add(token)
            assert batch.first_id == next_id, f"ids jump from {next_id - 1} to {batch.first_id}"
            expected = make_batch(token).with_ids(batch.first_id)
            assert list(batch) == list(expected), f"batch {token} differs"
            if token in ledger.acked:
                assert (batch.first_id, batch.last_id) == ledger.acked[token]
            next_id = batch.last_id + 1
        lost = {t: ledger.acked[t] for t in ledger.acked.keys() - seen}
        assert not lost, f"acknowledged batches lost: {sorted(lost.values())}"
        assert log.latest(STREAM) == next_id - 1
        return next_id - 1
    finally:
        log.close_sync()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_acknowledged_appends_survive_sigkill(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    directory = tmp_path / "data"
    ledger = Ledger()
    latest = 0
    for round_no in range(ROUNDS):
        kill_after = rng.randint(2, MAX_LINES)
        lines = run_child(
            directory, rng.getrandbits(64), kill_after, tmp_path / f"child-{round_no}.err"
        )
        assert lines[0] == "READY\n"
        for line in lines:
            ledger.take(line)
        now = verify(directory, ledger)
        assert now >= latest, f"round {round_no} (seed {SEED}): latest went back"
        latest = now
    assert len(ledger.acked) >= ROUNDS, "too few acknowledged batches to mean anything"
    assert len(list(directory.joinpath(STREAM).glob("*.log"))) > 1, "no segment was rolled"

    # Finally, the log accepts new appends and keeps them.
    async def append_more() -> int:
        log = Log.open(str(directory), CONFIG)
        next_id = latest + 1
        try:
            for _ in range(3):
                token = rng.getrandbits(62)
                ledger.sent.add(token)
                stored = await log.append(make_batch(token), assign_ids=True)
                assert stored.first_id == next_id
                ledger.acked[token] = (stored.first_id, stored.last_id)
                next_id = stored.last_id + 1
        finally:
            await log.close()
        return next_id - 1

    appended_up_to = asyncio.run(append_more())
    assert verify(directory, ledger) == appended_up_to


def test_crash_child_batches_are_deterministic() -> None:
    for token in (0, 1, 2**62 - 1, 123456789):
        a, b = make_batch(token), make_batch(token)
        assert list(a) == list(b)
        assert a.timestamps[0] == token
    assert list(make_batch(1)) != list(make_batch(2))


def test_run_child_reaps_the_child_when_it_fails(tmp_path: Path) -> None:
    """A child that cannot start (a file where its directory should be) fails the round cleanly."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)exited on its own.*FileExistsError"):
        run_child(blocker, 1, 5, tmp_path / "child.err")
