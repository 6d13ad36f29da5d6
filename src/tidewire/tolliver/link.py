"""One Tolliver connection on asyncio: the thin adapter around the sans-IO
:class:`~tidewire.protocols.tolliver.Connection`, shared by the hub
(:mod:`tidewire.server.tolliver`) and the stand-alone :class:`~.instance.Instance`.

What the adapter does, and nothing more (STYLE.md, "the runtime is a thin adapter"):

* feeds the bytes read into the machine and hands its events to :meth:`Link.handle_events`,
  the one hook each side implements (the hub stores and relays, an instance delivers to its
  application);
* writes what the machine has to send (:meth:`Link.flush`, or :meth:`Link.soon` for one write
  per turn of the event loop);
* arms **one** timer from ``next_deadline()`` on the injected ``clock`` and resends what is due
  when it fires (:meth:`Link.handle_timer`); tests drive a fake clock and call
  :meth:`Link.handle_timer` instead of waiting;
* stops resending while the transport's buffer is above its high-water mark (a peer that does
  not read would otherwise get its unacked messages queued again every ``resend_interval``);
  the timer is armed again when it drains (``resume_writing``);
* closes **after** writing what the machine said last (:meth:`Link.close`): a handshake
  refusal (response status 2, or final 2) reaches the peer before the FIN, so the peer sees a
  refusal, not a bare close. :meth:`Link.refuse` is the other way to close: nothing more is
  written (a refusal Tolliver has no frame for: identity, ACL).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from ..model import ProtocolError
from ..protocols.tolliver import Closed, Connection, Role

__all__ = ["HandshakeFailed", "Link"]


class HandshakeFailed(ProtocolError, ConnectionError):
    """The remote's handshake said no (it cannot speak this instance's version, or answered
    bytes that are not a Tolliver handshake): final, never retried. (A remote that closes the
    connection before answering is a :class:`ConnectionError`: it could be restarting.)"""


class Link(asyncio.Protocol):
    """An asyncio protocol driving one Tolliver :class:`Connection` (see the module).

    Subclasses implement :meth:`handle_events` (drain ``conn.next_event()``; a :class:`Closed`
    event goes to :meth:`close`) and may extend :meth:`connection_made` /
    :meth:`connection_lost` (calling these). ``clock`` is the time base of ``conn``'s
    deadlines (seconds, e.g. ``time.monotonic``)."""

    def __init__(self, conn: Connection, clock: Callable[[], float]) -> None:
        self.conn = conn
        self.clock = clock
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()  # the transport's buffer is below its high-water mark
        self.writable.set()
        self.eof = False  # the peer closed its side
        self.lost = False  # connection_lost came: nothing more is written or resent
        self.muted = False  # refused: nothing more is written
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when it fires (``clock``)
        self._flush_soon = False

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.conn.role is Role.CONNECTOR:
            self.conn.initiate()
            self.flush()

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        self.handle_events()

    def eof_received(self) -> bool | None:
        self.eof = True
        self.conn.receive_data(b"")
        self.handle_events()
        return None  # (close the transport)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()
        self.flush()  # (arms the resend timer again)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------------ the hook

    def handle_events(self) -> None:
        """Drain the machine's events (called after every read); the side's own logic."""
        raise NotImplementedError

    # ------------------------------------------------------------------ output and time

    def flush(self) -> None:
        """Write what the machine has to send (unless muted or gone), then arm the timer."""
        self._flush_soon = False
        if self.muted:
            return
        data = self.conn.data_to_send()
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)
        self._arm()

    def soon(self) -> None:
        """Flush once the event loop is done with what is ready now (one write for the sends
        and acks of one turn)."""
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self.flush)

    def _arm(self) -> None:
        """One timer, at the machine's next deadline: moved earlier if the deadline is; one
        that fires early (the deadline moved later) just re-arms."""
        deadline = None if self.lost else self.conn.next_deadline()
        if self._timer is not None and (deadline is None or deadline < self._timer_at):
            self._timer.cancel()
            self._timer = None
        if deadline is not None and self._timer is None:
            delay = max(0.0, deadline - self.clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._fire)
            self._timer_at = deadline

    def _fire(self) -> None:
        self._timer = None
        self.handle_timer(self.clock())

    def handle_timer(self, now: float) -> None:
        """Resend what is due at ``now`` (``clock``'s time): nothing while the peer does not
        read; the timer is armed again when it does (``resume_writing``)."""
        if not self.writable.is_set():
            return
        self.conn.handle_timer(now)
        self.flush()

    # ------------------------------------------------------------------ closing

    def close(self, event: Closed | None = None) -> None:
        """Close after writing what the machine has to send (a handshake refusal: response
        status 2, or final 2, reaches the peer before the connection closes)."""
        del event  # (the reason is the caller's to log)
        self.flush()
        if self.transport is not None:
            self.transport.close()  # (asyncio writes what is buffered first)

    def refuse(self) -> None:
        """Close with nothing more written: what the machine has queued (a handshake response,
        acks) is dropped. For refusals Tolliver has no frame for (identity, ACL)."""
        self.muted = True
        self.conn.data_to_send()
        if self.transport is not None:
            self.transport.close()
