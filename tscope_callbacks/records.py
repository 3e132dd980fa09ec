"""The data model shared by capture, analysis, callbacks and sinks.

Everything here is plain data: JSON-safe via ``to_dict``/``from_dict`` so a profiled step can be saved and
re-rendered later (``tscope report PATH``) without torch state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["OpRecord", "LayerRecord", "StepProfile", "CaptureInfo", "ProfileReason", "PROFILE_VERSION", "ProfileFormatError", "PHASES",
           "CATEGORIES", "NON_MODEL_PHASES", "ATTENTION_CONVENTIONS", "model_flops", "op_model_flops"]

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
    """One aten op call, as seen at the dispatcher. (``capture.build.build_result`` builds records positionally,
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


class ProfileReason(StrEnum):
    """Why a callback profiled a step (``CaptureInfo.reason``, the callbacks' ``history`` entries; a ``str``, so
    ``info.reason == "schedule"`` holds and the JSON stores the plain value)."""

    #: the callback's schedule (``every_n_steps``, ``start_step``, ``profile_first``) made the step due; also the
    #: first profile moved past warm-up (``CaptureOptions.wait_for_warmup``: the report says from which step)
    SCHEDULE = "schedule"
    #: a later step of a k-step series (``CaptureOptions.steps``): its op times enter the series' medians
    REPEAT = "repeat"
    #: a batch shape never profiled before: profiled once to count its FLOPs for the automatic MFU
    RECOUNT = "recount"
    #: the eager reference of a ``torch.compile``'d model (``CaptureOptions.compare_eager``), once
    EAGER_REFERENCE = "eager-reference"
    #: the step monitor's diagnosis of a trigger (a slowdown, a loss or gradient-norm spike)
    ANOMALY = "anomaly"
    #: the step monitor's own healthy baseline (the monitor alone in a trainer, without a scheduled callback)
    BASELINE = "baseline"


@dataclass(frozen=True)
class CaptureInfo:
    """What a profiled step's capture and its caller know about it, typed (``StepProfile.info``). Every field is
    None when unknown; a saved profile stores the known ones (``to_dict``). Build a changed copy with
    ``dataclasses.replace(info, field=value)``."""

    # the device and the capture (``capture.build``)
    device: str | None = None  #: "cpu" / "cuda" / "meta"
    device_name: str | None = None
    timing: str | None = None  #: the op-time source: "cpu-wall" / "cuda-kernels" / "none"
    model: str | None = None  #: the model's class name
    torch: str | None = None  #: torch's version
    inputs: list | None = None  #: [shape, dtype] of the model's tensor inputs at its first call
    internal_errors: list[str] | None = None  #: tscope's own errors during the capture (logged, not raised)
    paused_s: float | None = None  #: paused time, left out of wall_time_s (tscope's own checks, validation)
    capture_cost: dict[str, Any] | None = None  #: tscope's own host seconds, per part (``capture.profile``)
    clock_origin_ns: int | None = None  #: perf_counter_ns at the region's start (one clock per host)
    kernels: list | None = None  #: CUDA kernel timeline: [name, start_ns, duration_ns, stream, op index]
    memory_categories: dict[str, Any] | None = None  #: the step's memory by category (layer details)
    # precision and layout settings
    float32_matmul_precision: str | None = None  #: torch's setting during the capture ("highest"/"high"/...)
    trainer_precision: str | None = None  #: Lightning's precision plugin ("bf16-mixed", ...)
    attention_flops: str | None = None  #: the model-FLOPs convention of causal attention ("attended"/"full")
    cudnn_benchmark: bool | None = None
    conv_channels_last: bool | None = None  #: the model's 2-D convolutions (kernels over 1x1) are channels-last
    # compiled modules
    compiled_modules_run_eagerly: list[str] | None = None
    #: ``torch.compile``'d functions (not modules) the capture ran eagerly (force_eager): name -> [[first, last]]
    #: runs of the op indices (``OpRecord.index``) they ran, their backward ops included. The real run executes them
    #: compiled: the advice does not tell the user to fuse or compile those ops
    compiled_functions_run_eagerly: dict[str, list[list[int]]] | None = None
    compiled_capture: dict[str, Any] | None = None  #: kernels-mode capture of compiled modules
    replay: dict[str, Any] | None = None  #: a replayed step's match against its source profile
    # the step (callbacks)
    step: int | None = None  #: the optimizer step (train) or batch index (other stages)
    stage: str | None = None  #: "train" / "validation" / "test" / "predict"
    global_step: int | None = None  #: ``trainer.global_step`` when the profile started
    epoch: int | None = None
    reason: ProfileReason | None = None  #: why the step was profiled (a callback's capture; None: ``ts.profile``)
    micro_batches: int | None = None  #: micro-batches of the profiled optimizer step (gradient accumulation)
    #: the step monitor's medians over its recent clean steps (data wait, its share, steps, input_bound, input_fixes)
    step_breakdown: dict[str, Any] | None = None
    # the step time: the basis of MFU/MBU, never the profiled region's wall time
    step_time_s: float | None = None
    step_time_basis: str | None = None  #: "unprofiled-median" / "device-busy" / "op-time"
    step_time_steps: int | None = None  #: unprofiled steps the median is over
    step_time_clock: str | None = None  #: "CUDA events" / "wall clock"
    step_time_window: list[int] | None = None  #: [first, last] step of those
    step_time_spread_s: float | None = None  #: their typical deviation
    step_time_settled: bool | None = None  #: warm-up was over (5 steps in a row agreed)
    step_time_samples_s: list[float] | None = None
    step_time_sample_steps: list[int] | None = None
    deferred_from: int | None = None  #: the step the first profile was scheduled at, when it waited for warm-up
    device_busy_s: float | None = None
    device_idle_s: float | None = None
    outside_ops_s: float | None = None
    rank_step_times_s: list[float] | None = None  #: per rank, under DDP/FSDP (the world size is its length)
    skew: dict[str, Any] | None = None  #: the ranks' collectives matched (``analysis.comm.skew``)
    # the host while the step-time basis was measured (``devices.calibrate.host_environment``)
    host_cpus: int | None = None
    torch_threads: int | None = None
    host_others_load_per_cpu: float | None = None
    host_busy: bool | None = None
    host_oversubscribed: bool | None = None
    # several profiled steps merged into one (``analysis.noise.merge_steps``)
    merged_steps: list[int | None] | None = None
    matched_ops: int | None = None
    # a model analysed without training (``analyze_model``)
    analysis_precision: str | None = None  #: "bf16", "bf16-mixed", ...
    analysis_device: str | None = None  #: the torch device it ran on ("meta": counted, not computed)
    backward: bool | None = None
    backward_from: str | None = None  #: the loss the backward started from
    attention_backend: str | None = None  #: the fused attention counted on meta, or "device dispatch"
    optimizer: str | None = None  #: the optimizer step added ("adamw", ..., "custom")
    attention_calls: dict[str, int] | None = None  #: the attention ops routed, by backend

    def to_dict(self) -> dict[str, Any]:
        """The known fields (JSON-safe values; the keyword arguments of ``dataclasses.replace`` that set them)."""
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaptureInfo:
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in d.items() if k in names}
        if isinstance(known.get("reason"), str) and known["reason"] in ProfileReason.__members__.values():
            known["reason"] = ProfileReason(known["reason"])
        return cls(**known)


