"""The in-process hub the Tube security tests use (``from tube_hub import ...``): the hub's
aiohttp app on a guarded site as ``tidewire serve`` starts it, with tokens and an ACL. (A copy
of what ``tests/server/test_security_http.py`` has, so that this folder stands alone.)"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from tidewire.hub import Hub
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.log import LogConfig
from tidewire.server.app import build_app, start_http_site
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.rsio_http import HttpSettings
from tidewire.server.tube import TubeSettings

__all__ = ["ALICE", "BOB", "OLD", "Served", "bearer", "policy", "secure_hub"]

HOST = "127.0.0.1"

ALICE, ALICE_TOML = mint_token("alice")
BOB, BOB_TOML = mint_token("bob")
OLD, OLD_TOML = mint_token("old", days=-1)  # expired yesterday
TOKENS = Tokens.parse(ALICE_TOML + BOB_TOML + OLD_TOML)
ACL = Acl.parse("""
[principal."token:alice"]
read = ["orders", "public.*"]
write = ["orders"]

[principal."token:bob"]
read = ["public.*"]

[principal."token:old"]
read = ["*"]

[principal."cert:carol"]
read = ["orders"]
write = ["orders"]
""")


def policy() -> Access:
    return Access(ACL, TOKENS)


def bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


@dataclass
class Served:
    hub: Hub
    app: web.Application
    admission: Admission
    base: str


@asynccontextmanager
async def secure_hub(
    path: Path,
    *,
    tls: ssl.SSLContext | None = None,
    access: Access | None = None,
    limits: ConnectionLimits | None = None,
    tube: TubeSettings | None = None,
) -> AsyncIterator[Served]:
    """The hub's app on a guarded site on 127.0.0.1, as ``tidewire serve`` starts it."""
    hub = Hub.open(str(path / "hub"), LogConfig(fsync=False))
    settings = HttpSettings(poll_seconds=5.0)
    app = build_app(hub, settings, tube, access=access)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    admission = Admission(limits or ConnectionLimits())
    port = await start_http_site(runner, HOST, 0, admission=admission, tls=tls,
                                 settings=settings)  # fmt: skip
    base = f"{'https' if tls is not None else 'http'}://{HOST}:{port}"
    try:
        yield Served(hub, app, admission, base)
    finally:
        await runner.cleanup()
        await hub.close()
