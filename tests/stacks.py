"""A hub with every listener on 127.0.0.1 (:func:`stack`), and what tests read back from it:
``/metrics`` samples, the admin API, raw RS.io and Tolliver peers. Shared by the metrics, admin
API and log-line tests.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import aiohttp
from aiohttp import web
from multidict import CIMultiDictProxy
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tidewire.hub import Hub
from tidewire.hub.access import Access, Tokens, mint_token
from tidewire.log import LogConfig
from tidewire.protocols.rsio import (
    Decoder,
)
from tidewire.protocols.tolliver import Connection, Established, Received, Role
from tidewire.server.app import build_app, http_listener, start_http_site
from tidewire.server.guard import Admission, ConnectionLimits, Listener
from tidewire.server.rsio import RsioServer, start_rsio_server
from tidewire.server.rsio_http import HttpSettings
from tidewire.server.seguro import SeguroServer, start_seguro_server
from tidewire.server.tolliver import TolliverServer, start_tolliver_server
from tidewire.tolliver import Delivery, Instance, uuid7

HOST = "127.0.0.1"


MAX_DEMAND = 2**63 - 1


T = TypeVar("T")


ALICE, ALICE_TOML = mint_token("alice")


TOKENS = Tokens.parse(ALICE_TOML)


@dataclass
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Samples:
    """One scrape of ``/metrics``, parsed by prometheus-client's parser."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: list[Sample] = [s for f in self.families.values() for s in f.samples]

    def find(self, name: str, **labels: str) -> list[Sample]:
        """The samples named ``name`` whose labels include ``labels``."""
        return [s for s in self.samples if s.name == name
                and all(s.labels.get(k) == v for k, v in labels.items())]  # fmt: skip

    def value(self, name: str, **labels: str) -> float:
        """The one sample's value (0 when there is none: a counter not yet counted)."""
        found = self.find(name, **labels)
        assert len(found) <= 1, (name, labels, found)
        return found[0].value if found else 0.0

    def one(self, name: str, **labels: str) -> float:
        """The value of the one sample there must be."""
        found = self.find(name, **labels)
        assert len(found) == 1, (name, labels, found)
        return found[0].value


@dataclass
class Stack:
    """A hub with every listener, as ``tidewire serve`` starts them (ports 0), and an HTTP
    session to read its ``/metrics`` and admin API."""

    hub: Hub
    rsio: RsioServer
    tolliver: TolliverServer
    seguro: SeguroServer
    http: Listener
    app: web.Application
    session: aiohttp.ClientSession
    path: Path
    token: str | None = None  # sent with every admin request (an ACL's monitor principal)
    instances: list[Instance] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.http.port}"

    @property
    def rsio_url(self) -> str:
        return f"rsio://{HOST}:{self.rsio.port}"

    @property
    def tube_url(self) -> str:
        return f"ws://{HOST}:{self.http.port}/tube"

    @property
    def seguro_url(self) -> str:
        return f"seguro://{HOST}:{self.seguro.port}"

    async def get(self, path: str, token: str | None = None, *, anonymous: bool = False,
                  method: str = "GET") -> Answer:  # fmt: skip
        """``path`` with ``token`` (default: the stack's own, unless ``anonymous``)."""
        token = token if token is not None else (None if anonymous else self.token)
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with self.session.request(method, self.base + path, headers=headers) as r:
            return Answer(r.status, r.headers, await r.read())

    async def api(self, path: str) -> Any:
        answer = await self.get(path)
        assert answer.status == 200, (path, answer)
        assert answer.headers["Content-Type"].startswith("application/json"), answer.headers
        return answer.json()

    async def metrics(self) -> Samples:
        answer = await self.get("/metrics")
        assert answer.status == 200, answer
        return Samples(answer.body.decode())

    def instance(self, name: str) -> Instance:
        """A Tolliver instance with its store in the test's directory (closed at the end)."""
        made = Instance(str(self.path / f"{name}.db"))
        self.instances.append(made)
        return made

    async def connection(self, port: int) -> dict[str, Any]:
        """The admin API's entry for the connection from our local ``port``."""
        peer = f"{HOST}:{port}"
        found = await eventually(self.connections, lambda cs: any(c["peer"] == peer for c in cs),
                                 f"a connection from {peer}")  # fmt: skip
        return next(c for c in found if c["peer"] == peer)

    async def connections(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], await self.api("/api/connections"))

    async def subscriptions(self, stream: str | None = None) -> list[dict[str, Any]]:
        subs = cast(list[dict[str, Any]], await self.api("/api/subscriptions"))
        return [s for s in subs if stream is None or s["stream"] == stream]


