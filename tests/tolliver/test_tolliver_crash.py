"""Crash tests of Tolliver through the hub, with real processes: a ``tidewire serve`` hub and
instances in child processes (tests/tolliver/tolliver_child.py), each with its own SQLite
file, SIGKILLed and restarted on the same files (so with the same UUIDs).

* A receiver killed in the middle of a burst of reliable messages, then restarted: the hub
  resumes where the receiver's acks stopped and sends it the rest; no message may be lost
  (duplicates are allowed: at-least-once).
* A sender killed right after ``send`` returned for messages the hub never acked (the hub is
  stopped with SIGSTOP, then SIGKILLed): both restart on their files, and the sender's unacked
  messages reach the hub's stream once it reconnects.

Every wait polls with a deadline; every process is killed in ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit

import pytest

import tidewire
from tidewire.protocols.tolliver import matches
from tidewire.tolliver import Instance, Store

CHILD = Path(__file__).with_name("tolliver_child.py")
CHANNEL = "burst"
N = 500  # messages in the receiver's burst
KILL_AT = 40  # the receiver is killed once it has recorded this many
WORK_S = 0.01  # the killed receiver's work per message (its application is slower than the hub)
TIMEOUT = 20.0
POLL = 0.005
T = TypeVar("T")


def body(i: int) -> bytes:
    return b"m%05d" % i  # as tests/tolliver/tolliver_child.py sends them


def bounded(coro: Coroutine[Any, Any, T]) -> T:
    async def run() -> T:
        async with asyncio.timeout(TIMEOUT):
            return await coro

    return asyncio.run(run())


def wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL)


class Lines:
    """The lines a process prints, read by a thread (so a wait has a deadline)."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            for line in stream:
                self._queue.put(line.rstrip("\n"))
            self._queue.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def expect(self, prefix: str, timeout: float = TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no line starting with {prefix!r} within {timeout} s: {self.seen}")


@dataclass
class Proc:
    proc: subprocess.Popen[str]
    lines: Lines
    stderr: Path

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str) -> str:
        try:
            return self.lines.expect(prefix)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstderr:\n{self.stderr.read_text()}") from None

    def kill(self) -> None:
        """SIGKILL, and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)


@contextmanager
def started(args: list[str], stderr: Path, env: dict[str, str] | None = None) -> Iterator[Proc]:
    with open(stderr, "a") as err:
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True, env={**os.environ, **(env or {})})  # fmt: skip
    assert proc.stdout is not None
    try:
        yield Proc(proc, Lines(proc.stdout), stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=TIMEOUT)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


@dataclass
class Served:
    proc: Proc
    host: str
    port: int  # Tolliver
    rsio: str
    streams: str  # http://.../streams
    lines: list[str] = field(default_factory=list)


@contextmanager
def serving(data_dir: Path, stderr: Path) -> Iterator[Served]:
    """``tidewire serve`` on ``data_dir``, every listener on a free port of 127.0.0.1."""
    env = {"TIDEWIRE_RSIO_PORT": "0", "TIDEWIRE_SEGURO_PORT": "0", "TIDEWIRE_TOLLIVER_PORT": "0"}
    args = [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", str(data_dir),
            "--http-port", "0", "--host", "127.0.0.1"]  # fmt: skip
    with started(args, stderr, env) as proc:
        proc.expect("ready")
        words = [w for line in proc.lines.seen for w in line.split()]
        tolliver = urlsplit(next(w for w in words if w.startswith("tolliver://")))
        assert tolliver.hostname == "127.0.0.1"
        assert tolliver.port is not None
        rsio = next(w for w in words if w.startswith("rsio://"))
        streams = next(w for w in words if w.startswith("http://") and w.endswith("/streams"))
        yield Served(proc, tolliver.hostname, tolliver.port, rsio, streams, proc.lines.seen)


def child(mode: str, db: Path, hub: Served, *rest: str) -> list[str]:
    return [sys.executable, str(CHILD), mode, str(db), hub.host, str(hub.port), CHANNEL, *rest]


def records(path: Path) -> list[bytes]:
    """The bodies a receiver child recorded (a line cut by the kill is left out)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1].splitlines()


