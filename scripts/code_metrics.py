"""Code metrics of the profiled-step path (issue 31's before/after figures).

    .venv/bin/python scripts/code_metrics.py            # all figures
    .venv/bin/python scripts/code_metrics.py --static   # only the static ones (no fit)

Figures:
  * path files: distinct ``tscope_callbacks`` files whose functions run (module-level code of imports left out) from the profiled step's
    ``RooflineCallback.on_train_batch_start`` until the markdown table has been logged to TensorBoard (a CPU fit of a
    small MLP, ``profile_steps=1``, ``sys.setprofile`` over every Python call);
  * calls up a layer: calls on that path from a module of a lower layer into a module of a higher layer (layers as
    ``tests/test_architecture.py`` lists them);
  * ``Any`` at layer boundaries: parameters and returns annotated ``Any`` (or ``Any | None``; ``dict[str, Any]``
    JSON containers are not counted) of functions and
    methods that a module of another layer imports (``from X import f``/``Class``) -- the values crossing layers;
    ``report: Any`` parameters counted apart;
  * functions over 60 lines (``ast``: end_lineno - lineno + 1 > 60);
  * lines of the package and of the tests (``.py`` files, every line);
  * import circles: simple cycles of the package's module import graph, every import counted (module level,
    function level, ``importlib.import_module`` and annotation-only ``TYPE_CHECKING`` imports alike), and the
    modules in them;
  * ``.meta`` uses (``x.meta`` attribute reads and writes) and string-key accesses of a meta dict (``x.meta["k"]``,
    ``x.meta.get("k")``, ``meta["k"]``, ``meta.get("k")``), against ``.info`` uses;
  * arguments of each public callback's constructor.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "tscope_callbacks"
LAYERS = [("records", "rng"), ("devices", "formulas"), ("capture",), ("analysis",), ("render",),
          ("api", "inputs", "compat", "demo", "report"), ("callbacks", "demo.lightning"), ("cli",)]


def module_of(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def level(mod: str) -> int:
    best = (-1, -1)
    for i, names in enumerate(LAYERS):
        for n in names:
            if mod == n or mod.startswith(n + "."):
                best = max(best, (len(n), i))
    return best[1]


def files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def long_functions(limit: int = 60) -> list[tuple[str, str, int]]:
    out = []
    for p in files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append((str(p.relative_to(ROOT)), node.name, n))
    return sorted(out, key=lambda t: -t[2])


def _has_any(ann: ast.expr | None) -> bool:
    """The annotation is ``Any`` itself, or a union with ``Any`` in it (``Any | None``): an untyped value. Containers
    of JSON values (``dict[str, Any]``) are typed containers and do not count."""
    if ann is None:
        return False
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        try:
            ann = ast.parse(ann.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(ann, ast.Name):
        return ann.id == "Any"
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        return _has_any(ann.left) or _has_any(ann.right)
    return False


def boundary_any() -> tuple[int, int, list[str]]:
    """(Any annotations at layer boundaries, of which ``report: Any``, where)."""
    imported: dict[str, set[str]] = {}  # module -> names other layers import from it
    trees = {module_of(p): ast.parse(p.read_text()) for p in files()}
    for mod, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tscope_callbacks"):
                src = node.module.removeprefix("tscope_callbacks").lstrip(".")
                if src in trees and level(src) != level(mod):
                    imported.setdefault(src, set()).update(a.name for a in node.names)
    total, report_any, where = 0, 0, []
    for mod, names in imported.items():
        tree = trees[mod]
        defs: list[tuple[str, ast.FunctionDef]] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                defs.append((node.name, node))
            elif isinstance(node, ast.ClassDef) and node.name in names:
                defs += [(f"{node.name}.{f.name}", f) for f in node.body
                         if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                         (not f.name.startswith("_") or f.name == "__init__")]
        for name, fn in defs:
            a = fn.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
                if _has_any(arg.annotation):
                    total += 1
                    report_any += arg.arg == "report"
                    where.append(f"{mod}.{name}({arg.arg})")
            if _has_any(fn.returns):
                total += 1
                where.append(f"{mod}.{name} -> ")
    return total, report_any, where


def report_any_everywhere() -> int:
    """Functions anywhere in the package with a ``report`` parameter annotated ``Any``."""
    n = 0
    for p in files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                n += any(x.arg == "report" and _has_any(x.annotation) for x in a.posonlyargs + a.args + a.kwonlyargs)
    return n


def path_trace() -> tuple[list[str], int, Counter]:
    """Files on one profiled step's path and the calls up a layer on it (a CPU fit, TensorBoard logger)."""
    import tempfile
    import warnings

    warnings.filterwarnings("ignore")
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger

    sys.path.insert(0, str(ROOT))
    import tscope_callbacks as ts
    from tscope_callbacks.callbacks import roofline_cb

    spec = ts.DeviceSpec(name="test-cpu", flops={"fp32": 1e11}, bandwidth=2e10, source="metrics", measured=True,
                         vendor="cpu")

    class M(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

        def training_step(self, batch, i):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 32)), batch_size=8)
    state = {"on": False, "done": False}
    seen: Counter = Counter()
    up: Counter = Counter()
    pkg = str(PKG)

    orig_start = roofline_cb.RooflineCallback.on_train_batch_start

    def start(self, trainer, *a, **k):  # the profiled step: the callback's schedule says so
        if not state["done"] and trainer.global_step == 2:
            state["on"] = True
        return orig_start(self, trainer, *a, **k)

    roofline_cb.RooflineCallback.on_train_batch_start = start

    def prof(frame, event, arg):
        if event != "call" or not state["on"]:
            return
        f = frame.f_code.co_filename
        if not f.startswith(pkg) or frame.f_code.co_name == "<module>":  # imports are not the path
            return
        seen[f] += 1
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(pkg):
            caller = caller.f_back
        if caller is not None and caller.f_code.co_filename != f:
            a, b = module_of(Path(caller.f_code.co_filename)), module_of(Path(f))
            if level(a) < level(b):
                up[f"{a} -> {b}"] += 1

    cb = ts.RooflineCallback(spec, start_step=2, every_n_steps=None,
                             capture=ts.CaptureOptions(steps=1, wait_for_warmup=False, compare_eager=False),
                             outputs=ts.RooflineOutputs(plot=False, save_json=True), mfu=ts.MFUOptions(automatic=False))
    # stop once the table reached the logger: wrap the sink's log_text
    from tscope_callbacks.callbacks import sinks as sinks_mod

    sink_cls = sinks_mod.TensorBoardSink
    orig_text = sink_cls.log_text

    def log_text(self, key, text, step):
        r = orig_text(self, key, text, step)
        if key.endswith("/table"):
            state["on"], state["done"] = False, True
        return r

    sink_cls.log_text = log_text
    with tempfile.TemporaryDirectory() as d:
        trainer = pl.Trainer(max_steps=5, logger=TensorBoardLogger(d), callbacks=[cb], enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                             log_every_n_steps=1)
        sys.setprofile(prof)
        try:
            trainer.fit(M(), data)
        finally:
            sys.setprofile(None)
    roofline_cb.RooflineCallback.on_train_batch_start = orig_start
    sink_cls.log_text = orig_text
    if not state["done"]:
        print("warning: the table was never logged (the path count runs to the end of the fit)")
    names = sorted(str(Path(f).relative_to(ROOT)) for f in seen)
    return names, sum(up.values()), up


