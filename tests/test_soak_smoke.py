"""benchmarks/soak.py, very short and without Spark: every flow moves events, every line has its
fields, the summary comes last and the exit code agrees with its verdict (the 10-minute soak
itself is run by hand: benchmarks/README.md); and its rule for flat memory, on the figures of
real runs."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"

INTERVAL_KEYS = {
    "interval", "warmup", "elapsed_s", "seconds", "in_per_s", "out_per_s", "p50_ms", "p99_ms",
    "latency_samples", "p99_ms_by_protocol", "slow_lag", "spark_rows_per_s", "spark_batches",
    "spark_lag", "rss_mb", "rss_peak_mb", "rss_interval_max_mb", "rss_interval_min_mb",
    "rss_mean_mb", "client_rss_mb", "shed", "errors", "reconnects", "last_error", "hub_warnings",
    "hub_last_warning",
}  # fmt: skip
SUMMARY_KEYS = {
    "completed", "interrupted", "hub_died", "intervals", "elapsed_s", "events_in", "events_out",
    "events_in_total", "events_out_total", "p50_ms", "p99_ms", "latency_samples",
    "rss_baseline_mb", "rss_last_mb", "rss_peak_mb", "rss_growth_ratio", "rss_slope_mb_per_min",
    "rss_slope_points", "rss_second_half_min_mb", "rss_second_half_max_mb",
    "rss_second_half_spread_mb", "rss_flat", "flat_rule", "errors", "reconnects", "shed",
    "hub_exit_code",
}  # fmt: skip
IN = {"rsio", "tolliver", "seguro"}
OUT = {"rsio", "tube", "http", "tolliver", "slow"}


def test_a_short_soak_reports_every_flow(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--duration", "6", "--interval", "2", "--no-spark",
         "--rate", "500", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    lines: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    context = f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-3000:]}"
    assert [line["soak"] for line in lines] == ["start"] + ["interval"] * 3 + ["summary"], context

    intervals, summary = lines[1:-1], lines[-1]
    for line in intervals:
        assert set(line) >= INTERVAL_KEYS, (INTERVAL_KEYS - set(line), context)
        assert set(line["in_per_s"]) == IN, context
        assert set(line["out_per_s"]) == OUT, context
        assert all(rate > 0 for rate in line["in_per_s"].values()), context
        assert all(rate > 0 for rate in line["out_per_s"].values()), context
        assert 0 < line["p50_ms"] <= line["p99_ms"], context
        assert 0 < line["rss_mb"] <= line["rss_peak_mb"], context
        assert line["rss_interval_min_mb"] <= line["rss_interval_max_mb"], context
        assert line["spark_rows_per_s"] is None, context  # (--no-spark)
    assert [line["interval"] for line in intervals] == [1, 2, 3]
    assert intervals[0]["warmup"]
    assert not any(line["warmup"] for line in intervals[1:])

    assert set(summary) >= SUMMARY_KEYS, (SUMMARY_KEYS - set(summary), context)
    assert summary["completed"], context
    assert summary["hub_exit_code"] == 0, context
    assert summary["errors"] == 0, context
    assert all(n > 0 for n in summary["events_in"].values()), context
    assert all(n > 0 for n in summary["events_out"].values()), context
    assert summary["rss_baseline_mb"] == intervals[0]["rss_mb"], context
    # the second half (from 3 s on) is the third interval alone
    assert summary["rss_second_half_min_mb"] == intervals[2]["rss_interval_min_mb"], context
    assert summary["rss_second_half_max_mb"] == intervals[2]["rss_interval_max_mb"], context
    assert done.returncode == (0 if summary["rss_flat"] else 1), context
    assert not list(tmp_path.iterdir()), "the soak's temporary directory is left behind"


@pytest.fixture
def soak(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks/_soak_measure.py, where the soak's rule is."""
    monkeypatch.syspath_prepend(str(SOAK.parent))
    monkeypatch.delitem(sys.modules, "_soak_measure", raising=False)
    return importlib.import_module("_soak_measure")


def points(soak: ModuleType, rss: list[tuple[float, float, float]]) -> list[Any]:
    """30-second intervals from (lowest, highest, end) one-second samples in MB."""
    return [soak.RssPoint(30.0 * i, 30.0, end, (low + high) / 2, low, high)
            for i, (low, high, end) in enumerate(rss)]  # fmt: skip


def test_the_rule_fails_the_growth_the_soak_found(soak: ModuleType) -> None:
    """The 10-minute soak before the fix of the log's in-memory tail: 0.9 MB a minute, steady
    from 58.8 MB, with the 1 MB of noise within an interval that a busy hub shows."""

    def at(t: float) -> float:
        return 58.8 + 0.9 * t / 60

    rss = [(at(30.0 * i), at(30.0 * (i + 1)) + 1.0, at(30.0 * (i + 1))) for i in range(20)]
    verdict = soak.RssVerdict.of(points(soak, rss), 600.0, 5.0)
    assert verdict.points == 10  # the intervals from 300 s on
    assert verdict.spread == pytest.approx(0.9 * 5 + 1.0)
    assert not verdict.flat
    assert verdict.slope == pytest.approx(0.9)


def test_the_rule_passes_a_warm_up_that_levels_off(soak: ModuleType) -> None:
    """After the fix: a climb while the caches fill (the first minutes), then flat within the
    noise of a busy hub (2 MB within an interval)."""
    climb = [(51.2, 59.4, 59.4), (59.5, 59.9, 59.9), (59.7, 60.6, 60.6), (60.6, 61.2, 61.2)]
    flat = [(61.0, 63.0, 62.4)] * 16
    verdict = soak.RssVerdict.of(points(soak, climb + flat), 600.0, 5.0)
    assert verdict.flat
    assert verdict.points == 10
    assert (verdict.low, verdict.high) == (61.0, 63.0)
    assert verdict.slope == pytest.approx(0.0)


def test_a_run_too_short_to_tell_is_not_flat(soak: ModuleType) -> None:
    only_warm_up = points(soak, [(50.0, 51.0, 51.0)])
    assert not soak.RssVerdict.of(only_warm_up, 30.0, 5.0).flat
    assert soak.RssVerdict.of(only_warm_up, 30.0, 5.0).spread is None
