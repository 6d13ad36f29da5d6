"""Ids at times (issue 23), for :meth:`RsioClient.ids_at <tidewire.client.rsio.RsioClient.ids_at>`
and the clients that wrap it: the hub publisher asked (``?times=``, docs/protocols/rsio.md) and
the answer made from its JSON rows. (The HTTP carrier serves no hub publisher: no listing, so no
``ids_at`` either.)"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from ..model import MAX_ID, TidewireError, validate_stream_name
from ..protocols.rsio.names import HubPublisher

__all__ = ["ids_from_rows", "times_publisher"]


def times_publisher(times: Mapping[str, int]) -> HubPublisher:
    """The publisher ``?times=...`` asking for every ``stream: ms`` of ``times``;
    :class:`ValueError` for a time outside 0..2**63-1 or a bad stream name."""
    for stream, ms in times.items():
        validate_stream_name(stream)
        if isinstance(ms, bool) or not isinstance(ms, int) or not 0 <= ms <= MAX_ID:
            raise ValueError(f"the time of {stream!r} must be 0..2**63-1 ms, not {ms!r}")
    return HubPublisher(times=tuple(times.items()))


def ids_from_rows(times: Mapping[str, int], elements: Iterable[bytes]) -> dict[str, int | None]:
    """``{stream: id | None}`` for every stream of ``times`` from the rows the hub sent; a
    :class:`TidewireError` naming the streams it did not answer for (a principal that may not
    read them gets no row) or a row that is not what was asked."""
    answer: dict[str, int | None] = {}
    for element in elements:
        row = json.loads(element)
        stream, found = row.get("stream"), row.get("id")
        if stream not in times or row.get("time") != times[stream]:
            raise TidewireError(f"the hub answered ?times= with a row not asked for: {row!r}")
        if found is not None and (isinstance(found, bool) or not isinstance(found, int)):
            raise TidewireError(f"the hub answered ?times= with a bad id: {row!r}")
        answer[stream] = found
    missing = [s for s in times if s not in answer]
    if missing:
        raise TidewireError(f"no answer for the time of {', '.join(map(repr, missing))}: "
                            "not readable by this principal?")  # fmt: skip
    return answer
