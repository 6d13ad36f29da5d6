"""``tidewire streams create/retention/delete`` against a real ``tidewire serve`` on 127.0.0.1
with a tokens file and an ACL granting ``admin`` on ``orders*`` to one token (``ops``) and not
to another (``ci``): each command, the hub's refusals as one line and exit status 1, delete's
confirmation (a wrong name deletes nothing) and ``--yes``; ``tidewire streams`` alone still
lists. The commands run in-process with click's CliRunner; what the hub holds is read back
through ``AdminClient``."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner, Result

import tidewire
from serveproc import endpoint, read_until, server
from tidewire.cli import main
from tidewire.client.admin import AdminClient
from tidewire.hub.access import mint_token

pytestmark = pytest.mark.timeout(120)

OPS, OPS_TABLE = mint_token("ops")
CI, CI_TABLE = mint_token("ci")
ACL = ('[principal."token:ops"]\nadmin = ["orders*"]\nmonitor = true\n'
       '[principal."token:ci"]\nread = ["*"]\nwrite = ["*"]\nmonitor = true\n')  # fmt: skip
DAY = 86_400_000


@dataclass(frozen=True)
class Hub:
    http: str  # http://127.0.0.1:port
    rsio: str  # rsio://127.0.0.1:port


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """One hub with tokens and the ACL above for the module; each test uses streams of its
    own."""
    home = tmp_path_factory.mktemp("hub")
    (home / "tokens.toml").write_text(OPS_TABLE + CI_TABLE)
    (home / "acl.toml").write_text(ACL)
    args = ["--data-dir", str(home / "data"), "--http-port", "0", "--set", "log_level=warning",
            "--set", f"auth.tokens_file={home / 'tokens.toml'}",
            "--set", f"auth.acl_file={home / 'acl.toml'}"]  # fmt: skip
    with server(*args) as proc:
        lines = read_until(proc, "ready")
        rsio = next(w for line in lines for w in line.split() if w.startswith("rsio://"))
        yield Hub(endpoint(lines, "/healthz").removesuffix("/healthz"), rsio)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def invoke(hub: Hub, *args: str, token: str | None = OPS, stdin: str | None = None) -> Result:
    """``tidewire ARGS`` with the hub's URL (and ``token``) in the environment, as a user's
    shell would have them."""
    env = {"TIDEWIRE_HTTP_URL": hub.http, "TIDEWIRE_TOKEN": token}
    return CliRunner().invoke(main, list(args), env=env, input=stdin)


def retentions(hub: Hub) -> dict[str, Any]:
    """Each stream's retention, as ``GET /api/streams`` says."""

    async def go() -> dict[str, Any]:
        async with AdminClient(hub.http, token=OPS) as admin:
            return {s["name"]: s["retention"] for s in await admin.streams()}

    return asyncio.run(go())


def publish(hub: Hub, stream: str, n: int) -> None:
    async def go() -> None:
        async with asyncio.timeout(30), tidewire.connect(hub.rsio, token=CI) as client:
            await client.publish(stream, [b"event %d" % i for i in range(n)])

    asyncio.run(go())


