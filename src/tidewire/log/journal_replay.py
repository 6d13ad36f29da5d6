"""Recovery from the write-ahead journal, at :meth:`Log.open` (writable opens only), before the
streams' own recovery scan (docs/log.md, "Recovery").

Every entry after the checkpoint is written again at its place in its segment (idempotent:
bytes already there are left alone); then each stream's active segment is cut to its *durable
end*, the larger of the checkpoint's size for it and the end of its last replayed entry: bytes
beyond were written to the segment by a group whose journal entry never became durable, so
they were never acknowledged. Touched segments are fsynced. Entries for segments that
retention deleted, or for stream directories that no longer exist, are skipped.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field

from .journal import CHECKPOINT_FILES, JOURNAL_DIR, RING_FILE, JournalState, sync_dir
from .journal_codec import Checkpoint, Entry, decode_checkpoint, scan
from .segment import segment_name

__all__ = ["recover", "remove_journal"]

log = logging.getLogger("tidewire.log")


@dataclass(slots=True)
class _Replay:
    data_dir: str
    bases: dict[str, list[int]] = field(default_factory=dict)  # stream dir -> segment bases
    ends: dict[tuple[str, int], int] = field(default_factory=dict)  # (dir, base) -> end
    fds: dict[str, int] = field(default_factory=dict)  # segment path -> fd (to fsync)
    new_dirs: set[str] = field(default_factory=set)
    journaled: set[str] = field(default_factory=set)  # stream dirs with replayed entries
    entries: int = 0
    written: int = 0

    def segment_bases(self, directory: str) -> list[int] | None:
        bases = self.bases.get(directory)
        if bases is None:
            path = os.path.join(self.data_dir, directory)
            if not os.path.isdir(path):
                return None
            bases = self.bases[directory] = sorted(
                int(name[:-4]) for name in os.listdir(path)
                if name.endswith(".log") and name[:-4].isdigit()
            )  # fmt: skip
        return bases

    def fd(self, directory: str, base: int) -> int:
        path = os.path.join(self.data_dir, directory, segment_name(base, ".log"))
        fd = self.fds.get(path)
        if fd is None:
            fd = self.fds[path] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        return fd

    def apply(self, entry: Entry) -> None:
        bases = self.segment_bases(entry.directory)
        if bases is None:
            log.warning("journal replay: no stream directory %r: entry %d skipped",
                        entry.directory, entry.lsn)  # fmt: skip
            return
        if bases and entry.base < bases[0]:
            return  # retention deleted that segment after the entry was written
        if entry.base not in bases:
            bases.append(entry.base)
            bases.sort()
            self.new_dirs.add(entry.directory)
        self.journaled.add(entry.directory)
        fd = self.fd(entry.directory, entry.base)
        end = entry.position + entry.extent
        key = (entry.directory, entry.base)
        self.ends[key] = max(self.ends.get(key, 0), end)
        self.entries += 1
        if entry.synced:
            return  # fsynced in the segment before the entry was written
        if os.pread(fd, entry.extent, entry.position) == entry.payload:
            return
        view, at = entry.payload, entry.position
        while view:
            n = os.pwrite(fd, view, at)
            view, at = view[n:], at + n
        self.written += 1

    def cut(self, cp: Checkpoint) -> None:
        """Cut every stream's active segment to its durable end (see the module)."""
        for name in sorted(os.listdir(self.data_dir)):
            if name.startswith(".") or not os.path.isdir(os.path.join(self.data_dir, name)):
                continue
            bases = self.segment_bases(name)
            if not bases:
                continue
            active = bases[-1]
            if name not in cp.streams and name not in self.journaled:
                # Unknown to the journal (created after the checkpoint and not written since,
                # or put here by hand): the stream's own scan judges it, as without a journal.
                continue
            cp_base, cp_size = cp.streams.get(name, (0, 0))
            if cp_base > active:
                continue  # (not ours to judge: the stream's scan reports it)
            durable = max(cp_size if cp_base == active else 0, self.ends.get((name, active), 0))
            path = os.path.join(self.data_dir, name, segment_name(active, ".log"))
            size = os.path.getsize(path)
            if size > durable:
                log.warning(
                    "recovery: truncating torn tail of %s at byte offset %d (%d bytes dropped: "
                    "written but never acknowledged, their journal entry is not durable)",
                    path, durable, size - durable,
                )  # fmt: skip
                os.truncate(path, durable)
                self.fd(name, active)  # (fsynced below)


def recover(data_dir: str) -> JournalState | None:
    """Replay the journal of ``data_dir`` into its segments; ``None`` if there is none."""
    directory = os.path.join(data_dir, JOURNAL_DIR)
    found: list[Checkpoint] = []
    seen = False
    for name in CHECKPOINT_FILES:
        try:
            with open(os.path.join(directory, name), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            continue
        seen = True
        cp = decode_checkpoint(raw)
        if cp is not None:
            found.append(cp)
    if not found:
        if seen and os.path.exists(os.path.join(directory, RING_FILE)):
            # (the first checkpoint is written before any entry: a crash before it is
            # complete left nothing to replay, but an empty pair after that is damage)
            log.warning("journal: no intact checkpoint in %s: nothing replayed", directory)
        return None
    cp = max(found, key=lambda c: c.seq)
    try:
        with open(os.path.join(directory, RING_FILE), "rb") as f:
            ring = f.read()
    except FileNotFoundError:
        ring = b""
    replay = _Replay(data_dir)
    last = cp.lsn
    try:
        for entry, _ in scan(memoryview(ring), cp.position, cp.lsn + 1, cp.epoch):
            replay.apply(entry)
            last = entry.lsn
        replay.cut(cp)
        for fd in replay.fds.values():
            os.fsync(fd)
    finally:
        for fd in replay.fds.values():
            os.close(fd)
    for name in replay.new_dirs:
        sync_dir(os.path.join(data_dir, name))
    if replay.entries:
        log.info("journal replay: %d entries after checkpoint %d (%d rewritten)",
                 replay.entries, cp.lsn, replay.written)  # fmt: skip
    return JournalState(cp.epoch, last, cp.seq)


def remove_journal(data_dir: str) -> None:
    """Remove the journal (after :func:`recover`), for a log that runs without one: an old
    checkpoint must never judge segments written without the journal."""
    directory = os.path.join(data_dir, JOURNAL_DIR)
    if os.path.isdir(directory):
        shutil.rmtree(directory)
        sync_dir(data_dir)