def lines() -> tuple[int, int]:
    """(package lines, test lines): every line of every ``.py`` file."""
    count = lambda root: sum(len(p.read_text().splitlines()) for p in root.rglob("*.py")  # noqa: E731
                             if "__pycache__" not in p.parts)
    return count(PKG), count(ROOT / "tests")


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (every import: lazy, ``TYPE_CHECKING`` and ``import_module`` too)."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from test_architecture import _modules, _source, imports_of

    mods = set(_modules())
    graph = {}
    for m in mods:
        tree, is_pkg = _source(m)
        graph[m] = {d for d in imports_of(tree, m, is_pkg, annotations=True) if d in mods}
    return graph


def import_circles(graph: dict[str, set[str]], limit: int = 10000) -> list[list[str]]:
    """The simple cycles of ``graph`` (each once, from its smallest module; at most ``limit``)."""
    out: list[list[str]] = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack and len(out) < limit:
            node, path = stack.pop()
            for d in sorted(graph.get(node, ())):
                if d == start:
                    out.append(path)
                elif d > start and d not in path:
                    stack.append((d, path + [d]))
    return out


def circle_groups(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan): each group is one import circle however many
    simple cycles run through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def meta_uses() -> dict[str, int]:
    """``.meta`` attribute uses, string-key accesses of a meta dict, and ``.info`` uses in the package."""
    uses = keys = info = 0
    for p in files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "meta":
                uses += 1
            if isinstance(node, ast.Attribute) and node.attr == "info" and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("log", "logging", "logger")):
                info += 1
            target = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(
                    node.slice.value, str):
                target = node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("get", "setdefault", "pop") and node.args
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                target = node.func.value
            if target is not None and ((isinstance(target, ast.Attribute) and target.attr == "meta")
                                       or (isinstance(target, ast.Name) and target.id == "meta")):
                keys += 1
    return {"meta_uses": uses, "meta_key_accesses": keys, "info_uses": info}


