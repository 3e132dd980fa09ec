"""Shape-aware expected kernel time of a recorded op on a device (``devices.efficiency.KernelModel``).

The roofline bound says what the silicon allows; this says what the device's libraries achieve for the op's exact
shape: GEMMs by (M, N, K) and alignment, attention by backend and size, memory-bound ops by their bandwidth curve.
Ops the model cannot place (views, ops without a formula, CPU profiles) get None and keep their roofline bound.
"""

from __future__ import annotations

import math
from typing import Any

from tscope_callbacks.devices.efficiency import ITEMSIZE
from tscope_callbacks.formulas.kernel_bytes import kernel_bytes, kernel_work
from tscope_callbacks.formulas.matmul import gemm_flops
from tscope_callbacks.records import MEMORY_CATEGORIES, OpRecord

__all__ = ["expected_s", "kernel_bytes", "gemm_dims", "attention_dims", "attention_backend", "MEMORY_BOUND"]

MEMORY_BOUND = MEMORY_CATEGORIES  #: op classes whose kernels are paced by memory traffic (``records``)
_PREC = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def _mats(rec: OpRecord) -> list[list[int]]:
    return [s for s in rec.input_shapes if isinstance(s, (list, tuple)) and len(s) >= 2
            and all(isinstance(d, int) for d in s)]


def gemm_dims(rec: OpRecord) -> tuple[int, int, int] | None:
    """(M, N, K) of a matmul (batch dims folded into M) or of a convolution's implicit GEMM; None otherwise."""
    if rec.category == "matmul":
        mats = _mats(rec)
        if len(mats) < 2:
            return None
        a, b = mats[-2], mats[-1]
        m = math.prod(a[:-1])
        return (m, b[-1], a[-1]) if a[-1] == b[-2] else None
    if rec.category == "conv" and rec.input_shapes and rec.output_shapes and "backward" not in rec.op:
        w = rec.input_shapes[1] if len(rec.input_shapes) > 1 else None
        out = rec.output_shapes[0]
        if w and len(w) >= 3 and len(out) >= 3:
            return math.prod(out) // out[1], w[0], math.prod(w[1:])  # (N*spatial, C_out, C_in/groups * kernel)
    return None


def attention_backend(op: str) -> str | None:
    """SDPA backend of a fused attention op name; None for CPU/unknown kernels."""
    if "cpu" in op:
        return None
    if "cudnn" in op:
        return "CUDNN_ATTENTION"
    if "efficient" in op:
        return "EFFICIENT_ATTENTION"
    if "flash" in op:
        return "FLASH_ATTENTION"
    return None


def attention_dims(rec: OpRecord) -> tuple[int, int, int] | None:
    """(batch x heads, query length, head dim) from the query's shape (layout per op family)."""
    backward = "backward" in rec.op
    shapes = [s for s in rec.input_shapes if isinstance(s, (list, tuple)) and len(s) == 4]
    if len(shapes) < (4 if backward else 3):
        return None
    q = shapes[1] if backward else shapes[0]
    if "_scaled_dot_product" in rec.op or "cudnn" in rec.op:  # (B, H, L, D)
        return q[0] * q[1], q[2], q[3]
    return q[0] * q[2], q[1], q[3]  # (B, L, H, D)


def expected_s(rec: OpRecord, precision: str, model: Any) -> float | None:
    """Expected kernel seconds of ``rec`` at its roof ``precision`` on the device of ``model``; None when unknown."""
    if model is None or rec.category == "view" or not rec.counted:
        return None
    cat = rec.category
    if cat in ("matmul", "conv"):
        dims = gemm_dims(rec)
        if dims is None:
            return None
        m, n, k = dims
        lds = rec.leading_dims if cat == "matmul" else None
        item = ITEMSIZE.get(precision, 2)
        ok = all((ld * item) % 16 == 0 for ld in lds) if lds else None  # stored layout, where it was recorded
        t = model.gemm_s(m, n, k, precision, ok)
        if cat == "conv" and rec.flops:  # backward convolutions and grouped ones: same efficiency, their own FLOPs
            return t * rec.flops / max(gemm_flops(m, k, n), 1)
        return t
    if cat == "attention":
        backend, dims = attention_backend(rec.op), attention_dims(rec)
        if backend is None or dims is None:
            return None
        bh, length, d = dims
        causal = rec.flops_dense is not None
        return model.attention_s(backend, bh, length, d, causal, "backward" in rec.op, rec.flops, precision)
    if cat in MEMORY_BOUND and rec.bytes:
        nbytes, launches = kernel_work(rec)
        return model.memory_s(cat, nbytes, _PREC.get(rec.dtype, "fp32"), rec.op, launches)
    return None
