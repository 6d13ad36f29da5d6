"""Benchmark: reliable, acked messages over Tolliver through the hub, against NATS JetStream.

Run ``.venv/bin/python benchmarks/tolliver_reliable.py`` (a few minutes) or add ``--quick``
(under a minute: fewer messages and rounds). ``--dir`` picks where the temporary directories go
(default: ``/tmp`` unless it is a RAM file system, then the working directory: fsync must reach
a disk). First it runs ``benchmarks/peers.sh``, which installs what is missing: Debian's
``nats-server`` and, into the venv, ``nats-py`` (``--no-install`` skips it).

One figure, ``reliable_100B``: messages/s of 100 B bodies from one sender to one receiver through
a broker on 127.0.0.1, every message acked to the sender once the broker has stored it, and
acked to the broker by the receiver. Sender and receiver run in this process, on one event loop
(uvloop when installed); the broker is a process of its own.

- tidewire: ``tidewire serve`` (``log.fsync=true``) as a subprocess, fresh data directory per
  round. A receiver :class:`tidewire.tolliver.Instance` subscribes to the channel and connects
  to the hub's Tolliver port; a sender ``Instance`` connects after it (the hub, subscribed to
  every channel a remote wants, tells it so in the handshake). The sender sends ``SEND_CHUNK``
  messages with one ``inst.send_many(channel, "", bodies)`` (it returns once they are committed
  to the sender's SQLite store and written to the socket), then the next chunk, keeping at most
  ``WINDOW`` messages unacked by the hub (``inst.store.unacked()``; it waits for room with
  ``inst.unacked_at_most(WINDOW - SEND_CHUNK)``, woken by the commit of the acks). The hub
  appends the messages to the stream named after the channel and acks each once durable; it
  delivers the stream's events to the receiver as reliable messages; the receiver reads them
  with ``inst.batches()``, which acks a list once the next is asked for. The clock stops when
  the receiver has all N distinct messages (a sequence number in the body; repeats are counted
  apart) AND the sender's store holds 0 unacked messages.
- JetStream: Debian's ``nats-server -js`` (config file: ``jetstream { store_dir }`` in a fresh
  directory on the same disk) per round; a file-storage stream with one subject. nats-py, two
  connections: the sender publishes with ``js.publish_async`` (at most ``WINDOW`` PubAcks
  pending, nats-py's own semaphore) and gathers every PubAck future; the receiver is a durable
  push consumer (``js.subscribe`` with a callback, explicit acks), acking every message (a pull
  consumer, ``fetch`` of 256, was slower: 14 k against 20 k messages/s in one test). The clock
  stops when every PubAck has arrived AND the receiver has all N distinct messages.

Before the clock starts each round sends ``WARMUP`` messages through the whole path and waits for
all of them. Sides alternate (tidewire first in odd rounds, JetStream first in even ones) for 3
rounds (2 with ``--quick``); each side's best round is reported (the machine is shared; the
best round is the least disturbed one). Before each round: ``os.sync()`` and 0.5 s of rest.

Durability differs: the hub fsyncs every commit before it acks (group commit), and the sender
Instance's SQLite store commits its new messages and acks (``synchronous=FULL``); nats-server
2.9 (Debian's) has no per-message fsync setting: its file store syncs every 2 minutes, so a
PubAck means "written to the OS", not "on disk".

Output: exactly one JSON line per figure on stdout (progress goes to stderr), with the fields of
``log_append.py`` (``tidewire``, ``baseline``, ``baseline_value``, ``ratio``, ``goal``,
``goal_ratio``, ``meets_goal``, ``tidewire_rounds``, ``baseline_rounds``) plus ``rounds``,
``body_bytes``, ``tidewire_messages`` / ``baseline_messages`` (per round) and
``tidewire_repeats`` / ``baseline_repeats`` (repeated deliveries seen in each side's rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from _common import (
    RAM_FILE_SYSTEMS,
    LinePump,
    Processes,
    choose_base,
    distribution_version,
    fresh_dir,
    fs_type,
    loop_factory,
    module,
    note,
)
from tidewire.tolliver import Instance

HERE = os.path.dirname(os.path.abspath(__file__))
CHANNEL = "bench.reliable"
NATS_STREAM = "BENCH"
NATS_SUBJECT = "bench.reliable"
BODY_BYTES = 100
WINDOW = 1000  # messages unacked by the broker, at most (both sides)
SEND_CHUNK = 250  # tidewire: messages per send_many (one store commit, one write)
PUSH_PENDING = 65_536  # JetStream: messages the push subscription may buffer
WARMUP = 200
POLL_S = 0.002  # tidewire: how often the round looks whether the hub subscribed (setup)
GOAL_RATIO = 3.0
ROUND_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int
    tidewire_messages: int
    nats_messages: int


FULL = Settings(rounds=3, tidewire_messages=60_000, nats_messages=60_000)
QUICK = Settings(rounds=2, tidewire_messages=15_000, nats_messages=15_000)


# --------------------------------------------------------------------------- places


# --------------------------------------------------------------------------- processes


def install_peers() -> None:
    subprocess.run(["bash", os.path.join(HERE, "peers.sh"), sys.executable], check=True)


def start_tidewire(procs: Processes, data_dir: str) -> tuple[str, int, subprocess.Popen[str]]:
    proc = procs.start(
        [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", data_dir,
         "--host", "127.0.0.1", "--http-port", "0", "--set", "log.fsync=true"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TIDEWIRE_RSIO_PORT": "0", "TIDEWIRE_SEGURO_PORT": "0",
             "TIDEWIRE_TOLLIVER_PORT": "0"},
    )  # fmt: skip
    pump = LinePump(proc.stdout)
    match = pump.wait_for(r"tolliver://([\d.]+):(\d+)", proc, 60)
    pump.wait_for(r"^ready", proc, 60)
    return match.group(1), int(match.group(2)), proc


def start_nats_server(procs: Processes, directory: str) -> tuple[str, str, subprocess.Popen[str]]:
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    config = os.path.join(directory, "nats.conf")
    store = os.path.join(directory, "jetstream")
    with open(config, "w", encoding="utf-8") as f:
        f.write("host: 127.0.0.1\nport: -1\n")
        f.write(f"jetstream {{\n  store_dir: {json.dumps(store)}\n}}\n")
    proc = procs.start(
        [binary, "-js", "-c", config], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    pump = LinePump(proc.stderr)
    version = pump.wait_for(r"Version:\s+(\S+)", proc, 30).group(1)
    port = pump.wait_for(r"Listening for client connections on [\d.]+:(\d+)", proc, 30).group(1)
    pump.wait_for(r"Server is ready", proc, 30)
    return f"nats://127.0.0.1:{port}", version, proc


# --------------------------------------------------------------------------- counting


@dataclass(slots=True)
class Tally:
    """Distinct messages received (by the sequence number in the first 8 bytes of a body)."""

    target: int = 0
    distinct: int = 0
    repeats: int = 0
    seen: bytearray = field(default_factory=bytearray)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def expect(self, target: int) -> None:
        self.target, self.distinct, self.repeats = target, 0, 0
        self.seen = bytearray(target)
        self.done.clear()

    def add(self, body: bytes) -> None:
        seq = int.from_bytes(body[:8], "big")
        if seq >= len(self.seen):
            return  # a late repeat from the warm-up
        if self.seen[seq]:
            self.repeats += 1
            return
        self.seen[seq] = 1
        self.distinct += 1
        if self.distinct >= self.target:
            self.done.set()


def bodies(n: int) -> list[bytes]:
    pad = os.urandom(BODY_BYTES - 8)
    return [i.to_bytes(8, "big") + pad for i in range(n)]


@dataclass(frozen=True, slots=True)
class Measurement:
    messages: int
    seconds: float
    repeats: int

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds


async def poll_until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds, looking every ``POLL_S`` (bound it with
    ``asyncio.timeout``): the Instance has no event for "every message acked"."""
    while True:
        if condition():
            return
        await asyncio.sleep(POLL_S)


