"""The ``tidewire`` command: ``serve`` runs the hub; ``streams`` and ``stats`` ask a running hub
(its admin API, docs/observability.md), ``streams --data-dir`` and ``dump`` read a data
directory offline (read-only: no lock taken, nothing repaired, safe while a server runs);
``tail``, ``publish`` and ``bench`` talk RS.io to a running hub.

click is the library for the command line, rich for its tables and progress bars (progress
goes to stderr, so that stdout stays the data).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from . import __version__
from .cli_views import (
    _console,
    _lines,
    _progress,
    _stats_view,
    _streams_table,
    _table,
)
from .config import SETTINGS, ConfigError, env_name, load_config
from .log import Log
from .model import Batch, Event, LogClosedError, LogError, TidewireError, UnknownStream

if TYPE_CHECKING:
    from rich.console import RenderableType

    from .client.admin import AdminClient, AdminError, Stats

__all__ = ["main"]

T = TypeVar("T")

_DATA_DIR_HELP = "data directory (default: $TIDEWIRE_DATA_DIR or ./tidewire-data)"


def _setup_logging(level: str, log_format: str = "text") -> None:
    from .observe.logs import setup_logging

    setup_logging(level, log_format)


def _data_dir(option: str | None) -> str:
    if option:
        return option
    try:
        return load_config(None).data_dir
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _open_read_only(data_dir: str) -> Log:
    if not os.path.isdir(data_dir):
        raise click.ClickException(f"no data directory at {data_dir}")
    try:
        return Log.open(data_dir, read_only=True)
    except (LogError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


def _credentials(f: Any) -> Any:
    """``--token``, ``--ca-file``, ``--cert-file``, ``--key-file`` (also from TIDEWIRE_*)."""
    for option in reversed((
        click.option("--token", envvar="TIDEWIRE_TOKEN", default=None,
                     help="bearer token ($TIDEWIRE_TOKEN)"),
        click.option("--ca-file", envvar="TIDEWIRE_CA_FILE", default=None,
                     type=click.Path(exists=True, dir_okay=False),
                     help="CA that signed the hub's certificate (TLS; $TIDEWIRE_CA_FILE)"),
        click.option("--cert-file", envvar="TIDEWIRE_CERT_FILE", default=None,
                     type=click.Path(exists=True, dir_okay=False),
                     help="client certificate for mutual TLS ($TIDEWIRE_CERT_FILE)"),
        click.option("--key-file", envvar="TIDEWIRE_KEY_FILE", default=None,
                     type=click.Path(exists=True, dir_okay=False),
                     help="its private key ($TIDEWIRE_KEY_FILE)"),
    )):  # fmt: skip
        f = option(f)
    return f


def _client_options(url: str, token: str | None, ca_file: str | None, cert_file: str | None,
                    key_file: str | None) -> dict[str, Any]:  # fmt: skip
    """``connect()`` keywords: the token, and a TLS context for rsios:// or any TLS file."""
    from .server.guard import client_context

    tls = url.startswith("rsios:") or ca_file is not None or cert_file is not None
    return {"token": token, "ssl": client_context(ca_file, cert_file, key_file) if tls else None}


def _seguro_tls(url: str, token: str | None, **files: str | None) -> Any:
    """Seguro has no tokens (a ship is its certificate): only the TLS files count."""
    if token is not None:
        raise click.BadParameter("Seguro takes no token: use --cert-file", param_hint="--token")
    return _client_options(url.replace("seguros:", "rsios:", 1), None, **files)["ssl"]


# --------------------------------------------------------------------------- the admin API

_HTTP_URL = click.option("--url", default="http://127.0.0.1:7480", show_default=True,
                         envvar="TIDEWIRE_HTTP_URL",
                         help="the hub's HTTP endpoint ($TIDEWIRE_HTTP_URL)")  # fmt: skip


