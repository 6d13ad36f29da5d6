"""The options of the ``tidewire`` data source: checked and parsed once, before any hub is
asked anything, into a frozen :class:`Options`.

Keys are case-insensitive, as Spark's are. Spark's Kafka source is the model: its names work
here where they have a meaning (``subscribe``, ``subscribePattern``, ``maxOffsetsPerTrigger``,
``minOffsetsPerTrigger``, ``maxTriggerDelay``, the timestamp options, ``maxRecordsPerPartition``),
and those that have none (``assign``, ``kafka.*``, ``groupIdPrefix``, ...) are refused by name
with the reason; any other unknown key is refused too, so that a typo never passes silently.
docs/spark.md has the table of Kafka's options and what tidewire does with each.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..client.reconnect import gateway_urls
from ..model import MAX_ID, InvalidStreamName, TidewireError, validate_stream_name
from .limits import duration_ms

__all__ = [
    "BATCH_ROWS",
    "EARLIEST",
    "LATEST",
    "MAX_TRIGGER_DELAY_MS",
    "OptionError",
    "Options",
    "match_streams",
    "offsets_spec",
    "parse_options",
]

EARLIEST = -2
LATEST = -1
BATCH_ROWS = 65536
"""The option ``batchRows``'s default: the rows per Arrow batch a read hands Spark, at least
(whole hub records are combined until they reach it; 1 hands each record on as it came)."""
MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
"""The option ``maxTriggerDelay``'s default (Spark's Kafka source: ``15m``)."""


class OptionError(TidewireError, ValueError):
    """An option of the ``tidewire`` data source that is missing or wrong."""


@dataclass(frozen=True, slots=True)
class Options:
    urls: tuple[str, ...]
    streams: tuple[str, ...]  # to read; empty when only writing, or with a pattern
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
    pattern: str | None = None  # subscribePattern: read every stream whose whole name matches
    min_events_per_trigger: int | None = None  # minOffsetsPerTrigger
    max_trigger_delay_ms: int = MAX_TRIGGER_DELAY_MS  # maxTriggerDelay
    # startingTimestamp / startingOffsetsByTimestamp (the first wins, as Spark's): ms per stream
    starting_timestamp: int | None = None
    starting_by_timestamp: dict[str, int] | None = field(default=None, hash=False)
    latest_when_no_time: bool = False  # startingOffsetsByTimestampStrategy=latest (not error)
    ending_timestamp: int | None = None
    ending_by_timestamp: dict[str, int] | None = field(default=None, hash=False)


_KNOWN = {
    "url", "gateways", "streams", "stream", "startingoffsets", "endingoffsets",
    "maxeventspertrigger", "failondataloss", "eventsperpartition", "minpartitions", "prefetch",
    "batchrows", "tuneallocator",
    # Spark's Kafka source's names (docs/spark.md, "Kafka's options")
    "subscribe", "subscribepattern", "maxoffsetspertrigger", "minoffsetspertrigger",
    "maxtriggerdelay", "maxrecordsperpartition", "startingtimestamp",
    "startingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy", "endingtimestamp",
    "endingoffsetsbytimestamp",
}  # fmt: skip
_NAMES = [
    "startingOffsets", "endingOffsets", "maxEventsPerTrigger", "failOnDataLoss",
    "eventsPerPartition", "minPartitions", "batchRows", "tuneAllocator", "subscribePattern",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "maxRecordsPerPartition",
    "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
    "endingTimestamp", "endingOffsetsByTimestamp", "assign", "groupIdPrefix", "includeHeaders",
    "kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
]  # fmt: skip
_SPELLING = {name.lower(): name for name in _NAMES}
"""How the documentation spells each option, for messages: Spark hands a source its options
with their keys in lower case."""
_SPARKS = {"path", "checkpointlocation", "queryname"}  # Spark's own, passed to every source
_KAFKAS = {
    "assign": "a tidewire stream is one partition: name streams with 'streams' (or 'subscribe')",
    "groupidprefix": "tidewire has no consumer groups: a query's position is its checkpoint",
    "includeheaders": "tidewire events have no headers (stream, id, key, value, timestamp)",
    "kafkaconsumer.polltimeoutms": "there is no Kafka consumer: a read waits at most 60 s for "
                                   "its hub",
    "fetchoffset.numretries": "the hub's offsets are asked once per trigger (with 'gateways', "
                              "a failed ask goes on at the next gateway)",
    "fetchoffset.retryintervalms": "the hub's offsets are asked once per trigger (with "
                                   "'gateways', a failed ask goes on at the next gateway)",
    "topic": "to write, name the target stream with 'stream' (or a 'stream' column)",
}  # fmt: skip
_KAFKA_PREFIX = "kafka."  # kafka.bootstrap.servers and every Kafka client setting


def parse_options(options: Mapping[str, str], *, streaming: bool, writing: bool = False) -> Options:
    """Check and parse the options (keys are case-insensitive, as Spark's are)."""
    lowered: dict[str, str] = {}
    spelled: dict[str, str] = {}  # the user's spelling, for messages
    for key, value in options.items():
        lowered[key.lower()] = value
        spelled[key.lower()] = _SPELLING.get(key.lower(), key)
    _refuse_unknown(lowered, spelled)
    gateways = "gateways" in lowered
    urls = _urls(lowered)
    streams, pattern = _subscription(lowered, writing=writing)
    stream = lowered.get("stream")
    if stream is not None:
        _stream_name(stream, "stream")
    for key in ("maxoffsetspertrigger", "maxeventspertrigger", "minoffsetspertrigger",
                "maxtriggerdelay"):  # fmt: skip
        if key in lowered and not streaming:
            raise OptionError(f"option {spelled[key]!r} applies to streaming reads only")
    for key in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp"):
        if key in lowered and streaming:
            raise OptionError(f"option {spelled[key]!r} applies to batch reads only")
    starting = _keyword(lowered.get("startingoffsets", "latest" if streaming else "earliest"))
    ending = _keyword(lowered.get("endingoffsets", "latest"))
    if streams or pattern is not None:  # checked now, before any hub is asked anything
        offsets_spec(starting, "startingOffsets", streams, pattern)
        offsets_spec(ending, "endingOffsets", streams, pattern)
    max_events = _alias(lowered, spelled, "maxoffsetspertrigger", "maxeventspertrigger")
    min_events = lowered.get("minoffsetspertrigger")
    per_partition = _alias(lowered, spelled, "maxrecordsperpartition", "eventsperpartition")
    return Options(
        urls=urls,
        gateways=gateways,
        streams=streams,
        pattern=pattern,
        starting=starting,
        ending=ending,
        max_events_per_trigger=None if max_events is None else _positive(*max_events),
        min_events_per_trigger=None if min_events is None else _positive(
            min_events, spelled["minoffsetspertrigger"]),
        max_trigger_delay_ms=_delay(lowered.get("maxtriggerdelay")),
        fail_on_data_loss=_boolean(lowered.get("failondataloss", "true"), "failOnDataLoss"),
        events_per_partition=_positive(*(per_partition or ("1000000", "eventsPerPartition"))),
        min_partitions=_positive(lowered.get("minpartitions", "1"), "minPartitions"),
        stream=stream,
        prefetch=_positive(lowered.get("prefetch", "16"), "prefetch"),
        batch_rows=_positive(lowered.get("batchrows", str(BATCH_ROWS)), "batchRows"),
        tune_allocator=_boolean(lowered.get("tuneallocator", "true"), "tuneAllocator"),
        starting_timestamp=_timestamp(lowered.get("startingtimestamp"), "startingTimestamp"),
        starting_by_timestamp=_by_timestamp(lowered.get("startingoffsetsbytimestamp"),
                                            "startingOffsetsByTimestamp", streams, pattern),
        latest_when_no_time=_strategy(lowered.get("startingoffsetsbytimestampstrategy")),
        ending_timestamp=_timestamp(lowered.get("endingtimestamp"), "endingTimestamp"),
        ending_by_timestamp=_by_timestamp(lowered.get("endingoffsetsbytimestamp"),
                                          "endingOffsetsByTimestamp", streams, pattern),
    )  # fmt: skip


def _refuse_unknown(lowered: Mapping[str, str], spelled: Mapping[str, str]) -> None:
    """Kafka's options that mean nothing here, by name with the reason; then any other."""
    kafkas = [f"option {spelled[k]!r} is Kafka's and has no meaning here: "
              + (_KAFKAS.get(k) or "tidewire is not Kafka: name the hubs with 'url' or "
                 "'gateways'")
              for k in sorted(lowered) if k in _KAFKAS or k.startswith(_KAFKA_PREFIX)]  # fmt: skip
    if kafkas:
        raise OptionError("; ".join(kafkas))
    unknown = sorted(k for k in set(lowered) - _KNOWN - _SPARKS if not k.startswith("spark."))
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(unknown)} for format tidewire "
                          f"(known: {', '.join(sorted(_KNOWN))})")  # fmt: skip


