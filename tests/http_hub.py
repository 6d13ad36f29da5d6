"""The hub's aiohttp app on a guarded site, in this process, for the HTTP security tests
(tests/security/test_http.py, and the Tube tests that share its credentials): the tokens and
ACL they use, :func:`secure_hub`, and raw-socket helpers (one response, EOF, a keep-alive
``/healthz``, the guard's phase of a connection)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from helpers import until
from tidewire.hub import Budget, BudgetLimits, Hub
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.log import LogConfig
from tidewire.model import Batch
from tidewire.protocols.rsio_http import ERROR_HEADER
from tidewire.server.app import build_app, http_listener, start_http_site
from tidewire.server.guard import Admission, ConnectionLimits, GuardedConnection, Listener
from tidewire.server.rsio_http import HttpSettings
from tidewire.server.tube import TubeSettings

HOST = "127.0.0.1"
KiB = 1024
MiB = 1024 * KiB


# --------------------------------------------------------------------------- credentials

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


# --------------------------------------------------------------------------- the hub


@dataclass
class Answer:
    status: int
    headers: CIMultiDictProxy[str] | CIMultiDict[str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass
class Served:
    hub: Hub
    app: web.Application
    listener: Listener
    admission: Admission
    base: str
    session: aiohttp.ClientSession
    ssl: ssl.SSLContext | bool

    @property
    def port(self) -> int:
        return self.listener.port

    async def put(self, path: str, token: str | None = None, *, data: bytes | None = None,
                  method: str = "PUT",
                  headers: dict[str, str] | None = None) -> Answer:  # fmt: skip
        target = URL(path if path.startswith("http") else self.base + path, encoded=True)
        headers = {**bearer(token), **(headers or {})}
        request = self.session.request(method, target, data=data, ssl=self.ssl, headers=headers)
        async with request as r:
            return Answer(r.status, r.headers, await r.read())

    async def get(self, path: str, token: str | None = None,
                  headers: dict[str, str] | None = None) -> Answer:  # fmt: skip
        return await self.put(path, token, method="GET", headers=headers)

    def connections(self) -> list[GuardedConnection]:
        return list(self.listener.connections)


@asynccontextmanager
async def secure_hub(
    path: Path,
    *,
    tls: ssl.SSLContext | None = None,
    client_tls: ssl.SSLContext | None = None,
    access: Access | None = None,
    limits: ConnectionLimits | None = None,
    settings: HttpSettings | None = None,
    tube: TubeSettings | None = None,
    budget: BudgetLimits | None = None,
) -> AsyncIterator[Served]:
    """The hub's app on a guarded site, as ``tidewire serve`` starts it (``budget``: the
    ``memory.*`` settings)."""
    hub = Hub.open(str(path / "hub"), LogConfig(fsync=False))
    if budget is not None:
        hub.budget = Budget(budget)
    settings = settings or HttpSettings(poll_seconds=5.0)
    app = build_app(hub, settings, tube, access=access)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    admission = Admission(limits or ConnectionLimits())
    port = await start_http_site(runner, HOST, 0, admission=admission, tls=tls,
                                 settings=settings)  # fmt: skip
    base = f"{'https' if tls is not None else 'http'}://{HOST}:{port}"
    session = aiohttp.ClientSession(auto_decompress=False)
    served = Served(hub, app, http_listener(runner), admission, base, session,
                    client_tls if client_tls is not None else True)  # fmt: skip
    try:
        yield served
    finally:
        await session.close()
        await runner.cleanup()
        await hub.close()


async def append(hub: Hub, stream: str, values: list[bytes]) -> Batch:
    return await hub.append(Batch.build(stream, values), assign_ids=True)


def server_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What aiohttp's server logged as errors (an exception it did not expect)."""
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("aiohttp") and r.levelno >= logging.ERROR]  # fmt: skip


def refused(answer: Answer, status: int) -> None:
    """An onError refusal: ``status``, ``X-Rsio-Error: true``, one text/plain line."""
    assert answer.status == status, answer
    assert answer.headers.get(ERROR_HEADER) == "true", answer
    assert answer.headers["Content-Type"] == "text/plain; charset=utf-8", answer
    assert answer.text.strip(), answer
    assert answer.text.count("\n") == 1, answer


# --------------------------------------------------------------------------- raw HTTP


async def raw(served: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(HOST, served.port)


async def response(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 response with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers.add(name.strip(), value.strip())
    body = await reader.readexactly(int(headers.get("Content-Length", "0")))
    return Answer(int(status_line.split()[1]), headers, body)


async def eof(reader: asyncio.StreamReader) -> bool:
    """True once the hub has closed the connection (nothing more comes)."""
    try:
        return await reader.read(1) == b""
    except ConnectionError:
        return True


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: hub\r\n\r\n"


async def healthy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One keep-alive request on a raw connection, answered 200."""
    writer.write(HEALTHZ)
    answer = await response(reader)
    assert (answer.status, answer.body) == (200, b"ok\n"), answer


def phase_of(conn: GuardedConnection) -> str:
    return str(getattr(getattr(conn.inner, "phase", None), "value", "?"))


async def one_in(served: Served, phase: str) -> GuardedConnection:
    """The (one) server-side connection in ``phase`` ("headers", "body"), once there is one."""
    found: list[GuardedConnection] = []

    def there() -> bool:
        found[:] = [c for c in served.connections() if phase_of(c) == phase]
        return len(found) == 1

    await until(there, f"one connection in phase {phase}")
    return found[0]
