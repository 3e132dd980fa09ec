"""The step monitor's always-on cost on CPU: a ~1 ms and a ~5 ms MLP step, plain vs ``StepMonitor()``, one torch
thread, alternating order, in one process.

Two figures per step size, both against the median plain step of the same run:

- the step-time ratio: median step (batch start to next batch start, steps 30 to the end; the monitor's baseline
  profile and the 3 steps after it, which time each layer, are left out) with the monitor / without;
- the monitor's own hook time per step (its batch-start, before-optimizer-step and batch-end hooks, timed around
  each call; diagnosis steps left out) as a share of the plain step: the cost without the machine's noise.

Target: <= 1.02x a plain step.

    python benchmarks/step_monitor_overhead.py [--rounds 5] [--steps 200] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from tscope_callbacks.callbacks.monitor import StepMonitor
from tscope_callbacks.devices.calibrate import cpu_snapshot, others_load_per_cpu

RESULTS = Path(__file__).resolve().parent / "results" / "step_monitor_overhead.md"
SKIP = 30  #: warm-up steps left out


class MLP(pl.LightningModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = [torch.nn.Linear(64, width), torch.nn.ReLU()]
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 8))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

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


def _timed(mon: StepMonitor, spent: dict[int, float]) -> None:
    """Wrap the monitor's per-step hooks (instance attributes: Lightning calls them by name) with a timer."""
    for name in ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end"):
        fn = getattr(mon, name)

        def hook(trainer: pl.Trainer, *args: Any, _fn: Any = fn, **kw: Any) -> Any:
            step = trainer.global_step
            t = time.perf_counter()
            try:
                return _fn(trainer, *args, **kw)
            finally:
                spent[step] = spent.get(step, 0.0) + time.perf_counter() - t

        setattr(mon, name, hook)