def _subscription(lowered: Mapping[str, str], *, writing: bool) -> tuple[tuple[str, ...],
                                                                          str | None]:  # fmt: skip
    """``streams`` (or its alias ``subscribe``) or ``subscribePattern``: at most one of them,
    and one is required to read."""
    given = [k for k in ("streams", "subscribe", "subscribepattern") if k in lowered]
    if len(given) > 1:
        raise OptionError("give one of 'streams', 'subscribe' (the same: a comma-separated "
                          "list) and 'subscribePattern' (a regular expression), not "
                          + " and ".join(repr(k) for k in given))  # fmt: skip
    if "subscribepattern" in lowered:
        text = lowered["subscribepattern"]
        try:
            re.compile(text)
        except re.error as exc:
            raise OptionError(f"option 'subscribePattern': {text!r} is not a regular "
                              f"expression (Python's re): {exc}") from None  # fmt: skip
        if not text:
            raise OptionError("option 'subscribePattern' is empty")
        return (), text
    option = "subscribe" if "subscribe" in lowered else "streams"
    streams = tuple(s.strip() for s in lowered.get(option, "").split(",") if s.strip())
    for name in streams:
        _stream_name(name, option)
    if not writing and not streams:
        raise OptionError("option 'streams' is required to read: a comma-separated list "
                          "(or 'subscribe', the same, or 'subscribePattern', a regular "
                          "expression)")  # fmt: skip
    if len(set(streams)) != len(streams):
        raise OptionError(f"option {option!r} names a stream twice")
    return streams, None


