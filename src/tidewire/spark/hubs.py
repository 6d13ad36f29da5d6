"""Synchronous access to tidewire hubs for Spark's driver and executors.

Spark calls the data source from plain threads, so each call here runs the asyncio RS.io client
(:mod:`tidewire.client.rsio`) on a private event loop. Reading is pull-driven: the loop runs only
while the caller asks for the next batch, so the socket's buffers and the subscription's demand
hold the hub back when Spark is slower; nothing piles up in memory.

Several hubs: a stream lives on one hub. :func:`locate` asks every hub which of the wanted streams
it has; a stream on none goes to the hub chosen by its name's CRC-32C (so every writer picks the
same one), and a stream on two is an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import suppress
from types import TracebackType

from crc32c import crc32c

from ..client.rsio import Receipt, RsioClient, RsioError, connect
from ..model import Batch, TidewireError
from .planning import StreamInfo

__all__ = ["HubError", "HubSession", "home_hub", "locate"]


class HubError(TidewireError, RuntimeError):
    """A hub could not be reached, or answered with an error (message says which and why)."""


def home_hub(stream: str, urls: Sequence[str]) -> str:
    """Where a stream that exists on no hub yet is created: the same hub for every writer."""
    return urls[crc32c(stream.encode()) % len(urls)]


class HubSession:
    """One RS.io connection to one hub, used synchronously (``with HubSession(url) as hub``)."""

    def __init__(self, url: str, *, timeout: float = 60.0) -> None:
        self.url = url
        self.timeout = timeout
        self.loop = asyncio.new_event_loop()
        self.client: RsioClient | None = None

    def _run(self, coro: object) -> object:
        async def bounded() -> object:
            async with asyncio.timeout(self.timeout):
                return await coro  # type: ignore[misc]

        try:
            return self.loop.run_until_complete(bounded())
        except TimeoutError:
            raise HubError(f"hub {self.url}: no answer within {self.timeout:g} s") from None
        except (OSError, RsioError, TidewireError) as exc:
            raise HubError(f"hub {self.url}: {exc}") from exc

    def open(self) -> HubSession:
        if self.client is None:
            self.client = self._run(connect(self.url)._open())  # type: ignore[assignment]
        return self

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
    def _client(self) -> RsioClient:
        self.open()
        assert self.client is not None
        return self.client

    def streams(self, names: Sequence[str] | None = None) -> list[StreamInfo]:
        rows = self._run(self._client.streams(names))
        return [
            StreamInfo(r["stream"], self.url, bool(r["exists"]), r["first_id"], int(r["latest_id"]))
            for r in rows  # type: ignore[attr-defined]
        ]

    def read(self, stream: str, start: int, end: int, prefetch: int) -> Iterator[Batch]:
        """Batches of ids ``[start, end)`` of ``stream`` (an error if retention removed some)."""
        if end <= start:
            return
        batches = self._client.subscribe_records(stream, from_id=start, until_id=end - 1,
                                                 prefetch=prefetch)  # fmt: skip
        try:
            while True:
                try:
                    batch = self._run(anext(batches))
                except StopAsyncIteration:
                    return
                yield batch  # type: ignore[misc]
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
