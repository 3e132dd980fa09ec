"""One profiled step, analysed once: :class:`ReportData`, the frozen, typed content of the report (pure: no torch, no
hooks, no renderer), and the types it is made of.

``analysis.analyze.analyze(profile, spec, options)`` places every op of a StepProfile on ``spec``'s roofline
(``analysis.roofline``), then reads everything an output needs into one frozen, typed object. Every output
(markdown, CSV, JSON, plot, console, the callbacks' sinks, the dashboard) is a function of it alone. Users get it as
``tscope_callbacks.StepReport`` (``tscope_callbacks.report``: the same with its renderings one call away).

JSON (``report.to_dict()`` / ``StepReport.from_dict(d)``; ``json.dumps(d, allow_nan=False)`` works and
``to_dict(from_dict(d)) == d``)::

    schema: "tscope.step_report"   version: 3
    step: int | null    stage: "train"|"validation"|...|null    run: str | null    created: ISO time (UTC)
    device: {name, source, vendor, measured, bandwidth (B/s), peaks: {precision: FLOP/s},
             achievable: {name, bandwidth, peaks} | null, memory_bytes | null, link_bandwidth | null,
             link_name | null, load_per_cpu | null}
    summary: the model-level figures of the roofline (Summary: device, roof, step times and their basis, MFU/HFU/MBU,
             FLOP and byte totals, bound fractions, precisions, uncounted ops...)
    memory: {peak_bytes, device_bytes, fits, verdict, share, states_bytes, rest_bytes, shard_over, basis,
             categories: {weights, grads, optimizer_state, activations_saved, step_tracked_peak, sharded_params...}}
             | null (no memory figures: a profile without layer details)
    time_split: {compute_bound_s, memory_bound_s, communication_s, uncounted_s, overhead_s, idle_s, input_s, basis,
                 step_s}
    rows: {layer_phase, layer, inclusive, category, op_name, total: [Row]}
          Row: the stored sums {name, kind, layer, type, phase, category, n_ops, n_work, flops, bytes, measured_s,
          estimate_s, expected_s, achievable_estimate_s, compute_s, uncounted_s, uncounted_ops, largest_matmul,
          largest_matmul_flops, precisions, peaks, bandwidth, all_comm} and, derived from them (ignored on read):
          precision, intensity, ridge, bound, attained, pct_of_roof, attained_achievable, recoverable_s, ratio,
          expected_ratio, calls, counted_share
    ops: [OpRow]  every op in execution order: {i, op, layer, phase, category, flops, model_flops, bytes, time_s,
          estimate_s, expected_s, pct_of_roof, bound, precision, roof_precision, matrix, peak, dtype, input_shapes,
          output_shapes, counted, start_s}
    layers: [LayerInfo]  the LayerRecord fields (path, type, calls, num_parameters, shapes, memory, times, FLOPs,
          bytes, nonfinite_* flags); memory_fwd_bytes, memory_bwd_bytes, peak_fwd_bytes, peak_bwd_bytes and
          saved_bytes are null when the step's per-layer memory was not measured (no layer details)
    roofs: [RoofUsed]  the roofs the ops were placed on, most FLOPs first
    model: {params, params_trainable, size_mb, flops_forward, flops_step, macs_forward, macs_step, micro_batches,
          activations_mb, activations_source, forward_ms, batch, samples_per_s, tokens_per_s} | null (the step
          time per batch is the summary's: measured_step_s, else estimated_step_s)
    communication: {rows: [...], overlap: {...} | null, skew: {...} | null} | null   (null: no collectives)
    fsdp_whatif: {...} (analysis.fsdp.fsdp_whatif) | null      compiled_vs_eager: [...] | null
    what_if: {measured_on, roofs_of} | null   (times of one device placed on another's roofs)
    opportunities: [Opportunity]  {layer, phase, type, kind, cause, change, saving_s, recoverable_s, measured_s,
          estimate_s, bound, intensity, ridge, attained, evidence, rows: [[layer, phase]], predicted_by,
          predicted_text, measured_ratio, measured_on, op, title, saving_frac}, largest saving first; each names a change
    below_roof: [BelowRoof]  {layer, phase, type, measured_s, expected_s, recoverable_s, attained, cause}: rows below
          their roof for which no change is known (not opportunities), by recoverable time
    nonfinite: [{step, layer, op, phase, line, kind}]
    grad_spikes: [{step, norm, median, ratio, layer, layer_ratio, loss, loss_median, lr}]   the NaN guard's gradient
          spikes (``analysis.grad_history.GradHistory.add``) up to this step; [] when none were passed
    noise: {steps, floor_s, marks: [...], spread: [[layer, phase, s]], suppressed: [Opportunity]}
    context: the run's facts the report prints (RunContext: timing, model name, float32 matmul precision, step-time
          window and spread, environment, compiled capture, roof notes, merged steps, capture cost, ...)
    user: {}   the user's own data (the only free dict)

Each figure is stored once. Derived from the stored sections (properties, not in the JSON): ``header`` (the headline
figures with their unit and basis: what the page's cards show; the page's served step carries it,
``render.dashboard.page_step``), ``scalars`` (the roofline figures the callback logs as ``tscope/roofline/<key>``)
and ``area_scalars`` (the other areas it logs: comm, memory, model, fsdp_whatif).

The step file ``<log_dir>/tscope/step_<N>.json`` is ``{"profile": StepProfile.to_dict(), "device":
DeviceSpec.to_dict() | null, "report": <this dict> | null}`` (``report`` null: no device roof); a file holding this
dict at its top level is read too. :func:`read_step_report` reads either; a file of another version is refused in one
line (:class:`StepFileError`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from tscope_callbacks.analysis.basis import step_time_of, time_of
from tscope_callbacks.analysis.fmt import bw_text
from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.records import StepProfile

__all__ = ["SCHEMA", "VERSION", "ALERTS_FILE", "ReportData", "read_step_report", "read_step_json", "step_file",
           "comm_scalars", "model_scalars", "step_file_name", "parse_step_file_name", "STEP_FILE_KINDS",
           "read_alerts_file", "not_a_step_file", "StepFileError", "Figure", "DeviceInfo", "Summary", "MemorySection",
           "TimeSplit", "Row", "OpRow",
           "LayerInfo", "RoofUsed", "Opportunity", "BelowRoof", "NoiseSection", "NoiseMarkInfo", "RunContext", "WhatIf",
           "merge_rows", "json_safe"]

SCHEMA = "tscope.step_report"
VERSION = 3
#: ``<log_dir>/tscope/alerts.jsonl``: every alert of a run (the step monitor's, the NaN guard's), one JSON object a
#: line (``step``, ``key``, ``title``, ``text``), whatever the logger: what an offline dashboard shows without events
ALERTS_FILE = "alerts.jsonl"


def json_safe(x: Any) -> Any:
    """Recursively: inf/nan -> None, tuples -> lists, keys -> str (``json.dumps(allow_nan=False)`` works)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def _fin(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


# ---------------------------------------------------------------------------------------------------------- types
@dataclass(frozen=True)
class Figure:
    """A header figure with its unit and basis (what it was measured or estimated from)."""

    value: float | None
    unit: str
    basis: str


@dataclass(frozen=True)
class AchievableInfo:
    name: str
    bandwidth: float | None
    peaks: dict[str, float]


@dataclass(frozen=True)
class DeviceInfo:
    """The device whose roofs the ops were placed on."""

    name: str
    source: str
    vendor: str
    measured: bool
    bandwidth: float
    peaks: dict[str, float]
    achievable: AchievableInfo | None
    memory_bytes: int | None
    link_bandwidth: float | None
    link_name: str | None
    load_per_cpu: float | None  #: other processes' load while a CPU roof was measured


@dataclass(frozen=True)
class Summary:
    """The model-level figures of the roofline (``analysis.summary.summary_dict``)."""

    device: str
    device_source: str
    roof: str  #: "measured" | "datasheet"
    achievable_roof: str | None
    model: str | None
    step: int | None
    timed: bool
    timing: str | None
    float32_matmul_precision: str | None
    tf32: bool
    n_ops: int
    total_flops: int
    total_bytes: int
    intensity: float | None
    measured_step_s: float | None
    step_time_source: str | None
    step_time_basis_text: str
    device_idle_s: float | None
    device_busy_s: float | None
    wall_time_s: float | None
    op_time_s: float | None
    estimated_step_s: float
    roof_step_s: float
    kernel_model: str | None
    achievable_estimated_step_s: float | None
    mfu: float | None
    hfu: float | None
    model_flops: int
    hardware_flops: int
    recompute_flops: int
    mfu_precision: str
    mfu_peak_flops: float
    estimated_mfu: float | None
    mbu: float | None
    bandwidth: float
    achieved_tflops: float | None
    achieved_gbps: float | None
    time_basis: str
    compute_bound_time_frac: float | None
    memory_bound_time_frac: float | None
    uncounted_time_frac: float | None
    overhead_time_frac: float | None
    comm_time_frac: float | None
    flop_coverage: float
    dominant_precision: str
    precisions: dict[str, int]
    uncounted_ops: dict[str, int]
    capture_cost: dict[str, float | int] | None
    group_small: float  #: the share of time and FLOPs under which table rows are grouped
    has_kernel_model: bool
    has_achievable: bool
    #: HFU and MBU at the expected step time, as ``estimated_mfu`` (optional: older step files load without them)
    estimated_hfu: float | None = None
    estimated_mbu: float | None = None


@dataclass(frozen=True)
class MemorySection:
    """The step's memory by category (``capture.step_memory``) and whether it fits the device
    (``analysis.memory_fit``)."""

    peak_bytes: int | None
    device_bytes: int | None
    fits: bool | None  #: None: the device's memory is unknown (or a what-if)
    verdict: str  #: "fits" | "tight" | "does not fit" | "" (unknown)
    share: float | None
    states_bytes: int | None  #: weights + gradients + optimizer state
    rest_bytes: int | None  #: the step's own tracked peak (activations, temporaries, new gradients)
    shard_over: int | None
    basis: str
    categories: dict[str, int | float | None]  #: weights, grads, optimizer_state, activations_saved, ... (bytes)


@dataclass(frozen=True)
class TimeSplit:
    """The step's op time by bound (seconds; measured, or estimated when untimed: ``basis``), and ``idle_s``, the rest
    of the measured step: ``step_s`` (the unprofiled steps' median, MFU's basis) minus the measured op time -- on
    CUDA the device doing no op work, on CPU host time between ops (Python, hooks, data loading). The parts add up to
    ``step_s``: when the profiled ops took longer than the unprofiled step (the capture slowed them), the op parts
    are their times x ``scale`` (step / op time, below 1; the basis says so) and ``idle_s`` is 0. ``idle_s`` is None
    without a measured step (a capture's own wall time is slowed by the capture: never a basis).
    ``input_s`` is the host's wait for each batch, a figure beside the split, not a part of it (on a GPU the device
    may still be running queued work while the host waits)."""

    compute_bound_s: float
    memory_bound_s: float
    communication_s: float
    uncounted_s: float
    overhead_s: float
    idle_s: float | None
    input_s: float | None  #: data-loading wait (None until a step monitor fills it)
    basis: str
    #: the data wait's share of the step and the clean steps it is the median of (the step monitor's)
    input_share: float | None = None
    input_steps: int | None = None
    #: the step is input-bound: the step monitor's verdict (its threshold, over its verdict window)
    input_bound: bool = False
    input_fixes: tuple[str, ...] = ()  #: what to change in the DataLoader, read from its settings
    step_s: float | None = None  #: the measured step the parts add up to (None: untimed, or no step measured)
    scale: float = 1.0  #: the factor the op parts were scaled by to add up to the step (1: not scaled)
    input_step_s: float | None = None  #: those steps' mean time, the basis of ``input_share`` (the monitor's)


class RowFigures:
    """The figures a table row derives from its sums (both the analysis' accumulating row and the report's frozen
    one): dominant precision, intensity, effective ridge, bound, % of roof, recoverable time and the ratios. The row
    provides ``flops``, ``bytes``, ``compute_s``, ``precisions``, ``peaks``, ``bandwidth``, ``n_work``,
    ``uncounted_ops``, ``all_comm``, ``measured_s``, ``estimate_s``, ``expected_s`` and ``achievable_estimate_s``."""

    flops: int
    bytes: int
    compute_s: float
    precisions: dict[str, int]
    peaks: dict[str, float]
    bandwidth: float
    n_work: int
    uncounted_ops: dict[str, int]
    measured_s: float | None
    estimate_s: float
    expected_s: float
    achievable_estimate_s: float | None
    layer: str
    type: str

    @property
    def all_comm(self) -> bool:  # overridden by a field or property of the row
        return False

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
        peak = _div(self.flops, self.compute_s) or self.peaks.get(self.precision)
        return _div(peak, self.bandwidth)

    @property
    def bound(self) -> str:
        if self.all_comm:
            return "comm"
        if not self.n_work:
            return "uncounted" if self.uncounted_ops else "overhead"
        if self.bytes == 0:
            return "compute"
        return "compute" if (self.intensity or 0.0) >= (self.ridge or math.inf) else "memory"

    @property
    def attained(self) -> float | None:
        """Fraction of the (datasheet) roof: estimate / measured; None for rows with no work to place on a roof (no
        FLOPs, no bytes: views, metadata ops), whose 0% read as far below it."""
        return _div(self.estimate_s, self.measured_s) if self.estimate_s else None

    @property
    def attained_achievable(self) -> float | None:
        return _div(self.achievable_estimate_s, self.measured_s)

    @property
    def recoverable_s(self) -> float | None:
        """Measured time above the shape-aware expectation (what a better kernel or less overhead would save)."""
        return None if self.measured_s is None else max(0.0, self.measured_s - self.expected_s)

    @property
    def ratio(self) -> float | None:
        """measured / roofline bound (1.0 = on the roof)."""
        return _div(self.measured_s, self.estimate_s)

    @property
    def expected_ratio(self) -> float | None:
        """measured / shape-aware expectation (1.0 = as fast as the library does this shape)."""
        return _div(self.measured_s, self.expected_s)


def comm_scalars(communication: dict[str, Any] | None, skew: dict[str, float] | None = None) -> dict[str, float]:
    """The communication section's figures by bare names (the callbacks log them under ``tscope/comm/``): calls,
    bytes_mb, time_ms, busbw_gbps (the timed rows' link bytes over their time), and from the kernel timeline
    exposed_comm_ms and overlap_frac (a step that ran collectives), skew_max_wait_ms and skew_spread_ms (the ranks'
    step-time skew: the section's, else ``skew``, the capture's)."""
    c = communication or {}
    rows, ov, sk = c.get("rows") or [], c.get("overlap"), c.get("skew") or skew
    out: dict[str, float] = {}
    if rows:
        out["calls"] = float(sum(r["calls"] for r in rows))
        out["bytes_mb"] = sum(r["bytes"] for r in rows) / 2**20
        t = [r["time_s"] for r in rows if r["time_s"] is not None]
        if t:
            out["time_ms"] = sum(t) * 1e3
        bw = [r for r in rows if r.get("busbw") is not None]
        if bw:
            out["busbw_gbps"] = sum(r["link_bytes"] for r in bw) / sum(r["time_s"] for r in bw) / 1e9
    if ov and ov.get("comm_s"):  # a step that ran collectives (every CUDA capture has an overlap without them)
        if ov.get("exposed_comm_s") is not None:
            out["exposed_comm_ms"] = ov["exposed_comm_s"] * 1e3
        if ov.get("overlap_frac") is not None:
            out["overlap_frac"] = float(ov["overlap_frac"])
        # (the span's idle time is not logged: the capture slows the host, so the GPU idles more inside it than in
        # the step -- an H200 GPT-2 capture's 341 ms against 1.5 ms of a 56 ms step)
    if sk:
        out["skew_max_wait_ms"] = sk["max_wait_s"] * 1e3
        out["skew_spread_ms"] = sk["spread_s"] * 1e3
    return out


def model_scalars(model: dict[str, Any] | None, step_s: float | None = None) -> dict[str, float]:
    """The model summary (``analysis.model_summary``) as bare scalar names (the callbacks log them as
    ``tscope/model/*``); ``latency_ms`` is the step time ``step_s`` (``analysis.basis.step_time_of``: stored once, in
    the summary)."""
    s = dict(model or {}, latency_ms=None if not step_s else step_s * 1e3)
    keys = {"params": ("params_m", 1e-6), "params_trainable": ("params_trainable_m", 1e-6), "size_mb": ("size_mb", 1),
            "activations_mb": ("activations_mb", 1), "flops_forward": ("gflops_forward", 1e-9),
            "flops_step": ("gflops_step", 1e-9), "macs_step": ("gmacs_step", 1e-9), "latency_ms": ("latency_ms", 1),
            "samples_per_s": ("samples_per_s", 1), "tokens_per_s": ("tokens_per_s", 1)}
    return {name: float(s[k]) * scale for k, (name, scale) in keys.items() if s.get(k) is not None}


def layer_point_rows(rows: typing.Iterable[RowFigures]) -> list[dict[str, Any]]:
    """Per layer row (all phases, self attribution): where it sits on the roofline, as table rows (JSON-safe): the
    ``tscope/roofline/layers`` table and the W&B scatter. Rows without FLOPs and bytes are left out."""
    def fin(v: float | None) -> float | None:
        return v if v is not None and math.isfinite(v) else None

    out = []
    for r in rows:
        if r.flops == 0 and r.bytes == 0:
            continue
        ms = r.measured_s
        out.append({
            "layer": r.layer or "(root)", "type": r.type, "bound": r.bound, "intensity": fin(r.intensity),
            "achieved_gflops_per_s": fin(r.flops / ms / 1e9) if ms else None, "gflops": r.flops / 1e9,
            "mb": r.bytes / 2**20, "measured_ms": ms * 1e3 if ms is not None else None,
            "estimated_ms": r.expected_s * 1e3, "roof_ms": r.estimate_s * 1e3, "attained": fin(r.attained),
        })
    return out


@dataclass(frozen=True)
class Row(RowFigures):
    """A table row: the sums over a set of ops (a layer x phase, a layer, an op class, an op name, a group of small
    rows, the total). Derived figures are properties of the stored sums."""

    name: str
    kind: str  #: "layer" | "layer_total" | "inclusive" | "category" | "op" | "other" | "total"
    layer: str = ""
    type: str = ""
    phase: str = ""
    category: str = ""
    n_ops: int = 0
    n_work: int = 0
    flops: int = 0
    bytes: int = 0
    measured_s: float | None = None
    estimate_s: float = 0.0
    expected_s: float = 0.0
    achievable_estimate_s: float | None = None
    compute_s: float = 0.0
    uncounted_s: float = 0.0
    uncounted_ops: dict[str, int] = field(default_factory=dict)
    largest_matmul: tuple[int, ...] | None = None
    largest_matmul_flops: int = 0
    precisions: dict[str, int] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)
    bandwidth: float = 0.0
    all_comm: bool = False  #: every op is a collective

    @property
    def calls(self) -> int:
        return self.n_ops

    @property
    def counted_share(self) -> float | None:
        """The share of the row's ops that have a FLOP formula."""
        return _div(self.n_ops - sum(self.uncounted_ops.values()), self.n_ops)

    def _derived(self) -> dict[str, Any]:
        return {"precision": self.precision, "intensity": self.intensity, "ridge": self.ridge, "bound": self.bound,
                "attained": self.attained, "pct_of_roof": self.attained, "attained_achievable": self.attained_achievable,
                "recoverable_s": self.recoverable_s, "ratio": self.ratio, "expected_ratio": self.expected_ratio,
                "calls": self.calls, "counted_share": self.counted_share}


