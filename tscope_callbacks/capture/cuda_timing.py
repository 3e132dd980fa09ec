"""CUDA op timing from torch.profiler kernel records (never host timers around asynchronous launches).

While a profile runs on CUDA, each recorded aten op is wrapped in a profiler range named ``tscope#<index>``; the
kernels launched inside it are attached by the profiler (correlation ids) to that range or its children. After
the region, :func:`kernel_times` reads the profiler's events and returns the device time per op index.

The pure function :func:`kernel_times` works on any objects shaped like ``torch.autograd.profiler_util``'s
``FunctionEvent`` (``name``, ``device_time_total`` or ``kernels``/``cpu_children``), so it is unit-tested with fakes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["RANGE_PREFIX", "kernel_times", "OpRangeProfiler"]

RANGE_PREFIX = "tscope#"


def _event_device_us(evt: Any) -> float:
    """Device time (µs) of an event including its children's kernels."""
    for attr in ("device_time_total", "cuda_time_total"):
        v = getattr(evt, attr, None)
        if v is not None:
            return float(v)
    # fall back: kernels attached to the event and its CPU children, recursively
    total = 0.0
    stack = [evt]
    while stack:
        e = stack.pop()
        for k in getattr(e, "kernels", ()) or ():
            total += float(getattr(k, "duration", 0.0))
        stack.extend(getattr(e, "cpu_children", ()) or ())
    return total


# Kernel-name fragments of NVIDIA/AMD matrix-unit kernels (cuBLAS/cuBLASLt/CUTLASS/cuDNN/hipBLASLt naming):
# HMMA/IMMA shapes (h884, h1688, s16816, i8816...), xmma/wgmma/tensorop/"gmma" families, flash-attention kernels
# (always MMA-based), and AMD MFMA. A kernel named only "gemm"/"sgemm" without these runs on the FP32 pipes.
_TC_PATTERNS = (
    "hmma", "imma", "xmma", "wgmma", "gmma", "tensorop", "h884", "h1688", "h16816", "s1688", "s16816", "i8816",
    "i16832", "bf16816", "tf32", "mma_", "_mma", "flash_fwd", "flash_bwd", "fmha", "mfma", "cutlass_80", "sm80_",
    "sm86_", "sm89_", "sm90_", "sm100_", "nvjet",
)


def is_tensor_core_kernel(name: str) -> bool:
    """True when a CUDA/ROCm kernel name is one of the matrix-unit (tensor core / MFMA) families."""
    n = name.lower()
    if "sgemm" in n and not any(p in n for p in ("tensorop", "xmma", "tf32")):
        return False
    return any(p in n for p in _TC_PATTERNS)


def _subtree_kernels(evt: Any) -> list[Any]:
    out: list[Any] = []
    stack = [evt]
    while stack:
        e = stack.pop()
        out.extend(getattr(e, "kernels", ()) or ())
        stack.extend(getattr(e, "cpu_children", ()) or ())
    return out


def _op_ranges(events: Iterable[Any], n_ops: int) -> Iterator[tuple[int, Any]]:
    """(op index, event) for each profiler event that is one of our ``tscope#<index>`` ranges."""
    for evt in events:
        name = getattr(evt, "name", "")
        if not name.startswith(RANGE_PREFIX):
            continue
        try:
            idx = int(name[len(RANGE_PREFIX) :])
        except ValueError:
            continue
        if 0 <= idx < n_ops:
            yield idx, evt


def tensor_core_flags(events: Iterable[Any], n_ops: int) -> list[bool | None]:
    """Per op index: True if any of its kernels ran on tensor cores, False if it launched kernels but none did,
    None when it launched no kernel (or has no range event)."""
    out: list[bool | None] = [None] * n_ops
    for idx, evt in _op_ranges(events, n_ops):
        ks = _subtree_kernels(evt)
        if ks:
            out[idx] = bool(out[idx]) or any(is_tensor_core_kernel(getattr(k, "name", "")) for k in ks)
    return out


def kernel_times(events: Iterable[Any], n_ops: int) -> list[float | None]:
    """Seconds of device time per op index, from profiler events named ``tscope#<index>``.

    Ops with no range event get ``None`` (not timed); ops whose range launched no kernel get 0.0 (views,
    metadata ops and host-only work really take no device time).
    """
    out: list[float | None] = [None] * n_ops
    for idx, evt in _op_ranges(events, n_ops):
        out[idx] = (out[idx] or 0.0) + _event_device_us(evt) * 1e-6
    return out


class OpRangeProfiler:
    """Owns the torch.profiler session and the per-op ranges for CUDA timing."""

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        self._prof = profile(activities=acts, record_shapes=False, profile_memory=False, with_stack=False)
        fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
        self._range = fast if fast is not None else torch.autograd.profiler.record_function

    def start(self) -> None:
        self._prof.__enter__()

    def op_range(self, index: int):
        return self._range(f"{RANGE_PREFIX}{index}")

    def stop(self, n_ops: int) -> list[float | None]:
        """Device seconds per op; ``self.tensor_core`` holds the per-op tensor-core flags afterwards."""
        torch.cuda.synchronize()
        self._prof.__exit__(None, None, None)
        events = self._prof.events()
        self.tensor_core = tensor_core_flags(events, n_ops)
        return kernel_times(events, n_ops)

    def abort(self) -> None:
        try:
            self._prof.__exit__(None, None, None)
        except Exception:
            pass
