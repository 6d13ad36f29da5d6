"""Refusals counted in a row; refusal log lines rate-limited and summed up."""

from __future__ import annotations

import logging

import pytest

from tidewire.observe.throttle import LogThrottle, Refusals


def test_refusals_end_the_connection_after_limit_in_a_row() -> None:
    r = Refusals(limit=3)
    assert not r.refuse()
    assert not r.refuse()
    r.succeed()
    assert not r.refuse()
    assert not r.refuse()
    assert r.refuse()
    assert r.total == 5


def test_throttle_logs_a_burst_then_one_summary_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    throttle = LogThrottle(burst=2, interval=10.0, clock=lambda: now[0])
    logger = logging.getLogger("tidewire.test.throttle")
    with caplog.at_level(logging.WARNING, logger="tidewire.test.throttle"):
        logged = [throttle.log(logger, logging.WARNING, "refused %s", i) for i in range(1000)]
        assert logged[:2] == [True, True]
        assert not any(logged[2:])
        assert len(caplog.records) == 2
        now[0] = 10.0
        assert throttle.log(logger, logging.WARNING, "refused %s", "again")
    messages = [r.getMessage() for r in caplog.records]
    assert messages[2] == "... 998 more like 'refused' in the last 10s"
    assert messages[3] == "refused again"
    assert throttle.suppressed_total == 998
