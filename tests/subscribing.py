"""Helpers shared by the hub tests: drive subscriptions with bounded loops, never with timers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tidewire.hub import Subscription
from tidewire.model import Batch


def count(batches: Sequence[Batch]) -> int:
    return sum(len(b) for b in batches)


async def settle(task: asyncio.Future[Any] | None = None, iterations: int = 50) -> None:
    """Let the loop run a bounded number of iterations (and, if ``task`` is given, give it a
    further short bounded chance to finish, for paths that go through a worker thread)."""
    for _ in range(iterations):
        await asyncio.sleep(0)
    if task is not None:
        await asyncio.wait({task}, timeout=0.02)


async def assert_pending(task: asyncio.Future[Any]) -> None:
    await settle(task)
    assert not task.done(), f"expected next() to block, it returned {task.result()!r}"


async def collect(sub: Subscription, n: int) -> list[Batch]:
    """Call ``next()`` until ``n`` events came (each call must deliver at least one)."""
    out: list[Batch] = []
    for _ in range(n):
        if count(out) >= n:
            break
        got = await sub.next()
        assert got, f"next() returned {got!r} with {n - count(out)} events still expected"
        assert all(len(b) >= 1 for b in got)
        assert all(b.stream == sub.stream for b in got)
        out.extend(got)
    assert count(out) == n
    return out
