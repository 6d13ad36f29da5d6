"""The hub's own Tolliver subscriptions (issue 20): the list every remote gets in the handshake
response and in a subscription message when it changes.

A remote's decoder takes at most 65,536 entries in a handshake, so the list is bounded
(``tolliver.max_channels``): a list over that would make every instance's handshake fail.
Changes are told to the remotes in the background, ``ANNOUNCE_SLICE`` entries for one remote
per turn of the event loop: a thousand channels times every connected remote at once would
stall the hub, and a change told late only means an instance sends the hub a channel a little
later (the next handshake carries the whole list anyway). A remote is shown only the channels
its principal may read or write (:meth:`HubList.shown`, worked out once per principal and
version of the list).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..hub.access import Access
from ..observe.throttle import LogThrottle

if TYPE_CHECKING:
    from .tolliver_link import HubLink

__all__ = ["ANNOUNCE_SLICE", "HubList"]

log = logging.getLogger("tidewire.tolliver")

ANNOUNCE_SLICE = 256  # changes of the list told to one remote per turn of the event loop


class HubList:
    """The hub's subscriptions (channel, "" for every key): :attr:`wanted`."""

    def __init__(self, most: int, links: set[HubLink], access: Access,
                 throttle: LogThrottle) -> None:  # fmt: skip
        """``most``: ``tolliver.max_channels``; ``links``: the connected remotes (the
        server's set, read when a change is told)."""
        self.most = most
        self.links = links
        self.access = access
        self.throttle = throttle
        self.wanted: set[tuple[str, str]] = set()
        self.pinned: set[str] = set()  # channels the operator wants (connect): kept
        self._version = 0  # one more each change
        self._shown: dict[str, tuple[int, frozenset[tuple[str, str]]]] = {}  # by principal
        self._announcements: deque[tuple[list[tuple[str, str]], int]] = deque()
        self._announcing: asyncio.Task[None] | None = None

    def pin(self, channels: set[str]) -> None:
        """``channels`` are listed for as long as the hub runs (the operator's choice)."""
        self.pinned |= channels
        self.add(channels)

    def add(self, channels: Iterable[str]) -> None:
        """List ``channels``, within ``most`` (a warning, rate-limited, for those left out),
        telling the connected remotes that may see them."""
        new = {(c, "") for c in channels} - self.wanted
        room = self.most - len(self.wanted)
        if len(new) > room:
            self.throttle.log(log, logging.WARNING, "tolliver: the hub follows %d channels "
                              "already (tolliver.max_channels); not %d more", len(self.wanted),
                              len(new) - room)  # fmt: skip
            new = set(sorted(new)[: max(0, room)])
        if new:
            self.wanted |= new
            self._version += 1
            self._tell(sorted(new), 0)

    def remove(self, channels: list[str]) -> None:
        """No remote follows ``channels`` any more: unlisted (unless pinned), and told."""
        gone = [(c, "") for c in channels if c not in self.pinned and (c, "") in self.wanted]
        if gone:
            self.wanted.difference_update(gone)
            self._version += 1
            self._tell(gone, 1)

    def shown(self, link: HubLink) -> set[tuple[str, str]]:
        """What ``link``'s remote may see of the list (its principal may read or write the
        channel; all without an ACL, or for a remote the hub dialed): once per principal and
        version, not once per connection (an ACL check per channel for every connection
        would let connections alone stall the hub)."""
        if self.access.open or link.dialed:
            return set(self.wanted)
        name = link.principal.name
        cached = self._shown.get(name)
        if cached is None or cached[0] != self._version:
            if len(self._shown) >= 64:
                self._shown.clear()
            cached = (self._version, frozenset(s for s in self.wanted if link.shows(s[0])))
            self._shown[name] = cached
        return set(cached[1])

    def _tell(self, subscriptions: list[tuple[str, str]], op: int) -> None:
        self._announcements.append((subscriptions, op))
        if self._announcing is None:
            self._announcing = asyncio.create_task(self._announce())

    async def _announce(self) -> None:
        try:
            while self._announcements:
                subscriptions, op = self._announcements.popleft()
                for link in list(self.links):
                    for at in range(0, len(subscriptions), ANNOUNCE_SLICE):
                        if link.refused or link.lost:
                            break
                        part = subscriptions[at : at + ANNOUNCE_SLICE]
                        link.conn.subscribe_many([s for s in part if link.shows(s[0])], op=op)
                        link.flush()
                        await asyncio.sleep(0)
        finally:
            self._announcing = None

    def close(self) -> None:
        """Stop telling (the hub is closing)."""
        if self._announcing is not None:
            self._announcing.cancel()
