"""Benchmark: a well-behaved client's throughput under each of issue 20's attacks, against the
same client alone on the same hub, in the same run.

Run ``.venv/bin/python benchmarks/hostile_load.py`` (3 rounds of 4 s, about 4 1/2 minutes) or add
``--quick`` (1 round of 2 s).

One real hub (``tidewire serve`` through ``tests/security/harness.py``'s :func:`real_hub`: a
64 MiB memory budget, 32 MiB a principal, 16 MiB a connection, the ACL and tokens of
``tests/security/test_all_at_once.py``, no TLS). For each attack of the security tests' attack
modules, in rounds: the bystander (``harness.bystander``: a well-behaved RS.io client in a
process of its own, publishing and subscribing with its own token) runs alone for S seconds,
then again for S seconds while the attack runs in this process, restarted whenever it ends so
that it lasts the window. One figure per attack: the bystander's events/s under attack
(``tidewire``) against its events/s alone (``baseline_value``), over all rounds (events over
seconds), their ratio, goal ratio >= 0.5 (issue 20, item 8: "at least half its solo
throughput"), with the largest stall the bystander saw under attack (``max_stall_s``) and
alone (``baseline_max_stall_s``) as extra fields.

Output: one JSON line per figure on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

# The attacks are the security tests' own (and their harness's hub and bystander), so that
# what is measured here is what is tested there: both folders go on the path, as pytest puts
# them there for the tests.
_TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(_TESTS), str(_TESTS / "security")]

import aiohttp  # noqa: E402
import http_attacks  # noqa: E402
import rsio_attacks  # noqa: E402
import seguro_attacks  # noqa: E402
import tolliver_attacks  # noqa: E402
import tube_attacks  # noqa: E402
from harness import BystanderReport, RealHub, bystander, real_hub  # noqa: E402
from hostile_hub import FLOOD, SETTINGS, fill, fill_flood  # noqa: E402

from _common import choose_base, fresh_dir, fs_type, note  # noqa: E402
from tidewire.protocols.seguro.patp import SUFFIXES  # noqa: E402

MiB = 1024 * 1024
GOAL_RATIO = 0.5
TOKENS = ["good", "filler", "mallory"]
POINTS = [f"~{s}" for s in SUFFIXES[1:17]]  # the anonymous ships' points
ACL = f"""
[principal."token:good"]                # the bystander
read = ["bystander.*"]
write = ["bystander.*"]

[principal."token:filler"]              # fills the streams the attackers read
read = ["big", "flood.*"]
write = ["big", "flood.*"]

[principal."token:mallory"]             # never-fetched HTTP subscriptions
read = ["big"]

