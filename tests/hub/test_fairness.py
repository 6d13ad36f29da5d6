"""The hub's fair shares of its event loop (tidewire.hub.fairness), on a fake clock."""

from __future__ import annotations

import math

import pytest

from tidewire.hub import Budget, FairnessLimits, LoopShares
from tidewire.hub.fairness import MAX_DELAY


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(shares: LoopShares, clock: Clock, rates: dict[str, float], seconds: float,
        step: float = 0.01) -> dict[str, float]:  # fmt: skip
    """Each principal spends ``rate`` of every ``step`` for ``seconds``: the most each was
    told to wait."""
    waits = dict.fromkeys(rates, 0.0)
    for _ in range(round(seconds / step)):
        clock.now += step
        for principal, rate in rates.items():
            waits[principal] = max(waits[principal], shares.spend(principal, rate * step))
    return waits


def test_a_lone_principal_may_have_the_whole_loop() -> None:
    clock = Clock()
    shares = LoopShares(clock=clock)
    assert run(shares, clock, {"a": 0.95}, 2.0) == {"a": 0.0}
    assert shares.share("a") == pytest.approx(0.95, rel=0.05)
    assert shares.busy == pytest.approx(0.95, rel=0.05)


def test_over_its_fair_part_of_a_busy_loop_a_principal_waits_the_others_do_not() -> None:
    clock = Clock()
    limits = FairnessLimits(busy=0.5, half_life=0.2)
    shares = LoopShares(limits, clock=clock)
    waits = run(shares, clock, {"heavy": 0.8, "light": 0.15}, 2.0)
    assert waits["light"] == 0.0
    # its share 0.8 against a fair part of 1/2: the time its usage needs to halve... and more
    expected = limits.half_life * math.log2(0.8 * 2)
    assert waits["heavy"] == pytest.approx(expected, rel=0.1)
    assert shares.throttles > 0
    assert shares.throttled_seconds > 0
    assert shares.delay("light") == 0.0
    assert shares.delay("heavy") > 0


def test_no_wait_while_the_loop_is_not_busy() -> None:
    clock = Clock()
    shares = LoopShares(FairnessLimits(busy=0.5), clock=clock)
    # 0.4 of the loop is over the fair part of two (0.2 each would be fair) but the loop idles
    assert run(shares, clock, {"heavy": 0.35, "light": 0.05}, 2.0) == {"heavy": 0.0, "light": 0.0}
    assert shares.throttles == 0


def test_fair_shares_off_when_busy_is_over_one() -> None:
    clock = Clock()
    shares = LoopShares(FairnessLimits(busy=1.5), clock=clock)
    assert run(shares, clock, {"heavy": 0.9, "light": 0.09}, 2.0) == {"heavy": 0.0, "light": 0.0}


def test_principals_below_the_active_share_do_not_count() -> None:
    """A principal at 1 % of the loop does not make a busy lone one wait."""
    clock = Clock()
    shares = LoopShares(clock=clock)
    assert run(shares, clock, {"heavy": 0.9, "idle": 0.01}, 2.0)["heavy"] == 0.0


def test_waits_are_bounded_and_usage_decays_and_is_forgotten() -> None:
    clock = Clock()
    shares = LoopShares(FairnessLimits(busy=0.1, half_life=5.0), clock=clock)
    waits = run(shares, clock, {"a": 0.9, "b": 0.05, "c": 0.04}, 10.0)
    assert 0 < waits["a"] <= MAX_DELAY
    clock.now += 60.0  # twelve half-lives idle
    assert shares.share("a") < 0.001
    assert shares.shares() == {}
    assert shares.delay("a") == 0.0


def test_a_share_spends_for_its_principal_and_follows_a_rebind() -> None:
    clock = Clock()
    budget = Budget(loop=LoopShares(clock=clock))
    share = budget.share("anonymous", "127.0.0.1:1")
    clock.now += 0.1
    assert share.spend(0.05) == 0.0
    share.rebind("token:good")
    clock.now += 0.1
    share.spend(0.05)
    assert set(budget.loop.shares()) == {"anonymous", "token:good"}
    assert budget.loop.share("token:good") > budget.loop.share("anonymous")
    assert share.wait() == 0.0


def test_anonymous_peers_get_at_most_a_quarter_of_a_contended_loop() -> None:
    """Two principals: a named one may have half, anonymous peers together a quarter."""
    clock = Clock()
    shares = LoopShares(FairnessLimits(busy=0.5, anonymous=0.25), clock=clock)
    waits = run(shares, clock, {"anonymous": 0.4, "token:good": 0.2}, 2.0)
    assert waits["token:good"] == 0.0
    assert waits["anonymous"] > 0.0  # (0.4 is under half, over a quarter)
    clock = Clock()
    shares = LoopShares(FairnessLimits(busy=0.5, anonymous=0.25), clock=clock)
    waits = run(shares, clock, {"token:a": 0.4, "token:good": 0.2}, 2.0)
    assert waits == {"token:a": 0.0, "token:good": 0.0}


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="busy >= 0"):
        FairnessLimits(busy=-1)
    with pytest.raises(ValueError, match="half_life > 0"):
        FairnessLimits(half_life=0)
    with pytest.raises(ValueError, match="anonymous > 0"):
        FairnessLimits(anonymous=0)