def match_streams(pattern: str, names: Sequence[str]) -> list[str]:
    """The ``names`` that ``pattern`` matches whole (``re.fullmatch``, as Kafka matches a
    whole topic name), sorted. The hub's own streams (``_tidewire.*``) only when the pattern
    itself starts with ``_tidewire``: ``.*`` means the user's streams."""
    regex = re.compile(pattern)
    own = pattern.startswith("_tidewire")
    return sorted(n for n in names
                  if regex.fullmatch(n) and (own or not n.startswith("_tidewire")))  # fmt: skip


def _alias(lowered: Mapping[str, str], spelled: Mapping[str, str], kafka: str,
           ours: str) -> tuple[str, str] | None:  # fmt: skip
    """The value and the option's spelling of ``kafka`` or its alias ``ours``; both given and
    different is refused (which one was meant?)."""
    if kafka in lowered and ours in lowered and lowered[kafka].strip() != lowered[ours].strip():
        raise OptionError(f"options {spelled[kafka]!r} and {spelled[ours]!r} are the same "
                          f"option and disagree ({lowered[kafka]!r}, {lowered[ours]!r}): "
                          "give one")  # fmt: skip
    for key in (kafka, ours):
        if key in lowered:
            return lowered[key], spelled[key]
    return None


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


def _delay(text: str | None) -> int:
    if text is None:
        return MAX_TRIGGER_DELAY_MS
    try:
        return duration_ms(text)
    except ValueError as exc:
        raise OptionError(f"option 'maxTriggerDelay': {exc}") from None


def _strategy(text: str | None) -> bool:
    """``startingOffsetsByTimestampStrategy``: ``error`` (False, the default) or ``latest``."""
    word = "error" if text is None else text.strip().lower()
    if word not in ("error", "latest"):
        raise OptionError("option 'startingOffsetsByTimestampStrategy' must be error or "
                          f"latest, not {text!r}")  # fmt: skip
    return word == "latest"


