"""The ``tidewire`` Spark data source's pure-Python parts, without a JVM or a Spark session:
options, offsets, admission control and partitions (tidewire.spark.planning), and
Batch <-> Arrow conversion (tidewire.spark.arrow)."""

from __future__ import annotations

import gc
import itertools
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.model import MAX_ID, Batch, Event, InvalidBatch, InvalidStreamName, now_ms
from tidewire.spark.arrow import SCHEMA, from_arrow, stream_column, to_arrow
from tidewire.spark.planning import (
    DataLossSparkError,
    OptionError,
    Options,
    Range,
    StreamInfo,
    cap_offsets,
    check_data_loss,
    ending_offsets,
    latest_offsets,
    parse_options,
    split_ranges,
    spread,
    starting_offsets,
)

URL = "rsio://hub-a:7400"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
URL_B = "rsio://hub-b:7400"


def _options(*, streaming: bool = False, writing: bool = False, **extra: str) -> Options:
    return parse_options({"url": URL, "streams": "a,b", **extra}, streaming=streaming,
                         writing=writing)  # fmt: skip


def _info(
    stream: str, first: int | None, latest: int, *, url: str = URL, exists: bool = True
) -> StreamInfo:
    return StreamInfo(stream, url, exists, first, latest)


def _error(options: Mapping[str, str], **kwargs: bool) -> str:
    with pytest.raises(OptionError) as caught:
        parse_options(options, **kwargs)
    return str(caught.value)


# --------------------------------------------------------------------------- parse_options


def test_defaults_for_a_batch_read() -> None:
    options = parse_options({"url": URL, "streams": "orders"}, streaming=False)
    assert options == Options(
        urls=(URL,),
        streams=("orders",),
        starting="earliest",
        ending="latest",
        max_events_per_trigger=None,
        fail_on_data_loss=True,
        events_per_partition=1_000_000,
        min_partitions=1,
        stream=None,
        prefetch=16,
        batch_rows=65536,
    )


def test_defaults_for_a_streaming_read() -> None:
    options = parse_options({"url": URL, "streams": "orders"}, streaming=True)
    assert options.starting == "latest"
    assert options.max_events_per_trigger is None
    assert options.fail_on_data_loss is True


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("url", [None, "", " , ,"])
def test_url_is_required(url: str | None, streaming: bool) -> None:
    options = {"streams": "a"} if url is None else {"url": url, "streams": "a"}
    assert "'url' is required" in _error(options, streaming=streaming)


@pytest.mark.parametrize("url", ["http://h:1", "rsio://h", "h:1", "rsio://"])
def test_url_must_be_rsio_host_port(url: str) -> None:
    message = _error({"url": url, "streams": "a"}, streaming=False)
    assert repr(url) in message
    assert "rsio://host:port" in message


def test_several_urls_comma_separated() -> None:
    options = parse_options({"url": f" {URL} ,{URL_B},", "streams": "a"}, streaming=True)
    assert options.urls == (URL, URL_B)


def test_a_url_given_twice_is_refused_or_counted_once() -> None:
    try:
        urls = parse_options({"url": f"{URL},{URL}", "streams": "a"}, streaming=False).urls
    except OptionError as exc:
        urls = (str(exc),)
    assert urls == (URL,) or "'url'" in urls[0]


def test_gateways_say_every_url_serves_every_stream() -> None:
    options = parse_options({"gateways": f"{URL},hub-b:7400", "streams": "a"}, streaming=True)
    assert (options.urls, options.gateways) == ((URL, URL_B), True)
    assert parse_options({"url": URL, "streams": "a"}, streaming=True).gateways is False
    assert "not both" in _error({"url": URL, "gateways": URL, "streams": "a"}, streaming=False)
    assert "'gateways'" in _error({"gateways": "http://h:1", "streams": "a"}, streaming=False)
    assert "'gateways'" in _error({"gateways": f"{URL},{URL}", "streams": "a"}, streaming=False)
    assert "'gateways'" in _error({"gateways": " , ", "streams": "a"}, streaming=False)


def test_spread_deals_the_ranges_round_robin_over_the_gateways() -> None:
    ranges = [Range(URL, "a", i, i + 1) for i in range(1, 6)]
    assert [r.url for r in spread(ranges, [URL, URL_B])] == [URL, URL_B, URL, URL_B, URL]
    assert [(r.start, r.end) for r in spread(ranges, [URL_B])] == [(i, i + 1) for i in range(1, 6)]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("streams", [None, "", " , "])
def test_streams_required_to_read(streams: str | None, streaming: bool) -> None:
    options = {"url": URL} if streams is None else {"url": URL, "streams": streams}
    assert "'streams' is required" in _error(options, streaming=streaming)


@pytest.mark.parametrize("streaming", [False, True])
def test_streams_not_required_to_write(streaming: bool) -> None:
    options = parse_options({"url": URL, "stream": "out"}, streaming=streaming, writing=True)
    assert options.streams == ()
    assert options.stream == "out"
    assert parse_options({"url": URL}, streaming=streaming, writing=True).stream is None


def test_streams_are_stripped_and_keep_their_order() -> None:
    options = parse_options({"url": URL, "streams": " zeta , alpha,,mid "}, streaming=False)
    assert options.streams == ("zeta", "alpha", "mid")