def _admin(url: str, token: str | None, ca_file: str | None, cert_file: str | None,
           key_file: str | None) -> AdminClient:  # fmt: skip
    """The admin API's client: TLS for https:// or when a TLS file is given (http:// then
    becomes https://, as rsio:// becomes rsios:// for ``_client_options``)."""
    from .client.admin import AdminClient
    from .server.guard import client_context

    tls = url.startswith("https:") or ca_file is not None or cert_file is not None
    if tls and url.startswith("http:"):
        url = "https:" + url[len("http:") :]
    try:
        ssl = client_context(ca_file, cert_file, key_file) if tls else None
    except OSError as exc:  # (ssl.SSLError too)
        raise click.ClickException(f"cannot load the TLS files: {exc}") from None
    try:
        return AdminClient(url, token=token, ssl=ssl)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--url") from None


def _admin_message(exc: AdminError) -> str:
    """The error, with what to do about it."""
    hint = {
        0: "is the hub running? --url or $TIDEWIRE_HTTP_URL names it",
        401: "give a token with --token or $TIDEWIRE_TOKEN",
        403: "the ACL must grant this principal monitor = true",
        404: "does this hub serve the admin API (/api)?",
    }.get(exc.status)
    if exc.tls:
        hint = "--ca-file names the CA that signed the hub's certificate"
    return f"{exc} ({hint})" if hint else str(exc)


