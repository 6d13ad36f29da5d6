"""The asyncio Seguro client: ``async with tidewire.client.seguro.connect(url, "~zod") as ship``.

One connection is one point's session (the handshake runs in ``connect``); flows run one at a
time, as the seed requires: ``save`` returns once the hub said COMMITTED, ``save_many`` once it
said COMMITTED MANY (``latest`` follows the LATEST notifications meanwhile), ``read`` returns
the events and the SENT summary.

With ``retry=`` (a :class:`~tidewire.client.backoff.Retry`), ``connect`` gives a
:class:`ReconnectingSeguroClient` instead: the same calls, surviving a lost connection. Seguro
makes that exactly once, because the ship chooses the ids: WELCOME says the latest id the hub
stored for the point (counting every append of an earlier session that was handed to the log),
so after reconnecting the client drops the unacknowledged events at or below it (they are
stored) and sends the others again; a read resumes after the last event it has. The hub never
stores an id twice (ids must exceed the latest), so nothing is duplicated, and nothing is
acknowledged before it is durable. Seguro has no error replies: a refusal (the ACL, a
certificate naming another point, a limit) is a dropped connection like any other, so the
client calls a drop final (:class:`SeguroRefused`) once the same step was dropped
``refused_after`` times in a row with no progress. See docs/protocols/seguro.md,
"Reconnecting clients".

TLS: ``seguros://host:port`` (or ``ssl=`` a client context with ``seguro://``). The hub's
certificate is always verified, host name included; a context with a client certificate
(mutual TLS) proves the point: its subject CN must be the point's ``@p``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as _ssl
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from itertools import pairwise
from typing import Any, TypeVar, cast, overload
from urllib.parse import urlsplit

from ..model import MAX_ID, LocalProtocolError, TidewireError
from ..protocols.seguro import (
    Breach,
    ClientSession,
    Committed,
    CommittedMany,
    Identify,
    Limits,
    ManyEvent,
    Sent,
    Welcome,
    validate_patp,
)
from .backoff import Backoff, GaveUp, Retry
from .opening import Opening
from .reconnect import Reconnector, first_reachable, gateway_urls

__all__ = [
    "REFUSED_AFTER",
    "ReconnectingSeguroClient",
    "SeguroClient",
    "SeguroConnectionLost",
    "SeguroError",
    "SeguroRefused",
    "connect",
]

REFUSED_AFTER = 6
"""Drops of the same step in a row, with no progress, after which a reconnecting client takes
them for a refusal (final): the hub dropped the point after ``POINT`` (an old session of the
point may linger briefly, so a few are retried), or a command after sending it."""

Dial = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
UrlDial = Callable[[str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
"""Dials the gateway at the URL it is given (several gateways)."""


class SeguroError(TidewireError):
    """The hub broke the protocol, or dropped the connection (Seguro has no error replies)."""


class SeguroConnectionLost(SeguroError):
    """The connection failed or the hub closed it (retriable: a reconnecting client does)."""


class SeguroRefused(SeguroError):
    """A reconnecting client's final error: the hub dropped the same step ``refused_after``
    times in a row (the ACL, a certificate for another point, one of the hub's limits, or a
    session of the point that lives on)."""


class _PointDropped(SeguroConnectionLost):
    """Dropped after ``POINT``: the point has a session already, or this peer was refused."""


class SeguroClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 point: str) -> None:  # fmt: skip
        self.reader = reader
        self.writer = writer
        self.session = ClientSession(point)
        self.welcome: Welcome | None = None

    @property
    def latest(self) -> int:
        """The highest id the hub said is committed (0 if none)."""
        return self.session.latest

    async def _next(self) -> Any:
        """The hub's next event, reading as needed (what the session has to say goes first)."""
        while True:
            self._flush()
            event = self.session.next_event()
            if event is None:
                await self._receive()
                continue
            if isinstance(event, Breach):
                raise SeguroError(f"the hub broke the protocol: {event.reason}")
            return event

    async def _receive(self) -> None:
        """Read what the hub sent into the session (the session has no whole event)."""
        try:
            data = await self.reader.read(1 << 20)
        except OSError as exc:  # (ConnectionError, ssl.SSLError)
            raise SeguroConnectionLost(f"the connection failed: {exc}") from None
        if not data:  # (what arrived whole was taken before: nothing is lost here)
            raise SeguroConnectionLost("the hub closed the connection (a breach, the point has "
                                       "a session already, or this peer was refused)")  # fmt: skip
        self.session.receive_data(data)

    async def _until(self, kinds: tuple[type, ...]) -> list[Any]:
        """Events until one of ``kinds`` (inclusive)."""
        got: list[Any] = []
        while True:
            event = await self._next()
            got.append(event)
            self._flush()
            if isinstance(event, kinds):
                return got

    def _flush(self) -> None:
        data = self.session.data_to_send()
        if data:
            self.writer.write(data)

    async def handshake(self) -> Welcome:
        (*_, welcome) = await self._until((Welcome,))
        self.welcome = welcome
        return welcome  # type: ignore[no-any-return]

    async def save(self, event_id: int, data: bytes) -> None:
        # (what _until((Committed,)) does, with one write and no generic loop: a point saving
        # one event at a time spends most of its Python here; benchmarks/README.md, round 3)
        session = self.session
        session.save(event_id, data)
        self._flush()
        while True:
            event = session.next_event()
            if event is None:
                await self._receive()
            elif type(event) is Committed:
                return
            elif isinstance(event, Breach):
                raise SeguroError(f"the hub broke the protocol: {event.reason}")

    async def save_many(self, events: Sequence[tuple[int, bytes]]) -> None:
        self.session.save_many(events)
        await self._until((CommittedMany,))

    async def read(self, start: int, limit: int) -> tuple[list[tuple[int, bytes]], Sent]:
        self.session.read(start, limit)
        got = await self._until((Sent,))
        return [(e.id, e.data) for e in got if isinstance(e, ManyEvent)], got[-1]

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()

    def abort(self) -> None:
        """Drop the connection now (a flow cut short leaves the session unusable)."""
        transport = self.writer.transport
        if not transport.is_closing():
            transport.abort()


