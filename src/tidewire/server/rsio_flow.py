"""How an RS.io session stays bounded under hostile load: the pieces it shares with nothing else.

* **Slices.** Decoded input is handled at most :data:`SLICE_MESSAGES` messages,
  :data:`SLICE_SECONDS` or :data:`SLICE_BYTES` bytes at a time; then the session pauses
  reading, yields to the event loop and goes on (:class:`Slicer`). A Tube message inflated to
  megabytes of refused subscribes therefore never holds the loop for more than a slice (about
  half a millisecond), and the peer's next input waits meanwhile (reading is paused, so nothing
  more piles up).
* **Read-ahead accounts.** Every subscription of a connection charges what it keeps read ahead
  (its carry) to one gauge of the connection's budget share, ``"readahead"``
  (:class:`ReadAhead`, one :class:`~tidewire.hub.subscription.Account` per subscription).
* **Refusal log lines.** One :class:`RefusalLog` per hub (:func:`refusal_log`) for every
  RS.io connection, TCP and Tube: a flood of refusals from many connections is still a few
  lines and, when the interval ends, one line with the count.
* **Fair turns.** The loop time a connection's work takes is charged to its principal
  (:meth:`~tidewire.hub.Share.spend`); over its fair share of a contended loop
  (:mod:`tidewire.hub.fairness`) the connection waits: its ``Throttle`` pauses its reading
  for the wait, and :class:`Slicer` puts its next slice off as long.
* **Carriers.** What carries a session's bytes (:class:`Carrier`: TCP, Tube), and optionally
  :class:`Buffering`.
* **Output size.** A carrier that can tell how many bytes it holds for the peer
  (:class:`Buffering`) has them charged as ``"outbound"``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..hub import Hub, Share
from ..hub.fairness import Throttle
from ..observe.throttle import LogThrottle

__all__ = [
    "OUTPUT_PAUSE_BYTES",
    "SLICE_BYTES",
    "SLICE_CHECK",
    "SLICE_MESSAGES",
    "SLICE_SECONDS",
    "Buffering",
    "Carrier",
    "ReadAhead",
    "RefusalLog",
    "Slicer",
    "refusal_log",
]

SLICE_MESSAGES = 256
"""Decoded messages handled before yielding to the loop, at most (runs of elements count one)."""

SLICE_SECONDS = 0.0005
"""...or this long, whichever comes first (checked every :data:`SLICE_CHECK` messages). A
refused subscribe costs about 20 us (the ACL, the onError, the log throttle): a flood of them
goes 16-32 at a time, and a bystander's every step through the loop waits for at most one such
slice (measured: 64-message slices let a flood stall a bystander by 150-250 ms on a busy
2-core machine; half-millisecond slices, not at all)."""

SLICE_CHECK = 16
"""Messages between two looks at the clock."""

OUTPUT_PAUSE_BYTES = 5 * 1024 * 1024
"""Output waiting for the peer beyond which the session stops reading its input: the carriers'
high-water mark (4 MiB, TCP and Tube; the pumps stop there) plus 1 MiB for what the input
itself makes the hub answer. Reading is not paused at the mark itself: a fast subscriber's
``request``s must keep arriving while its output drains (pausing there cost 15-18 % of the
64 KiB subscribe throughput)."""

SLICE_BYTES = 256 * 1024
"""Decoded input handled before yielding: one TCP read (so a publisher's bulk input, decoded
in runs, is still one slice per read; a Tube message of megabytes is many)."""


class Carrier(Protocol):
    """What carries a session's bytes (a TCP transport; a Tube connection on a WebSocket)."""

    def write_chunks(self, chunks: list[bytes | memoryview]) -> None:
        """Send ``chunks`` back to back (they are the peer's bytes in order; views into
        immutable buffers, to be sent without a copy where the carrier can)."""

    def pause_reading(self) -> None:
        """Read nothing more from the peer until :meth:`resume_reading`."""

    def resume_reading(self) -> None: ...

    def close(self) -> None:
        """Send what is queued, then close."""

    def abort(self) -> None:
        """Drop the connection at once, without a word."""

    def is_closing(self) -> bool: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """Facts about the connection, as ``asyncio.Transport`` names them: ``peername``,
        ``guard`` (the guard's connection: id and log context), the TLS ones (``peercert``,
        ``ssl_object``, ...)."""

    def established(self) -> None:
        """The RS.io handshake is over (the guard's handshake deadline no longer applies)."""

    def refused(self) -> None:
        """The session refuses the peer (a breach): the close that follows lingers
        (:func:`~tidewire.server.guard.refused`)."""