@asynccontextmanager
async def stack(
    path: Path,
    *,
    access: Access | None = None,
    log: LogConfig | None = None,
    limits: ConnectionLimits | None = None,
    token: str | None = None,
) -> AsyncIterator[Stack]:
    """Every listener of a hub on 127.0.0.1, ports 0, sharing one admission (as ``serve``)."""
    hub = Hub.open(str(path / "hub"), log or LogConfig(fsync=False))
    admission = Admission(limits or ConnectionLimits())
    settings = HttpSettings(poll_seconds=5.0)
    app = build_app(hub, settings, access=access)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await start_http_site(runner, HOST, 0, admission=admission, tls=None, settings=settings)
    rsio = await start_rsio_server(hub, HOST, 0, access=access, admission=admission)
    tolliver = await start_tolliver_server(hub, HOST, 0, access=access, admission=admission)
    seguro_server = await start_seguro_server(hub, HOST, 0, access=access, admission=admission)
    session = aiohttp.ClientSession()
    s = Stack(hub, rsio, tolliver, seguro_server, http_listener(runner), app, session, path,
              token)  # fmt: skip
    try:
        yield s
    finally:
        for made in s.instances:
            await made.close()
        await session.close()
        await rsio.close()
        await seguro_server.close()
        await tolliver.close()
        await runner.cleanup()
        await hub.close()


async def eventually(probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str,
                     limit: float = 5.0) -> T:  # fmt: skip
    """``probe()`` again (every 5 ms, at most ``limit`` seconds) until ``ok`` of it."""
    deadline = time.monotonic() + limit
    while True:
        got = await probe()
        if ok(got):
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}; last: {got!r}"
        await asyncio.sleep(0.005)


def local_port(writer: object) -> int:
    """Our side's port of a stream writer / transport / WebSocket."""
    sockname = cast(asyncio.BaseTransport, writer).get_extra_info("sockname")
    return int(sockname[1])


async def read_rsio(reader: asyncio.StreamReader, decoder: Decoder, n: int) -> list[object]:
    """The next ``n`` RS.io messages from a raw connection."""
    out: list[object] = []
    while len(out) < n:
        message = decoder.next_message()
        if message is not None:
            out.append(message)
            continue
        data = await reader.read(65536)
        assert data, f"closed by the hub after {out}"
        decoder.feed(data)
    return out


async def take_tolliver(instance: Instance, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    async for delivery in instance.messages():
        got.append(delivery)
        if len(got) >= n:
            break
    return got


def values(prefix: str, n: int) -> list[bytes]:
    return [b"%s event %d" % (prefix.encode(), i) for i in range(n)]


RECEIVED = "tidewire_events_received_total"


RECEIVED_BYTES = "tidewire_bytes_received_total"


SENT = "tidewire_events_sent_total"


SENT_BYTES = "tidewire_bytes_sent_total"


def traffic(m: Samples, stream: str, protocol: str) -> tuple[float, float, float, float]:
    return (m.value(RECEIVED, stream=stream, protocol=protocol),
            m.value(RECEIVED_BYTES, stream=stream, protocol=protocol),
            m.value(SENT, stream=stream, protocol=protocol),
            m.value(SENT_BYTES, stream=stream, protocol=protocol))  # fmt: skip


def protocols_of(m: Samples, name: str, stream: str) -> set[str]:
    return {s.labels["protocol"] for s in m.find(name, stream=stream) if s.value}


class RawRemote:
    """A Tolliver remote through the sans-IO machine that never acks what it receives."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 channels: set[str], key: str = "") -> None:  # fmt: skip
        self.reader, self.writer = reader, writer
        self.conn = Connection(Role.CONNECTOR, uuid7(), 1, frozenset({1}),
                               {(c, key) for c in channels}, auto_ack=False)  # fmt: skip
        self.received: list[Received] = []
        self.established = False

    @classmethod
    async def open(cls, port: int, *channels: str, key: str = "") -> RawRemote:
        """Subscribed to ``channels`` (every key, or only ``key``)."""
        reader, writer = await asyncio.open_connection(HOST, port)
        remote = cls(reader, writer, set(channels), key)
        remote.conn.initiate()
        remote.flush()
        while not remote.established:
            await remote.read()
        return remote

    @property
    def uuid(self) -> uuid.UUID:
        return self.conn.instance

    def flush(self) -> None:
        if data := self.conn.data_to_send():
            self.writer.write(data)

    async def read(self) -> None:
        data = await self.reader.read(65536)
        assert data, "closed by the hub"
        self.conn.receive_data(data)
        while (event := self.conn.next_event()) is not None:
            if isinstance(event, Established):
                self.established = True
            elif isinstance(event, Received):
                self.received.append(event)
        self.flush()

    async def until_received(self, n: int) -> None:
        while len(self.received) < n:
            await self.read()

    def ack(self, *message_ids: int) -> None:
        self.conn.ack_many(message_ids)
        self.flush()
