"""``tscope calibrate --gemm``: measure this GPU's GEMM efficiency table, the one ``devices.efficiency`` predicts
GEMM kernel times from.

Each shape is timed as a CUDA graph of back-to-back ``torch.mm(a, b, out=c)`` calls, replayed between CUDA events:
the per-call time is the kernel alone, as GEMMs run inside a training step (no host dispatch in the figure, unlike
the packaged tables' one-call-between-events timing, so the table's ``gemm_delta_s`` is 0). Shapes: the GEMMs of
LLM layers (hidden 768-8192, MLP 3072-14336, vocabularies 50257/50304/128256) at 16-8192 rows, plus the misaligned
neighbours (4095, 50257) that take cuBLAS's slow paths; ``quick`` measures a third of them.

The table is cached per device (``gemm_tables.json`` in the roof cache directory) and used from then on for that
device in place of the packaged or scaled table (``efficiency.build_model``). ``timer`` replaces the CUDA timer
(tests).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from tscope_callbacks.devices.cache import GEMM_CACHE, cache_dir, cache_put, cached_gemm_table, gemm_cache_key
from tscope_callbacks.devices.efficiency import MIN_KERNEL_S, fit_gemm, forget
from tscope_callbacks.rng import rng_preserving

__all__ = ["gemm_shapes", "cuda_graph_gemm_timer", "measure_gemm_table", "cached_gemm_table", "loo_summary",
           "GEMM_CACHE", "cached_gemm_table"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
#: (N, K) of LLM layers: attention in/out projections, MLPs, LM heads (aligned and not)
_NK = [(768, 768), (2304, 768), (3072, 768), (768, 3072), (1024, 1024), (4096, 4096), (12288, 4096), (14336, 4096),
       (4096, 14336), (8192, 8192), (50257, 768), (50304, 768), (768, 50257), (4095, 4096), (4096, 4095),
       (128256, 4096)]
_M = [16, 128, 512, 2048, 8192]
_QUICK_NK = [(768, 768), (3072, 768), (768, 3072), (4096, 4096), (14336, 4096), (50257, 768), (50304, 768),
             (4095, 4096)]


def gemm_shapes(quick: bool = False) -> list[tuple[int, int, int]]:
    """(M, N, K) to measure: every LLM (N, K) at 16..8192 rows (quick: 128, 2048, 8192 rows, 8 (N, K) pairs, the
    aligned/misaligned lm_head and K=4095/4096 among them)."""
    ms = [128, 2048, 8192] if quick else _M
    nk = list(dict.fromkeys(_QUICK_NK)) if quick else _NK
    return [(m, n, k) for m in ms for n, k in nk]


def cuda_graph_gemm_timer(device: int = 0, calls: int = 20, reps: int = 5) -> Callable[[int, int, int, str], float]:
    """Seconds per kernel of an (M x K) @ (K x N) GEMM: median over ``reps`` replays of a CUDA graph of ``calls``
    back-to-back ``torch.mm`` calls, timed with CUDA events."""

    def timer(m: int, n: int, k: int, precision: str) -> float:
        dt = _DTYPES[precision]
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        try:
            with torch.cuda.device(device):
                a = torch.randn(m, k, device="cuda", dtype=dt)
                b = torch.randn(k, n, device="cuda", dtype=dt)
                c = torch.empty(m, n, device="cuda", dtype=dt)
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):  # warm-up off the capture: cuBLAS picks its kernel and workspace
                    for _ in range(3):
                        torch.mm(a, b, out=c)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(calls):
                        torch.mm(a, b, out=c)
                g.replay()
                torch.cuda.synchronize()
                times = []
                for _ in range(reps):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    g.replay()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) / 1e3 / calls)
                del g, a, b, c
                torch.cuda.empty_cache()
                return statistics.median(times)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev

    return timer


@rng_preserving  # random operands on the GPU
def measure_gemm_table(spec: Any, *, quick: bool = False, precisions: tuple[str, ...] = ("bf16",),
                       timer: Callable[[int, int, int, str], float] | None = None, device: int = 0,
                       cache: bool = True, progress: Callable[[str], None] | None = None, sdpa: bool = True,
                       sdpa_timer: Any = None, memory: bool = True, memory_timer: Any = None) -> dict[str, Any]:
    """Measure the GEMM table of the GPU ``spec`` describes (``spec``: its resolved DeviceSpec), fit the analytic
    parameters to it, and (``sdpa``) the fused-attention kernel times per backend (``devices.sdpa_table``) and
    (``memory``) the memory-bound ops' kernel times per size (``devices.memory_table``); cache it (``cache=True``)
    and return it (``efficiency`` table format). SDPA and memory-bound ops are measured through ``sdpa_timer`` /
    ``memory_timer`` when given: the kernel timers run the capture (``capture.kernel_timers``), a layer above this
    one, so the caller hands them in (``tscope calibrate --gemm`` does), or fakes in tests."""
    if timer is None:
        if not torch.cuda.is_available():
            raise RuntimeError("calibrate --gemm needs a CUDA GPU (none is visible to torch here)")
        timer = cuda_graph_gemm_timer(device)
        measured_on, sms = torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).multi_processor_count
    else:
        measured_on, sms = spec.name, None
    gemm: dict[str, list] = {}
    params: dict[str, list] = {}
    shapes = gemm_shapes(quick)
    for prec in precisions:
        if prec not in _DTYPES:
            raise ValueError(f"calibrate --gemm: precision {prec!r} not one of {sorted(_DTYPES)}")
        rows = []
        for i, (m, n, k) in enumerate(shapes):
            t = float(timer(m, n, k, prec))
            if not t > 0:
                raise RuntimeError(f"calibrate --gemm: {m}x{k} @ {k}x{n} {prec} timed {t!r} s")
            rows.append([m, n, k, max(t, MIN_KERNEL_S)])
            if progress is not None and (i + 1) % 10 == 0:
                progress(f"  {prec}: {i + 1}/{len(shapes)} shapes")
        gemm[prec] = rows
        peak = spec.flops.get(prec) or spec.vector_flops.get(prec) or spec.flops.get("bf16")
        params[prec] = fit_gemm([tuple(r) for r in rows], prec, float(peak), float(spec.bandwidth), sms or 132)
    table = {"version": 1, "device": spec.name, "measured_on": measured_on, "gemm_delta_s": 0.0, "sms": sms,
             "timing": "cuda-graph", "gemm": gemm, "gemm_params": params,
             "source": f"tscope calibrate --gemm on {measured_on} (torch {torch.__version__}): {len(shapes)} shapes "
                       f"per precision, CUDA-graph replays of back-to-back calls"}
    if sdpa and sdpa_timer is not None:
        from tscope_callbacks.devices.sdpa_table import measure_sdpa_rows

        table["sdpa"] = measure_sdpa_rows(sdpa_timer, quick=quick, progress=progress)
        table["sdpa_timing"] = "kernels"
        table["source"] += f"; SDPA: {len(table['sdpa'])} backend configurations, kernel time from the profiler"
    if memory and memory_timer is not None:
        from tscope_callbacks.devices.memory_table import measure_memory_rows

        table["memory_ops"], table["memory_op_class"] = measure_memory_rows(memory_timer, quick=quick,
                                                                            progress=progress)
        table["memory_timing"] = "kernels"
        table["source"] += f"; memory-bound: {len(table['memory_ops'])} ops, kernel time from the profiler"
    if cache:
        cache_put(cache_dir() / GEMM_CACHE, gemm_cache_key(spec.name), table)
        forget(spec.name)
    return table


def loo_summary(model: Any, precision: str = "bf16") -> dict[str, float]:
    """Leave-one-out accuracy of a kernel model's GEMM table: median relative error, share of kernels over 20 us
    within 1.3x, time-weighted error."""
    import math

    loo = model.gemm_loo(precision)
    if not loo:
        return {}
    errs = sorted(abs(math.log(p / t)) for *_, t, p in loo)
    big = [abs(math.log(p / t)) < math.log(1.3) for *_, t, p in loo if t > 20e-6]
    return {"shapes": float(len(loo)), "median_error": math.exp(statistics.median(errs)) - 1,
            "within_1_3x": sum(big) / len(big) if big else float("nan"),
            "time_weighted_error": sum(abs(p - t) for *_, t, p in loo) / sum(t for *_, t, _ in loo)}
