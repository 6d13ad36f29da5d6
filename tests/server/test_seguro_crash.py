"""Crash test of Seguro: a ship streams a large ``SAVE MANY`` into a ``tidewire serve`` process,
which is SIGKILLed mid-stream (after it acknowledged some events with ``LATEST``); the restarted
hub, on the same data directory, must say in ``WELCOME`` at least the highest id it acknowledged
and give back, over ``READ``, every stored event intact: exactly the ids the ship sent, in order,
without a hole, up to that id, each with its data.

Several rounds run on the same directory, each resuming above the ``WELCOME`` id (with a gap).
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
from bisect import bisect_right
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

from tidewire.protocols.seguro import (
    Breach,
    ClientSession,
    Committed,
    CommittedMany,
    Event,
    Latest,
    ManyEvent,
    Sent,
    Welcome,
)

SEED = int(os.environ.get("TIDEWIRE_CRASH_SEED", "20261121"))
POINT = "~sampel-palnet"
ROUNDS = 4
EVENTS_PER_ROUND = 30_000  # ~25 MB: far more than the hub acknowledges before the kill
PIECE = 64 * 1024
ROUND_TIMEOUT = 30.0
T = TypeVar("T")


def value(event_id: int) -> bytes:
    """The data of event ``event_id`` (a pure function of it; some look like framing)."""
    rng = random.Random(event_id)
    data = rng.randbytes(rng.choice([0, 1, 2, 100, 500, 800, 1000, 1500, 2500]))
    if rng.random() < 0.1:
        data += b"\n\nEVENT 1 1\nx\n\nSTREAMED MANY 1 1 1\n"
    return data


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)


def read_endpoints(proc: subprocess.Popen[str], timeout: float = 30.0) -> list[str]:
    """The server's stdout up to its ``ready`` line (then stdout keeps being drained)."""
    assert proc.stdout is not None
    stdout = proc.stdout
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if line.startswith("ready"):
            return seen
    raise AssertionError(f"the server printed no 'ready' within {timeout} s: {seen}")


@contextmanager
def serving(data_dir: Path, stderr_path: Path) -> Iterator[Served]:
    """``tidewire serve`` on ``data_dir``, every listener on a free port; killed on exit."""
    with open(stderr_path, "ab") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", str(data_dir),
             "--http-port", "0"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "TIDEWIRE_RSIO_PORT": "0", "TIDEWIRE_SEGURO_PORT": "0",
                 "TIDEWIRE_TOLLIVER_PORT": "0"},
        )  # fmt: skip
    try:
        try:
            lines = read_endpoints(proc)
        except AssertionError as exc:
            stderr_text = stderr_path.read_text(errors="replace")
            raise AssertionError(f"{exc}\nstderr:\n{stderr_text}") from None
        url = next(w for line in lines for w in line.split() if w.startswith("seguro://"))
        yield Served(proc, url, lines)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


async def open_session(url: str) -> tuple[ClientSession, asyncio.StreamReader,
                                          asyncio.StreamWriter, Welcome]:  # fmt: skip
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port, limit=1 << 22)
    session = ClientSession(POINT)
    (*_, welcome) = await exchange(session, reader, writer, Welcome)
    assert isinstance(welcome, Welcome)
    return session, reader, writer, welcome


async def exchange(
    session: ClientSession, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
    until: type,
) -> list[Event]:  # fmt: skip
    """Send what the session has to say; take events until one of type ``until``."""
    got: list[Event] = []
    writer.write(session.data_to_send())
    while True:
        event = session.next_event()
        if event is None:
            data = await reader.read(1 << 20)
            assert data, f"the hub closed the connection; got {got[-3:]}"
            session.receive_data(data)
            continue
        assert not isinstance(event, Breach), event
        got.append(event)
        writer.write(session.data_to_send())
        if isinstance(event, until):
            return got


async def bounded(coro: Coroutine[Any, Any, T]) -> T:
    async with asyncio.timeout(ROUND_TIMEOUT):
        return await coro


@dataclass(frozen=True)
class Plan:
    pieces: int  # pieces sent before waiting for acknowledgements
    wait_fraction: float  # of the events they hold, acknowledged before going on
    extra: int  # pieces sent right before the kill
    on_latest: bool  # kill on the first LATEST after those (if one is still to come)


@dataclass
class Outcome:
    acknowledged: list[int] = field(default_factory=list)  # every LATEST / COMMITTED MANY id
    completed: bool = False
    killed: bool = False