def _ask(admin: AdminClient, call: Callable[[AdminClient], Awaitable[T]]) -> T:
    """Run ``call(admin)`` in a fresh event loop; an :class:`AdminError` is the command's."""
    import asyncio

    from .client.admin import AdminError

    async def run() -> T:
        async with admin:
            return await call(admin)

    try:
        return asyncio.run(run())
    except AdminError as exc:
        raise click.ClickException(_admin_message(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tidewire")
def main() -> None:
    """tidewire: a durable event-streaming hub."""


def _settings_help() -> str:
    lines = [f"{key} ({kind.__name__}, {env_name(key)}): {help_}"
             for key, (kind, _, help_) in SETTINGS.items()]  # fmt: skip
    return "\b\nSettings for --set KEY=VALUE:\n" + "\n".join(lines)


@main.command(epilog=_settings_help())
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              envvar="TIDEWIRE_CONFIG", help="TOML config file ($TIDEWIRE_CONFIG)")  # fmt: skip
@click.option("--data-dir", help="directory of the embedded log")
@click.option("--host", help="address every listener binds to (default 127.0.0.1)")
@click.option("--http-port", type=int, help="HTTP port (default 7480; 0 = any free port)")
@click.option("--rsio-port", type=int, help="RS.io TCP port (default 7400; 0 = any free port)")
@click.option("--seguro-port", type=int,
              help="Seguro TCP port (default 7403; 0 = any free port)")  # fmt: skip
@click.option("--tolliver-port", type=int,
              help="Tolliver TCP port (default 7402; 0 = any free port)")  # fmt: skip
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="any setting")
def serve(
    config_path: str | None,
    data_dir: str | None,
    host: str | None,
    http_port: int | None,
    rsio_port: int | None,
    seguro_port: int | None,
    tolliver_port: int | None,
    sets: tuple[str, ...],
) -> None:
    """Run the hub: config file < TIDEWIRE_* variables < flags."""
    from .server import run_server

    overrides: dict[str, Any] = {
        "data_dir": data_dir,
        "host": host,
        "http.port": http_port,
        "rsio.port": rsio_port,
        "seguro.port": seguro_port,
        "tolliver.port": tolliver_port,
    }
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
        overrides[key.strip()] = value
    try:
        config = load_config(config_path, overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    _setup_logging(config.log_level, str(config.values["log_format"]))
    try:
        run_server(config)
    except (LogError, OSError, ConfigError) as exc:
        logging.getLogger("tidewire").error("cannot serve: %s", exc)
        raise click.ClickException(str(exc)) from None


@main.command()
@_HTTP_URL
@click.option("--data-dir", default=None,
              help="read this data directory instead, offline (no hub needed; no rates)")
@click.option("--internal", is_flag=True, help="include the hub's own streams (_tidewire.*)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per stream")
@_credentials
def streams(url: str, data_dir: str | None, internal: bool, as_json: bool,
            **credentials: Any) -> None:  # fmt: skip
    """List the streams of a running hub (its admin API): name, events, first/latest id,
    bytes, and the events per second in and out. With --data-dir, list those of a data
    directory instead, read directly (read-only: no lock, no repair; safe while a server
    runs)."""
    from .hub.hub import RESERVED_PREFIX

    rows: list[dict[str, Any]]
    if data_dir is not None:
        log = _open_read_only(data_dir)
        try:
            rows = [{"name": s.name, "events": s.events, "first_id": s.first_id,
                     "latest_id": s.latest_id, "bytes": s.bytes} for s in log.stats()]  # fmt: skip
        finally:
            log.close_sync()
        rows = [r for r in rows if internal or not r["name"].startswith(RESERVED_PREFIX)]
        keys = ["name", "events", "first_id", "latest_id", "bytes"]
    else:
        admin = _admin(url, **credentials)
        rows = cast(list[dict[str, Any]], _ask(admin, lambda a: a.streams(internal=internal)))
        keys = ["name", "events", "first_id", "latest_id", "bytes", "events_in_rate",
                "events_out_rate", "bytes_in_rate", "bytes_out_rate"]  # fmt: skip
    if as_json:
        for row in rows:
            click.echo(json.dumps({k: row.get(k) for k in keys}))
        return
    _console().print(_streams_table(rows, rates=data_dir is None))


@main.command()
@_HTTP_URL
@click.option("--json", "as_json", is_flag=True,
              help="print /api/stats as one JSON object (with --watch: one per refresh)")
@click.option("--watch", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="refresh every SECONDS until Ctrl-C")
@click.option("--count", type=click.IntRange(min=1), default=None, hidden=True,
              help="with --watch: stop after N refreshes")
@_credentials
def stats(url: str, as_json: bool, watch: float | None, count: int | None,
          **credentials: Any) -> None:  # fmt: skip
    """Show a running hub (its admin API): version, uptime, totals and rates in and out; its
    streams; connections and subscriptions by protocol; every subscription (demand, lag);
    the Tolliver peers (unacked deliveries, resends)."""
    import asyncio

    from rich.live import Live
    from rich.text import Text

    from .client.admin import AdminError

    admin = _admin(url, **credentials)
    out = _console()

    def show(data: Stats | AdminError, live: Live | None) -> None:
        if as_json:
            if isinstance(data, AdminError):
                click.echo(_admin_message(data), err=True)
            else:
                click.echo(json.dumps(data))
            return
        view: RenderableType
        if isinstance(data, AdminError):
            view = Text(f"{_admin_message(data)}; trying again every {watch:g}s")
        else:
            view = _stats_view(data, admin.base_url)
        if live is not None:
            live.update(view, refresh=True)
        else:
            out.print(view)

    async def run(admin: AdminClient) -> None:
        data: Stats | AdminError = await admin.stats()  # a first error is final
        if watch is None:
            show(data, None)
            return
        # On a terminal the view is redrawn in place; elsewhere each refresh is printed.
        live = Live(console=out, auto_refresh=False, redirect_stdout=False,
                    redirect_stderr=False) if out.is_terminal and not as_json else None  # fmt: skip
        with live or contextlib.nullcontext():
            shown = 0
            while True:
                show(data, live)
                shown += 1
                if count is not None and shown >= count:
                    return
                await asyncio.sleep(watch)
                try:
                    data = await admin.stats()
                except AdminError as exc:
                    if exc.status in (401, 403):
                        raise
                    data = exc  # (the hub restarts, say): shown, and tried again

    with contextlib.suppress(KeyboardInterrupt):
        _ask(admin, run)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _text(data: bytes | None) -> str:
    if data is None:
        return "-"
    return repr(data)[2:-1]  # printable ASCII as is, everything else escaped


_PROGRESS = click.option("--progress/--no-progress", default=None,
                         help="progress bars on stderr (default: when stderr is a terminal)")


@main.command()
@click.argument("stream")
@click.option("--data-dir", help=_DATA_DIR_HELP)
@click.option("--from", "from_id", type=click.IntRange(min=0), default=0, help="first id")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="at most N events")
@click.option("--json", "as_json", is_flag=True, help="JSON lines; key and value in base64")
@_PROGRESS
def dump(stream: str, data_dir: str | None, from_id: int, limit: int | None, as_json: bool,
         progress: bool | None) -> None:  # fmt: skip
    """Print the events of STREAM: id, timestamp (ms), key, value. The progress bar (stderr)
    shows by default when stderr is a terminal and stdout is not."""
    log = _open_read_only(_data_dir(data_dir))
    try:
        if stream not in log:
            raise click.ClickException(str(UnknownStream(stream)))
        remaining = sys.maxsize if limit is None else limit
        next_id = max(from_id, 1)
        total = max(0, log.latest(stream) - max(next_id, log.start_id(stream)) + 1)
        with _progress(progress, stdout_too=True) as bars:
            task = bars.add_task(f"dump {stream}", total=min(total, remaining))
            while remaining > 0:
                batches = log.read(stream, next_id, 1024 * 1024, remaining)
                if not batches:
                    break
                for batch in batches:
                    for event in batch:
                        _print_event(event, as_json)
                    remaining -= len(batch)
                    next_id = batch.last_id + 1
                    bars.advance(task, len(batch))
    except TidewireError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        log.close_sync()