# --------------------------------------------------------------------------- tidewire


async def tidewire_round(host: str, port: int, directory: str, n: int) -> Measurement:
    receiver = Instance(os.path.join(directory, "receiver.sqlite"))
    sender = Instance(os.path.join(directory, "sender.sqlite"))
    tally = Tally()
    reader: asyncio.Task[None] | None = None
    try:
        receiver.subscribe(CHANNEL)
        async with asyncio.timeout(30):
            await receiver.connect(host, port)
            await sender.connect(host, port)

        def hub_subscribed() -> bool:
            return any(
                (CHANNEL, "") in link.conn.peer_subscriptions for link in sender.links.values()
            )

        async with asyncio.timeout(30):
            await poll_until(hub_subscribed)

        async def read() -> None:
            async for deliveries in receiver.batches():
                for delivery in deliveries:
                    tally.add(delivery.body)

        reader = asyncio.create_task(read())

        async def send_all(messages: list[bytes]) -> None:
            for i in range(0, len(messages), SEND_CHUNK):
                chunk = messages[i : i + SEND_CHUNK]
                # the window: woken by the store's commit of the acks that make room
                await sender.unacked_at_most(WINDOW - len(chunk))
                # one store commit and one write for the chunk
                await sender.send_many(CHANNEL, "", chunk)

        async def exchange(messages: list[bytes]) -> None:
            tally.expect(len(messages))
            await send_all(messages)
            async with asyncio.timeout(ROUND_TIMEOUT_S):
                await tally.done.wait()
                await sender.unacked_at_most(0)

        await exchange(bodies(WARMUP))
        messages = bodies(n)
        start = time.perf_counter()
        await exchange(messages)
        seconds = time.perf_counter() - start
        return Measurement(n, seconds, tally.repeats)
    finally:
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        await sender.close()
        await receiver.close()


