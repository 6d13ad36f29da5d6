"""Every shell, Python and browser example of README.md and docs/ runs, against a real hub
(issue 23, item 7): a wrong example fails here, not in a reader's terminal.

Each Markdown file with examples to run gets its own hub (``tidewire serve`` as a child
process on free 127.0.0.1 ports, data in ``./tidewire-data`` of a scratch directory, an ACL
that grants everyone everything, ``admin`` included: ``EXAMPLES_ACL``) and runs
its blocks in order, in that directory, so that a block may use what an earlier one made. The
fence line's mode (tests/docs/doc_blocks.py) says how:

* ``run``: to its end within ``RUN_SECONDS``, exit status 0. ``sh``/``bash`` run under
  ``bash -e -o pipefail`` (a failing line fails the block), a ``console`` block's ``$`` lines
  the same way; ``python`` as a file given to ``python``, except that top-level ``await``/``async
  with`` run as in ``python -m asyncio`` or a notebook cell, and a block that uses ``spark``
  without defining it gets the tests' SparkSession (as in the ``pyspark`` shell), in this process;
  ``js`` as an ES module in Chromium on a page of the hub's origin (tests/docs/doc_browser.py:
  ``console.log`` is its output, an uncaught error its failure).
* ``run=until-<N>s``: a long-running command (a server, a follower): still running after N
  seconds, having printed something on stdout (a first line slow to come on a loaded machine
  is waited for, ``OUTPUT_SECONDS`` at most, while it runs); then stopped by its process
  group's id. It runs in a directory of its own (it is cut off mid-way: what it leaves is not
  for the next blocks).
* ``skip=<reason>``: not run.

Rewriting (doc_blocks.rewrite): ``127.0.0.1:7400``/``7402``/``7403``/``7480`` become the test
hub's ports, and a server's port flags (``--http-port 7480``) free ports. The CLI's own
defaults are pointed at the hub through ``TIDEWIRE_URL``, ``TIDEWIRE_HTTP_URL`` and
``TIDEWIRE_SEGURO_URL``, and a ``tidewire serve`` an example starts takes free ports for the
listeners it does not name (``TIDEWIRE_*_PORT=0``). ``.venv`` in the scratch directory is the
environment running the tests, with this tree's ``src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from doc_blocks import (
    Block,
    Mode,
    blocks,
    console_commands,
    markdown_files,
    parse_mode,
    rewrite,
)
from doc_browser import CHROMIUM, chromium, run_module

import helpers
import tidewire
from hubproc import HubProcess
from tidewire.config import ConfigError, load_config
from tidewire.hub.access import AccessFileError, Acl, Tokens

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(tidewire.__file__).resolve().parents[1]

RUN_SECONDS = 60.0
"""The longest a ``run`` block may take (the slowest, the README's CLI tour, takes a few)."""

OUTPUT_SECONDS = 30.0
"""How long a ``run=until-<N>s`` block still running after its N s may take to print its first
output (it is judged on what it printed, and a loaded machine may be slow to start it)."""

STOP_SECONDS = 10.0
"""How long a stopped block has to exit after SIGTERM before its group gets SIGKILL."""

EXAMPLES_ACL = """\
[principal."*"]
read = ["*", "_tidewire.*"]
write = ["*"]
monitor = true
admin = ["*"]
"""
"""The examples' hub's ACL: what a hub without one allows (everything, to everyone), and
``admin``, which no hub without an ACL grants, so that the stream-management examples (README,
"Managing streams") run as written. ``tolliver.allow_plaintext`` keeps Tolliver as open."""

PYTHON_RUNNER = """\
import ast, asyncio, sys, types
path = sys.argv[1]
with open(path, encoding="utf-8") as f:
    code = compile(f.read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
sys.argv = [path]
result = types.FunctionType(code, {"__name__": "__main__", "__file__": path})()
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""
"""Runs a Python block: a plain program as ``python file.py`` would, one with top-level
``await`` on a new event loop, as ``python -m asyncio`` does (``FunctionType`` over a module's
code object: a coroutine when the code awaits)."""


def all_blocks() -> list[Block]:
    return [b for path in markdown_files(ROOT) for b in blocks(ROOT, path)]


def runnable_files() -> list[str]:
    """The Markdown files with at least one block to run (``run`` or ``until``)."""
    names: list[str] = []
    for block in all_blocks():
        if block.runnable and block.path not in names:
            try:
                kind = parse_mode(block.info).kind
            except ValueError:
                continue
            if kind != "skip":
                names.append(block.path)
    return names


# --------------------------------------------------------------------------- the convention


def test_every_example_says_how_it_runs() -> None:
    """Each ``sh``/``bash``/``console``/``python`` block carries a valid mode: a new example
    without one fails here instead of escaping the test."""
    wrong = []
    for block in all_blocks():
        if block.runnable:
            try:
                parse_mode(block.info)
            except ValueError as exc:
                wrong.append(f"{block.where}: {exc}")
    assert not wrong, "\n".join(wrong)


def test_the_extractor_reads_fences_and_modes(tmp_path: Path) -> None:
    """Fences of backticks and tildes, indented in a list item, longer closing fences; the
    modes and what is refused; and the rewriting of the default ports."""
    doc = tmp_path / "doc.md"
    doc.write_text("text\n```sh run\necho one\n```\n\n1. item\n\n   ~~~~python run=until-3s\n"
                   "   print(2)\n     x = 3\n   ~~~~~\n```\nlayout\n```\n"
                   "```python\nprint('no mode')\n````\n", encoding="utf-8")  # fmt: skip
    found = blocks(tmp_path, doc)
    assert [(b.where, b.lang, b.info, b.text) for b in found] == [
        ("doc.md:2", "sh", "run", "echo one\n"),
        ("doc.md:8", "python", "run=until-3s", "print(2)\n  x = 3\n"),
        ("doc.md:12", "", "", "layout\n"),
        ("doc.md:15", "python", "", "print('no mode')\n"),
    ]
    assert [b.runnable for b in found] == [True, True, False, True]
    assert parse_mode("run") == Mode(kind="run")
    assert parse_mode(" run=until-12s ") == Mode(kind="until", seconds=12)
    assert parse_mode("skip=needs three hosts") == Mode(kind="skip", reason="needs three hosts")
    for wrong in ("", "runs", "run=until-0s", "run=until-3", "skip=", "skip= ", "until-3s"):
        with pytest.raises(ValueError, match="needs a mode"):
            parse_mode(wrong)
    ports = {"rsio": 1, "tolliver": 2, "seguro": 3, "http": 4}
    assert rewrite("rsio://127.0.0.1:7400 http://localhost:7480/x 127.0.0.1:74000 "
                   "--http-port 7480 --rsio-port=7500 h1:7400", ports) == (
        "rsio://127.0.0.1:1 http://localhost:4/x 127.0.0.1:74000 "
        "--http-port 0 --rsio-port=0 h1:7400")  # fmt: skip
    assert console_commands("$ echo a\na\n$ echo b\n") == "echo a\necho b\n"


def test_the_toml_examples_are_accepted(tmp_path: Path) -> None:
    """Each ``toml`` block is a file tidewire reads, and the reader accepts it: an ACL
    (``[principal...]``), a tokens file (``[token...]``) or a settings file
    (``tidewire serve --config``, read without the environment's ``TIDEWIRE_*``)."""
    tomls = [block for block in all_blocks() if block.lang == "toml"]
    assert tomls, "no toml block found: the extractor is broken"
    for i, block in enumerate(tomls):
        keys = tomllib.loads(block.text).keys()
        try:
            if "principal" in keys:
                Acl.parse(block.text, block.where)
            elif "token" in keys:
                Tokens.parse(block.text, block.where)
            else:
                settings = tmp_path / f"settings-{i}.toml"
                settings.write_text(block.text, encoding="utf-8")
                load_config(str(settings), environ={})
        except AccessFileError as exc:
            raise AssertionError(str(exc)) from None  # (it names block.where)
        except ConfigError as exc:
            raise AssertionError(f"{block.where}: {exc}") from None


# --------------------------------------------------------------------------- running them


def test_the_browser_runner_says_what_went_wrong() -> None:
    """A ``js`` module that runs to its end passes, one that throws fails, and a long-running
    one that logs nothing but the browser's own lines fails (one Chromium for the three)."""
    if not Path(CHROMIUM).exists():
        pytest.fail("no chromium: ./tw test installs Debian's chromium package")

    cases = [("await Promise.resolve();\n", None), ("await null;\nnull.x;\n", None),
             ("console.warn(1);\n", 1.0)]

    async def go() -> list[str | None]:
        async with chromium() as browser:
            return [await run_module(browser, text, "about:blank", until=until, run_seconds=20,
                                     output_seconds=1.0) for text, until in cases]  # fmt: skip

    ran, threw, silent = helpers.run(go(), 90)
    assert ran is None
    assert (threw or "").startswith("threw")
    assert (silent or "").startswith("logged nothing")


def test_the_runner_says_what_went_wrong(tmp_path: Path) -> None:
    """The harness fails what it should (a non-zero exit, a long-running block that ends early
    or prints nothing on stdout) and runs what it should (top-level ``await``, a console
    block's commands, a long-running block whose first line comes after its N s), without a
    hub."""
    scratch = workdir(tmp_path / "cwd")
    env = block_env({"rsio": "rsio://127.0.0.1:1", "seguro": "seguro://127.0.0.1:1",
                     "http": "http://127.0.0.1:1"})  # fmt: skip
    lines = iter(range(1, 100))

    def run(lang: str, info: str, text: str) -> str | None:
        block = Block(path="doc.md", line=next(lines), lang=lang, info=info, text=text)
        return run_block(block, parse_mode(info), text, scratch, env, output_seconds=2.0)

    assert run("python", "run", "import asyncio\nawait asyncio.sleep(0)\nprint(1)\n") is None
    assert "exit status 1" in (run("python", "run", "async def f(): 1 / 0\nawait f()\n") or "")
    assert "ZeroDivisionError" in (run("python", "run", "1 / 0\n") or "")
    assert "exit status 3" in (run("sh", "run", "false || exit 3\necho never\n") or "")
    assert "exit status 1" in (run("sh", "run", "false | true\n") or "")  # pipefail
    assert "exited (0) after" in (run("sh", "run=until-1s", "echo early\n") or "")
    assert "printed nothing on stdout" in (
        run("sh", "run=until-1s", "echo to stderr >&2\nsleep 30\n") or "")
    assert run("console", "run=until-1s", "$ echo a\nthe output\n$ sleep 30\n") is None
    assert run("sh", "run=until-1s", "sleep 1.5\necho late\nsleep 30\n") is None


@pytest.mark.parametrize("name", runnable_files())
def test_the_examples_run(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Every block of ``name`` with ``run`` or ``run=until-<N>s`` does what its mode says,
    against a hub of its own; the failures of all blocks are reported together."""
    scratch = workdir(tmp_path / "cwd")
    acl = tmp_path / "acl.toml"
    acl.write_text(EXAMPLES_ACL, encoding="utf-8")
    hub = HubProcess(scratch / "tidewire-data", tmp_path / "hub.log",
                     "--set", f"auth.acl_file={acl}", "--set", "tolliver.allow_plaintext=true")
    try:
        urls = hub.start()
        ports = {name: int(urlsplit(urls[name]).port or 0) for name in urls if name != "ws"}
        env = block_env(urls)
        failures: list[str] = []
        for block in blocks(ROOT, ROOT / name):
            if not block.runnable:
                continue
            mode = parse_mode(block.info)
            if mode.kind == "skip":
                continue
            text = rewrite(block.text, ports)
            if block.lang == "js":
                failure = run_js(block, mode, text, f"{urls['http']}/healthz")
            elif block.lang == "python" and uses_spark(text):
                failure = (run_with_spark(block, text, request) if mode.kind == "run" else
                           f"{block.where}: a Spark block runs in the tests' process, "
                           "to its end: its mode can only be 'run'")  # fmt: skip
            else:
                failure = run_block(block, mode, text, scratch, env)
            if failure:
                failures.append(failure)
        assert not failures, "\n\n".join(failures) + f"\n\nthe hub's log:\n{hub.log()[-3000:]}"
    finally:
        hub.stop()


def block_env(urls: dict[str, str]) -> dict[str, str]:
    """The environment of a block: the caller's without its TIDEWIRE_* settings (but
    ``TIDEWIRE_PURE``, which the suite's second run sets), the CLI pointed at the hub, a
    server's unnamed ports free, this tree's code first, output unbuffered (a long-running
    block is judged on what it printed)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TIDEWIRE_") or k == "TIDEWIRE_PURE"}  # fmt: skip
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p),
        "PYTHONUNBUFFERED": "1",
        "TIDEWIRE_URL": urls["rsio"],
        "TIDEWIRE_SEGURO_URL": urls["seguro"],
        "TIDEWIRE_HTTP_URL": urls["http"],
        **{f"TIDEWIRE_{name}_PORT": "0" for name in ("HTTP", "RSIO", "SEGURO", "TOLLIVER")},
    })  # fmt: skip
    return env


