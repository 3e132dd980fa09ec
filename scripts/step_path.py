"""Trace one profiled step's path through the package: which tscope files it crosses, and how often control
climbs back up (a call from a lower layer into a higher one, or a helper calling back into the callback that
called it).

Run: ``python scripts/step_path.py [--json] [--profile-steps K]``. It fits a small MLP on the CPU for 4 steps with a
``RooflineCallback`` (a fixed roof, TensorBoard logger, plot and step JSON on) that profiles step 2, and records
every Python call (``sys.setprofile``) made inside the callback's Lightning hooks at the steps from the profile's
start until its report is written (with ``--profile-steps 1``, the default here: the profiled step's
``on_train_batch_start`` and ``on_train_batch_end``). The user's own forward/backward between the hooks is not
traced (the capture's per-op handlers run there), so the figures are about the callback's path, not the capture's.

Counted (each as distinct call edges ``caller function -> callee function``, and as dynamic calls):

- ``files``: tscope_callbacks files that hold a function called on the path (``post-capture``: only the part
  after ``Profile.stop`` returned -- analysis and outputs);
- ``up_layer``: calls from a module of a lower layer into a higher one (the layers of
  ``tests/test_architecture.py``: records < devices/formulas < capture < analysis < render < api < callbacks < cli);
- ``into_caller``: calls of a method of the callback object by a function that is not one of its methods (a helper
  handed the callback, ``cb: Any``, calling back into it);
- ``cb_base_switches``: calls between ``callbacks/roofline_cb.py`` and ``callbacks/base.py`` (either way);
- ``asks_analysis``: distinct analysis/render/api functions the callbacks' files call directly (a derived field of
  the typed report, a property in ``analysis/report.py``, is listed apart as a read).

``data_path`` (issue 42's "one profiled step's way to TensorBoard"): the calls, after the capture stopped, that are
handed the step's data as an argument -- the StepProfile ``Profile.stop`` returned, or a value a call on the path
returned (transitively: the analysis, the report, the markdown text...; a constructed object's ``self`` too) -- from
one file into another, up to and including the TensorBoard sink's writes (a method of the data object itself is a
read, and a helper within one file is that file's business: neither counts). Counted: the calls (dynamic and as distinct ``caller -> callee`` edges), the files of their
functions, and the climbs: consecutive calls on the path, in time order, whose callee sits in a higher layer than the
previous one's (the data going back up a layer: analysis -> render -> analysis -> callbacks counts 2).

Static counts over the callbacks' files: parameters annotated ``cb: Any``, attribute writes on a parameter named
``cb`` (``cb.x = ...``: state set on the callback from outside its class) and attribute reads of it (``cb.x``: a
helper reaching back into the callback's state).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PKG = ROOT / "tscope_callbacks"

LAYERS: list[tuple[str, ...]] = [("records", "rng"), ("devices", "formulas"), ("capture",), ("analysis",), ("render",),
                                 ("api", "inputs", "compat", "demo", "report"), ("callbacks", "demo.lightning"),
                                 ("cli",)]
OWN = ("callbacks/roofline_cb.py", "callbacks/base.py", "callbacks/roofline_io.py", "callbacks/sinks.py",
       "callbacks/coordinator.py", "callbacks/context.py", "callbacks/schedule.py", "callbacks/series.py",
       "callbacks/sink_setup.py", "callbacks/emit.py")


def _rel(filename: str) -> str | None:
    try:
        return Path(filename).resolve().relative_to(PKG).as_posix()
    except ValueError:
        return None


def layer(rel: str) -> int:
    mod = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    best = (-1, -1)
    for i, names in enumerate(LAYERS):
        for n in names:
            if mod == n or mod.startswith(n + "."):
                best = max(best, (len(n), i))
    return best[1]


def _members(v: Any) -> list[Any]:
    if isinstance(v, (list, tuple)):
        return list(v[:64])
    if isinstance(v, dict):
        return list(v.values())[:64]
    return []


class DataPath:
    """The calls handed the step's data after the capture stopped (module doc: ``data_path``)."""

    def __init__(self) -> None:
        self.keep: list[Any] = []  # tracked objects stay alive, so their ids are never reused
        self.ids: set[int] = set()
        self.frames: set[int] = set()
        self.calls: list[tuple[tuple[str, str], tuple[str, str]]] = []

    def track(self, v: Any) -> None:
        if v is None or isinstance(v, (bool, int, float)) or id(v) in self.ids:
            return
        self.ids.add(id(v))
        self.keep.append(v)

    def holds(self, v: Any) -> bool:
        """``v`` is the step's data, or an object (a dataclass, a container) holding it one level down."""
        if id(v) in self.ids:
            return True
        if isinstance(v, (list, tuple, dict)):
            return any(id(m) in self.ids for m in _members(v))
        d = getattr(v, "__dict__", None)
        return isinstance(d, dict) and not isinstance(v, type) and any(id(m) in self.ids for m in list(d.values()))

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "return":
            if id(frame) in self.frames:
                self.frames.discard(id(frame))
                self.track(arg)
                if code.co_name == "__init__" and "self" in frame.f_locals:
                    self.track(frame.f_locals["self"])
            return
        if event != "call":
            return
        callee_file = _rel(code.co_filename)
        if code.co_name == "__init__" and callee_file is None and code.co_filename == "<string>":
            names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
            if any(self.holds(frame.f_locals.get(n)) for n in names if n != "self"):
                self.frames.add(id(frame))  # a dataclass built from the data (its ``self`` is tracked at return)
            return
        if callee_file is None or code.co_name.startswith("<"):
            return
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if not any(self.holds(frame.f_locals.get(n)) for n in names if n != "self"):
            return  # not handed the data (a method of the data object itself is a read)
        back = frame.f_back
        while back is not None and back.f_code.co_name.startswith("<") and back.f_back is not None:
            back = back.f_back
        caller = (_rel(back.f_code.co_filename) or "<outside>", back.f_code.co_qualname) if back else ("<outside>", "")
        self.frames.add(id(frame))  # what it returns is the step's data too
        if caller[0] == callee_file:
            return  # a helper within one file: the file's own business
        self.calls.append((caller, (callee_file, code.co_qualname)))

    def summary(self) -> dict[str, Any]:
        edges = Counter(f"{a[0]}:{a[1]} -> {b[0]}:{b[1]}" for a, b in self.calls)
        layers = [layer(b[0]) for _, b in self.calls]
        climbs = [f"{self.calls[i - 1][1][0]}:{self.calls[i - 1][1][1]} -> {self.calls[i][1][0]}:{self.calls[i][1][1]}"
                  for i in range(1, len(layers)) if layers[i] > layers[i - 1] >= 0]
        seq: list[str] = []
        for _, b in self.calls:
            area = b[0].split("/")[0].removesuffix(".py")
            if not seq or seq[-1] != area:
                seq.append(area)
        return {"calls": len(self.calls), "distinct": len(edges), "files": len({b[0] for _, b in self.calls}),
                "file_list": sorted({b[0] for _, b in self.calls}), "climbs": len(climbs), "climb_list": climbs,
                "areas": " -> ".join(seq), "edges": dict(edges)}


