"""What the benchmarks share: progress output, where their temporary directories go (a real
disk: fsync on a RAM file system costs nothing, which would flatter every durable write), the
subprocesses they start (all stopped at exit) and the peer libraries they load, the JSON lines
they print (:func:`emit`), and a ``tidewire serve`` child on free ports (:func:`serve_hub`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "RAM_FILE_SYSTEMS",
    "RAW_COMMIT_BYTES",
    "LinePump",
    "Processes",
    "choose_base",
    "distribution_version",
    "emit",
    "fresh_dir",
    "fs_type",
    "loop_factory",
    "module",
    "note",
    "raw_fdatasync_rate",
    "serve_hub",
]

RAM_FILE_SYSTEMS = {"tmpfs", "ramfs", "devtmpfs"}


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def emit(record: dict[str, Any]) -> None:
    """One machine-readable JSON line on stdout (progress goes to stderr, with :func:`note`)."""
    print(json.dumps(record), flush=True)


def fs_type(path: str) -> str:
    """The file-system type of the mount holding ``path`` (from /proc/self/mounts)."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        pass
    return kind


def choose_base(requested: str | None) -> str:
    if requested is not None:
        return requested
    if fs_type("/tmp") not in RAM_FILE_SYSTEMS:
        return "/tmp"
    return os.getcwd()


@contextmanager
def fresh_dir(parent: str, prefix: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


RAW_COMMIT_BYTES = 1024
"""What one raw durable commit writes (:func:`raw_fdatasync_rate`), as issue 22's table says."""


def raw_fdatasync_rate(parent: str, budget: float, max_bytes: int = 1 << 30) -> float:
    """The disk's raw durable-commit rate, in commits/s: one ``os.write`` of 1 KiB then one
    ``os.fdatasync``, one at a time, for ``budget`` seconds (at least one commit, at most
    ``max_bytes`` written), appending to a new file in a fresh directory under ``parent`` (the
    file grows, as a log's segment does, so every commit has metadata to sync too).

    This is the ceiling of a store that syncs once per commit, whatever its language: a store
    that makes several commits durable with one fsync (group commit) can exceed it."""
    value = os.urandom(RAW_COMMIT_BYTES)
    limit = max(1, max_bytes // RAW_COMMIT_BYTES)
    with fresh_dir(parent, "raw-fdatasync-") as directory:
        path = os.path.join(directory, "raw.log")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, value)  # warm-up: the file exists and has its first block
            os.fdatasync(fd)
            commits = 0
            start = time.perf_counter()
            deadline = start + budget
            while commits < limit:
                os.write(fd, value)
                os.fdatasync(fd)
                commits += 1
                if time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - start
        finally:
            os.close(fd)
    return commits / elapsed


class Processes:
    """Every subprocess this benchmark starts; all are stopped at exit, whatever happens."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        atexit.register(self.stop_all)

    def start(self, args: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        proc = subprocess.Popen(args, text=True, **kwargs)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[str], timeout: float = 30.0) -> int:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if proc in self.procs:
            self.procs.remove(proc)
        return proc.returncode

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc, timeout=10)


class LinePump:
    """Reads a subprocess's output lines in a thread (so that its pipe never fills)."""

    def __init__(self, stream: Any) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._stream = stream
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            for line in self._stream:
                self.lines.put(line.rstrip("\n"))
        self.lines.put("\0eof")

    def wait_for(self, pattern: str, proc: subprocess.Popen[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line == "\0eof":
                break
            self.seen.append(line)
            if match := regex.search(line):
                return match
        tail = "\n".join(self.seen[-20:])
        raise RuntimeError(
            f"{proc.args!r}: no line matching {pattern!r} (exit {proc.poll()}):\n{tail}"
        )


def module(name: str) -> Any:
    """Import a peer library (untyped here: mypy runs without the peers installed)."""
    return importlib.import_module(name)


def distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def loop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    try:
        import uvloop
    except ImportError:
        return None, "asyncio"
    return uvloop.new_event_loop, "uvloop"


def serve_hub(procs: Processes, data_dir: str, *args: str, stderr: Any = None,
              timeout: float = 60.0, new_session: bool = False,
              ) -> tuple[subprocess.Popen[str], dict[str, str]]:  # fmt: skip
    """Start ``tidewire serve`` on free ports (every listener on port 0) with ``args`` as more
    options, and wait for its ``ready`` line. Returns the process and its endpoints, parsed from
    what it printed: ``rsio``, ``tolliver``, ``seguro`` and ``ws`` URLs and ``http`` (the base
    URL, ``http://host:port``). ``stderr``: where its log lines go (a file; default: ours).
    ``new_session``: in a session of its own, so that a Ctrl-C in the terminal reaches only the
    benchmark, which then stops the hub itself."""
    env = {**os.environ, "TIDEWIRE_RSIO_PORT": "0", "TIDEWIRE_SEGURO_PORT": "0",
           "TIDEWIRE_TOLLIVER_PORT": "0"}  # fmt: skip
    proc = procs.start(
        [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", data_dir,
         "--http-port", "0", *args],
        stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=new_session,
    )  # fmt: skip
    pump = LinePump(proc.stdout)
    pump.wait_for(r"^ready", proc, timeout)
    urls: dict[str, str] = {}
    for line in pump.seen:
        for word in line.split():
            scheme, sep, _ = word.partition("://")
            if not sep:
                continue
            if scheme in ("rsio", "tolliver", "seguro", "ws") and scheme not in urls:
                urls[scheme] = word
            elif scheme == "http" and word.endswith("/healthz"):
                urls["http"] = word.removesuffix("/healthz")
    missing = {"rsio", "tolliver", "seguro", "ws", "http"} - set(urls)
    if missing:
        procs.stop(proc)
        raise RuntimeError(f"the hub printed no {sorted(missing)} endpoint: {pump.seen}")
    return proc, urls