def stream_events(hub: Served, stream: str) -> int:
    with urllib.request.urlopen(hub.streams, timeout=TIMEOUT) as response:
        found = [s["events"] for s in json.load(response) if s["name"] == stream]
    return int(found[0]) if found else 0


async def read_stream(url: str, stream: str, done: Callable[[list[bytes]], bool]) -> list[bytes]:
    """The bodies of ``stream``, in stream order, read over RS.io until ``done`` says so."""
    values: list[bytes] = []
    async with await tidewire.connect(url) as client:
        async for batch in client.subscribe(stream):
            values += [e.value for e in batch]
            if done(values):
                break
    return values


async def hub_subscription(instance: Instance, hub: uuid.UUID) -> None:
    """Until the hub subscribes to CHANNEL on ``instance``'s connection (sends go to it)."""
    while not (  # noqa: ASYNC110 - polling connection state; bounded by the caller's timeout
        (link := instance.links.get(hub)) is not None
        and matches(link.conn.peer_subscriptions, CHANNEL, "")
    ):
        await asyncio.sleep(POLL)


# ---------------------------------------------------------------------------- a. the receiver


@dataclass
class ReceiverCrash:
    first: uuid.UUID  # the receiver's UUID, before and after the restart
    again: uuid.UUID
    before: list[bytes]  # recorded before the kill
    after: list[bytes]  # recorded after the restart (ends with b"end")
    stream: list[bytes]  # the hub's stream, in order


@pytest.fixture(scope="module")
def receiver_crash(tmp_path_factory: pytest.TempPathFactory) -> ReceiverCrash:
    """A receiver child (subscribed to CHANNEL, connected to the hub) records what it gets; the
    test's sender sends N reliable messages through the hub; the receiver, whose application
    takes WORK_S per message, is SIGKILLed once it has recorded KILL_AT of them (the whole burst
    is at the hub by then: it has acked every one to the sender) and restarted on the same file.
    A last message, b"end", then goes through the hub: the restarted receiver gets it after
    everything the hub resends (the hub delivers a stream in order), so once it is recorded the
    run is over.

    WORK_S makes the receiver's application lag behind the network, as a real one doing work
    would: deliveries then wait in the instance's inbox when the kill comes, which is what
    test_a_killed_receiver_loses_no_message is about (with no work at all the application keeps
    up, the inbox is nearly always empty, and a loss is left to chance)."""
    tmp = tmp_path_factory.mktemp("receiver_crash")
    first_record, second_record = tmp / "first.txt", tmp / "second.txt"
    with serving(tmp / "hub", tmp / "hub.err") as hub:
        args = child("receive", tmp / "receiver.db", hub, str(first_record), str(WORK_S))
        with started(args, tmp / "receiver.err") as receiver:
            first = uuid.UUID(receiver.expect("READY").split()[1])

            async def burst() -> None:
                sender = Instance(str(tmp / "sender.db"), resend_interval=0.2)
                try:
                    hub_id = await sender.connect(hub.host, hub.port)
                    await hub_subscription(sender, hub_id)
                    for start in range(0, N, 50):  # concurrent sends: the store commits in groups
                        await asyncio.gather(*(sender.send(CHANNEL, "", body(i))
                                               for i in range(start, start + 50)))  # fmt: skip
                    while sender.store.unacked():  # noqa: ASYNC110 - bounded by TIMEOUT
                        await asyncio.sleep(POLL)  # every message is in the hub's stream
                finally:
                    await sender.close()

            bounded(burst())
            wait_for(lambda: len(records(first_record)) >= KILL_AT, "the first records")
            receiver.kill()
        before = records(first_record)
        assert len(before) < N, "the receiver was to be killed in the middle of the burst"

        with started(child("receive", tmp / "receiver.db", hub, str(second_record)),
                     tmp / "receiver.err") as receiver:  # fmt: skip
            again = uuid.UUID(receiver.expect("READY").split()[1])

            async def end() -> None:
                sender = Instance(str(tmp / "sender.db"), resend_interval=0.2)
                try:
                    await hub_subscription(sender, await sender.connect(hub.host, hub.port))
                    await sender.send(CHANNEL, "", b"end")
                    while sender.store.unacked():  # noqa: ASYNC110 - bounded by TIMEOUT
                        await asyncio.sleep(POLL)
                finally:
                    await sender.close()

            bounded(end())
            wait_for(lambda: b"end" in records(second_record), "b'end' at the restarted receiver")
        stream = bounded(read_stream(hub.rsio, CHANNEL, lambda values: b"end" in values))
    return ReceiverCrash(first, again, before, records(second_record), stream)


