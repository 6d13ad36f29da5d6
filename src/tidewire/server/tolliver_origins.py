"""Which events came from which Tolliver remote, so that the hub never delivers a message back
to the instance it came from (no echo: docs/protocols/tolliver.md, "Echo and loops")."""

from __future__ import annotations

import bisect
import uuid

__all__ = ["MAX_ORIGIN_RANGES", "Origins", "within"]

MAX_ORIGIN_RANGES = 256  # per remote and channel: runs of event ids it sent, not echoed to it
MAX_EVENT_ID = 2**63 - 1


class Origins:
    """Which events came from which remote, so that none is delivered back to it (no echo):
    per (remote, stream), runs ``(first, last)`` of event ids, ascending. Bounded: at most
    ``MAX_ORIGIN_RANGES`` runs per remote and stream (the oldest forgotten first), and runs
    below the remote's offset are dropped (:meth:`passed`: nothing below it is delivered
    again). In memory: a restart forgets them (docs/protocols/tolliver.md, "Echo and
    loops")."""

    def __init__(self) -> None:
        self._runs: dict[tuple[uuid.UUID, str], list[tuple[int, int]]] = {}

    def __len__(self) -> int:
        """How many (remote, stream) pairs have runs (for tests and the soak's bounds)."""
        return len(self._runs)

    def came(self, peer: uuid.UUID, stream: str, first: int, last: int) -> None:
        """Events ``first..last`` of ``stream`` are messages from ``peer``."""
        runs = self._runs.setdefault((peer, stream), [])
        if runs and runs[-1][1] + 1 == first:
            runs[-1] = (runs[-1][0], last)  # (a remote sending alone: one run)
        else:
            runs.append((first, last))
            if len(runs) > MAX_ORIGIN_RANGES:
                del runs[0]

    def of(self, peer: uuid.UUID, stream: str) -> list[tuple[int, int]] | None:
        """``peer``'s runs in ``stream`` (``None``: none; see :func:`within`)."""
        return self._runs.get((peer, stream))

    def forget(self, peer: uuid.UUID, stream: str) -> None:
        """``peer`` no longer follows ``stream``: its runs there are dropped."""
        self._runs.pop((peer, stream), None)

    def passed(self, peer: uuid.UUID, stream: str, next_id: int) -> None:
        """``peer`` will never be delivered an event of ``stream`` below ``next_id`` again."""
        runs = self._runs.get((peer, stream))
        if runs is not None:
            while runs and runs[0][1] < next_id:
                del runs[0]
            if not runs:
                del self._runs[(peer, stream)]


def within(ranges: list[tuple[int, int]], event_id: int) -> bool:
    """Whether ``event_id`` is in one of ``ranges`` (sorted, disjoint, inclusive)."""
    at = bisect.bisect_right(ranges, (event_id, MAX_EVENT_ID)) - 1
    return at >= 0 and ranges[at][1] >= event_id
