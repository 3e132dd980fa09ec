"""Gradient histograms: ``wandb.watch(model, log="gradients")`` vs tscope's device-side histograms, same model, same
gradients, one process (CPU; wandb in offline mode, nothing leaves the machine).

For a healthy step and for a step whose forward produced a NaN (every gradient non-finite, as when a run diverges):
how many histograms each logs, how many non-finite values it reports, and how many reads of the gradients' side it
makes (``.item()``, ``bool()`` of a tensor, ``.tolist()``, ``.cpu()`` while the histograms are built: on a GPU each
waits for the device). wandb makes several per parameter; tscope one per logged step, the copy of the whole batch,
which the callback issues non-blocking (turning the copy into histograms then reads host memory only). The time per
logged step (the histograms alone, median of alternating runs) is shown for scale; on CPU it is not the GPU cost.

    python benchmarks/watch_vs_wandb.py [--runs 15] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from unittest import mock

import torch
from common import publish

from tscope_callbacks.analysis import histograms as H
from tscope_callbacks.demo.model import GPTConfig, TinyGPT, random_tokens

CFG = GPTConfig(vocab_size=512, seq_len=64, d_model=128, n_layer=4, n_head=4)


class Reads:
    """Counts the host reads made inside the block (``Tensor.item``, ``__bool__``, ``tolist``, ``cpu``)."""

    NAMES = ("item", "__bool__", "__float__", "tolist", "cpu")

    def __enter__(self):
        self.n = dict.fromkeys(self.NAMES, 0)
        self._patches = []
        for name in self.NAMES:
            orig = getattr(torch.Tensor, name)

            def wrap(t, *a, _orig=orig, _name=name, **k):
                self.n[_name] += 1
                return _orig(t, *a, **k)

            p = mock.patch.object(torch.Tensor, name, wrap)
            p.start()
            self._patches.append(p)
        return self

    def __exit__(self, *exc):
        for p in self._patches:
            p.stop()

    @property
    def total(self) -> int:
        return sum(self.n.values())


def gradients(model: TinyGPT, nan: bool) -> None:
    model.zero_grad(set_to_none=True)
    x, y = random_tokens(CFG, 8)
    loss = model.loss(x, y)
    (loss * float("nan") if nan else loss).backward()


def wandb_step(watcher, model: TinyGPT) -> dict:
    """wandb.watch's own per-gradient histogram code (``log_tensor_stats``, what its backward hooks call), with the
    histograms it would log captured instead of sent."""
    logged: dict = {}
    import wandb

    with mock.patch.object(wandb.run, "_log", lambda d, commit=False: logged.update(d)):
        for n, p in model.named_parameters():
            watcher.log_tensor_stats(p.grad.data, "gradients/" + n)
    return logged


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    import wandb
    from wandb.integration.torch.wandb_torch import TorchHistory

    os.environ.setdefault("WANDB_SILENT", "true")
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    n_params = sum(1 for _ in model.parameters())
    with tempfile.TemporaryDirectory() as d:
        run = wandb.init(mode="offline", dir=d, project="tscope-bench")
        watcher = TorchHistory()
        lines = [f"# Gradient histograms: wandb.watch vs tscope (CPU, torch {torch.__version__}, wandb "
                 f"{wandb.__version__})", "",
                 f"TinyGPT d={CFG.d_model} x{CFG.n_layer}, {n_params} parameter tensors, 64 bins.", "",
                 "| step | tool | histograms logged | non-finite values reported | host reads | ms per logged step |",
                 "|---|---|---:|---:|---:|---:|"]
        for nan in (False, True):
            gradients(model, nan)
            named = [(n, p.grad) for n, p in model.named_parameters()]
            nonfinite = sum(int((~torch.isfinite(g)).sum()) for _, g in named)
            with Reads() as rw:
                logged = wandb_step(watcher, model)
            grads = [g for _, g in named]
            # reads counted on the path a GPU takes (on CPU, where a read costs nothing, clean tensors skip passes)
            with Reads() as rt, mock.patch.object(H, "_reads_are_free", lambda device: False):
                stats = H.device_stats(grads)
                counts = H.device_counts(grads, stats, 64)
                host = torch.cat([stats.flatten(), counts.flatten()]).cpu()  # the one copy the callback makes
            ns = len(named) * 7
            hists = H.read_histograms([n for n, _ in named], host[:ns], host[ns:], 64)  # host data: no device
            times: dict[str, list[float]] = {"wandb.watch": [], "tscope": []}
            for r in range(args.runs):
                for k in (("wandb.watch", "tscope") if r % 2 == 0 else ("tscope", "wandb.watch")):
                    t = time.perf_counter()
                    wandb_step(watcher, model) if k == "wandb.watch" else H.histograms(named, bins=64)
                    times[k].append(time.perf_counter() - t)
            label = "NaN in the forward (all gradients non-finite)" if nan else "healthy"
            lines.append(f"| {label} | wandb.watch | {len(logged)} of {n_params} | 0 of {nonfinite:,} | {rw.total} "
                         f"| {statistics.median(times['wandb.watch']) * 1e3:.2f} |")
            drawn = sum(1 for h in hists if h.num)
            lines.append(f"| {label} | tscope | {len(hists)} of {n_params} ({drawn} with finite values to draw) | "
                         f"{sum(h.nonfinite for h in hists):,} of {nonfinite:,} | {rt.total} | "
                         f"{statistics.median(times['tscope']) * 1e3:.2f} |")
        run.finish()
    lines += ["", "Host reads: `.item()`, `bool()` and `float()` of a tensor, `.tolist()` and `.cpu()` calls while the "
              "histograms are built, counted on the path a GPU takes. Each waits for the device on a GPU; tscope's "
              "one read is the copy of the whole batch, which `WatchCallback` issues non-blocking and reads when it "
              "has landed. Times are CPU times of the histograms alone (median of alternating runs): for scale, not "
              "the GPU cost, which is not measured yet."]
    text = "\n".join(lines)
    publish(text, args, "watch_vs_wandb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
