"""The memory budget: three shares (connection, principal, total), gauges, rebind, close."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.hub import Budget, BudgetLimits

MiB = 1024 * 1024


def small() -> Budget:
    return Budget(BudgetLimits(total=10 * MiB, principal=6 * MiB, connection=4 * MiB))


def test_a_connection_cannot_hold_more_than_its_share() -> None:
    budget = small()
    share = budget.share("anonymous", "127.0.0.1:1")
    assert share.try_hold("inbound", 3 * MiB)
    assert not share.try_hold("outbound", 2 * MiB)  # 5 > 4
    assert share.held == 3 * MiB
    assert share.gauge("outbound") == 0
    assert budget.refused == 1
    assert share.try_hold("outbound", 1 * MiB)
    assert share.available() == 0


def test_a_principal_shares_one_share_across_its_connections() -> None:
    budget = small()
    a, b = budget.share("anonymous"), budget.share("anonymous")
    other = budget.share("token:ci")
    assert a.try_hold("inbound", 4 * MiB)
    assert not b.try_hold("inbound", 3 * MiB)  # 7 > 6 for anonymous
    assert b.try_hold("inbound", 2 * MiB)
    assert other.try_hold("inbound", 4 * MiB)  # 10 = total
    assert budget.used == 10 * MiB
    assert budget.used_by("anonymous") == 6 * MiB
    c = budget.share("token:x")
    assert not c.try_hold("inbound", 1)  # the total is spent
    a.close()
    assert c.try_hold("inbound", 1)
    assert budget.used_by("anonymous") == 2 * MiB


def test_setting_a_gauge_replaces_it_and_lowering_always_succeeds() -> None:
    budget = small()
    share = budget.share()
    assert share.try_hold("inbound", 4 * MiB)
    assert share.try_hold("inbound", 1 * MiB)
    assert share.held == 1 * MiB
    share.hold("outbound", 9 * MiB)  # already in memory: recorded even over the share
    assert share.held == 10 * MiB
    assert not share.try_hold("inbound", 2 * MiB)
    assert share.try_hold("inbound", 0)
    share.release("outbound")
    assert share.held == 0
    assert budget.used == 0


def test_rebind_moves_holdings_to_the_authenticated_principal() -> None:
    budget = small()
    share = budget.share()
    share.hold("inbound", 100)
    share.rebind("token:ci")
    assert budget.used_by("anonymous") == 0
    assert budget.used_by("token:ci") == 100
    assert budget.principals() == {"token:ci": 100}
    assert budget.largest() == [("token:ci", "", 100)]


def test_close_returns_everything_and_is_idempotent() -> None:
    budget = small()
    share = budget.share()
    share.hold("a", 5)
    share.hold("b", 7)
    share.close()
    share.close()
    assert budget.used == 0
    assert share.closed
    assert not share.try_hold("a", 1)
    assert share.held == 0
    assert list(budget) == []


def test_limits_must_nest() -> None:
    with pytest.raises(ValueError, match="need 0 < connection"):
        BudgetLimits(total=1, principal=2, connection=1)


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("abc"), st.integers(0, 5 * MiB),
                          st.booleans()), max_size=60))  # fmt: skip
def test_the_totals_always_add_up_and_try_hold_never_exceeds(
    ops: list[tuple[int, str, int, bool]],
) -> None:
    budget = small()
    shares = [budget.share(p) for p in ("anonymous", "anonymous", "token:a", "token:b")]
    for i, kind, n, force in ops:
        before = budget.used
        if force:
            shares[i].hold(kind, n)
        elif shares[i].try_hold(kind, n) and budget.used > before:
            assert shares[i].held <= 4 * MiB
            assert budget.used_by(shares[i].principal) <= 6 * MiB
            assert budget.used <= 10 * MiB
        assert budget.used == sum(s.held for s in shares)
        for p in ("anonymous", "token:a", "token:b"):
            assert budget.used_by(p) == sum(s.held for s in shares if s.principal == p)
