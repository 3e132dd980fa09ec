"""Very deep models: capture and report time for 100/250/500/1000 tiny Linear layers (forward + backward).

Each layer is ``Linear(4, 4)`` (+ ReLU), so the per-op work is negligible and the figures are tscope's own per-layer
and per-op bookkeeping. Phases, each the best of ``--runs``:

- ``plain``: the step without tscope;
- ``capture``: the step under ``ts.profile(layer_details=True, check_finite=True)`` (hooks, dispatch mode, records);
- ``stop``: building the per-layer records at ``stop()``;
- ``report``: ``ts.roofline`` + ``to_markdown(top=20)`` + the layer tree table (``render_tree_table``);
- ``total``: capture + stop + report. Linear scaling means total(1000) / total(250) ~ 4 (quadratic: 16).

    python benchmarks/deep_model.py [--runs 3] [--write]   # --write: benchmarks/results/deep_model.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch
from torch import nn

import tscope_callbacks as ts
from tscope_callbacks.render.layer_table import render_tree_table

SIZES = (100, 250, 500, 1000)
SPEC = ts.DeviceSpec(name="bench-cpu", flops={"fp32": 1e11}, bandwidth=2e10, source="benchmark", measured=True,
                     vendor="cpu")  # a fixed CPU roof: no calibration in the timing


def make(n: int) -> nn.Module:
    layers = [nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(n)]
    return nn.Sequential(*layers)


def measure(n: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = make(n)
    x = torch.randn(2, 4)
    t0 = time.perf_counter()
    model(x).sum().backward()
    plain = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)

    prof = ts.profile(model, layer_details=True, check_finite=True)
    t0 = time.perf_counter()
    prof.start()
    model(x).sum().backward()
    t1 = time.perf_counter()
    prof.stop()
    t2 = time.perf_counter()
    report = ts.roofline(prof.result, SPEC)
    report.to_markdown(top=20)
    render_tree_table(prof.layers, root_name="Sequential")
    t3 = time.perf_counter()
    assert len(prof.layers) == 3 * n + 1
    return {"plain": plain, "capture": t1 - t0, "stop": t2 - t1, "report": t3 - t2, "total": t3 - t0,
            "ops": len(prof.ops)}


def run(runs: int) -> dict[int, dict[str, float]]:
    measure(20)  # warm-up: imports, formula plans
    out = {}
    for n in SIZES:
        best: dict[str, float] = {}
        for _ in range(runs):
            for k, v in measure(n).items():
                best[k] = min(best.get(k, float("inf")), v)
        out[n] = best
    return out


def to_markdown(res: dict[int, dict[str, float]], runs: int) -> str:
    base = res[SIZES[1]]["total"]
    lines = ["# Deep models: capture and report time vs depth", "",
             f"`python benchmarks/deep_model.py --runs {runs} --write` — {platform.processor() or platform.machine()}, "
             f"torch {torch.__version__}, {torch.get_num_threads()} threads. Layers are `Sequential(Linear(4, 4), "
             "ReLU)` blocks (3 modules each), one forward + backward; best of "
             f"{runs} runs. Times in ms.", "",
             "| Linear layers | modules | ops | plain step | capture | stop (layer records) | report (roofline + "
             "markdown + tree) | total | total / total(250) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n, r in res.items():
        lines.append(f"| {n} | {3 * n + 1} | {int(r['ops'])} | {r['plain'] * 1e3:.1f} | {r['capture'] * 1e3:.1f} | "
                     f"{r['stop'] * 1e3:.1f} | {r['report'] * 1e3:.1f} | {r['total'] * 1e3:.1f} | "
                     f"{r['total'] / base:.2f} |")
    lines += ["", "Linear scaling: the last column tracks depth / 250 (0.4, 1, 2, 4); quadratic bookkeeping would give "
              "16 at 1000 layers. `tests/test_robustness_models.py` asserts time(1000) / time(250) < 8."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/deep_model.md")
    args = ap.parse_args()
    res = run(args.runs)
    md = to_markdown(res, args.runs)
    print(md)
    if args.write:
        path = Path(__file__).parent / "results" / "deep_model.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(md)
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
