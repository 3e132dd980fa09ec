"""Bytes PyTorch's CUDA kernels really move for an op, where they pass over an operand more than once. The
record's ``bytes`` count every operand once (the roofline's minimum); kernel-time estimates
(``analysis.estimate``) and the kernel-timed bandwidth curves of ``tscope calibrate --gemm``
(``devices.memory_table``) use these."""

from __future__ import annotations

import math

from tscope_callbacks.records import OpRecord

__all__ = ["kernel_bytes"]

_ITEM = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
_SMEM_PER_BLOCK = 48 * 1024  #: CUDA's default shared memory per block, what PyTorch's softmax sizes its cache by
_SOFTMAX_FWD = frozenset({"aten._softmax", "aten._log_softmax"})
_SOFTMAX_BWD = frozenset({"aten._softmax_backward_data", "aten._log_softmax_backward_data"})


def kernel_bytes(rec: OpRecord) -> int:
    """Bytes the CUDA kernels of ``rec`` move, where PyTorch's kernels pass over an operand more than once (the
    record's ``bytes`` count each operand once: the roofline's minimum). From the kernels' sources, for the ops whose
    kernels the H100 GPT-2 step runs (``../shared/gpu/h100/kernel_names.txt``):

    - softmax / log_softmax over rows longer than 1024 (or 4 KB) whose row does not fit the 48 KB shared-memory cache
      (``cunn_SoftMaxForward``): the input is read three times (max, sum of exponentials, write), the output written
      once; the backward (``cunn_SoftMaxBackward``) reads the gradient twice (its sum, then the write pass) and the
      output once, and writes grad_input; softmax's (not log-softmax's) backward first forms ``grad * output`` in its
      own pass (2 reads, 1 write). The row is the last dim.
    - layer_norm backward with affine parameters: ``layer_norm_grad_input_kernel`` reads dY and X for dX, then
      ``GammaBetaBackwardCUDAKernel`` reads dY and X again for dgamma and dbeta.
    """
    op, base = rec.op, rec.bytes
    shapes = [s for s in rec.input_shapes if isinstance(s, (list, tuple)) and s]
    if (op in _SOFTMAX_FWD or op in _SOFTMAX_BWD) and shapes:
        row, item = shapes[0][-1], _ITEM.get(rec.dtype, 4)
        if row <= 1024 and row * item <= 4096:
            return base  # the persistent warp softmax: one read, one write
        if op in _SOFTMAX_FWD:
            smem = row < _SMEM_PER_BLOCK // item and row % (16 // item) == 0
            return base if smem else 3 * rec.bytes_read + rec.bytes_written
        n = math.prod(shapes[0]) * item  # grad, output and grad_input: one shape, dense in the kernel
        return (7 if op == "aten._softmax_backward_data" else 4) * n
    if op == "aten.native_layer_norm_backward" and len(shapes) >= 2 and len(rec.output_shapes) >= 2 \
            and rec.output_shapes[1]:
        item = _ITEM.get(rec.dtype, 4)
        return base + (math.prod(shapes[0]) + math.prod(shapes[1])) * item
    return base
