"""Bytes PyTorch's CUDA kernels really move for an op, where they pass over an operand more than once. The
record's ``bytes`` count every operand once (the roofline's minimum); kernel-time estimates
(``analysis.estimate``) and the kernel-timed bandwidth curves of ``tscope calibrate --gemm``
(``devices.memory_table``) use these."""

from __future__ import annotations

import math

from tscope_callbacks.records import OpRecord

__all__ = ["kernel_bytes", "kernel_launches", "kernel_work"]

_ITEM = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
_SMEM_PER_BLOCK = 48 * 1024  #: CUDA's default shared memory per block, what PyTorch's softmax sizes its cache by
_SOFTMAX_FWD = frozenset({"aten._softmax", "aten._log_softmax"})
_SOFTMAX_BWD = frozenset({"aten._softmax_backward_data", "aten._log_softmax_backward_data"})
#: embedding_dense_backward_cuda: at most this many indices take the one-kernel path (an atomic add per row)
_EMBEDDING_FEATURE_MAX = 3072
#: its sort path: arange, CUB's onesweep radix sort of the int64 indices over all 64 bits (histogram, exclusive
#: sum, 8 passes of 8 bits), then embedding_backward_cuda_kernel: zero fill, unique_by_key (2), partials per segment,
#: exclusive sum (2), partial-segment count, partial-segment offsets, compute_grad_weight, sum_and_scatter
_EMBEDDING_SORT_KERNELS = 1 + (2 + 8) + (1 + 2 + 1 + 2 + 1 + 1 + 1 + 1)


def _embedding_backward(rec: OpRecord) -> tuple[int, int] | None:
    """(kernels, bytes) of embedding_dense_backward on CUDA, or None when the record lacks its shapes."""
    shapes = [s for s in rec.input_shapes if isinstance(s, (list, tuple)) and s]
    if len(shapes) < 2 or not rec.output_shapes or len(rec.output_shapes[0]) != 2:
        return None
    item = _ITEM.get(rec.dtype, 4)
    n, d = math.prod(shapes[1]), shapes[0][-1]
    table = math.prod(rec.output_shapes[0]) * item  # zero-filled, then written where indexed
    rows = n * d * item
    if n <= _EMBEDDING_FEATURE_MAX:
        return 2, table + rows + 2 * rows  # fill; grad rows read, table rows read and written back
    # compute_grad_weight reads the gradient rows and writes fp32 partial sums; sum_and_scatter reads them back
    # and writes the table rows; the sort and the segment scans move the int64 indices (about 24 passes of n x 8)
    return _EMBEDDING_SORT_KERNELS, table + rows + 2 * n * d * 4 + rows + 24 * n * 8


def kernel_launches(rec: OpRecord) -> int:
    """How many CUDA kernels ``rec`` launches where PyTorch runs it as several (each pays a launch, see
    ``devices.efficiency.MIN_KERNEL_S``): embedding_dense_backward (2 up to 3072 indices, else a sort-based
    pipeline of 21); layer_norm backward with affine parameters (grad input, then gamma/beta: 2); softmax's backward
    over rows the persistent kernel cannot hold (grad * output first: 2). Else 1. See :func:`kernel_work`."""
    return kernel_work(rec)[1]


def kernel_bytes(rec: OpRecord) -> int:
    """Bytes the CUDA kernels of ``rec`` move (see :func:`kernel_work`)."""
    return kernel_work(rec)[0]


def kernel_work(rec: OpRecord) -> tuple[int, int]:
    """(bytes, kernels) of ``rec``'s CUDA kernels, where PyTorch's kernels pass over an operand more than once (the
    record's ``bytes`` count each operand once: the roofline's minimum) or run as several kernels. From the kernels'
    sources, for the ops whose kernels the H100 GPT-2 step runs (``../shared/gpu/h100/kernel_names.txt``):

    - softmax / log_softmax over rows longer than 1024 (or 4 KB) whose row does not fit the 48 KB shared-memory cache
      (``cunn_SoftMaxForward``): the input is read three times (max, sum of exponentials, write), the output written
      once; the backward (``cunn_SoftMaxBackward``) reads the gradient twice (its sum, then the write pass) and the
      output once, and writes grad_input; softmax's (not log-softmax's) backward first forms ``grad * output`` in its
      own pass (2 reads, 1 write; a second kernel). The row is the last dim.
    - layer_norm backward with affine parameters: ``layer_norm_grad_input_kernel`` reads dY and X for dX, then
      ``GammaBetaBackwardCUDAKernel`` (a second kernel) reads dY and X again for dgamma and dbeta.
    - embedding_dense_backward (``Embedding.cu``, ``EmbeddingBackwardKernel.cu``): the zero-filled table, the
      gradient rows, and on the sort path (over 3072 indices, 21 kernels) the fp32 partial sums written and read
      back.
    """
    op, base = rec.op, rec.bytes
    if op == "aten.embedding_dense_backward":
        eb = _embedding_backward(rec)
        return (eb[1], eb[0]) if eb else (base, 1)
    shapes = [s for s in rec.input_shapes if isinstance(s, (list, tuple)) and s]
    if (op in _SOFTMAX_FWD or op in _SOFTMAX_BWD) and shapes:
        row, item = shapes[0][-1], _ITEM.get(rec.dtype, 4)
        if row <= 1024 and row * item <= 4096:
            return base, 1  # the persistent warp softmax: one read, one write
        if op in _SOFTMAX_FWD:
            smem = row < _SMEM_PER_BLOCK // item and row % (16 // item) == 0
            return (base if smem else 3 * rec.bytes_read + rec.bytes_written), 1
        n = math.prod(shapes[0]) * item  # grad, output and grad_input: one shape, dense in the kernel
        return (7 * n, 2) if op == "aten._softmax_backward_data" else (4 * n, 1)
    if op == "aten.native_layer_norm_backward" and len(shapes) >= 2 and len(rec.output_shapes) >= 2 \
            and rec.output_shapes[1]:
        item = _ITEM.get(rec.dtype, 4)
        return base + (math.prod(shapes[0]) + math.prod(shapes[1])) * item, 2
    return base, 1
