"""Benchmark: Tube over WebSocket against plain aiohttp WebSocket messages.

Run ``.venv/bin/python benchmarks/tube_throughput.py`` (about half a minute) or add ``--quick``.

Figures (MB/s of 1 MiB messages, sender in a child process, receiver in this one, both on
uvloop, over 127.0.0.1):

* ``tube_plain_1MiB``: Tube messages split into 64 KiB fragments (the receiver asked for 64 KiB),
  not compressed: the sender's :class:`tidewire.protocols.tube.Connection` splits each message
  into 17 WebSocket messages, which the sender frames and writes as the hub's ``TubeCarrier``
  does (``messages_to_send``: their heads, Tube headers and payload views in one
  ``writelines`` per 512 KiB or so, no join; issue 22), and the receiver's reassembles them
  as ``tidewire.client.tube`` does (issue 22, round 3: each message in one buffer allocated at
  its header, every fragment copied in as it comes: ``Limits(prealloc_bytes=PREALLOC_BYTES)``).
  Baseline: the same bytes as one plain aiohttp WebSocket message each (``send_bytes`` /
  ``receive``). Goal: ratio >= 0.7.
* ``tube_plain_1MiB_stream``: the same, but the receiver takes each message's fragments as
  they come (``Connection(parts=True)``: :class:`MessageReceived` parts, nothing joined), as a
  reader of a byte stream would (RS.io over Tube is one); lengths are still counted whole.
  Against the same baseline; no goal (the goal stays on whole messages).
* ``tube_deflate_json_1MiB``: the same with compressible JSON and ``compression="always"``
  (zlib level 1 on the sender, inflate on the receiver), against plain messages of the same
  JSON; MB/s counts the uncompressed bytes. No goal: it shows what deflate costs and saves.

Each round the receiver connects to the child's server, asks for N messages of one kind and
stops the clock when all N have arrived whole (lengths checked). Kinds alternate in each round;
each kind's best round is reported. One JSON line per figure on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import time
from typing import Literal, cast

from aiohttp import WSMsgType, web
from aiohttp.client import ClientSession

from _common import LinePump, Processes, loop_factory, note
from tidewire.client.tube import PREALLOC_BYTES
from tidewire.protocols.tube import Connection, Limits, MessageReceived, Role
from tidewire.server.tube import WRITE_BATCH_BYTES, binary_frame_head, writes_lines

MESSAGE_BYTES = 1024 * 1024
FRAGMENT = 64 * 1024
GOAL_RATIO = 0.7
MAX_MSG = 2 * MESSAGE_BYTES  # aiohttp's bound on one WebSocket message (plain side)


@functools.cache
def payload(kind: str) -> bytes:
    """1 MiB: random bytes, or JSON rows (compressible, as event data usually is)."""
    if not kind.endswith("json"):
        return os.urandom(MESSAGE_BYTES)
    rows: list[str] = []
    size = i = 0
    while size < MESSAGE_BYTES:
        row = json.dumps({"id": i, "user": f"user-{i % 977}", "action": "click",
                          "page": f"/items/{i % 131}", "ms": 1700000000000 + i})  # fmt: skip
        rows.append(row)
        size += len(row) + 1
        i += 1
    return ("[" + ",".join(rows) + "]").encode()[:MESSAGE_BYTES]


# --------------------------------------------------------------------------- the sender (child)


async def serve() -> None:
    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_MSG, compress=False)
        frames = await ws.prepare(request)
        kind = request.query["kind"]
        n = int(request.query["n"])
        data = payload(kind)
        loop = asyncio.get_running_loop()
        if kind.startswith("plain"):
            for _ in range(n):
                await ws.send_bytes(data)
        else:
            mode: Literal["always", "never"] = "always" if kind.endswith("json") else "never"
            tube = Connection(Role.SERVER, fragment_size=FRAGMENT, now=loop.time(),
                              compression=mode)  # fmt: skip
            first = await ws.receive()  # the client's fragment size
            tube.receive_data(first.data, loop.time())
            for message in tube.data_to_send():  # the server's
                await ws.send_bytes(message)
            # As the hub's TubeCarrier sends: the WebSocket messages of each Tube message framed
            # here, every head and part (the Tube header, views of the payload) in one
            # writelines per WRITE_BATCH_BYTES or so, then drain.
            transport = cast(asyncio.WriteTransport, request.transport)
            assert writes_lines(transport)
            assert frames is not None
            for _ in range(n):
                tube.send(data, loop.time())
                lines: list[bytes | memoryview] = []
                batch = 0
                for parts in tube.messages_to_send():
                    size = sum(len(part) for part in parts)
                    lines.append(binary_frame_head(size))
                    lines += parts
                    batch += size
                    if batch >= WRITE_BATCH_BYTES:
                        transport.writelines(lines)
                        await frames.drain()
                        lines, batch = [], 0
                if lines:
                    transport.writelines(lines)
                    await frames.drain()
        await ws.receive()  # the receiver closes when it has everything
        return ws

    app = web.Application()
    app.router.add_get("/send", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"listening {port}", flush=True)
    await asyncio.Event().wait()


# --------------------------------------------------------------------------- the receiver


async def receive(session: ClientSession, port: int, kind: str, n: int) -> float:
    """MB/s of ``n`` messages of ``kind`` from the child."""
    url = f"http://127.0.0.1:{port}/send?kind={kind}&n={n}"
    loop = asyncio.get_running_loop()
    size = len(payload(kind))
    async with session.ws_connect(url, max_msg_size=MAX_MSG, compress=0) as ws:
        start = time.perf_counter()
        got = 0
        if kind.startswith("plain"):
            while got < n:
                message = await ws.receive()
                if message.type != WSMsgType.BINARY or len(message.data) != size:
                    raise RuntimeError(f"unexpected {message.type} {len(message.data or b'')}")
                got += 1
        else:
            # tube-stream: the message's fragments taken as they come, not joined (parts);
            # tube: whole messages, put together as tidewire.client.tube does (one buffer
            # allocated at the header, each fragment copied in as it comes: prealloc_bytes)
            tube = Connection(Role.CLIENT, fragment_size=FRAGMENT, now=loop.time(),
                              limits=Limits(prealloc_bytes=PREALLOC_BYTES),
                              parts=kind == "tube-stream")  # fmt: skip
            part = 0  # bytes of the message being received
            for out in tube.data_to_send():
                await ws.send_bytes(out)
            while got < n:
                message = await ws.receive()
                if message.type != WSMsgType.BINARY:
                    raise RuntimeError(f"unexpected {message.type} {message.data!r}")
                tube.receive_data(message.data, loop.time())
                while (event := tube.next_event()) is not None:
                    if isinstance(event, MessageReceived):  # (parts: deflated, or stream)
                        part += len(event.data)
                        if not event.final:
                            continue
                        if part != size:
                            raise RuntimeError(f"a message of {part} bytes")
                        got, part = got + 1, 0
        seconds = time.perf_counter() - start
        await ws.close()
    return n * size / seconds / 1e6


async def measure(port: int, rounds: int, n: int) -> dict[str, list[float]]:
    kinds = ["plain", "tube", "tube-stream", "plain-json", "tube-json"]
    results: dict[str, list[float]] = {k: [] for k in kinds}
    async with ClientSession() as session:
        for kind in kinds:  # warm-up, untimed
            await receive(session, port, kind, 3)
        for i in range(rounds):
            order = kinds if i % 2 == 0 else list(reversed(kinds))
            for kind in order:
                results[kind].append(await receive(session, port, kind, n))
                note(f"  round {i + 1} {kind:<12} {results[kind][-1]:9.1f} MB/s")
    return results


def line(name: str, tube: list[float], baseline: str, base: list[float],
         goal: float | None, extra: dict[str, object]) -> dict[str, object]:  # fmt: skip
    ratio = max(tube) / max(base)
    return {
        "benchmark": "tube_throughput", "figure": name, "unit": "MB/s", "better": "higher",
        "tidewire": round(max(tube), 1), "baseline": baseline,
        "baseline_value": round(max(base), 1), "ratio": round(ratio, 3),
        "goal": None if goal is None else f"ratio >= {goal}", "goal_ratio": goal,
        "meets_goal": None if goal is None else ratio >= goal,
        "tidewire_rounds": [round(r, 1) for r in tube],
        "baseline_rounds": [round(r, 1) for r in base], **extra,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and rounds")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    factory, loop_name = loop_factory()
    if args.serve:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve())
        return
    rounds, n = (2, 60) if args.quick else (3, 200)
    note(f"tube_throughput: {rounds} rounds of {n} messages of {MESSAGE_BYTES} B per kind")
    procs = Processes()
    try:
        child = procs.start([sys.executable, os.path.abspath(__file__), "--serve"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        port = int(LinePump(child.stdout).wait_for(r"listening (\d+)", child, 30).group(1))
        with asyncio.Runner(loop_factory=factory) as runner:
            results = runner.run(measure(port, rounds, n))
    finally:
        procs.stop_all()
    extra: dict[str, object] = {"message_bytes": MESSAGE_BYTES, "fragment_bytes": FRAGMENT,
                                "messages": n, "rounds": rounds, "loop": loop_name}  # fmt: skip
    json_bytes = len(payload("tube-json"))
    deflated = len(__import__("zlib").compress(payload("tube-json"), 1))
    print(json.dumps(line("tube_plain_1MiB", results["tube"],
                          "aiohttp WebSocket, one 1 MiB binary message each", results["plain"],
                          GOAL_RATIO, extra)), flush=True)  # fmt: skip
    print(json.dumps(line("tube_plain_1MiB_stream", results["tube-stream"],
                          "aiohttp WebSocket, one 1 MiB binary message each", results["plain"],
                          None, {**extra, "receiver": "Tube parts (a byte stream's reader)"})),
          flush=True)  # fmt: skip
    print(json.dumps(line("tube_deflate_json_1MiB", results["tube-json"],
                          "aiohttp WebSocket, the same JSON uncompressed", results["plain-json"],
                          None, {**extra, "json_bytes": json_bytes,
                                 "deflated_bytes": deflated})), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
