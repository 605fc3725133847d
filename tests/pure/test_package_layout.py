"""The package's layout holds: no module imports itself back through others, few loose modules,
every subpackage says what it holds, and the paths users import keep working."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
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
