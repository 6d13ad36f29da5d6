"""``tidewire dump --from-time`` (a read-only open looks the time up) and ``tidewire tail
--from-time`` (RS.io's ``from-time=`` against a real ``tidewire serve`` process, stopped by
pid), and the times they take (ms, RFC 3339, relative)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from serveproc import read_until, server
from tidewire.cli import main
from tidewire.cli_time import parse_time
from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch

NOW = 1_764_151_200_000  # 2025-11-26T10:00:00Z
STAMPS = [300, 100, 500, 200, 400]  # ids 1..5; not in time order


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("1700000000000", 1_700_000_000_000),
        ("2025-11-26T10:00:00Z", NOW),
        ("2025-11-26T10:00:00z", NOW),
        ("2025-11-26T11:00:00+01:00", NOW),
        ("2025-11-26T10:00:00.25Z", NOW + 250),
        ("1970-01-01T00:00:00Z", 0),
        ("-15m", NOW - 15 * 60_000),
        ("-500ms", NOW - 500),
        ("-2h", NOW - 7_200_000),
        ("-1d", NOW - 86_400_000),
        ("-30s", NOW - 30_000),
        (" 42 ", 42),
    ],
)
def test_times_are_ms_rfc_3339_or_relative(text: str, ms: int) -> None:
    assert parse_time(text, NOW) == ms


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2025-11-26T10:00:00", "no offset"),
        ("yesterday", "not a time"),
        ("-15", "not a time"),
        ("-15y", "not a time"),
        ("+15m", "not a time"),
        ("1.5", "not a time"),
        ("1969-12-31T23:59:59Z", "outside"),
        ("99999999999999999999", "outside"),
        ("-100000d", "outside"),
        ("", "not a time"),
    ],
)
def test_other_times_are_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_time(text, NOW)


def fill(data_dir: Path) -> None:
    async def go() -> None:
        config = LogConfig(fsync=False, defaults=StreamSettings(segment_bytes=4096))
        log = Log.open(str(data_dir), config)
        try:
            for i, ts in enumerate(STAMPS, 1):
                await log.append(Batch.build("t", [b"v%d" % i], timestamps=[ts]),
                                 assign_ids=True)  # fmt: skip
        finally:
            await log.close()

    asyncio.run(go())


def test_dump_from_time(tmp_path: Path) -> None:
    fill(tmp_path)
    args = ["dump", "t", "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--from-time", "350"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["3\t500\t-\tv3", "4\t200\t-\tv4", "5\t400\t-\tv5"]
    result = CliRunner().invoke(main, [*args, "--from-time", "1970-01-01T00:00:00.1Z"])
    assert [line.split("\t")[0] for line in result.output.splitlines()] == ["1", "2", "3", "4",
                                                                           "5"]  # fmt: skip
    result = CliRunner().invoke(main, [*args, "--from-time", "501"])
    assert (result.exit_code, result.output) == (0, "")  # nothing that new
    result = CliRunner().invoke(main, [*args, "--from-time", "-1m"])  # (1970 is long ago)
    assert (result.exit_code, result.output) == (0, "")
    result = CliRunner().invoke(main, [*args, "--from-time", "350", "--from", "2"])
    assert result.exit_code == 2
    assert "exclude each other" in result.output
    result = CliRunner().invoke(main, [*args, "--from-time", "soon"])
    assert result.exit_code == 2
    assert "'soon' is not a time" in result.output


def test_tail_from_time_over_rsio(tmp_path: Path) -> None:
    fill(tmp_path)
    with server("--data-dir", str(tmp_path), "--http-port", "0") as proc:
        lines = read_until(proc, "ready")
        rsio = next(w for line in lines for w in line.split() if w.startswith("rsio://"))
        tail = [sys.executable, "-m", "tidewire.cli", "tail", "t", "--url", rsio]
        result = subprocess.run([*tail, "--from-time", "450", "--limit", "3"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["3\t500\t-\tv3", "4\t200\t-\tv4", "5\t400\t-\tv5"]
        result = subprocess.run([*tail, "--from-time", "1", "--from", "latest"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 2
        assert "exclude each other" in result.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
