"""Kernel timers of ``tscope calibrate --gemm``'s SDPA and memory-bound tables (``devices.sdpa_table``,
``devices.memory_table``): run a call twice to warm it up, then capture it ``reps`` times with :func:`profile` and
read each capture's op records (on CUDA their times are kernel time from the profiler; on the CPU, for tests, op
wall times). They live in the capture layer because they run the capture; the tables below take them as
arguments."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from tscope_callbacks.capture.profile import profile
from tscope_callbacks.devices.memory_table import MEMORY_CASES, PRECISIONS
from tscope_callbacks.devices.memory_table import Timer as MemoryTimer
from tscope_callbacks.devices.sdpa_table import Timer as SdpaTimer
from tscope_callbacks.formulas.kernel_bytes import kernel_bytes
from tscope_callbacks.records import MEMORY_CATEGORIES

__all__ = ["captured_runs", "kernel_sdpa_timer", "kernel_memory_timer"]


def captured_runs(run: Callable[[], None], dev: torch.device, reps: int) -> list[list[Any]]:
    """The op records of ``reps`` captures of ``run`` on ``dev``, after two warm-up calls. Errors (an out-of-memory,
    a backend without a kernel) propagate to the timer, which leaves the configuration out."""
    anchor = torch.nn.Linear(1, 1).to(dev)  # a capture is timed on its module's device
    for _ in range(2):
        run()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    out = []
    for _ in range(reps):
        with profile(anchor) as prof:
            run()
        out.append(prof.ops)
    return out


def kernel_sdpa_timer(device: int = 0, reps: int = 3, device_type: str = "cuda") -> SdpaTimer:
    """``timer(backend, B, H, T, D, causal) -> (forward s, backward s)``: the attention ops' kernel time of one
    forward + backward under a capture (median of ``reps``), or None when the backend cannot run it.
    (``device_type="cpu"`` runs the same code on the CPU, op wall times: for tests.)"""
    cuda = device_type == "cuda"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def timer(backend: str, b: int, h: int, t: int, d: int, causal: bool) -> tuple[float, float] | None:
        dev = torch.device("cuda", device) if cuda else torch.device("cpu")
        dtype = torch.bfloat16 if cuda else torch.float32
        q, k, v = (torch.randn(b, h, t, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
        g = torch.randn(b, h, t, d, device=dev, dtype=dtype)

        def run() -> None:
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)

        try:
            with sdpa_kernel([getattr(SDPBackend, backend)]):
                captures = captured_runs(run, dev, reps)
        except RuntimeError:  # no kernel of this backend for the configuration (head dim, GPU generation, ...)
            return None
        fwd, bwd = [], []
        for ops in captures:
            ops = [r for r in ops if r.category == "attention" and r.time_s]
            fwd.append(sum(r.time_s for r in ops if r.phase == "forward"))
            bwd.append(sum(r.time_s for r in ops if r.phase == "backward"))
        f, w = statistics.median(fwd), statistics.median(bwd)
        return (f, w) if f > 0 and w > 0 else None

    return timer


def kernel_memory_timer(device: int = 0, reps: int = 3, device_type: str = "cuda") -> MemoryTimer:
    """``timer(case, numel, precision) -> [(op, op class, kernel bytes, seconds), ...]``: every memory-bound op of
    one call of the case under a capture, with its kernel time (median of ``reps``); None when it cannot run (out of
    memory, no kernel for the dtype).
    (``device_type="cpu"``: the same code on the CPU, op wall times, for tests.)"""
    cuda = device_type == "cuda"

    def timer(case: str, numel: int, precision: str) -> list[tuple[str, str, int, float]] | None:
        dev = torch.device("cuda", device) if cuda else torch.device("cpu")
        try:
            captures = captured_runs(MEMORY_CASES[case](numel, PRECISIONS[precision], dev), dev, reps)
        except RuntimeError:  # out of memory, or no kernel for this dtype here: the case is left out
            return None
        finally:
            if cuda:
                torch.cuda.empty_cache()
        samples = [[(r.op, r.category, kernel_bytes(r), r.time_s) for r in ops
                    if r.category in MEMORY_CATEGORIES and r.time_s and r.bytes] for ops in captures]
        if not samples or any(len(s) != len(samples[0]) for s in samples):
            return None
        return [(op, cat, nbytes, statistics.median(s[i][3] for s in samples))
                for i, (op, cat, nbytes, _) in enumerate(samples[0])]

    return timer
