"""The package's architecture, checked on its source:

- every module imports;
- imports follow the layers: a module imports only its own or lower layers (module-level and function-level imports
  alike, ``importlib.import_module("tscope_callbacks...")`` and annotation-only ``TYPE_CHECKING`` imports too), and
  never the package's top level (``import tscope_callbacks``, ``from tscope_callbacks import profile``: the top level
  reaches every layer) unless it sits above it;
- analysis is pure: it never imports a renderer, a device resolver, a callback or the CLI;
- the import graph has no cycle (``TYPE_CHECKING`` imports excepted: they do not run);
- a class's private members (``obj._x``) are read and written only by the module that defines the class (``self``
  and ``cls`` aside): helpers get an explicit state object instead.

Each check is a function of source text, run on the package and on small synthetic modules that must fail it.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

import tscope_callbacks

PKG = Path(tscope_callbacks.__file__).parent
TOP = "tscope_callbacks"

#: lowest first; a module may import modules of its own layer or below. "" is the package's top level (its
#: ``__init__``, which reaches every layer's public names): only the layers above it may import it
LAYERS: list[tuple[str, ...]] = [
    ("records", "rng", "hostclock"),
    ("devices", "formulas"),
    ("capture",),
    ("analysis",),
    ("render",),
    ("api", "inputs", "compat", "demo", "report"),
    ("callbacks", "demo.lightning"),
    ("",),
    ("cli", "dashboard"),  # the dashboard (TensorBoard plugin) reads saved reports through cli.report
]
#: analysis is pure: it never renders, and never resolves a device (which may measure one). Like the layer order,
#: this holds for annotation-only (``TYPE_CHECKING``) imports too: an analysis that names a renderer's class
#: depends on it
FORBIDDEN = {"analysis": ("render", "devices.resolve", "devices.calibrate", "callbacks", "cli", "api", "")}

#: cross-module private accesses that other work in progress still has to remove: module -> attribute names.
#: Kept exact: an entry that no longer occurs fails the test too (remove it here when it is fixed)
PENDING_PRIVATE: dict[str, set[str]] = {
}


# ---------------- reading the source ----------------
def _modules() -> list[str]:
    return [TOP] + [m.name for m in pkgutil.walk_packages([str(PKG)], f"{TOP}.")]


def _rel(mod: str) -> str:
    return mod.removeprefix(TOP).lstrip(".")


def _source(mod: str) -> tuple[ast.Module, bool]:
    path = Path(importlib.util.find_spec(mod).origin)
    return ast.parse(path.read_text()), path.name == "__init__.py"


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            skip.update(id(n) for n in ast.walk(node))
    return skip


def imports_of(tree: ast.Module, mod: str, is_pkg: bool = False, annotations: bool = False) -> set[str]:
    """The package modules ``mod`` imports (``TOP`` for the package's top level). ``annotations``: also the imports
    under ``if TYPE_CHECKING:``."""
    skip = set() if annotations else _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name == TOP or a.name.startswith(TOP + "."))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = mod.split(".")[: len(mod.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(parts + ([base] if base else []))
            if base != TOP and not base.startswith(TOP + "."):
                continue
            for a in node.names:  # `from pkg import submodule` imports the submodule; a name, the module itself
                sub = f"{base}.{a.name}"
                out.add(sub if _is_module(sub) else base)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.startswith(TOP)):
            out.add(node.args[0].value)
    return {m for m in out if m != mod}


def _level(mod: str) -> int:
    rel = _rel(mod)
    best = (-1, -1)  # (prefix length, level): the longest matching prefix decides
    for i, names in enumerate(LAYERS):
        for n in names:
            if rel == n or (n and rel.startswith(n + ".")):
                best = max(best, (len(n), i))
    assert best[1] >= 0, f"{mod} is in no layer: add it to LAYERS"
    return best[1]


def _within(rel: str, area: str) -> bool:
    return rel == area or (bool(area) and rel.startswith(area + "."))


def layer_violations(mod: str, deps: Iterable[str], annotation_deps: Iterable[str] = ()) -> list[str]:
    """What is wrong with ``mod`` importing ``deps`` (``annotation_deps``: also those under ``TYPE_CHECKING``)."""
    bad = []
    lvl, rel = _level(mod), _rel(mod)
    for dep in sorted(set(deps) | set(annotation_deps)):
        if _level(dep) > lvl:
            what = "the package's top level" if dep == TOP else f"{_rel(dep)} (layer {_level(dep)})"
            bad.append(f"{rel or TOP} (layer {lvl}) imports {what}")
        for area, banned in FORBIDDEN.items():
            if _within(rel, area) and any(_within(_rel(dep), b) for b in banned):
                bad.append(f"{rel} imports {_rel(dep) or TOP}: {area} must not")
    return bad


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> the modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)) is not None:
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


# ---------------- private members ----------------
def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


#: private names that torch's own objects carry (``Tensor._version``, an op's ``_opname``, a node's
#: ``_sequence_nr``...): reading them is using torch's protocol, not reaching into one of our classes
TORCH_PRIVATE = {n for obj in (torch.Tensor, torch.nn.Module, torch.ops.aten.mm.default, torch.ops.aten.mm,
                               torch.autograd.graph.Node, torch.optim.Optimizer, torch.nn.Parameter)
                 for n in dir(obj) if _private(n)}


def class_privates(tree: ast.Module) -> dict[str, set[str]]:
    """class name -> the private names it defines: methods, class attributes, ``self._x``/``cls._x`` writes,
    dataclass fields and ``__slots__`` entries."""
    out: dict[str, set[str]] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        names = out.setdefault(cls.name, set())
        for n in cls.body:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and _private(t.id):
                    names.add(t.id)
                if isinstance(t, ast.Name) and t.id == "__slots__" and isinstance(n.value, (ast.Tuple, ast.List)):
                    names.update(e.value for e in n.value.elts if isinstance(e, ast.Constant) and _private(e.value))
        for n in ast.walk(cls):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(n.name):
                names.add(n.name)
            elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _private(n.attr)
                  and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                names.add(n.attr)
    return out


def _foreign(v: ast.expr) -> bool:
    """Whether ``v._x`` may reach into another object: not ``self``, ``cls`` or ``super()``."""
    if isinstance(v, ast.Name) and v.id in ("self", "cls"):
        return False
    return not (isinstance(v, ast.Call) and getattr(v.func, "id", "") == "super")


def private_accesses(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every ``obj._x`` read or write whose object is not ``self``/``cls``/``super()``."""
    return [(n.lineno, n.attr) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and _private(n.attr) and _foreign(n.value)]


def _imported_classes(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """local name -> (module relative to the package, class name) of ``from tscope_callbacks.x import Name``."""
    out = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").startswith(TOP + "."):
            for a in n.names:
                out[a.asname or a.name] = (_rel(n.module), a.name)
    return out


def _annotated_accesses(tree: ast.Module) -> list[tuple[int, str, str, str]]:
    """(line, name, module, class) of ``p._x`` where ``p`` is a parameter annotated with a class imported from
    another package module (``def f(p: Profile)``), whatever the accessing module itself defines."""
    classes = _imported_classes(tree)
    out = []
    for f in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        typed = {}
        for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs:
            ann = a.annotation
            name = ann.id if isinstance(ann, ast.Name) else ann.value if isinstance(ann, ast.Constant) else None
            if isinstance(name, str) and name in classes:
                typed[a.arg] = classes[name]
        for n in ast.walk(f):
            if (isinstance(n, ast.Attribute) and _private(n.attr) and isinstance(n.value, ast.Name)
                    and n.value.id in typed and n.value.id not in ("self", "cls")):
                out.append((n.lineno, n.attr, *typed[n.value.id]))
    return out


def foreign_private_accesses(sources: dict[str, ast.Module]) -> dict[str, dict[str, list[int]]]:
    """module -> {private name: lines} for accesses to a private member of another module's class: one that only
    other modules' classes define, or any defined by the class a parameter is annotated with (``p: Profile``).
    Same-module access and torch's own private names (``Tensor._version``...) are allowed."""
    owners: dict[str, set[str]] = {}
    members: dict[tuple[str, str], set[str]] = {}
    for mod, tree in sources.items():
        for cls, names in class_privates(tree).items():
            members[(mod, cls)] = names
            for name in names:
                owners.setdefault(name, set()).add(mod)
    found: dict[str, dict[str, set[int]]] = {}
    for mod, tree in sources.items():
        for line, name in private_accesses(tree):
            defined_by = owners.get(name, set())
            if defined_by and mod not in defined_by and name not in TORCH_PRIVATE:
                found.setdefault(mod, {}).setdefault(name, set()).add(line)
        for line, name, cmod, cls in _annotated_accesses(tree):
            if cmod != mod and name in members.get((cmod, cls), ()):
                found.setdefault(mod, {}).setdefault(name, set()).add(line)
    return {m: {n: sorted(v) for n, v in names.items()} for m, names in found.items()}


# ---------------- the package ----------------
def test_every_module_imports_and_exports_what_it_lists() -> None:
    """Each module imports, and every name its ``__all__`` lists exists (a name renamed or deleted but still listed
    breaks ``from module import *`` and the docs' API pages)."""
    missing = {}
    for mod in _modules():
        m = importlib.import_module(mod)
        gone = [n for n in getattr(m, "__all__", ()) if not hasattr(m, n)]
        if gone:
            missing[mod] = gone
    assert not missing, missing


def test_imports_follow_the_layers_and_analysis_is_pure() -> None:
    bad = []
    for mod in _modules():
        tree, is_pkg = _source(mod)
        bad += layer_violations(mod, imports_of(tree, mod, is_pkg), imports_of(tree, mod, is_pkg, annotations=True))
    assert not bad, "\n".join(bad)


def test_no_import_cycles_even_for_annotations() -> None:
    # every import counts: module level, lazy ones inside functions, importlib's, and those only for annotations
    # (``if TYPE_CHECKING:``); a type two modules share lives in its own module, or a Protocol says what a helper reads
    mods = set(_modules())
    graph = {}
    for m in mods:
        tree, is_pkg = _source(m)
        graph[m] = {d for d in imports_of(tree, m, is_pkg, annotations=True) if d in mods}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(_rel(x) or TOP for x in cycle)


def test_no_import_circle_in_the_capture_even_for_annotations() -> None:
    # the capture's helpers (state, attribute, cuda_timing; build, region, profile, replay) see the objects that own
    # them through Protocols (attribute.AttributionState, cuda_timing.TimedState, profile_options.ProfileOptions): no import
    # runs back up, not even one for an annotation or a lazy one inside a function
    mods = {m for m in _modules() if _rel(m).startswith("capture")}
    graph = {}
    for m in mods:
        tree, is_pkg = _source(m)
        graph[m] = {d for d in imports_of(tree, m, is_pkg, annotations=True) if d in mods}
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(_rel(x) for x in cycle)


def test_no_module_touches_the_private_members_of_another_modules_class() -> None:
    found = foreign_private_accesses({_rel(m): _source(m)[0] for m in _modules()})
    new = {m: {n: lines for n, lines in names.items() if n not in PENDING_PRIVATE.get(m, set())}
           for m, names in found.items()}
    new = {m: names for m, names in new.items() if names}
    assert not new, "private members of another module's class (give the helper an explicit state object): " + \
        "; ".join(f"{m}: " + ", ".join(f"{n} (lines {v})" for n, v in sorted(names.items()))
                  for m, names in sorted(new.items()))
    stale = {m: names - set(found.get(m, {})) for m, names in PENDING_PRIVATE.items()}
    stale = {m: names for m, names in stale.items() if names}
    assert not stale, f"fixed, remove from PENDING_PRIVATE: {stale}"


def test_public_api_names() -> None:
    for name in tscope_callbacks.__all__:
        assert getattr(tscope_callbacks, name) is not None
    assert callable(tscope_callbacks.roofline) and callable(tscope_callbacks.calibrate)


# ---------------- each check fails where it must ----------------
def _parse(src: str) -> ast.Module:
    return ast.parse(textwrap.dedent(src))


@pytest.mark.parametrize(("mod", "src", "want"), [
    # a lower layer importing the package's top level, in each spelling
    ("tscope_callbacks.devices.x", "import tscope_callbacks as ts", "imports the package's top level"),
    ("tscope_callbacks.devices.x", "def f():\n    import tscope_callbacks\n", "imports the package's top level"),
    ("tscope_callbacks.capture.x", "from tscope_callbacks import profile", "imports the package's top level"),
    ("tscope_callbacks.formulas.x", "from .. import DeviceSpec", "imports the package's top level"),
    # a lower layer importing a higher one, also lazily and by name
    ("tscope_callbacks.devices.x", "def f():\n    from tscope_callbacks.capture import profile\n", "capture.profile"),
    ("tscope_callbacks.capture.x", "import importlib\nimportlib.import_module('tscope_callbacks.analysis.roofline')",
     "analysis.roofline (layer 3)"),
    # analysis importing render: at run time, and for annotations only
    ("tscope_callbacks.analysis.x", "from tscope_callbacks.render import markdown", "analysis must not"),
    ("tscope_callbacks.analysis.x",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tscope_callbacks.render.report import RooflineReport\n",
     "analysis must not"),
    ("tscope_callbacks.analysis", "from tscope_callbacks.render.report import RooflineReport", "analysis must not"),
    # an annotation-only import from a higher layer
    ("tscope_callbacks.capture.x", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from tscope_callbacks.analysis.roofline import RooflineAnalysis\n",
     "analysis.roofline (layer 3)"),
])
def test_the_layer_check_catches(mod: str, src: str, want: str) -> None:
    tree = _parse(src)
    bad = layer_violations(mod, imports_of(tree, mod), imports_of(tree, mod, annotations=True))
    assert any(want in b for b in bad), bad


@pytest.mark.parametrize(("mod", "src"), [
    ("tscope_callbacks.cli.x", "import tscope_callbacks as ts"),  # the CLI sits above the top level
    ("tscope_callbacks.analysis.x", "from tscope_callbacks.capture.profile import Profile"),
    ("tscope_callbacks.capture.x", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from tscope_callbacks.capture.state import CaptureState\n"),
])
def test_the_layer_check_allows(mod: str, src: str) -> None:
    tree = _parse(src)
    assert layer_violations(mod, imports_of(tree, mod), imports_of(tree, mod, annotations=True)) == []


def test_the_cycle_check_catches_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) is None


def test_the_private_member_check_catches_a_helper_reaching_into_a_class() -> None:
    owner = _parse('''
        class Profile:
            __slots__ = ("_slot",)
            _depth = 0

            def __init__(self):
                self._pending = []
                self._version = 0  # shares its name with torch's Tensor._version

            def _record(self, op):
                self._pending.append(op)  # its own state: fine
                other = Profile()
                other._pending.clear()  # another instance, same module: fine
    ''')
    helper = _parse('''
        class Helper:
            def __init__(self):
                self._own = 1

            def run(self, p, t):
                p._pending.append(1)  # write into Profile's list
                p._record(t)  # call its private method
                n = p._depth + p._slot  # read its class attribute and slot
                self._own += t._version  # own state, and torch's protocol: fine
                return super()._private_of_base  # a base class's member, through super(): fine
    ''')
    # a module with a member of the same name, reading it from another module's class (the parameter's annotation
    # tells): caught; its own class's member: fine
    replay = _parse('''
        from tscope_callbacks.capture.profile import Profile

        class Replay:
            def __init__(self, source: Profile, other: "Replay"):
                self._pending = []
                if source._pending:
                    other._pending.clear()
    ''')
    found = foreign_private_accesses({"capture.profile": owner, "capture.region": helper, "capture.replay": replay})
    assert set(found) == {"capture.region", "capture.replay"}
    assert found["capture.region"] == {"_pending": [7], "_record": [8], "_depth": [9], "_slot": [9]}
    assert found["capture.replay"] == {"_pending": [7]}