def merge_rows(name: str, kind: str, rows: list[Row], phase: str = "") -> Row:
    """One row summing ``rows`` (the "(other N ...)" group of a table), as if its ops had been added one by one."""
    measured = [r.measured_s for r in rows if r.measured_s is not None]
    ach = [r.achievable_estimate_s for r in rows if r.achievable_estimate_s is not None]
    unc: dict[str, int] = {}
    prec: dict[str, int] = {}
    peaks: dict[str, float] = {}
    mm, mm_flops = None, 0
    for r in rows:
        for k, v in r.uncounted_ops.items():
            unc[k] = unc.get(k, 0) + v
        for k, v in r.precisions.items():
            prec[k] = prec.get(k, 0) + v
        for k, v in r.peaks.items():
            peaks.setdefault(k, v)
        if r.largest_matmul is not None and r.largest_matmul_flops > mm_flops:
            mm, mm_flops = r.largest_matmul, r.largest_matmul_flops
    return Row(name, kind, phase=phase, n_ops=sum(r.n_ops for r in rows), n_work=sum(r.n_work for r in rows),
               flops=sum(r.flops for r in rows), bytes=sum(r.bytes for r in rows),
               measured_s=sum(measured) if measured else None, estimate_s=sum(r.estimate_s for r in rows),
               expected_s=sum(r.expected_s for r in rows), achievable_estimate_s=sum(ach) if ach else None,
               compute_s=sum(r.compute_s for r in rows), uncounted_s=sum(r.uncounted_s for r in rows),
               uncounted_ops=unc, largest_matmul=mm, largest_matmul_flops=mm_flops, precisions=prec, peaks=peaks,
               bandwidth=next((r.bandwidth for r in reversed(rows) if r.bandwidth), 0.0),
               all_comm=bool(rows) and all(r.all_comm for r in rows))