def _keyword(text: str) -> str:
    """``earliest`` and ``latest`` in any case, blanks around them ignored (as Spark's Kafka
    source: ``trim.toLowerCase``); anything else (JSON) as given."""
    word = text.strip().lower()
    return word if word in ("earliest", "latest") else text


def _timestamp(text: str | None, option: str) -> int | None:
    """A time in ms since the epoch (Kafka's: a long), >= 0."""
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0 or value > MAX_ID:
        raise OptionError(f"option {option!r} must be a time in ms since the epoch (>= 0), "
                          f"not {text!r}")  # fmt: skip
    return value


def _stream_values(spec: Any, option: str) -> dict[str, Any]:
    """``{"stream": v}``, or Kafka's ``{"topic": {"0": v}}`` (partition 0: a tidewire stream
    is one partition), as ``{stream: v}``."""
    if not isinstance(spec, dict):
        raise OptionError(f"option {option!r}: the JSON must be an object {{stream: value}}")
    out: dict[str, Any] = {}
    for name, value in spec.items():
        if isinstance(value, dict):
            if set(value) != {"0"}:
                raise OptionError(f"option {option!r}: {name!r} names partitions "
                                  f"{sorted(value)}; a tidewire stream has one, \"0\"")  # fmt: skip
            value = value["0"]
        out[name] = value
    return out


def _known_names(names: Sequence[str], option: str, streams: Sequence[str],
                 pattern: str | None) -> None:  # fmt: skip
    """JSON that names a stream the query does not read is refused (a typo, surely)."""
    if pattern is None:
        unknown = sorted(set(names) - set(streams))
        where = "not in 'streams'"
    else:
        unknown = sorted(set(names) - set(match_streams(pattern, names)))
        where = "that 'subscribePattern' does not match"
    if unknown:
        raise OptionError(f"option {option!r} names streams {where}: {unknown}")


def _by_timestamp(text: str | None, option: str, streams: Sequence[str],
                  pattern: str | None) -> dict[str, int] | None:  # fmt: skip
    """JSON ``{"stream": ms}`` or Kafka's ``{"stream": {"0": ms}}``."""
    if text is None:
        return None
    try:
        spec = _stream_values(json.loads(text), option)
    except ValueError as exc:
        if isinstance(exc, OptionError):
            raise
        raise OptionError(f"option {option!r} must be JSON like {{\"stream\": 1700000000000}}, "
                          f"not {text!r}") from None  # fmt: skip
    _known_names(list(spec), option, streams, pattern)
    for name, value in spec.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
            raise OptionError(f"option {option!r}: {name!r} must be a time in ms since the "
                              f"epoch (>= 0), not {value!r}")  # fmt: skip
    return spec


def offsets_spec(text: str, option: str, streams: Sequence[str],
                 pattern: str | None = None) -> dict[str, int]:  # fmt: skip
    """``earliest``/``latest``/JSON into ``{stream: id or EARLIEST or LATEST}`` for each of
    ``streams`` (JSON: ``{"stream": id}`` or Kafka's ``{"stream": {"0": id}}``; a stream it
    leaves out: earliest to start, latest to end). With a ``pattern``, the JSON may name any
    stream the pattern matches, read or not yet."""
    word = _keyword(text)
    if word in ("earliest", "latest"):
        return dict.fromkeys(streams, EARLIEST if word == "earliest" else LATEST)
    try:
        spec = _stream_values(json.loads(text), option)
    except ValueError as exc:
        if isinstance(exc, OptionError):
            raise
        raise OptionError(
            f"option {option!r} must be earliest, latest or JSON like "
            f'{{"stream": 42}}, not {text!r}'
        ) from None
    _known_names(list(spec), option, streams, pattern)
    out = dict.fromkeys(streams, EARLIEST if option == "startingOffsets" else LATEST)
    for name, value in spec.items():
        if isinstance(value, bool) or not isinstance(value, int) or not (
            value in (EARLIEST, LATEST) or 1 <= value <= MAX_ID + 1
        ):
            raise OptionError(f"option {option!r}: {name!r} must be an id >= 1, "
                              f"-2 (earliest) or -1 (latest), not {value!r}")  # fmt: skip
        if name in out:
            out[name] = value
    return out
