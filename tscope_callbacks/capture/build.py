"""The one pass that builds a capture's result at stop: the per-op tuples gathered by the hot path become
:class:`~tscope_callbacks.records.OpRecord` s with their kernel times, then the layer records and the step's
metadata, including the step-time basis of a bare capture (:func:`step_time`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from tscope_callbacks.capture.compiled import PROVENANCE
from tscope_callbacks.capture.cuda_timing import Timeline
from tscope_callbacks.capture.layers import build_layers
from tscope_callbacks.capture.step_memory import memory_categories
from tscope_callbacks.formulas.apply import count_op
from tscope_callbacks.records import CaptureInfo, OpRecord, StepProfile

if TYPE_CHECKING:
    from tscope_callbacks.capture.paths import ModelTree
    from tscope_callbacks.capture.profile_options import ProfileOptions
    from tscope_callbacks.capture.state import CaptureState

__all__ = ["build_result", "base_info", "step_time"]

_NAMES: dict[Any, tuple[str, str]] = {}
#: the ``fused_ops`` of every record that is not an Inductor kernel: one shared empty list (records are read-only, as
#: the shape lists the count memo shares between them), not one more object per op for the garbage collector
_NO_FUSED: list = []


def _device_of(model: torch.nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def layout_facts(model: torch.nn.Module, tree: ModelTree | None = None) -> dict[str, Any]:
    """Choices the layer-type advice needs that the op records do not show: whether cuDNN's autotuner is on and
    whether the model's 2-D convolutions (kernels larger than 1x1, whose layout is unambiguous) hold channels-last
    weights (absent when the model has none). ``tree``: the capture's walk of the model, reused."""
    out: dict[str, Any] = {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}
    try:
        mods = (m for _, m in tree.modules) if tree is not None else model.modules()
        ws = [m.weight for m in mods if isinstance(m, torch.nn.Conv2d) and m.weight.dim() == 4
              and m.weight.shape[-1] * m.weight.shape[-2] > 1]
        if ws:
            out["conv_channels_last"] = all(w.is_contiguous(memory_format=torch.channels_last) for w in ws)
    except Exception:  # an exotic module: the rules say nothing
        pass
    return out


def base_info(p: ProfileOptions, st: CaptureState) -> dict[str, Any]:
    """The capture's facts about its region, under their ``CaptureInfo`` field names."""
    dev = st.tree.device() if st.tree is not None else _device_of(p.model)
    name = "cpu"
    if dev.type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(dev)
    return {
        "device": dev.type,
        "device_name": name,
        "timing": {"cpu": "cpu-wall", "cuda": "cuda-kernels"}.get(p.timing, "none"),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "model": type(p.model).__name__,
        "torch": torch.__version__,
        "internal_errors": list(p.errors),
        "compiled_modules_run_eagerly": list(st.compiled),
        "compiled_functions_run_eagerly": st.eager_fns.ranges() if st.eager_fns is not None else None,
        "compiled_capture": None if st.cstate is None else {
            "mode": "kernels", "provenance": PROVENANCE, "graphs": st.cstate.graphs,
            "kernels_wrapped": st.cstate.kernels, "kernel_records": len(st.fused),
            "cudagraphs": st.cstate.cudagraphs,
            "limits": "CUDA-graph replays (mode='reduce-overhead') count in device-busy time without per-kernel "
                      "records"},
        "paused_s": st.paused_ns * 1e-9,  #: left out of wall_time_s (tscope's own checks, validation)
        "inputs": st.inputs or [],  #: [shape, dtype] of the model's tensor inputs at its first call
        **layout_facts(p.model, st.tree),
    }


def step_time(ops: list[OpRecord], wall: float | None, timeline: Timeline | None, timing: str) -> dict[str, Any]:
    """The step-time basis of a bare capture. The region's wall time measures the profiler, not the model (capture
    slows the host), so it is never the step time: on CUDA the device-busy time (union of kernel intervals; GPU
    idle reported apart), on CPU the summed op times (host time outside ops reported apart)."""
    if timing == "cuda" and timeline is not None:
        busy = timeline.busy_s
        return {"step_time_s": busy or None, "step_time_basis": "device-busy", "device_busy_s": busy,
                "device_idle_s": max(0.0, (wall or 0.0) - busy) if wall else None}
    if timing == "cpu":
        op_s = sum(r.time_s or 0.0 for r in ops)
        return {"step_time_s": op_s or None, "step_time_basis": "op-time", "outside_ops_s":
                max(0.0, (wall or 0.0) - op_s) if wall else None}
    return {"step_time_s": None, "step_time_basis": None}


