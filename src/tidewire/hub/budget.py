"""One memory budget for the hub, with a share per principal and per connection.

Every place where bytes wait for a peer is charged to the peer's connection: an inbound message
that has begun (or been declared) and is not finished, an HTTP body, output not yet written to
the socket, a subscription's read-ahead, Tolliver deliveries not yet acknowledged, transaction
offers staged until they complete. A charge has to fit three shares at once:

* the connection's own (``memory.connection_bytes``),
* its principal's, every connection of that principal together (``memory.principal_bytes``);
  ``anonymous`` is one principal, so anonymous peers share one share,
* the hub's total (``memory.budget_bytes``).

A :class:`Share` is one connection's account. Its holdings are named **gauges** (``"inbound"``,
``"outbound"``, ``"readahead"``, ...): an adapter sets a gauge to what it holds now rather than
adding and subtracting, so a missed release cannot leak budget, and :meth:`Share.close` returns
everything at once. :meth:`Share.try_hold` is the check made *before* buffering (a declared
length, a read-ahead): it refuses (and changes nothing) when any of the three shares would be
exceeded, and the adapter answers with its protocol's own error or pauses. :meth:`Share.hold`
records bytes that are already in memory and cannot be refused (a delivery already written to
the transport); it may go over, and the next ``try_hold`` of that connection then fails.

A connection whose frame waits for room (rather than being refused: it fits its own and its
principal's shares, and only the hub's total, held by others, or its own draining output is in
the way) asks to be told when bytes are returned (:meth:`Share.on_release`): each waiter is
called once, soon after the next release anywhere in the hub (on the next turn of the loop,
never from inside another connection's accounting), and asks again if it still does not fit.

Accounting is plain integers on the event loop's thread; nothing here allocates per byte. This
is the hub's own core (no library does per-principal byte accounting), so it is hand-written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .fairness import LoopShares

__all__ = ["BUDGET_DEFAULTS", "Budget", "BudgetLimits", "Share"]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """The three shares, in bytes (``memory.*`` settings)."""

    total: int = 1024 * MiB
    principal: int = 256 * MiB
    connection: int = 96 * MiB

    def __post_init__(self) -> None:
        if not 0 < self.connection <= self.principal <= self.total:
            raise ValueError("memory limits: need 0 < connection <= principal <= total, got "
                             f"{self.connection}, {self.principal}, {self.total}")  # fmt: skip


BUDGET_DEFAULTS = BudgetLimits()


class Budget:
    """The hub's memory budget: every :class:`Share` of every connection, by principal."""

    def __init__(self, limits: BudgetLimits = BUDGET_DEFAULTS,
                 loop: LoopShares | None = None) -> None:  # fmt: skip
        self.limits = limits
        self.loop = loop if loop is not None else LoopShares()
        """Each principal's share of the event loop's time (:mod:`.fairness`)."""
        self._used = 0
        self._by_principal: dict[str, int] = {}
        self._shares: set[Share] = set()
        self.refused = 0
        """How many :meth:`Share.try_hold` calls were refused, since start."""
        self._waiters: dict[Share, Callable[[], None]] = {}  # (Share.on_release)
        self._waking = False

    @property
    def used(self) -> int:
        """Bytes held by every connection together."""
        return self._used

    def used_by(self, principal: str) -> int:
        """Bytes held by every connection of ``principal``."""
        return self._by_principal.get(principal, 0)

    def principals(self) -> dict[str, int]:
        """Bytes held per principal (those holding any)."""
        return {p: n for p, n in self._by_principal.items() if n}

    def share(self, principal: str = "anonymous", label: str = "") -> Share:
        """A new connection's account; ``label`` names it in :meth:`largest` (a peer address)."""
        share = Share(self, principal, label)
        self._shares.add(share)
        return share

    def largest(self, n: int = 5) -> list[tuple[str, str, int]]:
        """The ``n`` connections holding most: (principal, label, bytes)."""
        rows = sorted(self._shares, key=lambda s: s.held, reverse=True)[:n]
        return [(s.principal, s.label, s.held) for s in rows if s.held]

    def __iter__(self) -> Iterator[Share]:
        return iter(list(self._shares))

    # -- used by Share only

    def _fits(self, principal: str, own: int, delta: int) -> bool:
        if delta <= 0:
            return True
        limits = self.limits
        return (own + delta <= limits.connection
                and self._by_principal.get(principal, 0) + delta <= limits.principal
                and self._used + delta <= limits.total)  # fmt: skip

    def _add(self, principal: str, delta: int) -> None:
        self._used += delta
        left = self._by_principal.get(principal, 0) + delta
        if left:
            self._by_principal[principal] = left
        else:
            self._by_principal.pop(principal, None)
        if delta < 0 and self._waiters and not self._waking:
            self._waking = True
            try:
                asyncio.get_running_loop().call_soon(self._wake)
            except RuntimeError:  # (no loop: synchronous code releasing; wake at once)
                self._wake()

    def _wake(self) -> None:
        self._waking = False
        waiters, self._waiters = self._waiters, {}
        for wake in waiters.values():
            wake()

    def _forget(self, share: Share) -> None:
        self._shares.discard(share)
        self._waiters.pop(share, None)


