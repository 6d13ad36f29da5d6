"""benchmarks/soak.py, very short and without Spark: every flow moves events, every line has its
fields, the summary comes last and the exit code agrees with its verdict (the 10-minute soak
itself is run by hand: benchmarks/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"

INTERVAL_KEYS = {
    "interval", "warmup", "elapsed_s", "seconds", "in_per_s", "out_per_s", "p50_ms", "p99_ms",
    "latency_samples", "p99_ms_by_protocol", "slow_lag", "spark_rows_per_s", "spark_batches",
    "spark_lag", "rss_mb", "rss_peak_mb", "rss_interval_max_mb", "rss_mean_mb", "client_rss_mb",
    "shed", "errors", "reconnects", "last_error", "hub_warnings", "hub_last_warning",
}  # fmt: skip
SUMMARY_KEYS = {
    "completed", "interrupted", "hub_died", "intervals", "elapsed_s", "events_in", "events_out",
    "events_in_total", "events_out_total", "p50_ms", "p99_ms", "latency_samples",
    "rss_baseline_mb", "rss_last_mb", "rss_peak_mb", "rss_growth_ratio", "rss_slope_mb_per_min",
    "rss_slope_points", "rss_flat", "flat_rule", "errors", "reconnects", "shed", "hub_exit_code",
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
    assert done.returncode == (0 if summary["rss_flat"] else 1), context
    assert not list(tmp_path.iterdir()), "the soak's temporary directory is left behind"
