"""Tube's deflate (seed 001's compression id 1, zlib format) as this side decides to use it:
``deflate`` for ``compression="always"``, :func:`deflated_if_it_pays` for ``"smart"``.

"smart" deflates a message of at least ``SMART_MIN_BYTES`` and sends the result only when it
shrinks the message by an eighth. Deflating a whole large message to find it does not pay
costs what deflating it costs (level 1 on this project's machine: 1 MiB of random bytes took
about 20 ms, so a hub sending 1 MiB incompressible values over Tube ran at 44 MB/s, nearly all
of it in deflate, issue 22). So a message of ``PROBE_FROM`` bytes or more is probed first: its
first ``PROBE_BYTES`` are deflated on their own and, when they do not shrink by an eighth, the
message goes plain without deflating the rest (**decision**: a message whose start does not
compress but whose whole would is sent plain; the wire bytes of any other message are those
of deflating it whole, as before). Pure: no I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

__all__ = ["PROBE_BYTES", "PROBE_FROM", "SMART_MIN_BYTES", "deflate", "deflated_if_it_pays"]

SMART_MIN_BYTES = 256  # smaller messages are never deflated by "smart"
PROBE_FROM = 64 * 1024  # messages this large are probed before they are deflated whole
PROBE_BYTES = 16 * 1024  # the probe: this many bytes from the message's start


def deflate(views: Sequence[memoryview]) -> bytes:
    """The zlib stream (level 1: fast, docs/protocols/tube.md) of the views back to back: the
    same bytes as ``zlib.compress(join, 1)``, without the join."""
    deflater = zlib.compressobj(1)
    return b"".join([*map(deflater.compress, views), deflater.flush()])


def _pays(packed: int, size: int) -> bool:
    return packed <= size - size // 8


def deflated_if_it_pays(views: Sequence[memoryview], total: int) -> bytes | None:
    """:func:`deflate` of the ``total`` bytes of ``views`` when that shrinks them by an eighth,
    else ``None`` (send them plain); ``None`` at once under ``SMART_MIN_BYTES``, and from
    ``PROBE_FROM`` bytes on when the first ``PROBE_BYTES`` alone do not shrink by an eighth."""
    if total < SMART_MIN_BYTES:
        return None
    if total >= PROBE_FROM:
        probe, left = [], PROBE_BYTES
        for view in views:
            if not left:
                break
            probe.append(view[:left])
            left -= probe[-1].nbytes
        if not _pays(len(deflate(probe)), PROBE_BYTES):
            return None
    packed = deflate(views)
    return packed if _pays(len(packed), total) else None
