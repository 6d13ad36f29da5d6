"""``tidewire streams``: list the streams (a running hub's, or a data directory's), and manage
them through the hub's admin API (issue 23):

* ``tidewire streams create NAME [--retention 7d | --retention-ms N] [--retention-bytes 1GiB]``
  is Kafka's ``kafka-topics --create --topic NAME --config retention.ms=...`` and NATS's
  ``nats stream add NAME --max-age 7d --max-bytes 1GiB``;
* ``tidewire streams retention NAME [...]`` is ``kafka-topics --alter`` /
  ``kafka-configs --alter --add-config retention.ms=...`` and ``nats stream edit``: only
  retention is a stream's to change (the names ``--max-age``/``--max-bytes`` are accepted as
  NATS users type them);
* ``tidewire streams delete NAME`` is ``kafka-topics --delete`` and ``nats stream rm``: like
  ``nats stream rm`` it asks first (the name typed again, as the dashboard asks), unless
  ``--yes`` (``-y``, ``-f``, ``--force``).

``none`` is "no bound" (Kafka's ``-1``, also accepted). Each needs a token the hub's ACL grants
``admin`` on the stream (a hub without an ACL file refuses them to everyone); a refusal is the
hub's one line with a hint, exit status 1, as for ``streams`` and ``stats``. The connection
options (``--url``, ``--token``, ``--ca-file``, ...) are those of the listing; given before the
subcommand's name (``tidewire streams --url U create x``) they apply to it too.
"""

from __future__ import annotations

import json
from typing import Any, cast

import click
from click.core import ParameterSource

from .cli_options import (
    HTTP_URL,
    admin_client,
    ask,
    credential_options,
    open_read_only,
)
from .cli_retention import (
    BYTES_HELP,
    DURATION_HELP,
    describe_retention,
    parse_bytes,
    parse_duration,
    parse_ms,
)
from .cli_views import make_console, streams_table

__all__ = ["streams"]

_CONNECTION = ("url", "token", "ca_file", "cert_file", "key_file")
_LISTING = {"data_dir": "--data-dir", "internal": "--internal", "as_json": "--json"}


@click.group(invoke_without_command=True)
@HTTP_URL
@click.option("--data-dir", default=None,
              help="read this data directory instead, offline (no hub needed; no rates)")
@click.option("--internal", is_flag=True, help="include the hub's own streams (_tidewire.*)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per stream")
@credential_options
@click.pass_context
def streams(ctx: click.Context, /, url: str, data_dir: str | None, internal: bool, as_json: bool,
            **credentials: Any) -> None:  # fmt: skip
    """List the streams of a running hub (its admin API): name, events, first/latest id,
    bytes, and the events per second in and out. With --data-dir, list those of a data
    directory instead, read directly (read-only: no lock, no repair; safe while a server
    runs).

    With a command, manage them (the ACL's admin right): create a stream with its retention,
    change a stream's retention, delete a stream."""
    if ctx.invoked_subcommand is not None:
        given = [flag for name, flag in _LISTING.items()
                 if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]  # fmt: skip
        if given:
            raise click.UsageError(f"{', '.join(given)} is for the listing, not for "
                                   f"'streams {ctx.invoked_subcommand}'")  # fmt: skip
        return
    _list(url, data_dir, internal, as_json, credentials)


def _list(url: str, data_dir: str | None, internal: bool, as_json: bool,
          credentials: dict[str, Any]) -> None:  # fmt: skip
    from .hub.hub import RESERVED_PREFIX

    rows: list[dict[str, Any]]
    if data_dir is not None:
        log = open_read_only(data_dir)
        try:
            rows = [{"name": s.name, "events": s.events, "first_id": s.first_id,
                     "latest_id": s.latest_id, "bytes": s.bytes} for s in log.stats()]  # fmt: skip
        finally:
            log.close_sync()
        rows = [r for r in rows if internal or not r["name"].startswith(RESERVED_PREFIX)]
        keys = ["name", "events", "first_id", "latest_id", "bytes"]
    else:
        admin = admin_client(url, **credentials)
        rows = cast(list[dict[str, Any]], ask(admin, lambda a: a.streams(internal=internal)))
        keys = ["name", "events", "first_id", "latest_id", "bytes", "events_in_rate",
                "events_out_rate", "bytes_in_rate", "bytes_out_rate"]  # fmt: skip
    if as_json:
        for row in rows:
            click.echo(json.dumps({k: row.get(k) for k in keys}))
        return
    make_console().print(streams_table(rows, rates=data_dir is None))


# --------------------------------------------------------------------------- the admin writes


