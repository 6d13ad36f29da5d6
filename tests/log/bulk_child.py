"""The child process of tests/log/test_log_bulk.py's crash test: one bulk append, then waits.

Usage: ``python bulk_child.py DIRECTORY MODE``

Opens the log (``CONFIG``: the journal on, as by default), appends one ordinary batch (``PRE
<first> <last>`` once durable), then bulk-appends ``BATCHES`` batches of :func:`bulk_batch`.
``MODE`` ``mid``: the source prints ``WROTE <k>`` after handing over its k-th batch and, after
the ``HOLD``-th, waits for ever (the parent kills it with SIGKILL: the first batches are in the
segment's file, not published, with no journal entry). ``MODE`` ``done``: prints ``DONE <first>
<last>`` once the bulk append returned, then waits to be killed.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator

from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch

STREAM = "bulk"
CONFIG = LogConfig(defaults=StreamSettings(segment_bytes=64 * 1024, index_interval_bytes=512),
                   max_record_bytes=16 * 1024)  # fmt: skip
BATCHES = 40
HOLD = 25
EVENTS = 10  # per batch


def bulk_batch(i: int) -> Batch:
    return Batch.build(STREAM, [b"bulk-%03d-%02d" % (i, j) + b"." * 300 for j in range(EVENTS)])


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(directory: str, mode: str) -> None:
    log = Log.open(directory, CONFIG)
    pre = await log.append(Batch.build(STREAM, [b"pre"]), assign_ids=True)
    emit(f"PRE {pre.first_id} {pre.last_id}")

    def source() -> Iterator[Batch]:
        for i in range(BATCHES):
            yield bulk_batch(i)
            emit(f"WROTE {i + 1}")
            if mode == "mid" and i + 1 == HOLD:
                threading.Event().wait()  # (killed here)

    first, last = await log.append_bulk(STREAM, pre.last_id + 1, BATCHES * EVENTS, 0, source)
    emit(f"DONE {first} {last}")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
