"""Model-level figures of a roofline analysis (``summary``) and the roofs its ops were placed on (``roofs_used``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tscope_callbacks.analysis.roofline import RooflineAnalysis
    from tscope_callbacks.records import CaptureInfo

__all__ = ["summary_dict", "roofs_used", "step_basis_text"]


def step_basis_text(source: str | None, info: CaptureInfo) -> str:
    """What the step time behind MFU/MBU is, in words (every figure says its basis)."""
    if source == "unprofiled-median":
        n, clock = info.step_time_steps, info.step_time_clock or "wall clock"
        return f"median of {n} unprofiled steps, {clock}" if n else f"unprofiled steps, {clock}"
    if source == "device-busy":
        return "device busy: union of kernel intervals"
    if source == "op-time":
        return "summed op times; capture overhead excluded"
    return source or "not timed"


def summary_dict(r: RooflineAnalysis) -> dict[str, Any]:
    """Model-level figures of a report (``report.summary``). MFU uses the matrix roof of ``mfu_precision``, MBU the
    bandwidth; ``time_basis`` says whether the bound fractions are of measured or (untimed) estimated time. MFU counts
    model FLOPs (activation-checkpointing recompute excluded), HFU hardware FLOPs (recompute included); they are equal
    without recompute."""
    ach = r.achievable
    return {
        "device": r.spec.name, "device_source": getattr(r.spec, "source", ""),
        "roof": "measured" if getattr(r.spec, "measured", False) else "datasheet",
        "achievable_roof": getattr(ach, "name", None) if ach is not None else None,
        "model": r.info.model, "step": r.info.step, "timed": r.timed,
        "timing": r.info.timing, "float32_matmul_precision": r.info.float32_matmul_precision,
        "tf32": r.tf32, "n_ops": len(r.op_roofs), "total_flops": r.total_flops,
        "total_bytes": r.total_bytes, "intensity": r.totals.intensity,
        "measured_step_s": r.measured_step_s, "step_time_source": r.step_time_source,
        "step_time_basis_text": step_basis_text(r.step_time_source, r.info),
        "device_idle_s": r.info.device_idle_s, "device_busy_s": r.info.device_busy_s,
        "wall_time_s": r.wall_time_s, "capture_cost": r.info.capture_cost, "op_time_s": r.op_time_s,
        "estimated_step_s": r.estimated_step_s,
        "roof_step_s": r.roof_step_s,
        "kernel_model": r.kernel_model.source if r.kernel_model is not None else None,
        "achievable_estimated_step_s": r.totals.achievable_estimate_s,
        "mfu": r.mfu, "hfu": r.hfu, "model_flops": r.model_flops, "hardware_flops": r.hardware_flops,
        "recompute_flops": r.recompute_flops, "mfu_precision": r.mfu_precision, "mfu_peak_flops": r.mfu_peak_flops,
        "estimated_mfu": r.estimated_mfu, "estimated_hfu": r.estimated_hfu, "estimated_mbu": r.estimated_mbu,
        "mbu": r.mbu, "bandwidth": r.bandwidth,
        "achieved_tflops": r.achieved_tflops, "achieved_gbps": r.achieved_gbps,
        "time_basis": r.time_basis, "compute_bound_time_frac": r.compute_bound_time_frac,
        "memory_bound_time_frac": r.memory_bound_time_frac, "uncounted_time_frac": r.uncounted_time_frac,
        "overhead_time_frac": r.overhead_time_frac, "comm_time_frac": r.comm_time_frac,
        "flop_coverage": r.flop_coverage,
        "dominant_precision": r.dominant_precision, "precisions": dict(r.totals.precisions),
        "uncounted_ops": dict(sorted(r.totals.uncounted_ops.items(), key=lambda kv: -kv[1])),
    }


def roofs_used(report: RooflineAnalysis) -> list[dict[str, Any]]:
    """The roofs the report's ops were placed on: one dict per (precision, matrix), most FLOPs first."""
    seen: dict[tuple[str, bool], dict[str, Any]] = {}
    for o in report.op_roofs:
        if o.record.category == "view":
            continue
        p = o.roof_precision or o.precision
        d = seen.get((p, o.matrix))
        if d is None:
            d = seen[(p, o.matrix)] = {
                "precision": p, "matrix": o.matrix, "peak_flops": o.peak, "bandwidth": o.bandwidth,
                "ridge": o.ridge, "achievable_peak_flops": o.ach_peak, "achievable_bandwidth": o.ach_bandwidth,
                "flops": 0, "n_ops": 0}
        d["flops"] += o.flops
        d["n_ops"] += 1
    return sorted(seen.values(), key=lambda d: (-d["flops"], not d["matrix"], d["precision"]))
