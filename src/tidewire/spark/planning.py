"""Options, offsets and partitions of the ``tidewire`` Spark data source: pure Python, no JVM,
no network (the hubs' answers come in as :class:`StreamInfo`), so it is unit-tested fast.

Offsets follow the conventions of Spark's Kafka source, with a stream in place of a topic
partition and an event id in place of an offset:

* an offset is the **next id** to read: ``{"orders": 1201}`` means "ids up to 1200 are done";
  a range is ``[start, end)``;
* ``startingOffsets``: ``"earliest"`` (the first retained id), ``"latest"`` (only what comes
  next) or JSON ``{"stream": id}`` where ``-2`` means earliest and ``-1`` latest. Defaults:
  ``earliest`` for batch reads, ``latest`` for streaming (as Kafka);
* ``endingOffsets`` (batch reads only): ``"latest"`` or JSON ``{"stream": id}`` (exclusive;
  ``-1`` = latest). Default ``latest``.

Ids may have gaps (a stream written with its own ids), so an id range bounds the number of
events from above: limiting a trigger's id span to N (``maxEventsPerTrigger``) reads at most N.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..client.reconnect import gateway_urls
from ..model import MAX_ID, InvalidStreamName, TidewireError, validate_stream_name

__all__ = [
    "BATCH_ROWS",
    "EARLIEST",
    "LATEST",
    "OptionError",
    "Options",
    "Range",
    "StreamInfo",
    "cap_offsets",
    "check_data_loss",
    "ending_offsets",
    "latest_offsets",
    "parse_options",
    "split_ranges",
    "spread",
    "starting_offsets",
]

EARLIEST = -2
LATEST = -1
BATCH_ROWS = 65536
"""The option ``batchRows``'s default: the rows per Arrow batch a read hands Spark, at least
(whole hub records are combined until they reach it; 1 hands each record on as it came)."""


class OptionError(TidewireError, ValueError):
    """An option of the ``tidewire`` data source that is missing or wrong."""


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


@dataclass(frozen=True, slots=True)
class Options:
    urls: tuple[str, ...]
    streams: tuple[str, ...]  # to read; empty when only writing with a stream column
    starting: str  # "earliest", "latest" or JSON
    ending: str
    max_events_per_trigger: int | None
    fail_on_data_loss: bool
    events_per_partition: int
    min_partitions: int
    stream: str | None  # writing: the target stream when rows have no ``stream`` column
    prefetch: int
    gateways: bool = False  # every URL serves every stream (option 'gateways'), not one hub each
    batch_rows: int = BATCH_ROWS  # reading: the hub's records gathered into Arrow batches
    tune_allocator: bool = True  # reading: glibc's malloc keeps big buffers (docs/spark.md)


_KNOWN = {
    "url", "gateways", "streams", "stream", "startingoffsets", "endingoffsets",
    "maxeventspertrigger", "failondataloss", "eventsperpartition", "minpartitions", "prefetch",
    "batchrows", "tuneallocator",
}  # fmt: skip
_SPARKS = {"path", "checkpointlocation", "queryname"}  # Spark's own, passed to every source


def parse_options(options: Mapping[str, str], *, streaming: bool, writing: bool = False) -> Options:
    """Check and parse the options (keys are case-insensitive, as Spark's are)."""
    lowered: dict[str, str] = {}
    for key, value in options.items():
        lowered[key.lower()] = value
    unknown = sorted(k for k in set(lowered) - _KNOWN - _SPARKS if not k.startswith("spark."))
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(unknown)} for format tidewire "
                          f"(known: {', '.join(sorted(_KNOWN))})")  # fmt: skip
    gateways = "gateways" in lowered
    urls = _urls(lowered)
    streams = tuple(s.strip() for s in lowered.get("streams", "").split(",") if s.strip())
    for name in streams:
        _stream_name(name, "streams")
    if not writing and not streams:
        raise OptionError("option 'streams' is required to read: a comma-separated list")
    if len(set(streams)) != len(streams):
        raise OptionError("option 'streams' names a stream twice")
    stream = lowered.get("stream")
    if stream is not None:
        _stream_name(stream, "stream")
    max_events = lowered.get("maxeventspertrigger")
    if max_events is not None and not streaming:
        raise OptionError("option 'maxEventsPerTrigger' applies to streaming reads only")
    if "endingoffsets" in lowered and streaming:
        raise OptionError("option 'endingOffsets' applies to batch reads only")
    starting = lowered.get("startingoffsets", "latest" if streaming else "earliest")
    ending = lowered.get("endingoffsets", "latest")
    if streams:  # checked now, before any hub is asked anything
        _offsets_spec(starting, "startingOffsets", streams)
        _offsets_spec(ending, "endingOffsets", streams)
    return Options(
        urls=urls,
        gateways=gateways,
        streams=streams,
        starting=starting,
        ending=ending,
        max_events_per_trigger=None if max_events is None else _positive(max_events,
                                                                          "maxEventsPerTrigger"),
        fail_on_data_loss=_boolean(lowered.get("failondataloss", "true"), "failOnDataLoss"),
        events_per_partition=_positive(lowered.get("eventsperpartition", "1000000"),
                                       "eventsPerPartition"),
        min_partitions=_positive(lowered.get("minpartitions", "1"), "minPartitions"),
        stream=stream,
        prefetch=_positive(lowered.get("prefetch", "16"), "prefetch"),
        batch_rows=_positive(lowered.get("batchrows", str(BATCH_ROWS)), "batchRows"),
        tune_allocator=_boolean(lowered.get("tuneallocator", "true"), "tuneAllocator"),
    )  # fmt: skip


