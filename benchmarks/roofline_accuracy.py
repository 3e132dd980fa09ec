"""Roofline estimate vs measured time on this CPU, per op class, with the CPU's measured roof.

The capture benchmark's transformer training step (TinyGPT d=256, 4 layers, seq 128, batch 16, AdamW) is profiled;
each op's estimate max(FLOPs/peak, bytes/bandwidth) uses the roof measured on this machine (``calibrate``:
best-of-N matmul FLOP/s, copy bandwidth). Matmul-class ops (mm/addmm/bmm) must be estimated within 1.5x of
measured in aggregate: that is the check that the counts and the roof are right, since large GEMMs run near the
roof. Other classes are reported as they are (pointwise ops on CPU run far below the copy bandwidth roof).

    python benchmarks/roofline_accuracy.py [--write]
    python benchmarks/roofline_accuracy.py --gpu [--write]   # the GPU workload (gpu_roofline_accuracy.py)
    python benchmarks/roofline_accuracy.py --smoke           # the GPU workload's code path on CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

import tscope_callbacks as ts

sys.path.insert(0, str(Path(__file__).parent))
from capture_overhead import BATCH, CFG, make, step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/roofline_accuracy.md")
    ap.add_argument("--runs", type=int, default=3, help="profiled steps; the median matmul ratio is reported")
    ap.add_argument("--gpu", action="store_true", help="the GPU workload: GPT-2 124M, 8x1024, bf16, fused AdamW")
    ap.add_argument("--smoke", action="store_true", help="the GPU workload's code on CPU (figures mean nothing)")
    args = ap.parse_args()
    if args.gpu or args.smoke:
        from gpu_roofline_accuracy import run

        return run(args.smoke, args.write)
    from tscope_callbacks.devices.calibrate import cpu_spec

    spec = cpu_spec(cache=False)
    model, opt, x, y = make()
    for _ in range(2):
        step(model, opt, x, y)
    reports = []
    for _ in range(args.runs):
        with ts.profile(model) as prof:
            step(model, opt, x, y, prof)
        reports.append(ts.roofline(prof.result, spec))
    # matmul-class ops: measured / estimated, summed over the class (its row in the op-class table)
    ratios = [next((c.ratio for c in r.rows["category"] if c.name == "matmul"), None) for r in reports]
    med = statistics.median(ratios)
    rep = reports[ratios.index(med)]
    lines = [
        f"# Roofline estimate vs measured (CPU, torch {torch.__version__}, {torch.get_num_threads()} threads)",
        "",
        f"Device roof (measured by `calibrate`): {spec.name}: fp32 {spec.peak_flops('fp32', allow_tf32=False) / 1e9:.1f} "
        f"GFLOP/s, bandwidth {spec.bandwidth / 1e9:.1f} GB/s.",
        f"Step: TinyGPT d_model={CFG.d_model} n_layer={CFG.n_layer} seq={CFG.seq_len} batch={BATCH}, AdamW; "
        f"{args.runs} profiled steps, the median one shown.",
        "",
        "| op class | ops | GFLOPs | MB | estimated ms | measured ms | measured / estimated |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rep.rows["category"]:
        ratio = row.ratio
        lines.append(
            f"| {row.name} | {row.n_ops} | {row.flops / 1e9:.3f} | {row.bytes / 1e6:.1f} | "
            f"{(row.estimate_s or 0) * 1e3:.2f} | {(row.measured_s or 0) * 1e3:.2f} | "
            f"{'' if ratio is None else f'{ratio:.2f}'} |"
        )
    ok = med is not None and 1 / 1.5 <= med <= 1.5
    lines += [
        "",
        f"matmul-class (mm/addmm/bmm) measured/estimated per run: {', '.join(f'{r:.2f}' for r in ratios)}; "
        f"median **{med:.2f}** (target within 1.5x): {'PASS' if ok else 'FAIL'}",
        "",
        "Reproduce: `python benchmarks/roofline_accuracy.py --write`",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        out = Path(__file__).parent / "results" / "roofline_accuracy.md"
        out.write_text(text + "\n")
        print(f"written {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