@dataclass(frozen=True)
class OpRow:
    """One op on its roof, in execution order."""

    i: int  #: its position in the profile's execution order (``OpRecord.index``)
    op: str
    layer: str
    phase: str
    category: str
    flops: int
    model_flops: int
    bytes: int
    time_s: float | None
    estimate_s: float
    expected_s: float
    achievable_estimate_s: float | None
    bound: str
    precision: str
    roof_precision: str
    matrix: bool
    peak: float
    dtype: str
    input_shapes: list[Any]
    output_shapes: list[Any]
    counted: bool
    start_s: float | None

    @property
    def pct_of_roof(self) -> float | None:
        return _div(self.estimate_s, self.time_s) if self.estimate_s else None  # no work: on no roof (as rows')

    @property
    def intensity(self) -> float | None:
        return _div(self.flops, self.bytes)

    def _derived(self) -> dict[str, Any]:
        return {"pct_of_roof": self.pct_of_roof}


@dataclass(frozen=True)
class LayerInfo:
    """A module's record (``records.LayerRecord``)."""

    path: str
    type: str = ""
    calls: int = 0
    num_parameters: int = 0
    num_trainable_parameters: int = 0
    input_shapes: list[Any] = field(default_factory=list)
    output_shapes: list[Any] = field(default_factory=list)
    grad_input_shapes: list[Any] = field(default_factory=list)
    grad_output_shapes: list[Any] = field(default_factory=list)
    param_bytes: int = 0
    grad_bytes: int = 0
    output_bytes: int = 0
    #: the per-layer memory (``capture.memory``): None when it was not measured (a profile without layer details,
    #: where the capture leaves these at 0)
    memory_fwd_bytes: int | None = 0
    memory_bwd_bytes: int | None = 0
    peak_fwd_bytes: int | None = 0
    peak_bwd_bytes: int | None = 0
    saved_bytes: int | None = 0
    forward_s: float = 0.0
    backward_s: float = 0.0
    self_forward_s: float = 0.0
    self_backward_s: float = 0.0
    recompute_s: float = 0.0
    flops_fwd: int = 0
    flops_bwd: int = 0
    flops_recompute: int = 0
    self_flops_fwd: int = 0
    self_flops_bwd: int = 0
    bytes_fwd: int = 0
    bytes_bwd: int = 0
    self_bytes_fwd: int = 0
    self_bytes_bwd: int = 0
    nonfinite_output: bool = False
    nonfinite_grad_input: bool = False
    nonfinite_grad_output: bool = False


