"""RS.io over HTTP (seed 002) from the outside: a real ``tidewire serve`` process on 127.0.0.1
and free ports, driven by tools that know nothing of tidewire.

* the real ``curl`` binary: subscribe, fetch a batch, cancel, fetch again (a saved transcript);
* 1,000 idle long-polls at once: the server's memory stays bounded, it answers ``/healthz``
  meanwhile, one append wakes every fetch, the next round all get 204 when the window passes;
* 20 clients that read their responses slowly (or not at all) while a stream of 200 MiB waits
  for them: the server's memory stays bounded (a few ``http.max_response_bytes`` per
  subscription), and a normal client meanwhile gets its elements;
* malformed requests on a raw socket: each gets a 4xx (exact status checked), the server stays
  up, other subscriptions keep working, and no Python traceback reaches the server's output; a
  body on a fetch is ignored (docs/protocols/rsio-http.md) and never taken for a request.

No mocks; every wait is bounded in count and time; every process is stopped, also on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import helpers
import tidewire
from tidewire.client.http import HttpHub
from tidewire.client.rsio import Receipt

HOST = "127.0.0.1"
KiB = 1024
MiB = 1024 * 1024
TRACEBACK = "Traceback (most recent call last)"


# ---------------------------------------------------------------------- the server process


@dataclass(frozen=True, slots=True)
class Served:
    proc: subprocess.Popen[bytes]
    port: int  # HTTP
    rsio: str  # rsio://127.0.0.1:<port>
    out: Path
    err: Path

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def stderr_size(self) -> int:
        return self.err.stat().st_size

    def stderr_since(self, offset: int) -> str:
        with self.err.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        return status_bytes(self.pid, "VmRSS")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


def status_bytes(pid: int, name: str) -> int:
    """``name`` (VmRSS, VmHWM) of /proc/<pid>/status, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {name} in /proc/{pid}/status")