def command(block: Block, text: str, cwd: Path) -> list[str]:
    """The command line that runs ``text``, written to a file in ``cwd`` named after the
    block's place."""
    stem = f"example-{Path(block.path).stem}-{block.line}"
    if block.lang == "python":
        script = cwd / f"{stem}.py"
        script.write_text(text, encoding="utf-8")
        return [sys.executable, "-c", PYTHON_RUNNER, str(script)]
    script = cwd / f"{stem}.sh"
    script.write_text(console_commands(text) if block.lang == "console" else text,
                      encoding="utf-8")  # fmt: skip
    return ["bash", "-e", "-o", "pipefail", str(script)]


@contextmanager
def started(argv: list[str], cwd: Path, env: dict[str, str],
            out: Path) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """``argv`` as the leader of a new process group, its stdout into ``out`` and its stderr
    into ``out`` + ``.err``; on exit the group is stopped (SIGTERM, then SIGKILL after
    ``STOP_SECONDS``), so that nothing it started outlives the test."""
    with open(out, "wb") as stdout, open(f"{out}.err", "wb") as stderr:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        yield proc
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``proc``'s group, then SIGKILL to whatever of it is left after
    ``STOP_SECONDS`` or after the leader exited (a child it left behind)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=STOP_SECONDS)


