"""Lost notifications found from the shards' state (cluster/notices.py): a shard whose last
message is older than the settling time and was never heard of is suspect, once; a busy
shard (its last message newer) or one fully heard is not."""

from __future__ import annotations

from typing import Any

from tidewire.cluster.notices import SETTLE_S, Notices

NOW = 1_795_709_531.0  # 2026-11-26T16:12:11Z


def info(name: str, last: int, at: str) -> dict[str, Any]:
    return {"config": {"name": name}, "state": {"last_seq": last, "last_ts": at}}


def test_a_quiet_shard_whose_last_message_was_never_heard_of_is_suspect_once() -> None:
    notices = Notices()
    notices.hear({"Nats-Stream": "TW_1", "Nats-Sequence": "7"})
    notices.hear({"Nats-Stream": "TW_1", "Nats-Sequence": "5"})  # (late: changes nothing)
    assert notices.heard == {"TW_1": 7}
    old = "2026-11-26T16:12:05.123456789Z"  # (six seconds before NOW)
    infos = [info("TW_0", 0, "0001-01-01T00:00:00Z"), info("TW_1", 7, old),
             info("TW_2", 9, old)]  # fmt: skip
    assert notices.suspects(infos, NOW) == ["TW_2"]  # (TW_0 is empty, TW_1 fully heard)
    assert notices.suspects(infos, NOW) == []  # (taken as heard: read again once)


def test_a_message_stored_moments_ago_is_on_its_way_not_lost() -> None:
    notices = Notices()
    recent = "2026-11-26T16:12:10.900000000Z"  # (0.1 s before NOW)
    assert SETTLE_S > 0.1
    assert notices.suspects([info("TW_3", 4, recent)], NOW) == []
    assert notices.suspects([info("TW_3", 4, recent)], NOW + SETTLE_S) == ["TW_3"]


def test_headers_that_are_not_a_notifications_and_bad_times_are_ignored() -> None:
    notices = Notices()
    notices.hear({"Nats-Sequence": "3"})
    notices.hear({"Nats-Stream": "TW_1", "Nats-Sequence": "x"})
    assert notices.heard == {}
    assert notices.suspects([info("TW_1", 2, "not a time")], NOW) == []
