"""The work of a GEMM, written once for every layer that needs it: the roof measurements and the kernel time model
(``devices``), the matmul formulas and Inductor's GEMM templates (``formulas.matmul``, ``formulas.fused``)."""

from __future__ import annotations

__all__ = ["gemm_flops"]


def gemm_flops(m: int, k: int, n: int, batch: int = 1) -> int:
    """FLOPs of ``batch`` products ``(m x k) @ (k x n)``: each of the m n outputs is k multiply-adds, 2 FLOPs each."""
    return 2 * batch * m * k * n
