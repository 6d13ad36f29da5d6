"""Several gateways (issue 21) for a reconnecting Tolliver instance: ``connect(host, A,
failover=[B], retry=...)``; the hub behind A stops and a hub on the same data directory starts
at B, then back at A. The sender's supervisor follows it there (its URL says so), the outbox
re-offers what the hub had not acked, and the subscribed receiver gets every message (dedupe:
each once). Real sockets on 127.0.0.1; the supervisors' sleep is a gate opened when the hub is
back (no timer waited for)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from test_tolliver_reconnect import (
    FOREVER,
    HOST,
    NEVER_RESENT,
    Gate,
    InProcessHub,
    Tally,
    refusing_port,
    stored,
)

from loops import Run
from tidewire.tolliver import Instance


def test_an_instance_fails_over_to_the_next_gateway(tmp_path: Path, run: Run) -> None:
    n = 120

    async def main() -> None:
        hub = InProcessHub(tmp_path / "hub")
        await hub.start()
        a = hub.port
        spare = refusing_port()
        b = int(spare.getsockname()[1])
        gate = Gate(hub.up)
        receiver = Instance(str(tmp_path / "r.db"), dedupe=True, sleep=gate,
                            resend_interval=NEVER_RESENT)  # fmt: skip
        receiver.subscribe("orders")
        sender = Instance(str(tmp_path / "s.db"), sleep=gate, resend_interval=NEVER_RESENT)
        sent, received = Tally(), Tally()

        async def produce() -> None:
            for i in range(n):
                body = b"m%04d" % i
                await sender.send("orders", "", body)
                sent.add(body)

        async def consume() -> None:
            async for delivery in receiver.messages():
                received.add(delivery.body)

        consumer = asyncio.create_task(consume())
        producer: asyncio.Task[None] | None = None
        on: list[str] = []
        try:
            async with asyncio.timeout(60):
                await receiver.connect(HOST, a, retry=FOREVER, failover=f"{HOST}:{b}")
                await sender.connect(HOST, a, retry=FOREVER, failover=[f"tolliver://{HOST}:{b}"])
                (supervisor,) = sender.supervisors
                assert supervisor.urls == (f"tolliver://{HOST}:{a}", f"tolliver://{HOST}:{b}")
                producer = asyncio.create_task(produce())
                await received.reach(1)
                for round_, port in enumerate((b, a)):
                    await sent.reach((round_ + 1) * n // 3)
                    await hub.stop()
                    if port == b:
                        spare.close()  # (B was held refused until now)
                    hub.port = port
                    mark = len(sent.items)
                    await sent.reach(mark + 5)  # kept on disk while no gateway answers
                    await hub.start()
                    await received.reach(mark + 5, distinct=True)
                    on += [supervisor.url, receiver.supervisors[0].url]
                await producer
                await received.reach(n, distinct=True)
            assert on == [f"tolliver://{HOST}:{b}"] * 2 + [f"tolliver://{HOST}:{a}"] * 2
            assert set(received.items) == set(sent.items)
            assert supervisor.failovers >= 2
            assert supervisor.reconnects >= 2
        finally:
            spare.close()
            for task in (producer, consumer):
                if task is not None:
                    task.cancel()
            await sender.close()
            await receiver.close()
            await hub.stop()
        counts = Counter(await stored(tmp_path / "hub", "orders"))
        assert sorted(counts) == sorted(set(sent.items))  # none lost (Tolliver: at least once)

    run(main())


def test_failover_needs_retry_and_good_addresses(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        instance = Instance(str(tmp_path / "i.db"))
        try:
            with pytest.raises(ValueError, match="retry"):
                await instance.connect(HOST, 1, failover="h:2")
            with pytest.raises(ValueError, match="tolliver://host:port"):
                await instance.connect(HOST, 1, failover="h", retry=FOREVER)
        finally:
            await instance.close()

    run(main())
