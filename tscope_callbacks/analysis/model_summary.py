"""The model level of a profiled (or analysed) step, the summary a profiling tutorial starts from: parameters
(total, trainable), model size at its dtype, peak activation memory, MACs and FLOPs (forward, and the whole step),
latency per batch and throughput (samples/s, tokens/s).

Sources, each stated in the result (``*_source`` keys): parameters and size from the module (``LayerRecord`` of the
root); activations from the peak of the forward above its start (layer details; the allocator's on CUDA, the tracked
tensors' elsewhere), else the bytes the forward saved for backward (layer details), else unknown; MACs = FLOPs / 2 of the matrix classes
(matmul, conv, attention: one multiply-add is 2 FLOPs); latency = the step-time basis of the report (measured or,
untimed, the sum of expected kernel times) and the forward's share of it; samples = the first input's batch
dimension, tokens = batch x sequence when the first input is 2-D integer ids (the model's inputs at its first call;
in Lightning, whose training step rarely calls the LightningModule itself, the batch's tensors). Under gradient
accumulation the latency and the samples are those of one optimizer step of all its micro-batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tscope_callbacks.analysis.basis import step_time_of, time_of
from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.records import MATRIX_CATEGORIES, model_flops

if TYPE_CHECKING:
    from tscope_callbacks.analysis.roofline import RooflineAnalysis

__all__ = ["batch_counts", "model_summary"]


def batch_counts(inputs: list) -> tuple[int, int]:
    """(samples, tokens) of one batch from its inputs ``[[shape, dtype name], ...]``: the first input's first
    dimension, and batch x sequence when that input is 2-D integer ids (0 when not); (0, 0) without one."""
    if not inputs or not inputs[0][0]:
        return 0, 0
    shape, dtype = inputs[0]
    return shape[0], shape[0] * shape[1] if len(shape) == 2 and "int" in str(dtype) else 0


def model_summary(report: RooflineAnalysis) -> dict[str, Any]:
    """The summary of a report (``RooflineAnalysis``) and its layer records; JSON-safe."""
    root = report.layer_records.get("") if report.layer_records else None
    ops = [o.record for o in report.op_roofs]
    fwd = [r for r in ops if r.phase == "forward"]
    conv = report.info.attention_flops or "attended"  # model FLOPs: records.model_flops, as the report's
    mat = [r for r in ops if r.category in MATRIX_CATEGORIES]
    out: dict[str, Any] = {
        "params": getattr(root, "num_parameters", None), "params_trainable": getattr(root, "num_trainable_parameters",
                                                                                       None),
        "size_mb": (root.param_bytes / 2**20) if root is not None else None,
        "flops_forward": model_flops(fwd, conv), "flops_step": report.model_flops,
        "macs_forward": model_flops([r for r in mat if r.phase == "forward"], conv) // 2,
        "macs_step": model_flops(mat, conv) // 2,
    }
    peak, saved = getattr(root, "peak_fwd_bytes", 0) or 0, getattr(root, "saved_bytes", 0) or 0
    micro = int(report.info.micro_batches or 1)  # a step of gradient accumulation: each backward frees its own
    out["micro_batches"] = micro
    if peak:
        src = ("allocator peak of the forward" if report.info.device == "cuda"
               else "peak of the forward's tensors")  # tracked live bytes: no allocator statistics off CUDA
        out["activations_mb"], out["activations_source"] = peak / 2**20, src
    elif saved:
        out["activations_mb"] = saved / micro / 2**20
        out["activations_source"] = "bytes saved for backward" + (f", mean of {micro} micro-batches"
                                                                  if micro > 1 else "")
    else:
        out["activations_mb"], out["activations_source"] = None, "needs layer details"
    step = step_time_of(report.measured_step_s, report.estimated_step_s)
    fwd_t = sum(time_of(o, report.timed) for o in report.op_roofs if o.record.phase == "forward")
    total_t = (report.op_time_s or 0.0) if report.timed else report.estimated_step_s
    out["forward_ms"] = (step * fwd_t / total_t * 1e3) if step and total_t else None  # the forward's share
    batch, tokens = batch_counts(report.info.inputs or [])
    out["batch"] = batch * micro if batch else None
    out["samples_per_s"] = _div(out["batch"], step)
    out["tokens_per_s"] = _div(tokens * micro, step) if tokens else None
    return out
