"""Times on the command line (``tidewire tail --from-time``, ``tidewire dump --from-time``):
milliseconds since the epoch, an RFC 3339 date and time with its offset, or a time relative to
now. Pure (:func:`parse_time` takes ``now_ms``); :data:`TIME` is the click type, which reads the
clock once, when the option is converted."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import click

__all__ = ["TIME", "parse_time"]

_RELATIVE = re.compile(r"-(\d{1,12})(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_MS = 2**63 - 1
HELP = "ms since the epoch, RFC 3339 (2026-11-26T10:00:00Z) or relative (-15m; ms s m h d)"


def parse_time(text: str, now_ms: int) -> int:
    """``text`` as milliseconds since the epoch: ``1700000000000``; ``2026-11-26T10:00:00Z``
    or with an offset (``+01:00``), fractions of a second kept to the millisecond; ``-15m``
    (``ms``, ``s``, ``m``, ``h``, ``d`` before ``now_ms``). :class:`ValueError` for anything
    else, a date without its offset (ambiguous), or a time before 1970 (RS.io's
    ``from-time=`` takes 0..2**63-1)."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        ms = int(text) if len(text) <= 19 else MAX_MS + 1
    elif relative := _RELATIVE.fullmatch(text):
        ms = now_ms - int(relative[1]) * _UNIT_MS[relative[2]]
    else:
        try:
            when = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise ValueError(f"{text!r} is not a time: {HELP}") from None
        if when.tzinfo is None:
            raise ValueError(f"{text!r} has no offset (add Z for UTC, or +01:00, ...)")
        ms = (when - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms <= MAX_MS:
        raise ValueError(f"{text!r} is outside 1970-01-01 .. 2**63-1 ms")
    return ms


class _Time(click.ParamType[int]):
    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_time(str(value), time.time_ns() // 1_000_000)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


TIME = _Time()
"""The click type of a ``--from-time`` option."""
