"""One reconnect helper for every tidewire client: RS.io (TCP and Tube,
:mod:`.resilient`), Seguro (:mod:`.seguro`), RS.io over HTTP (:mod:`.http`) and Tolliver
(:mod:`tidewire.tolliver.supervisor`).

A :class:`Reconnector` wraps one :class:`~.backoff.Backoff` (exponential, with jitter; bounded
per outage by :class:`~.backoff.Retry`, :class:`~.backoff.GaveUp` when it runs out) and adds
what the four reconnect loops shared, each in its own copy until issue 19:

* :meth:`Reconnector.dial`: try until a connection is made, each try bounded by a timeout;
  every error is sorted by the client's ``final`` rule, which says whether another try can help
  (a refused token, a certificate that does not verify, a refused handshake cannot) and what to
  raise; a retriable one is counted and waited for (:meth:`Reconnector.pause`);
* :meth:`Reconnector.pause`: count a failure and wait as the backoff says, cut short by
  :meth:`Reconnector.close` (then :class:`Closed`);
* :meth:`Reconnector.up` / :meth:`Reconnector.lasted`: the counters of a connection made, and
  whether it was *stable* (made progress, or lived ``stable_after`` seconds by the backoff's
  clock), which the client uses to end the outage (:meth:`Reconnector.reset`) or count the loss
  as one more failure of it;
* ``on_reconnect``: a hook called with each connection made after the first (re-subscribe,
  re-offer what is unacknowledged, ...).

What a lost connection means stays the client's rule (the docs of each say it): RS.io tries
again at once after a stable connection; Tolliver counts every loss (``Retry(attempts=1)``
never reconnects); Seguro counts every loss and ends the outage on WELCOME; HTTP counts failed
requests. Time is the backoff's ``clock`` and ``sleep``: tests inject both, and nothing here
reads the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from ..model import TidewireError
from .backoff import Backoff

__all__ = ["Closed", "Final", "Reconnector"]

C = TypeVar("C")

Final = Callable[[BaseException], BaseException | None]
"""A client's rule for a failed try: the error to raise at once (no other try can help), or
``None`` when another try may succeed."""


class Closed(TidewireError):
    """The client was closed while it waited to reconnect."""


def _retriable(exc: BaseException) -> BaseException | None:
    """The default rule: ``OSError`` (refused, reset, TLS, timed out) is worth another try."""
    return None if isinstance(exc, OSError) else exc


class Reconnector(Generic[C]):
    """One client's reconnects (see the module); :class:`~.backoff.GaveUp` from :meth:`dial`
    and :meth:`pause` when an outage runs out. Counters: :attr:`attempts` (tries),
    :attr:`failures` (failed tries and losses counted), :attr:`connects` (connections made),
    :attr:`reconnects` (those after the first), :attr:`last_error`."""

    def __init__(
        self,
        backoff: Backoff,
        what: str,
        *,
        stable_after: float = 1.0,
        final: Final = _retriable,
        on_reconnect: Callable[[C], None] | None = None,
        closed: Callable[[], BaseException] | None = None,
    ) -> None:
        """``what``: names the peer in errors and logs. ``final``: which errors end the
        client (default: all but ``OSError``). ``on_reconnect``: called with every
        connection made after the first. ``closed``: the error a wait ends with once the
        client is closed (default :class:`Closed`)."""
        self.backoff = backoff
        self.what = what
        self.stable_after = stable_after
        self.final = final
        self.on_reconnect = on_reconnect
        self.attempts = 0
        self.failures = 0
        self.connects = 0
        self.reconnects = 0
        self.last_error: BaseException | None = None
        self._closed = asyncio.Event()
        self._closed_error = closed or (lambda: Closed(f"{self.what}: the client is closed"))
        self._up_at = 0.0
        self._progress = False

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """No more waits: one under way ends with :class:`Closed`, and so does every later
        :meth:`pause`."""
        self._closed.set()

    async def dial(self, attempt: Callable[[], Awaitable[C]], *,
                   try_seconds: float | None = None) -> C:  # fmt: skip
        """Try ``attempt`` until it gives a connection: each try bounded by ``try_seconds``
        seconds (a :class:`TimeoutError`, retriable by the default rule); an error that
        ``final`` says no try can help is raised at once (as ``final`` gives it), any other is
        counted and waited for (:meth:`pause`: :class:`GaveUp` once the outage is over its
        bounds). The connection made is counted (:meth:`up`)."""
        while True:
            if self.closed:
                raise self._closed_error()
            self.attempts += 1
            try:
                async with asyncio.timeout(try_seconds):
                    connection = await attempt()
            except Exception as exc:
                final = self.final(exc)
                if final is exc:
                    raise
                if final is not None:
                    raise final from exc
                await self.pause(exc)
                continue
            self.up(connection)
            return connection

    async def pause(self, error: BaseException, *, at_least: float = 0.0) -> None:
        """Count a failure and wait before the next try, at least ``at_least`` seconds (a
        ``Retry-After``): :class:`GaveUp` when the outage is over its bounds, :class:`Closed`
        if the client is closed before or during the wait."""
        self.failures += 1
        self.last_error = error
        delay = max(self.backoff.failed(self.what, error), at_least)
        if self.closed:
            raise self._closed_error()
        sleep = asyncio.ensure_future(self.backoff.sleep(delay))
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({sleep, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleep.cancel()
            closed.cancel()
        if self.closed:
            raise self._closed_error()

    def up(self, connection: C) -> None:
        """A connection was made: counted, its age starts now; ``on_reconnect`` if it is not
        the first."""
        self.connects += 1
        self._up_at = self.backoff.clock()
        self._progress = False
        if self.connects > 1:
            self.reconnects += 1
            if self.on_reconnect is not None:
                self.on_reconnect(connection)

    def progressed(self) -> None:
        """The connection delivered or acknowledged something: it counts as stable."""
        self._progress = True

    def lasted(self) -> bool:
        """Whether the connection made last was stable: it progressed, or lived
        ``stable_after`` seconds (by the backoff's clock)."""
        return self._progress or self.backoff.clock() - self._up_at >= self.stable_after

    def reset(self) -> None:
        """The outage is over: the next one starts at ``Retry.initial`` with its own bounds."""
        self.backoff.reset()