class ReconnectingSeguroClient:
    """A point's session that survives lost connections (``connect(..., retry=Retry(...))``).

    ``save``, ``save_many`` and ``read`` are :class:`SeguroClient`'s, one flow at a time (calls
    from several tasks queue); on a lost connection they reconnect, paced by the
    :class:`~tidewire.client.backoff.Backoff`, and carry on: after WELCOME the unacknowledged
    events at or below its latest id are dropped (stored), the rest sent again; a read resumes
    after the last event received. :meth:`events` follows the point. Final, never retried:
    :class:`LocalProtocolError` (an id not above the latest, ids that do not increase, an event
    over the limits: checked before anything is sent), :class:`SeguroRefused`, a hub that breaks
    the protocol or says a latest id below what it acknowledged (:class:`SeguroError`), and
    :class:`~tidewire.client.backoff.GaveUp` once ``Retry.attempts`` or ``give_up_after`` of
    one outage ran out. Cancelling a call drops the connection (the next call reconnects);
    whether the events of a cancelled save were stored, ``latest`` then tells.

    Counters (for tests and metrics): ``connects`` (welcomed sessions), ``reconnects`` (the
    welcomed sessions after the first), ``failures`` (tries that failed), ``point_drops``
    (drops after ``POINT``), ``resent`` (events sent again), ``found_stored`` (unacknowledged
    events that LATEST or WELCOME showed were stored, so not sent again)."""

    def __init__(self, dial: Dial | UrlDial, point: str, backoff: Backoff, *,
                 where: str = "the hub", refused_after: int = REFUSED_AFTER,
                 timeout: float = 10.0, limits: Limits | None = None,
                 urls: Sequence[str] = ()) -> None:  # fmt: skip
        """``dial``: opens one connection per call: a :data:`Dial`, or with ``urls`` a
        :data:`UrlDial` given the gateway to try. ``urls``: gateways that all serve the
        point (cluster mode), tried round robin: a lost connection or a failed try goes on at
        the next one, where WELCOME's latest id tells what was stored, as after a reconnect
        to the same hub."""
        if refused_after < 1:
            raise ValueError("refused_after is at least 1")
        self.point = validate_patp(point)
        self.backoff = backoff
        self.refused_after = refused_after
        self.timeout = timeout  # for one connection and its handshake
        self.limits = limits or Limits()
        self._dial = dial
        self._what = f"seguro session of {self.point} at {where}"
        self._client: SeguroClient | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._known = 0  # the highest id any session of this client said is committed
        self.welcome: Welcome | None = None
        self.failures = 0
        self._dropped = 0  # after POINT, in a row
        self._reconnector: Reconnector[SeguroClient] = Reconnector(
            backoff, self._what, final=self._final_try,
            closed=lambda: SeguroError("the client is closed"), urls=urls,
        )  # fmt: skip
        self.point_drops = 0
        self.resent = 0
        self.found_stored = 0

    @property
    def latest(self) -> int:
        """The highest id the hub said is committed (0 if none)."""
        if self._client is not None:
            self._known = max(self._known, self._client.latest)
        return self._known

    @property
    def connected(self) -> bool:
        return self._client is not None

    @property
    def url(self) -> str | None:
        """The gateway of the current session (or of the next try while there is none);
        ``None`` when made with a :data:`Dial` and no ``urls``."""
        return self._reconnector.url

    @property
    def urls(self) -> tuple[str, ...]:
        """Every gateway this client may use, in the order they are tried."""
        return self._reconnector.urls

    @property
    def failovers(self) -> int:
        """Moves to the next gateway (failed tries and lost sessions, with several)."""
        return self._reconnector.failovers

    @property
    def connects(self) -> int:
        """Welcomed sessions."""
        return self._reconnector.connects

    @property
    def reconnects(self) -> int:
        """Welcomed sessions after the first."""
        return self._reconnector.reconnects

    # ------------------------------------------------------------------ connecting

    async def _handshake(self) -> SeguroClient:
        url = self._reconnector.url
        if url is None:
            reader, writer = await cast(Dial, self._dial)()
        else:
            reader, writer = await cast(UrlDial, self._dial)(url)
        client = SeguroClient(reader, writer, self.point)
        try:
            await client._until((Identify,))
            try:  # the hub has our POINT next: a drop now is its answer to it
                await client.handshake()
            except SeguroConnectionLost as exc:
                raise _PointDropped(str(exc)) from None
        except BaseException:
            client.abort()
            raise
        return client

    async def _connect(self) -> SeguroClient:
        """A welcomed session: tries until one is, paced by the backoff (the one reconnect
        helper, :class:`~.reconnect.Reconnector`); the outage ends on WELCOME."""
        self._dropped = 0
        try:
            client = await self._reconnector.dial(self._welcomed, try_seconds=self.timeout)
        except GaveUp:
            self._reconnector.reset()  # (the next call starts a new outage)
            raise
        self.welcome = client.welcome
        self._reconnector.reset()
        self._client = client
        return client

    async def _welcomed(self) -> SeguroClient:
        """One try: a session whose WELCOME does not contradict what the hub said before."""
        client = await self._handshake()
        latest = client.latest
        if latest < self._known:
            client.abort()
            raise SeguroError(f"{self._what}: WELCOME says {latest}, but the hub said "
                              f"{self._known} was committed: it lost events")  # fmt: skip
        return client

    def _final_try(self, exc: BaseException) -> BaseException | None:
        """A failed try: the error that ends the call, or ``None`` (counted; another try)."""
        if isinstance(exc, _PointDropped):
            self.point_drops += 1
            self._dropped += 1
            if self._dropped >= self.refused_after:
                return SeguroRefused(
                    f"{self._what}: dropped after POINT {self._dropped} times in a row (this "
                    "peer may not use the point, or a session of the point lives on)"
                )  # fmt: skip
        elif isinstance(exc, _ssl.SSLCertVerificationError):  # (an OSError: won't help)
            return exc
        elif isinstance(exc, OSError | TimeoutError | SeguroConnectionLost):
            self._dropped = 0  # (not in a row: the hub went away meanwhile)
        else:
            return exc
        self.failures += 1
        return None

    async def _session(self) -> SeguroClient:
        if self._closed:
            raise SeguroError("the client is closed")
        return self._client if self._client is not None else await self._connect()

    async def _wait(self, error: BaseException) -> None:
        """Count a failed try and wait before the next (:class:`GaveUp` ends the outage: the
        next call starts a new one)."""
        self.failures += 1
        try:
            await self._reconnector.pause(error)
        except GaveUp:
            self._reconnector.reset()
            raise

    def _lost(self, client: SeguroClient) -> None:
        self._known = max(self._known, client.latest)
        client.abort()
        if self._client is client:
            self._client = None

    # ------------------------------------------------------------------ flows

    def _check(self, events: Sequence[tuple[int, bytes]]) -> None:
        """What the hub would refuse by dropping the connection, refused here instead."""
        ids = [event_id for event_id, _ in events]
        if not ids or any(b <= a for a, b in pairwise(ids)):
            raise LocalProtocolError("event ids must increase")
        if ids[0] < 1 or ids[-1] > MAX_ID:
            raise LocalProtocolError(f"ids are 1 to 2**63-1 (tidewire's), not {ids[0]}..{ids[-1]}")
        if len(ids) > self.limits.max_many_count:
            raise LocalProtocolError(f"{len(ids)} events: over {self.limits.max_many_count}")
        biggest = max(len(data) for _, data in events)
        if biggest > self.limits.max_event_bytes:
            raise LocalProtocolError(f"an event of {biggest} bytes: over the limit of "
                                     f"{self.limits.max_event_bytes}")  # fmt: skip

    async def save(self, event_id: int, data: bytes) -> None:
        """Save one event; returns once it is durable (SAVE), across lost connections."""
        await self._save([(event_id, data)])

    async def save_many(self, events: Sequence[tuple[int, bytes]]) -> None:
        """Save ``events`` (at least 2, ids increasing); returns once all are durable (SAVE
        MANY), across lost connections (the rest goes again as SAVE MANY, or SAVE for one)."""
        if len(events) < 2:
            raise LocalProtocolError("SAVE MANY needs >= 2 increasing ids above the latest")
        await self._save(list(events))

    def _unstored(self, pending: list[tuple[int, bytes]], latest: int
                  ) -> list[tuple[int, bytes]]:  # fmt: skip
        rest = [e for e in pending if e[0] > latest]
        self.found_stored += len(pending) - len(rest)
        return rest

    async def _save(self, events: list[tuple[int, bytes]]) -> None:
        self._check(events)
        async with self._lock:
            client = await self._session()
            if events[0][0] <= client.latest:  # (not sent: the session stays usable)
                raise LocalProtocolError(f"id {events[0][0]} must exceed the latest "
                                         f"{client.latest}")  # fmt: skip
            pending, stalled = events, 0
            try:
                while pending:
                    try:
                        if len(pending) == 1:
                            await client.save(*pending[0])
                        else:
                            await client.save_many(pending)
                        break
                    except SeguroConnectionLost as exc:
                        before = len(pending)
                        pending = self._unstored(pending, client.latest)  # LATEST said so
                        self._lost(client)
                        await self._wait(exc)
                        client = await self._connect()
                        pending = self._unstored(pending, client.latest)  # WELCOME says so
                        stalled = stalled + 1 if len(pending) == before else 0
                        if stalled >= self.refused_after:
                            raise SeguroRefused(
                                f"{self._what}: the hub dropped the connection on the save of "
                                f"{pending[0][0]}.. {stalled} times in a row with nothing "
                                "stored (this peer may not write the point, one of the hub's "
                                "limits, or the hub cannot store it: a full disk)"
                            ) from exc
                        self.resent += len(pending)
            except BaseException:
                if self._client is client and client.session.state.value != "idle":
                    self._lost(client)  # a flow cut short (cancelled, or a final error)
                raise
            self._known = max(self._known, events[-1][0], client.latest)

    async def read(self, start: int, limit: int) -> tuple[list[tuple[int, bytes]], Sent]:
        """Events from ``start`` (or the first above it), at most ``limit`` (READ), across lost
        connections (a cut READ goes on after the last event received); the SENT summary is
        of all of them."""
        got: list[tuple[int, bytes]] = []
        async with self._lock:
            client = await self._session()
            stalled = 0
            try:
                while not got or len(got) < limit:
                    before = len(got)
                    try:
                        client.session.read(got[-1][0] + 1 if got else start, limit - len(got))
                        while not isinstance(event := await client._next(), Sent):
                            if isinstance(event, ManyEvent):
                                got.append((event.id, event.data))
                        break
                    except SeguroConnectionLost as exc:
                        self._lost(client)
                        stalled = stalled + 1 if len(got) == before else 0
                        if stalled >= self.refused_after:
                            raise SeguroRefused(
                                f"{self._what}: the hub dropped the connection on READ "
                                f"{stalled} times in a row (this peer may not read the point)"
                            ) from exc
                        await self._wait(exc)
                        client = await self._connect()
            except BaseException:
                if self._client is client and client.session.state.value != "idle":
                    self._lost(client)
                raise
        sent = Sent(len(got), got[0][0], got[-1][0]) if got else Sent(0, 0, 0)
        return got, sent

    async def events(self, start: int = 1, *, page: int = 256, follow: bool = False,
                     poll: float = 1.0) -> AsyncGenerator[tuple[int, bytes], None]:  # fmt: skip
        """The point's events from ``start``, in order, each once: READs of ``page`` events
        (what is held at once), each from the last event handed over + 1. ``follow``: once
        caught up, READ again every ``poll`` seconds (through the backoff's ``sleep``), for
        ever; else stop there."""
        if page < 1:
            raise ValueError("page is at least 1")
        next_id = start
        while True:
            got, _ = await self.read(next_id, page)
            for event_id, data in got:
                next_id = event_id + 1
                yield event_id, data
            if len(got) < page:
                if not follow:
                    return
                await self.backoff.sleep(poll)

    async def close(self) -> None:
        self._closed = True
        self._reconnector.close()
        if self._client is not None:
            client, self._client = self._client, None
            self._known = max(self._known, client.latest)
            await client.close()


