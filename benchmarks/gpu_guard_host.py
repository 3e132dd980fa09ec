"""The NaN guard's host time per step on a GPU, where it counts: a launch-bound step.

On a GPU-bound step (GPT-2 124M, 8x1024) the guard's deferred check is hidden: the host runs ahead, and its hooks'
host time is mostly waiting on a full launch queue (on an H200: 1.3 ms of hook time a step, 1.003x the step). A small
model's step is launch-bound instead: every host microsecond is a microsecond of the step. This runs such a step
(HF GPT-2 2x128, batch 4x128, bf16-mixed, fused AdamW), paired Lightning fits in rotating order, plain and with
``NaNGuardCallback()``:

- the step time over steps 20-80 (a CUDA event at each step's start, read after the fit): guard / plain;
- the guard's hooks' host time per step (``time.perf_counter`` around each hook; median over the same steps);
- each op of the deferred check timed alone on the model's gradients (median of 300 calls, GPU idle).

Targets: the guard's hooks at most 50 us a step plus the fused norm (``_foreach_norm`` + ``stack``); guard / plain
at most 1.05 on this launch-bound step.

    python benchmarks/gpu_guard_host.py [--runs 3] [--write]    # on a CUDA GPU
    python benchmarks/gpu_guard_host.py --smoke                   # exercise the code on CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch
from common import publish
from gpu_workload import SMOKE, Workload, build, device_for, fit_steps, med, paired

from tscope_callbacks import NaNGuardCallback
from tscope_callbacks.analysis import nonfinite as nl

SMALL = Workload(n_layer=2, d=128, heads=2, vocab=4096, batch=4, seq=128)
HOOKS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")


def timed_guard(per: dict[str, dict[int, int]], step: dict[str, int]) -> NaNGuardCallback:
    """A NaNGuardCallback whose hooks add their host time (ns) to ``per[hook][global step]``."""
    guard = NaNGuardCallback()

    def wrap(name: str, fn: Any) -> Any:
        def timed(trainer: Any, *a: Any) -> Any:
            step["now"] = trainer.global_step
            t0 = time.perf_counter_ns()
            try:
                return fn(trainer, *a)
            finally:
                d = per.setdefault(name, {})
                d[step["now"]] = d.get(step["now"], 0) + time.perf_counter_ns() - t0
        timed._tscope_guarded = True  # type: ignore[attr-defined]
        return timed

    for h in HOOKS:
        setattr(guard, h, wrap(h, getattr(guard, h)))
    return guard


def op_times(w: Workload, device: str) -> dict[str, float]:
    """µs (median of 300) of each op of the deferred check on the model's real gradients."""
    model, _, ids = build(w, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    chan = nl.FlagChannel(2)
    lv = loss.detach().float().reshape(1)

    def deferred() -> None:  # nan_steps.push_deferred's ops, in order
        norms = nl.per_tensor_norms([g for p in params if (g := p.grad) is not None])
        local = torch.cat([norms, lv]).sum().reshape(1)
        bad = (~torch.isfinite(local)).float()
        chan.push(0, torch.cat([bad, local, norms, lv]), None)
        chan.pending.clear()

    def t(fn: Any, n: int = 300) -> float:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        xs = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            xs.append(time.perf_counter_ns() - t0)
        if device == "cuda":
            torch.cuda.synchronize()
        return statistics.median(xs) / 1e3

    return {f"_foreach_norm ({len(grads)} gradients)": t(lambda: torch._foreach_norm(grads, 2, dtype=torch.float32)),
            "the fused norm (_foreach_norm + stack)": t(lambda: nl.per_tensor_norms(grads)),
            "isfinite of one value": t(lambda: torch.isfinite(lv)),
            "the whole deferred check (norm, flag, copy to pinned memory, event)": t(deferred)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    w = SMOKE if args.smoke else SMALL
    device = device_for(args.smoke)
    first, last = (20, 80) if not args.smoke else (8, 20)
    per: dict[str, dict[int, int]] = {}
    mode: list[str] = []

    def plain() -> float:
        return statistics.median(fit_steps(w, device, [], first=first, last=last)[0])

    def guarded() -> float:
        per.clear()
        g = timed_guard(per, {"now": 0})
        steps = fit_steps(w, device, [g], first=first, last=last)[0]
        mode.append(f"{g.mode}, host syncs {g.host_syncs}")
        return statistics.median(steps)

    res = paired({"plain": plain, "guard": guarded}, args.runs)
    p, g = med(res["plain"]), med(res["guard"])
    keep = range(first, last)
    hooks = {h: statistics.median(per.get(h, {}).get(i, 0) for i in keep) / 1e3 for h in HOOKS}
    total = statistics.median(sum(per.get(h, {}).get(i, 0) for h in HOOKS) for i in keep) / 1e3
    ops = op_times(w, device)
    norm = ops["the fused norm (_foreach_norm + stack)"]
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU smoke run"
    lines = [f"# NaN guard host time on a launch-bound GPU step ({name}, torch {torch.__version__})", "",
             f"HF GPT-2 {w.n_layer}x{w.d}, vocab {w.vocab}, batch {w.batch}x{w.seq}, bf16-mixed, fused AdamW; steps "
             f"{first}-{last}, median step (CUDA events); {args.runs} paired runs; guard mode {mode[-1]}.", "",
             "| run | median ms/step (runs) | ratio |", "|---|---|---:|",
             f"| plain | {' / '.join(f'{x:.3f}' for x in res['plain'])} | 1 |",
             f"| NaNGuardCallback() | {' / '.join(f'{x:.3f}' for x in res['guard'])} | **{g / p:.3f}** |", "",
             "The guard's hooks, host µs per step (median, last guarded run): "
             + ", ".join(f"{h.removeprefix('on_')} {v:.1f}" for h, v in hooks.items()) + f"; total **{total:.1f}**.",
             "", "Each op of the deferred check alone on the model's gradients (µs, median of 300, GPU idle):", ""]
    lines += [f"- {k}: {v:.1f}" for k, v in ops.items()]
    lines += ["", f"- guard hooks {total:.1f} µs a step vs 50 µs + the fused norm {norm:.1f} µs = {50 + norm:.1f} µs "
              f"(target): {'PASS' if total <= 50 + norm else 'FAIL'}",
              f"- guard / plain = {g / p:.3f} on this launch-bound step (target <= 1.05): "
              f"{'PASS' if g / p <= 1.05 else 'FAIL'}"]
    text = "\n".join(lines)
    publish(text, args, "gpu_guard_host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
