"""``tidewire seguro save | read``: talk Seguro (the per-point event log) to a running hub."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from .cli_options import (
    SEGURO_URL,
    b64,
    credential_options,
    seguro_tls,
    text,
)
from .model import TidewireError

__all__ = ["seguro"]


@click.group()
def seguro() -> None:
    """Talk Seguro (the per-point event log) to a running hub."""



@seguro.command("save")
@click.argument("point")
@click.argument("values", nargs=-1)
@click.option("--file", "files", multiple=True,
              type=click.Path(exists=True, dir_okay=False, allow_dash=True),
              help="an event: the whole file (\"-\": all of stdin); repeatable, instead of "
                   "VALUES")  # fmt: skip
@SEGURO_URL
@click.option("--id", "first_id", type=click.IntRange(min=1), default=None,
              help="the first event's id (default: the latest stored + 1)")  # fmt: skip
@credential_options
def seguro_save(point: str, values: tuple[str, ...], files: tuple[str, ...], url: str,
                first_id: int | None, **credentials: Any) -> None:  # fmt: skip
    """Save events of POINT with consecutive ids: each VALUE is one event (its bytes as given:
    UTF-8 text, or any bytes the shell passed, as Python's os.fsencode gives them back), and
    "-" (or no VALUE and no --file) reads one event per line of stdin (the newline dropped, as
    tidewire publish does); each --file F is one event, F's bytes ("-": all of stdin).
    SAVE for one event, SAVE MANY for several; prints what the hub committed, or "nothing to
    save" on stderr when there is no event. The events are read whole before the first is sent
    (a SAVE MANY declares its count first)."""
    import asyncio

    from .client.seguro import SeguroError, connect

    if values and files:
        raise click.UsageError("give VALUES or --file, not both")
    if (*values, *files).count("-") > 1:
        raise click.UsageError('"-" (stdin) may be given once')

    def read_events() -> list[bytes]:
        if files:
            return [sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
                    for name in files]  # fmt: skip
        events: list[bytes] = []
        for value in values or ("-",):
            events += _stdin_lines() if value == "-" else [os.fsencode(value)]
        return events

    async def run() -> None:
        datas = await asyncio.get_running_loop().run_in_executor(None, read_events)
        if not datas:
            click.echo("nothing to save", err=True)
            return
        async with connect(url, point, ssl=seguro_tls(url, **credentials)) as ship:
            start = first_id if first_id is not None else ship.latest + 1
            events = [(start + i, data) for i, data in enumerate(datas)]
            if len(events) == 1:
                await ship.save(*events[0])
            else:
                await ship.save_many(events)
            click.echo(f"committed {len(events)} event(s) of {point}: ids {start}.."
                       f"{start + len(events) - 1}")  # fmt: skip

    try:
        asyncio.run(run())
    except (SeguroError, OSError, ValueError, TidewireError) as exc:
        raise click.ClickException(str(exc)) from None


def _stdin_lines() -> list[bytes]:
    """stdin's lines, each without its newline; a last line without one counts too, an empty
    stdin is no line (the split ``tidewire publish`` makes)."""
    *lines, rest = sys.stdin.buffer.read().split(b"\n")
    return [*lines, rest] if rest else lines


@seguro.command("read")
@click.argument("point")
@SEGURO_URL
@click.option("--from", "from_id", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON lines; data in base64")
@credential_options
def seguro_read(point: str, url: str, from_id: int, limit: int, as_json: bool,
                **credentials: Any) -> None:  # fmt: skip
    """Read up to LIMIT events of POINT from id --from (READ)."""
    import asyncio

    from .client.seguro import SeguroError, connect

    async def run() -> None:
        async with connect(url, point, ssl=seguro_tls(url, **credentials)) as ship:
            events, sent = await ship.read(from_id, limit)
        for event_id, data in events:
            if as_json:
                click.echo(json.dumps({"id": event_id, "data": b64(data)}))
            else:
                click.echo(f"{event_id}\t{text(data)}")
        click.echo(f"sent {sent.count} ({sent.start}..{sent.end})", err=True)

    try:
        asyncio.run(run())
    except (SeguroError, OSError, ValueError, TidewireError) as exc:
        raise click.ClickException(str(exc)) from None