@contextmanager
def serve(root: Path, *settings: str, timeout: float = 60.0) -> Iterator[Served]:
    """Run ``tidewire serve`` on 127.0.0.1, every port free (``--http-port 0`` and the
    ``TIDEWIRE_*_PORT=0`` variables), data in ``root/data``, ``--set`` each of ``settings``;
    yield once it printed its endpoints. stdout/stderr go to files (a pipe nobody drains could
    block it). The process is killed on the way out if the test did not stop it."""
    out, err = root / "serve.out", root / "serve.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWIRE_")}
    env.update(TIDEWIRE_RSIO_PORT="0", TIDEWIRE_SEGURO_PORT="0", TIDEWIRE_TOLLIVER_PORT="0")
    sets = [arg for setting in settings for arg in ("--set", setting)]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidewire.cli", "serve", "--data-dir", str(root / "data"),
             "--host", HOST, "--http-port", "0", *sets],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while "ready" not in (text := out.read_text(errors="replace")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("tidewire serve did not get ready:\n"
                                     + text + err.read_text(errors="replace"))  # fmt: skip
            time.sleep(0.01)  # polling for the line, bounded by the deadline
        http = re.search(r"http://127\.0\.0\.1:(\d+)/healthz", text)
        rsio = re.search(r"rsio://127\.0\.0\.1:\d+", text)
        assert http is not None, text
        assert rsio is not None, text
        yield Served(proc, int(http.group(1)), rsio.group(0), out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def stop(served: Served, *, check_output: bool = True) -> None:
    """SIGTERM: the server must exit 0, and nothing in its output may be a traceback."""
    served.proc.send_signal(signal.SIGTERM)
    try:
        code = served.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no exit within 30 s of SIGTERM:\n{served.output()}") from None
    assert code == 0, served.output()
    if check_output:
        assert TRACEBACK not in served.output(), served.output()


run = functools.partial(helpers.run, loop="uvloop")  # (these run on uvloop)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


# ---------------------------------------------------------------------- HTTP bits


@dataclass(slots=True)
class Answer:
    """A parsed HTTP/1.x response: status, headers (names lower-cased), body."""

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    raw_head: str = ""


def parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    match = re.fullmatch(r"HTTP/1\.[01] (\d{3}) ?(.*)", lines[0])
    assert match is not None, f"not an HTTP status line: {lines[0]!r}"
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(match.group(1)), match.group(2), headers


def parse_response(data: bytes) -> Answer:
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, f"no end of headers in {data[:300]!r}"
    status, reason, headers = parse_head(head)
    return Answer(status, reason, headers, body, head.decode("latin-1"))


def length_prefixed(body: bytes) -> list[bytes]:
    """Decode ``X-Rsio-LengthPrefixedElements`` here, independently of tidewire's codec:
    ``[u32 big-endian length][element]...``."""
    out: list[bytes] = []
    pos = 0
    while pos < len(body):
        assert len(body) - pos >= 4, f"cut inside a length at {pos}"
        (size,) = struct.unpack_from(">I", body, pos)
        pos += 4
        assert len(body) - pos >= size, f"element of {size} bytes cut at {pos}"
        out.append(body[pos : pos + size])
        pos += size
        assert len(out) <= 1_000_000  # bounded loop
    return out


def raw_exchange(port: int, request: bytes, *, timeout: float = 15.0,
                 limit: int = 1 * MiB) -> bytes:  # fmt: skip
    """Send ``request`` on a fresh connection and read until the server closes it (every
    request here says ``Connection: close``; aiohttp closes after its own 400s too), at most
    ``limit`` bytes and ``timeout`` seconds."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(request)
        data = bytearray()
        deadline = time.monotonic() + timeout
        while len(data) < limit:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no end of the response within {timeout} s: "
                                     f"{bytes(data[:300])!r}") from None  # fmt: skip
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
        return bytes(data)


def put_request(target: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"PUT {target} HTTP/1.1", f"Host: {HOST}", *headers, "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


# ---------------------------------------------------------------------- 1. curl transcript


def find_curl() -> str:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("the curl binary is not on PATH: the test set-up installs it "
                    "(e.g. apt-get install curl)")  # fmt: skip
    return curl


class Transcript:
    """The commands run and the responses they printed, as a reader would see them."""

    def __init__(self, path: Path, curl: str) -> None:
        self.path = path
        self.curl = curl
        self.lines: list[str] = []

    def curl_i(self, *args: str) -> Answer:
        """``curl -sS -i <args>``: status line, headers and body on stdout."""
        result = self._run("-i", *args)
        answer = parse_response(result.stdout)
        self.lines += [answer.raw_head, ""]
        if answer.body:
            self.lines += [answer.body.decode("utf-8", "replace").rstrip("\n"), ""]
        return answer

    def curl_files(self, url: str, head: Path, body: Path) -> Answer:
        """``curl -sS -X PUT -D head -o body url``: the body's exact bytes in a file."""
        self._run("-X", "PUT", "-D", str(head), "-o", str(body), url)
        status, reason, headers = parse_head(head.read_bytes().rstrip(b"\r\n"))
        data = body.read_bytes()
        self.lines += [f"# {head.name}:", head.read_text("latin-1").rstrip("\r\n"),
                       f"# {body.name}: {len(data)} bytes: {data.hex(' ')}", ""]  # fmt: skip
        return Answer(status, reason, headers, data, head.read_text("latin-1"))

    def _run(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        shown = ["curl", "-sS", *args]
        self.lines.append("$ " + shlex.join(shown))
        result = subprocess.run([self.curl, "-sS", "--max-time", "20", *args],
                                capture_output=True, timeout=30)  # fmt: skip
        assert result.returncode == 0, f"{shlex.join(shown)}: {result.stderr!r}"
        return result

    def save(self) -> str:
        text = "\n".join(line.replace("\r\n", "\n") for line in self.lines) + "\n"
        self.path.write_text(text)
        return text


VALUES = [b"alpha", b"beta", "gamma-\u03b3".encode(), b"delta delta"]


def test_curl_transcript_subscribe_fetch_cancel(tmp_path: Path) -> None:
    curl = find_curl()
    with serve(tmp_path) as served:
        published = subprocess.run(
            [sys.executable, "-m", "tidewire.cli", "publish", "notes", "--url", served.rsio],
            input=b"\n".join(VALUES) + b"\n", capture_output=True, timeout=60,
        )  # fmt: skip
        assert published.returncode == 0, published.stderr
        assert b"published 4 events to notes (ids 1..4)" in published.stderr

        log = Transcript(tmp_path / "transcript.txt", curl)
        pub_url = f"{served.base}/rsio/pub/notes?format=value&request=10"
        created = log.curl_i("-X", "PUT", pub_url)
        assert (created.status, created.reason) == (201, "Created"), created
        location = created.headers["location"]
        assert re.fullmatch(rf"http://127\.0\.0\.1:{served.port}/rsio/sub/[A-Za-z0-9_-]{{22}}",
                            location), location  # fmt: skip

        got = log.curl_files(location, tmp_path / "fetch.headers", tmp_path / "fetch.body")
        assert got.status == 200, got
        assert got.headers["content-encoding"] == "X-Rsio-LengthPrefixedElements"
        assert "content-type" not in got.headers  # the seed: none on element responses
        assert int(got.headers["content-length"]) == len(got.body)
        assert got.headers["x-tidewire-sequence"] == "0"
        assert length_prefixed(got.body) == VALUES
        assert got.body[:9] == b"\x00\x00\x00\x05alpha"  # unsigned big-endian lengths

        cancelled = log.curl_i("-X", "PUT", location + "/cancel")
        assert cancelled.status == 200, cancelled
        assert cancelled.body == b""

        gone = log.curl_i("-X", "PUT", location)
        assert gone.status == 404, gone
        assert gone.headers["x-rsio-error"] == "true"
        assert gone.headers["content-type"].startswith("text/plain")
        assert gone.body.strip(), "an onError carries a message"

        text = log.save()
        stop(served)
    saved = (tmp_path / "transcript.txt").read_text()
    assert saved == text
    commands = [line for line in saved.splitlines() if line.startswith("$ curl")]
    assert commands == [
        f"$ curl -sS -i -X PUT '{pub_url}'",
        f"$ curl -sS -X PUT -D {tmp_path / 'fetch.headers'} -o {tmp_path / 'fetch.body'} "
        f"{location}",
        f"$ curl -sS -i -X PUT {location}/cancel",
        f"$ curl -sS -i -X PUT {location}",
    ]
    statuses = re.findall(r"^HTTP/1\.1 (\d{3})", saved, re.MULTILINE)
    assert statuses == ["201", "200", "200", "404"], saved
    assert f"Location: {location}" in saved
    assert "Content-Encoding: X-Rsio-LengthPrefixedElements" in saved
    assert "00 00 00 05 61 6c 70 68 61 00 00 00 04 62 65 74 61" in saved  # alpha, beta
    assert "X-Rsio-Error: true" in saved


# ---------------------------------------------------------------------- 2. 1,000 idle long-polls

N_POLLS = 1000
POLL_SECONDS = 8.0  # the hub's poll window here: long enough to open 1,000 fetches in
OPEN_SECONDS = 5.0  # at most this long to get 1,000 fetches open (measured: ~1.8 s on 2 cores)
# What 1,000 waiting fetches (and their 1,000 subscriptions) may add to the server's RSS. Each
# holds one connection (uvloop transport, aiohttp protocol and parser, the request, the handler
# task and its wait_for timer) and one subscription (a _Sub, its pump task waiting for a commit,
# the hub's Subscription, the log's commit waiter): a few KiB to a few tens of KiB each, so
# 1,000 of them are a few tens of MiB at most. 64 MiB (64 KiB per waiting fetch) leaves room
# for the allocator, and still fails any per-connection buffer (one 64 KiB read buffer each
# would already be 62 MiB on its own, 256 KiB would be 250 MiB).
IDLE_RSS_BOUND = 64 * MiB
FD_LIMIT_NEEDED = 2200  # 1,000 fetches + the subscribe pool + the interpreter's own


def raise_fd_limit(needed: int) -> None:
    """Lift the soft open-files limit to the hard one when it is below ``needed``; skip (with
    the reason) when even the hard limit is below."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the hard open-files limit is {hard}: {N_POLLS} concurrent connections "
                    f"need about {needed}")  # fmt: skip
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass(slots=True)
class IdleReport:
    rss_before: int = 0  # before any subscription
    rss_subscribed: int = 0  # 1,000 subscriptions, no fetch
    rss_waiting: int = 0  # 1,000 fetches waiting
    hwm_waiting: int = 0  # VmHWM while they waited (reset before, where allowed)
    rss_second_round: int = 0  # 1,000 fetches waiting again, after the first round's answers
    fds_before: int = 0
    fds_waiting: int = 0
    fds_after: int = 0
    setup_s: float = 0.0  # from the first fetch sent to all 1,000 open at the server
    wake_s: float = 0.0  # from the append to the last fetch answered
    window_s: float = 0.0  # second round: from the fetches sent to the last 204
    statuses: dict[str, int] = field(default_factory=dict)

    def figures(self) -> str:
        return (f"server VmRSS: {self.rss_before / MiB:.1f} MiB before, "
                f"{self.rss_subscribed / MiB:.1f} MiB with {N_POLLS} subscriptions, "
                f"{self.rss_waiting / MiB:.1f} MiB with {N_POLLS} fetches waiting (VmHWM "
                f"{self.hwm_waiting / MiB:.1f} MiB), {self.rss_second_round / MiB:.1f} MiB in "
                f"the second round; growth {(self.rss_waiting - self.rss_before) / MiB:.1f} MiB "
                f"(bound {IDLE_RSS_BOUND / MiB:.0f} MiB); fds {self.fds_before} -> "
                f"{self.fds_waiting} -> {self.fds_after}; all open at the server after "
                f"{self.setup_s:.2f} s, all woken {self.wake_s:.2f} s after the append, "
                f"all 204 {self.window_s:.2f} s after the second round started; "
                f"statuses {self.statuses}")  # fmt: skip


def reset_hwm(pid: int) -> None:
    """VmHWM back to VmRSS (if refused, VmHWM keeps the earlier peak: pessimistic)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")


async def wait_for(predicate: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.02)  # polling a condition, bounded by the deadline


async def idle_longpolls(served: Served, report: IdleReport) -> None:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=120)
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=20, sock_read=POLL_SECONDS + 30)
    tasks: list[asyncio.Task[tuple[int, Any, bytes]]] = []
    try:
        await _idle_longpolls(served, report, connector, client_timeout, tasks)
    finally:  # on a failure: no fetch left behind
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # The client closed its connections: the server's file descriptors are back.
    await wait_for(lambda: served.fds() <= report.fds_before + 5, 15,
                   "the server closed the 1,000 connections")  # fmt: skip
    report.fds_after = served.fds()


async def _idle_longpolls(served: Served, report: IdleReport, connector: aiohttp.TCPConnector,
                          client_timeout: aiohttp.ClientTimeout,
                          tasks: list[asyncio.Task[tuple[int, Any, bytes]]]) -> None:  # fmt: skip
    base = served.base
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout,
                                     auto_decompress=False) as session:  # fmt: skip

        async def put(url: str, gate: asyncio.Semaphore | None = None) -> tuple[int, Any, bytes]:
            if gate is not None:
                async with gate:
                    return await put(url)
            async with session.put(url) as response:
                return response.status, response.headers, await response.read()

        async def healthz() -> bytes:
            async with session.get(f"{base}/healthz") as response:
                assert response.status == 200
                return await response.read()

        assert await healthz() == b"ok\n"
        report.rss_before, report.fds_before = served.rss(), served.fds()

        gate = asyncio.Semaphore(100)
        subscribed = await asyncio.gather(
            *(put(f"{base}/rsio/pub/idle?format=value&request=1", gate) for _ in range(N_POLLS))
        )
        assert all(status == 201 for status, _, _ in subscribed), {s for s, _, _ in subscribed}
        locations = [headers["Location"] for _, headers, _ in subscribed]
        assert len(set(locations)) == N_POLLS  # never reused
        report.rss_subscribed = served.rss()

        # Round 1: 1,000 fetches at once, every one on its own connection, all waiting.
        reset_hwm(served.pid)
        started = time.monotonic()
        fetches = [asyncio.create_task(put(location)) for location in locations]
        tasks += fetches
        # (one of the 1,000 connections may be the keep-alive one open at fds_before)
        await wait_for(lambda: served.fds() >= report.fds_before + N_POLLS - 1,
                       OPEN_SECONDS, f"{N_POLLS} connections open at the server")  # fmt: skip
        report.setup_s = time.monotonic() - started
        assert await healthz() == b"ok\n"  # it answers meanwhile (after the fetches' requests)
        report.rss_waiting = served.rss()
        report.hwm_waiting = status_bytes(served.pid, "VmHWM")
        report.fds_waiting = served.fds()
        early = sum(task.done() for task in fetches)
        assert early == 0, f"{early} fetches were answered before anything was appended"

        # One event on the stream they all follow wakes every one of them.
        appended = time.monotonic()
        async with tidewire.connect(served.rsio) as hub:
            assert await hub.publish("idle", [b"wake up"]) == Receipt(1, 1, 1)
        answers = await asyncio.gather(*fetches)
        report.wake_s = time.monotonic() - appended
        statuses = [status for status, _, _ in answers]
        report.statuses["round 1"] = statuses.count(200)
        assert statuses == [200] * N_POLLS, sorted(set(statuses))
        assert all(body == b"wake up" for _, _, body in answers)
        assert all(h.get("X-Tidewire-Sequence") == "0" for _, h, _ in answers)
        assert all("Content-Encoding" not in h for _, h, _ in answers)  # one element each

        # Round 2, on the same 1,000 keep-alive connections: they wait again (demand 1 more,
        # nothing new), and all get 204 when the window passes.
        started = time.monotonic()
        fetches = [asyncio.create_task(put(location + "?request=1")) for location in locations]
        tasks += fetches
        assert await healthz() == b"ok\n"
        report.rss_second_round = served.rss()
        answers = await asyncio.gather(*fetches)
        report.window_s = time.monotonic() - started
        statuses = [status for status, _, _ in answers]
        report.statuses["round 2"] = statuses.count(204)
        assert statuses == [204] * N_POLLS, sorted(set(statuses))
        assert all(body == b"" for _, _, body in answers)
        assert POLL_SECONDS - 0.5 <= report.window_s <= POLL_SECONDS + 10, report.window_s

        # Cancel every one (200), after which each is gone (404 with X-Rsio-Error).
        cancelled = await asyncio.gather(*(put(f"{loc}/cancel", gate) for loc in locations))
        assert [status for status, _, _ in cancelled] == [200] * N_POLLS
        gone = await asyncio.gather(*(put(loc, gate) for loc in locations))
        assert all(s == 404 and h.get("X-Rsio-Error") == "true" for s, h, _ in gone)


