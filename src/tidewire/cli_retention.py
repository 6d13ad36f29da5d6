"""Retention on the command line (``tidewire streams create/retention``): a time as whole
milliseconds (``--retention-ms 604800000``) or a duration (``--retention 7d``, ``1h30m``), a
size as bytes or with a unit (``--retention-bytes 1GiB``, ``500MB``), and ``none`` for no
bound; and how the retention the hub answers is shown. Pure: no clock, no I/O.

Units: durations ``ms``, ``s``, ``m`` (minutes), ``h``, ``d``, ``w`` (7 days; no months or
years, whose length varies), several in a row adding up (``1d12h``); sizes ``B``, ``KiB``,
``MiB``, ``GiB``, ``TiB``, ``PiB`` (powers of 1024, what ``tidewire streams`` shows) and ``KB``,
``MB``, ``GB``, ``TB``, ``PB`` (powers of 1000), in any case, a decimal fraction allowed where
the result is a whole number of bytes (``1.5GiB``). ``1G`` or ``1k`` are refused rather than
guessed: the two families differ by 7 % at ``G``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "BYTES_HELP",
    "DURATION_HELP",
    "MAX_VALUE",
    "describe_retention",
    "format_bytes",
    "format_ms",
    "parse_bytes",
    "parse_duration",
    "parse_ms",
]

MAX_VALUE = 2**63 - 1
"""The largest retention the hub takes (its JSON value must be below 2**63)."""

DURATION_HELP = "a duration: 7d, 12h, 1h30m, 2w (ms s m h d w), or none (no bound)"
BYTES_HELP = ("bytes, or with a unit: 1GiB, 500MiB, 10GB (KiB MiB GiB TiB: 1024; KB MB GB TB: "
              "1000), or none (no bound)")

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
            "w": 7 * 86_400_000}  # fmt: skip
_DURATION = re.compile(r"(?:\d{1,19}(?:ms|s|m|h|d|w))+")
_PART = re.compile(r"(\d{1,19})(ms|s|m|h|d|w)")
_SIZE = re.compile(r"(\d{1,25}(?:\.\d{1,25})?)\s*([kmgtp]i?b|b)?", re.IGNORECASE)
_PREFIXES = "kmgtp"
_NONE = ("none", "unbounded", "-1")


def _bounded(value: int, text: str) -> int:
    if value > MAX_VALUE:
        raise ValueError(f"{text!r} is too large (at most {MAX_VALUE})")
    return value


def _is_none(text: str) -> bool:
    """``none`` (or ``unbounded``, or ``-1``: what the configuration file says for no bound)."""
    return text.strip().lower() in _NONE


def parse_ms(text: str) -> int | None:
    """``--retention-ms``: whole milliseconds, or ``none`` (``None``: no bound)."""
    text = text.strip()
    if _is_none(text):
        return None
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{text!r} is not a number of milliseconds (or none)")
    return _bounded(int(text), text)


def parse_duration(text: str) -> int | None:
    """``--retention``: a duration (module docstring) in milliseconds, or ``None`` for
    ``none``. A bare number is refused: its unit would be a guess (``--retention-ms`` takes
    milliseconds)."""
    text = text.strip()
    if _is_none(text):
        return None
    if text.isascii() and text.isdigit():
        raise ValueError(f"{text!r} has no unit: say 7d, 12h, 30m... (or use --retention-ms)")
    if not _DURATION.fullmatch(text):
        raise ValueError(f"{text!r} is not {DURATION_HELP}")
    total = sum(int(n) * _UNIT_MS[unit] for n, unit in _PART.findall(text))
    return _bounded(total, text)


def parse_bytes(text: str) -> int | None:
    """``--retention-bytes``: a size (module docstring) in bytes, or ``None`` for ``none``."""
    text = text.strip()
    if _is_none(text):
        return None
    match = _SIZE.fullmatch(text)
    if match is None:
        hint = " (say GiB for 2**30 or GB for 10**9)" if re.fullmatch(
            r"[\d.]+\s*[kmgtp]i?", text, re.IGNORECASE) else ""  # fmt: skip
        raise ValueError(f"{text!r} is not {BYTES_HELP}{hint}")
    number, unit = match[1], (match[2] or "b").lower()
    scale = 1
    if unit != "b":
        base = 1024 if unit[1] == "i" else 1000
        scale = base ** (_PREFIXES.index(unit[0]) + 1)
    try:
        exact = Decimal(number) * scale
    except InvalidOperation:  # pragma: no cover (the pattern admits only numbers)
        raise ValueError(f"{text!r} is not a size") from None
    if exact != exact.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return _bounded(int(exact), text)


def format_ms(ms: int) -> str:
    """``604800000`` -> ``7d``, ``5400000`` -> ``1h30m``, ``1500`` -> ``1s500ms``, ``0`` ->
    ``0ms`` (weeks are shown as days: ``14d`` reads better than ``2w``)."""
    if ms == 0:
        return "0ms"
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        count, ms = divmod(ms, _UNIT_MS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def format_bytes(n: int) -> str:
    """``1073741824`` -> ``1 GiB``, ``1536`` -> ``1.5 KiB``, ``1000`` -> ``1000 B`` (a
    binary unit when the value is within 1/1000 of a round figure in it, else bytes)."""
    for power in range(5, 0, -1):
        unit = 1024**power
        if n >= unit:
            value = n / unit
            shown = f"{value:.3f}".rstrip("0").rstrip(".")
            if abs(float(shown) * unit - n) <= n / 1000:
                return f"{shown} {'KMGTP'[power - 1]}iB"
            break
    return f"{n} B"


def describe_retention(retention: Any) -> str:
    """The ``retention`` object the hub answers (``{"ms", "bytes", "source"}``, or ``None`` on
    a gateway of a cluster), as one phrase: ``7d (604800000 ms), 1 GiB (1073741824 bytes),
    set at runtime``."""
    if not isinstance(retention, dict):
        return "not known here (cluster mode: JetStream's limits apply)"
    ms, nbytes = retention.get("ms"), retention.get("bytes")
    age = "no time bound" if ms is None else f"{format_ms(ms)} ({ms} ms)"
    size = "no size bound" if nbytes is None else f"{format_bytes(nbytes)} ({nbytes} bytes)"
    source = {
        "runtime": "set at runtime",
        "config": "from the stream's table in the configuration",
        "default": "the configuration's default",
    }.get(str(retention.get("source")), f"source {retention.get('source')}")
    return f"{age}, {size}, {source}"