@runtime_checkable
class Buffering(Protocol):
    """A carrier that can say how many bytes it holds for the peer (charged as
    ``"outbound"``). Optional: a :class:`Carrier` without it is not charged."""

    def get_write_buffer_size(self) -> int: ...


class Slicer:
    """Runs ``step`` (one slice: True when more remains) now and then again from the loop,
    with ``pause(True)`` while a continuation is pending and ``pause(False)`` once the input
    is drained. :meth:`run` is idempotent while a continuation is pending (the pending one
    will see the new input). With a ``throttle``, each slice's time is charged to it, and a
    continuation waits out the wait it earned."""

    def __init__(self, step: Callable[[], bool], pause: Callable[[bool], None],
                 throttle: Throttle | None = None) -> None:  # fmt: skip
        self._step = step
        self._pause = pause
        self._throttle = throttle
        self._handle: asyncio.Handle | None = None
        self._running = False
        self.slices = 0
        """Continuations scheduled so far (tests and metrics: was the input sliced?)."""

    @property
    def pending(self) -> bool:
        """A continuation is scheduled: input is waiting to be handled."""
        return self._handle is not None

    def run(self) -> None:
        """Run a slice now unless one is scheduled or running (a slice's own calls, e.g. a
        budget retry from an event it handles, come back here: its end sees to them)."""
        if self._handle is not None or self._running:
            return
        self._running = True
        began = time.perf_counter()
        try:
            more = self._step()
        finally:
            self._running = False
        wait = 0.0 if self._throttle is None else self._throttle.spent(time.perf_counter() - began)
        if more:
            self.slices += 1
            self._pause(True)
            loop = asyncio.get_running_loop()
            self._handle = (loop.call_later(wait, self._continue) if wait
                            else loop.call_soon(self._continue))  # fmt: skip
        else:
            self._pause(False)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _continue(self) -> None:
        self._handle = None
        self.run()


class ReadAhead:
    """The read-ahead of every subscription on one connection, as one ``"readahead"`` gauge
    of its budget ``share``."""

    def __init__(self, share: Share) -> None:
        self.share = share
        self.total = 0

    def account(self) -> _Part:
        """A new subscription's part (a :class:`~tidewire.hub.subscription.Account`)."""
        return _Part(self)


class _Part:
    """One subscription's part of a :class:`ReadAhead`."""

    __slots__ = ("held", "whole")

    def __init__(self, whole: ReadAhead) -> None:
        self.whole = whole
        self.held = 0

    def try_hold(self, nbytes: int) -> bool:
        whole = self.whole
        total = whole.total - self.held + nbytes
        if not whole.share.try_hold("readahead", total):
            return False
        whole.total, self.held = total, nbytes
        return True

    def hold(self, nbytes: int) -> None:
        whole = self.whole
        whole.total = whole.total - self.held + nbytes
        self.held = nbytes
        whole.share.hold("readahead", whole.total)


class RefusalLog:
    """The hub's rate-limited log of RS.io refusals (one for every connection, TCP and Tube):
    a :class:`~tidewire.observe.throttle.LogThrottle`, and a timer that writes its summary line
    when the interval ends (rather than at the next refusal, which may never come)."""

    def __init__(self, throttle: LogThrottle | None = None) -> None:
        self.throttle = throttle or LogThrottle()
        self._flush: asyncio.TimerHandle | None = None

    def log(self, logger: logging.LoggerAdapter[Any], level: int, msg: str,
            *args: object) -> None:  # fmt: skip
        if self.throttle.log(logger, level, msg, *args) or self._flush is not None:
            return
        self._flush = asyncio.get_running_loop().call_later(
            self.throttle.interval, self._summary, logger)

    def _summary(self, logger: logging.LoggerAdapter[Any]) -> None:
        self._flush = None
        self.throttle.flush(logger, logging.WARNING)


_logs: weakref.WeakKeyDictionary[Hub, RefusalLog] = weakref.WeakKeyDictionary()


def refusal_log(hub: Hub) -> RefusalLog:
    """The hub's :class:`RefusalLog`."""
    found = _logs.get(hub)
    if found is None:
        found = _logs[hub] = RefusalLog()
    return found
