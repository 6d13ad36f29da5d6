"""Spark's Kafka source's options in the ``tidewire`` source, without a JVM: names and case,
aliases, refusals, ``subscribePattern``, the timestamp options (with a fake time lookup),
``minOffsetsPerTrigger``/``maxTriggerDelay`` (with a fake clock) and Spark's time strings."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tidewire.spark.hubs import HubError, HubSession
from tidewire.spark.planning import (
    MAX_TRIGGER_DELAY_MS,
    OptionError,
    Options,
    StreamInfo,
    delay_batch,
    duration_ms,
    ending_offsets,
    match_streams,
    parse_options,
    starting_offsets,
    stream_names,
)

URL = "rsio://hub-a:7400"


def _parse(*, streaming: bool = False, **options: str) -> Options:
    return parse_options({"url": URL, **options}, streaming=streaming)


def _error(*, streaming: bool = False, **options: str) -> str:
    return _refused(options, streaming=streaming)


def _refused(options: Mapping[str, str], *, streaming: bool = False) -> str:
    with pytest.raises(OptionError) as caught:
        parse_options({"url": URL, **options}, streaming=streaming)
    return str(caught.value)


def _info(stream: str, first: int | None, latest: int, *, exists: bool = True) -> StreamInfo:
    return StreamInfo(stream, URL, exists, first, latest)


# a: ids 5..20; b: ids 1..9; new: on no hub yet
INFO = {"a": _info("a", 5, 20), "b": _info("b", 1, 9), "new": _info("new", None, 0, exists=False)}


class FakeLookup:
    """The hub's time index, faked: ``{stream: {ms: id}}``, a time not listed finds nothing
    (every event older). Records what it was asked."""

    def __init__(self, ids: Mapping[str, Mapping[int, int]]) -> None:
        self.ids = ids
        self.asked: list[dict[str, int]] = []

    def __call__(self, times: dict[str, int]) -> dict[str, int | None]:
        self.asked.append(dict(times))
        return {name: self.ids.get(name, {}).get(ms) for name, ms in times.items()}


# --------------------------------------------------------------------------- names and case


@pytest.mark.parametrize("word", ["earliest", "Earliest", "EARLIEST", " earliest ", "eArLiEsT\n"])
def test_earliest_in_any_case_and_trimmed(word: str) -> None:
    options = _parse(streams="a,b", startingOffsets=word)
    assert starting_offsets(options, INFO) == {"a": 5, "b": 1}


@pytest.mark.parametrize("word", ["latest", "Latest", "LATEST", "  latest"])
def test_latest_in_any_case_and_trimmed(word: str) -> None:
    options = _parse(streams="a,b", startingOffsets=word, endingOffsets=word)
    assert starting_offsets(options, INFO) == {"a": 21, "b": 10}
    assert ending_offsets(options, INFO) == {"a": 21, "b": 10}
    streaming = _parse(streaming=True, streams="a", STARTINGOFFSETS=word.upper())
    assert starting_offsets(streaming, INFO) == {"a": 21}


def test_options_in_mixed_case() -> None:
    options = _parse(streaming=True, SUBSCRIBE="a,b", MaxOffsetsPerTrigger="10",
                     minoffsetspertrigger="5", MAXTRIGGERDELAY="2S",
                     StartingOffsetsByTimestampStrategy="LATEST")  # fmt: skip
    assert options.streams == ("a", "b")
    assert options.max_events_per_trigger == 10
    assert options.min_events_per_trigger == 5
    assert options.max_trigger_delay_ms == 2000
    assert options.latest_when_no_time is True


def test_kafkas_nested_json_names_partition_zero() -> None:
    options = _parse(streams="a,b", startingOffsets='{"a": {"0": 7}}',
                     endingOffsets='{"b": {"0": 4}}')  # fmt: skip
    assert starting_offsets(options, INFO) == {"a": 7, "b": 1}
    assert ending_offsets(options, INFO) == {"a": 21, "b": 4}
    message = _error(streams="a", startingOffsets='{"a": {"0": 7, "1": 9}}')
    assert "startingOffsets" in message
    assert "one" in message


# --------------------------------------------------------------------------- aliases


def test_subscribe_is_streams() -> None:
    assert _parse(subscribe=" a , b ") == _parse(streams="a,b")
    assert "'subscribe'" in _error(subscribe="a,a")


@pytest.mark.parametrize(
    "given",
    [{"streams": "a", "subscribe": "a"}, {"streams": "a", "subscribePattern": "a.*"},
     {"Subscribe": "a", "SubscribePattern": "a.*"}],
)  # fmt: skip
def test_one_of_streams_subscribe_and_pattern(given: dict[str, str]) -> None:
    message = _refused(given)
    assert "give one of" in message
    for key in given:
        assert repr(key.lower()) in message


def test_max_offsets_per_trigger_and_its_alias() -> None:
    assert _parse(streaming=True, streams="a", maxOffsetsPerTrigger="7").max_events_per_trigger == 7
    assert _parse(streaming=True, streams="a", maxEventsPerTrigger="7").max_events_per_trigger == 7
    same = _parse(streaming=True, streams="a", maxOffsetsPerTrigger="7", maxEventsPerTrigger="7")
    assert same.max_events_per_trigger == 7
    message = _error(streaming=True, streams="a", maxOffsetsPerTrigger="7",
                     maxEventsPerTrigger="8")  # fmt: skip
    assert "'maxOffsetsPerTrigger'" in message
    assert "'maxEventsPerTrigger'" in message
    assert "disagree" in message
    assert "positive integer" in _error(streaming=True, streams="a", maxOffsetsPerTrigger="0")


def test_max_records_per_partition_is_events_per_partition() -> None:
    assert _parse(streams="a", maxRecordsPerPartition="9").events_per_partition == 9
    assert "disagree" in _error(streams="a", maxRecordsPerPartition="9", eventsPerPartition="8")
    assert "'maxRecordsPerPartition'" in _error(streams="a", maxRecordsPerPartition="-1")


@pytest.mark.parametrize(
    "key",
    ["maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "maxEventsPerTrigger"],
)
def test_trigger_options_are_for_streaming_only(key: str) -> None:
    message = _refused({"streams": "a", key: "5"})
    assert repr(key) in message
    assert "streaming" in message


@pytest.mark.parametrize("key", ["endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"])
def test_ending_options_are_for_batch_only(key: str) -> None:
    message = _refused({"streams": "a", key: "latest"}, streaming=True)
    assert repr(key) in message
    assert "batch" in message


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("assign", "one partition"),
        ("kafka.bootstrap.servers", "'url' or 'gateways'"),
        ("Kafka.Group.Id", "'url' or 'gateways'"),
        ("groupIdPrefix", "consumer groups"),
        ("includeHeaders", "no headers"),
        ("kafkaConsumer.pollTimeoutMs", "60 s"),
        ("fetchOffset.numRetries", "once per trigger"),
        ("fetchOffset.retryIntervalMs", "once per trigger"),
        ("topic", "'stream'"),
    ],
)
def test_kafka_only_options_are_refused_by_name_with_a_reason(key: str, reason: str) -> None:
    message = _refused({"streams": "a", key: "x"}, streaming=True)
    assert f"option {key!r} is Kafka's and has no meaning here" in message
    assert reason in message
    assert "\n" not in message  # one line


# --------------------------------------------------------------------------- subscribePattern


def test_pattern_matches_whole_names_and_hides_the_hubs_own_streams() -> None:
    names = ["orders", "orders-eu", "xorders", "_tidewire.txns", "_tidewire.audit", "pay"]
    assert match_streams("orders.*", names) == ["orders", "orders-eu"]
    assert match_streams("order", names) == []  # whole names only, not a search
    assert match_streams(".*", names) == ["orders", "orders-eu", "pay", "xorders"]
    assert match_streams("_tidewire\\..*", names) == ["_tidewire.audit", "_tidewire.txns"]
    assert match_streams("orders|pay", names) == ["orders", "pay"]


def test_pattern_options() -> None:
    options = _parse(streaming=True, subscribePattern="o.*")
    assert (options.pattern, options.streams) == ("o.*", ())
    info = {"ob": _info("ob", 3, 4), "oa": _info("oa", None, 0)}
    assert stream_names(options, info) == ("oa", "ob")
    assert starting_offsets(options, info) == {"oa": 1, "ob": 5}  # streaming: latest
    batch = _parse(subscribePattern="o.*", startingOffsets='{"ob": 4, "oc": 2}')
    assert starting_offsets(batch, info) == {"oa": 1, "ob": 4}  # oc: matched, not there yet
    assert "does not match" in _error(subscribePattern="o.*", startingOffsets='{"x": 4}')
    assert "regular expression" in _error(subscribePattern="o(")
    assert "empty" in _error(subscribePattern="")


# --------------------------------------------------------------------------- timestamps


def test_starting_timestamp_is_the_first_id_at_or_after_it() -> None:
    lookup = FakeLookup({"a": {1000: 12}, "b": {1000: 3}})
    options = _parse(streams="a,b", startingTimestamp="1000")
    assert starting_offsets(options, INFO, lookup) == {"a": 12, "b": 3}
    assert lookup.asked == [{"a": 1000, "b": 1000}]


def test_precedence_timestamp_then_by_timestamp_then_offsets() -> None:
    lookup = FakeLookup({"a": {1000: 12, 2000: 15}, "b": {1000: 3, 2000: 8}})
    both = _parse(streams="a,b", startingTimestamp="1000",
                  startingOffsetsByTimestamp='{"a": 2000, "b": 2000}', startingOffsets="latest")
    assert starting_offsets(both, INFO, lookup) == {"a": 12, "b": 3}
    by = _parse(streams="a,b", startingOffsetsByTimestamp='{"a": 2000}', startingOffsets="latest")
    assert starting_offsets(by, INFO, lookup) == {"a": 15, "b": 10}  # b: by startingOffsets
    kafka = _parse(streams="a,b", startingOffsetsByTimestamp='{"a": {"0": 2000}}')
    assert starting_offsets(kafka, INFO, lookup) == {"a": 15, "b": 1}
    end = _parse(streams="a,b", endingTimestamp="1000", endingOffsetsByTimestamp='{"a": 2000}',
                 endingOffsets='{"a": 7}')  # fmt: skip
    assert ending_offsets(end, INFO, lookup) == {"a": 12, "b": 3}
    end_by = _parse(streams="a,b", endingOffsetsByTimestamp='{"a": 2000}', endingOffsets='{"b": 4}')
    assert ending_offsets(end_by, INFO, lookup) == {"a": 15, "b": 4}


@pytest.mark.parametrize("strategy", [None, "error", "Error", " ERROR "])
def test_no_event_that_new_fails_by_default(strategy: str | None) -> None:
    extra = {} if strategy is None else {"startingOffsetsByTimestampStrategy": strategy}
    options = parse_options({"url": URL, "streams": "a,b", "startingTimestamp": "5000", **extra},
                            streaming=False)  # fmt: skip
    lookup = FakeLookup({"a": {5000: 17}})  # b: every event older
    with pytest.raises(OptionError) as caught:
        starting_offsets(options, INFO, lookup)
    message = str(caught.value)
    assert "'startingTimestamp'" in message
    assert "'b'" in message
    assert "startingOffsetsByTimestampStrategy=latest" in message


@pytest.mark.parametrize("strategy", ["latest", "LATEST", " Latest"])
def test_no_event_that_new_starts_at_the_end_with_strategy_latest(strategy: str) -> None:
    options = _parse(streams="a,b", startingOffsetsByTimestamp='{"a": 5000, "b": 5000}',
                     startingOffsetsByTimestampStrategy=strategy)  # fmt: skip
    assert starting_offsets(options, INFO, FakeLookup({"a": {5000: 17}})) == {"a": 17, "b": 10}


def test_no_event_that_new_ends_at_latest() -> None:
    options = _parse(streams="a,b", endingTimestamp="5000")
    assert ending_offsets(options, INFO, FakeLookup({"a": {5000: 17}})) == {"a": 17, "b": 10}


def test_a_stream_on_no_hub_yet_is_not_looked_up_and_starts_at_its_beginning() -> None:
    lookup = FakeLookup({"a": {1000: 12}})
    options = _parse(streams="a,new", startingTimestamp="1000")
    assert starting_offsets(options, INFO, lookup) == {"a": 12, "new": 1}
    assert lookup.asked == [{"a": 1000}]
    only_new = _parse(streams="new", startingTimestamp="1000")
    assert starting_offsets(only_new, INFO) == {"new": 1}  # nothing to ask: no lookup needed


def test_no_lookup_is_a_clear_error() -> None:
    with pytest.raises(OptionError, match="look up times"):
        starting_offsets(_parse(streams="a", startingTimestamp="1"), INFO)


@pytest.mark.parametrize("key", ["startingTimestamp", "endingTimestamp"])
@pytest.mark.parametrize("text", ["-1", "1.5", "soon", "", "2024-01-01"])
def test_bad_timestamps_are_refused(key: str, text: str) -> None:
    message = _refused({"streams": "a", key: text})
    assert repr(key) in message
    assert repr(text) in message


@pytest.mark.parametrize("key", ["startingOffsetsByTimestamp", "endingOffsetsByTimestamp"])
@pytest.mark.parametrize(
    ("text", "says"),
    [("{", "JSON"), ("[1]", "object"), ('{"a": -1}', ">= 0"), ('{"a": true}', ">= 0"),
     ('{"a": "1"}', ">= 0"), ('{"zz": 1}', "not in 'streams'"), ('{"a": {"1": 5}}', "one")],
)  # fmt: skip
def test_bad_timestamp_json_is_refused(key: str, text: str, says: str) -> None:
    message = _refused({"streams": "a", key: text})
    assert repr(key) in message
    assert says in message


def test_bad_strategy_is_refused() -> None:
    message = _error(streams="a", startingOffsetsByTimestampStrategy="earliest")
    assert "'startingOffsetsByTimestampStrategy'" in message
    assert "'earliest'" in message


# --------------------------------------------------------------------------- trigger delay


@pytest.mark.parametrize(
    ("text", "ms"),
    [("15m", 900_000), ("2s", 2000), ("2S", 2000), (" 500ms ", 500), ("1min", 60_000),
     ("1h", 3_600_000), ("1d", 86_400_000), ("2500us", 2), ("250", 250), ("0", 0)],
)  # fmt: skip
def test_durations_read_as_spark_does(text: str, ms: int) -> None:
    assert duration_ms(text) == ms
    options = _parse(streaming=True, streams="a", minOffsetsPerTrigger="1", maxTriggerDelay=text)
    assert options.max_trigger_delay_ms == ms


@pytest.mark.parametrize("text", ["", "1.5s", "2 s", "-1s", "s", "2sec", "1w", "ms5"])
def test_bad_durations_are_refused(text: str) -> None:
    message = _error(streaming=True, streams="a", maxTriggerDelay=text)
    assert "'maxTriggerDelay'" in message


def test_max_trigger_delay_defaults_to_15_minutes() -> None:
    assert MAX_TRIGGER_DELAY_MS == 15 * 60 * 1000
    assert _parse(streaming=True, streams="a").max_trigger_delay_ms == MAX_TRIGGER_DELAY_MS


def test_delay_batch_holds_until_enough_or_the_delay_passed() -> None:
    start, few, enough = {"a": 1, "b": 1}, {"a": 3, "b": 4}, {"a": 5, "b": 7}

    def held(now: int, latest: Mapping[str, int], last: int | None = 10_000) -> bool:
        return delay_batch(now_ms=now, last_ms=last, start=start, latest=latest, min_events=10,
                           delay_ms=2000)  # fmt: skip

    assert held(10_001, few)  # 5 waiting < 10, 1 ms since the last batch
    assert held(11_999, few)  # 1 ms before the delay is up
    assert not held(12_000, few)  # the delay is up: fire with what there is
    assert not held(10_001, enough)  # 10 waiting: fire at once
    assert not held(10_001, few, last=None)  # the first trigger is never held (Kafka's)
    assert held(10_001, start)  # nothing waiting is held too (nothing to run anyway)
    # a stream not in start yet counts nothing; one behind its start counts nothing
    assert delay_batch(now_ms=1, last_ms=0, start={"a": 9}, latest={"a": 3, "b": 50},
                       min_events=1, delay_ms=5)  # fmt: skip


# --------------------------------------------------------------------------- the hub's lookup


class _OldClient:
    """An RS.io client from before the time index: no ``ids_at``."""

    async def close(self) -> None:
        pass


class _Client(_OldClient):
    def __init__(self) -> None:
        self.asked: list[dict[str, int]] = []

    async def ids_at(self, times: dict[str, int]) -> dict[str, int | None]:
        self.asked.append(times)
        return {name: None if ms > 100 else ms + 1 for name, ms in times.items()}


def test_a_hub_session_asks_its_clients_ids_at_or_says_it_cannot_look_up_times() -> None:
    session = HubSession("rsio://127.0.0.1:1")  # never connected: the client is given
    try:
        session.client = _OldClient()  # type: ignore[assignment]
        with pytest.raises(HubError, match=r"rsio://127\.0\.0\.1:1: this hub cannot look up times"):
            session.ids_at({"a": 5})
        client = _Client()
        session.client = client  # type: ignore[assignment]
        assert session.ids_at({"a": 5, "b": 500}) == {"a": 6, "b": None}
        assert session.ids_at({}) == {}  # nothing asked
        assert client.asked == [{"a": 5, "b": 500}]
    finally:
        session.close()


def test_messages_spell_options_as_the_docs_do_though_spark_lowercases_keys() -> None:
    assert "'maxEventsPerTrigger'" in _refused({"streams": "a", "maxeventspertrigger": "5"})
    message = _refused({"streams": "a", "includeheaders": "true"}, streaming=True)
    assert "'includeHeaders' is Kafka's" in message
    message = _refused({"streams": "a", "maxoffsetspertrigger": "1", "maxeventspertrigger": "2"},
                       streaming=True)  # fmt: skip
    assert "'maxOffsetsPerTrigger' and 'maxEventsPerTrigger'" in message
