"""The child process of tests/log/test_log_crash.py: appends to a log until it is killed.

Usage: ``python crash_child.py DIRECTORY SEED``

Prints ``READY`` once the log is open, then for every batch ``SEND <token>`` just before the
append and ``ACK <token> <first_id> <last_id>`` once ``append`` has returned (the batch is
durable). Every line is flushed at once. A batch's content is a pure function of its token
(:func:`make_batch`), and its first event's timestamp *is* the token, so the parent can tell which
batch any record on disk holds and rebuild it byte for byte.

Several appender tasks run at once (some of them firing a few appends concurrently), so the log's
group commit writes many batches per flush.
"""

from __future__ import annotations

import asyncio
import random
import sys

from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch

STREAM = "crash-test"
CONFIG = LogConfig(defaults=StreamSettings(segment_bytes=32 * 1024, index_interval_bytes=512))
WORKERS = 4
MAX_BATCHES = 50_000  # a safety net only: the parent kills the child long before
TOKEN_BITS = 62


def make_batch(token: int) -> Batch:
    """The batch of ``token`` (ids 1..n: the log assigns the real ones)."""
    rng = random.Random(token)
    n = rng.choice([1, 1, 2, 3, 5, 8, 13, 21, 60])
    values = [rng.randbytes(rng.randint(0, 400)) for _ in range(n)]
    keys: list[bytes | None] = []
    for _ in range(n):
        r = rng.random()
        keys.append(None if r < 0.3 else b"" if r < 0.4 else rng.randbytes(rng.randint(1, 24)))
    return Batch.build(STREAM, values, keys=keys, timestamps=[token + i for i in range(n)])


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def append_one(log: Log, rng: random.Random) -> None:
    token = rng.getrandbits(TOKEN_BITS)
    batch = make_batch(token)
    emit(f"SEND {token}")
    stored = await log.append(batch, assign_ids=True)
    emit(f"ACK {token} {stored.first_id} {stored.last_id}")


async def worker(log: Log, rng: random.Random, budget: list[int]) -> None:
    while budget[0] > 0:
        fan_out = rng.choice([1, 1, 1, 2, 3])
        budget[0] -= fan_out
        await asyncio.gather(*(append_one(log, rng) for _ in range(fan_out)))


async def main(directory: str, seed: int) -> None:
    log = Log.open(directory, CONFIG)
    emit("READY")
    rng = random.Random(seed)
    budget = [MAX_BATCHES]
    try:
        await asyncio.gather(
            *(worker(log, random.Random(rng.getrandbits(64)), budget) for _ in range(WORKERS))
        )
    finally:
        await log.close()
    emit("DONE")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
