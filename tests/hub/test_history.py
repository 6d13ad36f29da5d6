"""The dashboard's history (tidewire.hub.history) driven by a fake clock through
``Metrics.sample``: per-stream rates from the counters' deltas, the largest lag, the latency
percentiles over the last window of the histograms, the bounds in points and in streams, and
the columns ``/api/history`` hands out (``since`` for the polls that follow the first)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.hub import RESERVED_PREFIX
from tidewire.hub.history import SERIES, History, HistoryLimits, quantile
from tidewire.hub.traffic import LATENCY_BUCKETS, Latency, Metrics

T0 = 1_800_000_000.0  # the wall clock at the first sample (seconds)


def metrics(limits: HistoryLimits | None = None) -> Metrics:
    m = Metrics()
    m.history = History(limits)
    return m


def tick(m: Metrics, second: int) -> None:
    """The sampler's call ``second`` seconds after the first (monotonic 100 + second)."""
    m.sample(100.0 + second, wall=T0 + second)


def test_the_hidden_prefix_is_the_hubs_reserved_one() -> None:
    assert History().hidden_prefix == RESERVED_PREFIX


def test_rates_are_the_counters_deltas_over_the_time_between_samples() -> None:
    m = metrics()
    m.received("rsio", "orders", 5, 500)  # before the first sample: in no rate
    tick(m, 0)
    assert len(m.history) == 0  # (a baseline: a rate needs two samples)
    m.received("rsio", "orders", 10, 1000)
    m.received("tube", "orders", 2, 200)
    m.sent("tube", "orders", 4, 40)
    m.received("rsio", "clicks", 1, 10)
    tick(m, 1)
    m.received("rsio", "orders", 30, 3000)
    m.sample(102.5, wall=T0 + 2.5)  # 1.5 s later: a late tick divides by the time it took
    out = m.history.as_json()
    assert out["time"] == [int((T0 + 1) * 1000), int((T0 + 2.5) * 1000)]
    orders = out["streams"]["orders"]
    assert orders["events_in_rate"] == [12.0, 20.0]
    assert orders["bytes_in_rate"] == [1200.0, 2000.0]
    assert orders["events_out_rate"] == [4.0, 0.0]
    assert orders["bytes_out_rate"] == [40.0, 0.0]
    assert orders["max_lag"] == [0, 0]
    assert out["streams"]["clicks"]["events_in_rate"] == [1.0, 0.0]
    assert list(out["streams"]) == ["clicks", "orders"]
    assert sorted(orders) == sorted(SERIES)
    json.dumps(out, allow_nan=False)  # (valid JSON: no NaN anywhere)


def test_the_lag_is_each_streams_largest_and_the_hubs_own_streams_are_not_charted() -> None:
    m = metrics()
    lags = {"orders": 7, "idle": 3, f"{RESERVED_PREFIX}txns": 9}
    m.lags = lambda: lags
    m.received("rsio", f"{RESERVED_PREFIX}txns", 100, 100)
    tick(m, 0)
    tick(m, 1)
    lags["orders"] = 2
    tick(m, 2)
    out = m.history.as_json()
    assert sorted(out["streams"]) == ["idle", "orders"]
    assert out["streams"]["orders"]["max_lag"] == [7, 2]
    assert out["streams"]["idle"]["max_lag"] == [3, 3]
    assert out["streams"]["idle"]["events_in_rate"] == [0.0, 0.0]


def test_points_are_kept_for_history_seconds_and_since_gives_the_newer_ones() -> None:
    m = metrics(HistoryLimits(seconds=5))
    for second in range(20):
        m.received("rsio", "orders", second, second)
        tick(m, second)
    out = m.history.as_json()
    assert len(m.history) == 5
    assert out["time"] == [int((T0 + s) * 1000) for s in range(15, 20)]
    assert out["streams"]["orders"]["events_in_rate"] == [15.0, 16.0, 17.0, 18.0, 19.0]
    assert out["history_seconds"] == 5
    newer = m.history.as_json(since_ms=out["time"][2])
    assert newer["time"] == out["time"][3:]
    assert newer["streams"]["orders"]["events_in_rate"] == [18.0, 19.0]
    assert m.history.as_json(since_ms=out["time"][-1])["time"] == []
    assert m.history.as_json(since_ms=out["time"][-1])["streams"] == {}


def test_each_point_keeps_the_busiest_streams_only() -> None:
    m = metrics(HistoryLimits(streams=2))
    lags = {"lagging": 50}
    m.lags = lambda: lags
    tick(m, 0)
    m.received("rsio", "busy", 100, 100)
    m.received("rsio", "quiet", 1, 1)
    m.received("rsio", "bulky", 1, 10_000)  # (events first: 1 event of 10 KB < 100 events)
    tick(m, 1)
    m.received("rsio", "quiet", 500, 500)  # now the busiest; lagging outranks the idle rest
    tick(m, 2)
    out = m.history.as_json()
    assert sorted(out["streams"]) == ["bulky", "busy", "lagging", "quiet"]
    # first: busy (100 events), then bulky (as few events as quiet, more bytes)
    assert out["streams"]["busy"]["events_in_rate"] == [100.0, None]
    assert out["streams"]["bulky"]["bytes_in_rate"] == [10_000.0, None]
    assert out["streams"]["quiet"]["events_in_rate"] == [None, 500.0]
    # then: quiet, and lagging (idle, but behind) before the idle ones
    assert out["streams"]["lagging"]["max_lag"] == [None, 50]
    assert out["streams"]["lagging"]["events_in_rate"] == [None, 0.0]


