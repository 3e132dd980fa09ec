"""The step monitor's parts beside Lightning's SimpleProfiler, its verdicts and its alerts, in the loops of issue 43.

Every fit runs with ``profiler=SimpleProfiler()`` and a ``RooflineCallback`` (the monitor inside, a profile at step 20),
so each figure below has Lightning's own beside it, from the same steps of the same fit:

- ``fetch``: the monitor's fetch + transfer, against SimpleProfiler's ``train_dataloader_next`` + ``batch_to_device``;
- ``hooks``: the monitor's hooks part (other callbacks' and the module's hooks), against the sum of SimpleProfiler's
  ``[Callback]`` and ``[LightningModule]`` hook actions of the callbacks that are not tscope's (per step);
- ``opt step``: the monitor's forward + backward + optimizer, against ``[LightningModule]...optimizer_step`` (which holds
  the closure: training_step and backward) less the hooks inside it;
- ``logging``, ``tscope``, ``other``: the monitor's own parts (Lightning marks none of them: ``other`` is its
  bookkeeping no hook marks).

Runs: HF GPT-2 (2 layers, d=64, a 1024-token vocabulary) on in-memory data with ``log_every_n_steps`` 1 and 50; the tscope demo model; a slow
Dataset (each sample sleeps 1 ms); the demo model with one layer made slower from step 60 by 20%, 30% and 100% of the
step (a sleep in its forward, sized from the median step of steps 25-55). ``--ddp``: 4 gloo ranks, one late by a 30 ms
sleep in its data (steps 20-39), its compute (40-59) and before the step (60-79).

    python benchmarks/step_monitor_scenarios.py [--steps 150] [--ddp] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.profilers import SimpleProfiler
from torch.utils.data import DataLoader, Dataset, TensorDataset

import tscope_callbacks as ts
from tscope_callbacks.analysis.step_parts import StepTimes
from tscope_callbacks.devices.calibrate import cpu_snapshot, others_load_per_cpu

RESULTS = Path(__file__).resolve().parent / "results" / "step_monitor_scenarios.md"
VOCAB = 1024  #: HF GPT-2's vocabulary here: a ~10 ms CPU step, where the loop's own work is a visible share
SLOW_FROM = 60


class SlowData(Dataset):
    def __init__(self, n: int = 8192, sleep_s: float = 0.001) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 512, (n, 65), generator=g)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.sleep_s)
        return self.x[i, :-1], self.x[i, 1:]


class GPT2Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        self.model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=128, vocab_size=VOCAB))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        loss = self.model(input_ids=x, labels=x).loss
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class Slower(torch.nn.Module):
    """Wraps a layer: from ``SLOW_FROM`` on, its forward sleeps ``extra_s`` more (set once the step time is known)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.extra_s, self.on = inner, 0.0, False

    def forward(self, *a: Any, **k: Any) -> Any:
        if self.on and self.extra_s:
            time.sleep(self.extra_s)
        return self.inner(*a, **k)


class SlowDown(pl.Callback):
    """Sizes the slowdown from the median step of steps 25-55 and turns it on at ``SLOW_FROM``."""

    def __init__(self, layer: Slower, share: float) -> None:
        self.layer, self.share, self.starts = layer, share, []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.starts.append((trainer.global_step, time.perf_counter()))
        if trainer.global_step == SLOW_FROM:
            d = [b - a for (s, a), (_, b) in zip(self.starts, self.starts[1:]) if 25 <= s < 55]
            self.layer.extra_s = self.share * statistics.median(d)
            self.layer.on = True


def _sp(d: dict[str, list[float]], suffix: str) -> list[float]:
    keys = [k for k in d if k.endswith(suffix)]
    return d[keys[0]] if keys else []