C = TypeVar("C", SeguroClient, ReconnectingSeguroClient)


class _Connect(Opening[C]):
    def __init__(self, opener: Callable[[], Coroutine[Any, Any, C]]) -> None:
        self._opener: Callable[[], Coroutine[Any, Any, C]] = opener

    async def _open(self) -> C:
        return await self._opener()


class _Endpoint:
    def __init__(self, url: str, ssl: _ssl.SSLContext | None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("seguro", "seguros") or not parts.hostname:
            raise ValueError(f"not a seguro:// or seguros:// URL: {url!r}")
        self.host, self.port = parts.hostname, parts.port or 7403
        if ssl is None and parts.scheme == "seguros":
            ssl = _ssl.create_default_context()  # the system's CAs; verifies the host name
            ssl.minimum_version = _ssl.TLSVersion.TLSv1_2
        self.ssl = ssl

    async def dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, limit=1 << 20, ssl=self.ssl)

    async def session(self, point: str) -> SeguroClient:
        reader, writer = await self.dial()
        client = SeguroClient(reader, writer, point)
        try:
            await client.handshake()
        except BaseException:
            await client.close()
            raise
        return client


@overload
def connect(url: str | Sequence[str], point: str, *, ssl: _ssl.SSLContext | None = None,
            retry: None = None) -> _Connect[SeguroClient]: ...  # fmt: skip
