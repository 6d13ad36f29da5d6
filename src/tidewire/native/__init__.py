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
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

__all__ = ["COMPILED", "PURE_ENV", "PURE_REQUESTED", "describe", "kernel"]

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
