"""NaN guard overhead: healthy Lightning fits of a small transformer LM on CPU, without vs with NaNGuardCallback.

Same process, configurations alternated (rotating order) within each round, median over rounds of each run's median
step time (steps after a warm-up, timed between consecutive ``on_train_batch_end``). ``detect_anomaly=True`` is
measured the same way for comparison. Because whole-step timings on a shared CPU are noisy, the time spent inside the
guard's own hooks is also measured directly (``hooks ms/step``): it is the guard's cost, free of run-to-run noise.
Target: guard/plain <= 1.02.

Two workloads: the guard's cost is about one read pass over the gradients (plus ~0.2 ms fixed), the step's cost
grows with parameters x tokens, so the ratio falls as batches grow; "small" (512 tokens per step) is a worst case.

    python benchmarks/nan_guard_overhead.py [--workloads small,medium] [--threads N] [--write]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from tscope_callbacks import NaNGuardCallback
from tscope_callbacks.demo.model import GPTConfig, TinyGPT

# name: (config, batch, steps per run, rounds)
WORKLOADS = {
    "small": (GPTConfig(vocab_size=512, seq_len=64, d_model=128, n_layer=4, n_head=4), 8, 40, 9),
    "medium": (GPTConfig(vocab_size=512, seq_len=128, d_model=256, n_layer=4, n_head=4), 8, 15, 5),
}
WARMUP = 5


class LM(pl.LightningModule):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = TinyGPT(cfg)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.model.loss(x, y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4, weight_decay=0.1)


def loader(cfg: GPTConfig, batch: int, steps: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, cfg.vocab_size, (batch * steps, cfg.seq_len + 1), generator=g)
    return DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=batch)


class TimedGuard(NaNGuardCallback):
    """NaNGuardCallback whose hooks add their own wall time to ``hook_s``."""

    hook_s = 0.0


def _timed(name: str):
    inner = getattr(NaNGuardCallback, name)

    def hook(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            self.hook_s += time.perf_counter() - t0

    return hook


for _h in ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end"):
    setattr(TimedGuard, _h, _timed(_h))


class StepTimer(Callback):
    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.stamps.append(time.perf_counter())

    def step_s(self) -> float:
        d = [b - a for a, b in zip(self.stamps[WARMUP:], self.stamps[WARMUP + 1:])]
        return statistics.median(d)

    def paired(self) -> float:
        """Median over adjacent step pairs of (even step time) / (preceding odd step time): with
        ``every_n_steps=2`` only even steps are guarded, and adjacent steps share the machine's load."""
        d = {i: b - a for i, (a, b) in enumerate(zip(self.stamps, self.stamps[1:]), start=1)}
        return statistics.median(d[i] / d[i - 1] for i in d if i > WARMUP and i % 2 == 0 and i - 1 in d)


CONFIGS = {
    "plain": lambda: ([], {}),
    "NaNGuardCallback()": lambda: ([TimedGuard()], {}),
    "NaNGuardCallback(check_params=True)": lambda: ([TimedGuard(check_params=True)], {}),
    "NaNGuardCallback(every_n_steps=2)": lambda: ([TimedGuard(every_n_steps=2)], {}),
    "detect_anomaly=True": lambda: ([], {"detect_anomaly": True}),
}


def run(name: str, workload: str) -> tuple[float, float | None, float]:
    cfg, batch, steps, _ = WORKLOADS[workload]
    callbacks, kw = CONFIGS[name]()
    timer = StepTimer()
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=[*callbacks, timer], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kw)
    trainer.fit(LM(cfg), loader(cfg, batch, steps))
    guard = next((c for c in callbacks if isinstance(c, NaNGuardCallback)), None)
    if guard is not None and (guard.num_events or guard.replays):
        raise RuntimeError(f"healthy run reported events: {guard.events}")
    return timer.step_s(), (guard.hook_s / steps if guard is not None else None), timer.paired()


def measure(workload: str) -> list[str]:
    cfg, batch, steps, rounds = WORKLOADS[workload]
    names = list(CONFIGS)
    times: dict[str, list[float]] = {n: [] for n in names}
    hooks: dict[str, list[float]] = {n: [] for n in names}
    paired: dict[str, list[float]] = {n: [] for n in names}
    run("plain", workload)  # warm-up (allocator, thread pools)
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            step_s, hook_s, pair = run(n, workload)
            times[n].append(step_s)
            paired[n].append(pair)
            if hook_s is not None:
                hooks[n].append(hook_s)
    base = statistics.median(times["plain"])
    n_params = sum(p.numel() for p in TinyGPT(cfg).parameters())
    lines = [
        f"## {workload}: TinyGPT d_model={cfg.d_model} n_layer={cfg.n_layer} seq={cfg.seq_len} vocab={cfg.vocab_size} "
        f"({n_params / 1e6:.2f} M params), batch {batch} ({batch * cfg.seq_len} tokens/step), AdamW",
        "",
        f"Median over {rounds} alternated rounds of each run's median step time ({steps} steps, {WARMUP} warm-up).",
        "",
        "| configuration | step ms | ratio vs plain | min..max ms | guard hooks ms/step | 1 + hooks/plain | "
        "paired even/odd |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n in names:
        med = statistics.median(times[n])
        h = f"{statistics.median(hooks[n]) * 1e3:.3f} | {1 + statistics.median(hooks[n]) / base:.4f}" if hooks[n] \
            else "- | -"
        lines.append(f"| {n} | {med * 1e3:.2f} | {med / base:.3f} | {min(times[n]) * 1e3:.2f}.."
                     f"{max(times[n]) * 1e3:.2f} | {h} | {statistics.median(paired[n]):.4f} |")
    pair = statistics.median(paired["NaNGuardCallback(every_n_steps=2)"]) / statistics.median(paired["plain"])
    return lines + ["", f"Paired estimate of the guard's per-step overhead (guarded even steps vs unguarded odd "
                        f"neighbours, over the same ratio without the guard): **{pair:.4f}**.", ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="small,medium", help=f"comma-separated, from {sorted(WORKLOADS)}")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/nan_guard_overhead.md")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    lines = [
        "# NaN guard overhead (healthy steps)",
        "",
        f"Lightning fit on CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads), "
        f"torch {torch.__version__}. `step ms`: whole-step wall time (noisy on a shared machine); `guard hooks "
        "ms/step`: time inside the guard's hooks, the guard's own cost; `1 + hooks/plain`: the overhead ratio from it; "
        "`paired even/odd`: median ratio of each even step's time to the odd step before it (with every_n_steps=2 "
        "only even steps are guarded; for the other rows it shows the parity bias).",
        "Target: NaNGuardCallback() / plain <= 1.02.",
        "",
    ]
    load0 = os.getloadavg()[0]
    for w in args.workloads.split(","):
        lines += measure(w.strip())
    lines += [f"Machine load average (1 min) at start / end: {load0:.2f} / {os.getloadavg()[0]:.2f} on "
              f"{os.cpu_count()} CPUs (a shared machine: whole-step times are noisy, the hook and paired columns "
              "much less so).", ""]
    table = "\n".join(lines)
    print(table)
    if args.write:
        out = Path(__file__).parent / "results" / "nan_guard_overhead.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
