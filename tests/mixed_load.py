"""The mixed load of the fault tests: every protocol's reconnecting client writing or reading
at once (tests/faults/test_kill.py against one hub killed and restarted; tests/cluster/ against
gateways over a cluster, whose URLs may be lists), and what each flow was acknowledged or
handed, to check afterwards that nothing acknowledged was lost and nothing stored twice.

Flows: RS.io/TCP publishes to ``k-rsio`` (hub ids; each offer a transaction); RS.io over Tube
publishes to ``k-tube`` with its own ids; RS.io/TCP follows ``k-tube``, Tube and RS.io over HTTP
follow ``k-rsio``; Seguro saves ``SAVE MANY`` batches for ``~zod``; Tolliver: one instance sends
reliable messages on ``k-tolliver``, another receives them through the hub.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from helpers import until
from tidewire.client import rsio, seguro, tube
from tidewire.client.backoff import Retry
from tidewire.client.http import HttpHub
from tidewire.model import Batch
from tidewire.tolliver import Instance

__all__ = ["RETRY", "Mixed", "finish_and_check", "read_ship", "read_stream"]

RETRY = Retry(initial=0.02, maximum=0.5, give_up_after=60.0)


class Mixed:
    """The flows, and what each was acknowledged or handed."""

    def __init__(self, urls: dict[str, str], tmp: Path) -> None:
        self.urls = urls
        self.tmp = tmp
        self.stop = asyncio.Event()
        self.acked: dict[str, list[bytes]] = {"k-rsio": [], "k-tube": []}
        self.seguro_acked: dict[int, bytes] = {}
        self.seen: dict[str, list[tuple[int, bytes]]] = {"tcp<-k-tube": [],
                                                          "tube<-k-rsio": [],
                                                          "http<-k-rsio": []}  # fmt: skip
        self.tolliver_sent: list[bytes] = []
        self.tolliver_got: list[bytes] = []
        self.reconnects: dict[str, Callable[[], int]] = {}
        self.receiving = asyncio.Event()  # the Tolliver receiver is connected
        self.tasks: list[asyncio.Task[None]] = []

    def progress(self) -> dict[str, int]:
        """A count per flow that grows while the flow works."""
        return {"rsio-pub": len(self.acked["k-rsio"]), "tube-pub": len(self.acked["k-tube"]),
                **{name: len(got) for name, got in self.seen.items()},
                "seguro": len(self.seguro_acked), "tolliver-send": len(self.tolliver_sent),
                "tolliver-receive": len(self.tolliver_got)}  # fmt: skip

    def start_flows(self) -> tuple[list[asyncio.Task[None]], list[asyncio.Task[None]]]:
        """Every flow as a task: (writers, readers); the Tolliver sender is a reader here,
        since it stays connected, resending, until cancelled."""
        writers = [asyncio.create_task(c()) for c in (
            self.publish_rsio, self.publish_tube, self.save_seguro)]  # fmt: skip
        readers = [
            asyncio.create_task(self.send_tolliver()),
            asyncio.create_task(self.follow("tcp<-k-tube", "k-tube", "tcp")),
            asyncio.create_task(self.follow("tube<-k-rsio", "k-rsio", "tube")),
            asyncio.create_task(self.follow("http<-k-rsio", "k-rsio", "http")),
            asyncio.create_task(self.receive_tolliver()),
        ]
        self.tasks = writers + readers
        return writers, readers

    def failed(self, log: Callable[[], str]) -> None:
        """Raise if a flow has failed (with the tail of ``log()``: the servers' log)."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise AssertionError(f"a flow failed: {task.exception()!r}\n{log()[-3000:]}")

    async def progress_everywhere(self, what: str, log: Callable[[], str]) -> None:
        """Wait until every flow has made progress (bounded by ``until``'s default)."""
        before = self.progress()

        def moved() -> bool:
            self.failed(log)
            now = self.progress()
            return all(now[k] > before[k] for k in now)

        await until(moved, f"every flow to make progress {what}: {self.progress()}")

    async def publish_rsio(self) -> None:
        async with rsio.connect(self.urls["rsio"], retry=RETRY) as client:
            self.reconnects["rsio-pub"] = lambda: client.reconnects
            async with await client.publisher("k-rsio") as pub:
                n = 0
                pending: list[tuple[asyncio.Future[rsio.Receipt], list[bytes]]] = []
                while not self.stop.is_set():
                    values = [b"r-%d" % (n + i) for i in range(20)]
                    n += 20
                    pending.append((await pub.submit(values), values))
                    while len(pending) > 8 or (pending and pending[0][0].done()):
                        future, sent = pending.pop(0)
                        await future
                        self.acked["k-rsio"] += sent
                for future, sent in pending:
                    await future
                    self.acked["k-rsio"] += sent

    async def publish_tube(self) -> None:
        async with tube.connect(self.urls["ws"], retry=RETRY) as client:
            self.reconnects["tube-pub"] = lambda: client.reconnects
            async with await client.publisher("k-tube", assign_ids=False) as pub:
                next_id = 1
                while not self.stop.is_set():
                    values = [b"t-%d" % (next_id + i) for i in range(10)]
                    batch = Batch.build("k-tube", values, ids=range(next_id, next_id + 10))
                    next_id += 10
                    await pub.send(batch)
                    self.acked["k-tube"] += values

    async def follow(self, name: str, stream: str, connect: str) -> None:
        seen = self.seen[name]
        if connect == "http":
            async with HttpHub(self.urls["http"], retry=RETRY) as hub:
                self.reconnects[name] = lambda: hub.resubscribed
                async for batch in hub.subscribe(stream, from_id=1):
                    seen += zip(batch.ids.tolist(), map(batch.value, range(len(batch))),
                                strict=True)  # fmt: skip
            return
        opener = (rsio.connect(self.urls["rsio"], retry=RETRY) if connect == "tcp"
                  else tube.connect(self.urls["ws"], retry=RETRY))  # fmt: skip
        async with opener as client:
            self.reconnects[name] = lambda: client.reconnects
            async for batch in client.subscribe(stream, from_id=1):
                seen += zip(batch.ids.tolist(), map(batch.value, range(len(batch))),
                            strict=True)  # fmt: skip

    async def save_seguro(self) -> None:
        async with seguro.connect(self.urls["seguro"], "~zod", retry=RETRY) as ship:
            self.reconnects["seguro"] = lambda: ship.reconnects
            next_id = ship.latest + 1
            while not self.stop.is_set():
                events = [(next_id + i, b"s-%d" % (next_id + i)) for i in range(16)]
                next_id += 16
                await ship.save_many(events)
                self.seguro_acked.update(events)

    async def connect_tolliver(self, instance: Instance) -> None:
        """Connect ``instance`` to the hub (the first of several gateways, failing over to the
        others: ``urls["tolliver"]`` may be a comma list)."""
        first, *others = self.urls["tolliver"].split(",")
        at = urlsplit(first)
        await instance.connect(at.hostname or "", at.port or 0, retry=RETRY, failover=others)

    async def send_tolliver(self) -> None:
        sender = Instance(str(self.tmp / "sender.db"))
        try:
            # The hub hands a remote what arrives once it is connected (the seed's rule), so
            # the receiver connects first.
            await self.receiving.wait()
            await self.connect_tolliver(sender)
            self.reconnects["tolliver-send"] = lambda: sender.reconnects
            n = 0
            while not self.stop.is_set():
                bodies = [b"m-%d" % (n + i) for i in range(10)]
                n += 10
                await sender.send_many("k-tolliver", "", bodies)
                self.tolliver_sent += bodies
                await asyncio.sleep(0.005)
            await asyncio.Event().wait()  # stay connected (resending) until cancelled
        finally:
            await sender.close()

    async def receive_tolliver(self) -> None:
        receiver = Instance(str(self.tmp / "receiver.db"), dedupe=True)
        receiver.subscribe("k-tolliver")
        try:
            await self.connect_tolliver(receiver)
            self.reconnects["tolliver-receive"] = lambda: receiver.reconnects
            self.receiving.set()
            async for delivery in receiver.messages():
                self.tolliver_got.append(delivery.body)
        finally:
            await receiver.close()


async def read_stream(url: str, stream: str) -> list[tuple[int, bytes]]:
    events: list[tuple[int, bytes]] = []
    async with rsio.connect(url) as client:
        latest = (await client.streams([stream]))[0]["latest_id"]
        if latest:
            async for batch in client.subscribe(stream, from_id=1, until_id=latest):
                events += zip(batch.ids.tolist(), map(batch.value, range(len(batch))),
                              strict=True)  # fmt: skip
    return events


async def read_ship(url: str) -> list[tuple[int, bytes]]:
    async with seguro.connect(url, "~zod") as ship:
        saved: list[tuple[int, bytes]] = []
        start = 1
        while got := (await ship.read(start, 1000))[0]:
            saved += got
            start = got[-1][0] + 1
        return saved


async def finish_and_check(load: Mixed, writers: list[asyncio.Task[None]],
                           readers: list[asyncio.Task[None]], step: float) -> None:  # fmt: skip
    """Stop the writers, let the readers catch up with what was stored, then check: no
    acknowledged event missing, no id or value twice within a stream, every follower saw exactly
    the stream in order, Seguro kept every saved event, every Tolliver message stored."""
    urls = load.urls

    load.stop.set()
    async with asyncio.timeout(step):
        await asyncio.gather(*writers)
    # The readers catch up with everything that was stored, then stop.
    final = {s: await read_stream(urls["rsio"], s) for s in ("k-rsio", "k-tube")}
    tolliver_stored: set[bytes] = set()

    async def tolliver_all_stored() -> None:  # at least once, by the seed
        for _ in range(int(step / 0.1)):
            events = await read_stream(urls["rsio"], "k-tolliver")
            tolliver_stored.update(v for _, v in events)
            if set(load.tolliver_sent) <= tolliver_stored:
                return
            await asyncio.sleep(0.1)

    await tolliver_all_stored()
    await until(lambda: len(load.seen["tcp<-k-tube"]) >= len(final["k-tube"])
                and len(load.seen["tube<-k-rsio"]) >= len(final["k-rsio"])
                and len(load.seen["http<-k-rsio"]) >= len(final["k-rsio"])
                and set(load.tolliver_sent) <= set(load.tolliver_got),
                "the readers to catch up", details=lambda: (
                    {k: len(v) for k, v in load.seen.items()},
                    {k: len(v) for k, v in final.items()},
                    sorted(set(load.tolliver_sent) - set(load.tolliver_got))[:12],
                    len(load.tolliver_sent)))  # fmt: skip
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)

    for stream, events in final.items():
        ids = [i for i, _ in events]
        values = [v for _, v in events]
        assert ids == sorted(set(ids)), f"{stream}: ids repeat or go back"
        repeated = [v for v, n in Counter(values).items() if n > 1]
        assert not repeated, f"{stream}: stored twice: {repeated[:5]}"
        missing = set(load.acked[stream]) - set(values)
        assert not missing, f"{stream}: acknowledged, then lost: {sorted(missing)[:5]}"
    for name, stream in (("tcp<-k-tube", "k-tube"), ("tube<-k-rsio", "k-rsio"),
                         ("http<-k-rsio", "k-rsio")):  # fmt: skip
        assert load.seen[name] == final[stream], f"{name}: not the stream, once, in order"

    saved = await read_ship(urls["seguro"])
    saved_ids = [i for i, _ in saved]
    assert saved_ids == sorted(set(saved_ids))
    kept = dict(saved)
    assert all(kept.get(i) == v for i, v in load.seguro_acked.items()), "Seguro lost"

    # Tolliver is at least once: every message is stored, perhaps more than once.
    lost = set(load.tolliver_sent) - tolliver_stored
    assert not lost, f"Tolliver messages never stored: {sorted(lost)[:5]}"
