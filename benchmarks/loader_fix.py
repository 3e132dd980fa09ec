"""The step monitor's input fix for a fast in-memory loader, applied: a small MLP trained on a ``TensorDataset``
(batch 32 of 64 features, 1 torch thread), each run a fit of the same steps, interleaved rounds, the median ms a step:

- as written (``num_workers=0``, one ``__getitem__`` a sample, the default collate);
- the fix the monitor gave before (``num_workers=2``, persistent workers): each batch a worker makes crosses processes;
- the fix it gives under ``WORKERS_PAY_MS`` a batch: the batch built in one indexing (the dataset's
  ``__getitems__(indices)``, which the DataLoader calls with each batch's indices).

    python benchmarks/loader_fix.py [--rounds 9] [--steps 1000] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from common import publish
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tscope_callbacks.analysis.anomaly import WORKERS_PAY_MS


class BatchIndexed(TensorDataset):
    """A TensorDataset whose batch is one indexing of each tensor (the DataLoader hands it a batch's indices)."""

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, ...]]:
        i = torch.as_tensor(indices)
        return [tuple(t[i] for t in self.tensors)]


def _whole(batch: list) -> tuple[torch.Tensor, ...]:
    return batch[0]  # __getitems__ made the batch: nothing to collate


def loaders(x: torch.Tensor, y: torch.Tensor) -> dict[str, DataLoader]:
    return {"as written: num_workers=0, a sample at a time": DataLoader(TensorDataset(x, y), batch_size=32,
                                                                       shuffle=True),
            "the old fix: num_workers=2, persistent": DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True,
                                                                 num_workers=2, persistent_workers=True),
            "the fix: one indexing a batch (__getitems__)": DataLoader(BatchIndexed(x, y), batch_size=32,
                                                                       shuffle=True, collate_fn=_whole)}


def fit_ms(model: nn.Module, opt: torch.optim.Optimizer, dl: DataLoader, steps: int) -> tuple[float, float]:
    """(ms a training step, ms a batch fetched) over ``steps`` steps."""
    fetch, n = 0.0, 0
    it = iter(dl)
    t0 = time.perf_counter()
    while n < steps:
        f = time.perf_counter()
        try:
            xb, yb = next(it)
        except StopIteration:
            it = iter(dl)
            continue
        fetch += time.perf_counter() - f
        nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        n += 1
    return (time.perf_counter() - t0) / n * 1e3, fetch / n * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/loader_fix.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = torch.randn(8192, 64), torch.randn(8192, 1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dls = loaders(x, y)
    for dl in dls.values():
        fit_ms(model, opt, dl, 20)  # warm: workers started
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in dls}
    for r in range(args.rounds):
        for k in (list(dls) if r % 2 == 0 else list(reversed(dls))):
            runs[k].append(fit_ms(model, opt, dls[k], args.steps))
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    base = runs[next(iter(dls))]
    lines = [f"# A fast in-memory loader's input fix, applied (CPU, torch {torch.__version__}, 1 thread)", "",
             f"MLP 64-256-256-1, AdamW, batch 32 from a TensorDataset of 8192 x 64; {args.rounds} interleaved rounds "
             f"of {args.steps} steps, medians (the ratio: the median of each round's ratio to the same round's run as "
             f"written); load average {load}. The monitor gives workers only to a fetch of {WORKERS_PAY_MS:g} ms a "
             "batch or more.", "",
             "| loader | ms a step | / as written | ms a batch fetched |", "|---|---:|---:|---:|"]
    for k, v in runs.items():
        step = statistics.median(s for s, _ in v)
        ratio = statistics.median(a[0] / b[0] for a, b in zip(v, base))
        lines.append(f"| {k} | {step:.3f} | {ratio:.2f} | {statistics.median(f for _, f in v):.3f} |")
    text = "\n".join(lines)
    publish(text, args, "loader_fix")
    return 0


if __name__ == "__main__":
    sys.exit(main())
