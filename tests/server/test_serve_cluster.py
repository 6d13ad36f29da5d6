"""``tidewire serve`` in cluster mode (issue 21): the ``storage.url`` and ``cluster.*``
settings, the hub on a connected storage with no data directory, its banner, and a cluster
that cannot be reached: one line and exit status 69, never a traceback.

The cluster itself is stood in for by :class:`ClusteredStorage` (a real Storage, in memory)
given to ``serve`` as its connector; serving over a real JetStream cluster end to end is
tests/cluster/'s.
"""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
from pathlib import Path

import pytest

import tidewire
from clustered_storage import URLS, ClusteredStorage
from helpers import child_env, run
from tidewire.cluster.jetstream import JetStreamStorage
from tidewire.cluster.local import LocalCluster, free_port
from tidewire.cluster.staging import STAGE_STREAM
from tidewire.config import ConfigError, ServerConfig, load_config
from tidewire.hub.staging import STAGING_TTL_MS
from tidewire.hub.storage import Storage
from tidewire.server.serve import Endpoint, serve
from tidewire.server.storage_open import (
    EXIT_UNAVAILABLE,
    StorageUnavailable,
    connect_jetstream,
    open_hub,
)

PORTS = {"http.port": 0, "rsio.port": 0, "tolliver.port": 0, "seguro.port": 0}


def cluster_config(data_dir: Path, **more: object) -> ServerConfig:
    return load_config(None, {**PORTS, "data_dir": str(data_dir), "storage.url": ",".join(URLS),
                              **more}, environ={})  # fmt: skip


# --------------------------------------------------------------------------- settings


def test_the_cluster_settings_and_their_defaults() -> None:
    config = load_config(None, environ={})
    assert config.storage_urls == ()
    assert not config.clustered
    assert (config.values["cluster.shards"], config.values["cluster.replicas"],
            config.values["cluster.append_timeout_s"]) == (16, 3, 30.0)  # fmt: skip
    env = {"TIDEWIRE_STORAGE_URL": " nats://h1:4222 ,tls://h2:4222,nats://h3",
           "TIDEWIRE_CLUSTER_SHARDS": "4", "TIDEWIRE_CLUSTER_REPLICAS": "1"}  # fmt: skip
    config = load_config(None, environ=env)
    assert config.storage_urls == ("nats://h1:4222", "tls://h2:4222", "nats://h3")
    assert config.clustered
    assert (config.values["cluster.shards"], config.values["cluster.replicas"]) == (4, 1)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("http://h1:4222", "scheme 'http', not nats or tls"),
        ("h1", "no scheme"),
        ("nats://:4222", "no host"),
        ("nats://h1:4222,", "'' is empty"),
        ("nats://h1:99999", "no valid port"),
        ("nats://h1:4222/streams", "more than a server's address"),
        ("nats://h1:1,nats://h1:1", "listed twice"),
    ],
)
def test_a_storage_url_that_is_no_list_of_nats_urls_is_refused(value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"storage\.url") as caught:
        load_config(None, {"storage.url": value}, environ={})
    assert why in str(caught.value)
    if why != "listed twice":
        assert "expected nats://host:port or tls://host:port" in str(caught.value)


