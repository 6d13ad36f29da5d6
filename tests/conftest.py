"""Shared fixtures. ``spark``: one local SparkSession for the whole run, with the ``tidewire``
data source registered (tests/spark/test_spark.py); ``cluster``/``own_cluster``: NATS JetStream
clusters (tests/cluster/). PySpark is imported only when a test asks
for it, so the rest of the suite runs without the ``spark`` extra."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from certs import Pki
    from loops import Run
    from tidewire.cluster.local import LocalCluster


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install tidewire[spark])")
    with pytest.MonkeyPatch.context() as patch:
        # Spark starts its Python workers with this interpreter (the one that has tidewire).
        patch.setitem(os.environ, "PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        import tidewire.spark

        session = (
            SparkSession.builder.master("local[2]")
            .appName("tidewire-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        try:
            session.sparkContext.setLogLevel("ERROR")
            tidewire.spark.register(session)
            yield session
        finally:
            session.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, the hub's certificate and client certificates on demand (tests/certs.py)."""
    from certs import Pki

    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Run a coroutine on asyncio's loop, then (second parametrization) on uvloop, bounded in
    time (tests/loops.py): by the module's ``RUN_SECONDS`` if it sets one, else 20 s."""
    from loops import RUN_SECONDS, runner

    return runner(str(request.param), getattr(request.module, "RUN_SECONDS", RUN_SECONDS))


@pytest.fixture
def hub_url(tmp_path: Path) -> Iterator[str]:
    """The RS.io URL of a ``tidewire serve`` child (embedded store in ``tmp_path/hub``, log in
    ``tmp_path/hub.log``, free 127.0.0.1 ports), stopped by its pid when the test ends."""
    from hubproc import HubProcess

    proc = HubProcess(tmp_path / "hub", tmp_path / "hub.log")
    try:
        yield proc.start()["rsio"]
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One 3-node NATS JetStream cluster for the session (tests/cluster/: real nats-server
    processes on free 127.0.0.1 ports, stopped by pid), for tests that only read and write."""
    from tidewire.cluster.local import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("cluster"), 3) as running:
        yield running


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Callable[[int], LocalCluster]]:
    """Makes clusters a test may kill nodes of (``make(nodes)``), stopped when it ends."""
    from tidewire.cluster.local import LocalCluster

    made: list[LocalCluster] = []

    def make(nodes: int = 3) -> LocalCluster:
        running = LocalCluster(tmp_path / f"cluster{len(made)}", nodes)
        made.append(running)
        running.start()
        return running

    try:
        yield make
    finally:
        for running in made:
            running.stop()
