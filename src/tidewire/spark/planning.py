"""Offsets and partitions of the ``tidewire`` Spark data source: pure Python, no JVM, no
network (the hubs' answers come in as :class:`StreamInfo`, a time lookup as a function), so it
is unit-tested fast. The options are parsed in :mod:`.options`, admission control is in
:mod:`.limits`; both are re-exported here.

Offsets follow the conventions of Spark's Kafka source, with a stream in place of a topic
partition and an event id in place of an offset:

* an offset is the **next id** to read: ``{"orders": 1201}`` means "ids up to 1200 are done";
  a range is ``[start, end)``;
* ``startingOffsets``: ``"earliest"`` (the first retained id), ``"latest"`` (only what comes
  next) or JSON ``{"stream": id}`` where ``-2`` means earliest and ``-1`` latest. Defaults:
  ``earliest`` for batch reads, ``latest`` for streaming (as Kafka);
* ``endingOffsets`` (batch reads only): ``"latest"`` or JSON ``{"stream": id}`` (exclusive;
  ``-1`` = latest). Default ``latest``;
* by time, with Spark's precedence: ``startingTimestamp`` (one time for every stream) over
  ``startingOffsetsByTimestamp`` (JSON ``{"stream": ms}``) over ``startingOffsets``; likewise
  ``endingTimestamp`` over ``endingOffsetsByTimestamp`` over ``endingOffsets``. A time becomes
  the first id whose timestamp is ``>= ms`` (the hub's time index); when a stream has none, a
  start follows ``startingOffsetsByTimestampStrategy`` (``error``, or ``latest``) and an end is
  latest.

Ids may have gaps (a stream written with its own ids), so an id range bounds the number of
events from above: limiting a trigger's id span to N (``maxOffsetsPerTrigger``) reads at most N.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from ..model import TidewireError
from .limits import cap_offsets, delay_batch, duration_ms
from .options import (
    BATCH_ROWS,
    EARLIEST,
    LATEST,
    MAX_TRIGGER_DELAY_MS,
    OptionError,
    Options,
    match_streams,
    offsets_spec,
    parse_options,
)

__all__ = [
    "BATCH_ROWS",
    "EARLIEST",
    "LATEST",
    "MAX_TRIGGER_DELAY_MS",
    "DataLossSparkError",
    "OptionError",
    "Options",
    "Range",
    "StreamInfo",
    "TimeLookup",
    "cap_offsets",
    "check_data_loss",
    "delay_batch",
    "duration_ms",
    "ending_offsets",
    "latest_offsets",
    "match_streams",
    "parse_options",
    "split_ranges",
    "spread",
    "starting_offsets",
    "stream_names",
]

TimeLookup = Callable[[dict[str, int]], dict[str, "int | None"]]
"""Asks the hubs, for each ``{stream: ms}``, the first id whose timestamp is ``>= ms`` (None:
every event is older); :func:`tidewire.spark.hubs.ids_at` over the hubs that hold them."""


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What a hub says of one stream (its ``?streams`` publisher), and which hub it is on."""

    stream: str
    url: str
    exists: bool
    first_id: int | None  # None: empty
    latest_id: int  # 0: none

    @property
    def earliest(self) -> int:
        """The first id a read from "earliest" gets (the next id for an empty stream)."""
        return self.first_id if self.first_id is not None else self.latest_id + 1

    @property
    def next_id(self) -> int:
        return self.latest_id + 1


@dataclass(frozen=True, slots=True)
class Range:
    """Ids ``[start, end)`` of ``stream`` on the hub at ``url``: one input partition."""

    url: str
    stream: str
    start: int
    end: int


def spread(ranges: Sequence[Range], urls: Sequence[str]) -> list[Range]:
    """Gateways: the partitions dealt round robin over ``urls`` (each range's first gateway),
    so that their reads are shared by every gateway."""
    return [replace(r, url=urls[i % len(urls)]) for i, r in enumerate(ranges)]


def stream_names(options: Options, info: Mapping[str, StreamInfo]) -> tuple[str, ...]:
    """The streams a read plans now: ``streams`` as given, or with ``subscribePattern`` those
    found matching it (``info`` holds exactly them)."""
    return options.streams if options.pattern is None else tuple(sorted(info))


def _times(one: int | None, each: Mapping[str, int] | None,
           names: Sequence[str]) -> dict[str, int]:  # fmt: skip
    """``{stream: ms}`` of the streams placed by time: ``one`` for all (``...Timestamp``) wins
    over ``each`` (``...OffsetsByTimestamp``; a stream it leaves out is placed by offsets)."""
    if one is not None:
        return dict.fromkeys(names, one)
    return {name: each[name] for name in names if each and name in each}


def _found(times: Mapping[str, int], info: Mapping[str, StreamInfo],
           lookup: TimeLookup | None, option: str) -> dict[str, int | None]:  # fmt: skip
    """The lookup's ids for the streams that exist (a stream on no hub yet: None)."""
    asked = {name: ms for name, ms in times.items() if info[name].exists}
    if not asked:
        return dict.fromkeys(times)
    if lookup is None:
        raise OptionError(f"option {option!r} needs a hub that can look up times")
    found = lookup(asked)
    return {name: found.get(name) for name in times}