@main.command()
@click.argument("stream")
@click.option("--url", default="rsio://127.0.0.1:7400", show_default=True, envvar="TIDEWIRE_URL",
              help="the hub's RS.io endpoint ($TIDEWIRE_URL)")  # fmt: skip
@click.option("--from", "from_id", default="earliest", show_default=True,
              help="an id, earliest or latest")  # fmt: skip
@click.option("--limit", type=click.IntRange(min=1), default=None, help="stop after N events")
@click.option("--json", "as_json", is_flag=True, help="JSON lines; key and value in base64")
@_credentials
def tail(stream: str, url: str, from_id: str, limit: int | None, as_json: bool,
         **credentials: Any) -> None:  # fmt: skip
    """Follow STREAM over RS.io: history from --from, then live (Ctrl-C stops)."""
    import asyncio

    from .client.rsio import RsioError, connect

    start: int | str = int(from_id) if from_id.isdigit() else from_id
    if start not in ("earliest", "latest") and not isinstance(start, int):
        raise click.BadParameter("an id, earliest or latest", param_hint="--from")

    async def follow() -> None:
        remaining = sys.maxsize if limit is None else limit
        async with connect(url, **_client_options(url, **credentials)) as hub, contextlib.aclosing(
            hub.subscribe(stream, from_id=start)
        ) as batches:
            async for batch in batches:
                for event in batch:
                    _print_event(event, as_json)
                    remaining -= 1
                    if not remaining:
                        return

    try:
        asyncio.run(follow())
    except KeyboardInterrupt:
        pass
    except (RsioError, LogClosedError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.argument("stream")
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--url", default="rsio://127.0.0.1:7400", show_default=True, envvar="TIDEWIRE_URL",
              help="the hub's RS.io endpoint ($TIDEWIRE_URL)")  # fmt: skip
@click.option("--key", default=None, help="the key of every event (UTF-8)")
@click.option("--batch", "batch_size", type=click.IntRange(min=1), default=1000,
              show_default=True, help="at most N events per batch")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="report commits as JSON lines")
@_credentials
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
        async with connect(url, **_client_options(url, **credentials)) as hub, \
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


@main.command()
@click.option("--url", default="rsio://127.0.0.1:7400", show_default=True, envvar="TIDEWIRE_URL",
              help="the hub's RS.io endpoint ($TIDEWIRE_URL)")  # fmt: skip
@click.option("--stream", default="bench", show_default=True, help="the stream to publish to")
@click.option("--events", "count", type=click.IntRange(min=1), default=100_000,
              show_default=True, help="events to publish")  # fmt: skip
@click.option("--size", type=click.IntRange(min=0), default=100, show_default=True,
              help="bytes per value")  # fmt: skip
@click.option("--batch", "batch_size", type=click.IntRange(min=1), default=1000,
              show_default=True, help="events per batch")  # fmt: skip
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object per figure: name, value, unit")  # fmt: skip
@_PROGRESS
@_credentials
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
        async with connect(url, **_client_options(url, **credentials)) as hub:
            with _progress(progress) as bars:
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
    table = _table(f"{count:,} events of {size} B to {stream} (ids {f['first_id']:.0f}.."
                   f"{f['last_id']:.0f}), in batches of {batch_size}", "PHASE", "EVENTS/S",
                   "MB/S")  # fmt: skip
    for phase in ("publish", "subscribe"):
        table.add_row(phase, f"{f[phase + '_events_per_second']:,.0f}",
                      f"{f[phase + '_mb_per_second']:,.2f}")  # fmt: skip
    table.caption = (f"commit latency (submit to receipt) over {len(latencies)} batch(es): "
                     f"p50 {f['commit_latency_p50_ms']:.2f} ms, "
                     f"p99 {f['commit_latency_p99_ms']:.2f} ms")  # fmt: skip
    _console().print(_lines(table))


