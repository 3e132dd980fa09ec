"""The callbacks' option objects: typed, frozen, validated at construction (one line naming the field and what it
takes), each a topic of one callback's arguments -- as ``ts.MonitorOptions`` is the step monitor's thresholds.

``RooflineCallback(capture=CaptureOptions(...), outputs=RooflineOutputs(...), mfu=MFUOptions(...),
what_if=WhatIf(...))``, ``LayerProfilerCallback(outputs=LayerOutputs(...))``, ``NaNGuardCallback(options=
NaNGuardOptions(...))``. Change one field of a copy with ``dataclasses.replace(opts, field=value)``.

:func:`moved_arguments` turns an argument a callback no longer takes (it moved into one of these objects) into one
line saying what to write instead.
"""

from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass
from typing import Any

from tscope_callbacks.records import ATTENTION_CONVENTIONS

__all__ = ["CaptureOptions", "RooflineOutputs", "MFUOptions", "WhatIf", "LayerOutputs", "NaNGuardOptions",
           "check_bool", "check_int", "check_number", "check_option", "moved_arguments"]


def check_bool(owner: str, name: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise TypeError(f"{owner}.{name} must be True or False, got {v!r}")


def check_int(owner: str, name: str, v: Any, minimum: int, *, none: str | None = None) -> None:
    """``v`` an int >= ``minimum`` (or None where ``none`` says what None means)."""
    if v is None and none is not None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        alt = f" (or None: {none})" if none is not None else ""
        raise ValueError(f"{owner}.{name} must be an int >= {minimum}{alt}, got {v!r}")


def check_number(owner: str, name: str, v: Any, minimum: float, *, none: str | None = None,
                 strict: bool = False) -> None:
    """``v`` a finite number >= ``minimum`` (> with ``strict``; or None where ``none`` says what None means)."""
    if v is None and none is not None:
        return
    bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
    if bad or (v <= minimum if strict else v < minimum):
        alt = f" (or None: {none})" if none is not None else ""
        raise ValueError(f"{owner}.{name} must be a number {'>' if strict else '>='} {minimum:g}{alt}, got {v!r}")


def check_option(owner: str, name: str, v: Any, cls: type, *, none: str | None = None) -> Any:
    """``v`` an instance of the option class ``cls`` (None: its defaults, or off where ``none`` says so); a dict
    or anything else gets one line saying what to write."""
    if v is None:
        return None if none is not None else cls()
    if isinstance(v, cls):
        return v
    fields = ", ".join(f"{k}={x!r}" for k, x in v.items()) if isinstance(v, dict) else "..."
    hint = f"ts.{cls.__name__}({fields})"
    alt = f" or None ({none})" if none is not None else ""
    raise TypeError(f"{owner}: {name} must be a tscope_callbacks.{cls.__name__}{alt}, got {type(v).__name__}; "
                    f"write {name}={hint}")


@dataclass(frozen=True, kw_only=True)
class CaptureOptions:
    """How ``RooflineCallback`` takes each scheduled profile. Every field is keyword-only."""

    #: consecutive steps profiled per scheduled profile; the report, scalars and JSON (written when the last of them
    #: ends, at the first one's step) use each op's median time over them. On CUDA the later ones are replays
    #: (cheap). 1: one step, no noise estimate. Compiled captures use one step.
    steps: int = 3
    #: the first profile waits until 5 unprofiled steps in a row agree (warm-up over: the step-time basis), at most
    #: 16 steps past its scheduled step and never past the last ``steps`` steps of ``max_steps``; its report says
    #: from which step it moved. False: profile exactly on schedule.
    wait_for_warmup: bool = True
    #: on CUDA, time later profiles of the first profile's batch shapes from kernel records alone, with that
    #: profile's counts (``ts.profile(replay=)``: no dispatch mode or hook in the step, so a profiled step costs
    #: about what the profiler's kernel tracing costs); a step whose kernels do not match is reported untimed and
    #: ends replays. False: every profile is a full capture.
    replay: bool = True
    #: on a ``torch.compile``'d model (profiled in kernels mode: the compiled execution), profile the step after the
    #: first profile eagerly once and log ``tscope/roofline/compiled_vs_eager`` (per layer: compiled vs eager time,
    #: speedup, compiled % of roof) and ``tscope/roofline/compile_speedup``; later profiles repeat the comparison
    compare_eager: bool = True

    def __post_init__(self) -> None:
        check_int("CaptureOptions", "steps", self.steps, 1)
        for name in ("wait_for_warmup", "replay", "compare_eager"):
            check_bool("CaptureOptions", name, getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class RooflineOutputs:
    """What ``RooflineCallback`` writes for each profiled step (every output is a function of its one report).
    Every field is keyword-only."""

    #: rows of the markdown table (``tscope/roofline/table``)
    top: int = 20
    #: log the roofline plot (``tscope/roofline/plot``)
    plot: bool = True
    #: write ``<log_dir>/tscope/step_<N>.json``: ``{"profile", "device", "report"}``, the raw records, the device and
    #: the step's StepReport JSON (``ts.load_step_file`` reads it, ``tscope report PATH`` renders it again, the
    #: dashboard shows it)
    save_json: bool = True
    #: also write ``<log_dir>/tscope/trace_step_<N>.json``, a Chrome/Perfetto trace of the step with one process per
    #: rank (ops and kernels annotated with layer, FLOPs, bytes, bound; Kineto's argument names)
    save_trace: bool = False
    #: how many per-step summaries the callback's ``history`` keeps (only the last profile and report are kept whole)
    history: int = 32

    def __post_init__(self) -> None:
        for name in ("top", "history"):
            check_int("RooflineOutputs", name, getattr(self, name), 1)
        for name in ("plot", "save_json", "save_trace"):
            check_bool("RooflineOutputs", name, getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class MFUOptions:
    """``RooflineCallback``'s model FLOPs utilization. Every field is keyword-only."""

    #: after a profile counted the step's FLOPs, log MFU at the trainer's ``log_every_n_steps``: model FLOPs of the
    #: window's steps over its CUDA-event time (wall clock on CPU), read one window late so no step waits for the
    #: GPU. FLOPs are kept per batch-shape signature; a new shape is recounted by profiling the next step (at most
    #: ``callbacks.auto_mfu.MAX_SIGNATURES`` shapes). Windows with a profile, validation or an epoch boundary are
    #: left out. False: MFU on profiled steps only.
    automatic: bool = True
    #: FLOP convention of causal attention: ``"attended"`` (the (query, key) pairs computed, what a causal flash
    #: kernel does) or ``"full"`` (the full square, as FlopCounterMode, PaLM and Megatron count it: use it to
    #: compare with published MFU). Model FLOPs always exclude activation-checkpointing recompute (``hfu`` includes
    #: it).
    attention_flops: str = "attended"

    def __post_init__(self) -> None:
        check_bool("MFUOptions", "automatic", self.automatic)
        if self.attention_flops not in ATTENTION_CONVENTIONS:
            raise ValueError(f"MFUOptions.attention_flops must be one of {', '.join(map(repr, ATTENTION_CONVENTIONS))}"
                             f", got {self.attention_flops!r}")


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    """What-ifs ``RooflineCallback`` adds to each report (the measured figures stay). Every field is keyword-only.
    """

    #: force the roof precision of matrix ops (e.g. ``"fp8"``: the step's matrix ops on FP8 roofs). None: each op's
    #: own dtype (TF32 for fp32 matmuls when ``float32_matmul_precision`` allows it). Lightning's spellings
    #: (``"bf16-mixed"``) and dtype names are accepted and normalized.
    precision: str | None = None
    #: N (>= 2): predict each profiled step under FSDP2 over N GPUs (``ts.fsdp_whatif``: per-GPU memory op by op,
    #: collectives, exposed communication, step time) into the report and as scalars ``tscope/fsdp_whatif/{peak_mb,
    #: device_share, step_ms, exposed_comm_ms, mfu}``. Profiles then take layer details (the memory timeline). For a
    #: model trained on one device. None: off.
    fsdp_gpus: int | None = None

    def __post_init__(self) -> None:
        if self.precision is not None:
            if not isinstance(self.precision, str):
                raise TypeError(f"WhatIf.precision must be a string like 'fp8' or 'bf16-mixed', or None, got "
                                f"{self.precision!r}")
            from tscope_callbacks.devices.precision import normalize_precision

            object.__setattr__(self, "precision", normalize_precision(self.precision))  # ValueError naming them
        check_int("WhatIf", "fsdp_gpus", self.fsdp_gpus, 2, none="off")


@dataclass(frozen=True, kw_only=True)
class LayerOutputs:
    """What ``LayerProfilerCallback`` writes for each profiled step. Every field is keyword-only."""

    #: per-layer scalars (``forward_ms``, ``backward_ms``) for the ``top_k`` layers with the most FLOPs (a set that
    #: stays the same from step to step and run to run, unlike one by noisy self time); with ``paths``, for the
    #: selected layers instead. 0: none (the tables and the bars plot carry the layers).
    top_k: int = 5
    #: write the InspectorGadgets-format JSON per profiled step (``<log_dir>/tscope/layers_step_<N>.json``)
    save_json: bool = True
    #: log ``tscope/layers/bars``: per-layer forward/backward self time and memory, largest first
    plot: bool = True
    #: ``print`` the table on rank zero (otherwise it goes to the ``tscope_callbacks`` logger at INFO)
    verbose: bool = False

    def __post_init__(self) -> None:
        check_int("LayerOutputs", "top_k", self.top_k, 0)
        for name in ("save_json", "plot", "verbose"):
            check_bool("LayerOutputs", name, getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class NaNGuardOptions:
    """``NaNGuardCallback``'s thresholds and limits. Every field is keyword-only."""

    #: with action ``"skip"``, stop after this many skipped steps in a row
    max_skips: int = 10
    #: after the first alert, at most one summary alert per this many seconds ...
    alert_every_s: float = 300.0
    #: ... or this many events
    alert_every_n: int = 100
    #: GradScaler (fp16) collapse: an event when the next scale falls below this ...
    amp_min_scale: float = 1e-4
    #: ... or after this many overflows in a row
    amp_max_overflows: int = 16
    #: how many events the callback's ``events`` keeps (the first ones); ``num_events`` counts all
    max_events: int = 1000
    #: alert when a healthy step's global gradient norm exceeds this many times the median of the checked steps
    #: before it (at least 10 of them); None: no spike alerts. Alerts only; the callback's ``spikes`` keeps them
    spike_factor: float | None = 10.0
    #: how many checked steps the gradient norms' history keeps
    history: int = 64

    def __post_init__(self) -> None:
        o = "NaNGuardOptions"
        check_int(o, "max_skips", self.max_skips, 1)
        check_number(o, "alert_every_s", self.alert_every_s, 0.0)
        check_int(o, "alert_every_n", self.alert_every_n, 1)
        check_number(o, "amp_min_scale", self.amp_min_scale, 0.0)
        check_int(o, "amp_max_overflows", self.amp_max_overflows, 1)
        check_int(o, "max_events", self.max_events, 0)
        check_number(o, "spike_factor", self.spike_factor, 1.0, none="no spike alerts")
        check_int(o, "history", self.history, 2)


def moved_arguments(cls: type, kwargs: dict[str, Any], moved: dict[str, str]) -> None:
    """Raise one ``TypeError`` line for the first keyword ``cls`` does not take: what to write instead when it moved
    (``moved``: old name -> the replacement, e.g. ``"outputs=ts.RooflineOutputs(plot=...)"``), else the closest
    argument it does take. Called before ``__init__`` (``__new__``), so the message replaces Python's own."""
    params = inspect.signature(cls.__init__).parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name, value in kwargs.items():
        if name in params or (open_ended and name not in moved):
            continue
        where = moved.get(name)
        if where is not None:
            raise TypeError(f"{cls.__name__}({name}=...) moved: write {where.replace('...', repr(value), 1)}")
        taken = [p for p in params if p != "self"]
        close = difflib.get_close_matches(name, taken, n=1)
        raise TypeError(f"{cls.__name__} takes no argument {name!r}"
                        + (f"; did you mean {close[0]}=?" if close else f"; its arguments: {', '.join(taken)}"))
