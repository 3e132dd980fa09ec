"""Hand-made StepProfiles with numbers you can check by hand (for roofline/report/plot tests).

The A100 80GB SXM roofs are written out here (not read from gpu_specs.json) so the expected numbers in the tests
do not move when the table is edited: dense bf16/fp16 312e12, tf32 156e12, fp32 19.5e12 FLOP/s on the matrix units,
fp32 vector 19.5e12, bandwidth 2.039e12 B/s.
"""

from __future__ import annotations

from typing import Any

from tscope_callbacks.devices.spec import DeviceSpec
from tscope_callbacks.records import CaptureInfo, LayerRecord, OpRecord, StepProfile

__all__ = ["a100", "matmul", "pointwise", "op", "make_profile", "toy_profile", "SIZES"]

SIZES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8}


def a100(**kw: Any) -> DeviceSpec:
    """A100 80GB SXM datasheet roofs (dense)."""
    return DeviceSpec(
        name="NVIDIA A100-SXM4-80GB",
        flops={"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12, "int8": 624e12},
        bandwidth=2.039e12,
        vector_flops={"fp64": 9.7e12, "fp32": 19.5e12, "fp16": 78e12, "bf16": 39e12},
        source="NVIDIA A100 datasheet (dense)",
        **kw,
    )


def op(name: str, layer: str = "", phase: str = "forward", *, flops: int = 0, read: int = 0, written: int = 0,
       dtype: str = "float32", time_s: float | None = None, category: str = "pointwise", counted: bool = True,
       shapes: list | None = None) -> OpRecord:
    """A bare OpRecord."""
    return OpRecord(op=name, layer=layer, phase=phase, flops=flops, bytes_read=read, bytes_written=written,
                    dtype=dtype, input_shapes=shapes or [], time_s=time_s, counted=counted, category=category)


def matmul(m: int, n: int, k: int, *, dtype: str = "bfloat16", layer: str = "", phase: str = "forward",
           time_s: float | None = None) -> OpRecord:
    """aten.mm [m,k] x [k,n]: 2mnk FLOPs; reads mk + kn, writes mn elements."""
    s = SIZES[dtype]
    return op("aten.mm", layer, phase, flops=2 * m * n * k, read=(m * k + k * n) * s, written=m * n * s,
              dtype=dtype, time_s=time_s, category="matmul", shapes=[[m, k], [k, n]])


def pointwise(n: int, *, name: str = "aten.relu", dtype: str = "float32", layer: str = "", phase: str = "forward",
              time_s: float | None = None, flops_per_elem: int = 1) -> OpRecord:
    """Unary elementwise op on n elements: n FLOPs; reads and writes n elements."""
    s = SIZES[dtype]
    return op(name, layer, phase, flops=flops_per_elem * n, read=n * s, written=n * s, dtype=dtype, time_s=time_s)


def make_profile(ops: list[OpRecord], *, layers: dict[str, LayerRecord] | None = None,
                 wall_time_s: float | None = None, **info: Any) -> StepProfile:
    """A StepProfile of ``ops`` (indexed in order); ``info``: its ``CaptureInfo`` fields."""
    for i, r in enumerate(ops):
        r.index = i
    info.setdefault("device_name", "NVIDIA A100-SXM4-80GB")
    info.setdefault("model", "Toy")
    return StepProfile(ops=ops, layers=layers or {}, wall_time_s=wall_time_s, info=CaptureInfo(**info))


def toy_profile(timed: bool = True) -> StepProfile:
    """A two-block model step: matmuls, activations, a norm, an uncounted op, views, tiny ops, an optimizer step.

    Times (when ``timed``) are chosen so that every row is off its roof by a known factor.
    """
    t = (lambda s: s) if timed else (lambda s: None)
    ops = [
        matmul(4096, 4096, 4096, layer="blocks.0.fc", time_s=t(0.8e-3)),  # est 0.4405 ms
        op("aten.view", "blocks.0.fc", category="view", time_s=t(1e-6)),
        pointwise(1 << 24, dtype="bfloat16", name="aten.gelu", layer="blocks.0.act", time_s=t(0.1e-3)),
        matmul(4096, 1024, 4096, layer="blocks.1.fc", time_s=t(0.3e-3)),
        pointwise(1 << 22, dtype="bfloat16", name="aten.native_layer_norm", layer="blocks.1.norm",
                  time_s=t(0.05e-3), flops_per_elem=5),
        op("aten.nonzero", "blocks.1", read=1 << 20, dtype="bfloat16", counted=False, category="other",
           time_s=t(0.04e-3)),
        matmul(4096, 4096, 4096, layer="blocks.0.fc", phase="backward", time_s=t(1.2e-3)),
        matmul(4096, 4096, 4096, layer="blocks.0.fc", phase="backward", time_s=t(1.0e-3)),
        pointwise(1 << 24, dtype="bfloat16", name="aten.gelu_backward", layer="blocks.0.act", phase="backward",
                  time_s=t(0.2e-3)),
        op("aten.add", "blocks.1.norm", flops=64, read=512, written=256, time_s=t(3e-6)),
        op("aten.mul", "blocks.1.norm", flops=64, read=512, written=256, time_s=t(3e-6)),
        op("aten._foreach_add_", "", "optimizer", flops=1 << 24, read=1 << 27, written=1 << 26,
           category="optimizer", time_s=t(0.15e-3)),
    ]
    layers = {
        "": LayerRecord(path="", type="Toy"),
        "blocks.0.fc": LayerRecord(path="blocks.0.fc", type="Linear"),
        "blocks.0.act": LayerRecord(path="blocks.0.act", type="GELU"),
        "blocks.1": LayerRecord(path="blocks.1", type="Block"),
        "blocks.1.fc": LayerRecord(path="blocks.1.fc", type="Linear"),
        "blocks.1.norm": LayerRecord(path="blocks.1.norm", type="LayerNorm"),
    }
    # the callbacks' basis: the median of unprofiled steps (4 ms); the captured region's wall (9 ms) is never used
    basis = {"step_time_s": 4.0e-3, "step_time_basis": "unprofiled-median", "step_time_steps": 8} if timed else {}
    return make_profile(ops, layers=layers, wall_time_s=9.0e-3 if timed else None, step=7, **basis)