class Share:
    """One connection's account in a :class:`Budget`: named gauges of bytes held."""

    __slots__ = ("_budget", "_gauges", "_held", "closed", "label", "principal")

    def __init__(self, budget: Budget, principal: str, label: str) -> None:
        self._budget = budget
        self.principal = principal
        self.label = label
        self._gauges: dict[str, int] = {}
        self._held = 0
        self.closed = False

    @property
    def held(self) -> int:
        """Bytes this connection holds, every gauge together."""
        return self._held

    @property
    def limits(self) -> BudgetLimits:
        return self._budget.limits

    def gauge(self, kind: str) -> int:
        """Bytes held under ``kind``."""
        return self._gauges.get(kind, 0)

    def gauges(self) -> dict[str, int]:
        return {k: v for k, v in self._gauges.items() if v}

    def available(self) -> int:
        """Bytes a ``try_hold`` could add now (the tightest of the three shares)."""
        b = self._budget
        return max(0, min(b.limits.connection - self._held,
                          b.limits.principal - b.used_by(self.principal),
                          b.limits.total - b.used))  # fmt: skip

    def fits_own(self, kind: str, nbytes: int) -> bool:
        """Whether gauge ``kind`` at ``nbytes`` fits this connection's and its principal's
        shares, whatever the hub's total: if it does, what is in the way is held by others
        (or by this connection's own draining gauges), and the bytes may be waited for."""
        delta = nbytes - self._gauges.get(kind, 0)
        limits, b = self._budget.limits, self._budget
        return delta <= 0 or (self._held + delta <= limits.connection
                              and b.used_by(self.principal) + delta <= limits.principal)

    def on_release(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` once, soon after bytes are next returned anywhere in the hub (replacing
        an earlier wish of this connection; dropped when it closes)."""
        if not self.closed:
            self._budget._waiters[self] = wake

    def try_hold(self, kind: str, nbytes: int) -> bool:
        """Set gauge ``kind`` to ``nbytes`` if that fits every share; else refuse, change
        nothing, and return False. Lowering a gauge always succeeds."""
        if self.closed:
            return nbytes <= 0
        delta = nbytes - self._gauges.get(kind, 0)
        if not self._budget._fits(self.principal, self._held, delta):
            self._budget.refused += 1
            return False
        self._set(kind, nbytes, delta)
        return True

    def hold(self, kind: str, nbytes: int) -> None:
        """Set gauge ``kind`` to ``nbytes`` whatever the shares (bytes already in memory)."""
        if not self.closed:
            self._set(kind, nbytes, nbytes - self._gauges.get(kind, 0))

    def release(self, kind: str) -> None:
        """Gauge ``kind`` back to zero."""
        self.hold(kind, 0)

    def rebind(self, principal: str) -> None:
        """The connection authenticated as ``principal``: move its holdings there."""
        if principal == self.principal:
            return
        self._budget._add(self.principal, -self._held)
        self.principal = principal
        self._budget._add(principal, self._held)

    def spend(self, seconds: float) -> float:
        """``seconds`` of loop time spent on this connection's behalf, charged to its
        principal: how long the connection should now wait (0: go on; :mod:`.fairness`)."""
        return self._budget.loop.spend(self.principal, seconds)

    def wait(self) -> float:
        """How long this connection should wait before its next work (0: go on), charging
        nothing."""
        return self._budget.loop.delay(self.principal)

    def close(self) -> None:
        """The connection ended: return everything it held. Idempotent."""
        if self.closed:
            return
        self._budget._add(self.principal, -self._held)
        self._gauges.clear()
        self._held = 0
        self.closed = True
        self._budget._forget(self)

    def _set(self, kind: str, nbytes: int, delta: int) -> None:
        if nbytes < 0:
            raise ValueError(f"gauge {kind!r}: {nbytes} bytes")
        if nbytes:
            self._gauges[kind] = nbytes
        else:
            self._gauges.pop(kind, None)
        self._held += delta
        self._budget._add(self.principal, delta)

    def __repr__(self) -> str:
        return f"<Share {self.principal} {self.label} {self._held}B {self._gauges}>"
