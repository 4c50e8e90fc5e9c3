"""The code's layers hold: every import in bench/ and strategies/ (those inside functions
too) goes down the layer table of docs/development.md, and no two modules import each other,
however long the way round. An import that runs back up, or a circle, is named with its pair.

The table is written here, not read from the code: the code is what it checks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

# Top to bottom; a layer may import the layers it names and nothing else of bench.
BELOW_DATA = {"strategies", "registry", "records", "config", "models", "tools"}
MAY_IMPORT = {
    "cli": {"commands", "config", "tools"},  # bench/cli.py, __main__.py: names -> commands
    "commands": {"report", "project", "launch", "train", "measure", "data", *BELOW_DATA},
    "report": {"project", "registry", "records", "config", "models", "tools"},
    "project": {"registry", "records", "config", "models", "tools"},
    "launch": {"train", "measure", "data", *BELOW_DATA},
    "train": {"measure", "data", *BELOW_DATA},
    "measure": {"data", *BELOW_DATA},
    "data": BELOW_DATA,
    "strategies": {"registry", "records", "config", "models", "tools"},
    # strategies/__init__.py: the names, their order, a factory each (which imports its
    # strategy's module only when it makes one)
    "registry": {"config", "models", "tools"},
    "records": {"config", "models", "tools"},
    "config": {"models", "tools"},
    "models": {"tools"},
    "tools": set(),
}
# Layers a reader of records runs in: `bench report`, `compare` and `project` import no torch.
WITHOUT_TORCH = {"report", "project", "registry", "records", "config", "tools"}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if module == "strategies":
        return "registry"
    if parts[0] == "strategies":
        return "strategies"
    if len(parts) == 1 or parts[1] in ("cli", "__main__"):
        return "cli"
    return parts[1]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted([*ROOT.glob("bench/**/*.py"), *ROOT.glob("strategies/**/*.py")]):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of bench or strategies, line) for every import statement in the file, at any
    depth but under ``if TYPE_CHECKING``; `from package import module` counts as importing
    that module."""
    def known_prefix(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):  # imports for type checkers only are not run: left out
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            node.body = []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in ("bench", "strategies"):
                target = known_prefix(name)
                if target:
                    found.append((target, node.lineno))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    known = modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges = graph.setdefault(name, {})
        for target, line in imports_of(path, known):
            # a package's own __init__ is not a way round: `bench.x.y` imports `bench.x` first
            if target != name and not name.startswith(target + "."):
                edges.setdefault(target, line)
    return graph


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    wrong = []
    for source, edges in graph.items():
        here = layer_of(source)
        for target, line in edges.items():
            there = layer_of(target)
            if there != here and there not in MAY_IMPORT[here] and target != "bench":
                wrong.append(f"{source}:{line} ({here}) imports {target} ({there})")
    return wrong


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_is_in_a_known_layer():
    strays = [m for m in modules() if layer_of(m) not in MAY_IMPORT]
    assert not strays, f"modules outside the layer table: {strays}"


def test_no_import_runs_back_up_a_layer():
    wrong = upward_imports(import_graph())
    assert not wrong, "imports that run back up:\n" + "\n".join(wrong)


def test_no_import_circles():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_readers_of_records_import_no_torch_at_module_level():
    """Only top-level imports load with the module; a function may import torch when run."""
    known = modules()
    wrong = []
    for name, path in known.items():
        if layer_of(name) not in WITHOUT_TORCH:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""])
                wrong += [f"{name}:{node.lineno} imports {n}" for n in names
                          if n.split(".")[0] in ("torch", "torchvision", "numpy")]
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_a_back_arrow_and_a_circle():
    """The test's own power, on a made-up graph: a record layer importing the report, and
    two modules importing each other, are both found."""
    graph = {"bench.records.a": {"bench.report.b": 3}, "bench.report.b": {"bench.records.a": 1},
             "bench.tools.c": {}}
    assert upward_imports(graph) == ["bench.records.a:3 (records) imports bench.report.b "
                                     "(report)"]
    assert circles(graph) == [["bench.records.a", "bench.report.b"]]


def test_reading_records_imports_no_torch():
    """What `bench report`, `compare` and `project` import (the strategy registry's order
    among it) loads neither torch nor numpy: a reader of records starts in a fraction of a
    second and runs where torch is not installed."""
    code = ("import sys; import bench.commands.report, bench.commands.compare, "
            "bench.commands.project, strategies; strategies.names(); "
            "print(sorted(m for m in ('torch', 'torchvision', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