# --------------------------------------------------------------------------- JetStream


async def nats_round(url: str, n: int) -> Measurement:
    nats = module("nats")
    api = module("nats.js.api")
    pub = await nats.connect(url)
    sub = await nats.connect(url)
    tally = Tally()
    consumer: Any = None
    try:
        js = pub.jetstream(publish_async_max_pending=WINDOW)
        await js.add_stream(name=NATS_STREAM, subjects=[NATS_SUBJECT], storage=api.StorageType.FILE)

        async def on_message(msg: Any) -> None:
            tally.add(msg.data)
            await msg.ack()

        consumer = await sub.jetstream().subscribe(
            NATS_SUBJECT,
            durable="receiver",
            stream=NATS_STREAM,
            cb=on_message,
            manual_ack=True,
            pending_msgs_limit=PUSH_PENDING,
            config=api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT),
        )

        async def exchange(messages: list[bytes]) -> None:
            tally.expect(len(messages))
            futures = [await js.publish_async(NATS_SUBJECT, body) for body in messages]
            async with asyncio.timeout(ROUND_TIMEOUT_S):
                await asyncio.gather(*futures)  # every PubAck (raises if one failed)
                await tally.done.wait()

        await exchange(bodies(WARMUP))
        messages = bodies(n)
        start = time.perf_counter()
        await exchange(messages)
        seconds = time.perf_counter() - start
        return Measurement(n, seconds, tally.repeats)
    finally:
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.unsubscribe()
        await pub.close()
        await sub.close()


# --------------------------------------------------------------------------- the run


@dataclass(slots=True)
class Side:
    name: str
    run: Callable[[], Measurement]
    rounds: list[Measurement] = field(default_factory=list)

    def best(self) -> Measurement:
        return max(self.rounds, key=lambda m: m.per_s)


STOP = threading.Event()


