"""The records of the hub's Tolliver instance (``_tidewire.tolliver``), written in groups.

A remote that subscribes to a thousand channels makes a thousand offset records (and as many
drops when it moves on): one append each would queue a thousand appends in front of every
other writer of the log, and stall them. Here every record queued in one turn of the event loop,
and while the previous group is being written, goes into one append, in the order queued (the
ledger's order is what :meth:`~.tolliver_offsets.RemoteOffsets.load` replays).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..hub.ledger import Ledger

__all__ = ["GroupedRecords"]

MAX_GROUP = 512  # records in one append at most (then the loop has a turn)


class GroupedRecords:
    """Records for ``ledger``, appended in groups (see the module)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._queued: list[dict[str, Any]] = []
        self._done: asyncio.Future[None] | None = None  # the queued group's
        self._writer: asyncio.Task[None] | None = None

    def add(self, record: dict[str, Any]) -> asyncio.Future[None]:
        """Queue ``record``; a future done once it is durable (its exception: the log's
        refusal, a full disk say, for the whole group)."""
        self._queued.append(record)
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
            self._done.add_done_callback(_retrieved)
        if self._writer is None:
            self._writer = asyncio.create_task(self._write())
        return self._done

    async def _write(self) -> None:
        try:
            await asyncio.sleep(0)  # (what the rest of this turn queues comes along)
            while self._queued:
                records, self._queued = self._queued, []
                done, self._done = self._done, None
                assert done is not None
                try:
                    for at in range(0, len(records), MAX_GROUP):
                        await self.ledger.record_many(records[at : at + MAX_GROUP])
                        await asyncio.sleep(0)
                except Exception as exc:  # (every waiter gets the log's error)
                    done.set_exception(exc)
                else:
                    done.set_result(None)
        finally:
            self._writer = None

    async def wait(self) -> None:
        """Until everything queued is written (or refused)."""
        while self._writer is not None:
            await asyncio.shield(self._writer)


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # (a group nobody awaits: its error is logged by who queued it)
