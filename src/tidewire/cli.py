"""The ``tidewire`` command: ``serve`` runs the hub; ``streams`` and ``stats`` ask a running hub
(its admin API, docs/observability.md), ``streams create/retention/delete`` manage its streams
(cli_streams.py), ``streams --data-dir`` and ``dump`` read a data directory offline
(read-only: no lock taken, nothing repaired, safe while a server runs); ``tail``, ``publish``
and ``bench`` talk RS.io to a running hub (cli_rsio.py), ``seguro`` Seguro (cli_seguro.py);
the options they share are in cli_options.py. ``serve --storage`` runs a gateway of a NATS
JetStream cluster, ``cluster local`` a local cluster (cli_cluster.py, docs/cluster.md).

click is the library for the command line, rich for its tables and progress bars (progress
goes to stderr, so that stdout stays the data).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

import click

from . import __version__, native
from .cli_cluster import ClusterUnavailable, cluster, offline_data_dir
from .cli_options import (
    DATA_DIR_HELP,
    HTTP_URL,
    PROGRESS,
    admin_client,
    admin_message,
    ask,
    configure_logging,
    credential_options,
    open_read_only,
    print_event,
)
from .cli_rsio import bench, publish, tail
from .cli_seguro import seguro
from .cli_streams import streams
from .cli_time import HELP as TIME_HELP
from .cli_time import TIME
from .cli_views import (
    make_console,
    progress_bars,
    stats_view,
)
from .config import SETTINGS, ConfigError, env_name, load_config
from .model import LogError, TidewireError, UnknownStream

if TYPE_CHECKING:
    from rich.console import RenderableType

    from .client.admin import AdminClient, AdminError, Stats

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tidewire",
                      message=f"%(prog)s, version %(version)s ({native.describe()})")  # fmt: skip
def main() -> None:
    """tidewire: a durable event-streaming hub."""


def _settings_help() -> str:
    lines = [f"{key} ({kind.__name__}, {env_name(key)}): {help_}"
             for key, (kind, _, help_) in SETTINGS.items()]  # fmt: skip
    return "\b\nSettings for --set KEY=VALUE:\n" + "\n".join(lines)


@main.command(epilog=_settings_help())
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              envvar="TIDEWIRE_CONFIG", help="TOML config file ($TIDEWIRE_CONFIG)")  # fmt: skip
@click.option("--data-dir", help="directory of the embedded log (unused with --storage)")
@click.option("--storage", "storage_url", metavar="URLS",
              help="store the streams in this NATS JetStream cluster instead (storage.url: "
                   "nats://h1:4222,nats://h2:4222; docs/cluster.md)")  # fmt: skip
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
    storage_url: str | None,
    host: str | None,
    http_port: int | None,
    rsio_port: int | None,
    seguro_port: int | None,
    tolliver_port: int | None,
    sets: tuple[str, ...],
) -> None:
    """Run the hub: config file < TIDEWIRE_* variables < flags. SIGHUP reloads the tokens
    and ACL files (auth.tokens_file, auth.acl_file). With --storage, a gateway of a cluster:
    the streams are in JetStream, data_dir is not used; an unreachable cluster exits 69."""
    from .server import run_server
    from .server.storage_open import StorageUnavailable

    overrides: dict[str, Any] = {
        "data_dir": data_dir,
        "storage.url": storage_url,
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
    configure_logging(config.log_level, str(config.values["log_format"]))
    tuned = native.tune_allocator()  # (large transient buffers off mmap: docs/native.md)
    logging.getLogger("tidewire").info("%s; malloc tuned: %s", native.describe(), tuned)
    try:
        run_server(config)
    except StorageUnavailable as exc:
        logging.getLogger("tidewire").error("cannot serve: %s", exc)
        raise ClusterUnavailable(str(exc)) from None  # (exit status 69)
    except (LogError, OSError, ConfigError) as exc:
        logging.getLogger("tidewire").error("cannot serve: %s", exc)
        raise click.ClickException(str(exc)) from None


@main.command()
@HTTP_URL
@click.option("--json", "as_json", is_flag=True,
              help="print /api/stats as one JSON object (with --watch: one per refresh)")
@click.option("--watch", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="refresh every SECONDS until Ctrl-C")
@click.option("--count", type=click.IntRange(min=1), default=None, hidden=True,
              help="with --watch: stop after N refreshes")
@credential_options
def stats(url: str, as_json: bool, watch: float | None, count: int | None,
          **credentials: Any) -> None:  # fmt: skip
    """Show a running hub (its admin API): version, uptime, totals and rates in and out; its
    streams; connections and subscriptions by protocol; every subscription (demand, lag);
    the Tolliver peers (unacked deliveries, resends)."""
    import asyncio

    from rich.live import Live
    from rich.text import Text

    from .client.admin import AdminError

    admin = admin_client(url, **credentials)
    out = make_console()

    def show(data: Stats | AdminError, live: Live | None) -> None:
        if as_json:
            if isinstance(data, AdminError):
                click.echo(admin_message(data), err=True)
            else:
                click.echo(json.dumps(data))
            return
        view: RenderableType
        if isinstance(data, AdminError):
            view = Text(f"{admin_message(data)}; trying again every {watch:g}s")
        else:
            view = stats_view(data, admin.base_url)
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
        ask(admin, run)


@main.command()
@click.argument("stream")
@click.option("--data-dir", help=DATA_DIR_HELP)
@click.option("--from", "from_id", type=click.IntRange(min=0), default=None,
              help="first id")  # fmt: skip
@click.option("--from-time", type=TIME, default=None,
              help=f"from the first event this new: {TIME_HELP}")  # fmt: skip
@click.option("--limit", type=click.IntRange(min=1), default=None, help="at most N events")
@click.option("--json", "as_json", is_flag=True, help="JSON lines; key and value in base64")
@PROGRESS
def dump(stream: str, data_dir: str | None, from_id: int | None, from_time: int | None,
         limit: int | None, as_json: bool, progress: bool | None) -> None:  # fmt: skip
    """Print the events of STREAM: id, timestamp (ms), key, value, from --from or from the
    first event at or after --from-time (the log's time index). The progress bar (stderr)
    shows by default when stderr is a terminal and stdout is not."""
    if from_id is not None and from_time is not None:
        raise click.UsageError("--from and --from-time exclude each other")
    log = open_read_only(offline_data_dir(data_dir))  # (not with storage.url: a gateway's)
    try:
        if stream not in log:
            raise click.ClickException(str(UnknownStream(stream)))
        remaining = sys.maxsize if limit is None else limit
        if from_time is not None:  # (no event that new: nothing to print)
            found = log.find_time(stream, from_time)
            from_id, remaining = (0, 0) if found is None else (found, remaining)
        next_id = max(from_id or 0, 1)
        total = max(0, log.latest(stream) - max(next_id, log.start_id(stream)) + 1)
        with progress_bars(progress, stdout_too=True) as bars:
            task = bars.add_task(f"dump {stream}", total=min(total, remaining))
            while remaining > 0:
                batches = log.read(stream, next_id, 1024 * 1024, remaining)
                if not batches:
                    break
                for batch in batches:
                    for event in batch:
                        print_event(event, as_json)
                    remaining -= len(batch)
                    next_id = batch.last_id + 1
                    bars.advance(task, len(batch))
    except TidewireError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        log.close_sync()


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


for command in (streams, tail, publish, bench, seguro, cluster):
    main.add_command(command)


if __name__ == "__main__":  # pragma: no cover
    main()