def _connection(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The subcommand's connection options, each taken from ``tidewire streams`` when given
    there on the command line and not here (``tidewire streams --url U delete x``)."""
    parent = ctx.parent
    out = {name: values[name] for name in _CONNECTION}
    if parent is None:  # pragma: no cover (a subcommand always has its group)
        return out
    for name in _CONNECTION:
        here = ctx.get_parameter_source(name)
        there = parent.get_parameter_source(name)
        if here in (ParameterSource.DEFAULT, ParameterSource.ENVIRONMENT) and \
                there is ParameterSource.COMMANDLINE:  # fmt: skip
            out[name] = parent.params[name]
    return out


def _retention_options(f: Any) -> Any:
    """``--retention``/``--max-age``, ``--retention-ms``, ``--retention-bytes``/``--max-bytes``."""
    for option in reversed((
        click.option("--retention", "--max-age", "retention", metavar="DURATION",
                     help=f"keep events this long: {DURATION_HELP}"),
        click.option("--retention-ms", "retention_ms", metavar="MS",
                     help="the same in milliseconds (Kafka's retention.ms), or none"),
        click.option("--retention-bytes", "--max-bytes", "retention_bytes", metavar="SIZE",
                     help=f"keep at most this much of the stream: {BYTES_HELP}"),
        click.option("--json", "as_json", is_flag=True, help="print the hub's JSON answer"),
    )):  # fmt: skip
        f = option(f)
    return f


def _wanted(retention: str | None, retention_ms: str | None,
            retention_bytes: str | None) -> dict[str, int | None]:  # fmt: skip
    """The ``AdminClient`` keywords of the options given (``None``: no bound)."""
    if retention is not None and retention_ms is not None:
        raise click.UsageError("--retention and --retention-ms both set the time bound: "
                               "give one")  # fmt: skip
    wanted: dict[str, int | None] = {}
    for text, parse, key, hint in (
        (retention, parse_duration, "retention_ms", "--retention"),
        (retention_ms, parse_ms, "retention_ms", "--retention-ms"),
        (retention_bytes, parse_bytes, "retention_bytes", "--retention-bytes"),
    ):  # fmt: skip
        if text is not None:
            try:
                wanted[key] = parse(text)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint=hint) from None
    return wanted


def _show(answer: Any, as_json: bool, line: str) -> None:
    click.echo(json.dumps(answer) if as_json else line)


@streams.command("create", short_help="create a stream (kafka-topics --create, nats stream add)")
@click.argument("name")
@_retention_options
@HTTP_URL
@credential_options
@click.pass_context
def create(ctx: click.Context, /, name: str, retention: str | None, retention_ms: str | None,
           retention_bytes: str | None, as_json: bool, **options: Any) -> None:  # fmt: skip
    """Create the stream NAME, empty, with its retention (kafka-topics --create, nats stream
    add). Without retention options the configuration's applies; with any, the stream's own
    retention is what they say, kept over the configuration across restarts (a bound not
    given is the configuration's)."""
    wanted = _wanted(retention, retention_ms, retention_bytes)
    admin = admin_client(**_connection(ctx, options))
    answer = ask(admin, lambda a: a.create_stream(name, **wanted), right="admin")
    _show(answer, as_json, f"created stream {name!r}; retention: "
          f"{describe_retention(answer['retention'])}")  # fmt: skip


@streams.command("retention", short_help="change a stream's retention (kafka-topics --alter, "
                 "nats stream edit)")  # fmt: skip
@click.argument("name")
@_retention_options
@HTTP_URL
@credential_options
@click.pass_context
def retention(ctx: click.Context, /, name: str, retention: str | None, retention_ms: str | None,
              retention_bytes: str | None, as_json: bool, **options: Any) -> None:  # fmt: skip
    """Change the retention of the stream NAME (kafka-topics --alter, nats stream edit): a
    bound given replaces the one that applies (none: no bound), a bound not given is kept.
    The hub applies it from its next retention pass, and keeps it across restarts."""
    wanted = _wanted(retention, retention_ms, retention_bytes)
    if not wanted:
        raise click.UsageError("nothing to change: give --retention (or --retention-ms) "
                               "and/or --retention-bytes")  # fmt: skip
    admin = admin_client(**_connection(ctx, options))
    answer = ask(admin, lambda a: a.set_retention(name, **wanted), right="admin")
    _show(answer, as_json, f"stream {name!r}; retention now: "
          f"{describe_retention(answer['retention'])}")  # fmt: skip


@streams.command("delete", short_help="delete a stream (kafka-topics --delete, nats stream rm)")
@click.argument("name")
@click.option("-y", "--yes", "-f", "--force", "yes", is_flag=True,
              help="do not ask for the name again (for scripts)")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print the hub's JSON answer")
@HTTP_URL
@credential_options
@click.pass_context
def delete(ctx: click.Context, /, name: str, yes: bool, as_json: bool, **options: Any) -> None:
    """Delete the stream NAME and every event of it, at once and for good (kafka-topics
    --delete, nats stream rm): its subscribers are told 'stream deleted', and a stream made
    later under the name starts again at id 1. Asks for the name to be typed again (on
    stderr; from stdin) unless --yes; another answer deletes nothing (exit status 1)."""
    admin = admin_client(**_connection(ctx, options))
    if not yes:
        typed = click.prompt(f"This deletes stream {name!r} and all its events, for good. "
                             "Type its name to confirm", default="", show_default=False,
                             err=True)  # fmt: skip
        if typed.strip() != name:
            raise click.ClickException(f"not deleted: {typed.strip()!r} is not {name!r} "
                                       "(--yes skips the question)")  # fmt: skip
    answer = ask(admin, lambda a: a.delete_stream(name), right="admin")
    _show(answer, as_json, f"deleted stream {name!r}")
