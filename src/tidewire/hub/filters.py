"""Event filters applied on delivery (per-event work, paid only by subscriptions that ask)."""

from __future__ import annotations

from ..model import Batch

__all__ = ["filter_key"]


def filter_key(batch: Batch, key: bytes) -> Batch | None:
    """The events of ``batch`` whose key is ``key``, or ``None`` if there are none."""
    if batch.key_flags is None:
        return None
    keep = [i for i in range(len(batch)) if batch.key_flags[i] and batch.key(i) == key]
    if not keep:
        return None
    if len(keep) == len(batch):
        return batch
    return Batch.build(
        batch.stream,
        [batch.value(i) for i in keep],
        ids=[batch.ids[i] for i in keep],
        keys=[key] * len(keep),
        timestamps=[batch.timestamps[i] for i in keep],
    )