def workdir(path: Path) -> Path:
    """A new directory where ``.venv`` is the environment running the tests."""
    path.mkdir()
    (path / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    return path


def run_block(block: Block, mode: Mode, text: str, scratch: Path, env: dict[str, str], *,
              output_seconds: float = OUTPUT_SECONDS) -> str | None:  # fmt: skip
    """Run one block as its mode says (``run`` in ``scratch``, ``until`` in a directory of
    its own under it, given ``output_seconds`` more to print its first output); what went
    wrong, or ``None``."""
    stem = f"{Path(block.path).stem}-{block.line}"
    cwd = scratch if mode.kind == "run" else workdir(scratch / f"until-{stem}")
    out = cwd / f"example-{stem}.out"
    began = time.monotonic()
    with started(command(block, text, cwd), cwd, env, out) as proc:
        if mode.kind == "run":
            try:
                code = proc.wait(timeout=RUN_SECONDS)
            except subprocess.TimeoutExpired:
                return report(block, text, out, f"still running after {RUN_SECONDS:.0f} s")
            return None if code == 0 else report(block, text, out, f"exit status {code}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(timeout=mode.seconds)
            return report(block, text, out, f"exited ({code}) after "
                          f"{time.monotonic() - began:.1f} s, before {mode.seconds} s")  # fmt: skip
        # Alive after its N s; its first line may still be coming on a loaded machine (a
        # server's imports alone take seconds there): wait for it while it runs, bounded.
        deadline = time.monotonic() + output_seconds
        while not out.stat().st_size:
            if proc.poll() is not None:
                return report(block, text, out,
                              f"exited ({proc.returncode}) having printed nothing")  # fmt: skip
            if time.monotonic() > deadline:
                return report(block, text, out, "printed nothing on stdout in "
                              f"{time.monotonic() - began:.0f} s")  # fmt: skip
            time.sleep(0.05)
    return None


def report(block: Block, text: str, out: Path, what: str) -> str:
    """What went wrong with ``block``, with the text it ran and the end of its output."""
    stdout = out.read_bytes().decode(errors="replace")
    stderr = Path(f"{out}.err").read_bytes().decode(errors="replace")
    return (f"{block.where} ({block.lang} {block.info}): {what}\n--- the block, as run:\n{text}"
            f"--- its stdout (the end):\n{stdout[-3000:]}\n"
            f"--- its stderr (the end):\n{stderr[-3000:]}")  # fmt: skip


# --------------------------------------------------------------------------- js blocks


def run_js(block: Block, mode: Mode, text: str, page_url: str) -> str | None:
    """Run a ``js`` block as an ES module in Chromium, on ``page_url`` (doc_browser.py)."""
    if not Path(CHROMIUM).exists():
        pytest.fail("no chromium: ./tw test installs Debian's chromium package")

    async def go() -> str | None:
        async with chromium() as browser:
            return await run_module(browser, text, page_url, run_seconds=RUN_SECONDS,
                                    until=mode.seconds if mode.kind == "until" else None,
                                    output_seconds=OUTPUT_SECONDS)  # fmt: skip

    what = helpers.run(go(), RUN_SECONDS + OUTPUT_SECONDS + 60)
    if what is None:
        return None
    return f"{block.where} ({block.lang} {block.info}): {what}\n--- the block:\n{text}"


# --------------------------------------------------------------------------- Spark blocks


def uses_spark(text: str) -> bool:
    """Whether the Python ``text`` reads the name ``spark`` without binding it (the pyspark
    shell's predefined session)."""
    tree = ast.parse(text)
    loaded = stored = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "spark":
            loaded |= isinstance(node.ctx, ast.Load)
            stored |= isinstance(node.ctx, ast.Store)
        elif isinstance(node, ast.alias) and (node.asname or node.name) == "spark":
            stored = True
    return loaded and not stored and not hasattr(builtins, "spark")


def run_with_spark(block: Block, text: str, request: pytest.FixtureRequest) -> str | None:
    """Run a Spark block in this process with the tests' session as ``spark``."""
    session = request.getfixturevalue("spark")
    namespace: dict[str, Any] = {"__name__": "__main__", "spark": session}
    try:
        exec(compile(text, block.where, "exec"), namespace)
    except Exception as exc:
        return f"{block.where} ({block.lang} {block.info}): {exc!r}\n--- the block:\n{text}"
    return None
