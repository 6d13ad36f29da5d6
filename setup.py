"""Builds tidewire's compiled kernels (docs/native.md); everything else is in pyproject.toml.

``pip install -e .`` (what ``./tw`` runs) calls this: the Cython kernels in
``src/tidewire/native/*.pyx`` become C extensions beside the pure-Python package. Pure Python is
always a complete install: ``TIDEWIRE_PURE=1`` at build time builds nothing, and a missing
Cython or a compiler that fails leaves a pure install with a warning instead of failing it
(``tidewire --version`` then says "pure Python"). For a build in the work tree:
``python setup.py build_ext --inplace``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNELS = [Extension("tidewire.native._kernels", ["src/tidewire/native/_kernels.pyx"])]


def warn(message: str) -> None:
    print(f"warning: tidewire: {message}; installing pure Python (slower, same behaviour)",
          file=sys.stderr)  # fmt: skip


class OptionalBuildExt(build_ext):
    """``build_ext`` where a failed compile is a warning: the pure modules are the fallback."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # (distutils raises several unrelated types here)
            warn(f"the compiled kernels did not build ({exc})")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            warn(f"{ext.name} did not build ({exc})")


def extensions() -> list[Any]:
    """The kernels to build: none with ``TIDEWIRE_PURE`` set, or without Cython."""
    if os.environ.get("TIDEWIRE_PURE", "") not in ("", "0"):
        warn("TIDEWIRE_PURE is set")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        warn("Cython is not installed")
        return []
    try:
        return list(cythonize(KERNELS, compiler_directives={"language_level": 3}, quiet=True))
    except Exception as exc:  # (a .pyx that does not translate)
        warn(f"Cython failed ({exc})")
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
