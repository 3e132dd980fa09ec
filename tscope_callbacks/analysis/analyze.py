"""``analyze(profile, spec, options)``: a profiled step placed on a device's roofline (``analysis.roofline``), its
findings (``analysis.advice``) and its noise (``analysis.noise``), read once into the frozen, typed report
(:class:`~tscope_callbacks.analysis.report.ReportData`; its module docstring documents the JSON). Pure: no torch, no
hooks, no renderer; ``spec`` is a resolved DeviceSpec (``tscope_callbacks.analyze`` resolves names)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from tscope_callbacks.analysis.advice import below_roof
from tscope_callbacks.analysis.advice import opportunities as advice_opportunities
from tscope_callbacks.analysis.basis import time_of
from tscope_callbacks.analysis.comm import comm_rows, overlap_of
from tscope_callbacks.analysis.compare import compiled_vs_eager
from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.fmt import sig, time_text
from tscope_callbacks.analysis.memory_fit import memory_fit, report_capacity
from tscope_callbacks.analysis.model_summary import model_summary
from tscope_callbacks.analysis.noise import Noise, find_noise
from tscope_callbacks.analysis.report import (
    AchievableInfo,
    BelowRoof,
    DeviceInfo,
    LayerInfo,
    MemorySection,
    NoiseMarkInfo,
    NoiseSection,
    Opportunity,
    OpRow,
    ReportData,
    RoofUsed,
    Row,
    RunContext,
    Summary,
    TimeSplit,
    WhatIf,
    _fin,
    _load,
    json_safe,
)
from tscope_callbacks.analysis.roofline import RooflineAnalysis, build_roofline
from tscope_callbacks.analysis.step_parts import fetch_of
from tscope_callbacks.analysis.summary import roofs_used, summary_dict
from tscope_callbacks.devices.efficiency import KernelModel
from tscope_callbacks.devices.spec import DeviceSpec
from tscope_callbacks.records import CaptureInfo, StepProfile, op_model_flops

__all__ = ["AnalyzeOptions", "analyze"]

R = TypeVar("R", bound=ReportData)


@dataclass(frozen=True)
class AnalyzeOptions:
    """How to analyse a step. ``achievable``: measured roofs (a DeviceSpec) beside the datasheet's; ``precision``:
    force matrix ops' roof precision (an fp8 what-if); ``group_small``: table grouping share; ``kernel_model``: True
    (the device's measured efficiency), False (roofs only) or a KernelModel; ``what_if``: the device the times were
    measured on when it is not ``spec`` (the caller resolves it); ``fsdp_whatif``: an ``analysis.fsdp.fsdp_whatif``
    result to carry; ``eager``: the eager reference's report of a compiled step (``compiled_vs_eager``);
    ``nonfinite``: the NaN guard's events of the step ({step, layer, op, phase, line, kind}); ``grad_spikes``: its
    gradient spikes (``GradHistory.add``'s dicts: step, norm, median, ratio, layer, layer_ratio, loss, ...);
    ``stage``/``run``/``user``: labels and the user's own data."""

    achievable: DeviceSpec | None = None
    precision: str | None = None
    group_small: float = 0.01
    kernel_model: bool | KernelModel | None = True
    what_if: str | None = None
    fsdp_whatif: dict[str, Any] | None = None
    eager: ReportData | None = None
    nonfinite: tuple[dict[str, Any], ...] = ()
    grad_spikes: tuple[dict[str, Any], ...] = ()
    stage: str | None = None
    run: str | None = None
    user: dict[str, Any] = field(default_factory=dict)


def analyze(profile: StepProfile, spec: DeviceSpec, options: AnalyzeOptions | None = None, *,
            report_type: type[R] = ReportData) -> R:  # type: ignore[assignment]
    """The report of ``profile`` on ``spec`` (a resolved DeviceSpec), built once as ``report_type`` (the report data
    or ``tscope_callbacks.StepReport``, which adds the renderings)."""
    profile = profile if isinstance(profile, StepProfile) else getattr(profile, "result", profile)  # a ts.profile
    if not isinstance(profile, StepProfile):
        raise TypeError(f"analyze() needs a profiled step: the `prof` of `with ts.profile(model) as prof:` (after "
                        f"the with-block), its .result, or a StepProfile; got {type(profile).__name__}")
    o = options or AnalyzeOptions()
    eng = build_roofline(profile, spec, achievable=o.achievable, precision=o.precision, group_small=o.group_small,
                         kernel_model=o.kernel_model)
    return _report(eng, o, profile, report_type)


_LAYER_MEMORY = ("memory_fwd_bytes", "memory_bwd_bytes", "peak_fwd_bytes", "peak_bwd_bytes", "saved_bytes")


#: a fusion finding's chain (``analysis.advice``) as its title says it
_CHAINS = {"optimizer": "optimizer update", "loss": "loss", "gelu": "GELU", "rmsnorm": "RMSNorm",
           "rope": "rotary embedding", "swiglu": "SwiGLU"}


def _opportunity(o: Opportunity, step: float | None) -> Opportunity:
    """The finding as the report shows it: its title and its share of the step set, its figures JSON-safe."""
    ev = json_safe(dict(o.evidence or {}))
    title = o.kind.replace("_", " ")
    chain = _CHAINS.get(str(ev.get("chain"))) if o.kind == "fusion" else None
    if chain:  # several fusion findings of one layer (the root's: loss, optimizer) tell apart at a glance
        title += f" ({chain})"
    return dataclasses.replace(o, title=title, op=o.op or str(ev.get("op") or ""), saving_s=_fin(o.saving_s),
                               saving_frac=_fin(_div(o.saving_s, step)), recoverable_s=_fin(o.recoverable_s),
                               measured_s=_fin(o.measured_s), estimate_s=float(o.estimate_s),
                               intensity=_fin(o.intensity), ridge=_fin(o.ridge), attained=_fin(o.attained),
                               evidence=ev, rows=tuple((str(a), str(b)) for a, b in o.rows),
                               measured_ratio=_fin(o.measured_ratio))


def _below_roof(r: Row, cause: str) -> BelowRoof:
    return BelowRoof(layer=r.layer, phase=r.phase, type=r.type, measured_s=_fin(r.measured_s),
                     expected_s=float(r.expected_s), recoverable_s=_fin(r.recoverable_s), attained=_fin(r.attained),
                     cause=cause)


def _device(spec: DeviceSpec, ach: DeviceSpec | None) -> DeviceInfo:
    extra = getattr(spec, "extra", None) or {}
    a = None
    if ach is not None:
        a = AchievableInfo(str(getattr(ach, "name", "")), _fin(getattr(ach, "bandwidth", None)),
                           {k: float(v) for k, v in (getattr(ach, "flops", None) or {}).items() if v})
    load = extra.get("load_per_cpu") if getattr(spec, "measured", False) else None
    return DeviceInfo(name=str(spec.name), source=str(getattr(spec, "source", "") or ""),
                      vendor=str(getattr(spec, "vendor", "") or ""), measured=bool(getattr(spec, "measured", False)),
                      bandwidth=float(spec.bandwidth), peaks={k: float(v) for k, v in spec.flops.items() if v},
                      achievable=a, memory_bytes=getattr(spec, "memory_bytes", None),
                      link_bandwidth=_fin(getattr(spec, "link_bandwidth", None)),
                      link_name=getattr(spec, "link_name", None) or None,
                      load_per_cpu=None if load is None else float(load))


def _summary(eng: RooflineAnalysis) -> Summary:
    s = json_safe(summary_dict(eng))
    names = {f.name for f in dataclasses.fields(Summary)}
    s = {k: v for k, v in s.items() if k in names}
    return _load(Summary, {**s, "group_small": float(eng.group_small),
                           "has_kernel_model": eng.kernel_model is not None,
                           "has_achievable": eng.achievable is not None})


def _memory(eng: RooflineAnalysis, what_if: bool) -> MemorySection | None:
    mc = eng.info.memory_categories
    if not mc:
        return None
    cap = report_capacity(eng.spec.memory_bytes, "what-if" if what_if else None)
    fit = memory_fit(mc, cap) or {}
    cats: dict[str, int | float | None] = {"weights": mc.get("params")}
    for k, v in mc.items():
        if k != "params" and (v is None or isinstance(v, (int, float))) and not isinstance(v, bool):
            cats[k] = v
    verdict = fit.get("verdict") or ""
    return MemorySection(peak_bytes=fit.get("peak"), device_bytes=fit.get("capacity"),
                         fits=None if not verdict else verdict != "does not fit", verdict=verdict,
                         share=_fin(fit.get("share")), states_bytes=fit.get("states"), rest_bytes=fit.get("rest"),
                         shard_over=fit.get("shard_over"), basis=str(mc.get("step_peak_basis") or ""),
                         categories=cats)


def _time_split(eng: RooflineAnalysis) -> TimeSplit:
    by = {b: 0.0 for b in ("compute", "memory", "comm", "uncounted", "overhead")}
    for o in eng.op_roofs:
        by[o.bound] += time_of(o, eng.timed)
    bd = eng.info.step_breakdown or {}  # the step monitor's means over its recent clean steps
    wait, share = fetch_of(bd)  # the DataLoader's next and the batch's transfer (ms a step), their share
    steps = bd.get("steps")
    steps = int(steps) if isinstance(steps, (int, float)) and math.isfinite(steps) else None
    bound = bool(bd.get("input_bound"))  # the monitor's own verdict (its threshold, over its verdict window)
    # the rest of the measured step beside its op time (the capture's own wall time, and the device idle inside it,
    # are slowed by the capture: never the basis). The parts add up to the step: where the profiled ops took longer
    # than the unprofiled step (the capture slowed them), their times are scaled to it, and said so
    step, ops = _fin(eng.measured_step_s), _fin(eng.op_time_s) if eng.timed else None
    timed_step = step if step and ops else None
    scale = min(1.0, timed_step / ops) if timed_step and ops else 1.0
    basis = "measured op time" if eng.timed else "estimated (shape-aware kernel times)"
    if scale < 1.0:
        basis += (f", scaled x{sig(scale)} to the unprofiled step (the profiled ops took {time_text(ops)}, "
                  f"the step {time_text(timed_step)}: the capture slowed them)")
    parts = [by[b] * scale for b in ("compute", "memory", "comm", "uncounted", "overhead")]
    idle = None if not timed_step else 0.0 if scale < 1.0 else max(0.0, timed_step - sum(parts))
    mean_ms = bd.get("step_ms")  # the monitor's mean step over those steps: the share's basis
    return TimeSplit(*parts, idle,
                     _fin(wait / 1e3) if isinstance(wait, (int, float)) else None, basis,
                     share, steps, bound, tuple(str(f) for f in bd.get("input_fixes") or ()) if bound else (),
                     timed_step, scale,
                     _fin(mean_ms / 1e3) if isinstance(mean_ms, (int, float)) and mean_ms > 0 else None)


def _context(info: CaptureInfo, eng: RooflineAnalysis) -> RunContext:
    tup = lambda v: tuple(v) if v is not None else None  # noqa: E731
    return RunContext(timing=info.timing, device_kind=info.device, step_time_window=tup(info.step_time_window),
                      step_time_spread_s=_fin(info.step_time_spread_s), step_time_settled=info.step_time_settled,
                      deferred_from=info.deferred_from, host_cpus=info.host_cpus,
                      host_others_load_per_cpu=_fin(info.host_others_load_per_cpu), host_busy=info.host_busy,
                      host_oversubscribed=info.host_oversubscribed, torch_threads=info.torch_threads,
                      merged_steps=tup(info.merged_steps), roof_notes=tuple(str(n) for n in eng.roof_notes),
                      compiled_capture=json_safe(info.compiled_capture) or None,
                      compiled_modules_run_eagerly=tup(info.compiled_modules_run_eagerly) or None,
                      micro_batches=int(info.micro_batches or 1), attention_flops=info.attention_flops or "attended")


def _noise(eng: RooflineAnalysis, n: Noise, suppressed: list[Opportunity], step: float | None) -> NoiseSection:
    marks = tuple(NoiseMarkInfo(m.layer, m.phase, m.kind, float(m.measured_s), float(m.typical_s),
                                float(m.spread_s), tuple(float(x) for x in m.samples), tuple(m.siblings), m.text)
                  for m in n.marks.values())
    spread = tuple((k[0], k[1], float(v)) for k, v in n.spread.items())
    return NoiseSection(int(n.steps), float(n.floor_s), marks, spread,
                        tuple(_opportunity(o, step) for o in suppressed))


def _communication(eng: RooflineAnalysis, ov: dict[str, float] | None) -> dict[str, Any] | None:
    rows = comm_rows(eng)
    sk = eng.info.skew
    if not rows and not (ov and ov.get("comm_s")):
        return None
    return json_safe({"rows": rows, "overlap": ov or None, "skew": sk or None})


def _report(eng: RooflineAnalysis, o: AnalyzeOptions, profile: StepProfile, cls: type[R]) -> R:
    """The report of a built roofline analysis: every table, section and finding computed once (opportunities
    with ``top=10``; outputs show the first 5)."""
    info = eng.info
    step = eng.measured_step_s
    noise = find_noise(eng)
    suppressed: list[Opportunity] = []
    every = advice_opportunities(eng, noise, top=1000, suppressed=suppressed)
    opps = every[:10]
    below = below_roof(eng, every, noise)
    ov = overlap_of(info.kernels, eng.op_roofs)
    model = json_safe(model_summary(eng))
    mem = _memory(eng, bool(o.what_if))
    summary = _summary(eng)
    fsdp = json_safe(o.fsdp_whatif) if o.fsdp_whatif else None
    # the capture leaves the per-layer memory at 0 when its memory tracker did not run (no layer details): the
    # step's tracked peak is then None too, and these figures are not measured (null), not zero
    mem_measured = (info.memory_categories or {}).get("step_tracked_peak") is not None
    unmeasured = {} if mem_measured else dict.fromkeys(_LAYER_MEMORY)
    layers = tuple(_load(LayerInfo, json_safe({**{f.name: getattr(rec, f.name) for f in dataclasses.fields(LayerInfo)
                                                  if hasattr(rec, f.name)}, **unmeasured}))
                   for rec in eng.layer_records.values())
    conv = info.attention_flops or "attended"
    ops = tuple(OpRow(i=int(x.record.index), op=x.record.op, layer=x.record.layer, phase=x.record.phase,
                      category=x.record.category, flops=int(x.flops), model_flops=op_model_flops(x.record, conv),
                      bytes=int(x.bytes), time_s=_fin(x.measured_s), estimate_s=float(x.estimate_s),
                      expected_s=float(x.expected_s), achievable_estimate_s=_fin(x.achievable_estimate_s),
                      bound=x.bound, precision=x.precision, roof_precision=x.roof_precision, matrix=bool(x.matrix),
                      peak=float(x.peak), dtype=x.record.dtype, input_shapes=json_safe(list(x.record.input_shapes)),
                      output_shapes=json_safe(list(x.record.output_shapes)), counted=bool(x.record.counted),
                      start_s=_fin(x.record.start_s))
                for x in eng.op_roofs)
    rows = {"layer_phase": tuple(eng.layer_rows), "layer": tuple(eng.layer_totals), "inclusive": tuple(eng.inclusive),
            "category": tuple(eng.category_rows), "op_name": tuple(eng.op_rows), "total": (eng.totals,)}
    eager = ((eng.layer_totals, eng.totals), (o.eager.rows["layer"], o.eager.totals)) if o.eager is not None else None
    return cls(
        step=info.step, stage=o.stage or info.stage, run=o.run,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), device=_device(eng.spec, eng.achievable),
        summary=summary, memory=mem,
        time_split=_time_split(eng), rows=rows, ops=ops, layers=layers,
        roofs=tuple(_load(RoofUsed, json_safe(r)) for r in roofs_used(eng)), model=model,
        communication=_communication(eng, ov), fsdp_whatif=fsdp,
        compiled_vs_eager=tuple(json_safe(compiled_vs_eager(*eager))) if eager is not None else None,
        what_if=WhatIf(o.what_if, str(eng.spec.name)) if o.what_if else None,
        opportunities=tuple(_opportunity(x, step) for x in opps),
        below_roof=tuple(_below_roof(r, c) for r, c in below),
        nonfinite=tuple(json_safe(dict(x)) for x in o.nonfinite if isinstance(x, dict)),
        noise=_noise(eng, noise, suppressed, step), context=_context(info, eng),
        user=json_safe(dict(o.user)),
        grad_spikes=tuple(json_safe(dict(x)) for x in o.grad_spikes if isinstance(x, dict)), profile=profile)
