"""Why a row is far from its roof: one-line reasons phrased from the numbers only (:func:`explain`)."""

from __future__ import annotations

from typing import Any

from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.fmt import g as _g
from tscope_callbacks.analysis.fmt import pct as _pct
from tscope_callbacks.devices.gemm import gemm_flops

__all__ = ["explain", "LAYER_TYPES_WITH_RULES", "SMALL_MATMUL_FLOPS", "SMALL_MATMUL_DIM", "LAUNCH_BOUND_S", "LOW_ATTAINED", "NEAR_ROOF"]

#: A matmul below this many FLOPs (or with a dimension below SMALL_MATMUL_DIM) cannot fill a large chip.
SMALL_MATMUL_FLOPS = gemm_flops(512, 512, 512)
SMALL_MATMUL_DIM = 64
#: Mean measured time per op under which launch/dispatch overhead dominates.
LAUNCH_BOUND_S = 10e-6
#: Below this fraction of roof a row gets a diagnosis; at or above NEAR_ROOF it is "near roof".
LOW_ATTAINED = 0.5
NEAR_ROOF = 0.8
#: layer types (lower-case substrings) whose advice comes from ``analysis.layer_advice`` or not at all
LAYER_TYPES_WITH_RULES = ("batchnorm", "pool", "embedding", "lstm", "gru", "rnn", "conv")


def explain(row: Any, *, tf32_available: bool = False) -> str:
    """One-line reason for a row's distance from its roof. Rules (in order):

    - all ops lack a FLOP formula -> "no FLOP formula for aten.x (N calls); time unexplained";
    - memory-bound -> "memory-bound at I FLOP/B (ridge R); A% of roof; " + "launch-bound: N ops of T us" when the
      mean op time < LAUNCH_BOUND_S and A < LOW_ATTAINED, else "fuse or lower precision" (fp32) / "fuse";
    - compute-bound -> "compute-bound, A% of roof" + ": small matmul (MxNxK=...)" when the largest matmul is small and
      A < LOW_ATTAINED, else ": launch-bound ..." as above, else ": fp32 matmul, enable TF32 or bf16" when fp32 on a
      TF32 chip, else ": near roof" (A >= NEAR_ROOF) / ": below roof, check shapes (multiples of 64) and layout" (rows
      with a GEMM or attention only);
    - layer types with rules of their own (``LAYER_TYPES_WITH_RULES``: BatchNorm, pooling, embeddings, RNNs, convs)
      get no generic hint ("fuse", "check shapes"): their advice names a change and its saving, or nothing does.
    Untimed rows (estimates only) leave out the "% of roof" part.
    """
    if row.bound == "uncounted":
        top = max(row.uncounted_ops, key=row.uncounted_ops.__getitem__)
        return f"no FLOP formula for {top} ({row.uncounted_ops[top]} calls); time unexplained by the roofline"
    if row.bound == "overhead":
        return "no counted work (views/metadata): pure overhead"
    att = row.attained
    roof = f"{_pct(att)} of roof" if att is not None else ""
    mean_s = _div(row.measured_s, row.n_ops)
    launch = (att is not None and att < LOW_ATTAINED and mean_s is not None and mean_s < LAUNCH_BOUND_S)
    launch_txt = f"launch-bound: {row.n_ops} ops of {mean_s * 1e6:.1f} us each; fuse or batch" if launch else ""
    typed = any(t in (row.type or "").lower() for t in LAYER_TYPES_WITH_RULES)
    if row.bound == "memory":
        head = f"memory-bound at {_g(row.intensity or 0.0)} FLOP/B (ridge {_g(row.ridge or 0.0)})"
        # layer types with their own rules (``analysis.layer_advice``) get those or nothing, not a generic hint
        tail = launch_txt or ("" if typed else "fuse or lower precision" if row.precision in ("fp32", "fp64")
                              else "fuse")
        return "; ".join(p for p in (head, roof, tail) if p)
    head = "compute-bound" + (f", {roof}" if roof else "")
    mm = row.largest_matmul
    small = mm is not None and (row.largest_matmul_flops < SMALL_MATMUL_FLOPS or min(mm) < SMALL_MATMUL_DIM)
    if att is not None and att < LOW_ATTAINED and small:
        assert mm is not None
        return f"{head}: small matmul (MxNxK={mm[0]}x{mm[1]}x{mm[2]}); batch or fuse"
    if launch_txt:
        return f"{head}: {launch_txt}"
    if row.precision == "fp32" and tf32_available:
        return f"{head}: fp32 matmul, enable TF32 or bf16"
    if att is None:
        return head
    if att >= NEAR_ROOF:
        return f"{head}: near roof"
    if typed or not any(o.record.category in ("matmul", "attention") for o in row.ops):
        return head  # shapes in multiples of 64 help GEMMs; for other ops no change predicts a saving
    return f"{head}: below roof, check shapes (multiples of 64) and layout"
