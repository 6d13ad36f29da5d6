"""The one place that decides whether tidewire runs its compiled kernels (docs/native.md).

The hot loops over a batch's elements and bytes have two implementations: the pure-Python
functions in their own modules (``runs.envelope_frames_py``, ...), which are the specification
and the fallback, and the typed Cython kernels in ``tidewire/native/_kernels.pyx``, built by
``setup.py`` during the normal install. A module exports the chosen one under the public name
with :func:`kernel`, so its callers never know which runs.

The kernels are used unless ``TIDEWIRE_PURE`` is set to anything but ``""``/``"0"`` when
tidewire is imported (aiohttp's and yarl's ``*_NO_EXTENSIONS`` pattern), or they were not built
(``TIDEWIRE_PURE=1`` at install time, or no compiler: ``setup.py`` then warns and installs pure
Python). :data:`COMPILED` says which; ``tidewire --version`` and ``tidewire serve``'s log show it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

__all__ = [
    "COMPILED",
    "MMAP_THRESHOLD",
    "PURE_ENV",
    "PURE_REQUESTED",
    "TRIM_THRESHOLD",
    "describe",
    "kernel",
    "tune_allocator",
]

PURE_ENV = "TIDEWIRE_PURE"
"""The environment variable that asks for pure Python (read once, at import)."""

PURE_REQUESTED = os.environ.get(PURE_ENV, "") not in ("", "0")
"""Whether ``TIDEWIRE_PURE`` asked for the pure-Python implementations."""


def _load() -> ModuleType | None:
    """The compiled kernels' module, or ``None`` when pure Python was asked for or the
    extension is not built (an ``ImportError`` of the extension itself and nothing else)."""
    if PURE_REQUESTED:
        return None
    name = f"{__name__}._kernels"
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if exc.name != name:  # a broken build, not an absent one: say so
            raise
        return None


_KERNELS = _load()

COMPILED: bool = _KERNELS is not None
"""Whether the compiled kernels are in use (every :func:`kernel` then returns one)."""

F = TypeVar("F", bound=Callable[..., Any])


def kernel(name: str, fallback: F) -> F:
    """The compiled kernel ``name`` when :data:`COMPILED`, else ``fallback``: its pure-Python
    twin, which is the specification (same signature, same results byte for byte, same
    exceptions for what it refuses; tests/native checks that). ``AttributeError`` for a name
    the built extension lacks (a stale build: rebuild it)."""
    if _KERNELS is None:
        return fallback
    found: F = getattr(_KERNELS, name)
    return found


def describe() -> str:
    """One line for logs and ``--version``: which implementation runs, and why."""
    if COMPILED:
        return "native kernels: compiled (Cython)"
    if PURE_REQUESTED:
        return f"native kernels: pure Python ({PURE_ENV} is set)"
    return "native kernels: pure Python (the extension is not built)"


MMAP_THRESHOLD = 32 << 20
"""Blocks below this come from malloc's heap, not a fresh ``mmap`` each (see tune_allocator)."""

TRIM_THRESHOLD = 64 << 20
"""Free memory at the heap's top above this goes back to the kernel (see tune_allocator)."""

_M_TRIM_THRESHOLD = -1  # (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3


def tune_allocator() -> bool:
    """Keep glibc's malloc from mapping and unmapping every transient buffer of 128 KiB or more
    (its default, adapted upwards only by frees): every such buffer (a 1 MiB record of 16 x 64
    KiB values, the frames that carry it) then page-faults in again on every call, ~2 us a
    page here, 5-22x the copy itself (docs/native.md). With ``mallopt`` the process serves
    blocks below :data:`MMAP_THRESHOLD` from its heap and keeps at most
    :data:`TRIM_THRESHOLD` of free heap top mapped, so RSS stays bounded by what is live plus
    that. For the hub's process (``tidewire serve`` calls it first); a library should not
    change its host's allocator, so the clients do not. Returns whether it applied (glibc
    only: elsewhere, and on a failing ``mallopt``, nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # (here: only the hub's process pays for loading it)

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # (musl has no mallopt worth the name)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