@dataclass(frozen=True)
class RoofUsed:
    """A roof the ops were placed on: one per (precision, matrix)."""

    precision: str
    matrix: bool
    peak_flops: float
    bandwidth: float
    ridge: float
    achievable_peak_flops: float | None
    achievable_bandwidth: float | None
    flops: int
    n_ops: int


@dataclass(frozen=True)
class Opportunity:
    """A finding: where time goes that need not, why (``cause``, computed from the numbers), what to change in the
    user's code (``change``), the predicted saving per step (``saving_s``) and how it was predicted
    (``predicted_by``, ``predicted_text``). ``kind``: one of ``analysis.advice.KINDS``. ``title`` and
    ``saving_frac`` (of the step) are set when the report is built."""

    layer: str
    phase: str
    type: str
    kind: str  #: ``analysis.advice.KINDS``
    cause: str
    change: str = ""
    saving_s: float | None = None  #: predicted saving per step (None: untimed and no kernel model)
    recoverable_s: float | None = None
    measured_s: float | None = None
    estimate_s: float = 0.0
    bound: str = ""
    intensity: float | None = None
    ridge: float | None = None
    attained: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)  #: the figures the finding rests on
    rows: tuple[tuple[str, str], ...] = ()  #: the (layer, phase) rows the saving comes from
    predicted_by: str = ""  #: how the saving was predicted: a key of ``analysis.finding.PREDICTED_BY``
    predicted_text: str = ""  #: the prediction's figures, one sentence
    measured_ratio: float | None = None  #: measured / predicted saving of this kind of change in the closed loop
    measured_on: str = ""  #: where the closed loop measured it ("": never, on this kind of device)
    op: str = ""  #: the op it is about, where one is
    title: str = ""
    saving_frac: float | None = None  #: of the step


