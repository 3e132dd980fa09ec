"""The data model shared by capture, analysis, callbacks and sinks.

Everything here is plain data: JSON-safe via ``to_dict``/``from_dict`` so a profiled step can be saved and
re-rendered later (``tscope report PATH``) without torch state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OpRecord", "LayerRecord", "StepProfile", "PHASES", "CATEGORIES", "NON_MODEL_PHASES",
           "ATTENTION_CONVENTIONS", "model_flops"]

#: Phases an op can run in. ``recompute`` is a forward re-run inside backward (activation checkpointing);
#: ``optimizer`` is set by the caller (e.g. the Lightning callback) around the optimizer step.
PHASES = ("forward", "backward", "recompute", "optimizer")
#: phases whose FLOPs are hardware work but not model FLOPs (MFU, PaLM's definition: the model's forward and
#: backward): activation-checkpointing recompute and the optimizer update
NON_MODEL_PHASES = frozenset({"recompute", "optimizer"})
#: FLOP conventions of causal attention in model FLOPs: the (query, key) pairs attended, or the full square
ATTENTION_CONVENTIONS = ("attended", "full")

#: Op classes used for grouping and for picking the compute roof (matmul-class ops run on tensor cores).
CATEGORIES = (
    "matmul",  # mm, addmm, bmm, baddbmm, linear decompositions
    "conv",  # convolution and its backward
    "attention",  # fused SDPA variants
    "norm",  # layer/batch/group/rms norm
    "softmax",
    "pointwise",  # unary/binary elementwise and activations
    "reduction",
    "embedding",
    "loss",
    "optimizer",  # _foreach_* and fused optimizer kernels
    "memory",  # copies, cat, index, fill: bytes but no FLOPs
    "comm",  # collectives (formulas.comm): bytes on the interconnect, placed against the link roof
    "view",  # metadata/view ops: known zero FLOPs and bytes
    "other",  # no formula (counted=False)
)

# Categories whose FLOPs run on matrix units (tensor cores) when the dtype allows it.
MATRIX_CATEGORIES = frozenset({"matmul", "conv", "attention"})
#: op classes whose kernels are paced by memory traffic (their time follows the measured bandwidth curves)
MEMORY_CATEGORIES = frozenset({"pointwise", "norm", "softmax", "loss", "reduction", "memory", "embedding",
                               "optimizer"})


@dataclass(slots=True)
class OpRecord:
    """One aten op call, as seen at the dispatcher. (``capture.region.build_result`` builds records positionally,
    in this field order: add new fields at the end.)"""

    op: str  #: overload packet name, e.g. ``"aten.mm"``
    layer: str  #: module path that was running (``""`` = the root model / outside any submodule)
    phase: str  #: one of PHASES
    flops: int = 0  #: a multiply-add counts 2
    bytes_read: int = 0
    bytes_written: int = 0
    dtype: str = ""  #: dtype of the op's main operand, e.g. ``"float32"``, ``"bfloat16"`` ("" when none)
    input_shapes: list = field(default_factory=list)  #: shapes of tensor args, in order (nested lists kept flat)
    time_s: float | None = None  #: measured; None when not timed
    counted: bool = True  #: False when no FLOP formula exists for the op
    category: str = "other"  #: one of CATEGORIES
    overload: str = ""  #: full overload name, e.g. ``"aten.mm.default"``
    output_shapes: list = field(default_factory=list)
    index: int = 0  #: position in execution order within the profile
    tensor_core: bool | None = None  #: CUDA: whether its kernels ran on tensor cores (None: unknown / CPU)
    flops_model: int | None = None  #: model FLOPs (MFU) where they differ from ``flops`` (attention backward: 2x fwd)
    flops_dense: int | None = None  #: full-square causal attention (FlopCounterMode/PaLM/Megatron), when different
    fused_ops: list = field(default_factory=list)  #: an Inductor kernel's fused aten ops (compiled capture)
    comm: dict | None = None  #: a collective's group, size, bytes (nccl-tests S), busbw factor (formulas.comm)
    start_s: float | None = None  #: start, seconds after the region's first op/kernel (CPU: op; CUDA: first kernel)
    leading_dims: list | None = None  #: matmuls: the operands' leading dimensions as stored (``formulas.apply``)
    #: its times in each of several profiled steps merged into one (``analysis.noise.merge_steps``; ``time_s`` is
    #: their median); None for a single step
    time_samples: list | None = None

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def model_flops(self) -> int:
        """What MFU counts for this op: ``flops_model`` where it differs from ``flops``, else ``flops``."""
        return self.flops if self.flops_model is None else self.flops_model

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(slots=True)
class LayerRecord:
    """Per-module totals (superset of InspectorGadgets' per-layer info).

    Times/flops/bytes are inclusive of children unless prefixed ``self_``. ``forward_s``/``backward_s`` are
    sums of the layer's own op times plus its children's (never host timers around async work).
    """

    path: str
    type: str = ""
    calls: int = 0
    num_parameters: int = 0
    num_trainable_parameters: int = 0
    input_shapes: list = field(default_factory=list)
    output_shapes: list = field(default_factory=list)
    grad_input_shapes: list = field(default_factory=list)
    grad_output_shapes: list = field(default_factory=list)
    param_bytes: int = 0
    grad_bytes: int = 0
    output_bytes: int = 0
    memory_fwd_bytes: int = 0  #: allocated bytes after the module's forward minus before it (``capture.memory``)
    memory_bwd_bytes: int = 0  #: the same across its backward (first to last backward op)
    peak_fwd_bytes: int = 0  #: highest allocated bytes while its forward ran, above the level at its start
    peak_bwd_bytes: int = 0
    saved_bytes: int = 0  #: activations its forward saved for backward (parameters excluded)
    forward_s: float = 0.0
    backward_s: float = 0.0
    self_forward_s: float = 0.0
    self_backward_s: float = 0.0
    recompute_s: float = 0.0  #: activation-checkpointing re-forward time (inclusive)
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

    @property
    def depth(self) -> int:
        return 0 if self.path == "" else self.path.count(".") + 1

    @property
    def parent(self) -> str | None:
        if self.path == "":
            return None
        return self.path.rpartition(".")[0]

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class StepProfile:
    """The result of one profiled region: ops in execution order plus per-layer totals.

    ``meta`` carries context the analysis needs: ``device`` ("cpu"/"cuda"), ``device_name``,
    ``float32_matmul_precision``, ``timing`` ("cpu-wall" / "cuda-kernels" / "none"), ``model`` (class name), and
    the caller's labels (``step``, ``epoch``...).
    """

    ops: list[OpRecord] = field(default_factory=list)
    layers: dict[str, LayerRecord] = field(default_factory=dict)
    wall_time_s: float | None = None  #: host wall time of the whole region
    meta: dict[str, Any] = field(default_factory=dict)

    # ---- honest coverage (fvcore-style) ----
    def uncounted_ops(self) -> dict[str, int]:
        """Ops with no FLOP formula: name -> number of calls (fvcore's ``unsupported_ops``)."""
        out: dict[str, int] = {}
        for r in self.ops:
            if not r.counted:
                out[r.op] = out.get(r.op, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def coverage(self) -> float:
        """Share of (non-view) op time covered by a formula; by op count when untimed. 1.0 when empty."""
        timed = all(r.time_s is not None for r in self.ops)
        tot = cov = 0.0
        for r in self.ops:
            if r.category == "view":
                continue
            w = (r.time_s or 0.0) if timed else 1.0
            tot += w
            if r.counted:
                cov += w
        return 1.0 if tot == 0 else cov / tot

    def op_time_s(self) -> float:
        return sum(r.time_s or 0.0 for r in self.ops)

    def uncovered_time_share(self) -> float | None:
        """Share of the region's wall time not inside any recorded op (Python overhead, hooks, idle)."""
        if not self.wall_time_s:
            return None
        return max(0.0, 1.0 - self.op_time_s() / self.wall_time_s)

    @property
    def total_flops(self) -> int:
        """Hardware FLOPs: every op that ran, activation-checkpointing recompute included."""
        return sum(r.flops for r in self.ops)

    @property
    def model_flops(self) -> int:
        """Model FLOPs (what MFU counts, :func:`model_flops`) under the profile's attention convention
        (``meta["attention_flops"]``, set by ``RooflineCallback(attention_flops=...)``; default "attended")."""
        return model_flops(self.ops, self.meta.get("attention_flops") or "attended")

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.ops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "wall_time_s": self.wall_time_s,
            "meta": dict(self.meta),
            "ops": [r.to_dict() for r in self.ops],
            "layers": {k: v.to_dict() for k, v in self.layers.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepProfile:
        return cls(
            ops=[OpRecord.from_dict(o) for o in d.get("ops", [])],
            layers={k: LayerRecord.from_dict(v) for k, v in d.get("layers", {}).items()},
            wall_time_s=d.get("wall_time_s"),
            meta=dict(d.get("meta", {})),
        )


def model_flops(ops: Iterable[OpRecord] | StepProfile, attention: str = "attended") -> int:
    """Model FLOPs of a step (its ops, or a StepProfile): what MFU counts, in the report, the automatic MFU windows
    between profiles and ``tscope diff`` alike (the one definition).

    - forward and backward only: activation-checkpointing ``recompute`` and the ``optimizer`` update are hardware
      FLOPs, not model FLOPs (PaLM's MFU; HFU counts them);
    - each op's ``model_flops``: attention backward as 2x its forward (flash kernels also recompute the scores: hardware
      work, not model work), masked attention at the pairs its mask keeps;
    - causal attention: ``attention="attended"`` (default) counts the (query, key) pairs attended, what a causal flash
      kernel computes (L(L+1)/2 per head for a square mask); ``"full"`` counts the full L x S square
      (``flops_dense``), as FlopCounterMode, PaLM's MFU and Megatron's formula do, to compare with published MFU;
    - per device: the local compute of this rank (torchtitan's convention), never multiplied by the world size.
    """
    if attention not in ATTENTION_CONVENTIONS:
        raise ValueError(f"attention_flops must be one of {ATTENTION_CONVENTIONS}, got {attention!r}")
    full = attention == "full"
    total = 0
    for r in ops.ops if isinstance(ops, StepProfile) else ops:
        if r.phase in NON_MODEL_PHASES:
            continue
        total += r.flops_dense if full and r.flops_dense is not None else r.model_flops
    return total
