"""The hub every attack runs against at once, shared by ``test_all_at_once.py`` and
``benchmarks/hostile_load.py``: its settings (a 64 MiB budget, small enough that the attacks
reach it), the never-acking Tolliver remote's channels, and the streams the attackers read,
filled by a principal of their own (``filler``)."""

from __future__ import annotations

import asyncio

from harness import RealHub

import tidewire
from tidewire.client.rsio_common import ConnectionLost

__all__ = ["BUDGET", "FLOOD", "SETTINGS", "fill", "fill_flood"]

MiB = 1024 * 1024
BUDGET = 64 * MiB
SETTINGS: dict[str, object] = {
    "memory.budget_bytes": BUDGET,
    "memory.principal_bytes": 32 * MiB,
    "memory.connection_bytes": 16 * MiB,
    "limits.message_seconds": 2.0,  # (the unfinished Tube messages are closed within a run)
    "http.poll_seconds": 2,
    "http.max_subscriptions_per_principal": 40,
    "tolliver.allow_plaintext": True,
    "tolliver.max_channels": 1500,
    "tolliver.max_unacked_bytes": 2 * MiB,
    # every attacker and the bystander come from 127.0.0.1: not what is tested or measured
    "limits.max_connections_per_peer": 1000,
}
FLOOD = [f"flood.{i}" for i in range(4)]  # the never-acking Tolliver remote's channels


async def fill(hub: RealHub) -> None:
    """32 MiB of 64 KiB values in ``big``, for the subscribers that never read or fetch."""
    async with await tidewire.connect(hub.rsio_url, token=hub.tokens["filler"]) as client:
        for start in range(0, 32 * MiB, MiB):
            await client.publish("big", [b"%08d" % (start + i) + bytes(64 * 1024 - 8)
                                         for i in range(16)])  # fmt: skip


async def fill_flood(hub: RealHub, tries: int = 100) -> None:
    """4 MiB into each of the never-acking remote's channels. It runs while the other attacks
    do, and they are meant to take the hub's whole budget: a publish the hub refuses for want of
    memory (RS.io's protocol error, the connection closed) is made again on a new connection, a
    little later, at most ``tries`` times in all (a well-behaved publisher's answer to it)."""
    for channel in FLOOD:
        for _ in range(4):
            for left in range(tries - 1, -1, -1):
                try:
                    async with await tidewire.connect(
                        hub.rsio_url, token=hub.tokens["filler"]
                    ) as client:
                        await client.publish(channel, [bytes(64 * 1024)] * 16)
                    break
                except ConnectionLost as e:
                    if "memory budget" not in str(e) or left == 0:
                        raise
                    await asyncio.sleep(0.05)  # (memory is given back as the attacks go on)
