"""The protocol registry (tidewire/registry.py) is the one place a protocol is registered:
``serve`` starts a listener for each and prints its endpoints, the metrics count it under its
labels, the hub's ingest defaults come from it, and the settings and the command line name
each listener. What users see (ports, settings, banner, labels) is as before the registry."""

from __future__ import annotations

import asyncio
import io
import re
import socket
import ssl
from pathlib import Path

import click

from helpers import HOST, run
from tidewire.cli import main
from tidewire.config import SETTINGS, load_config
from tidewire.hub import INGEST_DEFAULTS, IngestLimits
from tidewire.observe.metrics import CONNECTION_PROTOCOLS, SUBSCRIPTION_PROTOCOLS
from tidewire.registry import PROTOCOLS, by_name, listeners
from tidewire.server.listeners import HTTP_LISTENER, STARTERS
from tidewire.server.serve import LISTENERS, Endpoint, banner_endpoints, serve, tcp_listeners

MiB = 1024 * 1024


def test_every_listener_has_a_starter_settings_and_a_flag() -> None:
    """A listener the registry names is started by ``serve`` (the HTTP app, or a starter),
    has its ``<listener>.port`` and ``<listener>.tls`` settings and a ``--<listener>-port``
    flag on ``tidewire serve``."""
    command = main.commands["serve"] if isinstance(main, click.Group) else None
    assert command is not None
    flags = {opt for p in command.params for opt in getattr(p, "opts", ())}
    for name in listeners():
        assert name == HTTP_LISTENER or name in STARTERS, name
        assert f"{name}.port" in SETTINGS, name
        assert f"{name}.tls" in SETTINGS, name
        assert f"--{name}-port" in flags, name
    assert set(STARTERS) == set(tcp_listeners())
    assert LISTENERS == ("http", "rsio", "seguro", "tolliver")


def test_the_metrics_labels_and_ingest_defaults_come_from_the_registry() -> None:
    """The labels as they were (their order is the order users see them in), and every
    protocol that writes has its ingest defaults (the bounds each adapter had before)."""
    assert CONNECTION_PROTOCOLS == ("rsio", "http", "tube", "tolliver", "seguro")
    assert SUBSCRIPTION_PROTOCOLS == ("rsio", "rsio-http", "tube", "tolliver")
    assert all(p.connection_label for p in PROTOCOLS)
    before = {
        "rsio": IngestLimits(8 * MiB, 4, MiB),
        "tube": IngestLimits(8 * MiB, 4, MiB),
        "seguro": IngestLimits(16 * MiB, 4, 256 * 1024),
        "tolliver": IngestLimits(32 * MiB, 1024, MiB),
    }
    assert dict(INGEST_DEFAULTS) == before
    assert {p.name for p in PROTOCOLS if p.ingest is not None} == set(INGEST_DEFAULTS)
    for p in PROTOCOLS:
        if p.inlet_setting is not None:
            assert p.inlet_setting in SETTINGS
    assert by_name("tolliver").client_certificates
    assert [p.name for p in PROTOCOLS if p.client_certificates] == ["tolliver"]


def test_the_banner_under_tls_names_secure_schemes() -> None:
    """Each listener's scheme gains an ``s`` when that listener has a TLS context."""
    context = ssl.create_default_context()
    tls: dict[str, ssl.SSLContext | None] = dict.fromkeys(LISTENERS)
    tls["rsio"] = tls["http"] = context
    ports = {"http": 1, "rsio": 2, "tolliver": 3, "seguro": 4}
    urls = [e.url for e in banner_endpoints("h", ports, tls)]
    assert urls == [
        "rsios://h:2", "tolliver://h:3", "seguro://h:4", "https://h:1/healthz",
        "https://h:1/streams", "https://h:1/rsio/pub/<stream>", "wss://h:1/tube",
    ]  # fmt: skip


def test_serve_starts_every_listener_and_prints_the_same_banner(tmp_path: Path) -> None:
    """A real ``serve`` on 127.0.0.1 (every port 0): the banner's lines are the ones it
    printed before the registry, and every listener it names accepts a TCP connection."""
    config = load_config(None, {"data_dir": str(tmp_path), "http.port": 0, "rsio.port": 0,
                                "tolliver.port": 0, "seguro.port": 0}, environ={})  # fmt: skip
    out = io.StringIO()
    ready: list[Endpoint] = []

    async def main_() -> None:
        stop, up = asyncio.Event(), asyncio.Event()

        def on_ready(endpoints: list[Endpoint]) -> None:
            ready.extend(endpoints)
            up.set()

        task = asyncio.create_task(serve(config, out=out, stop=stop, on_ready=on_ready))
        await asyncio.wait([task, asyncio.create_task(up.wait())],
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        assert up.is_set(), task.result()
        for e in ready:
            port = int(e.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            with socket.create_connection((HOST, port), timeout=5):
                pass
        stop.set()
        await task

    run(main_())
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("tidewire ")
    assert lines[8].startswith("ready")
    printed, rows = [], []
    for line in lines[1:8]:
        match = re.fullmatch(r"  (\S+) +(\S+) +(.+)", line)
        assert match is not None, line
        label, url, what = match.groups()
        printed.append((label, url, what))
        assert line == f"  {label:<8} {url:<40} {what}"
        rows.append((label, re.sub(r":\d+", ":PORT", url), what))
    assert rows == [
        ("rsio", "rsio://127.0.0.1:PORT", "RS.io over TCP"),
        ("tolliver", "tolliver://127.0.0.1:PORT", "Tolliver (the hub's instance)"),
        ("seguro", "seguro://127.0.0.1:PORT", "Seguro (event log)"),
        ("http", "http://127.0.0.1:PORT/healthz", "health check"),
        ("http", "http://127.0.0.1:PORT/streams", "stream list (JSON)"),
        ("http", "http://127.0.0.1:PORT/rsio/pub/<stream>", "RS.io over HTTP (PUT)"),
        ("ws", "ws://127.0.0.1:PORT/tube", "RS.io over Tube (WebSocket)"),
    ]
    assert [(e.protocol, e.url, e.what) for e in ready] == printed