def fit(width: int, depth: int, steps: int, monitor: bool) -> tuple[list[float], float | None]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64 * (steps + 1), 64, generator=g), torch.randn(64 * (steps + 1), 8, generator=g))
    timer, cbs, spent = StepTimer(), [], {}
    skip: set[int] = set()
    mon = None
    if monitor:
        mon = StepMonitor()
        _timed(mon, spent)
        cbs.append(mon)
    trainer = pl.Trainer(max_steps=steps, callbacks=[timer, *cbs], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                         log_every_n_steps=50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(MLP(width, depth), DataLoader(data, batch_size=64))
    if mon is not None and mon.healthy is not None:
        b = mon.healthy.step
        skip = set(range(b - 1, b + 5))  # the baseline profile and the 3 steps timing each layer
    hook = None
    if mon is not None:
        per = [v for s, v in spent.items() if s >= SKIP and s not in skip]
        hook = statistics.median(per)
    return timer.times(skip), hook


class Blocks(pl.Callback):
    """Calls the monitor's per-step hooks in alternate blocks of ``BLOCK`` steps only: on and off steps interleave in
    one fit, so a change of the machine's load falls on both alike."""

    BLOCK = 10

    def __init__(self, mon: StepMonitor) -> None:
        self.mon = mon

    def on(self, step: int) -> bool:
        return (step // self.BLOCK) % 2 == 0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.on(trainer.global_step):
            self.mon.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        if self.on(trainer.global_step):
            self.mon.on_before_optimizer_step(trainer, pl_module, optimizer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.on(trainer.global_step - 1):
            self.mon.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def paired(width: int, depth: int, steps: int) -> tuple[float, float]:
    """(median on-step, median off-step) of one fit with the monitor's hooks on in alternate blocks (warm-up, the
    blocks' first step and the monitor's diagnosis steps left out)."""
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64 * (steps + 1), 64, generator=g), torch.randn(64 * (steps + 1), 8, generator=g))
    mon = StepMonitor(slow_factor=1e9, loss_spike=None)  # timing only: no diagnostic profile in the measured steps
    timer = StepTimer()
    trainer = pl.Trainer(max_steps=steps, callbacks=[timer, Blocks(mon)], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                         log_every_n_steps=50)
    mon.setup(trainer, None, "fit")  # what Lightning would do for a callback in the list
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(MLP(width, depth), DataLoader(data, batch_size=64))
    b = mon.healthy.step if mon.healthy is not None else -10
    on, off = [], []
    for (s, a), (_, t) in zip(timer.starts, timer.starts[1:]):
        if s < SKIP or s % Blocks.BLOCK == 0 or b - 1 <= s <= b + 4:
            continue
        (on if (s // Blocks.BLOCK) % 2 == 0 else off).append(t - a)
    return statistics.median(on), statistics.median(off)


def warm_hooks(n: int = 5000) -> float:
    """Seconds of the monitor's three per-step hooks, called back to back on a stand-in trainer (no fit around them:
    the cost without the cache misses and preemptions of a real step); the median step over ``n``."""
    import types

    from tscope_callbacks.analysis.anomaly import Snapshot

    mon = StepMonitor(slow_factor=1e9)  # the stand-in's microsecond "steps" jitter 2x: no trigger may fire here
    mon._reset(False)
    mon.healthy = Snapshot(0)  # as after the baseline profile: the steady state (no profile on a stand-in trainer)
    tr = types.SimpleNamespace(global_step=0, log_every_n_steps=10**9, callbacks=[], is_global_zero=True,
                               accumulate_grad_batches=1, optimizers=[])
    pm = types.SimpleNamespace(automatic_optimization=True)
    out = {"loss": torch.tensor(1.0)}
    times = []
    for i in range(n):
        tr.global_step = i
        t = time.perf_counter()
        mon.on_train_batch_start(tr, pm, None, i)
        mon.on_before_optimizer_step(tr, pm, None)
        tr.global_step = i + 1
        mon.on_train_batch_end(tr, pm, out, None, i)
        times.append(time.perf_counter() - t)
    return statistics.median(times[100:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--paired-only", action="store_true", help="only the paired measurement and the warm hooks")
    args = ap.parse_args()
    torch.set_num_threads(1)
    since = cpu_snapshot()
    lines = [f"torch {torch.__version__}, 1 thread, {args.rounds} rounds x {args.steps} steps, order alternating", "",
             "| step | plain ms | with monitor ms | step ratio | monitor hooks us/step | hooks / plain step |",
             "|---|---|---|---|---|---|"]
    for label, width, depth in (() if args.paired_only else (("~1 ms", 256, 2), ("~5 ms", 512, 2))):
        plain, mon, hooks = [], [], []
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for m in order:
                times, hook = fit(width, depth, args.steps, m)
                (mon if m else plain).append(statistics.median(times))
                if hook is not None:
                    hooks.append(hook)
        p, w, h = statistics.median(plain), statistics.median(mon), statistics.median(hooks)
        lines.append(f"| {label} MLP {width}x{depth} | {p * 1e3:.3f} | {w * 1e3:.3f} | {w / p:.3f}x | {h * 1e6:.1f} | "
                     f"{h / p:.2%} |")
        print(lines[-1], flush=True)
    lines += ["", "Paired in one fit (the monitor's hooks on in alternate blocks of 10 steps, 1000 steps, 3 fits):", "",
              "| step | off ms | on ms | ratio |", "|---|---|---|---|"]
    for label, width, depth in (("~1 ms", 256, 2), ("~5 ms", 512, 2)):
        pairs = [paired(width, depth, 1000) for _ in range(3)]
        on, off = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        lines.append(f"| {label} MLP {width}x{depth} | {off * 1e3:.3f} | {on * 1e3:.3f} | {on / off:.3f}x |")
        print(lines[-1], flush=True)
    lines += ["", f"The monitor's hooks called back to back outside a fit (warm): {warm_hooks() * 1e6:.1f} us a step."]
    lines += ["", f"Other processes' CPU load over the run: {others_load_per_cpu(since) or 0:.2f} per CPU "
              f"({os.cpu_count()} CPUs)."]
    text = "\n".join(lines)
    print(text)
    if args.write:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text("# Step monitor overhead (CPU)\n\n" + text + "\n\nReproduce: `python "
                           "benchmarks/step_monitor_overhead.py --write`\n")


if __name__ == "__main__":
    main()
