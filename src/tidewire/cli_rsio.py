"""``tidewire tail | publish | bench``: the commands that talk RS.io to a running hub."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

import click

from .cli_options import (
    PROGRESS,
    RSIO_URL,
    client_options,
    credential_options,
    print_event,
)
from .cli_time import HELP as TIME_HELP
from .cli_time import TIME
from .cli_views import (
    make_console,
    make_table,
    progress_bars,
    stacked,
)
from .model import Batch, LogClosedError, TidewireError

__all__ = ["bench", "publish", "tail"]


@click.command()
@click.argument("stream")
@RSIO_URL
@click.option("--from", "from_id", default=None, help="an id, earliest (default) or latest")
@click.option("--from-time", type=TIME, default=None,
              help=f"start at the first event this new: {TIME_HELP}")  # fmt: skip
@click.option("--limit", type=click.IntRange(min=1), default=None, help="stop after N events")
@click.option("--json", "as_json", is_flag=True, help="JSON lines; key and value in base64")
@credential_options
def tail(stream: str, url: str, from_id: str | None, from_time: int | None, limit: int | None,
         as_json: bool, **credentials: Any) -> None:  # fmt: skip
    """Follow STREAM over RS.io: history from --from (or --from-time), then live (Ctrl-C
    stops)."""
    import asyncio

    from .client.rsio import RsioError, connect
    from .protocols.rsio.names import FromTime

    if from_id is not None and from_time is not None:
        raise click.UsageError("--from and --from-time exclude each other")
    from_id = from_id or "earliest"
    start: int | str | FromTime = int(from_id) if from_id.isdigit() else from_id
    if from_time is not None:
        start = FromTime(from_time)
    elif start not in ("earliest", "latest") and not isinstance(start, int):
        raise click.BadParameter("an id, earliest or latest", param_hint="--from")

    async def follow() -> None:
        remaining = sys.maxsize if limit is None else limit
        async with connect(url, **client_options(url, **credentials)) as hub, contextlib.aclosing(
            hub.subscribe(stream, from_id=start)
        ) as batches:
            async for batch in batches:
                for event in batch:
                    print_event(event, as_json)
                    remaining -= 1
                    if not remaining:
                        return

    try:
        asyncio.run(follow())
    except KeyboardInterrupt:
        pass
    except (RsioError, LogClosedError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.argument("stream")
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@RSIO_URL
@click.option("--key", default=None, help="the key of every event (UTF-8)")
@click.option("--batch", "batch_size", type=click.IntRange(min=1), default=1000,
              show_default=True, help="at most N events per batch")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="report commits as JSON lines")
@credential_options
def publish(
    stream: str, files: tuple[str, ...], url: str, key: str | None, batch_size: int, as_json: bool,
    **credentials: Any,
) -> None:  # fmt: skip
    """Publish to STREAM over RS.io: each line of stdin is an event (the newline dropped), or
    each FILE is one event ("-" is all of stdin). Prints each commit as the hub makes it
    durable, then a summary; exits non-zero if the hub refuses or fails the publish."""
    import asyncio

    from .client.rsio import Receipt, RsioError, connect

    key_bytes = None if key is None else key.encode()
    total = [0, 0, 0]  # events, first id, last id

    def report(receipt: Receipt) -> None:
        total[0] += receipt.count
        total[1] = total[1] or receipt.first_id
        total[2] = receipt.last_id
        if as_json:
            click.echo(json.dumps({"durable": receipt.count, "first_id": receipt.first_id,
                                   "last_id": receipt.last_id}))  # fmt: skip
        else:
            click.echo(f"durable\t{receipt.count}\t{receipt.first_id}\t{receipt.last_id}")

    async def run() -> None:
        loop = asyncio.get_running_loop()
        async with connect(url, **client_options(url, **credentials)) as hub, \
                await hub.publisher(stream) as pub:
            pending: list[asyncio.Future[Receipt]] = []

            async def submit(values: list[bytes]) -> None:
                for i in range(0, len(values), batch_size):
                    chunk = values[i : i + batch_size]
                    keys = None if key_bytes is None else [key_bytes] * len(chunk)
                    pending.append(await pub.submit(Batch.build(stream, chunk, keys=keys)))
                while pending and pending[0].done():
                    report(pending.pop(0).result())

            if files:
                for name in files:
                    read = sys.stdin.buffer.read if name == "-" else Path(name).read_bytes
                    data = await loop.run_in_executor(None, read)
                    await submit([data])
            else:
                rest = b""
                stdin = cast(io.BufferedReader, sys.stdin.buffer)
                while chunk := await loop.run_in_executor(None, stdin.read1, 1 << 16):
                    *lines, rest = (rest + chunk).split(b"\n")
                    if lines:
                        await submit(lines)
                if rest:
                    await submit([rest])
            for future in pending:
                report(await future)
        if total[0]:
            click.echo(f"published {total[0]} events to {stream} (ids {total[1]}..{total[2]})",
                       err=True)  # fmt: skip
        else:
            click.echo("nothing to publish", err=True)

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except (RsioError, OSError, ValueError, TidewireError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@RSIO_URL
@click.option("--stream", default="bench", show_default=True, help="the stream to publish to")
@click.option("--events", "count", type=click.IntRange(min=1), default=100_000,
              show_default=True, help="events to publish")  # fmt: skip
@click.option("--size", type=click.IntRange(min=0), default=100, show_default=True,
              help="bytes per value")  # fmt: skip
@click.option("--batch", "batch_size", type=click.IntRange(min=1), default=1000,
              show_default=True, help="events per batch")  # fmt: skip
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object per figure: name, value, unit")  # fmt: skip
@PROGRESS
@credential_options
def bench(url: str, stream: str, count: int, size: int, batch_size: int, as_json: bool,
          progress: bool | None, **credentials: Any) -> None:  # fmt: skip
    """Measure a running hub over RS.io: publish --events values of --size bytes to --stream
    in batches of --batch, many batches in flight (one publisher), then read them back with a
    subscription from the first id published. Prints events/s and MB/s (10^6 bytes of values)
    of both, and the commit latency of a batch, from its submit to its receipt (durable): p50
    and p99."""
    import asyncio
    import functools
    import time

    from .client.rsio import Receipt, RsioError, connect

    payload = os.urandom(size)
    latencies: list[float] = []

    async def run() -> list[tuple[str, float, str]]:
        async with connect(url, **client_options(url, **credentials)) as hub:
            with progress_bars(progress) as bars:
                up = bars.add_task(f"publish {stream}", total=count)

                def committed(submitted: float, n: int, future: asyncio.Future[Receipt]) -> None:
                    if not future.cancelled() and future.exception() is None:
                        latencies.append(time.perf_counter() - submitted)
                        bars.advance(up, n)

                futures: list[asyncio.Future[Receipt]] = []
                async with await hub.publisher(stream) as pub:
                    start = time.perf_counter()
                    for done in range(0, count, batch_size):
                        n = min(batch_size, count - done)
                        batch = Batch.build(stream, [payload] * n)
                        submitted = time.perf_counter()
                        future = await pub.submit(batch)
                        future.add_done_callback(functools.partial(committed, submitted, n))
                        futures.append(future)
                    receipts = [await future for future in futures]
                    published = time.perf_counter() - start
                first, last = receipts[0].first_id, receipts[-1].last_id

                down = bars.add_task(f"subscribe {stream}", total=last - first + 1)
                received = received_bytes = 0
                start = time.perf_counter()
                async with contextlib.aclosing(
                    hub.subscribe(stream, from_id=first, until_id=last)
                ) as batches:
                    async for batch in batches:
                        received += len(batch)
                        received_bytes += batch.values.nbytes
                        bars.advance(down, len(batch))
                read = time.perf_counter() - start
        latencies.sort()
        return [
            ("publish_events_per_second", count / published, "events/s"),
            ("publish_mb_per_second", count * size / published / 1e6, "MB/s"),
            ("subscribe_events_per_second", received / read, "events/s"),
            ("subscribe_mb_per_second", received_bytes / read / 1e6, "MB/s"),
            ("commit_latency_p50_ms", _percentile(latencies, 0.50) * 1e3, "ms"),
            ("commit_latency_p99_ms", _percentile(latencies, 0.99) * 1e3, "ms"),
            ("first_id", first, "id"),
            ("last_id", last, "id"),
        ]

    try:
        figures = asyncio.run(run())
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except (RsioError, LogClosedError, OSError, ValueError, TidewireError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        for name, value, unit in figures:
            click.echo(json.dumps({"name": name, "value": value, "unit": unit}))
        return
    f = {name: value for name, value, _ in figures}
    table = make_table(f"{count:,} events of {size} B to {stream} (ids {f['first_id']:.0f}.."
                   f"{f['last_id']:.0f}), in batches of {batch_size}", "PHASE", "EVENTS/S",
                   "MB/S")  # fmt: skip
    for phase in ("publish", "subscribe"):
        table.add_row(phase, f"{f[phase + '_events_per_second']:,.0f}",
                      f"{f[phase + '_mb_per_second']:,.2f}")  # fmt: skip
    table.caption = (f"commit latency (submit to receipt) over {len(latencies)} batch(es): "
                     f"p50 {f['commit_latency_p50_ms']:.2f} ms, "
                     f"p99 {f['commit_latency_p99_ms']:.2f} ms")  # fmt: skip
    make_console().print(stacked(table))


def _percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted figures (0 for none)."""
    if not ordered:
        return 0.0
    import math

    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

