"""The bystander of the security tests, as a process of its own (harness.bystander runs it):

    python bystander_child.py RSIO_URL SECONDS STREAM      (token in $BYSTANDER_TOKEN)

It publishes small batches over RS.io as fast as a window of four in flight allows and
subscribes to them on a second connection. Every value carries the monotonic time it was sent;
the largest send-to-receive time is the stall. One JSON line on stdout: seconds, events,
max_stall_s, errors. It imports only tidewire, so the tests' own modules stay out of it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import struct
import sys
import time

import tidewire
from tidewire.client.rsio import Receipt

STAMP = struct.Struct(">d")
BATCH = 100
VALUE = 100


async def main(url: str, seconds: float, stream: str, token: str | None) -> dict[str, object]:
    report: dict[str, object] = {"seconds": seconds, "events": 0, "max_stall_s": 0.0,
                                 "errors": []}  # fmt: skip
    pad = b"\x00" * (VALUE - STAMP.size)
    stall = 0.0
    events = 0
    async with await tidewire.connect(url, token=token) as pub_hub, \
            await tidewire.connect(url, token=token) as sub_hub:  # fmt: skip
        # (the stream's first event makes the stream; stamped 0, it is not timed: its time would
        # include the subscription's start, not a stall)
        await pub_hub.publish(stream, [STAMP.pack(0.0) + pad])
        done = asyncio.Event()

        async def subscribe() -> None:
            nonlocal stall, events
            async for batch in sub_hub.subscribe(stream):
                now = time.monotonic()
                for i in (0, len(batch) - 1):
                    (sent,) = STAMP.unpack_from(batch.value(i))
                    if sent:
                        stall = max(stall, now - sent)
                events += len(batch)
                if done.is_set():
                    return

        async def publish() -> None:
            pub = await pub_hub.publisher(stream, format="value")
            window: list[asyncio.Future[Receipt]] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                window.append(await pub.submit([STAMP.pack(time.monotonic()) + pad] * BATCH))
                if len(window) >= 4:
                    await window.pop(0)
            for receipt in window:
                await receipt
            await pub.close()

        reader = asyncio.create_task(subscribe())
        started = time.monotonic()
        await publish()
        done.set()
        await pub_hub.publish(stream, [STAMP.pack(time.monotonic()) + pad])  # wakes the reader
        await asyncio.wait_for(reader, 30)
        report.update(seconds=time.monotonic() - started, events=events, max_stall_s=stall)
    return report


if __name__ == "__main__":
    url, seconds, stream = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    # The stall measured is the hub's: this process's own collector pauses are kept out of it
    # (its run is seconds long and its garbage bounded: batches, not objects per event).
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        result = asyncio.run(asyncio.wait_for(
            main(url, seconds, stream, os.environ.get("BYSTANDER_TOKEN") or None), seconds + 30))
    except Exception as exc:  # the report says what went wrong
        result = {"seconds": seconds, "events": 0, "max_stall_s": 0.0, "errors": [repr(exc)]}
    print(json.dumps(result), flush=True)