def run(name: str, module: pl.LightningModule, loader: DataLoader, steps: int, *, log_every: int = 50,
        callbacks: list[pl.Callback] | None = None, logger: Any = False) -> dict[str, Any]:
    prof = SimpleProfiler()
    roof = ts.RooflineCallback(start_step=20, every_n_steps=None,
                               outputs=ts.RooflineOutputs(plot=False, save_json=False))
    seen: list[StepTimes] = []
    mon = roof.monitor
    add = mon._add
    mon._add = lambda trainer, st: (seen.append(st), add(trainer, st))  # type: ignore[method-assign]
    since = cpu_snapshot()
    trainer = pl.Trainer(max_steps=steps, callbacks=[roof, *(callbacks or [])], profiler=prof, logger=logger,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1, log_every_n_steps=log_every)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)
    d = prof.recorded_durations
    clean = [st for st in seen if not st.dirty and 10 <= st.step < min(SLOW_FROM, steps - 2)]
    idx = [st.step for st in clean]
    fetch_sp = [a + b for a, b in zip(_sp(d, "train_dataloader_next"), _sp(d, ".batch_to_device"))]
    tscope = set(mon.probe.tscope_keys)
    own = [k for k in d if (k.startswith("[Callback]") and k[10:].rpartition(".")[0] not in tscope)
           or (k.startswith("[LightningModule]") and k.rpartition(".")[2].startswith("on_")
               and "batch_transfer" not in k)]
    hooks_sp = [sum(d[k][i] for k in own if len(d[k]) > i) for i in idx]
    opt = _sp(d, ".optimizer_step")
    inner = [k for k in own if k.endswith((".on_before_zero_grad", ".on_before_optimizer_step", ".on_before_backward",
                                           ".on_after_backward"))]
    opt_sp = [opt[i] - sum(d[k][i] for k in inner if len(d[k]) > i) for i in idx]
    med = lambda xs: statistics.median(xs) * 1e3 if xs else float("nan")  # noqa: E731
    b = mon.last_breakdown
    return {
        "name": name, "load": others_load_per_cpu(since),
        "step": med([st.host_s for st in clean]),
        "fetch": (med([st.part("fetch") + st.part("transfer") for st in clean]), med([fetch_sp[i] for i in idx])),
        "hooks": (med([st.part("hooks") for st in clean]), med(hooks_sp)),
        "opt": (med([st.part("forward") + st.part("backward") + st.part("optimizer") for st in clean]), med(opt_sp)),
        "logging": statistics.mean(st.part("logging") for st in clean) * 1e3,
        "tscope": med([st.part("tscope") for st in clean]), "other": med([st.part("other") for st in clean]),
        "cpu_wait": med([st.cpu_wait_s or 0.0 for st in clean]),
        "input_bound": bool(mon.input_fixes), "loop": mon.loop_finding,
        "alerts": [(a["step"], a["text"]) for a in mon.alerts], "contended": [c["text"] for c in mon.contended],
        "breakdown": b,
    }


def demo(steps: int, share: float = 0.0) -> tuple[pl.LightningModule, DataLoader, list[pl.Callback]]:
    from tscope_callbacks.demo.lightning import DemoLM, RandomTokenData

    m = DemoLM()
    dm = RandomTokenData()
    cbs: list[pl.Callback] = []
    if share:
        blocks = m.model.blocks
        layer = Slower(blocks[1].mlp)
        blocks[1].mlp = layer
        cbs.append(SlowDown(layer, share))
    dm.setup("fit")
    return m, dm.train_dataloader(), cbs


DDP_SCRIPT = """
    import json, os, sys, time
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import tscope_callbacks as ts
    from lightning.pytorch.profilers import SimpleProfiler

    torch.set_num_threads(1)
    out = sys.argv[1]
    PHASES = [(20, 39, 2, "data"), (40, 59, 1, "compute"), (60, 79, 3, "before")]
    late = lambda where, step: next((r for a, b, r, w in PHASES if w == where and a <= step <= b), None)

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        def training_step(self, batch, batch_idx):
            if late("compute", self.global_step) == self.global_rank:
                time.sleep(0.03)
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)
        def train_dataloader(self):
            g = torch.Generator().manual_seed(0)
            ds = TensorDataset(torch.randn(4096, 16, generator=g), torch.randn(4096, 4, generator=g))
            def collate(items):
                if late("data", self.trainer.global_step) == self.global_rank:
                    time.sleep(0.03)
                return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])
            return DataLoader(ds, batch_size=8, collate_fn=collate)

    class Before(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if late("before", trainer.global_step) == trainer.global_rank:
                time.sleep(0.03)

    mon = ts.StepMonitor(telemetry=False)
    prof = SimpleProfiler()
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=4, max_steps=80, callbacks=[Before(), mon],
                         profiler=prof, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=10, num_sanity_val_steps=0)
    trainer.fit(Net())
    bwd = [v for k, v in prof.recorded_durations.items() if k.endswith(".backward")][0]
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"history": [[s, l.rank, l.cost_ms, l.part, l.kind, l.finding, list(l.sync_ms)]
                               for s, l in mon.rank_history],
                   "backward_ms": {str(a): 1e3 * sorted(bwd[a:b])[len(bwd[a:b]) // 2] for a, b in ((25, 39), (45, 59), (65, 79))},
                   "alerts": [a["text"] for a in mon.alerts]}, f)
"""


