"""The roofline's rows: one op placed on its roof (:class:`OpRoof`) and the sums of a set of them (:func:`sum_row`:
a layer x phase, a layer, an op class, an op name; the report's frozen ``Row``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.report import Row
from tscope_callbacks.records import OpRecord

__all__ = ["OpRoof", "sum_row"]


@dataclass(slots=True)
class OpRoof:
    """One op placed on the roofline."""

    record: OpRecord
    precision: str  #: precision the op runs at (its dtype; TF32 for fp32 matrix ops when allowed; the override)
    matrix: bool  #: True when a matrix (tensor-core) roof applies, False for the vector roof
    peak: float  #: FLOP/s of that roof
    bandwidth: float  #: bytes/s
    ach_peak: float | None = None  #: achievable (measured) roof, when known
    ach_bandwidth: float | None = None
    roof_precision: str = ""  #: the roof actually used (the spec's fallback, e.g. fp16 for fp8 on an A100)
    expected: float | None = None  #: shape-aware expected kernel time (``analysis.estimate``); None: unknown
    link_bandwidth: float | None = None  #: collectives' roof: one direction of the device's fastest link (bytes/s)

    @property
    def link_bytes(self) -> float:
        """A collective's bytes on each rank's link, per direction: nccl-tests' S x the busbw factor."""
        c = self.record.comm
        if not c or not c.get("bytes") or c.get("busbw_factor") is None:
            return 0.0
        return float(c["bytes"]) * float(c["busbw_factor"])

    @property
    def flops(self) -> int:
        return self.record.flops

    @property
    def bytes(self) -> int:
        return self.record.bytes

    @property
    def measured_s(self) -> float | None:
        return self.record.time_s

    @property
    def intensity(self) -> float | None:
        """FLOP/byte; ``inf`` when the op moves no bytes but does FLOPs, None when it does neither."""
        if self.bytes == 0:
            return math.inf if self.flops > 0 else None
        return self.flops / self.bytes

    @property
    def ridge(self) -> float:
        return self.peak / self.bandwidth

    @property
    def bound(self) -> str:
        """``compute`` | ``memory`` | ``comm`` (collectives) | ``uncounted`` (no FLOP formula) | ``overhead``
        (views, zero-work ops)."""
        r = self.record
        if r.category == "view":
            return "overhead"
        if r.category == "comm":
            return "comm"
        if not r.counted:
            return "uncounted"
        intensity = self.intensity
        if intensity is None:
            return "overhead"
        return "compute" if intensity >= self.ridge else "memory"

    @property
    def compute_s(self) -> float:
        return self.flops / self.peak

    @property
    def memory_s(self) -> float:
        return self.bytes / self.bandwidth

    @property
    def estimate_s(self) -> float:
        if self.record.category == "comm":  # on the link roof (0 when the device lists no interconnect)
            return self.link_bytes / self.link_bandwidth if self.link_bandwidth else 0.0
        return max(self.compute_s, self.memory_s)

    @property
    def achievable_estimate_s(self) -> float | None:
        if self.ach_peak is None or self.ach_bandwidth is None:
            return None
        return max(self.flops / self.ach_peak, self.bytes / self.ach_bandwidth)

    @property
    def expected_s(self) -> float:
        """What this shape should take on the device (its libraries' measured efficiency); the roofline bound when
        no kernel model applies."""
        return self.estimate_s if self.expected is None else max(self.expected, self.estimate_s)

    @property
    def attained(self) -> float | None:
        return _div(self.estimate_s, self.measured_s)

    @property
    def recoverable_s(self) -> float | None:
        m = self.measured_s
        return None if m is None else max(0.0, m - self.expected_s)


def _mnk(rec: OpRecord) -> tuple[int, int, int] | None:
    """(M, N, K) of a matmul from its last two >=2-D inputs (batch dims folded into M); None if not a matmul."""
    mats = [s for s in rec.input_shapes if isinstance(s, (list, tuple)) and len(s) >= 2
            and all(isinstance(d, int) for d in s)]
    if rec.category != "matmul" or len(mats) < 2:
        return None
    a, b = mats[-2], mats[-1]
    return math.prod(a[:-1]), b[-1], a[-1]


def sum_row(name: str, kind: str, ops: Iterable[OpRoof], *, layer: str = "", type: str = "", phase: str = "",
            category: str = "") -> Row:
    """The row summing ``ops`` (a layer x phase, a layer, an op class, an op name, the total): every sum a row stores
    (``analysis.report.Row``), its derived figures being properties of them. ``measured_s`` is None when none of the
    ops was timed; ``precisions`` weighs each precision by FLOPs (bytes for ops without FLOPs), views left out."""
    n_ops = n_work = flops = nbytes = 0
    measured: float | None = None
    estimate = expected = compute = uncounted_s = 0.0
    ach: float | None = None
    uncounted: dict[str, int] = {}
    precisions: dict[str, int] = {}
    peaks: dict[str, float] = {}
    bandwidth = 0.0
    mm, mm_flops = None, 0
    comm = True
    for o in ops:
        r = o.record
        n_ops += 1
        flops += r.flops
        nbytes += r.bytes
        if r.time_s is not None:
            measured = (measured or 0.0) + r.time_s
        estimate += o.estimate_s
        expected += o.expected_s
        a = o.achievable_estimate_s
        if a is not None:
            ach = (ach or 0.0) + a
        compute += o.compute_s
        bandwidth = o.bandwidth
        comm = comm and r.category == "comm"
        if r.category != "view":
            precisions[o.precision] = precisions.get(o.precision, 0) + (r.flops or r.bytes)
            peaks.setdefault(o.precision, o.peak)
        if r.counted and r.category != "view" and (r.flops or r.bytes):
            n_work += 1
        if not r.counted:
            uncounted[r.op] = uncounted.get(r.op, 0) + 1
            uncounted_s += r.time_s if r.time_s is not None else o.expected_s
        mnk = _mnk(r)
        if mnk is not None and r.flops > mm_flops:
            mm, mm_flops = mnk, r.flops
    return Row(name, kind, layer=layer, type=type, phase=phase, category=category, n_ops=n_ops, n_work=n_work,
               flops=flops, bytes=nbytes, measured_s=measured, estimate_s=estimate, expected_s=expected,
               achievable_estimate_s=ach, compute_s=compute, uncounted_s=uncounted_s, uncounted_ops=uncounted,
               largest_matmul=mm, largest_matmul_flops=mm_flops, precisions=precisions, peaks=peaks,
               bandwidth=bandwidth, all_comm=bool(n_ops) and comm)