def test_keys_are_case_insensitive() -> None:
    options = parse_options(
        {
            "URL": URL,
            "Streams": "a,b",
            "StartingOffsets": '{"a": 5}',
            "MAXEVENTSPERTRIGGER": "10",
            "FailOnDataLoss": "False",
            "EventsPerPartition": "7",
            "minpartitions": "3",
            "PreFetch": "9",
            "BatchRows": "100",
        },
        streaming=True,
    )
    assert options.urls == (URL,)
    assert options.streams == ("a", "b")
    assert options.starting == '{"a": 5}'
    assert options.max_events_per_trigger == 10
    assert options.fail_on_data_loss is False
    assert options.events_per_partition == 7
    assert options.min_partitions == 3
    assert options.prefetch == 9
    assert options.batch_rows == 100
    batch = parse_options({"url": URL, "streams": "a", "EndingOffsets": '{"a": 9}'},
                          streaming=False)  # fmt: skip
    assert batch.ending == '{"a": 9}'


@pytest.mark.parametrize("streaming", [False, True])
def test_sparks_own_options_are_ignored(streaming: bool) -> None:
    spark = {
        "checkpointLocation": "/tmp/cp",
        "path": "ignored",
        "Path": "ignored",
        "queryName": "q",
        "spark.sql.shuffle.partitions": "4",
        "Spark.Custom.Thing": "x",
    }
    options = parse_options({"url": URL, "streams": "a", **spark}, streaming=streaming)
    assert options == parse_options({"url": URL, "streams": "a"}, streaming=streaming)


def test_a_typo_is_refused_naming_it() -> None:
    message = _error({"url": URL, "streams": "a", "startingOffset": "earliest"}, streaming=False)
    assert "unknown option" in message
    assert "startingoffset" in message.lower()
    assert "startingoffsets" in message  # the list of known options helps to spot the typo


def test_every_unknown_option_is_named() -> None:
    message = _error(
        {"url": URL, "streams": "a", "maxOffsetPerTrigger": "5", "startingTime": "x"},
        streaming=True,
    )
    assert "maxoffsetpertrigger" in message.lower()
    assert "startingtime" in message.lower()


def test_max_events_per_trigger_is_for_streaming_only() -> None:
    options = {"url": URL, "streams": "a", "maxEventsPerTrigger": "100"}
    assert parse_options(options, streaming=True).max_events_per_trigger == 100
    message = _error(options, streaming=False)
    assert "maxEventsPerTrigger" in message
    assert "streaming" in message


def test_ending_offsets_is_for_batch_only() -> None:
    options = {"url": URL, "streams": "a", "endingOffsets": "latest"}
    assert parse_options(options, streaming=False).ending == "latest"
    message = _error(options, streaming=True)
    assert "endingOffsets" in message
    assert "batch" in message


@pytest.mark.parametrize(
    ("key", "streaming"),
    [
        ("maxEventsPerTrigger", True),
        ("eventsPerPartition", False),
        ("minPartitions", False),
        ("prefetch", True),
        ("batchRows", False),
    ],
)
@pytest.mark.parametrize("text", ["0", "-1", "1.5", "abc", "", "1e3", "ten"])
def test_bad_numbers_are_refused(key: str, streaming: bool, text: str) -> None:
    message = _error({"url": URL, "streams": "a", key: text}, streaming=streaming)
    assert repr(key) in message
    assert repr(text) in message
    assert "positive integer" in message


@pytest.mark.parametrize("text", ["true", "TRUE", "True", "false", "False", "FALSE"])
def test_booleans(text: str) -> None:
    options = parse_options({"url": URL, "streams": "a", "failOnDataLoss": text}, streaming=True)
    assert options.fail_on_data_loss is (text.lower() == "true")


@pytest.mark.parametrize("text", ["yes", "no", "1", "0", "", "t", "truee"])
def test_bad_booleans_are_refused(text: str) -> None:
    message = _error({"url": URL, "streams": "a", "failOnDataLoss": text}, streaming=False)
    assert "'failOnDataLoss'" in message
    assert repr(text) in message


@pytest.mark.parametrize("name", ["a b", "a\tb", "x" * 256, "a\x00", "bad\x7f"])
def test_invalid_stream_names_are_refused(name: str) -> None:
    assert "'streams'" in _error({"url": URL, "streams": f"ok,{name}"}, streaming=False)
    message = _error({"url": URL, "stream": name}, streaming=True, writing=True)
    assert "'stream'" in message


@pytest.mark.parametrize("streams", ["a,a", "a, a", "a,b,a", " b ,b"])
def test_a_stream_named_twice_is_refused(streams: str) -> None:
    assert "twice" in _error({"url": URL, "streams": streams}, streaming=False)


# --------------------------------------------------------------------------- offsets

# a: events 5..20; e: empty (never written); x: on no hub; r: retention left nothing after id 10
INFO = {
    "a": _info("a", 5, 20),
    "e": _info("e", None, 0),
    "x": _info("x", None, 0, url=URL_B, exists=False),
    "r": _info("r", None, 10),
}


def _read(starting: str | None = None, ending: str | None = None) -> Options:
    extra = {"startingOffsets": starting} if starting is not None else {}
    if ending is not None:
        extra["endingOffsets"] = ending
    return parse_options({"url": URL, "streams": "a,e,x,r", **extra}, streaming=False)


def test_stream_info_earliest_and_next_id() -> None:
    assert (INFO["a"].earliest, INFO["a"].next_id) == (5, 21)
    assert (INFO["e"].earliest, INFO["e"].next_id) == (1, 1)
    assert (INFO["x"].earliest, INFO["x"].next_id) == (1, 1)
    assert (INFO["r"].earliest, INFO["r"].next_id) == (11, 11)


def test_starting_earliest_and_latest() -> None:
    assert starting_offsets(_read(), INFO) == {"a": 5, "e": 1, "x": 1, "r": 11}
    assert starting_offsets(_read("earliest"), INFO) == {"a": 5, "e": 1, "x": 1, "r": 11}
    assert starting_offsets(_read("latest"), INFO) == {"a": 21, "e": 1, "x": 1, "r": 11}
    streaming = parse_options({"url": URL, "streams": "a"}, streaming=True)
    assert starting_offsets(streaming, INFO) == {"a": 21}


