"""Synchronous access to tidewire hubs for Spark's driver and executors.

Spark calls the data source from plain threads, so each call here runs the asyncio RS.io client
(:mod:`tidewire.client.rsio`) on a private event loop. Reading is pull-driven: the loop runs only
while the caller asks for the next batch, so the socket's buffers and the subscription's demand
hold the hub back when Spark is slower; nothing piles up in memory.

Several hubs: a stream lives on one hub. :func:`locate` asks every hub which of the wanted streams
it has; a stream on none goes to the hub chosen by its name's CRC-32C (so every writer picks the
same one), and a stream on two is an error.

Several gateways (the option ``gateways``: cluster mode, every URL serves every stream): a
:class:`HubSession` over all of them is the reconnecting RS.io client
(:class:`~tidewire.client.resilient.ReconnectingClient`), so a failed connection goes on at the
next gateway, round robin, bounded by :data:`FAILOVER`: a read resumes after the last id it
got, a commit offers the same transaction id again (stored once: ``tidewire.hub.txn``), and
:func:`locate_any` asks whichever gateway answers first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from types import TracebackType

from crc32c import crc32c

from ..client.backoff import Retry
from ..client.resilient import ReconnectingClient
from ..client.rsio import Receipt, RsioClient, RsioError, connect
from ..model import Batch, TidewireError
from .planning import StreamInfo

__all__ = [
    "FAILOVER",
    "GROUP_BYTES",
    "HubError",
    "HubSession",
    "home_hub",
    "ids_at",
    "list_streams",
    "locate",
    "locate_any",
]

FAILOVER = Retry(initial=0.05, maximum=1.0, attempts=12, give_up_after=30.0)
"""How a session over several gateways tries again: per outage at most 12 tries (4 rounds of
3 gateways) or 30 s, each new try at the next gateway, the waits doubling from 50 ms."""


GROUP_BYTES = 64 * 1024 * 1024
"""What :meth:`HubSession.read_groups` gathers in one list at most (bytes of batches, and one
more batch of up to the hub's record size): the bound on a read's memory beyond the socket's."""


class HubError(TidewireError, RuntimeError):
    """A hub could not be reached, or answered with an error (message says which and why)."""


def home_hub(stream: str, urls: Sequence[str]) -> str:
    """Where a stream that exists on no hub yet is created: the same hub for every writer."""
    return urls[crc32c(stream.encode()) % len(urls)]


class HubSession:
    """One RS.io connection to one hub, used synchronously (``with HubSession(url) as hub``).

    ``gateways`` (several URLs that all serve every stream): the connection is made to the
    first that answers, and a lost one is made again at the next, paced and bounded by
    :data:`FAILOVER`; reads and commits carry on there (see the module)."""

    def __init__(self, url: str, *, timeout: float = 60.0,
                 gateways: Sequence[str] = ()) -> None:  # fmt: skip
        self.url = url if not gateways else ",".join(gateways)
        self.gateways = tuple(gateways)
        self.timeout = timeout
        self.loop = asyncio.new_event_loop()
        self.client: RsioClient | ReconnectingClient | None = None

    def _run(self, coro: object, *, bounded: bool = True) -> object:
        """Run ``coro`` on the session's loop, within ``timeout`` (``bounded=False``: the
        coroutine bounds its own waits), hub errors raised as :class:`HubError`."""

        async def within() -> object:
            async with asyncio.timeout(self.timeout):
                return await coro  # type: ignore[misc]

        try:
            return self.loop.run_until_complete(within() if bounded else coro)  # type: ignore[arg-type]
        except TimeoutError:
            raise HubError(f"hub {self.url}: no answer within {self.timeout:g} s") from None
        except (OSError, RsioError, TidewireError) as exc:
            raise HubError(f"hub {self.url}: {exc}") from exc

    def open(self) -> HubSession:
        if self.client is None:
            opening = connect(self.gateways, retry=FAILOVER) if self.gateways else connect(self.url)
            self.client = self._run(opening._open())  # type: ignore[assignment]
        return self

    @property
    def current(self) -> str:
        """The gateway (or hub) the session is connected to now."""
        if isinstance(self.client, ReconnectingClient) and self.client.url is not None:
            return self.client.url
        return self.url

    def __enter__(self) -> HubSession:
        return self.open()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.client is not None:
            with suppress(Exception):
                self.loop.run_until_complete(asyncio.wait_for(self.client.close(), 10))
            self.client = None
        with suppress(Exception):
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    @property
    def _client(self) -> RsioClient | ReconnectingClient:
        self.open()
        assert self.client is not None
        return self.client

    def streams(self, names: Sequence[str] | None = None) -> list[StreamInfo]:
        rows = self._run(self._client.streams(names))
        return [
            StreamInfo(r["stream"], self.url, bool(r["exists"]), r["first_id"], int(r["latest_id"]))
            for r in rows  # type: ignore[attr-defined]
        ]

    def ids_at(self, times: dict[str, int]) -> dict[str, int | None]:
        """For each ``{stream: ms}``, the first id whose timestamp is ``>= ms`` (None: every
        event is older), from the hub's time index (the RS.io client's ``ids_at``, the hub's
        ``?times`` publisher). A client or hub without it: :class:`HubError` saying so."""

        async def ask() -> dict[str, int | None]:
            client: object = self._client
            if isinstance(client, ReconnectingClient) and not hasattr(client, "ids_at"):
                client = await client.connection()  # (a reconnecting client may not relay it)
            # getattr: the time index is newer than this reader (issue 23), and an older
            # tidewire client has no ids_at; say so rather than fail with an AttributeError.
            lookup = getattr(client, "ids_at", None)
            if lookup is None:
                raise HubError(f"hub {self.url}: this hub cannot look up times (its client has "
                               "no ids_at: a tidewire without the time index)")  # fmt: skip
            found: dict[str, int | None] = await lookup(times)
            return found

        if not times:
            return {}
        return self._run(ask())  # type: ignore[return-value]

    def read(self, stream: str, start: int, end: int, prefetch: int) -> Iterator[Batch]:
        """Batches of ids ``[start, end)`` of ``stream`` (an error if retention removed some)."""
        for group in self.read_groups(stream, start, end, prefetch, rows=1):
            yield from group

    def read_groups(self, stream: str, start: int, end: int, prefetch: int, *, rows: int,
                    max_bytes: int = GROUP_BYTES) -> Iterator[list[Batch]]:  # fmt: skip
        """Batches of ids ``[start, end)`` of ``stream``, in order, as lists gathered in one
        run of the event loop each: whole batches until the list holds at least ``rows``
        events or ``max_bytes`` bytes (or the range ends; never empty). A run of the loop per
        batch cost about a fifth of an executor's read (docs/spark.md); ``timeout`` still
        bounds each wait for the next batch. If an error ends the read, the batches gathered
        for the list being made are dropped: resume after the last batch of the last list."""
        if end <= start:
            return
        batches = self._client.subscribe_records(stream, from_id=start, until_id=end - 1,
                                                 prefetch=prefetch)  # fmt: skip

        async def gather() -> list[Batch]:
            group: list[Batch] = []
            count = size = 0
            async with asyncio.timeout(None) as deadline:
                while count < rows and size < max_bytes:
                    deadline.reschedule(self.loop.time() + self.timeout)
                    try:
                        batch = await anext(batches)
                    except StopAsyncIteration:
                        break
                    group.append(batch)
                    count += len(batch)
                    size += batch.nbytes
            return group

        try:
            while True:
                group: list[Batch] = self._run(gather(), bounded=False)  # type: ignore[assignment]
                if not group:
                    return
                yield group
        finally:
            with suppress(Exception):
                self.loop.run_until_complete(batches.aclose())

    def commit(self, stream: str, batch: Batch, txn: str) -> Receipt:
        """Publish ``batch`` to ``stream`` exactly once for ``txn``."""
        return self._run(self._client.publish(stream, batch, txn=txn))  # type: ignore[return-value]


def locate(
    urls: Sequence[str], streams: Sequence[str], *, timeout: float = 60.0
) -> dict[str, StreamInfo]:
    """Where each of ``streams`` lives and what its hub says of it (see the module docstring)."""
    found: dict[str, StreamInfo] = {}
    absent: dict[str, StreamInfo] = {}
    for url in urls:
        with HubSession(url, timeout=timeout) as hub:
            for info in hub.streams(list(streams)):
                if not info.exists:
                    absent.setdefault(info.stream, info)
                    continue
                other = found.get(info.stream)
                if other is not None:
                    raise HubError(f"stream {info.stream!r} exists on two hubs, {other.url} and "
                                   f"{url}: each stream must live on one")  # fmt: skip
                found[info.stream] = info
    for name in streams:
        if name not in found:
            home = home_hub(name, urls)
            found[name] = StreamInfo(name, home, False, None, 0)
    return found


def locate_any(urls: Sequence[str], streams: Sequence[str] | None, *,
               timeout: float = 60.0) -> dict[str, StreamInfo]:  # fmt: skip
    """What the first of the gateways ``urls`` that answers says of each of ``streams`` (every
    gateway serves every stream, so one answer is the cluster's); ``None``: of every stream
    there is."""
    with HubSession(urls[0], timeout=timeout, gateways=urls) as hub:
        return {info.stream: info for info in
                hub.streams(None if streams is None else list(streams))}  # fmt: skip


def list_streams(urls: Sequence[str], *, gateways: bool,
                 timeout: float = 60.0) -> dict[str, StreamInfo]:  # fmt: skip
    """Every stream that exists on the hubs ``urls`` (``?streams``; with ``gateways``, on the
    cluster they all serve), for ``subscribePattern``. A stream on two independent hubs is an
    error, as in :func:`locate`."""
    if gateways:
        listed = locate_any(urls, None, timeout=timeout)
        return {name: info for name, info in listed.items() if info.exists}
    found: dict[str, StreamInfo] = {}
    for url in urls:
        with HubSession(url, timeout=timeout) as hub:
            for info in hub.streams(None):
                other = found.get(info.stream)
                if other is not None:
                    raise HubError(f"stream {info.stream!r} exists on two hubs, {other.url} "
                                   f"and {url}: each stream must live on one")  # fmt: skip
                if info.exists:
                    found[info.stream] = info
    return found


def ids_at(
    info: Mapping[str, StreamInfo], times: dict[str, int], *, gateways: Sequence[str] = (),
    timeout: float = 60.0,
) -> dict[str, int | None]:
    """:meth:`HubSession.ids_at` of each stream of ``times`` at the hub ``info`` places it on
    (one session per hub), or at any of the ``gateways``."""
    if gateways:
        with HubSession(gateways[0], timeout=timeout, gateways=gateways) as hub:
            return hub.ids_at(times)
    by_hub: dict[str, dict[str, int]] = {}
    for name, ms in times.items():
        by_hub.setdefault(info[name].url, {})[name] = ms
    found: dict[str, int | None] = {}
    for url, asked in by_hub.items():
        with HubSession(url, timeout=timeout) as hub:
            found.update(hub.ids_at(asked))
    return found
