"""Profiling a ``torch.compile``'d GPT-2 124M step (batch 8x1024, bf16 autocast, fused AdamW): the compiled step,
the profiled compiled step (kernels mode: the compiled execution), an eager step for reference, and the compiled
step again after two profiles, all timed with CUDA events around each whole call. Also: Dynamo's graph count and
recompiles before and after, the share of the device-busy time that has a per-kernel record (coverage), FLOPs of
the compiled profile vs an eager profile, and the compiled-vs-eager speedup per the two profiles.
Targets (issue "torch.compile"): unprofiled compiled steps after profiles within 2% of before; no recompile;
compiled FLOPs within 1% of eager.

    python benchmarks/gpu_compiled_profile.py [--runs 10] [--write]   # on a CUDA GPU
    python benchmarks/gpu_compiled_profile.py --smoke                 # exercise the code on CPU (numbers mean nothing)
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import interleaved, median_time, publish
from gpu_workload import FULL, SMOKE, build, device_for, train_step
from torch._dynamo.utils import counters

import tscope_callbacks as ts


def _dynamo() -> dict[str, int]:
    return {"graphs": counters["stats"].get("unique_graphs", 0), "breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values()) if "recompiles" in counters else 0}


def measure(runs: int, smoke: bool) -> tuple[str, bool]:
    w = SMOKE if smoke else FULL
    device = device_for(smoke)
    cuda = device == "cuda"
    model, opt, ids = build(w, device)
    cm = torch.compile(model)

    def step(mod) -> None:
        train_step(mod, opt, ids, device)

    for _ in range(5):
        step(cm)  # compile and warm up
    before = _dynamo()
    t_before = median_time(lambda: step(cm), runs, cuda=cuda)
    profs = {}

    def profiled() -> None:
        with ts.profile(cm) as p:
            step(cm)
        profs["compiled"] = p

    times = interleaved({"compiled step": lambda: step(cm), "profiled compiled step (kernels)": profiled,
                         "eager step": lambda: step(model)}, max(2, runs // 2), cuda=cuda)
    t_after = median_time(lambda: step(cm), runs, cuda=cuda)
    after = _dynamo()
    with ts.profile(model) as pe:
        step(model)
    pc = profs["compiled"]
    spec = ts.get_device_spec("auto") if cuda else ts.get_device_spec("h100")
    rc, re_ = ts.roofline(pc.result, spec), ts.roofline(pe.result, spec)
    kernel_s = sum(r.time_s or 0.0 for r in pc.ops)
    busy = pc.info.device_busy_s or pc.info.step_time_s or 0.0
    fl = lambda p: sum(r.model_flops for r in p.ops)  # noqa: E731
    flops_ratio = fl(pc) / fl(pe) if fl(pe) else float("nan")
    plain = times["compiled step"]
    lines = [f"# Profiling a compiled step ({torch.cuda.get_device_name() if cuda else 'CPU smoke run'}, torch "
             f"{torch.__version__})", "",
             f"GPT-2 {w.n_layer}x{w.d}, vocab {w.vocab}, batch {w.batch}x{w.seq}, bf16 autocast, fused AdamW, "
             f"`torch.compile` (default mode); CUDA events around each whole call, median of interleaved runs.", "",
             "| run | ms | ratio to compiled |", "|---|---:|---:|"]
    for k, v in times.items():
        lines.append(f"| {k} | {v * 1e3:.1f} | {v / plain:.2f} |")
    drift = t_after / t_before
    ok_speed, ok_graphs, ok_flops = drift <= 1.02, after == before, abs(flops_ratio - 1) <= 0.01
    cc = pc.info.compiled_capture or {}
    lines += ["",
              f"- compiled step before profiles {t_before * 1e3:.2f} ms, after {t_after * 1e3:.2f} ms: "
              f"**{drift:.3f}x** (target <= 1.02): {'PASS' if ok_speed else 'FAIL'}",
              f"- Dynamo before {before}, after {after}: {'PASS' if ok_graphs else 'FAIL'}",
              f"- compiled-profile model FLOPs / eager-profile model FLOPs = **{flops_ratio:.4f}** (target within 1%): "
              f"{'PASS' if ok_flops else 'FAIL'}",
              f"- kernel records: {cc.get('kernel_records')} Inductor kernel calls of {cc.get('kernels_wrapped')} "
              f"wrapped; timed records cover {kernel_s * 1e3:.2f} ms of {busy * 1e3:.2f} ms device-busy "
              f"({kernel_s / busy if busy else float('nan'):.0%})",
              f"- compiled vs eager (op time of the two profiles): {rc.totals.measured_s * 1e3:.2f} ms vs "
              f"{re_.totals.measured_s * 1e3:.2f} ms; headline MFU compiled {rc.summary.mfu or 0:.1%} "
              f"({rc.summary.step_time_source})"]
    by_cat: dict[str, list[float]] = {}
    for i, prof in enumerate((pe, pc)):
        for r in prof.ops:
            key = f"{r.phase} {r.category}"
            by_cat.setdefault(key, [0.0, 0.0])[i] += r.model_flops
    lines += ["", "Model FLOPs per phase and category (GFLOP):", "", "| phase, category | eager profile | "
              "compiled profile |", "|---|---:|---:|"]
    lines += [f"| {c} | {e / 1e9:.3f} | {k / 1e9:.3f} |" for c, (e, k) in sorted(by_cat.items()) if e or k]
    lines += ["", "Attention calls (first of each op, per profile): op, input shapes, model / hardware FLOPs:", ""]
    for name, prof in (("eager", pe), ("compiled", pc)):
        seen: set[str] = set()
        for r in prof.ops:
            if r.category == "attention" and r.op not in seen:
                seen.add(r.op)
                lines.append(f"- {name}: `{r.op}` {r.input_shapes} model {r.model_flops:,} hardware {r.flops:,}")
    return "\n".join(lines), ok_speed and ok_graphs and ok_flops


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    text, ok = measure(args.runs, args.smoke)
    publish(text, args, "gpu_compiled_profile")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
