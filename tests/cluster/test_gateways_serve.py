"""Two ``tidewire serve --storage`` gateways (child processes, as a user runs them) over the
session's 3-node cluster: the banner names the storage, what one gateway stores the other
serves, ``/api/cluster`` and ``/metrics`` show the three nodes, SIGTERM stops each with exit 0
and the cluster's stop line. Skipped until the JetStream backend is in this tree.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
import uuid
from typing import Any

import tidewire
from helpers import run
from serveproc import endpoint, first_values, read_until, server
from tidewire.cluster.local import LocalCluster

STATUS_SECONDS = 30.0  # the backend reads the cluster's status every few seconds


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def test_two_gateways_serve_the_same_streams_and_show_the_cluster(cluster: LocalCluster) -> None:
    stream = f"gw-{uuid.uuid4().hex[:8]}"
    args = ["--storage", cluster.storage_url, "--http-port", "0"]
    with server(*args) as a, server(*args) as b:
        lines_a = read_until(a, "ready", timeout=60)
        lines_b = read_until(b, "ready", timeout=60)
        for lines in (lines_a, lines_b):
            assert lines[1].startswith(f"  storage  {cluster.storage_url} (JetStream")
            assert lines[1].endswith("; no data directory")

        async def write_and_read() -> list[bytes]:
            async with asyncio.timeout(60), await tidewire.connect(rsio(lines_a)) as hub:
                await hub.publish(stream, [b"one", b"two", b"three"])
            return await first_values(rsio(lines_b), stream, 3)  # (through the other one)

        assert run(write_and_read(), timeout=90) == [b"one", b"two", b"three"]

        api = http(lines_b) + "/api/cluster"
        deadline = time.monotonic() + STATUS_SECONDS
        shown = get(api)
        def settled(shown: Any) -> bool:  # (a group may be electing a leader for a moment)
            return bool(shown and shown["groups"]) and all(g["leader"] for g in shown["groups"])

        while not settled(shown) and time.monotonic() < deadline:
            time.sleep(0.2)  # (another process's background refresh: polled, bounded)
            shown = get(api)
        assert shown is not None, "no cluster status on /api/cluster"
        assert len(shown["servers"]) == 3
        assert {n["name"] for n in shown["nodes"]} <= {n.name for n in cluster.nodes}
        assert all(g["leader"] is not None for g in shown["groups"])
        metrics = scrape(http(lines_a) + "/metrics")
        assert "tidewire_cluster_servers 3.0" in metrics
        assert "tidewire_cluster_group_leader{" in metrics

        for proc in (a, b):
            proc.send_signal(signal.SIGTERM)
        for proc in (a, b):
            assert proc.wait(60) == 0
            assert proc.stdout is not None
            assert "stopped: every acknowledged event is in the cluster" in proc.stdout.read()


def rsio(lines: list[str]) -> str:
    return next(w for line in lines for w in line.split() if w.startswith("rsio://"))


def http(lines: list[str]) -> str:
    return endpoint(lines, "/healthz").removesuffix("/healthz")
