"""One remote's delivery of one stream (split from :mod:`.tolliver_link`, which re-exports it):
a hub subscription read into reliable messages, and what awaits the remote's acks."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from operator import attrgetter
from typing import TYPE_CHECKING

from ..hub import Subscription
from ..model import TidewireError
from ..protocols.tolliver import UNRELIABLE, Message

if TYPE_CHECKING:
    from .tolliver_link import HubLink

__all__ = [
    "BODY",
    "CHANNEL",
    "DELIVERY_BYTES",
    "KEY",
    "MAX_UNACKED",
    "ChannelDelivery",
    "reliable_ids",
]

DELIVERY_BYTES = 256 * 1024
MAX_UNACKED = 4096  # per remote and channel: deliveries in flight

# A message's fields, for C loops over a run of messages (``map``: no Python per message)
BODY, CHANNEL, KEY = attrgetter("body"), attrgetter("channel"), attrgetter("key")


def reliable_ids(messages: list[Message]) -> list[int]:
    """The ids of the reliable ones among ``messages``, in order (all of them: C loops)."""
    ids = list(map(attrgetter("id"), messages))
    return ids if UNRELIABLE not in ids else [i for i in ids if i != UNRELIABLE]


class ChannelDelivery:
    """One remote's delivery of one stream: a hub subscription and what awaits acks."""

    def __init__(self, link: HubLink, channel: str, start: int,
                 kept: asyncio.Future[None] | None = None) -> None:  # fmt: skip
        """``kept``: delivery waits for it (the remote's first offset on its way to disk)."""
        self.link = link
        self.kept = kept
        self.channel = channel
        self.sub: Subscription = link.server.hub.subscribe(
            channel,
            start,
            max_batch_bytes=DELIVERY_BYTES,
            skip_lost=True,
            via="tolliver",
            connection=link.log.context.conn,
            counted=False,  # (deliver() counts what it sends)
        )
        self.sub.request(MAX_UNACKED)
        self.inflight: OrderedDict[int, int] = OrderedDict()  # tolliver id -> event id, in order
        self.acked_to = start - 1
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        link = self.link
        try:
            if self.kept is not None:
                await self.kept
            while True:
                await link.writable.wait()  # a remote that does not read gets nothing more
                await link.room.wait()  # nor one whose unacked deliveries fill its share
                await link.server.ids_ready.wait()  # (ids for one delivery: <= MAX_UNACKED)
                if (batches := await self.sub.next()) is None:
                    break
                await link.settled(self.channel)  # (so that its own messages are known)
                # (read while another channel filled the room: it waits, one delivery per
                # channel at most, until acks free room)
                await link.room.wait()
                link.deliver(self, batches)
                link.flush()  # once per delivery, not per message
        except asyncio.CancelledError:
            raise
        except TidewireError as exc:
            link.log.warning("delivering %r stopped: %s", self.channel, exc)

    def acked(self, message_ids: list[int]) -> int | None:
        """Record acks (of this channel's deliveries); the new offset (next event id to
        deliver) if it moved."""
        if not message_ids:
            return None
        last = list(map(self.inflight.pop, message_ids))[-1]  # (C loops: one pop each)
        inflight = self.inflight
        self.sub.request(len(message_ids))
        low = next(iter(inflight.values()), last + 1)  # (in event order)
        if low - 1 > self.acked_to:
            self.acked_to = low - 1
            return low
        return None

    def stop(self) -> None:
        self.sub.cancel()
        self.task.cancel()
