"""The harness itself: a real hub starts, is measured and stops; the bystander is served."""

from __future__ import annotations

import os
from pathlib import Path

from harness import BYSTANDER_MAX_STALL_S, bystander, real_hub

from helpers import run


def test_a_quiet_hub_serves_the_bystander_without_stalls(tmp_path: Path) -> None:
    with real_hub(tmp_path, tokens=["good"]) as hub:
        report = run(bystander(hub, 1.5, token=hub.tokens["good"]))
        assert report.errors == []
        assert report.events > 1000
        assert report.max_stall_s < BYSTANDER_MAX_STALL_S * 5  # the promise is the attacks'
        assert 30 * 2**20 < hub.rss() <= hub.peak_rss() < 2**30
        assert "ready" not in hub.log_text()  # banner on stdout, log on stderr
        pid = hub.pid
    assert not os.path.exists(f"/proc/{pid}")  # stopped and reaped