def test_starting_json() -> None:
    assert starting_offsets(_read('{"a": -1, "r": -2}'), INFO) == {
        "a": 21, "e": 1, "x": 1, "r": 11,
    }  # fmt: skip
    # streams the JSON leaves out start at earliest
    assert starting_offsets(_read('{"a": 7}'), INFO) == {"a": 7, "e": 1, "x": 1, "r": 11}
    assert starting_offsets(_read('{"a": 100, "x": 3}'), INFO)["a"] == 100
    assert starting_offsets(_read(json.dumps({"a": MAX_ID + 1})), INFO)["a"] == MAX_ID + 1
    assert starting_offsets(_read("{}"), INFO) == starting_offsets(_read("earliest"), INFO)


def test_ending_latest_and_json() -> None:
    assert ending_offsets(_read(), INFO) == {"a": 21, "e": 1, "x": 1, "r": 11}
    assert ending_offsets(_read(ending="latest"), INFO) == {"a": 21, "e": 1, "x": 1, "r": 11}
    # streams the JSON leaves out end at latest; -1 is latest
    assert ending_offsets(_read(ending='{"a": 10}'), INFO) == {"a": 10, "e": 1, "x": 1, "r": 11}
    assert ending_offsets(_read(ending='{"a": -1, "e": 4}'), INFO) == {
        "a": 21, "e": 4, "x": 1, "r": 11,
    }  # fmt: skip


@pytest.mark.parametrize("ending", ["earliest", '{"a": -2}'])
def test_ending_cannot_be_earliest(ending: str) -> None:
    with pytest.raises(OptionError, match="endingOffsets"):
        ending_offsets(_read(ending=ending), INFO)


def test_latest_offsets() -> None:
    assert latest_offsets(INFO, ["a", "x"]) == {"a": 21, "x": 1}


@pytest.mark.parametrize("which", ["startingOffsets", "endingOffsets"])
def test_json_naming_an_unknown_stream_is_refused(which: str) -> None:
    spec = '{"a": 5, "nope": 3, "other": 1}'
    with pytest.raises(OptionError) as caught:  # refused by parse_options, before any hub
        _read(spec) if which == "startingOffsets" else _read(ending=spec)
    assert which in str(caught.value)
    assert "'nope'" in str(caught.value)
    assert "'other'" in str(caught.value)


@pytest.mark.parametrize("text", ["{", "{'a': 5}", "nope", "", "Earliest!", "earliest,"])
def test_bad_json_is_refused(text: str) -> None:
    with pytest.raises(OptionError) as caught:
        starting_offsets(_read(text), INFO)
    assert "startingOffsets" in str(caught.value)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("text", ["42", "[1, 2]", '"earliest"', "null", '[{"a": 5}]'])
def test_json_that_is_not_an_object_is_refused(text: str) -> None:
    with pytest.raises(OptionError, match="must be an object"):
        starting_offsets(_read(text), INFO)


@pytest.mark.parametrize(
    "value", [0, -3, -100, True, False, "5", "earliest", 1.0, 2.5, None, [5], MAX_ID + 2]
)
@pytest.mark.parametrize("which", ["startingOffsets", "endingOffsets"])
def test_bad_offset_values_are_refused(value: object, which: str) -> None:
    spec = json.dumps({"a": value})
    with pytest.raises(OptionError) as caught:  # refused by parse_options, before any hub
        _read(spec) if which == "startingOffsets" else _read(ending=spec)
    message = str(caught.value)
    assert which in message
    assert "'a'" in message
    assert repr(json.loads(spec)["a"]) in message


# --------------------------------------------------------------------------- cap_offsets


def test_cap_none_reads_everything() -> None:
    start = {"a": 1, "b": 50, "c": 7}
    assert cap_offsets(start, {"a": 101, "b": 10, "c": 7}, None) == {"a": 101, "b": 50, "c": 7}


def test_cap_never_below_start_nor_for_a_stream_without_latest() -> None:
    assert cap_offsets({"a": 50, "b": 5}, {"a": 10}, 100) == {"a": 50, "b": 5}
    assert cap_offsets({"a": 50}, {"a": 10}, None) == {"a": 50}


def test_cap_shares_evenly() -> None:
    assert cap_offsets({"a": 1, "b": 1}, {"a": 101, "b": 101}, 10) == {"a": 6, "b": 6}
    end = cap_offsets({"a": 1, "b": 1, "c": 1}, {"a": 101, "b": 101, "c": 101}, 10)
    assert sum(e - 1 for e in end.values()) == 10
    assert sorted(e - 1 for e in end.values()) == [3, 3, 4]


def test_cap_is_proportional_to_what_each_stream_has_waiting() -> None:
    # Kafka's rateLimit: limit * size / total, floored (a: 2/2002 of 20 is < 1: raised to 1)
    end = cap_offsets({"a": 1, "b": 1, "c": 1}, {"a": 3, "b": 1001, "c": 1001}, 20)
    assert end == {"a": 2, "b": 11, "c": 10}  # 1 + 9 + 9 = 19: the last id to b (tie: name)
    end = cap_offsets({"a": 1, "b": 1}, {"a": 301, "b": 101}, 40)
    assert end == {"a": 31, "b": 11}  # 300:100 -> 30:10, as Kafka
    end = cap_offsets({"big": 1, "small": 1}, {"big": 1001, "small": 2}, 10)
    assert end == {"big": 10, "small": 2}  # small is not starved: at least one id