#: the version of :meth:`StepProfile.to_dict`'s format
PROFILE_VERSION = 2


class ProfileFormatError(ValueError):
    """A saved profile of another format version, or not a profile. One line."""


@dataclass
class StepProfile:
    """The result of one profiled region: ops in execution order plus per-layer totals, with ``info`` (what the
    capture and its caller know, typed: :class:`CaptureInfo`) and ``user`` (the caller's own data, free)."""

    ops: list[OpRecord] = field(default_factory=list)
    layers: dict[str, LayerRecord] = field(default_factory=dict)
    wall_time_s: float | None = None  #: host wall time of the whole region
    info: CaptureInfo = field(default_factory=CaptureInfo)
    user: dict[str, Any] = field(default_factory=dict)

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
        (``info.attention_flops``, set by ``RooflineCallback(attention_flops=...)``; default "attended")."""
        return model_flops(self.ops, self.info.attention_flops or "attended")

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.ops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PROFILE_VERSION,
            "wall_time_s": self.wall_time_s,
            "info": self.info.to_dict(),
            "user": dict(self.user),
            "ops": [r.to_dict() for r in self.ops],
            "layers": {k: v.to_dict() for k, v in self.layers.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepProfile:
        """Read :meth:`to_dict`'s dict back; :class:`ProfileFormatError` (one line) for another version."""
        if not isinstance(d, dict) or not isinstance(d.get("ops"), list):
            raise ProfileFormatError("not a profiled step (expected StepProfile.to_dict())")
        if d.get("version") != PROFILE_VERSION:
            raise ProfileFormatError(f"a profile of format version {d.get('version')!r}; this tscope reads version "
                                     f"{PROFILE_VERSION}: profile the step again with this version")
        return cls(
            ops=[OpRecord.from_dict(o) for o in d["ops"]],
            layers={k: LayerRecord.from_dict(v) for k, v in d.get("layers", {}).items()},
            wall_time_s=d.get("wall_time_s"),
            info=CaptureInfo.from_dict(d.get("info") or {}),
            user=dict(d.get("user") or {}),
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
    return sum(op_model_flops(r, attention) for r in (ops.ops if isinstance(ops, StepProfile) else ops)
               if r.phase not in NON_MODEL_PHASES)


def op_model_flops(r: OpRecord, attention: str = "attended") -> int:
    """One op's model FLOPs under an attention convention (:func:`model_flops`; its phase is not considered)."""
    return r.flops_dense if attention == "full" and r.flops_dense is not None else r.model_flops
