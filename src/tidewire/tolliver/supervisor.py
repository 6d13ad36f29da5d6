"""Keeping a stand-alone :class:`~.instance.Instance` connected to one remote
(``Instance.connect(..., retry=Retry(...))``): the reconnect loop, its counters, and what is
known of the remote while it is away (docs/protocols/tolliver.md, "Reconnecting and
duplicates"). The remote may be reached at several gateways (cluster mode, where every gateway
is the same hub to a Tolliver instance: ``Instance.connect(host, port, failover=[...])``),
tried round robin by the one reconnect helper."""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..client.backoff import Backoff, GaveUp, Retry
from ..client.reconnect import Reconnector, gateway_urls
from ..protocols.tolliver import Role, matches
from .instance_link import InstanceLink
from .link import HandshakeFailed

if TYPE_CHECKING:
    from .instance import Instance

__all__ = ["Supervisor"]

log = logging.getLogger("tidewire.tolliver")


class Supervisor:
    """Keeps an :class:`Instance` connected to one remote (``Instance.connect(..., retry=)``).

    A task dials ``host:port`` (with the one reconnect helper every client uses,
    :class:`~tidewire.client.reconnect.Reconnector`); whenever the connection is lost it waits
    as its :class:`~tidewire.client.backoff.Backoff` says, dials again and does the handshake again
    (the instance's subscriptions as they are then), and the instance resends every message
    the remote has not acked. Counting, per outage (``retry.attempts``, ``give_up_after``):
    each failed try is a failure, and so is the loss of a connection (so ``Retry(attempts=1)``
    never reconnects); a connection that lasted ``stable_after`` seconds ends the outage (the
    pacing starts again at ``retry.initial``), a shorter one does not, so a remote that closes
    every connection right after its handshake (e.g. an ACL refusing what is resent) still
    ends in :class:`GaveUp`. A :class:`HandshakeFailed` (versions) is final at once.

    Several gateways (``failover``: more ``host:port`` or ``tolliver://host:port`` after
    ``host:port``): a failed try or a lost connection goes on at the next one, round robin,
    paced as above; :attr:`url` (and :attr:`host`, :attr:`port`) say which is current. The
    handshake is made again there and the outbox re-offers every unacked message, as after a
    reconnect to the same hub. With TLS, ``server_hostname`` (when given) is checked at every
    gateway, else each gateway's own host name.

    Counters: :attr:`attempts` (connection tries), :attr:`failures` (tries failed and
    connections lost, in all), :attr:`reconnects` (connections established after the first),
    :attr:`last_error`; :attr:`gave_up` once it stopped for good (:meth:`wait` raises it).
    """

    def __init__(
        self,
        instance: Instance,
        host: str,
        port: int,
        retry: Retry,
        *,
        ssl: _ssl.SSLContext | None,
        server_hostname: str | None,
        handshake_timeout: float,
        stable_after: float,
        failover: str | Sequence[str] = (),
    ) -> None:
        self.instance = instance
        self.retry = retry
        others = [failover] if isinstance(failover, str) else list(failover)
        urls = gateway_urls([f"tolliver://{host}:{port}", *others])
        for url in urls:
            _address(url)  # (a bad one is refused here, not at its first try)
        self.ssl, self.server_hostname = ssl, server_hostname
        self.handshake_timeout = handshake_timeout
        self.stable_after = stable_after
        self.peer: uuid.UUID | None = None  # the remote's UUID, once a handshake completed
        self.link: InstanceLink | None = None  # the connection established now (or just lost)
        self.failures = 0
        self.last_error: BaseException | None = None
        self.gave_up: GaveUp | None = None
        self._known: frozenset[tuple[str, str]] = frozenset()  # the remote's, when last seen
        self._reconnector: Reconnector[InstanceLink] = Reconnector(
            Backoff(retry, clock=instance.clock, sleep=instance.sleep),
            f"tolliver {','.join(u.removeprefix('tolliver://') for u in urls)}",
            stable_after=stable_after, final=self._final, urls=urls,
        )  # fmt: skip
        self._first: asyncio.Future[uuid.UUID] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name=f"tolliver {host}:{port}")

    def __repr__(self) -> str:
        return (f"<Supervisor {self.host}:{self.port} peer={self.peer} "
                f"connected={self.connected} reconnects={self.reconnects}>")  # fmt: skip

    @property
    def url(self) -> str:
        """The gateway (``tolliver://host:port``) of the connection now, or of the next try."""
        url = self._reconnector.url
        assert url is not None  # (one URL at least)
        return url

    @property
    def urls(self) -> tuple[str, ...]:
        """Every gateway, in the order they are tried."""
        return self._reconnector.urls

    @property
    def host(self) -> str:
        return _address(self.url)[0]

    @property
    def port(self) -> int:
        return _address(self.url)[1]

    @property
    def failovers(self) -> int:
        """Moves to the next gateway (failed tries and lost connections, with several)."""
        return self._reconnector.failovers

    @property
    def attempts(self) -> int:
        """Connection tries."""
        return self._reconnector.attempts

    @property
    def reconnects(self) -> int:
        """Connections established after the first."""
        return self._reconnector.reconnects

    @property
    def connected(self) -> bool:
        return self.link is not None and self.link.conn.established

    @property
    def running(self) -> bool:
        """Not stopped (by :meth:`Instance.close`, or :class:`GaveUp`)."""
        return not self._task.done()

    @property
    def subscriptions(self) -> frozenset[tuple[str, str]]:
        """The remote's subscriptions: now, or as they were when its connection was lost."""
        link = self.link
        return frozenset(link.conn.peer_subscriptions) if link is not None else self._known

    def keeps(self, channel: str, key: str) -> bool:
        """Whether a message on (channel, key) is kept for this remote while it is away."""
        if self.peer is None or self._task.done():
            return False
        link = self.link
        subscriptions = link.conn.peer_subscriptions if link is not None else self._known
        return matches(subscriptions, channel, key)

    async def wait(self) -> None:
        """Until the supervisor stops: returns after :meth:`Instance.close`, raises
        :class:`GaveUp` if it gave up."""
        await asyncio.wait([self._task])
        if self.gave_up is not None:
            raise self.gave_up

    async def first(self) -> uuid.UUID:
        """The remote's UUID once the first handshake completed (:class:`GaveUp` if never)."""
        return await asyncio.shield(self._first)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.wait([self._task])

    @property
    def _what(self) -> str:
        return f"tolliver {self.host}:{self.port}"

    def _final(self, exc: BaseException) -> BaseException | None:
        """A failed try: :class:`HandshakeFailed` (versions) ends it at once, in
        :class:`GaveUp`; ``OSError`` (refused, reset, TLS, timed out, closed unanswered) is
        worth another try; anything else is a bug, raised."""
        if isinstance(exc, HandshakeFailed):
            self._failed(exc)
            return GaveUp(self._what, self._reconnector.backoff.failures + 1, exc)
        if isinstance(exc, OSError):
            self._failed(exc)
            return None
        return exc

    async def _run(self) -> None:
        reconnector = self._reconnector
        try:
            while True:
                link = await reconnector.dial(self._dial)
                self._established(link)
                lost = await link.gone
                error = lost if lost is not None else ConnectionError("closed by the remote")
                self._known = frozenset(link.conn.peer_subscriptions)
                self.link = None
                self._failed(error)
                log.info("%s: connection lost (%s); reconnecting", self._what, error)
                if reconnector.lasted():  # (a shorter one is one more failure of its outage)
                    reconnector.reset()
                await reconnector.pause(error)  # (every loss counts: attempts=1 never retries)
        except GaveUp as exc:
            self._stopped(exc)
        except Exception as exc:  # a bug: stop, and say so
            log.exception("%s: the supervisor failed", self._what)
            self._stopped(GaveUp(self._what, reconnector.backoff.failures, exc))
        finally:
            if self.link is not None:
                self._known = frozenset(self.link.conn.peer_subscriptions)
            self.link = None
            if not self._first.done():
                self._first.set_exception(ConnectionError("the instance was closed"))
            self._first.exception()  # (retrieved: connect() may have stopped waiting)

    def _stopped(self, exc: GaveUp) -> None:
        self.gave_up = exc
        log.warning("%s: %s", self._what, exc)
        if not self._first.done():
            self._first.set_exception(exc)

    async def _dial(self) -> InstanceLink:
        instance = self.instance
        host, port = self.host, self.port
        loop = asyncio.get_running_loop()
        link: InstanceLink | None = None
        try:
            async with asyncio.timeout(self.handshake_timeout):
                _, link = await loop.create_connection(
                    lambda: InstanceLink(instance, Role.CONNECTOR), host, port,
                    ssl=self.ssl, server_hostname=(self.server_hostname or host)
                    if self.ssl is not None else None,
                )  # fmt: skip
                await link.ready
        except BaseException:
            if link is not None and link.transport is not None:
                link.transport.abort()
            raise
        return link

    def _established(self, link: InstanceLink) -> None:
        peer = link.conn.peer
        assert peer is not None
        if self.peer is not None and peer != self.peer:
            log.warning("%s: now instance %s, was %s (what was kept for %s stays in the "
                        "outbox for when it comes back)", self._what, peer, self.peer,
                        self.peer)  # fmt: skip
        self.peer = peer
        self.link = link
        if self._first.done():
            log.info("%s: reconnected to %s", self._what, peer)
        else:
            self._first.set_result(peer)

    def _failed(self, error: BaseException) -> None:
        self.failures += 1
        self.last_error = error
        self.instance.last_error = error


def _address(url: str) -> tuple[str, int]:
    """``tolliver://host:port`` as (host, port); :class:`ValueError` without both."""
    parts = urlsplit(url)
    if parts.scheme != "tolliver" or not parts.hostname or parts.port is None:
        raise ValueError(f"not a tolliver://host:port (or host:port) address: {url!r}")
    return parts.hostname, parts.port
