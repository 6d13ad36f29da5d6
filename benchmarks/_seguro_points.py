"""Many Seguro points saving at once, for ``seguro_save.py``'s many-points figures (issue 22,
row 2): the points' names and the timed loop, given the URL of a hub started by the caller."""

from __future__ import annotations

import asyncio
import contextlib
import time

from tidewire.client.seguro import SeguroClient, connect
from tidewire.protocols.seguro.patp import PREFIXES, SUFFIXES, validate_patp

__all__ = ["CONNECT_AT_ONCE", "point_names", "save_one_at_a_time"]

CONNECT_AT_ONCE = 64
"""Seguro handshakes in flight while the points connect (a few listen backlogs' worth, so no
connection waits for a SYN to be sent again)."""


def point_names(count: int) -> list[str]:
    """``count`` distinct Seguro points, stars (``~marzod``, ``~marnec``, ...): one prefix
    syllable (never ``doz``, which Urbit renders shorter) and one suffix syllable each."""
    if count > (len(PREFIXES) - 1) * len(SUFFIXES):
        raise ValueError(f"{count} points: more than there are stars")
    return [
        validate_patp(f"~{PREFIXES[1 + i // len(SUFFIXES)]}{SUFFIXES[i % len(SUFFIXES)]}")
        for i in range(count)
    ]


async def save_one_at_a_time(
    url: str, points: int, value: bytes, budget: float, max_bytes: int
) -> float:
    """``points`` Seguro sessions on the hub at ``url`` (one connection per point), each saving
    ``value`` one event at a time (``await ship.save``, one in flight per point, returning on
    ``COMMITTED``) for ``budget`` seconds, at most ``max_bytes`` of values in all; the total
    durable commits/s. The connections open ``CONNECT_AT_ONCE`` at a time and every point saves
    one event (creating its stream) before the clock starts; afterwards every point's latest id
    is checked against what it saved."""
    names = point_names(points)
    max_per_point = max(1, max_bytes // (points * len(value)))
    counts = [0] * points
    async with contextlib.AsyncExitStack() as stack:
        ships: list[SeguroClient] = []
        for lo in range(0, points, CONNECT_AT_ONCE):
            ships.extend(
                await asyncio.gather(
                    *(
                        stack.enter_async_context(connect(url, n))
                        for n in names[lo : lo + CONNECT_AT_ONCE]
                    )
                )
            )
        await asyncio.gather(*(ship.save(1, value) for ship in ships))  # warm-up
        start = time.perf_counter()
        deadline = start + budget

        async def saver(i: int) -> None:
            ship, n = ships[i], 0
            while n < max_per_point:
                await ship.save(n + 2, value)
                n += 1
                if time.perf_counter() >= deadline:
                    break
            counts[i] = n

        await asyncio.gather(*(saver(i) for i in range(points)))
        elapsed = time.perf_counter() - start
        for name, ship, n in zip(names, ships, counts, strict=True):
            if ship.latest != n + 1:
                raise RuntimeError(f"{name}: committed up to {ship.latest}, not {n + 1}")
    return sum(counts) / elapsed
