"""The command line: ``serve`` as a real process (endpoints printed, graceful exit on signals,
clear refusal of a corrupt log) and the offline tools ``streams`` and ``dump``."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from certs import Pki
from serveproc import endpoint, fill, first_values, read_until, server
from tidewire.cli import main


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_endpoints_and_exits_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    fill(tmp_path)
    with server("--data-dir", str(tmp_path), "--http-port", "0") as proc:
        lines = read_until(proc, "ready")
        url = endpoint(lines, "/streams")
        assert url.startswith("http://127.0.0.1:")
        rsio = next(w for line in lines for w in line.split() if w.startswith("rsio://"))
        assert asyncio.run(first_values(rsio, "orders", 2)) == [b"hello", b"\x00\xff"]
        with urllib.request.urlopen(url, timeout=10) as response:
            streams = json.load(response)
        assert [(s["name"], s["events"], s["latest_id"]) for s in streams] == [
            ("orders", 2, 2),
            ("zeta", 5, 5),
        ]
        with urllib.request.urlopen(endpoint(lines, "/healthz"), timeout=10) as response:
            assert response.read() == b"ok\n"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None
        assert "stopped" in proc.stdout.read()


def test_serve_takes_settings_from_environment(tmp_path: Path) -> None:
    env = {"TIDEWIRE_DATA_DIR": str(tmp_path / "envdir"), "TIDEWIRE_HTTP_PORT": "0"}
    with server(env=env) as proc:
        lines = read_until(proc, "ready")
        assert str(tmp_path / "envdir") in lines[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_serve_refuses_a_second_server_on_the_same_directory(tmp_path: Path) -> None:
    with server("--data-dir", str(tmp_path), "--http-port", "0") as first:
        read_until(first, "ready")
        second = subprocess.run(
            [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", str(tmp_path),
             "--http-port", "0", "--rsio-port", "0", "--seguro-port", "0", "--tolliver-port", "0"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1
        assert "in use by another tidewire process" in second.stderr
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0


def test_serve_refuses_a_corrupt_log_naming_file_and_offset(tmp_path: Path) -> None:
    fill(tmp_path)
    segment = next((tmp_path / "orders").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[60] ^= 0xFF  # inside the first record's body
    segment.write_bytes(bytes(data))
    result = subprocess.run(
        [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", str(tmp_path),
         "--http-port", "0", "--rsio-port", "0", "--seguro-port", "0", "--tolliver-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert f"corrupt log file {segment} at byte offset 0: body CRC mismatch" in result.stderr
    assert segment.read_bytes() == bytes(data)  # refused, not "repaired"


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text("[http]\nprot = 1\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(config)])
    assert result.exit_code == 1
    assert "unknown setting 'http.prot'" in result.output
    result = CliRunner().invoke(main, ["serve", "--set", "novalue"])
    assert result.exit_code == 2


def test_offline_tools_report_bad_settings_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEWIRE_HTTP_PORT", "abc")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["dump", "orders"])  # (the default data directory)
    assert result.exit_code == 1
    assert "TIDEWIRE_HTTP_PORT: 'abc' is not a valid int" in result.output
    config = tmp_path / "t.toml"
    config.write_text('[log.streams."bad name"]\nretention_ms = 1\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(config)])
    assert result.exit_code == 1
    assert "log.streams: stream name 'bad name' holds whitespace" in result.output


def test_streams_table_and_json(tmp_path: Path) -> None:
    fill(tmp_path)
    result = CliRunner().invoke(main, ["streams", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()]
    assert rows[0] == ["STREAM", "EVENTS", "FIRST", "LATEST", "BYTES"]
    assert set(rows[1][0]) == {"─"}  # the header's rule, then a row per stream
    assert [r[:4] for r in rows[2:]] == [["orders", "2", "1", "2"], ["zeta", "5", "1", "5"]]
    zeta = os.path.getsize(next((tmp_path / "zeta").glob("*.log")))
    assert rows[3][4:] == [str(zeta), "B"]  # bytes for people (here under 1 KiB)
    result = CliRunner().invoke(main, ["streams", "--data-dir", str(tmp_path), "--json"])
    first = json.loads(result.output.splitlines()[0])
    size = os.path.getsize(next((tmp_path / "orders").glob("*.log")))
    assert first == {"name": "orders", "events": 2, "first_id": 1, "latest_id": 2, "bytes": size}


def test_dump_text_json_from_and_limit(tmp_path: Path) -> None:
    fill(tmp_path)
    result = CliRunner().invoke(main, ["dump", "orders", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["1\t1000\tk\thello", "2\t2000\t-\t\\x00\\xff"]
    result = CliRunner().invoke(
        main, ["dump", "zeta", "--data-dir", str(tmp_path), "--from", "2", "--limit", "2", "--json"]
    )
    events = [json.loads(line) for line in result.output.splitlines()]
    assert [(e["id"], e["key"], e["value"], e["timestamp"]) for e in events] == [
        (2, None, "eg==", 7),
        (3, None, "eg==", 7),
    ]


def test_dump_unknown_stream_and_missing_directory(tmp_path: Path) -> None:
    fill(tmp_path)
    result = CliRunner().invoke(main, ["dump", "nope", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "unknown stream 'nope'" in result.output
    result = CliRunner().invoke(main, ["streams", "--data-dir", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "no data directory" in result.output


def test_offline_tools_do_not_touch_a_torn_tail(tmp_path: Path) -> None:
    fill(tmp_path)
    segment = next((tmp_path / "zeta").glob("*.log"))
    with segment.open("ab") as f:
        f.write(b"\x01\x02\x03")  # a torn tail, as a live server could show mid-write
    before = segment.read_bytes()
    result = CliRunner().invoke(main, ["dump", "zeta", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0
    assert len(result.output.splitlines()) == 5
    assert segment.read_bytes() == before


def test_tail_follows_a_running_hub_over_rsio(tmp_path: Path) -> None:
    fill(tmp_path)
    with server("--data-dir", str(tmp_path), "--http-port", "0") as proc:
        lines = read_until(proc, "ready")
        rsio = next(w for line in lines for w in line.split() if w.startswith("rsio://"))
        result = subprocess.run(
            [sys.executable, "-m", "tidewire.cli", "tail", "zeta", "--url", rsio,
             "--from", "3", "--limit", "3"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["3\t7\t-\tz", "4\t7\t-\tz", "5\t7\t-\tz"]
        result = subprocess.run(
            [sys.executable, "-m", "tidewire.cli", "tail", "orders", "--url", rsio,
             "--limit", "1", "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert json.loads(result.stdout) == {
            "id": 1,
            "timestamp": 1000,
            "key": "aw==",
            "value": "aGVsbG8=",
        }
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_publish_lines_and_files_then_tail_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\x00\x01 two\nlines")
    with server("--data-dir", str(data), "--http-port", "0") as proc:
        lines = read_until(proc, "ready")
        rsio = next(w for line in lines for w in line.split() if w.startswith("rsio://"))
        cli = [sys.executable, "-m", "tidewire.cli"]
        result = subprocess.run(
            [*cli, "publish", "notes", "--url", rsio, "--key", "k", "--batch", "2"],
            input=b"one\ntwo\nthree", capture_output=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        # one line per durable batch of at most 2 events, then a summary on stderr
        assert result.stdout.decode().splitlines() == ["durable\t2\t1\t2", "durable\t1\t3\t3"]
        assert b"published 3 events to notes (ids 1..3)" in result.stderr
        result = subprocess.run(
            [*cli, "publish", "notes", str(blob), "--url", rsio, "--json"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"durable": 1, "first_id": 4, "last_id": 4}
        values = asyncio.run(first_values(rsio, "notes", 4))
        assert values == [b"one", b"two", b"three", blob.read_bytes()]
        result = subprocess.run(
            [*cli, "publish", "bad name", "--url", rsio], input=b"x\n",
            capture_output=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 1
        assert b"stream name 'bad name' holds whitespace" in result.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_seguro_save_and_read(tmp_path: Path) -> None:
    """``seguro save POINT VALUE...``: each value an event; ``-`` (or nothing): each line of
    stdin; ``--file F``: each file whole (``--file -``: all of stdin). Mixing values and files,
    or stdin twice, is a usage error (exit 2) that saves nothing."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_bytes(b"a")
    two.write_bytes(b"b\nc")
    with server("--data-dir", str(tmp_path / "data"), "--http-port", "0") as proc:
        lines = read_until(proc, "ready")
        url = next(w for line in lines for w in line.split() if w.startswith("seguro://"))
        cli = [sys.executable, "-m", "tidewire.cli", "seguro"]

        def save(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
            return subprocess.run([*cli, "save", "~zod", *args, "--url", url], input=stdin,
                                  capture_output=True, timeout=60)  # fmt: skip

        saved = save("-", stdin=b"hello")
        assert saved.returncode == 0, saved.stderr
        assert saved.stdout == b"committed 1 event(s) of ~zod: ids 1..1\n"
        saved = save("--file", str(one), "--file", str(two))
        assert saved.stdout == b"committed 2 event(s) of ~zod: ids 2..3\n"
        saved = save("ev1", "ünï", "", os.fsdecode(b"\xff\xfe"))  # not UTF-8: the bytes given
        assert saved.stdout == b"committed 4 event(s) of ~zod: ids 4..7\n"
        saved = save("x", "-", "y", stdin=b"l1\n\nl3\n")
        assert saved.stdout == b"committed 5 event(s) of ~zod: ids 8..12\n"
        saved = save(stdin=b"s1\ns2")
        assert saved.stdout == b"committed 2 event(s) of ~zod: ids 13..14\n"
        saved = save("--file", "-", stdin=b"whole\nstdin\n")
        assert saved.stdout == b"committed 1 event(s) of ~zod: ids 15..15\n"
        saved = save(stdin=b"")
        assert (saved.returncode, saved.stdout, saved.stderr) == (0, b"", b"nothing to save\n")
        for args in (("v", "--file", str(one)), ("-", "--file", "-"), ("-", "-")):
            refused = save(*args, stdin=b"never\n")
            assert refused.returncode == 2, (args, refused)
        read = subprocess.run([*cli, "read", "~zod", "--url", url, "--json"],
                              capture_output=True, timeout=60)  # fmt: skip
        rows = [json.loads(line) for line in read.stdout.splitlines()]
        datas = [b"hello", b"a", b"b\nc", b"ev1", "ünï".encode(), b"", b"\xff\xfe", b"x", b"l1",
                 b"", b"l3", b"y", b"s1", b"s2", b"whole\nstdin\n"]  # fmt: skip
        assert rows == [{"id": i, "data": base64.b64encode(data).decode()}
                        for i, data in enumerate(datas, 1)]  # fmt: skip
        assert b"sent 15 (1..15)" in read.stderr
        bad = subprocess.run([*cli, "read", "~zo", "--url", url], capture_output=True,
                             timeout=60)  # fmt: skip
        assert bad.returncode == 1
        assert b"is not an @p" in bad.stderr
        # the same events over RS.io: the point's stream is its @p
        rsio = next(w for line in lines for w in line.split() if w.startswith("rsio://"))
        assert asyncio.run(first_values(rsio, "~zod", 3)) == [b"hello", b"a", b"b\nc"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_url_takes_several_gateways_the_first_that_answers(tmp_path: Path) -> None:
    """``--url rsio://dead,live`` (the second entry without a scheme takes the first's): the
    command uses the gateway that answers; a malformed list is an error of ``--url``."""
    fill(tmp_path)
    with server("--data-dir", str(tmp_path), "--http-port", "0") as proc, \
            socket.socket() as dead:  # fmt: skip
        dead.bind(("127.0.0.1", 0))  # bound, never listening: refused
        lines = read_until(proc, "ready")
        rsio = next(w for line in lines for w in line.split() if w.startswith("rsio://"))
        both = f"rsio://127.0.0.1:{dead.getsockname()[1]},{rsio.removeprefix('rsio://')}"
        result = subprocess.run(
            [sys.executable, "-m", "tidewire.cli", "tail", "zeta", "--url", both,
             "--from", "3", "--limit", "1"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["3\t7\t-\tz"]
    bad = CliRunner().invoke(main, ["tail", "s", "--url", "127.0.0.1:1,rsio://h:2"])
    assert bad.exit_code == 2
    assert "--url" in bad.output


def test_tail_reports_an_unreachable_hub(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["tail", "s", "--url", "rsio://127.0.0.1:1"])
    assert result.exit_code == 1
    assert "Error:" in result.output


# --------------------------------------------------------------------------- security


def test_token_create_prints_a_token_that_its_table_accepts() -> None:
    from tidewire.hub.access import Tokens

    result = CliRunner().invoke(main, ["token", "create", "ci", "--days", "2"])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert token.startswith("ci.")
    assert len(token) > 40
    tokens = Tokens.parse(result.stderr)  # the comment line and the table are valid TOML
    assert tokens.authenticate(token, time.time()).name == "token:ci"
    assert tokens.by_name["ci"].expires is not None
    bad = CliRunner().invoke(main, ["token", "create", "a b"])
    assert bad.exit_code != 0
    assert "NAME" in bad.output


def test_serve_with_tls_tokens_and_acl_from_the_command_line(tmp_path: Path, pki: Pki) -> None:
    """The README's recipe: a token from `tidewire token create`, the hub on TLS with an ACL,
    then `tidewire publish` and `tidewire tail` over rsios:// with the token; a stream the
    token may not write is refused with the hub's reason."""
    runner = CliRunner()
    made = runner.invoke(main, ["token", "create", "ci"])
    token = made.stdout.strip()
    (tmp_path / "tokens.toml").write_text(made.stderr)
    (tmp_path / "acl.toml").write_text('[principal."token:ci"]\nread = ["*"]\nwrite = ["o*"]\n')
    args = ["--data-dir", str(tmp_path / "data"), "--http-port", "0", "--host", "0.0.0.0",
            "--set", f"tls.cert_file={pki.server_cert}", "--set", f"tls.key_file={pki.server_key}",
            "--set", f"tls.ca_file={pki.ca_file}",
            "--set", f"auth.tokens_file={tmp_path / 'tokens.toml'}",
            "--set", f"auth.acl_file={tmp_path / 'acl.toml'}"]  # fmt: skip
    with server(*args) as proc:
        lines = read_until(proc, "ready")
        rsios = next(w for line in lines for w in line.split() if w.startswith("rsios://"))
        url = rsios.replace("0.0.0.0", "127.0.0.1")
        common = ["--url", url, "--token", token, "--ca-file", pki.ca_file]
        ok = subprocess.run([sys.executable, "-m", "tidewire.cli", "publish", "orders", *common],
                            input="a\nb\n", capture_output=True, text=True, timeout=60)  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        tail = subprocess.run(
            [sys.executable, "-m", "tidewire.cli", "tail", "orders", "--limit", "2", *common],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert tail.returncode == 0, tail.stderr
        assert [line.split("\t")[-1] for line in tail.stdout.splitlines()] == ["a", "b"]
        refused = subprocess.run([sys.executable, "-m", "tidewire.cli", "publish", "secret",
                                  *common], input="x\n", capture_output=True, text=True,
                                 timeout=60)  # fmt: skip
        assert refused.returncode != 0
        assert "forbidden: token:ci may not write stream 'secret'" in refused.stderr
        plain = subprocess.run([sys.executable, "-m", "tidewire.cli", "tail", "orders", "--limit",
                                "1", "--url", url.replace("rsios:", "rsio:")],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert plain.returncode != 0  # clear text to a TLS port
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "without TLS" not in err
    assert "without an ACL" not in err
    assert "refused: token:ci may not write stream 'secret'" in err


def test_serve_warns_when_exposed_without_tls_or_acl(tmp_path: Path) -> None:
    with server("--data-dir", str(tmp_path), "--http-port", "0", "--host", "0.0.0.0") as proc:
        read_until(proc, "ready")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "listening on 0.0.0.0 without TLS for http, rsio, seguro, tolliver" in err
    assert "listening on 0.0.0.0 without an ACL" in err
