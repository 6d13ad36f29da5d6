"""``cluster.jsapi.retrying``: which JetStream answers are waited out (a cluster starting: 503,
and too few peers online for a stream's replicas yet: 10005) and which are not."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from helpers import run
from tidewire.cluster.jsapi import NO_PEERS, JetStreamError, retrying


def failing(errors: list[JetStreamError]) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    """A call that raises ``errors`` in turn, then answers ``"ok"``; and its call count."""
    calls = [0]

    async def work() -> str:
        calls[0] += 1
        if errors:
            raise errors.pop(0)
        return "ok"

    return calls, work


@pytest.mark.parametrize("error", [JetStreamError(503, 10008, "unavailable"),
                                   JetStreamError(400, NO_PEERS, "no suitable peers for "
                                                  "placement, peer offline")])  # fmt: skip
def test_a_starting_cluster_is_waited_for(error: JetStreamError) -> None:
    calls, work = failing([error, error])
    assert run(retrying(work, 30.0)) == "ok"
    assert calls[0] == 3


def test_other_errors_and_the_deadline_end_the_wait() -> None:
    calls, work = failing([JetStreamError(400, 10058, "stream name already in use")])
    with pytest.raises(JetStreamError, match="10058"):
        run(retrying(work, 30.0))
    assert calls[0] == 1
    peers = JetStreamError(400, NO_PEERS, "no suitable peers for placement")
    calls, work = failing([peers] * 100)
    with pytest.raises(JetStreamError, match="10005"):
        run(retrying(work, 0.01))  # (a cluster too small: an error)
    assert calls[0] == 1