def test_cap_takes_back_what_kafkas_rounding_up_would_add() -> None:
    # Kafka would grant 1 to each of the nine small streams and 9 to big: 18 for a cap of 10
    latest = {"big": 1001, **{f"s{i}": 2 for i in range(9)}}
    start = dict.fromkeys(latest, 1)
    end = cap_offsets(start, latest, 10)
    assert sum(e - start[s] for s, e in end.items()) == 10
    assert all(end[f"s{i}"] == 2 for i in range(9))  # every small stream got its one
    assert end["big"] == 2  # the biggest share gave its ids back (it has the most waiting)
    # fewer ids than streams: the biggest streams first
    end = cap_offsets({"a": 1, "b": 1, "c": 1}, {"a": 5, "b": 3, "c": 2}, 2)
    assert end == {"a": 2, "b": 2, "c": 1}


def test_cap_skips_a_stream_whose_latest_is_below_its_start() -> None:
    end = cap_offsets({"a": 50, "b": 1}, {"a": 10, "b": 100}, 10)
    assert end == {"a": 50, "b": 11}


def test_cap_with_room_for_everything_reads_everything() -> None:
    start, latest = {"a": 1, "b": 10}, {"a": 5, "b": 20}
    assert cap_offsets(start, latest, 14) == latest
    assert cap_offsets(start, latest, 10**9) == latest
    assert sum(e - s for e, s in zip(cap_offsets(start, latest, 13).values(),
                                     start.values(), strict=True)) == 13  # fmt: skip


def test_cap_one_event() -> None:
    end = cap_offsets({"a": 1, "b": 1}, {"a": 5, "b": 5}, 1)
    assert sorted(end.values()) == [1, 2]


_names = st.sampled_from(["a", "b", "c", "d", "e", "f"])


@given(
    st.dictionaries(_names, st.tuples(st.integers(1, 500), st.integers(0, 600)), min_size=1),
    st.none() | st.integers(1, 3000),
)
def test_cap_property(streams: dict[str, tuple[int, int]], max_events: int | None) -> None:
    start = {name: s for name, (s, _) in streams.items()}
    latest = {name: la for name, (_, la) in streams.items()}
    end = cap_offsets(start, latest, max_events)
    assert set(end) == set(start)
    available = {name: max(start[name], latest[name]) - start[name] for name in start}
    grant = {name: end[name] - start[name] for name in start}
    for name in start:
        assert start[name] <= end[name] <= max(start[name], latest[name])
    total = sum(available.values())
    if max_events is None or max_events >= total:
        assert end == {name: max(start[name], latest[name]) for name in start}
        return
    assert sum(grant.values()) == max_events  # never more, and no budget left unused
    waiting = [name for name in start if available[name]]
    small = sum(1 for name in waiting if max_events * available[name] < total)
    if max_events >= len(waiting):
        assert all(grant[name] >= 1 for name in waiting)  # nobody starved
    for name in waiting:  # proportional: off the exact share by the small streams' ones at most
        share = max_events * available[name] / total
        assert share - 1 - small < grant[name] < share + 1 + small


# --------------------------------------------------------------------------- check_data_loss

LOSS_INFO = {
    "a": _info("a", 100, 200),
    "b": _info("b", 1, 50),
    "x": _info("x", None, 0, exists=False),
}


def test_data_loss_fails_with_a_clear_message() -> None:
    with pytest.raises(DataLossSparkError) as caught:
        check_data_loss({"a": 50, "b": 1, "x": 1}, LOSS_INFO, fail=True)
    message = str(caught.value)
    assert "'a'" in message
    assert "50..99" in message
    assert "retention" in message
    assert "failOnDataLoss" in message


def test_data_loss_skipped_when_told() -> None:
    start = {"a": 50, "b": 1, "x": 1}
    moved, lost = check_data_loss(start, LOSS_INFO, fail=False)
    assert moved == {"a": 100, "b": 1, "x": 1}
    assert start == {"a": 50, "b": 1, "x": 1}  # the caller's mapping is left alone
    assert len(lost) == 1
    assert "'a'" in lost[0]
    assert "50..99" in lost[0]


@pytest.mark.parametrize("fail", [True, False])
def test_no_data_loss(fail: bool) -> None:
    start = {"a": 100, "b": 30, "x": 1}
    assert check_data_loss(start, LOSS_INFO, fail=fail) == (start, [])
    beyond = {"a": 500, "b": 51, "x": 9}
    assert check_data_loss(beyond, LOSS_INFO, fail=fail) == (beyond, [])


def test_data_loss_in_several_streams() -> None:
    info = {"a": _info("a", 100, 200), "b": _info("b", 10, 50)}
    moved, lost = check_data_loss({"a": 1, "b": 9}, info, fail=False)
    assert moved == {"a": 100, "b": 10}
    assert len(lost) == 2
    assert any("'b'" in m and "9..9" in m for m in lost)


# --------------------------------------------------------------------------- split_ranges


def _check_cover(
    ranges: list[Range], start: Mapping[str, int], end: Mapping[str, int], per: int
) -> None:
    """Each stream's ranges, in order, are exactly [start, end) with no gap or overlap."""
    for name in start:
        mine = [r for r in ranges if r.stream == name]
        if end.get(name, 0) <= start[name]:
            assert mine == []
            continue
        assert mine[0].start == start[name]
        assert mine[-1].end == end[name]
        for r in mine:
            assert 0 < r.end - r.start <= per
        for left, right in itertools.pairwise(mine):
            assert left.end == right.start
    assert {r.stream for r in ranges} <= set(start)