def test_counts() -> dict[str, int]:
    """Test functions, and those in files that import an internal module (``tscope_callbacks.<module>``) or use one
    (``ts.<name>`` of the top level only counts as public)."""
    total = internal = 0
    for p in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(p.read_text())
        tests = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name.startswith("test_")]
        mod_level = any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("tscope_callbacks.")
                        or isinstance(n, ast.Import) and any(a.name.startswith("tscope_callbacks.") for a in n.names)
                        for n in tree.body)
        total += len(tests)
        for t in tests:
            inner = any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("tscope_callbacks.")
                        for n in ast.walk(t))
            internal += mod_level or inner
    return {"test_functions": total, "importing_internals": internal}


CALLBACKS = {"RooflineCallback": "callbacks/roofline_cb.py", "LayerProfilerCallback": "callbacks/layers_cb.py",
             "NaNGuardCallback": "callbacks/nan_guard.py", "WatchCallback": "callbacks/watch.py",
             "StepMonitor": "callbacks/monitor.py"}


def callback_arguments() -> dict[str, int]:
    """Arguments of each public callback's ``__init__`` (``self`` left out)."""
    out = {}
    for name, rel in CALLBACKS.items():
        for node in ast.walk(ast.parse((PKG / rel).read_text())):
            if isinstance(node, ast.ClassDef) and node.name == name:
                init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
                if init is not None:
                    a = init.args
                    out[name] = len(a.posonlyargs + a.args + a.kwonlyargs) - 1 + bool(a.vararg) + bool(a.kwarg)
    return out


def main() -> None:
    pkg_lines, test_lines = lines()
    print(f"lines: package {pkg_lines}, tests {test_lines}")
    tc = test_counts()
    print(f"test functions: {tc['test_functions']}, of which in files or bodies importing an internal module: "
          f"{tc['importing_internals']}")
    graph = import_graph()
    groups, circles = circle_groups(graph), import_circles(graph)
    print(f"import circles (every import, annotations and lazy ones included): {len(groups)} groups of modules "
          f"importing each other, {len(circles)} simple cycles through them")
    for g in groups:
        print("    " + ", ".join(m.removeprefix("tscope_callbacks.") for m in g))
    m = meta_uses()
    print(f".meta uses: {m['meta_uses']}; string-key accesses of a meta dict: {m['meta_key_accesses']}; "
          f".info uses: {m['info_uses']}")
    print("callback arguments: " + ", ".join(f"{k} {v}" for k, v in callback_arguments().items()))
    longs = long_functions()
    total, rep, where = boundary_any()
    print(f"functions over 60 lines: {len(longs)}")
    for f, n, ln in longs:
        print(f"    {ln:4d}  {f}:{n}")
    print(f"Any annotations at layer boundaries: {total} (report: Any parameters among them: {rep})")
    print(f"functions with a `report: Any` parameter (anywhere): {report_any_everywhere()}")
    if "-v" in sys.argv:
        print("\n".join(f"    Any: {w}" for w in where))
    if "--static" in sys.argv:
        return
    names, n_up, up = path_trace()
    print(f"files on one profiled step's path (on_train_batch_start -> TensorBoard table): {len(names)}")
    for n in names:
        print(f"    {n}")
    print(f"calls up a layer on that path: {n_up} ({len(up)} distinct caller -> callee modules)")
    for k, v in up.most_common():
        print(f"    {v:5d}  {k}")


if __name__ == "__main__":
    main()
