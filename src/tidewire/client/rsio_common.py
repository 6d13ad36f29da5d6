"""What the RS.io client's modules share: its errors, what a publish returns, value-only
elements, and the byte streams it reads and writes (TCP, or Tube)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Protocol

from ..model import Batch, TidewireError
from ..protocols.rsio.envelopes import envelopes_to_batch
from ..record import decode_body, parse_header

__all__ = [
    "ByteReader",
    "ByteWriter",
    "ConnectionLost",
    "Receipt",
    "RsioError",
    "Values",
    "envelopes_batch",
    "record_to_batch",
]


class RsioError(TidewireError):
    """The hub ended a subscription or an offer with an error, or the connection closed."""


class ConnectionLost(RsioError):
    """The connection closed (EOF, a reset, the hub's ``goodbye``) before the subscription or
    the offer ended: nothing the hub said about it, so a new connection may resume it."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a publish made durable: ``count`` events stored as ids ``first_id``..``last_id``."""

    count: int
    first_id: int
    last_id: int


@dataclass(frozen=True, slots=True)
class Values:
    """Value-only elements (``format=value`` or fixed-size ``size=N``).

    With ``size > 0`` the values are packed back to back in ``data`` (``len(self) * size``
    bytes, no per-value objects); else ``items`` holds them.
    """

    stream: str
    size: int
    data: bytes = b""
    items: tuple[bytes, ...] = ()

    def __len__(self) -> int:
        return len(self.data) // self.size if self.size else len(self.items)

    def __getitem__(self, i: int) -> bytes:
        if not self.size:
            return self.items[i]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return self.data[i * self.size : (i + 1) * self.size]

    def __iter__(self) -> Generator[bytes, None, None]:
        for i in range(len(self)):
            yield self[i]


class ByteReader(Protocol):
    """Where the client reads the hub's bytes: an ``asyncio.StreamReader`` over TCP, or the
    messages of a Tube connection (``tidewire.client.tube``); ``b""`` at the end."""

    async def read(self, n: int = -1) -> bytes: ...


class ByteWriter(Protocol):
    """Where the client writes: an ``asyncio.StreamWriter``, or a Tube connection."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


def record_to_batch(stream: str, element: bytes) -> Batch:
    """One ``format=records`` element (a whole log record, CRC-32C checked) as a batch;
    :class:`RsioError` if it is not one."""
    view = memoryview(element)
    try:
        header = parse_header(view, 0)
        if header.length != len(view):
            raise ValueError(f"a {header.length}-byte record in a {len(view)}-byte element")
        return decode_body(stream, header, view, 0)
    except ValueError as exc:
        raise RsioError(f"the hub sent a bad record on {stream!r}: {exc}") from None


def envelopes_batch(stream: str, elements: list[bytes]) -> Batch:
    """Envelope-format elements as one batch; :class:`RsioError` if one is malformed."""
    try:
        return envelopes_to_batch(stream, elements)
    except (ValueError, TidewireError) as exc:
        raise RsioError(f"the hub sent a malformed envelope on {stream!r}: {exc}") from None