def on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM: stop as Ctrl-C does (``asyncio.Runner`` cancels the running round)."""
    STOP.set()
    os.kill(os.getpid(), signal.SIGINT)


def settle() -> None:
    """Let what the previous round removed reach the disk before the next round starts."""
    os.sync()
    time.sleep(0.5)


def run(settings: Settings, base: str) -> dict[str, Any]:
    procs = Processes()
    factory, loop_name = loop_factory()
    versions: dict[str, str] = {}
    with asyncio.Runner(loop_factory=factory) as runner:

        def in_loop(make: Callable[[], Awaitable[Measurement]]) -> Measurement:
            async def go() -> Measurement:
                return await make()

            return runner.run(go())

        def tidewire_side() -> Measurement:
            settle()
            with fresh_dir(base, "tidewire-tolliver-bench-") as directory:
                host, port, proc = start_tidewire(procs, os.path.join(directory, "hub"))
                try:
                    return in_loop(
                        lambda: tidewire_round(host, port, directory, settings.tidewire_messages)
                    )
                finally:
                    code = procs.stop(proc)
                    if code != 0:
                        note(f"warning: tidewire serve exited {code}")

        def nats_side() -> Measurement:
            settle()
            with fresh_dir(base, "tidewire-jetstream-bench-") as directory:
                url, version, proc = start_nats_server(procs, directory)
                versions["nats-server"] = version
                try:
                    return in_loop(lambda: nats_round(url, settings.nats_messages))
                finally:
                    procs.stop(proc)

        sides = [Side("tidewire", tidewire_side), Side("jetstream", nats_side)]
        note(f"  client loop {loop_name}; window {WINDOW}; {BODY_BYTES} B bodies")
        try:
            for r in range(settings.rounds):
                for side in sides if r % 2 == 0 else list(reversed(sides)):
                    if STOP.is_set():
                        raise KeyboardInterrupt
                    m = side.run()
                    side.rounds.append(m)
                    note(
                        f"  round {r + 1} {side.name:<9} {m.per_s:>10,.0f} messages/s "
                        f"({m.messages:,} in {m.seconds:.2f} s, {m.repeats} repeats)"
                    )
        finally:
            procs.stop_all()
    tw, base_side = sides
    ratio = tw.best().per_s / base_side.best().per_s
    return {
        "benchmark": "tolliver_reliable",
        "figure": "reliable_100B",
        "unit": "messages/s",
        "tidewire": round(tw.best().per_s, 1),
        "baseline": (
            f"nats-py {distribution_version('nats-py')} JetStream publish_async "
            f"(window {WINDOW}) + push consumer, explicit acks, nats-server "
            f"{versions.get('nats-server', '?')} file storage"
        ),
        "baseline_value": round(base_side.best().per_s, 1),
        "ratio": round(ratio, 3 if ratio < 1 else 2),
        "goal": f"ratio >= {GOAL_RATIO}",
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio >= GOAL_RATIO,
        "rounds": settings.rounds,
        "body_bytes": BODY_BYTES,
        "tidewire_messages": settings.tidewire_messages,
        "baseline_messages": settings.nats_messages,
        "tidewire_rounds": [round(m.per_s, 1) for m in tw.rounds],
        "baseline_rounds": [round(m.per_s, 1) for m in base_side.rounds],
        "tidewire_repeats": [m.repeats for m in tw.rounds],
        "baseline_repeats": [m.repeats for m in base_side.rounds],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer messages and rounds (< 1 min)")
    parser.add_argument("--dir", help="where to create temporary directories (default: /tmp)")
    parser.add_argument("--no-install", action="store_true", help="do not run peers.sh first")
    parser.add_argument("--messages", type=int, help="messages per tidewire round (override)")
    parser.add_argument("--nats-messages", type=int, help="messages per JetStream round")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.messages or args.nats_messages:
        settings = Settings(
            settings.rounds,
            args.messages or settings.tidewire_messages,
            args.nats_messages or settings.nats_messages,
        )
    base = choose_base(args.dir)
    kind = fs_type(base)
    if kind in RAM_FILE_SYSTEMS:
        note(f"warning: {base} is {kind}, not a disk: fsync costs nothing there")
    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.perf_counter()
    if not args.no_install:
        install_peers()
    note(
        f"tolliver_reliable: {'quick' if args.quick else 'full'} run, {settings.rounds} rounds, "
        f"temp dirs in {base} ({kind})"
    )
    try:
        line = run(settings, base)
    except KeyboardInterrupt:
        note("tolliver_reliable: interrupted")
        return 130
    print(json.dumps(line), flush=True)
    note(f"tolliver_reliable: done in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
