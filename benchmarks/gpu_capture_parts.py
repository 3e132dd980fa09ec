"""Where a first GPU capture's cost goes, part by part: one GPT-2 124M training step (batch 8x1024, bf16 autocast,
fused AdamW) plain, under a bare dispatch mode, and under ``ts.profile`` with one more part switched on at a time --
the dispatch mode with the counts but no kernel timing (``timing=None``), then Kineto's per-op ranges and kernel
records (``layer_details=False``), then layer details (hooks, memory), then the non-finite checks
(``check_finite=True``, LayerProfilerCallback's default) -- beside torch.profiler (CPU+CUDA). Each whole call timed
with CUDA events, runs interleaved, medians; with each capture's own parts (``info.capture_cost``, host ms) and the
plain step's host time (the call returning, before the device is done: how much host time the GPU hides).

    python benchmarks/gpu_capture_parts.py [--runs 5]      # on a CUDA GPU, about a minute on an H200
    python benchmarks/gpu_capture_parts.py --smoke         # exercise the code on CPU (numbers mean nothing)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from common import BareMode, count_ops, interleaved_runs
from gpu_workload import FULL, SMOKE, device_for, ready

import tscope_callbacks as ts

PARTS = ("start_s", "region_s", "sync_s", "kineto_s", "assign_s", "build_s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model: exercise the script only")
    args = ap.parse_args()
    w = SMOKE if args.smoke else FULL
    device = device_for(args.smoke)
    cuda = device == "cuda"
    model, step = ready(w, device)
    costs: dict[str, list[dict]] = {}

    def tscope(name: str, **kw) -> tuple[str, object]:
        costs[name] = []

        def f() -> None:
            with ts.profile(model, **kw) as prof:
                step()
            costs[name].append(prof.info.capture_cost or {})

        return name, f

    def bare() -> None:
        with BareMode():
            step()

    def torch_prof() -> None:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])):
            step()

    cont = dict([("plain step", step), ("bare dispatch mode", bare),
                 tscope("ts: counts, no timing", timing=None),
                 tscope("ts: + Kineto ranges", layer_details=False),
                 tscope("ts: + layer details", layer_details=True),
                 tscope("ts: + finite checks", layer_details=True, check_finite=True),
                 ("torch.profiler (CPU+CUDA)", torch_prof)])
    host = []
    for _ in range(5):  # the plain step's host time: the call returning, the device still busy
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        host.append(time.perf_counter() - t)
        if cuda:
            torch.cuda.synchronize()
    runs = interleaved_runs(cont, args.runs, cuda=cuda)
    med = {k: statistics.median(v) for k, v in runs.items()}
    plain, n_ops = med["plain step"], count_ops(step)
    print(f"# First-capture cost by part ({torch.cuda.get_device_name() if cuda else 'CPU smoke run'}, torch "
          f"{torch.__version__})\n\nGPT-2 {w.n_layer}x{w.d}, batch {w.batch}x{w.seq}, {n_ops} ops; median of "
          f"{args.runs} interleaved runs; plain step's host time (returned before the device was done) "
          f"{statistics.median(host) * 1e3:.1f} ms of its {plain * 1e3:.1f} ms.\n")
    print("| run | ms | / plain | extra µs per op | " + " | ".join(p.removesuffix("_s") for p in PARTS)
          + " (host ms, medians) |")
    print("|---|---:|---:|---:|" + "---:|" * len(PARTS))
    for k, v in med.items():
        cells = []
        for p in PARTS:
            xs = [c[p] for c in costs.get(k, []) if c.get(p) is not None]
            cells.append(f"{statistics.median(xs) * 1e3:.1f}" if xs else "")
        print(f"| {k} | {v * 1e3:.1f} | {v / plain:.2f} | {(v - plain) / n_ops * 1e6:.1f} | " + " | ".join(cells)
              + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
