"""Always-on cost of the callbacks on a GPU, and the automatic MFU against a hand count.

A Lightning fit of GPT-2 124M (batch 8x1024, bf16-mixed, fused AdamW), steps 20-50 timed with CUDA events (one at
the start of step 20 and of step 50: nothing synchronizes inside the window), paired runs in rotating order:

- plain;
- RooflineCallback + LayerProfilerCallback (one profile, at step 10) + NaNGuardCallback.

Targets (issue "Always-on cost"): callbacks/plain <= 1.02 on the unprofiled steps; the automatic MFU logged over
those steps within 3% of the Megatron-style hand count over the plain run's step time (same attention convention).

    python benchmarks/gpu_fit_overhead.py [--runs 2] [--write]    # on a CUDA GPU
    python benchmarks/gpu_fit_overhead.py --smoke                  # exercise the code on CPU
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import write
from gpu_workload import FULL, SMOKE, device_for, fit_window, hand_count, med, paired

import tscope_callbacks as ts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    w = SMOKE if args.smoke else FULL
    device = device_for(args.smoke)
    first, last = (20, 50) if not args.smoke else (12, 20)
    cbs_seen: list = []

    def plain() -> float:
        return fit_window(w, device, [], first=first, last=last)[0]

    def with_callbacks() -> float:
        roof = ts.RooflineCallback(plot=False, start_step=10, every_n_steps=None)
        cbs = [roof, ts.LayerProfilerCallback(start_step=10, every_n_steps=None), ts.NaNGuardCallback()]
        ms, trainer = fit_window(w, device, cbs, first=first, last=last)
        cbs_seen.append((roof, cbs[2], trainer))
        return ms

    res = paired({"plain": plain, "callbacks": with_callbacks}, args.runs)
    p, c = med(res["plain"]), med(res["callbacks"])
    roof, guard, trainer = cbs_seen[-1]
    model = trainer.lightning_module.model
    peak = roof.throughput.peak_flops
    hand = hand_count(model, w, roof.attention_flops) / (p / 1e3) / peak if peak else None
    auto = roof.last_mfu
    lines = [f"# GPU fit overhead ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU smoke run'}, "
             f"torch {torch.__version__})", "",
             f"GPT-2 {w.n_layer}x{w.d}, batch {w.batch}x{w.seq}; steps {first}-{last} timed with CUDA events; "
             f"{args.runs} paired runs.", "", "| run | ms/step (runs) | ratio |", "|---|---|---:|",
             f"| plain | {' / '.join(f'{x:.1f}' for x in res['plain'])} | 1 |",
             f"| Roofline + LayerProfiler (profile at step 10) + NaNGuard | "
             f"{' / '.join(f'{x:.1f}' for x in res['callbacks'])} | **{c / p:.3f}** |", "",
             f"- callbacks/plain = {c / p:.3f} (target <= 1.02): {'PASS' if c / p <= 1.02 else 'FAIL'}; NaN guard "
             f"mode {guard.mode}, host syncs {guard.host_syncs}"]
    if auto is not None and hand:
        ok = abs(auto / hand - 1) <= 0.03
        lines.append(f"- automatic MFU {auto:.2%} vs hand count {hand:.2%} over the plain step ({roof.attention_flops} "
                     f"attention): ratio {auto / hand:.3f} (target within 3%): {'PASS' if ok else 'FAIL'}")
    text = "\n".join(lines)
    print(text)
    if args.write and not args.smoke:
        write("gpu_fit_overhead.md", text, "python benchmarks/gpu_fit_overhead.py --write")
    return 0


if __name__ == "__main__":
    sys.exit(main())