def test_split_by_events_per_partition() -> None:
    info = {"a": _info("a", 1, 10)}
    ranges = split_ranges({"a": 1}, {"a": 11}, info, events_per_partition=4)
    assert ranges == [Range(URL, "a", 1, 5), Range(URL, "a", 5, 8), Range(URL, "a", 8, 11)]
    exact = split_ranges({"a": 1}, {"a": 9}, info, events_per_partition=4)
    assert [(r.start, r.end) for r in exact] == [(1, 5), (5, 9)]
    whole = split_ranges({"a": 3}, {"a": 11}, info, events_per_partition=100)
    assert whole == [Range(URL, "a", 3, 11)]


def test_split_into_min_partitions_big_ranges_first() -> None:
    info = {"a": _info("a", 1, 100), "b": _info("b", 1, 10, url=URL_B)}
    start, end = {"a": 1, "b": 1}, {"a": 101, "b": 11}
    ranges = split_ranges(start, end, info, events_per_partition=1000, min_partitions=4)
    assert len(ranges) == 4
    assert [r.stream for r in ranges].count("b") == 1
    _check_cover(ranges, start, end, 1000)


def test_split_no_finer_than_one_id() -> None:
    info = {"a": _info("a", 1, 3)}
    ranges = split_ranges({"a": 1}, {"a": 4}, info, events_per_partition=10, min_partitions=10)
    assert [(r.start, r.end) for r in ranges] == [(1, 2), (2, 3), (3, 4)]


def test_split_url_comes_from_the_stream_info() -> None:
    info = {"a": _info("a", 1, 10), "b": _info("b", 1, 10, url=URL_B)}
    ranges = split_ranges({"a": 1, "b": 1}, {"a": 11, "b": 11}, info, events_per_partition=3)
    assert {r.url for r in ranges if r.stream == "a"} == {URL}
    assert {r.url for r in ranges if r.stream == "b"} == {URL_B}


def test_split_nothing_to_read() -> None:
    info = {"a": _info("a", 1, 10), "b": _info("b", 1, 10)}
    assert split_ranges({"a": 5, "b": 5}, {"a": 5, "b": 3}, info, events_per_partition=1) == []
    assert split_ranges({"a": 5}, {}, info, events_per_partition=1, min_partitions=8) == []
    assert split_ranges({}, {}, info, events_per_partition=1) == []
    # only the stream with something to read
    ranges = split_ranges({"a": 5, "b": 5}, {"a": 5, "b": 7}, info, events_per_partition=1)
    assert ranges == [Range(URL, "b", 5, 6), Range(URL, "b", 6, 7)]


@given(
    st.dictionaries(_names, st.tuples(st.integers(1, 10**6), st.integers(-5, 300)), max_size=6),
    st.integers(1, 120),
    st.integers(1, 40),
)
def test_split_property(streams: dict[str, tuple[int, int]], per: int, min_partitions: int) -> None:
    start = {name: s for name, (s, _) in streams.items()}
    end = {name: s + span for name, (s, span) in streams.items()}
    info = {name: _info(name, 1, 10**7, url=f"rsio://hub-{name}:1") for name in streams}
    ranges = split_ranges(start, end, info, events_per_partition=per,
                          min_partitions=min_partitions)  # fmt: skip
    _check_cover(ranges, start, end, per)
    total = sum(max(0, end[n] - start[n]) for n in start)
    assert sum(r.end - r.start for r in ranges) == total
    assert len(ranges) >= min(min_partitions, total)
    assert all(r.url == f"rsio://hub-{r.stream}:1" for r in ranges)


# --------------------------------------------------------------------------- to_arrow


def _expected(batch: Batch) -> dict[str, list[Any]]:
    """What to_arrow must give, from the per-event objects (fine in a test)."""
    events: list[Event] = list(batch)
    return {
        "stream": [e.stream for e in events],
        "id": [e.id for e in events],
        "key": [e.key for e in events],
        "value": [e.value for e in events],
        "timestamp": [e.timestamp * 1000 for e in events],  # µs
    }


def _columns(rb: Any) -> dict[str, list[Any]]:
    rb.validate(full=True)
    out = {name: rb.column(name).to_pylist() for name in ("stream", "id", "key", "value")}
    out["timestamp"] = rb.column("timestamp").cast(pa.int64()).to_pylist()
    return out


