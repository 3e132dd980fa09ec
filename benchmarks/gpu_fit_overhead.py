"""Always-on cost of the callbacks on a GPU, and the automatic MFU against a hand count.

A Lightning fit of GPT-2 124M (batch 8x1024, bf16-mixed, fused AdamW), steps 20-60 timed with a CUDA event at the
start of each step (recording an event does not synchronize; all are read after the fit), paired runs in rotating
order:

- plain;
- RooflineCallback + LayerProfilerCallback (one scheduled profile, at step 10) + NaNGuardCallback, defaults
  otherwise: the RooflineCallback's step monitor also takes its healthy-baseline profile once ``min_steps`` (20)
  healthy steps are known, and times each layer's forward over the 3 steps after it.

Reported apart:

- the always-on cost: the mean step over the window's steps that no tscope profile touched (each profiled step
  ``p`` leaves out ``p-1`` to ``p + profile_steps + 3 confirmation steps + 4``, the same steps in both runs);
- the one-time cost of the profiles inside the window: the window's total time minus the plain run's, in ms.

Targets: always-on callbacks/plain <= 1.02; the automatic MFU logged over the unprofiled steps within 3% of the
Megatron-style hand count over the plain run's step time (same attention convention).

    python benchmarks/gpu_fit_overhead.py [--runs 2] [--write]    # on a CUDA GPU
    python benchmarks/gpu_fit_overhead.py --smoke                  # exercise the code on CPU
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import publish
from gpu_workload import FULL, SMOKE, device_for, fit_steps, hand_count, med, paired

import tscope_callbacks as ts
from tscope_callbacks.callbacks.monitor import CONFIRM_STEPS


def profiled_steps(roof: ts.RooflineCallback) -> dict[int, str]:
    """Every step a tscope profile started at in this fit, with why: the schedule's, the monitor's baseline, its
    diagnoses."""
    out = {int(h["step"]): "scheduled profile" for h in roof.history}
    mon = roof.monitor
    if mon is not None:
        if mon.healthy is not None:
            out[int(mon.healthy.step)] = "the step monitor's healthy-baseline profile"
        for a in mon.alerts:
            if a.get("profile_step") is not None:
                out[int(a["profile_step"])] = f"the step monitor's diagnosis ({a.get('trigger')})"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    w = SMOKE if args.smoke else FULL
    device = device_for(args.smoke)
    first, last = (20, 60)
    cbs_seen: list = []
    plain_steps: list[list[float]] = []
    cb_steps: list[list[float]] = []

    def plain() -> float:
        steps = fit_steps(w, device, [], first=first, last=last)[0]
        plain_steps.append(steps)
        return sum(steps)

    def with_callbacks() -> float:
        roof = ts.RooflineCallback(start_step=10, every_n_steps=None, outputs=ts.RooflineOutputs(plot=False))
        cbs = [roof, ts.LayerProfilerCallback(start_step=10, every_n_steps=None), ts.NaNGuardCallback()]
        steps, trainer = fit_steps(w, device, cbs, first=first, last=last)
        cbs_seen.append((roof, cbs[2], trainer))
        cb_steps.append(steps)
        return sum(steps)

    res = paired({"plain": plain, "callbacks": with_callbacks}, args.runs)
    roof, guard, trainer = cbs_seen[-1]
    profiled: dict[int, str] = {}
    for r, _, _ in cbs_seen:
        profiled.update(profiled_steps(r))
    span = max(roof.capture.steps, 1) + CONFIRM_STEPS + 4
    keep = [i for i in range(first, last) if not any(p - 1 <= i <= p + span for p in profiled)]

    def mean_kept(steps: list[float]) -> float:
        return sum(steps[i - first] for i in keep) / len(keep)

    p_kept = [mean_kept(s) for s in plain_steps]
    c_kept = [mean_kept(s) for s in cb_steps]
    p, c = med(p_kept), med(c_kept)
    n = last - first
    p_all, c_all = med(res["plain"]), med(res["callbacks"])
    inside = "; ".join(f"step {s}: {why}" for s, why in sorted(profiled.items()) if first - span <= s < last)
    listed = ", ".join(f"{s} ({why})" for s, why in sorted(profiled.items()))
    model = trainer.lightning_module.model
    peak = roof.throughput.peak_flops
    hand = hand_count(model, w, roof.mfu.attention_flops) / (p / 1e3) / peak if peak else None
    auto = roof.last_mfu
    lines = [f"# GPU fit overhead ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU smoke run'}, "
             f"torch {torch.__version__})", "",
             f"GPT-2 {w.n_layer}x{w.d}, batch {w.batch}x{w.seq}; steps {first}-{last} timed with a CUDA event at "
             f"each step's start; {args.runs} paired runs. tscope profiles started at steps "
             f"{listed}; the always-on figure leaves out "
             f"each one's steps p-1 to p+{span}: {len(keep)} of {n} steps kept.", "",
             "| run | always-on ms/step (runs) | ratio | whole window ms (runs) | window - plain |",
             "|---|---|---:|---|---:|",
             f"| plain | {' / '.join(f'{x:.2f}' for x in p_kept)} | 1 | "
             f"{' / '.join(f'{x:.0f}' for x in res['plain'])} | |",
             f"| Roofline + LayerProfiler + NaNGuard | {' / '.join(f'{x:.2f}' for x in c_kept)} | **{c / p:.3f}** | "
             f"{' / '.join(f'{x:.0f}' for x in res['callbacks'])} | {c_all - p_all:+.0f} ms |", "",
             f"- always-on: callbacks/plain = {c / p:.3f} on the {len(keep)} unprofiled steps (target <= 1.02): "
             f"{'PASS' if c / p <= 1.02 else 'FAIL'}; NaN guard mode {guard.mode}, host syncs {guard.host_syncs}; GPU "
             f"telemetry (NVML) {'on' if roof.monitor is not None and not roof.monitor.telemetry_off else 'off: ' + str(getattr(roof.monitor, 'telemetry_off', 'no monitor'))}",
             f"- one-time: the profiles inside the window ({inside or 'none'}) cost {c_all - p_all:+.0f} ms once over the {n}-step window ({c_all / p_all:.3f}x of "
             f"it; {(c_all - p_all) / (1000 * p) * 1e2:+.2f}% of a 1,000-step fit)"]
    if auto is not None and hand:
        ok = abs(auto / hand - 1) <= 0.03
        lines.append(f"- automatic MFU {auto:.2%} vs hand count {hand:.2%} over the plain step ({roof.mfu.attention_flops} "
                     f"attention): ratio {auto / hand:.3f} (target within 3%): {'PASS' if ok else 'FAIL'}")
    text = "\n".join(lines)
    publish(text, args, "gpu_fit_overhead")
    return 0


if __name__ == "__main__":
    sys.exit(main())
