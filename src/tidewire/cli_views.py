"""The command line's output: rich tables (sizes, rates, ids, durations), the streams and stats
views of the admin API's answers, and progress bars (always on stderr, so that stdout stays the
data). rich is imported when a view is drawn, not when ``tidewire`` starts.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.progress import Progress
    from rich.table import Table

    from .client.admin import Stats


def _isatty(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # (no such method; closed)
        return False


def make_console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr). Off a terminal it has no colours and is wide
    enough that no table is cut or wrapped to 80 columns (for grep, awk, logs)."""
    from rich.console import Console

    file = sys.stderr if stderr else sys.stdout
    return Console(file=file, highlight=False, width=None if _isatty(file) else 10_000)


def make_table(title: str | None, *columns: str) -> Table:
    """A table of plain columns: the first and every ``<NAME`` left-justified, the others (the
    numbers) right-justified."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, header_style="bold", show_edge=False,
                  pad_edge=False)  # fmt: skip
    for i, column in enumerate(columns):
        left = i == 0 or column.startswith("<")
        table.add_column(column.lstrip("<"), justify="left" if left else "right")
    return table


def stacked(*tables: Table) -> RenderableType:
    """Tables one after another, a blank line between, each with its title and caption on
    lines of their own (a table wraps them to its own width)."""
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    for table in tables:
        if parts:
            parts.append(Text(""))
        if table.title:
            parts.append(Text(str(table.title), style="bold"))
            table.title = None
        parts.append(table)
        if table.caption:
            parts.append(Text(str(table.caption)))
            table.caption = None
    return Group(*parts)


def progress_bars(show: bool | None, *, stdout_too: bool = False) -> Progress:
    """Progress bars on stderr: with ``show`` (--progress/--no-progress), else when stderr is
    a terminal (and, with ``stdout_too``, stdout is not: lines scrolling through the same
    terminal would tear the bar). Off a terminal the bars are printed once, when they end."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if show is None:
        show = _isatty(sys.stderr) and not (stdout_too and _isatty(sys.stdout))
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("events"), TaskProgressColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
        console=make_console(stderr=True), disable=not show,
        redirect_stdout=False, redirect_stderr=False,  # stdout is the data's, never the bar's
    )  # fmt: skip


def _size(n: float) -> str:
    """Bytes for people: 512 B, 40.0 KiB, 1.5 MiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def _rate(n: float) -> str:
    return f"{n:,.1f}"


def _id(n: int | None) -> str:
    return "-" if n is None else str(n)


def _duration(seconds: float) -> str:
    """1d 02h 03m 04s, 3m 04s, 4.5s."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m {s:02d}s"
    if hours:
        return f"{hours}h {minutes:02d}m {s:02d}s"
    return f"{minutes}m {s:02d}s"


def streams_table(rows: list[dict[str, Any]], *, rates: bool, title: str | None = None) -> Table:
    """Streams: name, events, first/latest id, bytes; and the rates in and out (a hub's)."""
    columns = ["STREAM", "EVENTS", "FIRST", "LATEST", "BYTES"]
    table = make_table(title, *columns, *(["IN EV/S", "OUT EV/S"] if rates else []))
    for s in rows:
        cells = [s["name"], str(s["events"]), _id(s["first_id"]), _id(s["latest_id"]),
                 _size(s["bytes"])]  # fmt: skip
        if rates:
            cells += [_rate(s["events_in_rate"]), _rate(s["events_out_rate"])]
        table.add_row(*cells)
    return table


def stats_view(stats: Stats, url: str) -> RenderableType:
    """``tidewire stats``: the hub, its streams, connections and subscriptions by protocol,
    every subscription, and the Tolliver peers."""
    from .hub.hub import RESERVED_PREFIX

    o = stats["overview"]
    hub = make_table(f"tidewire {o['version']} at {url}: up {_duration(o['uptime_seconds'])}, "
                 f"{o['streams']} stream(s), data in {o['data_dir']}",
                 "TRAFFIC", "EVENTS", "BYTES", "EV/S", "BYTES/S")  # fmt: skip
    hub.add_row("in", str(o["events_in"]), _size(o["bytes_in"]), _rate(o["events_in_rate"]),
                _size(o["bytes_in_rate"]) + "/s")  # fmt: skip
    hub.add_row("out", str(o["events_out"]), _size(o["bytes_out"]),
                _rate(o["events_out_rate"]), _size(o["bytes_out_rate"]) + "/s")  # fmt: skip

    public = [s for s in stats["streams"] if not s["name"].startswith(RESERVED_PREFIX)]
    streams = streams_table(cast(list[dict[str, Any]], public), rates=True, title="streams")

    protocols = make_table("connections and subscriptions by protocol", "PROTOCOL", "CONNECTIONS",
                       "SUBSCRIPTIONS", "BYTES IN", "BYTES OUT")  # fmt: skip
    traffic: dict[str, list[int]] = {}
    for c in stats["connections"]:
        counted = traffic.setdefault(c["protocol"], [0, 0])
        counted[0] += c["bytes_in"]
        counted[1] += c["bytes_out"]
    names = list(dict.fromkeys([*o["connections"], *o["subscriptions"], *traffic]))
    for name in names:
        bytes_in, bytes_out = traffic.get(name, [0, 0])
        conns = o["connections"].get(name)
        protocols.add_row(name, _id(conns), str(o["subscriptions"].get(name, 0)),
                          _size(bytes_in), _size(bytes_out))  # fmt: skip
    protocols.add_row("total", str(sum(o["connections"].values())),
                      str(sum(o["subscriptions"].values())), "", "", style="bold")  # fmt: skip

    subs = make_table("subscriptions", "STREAM", "<PROTOCOL", "CONNECTION", "NEXT ID", "DELIVERED",
                  "DEMAND", "LAG")  # fmt: skip
    for s in sorted(stats["subscriptions"], key=lambda s: (s["stream"], s["id"])):
        subs.add_row(s["stream"], s["protocol"], _id(s["connection"]), str(s["next_id"]),
                     str(s["delivered"]), "unbounded" if s["unbounded"] else str(s["demand"]),
                     str(s["lag"]))  # fmt: skip
    if not stats["subscriptions"]:
        subs.caption = "none"

    t = stats["tolliver"]
    peers = make_table(f"tolliver instance {t['instance'] or '(none)'}: peers", "PEER", "<ADDRESS",
                   "<CONNECTED", "<CHANNELS", "UNACKED", "RESENDS")  # fmt: skip
    for p in t["peers"]:
        peers.add_row(p["uuid"], p["address"] or "-", "yes" if p["connected"] else "no",
                      ", ".join(p["channels"]) or "-", str(p["unacked"]),
                      str(p["resends"]))  # fmt: skip
    if not t["peers"]:
        peers.caption = "none"
    return stacked(hub, streams, protocols, subs, peers)
