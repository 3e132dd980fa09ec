"""The roofline's rows: one op placed on its roof (:class:`OpRoof`), aggregates of ops (:class:`Row`: a layer x phase,
a layer, an op class, an op name) and ranked opportunities (:class:`Opportunity`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.report import RowFigures
from tscope_callbacks.records import OpRecord

__all__ = ["OpRoof", "Row", "Opportunity"]


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


@dataclass
class Row(RowFigures):
    """Aggregate of a set of ops (a layer x phase, a layer, an op class, an op name, or a group of small rows)."""

    name: str
    kind: str  #: "layer" | "layer_total" | "inclusive" | "category" | "op" | "other" | "total"
    layer: str = ""
    type: str = ""
    phase: str = ""  #: one of PHASES, or "total"/"" when the row spans phases
    category: str = ""
    n_ops: int = 0
    n_work: int = 0  #: ops with a formula that do work (not views, not uncounted, flops or bytes > 0)
    flops: int = 0
    bytes: int = 0
    measured_s: float | None = None  #: None when none of the row's ops was timed
    estimate_s: float = 0.0  #: roofline bound: sum of max(flops / peak, bytes / bandwidth)
    expected_s: float = 0.0  #: shape-aware expected time (the roofline bound where no kernel model applies)
    achievable_estimate_s: float | None = None
    compute_s: float = 0.0  #: sum of flops/peak
    uncounted_ops: dict[str, int] = field(default_factory=dict)
    uncounted_s: float = 0.0  #: measured (or, untimed, estimated) time of ops without a formula
    largest_matmul: tuple[int, int, int] | None = None  #: (M, N, K) of the row's largest matmul
    largest_matmul_flops: int = 0
    precisions: dict[str, int] = field(default_factory=dict)  #: precision -> FLOPs (bytes when no FLOPs)
    bandwidth: float = 0.0
    peaks: dict[str, float] = field(default_factory=dict, repr=False)  #: precision -> FLOP/s roof of its ops
    ops: list[OpRoof] = field(default_factory=list, repr=False)

    def add(self, o: OpRoof) -> None:
        r = o.record
        self.ops.append(o)
        self.n_ops += 1
        self.flops += r.flops
        self.bytes += r.bytes
        if r.time_s is not None:
            self.measured_s = (self.measured_s or 0.0) + r.time_s
        est = o.estimate_s
        self.estimate_s += est
        self.expected_s += o.expected_s
        ach = o.achievable_estimate_s
        if ach is not None:
            self.achievable_estimate_s = (self.achievable_estimate_s or 0.0) + ach
        self.compute_s += o.compute_s
        self.bandwidth = o.bandwidth
        if r.category != "view":
            self.precisions[o.precision] = self.precisions.get(o.precision, 0) + (r.flops or r.bytes)
            self.peaks.setdefault(o.precision, o.peak)
        if r.counted and r.category != "view" and (r.flops or r.bytes):
            self.n_work += 1
        if not r.counted:
            self.uncounted_ops[r.op] = self.uncounted_ops.get(r.op, 0) + 1
            self.uncounted_s += r.time_s if r.time_s is not None else o.expected_s
        mnk = _mnk(r)
        if mnk is not None and r.flops > self.largest_matmul_flops:
            self.largest_matmul, self.largest_matmul_flops = mnk, r.flops

    @property
    def all_comm(self) -> bool:
        """Every op of the row is a collective."""
        return bool(self.ops) and all(o.record.category == "comm" for o in self.ops)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (no inf/nan: missing figures are None)."""
        mm = self.largest_matmul
        return {
            "name": self.name, "kind": self.kind, "layer": self.layer, "type": self.type, "phase": self.phase,
            "category": self.category, "precision": self.precision, "n_ops": self.n_ops, "flops": self.flops,
            "bytes": self.bytes, "intensity": self.intensity, "ridge": self.ridge, "bound": self.bound,
            "estimate_s": self.estimate_s, "expected_s": self.expected_s,
            "achievable_estimate_s": self.achievable_estimate_s,
            "measured_s": self.measured_s, "attained": self.attained,
            "attained_achievable": self.attained_achievable, "recoverable_s": self.recoverable_s,
            "uncounted_ops": dict(self.uncounted_ops), "largest_matmul": list(mm) if mm else None,
        }


@dataclass
class Opportunity:
    """A finding: where time goes that need not, why (computed from the numbers), what to change (``fix``), and the
    predicted saving per step (``saving_s``), with how it was predicted. ``kind``: one of ``advice.KINDS``."""

    layer: str
    phase: str
    type: str
    recoverable_s: float | None
    measured_s: float | None
    estimate_s: float
    bound: str
    intensity: float | None
    ridge: float | None
    attained: float | None
    reason: str
    kind: str = ""
    saving_s: float | None = None  #: predicted saving per step (None: untimed and no model)
    fix: str = ""  #: what to change, in the user's terms
    evidence: dict[str, Any] = field(default_factory=dict)  #: the figures the finding rests on
    rows: tuple[tuple[str, str], ...] = ()  #: the (layer, phase) rows the saving comes from
    predicted_by: str = ""  #: how the saving was predicted: a key of ``analysis.finding.PREDICTED_BY``
    predicted_text: str = ""  #: the prediction's figures, one sentence
    measured_ratio: float | None = None  #: measured / predicted saving of this kind of change in the closed loop
    measured_on: str = ""  #: where the closed loop measured it ("" when it never did on this kind of device)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
