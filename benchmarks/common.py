"""Helpers shared by the benchmarks: the GPT-2 workloads, a bare dispatch mode, step timers (CUDA events on a GPU,
``perf_counter`` on CPU), the hand FLOP count and result writing. Not part of the package."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

RESULTS = Path(__file__).parent / "results"


class BareMode(TorchDispatchMode):
    """A pass-through dispatch mode: the floor of any dispatch-mode capture (without torch's Dynamo-disable shim
    around ``__torch_dispatch__``, as tscope's own mode)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def count_ops(step: Callable[[], None]) -> int:
    """Ops one call of ``step`` dispatches."""

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return Count.n


def gpt2(n_layer: int = 12, n_embd: int = 768, n_head: int = 12, vocab: int = 50257, n_positions: int = 1024,
         device: str = "cpu") -> Any:
    """HF GPT-2 built from a config (no download): 124M parameters at the defaults."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=n_positions,
                     bos_token_id=0, eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    if device == "meta":  # built there: .to("meta") would untie the embedding and the LM head
        with torch.device("meta"):
            return GPT2LMHeadModel(cfg)
    return GPT2LMHeadModel(cfg).to(device)


def hand_flops(n_params_nonembed: int, n_layer: int, d: int, tokens: int, seq: int, vocab: int,
               attention: str = "attended") -> float:
    """Megatron-style training FLOPs of one step: 6 N T for the weight matmuls (N without embeddings), 6 T d V for
    the LM head, and attention scores + values: 2 matmuls x 2 FLOPs x seq x d per token per layer forward, x3 for
    forward + backward; ``attended`` halves the causal square ((L+1)/2L of it, exactly)."""
    attn = 3 * 2 * 2 * n_layer * tokens * seq * d
    if attention == "attended":
        attn = attn * (seq + 1) / (2 * seq)
    return 6 * n_params_nonembed * tokens + 6 * tokens * d * vocab + attn


def median_time(fn: Callable[[], None], runs: int, *, cuda: bool = False) -> float:
    """Median seconds of ``fn`` over ``runs`` calls: CUDA events around each call on a GPU (the call is
    synchronized at its end, never timed with host timers around asynchronous work), perf_counter on CPU."""
    ts_ = []
    for _ in range(runs):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts_.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            ts_.append(time.perf_counter() - t0)
    return statistics.median(ts_)


def interleaved(contenders: dict[str, Callable[[], None]], runs: int, *, cuda: bool = False) -> dict[str, float]:
    """Median seconds per contender, runs interleaved in alternating order (drift hits every contender alike)."""
    return {k: statistics.median(v) for k, v in interleaved_runs(contenders, runs, cuda=cuda).items()}


def interleaved_runs(contenders: dict[str, Callable[[], None]], runs: int, *,
                     cuda: bool = False) -> dict[str, list[float]]:
    """Every run's seconds per contender, runs interleaved in alternating order."""
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for fn in contenders.values():
        fn()  # warm each path once
    for i in range(runs):
        order = list(contenders.items())
        if i % 2:
            order.reverse()
        for name, fn in order:
            times[name].append(median_time(fn, 1, cuda=cuda))
    return times


def write(name: str, text: str, reproduce: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / name
    out.write_text(text + f"\n\nReproduce: `{reproduce}`\n")
    print(f"written {out}")
    return out


def publish(text: str, args: Any, stem: str) -> None:
    """A benchmark's result: printed; with ``--write`` (and not ``--smoke``, where the benchmark has one) also written
    to ``benchmarks/results/<stem>.md`` with the command that reproduces it (``benchmarks/<stem>.py --write``)."""
    print(text)
    if args.write and not getattr(args, "smoke", False):
        write(f"{stem}.md", text, f"python benchmarks/{stem}.py --write")


def cost_lines(profiles: dict[str, Any], plain_s: float) -> list[str]:
    """Where a profiled step's extra time went: each capture's ``info.capture_cost`` (tscope's own host seconds
    per part) as a table, with the region's excess over a plain step per op -- the per-op hot path."""
    keys = [("start_s", "start"), ("region_s", "region"), ("sync_s", "device sync"), ("kineto_s", "Kineto read-out"),
            ("assign_s", "kernels to ops"), ("build_s", "records")]
    rows = {name: p.info.capture_cost or {} for name, p in profiles.items()}
    if not any(rows.values()):
        return []
    out = ["", "Where the time went (host ms, last run of each; `info.capture_cost`):", "",
           "| capture | " + " | ".join(k for _, k in keys) + " | region - plain, µs per op |",
           "|---|" + "---:|" * (len(keys) + 1)]
    for name, c in rows.items():
        cells = [f"{c[k] * 1e3:.1f}" if c.get(k) is not None else "" for k, _ in keys]
        per_op = ((c["region_s"] - plain_s) / c["ops"] * 1e6) if c.get("region_s") and c.get("ops") else None
        out.append(f"| {name} | " + " | ".join(cells) + f" | {'' if per_op is None else f'{per_op:.1f}'} |")
    return out


def cprofile_top(fn: Callable[[], None], path: str, top: int = 40) -> None:
    """Run ``fn`` once under cProfile and write the ``top`` functions by own time to ``path``."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    fn()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    Path(path).write_text(buf.getvalue())