@overload
def connect(url: str | Sequence[str], point: str, *, ssl: _ssl.SSLContext | None = None,
            retry: Retry, pacing: Callable[[Retry], Backoff] = Backoff,
            refused_after: int = REFUSED_AFTER,
            timeout: float = 10.0) -> _Connect[ReconnectingSeguroClient]: ...  # fmt: skip
def connect(url: str | Sequence[str], point: str, *, ssl: _ssl.SSLContext | None = None,
            retry: Retry | None = None, pacing: Callable[[Retry], Backoff] = Backoff,
            refused_after: int = REFUSED_AFTER, timeout: float = 10.0
            ) -> _Connect[SeguroClient] | _Connect[ReconnectingSeguroClient]:  # fmt: skip
    """A Seguro session for ``point`` at ``seguro://host:port`` (handshake included).

    ``ssl``: a client context (TLS; ``seguros://`` without one uses the system's CAs). The
    hub's certificate and host name are verified; for mutual TLS the context's certificate
    must name ``point`` (its subject CN).

    Several gateways (cluster mode): a list, or ``"seguro://h1:7403,seguro://h2:7403"`` /
    ``"seguro://h1:7403,h2:7403"`` (:func:`~tidewire.client.reconnect.gateway_urls`);
    without ``retry`` each is tried once, in order; with it, round robin (``ship.url``).

    ``retry``: reconnect (:class:`ReconnectingSeguroClient`), paced by ``pacing(retry)`` (a
    :class:`~tidewire.client.backoff.Backoff`; tests give one with their own sleep and clock),
    the first connection included; ``refused_after``: see :data:`REFUSED_AFTER`;
    ``timeout``: seconds for one connection and its handshake."""
    urls = gateway_urls(url)
    endpoints = {one: _Endpoint(one, ssl) for one in urls}
    if retry is None:
        return _Connect(lambda: first_reachable(urls, lambda one: endpoints[one].session(point),
                                                _final_one))  # fmt: skip
    where = ",".join(f"{e.host}:{e.port}" for e in endpoints.values())

    async def reconnecting() -> ReconnectingSeguroClient:
        ship = ReconnectingSeguroClient(lambda one: endpoints[one].dial(), point, pacing(retry),
                                        where=where, refused_after=refused_after,
                                        timeout=timeout, urls=urls)  # fmt: skip
        await ship._connect()
        return ship

    return _Connect(reconnecting)


def _final_one(exc: BaseException) -> BaseException | None:
    """Several gateways, no ``retry``: a refused connection tries the next; a certificate
    that does not verify (or a dropped POINT: a refusal) does not."""
    if isinstance(exc, OSError) and not isinstance(exc, _ssl.SSLCertVerificationError):
        return None
    return exc
