"""NaN guard cost on a GPU: healthy Lightning fits of GPT-2 124M (batch 8x1024, bf16-mixed, fused AdamW), steps
20-50 timed with CUDA events, paired runs in rotating order: plain, the guard with its default deferred read (no host
sync: flags read two steps late, bad updates masked on the device), the guard reading at each step (``sync=True``: one
host sync per step, the old behaviour), and ``detect_anomaly=True``. The deferred run also checks with
``torch.cuda.set_sync_debug_mode("warn")`` that no synchronizing call comes from tscope's code on healthy steps.
Target: guard/plain <= 1.02.

    python benchmarks/gpu_nan_guard_overhead.py [--runs 2] [--write]    # on a CUDA GPU
    python benchmarks/gpu_nan_guard_overhead.py --smoke                  # exercise the code on CPU
"""

from __future__ import annotations

import argparse
import sys
import warnings

import lightning.pytorch as pl
import torch
from common import publish
from gpu_workload import FULL, SMOKE, device_for, fit_window, med, paired

from tscope_callbacks import NaNGuardCallback


class SyncWatch(pl.Callback):
    """``set_sync_debug_mode("warn")`` over steps [first, last); keeps the sync warnings raised from tscope frames."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last, self.ours, self.all = first, last, [], 0
        self._ctx: warnings.catch_warnings | None = None
        self._rec: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.first and torch.cuda.is_available():
            self._ctx = warnings.catch_warnings(record=True)
            self._rec = self._ctx.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        if trainer.global_step == self.last and self._ctx is not None:
            torch.cuda.set_sync_debug_mode("default")
            self._ctx.__exit__(None, None, None)
            self._ctx = None
            sync = [r for r in self._rec if "synchroniz" in str(r.message).lower()]
            self.all = len(sync)
            self.ours = [f"{r.filename}:{r.lineno}" for r in sync if "tscope_callbacks" in r.filename]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    w = SMOKE if args.smoke else FULL
    device = device_for(args.smoke)
    first, last = (20, 50) if not args.smoke else (8, 14)
    watch = SyncWatch(first, last)
    guards: dict[str, NaNGuardCallback] = {}

    def run(name: str, **guard_kw):
        def f() -> float:
            g = NaNGuardCallback(**guard_kw)
            guards[name] = g
            extra = [watch] if name == "guard" else []
            return fit_window(w, device, [g, *extra], first=first, last=last)[0]
        return f

    configs = {"plain": lambda: fit_window(w, device, [], first=first, last=last)[0],
               "guard": run("guard"), "guard, sync=True": run("guard, sync=True", sync=True)}
    res = paired(configs, args.runs)
    anomaly = fit_window(w, device, [], first=first, last=last, detect_anomaly=True)[0]
    p = med(res["plain"])
    lines = [f"# GPU NaN guard overhead ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU smoke run'}, "
             f"torch {torch.__version__})", "",
             f"GPT-2 {w.n_layer}x{w.d}, batch {w.batch}x{w.seq}; steps {first}-{last} timed with CUDA events; "
             f"{args.runs} paired runs.", "", "| run | ms/step (runs) | ratio | host syncs |", "|---|---|---:|---:|"]
    for k, v in res.items():
        g = guards.get(k)
        lines.append(f"| {k} | {' / '.join(f'{x:.1f}' for x in v)} | {med(v) / p:.3f} | "
                     f"{g.host_syncs if g else ''} |")
    lines.append(f"| detect_anomaly=True | {anomaly:.1f} | {anomaly / p:.2f} | |")
    r = med(res["guard"]) / p
    lines += ["", f"- guard (deferred, mode {guards['guard'].mode}) / plain = **{r:.3f}** (target <= 1.02): "
              f"{'PASS' if r <= 1.02 else 'FAIL'}",
              f"- synchronizing calls from tscope code on healthy steps (set_sync_debug_mode): {len(watch.ours)} "
              f"({watch.ours[:3]}); from anything: {watch.all}"]
    text = "\n".join(lines)
    publish(text, args, "gpu_nan_guard_overhead")
    return 0


if __name__ == "__main__":
    sys.exit(main())