def test_create_then_change_the_retention(hub: Hub) -> None:
    result = invoke(hub, "streams", "create", "orders-a", "--retention", "7d",
                    "--retention-bytes", "1GiB")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == ("created stream 'orders-a'; retention: 7d (604800000 ms), "
                             "1 GiB (1073741824 bytes), set at runtime\n")  # fmt: skip
    assert retentions(hub)["orders-a"] == {"ms": 7 * DAY, "bytes": 2**30, "source": "runtime"}

    # a bound not given is kept; none lifts one
    result = invoke(hub, "streams", "retention", "orders-a", "--retention-bytes", "none")
    assert result.exit_code == 0, result.output
    assert result.stdout == ("stream 'orders-a'; retention now: 7d (604800000 ms), "
                             "no size bound, set at runtime\n")  # fmt: skip
    result = invoke(hub, "streams", "retention", "orders-a", "--retention-ms", "3600000",
                    "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "name": "orders-a", "retention": {"ms": 3_600_000, "bytes": None, "source": "runtime"}}
    # NATS's names for the same options
    result = invoke(hub, "streams", "retention", "orders-a", "--max-age", "2h",
                    "--max-bytes", "500MB")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert retentions(hub)["orders-a"] == {"ms": 7_200_000, "bytes": 500 * 10**6,
                                           "source": "runtime"}  # fmt: skip

    # without options: the configuration's retention (this hub's: no bound)
    result = invoke(hub, "streams", "create", "orders-b", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "name": "orders-b", "retention": {"ms": None, "bytes": None, "source": "default"}}

    # the listing is as before, with the new streams in it
    result = invoke(hub, "streams", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["orders-a"]["events"] == 0
    assert list(rows["orders-a"]) == ["name", "events", "first_id", "latest_id", "bytes",
                                      "events_in_rate", "events_out_rate", "bytes_in_rate",
                                      "bytes_out_rate"]  # fmt: skip


def test_what_the_hub_refuses_is_one_line_and_exit_status_1(hub: Hub) -> None:
    publish(hub, "other-a", 1)
    # a principal without the admin right
    result = invoke(hub, "streams", "create", "orders-c", token=CI)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: 403 Forbidden: refused: may not admin stream "
                                    "'orders-c' (the ACL must grant this principal admin")
    assert len(result.stderr.splitlines()) == 1
    # a stream the right does not cover
    result = invoke(hub, "streams", "retention", "other-a", "--retention", "1d")
    assert result.exit_code == 1
    assert "403 Forbidden: refused: may not admin stream 'other-a'" in result.stderr
    result = invoke(hub, "streams", "delete", "other-a", "--yes")
    assert result.exit_code == 1
    assert "403 Forbidden" in result.stderr
    # no token
    result = invoke(hub, "streams", "delete", "orders-c", "--yes", token=None)
    assert result.exit_code == 1
    assert "401 Unauthorized" in result.stderr
    assert "give a token with --token" in result.stderr
    # exists, does not exist
    assert invoke(hub, "streams", "create", "orders-c").exit_code == 0
    result = invoke(hub, "streams", "create", "orders-c")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: 409 Conflict: ")
    result = invoke(hub, "streams", "retention", "orders-none", "--retention", "1d")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: 404 Not Found: ")
    assert "admin API" not in result.stderr  # (a 404 of a write is "no such stream")
    streams = retentions(hub)
    assert "other-a" in streams
    assert streams["orders-c"]["source"] == "default"


def test_mistakes_are_usage_errors_before_anything_is_sent(hub: Hub) -> None:
    cases = [
        (["streams", "retention", "orders-d"], "nothing to change"),
        (["streams", "create", "orders-d", "--retention", "7d", "--retention-ms", "1"],
         "--retention and --retention-ms"),
        (["streams", "create", "orders-d", "--retention-bytes", "1G"], "say GiB for 2**30"),
        (["streams", "create", "orders-d", "--retention", "604800000"], "has no unit"),
        (["streams", "--json", "create", "orders-d"], "--json is for the listing"),
        (["streams", "create"], "Missing argument 'NAME'"),
    ]  # fmt: skip
    for args, message in cases:
        result = invoke(hub, *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
    assert "orders-d" not in retentions(hub)


def test_delete_asks_for_the_name_unless_yes(hub: Hub) -> None:
    for name in ("orders-e", "orders-f"):
        publish(hub, name, 3)
    result = invoke(hub, "streams", "delete", "orders-e", stdin="orders-f\n")
    assert result.exit_code == 1
    assert "Type its name to confirm" in result.stderr
    assert "not deleted: 'orders-f' is not 'orders-e'" in result.stderr
    assert result.stdout == ""
    result = invoke(hub, "streams", "delete", "orders-e", stdin="")  # no answer at all
    assert result.exit_code == 1
    assert {"orders-e", "orders-f"} <= set(retentions(hub))

    result = invoke(hub, "streams", "delete", "orders-e", stdin="orders-e\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == "deleted stream 'orders-e'\n"
    result = invoke(hub, "streams", "delete", "orders-f", "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"deleted": "orders-f"}
    assert "Type its name" not in result.stderr
    assert not {"orders-e", "orders-f"} & set(retentions(hub))
    result = invoke(hub, "streams", "delete", "orders-f", "-y")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: 404 Not Found: ")

    # made again under the name, the stream starts at id 1
    publish(hub, "orders-e", 2)
    result = invoke(hub, "streams", "--json")
    rows = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert (rows["orders-e"]["first_id"], rows["orders-e"]["latest_id"]) == (1, 2)


def test_connection_options_before_the_command_apply_to_it(hub: Hub) -> None:
    env = {"TIDEWIRE_HTTP_URL": "http://127.0.0.1:1", "TIDEWIRE_TOKEN": None}
    result = CliRunner().invoke(main, ["streams", "--url", hub.http, "--token", OPS,
                                       "create", "orders-g"], env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    # given after the command name, an option is the command's own
    result = CliRunner().invoke(main, ["streams", "--url", "http://127.0.0.1:1", "delete",
                                       "orders-g", "--url", hub.http, "--token", OPS, "-f"],
                                env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "orders-g" not in retentions(hub)
