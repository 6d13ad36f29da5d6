"""Which records of a segment this process has checked against their body CRC already.

A segment's committed bytes never change while it is open (a rollback cuts back *to* the
committed size, never below it; recovery runs before a segment is opened for reading), so a
record whose body CRC was checked once needs no second check for the next subscriber that reads
the same mapped pages (docs/log.md, "Reads": **decision**, once per process, not per read).

The knowledge is kept as a few runs of byte positions, ``[start, stop)``, each a stretch of
consecutive records all checked: a reader going through a segment in order extends one run
record by record, so a fan-out of subscribers replaying the same stretch checks each record once.
At most :data:`MAX_RUNS` runs are kept (when a new one would pass that, the shortest is
forgotten: its records are checked again when read), so the memory is a few tuples per segment,
whatever the number of records or readers.

Thread safety without a lock: the runs are one tuple, replaced whole. A read in a worker thread
and one on the event loop may race; the loser's update is lost (its records are checked again
at their next read), and every run ever stored covers only records some reader checked, so a
race never marks a record that was not checked.
"""

from __future__ import annotations

__all__ = ["MAX_RUNS", "VerifiedRuns"]

MAX_RUNS = 4


class VerifiedRuns:
    """The stretches of a segment whose records' body CRCs were checked (see the module)."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: tuple[tuple[int, int], ...] = ()

    @property
    def runs(self) -> tuple[tuple[int, int], ...]:
        """The runs ``(start, stop)``, in no particular order, at most :data:`MAX_RUNS`."""
        return self._runs

    def covers(self, start: int, stop: int) -> bool:
        """Whether every byte of ``[start, stop)`` lies in one checked run."""
        return any(a <= start and stop <= b for a, b in self._runs)

    def add(self, start: int, stop: int) -> None:
        """Record that the record at ``[start, stop)`` was checked (it extends a run that ends
        at ``start`` or begins at ``stop``, joining two when it fills the gap between them)."""
        runs = list(self._runs)
        lo, hi = start, stop
        kept: list[tuple[int, int]] = []
        for a, b in runs:
            if b >= lo and a <= hi:  # touching or overlapping: one run
                lo, hi = min(a, lo), max(b, hi)
            else:
                kept.append((a, b))
        kept.append((lo, hi))
        if len(kept) > MAX_RUNS:
            kept.remove(min(kept, key=lambda run: run[1] - run[0]))
        self._runs = tuple(kept)
