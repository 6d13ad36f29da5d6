"""The blocking Seguro client: :func:`connect` gives a :class:`SyncSeguro`, one point's
session, whose flows run the asyncio client's on ``tidewire.sync``'s loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Sequence
from functools import partial
from typing import Any, TypeVar

from ..client.seguro import ReconnectingSeguroClient, SeguroClient
from ..client.seguro import connect as seguro_async_connect
from ..protocols.seguro import Sent
from .hub import SyncSubscription
from .runner import RUNNER, Bound, opened

__all__ = ["SyncSeguro", "connect"]

T = TypeVar("T")


class SyncSeguro(Bound):
    """A blocking Seguro session of one point: what :func:`connect`
    (``tidewire.sync.seguro_connect``) returns. ``save``, ``save_many`` and ``read`` are the
    asyncio client's
    (:class:`~tidewire.client.seguro.SeguroClient`, or with ``retry=``
    :class:`~tidewire.client.seguro.ReconnectingSeguroClient`), one flow at a time as the seed
    requires (calls from several threads queue), with ``timeout=`` as :class:`SyncHub`'s. A
    timeout cuts a flow short: without ``retry`` the session is then unusable, as the asyncio
    client's is; with it the next call reconnects and ``latest`` tells what was stored."""

    _client: SeguroClient | ReconnectingSeguroClient

    def __init__(self, client: SeguroClient | ReconnectingSeguroClient, point: str,
                 loop: asyncio.AbstractEventLoop, timeout: float | None) -> None:  # fmt: skip
        super().__init__(client, loop, timeout)
        self.point = point
        self._flow = asyncio.Lock()  # (binds to the loop at its first use, there)

    @property
    def client(self) -> SeguroClient | ReconnectingSeguroClient:
        """The asyncio client underneath (for coroutines given to :func:`run`)."""
        return self._client

    @property
    def latest(self) -> int:
        """The highest id the hub said is committed for the point (0 if none)."""
        return self.call(_latest(self._client), None)

    async def _one_flow(self, flow: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``flow()`` once the flows before it ended (made here, on the loop: a call refused
        before it runs leaves no coroutine behind unawaited)."""
        async with self._flow:
            return await flow()

    def save(self, event_id: int, data: bytes, *, timeout: float | None = None) -> None:
        """Save one event; returns once the hub said it is durable (SAVE)."""
        self.call(self._one_flow(lambda: self._client.save(event_id, data)), timeout)

    def save_many(self, events: Sequence[tuple[int, bytes]], *,
                  timeout: float | None = None) -> None:  # fmt: skip
        """Save ``events`` (``(id, data)``, at least 2, ids increasing above the latest);
        returns once the hub said all are durable (SAVE MANY)."""
        self.call(self._one_flow(lambda: self._client.save_many(events)), timeout)

    def read(self, start: int, limit: int, *, timeout: float | None = None
             ) -> tuple[list[tuple[int, bytes]], Sent]:  # fmt: skip
        """Events ``(id, data)`` from ``start`` (or the first above it), at most ``limit``,
        and the hub's SENT summary (READ)."""
        return self.call(self._one_flow(lambda: self._client.read(start, limit)), timeout)

    def pages(self, start: int = 1, *, page: int = 256, follow: bool = False,
              poll: float = 1.0, timeout: float | None = None
              ) -> SyncSubscription[list[tuple[int, bytes]]]:  # fmt: skip
        """The point's events from ``start`` in order, each once, as lists of at most ``page``
        ``(id, data)``: one READ each, from the last id handed over + 1 (the asyncio
        :meth:`ReconnectingSeguroClient.events
        <tidewire.client.seguro.ReconnectingSeguroClient.events>`' rule, here for either
        client). Saves of this session run between two READs (one flow at a time). Caught
        up: the iterator ends, or with ``follow`` READs again every ``poll`` seconds for
        ever. ``timeout``: the most one ``next()`` waits (a timeout ends it)."""
        if page < 1:
            raise ValueError("page is at least 1")
        return SyncSubscription(self, self._pages(start, page, follow, poll), timeout)

    def events(self, start: int = 1, *, page: int = 256, follow: bool = False,
               poll: float = 1.0, timeout: float | None = None
               ) -> Generator[tuple[int, bytes], None, None]:  # fmt: skip
        """:meth:`pages`, one ``(id, data)`` at a time (fetched a page at a time: one hop
        to the loop per page, not per event); leaving the loop early ends the READs."""
        with self.pages(start, page=page, follow=follow, poll=poll, timeout=timeout) as got:
            for events in got:
                yield from events

    async def _pages(self, start: int, page: int, follow: bool,
                     poll: float) -> AsyncGenerator[list[tuple[int, bytes]], None]:  # fmt: skip
        next_id = start
        while True:
            got, _ = await self._one_flow(partial(self._client.read, next_id, page))
            if got:
                next_id = got[-1][0] + 1
                yield got
            if len(got) < page:
                if not follow:
                    return
                await asyncio.sleep(poll)

    def __enter__(self) -> SyncSeguro:
        return self


async def _latest(client: SeguroClient | ReconnectingSeguroClient) -> int:
    return client.latest


def connect(url: str | Sequence[str], point: str, *, timeout: float | None = None,
                   **options: Any) -> SyncSeguro:  # fmt: skip
    """A blocking Seguro session for ``point`` at ``seguro://host:port`` (handshake done):
    ``with tidewire.sync.seguro_connect("seguro://127.0.0.1:7403", "~zod") as ship``.
    ``options``: :func:`tidewire.client.seguro.connect`'s (``ssl``, ``retry``, ...);
    ``timeout``: as :func:`connect`'s."""
    opening = seguro_async_connect(url, point, **options)
    loop = RUNNER.loop()
    client: SeguroClient | ReconnectingSeguroClient = RUNNER.call(opened(opening), timeout,
                                                                   loop)  # fmt: skip
    return SyncSeguro(client, point, loop, timeout)
