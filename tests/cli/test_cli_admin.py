"""The command line against a running hub's admin API (``tidewire streams``, ``tidewire
stats``), the load generator ``tidewire bench``, and the progress bars (stderr only, stdout
stays the data). The hub is a real ``tidewire serve`` process on 127.0.0.1 (tests/cli/test_cli.py's
``server``); the commands run in-process with click's CliRunner."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import tidewire
from certs import Pki
from serveproc import endpoint, fill, read_until, server
from tidewire.cli import main
from tidewire.client.admin import AdminClient, AdminError
from tidewire.server.guard import client_context

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Running:
    http: str  # http://127.0.0.1:port
    rsio: str  # rsio://127.0.0.1:port


def _urls(lines: list[str]) -> Running:
    http = endpoint(lines, "/healthz").removesuffix("/healthz")
    rsio = next(w for line in lines for w in line.split() if w.startswith(("rsio://", "rsios://")))
    return Running(http, rsio)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One hub for the module (no ACL); each test uses streams of its own."""
    data = tmp_path_factory.mktemp("hub")
    with server("--data-dir", str(data), "--http-port", "0", "--set", "log_level=warning") as proc:
        yield _urls(read_until(proc, "ready"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def publish(url: str, stream: str, n: int, **credentials: Any) -> None:
    async def go() -> None:
        async with asyncio.timeout(30), tidewire.connect(url, **credentials) as client:
            await client.publish(stream, [b"event %d" % i for i in range(n)])

    asyncio.run(go())


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def rows(text: str) -> list[list[str]]:
    """A table's lines, split on blanks (rules and blank lines left out)."""
    return [line.split() for line in text.splitlines()
            if line.strip() and not set(line.strip()) <= {"─"}]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- streams


def test_streams_asks_the_running_hub(hub: Running) -> None:
    publish(hub.rsio, "listed", 3)
    result = invoke("streams", "--url", hub.http)
    assert result.exit_code == 0, result.output
    table = rows(result.stdout)
    assert table[0] == ["STREAM", "EVENTS", "FIRST", "LATEST", "BYTES", "IN", "EV/S", "OUT",
                        "EV/S"]  # fmt: skip
    assert ["listed", "3", "1", "3"] in [r[:4] for r in table]
    # the URL from the environment too; one JSON object per stream, with the rates
    result = invoke("streams", "--json", env={"TIDEWIRE_HTTP_URL": hub.http})
    assert result.exit_code == 0, result.output
    listed = [json.loads(line) for line in result.stdout.splitlines()]
    row = next(r for r in listed if r["name"] == "listed")
    assert row["events"] == 3
    assert (row["first_id"], row["latest_id"]) == (1, 3)
    assert row["bytes"] > 0
    assert set(row) == {"name", "events", "first_id", "latest_id", "bytes", "events_in_rate",
                        "events_out_rate", "bytes_in_rate", "bytes_out_rate"}  # fmt: skip
    assert all(not r["name"].startswith("_tidewire.") for r in listed)


def test_streams_internal_lists_the_hubs_own_streams(hub: Running) -> None:
    async def internal() -> list[str]:
        async with AdminClient(hub.http) as admin:
            return [s["name"] for s in await admin.streams(internal=True)]

    names = asyncio.run(internal())
    assert any(name.startswith("_tidewire.") for name in names)  # (Tolliver's state at least)
    result = invoke("streams", "--url", hub.http, "--internal", "--json")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["name"] for line in result.stdout.splitlines()] == names


# --------------------------------------------------------------------------- stats


def test_stats_json_is_the_whole_api(hub: Running) -> None:
    publish(hub.rsio, "counted", 4)
    result = invoke("stats", "--url", hub.http, "--json")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert set(stats) == {"overview", "streams", "connections", "subscriptions", "tolliver"}
    overview = stats["overview"]
    assert overview["version"] == tidewire.__version__
    for key in ("uptime_seconds", "streams", "events_in", "events_out", "events_in_rate",
                "events_out_rate", "bytes_in_rate", "bytes_out_rate"):  # fmt: skip
        assert key in overview
    assert overview["events_in"] >= 4
    assert set(overview["connections"]) >= {"rsio", "http", "tube", "tolliver", "seguro"}
    assert "counted" in [s["name"] for s in stats["streams"]]
    assert set(stats["tolliver"]) >= {"instance", "peers"}


def test_stats_tables_show_connections_and_subscriptions(hub: Running) -> None:
    publish(hub.rsio, "watched", 5)
    tail = subprocess.Popen(
        [sys.executable, "-m", "tidewire.cli", "tail", "watched", "--url", hub.rsio],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        async def subscribed() -> None:
            async with asyncio.timeout(30), AdminClient(hub.http) as admin:
                for _ in range(600):  # (polls the hub: no event to wait on)
                    subs = await admin.subscriptions()
                    if any(s["stream"] == "watched" and s["lag"] == 0 for s in subs):
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"no caught-up subscription to 'watched': {subs}")

        asyncio.run(subscribed())
        result = invoke("stats", "--url", hub.http)
        assert result.exit_code == 0, result.output
        table = rows(result.stdout)
        assert f"tidewire {tidewire.__version__} at {hub.http}:" in result.stdout
        assert ["PROTOCOL", "CONNECTIONS", "SUBSCRIPTIONS", "BYTES", "IN", "BYTES", "OUT"] in table
        rsio = next(r for r in table if r[0] == "rsio")
        assert int(rsio[1]) >= 1  # connections
        assert int(rsio[2]) >= 1  # subscriptions
        sub = next(r for r in table if r[:2] == ["watched", "rsio"])
        # stream, protocol, connection, next id, delivered, demand, lag
        assert sub[3:5] == ["6", "5"]
        assert sub[-1] == "0"
        assert ["watched", "5", "1", "5"] in [r[:4] for r in table]  # the streams table
        assert any(r[:2] == ["PEER", "ADDRESS"] for r in table)  # Tolliver's

        # --watch (its hidden --count bounds it): off a terminal, each refresh is printed
        result = invoke("stats", "--url", hub.http, "--watch", "0.1", "--count", "2")
        assert result.exit_code == 0, result.output
        assert result.stdout.count(f"tidewire {tidewire.__version__} at") == 2
        result = invoke("stats", "--url", hub.http, "--watch", "0.1", "--count", "2", "--json")
        assert [set(json.loads(line)) for line in result.stdout.splitlines()] == [
            {"overview", "streams", "connections", "subscriptions", "tolliver"}
        ] * 2
    finally:
        tail.kill()
        tail.wait(timeout=10)


# --------------------------------------------------------------------------- errors


def test_a_hub_that_is_not_running_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for command in ("streams", "stats"):
        result = invoke(command, "--url", url)
        assert result.exit_code == 1
        assert f"Error: cannot reach the hub at {url}: connection refused" in result.stderr
        assert "is the hub running?" in result.stderr
        assert "Traceback" not in result.output
    result = invoke("streams", "--url", "ftp://127.0.0.1:7480")
    assert result.exit_code == 2
    assert "not an http:// or https:// URL" in result.stderr


def test_tls_tokens_and_the_monitor_right(tmp_path: Path, pki: Pki) -> None:
    """On a hub with TLS, tokens and an ACL, the admin API answers only a principal granted
    ``monitor``: no or a bad token is 401, a token without it 403 (the command says what to
    do); a CA file makes http:// https://, as it makes rsio:// rsios://."""
    runner = CliRunner()
    ops = runner.invoke(main, ["token", "create", "ops"])
    ci = runner.invoke(main, ["token", "create", "ci"])
    (tmp_path / "tokens.toml").write_text(ops.stderr + ci.stderr)
    (tmp_path / "acl.toml").write_text('[principal."token:ops"]\nmonitor = true\nread = ["*"]\n'
                                       '[principal."token:ci"]\nread = ["*"]\nwrite = ["*"]\n')
    args = ["--data-dir", str(tmp_path / "data"), "--http-port", "0",
            "--set", f"tls.cert_file={pki.server_cert}", "--set", f"tls.key_file={pki.server_key}",
            "--set", f"tls.ca_file={pki.ca_file}",  # (Tolliver's peers: mutual TLS)
            "--set", f"auth.tokens_file={tmp_path / 'tokens.toml'}",
            "--set", f"auth.acl_file={tmp_path / 'acl.toml'}"]  # fmt: skip
    with server(*args) as proc:
        urls = _urls(read_until(proc, "ready"))
        assert urls.http.startswith("https://127.0.0.1:")
        ci_token, ops_token = ci.stdout.strip(), ops.stdout.strip()
        publish(urls.rsio, "guarded", 2, token=ci_token, ssl=client_context(pki.ca_file))
        tls = ["--url", urls.http, "--ca-file", pki.ca_file]

        for token in (None, "ops.not-the-token"):
            result = invoke("stats", *tls, *(["--token", token] if token else []))
            assert result.exit_code == 1
            assert "Error: 401 Unauthorized: " in result.stderr
            assert "give a token with --token" in result.stderr
        result = invoke("streams", *tls, "--token", ci_token)
        assert result.exit_code == 1
        assert "Error: 403 Forbidden: " in result.stderr
        assert "monitor = true" in result.stderr

        # ops may: by its https:// URL, or by http:// with the CA (made https://)
        result = invoke("stats", *tls, "--token", ops_token, "--json")
        assert result.exit_code == 0, result.output
        assert "guarded" in [s["name"] for s in json.loads(result.stdout)["streams"]]
        http = urls.http.replace("https:", "http:", 1)
        result = invoke("streams", "--url", http, "--ca-file", pki.ca_file, "--token", ops_token)
        assert result.exit_code == 0, result.output
        assert ["guarded", "2", "1", "2"] in [r[:4] for r in rows(result.stdout)]
        # without the CA the hub's certificate is not trusted: an error, not a traceback
        result = invoke("stats", "--url", urls.http, "--token", ops_token)
        assert result.exit_code == 1
        assert f"Error: TLS with the hub at {urls.http} failed: " in result.stderr
        assert "certificate verify failed" in result.stderr
        assert "--ca-file names the CA" in result.stderr
        assert "Traceback" not in result.output

        async def refused() -> AdminError:
            with pytest.raises(AdminError) as caught:
                async with AdminClient(urls.http, "bad", client_context(pki.ca_file)) as admin:
                    await admin.overview()
            return caught.value

        error = asyncio.run(refused())
        assert error.status == 401
        assert error.message
        assert str(error) == f"401 Unauthorized: {error.message}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


# --------------------------------------------------------------------------- bench


def test_bench_publishes_reads_back_and_reports(hub: Running) -> None:
    publish(hub.rsio, "benched", 7)
    result = invoke("bench", "--url", hub.rsio, "--stream", "benched", "--events", "2000",
                    "--batch", "300", "--size", "50", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = {f["name"]: f for f in map(json.loads, result.stdout.splitlines())}
    assert set(figures) == {
        "publish_events_per_second", "publish_mb_per_second", "subscribe_events_per_second",
        "subscribe_mb_per_second", "commit_latency_p50_ms", "commit_latency_p99_ms",
        "first_id", "last_id",
    }  # fmt: skip
    for name in ("publish", "subscribe"):
        assert figures[f"{name}_events_per_second"]["value"] > 0
        assert figures[f"{name}_events_per_second"]["unit"] == "events/s"
        assert figures[f"{name}_mb_per_second"]["unit"] == "MB/s"
    p50, p99 = figures["commit_latency_p50_ms"]["value"], figures["commit_latency_p99_ms"]["value"]
    assert 0 < p50 <= p99
    assert (figures["first_id"]["value"], figures["last_id"]["value"]) == (8, 2007)
    assert result.stderr == ""  # no terminal, no --progress: no bars

    async def events() -> int:
        async with AdminClient(hub.http) as admin:
            return next(s["events"] for s in await admin.streams() if s["name"] == "benched")

    assert asyncio.run(events()) == 2007

    # the summary as a table; the bars on stderr with --progress
    result = invoke("bench", "--url", hub.rsio, "--stream", "benched", "--events", "10",
                    "--progress")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "10 events of 100 B to benched (ids 2008..2017), in batches of 1000" in result.stdout
    assert {r[0] for r in rows(result.stdout)} >= {"publish", "subscribe"}
    assert "commit latency (submit to receipt) over 1 batch(es): p50" in result.stdout
    assert "publish benched" in result.stderr
    assert "subscribe benched" in result.stderr
    assert "10/10" in result.stderr


def test_bench_reports_an_unreachable_hub() -> None:
    result = invoke("bench", "--url", f"rsio://127.0.0.1:{free_port()}", "--events", "10")
    assert result.exit_code == 1
    assert "Error:" in result.stderr
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------- dump --progress


def test_dump_progress_goes_to_stderr_only(tmp_path: Path) -> None:
    fill(tmp_path)
    plain = invoke("dump", "zeta", "--data-dir", str(tmp_path), "--json")
    assert plain.exit_code == 0, plain.output
    assert plain.stderr == ""  # no terminal: no bar
    result = invoke("dump", "zeta", "--data-dir", str(tmp_path), "--json", "--progress")
    assert result.exit_code == 0, result.output
    assert result.stdout == plain.stdout  # the events, untouched
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [1, 2, 3, 4, 5]
    assert "dump zeta" in result.stderr
    assert "5/5 events" in result.stderr
    # the total follows --from and --limit
    result = invoke("dump", "zeta", "--data-dir", str(tmp_path), "--from", "2", "--limit", "3",
                    "--progress")  # fmt: skip
    assert len(result.stdout.splitlines()) == 3
    assert "3/3 events" in result.stderr
    result = invoke("dump", "zeta", "--data-dir", str(tmp_path), "--from", "4", "--progress")
    assert "2/2 events" in result.stderr


def test_the_progress_bar_shows_on_a_terminal_by_default(tmp_path: Path) -> None:
    """stderr a terminal (a pseudo-terminal here) and stdout a file: the bar is drawn."""
    fill(tmp_path)
    leader, follower = pty.openpty()
    out = tmp_path / "out.txt"
    drawn = b""
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidewire.cli", "dump", "zeta", "--data-dir", str(tmp_path)],
            stdout=stdout, stderr=follower,
        )  # fmt: skip
    os.close(follower)
    try:
        deadline = time.monotonic() + 60
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([leader], [], [], left)[0]:
                break
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed (the process is done)
                break
            if not chunk:
                break
            drawn += chunk
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(leader)
    assert len(out.read_text().splitlines()) == 5
    assert b"dump zeta" in drawn
    assert b"5/5" in drawn
