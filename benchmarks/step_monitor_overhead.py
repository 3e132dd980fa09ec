"""The step monitor's always-on cost on CPU, and its alerts on healthy 1000-step fits, idle and beside a busy process.

Three figures, each against a plain run of the same process:

- the monitor's own cost per step: its hooks (Lightning marks them ``[Callback]StepMonitor...``: the monitor's
  ``tscope`` part, median over the clean steps) plus its step-parts probe (marks per step x the probe's cost per mark,
  measured at install); the probe's cost per mark beside it;
- the step-time ratio with the monitor / without (a ~1 ms and a ~5 ms MLP step, one torch thread, alternating order,
  medians of the rounds): this machine's noise is usually larger than the cost;
- healthy 1000-step fits (the MLPs in ``RooflineCallback()``'s defaults: the monitor on, a profile at step 10 and
  every 500): alerts (target 0), slowdowns named contention, transients, with no other process and with one busy
  process (``python -c "while True: pass"``) for the whole fit. The other processes' CPU load is measured over each
  fit (the machine is shared: it is not idle when nothing of ours runs).

    python benchmarks/step_monitor_overhead.py [--rounds 3] [--steps 300] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import tscope_callbacks as ts
from tscope_callbacks.analysis.step_parts import StepTimes
from tscope_callbacks.callbacks.monitor import StepMonitor
from tscope_callbacks.devices.calibrate import cpu_snapshot, others_load_per_cpu

RESULTS = Path(__file__).resolve().parent / "results" / "step_monitor_overhead.md"
SKIP = 30  #: warm-up steps left out
MLPS = (("~1 ms", 256, 2), ("~5 ms", 512, 2))


class MLP(pl.LightningModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = [torch.nn.Linear(64, width), torch.nn.ReLU()]
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 8))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class StepTimer(pl.Callback):
    """Each step's time: batch start to the next batch start (data loading included)."""

    def __init__(self) -> None:
        self.starts: list[tuple[int, float]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.starts.append((trainer.global_step, time.perf_counter()))

    def times(self, skip: set[int]) -> list[float]:
        return [b - a for (s, a), (_, b) in zip(self.starts, self.starts[1:]) if s >= SKIP and s not in skip]


def _trainer(steps: int, callbacks: list[pl.Callback]) -> pl.Trainer:
    return pl.Trainer(max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                      log_every_n_steps=50)


def _data(steps: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = 64 * (steps + 1)
    return DataLoader(TensorDataset(torch.randn(n, 64, generator=g), torch.randn(n, 8, generator=g)), batch_size=64)


def _cpu_timed(mon: StepMonitor, spent: dict[int, float]) -> None:
    """Wrap the monitor's per-step hooks (instance attributes: Lightning calls them by name) with the thread's CPU
    time: its cost without the waits for a CPU a busy machine adds to any wall time."""
    for name in ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end"):
        fn = getattr(mon, name)

        def hook(trainer: pl.Trainer, *args: Any, _fn: Any = fn, _name: str = name, **kw: Any) -> Any:
            step = trainer.global_step - (_name == "on_train_batch_end")
            t = time.thread_time()
            try:
                return _fn(trainer, *args, **kw)
            finally:
                spent[step] = spent.get(step, 0.0) + time.thread_time() - t

        setattr(mon, name, hook)


def fit(width: int, depth: int, steps: int, monitor: bool) -> dict[str, Any]:
    """One fit: its step times (warm-up and the monitor's own profile steps left out) and, with the monitor, its
    clean steps' parts."""
    torch.manual_seed(0)
    timer, cbs = StepTimer(), []
    seen: list[StepTimes] = []
    mon = None
    cpu: dict[int, float] = {}
    if monitor:
        mon = StepMonitor(telemetry=False)
        add = mon._add
        mon._add = lambda trainer, st: (seen.append(st), add(trainer, st))  # type: ignore[method-assign]
        _cpu_timed(mon, cpu)
        cbs.append(mon)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(steps, [timer, *cbs]).fit(MLP(width, depth), _data(steps))
    skip = {st.step for st in seen if st.dirty}
    out: dict[str, Any] = {"times": timer.times(skip)}
    if mon is not None:
        clean = [st for st in seen if not st.dirty and st.step >= SKIP]
        out["tscope_s"] = statistics.median(st.part("tscope") for st in clean)
        out["hooks_cpu_s"] = statistics.median(cpu.get(st.step, 0.0) for st in clean)
        out["hooks_s"] = statistics.median(st.named.get("tscope:StepMonitor", 0.0) for st in clean)
        out["probe_s"] = statistics.median(st.named.get("tscope:step-parts probe", 0.0) for st in clean)
        out["per_mark_s"] = mon.probe.call_cost_s
        out["marks"] = (out["probe_s"] / mon.probe.call_cost_s) if mon.probe.call_cost_s else 0.0
    return out


def healthy(width: int, depth: int, steps: int) -> dict[str, Any]:
    """A healthy fit under RooflineCallback's defaults (the monitor inside): what its monitor said."""
    torch.manual_seed(0)
    since = cpu_snapshot()
    roof = ts.RooflineCallback(outputs=ts.RooflineOutputs(plot=False, save_json=False))
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(steps, [roof]).fit(MLP(width, depth), _data(steps))
    mon = roof.monitor
    return {"alerts": [a["text"] for a in mon.alerts], "contended": len(mon.contended), "transients": mon.transients,
            "load": others_load_per_cpu(since), "wall_s": time.perf_counter() - t,
            "step_ms": mon.last_breakdown.step_ms if mon.last_breakdown else float("nan"),
            "cpu_wait_ms": mon.last_breakdown.cpu_wait_ms if mon.last_breakdown else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--healthy-steps", type=int, default=1000)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    since = cpu_snapshot()
    lines = [f"torch {torch.__version__}, 1 thread, {os.cpu_count()} CPUs; {args.rounds} rounds x {args.steps} steps, "
             "order alternating; `uptime` at the start: " + os.popen("uptime").read().strip(), "",
             "| step | plain ms | with monitor ms | step ratio | monitor's own us/step (tscope part: hooks + probe, "
             "wall) | its hooks' CPU us/step | probe us (marks x us/mark) |", "|---|---|---|---|---|---|---|"]
    for label, width, depth in MLPS:
        plain, mon, own, hooks, probe, per, marks = [], [], [], [], [], [], []  # (hooks: their CPU time)
        for r in range(args.rounds):
            for m in ((False, True) if r % 2 == 0 else (True, False)):
                got = fit(width, depth, args.steps, m)
                (mon if m else plain).append(statistics.median(got["times"]))
                if m:
                    own.append(got["tscope_s"])
                    hooks.append(got["hooks_cpu_s"])
                    probe.append(got["probe_s"])
                    per.append(got["per_mark_s"])
                    marks.append(got["marks"])
        p, w = statistics.median(plain), statistics.median(mon)
        med = statistics.median
        lines.append(f"| {label} MLP {width}x{depth} | {p * 1e3:.3f} | {w * 1e3:.3f} | {w / p:.3f}x | "
                     f"{med(own) * 1e6:.1f} ({med(own) / p:.2%} of the plain step) | {med(hooks) * 1e6:.1f} | "
                     f"{med(probe) * 1e6:.1f} ({med(marks):.0f} x {med(per) * 1e6:.2f}) |")
        print(lines[-1], flush=True)
    lines += ["", f"Healthy {args.healthy_steps}-step fits, `RooflineCallback()` defaults (the monitor on):", "",
              "| step | other process | alerts | named contention | transients | others' load per CPU | "
              "mean step ms | CPU wait ms/step |", "|---|---|---|---|---|---|---|---|"]
    for busy in (False, True):
        proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for label, width, depth in MLPS:
                h = healthy(width, depth, args.healthy_steps)
                wait = "-" if h["cpu_wait_ms"] is None else f"{h['cpu_wait_ms']:.2f}"
                lines.append(f"| {label} MLP {width}x{depth} | {'one busy process' if busy else 'none'} | "
                             f"{len(h['alerts'])} | {h['contended']} | {h['transients']} | {h['load'] or 0:.2f} | "
                             f"{h['step_ms']:.2f} | {wait} |")
                print(lines[-1], flush=True)
                for a in h["alerts"]:
                    lines.append(f"|  | alert: {a} |||||||")
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
    lines += ["", f"Other processes' CPU load over the whole run: {others_load_per_cpu(since) or 0:.2f} per CPU."]
    text = "\n".join(lines)
    print(text)
    if args.write:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text("# Step monitor overhead and healthy-fit alerts (CPU)\n\n" + text + "\n\nReproduce: `python "
                           "benchmarks/step_monitor_overhead.py --write`\n")


if __name__ == "__main__":
    main()
