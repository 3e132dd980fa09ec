"""CUDA op timing from torch.profiler kernel records (never host timers around asynchronous launches).

While a profile runs on CUDA, each recorded aten op is wrapped in a profiler range named ``tscope#<index>``; the
kernels launched inside it are attached by the profiler (correlation ids) to that range or its children. After
the region, :func:`kernel_times` reads the profiler's events and returns the device time per op index.

The pure function :func:`kernel_times` works on any objects shaped like ``torch.autograd.profiler_util``'s
``FunctionEvent`` (``name``, ``device_time_total`` or ``kernels``/``cpu_children``), so it is unit-tested with fakes.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def kernel_times(events: Iterable[Any], n_ops: int) -> list[float | None]:
    """Seconds of device time per op index, from profiler events named ``tscope#<index>``.

    Ops with no range event get ``None`` (not timed); ops whose range launched no kernel get 0.0 (views,
    metadata ops and host-only work really take no device time).
    """
    out: list[float | None] = [None] * n_ops
    for evt in events:
        name = getattr(evt, "name", "")
        if not name.startswith(RANGE_PREFIX):
            continue
        try:
            idx = int(name[len(RANGE_PREFIX) :])
        except ValueError:
            continue
        if 0 <= idx < n_ops:
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
        torch.cuda.synchronize()
        self._prof.__exit__(None, None, None)
        return kernel_times(self._prof.events(), n_ops)

    def abort(self) -> None:
        try:
            self._prof.__exit__(None, None, None)
        except Exception:
            pass
