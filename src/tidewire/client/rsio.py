"""The asyncio RS.io-over-TCP client: ``async with tidewire.connect("rsio://host:7400") as hub``.

One reader task feeds the sans-IO :class:`~tidewire.protocols.rsio.Connection`; each
subscription keeps a small queue of received elements, bounded by its prefetch: the client asks
for ``prefetch`` elements, and for more only as the application consumes them, so a slow
consumer slows the hub down instead of filling memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..model import Batch, LogClosedError, TidewireError
from ..protocols.rsio import (
    Cancel,
    Connection,
    ConnectionClosed,
    Goodbye,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    Role,
    Subscribe,
)
from ..protocols.rsio.publisher import PublisherName, decode_envelope

__all__ = ["RsioClient", "RsioError", "connect"]


class RsioError(TidewireError):
    """The hub ended a subscription with onError, or the connection closed."""


@dataclass(slots=True)
class _Inbox:
    name: PublisherName
    elements: list[bytes] = field(default_factory=list)
    done: str | None = None  # "complete", or the error
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class RsioClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = Connection(Role.CLIENT)
        self.conn.initiate()
        self._inboxes: dict[int, _Inbox] = {}
        self._closed: str | None = None
        self._task = asyncio.create_task(self._read_loop())
        self._flush()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    async def _read_loop(self) -> None:
        try:
            while not self.conn.closed:
                data = await self.reader.read(256 * 1024)
                self.conn.receive_data(data)
                self._dispatch()
                self._flush()
                if not data:
                    break
        except (ConnectionError, OSError) as exc:
            self._closed = f"connection lost: {exc}"
        finally:
            self._closed = self._closed or "connection closed"
            for inbox in self._inboxes.values():
                inbox.done = inbox.done or self._closed
                inbox.wake.set()

    def _dispatch(self) -> None:
        while (event := self.conn.next_event()) is not None:
            match event:
                case OnNext(subscriber, element):
                    inbox = self._inboxes.get(subscriber)
                    if inbox is not None:
                        inbox.elements.append(element)
                        inbox.wake.set()
                case OnNextPacked(subscriber, count, elements):
                    inbox = self._inboxes.get(subscriber)
                    if inbox is not None:
                        size = len(elements) // count
                        inbox.elements.extend(
                            elements[i * size : (i + 1) * size] for i in range(count)
                        )
                        inbox.wake.set()
                case OnComplete(subscriber) | OnError(subscriber):
                    inbox = self._inboxes.get(subscriber)
                    if inbox is not None:
                        inbox.done = "complete" if isinstance(event, OnComplete) else event.error
                        inbox.wake.set()
                case ConnectionClosed(reason):
                    self._closed = reason

    def _free_id(self) -> int:
        subscriber = self.conn.free_subscriber_id()
        while subscriber in self._inboxes:
            subscriber += 1
            while not self.conn.can_subscribe(subscriber):
                subscriber += 1
        return subscriber

    async def subscribe(
        self,
        stream: str,
        *,
        from_id: int | str = "earliest",
        until_id: int | None = None,
        key: bytes | None = None,
        prefetch: int = 4096,
    ) -> AsyncIterator[Batch]:
        """Batches of ``stream`` from ``from_id`` (an id, "earliest" or "latest"), then live."""
        if self._closed:
            raise LogClosedError(self._closed)
        if not isinstance(from_id, int) and from_id not in ("earliest", "latest"):
            raise ValueError(f"from_id must be an id, 'earliest' or 'latest', not {from_id!r}")
        name = PublisherName(stream, from_id, until_id, key)  # type: ignore[arg-type]
        subscriber = self._free_id()
        inbox = self._inboxes[subscriber] = _Inbox(name)
        self.conn.send(Subscribe(str(name), subscriber, prefetch))
        self._flush()
        try:
            while True:
                if not inbox.elements:
                    if inbox.done is not None:
                        if inbox.done == "complete":
                            return
                        raise RsioError(inbox.done)
                    inbox.wake.clear()
                    await inbox.wake.wait()
                    continue
                elements, inbox.elements = inbox.elements, []
                if inbox.done is None and not self.conn.closed:
                    self.conn.send(Request(subscriber, len(elements)))  # refill the prefetch
                    self._flush()
                yield _to_batch(stream, elements)
        finally:
            if inbox.done is None and not self.conn.closed:
                self.conn.send(Cancel(subscriber))
                self._flush()
            del self._inboxes[subscriber]

    async def close(self) -> None:
        if not self.conn.closed:
            with contextlib.suppress(TidewireError):
                self.conn.send(Goodbye("client closing"))
                self._flush()
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            await asyncio.wait_for(asyncio.shield(self._task), 5)
        self._task.cancel()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()

    async def __aenter__(self) -> RsioClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _to_batch(stream: str, elements: list[bytes]) -> Batch:
    events = [decode_envelope(e) for e in elements]
    return Batch.build(
        stream,
        [v for _, _, _, v in events],
        ids=[i for i, _, _, _ in events],
        keys=[k for _, _, k, _ in events],
        timestamps=[t for _, t, _, _ in events],
    )


async def connect(url: str) -> RsioClient:
    """Open an RS.io connection to ``rsio://host:port``."""
    parts = urlsplit(url)
    if parts.scheme != "rsio" or not parts.hostname:
        raise ValueError(f"not an rsio:// URL: {url!r}")
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 7400)
    return RsioClient(reader, writer)
