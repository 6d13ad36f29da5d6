"""Shared fixtures. ``spark``: one local SparkSession for the whole run, with the ``tidewire``
data source registered (tests/spark/test_spark.py). PySpark is imported only when a test asks
for it, so the rest of the suite runs without the ``spark`` extra."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from certs import Pki
    from loops import Run


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
