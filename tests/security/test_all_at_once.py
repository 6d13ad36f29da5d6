"""Issue 20's promise as a whole: one real hub (``tidewire serve``, a 64 MiB memory budget, 32 MiB
a principal, 16 MiB a connection) under every attack of the attack modules at once, on all five
protocols, with a well-behaved RS.io client (the bystander, a token of its own) beside them.

First the bystander runs alone (what this shared machine gives it with no attack), then the
attacks, the bystander and a ``/healthz`` probe run together. Each attacker must be refused or
bounded, the hub must stay alive and answer ``/healthz``, its peak resident memory must grow by
at most twice the budget plus 64 MiB (the interpreter's own churn), and the bystander must be
served: no stall over :data:`ALL_AT_ONCE_STALL_S` beyond its stall alone (the per-attack tests
hold each attack alone to the 100 ms promise; what the bystander keeps of its throughput is a
benchmark's figure, benchmarks/hostile_load.py).

Only Seguro speaks TLS here (its point's owner is named by a client certificate); the other
listeners are plain TCP, as the attackers and the bystander use them.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import http_attacks
import rsio_attacks
import seguro_attacks
import tolliver_attacks
import tube_attacks
from harness import BystanderReport, RealHub, alone, assert_served, bystander, real_hub
from hostile_hub import BUDGET, FLOOD, fill, fill_flood
from hostile_hub import SETTINGS as BASE

from certs import Pki
from helpers import run
from tidewire.client.backoff import Retry
from tidewire.client.seguro import connect
from tidewire.protocols.seguro.patp import SUFFIXES

MiB = 1024 * 1024
SETTINGS = {**BASE, "rsio.tls": False, "http.tls": False, "tolliver.tls": False}
ALL_AT_ONCE_STALL_S = 0.25  # the bystander's stall over its stall alone, at most
SECONDS = 5.0  # how long the bystander runs under attack, and the attacks that last
TOKENS = ["good", "filler", "mallory", "grabber", "leaker"]
POINTS = [f"~{s}" for s in SUFFIXES[1:33]]  # anonymous ships' points (not ~zod, the owner's)
ACL = f"""
[principal."token:good"]                # the bystander
read = ["bystander.*"]
write = ["bystander.*"]

[principal."token:filler"]              # fills the streams the attackers read
read = ["big", "flood.*"]
write = ["big", "flood.*"]

[principal."token:mallory"]             # never-fetched HTTP subscriptions
read = ["big"]

[principal."token:grabber"]             # too many HTTP subscriptions
read = ["grab*"]

[principal."token:leaker"]              # puts its token in URLs
read = ["orders"]

[principal."cert:~zod"]                 # a Seguro point's owner
read = ["~zod"]
write = ["~zod"]