def test_credentials_in_the_storage_url_are_refused_without_being_repeated() -> None:
    with pytest.raises(ConfigError, match="holds credentials") as caught:
        load_config(None, {"storage.url": "nats://alice:s3cret@h1:4222"}, environ={})
    assert "s3cret" not in str(caught.value)
    assert "alice" not in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("cluster.shards", 0), ("cluster.replicas", 6), ("cluster.append_timeout_s", 0)],
)
def test_cluster_numbers_out_of_range_are_refused(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(None, {key: value}, environ={})


# --------------------------------------------------------------------------- serving


def test_serve_runs_the_hub_on_the_cluster_without_a_data_directory(tmp_path: Path) -> None:
    """The connector's storage is the hub's: the banner names it, an RS.io publish lands in
    it, nothing is made in data_dir, and it is closed at the stop."""
    storage = ClusteredStorage()
    asked: list[tuple[str, ...]] = []

    async def connect(config: ServerConfig) -> Storage:
        asked.append(config.storage_urls)
        return storage

    out = io.StringIO()

    async def main() -> None:
        stop, up = asyncio.Event(), asyncio.Event()
        endpoints: list[Endpoint] = []

        def on_ready(found: list[Endpoint]) -> None:
            endpoints.extend(found)
            up.set()

        task = asyncio.create_task(serve(cluster_config(tmp_path / "data"), out=out,
                                         stop=stop, on_ready=on_ready, connect=connect))
        await asyncio.wait([task, asyncio.create_task(up.wait())],
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        assert up.is_set(), task.result()
        rsio = next(e.url for e in endpoints if e.protocol == "rsio")
        async with await tidewire.connect(rsio) as hub:
            await hub.publish("orders", [b"one", b"two"])
        stop.set()
        await task

    run(main())
    assert asked == [URLS]
    assert [e.value for b in storage.committed["orders"] for e in b] == [b"one", b"two"]
    assert storage.closed
    assert not (tmp_path / "data").exists()
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(f" stream(s) from {storage.describe()}")
    assert lines[1] == f"  storage  {storage.describe()}; no data directory"
    assert lines[-1] == "stopped: every acknowledged event is in the cluster"


def test_a_cluster_that_refuses_or_does_not_answer_is_one_clear_error(tmp_path: Path) -> None:
    async def refused(config: ServerConfig) -> Storage:
        raise ConnectionRefusedError(111, "Connect call failed")

    async def silent(config: ServerConfig) -> Storage:
        await asyncio.Event().wait()  # (never: the bound, cluster.append_timeout_s, ends it)
        raise AssertionError

    config = cluster_config(tmp_path / "data", **{"cluster.append_timeout_s": 0.2})
    with pytest.raises(StorageUnavailable) as caught:
        run(serve(config, out=io.StringIO(), connect=refused))
    assert str(caught.value) == (f"cannot reach the cluster at {','.join(URLS)}: "
                                 "[Errno 111] Connect call failed")  # fmt: skip
    with pytest.raises(StorageUnavailable) as caught:
        run(serve(config, out=io.StringIO(), connect=silent))
    assert str(caught.value) == (f"the cluster at {','.join(URLS)} did not answer within "
                                 "0.2 s (cluster.append_timeout_s)")  # fmt: skip
    assert not (tmp_path / "data").exists()


def test_the_command_exits_69_with_one_line_when_the_cluster_is_unreachable(
    tmp_path: Path,
) -> None:
    """A real ``tidewire serve --storage`` on a port where nothing listens."""
    url = f"nats://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "tidewire.cli", "serve", "--storage", url,
         "--data-dir", str(tmp_path / "data"), "--http-port", "0", "--rsio-port", "0",
         "--seguro-port", "0", "--tolliver-port", "0", "--set", "cluster.append_timeout_s=5"],
        capture_output=True, text=True, timeout=60, env=child_env(), check=False,
    )  # fmt: skip
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert "Traceback" not in done.stderr
    assert "Error: " in done.stderr
    assert "cannot serve" in done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "data").exists()


def test_an_embedded_hub_is_unchanged_by_the_cluster_settings(tmp_path: Path) -> None:
    """No storage.url: the log in data_dir, the banner without a storage line."""
    out = io.StringIO()
    config = load_config(None, {**PORTS, "data_dir": str(tmp_path / "data")}, environ={})

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(config, out=out, stop=stop,
                                         on_ready=lambda _: stop.set()))  # fmt: skip
        await task

    run(main())
    assert (tmp_path / "data").is_dir()
    assert not any(line.startswith("  storage") for line in out.getvalue().splitlines())
    assert out.getvalue().splitlines()[-1] == "stopped: every acknowledged event is on disk"



def test_the_jetstream_backend_is_given_the_cluster_settings(
    tmp_path: Path, cluster: LocalCluster
) -> None:
    """``connect_jetstream`` connects the real backend to the cluster ``storage.url`` names,
    with the ``cluster.*`` settings (the session's 3-node cluster)."""
    config = load_config(None, {**PORTS, "data_dir": str(tmp_path),
                                "storage.url": cluster.storage_url, "cluster.shards": 4,
                                "cluster.replicas": 1, "cluster.append_timeout_s": 7.5},
                         environ={})  # fmt: skip

    async def main() -> str:
        storage = await connect_jetstream(config)
        try:
            return storage.describe()
        finally:
            await storage.close()

    assert run(main(), 60) == f"{cluster.storage_url} (JetStream, 4 shards, R1)"


def test_the_staging_ttl_reaches_a_gateway_and_its_staging_stream(
    tmp_path: Path, cluster: LocalCluster
) -> None:
    """``txn.staging_ttl_ms`` is the cluster staging stream's ``max_age`` too (docs/cluster.md
    "Staged parts"), as it is the embedded sweep's TTL."""
    config = load_config(None, {**PORTS, "data_dir": str(tmp_path),
                                "storage.url": cluster.storage_url,
                                "txn.staging_ttl_ms": 7_200_000}, environ={})  # fmt: skip

    async def main() -> int:
        hub = await open_hub(config)
        try:
            assert hub.txns.staging_ttl_ms == 7_200_000
            part = hub.stage("anonymous", "ttl.s", "T", "0.1")
            await part.close()  # (makes TW_STAGE, or brings its max_age to the setting)
            storage = hub.storage
            assert isinstance(storage, JetStreamStorage)
            info = await storage.api.call(f"$JS.API.STREAM.INFO.{STAGE_STREAM}")
            return int(info["config"]["max_age"])
        finally:
            hub.txns.staging_ttl_ms = STAGING_TTL_MS  # (as the other tests' gateways have it)
            await hub.txns.staging.ensure()  # type: ignore[union-attr]
            await hub.close()

    assert run(main(), 60) == 7_200_000 * 1_000_000
