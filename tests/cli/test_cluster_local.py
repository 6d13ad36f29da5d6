"""``tidewire cluster local`` as a child process, as a developer runs it: exactly the lines
``storage <URLs>`` and ``ready`` on stdout, nodes that answer, every node's process gone after
SIGTERM (exit 0), and a second run on the same directory on the same ports. Also: the offline
``dump`` refuses to guess a data directory when ``storage.url`` names a cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import child_env
from serveproc import read_until
from tidewire.cli_cluster import ClusterUnavailable
from tidewire.server.storage_open import EXIT_UNAVAILABLE

START_SECONDS = 60.0  # three nats-server processes electing a meta leader: a few seconds here
STORAGE = re.compile(r"storage (nats://127\.0\.0\.1:\d+(?:,nats://127\.0\.0\.1:\d+)*)")


@contextmanager
def local_cluster(directory: Path, nodes: int = 3) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewire.cli", "cluster", "local", "--nodes", str(nodes),
         "--dir", str(directory)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:  # (a failed test: stop it, and so its nodes, as a user would)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for pid in nats_servers(directory):  # (never left behind, whatever failed)
            os.kill(pid, signal.SIGKILL)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


def nats_servers(directory: Path) -> list[int]:
    """The pids of the running nats-server processes configured under ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # (gone meanwhile)
            continue
        if state != "Z" and any(a.startswith(str(directory).encode() + b"/n") for a in argv) \
                and b"nats-server" in argv[0]:  # fmt: skip
            found.append(int(entry.name))
    return sorted(found)


def started(proc: subprocess.Popen[str]) -> str:
    """The storage URLs printed, after checking the two lines are exactly what is promised."""
    lines = read_until(proc, "ready", timeout=START_SECONDS)
    assert len(lines) == 2, lines
    match = STORAGE.fullmatch(lines[0])
    assert match is not None, lines
    assert lines[1] == "ready"
    return match.group(1)


def ports(urls: str) -> list[int]:
    return [int(url.rsplit(":", 1)[1]) for url in urls.split(",")]


def test_local_prints_storage_then_ready_and_sigterm_stops_every_node(tmp_path: Path) -> None:
    directory = tmp_path / "twc"
    with local_cluster(directory) as proc:
        urls = started(proc)
        saved = json.loads((directory / "cluster.json").read_text())["nodes"]
        assert ports(urls) == [node["client_port"] for node in saved]
        assert len(saved) == 3
        pids = nats_servers(directory)
        assert len(pids) == 3
        for port in ports(urls):  # every node takes clients
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                assert sock.recv(4096).startswith(b"INFO ")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert proc.stdout is not None
        assert proc.stdout.read() == ""  # nothing after "ready"
        # Each of `pids` gone (reaped: no zombie either), and no other node of the directory.
        assert not set(pids) & {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}
        assert nats_servers(directory) == []

    # Again on the same directory: the same URLs, so the gateways need no change. Ctrl-C.
    with local_cluster(directory) as proc:
        assert started(proc) == urls
        assert len(nats_servers(directory)) == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert nats_servers(directory) == []


def test_a_directory_of_another_size_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "twc").mkdir()
    record = {"nodes": [{"name": "n1", "client_port": 1, "cluster_port": 2, "monitor_port": 3}]}
    (tmp_path / "twc" / "cluster.json").write_text(json.dumps(record))
    done = subprocess.run(
        [sys.executable, "-m", "tidewire.cli", "cluster", "local", "--nodes", "3", "--dir",
         str(tmp_path / "twc")], capture_output=True, text=True, timeout=60, env=child_env(),
        check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout == ""
    assert "holds a cluster of 1 nodes, not 3" in done.stderr
    assert "Traceback" not in done.stderr


def test_dump_without_a_data_dir_says_the_streams_are_in_the_cluster(tmp_path: Path) -> None:
    env = {**child_env(), "TIDEWIRE_STORAGE_URL": "nats://127.0.0.1:4222",
           "TIDEWIRE_DATA_DIR": str(tmp_path)}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "tidewire.cli", "dump", "orders"],
                          capture_output=True, text=True, timeout=60, env=env,
                          check=False)  # fmt: skip
    assert done.returncode == 1
    assert "storage.url says the streams are in a cluster" in done.stderr
    assert "through a gateway" in done.stderr


def test_serve_and_the_cli_agree_on_the_unavailable_status() -> None:
    assert ClusterUnavailable("x").exit_code == EXIT_UNAVAILABLE == 69