@dataclass(frozen=True)
class BelowRoof:
    """A layer x phase row below its roof for which no change is known (not an opportunity): what the numbers say
    about it (``cause``)."""

    layer: str
    phase: str
    type: str
    measured_s: float | None
    expected_s: float
    recoverable_s: float | None
    attained: float | None
    cause: str


@dataclass(frozen=True)
class NoiseMarkInfo:
    """A row whose time is noise (``analysis.noise.NoiseMark``), with its sentence."""

    layer: str
    phase: str
    kind: str
    measured_s: float
    typical_s: float
    spread_s: float
    samples: tuple[float, ...]
    siblings: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class NoiseSection:
    steps: int = 1
    floor_s: float = 0.0
    marks: tuple[NoiseMarkInfo, ...] = ()
    spread: tuple[tuple[Any, ...], ...] = ()  #: (layer, phase, seconds) per layer x phase row
    suppressed: tuple[Opportunity, ...] = ()  #: findings within the noise: not shown as findings

    def mark(self, layer: str, phase: str) -> NoiseMarkInfo | None:
        """The mark of a layer x phase row (None: its time is not noise)."""
        return next((m for m in self.marks if m.layer == layer and m.phase == phase), None)

    def is_marked(self, layer: str, phase: str) -> bool:
        return self.mark(layer, phase) is not None

    def spread_of(self, layer: str, phase: str) -> float:
        return next((float(s[2]) for s in self.spread if s[0] == layer and s[1] == phase), 0.0)


@dataclass(frozen=True)
class WhatIf:
    """Times measured on one device placed on another's roofs."""

    measured_on: str
    roofs_of: str


@dataclass(frozen=True)
class RunContext:
    """The facts of the run the report prints (from the capture and the callback; formerly ``meta`` keys)."""

    timing: str | None = None
    device_kind: str | None = None  #: "cpu" | "cuda" | "meta"
    step_time_window: tuple[int, ...] | None = None
    step_time_spread_s: float | None = None
    step_time_settled: bool | None = None
    deferred_from: int | None = None
    host_cpus: int | None = None
    host_others_load_per_cpu: float | None = None
    host_busy: bool | None = None
    host_oversubscribed: bool | None = None
    torch_threads: int | None = None
    merged_steps: tuple[int, ...] | None = None
    roof_notes: tuple[str, ...] = ()
    compiled_capture: dict[str, Any] | None = None
    compiled_modules_run_eagerly: tuple[str, ...] | None = None
    micro_batches: int = 1
    attention_flops: str = "attended"  #: the model-FLOPs convention of causal attention (``records.model_flops``)


R = typing.TypeVar("R", bound="ReportData")


