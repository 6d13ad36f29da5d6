"""The PySpark data source, format ``tidewire`` (needs the ``spark`` extra).

``tidewire.spark.register(spark)`` registers it; see :mod:`tidewire.spark.source` and
docs/spark.md."""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the data source with ``spark`` (imports PySpark only now)."""
    from .source import register as _register

    _register(spark)
