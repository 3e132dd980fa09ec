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
  * functions over 60 lines (``ast``: end_lineno - lineno + 1 > 60).
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

    cb = ts.RooflineCallback(spec, start_step=2, every_n_steps=None, profile_steps=1, wait_for_warmup=False,
                             plot=False, auto_mfu=False, compare_eager=False, save_json=True)
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


def main() -> None:
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