def test_thousand_idle_long_polls_hold_bounded_memory(tmp_path: Path) -> None:
    raise_fd_limit(FD_LIMIT_NEEDED)
    report = IdleReport()
    # (all from 127.0.0.1: lift the per-address bound, which is 256 by default)
    with serve(tmp_path, f"http.poll_seconds={POLL_SECONDS}",
               "limits.max_connections_per_peer=5000") as served:  # fmt: skip
        try:
            run(idle_longpolls(served, report), timeout=60)
        finally:
            print("\n" + report.figures())
        assert served.alive(), served.output()
        assert report.rss_waiting - report.rss_before < IDLE_RSS_BOUND, report.figures()
        assert report.hwm_waiting - report.rss_before < IDLE_RSS_BOUND, report.figures()
        assert report.rss_second_round - report.rss_before < IDLE_RSS_BOUND, report.figures()
        stop(served)


# ---------------------------------------------------------------------- 3. slow clients

SLOW_CLIENTS = 20
BIG_VALUE = 64 * KiB
BIG_EVENTS = 3200  # x 64 KiB = 200 MiB
BIG_SUBMIT = 16  # 1 MiB per submit
RESPONSE_BYTES = 1 * MiB  # http.max_response_bytes here (the default is 4 MiB)
SLOW_DEMAND = 1_000_000  # far more than the stream holds: only the server's bounds hold it back
NORMAL_EVENTS = 320  # 20 MiB the normal client reads while the slow ones stall
SLOW_PAUSE_S = 0.1  # the slow clients' deliberate pace: 4 KiB each per pause
SLOW_ROUNDS = 15
# What the 20 slow subscriptions may add to the server's RSS (the unbounded failure mode is
# each one holding the stream for its client: 20 x 200 MiB = 4 GiB). Per subscription the hub
# holds (docs/protocols/rsio-http.md, "Limits and lifetime"; hub/subscription.py): what its pump
# read ahead of the fetches (under max_response_bytes before it reads one more hub batch of at
# most max_response_bytes: 2 MiB); the one unsent delivery, being written to a client that does
# not read (1 MiB), plus what the transport buffers of it (up to 1 MiB more); the hub
# subscription's carry (readahead_bytes, max(1 MiB, max_response_bytes) = 1 MiB): about
# 5 x max_response_bytes = 5 MiB, 100 MiB for 20. The rest of 160 MiB (60 MiB) is for the
# normal client's subscription, the log's reads in flight and the allocator's slack.
# Measured on a 2-core machine: 106-117 MiB (about 3.3 x max_response_bytes + 2.5 MiB per slow
# subscription: 182 MiB with max_response_bytes = 2 MiB).
SLOW_RSS_BOUND = 160 * MiB


