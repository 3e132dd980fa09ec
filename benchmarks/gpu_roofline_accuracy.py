"""Estimates vs measured kernel time on the GPU workload (GPT-2 124M, batch 8x1024, bf16 autocast, fused AdamW).

One training step is profiled with ``ts.profile`` (per-op kernel time from the profiler's kernel records). Per op
class: measured / roofline bound (the datasheet roof) and measured / expected (the shape-aware kernel model,
``devices.efficiency``); the whole step: sum of expected kernel times vs the device-busy time. Then
``analyze_model`` on meta (no GPU work: the estimate a user gets before training) is compared with the measured
forward and step. Targets (issue "Estimates and advice"): measured/expected within 1.3x for matmul, attention and
the whole step; the meta forward within 1.3x of the measured forward.

    python benchmarks/roofline_accuracy.py --gpu [--write]    # on a CUDA GPU
    python benchmarks/roofline_accuracy.py --smoke            # exercise the code on CPU (numbers mean nothing)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import gpt2, write
from gpu_workload import FULL, SMOKE, device_for, ready

import tscope_callbacks as ts

TARGET = 1.3


def _within(x: float | None) -> bool:
    return x is not None and 1 / TARGET <= x <= TARGET


def run(smoke: bool, write_out: bool) -> int:
    w = SMOKE if smoke else FULL
    device = device_for(smoke)
    cuda = device == "cuda"
    model, step = ready(w, device)
    with ts.profile(model) as prof:
        step()
    spec = ts.get_device_spec("auto") if cuda else ts.get_device_spec("h100")  # smoke: any GPU spec
    rep = ts.roofline(prof.result, spec)
    name = torch.cuda.get_device_name() if cuda else "CPU smoke run"
    lines = [f"# Estimates vs measured kernel time ({name}, torch {torch.__version__})", "",
             f"GPT-2 {w.n_layer}x{w.d}, vocab {w.vocab}, batch {w.batch}x{w.seq}, bf16 autocast, fused AdamW; one "
             f"profiled step; kernel model: {rep.summary.kernel_model or 'none'}.", "",
             "| op class | ops | measured ms | roof ms | expected ms | measured / roof | measured / expected |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    ratios = {}
    for c in rep.rows["category"]:
        ratios[c.name] = c.expected_ratio
        f = lambda x: "" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"| {c.name} | {c.n_ops} | {f((c.measured_s or 0) * 1e3)} | "
                     f"{f(c.estimate_s * 1e3)} | {f(c.expected_s * 1e3)} | {f(c.ratio)} | "
                     f"{f(c.expected_ratio)} |")
    busy = rep.profile.info.device_busy_s or rep.summary.op_time_s or 0.0
    step_ratio = busy / rep.summary.estimated_step_s if rep.summary.estimated_step_s else None
    fwd_meas = sum(o.time_s or 0.0 for o in rep.ops if o.phase == "forward")
    with torch.device("meta"):
        meta_model = gpt2(w.n_layer, w.d, w.heads, w.vocab, max(w.seq, 64), device="meta")
    est = ts.analyze_model(meta_model, input_shape=[(w.batch, w.seq)], gpu=spec, precision="bf16-mixed",
                           backward=True, optimizer="adamw-fused")  # the workload's update: fused AdamW
    expected = lambda phase: sum(o.expected_s for o in est.ops if o.phase == phase)  # noqa: E731
    fwd_est = expected("forward")
    fwd_ratio = fwd_meas / fwd_est if fwd_est else None
    meta_step_ratio = busy / est.summary.estimated_step_s if est.summary.estimated_step_s else None
    checks = [("matmul measured / expected", ratios.get("matmul")),
              ("attention measured / expected", ratios.get("attention")),
              ("whole step: device-busy / sum of expected", step_ratio),
              ("meta forward (analyze_model, bf16-mixed): measured / estimated", fwd_ratio),
              ("meta whole step (analyze_model with optimizer=\"adamw-fused\"): device-busy / estimated",
               meta_step_ratio)]
    lines += ["", f"- step: device busy {busy * 1e3:.2f} ms, sum of expected {rep.summary.estimated_step_s * 1e3:.2f} ms, "
              f"roofline bound {rep.summary.roof_step_s * 1e3:.2f} ms",
              f"- forward: measured {fwd_meas * 1e3:.2f} ms; analyze_model on meta {fwd_est * 1e3:.2f} ms "
              f"(+ backward {expected('backward') * 1e3:.2f} ms)", ""]
    ok = True
    for label, r in checks:
        good = _within(r)
        ok &= good
        lines.append(f"- {label} = **{'n/a' if r is None else f'{r:.2f}'}** (target within {TARGET}x): "
                     f"{'PASS' if good else 'FAIL'}")
    # per GEMM of the LM head (misaligned vocabulary: the weight gradient reads grad_output.t(), leading dim 50257)
    lines += ["", "| lm_head GEMM | phase | leading dims | measured ms | expected ms | measured / expected |",
              "|---|---|---|---:|---:|---:|"]
    for o, r in zip(rep.ops, rep.profile.ops):  # the report's op on its roof, and its record
        if r.layer == "lm_head" and r.category == "matmul" and r.time_s and o.expected_s:
            shapes = " @ ".join("x".join(map(str, sh)) for sh in r.input_shapes if len(sh) == 2)
            lines.append(f"| {shapes} | {r.phase} | {r.leading_dims} | {r.time_s * 1e3:.3f} | "
                         f"{o.expected_s * 1e3:.3f} | {r.time_s / o.expected_s:.2f} |")
    # per aten op of the memory-bound classes: the split the class totals hide (layer_norm forward vs backward, ...)
    per: dict[tuple[str, str, str], list[float]] = {}
    for o, r in zip(rep.ops, rep.profile.ops):
        if r.category in ("norm", "softmax", "reduction", "embedding", "loss", "memory", "pointwise", "optimizer") \
                and r.time_s is not None and o.expected_s:
            acc = per.setdefault((r.category, r.op, r.phase), [0, 0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += r.time_s
            acc[2] += o.expected_s
            acc[3] += r.bytes
    lines += ["", "| class | op | phase | ops | MB | measured ms | expected ms | measured / expected |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for (cat, name, phase), (n, meas, exp, nbytes) in sorted(per.items(), key=lambda kv: -kv[1][1])[:25]:
        lines.append(f"| {cat} | {name} | {phase} | {n} | {nbytes / 1e6:.0f} | {meas * 1e3:.3f} | {exp * 1e3:.3f} | "
                     f"{meas / exp:.2f} |")
    opps = rep.opportunities[:3]
    lines += ["", "Top opportunities:", ""] + [f"{i}. `{o.layer or '(root)'}` {o.kind}: saves "
                                             f"{(o.saving_s or 0) * 1e3:.2f} ms" for i, o in enumerate(opps, 1)]
    text = "\n".join(lines)
    print(text)
    if write_out and cuda:
        write("roofline_accuracy_gpu.md", text, "python benchmarks/roofline_accuracy.py --gpu --write")
    return 0 if ok else 1
