"""Roofs checked against the data: a measured roof widened when an op beats it, datasheet roofs beaten explained."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from tscope_callbacks.analysis.fmt import bw_text, rate_text
from tscope_callbacks.analysis.rows import OpRoof

__all__ = ["widen", "beaten", "roof_bandwidth"]

#: ops shorter than this are too noisy (timer resolution) to move a measured roof
_WIDEN_MIN_S = 20e-6


def widen(ops: list[OpRoof], spec: Any) -> list[str]:
    """A measured roof is an upper bound: where a timed op ran faster than the calibration measured (a small
    calibration GEMM, a busy machine), raise that roof to the op's rate, so no op is above 100% of its roof, and say
    so. Returns the notes (empty when the roofs held)."""
    notes = []
    best: dict[tuple[str, bool], tuple[float, OpRoof]] = {}
    for o in ops:
        t = o.measured_s
        if t is None or t < _WIDEN_MIN_S or o.record.category in ("view", "comm") or not o.flops:
            continue
        rate = o.flops / t
        key = (o.roof_precision, o.matrix)
        if rate > o.peak and rate > best.get(key, (0.0, o))[0]:
            best[key] = (rate, o)
    for (prec, matrix), (rate, o) in best.items():
        old = o.peak
        for x in ops:
            if (x.roof_precision, x.matrix) == (prec, matrix):
                x.peak = rate
        notes.append(f"{prec} {'matrix' if matrix else 'vector'} roof widened from {rate_text(old)} to "
                     f"{rate_text(rate)}: `{o.record.op}` in `{o.record.layer or '(root)'}` ran faster than "
                     "the calibration measured (re-run `tscope calibrate --no-cache` on an idle machine)")
    bw = max(((o.bytes / o.measured_s, o) for o in ops if o.measured_s and o.measured_s >= _WIDEN_MIN_S and o.bytes
              and o.record.category not in ("view", "comm")), key=lambda x: x[0], default=(0.0, None))
    if bw[1] is not None and bw[0] > bw[1].bandwidth:
        old = bw[1].bandwidth
        for x in ops:
            x.bandwidth = max(x.bandwidth, bw[0])
        notes.append(f"bandwidth roof widened from {bw_text(old)} to {bw_text(bw[0])}: `{bw[1].record.op}` "
                     "moved its bytes faster than the calibration's copy (data in cache)")
    return notes


def beaten(ops: list[OpRoof]) -> list[str]:
    """Datasheet roofs are not moved: ops above 100% of them are counted and explained."""
    over = [o for o in ops if o.measured_s and o.attained is not None and o.attained > 1.0
            and o.record.category not in ("view", "comm")]
    if not over:
        return []
    mem = sum(1 for o in over if o.bound == "memory")
    return [f"{len(over)} ops ran faster than their datasheet roof ({mem} memory-bound: small working sets served "
            "from L2 beat the HBM bandwidth; the others mean the profile's device is not the one named, or a count "
            "is wrong)"]


def roof_bandwidth(roofs: Iterable[Any], device_bw: float) -> float:
    """The bandwidth the ops were placed on (the roofs' own: a measured roof an op beat is widened, :func:`widen`),
    else the device's: what the plot draws and the report's roof lines say beside the device's."""
    return max((r.bandwidth for r in roofs if r.bandwidth and math.isfinite(r.bandwidth)), default=device_bw)
