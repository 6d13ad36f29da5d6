"""The child process of tests/tolliver/test_tolliver_crash.py: a Tolliver instance, connected
to a hub, that the parent SIGKILLs and restarts on the same SQLite file.

Usage::

    python tolliver_child.py receive DB HOST PORT CHANNEL RECORD [DELAY]
    python tolliver_child.py send DB HOST PORT CHANNEL

``receive``: subscribes to CHANNEL (every key), connects to the hub, prints ``READY <uuid>``,
then appends the body of every delivery to the file RECORD, one line each, flushed at once (the
bytes are in the kernel when the write returns, so a SIGKILL loses none of them). DELAY seconds
after each record stand for the application's work on the message (0 by default).

``send``: connects to the hub, prints ``READY <uuid> <hub's uuid>``, then obeys commands read
from stdin, one a line:

* ``subscribed``: waits until the hub subscribes to CHANNEL (before that, a message sent goes to
  nobody and is not kept); prints ``SUBSCRIBED``.
* ``send A B``: sends the bodies ``m%05d`` for A <= i < B, reliable, on CHANNEL with the empty
  key, each once ``send`` has returned (the message is then on disk, unacked); prints
  ``SENT B <unacked>`` (the store's count of messages awaiting an ack).
* ``drain``: waits until no message awaits an ack; prints ``DRAINED``.

Every line printed is flushed at once. The process runs until it is killed (or stdin closes).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import BinaryIO

from tidewire.protocols.tolliver import matches
from tidewire.tolliver import Instance

CONNECT_TIMEOUT = 20.0
POLL = 0.005


def body(i: int) -> bytes:
    return b"m%05d" % i


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def receive(db: str, host: str, port: int, channel: str, out: BinaryIO, delay: float) -> None:
    instance = Instance(db, resend_interval=0.2)
    instance.subscribe(channel)
    async with asyncio.timeout(CONNECT_TIMEOUT):
        await instance.connect(host, port)
    emit(f"READY {instance.instance_id}")
    async for delivery in instance.messages():
        out.write(delivery.body + b"\n")
        out.flush()
        if delay:
            await asyncio.sleep(delay)  # the application's work on the message


def subscribed(instance: Instance, hub: uuid.UUID, channel: str) -> bool:
    link = instance.links.get(hub)
    return link is not None and matches(link.conn.peer_subscriptions, channel, "")


async def send(db: str, host: str, port: int, channel: str) -> None:
    instance = Instance(db, resend_interval=0.2)
    async with asyncio.timeout(CONNECT_TIMEOUT):
        hub = await instance.connect(host, port)
    emit(f"READY {instance.instance_id} {hub}")
    while line := await asyncio.to_thread(sys.stdin.readline):
        match line.split():
            case ["subscribed"]:
                while not subscribed(instance, hub, channel):  # noqa: ASYNC110 - parent bounds
                    await asyncio.sleep(POLL)
                emit("SUBSCRIBED")
            case ["send", start, end]:
                for i in range(int(start), int(end)):
                    await instance.send(channel, "", body(i))
                emit(f"SENT {end} {instance.store.unacked()}")
            case ["drain"]:
                while instance.store.unacked():  # noqa: ASYNC110 - the parent bounds the wait
                    await asyncio.sleep(POLL)
                emit("DRAINED")
            case _:
                emit(f"UNKNOWN {line.strip()}")
    await instance.close()


def main(argv: list[str]) -> None:
    mode, db, host, port, channel, *rest = argv
    if mode == "receive":
        delay = float(rest[1]) if len(rest) > 1 else 0.0
        with open(rest[0], "ab") as out:
            asyncio.run(receive(db, host, int(port), channel, out, delay))
    elif mode == "send":
        asyncio.run(send(db, host, int(port), channel))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
