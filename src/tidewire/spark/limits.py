"""Admission control of the ``tidewire`` streaming source, as Spark's Kafka source does it:
pure decisions, the clock passed in (``now_ms``), unit-tested without a JVM.

* ``maxOffsetsPerTrigger`` (alias ``maxEventsPerTrigger``): :func:`cap_offsets` shares the
  cap over the streams **in proportion to what each has waiting**, as Kafka's
  ``KafkaMicroBatchStream.rateLimit`` does (``limit * size / total``, floored, but at least
  one event for a stream that has any: "don't completely starve small partitions").
  Kafka's rounding can go past the cap (each small partition's share rounded up) or leave
  part of it unused (the others' rounded down); here the shares are then evened out so that
  a trigger takes exactly ``min(cap, waiting)`` ids: ``maxOffsetsPerTrigger`` is a bound.
* ``minOffsetsPerTrigger`` with ``maxTriggerDelay``: :func:`delay_batch` is Kafka's
  ``delayBatch``: hold the trigger (no micro-batch) while fewer ids are waiting than the
  minimum, unless ``maxTriggerDelay`` has passed since the last micro-batch that ran.
  PySpark has no composite read limit and its ``ReadMinRows`` carries no delay, so the source
  applies both itself from its options (docs/spark.md, "Kafka's options").
* :func:`duration_ms` reads a delay as Spark's ``JavaUtils.timeStringAsMs`` does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["cap_offsets", "delay_batch", "duration_ms"]

_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
             "d": 86_400_000}  # fmt: skip
_DURATION = re.compile(r"(-?[0-9]+)([a-z]+)?")


def duration_ms(text: str) -> int:
    """``text`` as milliseconds, read as Spark reads a time option (``JavaUtils.timeStringAs``):
    trimmed, any case, an integer with an optional unit ``us ms s m min h d`` (none: ms);
    microseconds are floored to whole ms. Raises :class:`ValueError` for anything else,
    negative values included (a delay cannot be negative)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"not a duration like 15m, 2s or 500ms: {text!r}")
    value, unit = int(match[1]), match[2] or "ms"
    if unit not in _UNITS_MS:
        raise ValueError(f"unknown unit {unit!r} (us, ms, s, m, min, h or d)")
    if value < 0:
        raise ValueError(f"a duration cannot be negative: {text!r}")
    return value // 1000 if unit == "us" else value * int(_UNITS_MS[unit])


def delay_batch(
    *,
    now_ms: int,
    last_ms: int | None,
    start: Mapping[str, int],
    latest: Mapping[str, int],
    min_events: int,
    delay_ms: int,
) -> bool:
    """Whether to hold this trigger back (Kafka's ``delayBatch``): true while fewer than
    ``min_events`` ids lie between ``start`` and ``latest`` over all streams, unless
    ``delay_ms`` have passed since ``last_ms``, when the last micro-batch ran (None before
    any: a query's first trigger is never held, as Kafka's, whose ``lastTriggerMillis`` starts
    at 0). ``now_ms`` and ``last_ms`` are read from one clock, any (the source uses a monotonic
    one). A stream missing from ``start`` counts nothing."""
    if last_ms is None or now_ms - last_ms >= delay_ms:
        return False
    waiting = sum(max(0, end - start[name]) for name, end in latest.items() if name in start)
    return waiting < min_events


def cap_offsets(
    start: Mapping[str, int], latest: Mapping[str, int], max_events: int | None
) -> dict[str, int]:
    """``latest``, but spanning at most ``max_events`` ids past ``start`` in all (admission
    control, ``ReadMaxRows``), shared in proportion to what each stream has waiting (see the
    module). Never below ``start``; a stream missing from ``latest`` stays at its start.

    The shares: ``floor(max_events * size / total)``, at least 1 for a stream with something
    waiting (Kafka's rule); then, if that took more than ``max_events`` (many small streams),
    one id at a time back from the biggest shares (a share of 1 last, smallest stream first);
    if less, one more id each to the streams with the largest remainders (not to those raised
    to 1), ties by name. So exactly ``min(max_events, total)`` ids are granted."""
    end = {name: max(latest.get(name, start[name]), start[name]) for name in start}
    if max_events is None:
        return end
    size = {name: end[name] - start[name] for name in sorted(start) if end[name] > start[name]}
    total = sum(size.values())
    if total <= max_events:
        return end
    grant = {name: max(1, max_events * n // total) for name, n in size.items()}
    raised = {name for name, n in size.items() if max_events * n < total}  # share was < 1
    excess = sum(grant.values()) - max_events
    while excess > 0:
        name = max(grant, key=lambda s: (grant[s], size[s], s))
        if grant[name] == 1:  # every share is 1: the smallest streams wait for a later trigger
            name = min((s for s in grant if grant[s] == 1), key=lambda s: (size[s], s))
        grant[name] -= 1
        excess -= 1
    short = max_events - sum(grant.values())
    if short > 0:  # fewer than the streams not raised to 1: each gets at most one more
        order = sorted((s for s in grant if s not in raised),
                       key=lambda s: (-(max_events * size[s] % total), s))  # fmt: skip
        for name in order[:short]:
            grant[name] += 1
    return {name: start[name] + grant.get(name, 0) for name in start}
