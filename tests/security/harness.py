"""The security tests' harness: a real hub to attack, and a well-behaved client beside it.

:func:`real_hub` runs ``tidewire serve`` as a child process on free 127.0.0.1 ports with the
settings, tokens and ACL a test gives, and stops it by its pid. Its resident memory is read from
``/proc`` (:meth:`RealHub.rss`, and the peak :meth:`RealHub.peak_rss`), which is what the
budget promises to bound; its log is a file (:meth:`RealHub.log_text`).

:func:`bystander` is the client whose service the attacks must not take away: it publishes
small batches over RS.io as fast as a window of four in flight allows and subscribes to what it
publishes on a second connection, in a process of its own (``bystander_child.py``), so that the
attacker's work in the test's process cannot be mistaken for the hub's. Every value carries the
time it was sent; the largest send-to-receive time is the **stall** a hub pause would show.
The hub runs with ``log.fsync = false`` unless a test says otherwise: the disk's latency is
not what these tests are about.

:func:`alone` runs the bystander before an attack, and :func:`assert_served` judges its run under
the attack against that: no errors, no stall over :func:`stall_bound` (the promise, over what
this shared machine shows with no attack at all, and over what a do-nothing process beside the
bystander overslept in the same window: tests/noise.py), and, when asked, a share of its
throughput.

Test modules in ``tests/security/`` import it as ``from harness import real_hub, bystander``
(pytest puts a test's folder on the path, as for ``tests/log/crash_child.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from certs import Pki
from helpers import child_env, run
from noise import MachineNoise
from serveproc import read_until
from tidewire.config import env_name
from tidewire.hub.access import mint_token

__all__ = ["BYSTANDER_MAX_STALL_S", "BystanderReport", "RealHub", "alone", "assert_served",
           "bystander", "real_hub", "stall_bound"]

BYSTANDER_MAX_STALL_S = 0.1
"""The promise: a well-behaved client sees no stall over this while the hub is attacked."""

MiB = 1024 * 1024


@dataclass
class RealHub:
    """A running ``tidewire serve`` child and how to reach it."""

    proc: subprocess.Popen[str]
    banner: list[str]
    log_path: Path
    tokens: dict[str, str] = field(default_factory=dict)
    scheme_tls: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _port(self, scheme: str) -> int:
        for line in self.banner:
            for word in line.split():
                if word.startswith((f"{scheme}://", f"{scheme}s://")):
                    return int(word.rsplit(":", 1)[1].split("/", 1)[0])
        raise AssertionError(f"no {scheme} endpoint in {self.banner}")

    @property
    def rsio_port(self) -> int:
        return self._port("rsio")

    @property
    def rsio_url(self) -> str:
        return f"{'rsios' if self.scheme_tls else 'rsio'}://127.0.0.1:{self.rsio_port}"

    @property
    def seguro_port(self) -> int:
        return self._port("seguro")

    @property
    def tolliver_port(self) -> int:
        return self._port("tolliver")

    @property
    def http_port(self) -> int:
        return self._port("http")

    @property
    def http_base(self) -> str:
        return f"{'https' if self.scheme_tls else 'http'}://127.0.0.1:{self.http_port}"

    @property
    def tube_url(self) -> str:
        return f"{'wss' if self.scheme_tls else 'ws'}://127.0.0.1:{self.http_port}/tube"

    def _status(self, key: str) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(f"no {key} for pid {self.pid}")

    def rss(self) -> int:
        """The hub's resident memory now, in bytes."""
        return self._status("VmRSS")

    def peak_rss(self) -> int:
        """The most the hub has been resident since it started, in bytes."""
        return self._status("VmHWM")

    def log_text(self) -> str:
        """Everything the hub logged (its stderr) so far."""
        return self.log_path.read_text(errors="replace")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)