def build_result(p: ProfileOptions, st: CaptureState, wall: float | None, timeline: Timeline | None) -> StepProfile:
    for i, (func, args, kwargs, out) in st.deferred.items():  # value-dependent ops on CUDA: counted now, synced
        f, _, layer, phase, dt = st.pending[i]
        st.pending[i] = (f, count_op(func, args, kwargs, out, p.registry), layer, phase, dt)
    if st.cstate is not None:
        st.cstate.resolve(st.pending)
    st.masks.apply(st.pending)
    times = timeline.times if timeline is not None else None
    tcs = timeline.tensor_core if timeline is not None else None
    starts = timeline.starts if timeline is not None else None
    ops = []
    add = ops.append
    shapes = p.record_shapes
    fused, comm, cpu_starts = st.fused, st.comm, st.starts
    Op = OpRecord
    seen: dict[int, tuple[str, str]] = {}  # id(op) -> names: every op is alive in the pending list
    sums: dict[tuple[str, str], list] = {}  # (layer, phase) -> [seconds, flops, bytes]: build_layers' first pass
    key = acc = None  # the running (layer, phase) sum: ops of one layer and phase come in runs
    for i, (func, c, layer, phase, dt) in enumerate(st.pending):  # positional: the field order of OpRecord
        names = seen.get(id(func))
        if names is None:
            names = seen[id(func)] = _NAMES.get(func) or _names(func)
        f = fused.get(i) if fused else None
        t = dt if times is None else times[i]
        if key is None or key[0] != layer or key[1] != phase:
            key = (layer, phase)
            acc = sums.get(key)
            if acc is None:
                acc = sums[key] = [0.0, 0, 0]
        if t:
            acc[0] += t
        acc[1] += c.flops
        acc[2] += c.bytes_read + c.bytes_written
        add(Op(names[0], layer, phase, c.flops, c.bytes_read, c.bytes_written, c.dtype,
               c.input_shapes if shapes else [], t, c.counted, c.category,
               names[1], c.output_shapes if shapes else [], i, None if tcs is None else tcs[i],
               c.flops_model, c.flops_dense, list(f) if f else _NO_FUSED, comm.get(i) if comm else None,
               cpu_starts.get(i) if starts is None else starts[i], c.leading_dims))
    if st.details is not None:
        st.details.finish()
    layers = build_layers(p.model, ops, st.details, st.collapse, st.calls, tree=st.tree, sums=sums)
    # the caller's facts (the step, a basis measured on unprofiled steps...) win over the capture's
    info = CaptureInfo(**base_info(p, st), **step_time(ops, wall, timeline, p.timing))
    info = dataclasses.replace(info, **p.given.to_dict())
    tree = st.tree
    cats = memory_categories(p.model, ops, layers,
                             params=[prm for _, prm in tree.parameters] if tree is not None else None,
                             tracker=st.memory, optimizers=list(st.optimizers.values()),
                             grads_at_start=st.grads_at_start, buffers=tree.buffers() if tree is not None else None)
    st.optimizers.clear()
    device: dict[str, Any] = {}
    if cats is not None:
        device["memory_categories"] = cats
    if timeline is not None and timeline.kernels:  # the device side, for overlap analysis and traces
        device.update(timeline.device_info())
    elif st.timed:
        device["clock_origin_ns"] = st.t0  # perf_counter_ns: one clock for every process of a host
    return StepProfile(ops=ops, layers=layers, wall_time_s=wall, info=dataclasses.replace(info, **device),
                       user=dict(p.user))


def _names(func: Any) -> tuple[str, str]:
    """(packet name "aten.mm", overload name "aten.mm.default"), cached per op."""
    packet = f"{func.namespace}.{func._opname}" if hasattr(func, "_opname") else str(func)
    _NAMES[func] = (packet, str(func))
    return _NAMES[func]
