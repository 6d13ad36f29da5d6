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
  re-offer what is unacknowledged, ...);
* ``urls``: several gateways that serve the same streams (cluster mode, docs/cluster.md), tried
  round robin: :attr:`Reconnector.url` is the one the next try (or the connection made) uses;
  a failed try moves on to the next one before its wait, and so does the first
  :meth:`Reconnector.dial` after a connection was made (the connection was lost: its gateway
  may be the one that died). The backoff paces the tries as with one URL, so a client whose
  gateways are all down still waits between tries; one URL (or none) changes nothing.
  :func:`gateway_urls` parses a comma-separated list the way every client accepts it.

What a lost connection means stays the client's rule (the docs of each say it): RS.io tries
again at once after a stable connection; Tolliver counts every loss (``Retry(attempts=1)``
never reconnects); Seguro counts every loss and ends the outage on WELCOME; HTTP counts failed
requests. Time is the backoff's ``clock`` and ``sleep``: tests inject both, and nothing here
reads the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from ..model import TidewireError
from .backoff import Backoff

__all__ = ["Closed", "Final", "Reconnector", "first_reachable", "gateway_urls"]

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
    :attr:`reconnects` (those after the first), :attr:`failovers` (moves to the next of
    several ``urls``), :attr:`last_error`; :attr:`url` is the gateway in use."""

    def __init__(
        self,
        backoff: Backoff,
        what: str,
        *,
        stable_after: float = 1.0,
        final: Final = _retriable,
        on_reconnect: Callable[[C], None] | None = None,
        closed: Callable[[], BaseException] | None = None,
        urls: Sequence[str] = (),
    ) -> None:
        """``what``: names the peer in errors and logs. ``final``: which errors end the
        client (default: all but ``OSError``). ``on_reconnect``: called with every
        connection made after the first. ``closed``: the error a wait ends with once the
        client is closed (default :class:`Closed`). ``urls``: the gateways to rotate over
        (see the module; the first is tried first)."""
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
        self.urls: tuple[str, ...] = tuple(urls)
        self.failovers = 0  # moves to the next URL (with several)
        self._at = 0  # the index in urls of the current URL
        self._live = False  # a connection made by dial() that no later dial() replaced yet

    @property
    def url(self) -> str | None:
        """The gateway of the connection made last, or of the next try after a failure
        (``None`` without ``urls``)."""
        return self.urls[self._at] if self.urls else None

    def move_on(self) -> None:
        """The next URL (round robin) for the next try; nothing with fewer than two."""
        if len(self.urls) > 1:
            self._at = (self._at + 1) % len(self.urls)
            self.failovers += 1

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
        bounds). The connection made is counted (:meth:`up`). With ``urls``, ``attempt``
        reads :attr:`url` for where to go: a failed try moves on to the next URL, and so does
        a call after a connection was made (that connection is taken for lost)."""
        if self._live:
            self._live = False
            self.move_on()
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
                self.move_on()
                await self.pause(exc)
                continue
            self._live = True
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


def gateway_urls(urls: str | Sequence[str]) -> tuple[str, ...]:
    """Gateway URLs, in order, from a list or a comma-separated string (the forms Kafka's
    ``bootstrap.servers`` and nats-py's ``servers`` take): ``"rsio://h1:7400,rsio://h2:7400"``,
    or ``"rsio://h1:7400,h2:7400"``, where an entry without ``scheme://`` takes the first
    entry's scheme, and its path too when it has none (``"ws://h1:7480/tube,h2:7480"`` is
    ``ws://h2:7480/tube``). Spaces around entries and empty entries are ignored.
    :class:`ValueError`: no URL, a first entry without a scheme, or a URL named twice."""
    items = [urls] if isinstance(urls, str) else list(urls)
    parts = [p.strip() for item in items for p in item.split(",") if p.strip()]
    if not parts:
        raise ValueError("no URL given")
    scheme, sep, rest = parts[0].partition("://")
    if not sep:
        raise ValueError(f"the first URL needs a scheme (like rsio://host:port): {parts[0]!r}")
    path = rest[rest.find("/"):] if "/" in rest else ""
    out = tuple(p if "://" in p else f"{scheme}://{p}{'' if '/' in p else path}" for p in parts)
    if len(set(out)) != len(out):
        raise ValueError(f"a URL is named twice: {', '.join(out)}")
    return out


async def first_reachable(urls: Sequence[str], attempt: Callable[[str], Awaitable[C]],
                          final: Final = _retriable) -> C:  # fmt: skip
    """One try of each URL in order, without waits (a client that does not reconnect, given
    several gateways): the first connection made; an error ``final`` calls final at once;
    else the last URL's error."""
    error: BaseException | None = None
    for url in urls:
        try:
            return await attempt(url)
        except Exception as exc:
            rule = final(exc)
            if rule is exc:
                raise
            if rule is not None:
                raise rule from exc
            error = exc
    assert error is not None, "no URL given"
    raise error
