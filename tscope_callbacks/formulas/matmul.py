"""Matrix-multiply family. A multiply-add is 2 FLOPs: ``(m x k) @ (k x n)`` costs ``2*m*k*n``.

Conventions (the same as ``torch.utils.flop_counter``): the ``beta*self`` bias/accumulate epilogue of
addmm/baddbmm/addmv is not counted (it is fused into the GEMM's store); ``F.linear`` and ``torch.matmul`` are
composite and arrive at dispatch as ``t``/``view`` + ``addmm``/``mm``/``bmm``, which are what we count.
"""

from __future__ import annotations

from tscope_callbacks.devices.gemm import gemm_flops  # the one GEMM rule (re-exported here)
from tscope_callbacks.formulas.common import numel, reg
from tscope_callbacks.formulas.costs import GELU_COSTS, POINTWISE_COSTS

__all__ = ["gemm_flops", "mm_flops", "bmm_flops"]


def mm_flops(a, b, *args, out=None, **kwargs) -> int:
    return gemm_flops(a[-2], a[-1], b[-1])


def bmm_flops(a, b, *args, out=None, **kwargs) -> int:
    bsz, m, k = a
    return gemm_flops(m, k, b[-1], bsz)


def _addmm(bias, a, b, *args, out=None, **kwargs) -> int:
    return mm_flops(a, b)


def _baddbmm(bias, a, b, *args, out=None, **kwargs) -> int:
    return bmm_flops(a, b)


def _addmv(bias, mat, vec, *args, out=None, **kwargs) -> int:
    return gemm_flops(mat[0], mat[1], 1)


def _mv(mat, vec, *args, out=None, **kwargs) -> int:
    return gemm_flops(mat[0], mat[1], 1)


def _dot(a, b, *args, out=None, **kwargs) -> int:
    return gemm_flops(1, a[0], 1)


def _addmm_activation(bias, a, b, *args, out=None, use_gelu=False, **kwargs) -> int:
    # GEMM plus the fused activation on every output element (formulas.costs)
    return mm_flops(a, b) + (GELU_COSTS["none"][0] if use_gelu else POINTWISE_COSTS["relu"]) * numel(out)


def _by_out_and_k(a, b, *args, out=None, **kwargs) -> int:
    """Packed-weight GEMMs (int4/int8 weight-only): each output element is a length-k dot product."""
    return gemm_flops(numel(out), a[-1], 1)


def _grouped_mm(a, b, *args, out=None, **kwargs) -> int:
    """MoE grouped GEMM: each output element is one dot product over k, except 2d x 2d where k is split into
    groups (out is ``(G, m, n)``, total k = ``a[-1]``)."""
    if len(a) == 2 and len(b) == 2:
        return gemm_flops(a[0], a[-1], b[-1])
    return gemm_flops(numel(out), a[-1], 1)


reg(["mm", "_int_mm", "_scaled_mm"], "matmul", mm_flops)
reg(["addmm"], "matmul", _addmm)
reg(["bmm"], "matmul", bmm_flops)
reg(["baddbmm", "addbmm"], "matmul", _baddbmm)
reg(["addmv"], "matmul", _addmv)
reg(["mv"], "matmul", _mv)
reg(["dot", "vdot"], "matmul", _dot)
reg(["_addmm_activation"], "matmul", _addmm_activation)
reg(["_weight_int8pack_mm", "_weight_int4pack_mm"], "matmul", _by_out_and_k)
reg(["_grouped_mm", "_scaled_grouped_mm"], "matmul", _grouped_mm)
