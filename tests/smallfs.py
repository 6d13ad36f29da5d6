"""A small, real file system for the disk-full tests: a tmpfs of a few MiB (and, if asked, a few
inodes) mounted in a mount namespace of its own, held open by a child process.

The holder is ``unshare --mount sh -c 'mount -t tmpfs ... && exec cat'`` (as root), else
``unshare --user --map-root-user --mount ...`` (an unprivileged user namespace). ``cat`` reads a
pipe this process holds, so the holder ends when :meth:`SmallFs.stop` closes it, or when this
process dies: nothing is left mounted anywhere. The mount is private to that namespace; this
process, and any child it starts (a hub, a crash child), reaches it through the holder's root,
``/proc/<holder pid>/root/<mountpoint>`` (:attr:`SmallFs.root`), which outlives any one of them:
a hub restarted on it finds its data.

:meth:`SmallFs.fill` writes a ballast file until the file system refuses (``ENOSPC``), and
:meth:`SmallFs.free` deletes it: space comes back at once. :meth:`SmallFs.start` raises
:class:`Unavailable`, with the reason, where neither mount namespaces as root nor user
namespaces work.
"""

from __future__ import annotations

import errno
import os
import selectors
import shutil
import subprocess
from pathlib import Path

START_SECONDS = 10.0
_CHUNK = bytes(64 * 1024)

__all__ = ["SmallFs", "Unavailable"]


class Unavailable(Exception):
    """No way to mount a private tmpfs here (the reason is the message)."""


class SmallFs:
    def __init__(self, mountpoint: Path, size: int, *, inodes: int | None = None) -> None:
        self.mountpoint = mountpoint.resolve()
        self.size = size
        self.inodes = inodes
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> SmallFs:
        """Mount the tmpfs; :class:`Unavailable` if no way works here."""
        missing = [tool for tool in ("unshare", "mount") if shutil.which(tool) is None]
        if missing:
            raise Unavailable(f"{', '.join(missing)} not found")
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        ways = [["unshare", "--mount"]] if os.geteuid() == 0 else []
        ways.append(["unshare", "--user", "--map-root-user", "--mount"])
        options = f"size={self.size},mode=0755"
        if self.inodes is not None:
            options += f",nr_inodes={self.inodes}"
        script = 'mount -t tmpfs -o "$1" tidewire-test "$2" && echo mounted && exec cat'
        reasons: list[str] = []
        for way in ways:
            proc = subprocess.Popen(
                [*way, "--propagation", "private", "sh", "-c", script, "sh", options,
                 str(self.mountpoint)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            if _first_line(proc) == b"mounted\n":
                self.proc = proc
                return self
            error = _end(proc)
            reasons.append(f"{' '.join(way)}: {error or 'no mount'}")
        raise Unavailable("cannot mount a private tmpfs: " + "; ".join(reasons))

    def stop(self) -> None:
        """Unmount (the holder exits, and its namespace with it). Always safe."""
        if self.proc is not None:
            _end(self.proc)
            self.proc = None

    def __enter__(self) -> SmallFs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ using it

    @property
    def root(self) -> Path:
        """The tmpfs, as this process (and its children) reach it."""
        assert self.proc is not None, "not started"
        return Path(f"/proc/{self.proc.pid}/root{self.mountpoint}")

    def available(self) -> int:
        """Bytes still free."""
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def inodes_free(self) -> int:
        return os.statvfs(self.root).f_favail

    def fill(self, name: str = "ballast", *, leave: int = 0) -> int:
        """Write zeros to the file ``name`` until ``leave`` bytes or fewer are free (with
        ``leave=0``: until the file system refuses); the bytes written. Others writing at the
        same time may take some of the space; what is left is never more than ``leave``."""
        written = 0
        fd = os.open(self.root / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for _ in range(self.size // len(_CHUNK) + 64):  # bounded: the size, in chunks
                room = self.available() - leave
                if room <= 0:
                    break
                try:
                    n = os.write(fd, _CHUNK[: min(len(_CHUNK), room)])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                written += n
        finally:
            os.close(fd)
        return written

    def fill_inodes(self, prefix: str = "inode-ballast", *, leave: int = 0) -> int:
        """Create empty files until ``leave`` inodes or fewer are free; how many."""
        made = 0
        for i in range((self.inodes or 0) + 64):
            if self.inodes_free() <= leave:
                break
            try:
                os.close(os.open(self.root / f"{prefix}-{i}", os.O_WRONLY | os.O_CREAT, 0o644))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
            made += 1
        return made

    def free(self, name: str = "ballast") -> None:
        """Delete the ballast file ``name`` (and any ``name-<n>`` files): its space is back."""
        for path in [self.root / name, *self.root.glob(f"{name}-*")]:
            path.unlink(missing_ok=True)


def _first_line(proc: subprocess.Popen[bytes]) -> bytes:
    """The holder's first line of output, within ``START_SECONDS`` (b"" if none)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(START_SECONDS):
            return b""
    return proc.stdout.readline()


def _end(proc: subprocess.Popen[bytes]) -> str:
    """Stop the holder (or a failed start); what it said on stderr."""
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()  # cat reads end of file and exits
    try:
        proc.wait(timeout=START_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=START_SECONDS)
    error = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return error