@dataclass(frozen=True)
class ReportData:
    """One profiled step, analysed once: every figure, table and finding an output shows (see the module docstring
    for the JSON). The report users get is ``tscope_callbacks.StepReport``, this with its renderings; renderers are
    pure functions of this. ``profile`` is the StepProfile it was analysed from, when known (not in its JSON: a step
    file stores it beside the report)."""

    step: int | None
    stage: str | None
    run: str | None
    created: str
    device: DeviceInfo
    summary: Summary
    memory: MemorySection | None
    time_split: TimeSplit
    rows: dict[str, tuple[Row, ...]]
    ops: tuple[OpRow, ...]
    layers: tuple[LayerInfo, ...]
    roofs: tuple[RoofUsed, ...]
    model: dict[str, Any] | None
    communication: dict[str, Any] | None
    fsdp_whatif: dict[str, Any] | None
    compiled_vs_eager: tuple[dict[str, Any], ...] | None
    what_if: WhatIf | None
    opportunities: tuple[Opportunity, ...]
    nonfinite: tuple[dict[str, Any], ...]
    noise: NoiseSection
    context: RunContext
    user: dict[str, Any] = field(default_factory=dict)
    grad_spikes: tuple[dict[str, Any], ...] = ()
    below_roof: tuple[BelowRoof, ...] = ()  #: rows below their roof with no known change (not opportunities)
    profile: StepProfile | None = field(default=None, compare=False, repr=False, metadata={"json": False})

    # ---- figures derived from the stored sections (each figure is stored once)
    @property
    def header(self) -> dict[str, Figure]:
        """The headline figures with their unit and basis (the page's cards): step_ms, estimated_step_ms, mfu, mbu,
        hfu, achieved_tflops, tokens_per_s, samples_per_s, memory_peak_bytes, flop_coverage."""
        s, model, mem = self.summary, self.model or {}, self.memory
        ms = lambda x: None if x is None else x * 1e3  # noqa: E731
        est = "sum of shape-aware kernel estimates" if s.has_kernel_model else "sum of per-op roofline bounds"
        mfu_b = f"model FLOPs / step time / {s.mfu_precision} matrix roof"
        return {
            "step_ms": Figure(_fin(ms(s.measured_step_s)), "ms", s.step_time_basis_text),
            "estimated_step_ms": Figure(_fin(ms(s.estimated_step_s)), "ms", est),
            "mfu": Figure(_fin(s.mfu), "fraction", mfu_b),
            "mbu": Figure(_fin(s.mbu), "fraction", "bytes / step time / "
                          f"{'measured' if self.device.measured else 'datasheet'} bandwidth "
                          f"{bw_text(s.bandwidth)}"),
            "hfu": Figure(_fin(s.hfu), "fraction", "hardware FLOPs (recompute included) / step time / "
                          f"{s.mfu_precision} matrix roof"),
            "achieved_tflops": Figure(_fin(s.achieved_tflops), "TFLOP/s", "all FLOPs / step time"),
            "tokens_per_s": Figure(_fin(model.get("tokens_per_s")), "tokens/s", "tokens in the batch / step time"),
            "samples_per_s": Figure(_fin(model.get("samples_per_s")), "samples/s", "batch size / step time"),
            "memory_peak_bytes": Figure(None if mem is None or mem.peak_bytes is None else float(mem.peak_bytes),
                                        "bytes", mem.basis if mem is not None and mem.peak_bytes is not None else
                                        "needs layer details"),
            "flop_coverage": Figure(_fin(s.flop_coverage), "fraction", "share of ops with a FLOP formula"),
        }

    @property
    def step_s(self) -> float | None:
        """The step time: measured, else expected (``analysis.basis.step_time_of``)."""
        return step_time_of(self.summary.measured_step_s, self.summary.estimated_step_s)

    def header_json(self) -> dict[str, dict[str, Any]]:
        """:attr:`header` as JSON (``{figure: {value, unit, basis}}``): what the page's cards read."""
        return {k: dataclasses.asdict(f) for k, f in self.header.items()}

    @property
    def scalars(self) -> dict[str, float]:
        """The roofline figures by their bare metric names (``mfu``, ``mbu``, ...; the callbacks add the
        ``tscope/roofline/`` namespace and stage); figures that do not exist (untimed) are left out, ``hfu`` too
        where it equals ``mfu``."""
        s = self.summary
        ms = lambda x: None if x is None else x * 1e3  # noqa: E731
        # the bound shares of the measured step, as the report's Time line and the page's "Where the step goes"
        # split it (they read 0.794 here beside 71.5% there: a share of the op time); of the op time without one
        t = self.time_split
        compute, memory = ((t.compute_bound_s / t.step_s, t.memory_bound_s / t.step_s) if t.step_s and self.timed
                           else (s.compute_bound_time_frac, s.memory_bound_time_frac))
        vals = {"mfu": s.mfu, "hfu": s.hfu if s.hardware_flops != s.model_flops else None, "mbu": s.mbu,
                "achieved_tflops": s.achieved_tflops, "measured_step_ms": ms(s.measured_step_s),
                "estimated_step_ms": ms(s.estimated_step_s), "compute_bound_time_frac": compute,
                "memory_bound_time_frac": memory, "flop_coverage": s.flop_coverage}
        return {k: float(v) for k, v in vals.items() if v is not None and math.isfinite(v)}

    @property
    def area_scalars(self) -> dict[str, dict[str, float]]:
        """The other areas' figures by bare names (the callbacks log them as ``tscope/<area>/<key>``): ``comm``
        (collectives), ``model`` (the model summary), ``memory`` (the step's memory by category, MiB) and
        ``fsdp_whatif``; areas with no figure are left out."""
        skew = self.profile.info.skew if self.profile is not None else None
        out: dict[str, dict[str, Any]] = {"comm": comm_scalars(self.communication, skew),
                                          "model": model_scalars(self.model, self.step_s)}
        mem = self.memory
        if mem is not None and mem.categories.get("step_peak"):
            keys = {"step_peak": "step_peak_mb", "weights": "weights_mb", "grads": "grads_mb",
                    "optimizer_state": "optimizer_state_mb", "activations_saved": "activations_saved_mb"}
            m: dict[str, Any] = {name: (mem.categories[k] or 0) / 2**20 for k, name in keys.items()
                                 if mem.categories.get(k) is not None}
            if mem.share is not None:
                m["device_share"] = mem.share
            out["memory"] = m
        fsdp = self.fsdp_whatif
        if fsdp:
            fm, sim = fsdp["memory"], fsdp.get("time") or {}
            out["fsdp_whatif"] = {
                "peak_mb": fm["peak"] / 2**20 if fm.get("peak") else None, "device_share": fm.get("share"),
                "step_ms": sim["step_s"] * 1e3 if sim.get("step_s") else None,
                "exposed_comm_ms": sim["exposed_s"] * 1e3 if sim.get("exposed_s") is not None else None,
                "mfu": sim.get("mfu")}
        return {k: {n: float(v) for n, v in d.items() if v is not None and math.isfinite(v)} for k, d in out.items()
                if d}

    # ---- tables
    @property
    def totals(self) -> Row:
        return self.rows["total"][0]

    @property
    def timed(self) -> bool:
        return self.summary.timed

    def _time(self, r: Row) -> float:
        return time_of(r, self.timed)

    def table(self, kind: str = "layer_phase", top: int | None = None) -> list[Row]:
        """Rows of ``kind`` (``rows`` keys; "layer" and "op" are accepted for "layer_phase" and "op_name"), rows
        under ``summary.group_small`` share of time AND of FLOPs (and rows past ``top``) grouped into one "(other N
        ...)" row, so the rows still sum to the total (inclusive rows overlap: never grouped)."""
        key = {"layer": "layer_phase", "layer_total": "layer", "op": "op_name"}.get(kind, kind)
        rows = list(self.rows[key])
        if key == "inclusive":
            return rows[:top] if top is not None else rows
        tot_t, g = self._time(self.totals), self.summary.group_small
        keep: list[Row] = []
        small: list[Row] = []
        for r in rows:
            tiny = (_div(self._time(r), tot_t) or 0.0) < g and (_div(r.flops, self.totals.flops) or 0.0) < g
            (small if tiny or (top is not None and len(keep) >= top) else keep).append(r)
        if len(small) <= 1:
            return keep + small
        unit = {"layer_phase": "layers", "layer": "layers", "category": "classes"}.get(key, "ops")
        return keep + [merge_rows(f"(other {len(small)} {unit})", "other", small)]

    # ---- JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe dict of the module docstring (``json.dumps(..., allow_nan=False)`` works)."""
        return {"schema": SCHEMA, "version": VERSION, **_dump(self)}

    @classmethod
    def from_dict(cls: type[R], d: dict[str, Any], profile: StepProfile | None = None) -> R:
        """Read :meth:`to_dict`'s dict back (extra keys are ignored; ``profile``: the StepProfile it was analysed
        from, when known); :class:`StepFileError` (one line) for another schema or version, or a malformed dict."""
        if not isinstance(d, dict):
            raise StepFileError(f"a step report is a JSON object, got {type(d).__name__}")
        if d.get("schema") != SCHEMA:
            raise StepFileError("not a tscope step report (no \"schema\": \"tscope.step_report\"; expected "
                                "StepReport.to_dict())")
        if d.get("version") != VERSION:
            raise StepFileError(f"a step report of version {d.get('version')!r}; this tscope reads version {VERSION}: "
                                "profile the step again with this version")
        try:
            return dataclasses.replace(_load(cls, d), profile=profile)
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise StepFileError(f"malformed step report ({type(e).__name__}: {e})") from None

    def __repr__(self) -> str:
        s = self.summary
        return (f"{type(self).__name__}(step={self.step}, device={s.device!r}, ops={s.n_ops}, flops={s.total_flops}, "
                f"mfu={s.mfu})")


