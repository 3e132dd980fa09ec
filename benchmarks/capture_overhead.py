"""Capture overhead: one training step of a small transformer LM on CPU, plain vs under ``ts.profile``.

Same process, alternating order, median of several runs; torch.profiler (record_shapes, profile_memory,
with_flops) and FlopCounterMode on the same step for comparison. Target: profile/plain <= 1.15.

    python benchmarks/capture_overhead.py [--runs 7] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import tscope_callbacks as ts
from tscope_callbacks.demo.model import GPTConfig, TinyGPT, matmul_flops, random_tokens

CFG = GPTConfig(vocab_size=512, seq_len=128, d_model=256, n_layer=4, n_head=4)
BATCH = 16


def make():
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = random_tokens(CFG, BATCH)
    return model, opt, x, y


def step(model, opt, x, y, prof=None):
    loss = model.loss(x, y)
    loss.backward()
    if prof is not None:
        with prof.phase("optimizer"):
            opt.step()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/capture_overhead.md")
    args = ap.parse_args()
    model, opt, x, y = make()
    for _ in range(3):
        step(model, opt, x, y)

    def plain():
        step(model, opt, x, y)

    last = {}

    def tscope():
        with ts.profile(model) as prof:
            step(model, opt, x, y, prof)
        last["prof"] = prof

    def torch_prof():
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_flops=True):
            step(model, opt, x, y)

    def flop_counter():
        with FlopCounterMode(display=False):
            step(model, opt, x, y)

    contenders = {"plain step": plain, "tscope profile": tscope, "torch.profiler (shapes+memory+flops)": torch_prof,
                  "FlopCounterMode": flop_counter}
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for fn in contenders.values():  # warm each path once
        fn()
    for i in range(args.runs):
        order = list(contenders.items())
        if i % 2:
            order.reverse()
        for name, fn in order:
            times[name].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    prof = last["prof"]
    ana = matmul_flops(CFG, BATCH)["total"]
    fwd_mm = sum(r.flops for r in prof.ops if r.phase == "forward" and r.category == "matmul")
    lines = [
        f"# Capture overhead (CPU, torch {torch.__version__}, {torch.get_num_threads()} threads)",
        "",
        f"Model: TinyGPT d_model={CFG.d_model} n_layer={CFG.n_layer} seq={CFG.seq_len} batch={BATCH}; "
        f"one AdamW training step; median of {args.runs} runs, alternating order, one process.",
        "",
        "| run | median step s | ratio to plain |",
        "|---|---:|---:|",
    ]
    for k, v in med.items():
        lines.append(f"| {k} | {v:.4f} | {v / med['plain step']:.3f} |")
    lines += [
        "",
        f"tscope recorded {len(prof.ops)} ops; forward matmul FLOPs {fwd_mm:,} vs analytic {ana:,} "
        f"({'exact' if fwd_mm == ana else 'MISMATCH'}); FLOP coverage of op time {prof.coverage():.1%}; "
        f"region wall time not inside any op: {prof.result.uncovered_time_share():.1%}.",
    ]
    ratio = med["tscope profile"] / med["plain step"]
    lines.append(f"\n**tscope/plain = {ratio:.3f}** (target <= 1.15): {'PASS' if ratio <= 1.15 else 'FAIL'}")
    text = "\n".join(lines)
    print(text)
    if args.write:
        out = Path(__file__).parent / "results" / "capture_overhead.md"
        out.write_text(text + "\n\nReproduce: `python benchmarks/capture_overhead.py --write`\n")
        print(f"written {out}")
    return 0 if ratio <= 1.15 else 1


if __name__ == "__main__":
    sys.exit(main())
