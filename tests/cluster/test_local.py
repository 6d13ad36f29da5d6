"""``LocalCluster``: real nodes on loopback, configured as docs/cluster.md requires."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tidewire.cluster.local import (
    MIN_VERSION,
    ClusterError,
    LocalCluster,
    find_nats_server,
    server_version,
)


def test_the_server_found_is_recent_enough() -> None:
    assert server_version(find_nats_server()) >= MIN_VERSION >= (2, 12, 0)


def test_an_old_server_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "nats-server"
    old.write_text("#!/bin/sh\necho 'nats-server: v2.9.10'\n")
    old.chmod(0o755)
    monkeypatch.setenv("TIDEWIRE_NATS_SERVER", str(old))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert server_version(str(old)) == (2, 9, 10)
    found = find_nats_server()  # (the venv's, beside this Python, is recent: it wins)
    assert found != str(old)


def test_every_node_syncs_always_and_has_a_meta_leader(cluster: LocalCluster) -> None:
    assert len(cluster.urls) == 3
    assert cluster.storage_url == ",".join(cluster.urls)
    for node in cluster.nodes:
        config = cluster.monitor(node, "/varz")["jetstream"]
        assert isinstance(config, dict)
        assert config["config"]["sync_always"] is True  # an ack means fsynced
        assert cluster.monitor(node, "/varz")["max_payload"] == 8 * 1024 * 1024
    meta = cluster.monitor(cluster.nodes[0], "/jsz")["meta_cluster"]
    assert isinstance(meta, dict)
    assert meta["cluster_size"] == 3


def test_a_node_that_does_not_come_up_is_reported_with_the_end_of_its_log(
    own_cluster: Callable[[int], LocalCluster],
) -> None:
    running = own_cluster(3)
    running.kill(2)
    for line in ("first line\n", "x" * 3000 + "\n", "the last words\n"):
        with open(running.directory / "n3.log", "a") as log:
            log.write(line)
    assert running.log_tail(running.nodes[2]).endswith("the last words\n")
    assert "first line" not in running.log_tail(running.nodes[2])
    with pytest.raises(ClusterError, match=r"(?s)n3 exited \(-9\); the end of .*:.*last words"):
        running.wait_ready(5, [running.nodes[2]])


def test_a_killed_node_restarts_on_its_ports_and_stop_ends_every_process(
    own_cluster: Callable[[int], LocalCluster],
) -> None:
    running = own_cluster(3)
    first = running.nodes[1].pid
    assert first is not None
    running.kill(1)
    assert running.nodes[1].pid is None
    running.restart(1)
    assert running.nodes[1].pid not in (None, first)
    again = LocalCluster(running.directory, 3)  # the same directory: the same ports
    assert again.urls == running.urls
    pids = [n.pid for n in running.nodes]
    running.stop()
    assert [n.pid for n in running.nodes] == [None] * 3
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_directory_keeps_its_node_count(own_cluster: Callable[[int], LocalCluster]) -> None:
    running = own_cluster(1)
    with pytest.raises(ClusterError, match="1 nodes, not 3"):
        LocalCluster(running.directory, 3)
