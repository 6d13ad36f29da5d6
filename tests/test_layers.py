"""The package's layers as docs/architecture.md draws them, checked on the source itself: the
floor and the protocol cores load no asyncio, client, server or hub."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

FLOOR = (
    "tidewire.model",
    "tidewire.native",
    "tidewire.record",
    "tidewire.registry",
    "tidewire.protocols.rsio",
    "tidewire.protocols.tube",
    "tidewire.protocols.tolliver",
    "tidewire.protocols.seguro",
    "tidewire.protocols.rsio_http",
)
ABOVE = ("asyncio", "tidewire.client", "tidewire.server", "tidewire.hub", "tidewire.log")


def test_floor_and_protocol_cores_load_nothing_above_them() -> None:
    """A fresh interpreter imports the model, the record format and every protocol core, then
    lists what got loaded: none of asyncio, the clients, the server, the hub or the log."""
    script = (
        f"import {', '.join(FLOOR)}; import sys; "
        f"print(' '.join(m for m in sys.modules if m in {ABOVE!r} "
        f"or m.startswith(tuple(p + '.' for p in {ABOVE!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == []


def test_connect_is_still_exported() -> None:
    """``from tidewire import connect`` works, lazily (the RS.io client)."""
    import tidewire
    from tidewire import Batch, connect
    from tidewire.client.rsio import connect as rsio_connect

    assert connect is rsio_connect
    assert tidewire.Batch is Batch
    assert "connect" in tidewire.__all__


# --------------------------------------------------------------------------- the source itself

SRC = Path(importlib.import_module("tidewire").__file__ or "").parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def top_level_imports(path: Path) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: its top level, with the bodies of plain
    ``if``/``try`` statements, without ``if TYPE_CHECKING:`` blocks."""
    body = list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and not is_type_checking(node):
            body[:0] = [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            body[:0] = [*node.body, *(s for h in node.handlers for s in h.body), *node.orelse]


def resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(module: str, path: Path) -> set[str]:
    """The tidewire modules ``module`` imports at its top level (a package's ``__init__`` for
    ``from package import name``; the submodule for ``from package import submodule``)."""
    found: set[str] = set()
    for node in top_level_imports(path):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
            continue
        target = resolve(module, path, node)
        for alias in node.names:
            if f"{target}.{alias.name}" in MODULES:
                found.add(f"{target}.{alias.name}")
            elif target in MODULES:
                found.add(target)
    found.discard(module)
    return found


def test_no_import_cycles() -> None:
    """The package's import graph (top-level imports) has no cycle: each layer imports only
    the ones below it (docs/architecture.md, "Layers")."""
    graph = {m: imported_modules(m, p) for m, p in MODULES.items()}
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            cycles.append([*trail[trail.index(module) :], module])
            return
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []


FLOOR_LAYERS = (
    "tidewire.errors", "tidewire.model", "tidewire", "tidewire.registry", "tidewire.native"
)
"""The error tree, the model, the package itself (which loads only the model), the protocol
registry (plain data, importing nothing) and the switch to the compiled kernels (which load
only the model: docs/native.md)."""

MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "tidewire.errors": (),
    "tidewire.registry": (),
    "tidewire.model": ("tidewire.errors",),
    "tidewire.native": ("tidewire.errors", "tidewire.model"),
    "tidewire": ("tidewire.errors", "tidewire.model"),
    "tidewire.record": FLOOR_LAYERS,
    "tidewire.protocols": (*FLOOR_LAYERS, "tidewire.record"),
    "tidewire.log": (*FLOOR_LAYERS, "tidewire.record"),
    "tidewire.config": (*FLOOR_LAYERS, "tidewire.log"),
    "tidewire.hub": (*FLOOR_LAYERS, "tidewire.record", "tidewire.log"),
    "tidewire.observe": (*FLOOR_LAYERS, "tidewire.record", "tidewire.log", "tidewire.hub"),
    "tidewire.cluster": (*FLOOR_LAYERS, "tidewire.record", "tidewire.log", "tidewire.hub"),
    "tidewire.client": (*FLOOR_LAYERS, "tidewire.record", "tidewire.protocols"),
    "tidewire.tolliver": (
        *FLOOR_LAYERS, "tidewire.record", "tidewire.protocols", "tidewire.client"
    ),
}
"""What each layer may import at its top level (its own modules aside); the layers not listed
(server, spark, the command line) sit on top and may import any of these."""


def layer(module: str) -> str:
    """The layer of ``module``: the longest entry of ``MAY_IMPORT`` it falls in, else itself."""
    for name in sorted(MAY_IMPORT, key=len, reverse=True):
        if module == name or (name != "tidewire" and module.startswith(name + ".")):
            return name
    return module


def test_each_layer_imports_only_the_layers_below_it() -> None:
    """docs/architecture.md, "Layers": the model and the protocol cores import nothing above
    them, the hub nothing of observe, the server or the clients (TYPE_CHECKING aside)."""
    wrong = [
        f"{module} imports {imported}"
        for module, path in MODULES.items()
        if layer(module) in MAY_IMPORT
        for imported in imported_modules(module, path)
        if layer(imported) != layer(module) and layer(imported) not in MAY_IMPORT[layer(module)]
    ]
    assert wrong == []


def test_no_private_name_is_imported_from_another_module() -> None:
    """``from .x import _y`` reaches into another module's insides: a name shared between
    modules is public (the standard library's ``import ssl as _ssl`` is fine)."""
    wrong = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and resolve(module, path, node).startswith(
                "tidewire"
            ):
                wrong += [f"{module}: {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert wrong == []


SIGNALS = {
    "tidewire.protocols.rsio.varint.NeedData",
    "tidewire.protocols.rsio.codec._Consumed",
    "tidewire.protocols.tolliver.codec._NeedData",
    "tidewire.protocols.seguro.session._ProtocolBreach",
    "tidewire.client.http._Lost",
    "tidewire.server.app._BodyDropped",
    "tidewire.server.app._BodyTimeout",
}
"""Exceptions used for control flow and caught inside the package (a decoder's "need more
bytes", a body aiohttp must stop reading): signals, not errors a caller sees."""


def test_every_error_is_a_tidewire_error() -> None:
    """Every exception class the package defines derives from ``TidewireError`` (it may also
    derive from ``ValueError``, ``ConnectionError``, ...), so ``except TidewireError`` catches
    every error tidewire raises of its own."""
    from tidewire.model import TidewireError

    outside = []
    for module in MODULES:
        if module.startswith("tidewire.spark") and importlib.util.find_spec("pyspark") is None:
            continue
        loaded = importlib.import_module(module)
        for name, value in vars(loaded).items():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module
                and not issubclass(value, TidewireError)
                and f"{module}.{name}" not in SIGNALS
            ):
                outside.append(f"{module}.{name}")
    assert outside == []


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100

def oversized() -> list[str]:
    """Modules over ``MAX_MODULE_LINES`` lines and functions over ``MAX_FUNCTION_LINES``."""
    found = []
    for module, path in MODULES.items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{module}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{module}.{node.name}: {length} lines")
    return found


def test_sizes() -> None:
    """No module over 600 lines, no function over 100 (issue 19, item 10)."""
    assert oversized() == []
