"""``RooflineCallback``: per-op/per-layer roofline of scheduled training steps, plus automatic MFU every step."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from tscope_callbacks.callbacks.base import ProfileContext, ProfilingCallback, batch_signature
from tscope_callbacks.records import StepProfile

__all__ = ["RooflineCallback"]

_PREFIX = "tscope/roofline/"
_AUTO_SPECS: dict[str, Any] = {}  #: device -> spec resolved for gpu="auto" in this process

#: distinct batch-shape signatures whose FLOPs are kept for the automatic MFU (each new one costs a recount)
MAX_SIGNATURES = 8


class RooflineCallback(ProfilingCallback):
    """Roofline of scheduled training steps: FLOPs, bytes and time of every op (forward, backward, optimizer), each
    layer's distance from its roof, and model-level MFU/MBU -- no ``flops_per_batch`` needed.

    Args:
        gpu: ``"auto"`` (the trainer's root device; on CPU a measured roof), a device name from
            ``gpu_specs.json``, a JSON path or a ``DeviceSpec``. An unknown device with ``"auto"`` gives one warning
            and the roofline part is skipped (FLOPs, times and coverage are still logged); a name the table does not
            know (``UnknownDeviceError``, listing the closest names) or a malformed JSON file (``SpecFileError``,
            naming the row and field) raises here, at construction.
        precision: force the roof precision of matrix ops (e.g. ``"fp8"`` for a what-if). Default: each op's own
            dtype (TF32 for fp32 matmuls when ``float32_matmul_precision`` allows it); ``trainer.precision`` is
            recorded in the profile's meta.
        top: rows of the markdown table.
        plot: log the roofline plot.
        save_json: write ``<log_dir>/tscope/step_<N>.json`` (``{"profile", "device", "report"}``; render it again
            with ``tscope report PATH``).
        auto_mfu: after a profile counted the step's FLOPs, log MFU from each step's wall time at the trainer's
            ``log_every_n_steps``. The FLOPs are kept per batch-shape signature; a new shape is recounted by
            profiling the next step (at most ``MAX_SIGNATURES`` shapes). Time is measured with
            ``time.perf_counter()`` over the window of steps since the last logging step (profiled steps and
            validation excluded); on CUDA the device is synchronized only at the window's ends (logging steps).
        history: how many per-step summaries ``history`` keeps (records are never accumulated: only the last
            profile and report are kept).
        every_n_steps, start_step, max_profiles, profile_first, stages, raise_errors: see
            :class:`~tscope_callbacks.callbacks.base.ProfilingCallback`.

    Keys written (stage ``train``; other stages use ``tscope/roofline/<stage>/...``):

    - scalars ``tscope/roofline/mfu``, ``mbu``, ``achieved_tflops``, ``measured_step_ms``, ``estimated_step_ms``,
      ``compute_bound_time_frac``, ``memory_bound_time_frac``, ``flop_coverage`` on profiled steps (without a device
      roof only ``achieved_tflops``, ``measured_step_ms``, ``flop_coverage``); ``tscope/roofline/hfu`` (hardware
      FLOPs utilization, activation-checkpointing recompute included; ``mfu`` excludes it) when a step recomputed;
      with several ranks also
      ``tscope/roofline/step_ms_min``, ``tscope/roofline/step_ms_max`` (profiled region wall time across ranks);
    - scalars ``tscope/roofline/mfu`` and ``tscope/roofline/achieved_tflops`` on logging steps between profiles
      (automatic MFU; ``mfu`` only with a device roof);
    - text ``tscope/roofline/table`` (markdown), image ``tscope/roofline/plot``, table ``tscope/roofline/layers``
      (per layer: intensity, achieved GFLOP/s, time, estimate, bound) and, on W&B, the scatter
      ``tscope/roofline/scatter``;
    - file ``<log_dir>/tscope/step_<N>.json`` (other stages: ``<stage>_step_<N>.json``).

    Under DDP every rank profiles the same steps and the profiled region's wall time is gathered from all ranks;
    only rank zero analyses and writes (``last_report``, the automatic MFU and all outputs are rank zero's).

    Attributes: ``last_profile`` (StepProfile), ``last_report`` (RooflineReport or None), ``last_mfu``,
    ``history`` (summaries of recent profiled steps), ``spec`` (the DeviceSpec or None).
    """

    def __init__(self, gpu: Any = "auto", precision: str | None = None, *, top: int = 20, plot: bool = True,
                 save_json: bool = True, auto_mfu: bool = True, history: int = 32, every_n_steps: int | None = 500,
                 start_step: int = 10, max_profiles: int | None = None, profile_first: bool = True,
                 stages: str | list[str] | tuple[str, ...] = ("train",), raise_errors: bool = False) -> None:
        super().__init__(every_n_steps=every_n_steps, start_step=start_step, max_profiles=max_profiles,
                         profile_first=profile_first, stages=stages, raise_errors=raise_errors)
        from tscope_callbacks.devices.spec import DeviceSpec

        if not isinstance(gpu, (str, DeviceSpec)):
            raise TypeError(f"gpu must be 'auto', a device name, a JSON path or a DeviceSpec, got {type(gpu).__name__}")
        if precision is not None:
            if not isinstance(precision, str):
                raise TypeError(f"precision must be a string like 'bf16' or 'bf16-mixed', or None, got {precision!r}")
            from tscope_callbacks.devices.precision import normalize_precision

            normalize_precision(precision)  # raises ValueError naming the accepted values
        for name, val in (("plot", plot), ("save_json", save_json), ("auto_mfu", auto_mfu)):
            if not isinstance(val, bool):
                raise TypeError(f"{name} must be a bool, got {type(val).__name__}")
        for name, val in (("top", top), ("history", history)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be an int >= 1, got {val!r}")
        self.gpu, self.precision, self.top, self.plot = gpu, precision, top, plot
        self.save_json, self.auto_mfu = save_json, auto_mfu
        self.spec: Any = None
        if isinstance(gpu, DeviceSpec):
            self.spec = gpu
        elif gpu.strip().lower() != "auto":
            from tscope_callbacks.devices.resolve import get_device_spec

            # an unknown name or a bad JSON file fails here, naming the closest devices / the row and field
            self.spec = get_device_spec(gpu)
        self.trainer_precision: str | None = None
        self.last_profile: StepProfile | None = None
        self.last_report: Any = None
        self.last_mfu: float | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=history)
        # automatic MFU state
        self._flops: dict[tuple, int] = {}
        self._peak: float | None = None
        self._mfu_on = False
        self._reset = True
        self._last_gs = -1
        self._win_t0 = 0.0
        self._win_flops = 0
        self._win_steps = 0
        self._recount_at: int | None = None
        self._shape_warned = False

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from tscope_callbacks.devices.spec import DeviceSpec

        try:
            self.trainer_precision = str(trainer.precision)
        except Exception:
            self.trainer_precision = None
        if isinstance(self.gpu, DeviceSpec) or self.gpu.strip().lower() != "auto":
            return  # resolved at construction
        from tscope_callbacks.devices.resolve import get_device_spec
        from tscope_callbacks.devices.spec import UnknownDeviceError

        dev = trainer.strategy.root_device
        try:
            key = str(dev)
            if key not in _AUTO_SPECS:  # once per process: a CPU roof may be measured (seconds)
                _AUTO_SPECS[key] = get_device_spec(dev)  # CUDA: the device's name; CPU: a measured roof
            self.spec = _AUTO_SPECS[key]
        except UnknownDeviceError as e:
            self.spec = None
            rank_zero_warn(f"tscope RooflineCallback: no roof known for this device ({e}). The roofline part is "
                           "skipped; FLOPs, times and coverage are still logged. Pass gpu=<name> or a DeviceSpec.")
        except Exception as e:
            self.spec = None
            self._warn_once("resolving the device roof", e)

    # ------------------------------------------------------------------ profiled steps
    @override
    def _on_profile(self, trainer: pl.Trainer, pl_module: pl.LightningModule, result: StepProfile,
                    ctx: ProfileContext) -> None:
        result.meta["trainer_precision"] = self.trainer_precision
        if not ctx.is_global_zero:  # other ranks profile the same steps (and join the gather) but analyse nothing
            self.last_profile = result
            self.history.append({"stage": ctx.stage, "step": ctx.step, "reason": ctx.reason})
            return
        report = None
        if self.spec is not None:
            from tscope_callbacks.api import roofline

            try:
                report = roofline(result, self.spec, precision=self.precision)
            except Exception as e:  # counts and times are still logged below
                self._warn_once("the roofline analysis", e)
        self.last_profile, self.last_report = result, report
        if ctx.stage == "train":
            self._count_flops(result, report, ctx)
        prefix = _PREFIX if ctx.stage == "train" else f"{_PREFIX}{ctx.stage}/"
        scalars = {prefix + k: v for k, v in self._scalars(result, report, ctx).items()}
        self.history.append({"stage": ctx.stage, "step": ctx.step, "reason": ctx.reason, **scalars})
        sinks = self.sinks(trainer)
        if sinks is None:
            return
        log_step = ctx.log_step
        sinks.log_scalars(scalars, log_step)
        sinks.log_text(prefix + "table", self._markdown(result, report, ctx), log_step)
        if report is not None:
            rows = _layer_rows(report)
            sinks.log_table(prefix + "layers", rows, log_step)
            sinks.log_scatter(prefix + "scatter", rows, "intensity", "achieved_gflops_per_s", log_step,
                              title="layer roofline: intensity (FLOP/byte) vs achieved GFLOP/s")
            if self.plot:
                try:
                    self._log_plot(sinks, prefix + "plot", report, log_step)
                except Exception as e:
                    self._warn_once("drawing the roofline plot", e)
        if self.save_json:
            name = f"step_{ctx.step}.json" if ctx.stage == "train" else f"{ctx.stage}_step_{ctx.step}.json"
            sinks.write_json(name, {"profile": result.to_dict(), "device": _spec_dict(self.spec),
                                    "report": report.to_dict() if report is not None else None})

    def _scalars(self, result: StepProfile, report: Any, ctx: ProfileContext) -> dict[str, float]:
        if report is not None:
            out = dict(report.scalars())
        else:
            wall = result.wall_time_s or 0.0
            out = {"flop_coverage": float(result.coverage())}
            if wall > 0:
                out["measured_step_ms"] = wall * 1e3
                out["achieved_tflops"] = result.total_flops / wall / 1e12
        if ctx.world_size > 1 and ctx.step_times_s:
            out["step_ms_min"] = min(ctx.step_times_s) * 1e3
            out["step_ms_max"] = max(ctx.step_times_s) * 1e3
        return out

    def _markdown(self, result: StepProfile, report: Any, ctx: ProfileContext) -> str:
        head = f"**{ctx.stage} step {ctx.step}**"
        if ctx.micro_batches > 1:
            head += f" ({ctx.micro_batches} micro-batches)"
        if ctx.world_size > 1:
            t = ctx.step_times_s
            slow = max(range(len(t)), key=t.__getitem__)
            head += (f" -- profiled step time across {len(t)} ranks: min {min(t) * 1e3:.2f} ms, max "
                     f"{max(t) * 1e3:.2f} ms (slowest: rank {slow})")
        if report is not None:
            return head + "\n\n" + report.to_markdown(top=self.top)
        return head + " -- no device roof; op totals only\n\n" + _op_markdown(result, self.top)

    def _log_plot(self, sinks: Any, key: str, report: Any, step: int) -> None:
        from tscope_callbacks.render.plot import figure

        sinks.log_figure(key, figure(report), step)  # a standalone Agg Figure: no pyplot state to close

    # ------------------------------------------------------------------ automatic MFU
    def _count_flops(self, result: StepProfile, report: Any, ctx: ProfileContext) -> None:
        if ctx.batch_signature and (ctx.batch_signature in self._flops or len(self._flops) < MAX_SIGNATURES):
            self._flops[ctx.batch_signature] = int(result.model_flops)  # MFU: activation recompute excluded
        if report is not None and getattr(report, "mfu_peak_flops", None):
            self._peak = float(report.mfu_peak_flops)
        self._mfu_on = self.auto_mfu and bool(self._flops)
        self._reset = True  # the profiled step's time is not a plain step's
        self._recount_at = None

    @override
    def _wants(self, stage: str, step: int) -> bool:
        return stage == "train" and self._recount_at is not None and step >= self._recount_at

    @override
    def _train_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        step = trainer.global_step
        if self._recount_at is not None and step >= self._recount_at and not self.schedules["train"].is_due(step):
            self._recount_at = None
            if batch_signature(batch) not in self._flops:  # the new shape persists: count it
                self._start(trainer, pl_module, "train", step, batch, reason="recount")
            self._next_train = self.schedules["train"].next_due(step + 1)
            return
        super()._train_due(trainer, pl_module, batch)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._mfu_on:
            try:
                self._mfu_step_end(trainer, batch)
            except Exception as e:
                self._mfu_on = False
                self._warn_once("the automatic MFU", e)

    def _sync(self, trainer: pl.Trainer) -> None:
        dev = trainer.strategy.root_device
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def _mfu_step_end(self, trainer: pl.Trainer, batch: Any) -> None:
        gs = trainer.global_step
        if gs == self._last_gs:
            return  # no optimizer step (inside an accumulation window)
        self._last_gs = gs
        if self._reset:
            self._sync(trainer)
            self._reset, self._win_t0, self._win_flops, self._win_steps = False, time.perf_counter(), 0, 0
            return
        flops = self._flops.get(batch_signature(batch))
        if flops is None:
            if len(self._flops) < MAX_SIGNATURES:
                self._recount_at = gs
                self._next_train = min(self._next_train, gs)
            elif not self._shape_warned:
                self._shape_warned = True
                rank_zero_warn(f"tscope RooflineCallback: more than {MAX_SIGNATURES} batch shapes; the automatic "
                               "MFU skips steps whose shape was never profiled")
            self._reset = True
            return
        self._win_flops += flops
        self._win_steps += 1
        if gs % max(trainer.log_every_n_steps, 1):
            return
        self._sync(trainer)
        now = time.perf_counter()
        dt, fl = now - self._win_t0, self._win_flops
        self._win_t0, self._win_flops, self._win_steps = now, 0, 0
        if dt <= 0:
            return
        achieved = fl / dt
        scalars = {_PREFIX + "achieved_tflops": achieved / 1e12}
        if self._peak:
            self.last_mfu = achieved / self._peak
            scalars[_PREFIX + "mfu"] = self.last_mfu
        sinks = self.sinks(trainer)
        if sinks is not None:
            sinks.log_scalars(scalars, gs - 1)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset = True

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset = True

    # ------------------------------------------------------------------ checkpointing
    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_mfu": self.last_mfu}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.last_mfu = state_dict.get("last_mfu")


def _spec_dict(spec: Any) -> dict[str, Any] | None:
    if spec is None:
        return None
    to_dict = getattr(spec, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if dataclasses.is_dataclass(spec):
        d = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "achievable"}
        ach = getattr(spec, "achievable", None)
        d["achievable"] = _spec_dict(ach) if ach is not None else None
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}
    return {"name": str(getattr(spec, "name", spec))}


def _fin(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _layer_rows(report: Any) -> list[dict[str, Any]]:
    """Per layer (all phases, self attribution): where it sits on the roofline."""
    rows = []
    for r in report.layer_totals:
        if r.flops == 0 and r.bytes == 0:
            continue
        ms = r.measured_s
        rows.append({
            "layer": r.layer or "(root)",
            "type": r.type,
            "bound": r.bound,
            "intensity": _fin(r.intensity),
            "achieved_gflops_per_s": _fin(r.flops / ms / 1e9) if ms else None,
            "gflops": r.flops / 1e9,
            "mb": r.bytes / 1e6,
            "measured_ms": ms * 1e3 if ms is not None else None,
            "estimated_ms": r.estimate_s * 1e3,
            "attained": _fin(r.attained),
        })
    return rows


def _op_markdown(result: StepProfile, top: int) -> str:
    """Top ops by time (or FLOPs when untimed), for runs without a device roof."""
    agg: dict[str, list[float]] = {}
    for r in result.ops:
        a = agg.setdefault(r.op, [0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += r.flops
        a[2] += r.bytes
        a[3] += r.time_s or 0.0
    items = sorted(agg.items(), key=lambda kv: (kv[1][3], kv[1][1]), reverse=True)[:top]
    lines = ["| op | calls | GFLOPs | MB | time ms |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {int(v[0])} | {v[1] / 1e9:.4f} | {v[2] / 1e6:.3f} | {v[3] * 1e3:.3f} |" for k, v in items]
    return "\n".join(lines)
