"""What ``tscope calibrate --gemm``'s kernel-time timers share (``sdpa_table``, ``memory_table``): run a call twice
to warm it up, then capture it ``reps`` times, and hand back each capture's op records (on CUDA their times are
kernel time from the profiler; on the CPU, for tests, op wall times)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["captured_runs"]


def captured_runs(run: Callable[[], None], dev: torch.device, reps: int) -> list[list[Any]]:
    """The op records of ``reps`` captures of ``run`` on ``dev``, after two warm-up calls. Errors (an out-of-memory,
    a backend without a kernel) propagate to the timer, which leaves the configuration out."""
    import tscope_callbacks as ts

    anchor = torch.nn.Linear(1, 1).to(dev)  # a capture is timed on its module's device
    for _ in range(2):
        run()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    out = []
    for _ in range(reps):
        with ts.profile(anchor) as prof:
            run()
        out.append(prof.ops)
    return out