def test_bytes_then_lag_break_ties_between_equally_busy_streams() -> None:
    m = metrics(HistoryLimits(streams=1))
    tick(m, 0)
    m.received("rsio", "small", 1, 1)
    m.received("rsio", "large", 1, 1000)
    tick(m, 1)
    assert list(m.history.as_json()["streams"]) == ["large"]


def test_latency_percentiles_come_from_the_last_window_of_the_histograms() -> None:
    m = metrics(HistoryLimits(latency_window=3))
    tick(m, 0)
    out = m.history.as_json()
    for _ in range(100):
        m.append_seconds.observe(0.0003)  # bucket (0.00025, 0.0005]
    m.fsync_seconds.observe(0.02)  # bucket (0.01, 0.025]
    tick(m, 1)
    out = m.history.as_json()
    assert out["append_seconds"]["p50"][0] == pytest.approx(0.00025 + 0.00025 * 0.5)
    assert out["append_seconds"]["p99"][0] == pytest.approx(0.00025 + 0.00025 * 0.99)
    assert out["fsync_seconds"]["p50"][0] == pytest.approx(0.01 + 0.015 * 0.5)
    for second in range(2, 6):  # nothing more observed: out of the 3-sample window at 4
        tick(m, second)
    out = m.history.as_json()
    assert out["append_seconds"]["p50"][1:3] == out["append_seconds"]["p50"][:1] * 2
    assert out["append_seconds"]["p50"][3:] == [None, None]
    assert out["fsync_seconds"]["p99"][3:] == [None, None]
    json.dumps(out, allow_nan=False)


def test_quantile_edges() -> None:
    bounds = (1.0, 2.0, 4.0)
    assert quantile(0.5, bounds, [0, 0, 0, 0]) is None
    assert quantile(0.5, bounds, [2, 0, 0, 0]) == 0.5  # the first bucket starts at 0
    assert quantile(0.99, bounds, [0, 0, 0, 5]) == 4.0  # above every bound: the largest
    assert quantile(0.5, bounds, [0, 1, 1, 0]) == 2.0  # the rank at a bucket's top
    assert quantile(1.0, bounds, [0, 1, 1, 0]) == 4.0


@given(st.lists(st.sampled_from((*LATENCY_BUCKETS, 20.0)), min_size=1, max_size=200),
       st.sampled_from((0.5, 0.9, 0.99)))  # fmt: skip
def test_quantile_lies_in_the_bucket_of_the_true_quantile(values: list[float], q: float) -> None:
    h = Latency()
    for v in values:
        h.observe(v)
    found = quantile(q, h.bounds, h.counts)
    assert found is not None
    ordered = sorted(values)
    true = ordered[max(0, math.ceil(q * len(ordered)) - 1)]
    index = min(h.bounds.index(true) if true in h.bounds else len(h.bounds), len(h.bounds) - 1)
    low = h.bounds[index - 1] if index else 0.0
    assert low <= found <= h.bounds[index]


def test_limits_are_checked() -> None:
    for bad in ({"seconds": 0}, {"streams": 0}, {"latency_window": 0}):
        with pytest.raises(ValueError, match="at least 1"):
            HistoryLimits(**bad)


def test_memory_is_bounded_by_points_and_streams() -> None:
    m = metrics(HistoryLimits(seconds=10, streams=3))
    tick(m, 0)
    for second in range(1, 40):
        for s in range(50):  # 50 streams, each busy at some point
            m.received("rsio", f"s{s}", (s * 7 + second) % 50, 1)
        tick(m, second)
    assert len(m.history) == 10
    out = m.history.as_json()
    for i in range(10):
        kept = [n for n, cols in out["streams"].items() if cols["events_in_rate"][i] is not None]
        assert len(kept) == 3


def test_a_failing_lag_source_costs_the_point_its_lag_not_the_sampler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = metrics()

    def broken() -> dict[str, int]:
        raise RuntimeError("storage gone")

    m.lags = broken
    tick(m, 0)
    m.received("rsio", "orders", 3, 3)
    tick(m, 1)
    tick(m, 2)
    out = m.history.as_json()
    assert out["streams"]["orders"]["events_in_rate"] == [3.0, 0.0]
    assert out["streams"]["orders"]["max_lag"] == [0, 0]
    assert m.rates("orders")[0] > 0  # (the rates' samples were taken too)
    failures = [r for r in caplog.records if "could not read" in r.getMessage()]
    assert len(failures) == 1  # (a line a minute, not one a second)