[principal.anonymous]
read = ["big", "s", "~*", "glob.*", "flood.*"]
write = {POINTS!r}
""".replace("'", '"')


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int
    seconds: float


FULL = Settings(rounds=3, seconds=4.0)
QUICK = Settings(rounds=1, seconds=2.0)

Attack = Callable[[RealHub, float], Awaitable[None]]
"""One go of an attack, given the hub and the seconds left in the window (for the attacks
whose length is a parameter); restarted until the window ends, cut short (cancelled) then."""


async def rsio_unknown_onnext(hub: RealHub, left: float) -> None:
    await rsio_attacks.unknown_id_onnext(hub.rsio_port)


async def rsio_refused_subscribes(hub: RealHub, left: float) -> None:
    await rsio_attacks.refused_subscribes(hub.rsio_port, count=20_000, connections=4)


async def rsio_never_reading(hub: RealHub, left: float) -> None:
    await rsio_attacks.never_reading(hub.rsio_port, "big", seconds=left)


async def tube_deflate_bomb(hub: RealHub, left: float) -> None:
    await tube_attacks.deflate_bomb(hub.tube_url)


async def tube_never_reading(hub: RealHub, left: float) -> None:
    await tube_attacks.never_reading(hub.tube_url, 100, left)


async def http_never_fetched(hub: RealHub, left: float) -> None:
    async with aiohttp.ClientSession() as session:
        await http_attacks.never_fetched(session, hub.http_base, "big?format=value", 40,
                                         hub.tokens["mallory"])  # fmt: skip
    # (its subscriptions live until the poll deadline; a new go then takes them again, and
    # meanwhile its subscribes over the per-principal cap would only be refused)
    await asyncio.sleep(min(left, 1.0))


async def http_declared_bodies(hub: RealHub, left: float) -> None:
    await http_attacks.declared_bodies("127.0.0.1", hub.http_port)


async def seguro_huge_events(hub: RealHub, left: float) -> None:
    await asyncio.gather(*(seguro_attacks.huge_event(hub.seguro_port, p) for p in POINTS))


async def tolliver_channel_flood(hub: RealHub, left: float) -> None:
    await tolliver_attacks.channel_flood(hub.tolliver_port)


async def tolliver_never_acking(hub: RealHub, left: float) -> None:
    going = asyncio.create_task(tolliver_attacks.never_acking(
        hub.tolliver_port, FLOOD, left, lambda: fill_flood(hub)))  # fmt: skip
    try:
        await asyncio.shield(going)
    except asyncio.CancelledError:
        # (cut short, it would leave its filler publishing into the next measurement: it
        # ends by itself at the window's end, ``left``, which is about when it is cut)
        await going
        raise


ATTACKS: dict[str, tuple[Attack, str]] = {
    "rsio_unknown_id_onnext": (rsio_unknown_onnext, "8 RS.io connections: onNext for an id "
                               "never subscribed, 16 MiB declared, 15 MiB sent"),
    "rsio_refused_subscribes": (rsio_refused_subscribes, "4 RS.io connections: 20,000 "
                                "refused subscribes in one write each"),
    "rsio_never_reading": (rsio_never_reading, "one RS.io connection: 100 subscriptions to "
                           "32 MiB with unbounded demand, nothing read"),
    "tube_deflate_bomb": (tube_deflate_bomb, "one Tube message of about 16 KB inflating to "
                          "8 MiB of refused subscribes"),
    "tube_never_reading": (tube_never_reading, "one Tube connection: 100 subscriptions to "
                           "32 MiB with demand 10,000, nothing read"),
    "http_never_fetched": (http_never_fetched, "40 RS.io-over-HTTP subscriptions to 32 MiB "
                           "asking for everything, never fetched"),
    "http_declared_bodies": (http_declared_bodies, "8 PUTs declaring 15 MiB bodies (1 MiB "
                             "sent) and one declaring 1 GiB"),
    "seguro_huge_events": (seguro_huge_events, "16 anonymous ships: SAVE declaring 60 MiB, "
                           "data sent as fast as the hub takes it"),
    "tolliver_channel_flood": (tolliver_channel_flood, "Tolliver handshakes: 4,000-byte "
                               "channel names, then thousands of channels"),
    "tolliver_never_acking": (tolliver_never_acking, "a Tolliver remote reading 16 MiB of "
                              "reliable deliveries and acking none"),
}


@dataclass
class Side:
    """One side of a figure (the bystander alone, or under the attack) over all rounds."""

    events: int = 0
    seconds: float = 0.0
    max_stall_s: float = 0.0
    rounds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, report: BystanderReport) -> None:
        self.events += report.events
        self.seconds += report.seconds
        self.max_stall_s = max(self.max_stall_s, report.max_stall_s)
        self.rounds.append(report.events_per_s)
        self.errors += report.errors

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


@dataclass
class Goes:
    """An attack's goes over all rounds: how many ran to their end (not cut short by the
    window's end), how many failed (an attack module's own assertion or a
    connection error; the hub's answers are the security tests' to judge), the first few
    failures, and the current go's timeout (so that the window can be ended early)."""

    done: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    current: asyncio.Timeout | None = None
    ended: bool = False

    def end(self) -> None:
        """End the window now: the current go is cut short, no other begins."""
        self.ended = True
        if self.current is not None and not self.current.expired():
            with contextlib.suppress(RuntimeError):  # (a go that has just finished)
                self.current.reschedule(asyncio.get_running_loop().time())


async def attacking(attack: Attack, hub: RealHub, goes: Goes, seconds: float,
                    longest: float) -> None:  # fmt: skip
    """``attack`` again and again until ``goes.end()`` (at most ``longest`` seconds; the
    attacks whose length is a parameter are given what is left of ``seconds``, the window). A
    go cut short is cancelled: the attack modules close what they opened when cancelled."""
    loop = asyncio.get_running_loop()
    end = loop.time() + longest
    window = loop.time() + seconds
    while not goes.ended and (left := end - loop.time()) > 0.05:
        try:
            async with asyncio.timeout(left) as goes.current:
                await attack(hub, max(window - loop.time(), 0.5))
            goes.done += 1
        except TimeoutError:
            break
        except (AssertionError, OSError, aiohttp.ClientError) as failure:
            goes.current = None
            goes.failed += 1
            if len(goes.failures) < 3:
                goes.failures.append(repr(failure)[:200])
            await asyncio.sleep(0.05)  # (a failing attack must not spin this loop)
        finally:
            goes.current = None


