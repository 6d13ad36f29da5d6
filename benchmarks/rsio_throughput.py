"""Benchmark: reading a durable tidewire stream over RS.io, against nats-py, rsocket-py, a socket.

Run ``.venv/bin/python benchmarks/rsio_throughput.py`` (1-2 minutes) or add ``--quick`` (well
under a minute: fewer elements and rounds). ``--dir`` picks where the temporary directories go
(default: ``/tmp`` unless it is a RAM file system, then the working directory: the stream is
read from real segment files). First it runs ``benchmarks/peers.sh``, which installs what is
missing: Debian's ``nats-server`` and, into the venv, ``nats-py`` and ``rsocket`` (rsocket-py).

Everything runs on 127.0.0.1, one subscriber in this process (uvloop when installed; glibc's
malloc tuned with ``tidewire.native.tune_allocator()``, as ``tidewire serve`` tunes the hub's),
each producer in its own process. What moves, per value size (16 B, 1 KiB, 64 KiB):

- tidewire: one stream per value size is filled beforehand with :class:`tidewire.log.Log`
  (appends of 1000 events, at most 1 MiB of values, each one record; written without fsync, the
  files being the same), then ``tidewire serve`` runs as a subprocess and this process reads it
  from its start with ``until_id=N`` over RS.io, in the envelope format
  (``hub.subscribe(stream, until_id=N, prefetch=P)``, counting ``len(batch)``) and, for 16 B,
  in fixed-size mode (``hub.subscribe_values(stream, until_id=N, size=16, prefetch=P)``: the
  hub packs values into ``onNextPacked`` frames). Timed from the subscribe call to the end of
  the iteration (onComplete after id N).
- nats-py: core publish -> subscribe through ``nats-server`` (started here on a free port with
  ``max_payload`` 2 MB). A publisher process publishes N messages; the subscriber here counts
  them in a ``cb``. Timed from the first message received to the last. So that none is dropped
  as a slow consumer, the subscriber reports its count on an ack subject and the publisher
  keeps at most a window (32 MiB, at most 256 k messages) ahead of it; a drop fails the run.
- rsocket-py: request-stream. A server process answers with a ``StreamFromGenerator`` of N
  payloads; the client here asks ``initial_request_n(N)`` (one large request) and counts
  ``on_next``. Both ends use ``TransportTCP`` with a 256 KiB read buffer (the default is 1 KiB).
  Timed from the request to the last payload.
- socket (64 KiB only): the loopback ceiling. A process writes N x 64 KiB into a TCP socket with
  ``sendall`` of 1 MiB chunks; this process reads with ``recv_into`` a 1 MiB buffer. Timed from
  ``accept`` to the last byte.

Each side of one value size moves a fixed number of elements per round (chosen so that a round
lasts about a second or two; rsocket-py moves fewer, being far slower; rates are compared, not
totals). Sides run in alternation (forward order in even rounds, reverse in odd ones) for 3
rounds (2 with ``--quick``); the best round of each side is reported: the machine is shared,
and the best round is the least disturbed one.

Output: exactly one JSON line per figure on stdout (progress goes to stderr), e.g.::

    {"benchmark": "rsio_throughput", "figure": "16B_envelope_vs_nats", "unit": "elements/s",
     "tidewire": 1.0, "baseline": "nats-py ...", "baseline_value": 0.2, "ratio": 5.0,
     "goal": "ratio >= 5.0", "goal_ratio": 5.0, "meets_goal": true, "rounds": 3, ...}

(one line in reality). ``tidewire`` / ``baseline_value``: the best rounds in ``unit`` (elements
per second; MB/s, 10^6 bytes of values per second, for the socket ceiling); ``ratio``:
tidewire / baseline; ``tidewire_mb_s`` / ``baseline_mb_s``: the same rounds in MB/s of values;
``tidewire_rounds`` / ``baseline_rounds``: every round, to judge the noise.

Internal: ``rsio_throughput.py --peer KIND ARGS`` runs one producer (``nats-publish``,
``rsocket-server``, ``socket-send``); the benchmark starts these itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import tidewire
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
from tidewire.log import Log, LogConfig
from tidewire.model import Batch
from tidewire.native import tune_allocator

T = TypeVar("T")

HERE = os.path.dirname(os.path.abspath(__file__))
KiB = 1024
MiB = 1024 * KiB
TIMESTAMP = 1_700_000_000_000
FILL_EVENTS = 1000  # events per append (one log record) while filling ...
FILL_MAX_BYTES = 1 * MiB  # ... at most this many bytes of values
PREFETCH_BYTES = 8 * MiB  # tidewire's prefetch, in bytes of values
NATS_WINDOW_BYTES = 32 * MiB  # how far the nats publisher may run ahead of the subscriber
NATS_WINDOW_MAX = 256 * KiB  # ... in messages
NATS_SUBJECT = "bench.data"
NATS_ACK_SUBJECT = "bench.ack"
SOCKET_CHUNK = 1 * MiB
RSOCKET_READ_BUFFER = 256 * KiB
PEER_TIMEOUT_S = 300.0  # one measurement taking longer than this is a failure


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class Counts:
    """Elements moved by each side in one round, for one value size (0: side not run)."""

    tidewire: int  # envelope format
    nats: int
    rsocket: int
    packed: int = 0  # tidewire, fixed-size mode
    socket: int = 0


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int
    counts: dict[int, Counts]  # value size -> counts


FULL = Settings(
    rounds=3,
    counts={
        16: Counts(tidewire=1_000_000, nats=400_000, rsocket=40_000, packed=8_000_000),
        1 * KiB: Counts(tidewire=300_000, nats=200_000, rsocket=40_000),
        64 * KiB: Counts(tidewire=16_384, nats=16_384, rsocket=16_384, socket=65_536),
    },
)
QUICK = Settings(
    rounds=2,
    counts={
        16: Counts(tidewire=300_000, nats=100_000, rsocket=12_000, packed=2_000_000),
        1 * KiB: Counts(tidewire=80_000, nats=60_000, rsocket=12_000),
        64 * KiB: Counts(tidewire=2_048, nats=2_048, rsocket=4_096, socket=16_384),
    },
)


def label(size: int) -> str:
    return f"{size // KiB}KiB" if size >= KiB else f"{size}B"


def stream_name(size: int) -> str:
    return f"bench-{label(size).lower()}"


def prefetch_for(size: int) -> int:
    return max(16, min(1 << 20, PREFETCH_BYTES // size))


# --------------------------------------------------------------------------- places


# --------------------------------------------------------------------------- processes


def peer_command(kind: str, *args: object) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--peer", kind, *map(str, args)]


def install_peers() -> None:
    script = os.path.join(HERE, "peers.sh")
    subprocess.run(["bash", script, sys.executable], check=True)


@dataclass(slots=True)
class NatsServer:
    url: str
    version: str
    proc: subprocess.Popen[str]


def start_nats_server(procs: Processes, directory: str) -> NatsServer:
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    config = os.path.join(directory, "nats.conf")
    with open(config, "w", encoding="utf-8") as f:
        # port -1: any free port; max_pending: the server's buffer per client connection.
        f.write("host: 127.0.0.1\nport: -1\nmax_payload: 2MB\nmax_pending: 512MB\n")
        f.write('write_deadline: "30s"\n')
    proc = procs.start([binary, "-c", config], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pump = LinePump(proc.stderr)
    version = pump.wait_for(r"Version:\s+(\S+)", proc, 30).group(1)
    port = pump.wait_for(r"Listening for client connections on [\d.]+:(\d+)", proc, 30).group(1)
    pump.wait_for(r"Server is ready", proc, 30)
    return NatsServer(f"nats://127.0.0.1:{port}", version, proc)


@dataclass(slots=True)
class TidewireServer:
    url: str
    proc: subprocess.Popen[str]


def start_tidewire(procs: Processes, data_dir: str) -> TidewireServer:
    proc = procs.start(
        [
            sys.executable,
            "-m",
            "tidewire.cli",
            "serve",
            "--data-dir",
            data_dir,
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TIDEWIRE_RSIO_PORT": "0", "TIDEWIRE_SEGURO_PORT": "0",
             "TIDEWIRE_TOLLIVER_PORT": "0"},
    )
    pump = LinePump(proc.stdout)
    url = pump.wait_for(r"(rsio://\S+)", proc, 60).group(1)
    pump.wait_for(r"^ready", proc, 60)
    return TidewireServer(url, proc)


def start_rsocket_server(procs: Processes) -> tuple[int, subprocess.Popen[str]]:
    proc = procs.start(peer_command("rsocket-server"), stdout=subprocess.PIPE)
    pump = LinePump(proc.stdout)
    port = int(pump.wait_for(r"^listening on (\d+)", proc, 60).group(1))
    return port, proc


# --------------------------------------------------------------------------- tidewire


async def fill_streams(data_dir: str, counts: dict[int, int]) -> None:
    """Append ``counts[size]`` events of each value size, as a producer would: batches of 1000
    events (at most 1 MiB of values), each one record in the log. Written without fsync (the
    files are the same; only the reads are timed), then the log is closed."""
    log = Log.open(data_dir, LogConfig(fsync=False))
    try:
        for size, n in counts.items():
            per_batch = max(1, min(FILL_EVENTS, FILL_MAX_BYTES // size))
            block = os.urandom(per_batch * size)
            values = [block[i * size : (i + 1) * size] for i in range(per_batch)]
            stream = stream_name(size)
            done = 0
            while done < n:
                take = min(per_batch, n - done)
                batch = Batch.build(stream, values[:take], timestamps=TIMESTAMP)
                await log.append(batch, assign_ids=True)
                done += take
            if log.latest(stream) != n:
                raise RuntimeError(f"{stream}: latest id {log.latest(stream)}, expected {n}")
    finally:
        await log.close()


@dataclass(frozen=True, slots=True)
class Measurement:
    elements: int
    value_bytes: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.elements / self.seconds

    @property
    def mb_s(self) -> float:
        return self.value_bytes / self.seconds / 1e6


async def tidewire_read(url: str, size: int, n: int, packed: bool) -> Measurement:
    stream = stream_name(size)
    prefetch = prefetch_for(size)
    count = 0
    async with await tidewire.connect(url) as hub:
        start = time.perf_counter()
        if packed:
            checked = False
            async for values in hub.subscribe_values(
                stream, until_id=n, size=size, prefetch=prefetch
            ):
                if not checked:  # once: the packed buffer holds whole values
                    if len(values.data) != len(values) * size:
                        raise RuntimeError("subscribe_values: data is not len(values) * size")
                    checked = True
                count += len(values)
        else:
            async for batch in hub.subscribe(stream, until_id=n, prefetch=prefetch):
                count += len(batch)
        elapsed = time.perf_counter() - start
    if count != n:
        raise RuntimeError(f"tidewire: received {count} elements, expected {n}")
    return Measurement(n, n * size, elapsed)


# --------------------------------------------------------------------------- nats


def nats_window(size: int) -> int:
    return max(16, min(NATS_WINDOW_MAX, NATS_WINDOW_BYTES // size))


async def nats_read(server: NatsServer, size: int, n: int) -> Measurement:
    nats = module("nats")
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    errors: list[str] = []
    window = nats_window(size)
    ack_every = max(1, window // 4)
    count = 0
    first = last = 0.0

    async def on_error(exc: Exception) -> None:
        errors.append(repr(exc))
        if not done.done():
            done.set_exception(RuntimeError(f"nats: {exc!r}"))

    nc = await nats.connect(server.url, error_cb=on_error, allow_reconnect=False)
    try:

        async def on_msg(msg: Any) -> None:
            nonlocal count, first, last
            count += 1
            if count == 1:
                first = time.perf_counter()
            if count % ack_every == 0 or count == n:
                await nc.publish(NATS_ACK_SUBJECT, b"%d" % count)
            if count == n:
                last = time.perf_counter()
                if not done.done():
                    done.set_result(None)

        await nc.subscribe(NATS_SUBJECT, cb=on_msg, pending_msgs_limit=0, pending_bytes_limit=0)
        await nc.flush()
        publisher = await asyncio.create_subprocess_exec(
            *peer_command("nats-publish", server.url, n, size, window)
        )
        exited = asyncio.ensure_future(publisher.wait())
        try:
            first_done = asyncio.FIRST_COMPLETED
            waiters: set[asyncio.Future[Any]] = {done, exited}
            await asyncio.wait(waiters, timeout=PEER_TIMEOUT_S, return_when=first_done)
            if not done.done():  # the publisher died, or the time is up
                state = f"exited {publisher.returncode}" if exited.done() else "still running"
                raise RuntimeError(f"nats: {count} of {n} messages received; publisher {state}")
            done.result()
            if await asyncio.wait_for(exited, 60) != 0:
                raise RuntimeError(f"nats publisher exited {publisher.returncode}")
        finally:
            if publisher.returncode is None:
                publisher.kill()
                await publisher.wait()
        await nc.flush()
        await asyncio.sleep(0.05)  # a message past N (there should be none) would show here
    finally:
        await nc.close()
    if count != n or errors:
        raise RuntimeError(f"nats: received {count} messages, expected {n}; errors: {errors}")
    return Measurement(n, n * size, last - first)


async def peer_nats_publish(url: str, n: int, size: int, window: int) -> None:
    nats = module("nats")
    nc = await nats.connect(url, allow_reconnect=False)
    acked = 0
    progressed = asyncio.Event()

    async def on_ack(msg: Any) -> None:
        nonlocal acked
        acked = max(acked, int(msg.data))
        progressed.set()

    await nc.subscribe(NATS_ACK_SUBJECT, cb=on_ack)
    await nc.flush()
    payload = os.urandom(size)
    check_every = max(1, window // 8)
    for sent in range(1, n + 1):
        await nc.publish(NATS_SUBJECT, payload)
        if sent % check_every == 0:
            while sent - acked > window:
                progressed.clear()
                await nc.flush()
                await asyncio.wait_for(progressed.wait(), PEER_TIMEOUT_S)
    await nc.flush()
    while acked < n:  # stay connected until the subscriber has everything
        progressed.clear()
        await asyncio.wait_for(progressed.wait(), PEER_TIMEOUT_S)
    await nc.close()


# --------------------------------------------------------------------------- rsocket


async def rsocket_read(port: int, size: int, n: int) -> Measurement:
    rs_payload = module("rsocket.payload")
    rs_client = module("rsocket.rsocket_client")
    rs_helpers = module("rsocket.helpers")
    rs_tcp = module("rsocket.transports.tcp")
    subscriber_mod = module("reactivestreams.subscriber")
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    count = 0
    nbytes = 0

    def on_next(payload: Any, is_complete: bool = False) -> None:
        nonlocal count, nbytes
        count += 1
        nbytes += len(payload.data)
        if is_complete and not done.done():
            done.set_result(None)

    def on_complete() -> None:
        if not done.done():
            done.set_result(None)

    def on_error(exc: Exception) -> None:
        if not done.done():
            done.set_exception(RuntimeError(f"rsocket: {exc!r}"))

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    transport = rs_tcp.TransportTCP(reader, writer, read_buffer_size=RSOCKET_READ_BUFFER)
    async with rs_client.RSocketClient(rs_helpers.single_transport_provider(transport)) as client:
        subscriber = subscriber_mod.DefaultSubscriber(
            on_next=on_next, on_complete=on_complete, on_error=on_error
        )
        start = time.perf_counter()
        request = rs_payload.Payload(b"%d %d" % (n, size))
        client.request_stream(request).initial_request_n(n).subscribe(subscriber)
        await asyncio.wait_for(done, PEER_TIMEOUT_S)
        elapsed = time.perf_counter() - start
    if count != n or nbytes != n * size:
        raise RuntimeError(f"rsocket: received {count} payloads ({nbytes} B), expected {n}")
    return Measurement(n, nbytes, elapsed)


async def peer_rsocket_server() -> None:
    rs_payload = module("rsocket.payload")
    rs_server = module("rsocket.rsocket_server")
    rs_handler = module("rsocket.request_handler")
    rs_tcp = module("rsocket.transports.tcp")
    rs_stream = module("rsocket.streams.stream_from_generator")

    async def request_stream(self: Any, request: Any) -> Any:
        n, size = (int(x) for x in bytes(request.data).split())
        data = os.urandom(size)

        def generate() -> Iterator[tuple[Any, bool]]:
            for i in range(n):
                yield rs_payload.Payload(data), i == n - 1

        return rs_stream.StreamFromGenerator(generate)

    handler = type(
        "BenchHandler", (rs_handler.BaseRequestHandler,), {"request_stream": request_stream}
    )
    servers: list[Any] = []

    def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = rs_tcp.TransportTCP(reader, writer, read_buffer_size=RSOCKET_READ_BUFFER)
        servers.append(rs_server.RSocketServer(transport, handler_factory=handler))

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


# --------------------------------------------------------------------------- plain socket


def socket_read(procs: Processes, size: int, n: int) -> Measurement:
    total = n * size
    buffer = bytearray(SOCKET_CHUNK)
    view = memoryview(buffer)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(60)
        port = listener.getsockname()[1]
        sender = procs.start(peer_command("socket-send", port, total))
        try:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(PEER_TIMEOUT_S)
                start = time.perf_counter()
                got = 0
                while got < total:
                    k = conn.recv_into(view)
                    if k == 0:
                        break
                    got += k
                elapsed = time.perf_counter() - start
            if sender.wait(timeout=60) != 0:
                raise RuntimeError(f"socket sender exited {sender.returncode}")
        finally:
            procs.stop(sender)
    if got != total:
        raise RuntimeError(f"socket: received {got} bytes, expected {total}")
    return Measurement(n, total, elapsed)


def peer_socket_send(port: int, total: int) -> None:
    chunk = memoryview(os.urandom(SOCKET_CHUNK))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        left = total
        while left > 0:
            k = min(left, SOCKET_CHUNK)
            sock.sendall(chunk[:k])
            left -= k


# --------------------------------------------------------------------------- driver


@dataclass(slots=True)
class Side:
    name: str
    run: Callable[[], Measurement]
    rounds: list[Measurement] = field(default_factory=list)

    def best(self) -> Measurement:
        return max(self.rounds, key=lambda m: m.per_s)


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    size: int
    tidewire: str  # side names
    baseline: str
    baseline_label: str
    goal_ratio: float | None
    unit: str = "elements/s"


STOP = threading.Event()  # set by SIGTERM


def on_sigterm(signum: int, frame: object) -> None:
    """Stop as Ctrl-C does (asyncio.Runner cancels the running measurement); should a peer
    library swallow that cancel, the run still stops before the next measurement."""
    STOP.set()
    os.kill(os.getpid(), signal.SIGINT)


def run_rounds(sides: list[Side], rounds: int, size: int) -> None:
    for r in range(rounds):
        for side in sides if r % 2 == 0 else list(reversed(sides)):
            if STOP.is_set():
                raise KeyboardInterrupt
            m = side.run()
            side.rounds.append(m)
            note(
                f"  {label(size)} round {r + 1} {side.name:<17} {m.per_s:>13,.0f} elements/s "
                f"{m.mb_s:>9,.1f} MB/s  ({m.elements:,} in {m.seconds:.2f} s)"
            )


def figure_line(figure: Figure, sides: dict[str, Side], rounds: int) -> dict[str, Any]:
    tw, base = sides[figure.tidewire], sides[figure.baseline]
    mb = figure.unit == "MB/s"

    def value(m: Measurement) -> float:
        return m.mb_s if mb else m.per_s

    tw_best, base_best = tw.best(), base.best()
    ratio = value(tw_best) / value(base_best)
    line: dict[str, Any] = {
        "benchmark": "rsio_throughput",
        "figure": figure.name,
        "unit": figure.unit,
        "tidewire": round(value(tw_best), 1),
        "baseline": figure.baseline_label,
        "baseline_value": round(value(base_best), 1),
        "ratio": round(ratio, 3 if ratio < 1 else 2),
        "goal": None if figure.goal_ratio is None else f"ratio >= {figure.goal_ratio}",
        "goal_ratio": figure.goal_ratio,
        "meets_goal": None if figure.goal_ratio is None else ratio >= figure.goal_ratio,
        "rounds": rounds,
        "value_bytes": figure.size,
        "tidewire_side": tw.name,
        "tidewire_mb_s": round(tw_best.mb_s, 1),
        "baseline_mb_s": round(base_best.mb_s, 1),
        "tidewire_elements": tw_best.elements,
        "baseline_elements": base_best.elements,
        "tidewire_rounds": [round(value(m), 1) for m in tw.rounds],
        "baseline_rounds": [round(value(m), 1) for m in base.rounds],
    }
    return line


def run(settings: Settings, base: str) -> list[dict[str, Any]]:
    procs = Processes()
    factory, loop_name = loop_factory()
    try:
        with (
            fresh_dir(base, "tidewire-rsio-bench-") as parent,
            asyncio.Runner(loop_factory=factory) as runner,
        ):

            def in_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> Callable[[], T]:
                return lambda: runner.run(make())

            data_dir = os.path.join(parent, "data")
            started = time.perf_counter()
            fill = {size: max(c.tidewire, c.packed) for size, c in settings.counts.items()}
            runner.run(fill_streams(data_dir, fill))
            total = sum(size * n for size, n in fill.items())
            note(f"  filled {total / MiB:,.0f} MiB in {time.perf_counter() - started:.1f} s")
            nats_server = start_nats_server(procs, parent)
            tw_server = start_tidewire(procs, data_dir)
            rsocket_port, _ = start_rsocket_server(procs)
            note(
                f"  servers: tidewire {tw_server.url}, nats-server {nats_server.version} "
                f"{nats_server.url}, rsocket-py on port {rsocket_port}; client loop {loop_name}"
            )
            nats_label = (
                f"nats-py {distribution_version('nats-py')} core pub/sub via nats-server "
                f"{nats_server.version}"
            )
            rsocket_label = f"rsocket-py {distribution_version('rsocket')} request-stream"
            lines: list[dict[str, Any]] = []
            tw_url = tw_server.url
            for size, counts in settings.counts.items():
                sides: list[Side] = []
                n_tw = counts.tidewire
                if counts.packed:
                    read = partial(tidewire_read, tw_url, size, counts.packed, packed=True)
                    sides.append(Side("tidewire-packed", in_loop(read)))
                read = partial(tidewire_read, tw_url, size, n_tw, packed=False)
                sides.append(Side("tidewire-envelope", in_loop(read)))
                sides.append(
                    Side("nats-py", in_loop(partial(nats_read, nats_server, size, counts.nats)))
                )
                sides.append(
                    Side(
                        "rsocket-py",
                        in_loop(partial(rsocket_read, rsocket_port, size, counts.rsocket)),
                    )
                )
                if counts.socket:
                    sides.append(Side("socket", partial(socket_read, procs, size, counts.socket)))
                run_rounds(sides, settings.rounds, size)
                by_name = {side.name: side for side in sides}
                for figure in figures_for(size, nats_label, rsocket_label):
                    line = figure_line(figure, by_name, settings.rounds)
                    lines.append(line)
                    print(json.dumps(line), flush=True)
            tw_exit = procs.stop(tw_server.proc)
            if tw_exit != 0:
                note(f"warning: tidewire serve exited {tw_exit}")
            return lines
    finally:
        procs.stop_all()


def figures_for(size: int, nats_label: str, rsocket_label: str) -> list[Figure]:
    if size == 16:
        return [
            Figure("16B_packed_vs_nats", 16, "tidewire-packed", "nats-py", nats_label, 5.0),
            # issue 22, row 3: 16 B envelopes >= 10x nats-py (was 5)
            Figure("16B_envelope_vs_nats", 16, "tidewire-envelope", "nats-py", nats_label, 10.0),
            Figure(
                "16B_packed_vs_rsocket", 16, "tidewire-packed", "rsocket-py", rsocket_label, 20.0
            ),
            Figure(
                "16B_envelope_vs_rsocket",
                16,
                "tidewire-envelope",
                "rsocket-py",
                rsocket_label,
                20.0,
            ),
        ]
    name = label(size)
    figures = [
        Figure(f"{name}_vs_nats", size, "tidewire-envelope", "nats-py", nats_label, None),
        Figure(f"{name}_vs_rsocket", size, "tidewire-envelope", "rsocket-py", rsocket_label, None),
    ]
    if size == 64 * KiB:
        figures.insert(
            0,
            Figure(
                f"{name}_vs_socket_ceiling",
                size,
                "tidewire-envelope",
                "socket",
                f"plain TCP socket, sendall/recv_into {SOCKET_CHUNK // MiB} MiB",
                0.7,  # issue 22, row 4 (was 0.4)
                unit="MB/s",
            ),
        )
    return figures


def run_peer(argv: list[str]) -> int:
    kind, args = argv[0], argv[1:]
    factory, _ = loop_factory()
    if kind == "socket-send":
        peer_socket_send(int(args[0]), int(args[1]))
        return 0
    with asyncio.Runner(loop_factory=factory) as runner:
        if kind == "nats-publish":
            runner.run(peer_nats_publish(args[0], int(args[1]), int(args[2]), int(args[3])))
        elif kind == "rsocket-server":
            runner.run(peer_rsocket_server())
        else:
            raise SystemExit(f"unknown peer {kind!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--peer"]:
        return run_peer(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer elements and rounds (< 1 min)")
    parser.add_argument("--dir", help="where to create temporary directories (default: /tmp)")
    parser.add_argument("--no-install", action="store_true", help="do not run peers.sh first")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    # The subscribers' process (ours, not a library's host) tunes glibc's malloc as
    # ``tidewire serve`` does: without it, each 64 KiB delivery's values column (a fresh ~1 MiB
    # block) is mmapped and page-faulted anew, ~13 faults per element (README, rsio_throughput
    # "issue 22, round 2"). The peers' processes are untouched; the socket ceiling reads into one
    # preallocated buffer either way.
    tuned = tune_allocator()
    base = choose_base(args.dir)
    kind = fs_type(base)
    if kind in RAM_FILE_SYSTEMS:
        note(f"warning: {base} is {kind}, not a disk: the stream is read from RAM files")
    # SIGTERM ends the run as Ctrl-C does (asyncio.Runner cancels the running measurement);
    # finally blocks then stop every subprocess and remove the temporary directories.
    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.perf_counter()
    if not args.no_install:
        install_peers()
    note(
        f"rsio_throughput: {'quick' if args.quick else 'full'} run, {settings.rounds} rounds, "
        f"temp dirs in {base} ({kind}); subscriber allocator tuned: {tuned}"
    )
    try:
        run(settings, base)
    except KeyboardInterrupt:
        note("rsio_throughput: interrupted")
        return 130
    note(f"rsio_throughput: done in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
