"""The examples of the documentation as tests/docs/test_examples.py runs them: the fenced code
blocks of README.md and docs/**/*.md, each with the mode word its fence line carries, and the
rewriting that points an example written for a hub on the default ports at the test's hub.

A runnable block is a fence whose language is ``sh``, ``bash``, ``console``, ``python`` or
``js``; its fence line names a mode after the language (GitHub colours by the first word and
ignores the rest)::

    ```python run              runs as written, to its end, exit status 0
    ```sh run=until-3s         long-running: still running after 3 s, having printed something
    ```sh skip=<reason>        not run; the reason says why (and what tests it instead)

A runnable block without a valid mode is an error, so that no new example escapes the test.
Other languages (``toml``, ``json``) and blocks without a language (outputs, file
layouts, transcripts) are not examples to run. Pure functions only: no hub, no process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_PORTS",
    "RUNNABLE",
    "Block",
    "Mode",
    "blocks",
    "console_commands",
    "markdown_files",
    "parse_mode",
    "rewrite",
]

RUNNABLE = frozenset({"sh", "bash", "console", "python", "js"})
"""The languages whose blocks are examples to run."""

DEFAULT_PORTS = {"rsio": 7400, "tolliver": 7402, "seguro": 7403, "http": 7480}
"""The listeners' default ports (docs/configuration.md), as the examples are written."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_UNTIL = re.compile(r"run=until-(?P<seconds>[1-9][0-9]*)s")
_SERVER_PORT = re.compile(r"(--(?:http|rsio|seguro|tolliver)-port)([ =])[0-9]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class Mode:
    """How a block runs: ``run`` to its end, ``until`` (``seconds`` alive, then stopped) or
    ``skip`` (with its ``reason``)."""

    kind: str
    seconds: int = 0
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("run", "until", "skip"):
            raise ValueError(f"no mode {self.kind!r}")
        if (self.kind == "until") != (self.seconds > 0):
            raise ValueError("seconds go with until, and only with it")
        if (self.kind == "skip") != bool(self.reason):
            raise ValueError("a reason goes with skip, and only with it")


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """One fenced block: ``path`` (relative to the repository), ``line`` (its opening fence's,
    1-based), ``lang`` (``""`` when none), ``info`` (the fence line after the language) and
    ``text`` (its content, the fence's indentation removed)."""

    path: str
    line: int
    lang: str
    info: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE


def parse_mode(info: str) -> Mode:
    """The mode of a fence line's words after the language; ``ValueError`` saying what is
    expected when there is none or it is not one of the three."""
    word = info.strip()
    if word == "run":
        return Mode(kind="run")
    if match := _UNTIL.fullmatch(word):
        return Mode(kind="until", seconds=int(match["seconds"]))
    if word.startswith("skip=") and word[len("skip=") :].strip():
        return Mode(kind="skip", reason=word[len("skip=") :].strip())
    raise ValueError(f"the fence line says {word!r} after the language: it needs a mode, "
                     "'run', 'run=until-<N>s' or 'skip=<reason>'")  # fmt: skip


def markdown_files(root: Path) -> list[Path]:
    """README.md and every docs/**/*.md under ``root``, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def blocks(root: Path, path: Path) -> list[Block]:
    """The fenced blocks of the Markdown file ``path`` (CommonMark fences: three or more
    backticks or tildes, closed by a fence of the same character at least as long; an
    unclosed fence runs to the end of the file)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        lang, _, info = opening["info"].strip().partition(" ")
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if (closing is not None and closing["fence"][0] == fence[0]
                    and len(closing["fence"]) >= len(fence) and not closing["info"].strip()):
                break
            body.append(_dedent(lines[j], indent))
            j += 1
        found.append(Block(path=path.relative_to(root).as_posix(), line=i + 1, lang=lang,
                           info=info.strip(), text="\n".join(body) + "\n"))  # fmt: skip
        i = j + 1
    return found


def _dedent(line: str, indent: int) -> str:
    """``line`` without up to ``indent`` leading spaces (a fence inside a list item)."""
    stripped = line.lstrip(" ")
    return line[min(indent, len(line) - len(stripped)) :]


def console_commands(text: str) -> str:
    """A ``console`` block's commands: its ``$ `` lines, the prompt removed (the rest is the
    output it shows)."""
    return "".join(line[2:] + "\n" for line in text.splitlines() if line.startswith("$ "))


def rewrite(text: str, ports: dict[str, int]) -> str:
    """``text`` pointed at the test's hub: every ``127.0.0.1:<default port>`` (or
    ``localhost:``) becomes that listener's port in ``ports``, and a server's own port flag
    (``--http-port 7480``) becomes ``0``, a free port: an example that starts a hub of its own
    must not take the test hub's ports, nor fixed ones other tests may hold."""
    for name, default in DEFAULT_PORTS.items():
        text = re.sub(rf"\b(127\.0\.0\.1|localhost):{default}\b", rf"\g<1>:{ports[name]}", text)
    return _SERVER_PORT.sub(r"\g<1>\g<2>0", text)
