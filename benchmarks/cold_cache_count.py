"""What a large op does to the Python that runs after it: the capture's count-memo hit for a convolution, timed
right after the convolution ran (as the capture runs it), called again at once, and after touching 16 MB of other
memory. Thread CPU time, medians of 180 calls. On a CNN step (few ops, each megabytes of activations) the
interpreter's state is evicted by every op, so the per-op Python of a capture costs several times its warm figure;
torch.profiler's C++ record touches far less.

    OMP_NUM_THREADS=1 python benchmarks/cold_cache_count.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tscope_callbacks.capture.region import count_cache
from tscope_callbacks.formulas import DEFAULT_REGISTRY


def main() -> None:
    torch.set_num_threads(1)
    cc = count_cache(DEFAULT_REGISTRY)
    conv = torch.nn.Conv2d(16, 32, 3, padding=1, bias=False)
    x = torch.randn(32, 16, 32, 32)  # 2 MiB in, 4 MiB out: the CNN benchmark's first block
    other = torch.randn(4 * 1024 * 1024)  # 16 MiB
    res: dict[str, list[int]] = {"right after the convolution": [], "called again at once": [],
                                 "after touching 16 MiB": []}
    conv_op = torch.ops.aten.convolution.default

    def timed(key: str, func, args, kwargs, out) -> None:
        t = time.thread_time_ns()
        cc.count(func, args, kwargs, out)
        res[key].append(time.thread_time_ns() - t)

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is conv_op:
                timed("right after the convolution", func, args, kwargs or {}, out)
                timed("called again at once", func, args, kwargs or {}, out)
                other.mul_(1.0001)
                timed("after touching 16 MiB", func, args, kwargs or {}, out)
            return out

    for _ in range(200):
        with Mode(), torch.no_grad():
            conv(x)
    print(f"count-memo hit of aten.convolution (thread CPU µs, median of {len(res['called again at once']) - 20}):")
    for k, v in res.items():
        print(f"  {k:30s} {statistics.median(v[20:]) / 1e3:6.1f}")


if __name__ == "__main__":
    main()