async def one_round(hub: RealHub, attack: Attack, seconds: float, alone: Side,
                    attacked: Side, goes: Goes) -> None:  # fmt: skip
    """The bystander alone, then under ``attack``: what each saw goes to ``alone`` and
    ``attacked``, the attack's failures to ``goes``."""
    good = hub.tokens["good"]
    alone.add(await bystander(hub, seconds, token=good))
    # The attack starts as the bystander's child process does (which takes a moment before
    # it measures: the attack is under way by then) and ends when the bystander has finished.
    goes.ended = False
    running = asyncio.create_task(attacking(attack, hub, goes, seconds + 0.5, seconds + 30.0))
    try:
        attacked.add(await bystander(hub, seconds, token=good))
    finally:
        goes.end()
        async with asyncio.timeout(30):
            await running


def figure(name: str, what: str, alone: Side, attacked: Side, goes: Goes,
           settings: Settings) -> dict[str, object]:  # fmt: skip
    ratio = attacked.rate / alone.rate if alone.rate else 0.0
    return {
        "benchmark": "hostile_load",
        "figure": name,
        "unit": "events/s",
        "better": "higher",
        "tidewire": round(attacked.rate, 1),
        "baseline": "the same bystander alone on the same hub, just before (same run)",
        "baseline_value": round(alone.rate, 1),
        "ratio": round(ratio, 3),
        "goal": f"ratio >= {GOAL_RATIO}",
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio >= GOAL_RATIO,
        "tidewire_rounds": [round(r, 1) for r in attacked.rounds],
        "baseline_rounds": [round(r, 1) for r in alone.rounds],
        "rounds": settings.rounds,
        "seconds": settings.seconds,
        "max_stall_s": round(attacked.max_stall_s, 4),
        "baseline_max_stall_s": round(alone.max_stall_s, 4),
        "bystander_errors": attacked.errors + alone.errors,
        "attack": what,
        "attack_goes": goes.done,
        "attack_failed_goes": goes.failed,
        "attack_failures": goes.failures,
    }


async def main_async(settings: Settings, base: str, only: list[str]) -> None:
    with fresh_dir(base, "tidewire-bench-hostile-") as directory, \
            real_hub(Path(directory), settings=SETTINGS, acl=ACL, tokens=TOKENS) as hub:
        note("hostile_load: writing 32 MiB into the stream the attackers read")
        await fill(hub)
        await bystander(hub, 1.0, token=hub.tokens["good"])  # warm-up (untimed)
        for name in only:
            attack, what = ATTACKS[name]
            alone, attacked = Side(), Side()
            goes = Goes()
            for i in range(settings.rounds):
                await one_round(hub, attack, settings.seconds, alone, attacked, goes)
                note(f"  {name} round {i + 1}: alone {alone.rounds[-1]:8,.0f} events/s, "
                     f"attacked {attacked.rounds[-1]:8,.0f} events/s "
                     f"(stall {attacked.max_stall_s * 1000:.0f} ms)")
            line = figure(name, what, alone, attacked, goes, settings)
            line["hub_alive"] = hub.alive
            line["hub_peak_rss_mib"] = round(hub.peak_rss() / MiB, 1)
            print(json.dumps(line), flush=True)
            if not hub.alive:
                raise SystemExit(f"the hub died under {name}:\n{hub.log_text()[-4000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s per attack")
    parser.add_argument("--dir", help="where the hub's temporary directory goes")
    parser.add_argument("--only", action="append", choices=sorted(ATTACKS),
                        help="only this attack (repeatable)")  # fmt: skip
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    base = choose_base(args.dir)
    note(f"hostile_load: {settings.rounds} rounds of {settings.seconds:g} s, "
         f"data in {base} ({fs_type(base)})")  # fmt: skip
    started = time.perf_counter()
    # (the default loop, as the security tests run their attacks)
    with asyncio.Runner() as runner:
        runner.run(main_async(settings, base, args.only or list(ATTACKS)))
    note(f"hostile_load: done in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
