"""``tidewire cluster ...``: cluster mode's commands (docs/cluster.md "Running a cluster").

``tidewire cluster local --nodes 3 --dir D`` runs a local NATS JetStream cluster for
development and tests (:class:`~tidewire.cluster.local.LocalCluster`): it prints exactly two
lines on stdout, ``storage <the URL list>`` (the value for ``tidewire serve --storage``) and
``ready``, then stays in the foreground until SIGINT (Ctrl-C) or SIGTERM, and stops its nodes
by pid before it exits 0. The ports are kept in ``D/cluster.json``: a second run on the same
``D`` has the same URLs (gateways given them need no change), and the same data.

Also here: what the offline tools (``tidewire dump``) say when the configuration names a
cluster, and the exception ``serve`` exits with when the cluster cannot be reached.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import click

from .cluster.local import ClusterError, LocalCluster
from .config import ConfigError, load_config
from .errors import TidewireError

__all__ = ["ClusterUnavailable", "cluster", "offline_data_dir"]

WATCH_SECONDS = 1.0
"""How often ``cluster local`` looks at its nodes while it waits (a node that exits is
reported on stderr, once)."""


class ClusterUnavailable(TidewireError, click.ClickException):
    """``tidewire serve``'s error when its cluster cannot be reached: exit status 69 (sysexits'
    EX_UNAVAILABLE, :data:`tidewire.server.storage_open.EXIT_UNAVAILABLE`), not 1."""

    exit_code = 69


def offline_data_dir(option: str | None) -> str:
    """The data directory an offline tool reads: ``option``, else ``data_dir`` from the
    environment; a :class:`click.ClickException` when, without ``option``, ``storage.url`` is
    set: the streams are then in a cluster, which only a gateway reads."""
    if option:
        return option
    try:
        config = load_config(None)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if config.clustered:
        raise click.ClickException(
            "this reads the embedded log's data directory, and storage.url says the streams "
            "are in a cluster: read them through a gateway (tidewire tail STREAM --from "
            "earliest --url rsio://GATEWAY:7400; tidewire streams --url http://GATEWAY:7480), "
            "or name a data directory with --data-dir"
        )
    return config.data_dir


@click.group()
def cluster() -> None:
    """Cluster mode: the streams in a NATS JetStream cluster, hubs as gateways
    (docs/cluster.md)."""


@cluster.command("local")
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True,
              help="nats-server processes (3 for R3)")  # fmt: skip
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="the cluster's directory: each node's store, configuration and log, and "
                   "the ports (cluster.json, kept for the next run)")  # fmt: skip
def local(nodes: int, directory: str) -> None:
    """Run a local JetStream cluster on free 127.0.0.1 ports until Ctrl-C or SIGTERM. Prints
    `storage <URLS>` (for tidewire serve --storage) and then `ready`. The nats-server is
    $TIDEWIRE_NATS_SERVER, else the one ./tw installs (docs/cluster.md)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Before the nodes start: a signal while they come up stops them too, cleanly.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    running: LocalCluster | None = None
    try:
        running = LocalCluster(directory, nodes)
        running.start(wait=False)
        running.wait_ready()
        if not stop.is_set():
            click.echo(f"storage {running.storage_url}")
            click.echo("ready")
            sys.stdout.flush()
            click.echo(f"{nodes} nats-server node(s) in {running.directory} (logs: "
                       "n*.log there); Ctrl-C or SIGTERM stops them", err=True)  # fmt: skip
            _watch(running, stop)
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if running is not None:
            running.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo("stopped", err=True)


def _watch(running: LocalCluster, stop: threading.Event) -> None:
    """Wait for ``stop``, saying on stderr (once each) when a node exits by itself."""
    told: set[str] = set()
    while not stop.wait(WATCH_SECONDS):
        for node in running.nodes:
            if node.pid is None and node.name not in told:
                told.add(node.name)
                code = None if node.process is None else node.process.returncode
                click.echo(f"nats-server {node.name} exited ({code}): see "
                           f"{running.directory / (node.name + '.log')}", err=True)  # fmt: skip