def ddp() -> list[str]:
    import json

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "late.py"
        path.write_text(textwrap.dedent(DDP_SCRIPT))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(29500 + os.getpid() % 1000)}
        subprocess.run([sys.executable, str(path), tmp], env=env, cwd=tmp, check=True, capture_output=True, timeout=900)
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(4)]
    lines = ["| logging step | late rank | kind (part) | every other rank waits ms/step | sync ms/step per rank | "
             "SimpleProfiler backward ms (rank 0, median of the phase) |", "|---|---|---|---|---|---|"]
    phase = {40: "25", 60: "45", 80: "65"}
    for s, r, cost, part, kind, finding, sync in ranks[0]["history"]:
        bw = ranks[0]["backward_ms"].get(phase.get(s, ""), None)
        lines.append(f"| {s} | {r}{'' if finding else ' (no finding)'} | {kind} ({part}) | {cost:.1f} | "
                     f"{', '.join(f'{x:.1f}' for x in sync)} | {'' if bw is None else f'{bw:.1f}'} |")
    lines += ["", "Alerts (rank 0): " + " / ".join(ranks[0]["alerts"])]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--ddp", action="store_true", help="also the 4-rank late-rank run")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    since = cpu_snapshot()
    g = torch.Generator().manual_seed(0)
    tokens = TensorDataset(torch.randint(0, VOCAB, (4096, 64), generator=g))
    results = []
    from lightning.pytorch.loggers import TensorBoardLogger

    tmp = tempfile.mkdtemp()
    for every in (1, 50):  # Lightning's default logger (TensorBoard), as a user's fit has it
        results.append(run(f"HF GPT-2 2x64, in-memory, TensorBoard, log_every_n_steps={every}", GPT2Module(),
                           DataLoader(tokens, batch_size=8), args.steps, log_every=every,
                           logger=TensorBoardLogger(tmp, name=f"every{every}")))
    m, dl, cbs = demo(args.steps)
    results.append(run("demo model, in-memory", m, dl, args.steps, callbacks=cbs))
    m, _, cbs = demo(args.steps)
    results.append(run("demo model, a Dataset sleeping 1 ms a sample", m, DataLoader(SlowData(), batch_size=16),
                       args.steps, callbacks=cbs))
    for share in (0.2, 0.3, 1.0):
        m, dl, cbs = demo(args.steps, share)
        results.append(run(f"demo model, blocks.1.mlp +{share:.0%} of the step from step {SLOW_FROM}", m, dl,
                           args.steps, callbacks=cbs))
    lines = [f"torch {torch.__version__}, 1 thread, {os.cpu_count()} CPUs, `uptime` at the start: "
             + os.popen("uptime").read().strip(), "",
             "Medians over the clean steps 10-59 of each fit (ms a step), tscope / SimpleProfiler:", "",
             "| run | step | fetch | hooks | fwd+bwd+opt (opt step) | logging (mean) | tscope | other | CPU wait | "
             "input-bound | others' load |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        f = lambda p: f"{p[0]:.3g} / {p[1]:.3g}"  # noqa: E731
        lines.append(f"| {r['name']} | {r['step']:.3g} | {f(r['fetch'])} | {f(r['hooks'])} | {f(r['opt'])} | "
                     f"{r['logging']:.3g} | {r['tscope']:.3g} | {r['other']:.3g} | {r['cpu_wait']:.3g} | "
                     f"{'yes' if r['input_bound'] else 'no'} | {r['load'] or 0:.2f} |")
    lines += ["", "Verdicts and alerts:", ""]
    for r in results:
        lines.append(f"- **{r['name']}**: loop finding: {r['loop'] or 'none'}")
        for step, text in r["alerts"]:
            lines.append(f"  - alert at step {step}: {text}")
        for text in r["contended"]:
            lines.append(f"  - named contention (not alerted): {text}")
    if args.ddp:
        lines += ["", "4 gloo ranks on CPU (DDP), one late by 30 ms: data (steps 20-39, rank 2), compute (40-59, "
                  "rank 1), before the step (60-79, rank 3); the gather at each logging step reads the interval "
                  "before it:", ""] + ddp()
    lines += ["", f"Other processes' CPU load over the whole run: {others_load_per_cpu(since) or 0:.2f} per CPU."]
    text = "\n".join(lines)
    print(text)
    if args.write:
        RESULTS.write_text("# Step monitor: parts beside Lightning's SimpleProfiler, verdicts, alerts (CPU)\n\n" + text
                           + "\n\nReproduce: `python benchmarks/step_monitor_scenarios.py --ddp --write`\n")


if __name__ == "__main__":
    main()