def test_schema_is_exact() -> None:
    assert [(f.name, f.type) for f in SCHEMA] == [
        ("stream", pa.string()),
        ("id", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
    rb = to_arrow(Batch.build("orders", [b"x"], timestamps=1))
    assert rb.schema.equals(SCHEMA)
    assert rb.schema.field("timestamp").type.tz == "UTC"


KEYED = Batch.build(
    "orders",
    [b"a", b"bb", b"", b"dddd", b"e", b"ffffff", b"g"],
    ids=[3, 5, 9, 10, 20, 21, MAX_ID],
    keys=[b"k", None, b"", b"kk", None, b"", b"kkk"],
    timestamps=[1, 2, 1_700_000_000_123, 4, -5, 0, 2**40],
)


def test_to_arrow_columns() -> None:
    rb = to_arrow(KEYED)
    assert rb.num_rows == 7
    assert _columns(rb) == _expected(KEYED)
    assert rb.column("key").to_pylist()[1:3] == [None, b""]  # a missing key is not b""
    assert rb.column("key").null_count == 2
    assert rb.column("id").to_pylist()[-1] == MAX_ID


@pytest.mark.parametrize(("start", "stop"), [(1, 4), (2, 7), (6, 7), (0, 1), (3, 5)])
def test_to_arrow_of_a_slice(start: int, stop: int) -> None:
    part = KEYED.slice(start, stop)
    if start:
        assert part.value_offsets[0] > 0  # offsets start above 0: to_arrow must rebase
    rb = to_arrow(part)
    assert _columns(rb) == _expected(part)
    assert _columns(rb)["value"] == _expected(KEYED)["value"][start:stop]


def test_to_arrow_without_keys() -> None:
    batch = Batch.build("s", [b"one", b"two", b""], timestamps=[10, 20, 30])
    assert not batch.has_keys
    rb = to_arrow(batch)
    assert rb.column("key").null_count == 3
    assert rb.column("key").to_pylist() == [None, None, None]
    assert _columns(rb) == _expected(batch)
    assert _columns(to_arrow(batch.slice(1, 3))) == _expected(batch.slice(1, 3))


def test_to_arrow_of_a_slice_whose_keys_are_all_absent() -> None:
    part = KEYED.slice(1, 2)
    assert part.has_keys
    assert to_arrow(part).column("key").to_pylist() == [None]


def test_to_arrow_of_fixed_size_values() -> None:
    batch = Batch.fixed("s", b"abcdefgh", 2, key=b"", timestamp=7)
    assert _columns(to_arrow(batch))["key"] == [b""] * 4
    keyed = Batch.fixed("s", b"abcdefgh", 2, key=b"kk", timestamp=7).slice(1, 3)
    assert _columns(to_arrow(keyed)) == _expected(keyed)


def test_stream_columns_come_from_a_bounded_cache_and_are_right() -> None:
    """Issue 22: the ``stream`` column is a slice of a cached column, grown when a batch is
    bigger, per name; a column bigger than the cache's 16 MiB is built and not kept."""
    assert stream_column("a", 3).to_pylist() == ["a"] * 3
    assert stream_column("bb", 5).to_pylist() == ["bb"] * 5
    assert stream_column("a", 2).to_pylist() == ["a"] * 2  # a slice of the first
    assert stream_column("a", 7).to_pylist() == ["a"] * 7  # grown
    assert stream_column("bb", 0).to_pylist() == []
    name = "n" * 255
    huge = stream_column(name, 70_000)  # 17.9 MB of names: not cached
    assert len(huge) == 70_000
    assert huge[69_999].as_py() == name
    assert stream_column("a", 4).to_pylist() == ["a"] * 4
    rb = to_arrow(Batch.build("two", [b"x", b"y"], timestamps=1))
    assert rb.column("stream").to_pylist() == ["two", "two"]
    assert to_arrow(KEYED.slice(2, 4)).column("stream").to_pylist() == ["orders", "orders"]


def test_to_arrow_refuses_a_timestamp_out_of_range() -> None:
    batch = Batch.build("s", [b"x"], timestamps=2**62)
    with pytest.raises((InvalidBatch, pa.ArrowInvalid, OverflowError)):
        to_arrow(batch)


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    """A batch (with or without keys, ids with gaps), often a slice of a bigger one."""
    n = draw(st.integers(1, 20))
    values = draw(st.lists(st.binary(max_size=12), min_size=n, max_size=n))
    keys = draw(st.none() | st.lists(st.none() | st.binary(max_size=6), min_size=n, max_size=n))
    ids = sorted(draw(st.sets(st.integers(1, MAX_ID), min_size=n, max_size=n)))
    stamps = draw(st.lists(st.integers(-(10**12), 10**13), min_size=n, max_size=n))
    stream = draw(st.sampled_from(["orders", "a.b-c", "日本語"]))
    batch = Batch.build(stream, values, ids=ids, keys=keys, timestamps=stamps)
    start = draw(st.integers(0, n - 1))
    return batch.slice(start, draw(st.integers(start + 1, n)))


@given(batches())
def test_to_arrow_property(batch: Batch) -> None:
    assert _columns(to_arrow(batch)) == _expected(batch)


# --------------------------------------------------------------------------- from_arrow


def _events(batch: Batch) -> list[tuple[int, bytes, bytes | None, int]]:
    return [(e.id, e.value, e.key, e.timestamp) for e in batch]


def _values_keys(batch: Batch) -> list[tuple[bytes, bytes | None]]:
    return [(e.value, e.key) for e in batch]


@pytest.mark.parametrize("kind", [pa.binary(), pa.string(), pa.large_binary(), pa.large_string()])
def test_from_arrow_value_column_binary_or_string(kind: Any) -> None:
    texts = ["one", "", "thrée"]
    data = texts if kind in (pa.string(), pa.large_string()) else [t.encode() for t in texts]
    rb = pa.record_batch({"value": pa.array(data, kind)})
    (batch,) = from_arrow(rb, "out")
    assert batch.stream == "out"
    assert [e.value for e in batch] == [t.encode() for t in texts]
    assert [e.id for e in batch] == [1, 2, 3]
    assert not batch.has_keys
    batch.validate()


def test_from_arrow_keys() -> None:
    rb = pa.record_batch(
        {"value": pa.array([b"a", b"b", b"c", b"d"]), "key": pa.array(["k", None, "", "kk"])}
    )
    (batch,) = from_arrow(rb, "s")
    assert [e.key for e in batch] == [b"k", None, b"", b"kk"]
    assert batch.has_keys
    batch.validate()


def test_from_arrow_all_null_keys_mean_no_key() -> None:
    rb = pa.record_batch(
        {"value": pa.array([b"a", b"b"]), "key": pa.array([None, None], pa.binary())}
    )
    (batch,) = from_arrow(rb, "s")
    assert not batch.has_keys
    assert [e.key for e in batch] == [None, None]


def test_from_arrow_splits_by_stream_column_keeping_order() -> None:
    streams = ["a", "b", "a", "c", "b", "a"]
    rb = pa.record_batch(
        {
            "stream": pa.array(streams),
            "value": pa.array([f"v{i}".encode() for i in range(6)]),
            "key": pa.array([None, b"k1", b"k2", None, None, b"k5"]),
        }
    )
    out = from_arrow(rb, "ignored")  # the column wins over the option
    by_stream = {b.stream: b for b in out}
    assert len(out) == 3
    assert set(by_stream) == {"a", "b", "c"}
    assert _values_keys(by_stream["a"]) == [(b"v0", None), (b"v2", b"k2"), (b"v5", b"k5")]
    assert _values_keys(by_stream["b"]) == [(b"v1", b"k1"), (b"v4", None)]
    assert _values_keys(by_stream["c"]) == [(b"v3", None)]
    assert [e.id for e in by_stream["a"]] == [1, 2, 3]


def test_from_arrow_uses_the_option_stream_without_a_column() -> None:
    (batch,) = from_arrow(pa.record_batch({"value": pa.array([b"x"])}), "target")
    assert batch.stream == "target"
    with pytest.raises(InvalidBatch, match="stream"):
        from_arrow(pa.record_batch({"value": pa.array([b"x"])}), None)


def test_from_arrow_of_no_rows() -> None:
    assert from_arrow(pa.record_batch({"value": pa.array([], pa.binary())}), None) == []


@pytest.mark.parametrize(
    "columns",
    [
        {"val": pa.array([b"x"])},
        {"key": pa.array([b"k"]), "stream": pa.array(["s"])},
        {"val": pa.array([], pa.binary())},
    ],
)
def test_from_arrow_needs_a_value_column(columns: dict[str, Any]) -> None:
    with pytest.raises(InvalidBatch, match="'value' column"):
        from_arrow(pa.record_batch(columns), "s")


def test_from_arrow_refuses_nulls_and_bad_types() -> None:
    with pytest.raises(InvalidBatch, match=r"'value'.*null"):
        from_arrow(pa.record_batch({"value": pa.array([b"x", None])}), "s")
    with pytest.raises(InvalidBatch, match=r"'stream'.*null"):
        from_arrow(pa.record_batch({"value": pa.array([b"x", b"y"]),
                                    "stream": pa.array(["a", None])}), "s")  # fmt: skip
    with pytest.raises(InvalidBatch, match="'value'"):
        from_arrow(pa.record_batch({"value": pa.array([1, 2])}), "s")
    with pytest.raises(InvalidBatch, match="'key'"):
        from_arrow(pa.record_batch({"value": pa.array([b"x"]), "key": pa.array([7])}), "s")
    for stamps in (pa.array([5], pa.int64()), pa.array(["2024-01-01"]), pa.array([1.5])):
        with pytest.raises(InvalidBatch, match="'timestamp'"):
            from_arrow(pa.record_batch({"value": pa.array([b"x"]), "timestamp": stamps}), "s")


def test_from_arrow_refuses_an_invalid_stream_name() -> None:
    with pytest.raises(InvalidStreamName):
        from_arrow(pa.record_batch({"value": pa.array([b"x"]), "stream": pa.array(["a b"])}), None)
    with pytest.raises(InvalidStreamName):
        from_arrow(pa.record_batch({"value": pa.array([b"x"])}), "")


def test_from_arrow_binary_stream_column() -> None:
    rb = pa.record_batch({"value": pa.array([b"x"]), "stream": pa.array([b"orders"])})
    try:
        out = from_arrow(rb, None)
    except InvalidBatch:
        return
    assert [b.stream for b in out] == ["orders"]


def _ms(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(milliseconds=1)


def _sliceable() -> Any:
    n = 12
    return pa.record_batch(
        {
            "stream": pa.array(["a" if i % 3 else "b" for i in range(n)]),
            "value": pa.array([f"value-{i}" * (i % 4) for i in range(n)]),
            "key": pa.array([None if i % 4 == 1 else f"k{i}".encode() for i in range(n)]),
            "timestamp": pa.array([i * 1000 + 999 for i in range(n)], pa.timestamp("us", tz="UTC")),
        }
    )


@pytest.mark.parametrize(("offset", "length"), [(3, 5), (0, 4), (7, 5), (11, 1), (1, 10)])
def test_from_arrow_of_a_sliced_record_batch(offset: int, length: int) -> None:
    full = _sliceable()
    rows = full.slice(offset, length).to_pylist()
    out = {b.stream: b for b in from_arrow(full.slice(offset, length), None)}
    for name in ("a", "b"):
        mine = [r for r in rows if r["stream"] == name]
        if not mine:
            assert name not in out
            continue
        batch = out[name]
        batch.validate()
        assert [e.value for e in batch] == [r["value"].encode() for r in mine]
        assert [e.key for e in batch] == [r["key"] for r in mine]
        assert [e.timestamp for e in batch] == [_ms(r["timestamp"]) for r in mine]


@pytest.mark.parametrize(("offset", "length"), [(3, 5), (2, 2), (5, 1)])
def test_from_arrow_of_a_sliced_single_stream(offset: int, length: int) -> None:
    full = _sliceable().drop_columns(["stream"])
    (batch,) = from_arrow(full.slice(offset, length), "s")
    rows = full.to_pylist()[offset : offset + length]
    assert [e.value for e in batch] == [r["value"].encode() for r in rows]
    assert [e.key for e in batch] == [r["key"] for r in rows]
    assert [e.timestamp for e in batch] == list(range(offset, offset + length))  # 999 µs cut
    assert to_arrow(batch).column("value").to_pylist() == [r["value"].encode() for r in rows]


def test_from_arrow_timestamps_to_ms() -> None:
    us = pa.array([0, 999, 1000, 1_700_000_000_123_456], pa.timestamp("us", tz="UTC"))
    (batch,) = from_arrow(pa.record_batch({"value": pa.array([b"x"] * 4), "timestamp": us}), "s")
    assert [e.timestamp for e in batch] == [0, 0, 1, 1_700_000_000_123]
    for unit, scale in (("s", 1000), ("ms", 1)):
        for tz in (None, "UTC", "Europe/Paris"):
            stamps = pa.array([5, 6], pa.timestamp(unit, tz=tz))
            rb = pa.record_batch({"value": pa.array([b"x", b"y"]), "timestamp": stamps})
            (batch,) = from_arrow(rb, "s")
            assert [e.timestamp for e in batch] == [5 * scale, 6 * scale]


def test_from_arrow_timestamps_default_to_now() -> None:
    before = now_ms()
    stamps = pa.array([None, 42], pa.timestamp("ms"))
    (stamped,) = from_arrow(pa.record_batch({"value": pa.array([b"x", b"y"]),
                                             "timestamp": stamps}), "s")  # fmt: skip
    (unstamped,) = from_arrow(pa.record_batch({"value": pa.array([b"x", b"y"])}), "s")
    after = now_ms()
    assert before <= stamped.event(0).timestamp <= after
    assert stamped.event(1).timestamp == 42
    assert all(before <= e.timestamp <= after for e in unstamped)


def test_from_arrow_nanosecond_timestamps() -> None:
    stamps = pa.array([1_500, 2_000_000_999], pa.timestamp("ns"))
    rb = pa.record_batch({"value": pa.array([b"x", b"y"]), "timestamp": stamps})
    try:
        (batch,) = from_arrow(rb, "s")
    except InvalidBatch:
        return
    assert [e.timestamp for e in batch] == [0, 2000]


def test_from_arrow_batches_outlive_the_record_batch() -> None:
    def make() -> list[Batch]:
        return from_arrow(_sliceable().slice(2, 7), None)

    out = make()
    gc.collect()
    _ = [bytes(1 << 16) for _ in range(64)]  # reuse freed memory, were any freed
    assert sorted(e.value for b in out for e in b) == sorted(
        f"value-{i}".encode() * (i % 4) for i in range(2, 9)
    )


def test_round_trip_from_arrow_then_to_arrow() -> None:
    full = _sliceable().drop_columns(["stream"]).slice(3, 6)
    (batch,) = from_arrow(full, "s")
    back = to_arrow(batch)
    assert back.column("value").to_pylist() == full.column("value").cast(pa.binary()).to_pylist()
    assert back.column("key").to_pylist() == full.column("key").to_pylist()
    assert back.column("timestamp").cast(pa.int64()).to_pylist() == [
        (v // 1000) * 1000 for v in full.column("timestamp").cast(pa.int64()).to_pylist()
    ]


@given(batches())
def test_round_trip_to_arrow_then_from_arrow(batch: Batch) -> None:
    (back,) = from_arrow(to_arrow(batch), None)
    back.validate()
    assert back.stream == batch.stream
    assert [(e.value, e.key, e.timestamp) for e in back] == [
        (e.value, e.key, e.timestamp) for e in batch
    ]
    assert [e.id for e in back] == list(range(1, len(batch) + 1))  # the hub assigns ids


_rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.binary(max_size=10),
        st.none() | st.binary(max_size=5),
        st.none() | st.integers(0, 10**16),
    ),
    min_size=1,
    max_size=25,
)


@given(_rows, st.data())
def test_from_arrow_property(rows: list[tuple[str, bytes, bytes | None, int | None]],
                             data: st.DataObject) -> None:  # fmt: skip
    as_string = data.draw(st.booleans())
    values = [v.hex() if as_string else v for _, v, _, _ in rows]
    rb = pa.record_batch(
        {
            "stream": pa.array([s for s, _, _, _ in rows]),
            "value": pa.array(values, pa.string() if as_string else pa.binary()),
            "key": pa.array([k for _, _, k, _ in rows], pa.binary()),
            "timestamp": pa.array([t for _, _, _, t in rows], pa.timestamp("us", tz="UTC")),
        }
    )
    offset = data.draw(st.integers(0, len(rows) - 1))
    length = data.draw(st.integers(1, len(rows) - offset))
    before = now_ms()
    out = from_arrow(rb.slice(offset, length), None)
    after = now_ms()
    window = rows[offset : offset + length]
    assert sorted(b.stream for b in out) == sorted({s for s, _, _, _ in window})
    for batch in out:
        batch.validate()
        mine = [(v.hex().encode() if as_string else v, k, t)
                for s, v, k, t in window if s == batch.stream]  # fmt: skip
        assert [(e.value, e.key) for e in batch] == [(v, k) for v, k, _ in mine]
        for event, (_, _, t) in zip(batch, mine, strict=True):
            if t is None:
                assert before <= event.timestamp <= after
            else:
                assert event.timestamp == t // 1000
        assert _columns(to_arrow(batch))["value"] == [v for v, _, _ in mine]


@pytest.mark.parametrize(("text", "tuned"), [(None, True), ("true", True), ("FALSE", False)])
def test_tune_allocator_is_a_boolean_that_defaults_to_true(text: str | None, tuned: bool) -> None:
    given = {"url": URL, "streams": "a"} | ({} if text is None else {"tuneAllocator": text})
    assert parse_options(given, streaming=False).tune_allocator is tuned
    message = _error({"url": URL, "streams": "a", "tuneAllocator": "yes"}, streaming=False)
    assert "'tuneAllocator'" in message
