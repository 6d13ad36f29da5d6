"""A stand-alone :class:`~.instance.Instance`'s side of one connection: the shared
:class:`~.link.Link` plus what an instance does with the machine's events (deliver to the
application's inbox, record acks, adopt the remote, fail the handshake future).

The instance's own state (links by peer, the store, the inbox) stays in :class:`Instance`; this
class only routes events to it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING

from ..protocols.tolliver import (
    Acked,
    Closed,
    Connection,
    Established,
    Message,
    PeerSubscriptions,
    Received,
    Role,
)
from .link import HandshakeFailed, Link

if TYPE_CHECKING:
    from .instance import Instance

__all__ = ["VERSION", "InstanceLink", "ack_on_links"]

log = logging.getLogger("tidewire.tolliver")

VERSION = 1


def ack_on_links(acks: list[tuple[InstanceLink, int]]) -> None:
    """Ack on their connections (one write per connection; none on a connection gone)."""
    by_link: dict[InstanceLink, list[int]] = {}
    for link, message_id in acks:
        by_link.setdefault(link, []).append(message_id)
    for link, message_ids in by_link.items():
        if link.conn.established:
            link.conn.ack_many(message_ids)
            link.soon()


class InstanceLink(Link):
    """One connection of an :class:`Instance` to a remote (either role). :attr:`ready` is the
    remote's UUID once the handshake completed (or why it did not); :attr:`gone` resolves with
    ``connection_lost``'s exception."""

    def __init__(self, instance: Instance, role: Role) -> None:
        conn = Connection(role, instance.store.instance, VERSION, frozenset({VERSION}),
                          set(instance.subscriptions), resend_interval=instance.resend_interval,
                          resend_backoff=instance.resend_backoff,
                          resend_max_interval=instance.resend_max_interval,
                          auto_ack=False)  # acked once handled (Instance._deliver)  # fmt: skip
        super().__init__(conn, instance.clock)
        self.instance = instance
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[uuid.UUID] = loop.create_future()
        self.gone: asyncio.Future[Exception | None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.instance._handshakes += 1
        self.instance._sendable.clear()  # sends wait for the handshake (the seed)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._fail(ConnectionError(f"connection lost before the handshake completed: {exc}"))
        self.instance._forget(self)
        if not self.gone.done():
            self.gone.set_result(exc)

    def _fail(self, exc: Exception) -> None:
        """The handshake did not complete (once)."""
        if self.ready.done():
            return
        self.ready.set_exception(exc)
        if self.conn.role is Role.ACCEPTOR:
            self.ready.exception()  # (nobody awaits an accepted connection's handshake)
        self.instance._handshake_done()

    def handle_events(self) -> None:
        instance, conn = self.instance, self.conn
        received: list[Message] = []
        acked: list[int] = []
        while True:
            if conn.receive_run(received, acked):  # (the hot paths first, in runs)
                if received:
                    instance._deliver_many(self, received)
                if acked and conn.peer is not None:
                    instance.acked_many(acked, conn.peer)
                received.clear()
                acked.clear()
            event = conn.next_event()
            if event is None:
                break
            if isinstance(event, Received):
                instance._deliver(self, event.message)
                continue
            if isinstance(event, Acked):
                if self.conn.peer is not None:
                    instance.acked(event.id, self.conn.peer)
                continue
            match event:
                case Established(peer):
                    instance._adopt(self, peer)
                    if not self.ready.done():
                        self.ready.set_result(peer)
                        instance._handshake_done()
                case PeerSubscriptions():
                    pass
                case Closed(reason, error):
                    if error:
                        log.warning("tolliver %s: closing: %s", self.conn.peer, reason)
                    if not self.eof:  # refused by the handshake, or not Tolliver at all
                        self._fail(HandshakeFailed(reason))
                    self.close(event)  # (a refusal of ours is written first)
                    return
        self.flush()
