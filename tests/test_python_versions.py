"""The package says `requires-python >= 3.9`, but our interpreter is newer, so nothing here
runs the code on 3.9. `X | Y` of types is the one 3.10 feature that the lint (ruff,
target py39) does not flag: inside annotations it is fine under `from __future__ import
annotations` (never evaluated), anywhere else it is evaluated and raises TypeError on 3.9
(`isinstance(x, int | float)` once made `bench project` and `bench report` crash there).
This walks every source file's syntax tree for such unions."""

from __future__ import annotations

import ast

import pytest
from conftest import ROOT

SOURCES = ("bench", "strategies", "scripts", "tests", "benchmarks")
# Names that, joined by `|`, can only be a type union (a set or int `|` never involves them).
TYPE_NAMES = {"int", "float", "str", "bool", "bytes", "list", "dict", "tuple", "set",
              "frozenset", "type", "object", "Path", "Any"}


def _is_type_like(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    # Types are CamelCase; ALL_CAPS names are constants (os.O_WRONLY | os.O_CREAT, re.I | re.M)
    if isinstance(node, ast.Name):
        return node.id in TYPE_NAMES or (node.id[:1].isupper() and not node.id.isupper())
    if isinstance(node, ast.Attribute):
        return node.attr[:1].isupper() and not node.attr.isupper()
    if isinstance(node, ast.Subscript):  # list[int] | None
        return _is_type_like(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_type_like(node.left) or _is_type_like(node.right)
    return False


def _unions(tree: ast.AST) -> list[ast.BinOp]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr)
            and (_is_type_like(n.left) or _is_type_like(n.right))]


def _annotations(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            found += [a.annotation for a in every if a is not None and a.annotation]
            found += [node.returns] if node.returns else []
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return found


def runtime_unions(source: str) -> list[int]:
    """Line numbers of `X | Y` type unions that Python 3.9 would evaluate."""
    tree = ast.parse(source)
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                    and any(a.name == "annotations" for a in n.names) for n in tree.body)
    unions = _unions(tree)
    if postponed:
        inside = {id(u) for ann in _annotations(tree) for u in _unions(ann)}
        unions = [u for u in unions if id(u) not in inside]
    return sorted({u.lineno for u in unions})


def test_the_check_finds_what_fails_on_python_39_and_passes_what_does_not():
    assert runtime_unions("isinstance(x, int | float)\n") == [1]
    assert runtime_unions("def f(a: str | None = None): pass\n") == [1]
    assert runtime_unions("from __future__ import annotations\n"
                          "Maybe = list[int] | None\n") == [2]
    assert runtime_unions("from __future__ import annotations\n"
                          "def f(a: str | None = None) -> dict[str, int] | None: pass\n"
                          "x: Path | None = None\n") == []
    assert runtime_unions("flags = a | b\nmask = 1 | 2\nkeys = set(x) | {'y'}\n") == []
    assert runtime_unions("fd = os.open(p, os.O_WRONLY | os.O_CREAT)\nf = re.I | re.M\n") == []
    assert runtime_unions("isinstance(x, pd.DataFrame | None)\n") == [1]


@pytest.mark.parametrize("folder", SOURCES)
def test_no_type_union_is_evaluated_at_run_time(folder):
    bad = [f"{path.relative_to(ROOT)}:{line}"
           for path in sorted((ROOT / folder).rglob("*.py"))
           for line in runtime_unions(path.read_text())]
    assert not bad, "evaluated `X | Y` unions fail on Python 3.9 (use a tuple in isinstance, " \
                    "Optional/Union or `from __future__ import annotations`): " + ", ".join(bad)