[principal.anonymous]
read = ["big", "s", "~*", "glob.*", "flood.*"]
write = {POINTS!r}
""".replace("'", '"')


@dataclass
class Outcome:
    """What each attack got from the hub."""

    onnext: list[rsio_attacks.Answer]
    subscribes: list[rsio_attacks.Answer]
    bomb: tuple[int, int | None, float]
    unfinished: list[int | None]
    tiny: list[int | None]
    origins: list[int]
    fetched: list[str]
    grabbed: list[int]
    bodies: list[bytes]
    echoes: list[bytes]
    huge: list[int]
    taken: list[bool]
    squatting: Counter[str]
    saved: int
    flood: tuple[int, int]
    unacked: tuple[int, int, int]


async def http_attacks_at_once(hub: RealHub) -> tuple[list[str], list[int], list[bytes],
                                                        list[bytes]]:  # fmt: skip
    """Never-fetched subscriptions, too many subscriptions, declared bodies, tokens in URLs."""
    leaker = hub.tokens["leaker"]

    async def echoes() -> list[bytes]:
        return [await http_attacks.raw_answer("127.0.0.1", hub.http_port, request)
                for request in http_attacks.bad_requests(leaker)]  # fmt: skip

    async with aiohttp.ClientSession() as session:
        fetched, grabbed, bodies, answers = await asyncio.gather(
            http_attacks.never_fetched(session, hub.http_base, "big?format=value", 40,
                                       hub.tokens["mallory"]),
            http_attacks.subscribe_many(session, hub.http_base, 60, hub.tokens["grabber"]),
            http_attacks.declared_bodies("127.0.0.1", hub.http_port),
            echoes())  # fmt: skip
    return fetched, grabbed, bodies, answers


async def seguro_owner(hub: RealHub, pki: Pki, stop: asyncio.Event) -> int:
    """The owner of ``~zod`` saving 20 events a session until ``stop``: how many it saved."""
    ctx = pki.client_context(pki.client("~zod"))
    saved = 0
    url = f"seguro://127.0.0.1:{hub.seguro_port}"
    while not stop.is_set():
        async with connect(url, "~zod", ssl=ctx, retry=Retry(attempts=50)) as ship:
            for _ in range(20):
                await ship.save(ship.latest + 1, b"owner %d" % saved)
                saved += 1
    return saved


async def seguro_attacks_at_once(hub: RealHub, pki: Pki) -> tuple[list[int], list[bool],
                                                                   Counter[str], int]:  # fmt: skip
    """Events declared huge, events never finished, and a read-only squatter on ``~zod``
    while its owner saves."""
    port = hub.seguro_port
    anonymous = pki.client_context()
    held: list[asyncio.StreamWriter] = []
    outcomes: Counter[str] = Counter()
    stop = asyncio.Event()
    squatting = asyncio.create_task(seguro_attacks.squatter(port, "~zod", anonymous, stop,
                                                            outcomes, hold=SECONDS + 5))
    saving = asyncio.create_task(seguro_owner(hub, pki, stop))
    try:
        results = await asyncio.gather(
            *(seguro_attacks.huge_event(port, p, ctx=anonymous) for p in POINTS[:16]),
            *(seguro_attacks.unfinished_event(port, p, held, ctx=anonymous)
              for p in POINTS[16:]))  # fmt: skip
        await asyncio.sleep(SECONDS / 2)
    finally:
        stop.set()
        for writer in held:
            writer.close()
    saved = await saving
    # The owner once more: it takes the point from the squatter if it holds it now, so that
    # every time the squatter got in, the owner displaced it.
    ctx = pki.client_context(pki.client("~zod"))
    url = f"seguro://127.0.0.1:{port}"
    async with connect(url, "~zod", ssl=ctx, retry=Retry(attempts=50)) as ship:
        assert ship.latest == saved
        async with asyncio.timeout(10):
            await squatting
    sizes = [r for r in results[:16] if isinstance(r, int)]
    taken = [bool(r) for r in results[16:]]
    return sizes, taken, outcomes, saved


async def rsio_attacks_at_once(hub: RealHub) -> tuple[list[rsio_attacks.Answer],
                                                        list[rsio_attacks.Answer]]:  # fmt: skip
    """onNext for an id never made, refused subscribes, a subscriber that never reads."""
    port = hub.rsio_port
    onnext, subscribes, _ = await asyncio.gather(
        rsio_attacks.unknown_id_onnext(port),
        rsio_attacks.refused_subscribes(port, count=20_000, connections=4),
        rsio_attacks.never_reading(port, "big", seconds=SECONDS))  # fmt: skip
    return onnext, subscribes


async def tube_attacks_at_once(hub: RealHub) -> tuple[tuple[int, int | None, float],
                                                        list[int | None], list[int | None],
                                                        list[int]]:  # fmt: skip
    """A deflate bomb, unfinished messages, tiny fragments, a subscriber that never reads,
    foreign origins."""
    url = hub.tube_url
    bomb, unfinished, tiny, origins = await asyncio.gather(
        tube_attacks.deflate_bomb(url), tube_attacks.unfinished(url, 12, 12),
        tube_attacks.tiny_fragments(url, 20),
        tube_attacks.foreign_origins(url, "http://evil.example", 50))  # fmt: skip
    return bomb, unfinished, tiny, origins


async def tolliver_attacks_at_once(hub: RealHub) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """A flood of channels, a remote that never acks."""
    port = hub.tolliver_port
    return await asyncio.gather(
        tolliver_attacks.channel_flood(port),
        tolliver_attacks.never_acking(port, FLOOD, SECONDS, lambda: fill_flood(hub)))  # fmt: skip


async def every_attack(hub: RealHub, pki: Pki) -> Outcome:
    """Every attack of the attack modules, all at once."""
    (onnext, subscribes), tube, http, seguro, tolliver, _ = await asyncio.gather(
        rsio_attacks_at_once(hub), tube_attacks_at_once(hub), http_attacks_at_once(hub),
        seguro_attacks_at_once(hub, pki), tolliver_attacks_at_once(hub),
        tube_attacks.never_reading(hub.tube_url, 100, SECONDS))  # fmt: skip
    return Outcome(onnext, subscribes, *tube, *http, *seguro, *tolliver)


def healthz_answers(base: str) -> int:
    with urllib.request.urlopen(base + "/healthz", timeout=5) as answer:
        return int(answer.status)


def test_every_attack_at_once(tmp_path: Path, pki: Pki) -> None:
    with real_hub(tmp_path, settings=SETTINGS, acl=ACL, tokens=TOKENS, pki=pki) as hub:
        hub.scheme_tls = False  # (only Seguro speaks TLS: see SETTINGS)
        run(fill(hub), 60)
        good = hub.tokens["good"]
        solo = alone(hub, SECONDS, token=good)  # (as long as under attack: comparable)
        before = hub.rss()

        async def main() -> tuple[Outcome, BystanderReport, float]:
            async with asyncio.timeout(60):
                outcome, report, slowest = await asyncio.gather(
                    every_attack(hub, pki), bystander(hub, SECONDS, token=good),
                    tube_attacks.healthz(hub.http_base, SECONDS))  # fmt: skip
            return outcome, report, slowest

        began = time.monotonic()
        outcome, report, slowest = run(main(), 90)
        growth = hub.peak_rss() - before
        print(f"\nall at once: {time.monotonic() - began:.1f} s, peak RSS growth "
              f"+{growth / MiB:.1f} MiB (bound {(2 * BUDGET + 64 * MiB) // MiB} MiB), "
              f"/healthz at worst {slowest * 1000:.0f} ms; bystander's throughput "
              f"{report.events_per_s / max(solo.events_per_s, 1e-9):.0%} of alone; alone {solo}, "
              f"under attack {report}; Seguro bytes sent {outcome.huge}, "
              f"declarations taken {outcome.taken}, squatter {outcome.squatting}")  # fmt: skip
        assert hub.alive
        assert healthz_answers(hub.http_base) == 200
        assert growth <= 2 * BUDGET + 64 * MiB, f"+{growth / MiB:.0f} MiB"
        judge(outcome, hub)
        # Every attack at once, its attackers in this process on the same 2 cores as the hub
        # and the bystander: the per-attack tests hold each attack to the 100 ms promise; all
        # of them together get ALL_AT_ONCE_STALL_S. (What the bystander keeps of its
        # throughput is benchmarks/hostile_load.py's figure, not a test's.)
        assert_served(solo, report, promise=ALL_AT_ONCE_STALL_S)


def judge(o: Outcome, hub: RealHub) -> None:
    """Each attacker was refused or bounded."""
    unknown = "protocol error: elements for subscriber 7, which is not subscribed"
    assert all(a.reset or a.goodbye == unknown for a in o.onnext), [a.goodbye for a in o.onnext]
    for answer in o.subscribes:
        assert answer.reset or (answer.errors == 100 and answer.goodbye == (
            "too many refusals in a row (the limit is 100)")), answer.goodbye  # fmt: skip
    size, code, _ = o.bomb
    assert size < 20_000
    assert code in (1000, 1009)
    assert set(o.unfinished) <= {1008, 1009}, o.unfinished
    # (1009: refused at its first message because the anonymous share was already full)
    assert len(o.tiny) == 20
    assert set(o.tiny) <= {1008, 1009}, o.tiny
    assert o.origins == [403] * 50
    assert len(o.fetched) == 40  # (within mallory's share: bounded by the budget, not refused)
    assert o.grabbed == [201] * 40 + [429] * 20
    assert sum(h.startswith(b"HTTP/1.1 503") for h in o.bodies[:8]) >= 6, o.bodies
    assert o.bodies[8].startswith(b"HTTP/1.1 413"), o.bodies[8]
    leaked = hub.tokens["leaker"].partition(".")[2].encode()
    assert all(a.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")) for a in o.echoes), o.echoes
    assert all(leaked not in a for a in o.echoes), o.echoes
    # (what a Seguro ship sent is not judged here: over TLS, a transport the hub has dropped
    # may still take writes for a while; tests/security/test_seguro_attacks.py judges it over
    # plain TCP. Here: nothing committed, and the hub's RSS.)
    assert sum(o.taken) * 3 * MiB <= 32 * MiB  # the anonymous share took what fits
    assert o.squatting["displaced"] == o.squatting["welcomed"], o.squatting
    assert o.saved > 0
    assert o.flood == (5, 7)  # the 4,000-byte names refused, the thousands taken (and capped)
    count, nbytes, frames = o.unacked
    assert nbytes <= 2 * MiB + len(FLOOD) * (256 * 1024 + 64 * 1024)
    assert frames <= 3 * count
    assert hub.log_text().count("\n") < 10_000  # refusals logged a few at a time, not each
