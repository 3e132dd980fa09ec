"""``RooflineCallback``: per-op/per-layer roofline of scheduled training steps, plus automatic MFU between them."""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from tscope_callbacks.analysis.analyze import AnalyzeOptions
from tscope_callbacks.analysis.compare import compiled_vs_eager
from tscope_callbacks.analysis.report import json_safe
from tscope_callbacks.analysis.throughput import Throughput, model_flops
from tscope_callbacks.callbacks import roofline_io as io
from tscope_callbacks.callbacks.auto_mfu import MAX_SIGNATURES, AutoMFU
from tscope_callbacks.callbacks.base import ProfileContext, ProfilingCallback
from tscope_callbacks.callbacks.clock import StepClock
from tscope_callbacks.callbacks.context import batch_signature, batch_size
from tscope_callbacks.callbacks.monitor import MonitorOptions, StepMonitor
from tscope_callbacks.callbacks.options import CaptureOptions, MFUOptions, RooflineOutputs, WhatIf, check_option
from tscope_callbacks.callbacks.series import AFTER_STEPS, FirstProfileWait, ProfileSeries
from tscope_callbacks.callbacks.sinks import metric_key
from tscope_callbacks.devices.spec import DeviceSpec
from tscope_callbacks.records import ProfileReason, StepProfile
from tscope_callbacks.report import StepReport

__all__ = ["RooflineCallback"]

log = logging.getLogger("tscope_callbacks")

#: unprofiled steps timed before a scheduled profile (their median is the profiled step's time basis)
BASIS_STEPS = 16
#: ``monitor``'s default: the step monitor on, with its default thresholds
MONITOR_ON = MonitorOptions()


