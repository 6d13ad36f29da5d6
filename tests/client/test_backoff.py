"""The reconnect pacing every client shares (tidewire.client.backoff): exponential growth, the
cap, jitter within its bounds, reset, and giving up by attempts or by time, all on a fake clock,
a fixed random source and a recording sleep (no test waits for a timer)."""

from __future__ import annotations

import asyncio
import random

import pytest

from tidewire.client.backoff import NEVER, Backoff, GaveUp, Retry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def delays(backoff: Backoff, n: int) -> list[float]:
    return [backoff.failed("hub", None) for _ in range(n)]


def test_delays_double_from_initial() -> None:
    backoff = Backoff(Retry(initial=0.1, maximum=100, jitter=0))
    assert delays(backoff, 5) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert backoff.failures == 5


def test_delays_are_capped_at_the_maximum() -> None:
    backoff = Backoff(Retry(initial=1, maximum=5, jitter=0))
    assert delays(backoff, 6) == [1, 2, 4, 5, 5, 5]
    backoff.failures = 10_000  # no overflow however long the outage
    assert backoff.next_delay() == 5


@pytest.mark.parametrize(("draw", "expected"), [(0.0, 0.8), (0.5, 0.6), (0.999, 0.4004)])
def test_jitter_takes_its_fraction_off_the_ceiling(draw: float, expected: float) -> None:
    backoff = Backoff(Retry(initial=0.8, maximum=10, jitter=0.5), rng=lambda: draw)
    assert backoff.next_delay() == pytest.approx(expected)


@pytest.mark.parametrize("jitter", [0.0, 0.25, 1.0])
def test_jitter_stays_within_its_bounds(jitter: float) -> None:
    retry = Retry(initial=0.05, maximum=3.0, jitter=jitter)
    backoff = Backoff(retry, rng=random.Random(1234).random)
    seen: list[float] = []
    for n in range(40):
        ceiling = min(retry.maximum, retry.initial * 2**n)
        delay = backoff.failed("hub", None)
        assert ceiling * (1 - jitter) <= delay <= ceiling
        seen.append(delay / ceiling)
    if jitter:  # it does spread: not every wait is the ceiling
        assert min(seen) < 1 - jitter / 2


def test_next_delay_is_pure() -> None:
    backoff = Backoff(Retry(initial=0.1, jitter=0))
    assert backoff.next_delay() == backoff.next_delay() == 0.1
    assert backoff.failures == 0
    assert backoff.since is None


def test_reset_starts_again_from_initial() -> None:
    clock = Clock()
    backoff = Backoff(Retry(initial=0.1, maximum=10, jitter=0, attempts=3), clock=clock)
    delays(backoff, 2)
    assert backoff.since == 100.0
    backoff.reset()
    state: tuple[int, float | None] = (backoff.failures, backoff.since)
    assert state == (0, None)
    assert backoff.next_delay() == 0.1
    assert delays(backoff, 2) == pytest.approx([0.1, 0.2])  # a new outage's attempts


def test_attempts_bound_one_outage() -> None:
    backoff = Backoff(Retry(initial=0.1, jitter=0, attempts=3))
    boom = ConnectionRefusedError("refused")
    backoff.failed("rsio://h:1", boom)
    backoff.failed("rsio://h:1", boom)
    with pytest.raises(GaveUp) as info:
        backoff.failed("rsio://h:1", boom)
    assert info.value.attempts == 3
    assert info.value.last is boom
    assert info.value.__cause__ is boom
    assert "rsio://h:1: gave up after 3 attempt(s)" in str(info.value)


def test_never_tries_once() -> None:
    with pytest.raises(GaveUp):
        Backoff(NEVER).failed("hub", None)


def test_give_up_after_counts_from_the_first_failure() -> None:
    clock = Clock()
    backoff = Backoff(Retry(initial=1, maximum=1, jitter=0, give_up_after=2.5), clock=clock)
    clock.now = 200.0
    assert backoff.failed("hub", None) == 1  # the outage begins now
    clock.now = 201.0
    assert backoff.failed("hub", None) == 1
    clock.now = 202.4
    assert backoff.failed("hub", None) == 1
    clock.now = 202.5
    with pytest.raises(GaveUp) as info:
        backoff.failed("hub", None)
    assert info.value.attempts == 4


def test_wait_sleeps_through_the_injected_sleep() -> None:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    async def main() -> None:
        backoff = Backoff(Retry(initial=0.5, maximum=1.5, jitter=0, attempts=4), sleep=sleep)
        for _ in range(3):
            await backoff.wait("hub", None)
        with pytest.raises(GaveUp):
            await backoff.wait("hub", None)

    asyncio.run(main())
    assert slept == [0.5, 1.0, 1.5]  # (no sleep before giving up)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0},
        {"initial": 2, "maximum": 1},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"attempts": 0},
    ],
)
def test_retry_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each message is the case's own
        Retry(**kwargs)  # type: ignore[arg-type]