def _urls(lowered: Mapping[str, str]) -> tuple[str, ...]:
    """The URLs of the option ``url`` (independent hubs) or ``gateways`` (each serves every
    stream: ``rsio://h1:7400,rsio://h2:7400`` or ``rsio://h1:7400,h2:7400``); exactly one."""
    if "gateways" in lowered:
        if "url" in lowered:
            raise OptionError("give either 'url' (independent hubs, each stream on one) or "
                              "'gateways' (every URL serves every stream), not both")  # fmt: skip
        try:
            urls = gateway_urls(lowered["gateways"])
        except ValueError as exc:
            raise OptionError(f"option 'gateways': {exc}") from None
        option = "gateways"
    else:
        urls = tuple(u.strip() for u in lowered.get("url", "").split(",") if u.strip())
        if not urls:
            raise OptionError("option 'url' is required (or 'gateways'): rsio://host:port, or "
                              "several, comma-separated")  # fmt: skip
        if len(set(urls)) != len(urls):
            raise OptionError("option 'url' names a hub twice")
        option = "url"
    for url in urls:
        if not url.startswith("rsio://") or ":" not in url[len("rsio://") :]:
            raise OptionError(f"option {option!r}: {url!r} is not rsio://host:port")
    return urls


def spread(ranges: Sequence[Range], urls: Sequence[str]) -> list[Range]:
    """Gateways: the partitions dealt round robin over ``urls`` (each range's first gateway),
    so that their reads are shared by every gateway."""
    return [replace(r, url=urls[i % len(urls)]) for i, r in enumerate(ranges)]


def _stream_name(name: str, option: str) -> None:
    try:
        validate_stream_name(name)
    except InvalidStreamName as exc:
        raise OptionError(f"option {option!r}: {exc}") from None


def _positive(text: str, option: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise OptionError(f"option {option!r} must be a positive integer, not {text!r}")
    return value


def _boolean(text: str, option: str) -> bool:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise OptionError(f"option {option!r} must be true or false, not {text!r}")


def _offsets_spec(text: str, option: str, streams: Sequence[str]) -> dict[str, int]:
    """``earliest``/``latest``/JSON into ``{stream: id or EARLIEST or LATEST}``."""
    if text in ("earliest", "latest"):
        return dict.fromkeys(streams, EARLIEST if text == "earliest" else LATEST)
    try:
        spec: Any = json.loads(text)
    except ValueError:
        raise OptionError(
            f"option {option!r} must be earliest, latest or JSON like "
            f'{{"stream": 42}}, not {text!r}'
        ) from None
    if not isinstance(spec, dict):
        raise OptionError(f"option {option!r}: the JSON must be an object {{stream: id}}")
    unknown = sorted(set(spec) - set(streams))
    if unknown:
        raise OptionError(f"option {option!r} names streams not in 'streams': {unknown}")
    out = dict.fromkeys(streams, EARLIEST if option == "startingOffsets" else LATEST)
    for name, value in spec.items():
        if isinstance(value, bool) or not isinstance(value, int) or not (
            value in (EARLIEST, LATEST) or 1 <= value <= MAX_ID + 1
        ):
            raise OptionError(f"option {option!r}: {name!r} must be an id >= 1, "
                              f"-2 (earliest) or -1 (latest), not {value!r}")  # fmt: skip
        out[name] = value
    return out


def starting_offsets(options: Options, info: Mapping[str, StreamInfo]) -> dict[str, int]:
    """The first id to read of each stream."""
    spec = _offsets_spec(options.starting, "startingOffsets", options.streams)
    out = {}
    for name, value in spec.items():
        if value == EARLIEST:
            out[name] = info[name].earliest
        elif value == LATEST:
            out[name] = info[name].next_id
        else:
            out[name] = value
    return out


def ending_offsets(options: Options, info: Mapping[str, StreamInfo]) -> dict[str, int]:
    """The id each stream's batch read stops before."""
    spec = _offsets_spec(options.ending, "endingOffsets", options.streams)
    out = {}
    for name, value in spec.items():
        if value == EARLIEST:
            raise OptionError("option 'endingOffsets' cannot be earliest (-2)")
        out[name] = info[name].next_id if value == LATEST else value
    return out


def latest_offsets(info: Mapping[str, StreamInfo], streams: Sequence[str]) -> dict[str, int]:
    return {name: info[name].next_id for name in streams}


def cap_offsets(
    start: Mapping[str, int], latest: Mapping[str, int], max_events: int | None
) -> dict[str, int]:
    """``latest``, but spanning at most ``max_events`` ids past ``start`` in all (admission
    control, ``ReadMaxRows``): shared out evenly over the streams that have something, the
    rest of a small stream's share going to the others. Never below ``start``."""
    end = {name: max(latest.get(name, start[name]), start[name]) for name in start}
    if max_events is None:
        return end
    want = {name: end[name] - start[name] for name in start if end[name] > start[name]}
    budget = max_events
    grant = dict.fromkeys(want, 0)
    while budget > 0 and want:
        share = max(1, budget // len(want))
        for name in sorted(want):
            take = min(share, want[name], budget)
            grant[name] += take
            want[name] -= take
            budget -= take
            if not want[name]:
                del want[name]
            if budget <= 0:
                break
    return {name: start[name] + grant.get(name, 0) for name in start}


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
