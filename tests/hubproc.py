"""A ``tidewire serve`` child process for the fault tests: started on free ports the first
time, restarted on the *same* ports (so that clients reconnect to the address they know),
killed with SIGKILL or stopped with SIGTERM.

``HubProcess(data_dir, log_path)``; ``start()`` returns the endpoints (``rsio``, ``tolliver``,
``seguro``, ``http``, ``ws`` URLs); ``kill()``, ``terminate() -> (returncode, seconds)``;
``stop()`` (kill if still running, always safe). Its stdout is drained by a thread; stderr goes
to ``log_path`` (appended across restarts), which a failing test shows.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

READY_TIMEOUT = 30.0


class HubProcess:
    def __init__(self, data_dir: Path, log_path: Path, *args: str,
                 env: dict[str, str] | None = None, prefix: list[str] | None = None) -> None:
        """``args``: more ``tidewire serve`` options; ``prefix``: a command the server runs
        under (e.g. ``unshare ...``)."""
        self.data_dir = data_dir
        self.log_path = log_path
        self.args = list(args)
        self.env = env or {}
        self.prefix = prefix or []
        self.proc: subprocess.Popen[str] | None = None
        self.urls: dict[str, str] = {}
        self.stdout: list[str] = []
        self.starts = 0

    def _ports(self) -> dict[str, str]:
        if not self.urls:
            return {"http": "0", "rsio": "0", "seguro": "0", "tolliver": "0"}
        return {name: str(urlsplit(self.urls[name]).port)
                for name in ("http", "rsio", "seguro", "tolliver")}  # fmt: skip

    def start(self) -> dict[str, str]:
        """Start the hub (on the ports of its first start) and wait for ``ready``."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        ports = self._ports()
        env = {**os.environ, "TIDEWIRE_RSIO_PORT": ports["rsio"],
               "TIDEWIRE_SEGURO_PORT": ports["seguro"],
               "TIDEWIRE_TOLLIVER_PORT": ports["tolliver"], **self.env}  # fmt: skip
        with open(self.log_path, "ab") as stderr:
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "tidewire.cli", "serve",
                 "--data-dir", str(self.data_dir), "--http-port", ports["http"], *self.args],
                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
            )  # fmt: skip
        self.starts += 1
        lines = self._read_until_ready(self.proc)
        urls: dict[str, str] = {}
        for line in lines:
            for word in line.split():
                scheme, sep, _ = word.partition("://")
                if not sep:
                    continue
                if scheme in ("rsio", "tolliver", "seguro", "ws") and scheme not in urls:
                    urls[scheme] = word
                elif scheme == "http" and word.endswith("/healthz"):
                    urls["http"] = word.removesuffix("/healthz")
        if self.urls and urls != self.urls:
            raise AssertionError(f"restarted on other ports: {urls} != {self.urls}")
        self.urls = urls
        return urls

    def _read_until_ready(self, proc: subprocess.Popen[str]) -> list[str]:
        assert proc.stdout is not None
        stdout = proc.stdout
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            for line in stdout:
                lines.put(line.rstrip("\n"))
                self.stdout.append(line.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        seen: list[str] = []
        deadline = time.monotonic() + READY_TIMEOUT
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
        self.stop()
        raise AssertionError(f"the hub printed no 'ready' within {READY_TIMEOUT} s: {seen}\n"
                             f"stderr:\n{self.log()}")  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def terminate(self, timeout: float = 30.0) -> tuple[int, float]:
        """SIGTERM; the exit code and how long the hub took to exit."""
        assert self.proc is not None
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        return code, time.monotonic() - began

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