@contextmanager
def real_hub(
    tmp_path: Path,
    *,
    settings: Mapping[str, object] | None = None,
    acl: str | None = None,
    tokens: Sequence[str] = (),
    pki: Pki | None = None,
    client_auth: str = "optional",
) -> Iterator[RealHub]:
    """``tidewire serve`` with ``settings`` (dotted keys), bearer tokens for ``tokens`` (names;
    the tokens are in ``RealHub.tokens``), an ACL (TOML text) and, with ``pki``, TLS on every
    listener. Stopped (SIGTERM, then SIGKILL) by its pid when the block ends."""
    home = tmp_path / f"hub-{uuid.uuid4().hex[:8]}"
    home.mkdir()
    env = {**child_env(), "TIDEWIRE_DATA_DIR": str(home / "data"), "TIDEWIRE_HTTP_PORT": "0",
           "TIDEWIRE_RSIO_PORT": "0", "TIDEWIRE_SEGURO_PORT": "0", "TIDEWIRE_TOLLIVER_PORT": "0",
           "TIDEWIRE_HOST": "127.0.0.1", "TIDEWIRE_LOG_FSYNC": "false"}  # fmt: skip
    issued: dict[str, str] = {}
    if tokens:
        tables = []
        for name in tokens:
            issued[name], table = mint_token(name)
            tables.append(table)
        (home / "tokens.toml").write_text("\n".join(tables))
        env[env_name("auth.tokens_file")] = str(home / "tokens.toml")
    if acl is not None:
        (home / "acl.toml").write_text(acl)
        env[env_name("auth.acl_file")] = str(home / "acl.toml")
    if pki is not None:
        env.update({env_name("tls.cert_file"): pki.server_cert,
                    env_name("tls.key_file"): pki.server_key,
                    env_name("tls.ca_file"): pki.ca_file,
                    env_name("tls.client_auth"): client_auth})  # fmt: skip
    for key, value in (settings or {}).items():
        env[env_name(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    log_path = home / "hub.log"
    with open(log_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tidewire.cli", "serve"], env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)  # fmt: skip
    try:
        try:
            banner = read_until(proc, "ready", timeout=60)
        except AssertionError:
            raise AssertionError(f"the hub did not start: {log_path.read_text()}") from None
        yield RealHub(proc, banner, log_path, issued, scheme_tls=pki is not None)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


@dataclass
class BystanderReport:
    """What the well-behaved client saw."""

    seconds: float
    events: int
    max_stall_s: float
    errors: list[str]
    machine_stall_s: float = 0.0
    """What a do-nothing process overslept over the same window (tests/noise.py)."""

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


async def bystander(hub: RealHub, seconds: float, *, token: str | None = None,
                    stream: str | None = None) -> BystanderReport:  # fmt: skip
    """Publish and subscribe over RS.io for ``seconds``, in a child process of its own
    (``bystander_child.py``: the attacker's work in this process holds no lock it needs);
    the child is stopped by its pid if this is cancelled."""
    name = stream or f"bystander.{uuid.uuid4().hex[:8]}"
    env = {**child_env(), "BYSTANDER_TOKEN": token or ""}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("bystander_child.py")), hub.rsio_url,
        str(seconds), name, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)  # fmt: skip
    try:
        async with MachineNoise() as noise:
            out, err = await asyncio.wait_for(proc.communicate(), seconds + 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    try:
        fields = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return BystanderReport(seconds, 0, 0.0, [f"the bystander failed: {err.decode()[-2000:]}"])
    return BystanderReport(**fields, machine_stall_s=noise.max_lag_s)


def alone(hub: RealHub, seconds: float = 1.5, *, token: str | None = None) -> BystanderReport:
    """The bystander on its own, just before an attack (from synchronous test code): what this
    busy machine shows with no attack, for :func:`assert_served` to compare with."""
    report = run(bystander(hub, seconds, token=token), seconds + 90)
    assert report.errors == [], report.errors
    return report


def stall_bound(solo: BystanderReport | None = None, promise: float = BYSTANDER_MAX_STALL_S
                ) -> float:  # fmt: skip
    """The stall the bystander may see under attack: the promise, over what ``solo`` (the same
    client with no attack, measured just before) saw on this shared machine."""
    return promise + (solo.max_stall_s if solo is not None else 0.0)


def assert_served(solo: BystanderReport | None, report: BystanderReport, *,
                  promise: float = BYSTANDER_MAX_STALL_S) -> None:  # fmt: skip
    """The bystander was served under attack: no errors, some events, no stall over
    :func:`stall_bound` of ``solo`` (the bare promise without one). What it keeps of its
    throughput is a speed figure, so a benchmark's (benchmarks/hostile_load.py), not a test's.
    What the machine itself stalled over the run (``report.machine_stall_s``, a do-nothing
    process beside it) is the hub's to be forgiven, not to be charged with."""
    assert report.errors == [], report.errors
    assert report.events > 0, report
    bound = stall_bound(solo, promise) + report.machine_stall_s
    assert report.max_stall_s < bound, (solo, report)
