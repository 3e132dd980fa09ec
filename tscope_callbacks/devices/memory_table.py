"""``tscope calibrate --gemm`` also measures memory-bound ops: per op, the bandwidth its kernels reach at each size,
as a training step sees it.

The packaged tables time one call between CUDA events. Up to 32 MB on an H100 that time is the op's host dispatch
(add 22 µs, layer_norm 42 µs), so the kernel model can use only their largest rows; and they cover six op kinds,
forward only. Here each case (a memory-bound pattern of a training step, forward and backward) runs under
``ts.profile``, and every memory-bound op's **kernel time** from the profiler's kernel records is paired with the
bytes its kernels move (``formulas.kernel_bytes``). That covers ops no sweep measured: layer_norm's backward, the
bias gradient's column sum, the embedding's sort-based backward, log-softmax and nll_loss over a vocabulary, dtype
casts.

Rows: ``table["memory_ops"][op][dtype] = [[kernel bytes, seconds], ...]``, ``table["memory_op_class"][op]`` its op
class, and ``"memory_timing": "kernels"``. The kernel model predicts an op that has rows from its own curve, and
any other op of a measured class from that class's rows (``KernelModel.memory_s``): on a GPU without a packaged
table, every memory-bound op then follows this GPU's measurements rather than the H100's scaled. ``timer``: the kernel timer
(``capture.kernel_timers``, which runs the capture), or a fake in tests.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["MEMORY_CASES", "PRECISIONS", "LOSS_ROWS", "memory_sizes", "measure_memory_rows"]

_VOCAB, _WIDTH = 50257, 768  #: GPT-2's vocabulary and width: the shapes of its loss and embedding
Run = Callable[[], None]


def _leaf(shape: tuple[int, ...], dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    return torch.randn(shape, device=dev, dtype=dtype, requires_grad=True)


def _rows(numel: int, width: int) -> int:
    return max(1, numel // width)


def _add(n: int, dt: torch.dtype, dev: torch.device) -> Run:
    a, b = (torch.randn(n, device=dev, dtype=dt) for _ in range(2))

    def run() -> None:
        a.add(b)

    return run


def _gelu(n: int, dt: torch.dtype, dev: torch.device) -> Run:
    x, g = _leaf((n,), dt, dev), torch.randn(n, device=dev, dtype=dt)
    return lambda: F.gelu(x).backward(g)


def _layer_norm(n: int, dt: torch.dtype, dev: torch.device) -> Run:
    m = _rows(n, _WIDTH)
    x, g = _leaf((m, _WIDTH), dt, dev), torch.randn(m, _WIDTH, device=dev, dtype=dt)
    w, b = _leaf((_WIDTH,), dt, dev), _leaf((_WIDTH,), dt, dev)
    return lambda: F.layer_norm(x, (_WIDTH,), w, b).backward(g)


def _softmax(n: int, dt: torch.dtype, dev: torch.device) -> Run:
    m = _rows(n, 1024)
    x, g = _leaf((m, 1024), dt, dev), torch.randn(m, 1024, device=dev, dtype=dt)
    return lambda: F.softmax(x, dim=-1).backward(g)


def _cross_entropy(n: int, dt: torch.dtype, dev: torch.device) -> Run:
    m = _rows(n, _VOCAB)
    x, t = _leaf((m, _VOCAB), dt, dev), torch.randint(0, _VOCAB, (m,), device=dev)
    return lambda: F.cross_entropy(x, t).backward()


def _bias_grad(n: int, dt: torch.dtype, dev: torch.device) -> Run:
    x = torch.randn(_rows(n, _WIDTH), _WIDTH, device=dev, dtype=dt)

    def run() -> None:
        x.sum(0)

    return run


def _cast(n: int, dt: torch.dtype, dev: torch.device) -> Run:
    x = torch.randn(n, device=dev, dtype=dt)
    other = torch.float32 if dt != torch.float32 else torch.bfloat16

    def run() -> None:
        x.to(other)
        x.clone()

    return run


def _embedding(n: int, dt: torch.dtype, dev: torch.device) -> Run:
    w, ids = _leaf((_VOCAB, _WIDTH), dt, dev), torch.randint(0, _VOCAB, (_rows(n, _WIDTH),), device=dev)
    g = torch.randn(ids.numel(), _WIDTH, device=dev, dtype=dt)
    return lambda: F.embedding(ids, w).backward(g)


#: case -> builder(numel, dtype, device) of one forward (+ backward) call
MEMORY_CASES: dict[str, Callable[[int, torch.dtype, torch.device], Run]] = {
    "add": _add, "gelu": _gelu, "layer_norm": _layer_norm, "softmax": _softmax, "cross_entropy": _cross_entropy,
    "bias_grad": _bias_grad, "cast": _cast, "embedding": _embedding}
PRECISIONS = {"bf16": torch.bfloat16, "fp32": torch.float32}
Timer = Callable[[str, int, str], "list[tuple[str, str, int, float]] | None"]


#: the loss's rows (tokens of a step): its forward ``nll_loss`` runs one block per call, so its time follows the row
#: count and a curve measured on fewer rows than a step has does not extend to it (sized by elements, 128M elements
#: of a 50257 vocabulary were 2,670 rows; GPT-2's 8x1024 step has 8,192)
LOSS_ROWS = (1024, 4096, 16384)
LOSS_ROWS_QUICK = (2048, 8192)


def memory_sizes(quick: bool = False, case: str | None = None) -> list[int]:
    """Elements per case: 1M to 128M (quick: 2M, 8M, 32M), training-step tensor sizes; the loss (``cross_entropy``)
    by its rows: :data:`LOSS_ROWS` tokens over GPT-2's vocabulary (up to 823M elements: 3.3 GB of fp32 logits)."""
    if case == "cross_entropy":
        return [r * _VOCAB for r in (LOSS_ROWS_QUICK if quick else LOSS_ROWS)]
    return [1 << 21, 1 << 23, 1 << 25] if quick else [1 << e for e in range(20, 28, 2)] + [1 << 27]


def measure_memory_rows(timer: Timer, *, quick: bool = False,
                        progress: Callable[[str], None] | None = None
                        ) -> tuple[dict[str, dict[str, list[list[float]]]], dict[str, str]]:
    """``({op: {precision: [[kernel bytes, seconds], ...]}}, {op: op class})`` over every case, size and precision
    (bf16, fp32)."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    classes: dict[str, str] = {}
    for case in MEMORY_CASES:
        for prec in PRECISIONS:
            for numel in memory_sizes(quick, case):
                for op, cat, nbytes, seconds in timer(case, numel, prec) or []:
                    if seconds > 0 and nbytes > 0:
                        out.setdefault(op, {}).setdefault(prec, []).append([float(nbytes), float(seconds)])
                        classes[op] = cat
        if progress is not None:
            progress(f"  memory-bound {case}: done")
    for per in out.values():
        for rows in per.values():
            rows.sort()
    return out, classes
