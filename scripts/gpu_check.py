"""GPU verification of the CUDA code paths (run on a machine with a CUDA GPU; commit its output).

Checks, on a real GPU:
1. ``get_device_spec("auto")`` resolves the device name; ``calibrate()`` measures achievable roofs beside the datasheet.
2. CUDA op timing from profiler kernel records: every op timed, and the sum of kernel times vs the step's
   CUDA-event time (kernels cannot take longer than the step; the gap is launch/idle time).
3. Tensor-core detection: bf16 matmuls run on tensor cores; fp32 with TF32 off do not.
4. Per-layer CUDA allocator growth is recorded.
5. Roofline report (MFU, table) and the profiled-step cost as a ratio to a plain step.

    python scripts/gpu_check.py [--out benchmarks/results/gpu_check_<device>.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

import tscope_callbacks as ts
from tscope_callbacks.demo.model import GPTConfig, TinyGPT, matmul_flops, random_tokens


def cuda_time(fn, reps: int = 5) -> float:
    """Median seconds of ``fn`` by CUDA events (after one warm-up)."""
    fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run this on a GPU machine", file=sys.stderr)
        return 2
    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    name = torch.cuda.get_device_name()
    say(f"# GPU check: {name}\n\ntorch {torch.__version__}, CUDA {torch.version.cuda}\n")
    spec = ts.get_device_spec("auto")
    say(f"## 1. Device roofs\n\nresolved `{name}` -> **{spec.name}** (source: {spec.source})\n")
    cal = ts.calibrate(quick=True)
    ach = cal.achievable
    say("| precision | datasheet TFLOP/s | achievable TFLOP/s | % |\n|---|---:|---:|---:|")
    for p in ("bf16", "fp16", "tf32", "fp32"):
        try:
            d, a = spec.peak_flops(p), ach.peak_flops(p) if ach else float("nan")
            say(f"| {p} | {d / 1e12:.1f} | {a / 1e12:.1f} | {a / d:.0%} |")
        except Exception as e:
            say(f"| {p} | n/a ({e}) | | |")
    if ach:
        say(f"\nbandwidth: datasheet {spec.bandwidth / 1e12:.2f} TB/s, achievable {ach.bandwidth / 1e12:.2f} TB/s\n")

    cfg = GPTConfig(vocab_size=8192, seq_len=512, d_model=1024, n_layer=8, n_head=16)
    batch = 8
    torch.manual_seed(0)
    model = TinyGPT(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x, y = random_tokens(cfg, batch, device="cuda")

    def step(prof=None):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model.loss(x, y)
        loss.backward()
        if prof is not None:
            with prof.phase("optimizer"):
                opt.step()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    plain = cuda_time(step)
    holder = {}

    def prof_step():
        with ts.profile(model, layer_details=True) as prof:
            step(prof)
        holder["p"] = prof

    profd = cuda_time(prof_step, reps=3)
    prof = holder["p"]
    ops = prof.ops
    timed = sum(r.time_s is not None for r in ops)
    kern = sum(r.time_s or 0.0 for r in ops)
    say("## 2. CUDA op timing from kernel records\n")
    say(f"ops recorded {len(ops)}, timed {timed} ({timed / len(ops):.0%}); timing={prof.meta['timing']}")
    say(f"sum of op kernel times {kern * 1e3:.2f} ms vs plain step (CUDA events) {plain * 1e3:.2f} ms "
        f"-> kernels cover {kern / plain:.0%} of the step")
    fwd = sum(r.flops for r in ops if r.phase == "forward" and r.category == "matmul")
    say(f"forward matmul FLOPs {fwd:,} vs analytic {matmul_flops(cfg, batch)['total']:,}\n")

    say("## 3. Tensor-core detection\n")
    mm = [r for r in ops if r.category == "matmul" and r.dtype == "bfloat16"]
    say(f"bf16 matmul ops on tensor cores: {sum(r.tensor_core is True for r in mm)}/{len(mm)}")
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn(2048, 2048, device="cuda")
        lin = torch.nn.Linear(2048, 2048).cuda()
        with ts.profile(lin) as p32:
            lin(a)
        flags = [r.tensor_core for r in p32.ops if r.category == "matmul"]
        say(f"fp32 matmul with TF32 off, tensor-core flags: {flags} (expected False)")
        torch.backends.cuda.matmul.allow_tf32 = True
        with ts.profile(lin) as ptf:
            lin(a)
        say(f"fp32 matmul with TF32 on, tensor-core flags: {[r.tensor_core for r in ptf.ops if r.category == 'matmul']}\n")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev

    say("## 4. Per-layer CUDA memory\n")
    for path in ("", "blocks.0", "blocks.0.mlp", "head"):
        L = prof.layers.get(path)
        if L is not None:
            say(f"- `{path or '(root)'}`: fwd growth {L.memory_fwd_bytes / 2**20:.1f} MiB, "
                f"bwd {L.memory_bwd_bytes / 2**20:.1f} MiB, output {L.output_bytes / 2**20:.1f} MiB")

    say("\n## 5. Roofline and cost\n")
    report = ts.roofline(prof.result, spec)
    say(f"MFU {report.mfu:.1%} (bf16 peak {spec.peak_flops('bf16') / 1e12:.0f} TFLOP/s), profiled step "
        f"{profd * 1e3:.1f} ms vs plain {plain * 1e3:.1f} ms -> ratio {profd / plain:.2f}\n")
    say(report.to_markdown(top=15))
    out = Path(args.out or f"benchmarks/results/gpu_check_{spec.name.replace(' ', '_').replace('/', '-')}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
