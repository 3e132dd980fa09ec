"""Roofline analysis: op records + a DeviceSpec -> :class:`RooflineAnalysis` (pure functions, no torch).

Per op (DESIGN.md "Counting semantics"): the precision actually used (TF32 for fp32 matrix ops when
``float32_matmul_precision`` allows it and the chip has TF32), the roof for it (matrix roof for matmul/conv/attention,
vector roof otherwise), intensity = flops/bytes, ridge = peak/bandwidth, bound, estimate = max(flops/peak,
bytes/bandwidth), attained = estimate/measured ("% of roof") and recoverable = max(0, measured - estimate).
Rows aggregate ops per layer x phase (self attribution, so rows never double count), per layer, per layer
inclusive of children, per op class and per op name. The caller resolves the device (``api.analyze``);
``analysis.analyze.report_of`` reads the analysis, its findings and its noise into the typed report every output
renders.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tscope_callbacks.analysis.basis import time_of
from tscope_callbacks.analysis.estimate import expected_s
from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.fmt import time_text
from tscope_callbacks.analysis.report import Row
from tscope_callbacks.analysis.roofs import beaten as _beaten
from tscope_callbacks.analysis.roofs import widen as _widen
from tscope_callbacks.analysis.rows import OpRoof, sum_row
from tscope_callbacks.capture.paths import ancestors
from tscope_callbacks.devices.efficiency import KernelModel, model_for
from tscope_callbacks.devices.precision import normalize_precision, precision_for_dtype, tf32_enabled
from tscope_callbacks.devices.spec import DeviceSpec
from tscope_callbacks.records import (
    MATRIX_CATEGORIES,
    PHASES,
    CaptureInfo,
    LayerRecord,
    OpRecord,
    StepProfile,
    model_flops,
)

__all__ = ["build_roofline", "RooflineAnalysis"]


def _rate(spec: DeviceSpec, p: str, matrix: bool) -> tuple[str, bool, float] | None:
    """(roof precision, matrix roof?, FLOP/s) that ``spec`` uses for ``p``; None when it has none. The TF32 rule is
    applied by the caller from the profile's info, never from this process's torch settings (allow_tf32=False)."""
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

    def __init__(self, spec: DeviceSpec, ach: DeviceSpec | None) -> None:
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


def _op_precision(rec: OpRecord, spec: DeviceSpec, tf32: bool, override: str | None) -> tuple[str, bool]:
    matrix = rec.category in MATRIX_CATEGORIES
    try:
        p = precision_for_dtype(rec.dtype) if rec.dtype else "fp32"
    except (KeyError, ValueError, TypeError):
        p = "fp32"
    if matrix and override:
        p = override
    elif matrix and p == "fp32" and tf32:
        p = "tf32"
    return p, matrix


def _ran(ops: list) -> str:
    """The precision that ran most (FLOPs; bytes when no op has FLOPs): an op's precision where its dtype is a
    float, else its dtype (``int64``, ``bool``), which the roofline places on the fp32 vector roof."""
    by: dict[str, int] = {}
    for o in ops:
        r = o.record
        if r.category == "view":
            continue
        try:
            precision_for_dtype(r.dtype, default=None)
            label = o.precision
        except (ValueError, KeyError, TypeError):
            label = r.dtype or o.precision
        by[label] = by.get(label, 0) + (r.flops or r.bytes)
    if not by:
        return ""
    return max(by, key=by.__getitem__)


def build_roofline(prof: StepProfile, spec: DeviceSpec, *, achievable: DeviceSpec | None = None,
                   precision: str | None = None, group_small: float = 0.01,
                   kernel_model: bool | KernelModel | None = True) -> RooflineAnalysis:
    """Place every op of ``prof`` on the roofline.

    ``spec``: a resolved DeviceSpec (``devices.resolve.get_device_spec`` turns names into one; analysis never
    measures). ``achievable``: measured roofs (a DeviceSpec) shown beside the datasheet ones; default
    ``spec.achievable``.
    ``precision``: force the roof precision of matrix-class ops (e.g. "fp8" for an fp8 what-if on a bf16 run);
    other ops always use their own dtype. ``group_small``: rows under this share of measured time (estimated when
    untimed) AND of FLOPs are grouped into one "(other N ...)" row in tables; totals always include them.
    ``kernel_model``: True (default) predicts each op's shape-aware kernel time with the device's measured
    efficiency (``devices.efficiency.model_for``; none for CPU roofs); False keeps pure roofline bounds; or a
    ``KernelModel``.
    """
    info = prof.info
    ach = achievable if achievable is not None else getattr(spec, "achievable", None)
    override = normalize_precision(precision) if precision else None
    tf32 = tf32_enabled(info.float32_matmul_precision or "highest") and bool(spec.flops.get("tf32"))
    roofs = _Roofs(spec, ach)
    ach_bw = float(ach.bandwidth) if ach is not None and getattr(ach, "bandwidth", None) else None
    model = model_for(spec) if kernel_model is True else (kernel_model or None)
    ops: list[OpRoof] = []
    for rec in prof.ops:
        p, matrix = _op_precision(rec, spec, tf32, override)
        roof_p, roof_matrix, peak, ach_peak = roofs.get(p, matrix)
        ops.append(OpRoof(rec, p, roof_matrix, peak, float(spec.bandwidth), ach_peak if ach_bw else None,
                          ach_bw if ach_peak else None, roof_p, expected_s(rec, roof_p, model),
                          getattr(spec, "link_bandwidth", None)))
    notes = _widen(ops, spec) if getattr(spec, "measured", False) else _beaten(ops)
    return RooflineAnalysis(ops, spec, info=info, layers=dict(prof.layers), wall_time_s=prof.wall_time_s,
                            achievable=ach, group_small=group_small, coverage=prof.coverage(), tf32=tf32, roofs=roofs,
                            kernel_model=model, roof_notes=tuple(notes))


def _mfu_roof(ops: list[OpRoof], roofs: _Roofs, spec: DeviceSpec, fallback: str) -> tuple[str, float]:
    """(precision, FLOP/s) of the matrix roof MFU is against: the precision of most matrix FLOPs; a measured roof
    raised by ``_widen`` counts raised."""
    mat: dict[str, int] = {}
    for o in ops:
        if o.matrix and o.flops:
            mat[o.roof_precision] = mat.get(o.roof_precision, 0) + o.flops
    mfu_p = max(mat, key=mat.__getitem__) if mat else (fallback or "fp32")
    precision, _, peak, _ = roofs.get(mfu_p, True)
    widened = [o.peak for o in ops if o.matrix and o.roof_precision == precision]
    if widened and getattr(spec, "measured", False):
        peak = max(peak, max(widened))
    return precision, peak


def _bound_fractions(ops: list[OpRoof], timed: bool) -> dict[str, float | None]:
    """The share of op time (measured; expected when untimed) per bound."""
    frac = {b: 0.0 for b in ("compute", "memory", "comm", "uncounted", "overhead")}
    for o in ops:
        frac[o.bound] += time_of(o, timed)
    tot = sum(frac.values())
    return {b: _div(v, tot) for b, v in frac.items()}


class RooflineAnalysis:
    """Roofline of one profiled region, the analysis' working object (``analysis.analyze`` reads it into the report;
    users never see it). Build with :func:`build_roofline`.

    Row tables (frozen ``analysis.report.Row``, largest time first; "time" = measured, or estimated when untimed):
    ``layer_rows`` (layer x phase, self attribution: they sum to ``totals``), ``layer_totals`` (per layer, all phases,
    self), ``inclusive`` (per layer including children; overlapping, never summed), ``category_rows`` (op class),
    ``op_rows`` (op name; view ops folded into one "(view ops)" row). ``totals`` is the whole region; ``row_ops``
    the ops of each layer x phase row. Model-level figures are attributes: ``mfu`` counts model FLOPs
    (``model_flops``: activation-checkpointing recompute and the optimizer update excluded), ``hfu`` hardware FLOPs
    (``hardware_flops``: everything that ran).
    """

    def __init__(self, ops: list[OpRoof], spec: DeviceSpec, *, info: CaptureInfo, layers: dict[str, LayerRecord],
                 wall_time_s: float | None, achievable: DeviceSpec | None, group_small: float, coverage: float,
                 tf32: bool, roofs: _Roofs, kernel_model: KernelModel | None = None,
                 roof_notes: tuple[str, ...] = ()) -> None:
        self.op_roofs, self.spec, self.achievable, self.info = ops, spec, achievable, info
        self.kernel_model = kernel_model  #: the devices.efficiency.KernelModel behind ``expected_s`` (None: roofs only)
        self.roof_notes = roof_notes  #: measured roofs widened where an op beat them, datasheet roofs beaten
        self.layer_records, self.wall_time_s, self.group_small = layers, wall_time_s, group_small
        self.flop_coverage, self.tf32 = coverage, tf32
        self.timed = any(o.measured_s is not None for o in ops)
        self._build_rows(layers)
        t = self.totals
        self.total_flops, self.total_bytes = t.flops, t.bytes
        self.op_time_s = t.measured_s  #: sum of measured op times (None when untimed)
        # The step time MFU/MBU use: the step as it runs unprofiled, never the wall time of the captured region
        # (capture slows the host). Given by the capture or its caller: "unprofiled-median" (callbacks: median of
        # the unprofiled steps around the profile), "device-busy" (CUDA: union of kernel intervals), "op-time" (CPU:
        # summed op times); a profile without it uses its summed op times.
        if info.step_time_s:
            self.measured_step_s: float | None = float(info.step_time_s)
            self.step_time_source: str | None = info.step_time_basis or "given"
        else:
            self.measured_step_s = t.measured_s if info.device != "meta" else None
            self.step_time_source = "op-time" if self.measured_step_s is not None else None
        self.estimated_step_s = t.expected_s  #: sum of shape-aware expected kernel times (roof bound where none)
        self.roof_step_s = t.estimate_s  #: sum of roofline bounds (datasheet)
        #: what ran most (FLOPs; bytes for ops without FLOPs): a float precision, or the dtype of integer/bool
        #: ops (an integer-only model is "int64", not the fp32 roof its ops are placed on)
        self.dominant_precision = _ran(ops) or t.precision or "fp32"
        self.mfu_precision, self.mfu_peak_flops = _mfu_roof(ops, roofs, spec, t.precision)  #: MFU's matrix roof
        self.bandwidth = float(spec.bandwidth)
        step = self.measured_step_s
        #: activation-checkpointing re-forward FLOPs; hardware FLOPs = all ops, model FLOPs = without the recompute
        self.recompute_flops = sum(o.flops for o in ops if o.record.phase == "recompute")
        self.hardware_flops = t.flops
        #: MFU's FLOPs (``records.model_flops``, the automatic MFU windows' too): forward and backward, attention
        #: backward as 2x its forward, causal attention under the profile's convention (``attention_flops``)
        self.model_flops = model_flops([o.record for o in ops], info.attention_flops or "attended")
        self.mfu = _div(_div(self.model_flops, step), self.mfu_peak_flops)  #: model FLOPs utilization
        self.hfu = _div(_div(self.hardware_flops, step), self.mfu_peak_flops)  #: hardware FLOPs utilization
        self.mbu = _div(_div(t.bytes, step), self.bandwidth)
        self.achieved_tflops = _div(_div(t.flops, step), 1e12)  #: what the hardware did (recompute included)
        self.achieved_gbps = _div(_div(t.bytes, step), 1e9)
        #: the same at the expected step time (an estimate's figures; a measured step's too, for comparison)
        self.estimated_mfu = _div(_div(self.model_flops, t.expected_s), self.mfu_peak_flops)
        self.estimated_hfu = _div(_div(self.hardware_flops, t.expected_s), self.mfu_peak_flops)
        self.estimated_mbu = _div(_div(t.bytes, t.expected_s), self.bandwidth)
        self.time_basis = "measured" if self.timed else "estimated"
        frac = _bound_fractions(ops, self.timed)
        self.compute_bound_time_frac, self.memory_bound_time_frac = frac["compute"], frac["memory"]
        self.uncounted_time_frac, self.overhead_time_frac = frac["uncounted"], frac["overhead"]
        self.comm_time_frac = frac["comm"]

    def _build_rows(self, layers: dict[str, LayerRecord]) -> None:
        """The row tables: layer x phase, layer, inclusive, op class, op name, and the totals."""
        typ = {k: getattr(v, "type", "") for k, v in layers.items()}
        by = self._group(lambda o: [(o.record.layer, o.record.phase)])
        self.row_ops: dict[tuple[str, str], list[OpRoof]] = by
        self.layer_rows = self._sorted(sum_row(k[0] or "(root)", "layer", v, layer=k[0], type=typ.get(k[0], ""),
                                               phase=k[1]) for k, v in by.items())
        self.layer_totals = self._sorted(
            sum_row(k or "(root)", "layer_total", v, layer=k, type=typ.get(k, ""), phase="total")
            for k, v in self._group(lambda o: [o.record.layer]).items())
        self.inclusive = self._sorted(
            sum_row(k or "(root)", "inclusive", v, layer=k, type=typ.get(k, ""), phase="total")
            for k, v in self._group(lambda o: ancestors(o.record.layer)).items())
        self.category_rows = self._sorted(sum_row(k, "category", v, category=k, phase="total")
                                          for k, v in self._group(lambda o: [o.record.category]).items())
        self.op_rows = self._sorted(
            sum_row(k, "op", v, phase="total", category=v[0].record.category)
            for k, v in self._group(lambda o: ["(view ops)" if o.record.category == "view" else o.record.op]).items())
        self.totals = sum_row("total", "total", self.op_roofs, phase="total")

    def _group(self, keys: Callable[[OpRoof], list[Any]]) -> dict[Any, list[OpRoof]]:
        out: dict[Any, list[OpRoof]] = {}
        for o in self.op_roofs:
            for k in keys(o):
                out.setdefault(k, []).append(o)
        return out

    def _sorted(self, rows: Iterable[Row]) -> list[Row]:
        return sorted(rows, key=lambda r: time_of(r, self.timed), reverse=True)

    def expected_time_s(self, phase: str | None = None) -> float:
        """Sum of the shape-aware expected kernel times (roofline bound where no model applies), optionally for one
        phase."""
        if phase is not None and phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES} or None, got {phase!r}")
        return sum(o.expected_s for o in self.op_roofs if phase is None or o.record.phase == phase)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(device={self.spec.name!r}, ops={len(self.op_roofs)}, flops={self.total_flops}, "
                f"mfu={self.mfu}, estimated_step_s={time_text(self.estimated_step_s)})")
