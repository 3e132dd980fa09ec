"""Where a row stands against its roof, in words from the numbers only (:func:`explain`). It names no change: the
changes, with their predicted savings, are ``analysis.advice``'s opportunities."""

from __future__ import annotations

from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.fmt import pct_text, sig, time_text
from tscope_callbacks.analysis.report import Row
from tscope_callbacks.devices.gemm import gemm_flops

__all__ = ["explain", "SMALL_MATMUL_FLOPS", "SMALL_MATMUL_DIM", "LAUNCH_BOUND_S", "LOW_ATTAINED", "NEAR_ROOF"]

#: A matmul below this many FLOPs (or with a dimension below SMALL_MATMUL_DIM) cannot fill a large chip.
SMALL_MATMUL_FLOPS = gemm_flops(512, 512, 512)
SMALL_MATMUL_DIM = 64
#: Mean measured time per op under which launch/dispatch overhead dominates.
LAUNCH_BOUND_S = 10e-6
#: Below this fraction of roof a row is "below its roof"; at or above NEAR_ROOF it is "near roof".
LOW_ATTAINED = 0.5
NEAR_ROOF = 0.8


def explain(row: Row) -> str:
    """One line on where a row stands. Rules (in order):

    - all ops lack a FLOP formula -> "no FLOP formula for aten.x (N calls): the roofline cannot place its time";
    - views only -> "no counted work (views/metadata)";
    - memory-bound -> "memory-bound at I FLOP/B (ridge R); A% of roof" + "; N ops of T us each: dispatch or launch
      overhead" when the mean op time < LAUNCH_BOUND_S and A < LOW_ATTAINED;
    - compute-bound -> "compute-bound, A% of roof" + ": small matmul (MxNxK=...)" when the largest matmul is small
      and A < LOW_ATTAINED, else the overhead clause as above, else ": near roof" (A >= NEAR_ROOF).
    Untimed rows (estimates only) leave out the "% of roof" part.
    """
    if row.bound == "uncounted":
        top = max(row.uncounted_ops, key=row.uncounted_ops.__getitem__)
        return (f"no FLOP formula for {top} ({row.uncounted_ops[top]} calls): the roofline cannot place its time "
                f"(give it one: `ts.profile(model, formulas={{\"{top}\": fn}})`)")
    if row.bound == "overhead":
        return "no counted work (views/metadata)"
    att = row.attained
    roof = f"{pct_text(att)} of roof" if att is not None else ""
    mean_s = _div(row.measured_s, row.n_ops)
    launch = att is not None and att < LOW_ATTAINED and mean_s is not None and mean_s < LAUNCH_BOUND_S
    launch_txt = f"{row.n_ops} ops of {time_text(mean_s)} each: dispatch or launch overhead" if launch else ""
    if row.bound == "memory":
        head = f"memory-bound at {sig(row.intensity or 0.0)} FLOP/B (ridge {sig(row.ridge or 0.0)})"
        return "; ".join(p for p in (head, roof, launch_txt) if p)
    head = "compute-bound" + (f", {roof}" if roof else "")
    mm = row.largest_matmul
    small = mm is not None and (row.largest_matmul_flops < SMALL_MATMUL_FLOPS or min(mm) < SMALL_MATMUL_DIM)
    if att is not None and att < LOW_ATTAINED and small and mm is not None:
        return f"{head}: small matmul (MxNxK={mm[0]}x{mm[1]}x{mm[2]})"
    if launch_txt:
        return f"{head}: {launch_txt}"
    if att is not None and att >= NEAR_ROOF:
        return f"{head}: near roof"
    return head
