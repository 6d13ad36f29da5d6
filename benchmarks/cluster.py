"""Benchmark: cluster mode (a gateway over a local 3-node NATS JetStream cluster), against
nats-py on the same cluster in the same run, with the embedded log's figures beside them.

Run ``.venv/bin/python benchmarks/cluster.py`` (a few minutes) or add ``--quick`` (about a
minute: fewer events and rounds). ``--dir`` picks where the cluster's and the hub's
directories go (default: ``/tmp`` unless it is a RAM file system, then the working directory:
fsync must reach a disk). The nats-server is the one ``./tw`` installs (docs/cluster.md), every
node with ``sync_interval: always``: on both sides an acknowledgement means fsynced on a
quorum of 2 of the 3 nodes.

Figures (one JSON line each on stdout; progress on stderr):

- ``cluster_append_1KiB``: events/s of 1 KiB events appended through one gateway by one RS.io
  client's publisher, offers of 1000 events with at most ``IN_FLIGHT`` unacknowledged (the
  gateway merges what waits for a stream's publish in flight into its next record), against
  nats-py publishing the same events one message each with ``js.publish_async`` (at most
  ``WINDOW`` acks pending) to an R3 file stream of the same cluster, every ack gathered. Goal:
  ratio >= 5 (tidewire moves whole record batches). ``embedded``: the same client against a
  ``tidewire serve`` on the embedded log (fsync per commit).
- ``cluster_subscribe_1KiB``: events/s read by one RS.io subscriber through a gateway from the
  start of a stream of N events, against a nats-py pull consumer fetching the baseline's N
  messages (batches of 1000, acks none: ``AckPolicy.NONE``, a plain read). ``embedded`` beside.
- ``cluster_failover_s``: seconds from SIGKILL of the leader of the JetStream stream holding
  the tidewire stream (an appender publishing 100-event batches without pause) to its first
  acknowledged append; against nats-py's ``js.publish`` on its own R3 stream after its leader
  is killed (the same measure). Lower is better; the ratio is tidewire / nats.

Each append and read figure alternates the sides for 3 rounds (2 with ``--quick``) and reports
each side's best round (the machine is shared). Fields as in ``log_append.py``: ``tidewire``,
``baseline``, ``baseline_value``, ``ratio``, ``goal``, ``goal_ratio``, ``meets_goal``,
``tidewire_rounds``, ``baseline_rounds``, plus ``embedded`` / ``embedded_rounds``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from _common import (
    Processes,
    choose_base,
    emit,
    fresh_dir,
    loop_factory,
    module,
    note,
    serve_hub,
)
from tidewire.cluster.local import LocalCluster
from tidewire.cluster.subjects import shard_of, shard_stream

KiB = 1024
EVENT = b"e" * KiB
BATCH = 1000
WINDOW = 4096  # nats-py's pending acks at most (publish_async)
IN_FLIGHT = 16  # tidewire's offers unacknowledged at most (16 MiB of 1 KiB events)


def best(rounds: list[float], *, lower: bool = False) -> float:
    return min(rounds) if lower else max(rounds)


def figure(name: str, unit: str, tidewire: list[float], baseline: str, nats: list[float],
           embedded: list[float] | None, goal: str | None, goal_ratio: float | None, *,
           lower: bool = False, **extra: Any) -> None:  # fmt: skip
    ours, theirs = best(tidewire, lower=lower), best(nats, lower=lower)
    ratio = ours / theirs if theirs else None
    meets = None if goal_ratio is None or ratio is None else ratio >= goal_ratio
    record: dict[str, Any] = {
        "figure": name, "unit": unit, "tidewire": round(ours, 3), "baseline": baseline,
        "baseline_value": round(theirs, 3), "ratio": None if ratio is None else round(ratio, 3),
        "goal": goal, "goal_ratio": goal_ratio, "meets_goal": meets,
        "tidewire_rounds": [round(r, 3) for r in tidewire],
        "baseline_rounds": [round(r, 3) for r in nats],
    }  # fmt: skip
    if embedded is not None:
        record["embedded"] = round(best(embedded, lower=lower), 3)
        record["embedded_rounds"] = [round(r, 3) for r in embedded]
    emit(record | extra)


# ---------------------------------------------------------------------- tidewire's side


async def tidewire_append(url: str, stream: str, n: int) -> float:
    """Events/s of ``n`` 1 KiB events offered ``BATCH`` at a time through one RS.io client's
    publisher, at most ``IN_FLIGHT`` offers unacknowledged (as nats-py's window)."""
    import tidewire

    async with await tidewire.connect(url) as client:
        await client.publish(stream, [EVENT] * 10)  # (warm: the stream exists, paths are hot)
        async with await client.publisher(stream) as pub:
            began = time.perf_counter()
            pending: list[asyncio.Future[Any]] = []
            for _ in range(n // BATCH):
                pending.append(await pub.submit([EVENT] * BATCH))
                while len(pending) > IN_FLIGHT or (pending and pending[0].done()):
                    await pending.pop(0)
            await asyncio.gather(*pending)
            return n / (time.perf_counter() - began)


async def tidewire_subscribe(url: str, stream: str, n: int) -> float:
    """Events/s reading the first ``n`` events of ``stream`` with one subscriber."""
    import tidewire

    async with await tidewire.connect(url) as client:
        count = 0
        began = time.perf_counter()
        async for batch in client.subscribe(stream, from_id="earliest", prefetch=64 * BATCH):
            count += len(batch)
            if count >= n:
                break
        return count / (time.perf_counter() - began)


async def tidewire_failover(url: str, stream: str, cluster: LocalCluster) -> float:
    """Seconds from SIGKILL of the stream's JetStream leader to the first acked append."""
    import nats

    import tidewire

    group = shard_stream(shard_of(stream, 16))  # (cluster.shards' default)
    nc = await nats.connect(cluster.urls)
    try:
        info = (await nc.jetstream().stream_info(group)).cluster
        leader = info.leader if info is not None else None
    finally:
        await nc.close()
    async with await tidewire.connect(url) as client:
        await client.publish(stream, [EVENT] * 100)
        node = next(i for i, n in enumerate(cluster.nodes) if n.name == leader)
        cluster.kill(node)
        killed = time.perf_counter()
        await client.publish(stream, [EVENT] * 100)
        took = time.perf_counter() - killed
    cluster.restart(node)
    return took


# ---------------------------------------------------------------------- nats-py's side


async def nats_stream(js: Any, name: str) -> None:
    api = module("nats.js.api")
    with contextlib.suppress(Exception):
        await js.delete_stream(name)
    config = api.StreamConfig(name=name, subjects=[f"{name}.>"], num_replicas=3,
                              storage=api.StorageType.FILE)  # fmt: skip
    for _ in range(300):  # (a node restarted a moment ago may not be placeable yet)
        try:
            await js.add_stream(config)
            return
        except Exception as exc:
            if "no suitable peers" not in str(exc):
                raise
            await asyncio.sleep(0.1)
    await js.add_stream(config)


async def nats_append(urls: list[str], name: str, n: int) -> float:
    nats = module("nats")
    nc = await nats.connect(urls)
    try:
        js = nc.jetstream(publish_async_max_pending=WINDOW)
        await nats_stream(js, name)
        subject = f"{name}.events"
        began = time.perf_counter()
        acks = [await js.publish_async(subject, EVENT) for _ in range(n)]
        await asyncio.gather(*acks)
        return n / (time.perf_counter() - began)
    finally:
        await nc.close()


async def nats_fetch(urls: list[str], name: str, n: int) -> float:
    nats = module("nats")
    api = module("nats.js.api")
    nc = await nats.connect(urls)
    try:
        js = nc.jetstream()
        config = api.ConsumerConfig(ack_policy=api.AckPolicy.NONE,
                                    deliver_policy=api.DeliverPolicy.ALL)  # fmt: skip
        sub = await js.pull_subscribe(f"{name}.events", durable=None, stream=name, config=config)
        count = 0
        began = time.perf_counter()
        while count < n:
            count += len(await sub.fetch(BATCH, timeout=10))
        return count / (time.perf_counter() - began)
    finally:
        await nc.close()


async def nats_failover(urls: list[str], name: str, cluster: LocalCluster) -> float:
    nats = module("nats")
    nc = await nats.connect(urls)
    try:
        js = nc.jetstream(timeout=2)
        await nats_stream(js, name)
        await js.publish(f"{name}.events", EVENT)
        leader = (await js.stream_info(name)).cluster.leader
        node = next(i for i, n in enumerate(cluster.nodes) if n.name == leader)
        cluster.kill(node)
        killed = time.perf_counter()
        while True:
            try:
                await js.publish(f"{name}.events", EVENT)
                break
            except Exception:  # (timeouts, no responders: a leader is being elected)
                await asyncio.sleep(0.01)
        took = time.perf_counter() - killed
    finally:
        await nc.close()
    cluster.restart(node)
    return took


# ---------------------------------------------------------------------- the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    rounds = 2 if args.quick else 3
    n = 20_000 if args.quick else 100_000
    factory, loop_name = loop_factory()
    base = choose_base(args.dir)
    procs = Processes()

    def run(coro: Any) -> Any:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(asyncio.wait_for(coro, 600))

    with fresh_dir(base, "tw-cluster-") as where:
        cluster = LocalCluster(f"{where}/cluster", 3)
        cluster.start()
        try:
            note(f"cluster: {cluster.storage_url} ({loop_name})")
            gateway, urls = serve_hub(procs, f"{where}/gateway", "--storage", cluster.storage_url)
            embedded, eurls = serve_hub(procs, f"{where}/embedded")
            append: dict[str, list[float]] = {"tw": [], "nats": [], "emb": []}
            read: dict[str, list[float]] = {"tw": [], "nats": [], "emb": []}
            for r in range(rounds):
                sides = ["tw", "nats", "emb"] if r % 2 == 0 else ["nats", "emb", "tw"]
                for side in sides:
                    stream = f"bench.{side}.{r}"
                    if side == "tw":
                        append["tw"].append(run(tidewire_append(urls["rsio"], stream, n)))
                        read["tw"].append(run(tidewire_subscribe(urls["rsio"], stream, n)))
                    elif side == "emb":
                        append["emb"].append(run(tidewire_append(eurls["rsio"], stream, n)))
                        read["emb"].append(run(tidewire_subscribe(eurls["rsio"], stream, n)))
                    else:
                        name = f"NATSBENCH{r}"
                        append["nats"].append(run(nats_append(cluster.urls, name, n)))
                        read["nats"].append(run(nats_fetch(cluster.urls, name, n)))
                    note(f"round {r + 1} {side}: append {append[side][-1]:,.0f}/s, "
                         f"read {read[side][-1]:,.0f}/s")  # fmt: skip
            figure("cluster_append_1KiB", "events/s", append["tw"],
                   "nats-py js.publish_async, one message per event", append["nats"],
                   append["emb"], "ratio >= 5", 5.0, events=n, batch=BATCH)  # fmt: skip
            figure("cluster_subscribe_1KiB", "events/s", read["tw"],
                   "nats-py pull consumer, fetch 1000", read["nats"], read["emb"], None, None,
                   events=n)  # fmt: skip
            fail_tw = [run(tidewire_failover(urls["rsio"], "bench.failover", cluster))]
            fail_nats = [run(nats_failover(cluster.urls, "NATSFAILOVER", cluster))]
            figure("cluster_failover_s", "s", fail_tw, "nats-py js.publish after its leader "
                   "is killed", fail_nats, None, None, None, lower=True)  # fmt: skip
            procs.stop(gateway)
            procs.stop(embedded)
        finally:
            cluster.stop()
            procs.stop_all()
    json.dumps({})  # (nothing else to print)
    sys.exit(0)


if __name__ == "__main__":
    main()
