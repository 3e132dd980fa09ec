"""The package's layers: every module imports, imports only its own or lower layers, and the import graph (module-level
and function-level imports alike; ``TYPE_CHECKING`` blocks excepted) has no cycle. Plus the size rule."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import tscope_callbacks

PKG = Path(tscope_callbacks.__file__).parent

#: lowest first; a module may import modules of its own layer or below
LAYERS: list[tuple[str, ...]] = [
    ("records", "rng"),
    ("devices", "formulas"),
    ("capture",),
    ("analysis",),
    ("render",),
    ("api", "inputs", "compat", "demo"),
    ("callbacks", "demo.lightning"),
    ("cli",),
]
#: analysis is pure: it never renders, and never resolves a device (which may measure one)
FORBIDDEN = {"analysis": ("render", "devices.resolve", "devices.calibrate", "callbacks", "cli", "api")}


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages([str(PKG)], "tscope_callbacks.")]


def _rel(mod: str) -> str:
    return mod.removeprefix("tscope_callbacks").lstrip(".")


def _level(mod: str) -> int:
    rel = _rel(mod)
    best = (-1, -1)  # (prefix length, level): the longest matching prefix decides
    for i, names in enumerate(LAYERS):
        for n in names:
            if rel == n or rel.startswith(n + "."):
                best = max(best, (len(n), i))
    assert best[1] >= 0, f"{mod} is in no layer: add it to LAYERS"
    return best[1]


def _imports(mod: str) -> set[str]:
    path = Path(importlib.util.find_spec(mod).origin)
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    skip: set[int] = set()
    for node in ast.walk(tree):  # imports under `if TYPE_CHECKING:` are for annotations only
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            skip.update(id(n) for n in ast.walk(node))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("tscope_callbacks."))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = mod.split(".")[: len(mod.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(parts + ([base] if base else []))
            if not base.startswith("tscope_callbacks"):
                continue
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{base}.{a.name}"
                out.add(sub if importlib.util.find_spec(base) and _is_module(sub) else base)
    return {m for m in out if m != "tscope_callbacks"}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_every_module_imports() -> None:
    for mod in _modules():
        importlib.import_module(mod)


def test_imports_follow_the_layers_and_analysis_is_pure() -> None:
    bad = []
    for mod in _modules():
        lvl = _level(mod)
        rel = _rel(mod)
        for dep in _imports(mod):
            if _level(dep) > lvl:
                bad.append(f"{rel} (layer {lvl}) imports {_rel(dep)} (layer {_level(dep)})")
            for area, banned in FORBIDDEN.items():
                if rel.startswith(area + ".") and any(_rel(dep) == b or _rel(dep).startswith(b + ".") for b in banned):
                    bad.append(f"{rel} imports {_rel(dep)}: {area} must not")
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    graph = {m: {d for d in _imports(m) if d in set(_modules())} for m in _modules()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in graph[m]:
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(_rel(x) for x in stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)


def test_files_stay_small() -> None:
    big = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not big, f"files over 400 lines: {big}"


def test_public_api_names() -> None:
    for name in tscope_callbacks.__all__:
        assert getattr(tscope_callbacks, name) is not None
    assert callable(tscope_callbacks.roofline) and callable(tscope_callbacks.calibrate)