def big_value(event_id: int) -> bytes:
    """Event ``event_id``'s value: its id (8 bytes big-endian), then a filler from the id."""
    return event_id.to_bytes(8, "big") + bytes([event_id % 251]) * (BIG_VALUE - 8)


class RssSampler(threading.Thread):
    """The server's VmRSS every ``interval`` s; ``peak`` is the highest seen, with VmHWM (reset
    at the start where allowed, else pessimistic: it holds the earlier peak)."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.finished = threading.Event()
        reset_hwm(pid)
        self.baseline = status_bytes(pid, "VmRSS")
        self.peak = self.baseline
        self.hwm = 0
        self.samples = 1

    def run(self) -> None:
        while not self.finished.wait(self.interval):
            try:
                self.peak = max(self.peak, status_bytes(self.pid, "VmRSS"))
            except OSError:  # the process is gone: the test fails elsewhere
                return
            self.samples += 1

    def stop(self) -> None:
        self.finished.set()
        self.join(timeout=10)
        with contextlib.suppress(OSError):
            self.hwm = status_bytes(self.pid, "VmHWM")
            self.peak = max(self.peak, self.hwm)


@dataclass(slots=True)
class SlowReport:
    publish_s: float = 0.0
    rss_empty: int = 0  # before publishing
    rss_published: int = 0
    baseline: int = 0  # the sampler's, right before the slow clients subscribed
    peak: int = 0
    hwm: int = 0
    samples: int = 0
    normal_s: float = 0.0
    slow_read: int = 0  # bytes each slow client had read when the sampling stopped
    first_response: list[int] = field(default_factory=list)  # elements in each slow response

    def growth(self) -> int:
        return self.peak - self.baseline

    def figures(self) -> str:
        return (f"server VmRSS: {self.rss_empty / MiB:.0f} MiB empty, "
                f"{self.rss_published / MiB:.0f} MiB after publishing 200 MiB in "
                f"{self.publish_s:.1f} s; with {SLOW_CLIENTS} slow clients: baseline "
                f"{self.baseline / MiB:.0f} MiB, peak {self.peak / MiB:.0f} MiB (VmHWM "
                f"{self.hwm / MiB:.0f} MiB, {self.samples} samples), growth "
                f"{self.growth() / MiB:.0f} MiB (bound {SLOW_RSS_BOUND / MiB:.0f} MiB); the "
                f"normal client read {NORMAL_EVENTS} events ({NORMAL_EVENTS * BIG_VALUE // MiB}"
                f" MiB) in {self.normal_s:.2f} s meanwhile; each slow client had read "
                f"{self.slow_read // KiB} KiB; elements in the slow clients' responses: "
                f"{sorted(set(self.first_response))}")  # fmt: skip


async def publish_big(url: str) -> list[Receipt]:
    async with tidewire.connect(url) as hub:
        pub = await hub.publisher("big", format="value")
        futures: list[asyncio.Future[Receipt]] = []
        for first in range(1, BIG_EVENTS + 1, BIG_SUBMIT):
            values = [big_value(i) for i in range(first, first + BIG_SUBMIT)]
            futures.append(await pub.submit(values))  # pipelined: waits only for queue room
        receipts = list(await asyncio.gather(*futures))
        await pub.close()
    return receipts


async def normal_client(base: str) -> int:
    """Read the first NORMAL_EVENTS values of ``big`` with tidewire's HTTP client, checking
    each; how many."""
    seen = 0
    async with HttpHub(base) as hub:
        values = hub.subscribe_values("big", demand=64)
        async with contextlib.aclosing(values):
            async for elements in values:
                for value in elements[: NORMAL_EVENTS - seen]:
                    seen += 1
                    assert value == big_value(seen), f"element {seen}: {value[:8]!r}"
                if seen >= NORMAL_EVENTS:
                    break
    return seen


async def slow_clients(served: Served, report: SlowReport) -> None:
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            # The baseline is taken before the slow clients subscribe: their pumps read ahead
            # as soon as they have demand. Each then fetches on a raw socket with a tiny
            # receive buffer, and does not read at all (while the normal client reads its
            # 20 MiB), then reads 4 KiB per pause; the server's memory is sampled throughout.
            sampler = RssSampler(served.pid)
            report.baseline = sampler.baseline
            sampler.start()
            try:
                locations: list[str] = []
                for _ in range(SLOW_CLIENTS):
                    url = f"{served.base}/rsio/pub/big?format=value&request={SLOW_DEMAND}"
                    async with session.put(url) as response:
                        assert response.status == 201, await response.text()
                        locations.append(response.headers["Location"])
                for location in locations:
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    socks.append(sock)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    sock.setblocking(False)
                    await loop.sock_connect(sock, (HOST, served.port))
                    path = location.removeprefix(served.base)
                    await loop.sock_sendall(sock, f"PUT {path} HTTP/1.1\r\nHost: {HOST}:"
                                            f"{served.port}\r\n\r\n".encode())  # fmt: skip
                started = time.monotonic()
                assert await normal_client(served.base) == NORMAL_EVENTS
                report.normal_s = time.monotonic() - started
                received = [bytearray() for _ in socks]
                for _ in range(SLOW_ROUNDS):
                    await asyncio.sleep(SLOW_PAUSE_S)  # the slow clients' pace, not a timer
                    for sock, got in zip(socks, received, strict=True):
                        got += await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)
                report.slow_read = min(len(got) for got in received)
            finally:
                sampler.stop()
                report.peak, report.hwm, report.samples = (sampler.peak, sampler.hwm,
                                                           sampler.samples)  # fmt: skip
            # Now each reads the rest of its response at full speed: a batch of the first
            # elements, about max_response_bytes.
            for sock, got in zip(socks, received, strict=True):
                while b"\r\n\r\n" not in got:
                    got += await asyncio.wait_for(loop.sock_recv(sock, 65536), 10)
                    assert len(got) < MiB
                head, _, body = bytes(got).partition(b"\r\n\r\n")
                status, _, headers = parse_head(head)
                assert status == 200, head
                assert headers["content-encoding"] == "X-Rsio-LengthPrefixedElements", head
                size = int(headers["content-length"])
                assert size <= RESPONSE_BYTES + BIG_VALUE, size
                rest = bytearray(body)
                while len(rest) < size:
                    chunk = await asyncio.wait_for(loop.sock_recv(sock, 256 * KiB), 10)
                    assert chunk, "the server closed a slow client's connection"
                    rest += chunk
                elements = length_prefixed(bytes(rest))
                assert elements == [big_value(i) for i in range(1, len(elements) + 1)]
                report.first_response.append(len(elements))
            for location in locations:
                async with session.put(location + "/cancel") as response:
                    assert response.status == 200
            async with session.get(f"{served.base}/healthz") as response:
                assert await response.read() == b"ok\n"
    finally:
        for sock in socks:
            sock.close()


def test_slow_clients_hold_bounded_memory(tmp_path: Path) -> None:
    report = SlowReport()
    settings = (f"http.max_response_bytes={RESPONSE_BYTES}", "log.fsync=false")  # throw-away data
    with serve(tmp_path, *settings) as served:
        report.rss_empty = served.rss()
        started = time.monotonic()
        receipts = run(publish_big(served.rsio), timeout=60)
        report.publish_s = time.monotonic() - started
        assert sum(r.count for r in receipts) == BIG_EVENTS
        assert receipts[-1].last_id == BIG_EVENTS
        report.rss_published = served.rss()
        try:
            run(slow_clients(served, report), timeout=60)
        finally:
            print("\n" + report.figures())
        assert report.growth() < SLOW_RSS_BOUND, report.figures()
        assert served.alive(), served.output()
        stop(served)


# ---------------------------------------------------------------------- 4. malformed requests

OK_VALUES = [b"one", b"two"]
NINES = "9" * 5000  # a request= value far past 2^63-1, still inside aiohttp's 8190-byte line
PAD = "a" * 20_000  # a 20 KB URL


@dataclass(frozen=True, slots=True)
class Bad:
    """A malformed request, built from the path of a live subscription (the victim), and the
    answer expected: its exact ``status`` and whether it carries ``X-Rsio-Error: true`` (None:
    aiohttp's own refusal, before the hub sees the request)."""

    id: str
    build: Callable[[str], bytes]
    status: int
    rsio_error: bool | None


BAD: list[Any] = [
    Bad("huge-request-on-subscribe",
        lambda sub: put_request(f"/rsio/pub/ok?format=value&request={NINES}"), 400, True),
    Bad("request-past-2^63-on-subscribe",
        lambda sub: put_request("/rsio/pub/ok?request=9223372036854775808"), 400, True),
    # on a fetch the subscription carries on: 400 without X-Rsio-Error
    Bad("huge-request-on-fetch", lambda sub: put_request(f"{sub}?request={NINES}"), 400, False),
    Bad("percent-encoding-not-utf8-in-stream",
        lambda sub: put_request("/rsio/pub/bad%FFname?request=1"), 400, True),
    pytest.param(
        Bad("percent-encoding-not-hex-in-stream",
            lambda sub: put_request("/rsio/pub/bad%ZZname?request=1"), 400, True)),
    pytest.param(
        Bad("percent-encoding-cut-short-in-stream",
            lambda sub: put_request("/rsio/pub/bad%4?request=1"), 400, True)),
    # aiohttp's parser refuses a request line over 8190 bytes itself: 400 (in an HTTP/1.0
    # status line), no X-Rsio-Error (see the traceback test below)
    Bad("url-20kb-on-subscribe",
        lambda sub: put_request(f"/rsio/pub/ok?format=value&pad={PAD}"), 400, None),
    Bad("url-20kb-on-fetch", lambda sub: put_request(f"{sub}?request=1&pad={PAD}"), 400, None),
    Bad("if-none-match-on-subscribe",
        lambda sub: put_request("/rsio/pub/ok?request=1", "If-None-Match: *"), 412, False),
    Bad("if-none-match-on-fetch",
        lambda sub: put_request(f"{sub}?request=1", "If-None-Match: *"), 412, False),
    Bad("if-none-match-on-cancel",
        lambda sub: put_request(f"{sub}/cancel", "If-None-Match: *"), 412, False),
]  # fmt: skip


@pytest.fixture(scope="module")
def malformed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for the malformed requests (poll window 1 s: an empty fetch ends quickly),
    with the stream ``ok`` holding OK_VALUES."""
    root = tmp_path_factory.mktemp("malformed")
    with serve(root, "http.poll_seconds=1") as served:

        async def fill() -> Receipt:
            async with tidewire.connect(served.rsio) as hub:
                return await hub.publish("ok", OK_VALUES)

        assert run(fill(), timeout=30) == Receipt(2, 1, 2)
        yield served
        stop(served, check_output=False)  # the tests check their own part of the output


def raw_subscribe(served: Served, publisher: str) -> str:
    """``PUT /rsio/pub/<publisher>`` on a raw socket: the subscription's path."""
    answer = parse_response(raw_exchange(served.port, put_request(f"/rsio/pub/{publisher}")))
    assert answer.status == 201, answer
    location = answer.headers["location"]  # its host is the request's Host header
    assert re.fullmatch(rf"http://{re.escape(HOST)}/rsio/sub/[A-Za-z0-9_-]{{22}}",
                        location), location  # fmt: skip
    return location.removeprefix(f"http://{HOST}")


def check_delivers(served: Served, sub: str) -> None:
    """Fetching ``sub`` with request=2 gives OK_VALUES in one batch."""
    answer = parse_response(raw_exchange(served.port, put_request(f"{sub}?request=2")))
    assert answer.status == 200, answer
    assert answer.headers.get("content-encoding") == "X-Rsio-LengthPrefixedElements", answer
    assert length_prefixed(answer.body) == OK_VALUES


def check_cancel(served: Served, sub: str) -> None:
    answer = parse_response(raw_exchange(served.port, put_request(f"{sub}/cancel")))
    assert answer.status == 200, answer


@pytest.mark.parametrize("bad", BAD, ids=lambda bad: bad.id)
def test_malformed_request_gets_a_4xx_and_the_server_carries_on(
    malformed_server: Served, bad: Bad
) -> None:
    served = malformed_server
    assert served.alive(), served.output()
    victim = raw_subscribe(served, "ok?format=value")  # no demand yet
    offset = served.stderr_size()
    answer = parse_response(raw_exchange(served.port, bad.build(victim)))
    print(f"\n{bad.id}: {answer.raw_head.splitlines()[0]!r}, X-Rsio-Error "
          f"{answer.headers.get('x-rsio-error')!r}, body {answer.body[:100]!r}")  # fmt: skip
    assert 400 <= bad.status < 500
    assert answer.status == bad.status, answer
    if bad.rsio_error is not None:
        assert (answer.headers.get("x-rsio-error") == "true") is bad.rsio_error, answer
    if answer.headers.get("x-rsio-error") == "true":  # an onError carries a text/plain message
        assert answer.headers["content-type"].startswith("text/plain"), answer
        assert answer.body.strip(), answer
    # The server is up, answers /healthz, and subscriptions keep working: the victim (none of
    # these answers ended it: they are not onError on it) and a new one.
    assert served.alive(), served.output()
    health = raw_exchange(served.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                          b"Connection: close\r\n\r\n")  # fmt: skip
    assert parse_response(health).body == b"ok\n"
    check_delivers(served, victim)
    check_cancel(served, victim)
    other = raw_subscribe(served, "ok?format=value")
    check_delivers(served, other)
    check_cancel(served, other)
    # No traceback for a refusal the hub made itself. (Refusals by aiohttp's HTTP parser, the
    # 20 KB URLs, are checked in the test below.)
    if bad.rsio_error is not None:
        assert TRACEBACK not in served.stderr_since(offset), served.stderr_since(offset)


def test_requests_the_http_parser_refuses_log_no_traceback(malformed_server: Served) -> None:
    served = malformed_server
    for request in (put_request(f"/rsio/pub/ok?pad={PAD}"),
                    put_request("/rsio/pub/ok", "No colon in this header line")):  # fmt: skip
        offset = served.stderr_size()
        answer = parse_response(raw_exchange(served.port, request))
        assert answer.status == 400, answer
        assert served.alive(), served.output()
        output = served.stderr_since(offset)
        assert TRACEBACK not in output, output


def read_answers(sock: socket.socket, n: int, timeout: float = 15.0) -> list[Answer]:
    """``n`` responses from one keep-alive connection, framed by their Content-Length (the hub
    sends no chunked responses), within ``timeout`` seconds."""
    data = bytearray()
    answers: list[Answer] = []
    deadline = time.monotonic() + timeout
    while len(answers) < n:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            status, reason, headers = parse_head(bytes(data[:head_end]))
            end = head_end + 4 + int(headers.get("content-length", "0"))
            if len(data) >= end:
                answers.append(Answer(status, reason, headers, bytes(data[head_end + 4 : end]),
                                      data[:head_end].decode("latin-1")))  # fmt: skip
                del data[:end]
                continue
        left = deadline - time.monotonic()
        assert left > 0, f"{len(answers)} of {n} answers within {timeout} s: {bytes(data)!r}"
        assert len(data) < MiB, f"{len(answers)} of {n} answers: {bytes(data)[:300]!r}"
        sock.settimeout(left)
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(answers)} of {n} answers: {bytes(data)!r}"
        data += chunk
    return answers


