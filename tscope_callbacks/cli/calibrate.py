"""``tscope calibrate``: measure this machine's achievable roofs and show them beside the datasheet."""

from __future__ import annotations

import argparse
import json
import sys

from tscope_callbacks.analysis.fmt import bw_text, bytes_text, pct_text, rate_text, time_text
from tscope_callbacks.devices.calibrate import calibrate
from tscope_callbacks.render.text import calibration_table

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default=None, metavar="DEVICE",
                   help="cpu, cuda or cuda:N (default auto: the current GPU, else the CPU)")
    p.add_argument("--quick", action="store_true", help="smaller, faster measurements")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--no-cache", action="store_true", help="measure again even when a cached result exists")
    p.add_argument("--gemm", action="store_true",
                   help="also measure this GPU's GEMM efficiency table (CUDA-graph timed LLM shapes, aligned and "
                        "not) and its fused-attention kernel times per SDPA backend (kernel time from the profiler); "
                        "cached and used from then on for shape-aware estimates on this device")
    p.add_argument("--gemm-precision", action="append", default=None, choices=["bf16", "fp16", "tf32", "fp32"],
                   help="precision(s) of the GEMM table (repeat; default bf16)")


def run(args: argparse.Namespace) -> int:
    gpu = args.gpu
    try:
        spec = calibrate(gpu, quick=args.quick, cache=not args.no_cache)
    except (ValueError, RuntimeError) as e:
        print(f"tscope calibrate: {e}", file=sys.stderr)
        return 2
    if args.json and not args.gemm:
        print(json.dumps(spec.to_dict(), indent=2))
    elif not args.json:
        print(calibration_table(spec))
    if args.gemm:
        return _gemm(args, spec)
    return 0


def _gemm(args: argparse.Namespace, spec) -> int:
    from tscope_callbacks.capture.kernel_timers import kernel_memory_timer, kernel_sdpa_timer
    from tscope_callbacks.devices.cache import cache_dir
    from tscope_callbacks.devices.efficiency import build_model
    from tscope_callbacks.devices.gemm_table import GEMM_CACHE, loo_summary, measure_gemm_table

    if getattr(spec, "measured", False) and getattr(spec, "vendor", "") == "cpu":
        print("tscope calibrate --gemm: needs a CUDA GPU (this is a CPU roof); the GEMM model is for GPU libraries",
              file=sys.stderr)
        return 2
    precs = tuple(args.gemm_precision or ["bf16"])
    try:
        table = measure_gemm_table(spec, quick=args.quick, precisions=precs, cache=True,
                                   progress=None if args.json else print, sdpa_timer=kernel_sdpa_timer(),
                                   memory_timer=kernel_memory_timer())
    except (RuntimeError, ValueError) as e:
        print(f"tscope calibrate: {e}", file=sys.stderr)
        return 2
    model = build_model(spec, table={**table, "delta_s": 0.0})
    summary = {p: loo_summary(model, p) for p in precs}
    if args.json:
        print(json.dumps({"spec": spec.to_dict(), "gemm_table": table, "leave_one_out": summary}, indent=2))
        return 0
    print(f"\nGEMM table of {table['measured_on']}: {sum(len(v) for v in table['gemm'].values())} kernels "
          f"({table['timing']} timing)")
    for p, s in summary.items():
        if s:
            print(f"  {p}: leave-one-out median error {pct_text(s['median_error'])}, {pct_text(s['within_1_3x'])} of kernels "
                  f"over 20 us within 1.3x, time-weighted error {pct_text(s['time_weighted_error'])}")
    rows = {(m, n, k): t for m, n, k, t in table["gemm"].get("bf16", [])}
    for a, b in (((8192, 50257, 768), (8192, 50304, 768)), ((8192, 4095, 4096), (8192, 4096, 4096))):
        if a in rows and b in rows:
            tf = lambda d: 2 * d[0] * d[1] * d[2] / rows[d]  # noqa: E731
            print(f"  bf16 {a[0]}x{a[2]} @ {a[2]}x{a[1]}: {rate_text(tf(a))} vs N={b[1]}: {rate_text(tf(b))}")
    for backend in sorted({r[0] for r in table.get("sdpa", [])}):
        got = [r for r in table["sdpa"] if r[0] == backend]
        ref = next((r for r in got if tuple(r[1:6]) == (8, 12, 1024, 64, True)), got[0])
        print(f"  SDPA {backend}: {len(got)} configurations; ({', '.join(map(str, ref[1:5]))}) "
              f"{'causal' if ref[5] else 'full'}: forward {time_text(ref[6])}, backward {time_text(ref[7])} "
              f"(kernel time)")
    mem = table.get("memory_ops", {})
    if mem:
        print(f"  memory-bound: {len(mem)} ops timed as kernels, e.g. (at the largest size measured):")
        for op in ("aten.native_layer_norm_backward", "aten.sum", "aten.embedding_dense_backward", "aten.add"):
            rows = mem.get(op, {}).get("bf16") or mem.get(op, {}).get("fp32")
            if rows:
                b, t = rows[-1]
                print(f"    {op}: {bytes_text(b)} in {time_text(t)} = {bw_text(b / t)}")
    print(f"cached in {cache_dir() / GEMM_CACHE}; reports for {spec.name} now use it")
    return 0