def _percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted figures (0 for none)."""
    if not ordered:
        return 0.0
    import math

    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@main.group()
def token() -> None:
    """Bearer tokens for the hub (settings auth.tokens_file and auth.acl_file)."""


@token.command("create")
@click.argument("name")
@click.option("--days", type=click.FloatRange(min=0, min_open=True), default=None,
              help="expire after this many days (default: never)")  # fmt: skip
def token_create(name: str, days: float | None) -> None:
    """Make a token for NAME: prints the token (give it to the client, it is shown only once)
    and the table to add to the tokens file. The hub keeps only its SHA-256; the ACL names
    the principal token:NAME."""
    from .hub.access import mint_token

    try:
        secret, table = mint_token(name, days)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    click.echo(secret)
    click.echo(f"# add to the tokens file (auth.tokens_file); the ACL names it token:{name}",
               err=True)  # fmt: skip
    click.echo(table, err=True, nl=False)


@main.group()
def seguro() -> None:
    """Talk Seguro (the per-point event log) to a running hub."""


_SEGURO_URL = click.option("--url", default="seguro://127.0.0.1:7403", show_default=True,
                           envvar="TIDEWIRE_SEGURO_URL",
                           help="the hub's Seguro endpoint ($TIDEWIRE_SEGURO_URL)")  # fmt: skip


@seguro.command("save")
@click.argument("point")
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@_SEGURO_URL
@click.option("--id", "first_id", type=click.IntRange(min=1), default=None,
              help="the first event's id (default: the latest stored + 1)")  # fmt: skip
@_credentials
def seguro_save(point: str, files: tuple[str, ...], url: str, first_id: int | None,
                **credentials: Any) -> None:  # fmt: skip
    """Save each FILE ("-" is stdin) as one event of POINT, with consecutive ids: SAVE for one,
    SAVE MANY for several. Prints what the hub committed."""
    import asyncio

    from .client.seguro import SeguroError, connect

    async def run() -> None:
        loop = asyncio.get_running_loop()
        datas = []
        for name in files or ("-",):
            read = sys.stdin.buffer.read if name == "-" else Path(name).read_bytes
            datas.append(await loop.run_in_executor(None, read))
        async with connect(url, point, ssl=_seguro_tls(url, **credentials)) as ship:
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


@seguro.command("read")
@click.argument("point")
@_SEGURO_URL
@click.option("--from", "from_id", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON lines; data in base64")
@_credentials
def seguro_read(point: str, url: str, from_id: int, limit: int, as_json: bool,
                **credentials: Any) -> None:  # fmt: skip
    """Read up to LIMIT events of POINT from id --from (READ)."""
    import asyncio

    from .client.seguro import SeguroError, connect

    async def run() -> None:
        async with connect(url, point, ssl=_seguro_tls(url, **credentials)) as ship:
            events, sent = await ship.read(from_id, limit)
        for event_id, data in events:
            if as_json:
                click.echo(json.dumps({"id": event_id, "data": _b64(data)}))
            else:
                click.echo(f"{event_id}\t{_text(data)}")
        click.echo(f"sent {sent.count} ({sent.start}..{sent.end})", err=True)

    try:
        asyncio.run(run())
    except (SeguroError, OSError, ValueError, TidewireError) as exc:
        raise click.ClickException(str(exc)) from None


def _print_event(event: Event, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({
            "id": event.id,
            "timestamp": event.timestamp,
            "key": None if event.key is None else _b64(event.key),
            "value": _b64(event.value),
        }))  # fmt: skip
    else:
        click.echo(f"{event.id}\t{event.timestamp}\t{_text(event.key)}\t{_text(event.value)}")


if __name__ == "__main__":  # pragma: no cover
    main()
