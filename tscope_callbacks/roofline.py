"""Roofline analysis: op records + a DeviceSpec -> :class:`RooflineReport` (pure functions, no torch).

Per op (DESIGN.md "Counting semantics"): the precision actually used (TF32 for fp32 matrix ops when
``float32_matmul_precision`` allows it and the chip has TF32), the roof for it (matrix roof for matmul/conv/attention,
vector roof otherwise), intensity = flops/bytes, ridge = peak/bandwidth, bound, estimate = max(flops/peak,
bytes/bandwidth), attained = estimate/measured ("% of roof") and recoverable = max(0, measured - estimate).
Rows aggregate ops per layer x phase (self attribution, so rows never double count), per layer, per layer
inclusive of children, per op class and per op name. Rendering lives in ``report.py``, the plot in ``plot.py``.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any

from tscope_callbacks import specs as _specs
from tscope_callbacks.records import MATRIX_CATEGORIES, PHASES, OpRecord, StepProfile

__all__ = ["roofline", "RooflineReport", "OpRoof", "Row", "Opportunity", "METRIC_PREFIX"]

METRIC_PREFIX = "tscope/roofline/"


def _div(a: float | None, b: float | None) -> float | None:
    """a / b; None when either is None or b is 0 (inf/nan never leave this module's figures)."""
    if a is None or b is None or b == 0:
        return None
    return a / b


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
        """``compute`` | ``memory`` | ``uncounted`` (no FLOP formula) | ``overhead`` (views, zero-work ops)."""
        r = self.record
        if r.category == "view":
            return "overhead"
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
        return max(self.compute_s, self.memory_s)

    @property
    def achievable_estimate_s(self) -> float | None:
        if self.ach_peak is None or self.ach_bandwidth is None:
            return None
        return max(self.flops / self.ach_peak, self.bytes / self.ach_bandwidth)

    @property
    def attained(self) -> float | None:
        return _div(self.estimate_s, self.measured_s)

    @property
    def recoverable_s(self) -> float | None:
        m = self.measured_s
        return None if m is None else max(0.0, m - self.estimate_s)


def _mnk(rec: OpRecord) -> tuple[int, int, int] | None:
    """(M, N, K) of a matmul from its last two >=2-D inputs (batch dims folded into M); None if not a matmul."""
    mats = [s for s in rec.input_shapes if isinstance(s, (list, tuple)) and len(s) >= 2
            and all(isinstance(d, int) for d in s)]
    if rec.category != "matmul" or len(mats) < 2:
        return None
    a, b = mats[-2], mats[-1]
    return math.prod(a[:-1]), b[-1], a[-1]


@dataclass
class Row:
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
    estimate_s: float = 0.0
    achievable_estimate_s: float | None = None
    compute_s: float = 0.0  #: sum of flops/peak
    uncounted_ops: dict[str, int] = field(default_factory=dict)
    uncounted_s: float = 0.0  #: measured (or, untimed, estimated) time of ops without a formula
    largest_matmul: tuple[int, int, int] | None = None  #: (M, N, K) of the row's largest matmul
    largest_matmul_flops: int = 0
    precisions: dict[str, int] = field(default_factory=dict)  #: precision -> FLOPs (bytes when no FLOPs)
    bandwidth: float = 0.0
    _peaks: dict[str, float] = field(default_factory=dict, repr=False)
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
        ach = o.achievable_estimate_s
        if ach is not None:
            self.achievable_estimate_s = (self.achievable_estimate_s or 0.0) + ach
        self.compute_s += o.compute_s
        self.bandwidth = o.bandwidth
        if r.category != "view":
            self.precisions[o.precision] = self.precisions.get(o.precision, 0) + (r.flops or r.bytes)
            self._peaks.setdefault(o.precision, o.peak)
        if r.counted and r.category != "view" and (r.flops or r.bytes):
            self.n_work += 1
        if not r.counted:
            self.uncounted_ops[r.op] = self.uncounted_ops.get(r.op, 0) + 1
            self.uncounted_s += r.time_s if r.time_s is not None else est
        mnk = _mnk(r)
        if mnk is not None and r.flops > self.largest_matmul_flops:
            self.largest_matmul, self.largest_matmul_flops = mnk, r.flops

    @property
    def precision(self) -> str:
        """Dominant precision (most FLOPs; most bytes when the row has no FLOPs)."""
        return max(self.precisions, key=self.precisions.__getitem__) if self.precisions else ""

    @property
    def intensity(self) -> float | None:
        return _div(self.flops, self.bytes)

    @property
    def ridge(self) -> float | None:
        """Effective ridge: (FLOPs / sum of flops/peak) / bandwidth; the dominant precision's when no FLOPs."""
        peak = _div(self.flops, self.compute_s) or self._peaks.get(self.precision)
        return _div(peak, self.bandwidth)

    @property
    def bound(self) -> str:
        if not self.n_work:
            return "uncounted" if self.uncounted_ops else "overhead"
        if self.bytes == 0:
            return "compute"
        return "compute" if (self.intensity or 0.0) >= (self.ridge or math.inf) else "memory"

    @property
    def attained(self) -> float | None:
        """Fraction of the (datasheet) roof: estimate / measured."""
        return _div(self.estimate_s, self.measured_s)

    @property
    def attained_achievable(self) -> float | None:
        return _div(self.achievable_estimate_s, self.measured_s)

    @property
    def recoverable_s(self) -> float | None:
        return None if self.measured_s is None else max(0.0, self.measured_s - self.estimate_s)

    @property
    def ratio(self) -> float | None:
        """measured / estimated (1.0 = on the roof)."""
        return _div(self.measured_s, self.estimate_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (no inf/nan: missing figures are None)."""
        mm = self.largest_matmul
        return {
            "name": self.name, "kind": self.kind, "layer": self.layer, "type": self.type, "phase": self.phase,
            "category": self.category, "precision": self.precision, "n_ops": self.n_ops, "flops": self.flops,
            "bytes": self.bytes, "intensity": self.intensity, "ridge": self.ridge, "bound": self.bound,
            "estimate_s": self.estimate_s, "achievable_estimate_s": self.achievable_estimate_s,
            "measured_s": self.measured_s, "attained": self.attained,
            "attained_achievable": self.attained_achievable, "recoverable_s": self.recoverable_s,
            "uncounted_ops": dict(self.uncounted_ops), "largest_matmul": list(mm) if mm else None,
        }


@dataclass
class Opportunity:
    """A layer x phase ranked by recoverable time, with a reason computed from its numbers."""

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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _rate(spec: Any, p: str, matrix: bool) -> tuple[str, bool, float] | None:
    """(roof precision, matrix roof?, FLOP/s) that ``spec`` uses for ``p``; None when it has none. The TF32 rule is
    applied by the caller from the profile's meta, never from this process's torch settings (allow_tf32=False)."""
    try:
        if hasattr(spec, "effective_precision"):
            peak = spec.peak_flops(p, matrix, allow_tf32=False)
            eff = str(spec.effective_precision(p, matrix, allow_tf32=False))
        else:  # a duck-typed spec with the bare contract
            peak, eff = spec.peak_flops(p, matrix=matrix), p
    except (KeyError, ValueError, TypeError):
        return None
    name, _, vec = eff.partition(" ")
    return (name, matrix and not vec, float(peak)) if peak and peak > 0 else None


class _Roofs:
    """Per-(precision, matrix) roof lookup, cached: (roof precision, matrix roof?, peak, achievable peak)."""

    def __init__(self, spec: Any, ach: Any) -> None:
        self.spec, self.ach = spec, ach
        self._cache: dict[tuple[str, bool], tuple[str, bool, float, float | None]] = {}

    def get(self, p: str, matrix: bool) -> tuple[str, bool, float, float | None]:
        key = (p, matrix)
        if key not in self._cache:
            r = _rate(self.spec, p, matrix) or _rate(self.spec, "fp32", matrix) or _rate(self.spec, "fp32", not matrix)
            if r is None:
                raise ValueError(f"device {self.spec.name!r} has no FLOP/s roof for {p} (nor fp32)")
            a = _rate(self.ach, p, matrix) if self.ach is not None else None
            self._cache[key] = (*r, a[2] if a else None)
        return self._cache[key]


def _op_precision(rec: OpRecord, spec: Any, tf32: bool, override: str | None) -> tuple[str, bool]:
    matrix = rec.category in MATRIX_CATEGORIES
    try:
        p = _specs.precision_for_dtype(rec.dtype) if rec.dtype else "fp32"
    except (KeyError, ValueError, TypeError):
        p = "fp32"
    if matrix and override:
        p = override
    elif matrix and p == "fp32" and tf32:
        p = "tf32"
    return p, matrix


def _resolve(spec: Any, default: str) -> Any:
    """A DeviceSpec from a spec, a name or path; "cpu" (a CPU profile's recorded name) -> this machine's measured
    CPU roof."""
    if spec is None or isinstance(spec, str):
        spec = spec or default
        if spec.strip().lower() == "cpu":
            import torch

            spec = torch.device("cpu")
        return _specs.get_device_spec(spec)
    return spec


def roofline(prof: Any, spec: Any = None, *, achievable: Any = None, precision: str | None = None,
             group_small: float = 0.01) -> RooflineReport:
    """Place every op of ``prof`` (a StepProfile, or anything with ``.ops/.layers/.wall_time_s/.meta``) on the roofline.

    ``spec``: a DeviceSpec or a name for ``get_device_spec``; None -> ``prof.meta["device_name"]`` or "auto".
    ``achievable``: measured roofs (DeviceSpec or name) shown beside the datasheet ones; default ``spec.achievable``.
    ``precision``: force the roof precision of matrix-class ops (e.g. "fp8" for an fp8 what-if on a bf16 run);
    other ops always use their own dtype. ``group_small``: rows under this share of measured time (estimated when
    untimed) AND of FLOPs are grouped into one "(other N ...)" row in tables; totals always include them.
    """
    meta = dict(getattr(prof, "meta", None) or {})
    spec = _resolve(spec, meta.get("device_name") or "auto")
    ach = _resolve(achievable, "") if achievable is not None else getattr(spec, "achievable", None)
    override = _specs.normalize_precision(precision) if precision else None
    tf32 = (meta.get("float32_matmul_precision", "highest") != "highest" and bool(spec.flops.get("tf32")))
    roofs = _Roofs(spec, ach)
    ach_bw = float(ach.bandwidth) if ach is not None and getattr(ach, "bandwidth", None) else None
    ops: list[OpRoof] = []
    for rec in prof.ops:
        p, matrix = _op_precision(rec, spec, tf32, override)
        roof_p, roof_matrix, peak, ach_peak = roofs.get(p, matrix)
        ops.append(OpRoof(rec, p, roof_matrix, peak, float(spec.bandwidth), ach_peak if ach_bw else None,
                          ach_bw if ach_peak else None, roof_p))
    return RooflineReport(ops, spec, meta=meta, layers=dict(getattr(prof, "layers", None) or {}),
                          wall_time_s=getattr(prof, "wall_time_s", None), achievable=ach,
                          group_small=group_small, coverage=_coverage(prof), tf32=tf32, roofs=roofs)


def _coverage(prof: Any) -> float:
    cov = getattr(prof, "coverage", None)
    return float(cov()) if callable(cov) else StepProfile(ops=list(prof.ops)).coverage()



def _render() -> Any:
    return importlib.import_module("tscope_callbacks.report")


def _ancestors(path: str) -> list[str]:
    out = [path]
    while path:
        path = path.rpartition(".")[0]
        out.append(path)
    return out


class RooflineReport:
    """Roofline of one profiled region. Build with :func:`roofline`.

    Row tables (lists of :class:`Row`, largest time first; "time" = measured, or estimated when untimed):
    ``layer_rows`` (layer x phase, self attribution: they sum to ``totals``), ``layer_totals`` (per layer, all phases,
    self), ``inclusive`` (per layer including children; overlapping, never summed), ``category_rows`` (op class),
    ``op_rows`` (op name; view ops folded into one "(view ops)" row). ``totals`` is the whole region.
    ``table(kind, top)`` applies the grouping of small rows. Model-level figures are attributes and ``summary``:
    ``mfu`` counts model FLOPs (``model_flops``: activation-checkpointing recompute excluded), ``hfu`` hardware FLOPs
    (``hardware_flops``: everything that ran); ``scalars()`` has ``hfu`` only when something was recomputed.
    """

    def __init__(self, ops: list[OpRoof], spec: Any, *, meta: dict[str, Any], layers: dict[str, Any],
                 wall_time_s: float | None, achievable: Any, group_small: float, coverage: float, tf32: bool,
                 roofs: _Roofs) -> None:
        self.op_roofs, self.spec, self.achievable, self.meta = ops, spec, achievable, meta
        self.layer_records, self.wall_time_s, self.group_small = layers, wall_time_s, group_small
        self.flop_coverage, self.tf32 = coverage, tf32
        self.profile: Any = None  #: the StepProfile, when the caller attaches it (analyze_model does)
        self.timed = any(o.measured_s is not None for o in ops)
        typ = {k: getattr(v, "type", "") for k, v in layers.items()}

        def lrow(kind: str, layer: str, phase: str) -> Row:
            return Row(layer or "(root)", kind, layer=layer, type=typ.get(layer, ""), phase=phase)

        self.layer_rows = self._rows(lambda o: [(o.record.layer, o.record.phase)],
                                     lambda k: lrow("layer", k[0], k[1]))
        self.layer_totals = self._rows(lambda o: [o.record.layer], lambda k: lrow("layer_total", k, "total"))
        self.inclusive = self._rows(lambda o: _ancestors(o.record.layer), lambda k: lrow("inclusive", k, "total"))
        self.category_rows = self._rows(lambda o: [o.record.category],
                                        lambda k: Row(k, "category", category=k, phase="total"))
        self.op_rows = self._rows(lambda o: ["(view ops)" if o.record.category == "view" else o.record.op],
                                  lambda k: Row(k, "op", phase="total"))
        for r in self.op_rows:
            r.category = r.ops[0].record.category
        self.totals = Row("total", "total", phase="total")
        for o in ops:
            self.totals.add(o)

        t = self.totals
        self.total_flops, self.total_bytes = t.flops, t.bytes
        self.op_time_s = t.measured_s  #: sum of measured op times (None when untimed)
        wall = wall_time_s if wall_time_s and meta.get("device") != "meta" else None  # a meta run's wall is no step
        self.measured_step_s = wall or t.measured_s  #: wall time of the region, else the sum of op times
        self.step_time_source = "wall" if wall else ("ops" if t.measured_s is not None else None)
        self.estimated_step_s = t.estimate_s
        self.dominant_precision = t.precision or "fp32"
        mat: dict[str, int] = {}
        for o in ops:
            if o.matrix and o.flops:
                mat[o.roof_precision] = mat.get(o.roof_precision, 0) + o.flops
        mfu_p = max(mat, key=mat.__getitem__) if mat else self.dominant_precision
        self.mfu_precision, _, self.mfu_peak_flops, _ = roofs.get(mfu_p, True)  #: the matrix roof MFU is against
        self.bandwidth = float(spec.bandwidth)
        step = self.measured_step_s
        #: activation-checkpointing re-forward FLOPs; hardware FLOPs = all ops, model FLOPs = without the recompute
        self.recompute_flops = sum(o.flops for o in ops if o.record.phase == "recompute")
        self.hardware_flops = t.flops
        self.model_flops = t.flops - self.recompute_flops
        self.mfu = _div(_div(self.model_flops, step), self.mfu_peak_flops)  #: model FLOPs utilization
        self.hfu = _div(_div(self.hardware_flops, step), self.mfu_peak_flops)  #: hardware FLOPs utilization
        self.mbu = _div(_div(t.bytes, step), self.bandwidth)
        self.achieved_tflops = _div(_div(t.flops, step), 1e12)  #: what the hardware did (recompute included)
        self.achieved_gbps = _div(_div(t.bytes, step), 1e9)
        self.estimated_mfu = _div(_div(self.model_flops, t.estimate_s), self.mfu_peak_flops)
        self.time_basis = "measured" if self.timed else "estimated"
        frac = {b: 0.0 for b in ("compute", "memory", "uncounted", "overhead")}
        for o in ops:
            frac[o.bound] += (o.measured_s or 0.0) if self.timed else o.estimate_s
        tot = sum(frac.values())
        self.compute_bound_time_frac = _div(frac["compute"], tot)
        self.memory_bound_time_frac = _div(frac["memory"], tot)
        self.uncounted_time_frac = _div(frac["uncounted"], tot)
        self.overhead_time_frac = _div(frac["overhead"], tot)

    def _rows(self, keys: Any, make: Any) -> list[Row]:
        rows: dict[Any, Row] = {}
        for o in self.op_roofs:
            for k in keys(o):
                if k not in rows:
                    rows[k] = make(k)
                rows[k].add(o)
        return sorted(rows.values(), key=self._time, reverse=True)

    def _time(self, r: Row) -> float:
        return (r.measured_s or 0.0) if self.timed else r.estimate_s

    # ---- tables ----
    def table(self, kind: str = "layer", top: int | None = None) -> list[Row]:
        """Rows of ``kind`` ("layer", "layer_total", "category", "op"), rows under ``group_small`` share of time AND
        of FLOPs (and rows past ``top``) grouped into one "(other N ...)" row, so the rows still sum to ``totals``."""
        rows = {"layer": self.layer_rows, "layer_total": self.layer_totals, "category": self.category_rows,
                "op": self.op_rows, "inclusive": self.inclusive}[kind]
        if kind == "inclusive":  # overlapping rows: never grouped into a sum
            return rows[:top] if top is not None else list(rows)
        tot_t, g = self._time(self.totals), self.group_small
        keep: list[Row] = []
        small: list[Row] = []
        for r in rows:
            tiny = (_div(self._time(r), tot_t) or 0.0) < g and (_div(r.flops, self.totals.flops) or 0.0) < g
            (small if tiny or (top is not None and len(keep) >= top) else keep).append(r)
        if len(small) <= 1:
            return keep + small
        unit = {"layer": "layers", "layer_total": "layers", "category": "classes"}.get(kind, "ops")
        other = Row(f"(other {len(small)} {unit})", "other", phase="")
        for r in small:
            for o in r.ops:
                other.add(o)
        return keep + [other]

    def measured_over_estimated(self, categories: Any = MATRIX_CATEGORIES) -> float | None:
        """Aggregate measured / estimated time of the ops in ``categories`` (default: matmul, conv, attention)."""
        ops = [o for o in self.op_roofs if o.record.category in set(categories) and o.measured_s is not None]
        return _div(sum(o.measured_s or 0.0 for o in ops), sum(o.estimate_s for o in ops))

    def category_comparison(self) -> list[dict[str, Any]]:
        """Per op class: measured vs estimated time and their ratio (measured / estimated; 1.0 = on the roof)."""
        return [{"category": r.name, "n_ops": r.n_ops, "measured_s": r.measured_s, "estimated_s": r.estimate_s,
                 "ratio": r.ratio, "achievable_estimated_s": r.achievable_estimate_s,
                 "ratio_achievable": _div(r.measured_s, r.achievable_estimate_s)} for r in self.category_rows]

    def estimated_time_s(self, phase: str | None = None, *, achievable: bool = False) -> float:
        """Sum of per-op roofline estimates (datasheet roof, or the achievable one), optionally for one phase."""
        if phase is not None and phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES} or None, got {phase!r}")
        tot = 0.0
        for o in self.op_roofs:
            if phase is None or o.record.phase == phase:
                tot += (o.achievable_estimate_s or 0.0) if achievable else o.estimate_s
        return tot

    def opportunities(self, top: int = 5) -> list[Opportunity]:
        """Layer x phase rows ranked by recoverable time (estimated time when untimed), each with a reason."""
        explain = _render().explain
        rows = [r for r in self.layer_rows if r.bound != "overhead"]
        if self.timed:
            rows = sorted((r for r in rows if (r.recoverable_s or 0.0) > 0), key=lambda r: -(r.recoverable_s or 0.0))
        tf32 = bool(self.spec.flops.get("tf32"))
        return [Opportunity(r.layer, r.phase, r.type, r.recoverable_s, r.measured_s, r.estimate_s, r.bound,
                            r.intensity, r.ridge, r.attained, explain(r, tf32_available=tf32)) for r in rows[:top]]

    # ---- model level ----
    @property
    def summary(self) -> dict[str, Any]:
        """Model-level figures (JSON-safe); keys listed in ``report.summary_dict``."""
        return _render().summary_dict(self)

    def scalars(self) -> dict[str, float]:
        """DESIGN.md metric keys ``tscope/roofline/*``; figures that do not exist (untimed) are left out."""
        ms = lambda s: None if s is None else s * 1e3  # noqa: E731
        vals = {"mfu": self.mfu, "hfu": self.hfu if self.recompute_flops else None, "mbu": self.mbu,
                "achieved_tflops": self.achieved_tflops,
                "measured_step_ms": ms(self.measured_step_s), "estimated_step_ms": ms(self.estimated_step_s),
                "compute_bound_time_frac": self.compute_bound_time_frac,
                "memory_bound_time_frac": self.memory_bound_time_frac, "flop_coverage": self.flop_coverage}
        return {METRIC_PREFIX + k: float(v) for k, v in vals.items() if v is not None and math.isfinite(v)}

    # ---- rendering (report.py / plot.py) ----
    def to_markdown(self, top: int = 20) -> str:
        """Markdown: header figures, layer x phase table, op-class comparison, opportunities."""
        return _render().to_markdown(self, top=top)

    def to_csv(self, path: Any) -> None:
        """Every row of every table, ungrouped."""
        _render().to_csv(self, path)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (``json.dumps`` works: no inf/nan)."""
        return _render().to_dict(self)

    def to_console(self, top: int = 20, console: Any = None) -> None:
        """Print with rich when installed, plain markdown otherwise."""
        _render().to_console(self, top=top, console=console)

    def figure(self, top_labels: int = 8) -> Any:
        """The roofline as a matplotlib Figure (no pyplot state)."""
        return importlib.import_module("tscope_callbacks.plot").figure(self, top_labels=top_labels)

    def plot(self, path: Any, top_labels: int = 8) -> Any:
        """Write the roofline PNG to ``path``."""
        return importlib.import_module("tscope_callbacks.plot").plot(self, path, top_labels=top_labels)

    def __repr__(self) -> str:
        return (f"RooflineReport(device={self.spec.name!r}, ops={len(self.op_roofs)}, flops={self.total_flops}, "
                f"mfu={self.mfu}, estimated_step_s={self.estimated_step_s:.3g})")


# ``ts.roofline`` is this module once it is imported (it shares the function's name): calling it calls the function
from tscope_callbacks._callable_module import make_module_callable  # noqa: E402

make_module_callable(__name__)