class RooflineCallback(ProfilingCallback):
    """Roofline of scheduled training steps: FLOPs, bytes and time of every op (forward, backward, optimizer), each
    layer's distance from its roof, and model-level MFU/MBU -- no ``flops_per_batch`` needed.

    Every figure describes the step as it runs **unprofiled** (capture slows the host, so the profiled step's own
    wall time is never used): the step time behind MFU, MBU, ``measured_step_ms`` and the report is the median of
    the unprofiled steps around the profile, past warm-up (with ``capture.steps`` > 1 the 5 after it, its report is
    made then, and the 5 before; else up to 16 before it), timed with CUDA events on a GPU (wall clock on CPU)
    without any host sync. Warm-up is over once 5 unprofiled steps in a row agree (``callbacks.clock``); the first
    profile waits for that (at most 16 steps past ``start_step``) and its report says so. Only with fewer than 3
    such steps (every step profiled) the capture's device-busy time (CUDA: union of kernel intervals) or summed op
    times (CPU) stand in. The report says which, names the steps, and says when other processes kept the CPUs busy
    or torch's threads oversubscribe them.

    Per-op and per-layer times are the median over ``capture.steps`` consecutive profiled steps (their spread kept
    per op); rows whose times disagree across those steps, or with identical blocks (same ops and shapes), are
    marked noise in the report and get no advice (``analysis.noise``).

    Args:
        gpu: ``"auto"`` (the trainer's root device; on CPU a measured roof), a device name from
            ``gpu_specs.json``, a JSON path or a ``DeviceSpec``. An unknown device with ``"auto"`` gives one warning
            and the roofline part is skipped (FLOPs, times and coverage are still logged); a name the table does not
            know (``UnknownDeviceError``, listing the closest names) or a malformed JSON file (``SpecFileError``,
            naming the row and field) raises here, at construction.
        every_n_steps, start_step, max_profiles, profile_first, stages, raise_errors: the schedule and error
            policy, as in every tscope callback (:class:`~tscope_callbacks.callbacks.base.ProfilingCallback`).
        capture: how each scheduled profile is taken (:class:`~tscope_callbacks.CaptureOptions`: ``steps``
            consecutive steps per profile (3), ``wait_for_warmup``, ``replay`` on CUDA, ``compare_eager`` for compiled
            models). None: its defaults.
        outputs: what each profiled step writes (:class:`~tscope_callbacks.RooflineOutputs`: markdown ``top`` rows,
            ``plot``, ``save_json``, ``save_trace``, ``history``). None: its defaults.
        mfu: the model FLOPs utilization (:class:`~tscope_callbacks.MFUOptions`: ``automatic`` MFU between profiles
            at the trainer's ``log_every_n_steps``, the ``attention_flops`` convention). None: its defaults.
        what_if: what-ifs added to each report (:class:`~tscope_callbacks.WhatIf`: a forced matrix ``precision``
            such as ``"fp8"``, FSDP2 over ``fsdp_gpus`` GPUs). None: none.
        monitor: **on by default**: the step monitor (:class:`~tscope_callbacks.StepMonitor`) this callback adds to
            the trainer's callbacks at setup (unless the trainer already has one): every step's time in named parts
            (``tscope/step/*``), input-bound and loop-overhead verdicts, the late rank under DDP
            (``tscope/ranks/*``), GPU power, clocks and energy (``tscope/gpu/*``, with the ``nvml`` extra) and a
            diagnosis when steps get slower or the loss or gradient norm spikes, with an alert naming what grew;
            its baseline is this callback's first profile, and it captures nothing before ``start_step``.
            A :class:`~tscope_callbacks.MonitorOptions` (default ``ts.MonitorOptions()``): a monitor with those
            thresholds; a ``StepMonitor``: that one (e.g. ``StepMonitor(telemetry=False)``); None: no monitor.

    An argument that moved into an option object (``plot=``, ``profile_steps=``, ``precision=``...) raises one line
    saying what to write instead.

    Keys written (stage ``train``; other stages use ``tscope/roofline/<stage>/...``):

    - scalars ``tscope/roofline/mfu``, ``mbu``, ``achieved_tflops``, ``measured_step_ms``, ``estimated_step_ms``,
      ``compute_bound_time_frac``, ``memory_bound_time_frac``, ``flop_coverage`` on profiled steps (without a device
      roof only ``achieved_tflops``, ``measured_step_ms``, ``flop_coverage``); ``tscope/roofline/hfu`` (hardware
      FLOPs utilization: activation-checkpointing recompute and attention backward's recomputed scores included;
      ``mfu`` excludes both) when it differs from ``mfu``;
      with several ranks also ``tscope/roofline/step_ms_min``, ``tscope/roofline/step_ms_max`` (the step time
      basis across ranks);
    - scalars ``tscope/roofline/{mfu, achieved_tflops, step_ms, samples_per_s, tokens_per_s}`` on logging steps
      between profiles (automatic MFU, per rank; ``mfu`` only with a device roof, ``tokens_per_s`` when the batch's
      first tensor is 2-D integer ids). ``mfu`` has one meaning in both: model FLOPs over the real step time;
    - text ``tscope/roofline/table`` (markdown), image ``tscope/roofline/plot``, table ``tscope/roofline/layers``
      (per layer: intensity, achieved GFLOP/s, time, estimate, bound) and, on W&B, the scatter
      ``tscope/roofline/scatter``;
    - hyperparameters ``tscope/model/*`` once per fit (parameters, size, activations, forward and step GFLOP, GMAC,
      latency per batch, samples/s, tokens/s: ``analysis.model_summary``): the logger's hyperparameters or config
      (TensorBoard's HPARAMS tab and ``hparams.yaml``, the W&B config), not one-point charts;
    - at each profiled step with layer details (e.g. beside a ``LayerProfilerCallback``): scalars
      ``tscope/memory/{step_peak_mb, device_share}`` (the step's measured peak and its share of the device) and the
      memory by category, fixed for a model and batch shape, as hyperparameters
      ``tscope/memory/{weights_mb, grads_mb, optimizer_state_mb, activations_saved_mb}`` (``capture.step_memory``;
      ``callbacks.sinks.HPARAM_AREAS``); on TensorBoard a custom-scalars layout grouping MFU, step time and
      throughput; ``tscope/comm/*`` and the text
      ``tscope/comm/table`` when the step ran collectives; ``tscope/roofline/compiled_vs_eager`` and
      ``tscope/roofline/compile_speedup`` for compiled models;
    - file ``<log_dir>/tscope/step_<N>.json`` (other stages: ``<stage>_step_<N>.json``).

    Under DDP every rank profiles the same steps; only rank zero analyses and writes.

    A profiled step is analysed once into a :class:`~tscope_callbacks.StepReport`; every output above (scalars,
    tables, plot, files) is a function of it (``callbacks.roofline_io.emit``).

    Attributes: ``last_profile`` (StepProfile), ``last_report`` (the last step's StepReport, what every output was
    made of; None without a device roof), ``last_mfu``, ``history`` (summaries of recent profiled steps: stage, step,
    ``reason`` (a :class:`~tscope_callbacks.ProfileReason`) and the step's scalars), ``spec`` (the DeviceSpec or
    None), ``throughput``, ``monitor`` (the StepMonitor it adds, or None), and its options ``capture``, ``outputs``,
    ``mfu``, ``what_if``.
    """

    #: arguments that moved into an option object: what to write instead (one line, ``options.moved_arguments``)
    _moved = {
        "precision": "what_if=ts.WhatIf(precision=...)", "fsdp_whatif": "what_if=ts.WhatIf(fsdp_gpus=...)",
        **{k: f"outputs=ts.RooflineOutputs({k}=...)" for k in ("top", "plot", "save_json", "save_trace", "history")},
        "auto_mfu": "mfu=ts.MFUOptions(automatic=...)", "attention_flops": "mfu=ts.MFUOptions(attention_flops=...)",
        "profile_steps": "capture=ts.CaptureOptions(steps=...)", "steps": "capture=ts.CaptureOptions(steps=...)",
        **{k: f"capture=ts.CaptureOptions({k}=...)" for k in ("wait_for_warmup", "replay", "compare_eager")},
    }

    def __init__(self, gpu: str | DeviceSpec = "auto", *, every_n_steps: int | None = 500, start_step: int = 10,
                 max_profiles: int | None = None, profile_first: bool = True,
                 stages: str | list[str] | tuple[str, ...] = ("train",), capture: CaptureOptions | None = None,
                 outputs: RooflineOutputs | None = None, mfu: MFUOptions | None = None, what_if: WhatIf | None = None,
                 monitor: MonitorOptions | StepMonitor | None = MONITOR_ON, raise_errors: bool = False) -> None:
        if not isinstance(gpu, (str, DeviceSpec)):
            raise TypeError(f"RooflineCallback: gpu must be 'auto', a device name, a JSON path or a DeviceSpec, got "
                            f"{type(gpu).__name__}")
        self.gpu = gpu
        self.capture: CaptureOptions = check_option("RooflineCallback", "capture", capture, CaptureOptions)
        self.outputs: RooflineOutputs = check_option("RooflineCallback", "outputs", outputs, RooflineOutputs)
        self.mfu: MFUOptions = check_option("RooflineCallback", "mfu", mfu, MFUOptions)
        self.what_if: WhatIf = check_option("RooflineCallback", "what_if", what_if, WhatIf)
        if isinstance(monitor, bool) or not isinstance(monitor, (MonitorOptions, StepMonitor, type(None))):
            say = "monitor=None" if monitor is False else "monitor=ts.MonitorOptions() (the default)"
            raise TypeError(f"RooflineCallback: monitor takes a tscope_callbacks.MonitorOptions (on, the default), a "
                            f"StepMonitor or None (off), got {monitor!r}; write {say}")
        #: the step monitor this callback adds to the trainer at setup (None: off; see ``monitor`` above)
        self.monitor: StepMonitor | None = StepMonitor(monitor) if isinstance(monitor, MonitorOptions) else monitor
        # what, besides the schedule, makes a training step due (``_next_step``)
        self._recount_at: int | None = None  #: a step whose batch shape is new: profile it to count its FLOPs
        self._eager_at: int | None = None  #: the step of the eager reference (``CaptureOptions.compare_eager``)
        self._eager_pending = False
        self._series = ProfileSeries(self.capture.steps)  #: the running k-step series
        self._wait = FirstProfileWait(self.capture.wait_for_warmup)  #: the first profile's wait for warmed-up steps
        super().__init__(every_n_steps=every_n_steps, start_step=start_step, max_profiles=max_profiles,
                         profile_first=profile_first, stages=stages, raise_errors=raise_errors)
        self._auto_on = self.mfu.automatic  #: the automatic MFU runs (off after a failure, said once)
        self.eager_report: StepReport | None = None  #: the eager reference of a compiled model (``compare_eager``)
        self.spec: Any = gpu if isinstance(gpu, DeviceSpec) else None
        if self.spec is None and gpu.strip().lower() != "auto":
            from tscope_callbacks.devices.resolve import get_device_spec

            # an unknown name or a bad JSON file fails here, naming the closest devices / the row and field
            self.spec = get_device_spec(gpu)
        self.last_profile: StepProfile | None = None
        self.last_report: StepReport | None = None  #: the last step's report (what every output is made of)
        self.history: deque[dict[str, Any]] = deque(maxlen=self.outputs.history)
        self.auto = AutoMFU(MAX_SIGNATURES)  #: the automatic MFU between profiles (its FLOPs, window, rates)
        self._clock: StepClock | None = None
        self._last_gs = -1
        self._model_logged = False  #: ``tscope/model/*`` are logged once per fit

    @property
    def throughput(self) -> Throughput:
        """The automatic MFU's rates over finished windows (``peak_flops``: the roof its MFU is against)."""
        return self.auto.throughput

    @property
    def last_mfu(self) -> float | None:
        """The automatic MFU of the last finished window."""
        return self.auto.last_mfu

    @last_mfu.setter
    def last_mfu(self, value: float | None) -> None:
        self.auto.last_mfu = value

    @property
    def _flops(self) -> dict[Any, int]:
        return self.auto.flops

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        cuda = trainer.strategy.root_device.type == "cuda"
        self._clock = StepClock(cuda)
        self._series = ProfileSeries(self.capture.steps)
        coord = self.coordinator(trainer)
        coord.register_clock(self._clock)
        coord.register_clock(self.auto.start(cuda))
        if self.monitor is not None and not any(isinstance(c, StepMonitor) for c in trainer.callbacks):
            trainer.callbacks.append(self.monitor)  # its own hooks from here (Lightning calls it in this loop too)
            if trainer.is_global_zero:
                log.info("tscope RooflineCallback: added its StepMonitor to the trainer's callbacks (monitor=None "
                         "turns it off)")
        if self.spec is not None or isinstance(self.gpu, DeviceSpec):
            return  # resolved at construction
        from tscope_callbacks.devices.resolve import get_device_spec
        from tscope_callbacks.devices.spec import UnknownDeviceError

        try:  # CUDA: the device's name; CPU: this machine's measured roof (cached per machine)
            self.spec = get_device_spec(trainer.strategy.root_device)
        except UnknownDeviceError as e:
            rank_zero_warn(f"tscope RooflineCallback: no roof known for this device ({e}). The roofline part is "
                           "skipped; FLOPs, times and coverage are still logged. Pass gpu=<name> or a DeviceSpec.")
        except Exception as e:
            self.faults.report("resolving the device roof", e)

    # ------------------------------------------------------------------ per-step timing (no host sync)
    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step != self._last_gs and self._clock is not None:  # a new optimizer step's first batch
            self._last_gs = trainer.global_step
            self._new_step(trainer, pl_module, trainer.global_step)
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)  # schedule, capture

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # a capture ends: analyse, emit
        if self.auto.running:
            self._count(trainer, batch)

    def _new_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, gs: int) -> None:
        """Time the step (near a profile: the step-time basis), release a held series' report once the steps after
        it are timed (or a profile starts now), and log the automatic MFU's finished windows at logging steps."""
        if self._next_train - gs <= BASIS_STEPS or self._series.pending is not None:
            try:
                self._clock.tick(gs)  # type: ignore[union-attr]
            except Exception as e:  # profiles then use their own basis; the schedule goes on
                self._clock = None
                self.faults.report("the step clock", e)
        self._release(trainer, pl_module, now="train" in self.schedules and self.schedules["train"].next_due(gs) <= gs)
        if self._auto_on and self.auto.flops and gs % max(trainer.log_every_n_steps, 1) == 0:
            self._log_windows(trainer, gs)

    def _count(self, trainer: pl.Trainer, batch: Any) -> None:
        """The automatic MFU's window counts every micro-batch's samples and each optimizer step's model FLOPs; a
        batch shape never profiled is profiled at this step to count them."""
        try:
            sig = batch_signature(batch)
            self.auto.count_micro_batch(*batch_size(sig))
            if trainer.global_step != self._last_gs and self.auto.count_step(sig):  # the optimizer stepped
                self._recount_at = trainer.global_step
                self._replan(trainer.global_step)
        except Exception as e:  # the automatic MFU stops; profiles go on
            self._auto_on, self.auto.timer = False, None
            self.faults.report("counting samples and FLOPs per step", e)

    def _log_windows(self, trainer: pl.Trainer, step: int, *, final: bool = False) -> None:
        """The automatic MFU at a logging step: the windows the device has finished, logged at their last step."""
        try:
            for at, vals in self.auto.windows(step, final=final):
                self.sinks(trainer).log_scalars({metric_key("roofline", k): v for k, v in vals.items()}, at)
        except Exception as e:
            self._auto_on = False
            self.faults.report("the automatic MFU", e)

    def _dirty(self) -> None:
        for c in (self._clock, self.auto.timer):
            if c is not None:
                c.mark_dirty()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._dirty()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._dirty()

    @override
    def _step_basis(self, trainer: pl.Trainer) -> dict[str, Any]:
        return {**self._clock.labels(BASIS_STEPS), **self._wait.labels()} if self._clock is not None else {}

    # ------------------------------------------------------------------ profiled steps
    @override
    def _capture_options(self) -> dict[str, Any]:
        return {**super()._capture_options(), "replay": self.capture.replay,
                **({"layer_details": True} if self.what_if.fsdp_gpus else {}),
                **({"compiled": "eager"} if self._eager_pending else {})}

    @override
    def _on_profile(self, trainer: pl.Trainer, pl_module: pl.LightningModule, result: StepProfile,
                    ctx: ProfileContext) -> None:
        if ctx.reason == ProfileReason.EAGER_REFERENCE:  # the eager reference of a compiled model: the last compiled step
            if self.spec is not None and ctx.is_global_zero:  # compared with it, at this step
                eager = self.eager_report = self._report(result, AnalyzeOptions(precision=self.what_if.precision))
                last = self.last_report
                if last is not None and eager is not None:
                    rows = compiled_vs_eager((last.rows["layer"], last.totals), (eager.rows["layer"], eager.totals))
                    io.emit_comparison(io.Comparison(last.step, eager.step, tuple(json_safe(rows))),
                                       self.sinks(trainer), ctx, self.outputs.top)
            return
        if ctx.reason == ProfileReason.REPEAT:
            if self._series.add(result, ctx):
                self._flush_series(trainer, pl_module, wait=True)
            else:
                self._replan(ctx.step + 1)  # the series' next step
            return
        self._flush_series(trainer, pl_module)  # a series cut short by this profile
        if (ctx.reason == ProfileReason.SCHEDULE and ctx.stage == "train" and not result.info.compiled_capture
                and self._series.begin(result, ctx)):
            self._replan(ctx.step + 1)  # the series' next step
            return
        self._analyse(trainer, pl_module, result, ctx)

    def _flush_series(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, wait: bool = False) -> None:
        """Analyse the running series (its ops' median times) at its first step -- with ``wait``, once the unprofiled
        steps after it are timed (its basis: the steps around it); nothing when none runs."""
        self._release(trainer, pl_module, now=True)
        merged = self._series.take(self.faults)
        if merged is not None and wait and self._clock is not None:
            self._series.hold(merged, self._series.last_step)
        elif merged is not None:
            self._analyse(trainer, pl_module, *merged)

    def _release(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, now: bool = False) -> None:
        held = self._series.release(trainer.global_step, now=now)
        if held is not None:
            if self._clock is not None and self._clock.basis(2 * AFTER_STEPS) is not None:
                # the 5 unprofiled steps after it and the 5 before: its step-time basis
                held[0].info = dataclasses.replace(held[0].info, **self._clock.labels(2 * AFTER_STEPS))
            self._analyse(trainer, pl_module, *held)
            # the analysis and its outputs ran inside this step: no step-time basis, no automatic-MFU window (an
            # H200 GPT-2 fit logged a 95 ms window, MFU 7% against 11.8%, for the step its report was written in)
            self.coordinator(trainer).dirty_clocks()

    def _analyse(self, trainer: pl.Trainer, pl_module: pl.LightningModule, result: StepProfile,
                 ctx: ProfileContext) -> None:
        """A profiled step (or a merged series): analysed once, then emitted (rank zero) as a function of its
        StepReport."""
        report = self._analyze(trainer, pl_module, result, ctx)
        step = io.AnalysedStep(result, report, self.spec,
                               self._traces(trainer, result, ctx) if self.outputs.save_trace else None,
                               self.eager_report.step if self.eager_report is not None else None)
        self.last_profile, self.last_report = result, report
        if ctx.stage == "train":  # the automatic MFU counts the FLOPs of this batch shape from now on
            self.auto.learn(ctx.batch_signature, model_flops(result, self.mfu.attention_flops),
                            step.report.summary.mfu_peak_flops if step.report is not None else None)
            self._recount_at = None
        scalars = {metric_key("roofline", k, ctx.stage): v for k, v in io.step_scalars(step, ctx).items()}
        self.history.append({"stage": ctx.stage, "step": ctx.step, "reason": ctx.reason, **scalars})
        if ctx.is_global_zero:
            opts = io.EmitOptions(top=self.outputs.top, plot=self.outputs.plot, save_json=self.outputs.save_json,
                                  model=not self._model_logged)
            io.emit(step, self.sinks(trainer), ctx, opts, self.faults)
            self._model_logged |= step.report is not None and ctx.stage == "train"
        if (self.capture.compare_eager and ctx.stage == "train" and result.info.compiled_capture
                and self.eager_report is None and self._eager_at is None):  # an eager reference at the next step
            self._eager_at = ctx.step + 1
            self._replan(ctx.step + 1)

    def _analyze(self, trainer: pl.Trainer, pl_module: pl.LightningModule, result: StepProfile,
                 ctx: ProfileContext) -> StepReport | None:
        """The step's one report (rank zero, with a device roof), with the FSDP what-if and the eager reference
        (compiled models) in the options it is built with. None when there is none."""
        result.info = dataclasses.replace(result.info, trainer_precision=str(getattr(trainer, "precision", "")),
                                          attention_flops=self.mfu.attention_flops)
        if self.spec is None or not ctx.is_global_zero:
            return None
        extra: dict[str, Any] = {}
        if self.capture.compare_eager and ctx.stage == "train" and self.eager_report is not None and \
                result.info.compiled_capture:
            extra["eager"] = self.eager_report
        # the trainer's NaN guard's gradient spikes up to this step (through the coordinator), for the report and the
        # dashboard
        spikes = self.coordinator(trainer).grad_spikes(ctx.step)
        if spikes:
            extra["grad_spikes"] = spikes
        opts = AnalyzeOptions(precision=self.what_if.precision, **extra)
        report = self._report(result, opts)
        if report is not None and self.what_if.fsdp_gpus and ctx.stage == "train":
            try:
                w = io.fsdp_whatif_of(report, pl_module, self.what_if.fsdp_gpus, str(getattr(trainer, "precision", "")))
                report = self._report(result, dataclasses.replace(opts, fsdp_whatif=w)) or report
            except Exception as e:  # e.g. an already sharded model: said once, the rest of the report stands
                self.faults.report(f"the FSDP what-if over {self.what_if.fsdp_gpus} GPUs", e)
        return report

    def _report(self, result: StepProfile, options: AnalyzeOptions) -> StepReport | None:
        """``ts.analyze`` of the step on the callback's device; None (reported once) when the analysis fails:
        counts and times are still logged."""
        from tscope_callbacks.api import analyze

        try:
            return analyze(result, self.spec, options)
        except Exception as e:
            self.faults.report("the roofline analysis", e)
            return None

    def _traces(self, trainer: pl.Trainer, result: StepProfile, ctx: ProfileContext) -> tuple[StepProfile, ...]:
        """Every rank's records of the step, for the trace (a collective under several ranks: all ranks call it)."""
        try:
            return io.gather_traces(trainer, result, ctx)
        except Exception as e:
            self.faults.report("gathering the ranks' profiles for the trace", e)
            return (result,)

    @override
    def _next_step(self, step: int) -> int:
        """The schedule's next due step, or earlier: the next step of a running series, a batch shape to recount,
        the eager reference, or every step while the first profile waits for warmed-up steps."""
        nxt = super()._next_step(step)
        sched = self.schedules.get("train")
        if sched is not None and sched.taken == 0 and self._wait.deferred_from is not None:
            return step  # the first profile, waiting (``_due``)
        for s in (self._series.next, self._recount_at, self._eager_at):
            if s is not None:
                nxt = min(nxt, max(s, step))
        return nxt

    @override
    def _wants(self, stage: str, step: int) -> bool:
        return stage == "train" and ((self._recount_at is not None and step >= self._recount_at)
                                     or (self._series.next is not None and step == self._series.next))

    @override
    def held_until(self) -> int:
        """After a running series and the unprofiled steps timed after it (its step-time basis)."""
        until = super().held_until()
        if self._series.next is not None:
            until = max(until, self._series.next + 1)
        if self._series.pending_until is not None:
            until = max(until, self._series.pending_until)
        return until

    @override
    def _due(self, stage: str, step: int) -> bool:
        if stage == "train" and self._wait.waiting(step) and self.schedules["train"].taken == 0:
            return True  # the first profile, waiting for warmed-up unprofiled steps
        return super()._due(stage, step)

    @override
    def _claim(self, stage: str, step: int) -> None:
        sched = self.schedules.get("train")
        span = self.capture.steps + AFTER_STEPS
        first_deferred = (stage == "train" and self._wait.deferred_from is not None and sched.taken == 0
                          and step > self._wait.deferred_from
                          and (sched.every_n_steps is None or sched.every_n_steps >= span))
        super()._claim(stage, step)
        if first_deferred and self.capture.steps > 1:
            # the first profile moved off its scheduled step (warm-up): its series and the unprofiled steps timed
            # after it (its basis) are not cut by the next scheduled profile, which moves to the first scheduled step
            # past them (where they do not reach it, the schedule is unchanged; a schedule denser than a series and
            # its basis, every_n_steps < profile_steps + AFTER_STEPS, is kept as asked)
            sched.reserve(step + span)
            self._replan(step + 1)

    @override
    def _train_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        step = trainer.global_step
        if self._eager_at is not None and step >= self._eager_at and not self.schedules["train"].is_due(step):
            self._eager_at = None
            self._eager_pending = True
            try:
                self._start(trainer, pl_module, "train", step, batch, reason=ProfileReason.EAGER_REFERENCE)
            finally:
                self._eager_pending = False
            self._replan(step + 1)
            return
        if self._recount_at is not None and step >= self._recount_at and not self.schedules["train"].is_due(step):
            self._recount_at = None
            if batch_signature(batch) not in self._flops:  # the new shape persists: count it
                self._start(trainer, pl_module, "train", step, batch, reason=ProfileReason.RECOUNT)
            self._replan(step + 1)
            return
        sched = self.schedules["train"]
        if self._series.next is not None and not sched.is_due(step):
            if step == self._series.next:  # the next step of a k-step series
                self._start(trainer, pl_module, "train", step, batch, reason=ProfileReason.REPEAT)
                return
            self._flush_series(trainer, pl_module)  # a step was skipped (e.g. resumed): analyse what there is
        if self._clock is not None and sched.taken == 0 and self._due("train", step):
            if self._wait.hold(self._clock, step, trainer.max_steps, self.capture.steps):
                self._replan(step + 1)  # wait for warmed-up unprofiled steps (the step-time basis)
                return
            self._start(trainer, pl_module, "train", step, batch)
            return
        super()._train_due(trainer, pl_module, batch)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush_series(trainer, pl_module)  # a series the end of training cut short
        timer = self.auto.timer
        if self._auto_on and timer is not None and (timer.closed or timer.current is not None):
            self._log_windows(trainer, trainer.global_step, final=True)  # the last windows: one wait, at the end

    # ------------------------------------------------------------------ checkpointing
    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_mfu": self.last_mfu}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.last_mfu = state_dict.get("last_mfu")