def test_a_body_on_a_fetch_is_ignored_and_not_taken_for_a_request(
    malformed_server: Served,
) -> None:
    """docs/protocols/rsio-http.md: "A request body is ignored." A fetch carrying one is answered
    as a fetch, and its body, even when it looks like a request (here: a cancel of the same
    subscription), is never parsed as the next request on the keep-alive connection."""
    served = malformed_server
    victim = raw_subscribe(served, "ok?format=value")
    smuggled = put_request(f"{victim}/cancel")
    offset = served.stderr_size()
    with socket.create_connection((HOST, served.port), timeout=15) as sock:
        first = "\r\n".join([f"PUT {victim}?request=1 HTTP/1.1", f"Host: {HOST}",
                             f"Content-Length: {len(smuggled)}", "", ""])  # fmt: skip
        sock.sendall(first.encode() + smuggled)
        second = "\r\n".join(
            [
                f"PUT {victim}?request=1 HTTP/1.1",
                f"Host: {HOST}",
                "Content-Type: application/octet-stream",
                "Transfer-Encoding: chunked",
                "",
                "5",
                "hello",
                "0",
                "",
                "",
            ]
        )
        sock.sendall(second.encode())
        answers = read_answers(sock, 2)
    print(f"\nbody-on-fetch: {[a.raw_head.splitlines()[0] for a in answers]}, "
          f"bodies {[a.body for a in answers]}")  # fmt: skip
    assert [(a.status, a.body) for a in answers] == [(200, b"one"), (200, b"two")], answers
    assert [a.headers["x-tidewire-sequence"] for a in answers] == ["0", "1"]
    # the "cancel" in the first body cancelled nothing: the victim still works
    assert served.alive(), served.output()
    answer = parse_response(raw_exchange(served.port, put_request(f"{victim}/requestMore=1")))
    assert answer.status == 200, answer
    check_cancel(served, victim)
    assert TRACEBACK not in served.stderr_since(offset), served.stderr_since(offset)
