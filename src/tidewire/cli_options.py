"""What the ``tidewire`` commands share: their options (credentials, URLs, progress), the
clients they build from them (the admin API's, TLS contexts), and how they print an event.

Kept apart from the commands so that each group of commands (``cli.py``, ``cli_rsio.py``,
``cli_seguro.py``) imports only these, never another group's module.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .config import ConfigError, load_config
from .log import Log
from .model import Event, LogError

if TYPE_CHECKING:
    from .client.admin import AdminClient, AdminError

__all__ = [
    "DATA_DIR_HELP",
    "HTTP_URL",
    "PROGRESS",
    "RSIO_URL",
    "SEGURO_URL",
    "admin_client",
    "admin_message",
    "ask",
    "b64",
    "client_options",
    "configure_logging",
    "credential_options",
    "gateways",
    "open_read_only",
    "print_event",
    "resolve_data_dir",
    "seguro_tls",
    "text",
]

T = TypeVar("T")

DATA_DIR_HELP = "data directory (default: $TIDEWIRE_DATA_DIR or ./tidewire-data)"


def configure_logging(level: str, log_format: str = "text") -> None:
    from .observe.logs import setup_logging

    setup_logging(level, log_format)


def resolve_data_dir(option: str | None) -> str:
    if option:
        return option
    try:
        return load_config(None).data_dir
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def open_read_only(data_dir: str) -> Log:
    if not os.path.isdir(data_dir):
        raise click.ClickException(f"no data directory at {data_dir}")
    try:
        return Log.open(data_dir, read_only=True)
    except (LogError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


def credential_options(f: Any) -> Any:
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


def gateways(url: str) -> tuple[str, ...]:
    """``--url`` as the clients take it: one URL, or several gateways, comma-separated
    (``rsio://h1:7400,rsio://h2:7400`` or ``rsio://h1:7400,h2:7400``: an entry without a
    scheme takes the first one's); a malformed list is the option's error."""
    from .client.reconnect import gateway_urls

    try:
        return gateway_urls(url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--url") from None


def client_options(url: str, token: str | None, ca_file: str | None, cert_file: str | None,
                    key_file: str | None) -> dict[str, Any]:  # fmt: skip
    """``connect()`` keywords: the token, and a TLS context for rsios:// (any of the gateways
    of a comma-separated ``url``) or any TLS file."""
    from .server.guard import client_context

    secure = any(u.startswith(("rsios:", "seguros:")) for u in gateways(url))
    tls = secure or ca_file is not None or cert_file is not None
    return {"token": token, "ssl": client_context(ca_file, cert_file, key_file) if tls else None}


def seguro_tls(url: str, token: str | None, **files: str | None) -> Any:
    """Seguro has no tokens (a ship is its certificate): only the TLS files count."""
    if token is not None:
        raise click.BadParameter("Seguro takes no token: use --cert-file", param_hint="--token")
    return client_options(url, None, **files)["ssl"]


# --------------------------------------------------------------------------- the admin API

HTTP_URL = click.option("--url", default="http://127.0.0.1:7480", show_default=True,
                         envvar="TIDEWIRE_HTTP_URL",
                         help="the hub's HTTP endpoint ($TIDEWIRE_HTTP_URL)")  # fmt: skip


def admin_client(url: str, token: str | None, ca_file: str | None, cert_file: str | None,
           key_file: str | None) -> AdminClient:  # fmt: skip
    """The admin API's client: TLS for https:// or when a TLS file is given (http:// then
    becomes https://, as rsio:// becomes rsios:// for ``client_options``)."""
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


def admin_message(exc: AdminError, right: str = "monitor") -> str:
    """The error, with what to do about it; ``right`` is what the request needs of the ACL:
    ``monitor`` (the readings) or ``admin`` (the writes: there a 404 is the hub's "no such
    stream", which needs no hint)."""
    hint = {
        0: "is the hub running? --url or $TIDEWIRE_HTTP_URL names it",
        401: "give a token with --token or $TIDEWIRE_TOKEN",
        403: "the ACL must grant this principal monitor = true" if right == "monitor" else
             "the ACL must grant this principal admin on the stream, e.g. admin = "
             '["orders*"]; docs/security.md',
        404: "does this hub serve the admin API (/api)?" if right == "monitor" else None,
    }.get(exc.status)
    if exc.tls:
        hint = "--ca-file names the CA that signed the hub's certificate"
    return f"{exc} ({hint})" if hint else str(exc)


def ask(admin: AdminClient, call: Callable[[AdminClient], Awaitable[T]],
        right: str = "monitor") -> T:  # fmt: skip
    """Run ``call(admin)`` in a fresh event loop; an :class:`AdminError` is the command's
    (one line, exit status 1, with :func:`admin_message`'s hint for ``right``)."""
    import asyncio

    from .client.admin import AdminError

    async def run() -> T:
        async with admin:
            return await call(admin)

    try:
        return asyncio.run(run())
    except AdminError as exc:
        raise click.ClickException(admin_message(exc, right)) from None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def text(data: bytes | None) -> str:
    if data is None:
        return "-"
    return repr(data)[2:-1]  # printable ASCII as is, everything else escaped


PROGRESS = click.option("--progress/--no-progress", default=None,
                         help="progress bars on stderr (default: when stderr is a terminal)")


SEGURO_URL = click.option("--url", default="seguro://127.0.0.1:7403", show_default=True,
                           envvar="TIDEWIRE_SEGURO_URL",
                           help="the hub's Seguro endpoint, or several gateways, "
                                "comma-separated: the first that answers "
                                "($TIDEWIRE_SEGURO_URL)")  # fmt: skip

RSIO_URL = click.option("--url", default="rsio://127.0.0.1:7400", show_default=True,
                         envvar="TIDEWIRE_URL",
                         help="the hub's RS.io endpoint, or several gateways, comma-separated "
                              "(the first that answers is used; $TIDEWIRE_URL)")  # fmt: skip


def print_event(event: Event, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({
            "id": event.id,
            "timestamp": event.timestamp,
            "key": None if event.key is None else b64(event.key),
            "value": b64(event.value),
        }))  # fmt: skip
    else:
        click.echo(f"{event.id}\t{event.timestamp}\t{text(event.key)}\t{text(event.value)}")