def test_a_killed_receiver_restarts_with_its_uuid_and_the_hub_resends_from_its_offset(
    receiver_crash: ReceiverCrash,
) -> None:
    run = receiver_crash
    assert run.again == run.first  # the UUID lives in the receiver's SQLite file
    assert set(run.stream) == {body(i) for i in range(N)} | {b"end"}
    assert set(run.before) <= set(run.stream)
    assert run.after[-1] == b"end"
    # The hub resumes at one point of the stream (the receiver's offset: everything before it
    # was acked) and sends the restarted receiver everything from there on.
    resume = min(run.stream.index(b) for b in run.after)
    missing = set(run.stream[resume:]) - set(run.after)
    assert not missing, f"resumed at {resume} of the stream, yet never got {sorted(missing)}"


def test_a_killed_receiver_loses_no_message(receiver_crash: ReceiverCrash) -> None:
    run = receiver_crash
    lost = {body(i) for i in range(N)} - set(run.before) - set(run.after)
    assert not lost, (f"{len(lost)} of {N} messages never recorded (from {min(lost)!r} to "
                      f"{max(lost)!r}); recorded {len(run.before)} before the kill, then "
                      f"{len(run.after) - 1} after the restart")  # fmt: skip


# ---------------------------------------------------------------------------- b. the sender


def test_a_sender_killed_with_unacked_messages_delivers_them_after_both_restart(
    tmp_path: Path,
) -> None:
    """The sender child sends 50 messages, acked by the hub; the hub is stopped (SIGSTOP: it
    can neither store nor ack), the sender sends 50 more and is SIGKILLed as soon as ``send``
    has returned for the last one; the hub is SIGKILLed. The sender's store then holds 50
    unacked messages, and the hub's stream only the first 50. Both restart on their files; once
    the sender has reconnected, every one of the 100 is in the hub's stream (at least once)."""
    sender_db, first, second = tmp_path / "sender.db", 50, 100
    with serving(tmp_path / "hub", tmp_path / "hub.err") as hub:

        async def subscribe_hub() -> None:
            """A subscriber connects once: from then on the hub wants CHANNEL."""
            subscriber = Instance(str(tmp_path / "subscriber.db"))
            subscriber.subscribe(CHANNEL)
            try:
                await subscriber.connect(hub.host, hub.port)
            finally:
                await subscriber.close()

        bounded(subscribe_hub())
        with started(child("send", sender_db, hub), tmp_path / "sender.err") as sender:
            _, sender_id, hub_id = sender.expect("READY").split()
            sender.command("subscribed")
            sender.expect("SUBSCRIBED")
            sender.command(f"send 0 {first}")
            sender.expect(f"SENT {first}")
            sender.command("drain")
            sender.expect("DRAINED")  # the hub acked them: they are in its stream
            os.kill(hub.proc.proc.pid, signal.SIGSTOP)
            sender.command(f"send {first} {second}")
            assert sender.expect(f"SENT {second}").split()[2] == str(second - first)
            sender.kill()  # right after send() returned
        hub.proc.kill()  # SIGKILL, while it is stopped: it never read the last 50

    store = Store.open(str(sender_db))
    try:
        assert str(store.instance) == sender_id
        assert store.unacked() == second - first  # on disk, awaiting the hub's ack
        assert sorted(b for *_, b in store.pending_for(uuid.UUID(hub_id))) == [
            body(i) for i in range(first, second)
        ]
    finally:
        store.close()

    with serving(tmp_path / "hub", tmp_path / "hub.err") as hub:
        stored = stream_events(hub, CHANNEL)
        before = bounded(read_stream(hub.rsio, CHANNEL, lambda values: len(values) >= stored))
        assert set(before) == {body(i) for i in range(first)}  # none of the unacked ones
        with started(child("send", sender_db, hub), tmp_path / "sender.err") as sender:
            _, again, hub_again = sender.expect("READY").split()
            assert (again, hub_again) == (sender_id, hub_id)  # both kept their UUIDs
            sender.command("drain")
            sender.expect("DRAINED")  # resent at once on the reconnect, stored, acked
        wanted = {body(i) for i in range(second)}
        after = bounded(read_stream(hub.rsio, CHANNEL, lambda values: set(values) >= wanted))
        assert set(after) == wanted


