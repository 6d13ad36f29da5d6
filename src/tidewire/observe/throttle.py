"""Refusals counted, and their log lines rate-limited and aggregated.

A peer that sends thousands of refused requests (subscribes to a forbidden stream, offers with a
bad name) must not turn each into a log line: the first few of a kind are logged as they come,
then at most one line per ``interval`` says how many more there were::

    refused subscribe to 'secret.x': forbidden
    ... 12,345 more refusals like "refused subscribe ..." in the last 10s

:class:`Refusals` is one connection's count: :meth:`Refusals.refuse` returns True when the
connection has now been refused ``limit`` times in a row without a success in between, and the
adapter then ends it in its protocol's words. :class:`LogThrottle` is the rate limiter; one per
logger-and-kind is enough, and it takes ``now`` so tests need no sleeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LogThrottle", "Refusals"]


@dataclass(slots=True)
class LogThrottle:
    """At most ``burst`` lines per ``interval`` seconds; the rest counted and summed up in one
    line when the next interval begins (or at :meth:`flush`)."""

    burst: int = 5
    interval: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _window_start: float = field(default=-1e18, init=False)
    _logged: int = field(default=0, init=False)
    _suppressed: int = field(default=0, init=False)
    _sample: str = field(default="", init=False)
    suppressed_total: int = field(default=0, init=False)

    def log(self, logger: logging.Logger | logging.LoggerAdapter[Any], level: int, msg: str,
            *args: object) -> bool:  # fmt: skip
        """Log ``msg % args`` unless over the rate; True if it was logged."""
        now = self.clock()
        if now - self._window_start >= self.interval:
            self.flush(logger, level)
            self._window_start = now
            self._logged = 0
        if self._logged < self.burst:
            self._logged += 1
            logger.log(level, msg, *args)
            return True
        if not self._suppressed:
            self._sample = msg.split("%", 1)[0].strip()[:60]
        self._suppressed += 1
        self.suppressed_total += 1
        return False

    def flush(self, logger: logging.Logger | logging.LoggerAdapter[Any], level: int) -> None:
        """Log the summary line of what was suppressed, if anything was."""
        if self._suppressed:
            logger.log(level, "... %d more like %r in the last %gs", self._suppressed,
                       self._sample, self.interval)  # fmt: skip
            self._suppressed = 0


@dataclass(slots=True)
class Refusals:
    """One connection's refusals in a row; ``limit`` of them (no success between) ends it."""

    limit: int = 100
    in_a_row: int = 0
    total: int = 0

    def refuse(self) -> bool:
        """Count one refusal; True when the connection has reached the limit."""
        self.in_a_row += 1
        self.total += 1
        return self.in_a_row >= self.limit

    def succeed(self) -> None:
        """A request was accepted: the run of refusals is broken."""
        self.in_a_row = 0
