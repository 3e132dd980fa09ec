"""``tscope calibrate --gemm`` also measures fused attention: the SDPA part of this GPU's efficiency table, timed
as a training step sees it.

The packaged tables time one SDPA call between CUDA events, which adds the call's host work to the figure: on the
H100 a cuDNN forward at (8, 12, 1024, 64) read 0.084 ms causal and 0.087 ms full (twice the work), i.e. mostly
host, and the GPT-2 step's attention kernels ran at 0.75x the time those figures predict. Here each configuration
runs forward and backward under ``ts.profile`` and the figure is the attention ops' **kernel time** from the
profiler's kernel records, the very basis the roofline report compares estimates with. Per backend (flash, cuDNN,
memory-efficient; one that cannot run a configuration is skipped), bf16, causal and not.

Rows have the packaged table's format (``[backend, B, H, T, D, causal, fwd_s, bwd_s]``) and the table says
``"sdpa_timing": "kernels"``, so the model subtracts no host time from them. ``timer``: the kernel timer
(``capture.kernel_timers``, which runs the capture), or a fake in tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SDPA_BACKENDS", "sdpa_configs", "measure_sdpa_rows"]

SDPA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
#: (B, H, T, D): GPT-2/Llama-like heads at 256-8192 tokens, the packaged sweep's grid
_CONFIGS = [(8, 12, 1024, 64), (4, 16, 2048, 64), (2, 32, 4096, 128), (8, 32, 1024, 128), (16, 8, 512, 64),
            (1, 32, 8192, 128), (4, 12, 1024, 64), (8, 16, 256, 64)]
_QUICK = [(8, 12, 1024, 64), (4, 16, 2048, 64), (8, 32, 1024, 128), (16, 8, 512, 64)]

Timer = Callable[[str, int, int, int, int, bool], "tuple[float, float] | None"]


def sdpa_configs(quick: bool = False) -> list[tuple[int, int, int, int, bool]]:
    """(B, H, T, D, causal) to measure per backend."""
    return [(*c, causal) for c in (_QUICK if quick else _CONFIGS) for causal in (True, False)]


def measure_sdpa_rows(timer: Timer, *, quick: bool = False,
                      progress: Callable[[str], None] | None = None) -> list[list[Any]]:
    """``[backend, B, H, T, D, causal, fwd_s, bwd_s]`` per backend and configuration that runs."""
    rows: list[list[Any]] = []
    for backend in SDPA_BACKENDS:
        for b, h, t, d, causal in sdpa_configs(quick):
            got = timer(backend, b, h, t, d, causal)
            if got is not None:
                rows.append([backend, b, h, t, d, causal, float(got[0]), float(got[1])])
        if progress is not None:
            progress(f"  SDPA {backend}: {sum(r[0] == backend for r in rows)} configurations")
    return rows
