"""Stream administration through ``tidewire serve --storage`` gateways (child processes, as a
user runs them, with a tokens file and an ACL granting ``admin``) over the session's cluster:
a stream created with its retention through one gateway, changed through the other, still
there with its runtime retention after the first gateway is stopped and started again, and
deleted through the restarted one."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from serveproc import endpoint, read_until, server
from tidewire.cluster.local import LocalCluster
from tidewire.hub.access import mint_token

SECONDS = 30.0  # a notification between gateways: milliseconds; bounded
OPS, OPS_TABLE = mint_token("ops")
ACL = '[principal."token:ops"]\nadmin = ["adm-*"]\nmonitor = true\n'


def call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method, headers={
        "X-Tidewire-Request": "1", "Content-Type": "application/json",
        "Authorization": f"Bearer {OPS}"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def retention_on(base: str, stream: str) -> Any:
    """The stream's ``retention`` as ``GET /api/streams`` shows it (``None``: not listed)."""
    _, listed = call(base, "GET", "/api/streams")
    return next((s["retention"] for s in listed if s["name"] == stream), None)


def poll(what: str, check: Any) -> None:
    """Until ``check()`` (another process's state: polled, bounded)."""
    deadline = time.monotonic() + SECONDS
    while not check():
        assert time.monotonic() < deadline, f"not within {SECONDS}s: {what}"
        time.sleep(0.05)


def test_admin_actions_through_serve_gateways_survive_a_gateway_restart(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    stream = f"adm-{uuid.uuid4().hex[:8]}"
    (tmp_path / "tokens.toml").write_text(OPS_TABLE)
    (tmp_path / "acl.toml").write_text(ACL)
    args = ["--storage", cluster.storage_url, "--http-port", "0"]
    env = {"TIDEWIRE_AUTH_TOKENS_FILE": str(tmp_path / "tokens.toml"),
           "TIDEWIRE_AUTH_ACL_FILE": str(tmp_path / "acl.toml")}  # fmt: skip

    def base(lines: list[str]) -> str:
        return endpoint(lines, "/healthz").removesuffix("/healthz")

    with server(*args, env=env) as a, server(*args, env=env) as b:
        url_a, url_b = base(read_until(a, "ready", 60)), base(read_until(b, "ready", 60))
        status, body = call(url_a, "POST", "/api/streams",
                            {"name": stream, "retention_ms": 86_400_000})  # fmt: skip
        assert status == 201, body
        poll("gateway b lists it", lambda: retention_on(url_b, stream) is not None)
        status, body = call(url_b, "PATCH", f"/api/streams/{stream}", {"retention_bytes": 1 << 20})
        assert status == 200, body
        wanted = {"ms": 86_400_000, "bytes": 1 << 20, "source": "runtime"}
        poll("gateway a learns the change", lambda: retention_on(url_a, stream) == wanted)
        a.send_signal(signal.SIGTERM)
        assert a.wait(60) == 0
    with server(*args, env=env) as again, server(*args, env=env) as b:
        url_again, url_b = base(read_until(again, "ready", 60)), base(read_until(b, "ready", 60))
        assert retention_on(url_again, stream) == wanted  # (kept in the cluster)
        status, body = call(url_again, "DELETE", f"/api/streams/{stream}")
        assert (status, body) == (200, {"deleted": stream})
        poll("gateway b forgets it", lambda: retention_on(url_b, stream) is None)
        status, body = call(url_b, "DELETE", f"/api/streams/{stream}")
        assert status == 404, body
