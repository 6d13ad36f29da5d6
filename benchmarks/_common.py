"""What the benchmarks share: progress output, and where their temporary directories go (a
real disk: fsync on a RAM file system costs nothing, which would flatter every durable write).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["RAM_FILE_SYSTEMS", "choose_base", "fresh_dir", "fs_type", "note"]

RAM_FILE_SYSTEMS = {"tmpfs", "ramfs", "devtmpfs"}


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fs_type(path: str) -> str:
    """The file-system type of the mount holding ``path`` (from /proc/self/mounts)."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        pass
    return kind


def choose_base(requested: str | None) -> str:
    if requested is not None:
        return requested
    if fs_type("/tmp") not in RAM_FILE_SYSTEMS:
        return "/tmp"
    return os.getcwd()


@contextmanager
def fresh_dir(parent: str, prefix: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
