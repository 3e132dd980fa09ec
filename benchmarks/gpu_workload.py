"""The GPU benchmarks' workload: HF GPT-2 124M from a config, batch 8x1024, bf16 autocast, fused AdamW -- as a plain
step function and as a Lightning fit with a CUDA-event window timer. ``smoke=True`` shrinks it to a CPU-sized run
(2 layers, d=64, batch 2x64) so the scripts can be exercised without a GPU; its figures mean nothing."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from common import gpt2, hand_flops
from torch.utils.data import DataLoader, TensorDataset


@dataclass(frozen=True)
class Workload:
    n_layer: int = 12
    d: int = 768
    heads: int = 12
    vocab: int = 50257
    batch: int = 8
    seq: int = 1024

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


FULL = Workload()
SMOKE = Workload(n_layer=2, d=64, heads=2, vocab=512, batch=2, seq=64)


def device_for(smoke: bool) -> str:
    if smoke:
        return "cpu"
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (run with --smoke on CPU to exercise the script)")
    return "cuda"


def autocast(device: str) -> Any:
    return torch.autocast(device, dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def build(w: Workload, device: str) -> tuple[Any, Any, torch.Tensor]:
    model = gpt2(w.n_layer, w.d, w.heads, w.vocab, max(w.seq, 64), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    ids = torch.randint(0, w.vocab, (w.batch, w.seq), device=device, generator=None)
    return model, opt, ids


def train_step(model: Any, opt: Any, ids: torch.Tensor, device: str) -> None:
    """One training step of the workload: forward with its LM loss (bf16 autocast on CUDA), backward, update."""
    with autocast(device):
        loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def ready(w: Workload, device: str, *, compile: bool = False, warmup: int = 3) -> tuple[Any, Callable[[], None]]:
    """The workload built on ``device`` (``torch.compile``'d when asked) and its training step as a no-argument
    callable, already run ``warmup`` times: ``(the module the step runs, step)``."""
    model, opt, ids = build(w, device)
    module = torch.compile(model) if compile else model

    def step() -> None:
        train_step(module, opt, ids, device)

    step.optimizer = opt  # type: ignore[attr-defined]  # its state: the step's memory (scripts/gpu_check.py)
    for _ in range(warmup):
        step()
    return module, step


def hand_count(model: Any, w: Workload, attention: str = "attended") -> float:
    """Megatron-style FLOPs of one training step (see ``common.hand_flops``)."""
    emb = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
    non_embed = sum(p.numel() for p in model.parameters()) - emb
    return hand_flops(non_embed, w.n_layer, w.d, w.tokens, w.seq, w.vocab, attention)


class LM(pl.LightningModule):
    def __init__(self, w: Workload) -> None:
        super().__init__()
        self.w = w
        self.model = gpt2(w.n_layer, w.d, w.heads, w.vocab, max(w.seq, 64))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.model(batch[0], labels=batch[0]).loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-4, weight_decay=0.1, fused=True)


def loader(w: Workload, steps: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, w.vocab, (w.batch * steps, w.seq), generator=g)
    return DataLoader(TensorDataset(data), batch_size=w.batch, pin_memory=torch.cuda.is_available())


class Window(pl.Callback):
    """Times steps [first, last) of a fit: a CUDA event (wall clock on CPU) at the start of each step from ``first``
    to ``last``, read after the fit -- nothing synchronizes inside the window (recording an event does not)."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.stamps: dict[int, Any] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        gs = trainer.global_step
        if self.first <= gs <= self.last and gs not in self.stamps:
            if trainer.strategy.root_device.type == "cuda":
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                self.stamps[gs] = ev
            else:
                import time

                self.stamps[gs] = time.perf_counter()

    def step_ms(self) -> list[float]:
        """ms of each step ``first`` .. ``last - 1`` (start of a step to the start of the next)."""
        out = []
        for i in range(self.first, self.last):
            a, b = self.stamps[i], self.stamps[i + 1]
            if isinstance(a, float):
                out.append((b - a) * 1e3)
            else:
                b.synchronize()
                out.append(a.elapsed_time(b))
        return out


def fit_steps(w: Workload, device: str, callbacks: list, *, first: int, last: int, detect_anomaly: bool = False,
              seed: int = 0) -> tuple[list[float], pl.Trainer]:
    """ms of each step in [first, last) of a Lightning fit (bf16-mixed on CUDA) with ``callbacks`` added."""
    torch.manual_seed(seed)
    win = Window(first, last)
    trainer = pl.Trainer(max_steps=last + 1, accelerator="gpu" if device == "cuda" else "cpu", devices=1,
                         precision="bf16-mixed" if device == "cuda" else "32-true", callbacks=[win, *callbacks],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=10, detect_anomaly=detect_anomaly)
    trainer.fit(LM(w), loader(w, last + 1))
    return win.step_ms(), trainer


def fit_window(w: Workload, device: str, callbacks: list, *, first: int, last: int, detect_anomaly: bool = False,
               seed: int = 0) -> tuple[float, pl.Trainer]:
    """ms per step over [first, last) of a Lightning fit (bf16-mixed on CUDA) with ``callbacks`` added."""
    steps, trainer = fit_steps(w, device, callbacks, first=first, last=last, detect_anomaly=detect_anomaly, seed=seed)
    return sum(steps) / len(steps), trainer


def paired(configs: dict[str, Any], runs: int) -> dict[str, list[float]]:
    """Each config run ``runs`` times, the order rotating between runs (drift hits every config alike)."""
    out: dict[str, list[float]] = {k: [] for k in configs}
    names = list(configs)
    for r in range(runs):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            out[k].append(configs[k]())
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs)