async def stream_and_kill(hub: Served, ids: list[int], plan: Plan) -> Outcome:
    """SAVE MANY ``ids`` in pieces of 64 KiB: send ``plan.pieces``, wait until the hub said
    LATEST for a ``plan.wait_fraction`` of the events they hold (at least one LATEST), send
    ``plan.extra`` more pieces at once and SIGKILL the hub, then or on the next LATEST
    (STREAMED MANY is never sent); record every acknowledgement received until the socket
    dies."""
    session, reader, writer, _ = await open_session(hub.url)
    session.save_many([(i, value(i)) for i in ids])
    stream = memoryview(session.data_to_send())
    pieces = [stream[offset : offset + PIECE] for offset in range(0, len(stream), PIECE)]
    assert plan.pieces + plan.extra < len(pieces) - 1
    # The events wholly inside the first plan.pieces pieces.
    header = len(b"SAVE MANY %d %d %d\n" % (len(ids), ids[0], ids[-1]))
    sizes = (len(b"EVENT %d %d\n\n\n" % (i, len(value(i)))) + len(value(i)) for i in ids)
    ends = [header + end for end in accumulate(sizes)]  # where each event's bytes end
    whole = bisect_right(ends, plan.pieces * PIECE)
    target = ids[max(0, int(whole * plan.wait_fraction) - 1)]
    last_whole = ids[bisect_right(ends, (plan.pieces + plan.extra) * PIECE) - 1]
    out = Outcome()
    acked = asyncio.Event()
    armed: list[int] = []  # kill on a LATEST once more than these many came

    def kill() -> None:
        hub.proc.send_signal(signal.SIGKILL)
        out.killed = True

    async def send() -> None:
        for piece in pieces[: plan.pieces]:
            writer.write(piece)
            await writer.drain()
        while not (out.acknowledged and out.acknowledged[-1] >= target):
            await acked.wait()
            acked.clear()
        for piece in pieces[plan.pieces : plan.pieces + plan.extra]:
            writer.write(piece)
            await writer.drain()
        if plan.on_latest and out.acknowledged[-1] < last_whole:
            armed.append(len(out.acknowledged))  # a LATEST is still to come
        else:
            kill()

    async def receive() -> None:
        while True:
            try:
                data = await reader.read(1 << 16)
            except (ConnectionError, OSError):
                return
            if not data:
                return
            session.receive_data(data)
            while (event := session.next_event()) is not None:
                assert not isinstance(event, Breach), event  # incl. a decreasing LATEST
                if isinstance(event, Latest):
                    out.acknowledged.append(event.id)
                    acked.set()
                    if armed and len(out.acknowledged) > armed[0] and not out.killed:
                        kill()
                elif isinstance(event, CommittedMany):
                    out.acknowledged.append(event.end)
                    out.completed = True

    sender = asyncio.create_task(send())
    try:
        await receive()  # until the hub dies
        await sender
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
    assert out.killed, "the hub went away before the kill"
    return out


async def read_everything(url: str) -> tuple[Welcome, list[tuple[int, bytes]]]:
    session, reader, writer, welcome = await open_session(url)
    try:
        session.read(1, 2**64 - 1)
        got = await exchange(session, reader, writer, Sent)
    finally:
        writer.close()
    events = [(e.id, e.data) for e in got if isinstance(e, ManyEvent)]
    sent = got[-1]
    assert isinstance(sent, Sent)
    assert sent.count == len(events)
    return welcome, events


@pytest.mark.timeout(120)
def test_acknowledged_seguro_events_survive_sigkill(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    data_dir = tmp_path / "data"
    log = tmp_path / "serve.err"
    sent_ids: list[int] = []  # every id the ship sent, all rounds, in order
    acknowledged = 0
    next_id = 1
    for round_no in range(ROUNDS):
        ids = [next_id + 3 * i + rng.randint(0, 2) for i in range(EVENTS_PER_ROUND)]
        extra = rng.choice([0, 1, 2, 4, 8, 16, 32])
        plan = Plan(rng.randint(1, 250), rng.random(), extra, rng.random() < 0.5)
        with serving(data_dir, log) as hub:
            outcome = asyncio.run(bounded(stream_and_kill(hub, ids, plan)))
            assert hub.proc.wait(timeout=30) == -signal.SIGKILL
        assert not outcome.completed, "STREAMED MANY was never sent"
        assert outcome.acknowledged, outcome
        assert outcome.acknowledged == sorted(outcome.acknowledged)
        acknowledged = max(acknowledged, *outcome.acknowledged)
        sent_ids += ids

        with serving(data_dir, log) as hub:
            welcome, events = asyncio.run(bounded(read_everything(hub.url)))
            hub.proc.send_signal(signal.SIGTERM)
            assert hub.proc.wait(timeout=30) == 0, log.read_text(errors="replace")
        context = (
            f"round {round_no} (seed {SEED}): {plan}, killed after LATEST "
            f"{outcome.acknowledged[-1]}"
        )
        assert welcome.latest is not None, context
        assert welcome.latest >= acknowledged, f"{context}: acknowledged events lost"
        assert events, context
        assert events[-1][0] == welcome.latest, context
        expected = [(i, value(i)) for i in sent_ids if i <= welcome.latest]
        assert len(events) == len(expected), f"{context}: a hole, or events nobody sent"
        for got, want in zip(events, expected, strict=True):
            assert got == want, f"{context}: event {want[0]} differs"
        # What was sent and not stored is gone: the next round starts above WELCOME's id.
        sent_ids = [i for i in sent_ids if i <= welcome.latest]
        next_id = welcome.latest + 1 + rng.randint(0, 5)

    # After all that, the hub takes a whole SAVE MANY and a SAVE and serves them back.
    async def finish(url: str) -> None:
        session, reader, writer, welcome = await open_session(url)
        try:
            assert welcome.latest == sent_ids[-1]
            session.save_many([(next_id, b"one"), (next_id + 1, b"")])
            await exchange(session, reader, writer, CommittedMany)
            session.save(next_id + 5, b"\n\n")
            await exchange(session, reader, writer, Committed)
            session.read(sent_ids[-1], 10)
            got = await exchange(session, reader, writer, Sent)
            assert [(e.id, e.data) for e in got if isinstance(e, ManyEvent)] == [
                (sent_ids[-1], value(sent_ids[-1])),
                (next_id, b"one"),
                (next_id + 1, b""),
                (next_id + 5, b"\n\n"),
            ]
        finally:
            writer.close()

    with serving(data_dir, log) as hub:
        asyncio.run(bounded(finish(hub.url)))
        hub.proc.send_signal(signal.SIGTERM)
        assert hub.proc.wait(timeout=30) == 0
