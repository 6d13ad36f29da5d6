"""The security tests' harness: a real hub to attack, and a well-behaved client beside it.

:func:`real_hub` runs ``tidewire serve`` as a child process on free 127.0.0.1 ports with the
settings, tokens and ACL a test gives, and stops it by its pid. Its resident memory is read from
``/proc`` (:meth:`RealHub.rss`, and the peak :meth:`RealHub.peak_rss`), which is what the
budget promises to bound; its log is a file (:meth:`RealHub.log_text`).

:func:`bystander` is the client whose service the attacks must not take away: it publishes
small batches over RS.io as fast as a window of four in flight allows and subscribes to what it
publishes on a second connection, in a thread of its own with its own event loop, so that the
attacker's work in the test's loop cannot be mistaken for the hub's. Every value carries the
time it was sent; the largest send-to-receive time is the **stall** a hub pause would show.
The hub runs with ``log.fsync = false`` unless a test says otherwise: the disk's latency is
not what these tests are about.

Test modules in ``tests/security/`` import it as ``from harness import real_hub, bystander``
(pytest puts a test's folder on the path, as for ``tests/log/crash_child.py``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import tidewire
from certs import Pki
from helpers import child_env
from serveproc import read_until
from tidewire.client.rsio import Receipt
from tidewire.config import env_name
from tidewire.hub.access import mint_token

__all__ = ["BYSTANDER_MAX_STALL_S", "BystanderReport", "RealHub", "bystander", "real_hub"]

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

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


_STAMP = struct.Struct(">d")
_BATCH = 100
_VALUE = 100


async def bystander(hub: RealHub, seconds: float, *, token: str | None = None,
                    stream: str | None = None) -> BystanderReport:  # fmt: skip
    """Publish and subscribe over RS.io for ``seconds`` (in a thread with its own loop)."""
    name = stream or f"bystander.{uuid.uuid4().hex[:8]}"
    return await asyncio.to_thread(_in_thread, hub.rsio_url, seconds, token, name)


def _in_thread(url: str, seconds: float, token: str | None, stream: str) -> BystanderReport:
    report = BystanderReport(seconds, 0, 0.0, [])
    result: list[BystanderReport] = []

    def main() -> None:
        with asyncio.Runner() as runner:
            try:
                runner.run(asyncio.wait_for(_run(url, seconds, token, stream, report),
                                            seconds + 30))  # fmt: skip
            except Exception as exc:  # the report says what went wrong
                report.errors.append(repr(exc))
        result.append(report)

    thread = threading.Thread(target=main, name="bystander", daemon=True)
    thread.start()
    thread.join(seconds + 60)
    if not result:
        report.errors.append("the bystander did not finish")
    return report


async def _run(url: str, seconds: float, token: str | None, stream: str,
               report: BystanderReport) -> None:  # fmt: skip
    pad = b"\x00" * (_VALUE - _STAMP.size)
    async with await tidewire.connect(url, token=token) as pub_hub, \
            await tidewire.connect(url, token=token) as sub_hub:  # fmt: skip
        await pub_hub.publish(stream, [_STAMP.pack(time.monotonic()) + pad])
        done = asyncio.Event()

        async def subscribe() -> None:
            async for batch in sub_hub.subscribe(stream):
                now = time.monotonic()
                for i in (0, len(batch) - 1):
                    (sent,) = _STAMP.unpack_from(batch.value(i))
                    report.max_stall_s = max(report.max_stall_s, now - sent)
                report.events += len(batch)
                if done.is_set():
                    return

        async def publish() -> None:
            pub = await pub_hub.publisher(stream, format="value")
            window: list[asyncio.Future[Receipt]] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                values = [_STAMP.pack(time.monotonic()) + pad] * _BATCH
                window.append(await pub.submit(values))
                if len(window) >= 4:
                    await window.pop(0)
            for receipt in window:
                await receipt
            await pub.close()

        reader = asyncio.create_task(subscribe())
        started = time.monotonic()
        await publish()
        done.set()
        await pub_hub.publish(stream, [_STAMP.pack(time.monotonic()) + pad])  # wakes the reader
        await asyncio.wait_for(reader, 30)
        report.seconds = time.monotonic() - started
