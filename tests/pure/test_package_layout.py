"""The package's layout holds: no module imports itself back through others, no two folders import
each other (the subpackages are layers), few loose modules, every subpackage says what it holds,
and the paths users import keep working."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Container
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "shufflefs"
MAX_LOOSE = 10
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _eager_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that ``name`` imports when it is loaded or type-checked: imports at
    module level, inside top-level ``if``/``try`` blocks (``TYPE_CHECKING`` included), not inside
    functions or classes."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in modules:
                        found.add(f"{target}.{alias.name}")
                if target in modules:
                    found.add(target)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))
    visit(ast.parse(path.read_text()).body)
    found.discard(name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if not state.get(v):
                found = dfs(v)
                if found:
                    return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if not state.get(u):
            found = dfs(u)
            if found:
                return found
    return None


def test_no_module_imports_itself_back():
    modules = _modules()
    graph = {m: _eager_imports(m, p, modules) for m, p in modules.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _all_imports(name: str, source: str, is_init: bool, modules: Container[str]) -> set[str]:
    """Modules of the package that ``name`` imports anywhere (inside functions and classes too),
    except under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    package = name.split(".") if is_init else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules)
            if target in modules:
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        for child in ast.iter_child_nodes(node):
            visit(child)
    visit(ast.parse(source))
    found.discard(name)
    return found


def _folder(module: str) -> str | None:
    """The subpackage (folder) of the package a module is in; None for a loose module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else None


def _folder_graph(modules: dict[str, Path]) -> dict[str, dict[str, set[str]]]:
    """folder -> {other folder it imports: the modules that import it}."""
    graph: dict[str, dict[str, set[str]]] = {}
    for name, path in modules.items():
        here = _folder(name)
        if here is None:
            continue
        graph.setdefault(here, {})
        for target in _all_imports(name, path.read_text(), path.name == "__init__.py", modules):
            there = _folder(target)
            if there is not None and there != here:
                graph[here].setdefault(there, set()).add(f"{name} -> {target}")
    return graph


def test_no_two_folders_import_each_other():
    """The subpackages form layers: none imports, even inside a function, a folder that imports
    it back, directly or through others (``if TYPE_CHECKING:`` imports, never run, aside)."""
    graph = _folder_graph(_modules())
    cycle = _cycle({f: set(uses) for f, uses in graph.items()})
    assert cycle is None, "; ".join(
        f"{a} -> {b} ({', '.join(sorted(graph[a][b])[:3])}{', ...' if len(graph[a][b]) > 3 else ''})"
        for a, b in zip(cycle, cycle[1:]))


def test_the_folder_scan_sees_imports_in_functions_and_skips_type_checking():
    source = ("from typing import TYPE_CHECKING\nfrom . import c\nif TYPE_CHECKING:\n    from ..b import y\n"
              "def f():\n    from ..b.x import z\n    import p.d\n")
    modules = {"p.a", "p.a.m", "p.a.c", "p.b", "p.b.x", "p.d"}
    assert _all_imports("p.a.m", source, False, modules) == {"p.a", "p.a.c", "p.b.x", "p.d"}


def test_few_loose_modules_and_every_subpackage_says_what_it_holds():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE, loose
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 20 and "import" in doc.lower(), f"{init}: say what it holds and may import"


def test_the_fuse_adapter_stays_small():
    """fs/fuse_ops.py only translates requests to the catalog: under 400 lines."""
    assert len((PACKAGE / "fs" / "fuse_ops.py").read_text().splitlines()) < 400


def test_no_module_is_too_long():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


@pytest.mark.parametrize("path, name", [
    ("shufflefs.quality", "label_mix_tv"),  # the README's examples
    ("shufflefs.quality", "gap_entropy"),
    ("shufflefs.formats", "scan_file"),
    ("shufflefs.cli.demo", "write_dataset"),
    ("shufflefs.torch", "set_epoch"),
    ("shufflefs.cli", "main"),  # the console script
])
def test_paths_users_import(path, name):
    assert callable(getattr(importlib.import_module(path), name))


def test_the_command_runs_as_a_module():
    r = subprocess.run([sys.executable, "-m", "shufflefs", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
