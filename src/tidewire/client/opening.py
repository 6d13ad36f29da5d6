"""What every ``connect(...)`` of the clients returns: awaitable (``client = await
connect(...)``, the caller closes it) and an async context manager (``async with connect(...)
as client``, closed on the way out). A subclass says how to open one client (:meth:`_open`)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Opening"]


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


class Opening(Generic[C]):
    client: C | None = None  # the client the context manager opened

    async def _open(self) -> C:
        raise NotImplementedError

    def __await__(self) -> Generator[Any, None, C]:
        return self._open().__await__()

    async def __aenter__(self) -> C:
        self.client = await self._open()
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.close()