def starting_offsets(options: Options, info: Mapping[str, StreamInfo],
                     lookup: TimeLookup | None = None) -> dict[str, int]:  # fmt: skip
    """The first id to read of each stream (:func:`stream_names`). A stream placed by time
    whose events are all older starts at its end with ``startingOffsetsByTimestampStrategy``
    ``latest``, else fails; one that exists on no hub yet starts at its beginning (every
    event it will get is newer)."""
    names = stream_names(options, info)
    spec = offsets_spec(options.starting, "startingOffsets", names, options.pattern)
    out = {}
    for name, value in spec.items():
        if value == EARLIEST:
            out[name] = info[name].earliest
        elif value == LATEST:
            out[name] = info[name].next_id
        else:
            out[name] = value
    times = _times(options.starting_timestamp, options.starting_by_timestamp, names)
    option = "startingTimestamp" if options.starting_timestamp is not None else (
        "startingOffsetsByTimestamp")  # fmt: skip
    for name, found in _found(times, info, lookup, option).items():
        if found is not None:
            out[name] = found
        elif not info[name].exists:
            out[name] = info[name].earliest
        elif options.latest_when_no_time:
            out[name] = info[name].next_id
        else:
            raise OptionError(f"option {option!r}: stream {name!r} has no event at or after "
                              f"{times[name]} ms (all are older, or it is empty); set "
                              "startingOffsetsByTimestampStrategy=latest to start at its "
                              "end")  # fmt: skip
    return out


def ending_offsets(options: Options, info: Mapping[str, StreamInfo],
                   lookup: TimeLookup | None = None) -> dict[str, int]:  # fmt: skip
    """The id each stream's batch read stops before; by time, the first id at or after the
    time (exclusive), or latest if every event is older (as Spark's Kafka source)."""
    names = stream_names(options, info)
    spec = offsets_spec(options.ending, "endingOffsets", names, options.pattern)
    out = {}
    for name, value in spec.items():
        if value == EARLIEST:
            raise OptionError("option 'endingOffsets' cannot be earliest (-2)")
        out[name] = info[name].next_id if value == LATEST else value
    times = _times(options.ending_timestamp, options.ending_by_timestamp, names)
    option = "endingTimestamp" if options.ending_timestamp is not None else (
        "endingOffsetsByTimestamp")  # fmt: skip
    for name, found in _found(times, info, lookup, option).items():
        out[name] = info[name].next_id if found is None else found
    return out


def latest_offsets(info: Mapping[str, StreamInfo], streams: Sequence[str]) -> dict[str, int]:
    return {name: info[name].next_id for name in streams}


def check_data_loss(
    start: Mapping[str, int], info: Mapping[str, StreamInfo], *, fail: bool
) -> tuple[dict[str, int], list[str]]:
    """Starts moved up to what retention kept (with ``fail=False``), and a message for each
    stream whose start was trimmed; with ``fail=True`` such a stream raises instead."""
    out = dict(start)
    lost = []
    for name, first in start.items():
        kept = info[name].first_id
        if kept is not None and first < kept:
            message = (f"stream {name!r}: ids {first}..{kept - 1} were removed by retention "
                       "before they were read")  # fmt: skip
            if fail:
                raise DataLossSparkError(
                    message + "; set failOnDataLoss=false to skip them and go on"
                )
            out[name] = kept
            lost.append(message)
    return out, lost


class DataLossSparkError(TidewireError, RuntimeError):
    """Events a query had not read yet were removed by retention (``failOnDataLoss``)."""


def split_ranges(
    start: Mapping[str, int],
    end: Mapping[str, int],
    info: Mapping[str, StreamInfo],
    *,
    events_per_partition: int,
    min_partitions: int = 1,
) -> list[Range]:
    """Each stream's ``[start, end)`` cut into partitions of at most ``events_per_partition``
    ids, and into at least ``min_partitions`` partitions in all (big ranges cut first), so
    that several executors read in parallel."""
    spans = {name: end[name] - start[name] for name in start if end.get(name, 0) > start[name]}
    if not spans:
        return []
    total = sum(spans.values())
    pieces = {name: max(1, math.ceil(span / events_per_partition)) for name, span in spans.items()}
    while sum(pieces.values()) < min_partitions:
        name = max(pieces, key=lambda n: (spans[n] / pieces[n], n))
        if spans[name] <= pieces[name]:
            break  # no range can be cut finer than one id
        pieces[name] += 1
    out = []
    for name in sorted(spans):
        count, first = pieces[name], start[name]
        step, extra = divmod(spans[name], count)
        for i in range(count):
            size = step + (1 if i < extra else 0)
            out.append(Range(info[name].url, name, first, first + size))
            first += size
    assert sum(r.end - r.start for r in out) == total
    return out