class Tracer:
    def __init__(self, cb: Any) -> None:
        self.cb = cb
        self.calls: list[tuple[tuple[str, str], tuple[str, str], bool]] = []  #: (caller, callee, into_caller)
        self.after_stop = False
        self.post: set[str] = set()
        self.data = DataPath()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.after_stop:
            self.data(frame, event, arg)
        if event != "call":
            return
        code = frame.f_code
        callee_file = _rel(code.co_filename)
        if callee_file is None:
            return
        back = frame.f_back
        while back is not None and back.f_code.co_name.startswith("<") and back.f_back is not None:
            back = back.f_back  # a comprehension's frame: its function is the caller
        caller_file = _rel(back.f_code.co_filename) if back is not None else None
        callee = (callee_file, code.co_qualname)
        caller = (caller_file or "<outside>", back.f_code.co_qualname if back is not None else "")
        this = frame.f_locals.get("self") if code.co_argcount else None
        that = back.f_locals.get("self") if back is not None and back.f_code.co_argcount else None
        into = this is self.cb and that is not self.cb and caller_file is not None
        self.calls.append((caller, callee, into))
        if self.after_stop:
            self.post.add(callee_file)


def _fit(profile_steps: int) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger

    import tscope_callbacks as ts
    from tscope_callbacks.capture import profile as capture_profile

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randint(0, 8, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    spec = ts.DeviceSpec(name="trace-cpu", flops={"fp32": 1e11}, bandwidth=2e10, source="step_path", measured=True,
                         vendor="cpu")
    cb = ts.RooflineCallback(gpu=spec, start_step=2, every_n_steps=None,
                             capture=ts.CaptureOptions(steps=profile_steps, wait_for_warmup=False),
                             mfu=ts.MFUOptions(automatic=False))
    tracer = Tracer(cb)
    tracing = {"on": False, "done": False}
    stop = capture_profile.Profile.stop

    def traced_stop(self: Any, *a: Any, **k: Any) -> Any:  # post-capture: what follows the capture's stop
        sys.setprofile(None)
        result = None
        try:
            result = stop(self, *a, **k)
            return result
        finally:
            tracer.after_stop = True
            tracer.data.track(result)
            sys.setprofile(tracer if tracing["on"] else None)

    def wrap(name: str) -> None:
        orig = getattr(cb, name)

        def hook(trainer: Any, *a: Any, **k: Any) -> Any:
            on = not tracing["done"] and trainer.global_step >= 2
            tracing["on"] = on
            if on:
                sys.setprofile(tracer)
            try:
                return orig(trainer, *a, **k)
            finally:
                sys.setprofile(None)
                tracing["on"] = False
                if on and cb.history:  # the report is written: the path ends
                    tracing["done"] = True

        setattr(cb, name, hook)

    for name in ("on_train_batch_start", "on_train_batch_end", "on_before_optimizer_step"):
        wrap(name)
    capture_profile.Profile.stop = traced_stop  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as d:
            trainer = pl.Trainer(max_steps=2 + profile_steps + 7, default_root_dir=d, callbacks=[cb],
                                 logger=TensorBoardLogger(d, name="tb"), accelerator="cpu", devices=1,
                                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                 log_every_n_steps=1, num_sanity_val_steps=0)
            trainer.fit(MLP(), loader)
    finally:
        capture_profile.Profile.stop = stop  # type: ignore[method-assign]
    assert cb.history, "the step was not profiled"
    return _summarize(tracer)


def _summarize(t: Tracer) -> dict[str, Any]:
    files = sorted({c[1][0] for c in t.calls} | {c[0][0] for c in t.calls if c[0][0] != "<outside>"})
    up: Counter = Counter()
    into: Counter = Counter()
    switch: Counter = Counter()
    asks: set[str] = set()
    reads: set[str] = set()
    pair = {"callbacks/roofline_cb.py", "callbacks/base.py"}
    for caller, callee, back in t.calls:
        if caller[0] == "<outside>":
            continue
        edge = f"{caller[0]}:{caller[1]} -> {callee[0]}:{callee[1]}"
        if layer(caller[0]) < layer(callee[0]) and layer(caller[0]) >= 0:
            up[edge] += 1
        if back:
            into[edge] += 1
        if {caller[0], callee[0]} == pair:
            switch[edge] += 1
        if caller[0].startswith("callbacks/") and (callee[0].startswith(("analysis/", "render/"))
                                                   or layer(callee[0]) == layer("api.py")):
            # a derived field of the typed report (a property of its frozen dataclasses) is a read, not a request
            (reads if callee[0] == "analysis/report.py" else asks).add(f"{callee[0]}:{callee[1]}")
    return {"files": len(files), "file_list": files, "post_capture_files": len(t.post),
            "post_capture_file_list": sorted(t.post),
            "up_layer": {"distinct": len(up), "calls": sum(up.values()), "edges": dict(up)},
            "into_caller": {"distinct": len(into), "calls": sum(into.values()), "edges": dict(into)},
            "cb_base_switches": {"distinct": len(switch), "calls": sum(switch.values()), "edges": dict(switch)},
            "asks_analysis": {"distinct": len(asks), "callees": sorted(asks)},
            "report_reads": sorted(reads), "data_path": t.data.summary()}


def static_counts() -> dict[str, Any]:
    cb_any: list[str] = []
    cb_writes: list[str] = []
    cb_uses: list[str] = []
    for rel in OWN:
        path = PKG / rel
        if not path.exists():
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for a in node.args.args + node.args.kwonlyargs:
                    if a.arg == "cb" and a.annotation is not None and ast.unparse(a.annotation) == "Any":
                        cb_any.append(f"{rel}:{node.name}")
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for tg in targets:
                    for sub in ast.walk(tg):
                        if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                                and sub.value.id == "cb"):
                            cb_writes.append(f"{rel}:{node.lineno} cb.{sub.attr}")
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cb"
                    and isinstance(node.ctx, ast.Load)):
                cb_uses.append(f"{rel}:{node.lineno} cb.{node.attr}")
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr" and node.args
                    and getattr(node.args[0], "id", "") == "cb"):
                cb_writes.append(f"{rel}:{node.lineno} setattr(cb, ...)")
    return {"cb_any_params": len(cb_any), "cb_any": cb_any, "cb_attribute_writes": len(cb_writes),
            "cb_writes": cb_writes, "cb_attribute_reads": len(cb_uses), "cb_reads": cb_uses}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print everything as JSON")
    ap.add_argument("--profile-steps", type=int, default=1, help="steps per profile (the callback's profile_steps)")
    ap.add_argument("--static", action="store_true", help="only the static counts (no fit)")
    ap.add_argument("-v", action="store_true", help="list the data path's edges")
    args = ap.parse_args()
    if args.static:
        print(json.dumps(static_counts(), indent=1))
        return
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    out = {**_fit(args.profile_steps), **static_counts()}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    d = out["data_path"]
    print(f"data path (the step's data, capture stop -> TensorBoard sink): {d['calls']} calls ({d['distinct']} "
          f"distinct edges) in {d['files']} files, {d['climbs']} climbs back up a layer")
    print(f"    areas in order: {d['areas']}")
    for c in d["climb_list"]:
        print(f"    climb: {c}")
    if "-v" in sys.argv:
        for e, n in d["edges"].items():
            print(f"    {n:4d}  {e}")
    print(f"tscope files on the path: {out['files']} (after the capture stops: {out['post_capture_files']})")
    for name in ("up_layer", "into_caller", "cb_base_switches"):
        v = out[name]
        print(f"{name}: {v['distinct']} distinct edges, {v['calls']} calls")
        for e, n in sorted(v["edges"].items()):
            print(f"    {n:4d}  {e}")
    print(f"asks_analysis: {out['asks_analysis']['distinct']} distinct callees")
    for c in out["asks_analysis"]["callees"]:
        print(f"    {c}")
    print(f"reads of the typed report's derived fields: {', '.join(out['report_reads']) or 'none'}")
    print(f"cb: Any parameters: {out['cb_any_params']}; attribute writes on cb: {out['cb_attribute_writes']}; "
          f"attribute reads of cb: {out['cb_attribute_reads']}")
    for s in out["cb_any"] + out["cb_writes"]:
        print(f"    {s}")
    print("files:", " ".join(out["file_list"]))


if __name__ == "__main__":
    main()
