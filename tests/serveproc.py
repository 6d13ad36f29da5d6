"""``tidewire serve`` as a child process for the command-line tests: start it, read its lines
up to a marker, find an endpoint in its banner; ``fill`` a data directory beforehand.
"""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import tidewire
from tidewire.log import Log
from tidewire.model import Batch


def fill(data_dir: Path) -> None:
    async def go() -> None:
        log = Log.open(str(data_dir))
        await log.append(Batch.build("orders", [b"hello", b"\x00\xff"], keys=[b"k", None],
                                     timestamps=[1000, 2000]), assign_ids=True)  # fmt: skip
        await log.append(Batch.build("zeta", [b"z"] * 5, timestamps=7), assign_ids=True)
        await log.close()

    asyncio.run(go())


async def first_values(url: str, stream: str, n: int) -> list[bytes]:
    """The first ``n`` values of ``stream``, read over RS.io from the running server."""
    values: list[bytes] = []
    async with asyncio.timeout(30), await tidewire.connect(url) as hub:
        async for batch in hub.subscribe(stream):
            values += [e.value for e in batch]
            if len(values) >= n:
                break
    return values[:n]


@contextmanager
def server(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewire.cli", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "TIDEWIRE_RSIO_PORT": "0",
            "TIDEWIRE_SEGURO_PORT": "0",
            "TIDEWIRE_TOLLIVER_PORT": "0",
            **(env or {}),
        },
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


def read_until(proc: subprocess.Popen[str], marker: str, timeout: float = 30.0) -> list[str]:
    """Lines of stdout up to and including the one that contains ``marker``."""
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stdout = proc.stdout

    def pump() -> None:
        for line in stdout:
            lines.put(line.rstrip("\n"))
            if marker in line:
                return
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        seen.append(line)
        if marker in line:
            return seen
        if not line and proc.poll() is not None:
            break
    why = ""
    if proc.poll() is not None and proc.stderr is not None:  # (it exited: say why)
        why = f"; it exited {proc.returncode}, stderr: {proc.stderr.read()[-3000:]}"
    raise AssertionError(f"no {marker!r} on stdout within {timeout}s; got {seen}{why}")


def endpoint(lines: list[str], path: str) -> str:
    return next(word for line in lines for word in line.split() if word.endswith(path))