class StepFileError(ValueError):
    """A step file that cannot be read: not JSON, half-written, another schema or version. One line."""


# ------------------------------------------------------------------------------------------------ (de)serializing
def _dump(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        out = {f.name: _dump(getattr(x, f.name)) for f in dataclasses.fields(x) if f.metadata.get("json", True)}
        derived = getattr(x, "_derived", None)
        if derived is not None:
            out.update({k: _dump(v) for k, v in derived().items()})
        return out
    return json_safe(x) if not isinstance(x, (dict, list, tuple)) else (
        {str(k): _dump(v) for k, v in x.items()} if isinstance(x, dict) else [_dump(v) for v in x])


_HINTS: dict[type, dict[str, Any]] = {}


def _load(tp: Any, v: Any) -> Any:
    if v is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _load(args[0], v) if len(args) == 1 else v
    if dataclasses.is_dataclass(tp):
        hints = _HINTS.get(tp) or _HINTS.setdefault(tp, typing.get_type_hints(tp))
        kw = {f.name: _load(hints[f.name], v[f.name]) for f in dataclasses.fields(tp)
              if f.name in v and f.metadata.get("json", True)}
        return tp(**kw)
    if origin is tuple:
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        return tuple(_load(inner, x) for x in v)
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return [_load(inner, x) for x in v]
    if origin is dict:
        _, inner = typing.get_args(tp) or (str, Any)
        return {k: _load(inner, x) for k, x in v.items()}
    if tp is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def read_step_json(path: str | os.PathLike[str], label: str | None = None) -> dict[str, Any]:
    """The JSON object in a step file (or any saved profile), read once: the one reader of the CLI, the report
    loader and the dashboard. Raises :class:`StepFileError` with one line naming ``label`` (the path by default) for
    a missing or unreadable file, one that is not text, empty, corrupt or half-written JSON, or not a JSON object."""
    label = os.fspath(path) if label is None else label
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except IsADirectoryError:
        raise StepFileError(_directory_hint(path, label)) from None
    except OSError as e:
        raise StepFileError(f"cannot read {label}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        if "tfevents" in os.path.basename(os.fspath(path)):
            folder = os.path.dirname(os.fspath(path)) or "."
            raise StepFileError(f"{label} is a TensorBoard event file, not a step file: `tensorboard --logdir {folder}` "
                                f"shows it; `tscope report` reads a profiled step's JSON ({_WRITES})") from None
        raise StepFileError(f"{label} is not a text file, so not a step file ({_WRITES})") from None
    if not text.strip():
        raise StepFileError(f"{label}: empty, perhaps half-written (a run still writing it shows it once complete)")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        if not os.fspath(path).lower().endswith(".json"):
            raise StepFileError(f"{label} is not JSON, so not a step file ({_WRITES})") from None
        raise StepFileError(f"{label} is not valid JSON, perhaps half-written or corrupt "
                            f"({getattr(e, 'msg', e)}{where})") from None
    if not isinstance(data, dict):
        raise StepFileError(f"{label}: not a profiled step (a JSON {type(data).__name__} where a JSON object was "
                            "expected)")
    return data


_WRITES = "RooflineCallback writes tscope/step_<N>.json in the run's log directory"


def _directory_hint(path: str | os.PathLike[str], label: str) -> str:
    """What to run when ``path`` is a directory: its last profiled step's file, when it holds step files (searched
    down to the run folders' ``tscope/``), else where they are written."""
    found: list[tuple[int, str]] = []
    root = os.fspath(path)
    for dirpath, dirnames, files in os.walk(root):
        if dirpath[len(root):].count(os.sep) >= 4:  # <dir>/<name>/version_0/tscope: deep enough
            dirnames[:] = []
        for f in files:
            parsed = parse_step_file_name(f)
            if parsed is not None and parsed[:2] == ("step", "train"):
                found.append((parsed[2], os.path.join(dirpath, f)))
        if len(found) > 10_000:
            break
    if not found:
        return f"{label} is a directory with no step file in it: give a step file ({_WRITES})"
    _, last = max(found)
    return (f"{label} is a directory: give one of its {len(found)} step files, e.g. the last profiled step's: "
            f"`tscope report {last}`; `tscope view {label}` shows them all")


def not_a_step_file(path: str | os.PathLike[str], data: dict[str, Any]) -> str:
    """One line on why ``data`` (the JSON object read from ``path``) is no step file: what it is instead, when it is
    another tscope output (the layer profiler's file, a trace), and what to open."""
    parsed = parse_step_file_name(os.fspath(path))
    layers = parsed is not None and parsed[0] == "layers"
    tree = len(data) == 1 and all(isinstance(v, dict) and "info" in v and "children" in v for v in data.values())
    if layers or tree:
        step = step_file_name(parsed[2], parsed[1]) if layers and parsed is not None else "step_N.json"
        return (f"{path} is the LayerProfilerCallback's layer tree, not a step file: the RooflineCallback's {step} "
                f"beside it is; `tscope view LOGDIR` shows both")
    if "traceEvents" in data:
        return f"{path} is a Chrome/Perfetto trace, not a step file: open it in ui.perfetto.dev"
    if not data:
        return f"{path} is an empty JSON object, not a tscope step file (RooflineCallback writes tscope/step_<N>.json)"
    keys = ", ".join(repr(k) for k in list(data)[:4]) + (", ..." if len(data) > 4 else "")
    return (f"{path} is not a profiled step: a JSON object with {keys}, none of a step file's 'profile', 'report' "
            "or 'schema' (RooflineCallback writes tscope/step_<N>.json)")


def read_alerts_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The alerts in an :data:`ALERTS_FILE`, in order; a missing file is none, and a line that is not a JSON object
    with an int ``step`` and a str ``text`` (a line still being written) is left out. Never raises."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for line in lines:
        try:
            a = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(a, dict) and type(a.get("step")) is int and isinstance(a.get("text"), str):
            out.append(a)
    return out


#: the kinds of per-step file under ``<log_dir>/tscope/``: the step file (profile, device, report), the Chrome trace
#: (``save_trace``) and the LayerProfilerCallback's layer tree
STEP_FILE_KINDS = ("step", "trace", "layers")
_STEP_NAME = re.compile(r"^(?:(?P<kind>trace|layers)_)?(?:(?P<stage>[a-z]+)_)?step_(?P<step>\d+)\.json$")


def step_file_name(step: int, stage: str = "train", kind: str = "step") -> str:
    """The name of a per-step file: ``step_<N>.json`` (other stages ``<stage>_step_<N>.json``); a trace or layer tree
    prefixed with its kind (``trace_step_<N>.json``, ``layers_validation_step_<N>.json``). The one rule every writer
    and reader uses (:func:`parse_step_file_name` reads it back)."""
    if kind not in STEP_FILE_KINDS:
        raise ValueError(f"kind must be one of {STEP_FILE_KINDS}, got {kind!r}")
    name = f"step_{int(step)}.json" if stage == "train" else f"{stage}_step_{int(step)}.json"
    return name if kind == "step" else f"{kind}_{name}"


def parse_step_file_name(name: str) -> tuple[str, str, int] | None:
    """``(kind, stage, step)`` of a name :func:`step_file_name` makes; None for any other name."""
    m = _STEP_NAME.match(os.path.basename(name))
    if m is None or m["stage"] in STEP_FILE_KINDS:
        return None
    return m["kind"] or "step", m["stage"] or "train", int(m["step"])


def step_file(profile: StepProfile, device: dict[str, Any] | None, report: ReportData | None) -> dict[str, Any]:
    """A step file's content: ``{"profile", "device", "report"}`` -- the raw records, the device's roof row
    (``DeviceSpec.to_dict()``: a re-analysis on that device) and the report's JSON (None: no device roof)."""
    return {"profile": profile.to_dict(), "device": device, "report": report.to_dict() if report is not None else None}


def read_step_report(cls: type[R], path: str | os.PathLike[str], data: dict[str, Any] | None = None) -> R:
    """The report (of class ``cls``) of a step file (``<log_dir>/tscope/step_<N>.json``, ``{"profile", "device",
    "report"}``; a report dict at the top level is read too), with its profile when the file has one; ``data``: its
    JSON, when already read with :func:`read_step_json`. Raises :class:`StepFileError` with one line for a missing,
    unreadable, corrupt or half-written file, or one of another schema or version."""
    if data is None:
        data = read_step_json(path)
    profile = None
    if data.get("schema") != SCHEMA and "profile" in data:
        rep = data.get("report")
        if rep is None:
            raise StepFileError(f"{path} has no report (the step had no device roof): `tscope report {path} --gpu "
                                "NAME` analyses its profile")
        if not (isinstance(rep, dict) and rep.get("schema") == SCHEMA and rep.get("version") == VERSION):
            v = rep.get("version", 1) if isinstance(rep, dict) else 1
            raise StepFileError(f"{path} is a step file of version {v}; this tscope reads version {VERSION}: "
                                "profile the step again with this version")
        try:
            profile = StepProfile.from_dict(data["profile"])
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise StepFileError(f"{path}: malformed profile ({type(e).__name__}: {e})") from None
        data = rep
    try:
        return cls.from_dict(data, profile)
    except StepFileError as e:
        raise StepFileError(f"{path}: {e}") from None