# ---------------------------------------------------------------------------- c. the hub


async def offset_recorded(url: str, remote: uuid.UUID, beyond: int = 1) -> None:
    """Until the hub's state stream holds an offset of ``remote`` for CHANNEL (durably) past
    ``beyond`` (the hub keeps the offset where a remote starts at once, as ``next`` 1 here)."""

    def found(values: list[bytes]) -> bool:
        records = [json.loads(v) for v in values]
        return any(r.get("remote") == str(remote) and r.get("channel") == CHANNEL
                   and int(r.get("next", 0)) > beyond for r in records)  # fmt: skip

    await read_stream(url, "_tidewire.tolliver", found)


def test_a_restarted_hub_still_takes_messages_for_the_subscribers_it_knows(
    tmp_path: Path,
) -> None:
    """A subscriber acks a message (the hub keeps its offset) and goes away: the hub still wants
    the channel, and stores what a sender sends there for when it comes back. The hub is then
    SIGKILLed and restarted on its directory: it should want that channel still."""
    receiver_db, sender_db = str(tmp_path / "receiver.db"), str(tmp_path / "sender.db")

    async def take_one(instance: Instance) -> bytes:
        async for delivery in instance.messages():
            return delivery.body
        raise AssertionError("messages() ended")

    with serving(tmp_path / "hub", tmp_path / "hub.err") as hub:

        async def before() -> None:
            receiver, sender = Instance(receiver_db), Instance(sender_db)
            receiver.subscribe(CHANNEL)
            try:
                await receiver.connect(hub.host, hub.port)
                await hub_subscription(sender, await sender.connect(hub.host, hub.port))
                await sender.send(CHANNEL, "", b"one")
                assert await take_one(receiver) == b"one"
                await offset_recorded(hub.rsio, receiver.instance_id)
                await receiver.close()  # away; the hub keeps wanting CHANNEL for it
                await sender.send(CHANNEL, "", b"two")
                assert sender.store.unacked() == 1  # kept for the hub until it acks
                while sender.store.unacked():  # noqa: ASYNC110 - bounded by TIMEOUT
                    await asyncio.sleep(POLL)
            finally:
                await sender.close()
                await receiver.close()

        bounded(before())
        hub.proc.kill()

    with serving(tmp_path / "hub", tmp_path / "hub.err") as hub:

        async def after() -> None:
            receiver, sender = Instance(receiver_db), Instance(sender_db)
            receiver.subscribe(CHANNEL)
            try:
                await sender.connect(hub.host, hub.port)
                await sender.send(CHANNEL, "", b"three")
                assert sender.store.unacked() == 1, "b'three' went to nobody: it is dropped"
                await receiver.connect(hub.host, hub.port)  # resumes after b"one"
                assert [await take_one(receiver) for _ in range(2)] == [b"two", b"three"]
            finally:
                await sender.close()
                await receiver.close()

        bounded(after())
