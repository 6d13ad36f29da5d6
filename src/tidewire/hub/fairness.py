"""Who the event loop works for: each principal's share of the hub's loop time, and a fair turn.

The memory budget (:mod:`.budget`) bounds what a peer makes the hub *hold*; this bounds what a
peer makes the hub *do*. The hub is one event loop: a principal whose requests are costly (a
Tolliver handshake of a thousand channels, a Tube subscriber of highly compressible data that
makes the hub read and deflate gigabytes for a few megabytes on the wire, a flood of refused
requests) would otherwise take the loop from everyone else in proportion to its cost, since
asyncio serves ready callbacks in turn, not by the time each one takes.

Kafka's answer is the request quota (``request_percentage``: a principal's share of the broker's
request-handler time, enforced by muting its connections for a computed throttle time). Here
it is the same idea made work-conserving: the adapters measure the loop time they spend on a
connection's behalf (handling its input, writing its deliveries) with
:meth:`~tidewire.hub.Share.spend`, which charges the connection's principal here and answers
how long that connection should now wait before its next piece of work. The answer is 0
unless the loop is contended, that is, unless

* every principal's measured share together passes :attr:`FairnessLimits.busy`, and
* at least two principals are active (a lone principal may have the whole loop), and
* this principal's share is over its fair part, ``1 / active principals``;

then it is the time its decayed usage needs to fall back to its fair part (``half_life *
log2(share / fair)``; at most a half-life for a principal at twice its part, never over
:data:`MAX_DELAY`). ``anonymous`` (every peer that proved no identity, one principal as in the
memory budget) has a smaller part when the loop is contended: at most
:attr:`FairnessLimits.anonymous` (a quarter), so that unidentified peers cannot take most of a
hub from those it knows. (With no tokens or certificates configured everyone is anonymous:
one principal, never held back.) The adapters pause the connection's reading and its
deliveries that long (:mod:`tidewire.server`), so the other principals get the loop meanwhile.

Usage is an exponentially decayed sum of seconds spent (half-life :attr:`FairnessLimits.
half_life`): a principal spending a constant fraction ``r`` of the loop settles at
``r * half_life / ln 2``, so ``share = usage * ln 2 / half_life``. The sum of all principals is
kept as one more decayed counter, so each :meth:`LoopShares.spend` is O(1); counting the
active principals is a scan, done at most every :data:`SCAN_SECONDS`.

The clock is injected (tests pass a fake one). Hand-written: it is the hub's own scheduling policy,
a few lines of arithmetic no library offers in this shape.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .budget import Share

__all__ = ["FAIRNESS_DEFAULTS", "MAX_DELAY", "FairnessLimits", "LoopShares", "Throttle"]

MAX_DELAY = 1.0
"""The longest one throttle lasts (seconds), whatever the arithmetic says."""
SCAN_SECONDS = 0.01
"""How often the active principals are counted again (a scan of every principal)."""
ACTIVE_SHARE = 0.02
"""A principal using less than this share of the loop does not count as active."""
ANONYMOUS = "anonymous"
"""The principal of every peer that proved no identity (tidewire.hub.access.ANONYMOUS)."""
_LN2 = math.log(2)


@dataclass(frozen=True, slots=True)
class FairnessLimits:
    """``limits.fair_busy``, ``limits.anonymous_loop_share`` and the decay (docs/configuration.md,
    "Fair shares of the loop"). ``busy`` over 1 turns fair shares off (the measured shares
    never add up to more than 1)."""

    busy: float = 0.5
    anonymous: float = 0.25
    """The most of the loop anonymous peers (one principal) may take when it is contended,
    below their fair part when that is larger (``limits.anonymous_loop_share``)."""
    half_life: float = 0.2

    def __post_init__(self) -> None:
        if not (self.busy >= 0 and self.anonymous > 0 and self.half_life > 0):
            raise ValueError(f"fairness: need busy >= 0, anonymous > 0 and half_life > 0, "
                             f"got {self}")  # fmt: skip


FAIRNESS_DEFAULTS = FairnessLimits()


class LoopShares:
    """Every principal's decayed loop time; :meth:`spend` charges and answers the wait."""

    def __init__(self, limits: FairnessLimits = FAIRNESS_DEFAULTS,
                 clock: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        self.limits = limits
        self.clock = clock
        self._decay = _LN2 / limits.half_life  # per second
        self._usage: dict[str, tuple[float, float]] = {}  # principal -> (usage, as of)
        self._total = (0.0, clock())
        self._active = 0
        self._scanned = -math.inf
        self.throttles = 0
        """How many waits :meth:`spend` has answered (since start)."""
        self.throttled_seconds = 0.0
        """Their total (since start)."""

    def spend(self, principal: str, seconds: float) -> float:
        """Charge ``seconds`` of loop time to ``principal``; how long the connection that
        spent them should wait before its next piece of work (0: go on)."""
        now = self.clock()
        usage = self._decayed(self._usage.get(principal), now) + seconds
        self._usage[principal] = (usage, now)
        self._total = (self._decayed(self._total, now) + seconds, now)
        delay = self._delay(usage, now, principal)
        if delay:
            self.throttles += 1
            self.throttled_seconds += delay
        return delay

    def delay(self, principal: str) -> float:
        """How long a connection of ``principal`` should wait now (0: go on), charging
        nothing: e.g. before a new connection's first work."""
        now = self.clock()
        return self._delay(self._decayed(self._usage.get(principal), now), now, principal)

    def share(self, principal: str) -> float:
        """``principal``'s recent share of the loop (0 to about 1)."""
        return self._decayed(self._usage.get(principal), self.clock()) * self._decay

    def shares(self) -> dict[str, float]:
        """Every principal's recent share of the loop (those over 0.1 %), for the metrics."""
        now = self.clock()
        out = {p: self._decayed(u, now) * self._decay for p, u in self._usage.items()}
        return {p: s for p, s in out.items() if s >= 0.001}

    @property
    def busy(self) -> float:
        """Every principal's share together: how much of the loop measured work takes."""
        return self._decayed(self._total, self.clock()) * self._decay

    def _delay(self, usage: float, now: float, principal: str) -> float:
        limits = self.limits
        if self._decayed(self._total, now) * self._decay < limits.busy:
            return 0.0
        active = self._count_active(now)
        if active < 2:
            return 0.0
        fair = 1 / active if principal != ANONYMOUS else min(1 / active, limits.anonymous)
        over = usage * self._decay / fair  # its share over its fair part
        if over <= 1.0:
            return 0.0
        return min(MAX_DELAY, math.log(over) / self._decay)

    def _count_active(self, now: float) -> int:
        if now - self._scanned >= SCAN_SECONDS:
            self._scanned = now
            floor = ACTIVE_SHARE / self._decay
            usages = self._usage
            for principal, entry in list(usages.items()):
                if self._decayed(entry, now) < floor * 0.01:  # long idle: forgotten
                    del usages[principal]
            self._active = sum(self._decayed(e, now) >= floor for e in usages.values())
        return self._active

    def _decayed(self, entry: tuple[float, float] | None, now: float) -> float:
        if entry is None:
            return 0.0
        usage, then = entry
        return usage * math.exp(-self._decay * (now - then)) if now > then else usage


class Throttle:
    """A connection's waits for its fair share of the loop: :meth:`spent` charges loop time to
    ``share`` and, when the answer is a wait, calls ``pause(True)`` now and ``pause(False)``
    once it is over (one wait at a time)."""

    def __init__(self, share: Share, pause: Callable[[bool], None]) -> None:
        self.share = share
        self._pause = pause
        self._handle: asyncio.TimerHandle | None = None
        self.waits = 0
        """How many waits so far (tests and metrics)."""

    @property
    def waiting(self) -> bool:
        return self._handle is not None

    def spent(self, seconds: float) -> float:
        """Charge ``seconds``; the wait it earned (0: none), already begun."""
        wait = self.share.spend(seconds)
        if wait:
            self.hold(wait)
        return wait

    def check(self) -> None:
        """Wait now if the principal is over its fair share (charging nothing)."""
        if wait := self.share.wait():
            self.hold(wait)

    def hold(self, seconds: float) -> None:
        if self._handle is None:
            self.waits += 1
            self._pause(True)
            self._handle = asyncio.get_running_loop().call_later(seconds, self._over)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _over(self) -> None:
        self._handle = None
        self._pause(False)
