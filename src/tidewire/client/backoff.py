"""Reconnect pacing shared by every tidewire client: exponential backoff with full jitter.

The n-th wait (n = 0, 1, ...) is drawn uniformly from ``[initial * 2**n * (1 - jitter),
initial * 2**n]``, capped at ``maximum``; a success (:meth:`Backoff.reset`) starts again at
``initial``. Jitter spreads the reconnects of many clients that lost the same hub, so that a
restarted hub is not hit by all of them in the same millisecond (the "thundering herd").

``attempts`` bounds the tries of one outage (``None``: forever); ``give_up_after`` bounds its
time in seconds. The clock and the random source are arguments so that tests need no sleeps:
:meth:`Backoff.next_delay` is pure, and :meth:`Backoff.wait` sleeps through ``sleep``.

Hand-written rather than a library (tenacity, backoff): it is 60 lines, and the clients need
the pacing as a value they can drive from their own reconnect loops, not a decorator.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..model import TidewireError

__all__ = ["NEVER", "Backoff", "GaveUp", "Retry"]


class GaveUp(TidewireError):
    """A client stopped reconnecting: ``attempts`` or ``give_up_after`` ran out."""

    def __init__(self, what: str, attempts: int, last: BaseException | None) -> None:
        super().__init__(f"{what}: gave up after {attempts} attempt(s): {last!r}")
        self.attempts = attempts
        self.last = last


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """How a client reconnects (immutable; every client takes one as ``retry=``)."""

    initial: float = 0.05
    maximum: float = 5.0
    jitter: float = 0.5  # the fraction of each wait that is random (0: none, 1: full jitter)
    attempts: int | None = None  # per outage; None: forever
    give_up_after: float | None = None  # seconds per outage; None: forever

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError("0 < initial <= maximum")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter is 0 to 1")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError("attempts is at least 1")


NEVER = Retry(attempts=1)  # one try, no reconnect


@dataclass(slots=True)
class Backoff:
    """The state of one client's reconnects (see the module docstring)."""

    retry: Retry = field(default_factory=Retry)
    rng: Callable[[], float] = random.random
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    failures: int = 0  # consecutive, in the current outage
    since: float | None = None  # when the current outage began

    def next_delay(self) -> float:
        """The wait before the next try (pure: it does not count a failure)."""
        ceiling = min(self.retry.maximum, self.retry.initial * 2.0 ** min(self.failures, 60))
        return ceiling * (1.0 - self.retry.jitter * self.rng())

    def failed(self, what: str, error: BaseException | None) -> float:
        """Count a failure; the wait before the next try, or :class:`GaveUp`."""
        now = self.clock()
        if self.since is None:
            self.since = now
        delay = self.next_delay()
        self.failures += 1
        r = self.retry
        if (r.attempts is not None and self.failures >= r.attempts) or (
            r.give_up_after is not None and now - self.since >= r.give_up_after
        ):
            raise GaveUp(what, self.failures, error) from error
        return delay

    async def wait(self, what: str, error: BaseException | None) -> None:
        """Count a failure and sleep before the next try (or raise :class:`GaveUp`)."""
        await self.sleep(self.failed(what, error))

    def reset(self) -> None:
        """A try succeeded: the next outage starts from ``initial``."""
        self.failures = 0
        self.since = None
