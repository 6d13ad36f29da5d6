"""Retention per stream on JetStream: tidewire's own limits, applied by purging whole records.

The shard streams have no limits of their own (one JetStream stream holds many tidewire
streams, each with its own ``retention_bytes``/``retention_ms``, docs/log.md). Any gateway may
run :func:`enforce`: for each stream over its limits it finds, by binary search on the records'
``Tw-Sum`` (cumulative bytes, running newest timestamp), the first record to keep, and purges
the subject below it (``$JS.API.STREAM.PURGE.TW_<k>`` with ``filter`` and ``seq``). Purges are
idempotent, so gateways running it at once do no harm. The rule is the embedded log's, with
records for segments: drop the oldest while the rest still holds ``retention_bytes``, or while
it is older than ``retention_ms``; the last record always stays.

The limits of a stream are the configuration's (``[log.streams."<name>"]``, ``[log]``'s
defaults) unless it has a runtime retention (set through the admin API: its administration
entry, kept in the cluster beside its records, :mod:`.subjects`), which every gateway's pass
then applies in their place: :func:`settings_for`.
"""

from __future__ import annotations

import logging

from ..log import LogConfig, StreamSettings
from ..log.admin import apply_override
from .catalog import Catalog, Head, RecordPoint
from .jsapi import Api
from .jsread import seek

__all__ = ["enforce", "settings_for", "targets"]

log = logging.getLogger(__name__)


def targets(head: Head, settings: StreamSettings, now_ms: int) -> tuple[int | None, int | None]:
    """What the first kept record must reach: (bytes through it, its running newest
    timestamp); ``None`` for a limit that is unset or removes nothing. Pure."""
    last, first = head.last, head.first
    if last is None:
        return None, None
    by_bytes = by_age = None
    if settings.retention_bytes is not None:
        base = first.sum.bytes_before if first is not None else 0
        if last.sum.bytes_through - base > settings.retention_bytes:
            # keep from the first record r with bytes_through(last) - bytes_through(r) <
            # retention_bytes: dropping r would leave less than the limit.
            by_bytes = last.sum.bytes_through - settings.retention_bytes + 1
    if settings.retention_ms is not None:
        cutoff = now_ms - settings.retention_ms
        if first is None or first.sum.max_ts < cutoff:
            by_age = cutoff  # keep from the first record whose running newest is not too old
    return by_bytes, by_age


def settings_for(config: LogConfig, head: Head) -> StreamSettings:
    """The stream's settings: the configuration's, with its runtime retention in place of the
    configuration's retention when it has one. Pure."""
    return apply_override(config.for_stream(head.name), head.runtime)


async def enforce(api: Api, catalog: Catalog, config: LogConfig, now_ms: int) -> int:
    """Apply every known stream's retention (:func:`settings_for`) at ``now_ms``; return how
    many records were purged."""
    removed = 0
    for head in list(catalog.heads.values()):
        settings = settings_for(config, head)
        if settings.retention_bytes is None and settings.retention_ms is None:
            continue
        removed += await _enforce_one(api, catalog, head, settings, now_ms)
    return removed


async def _enforce_one(
    api: Api, catalog: Catalog, head: Head, settings: StreamSettings, now_ms: int
) -> int:
    if head.last is not None and head.first is None:
        first = await api.direct_get(head.jetstream, {"seq": 0, "next_by_subj": head.subject})
        if first is not None:
            catalog.trimmed(head.name, RecordPoint.of(first))
    by_bytes, by_age = targets(head, settings, now_ms)
    if head.last is None or (by_bytes is None and by_age is None):
        return 0
    last_seq = head.last.seq
    keeps: list[int] = []  # per limit, the first record it keeps (the last one at most)
    if by_bytes is not None:
        found = await seek(api, head, lambda r: r.sum.bytes_through, by_bytes)
        keeps.append(found.seq if found is not None else last_seq)
    if by_age is not None:
        found = await seek(api, head, lambda r: r.sum.max_ts, by_age)
        keeps.append(found.seq if found is not None else last_seq)
    keep = min(max(keeps), last_seq)  # a record goes when either limit drops it
    if head.first is not None and keep <= head.first.seq:
        return 0
    answer = await api.call(f"$JS.API.STREAM.PURGE.{head.jetstream}",
                            {"filter": head.subject, "seq": keep})  # fmt: skip
    purged = int(answer.get("purged", 0))
    kept = await api.direct_get(head.jetstream, {"seq": keep, "next_by_subj": head.subject})
    if kept is not None:
        catalog.trimmed(head.name, RecordPoint.of(kept), purged)
    if purged:
        log.info("retention: stream %r drops %d records (below message %d of %s)",
                 head.name, purged, keep, head.jetstream)  # fmt: skip
    return purged
