"""The shared machinery of the profiling callbacks: schedule, one capture session per step, cleanup, errors.

Hook order (Lightning 2.x, automatic optimization): ``on_train_batch_start`` -> optimizer step with closure
(training_step, ``on_before_zero_grad``, backward) -> ``on_before_optimizer_step`` -> ``optimizer.step`` ->
``on_train_batch_end``. With ``accumulate_grad_batches=k`` the first k-1 micro-batches skip the optimizer step.

So a profiled training step starts at ``on_train_batch_start`` of the first micro-batch whose ``global_step`` is
due, marks phase ``"optimizer"`` from ``on_before_optimizer_step`` until the optimizer's step post-hook, and stops at
``on_train_batch_end`` once the optimizer stepped (``global_step`` moved) -- forward, backward and optimizer step of
every micro-batch of the window (each micro-batch counted once, however many tscope callbacks share the window); a
validation run inside the window is paused out of it (not recorded, its time left out of the wall time). Manual
optimization: the whole ``training_step`` is the region. Off-schedule steps install nothing: the hot path is one
integer comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from tscope_callbacks.callbacks.context import (
    ProfileContext,
    batch_signature,
    gather_floats,
    gather_objects,
    signature_inputs,
)
from tscope_callbacks.callbacks.coordinator import Capture
from tscope_callbacks.callbacks.guarded import GuardedCallback
from tscope_callbacks.callbacks.schedule import NEVER, Schedule, normalize_stages
from tscope_callbacks.callbacks.sinks import Sink
from tscope_callbacks.records import CaptureInfo, ProfileReason, StepProfile

__all__ = ["ProfilingCallback", "ProfileContext"]

#: why a step may be timed from kernel records with an earlier full capture's counts (``capture.replay``): not a
#: recount (new shapes: counting is its point) nor a compiled model's eager reference (another code path)
_REPLAYABLE = frozenset({ProfileReason.SCHEDULE, ProfileReason.REPEAT, ProfileReason.ANOMALY, ProfileReason.BASELINE})


class ProfilingCallback(GuardedCallback):
    """Base of the tscope profiling callbacks: schedule, shared capture, sinks, cleanup and error policy.

    Args (keyword-only):
        every_n_steps: profile every N optimizer steps (steps that are multiples of N); None: only ``start_step``.
        start_step: first step that may be profiled (skips warm-up).
        max_profiles: at most this many profiles per stage (None = unlimited).
        profile_first: also profile ``start_step`` itself.
        stages: which stages to profile: ``"train"`` (forward+backward+optimizer per optimizer step) and opt-in
            ``"validation"``, ``"test"``, ``"predict"`` (forward only, by batch index within the epoch; their
            outputs are logged at ``global_step`` for validation and at the batch index for test/predict).
        raise_errors: let exceptions raised by tscope's own code propagate (default: log one line per failing
            part, training continues unchanged).
    """

    #: the first training step with work for this callback: set by ``_replan`` only, read by the hot path
    _next_train: int = NEVER

    def __init__(self, *, every_n_steps: int | None = 500, start_step: int = 10, max_profiles: int | None = None,
                 profile_first: bool = True, stages: str | Sequence[str] = ("train",),
                 raise_errors: bool = False) -> None:
        super().__init__()
        if not isinstance(raise_errors, bool):
            raise TypeError(f"raise_errors must be a bool, got {type(raise_errors).__name__}")
        self.stages = normalize_stages(stages)
        self.raise_errors = raise_errors
        self.schedules = {s: Schedule(every_n_steps, start_step, max_profiles, profile_first) for s in self.stages}
        self._replan(0)
        self._next_eval: dict[str, int] = {}
        self._silence_told: set[tuple[str, str]] = set()
        self._eval_batches: dict[str, int] = {}  #: eval stage -> most batches one of its epochs ran (silence reasons)

    # ------------------------------------------------------------------ subclass API
    def _capture_options(self) -> dict[str, Any]:
        """Options for ``ts.profile``: layer_details, check_finite, paths, depth."""
        return {"layer_details": False, "check_finite": False, "paths": None, "depth": None}

    def _on_profile(self, trainer: pl.Trainer, pl_module: pl.LightningModule, result: StepProfile,
                    ctx: ProfileContext) -> None:
        """Handle one profiled step's records (all ranks; ``self.sinks(trainer)`` writes on rank zero only)."""

    def _step_basis(self, trainer: pl.Trainer) -> dict[str, Any]:
        """``CaptureInfo`` fields giving the profile its step-time basis (the RooflineCallback's unprofiled-step
        median: ``step_time_*``, ``host_*``)."""
        return {}

    def _next_step(self, step: int) -> int:
        """The first training step ``>= step`` at which this callback has work: the schedule's next due step (a
        subclass adds its own reasons)."""
        sched = self.schedules.get("train")
        return sched.next_due(step) if sched is not None else NEVER

    def _replan(self, step: int) -> None:
        """The one place the next training step with work is set (the hot path's one comparison reads it)."""
        self._next_train = self._next_step(step)

    def _due(self, stage: str, step: int) -> bool:
        sched = self.schedules.get(stage)
        return sched is not None and sched.is_due(step, ignore_last=stage != "train")

    def _wants(self, stage: str, step: int) -> bool:
        """Join a capture at ``step`` although the schedule does not make it due (e.g. a FLOP recount)."""
        return False

    def held_until(self) -> int:
        """The first training step this callback's profiles leave alone: after the last step it profiled or
        reserved. The step monitor times layers (which slows steps) only from there."""
        s = self.schedules.get("train")
        return s.last_step + 1 if s is not None else 0

    def _claim(self, stage: str, step: int) -> None:
        sched = self.schedules[stage]
        sched.mark(step)
        if stage == "train":
            self._replan(step + 1)
        else:
            self._next_eval[stage] = sched.next_due(step + 1, ignore_last=True)

    # ------------------------------------------------------------------ helpers
    def sinks(self, trainer: pl.Trainer) -> Sink:
        """Where outputs go: the trainer's loggers on rank zero, a do-nothing sink elsewhere (and under
        ``fast_dev_run``, which runs the profiling code path but writes nothing)."""
        return self.coordinator(trainer).sinks(trainer, self.raise_errors)

    # ------------------------------------------------------------------ session control
    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, step: int, batch: Any,
               reason: ProfileReason = ProfileReason.SCHEDULE) -> None:
        coord = self.coordinator(trainer)
        if coord.running is not None:
            return  # another stage's capture is running (e.g. validation inside an accumulation window)
        members = [cb for cb in trainer.callbacks if isinstance(cb, ProfilingCallback) and cb is not self
                   and (cb._due(stage, step) or cb._wants(stage, step))]
        members.insert(0, self)
        scheduled = False
        for m in members:
            if m._due(stage, step):
                m._claim(stage, step)
                scheduled = True
        opts = [m._capture_options() for m in members]
        basis: dict[str, Any] = {}
        for m in members:
            basis.update(m._step_basis(trainer))
        info = CaptureInfo(step=step, stage=stage, global_step=trainer.global_step, epoch=trainer.current_epoch,
                           reason=reason, **basis)
        prof = None
        sig = batch_signature(batch) if stage == "train" else ()
        details = any(o.get("layer_details") for o in opts)
        check = any(o.get("check_finite") for o in opts)
        compiled = "eager" if any(o.get("compiled") == "eager" for o in opts) else "auto"
        # count once, time later (CUDA): a training step of the batch shapes of an earlier full capture is timed from
        # kernel records alone with that capture's counts, unless a member checks values or opted out (the later
        # steps of a k-step series too: RooflineCallback's ``capture.steps``; the step monitor's diagnoses, which
        # compare op times: a replay that does not match says so, and the next one is a full capture)
        key = (stage, sig, details, compiled)
        replayable = (stage == "train" and not check and reason in _REPLAYABLE
                      and all(o.get("replay", True) for o in opts))
        source = coord.replay_source(key) if replayable else None
        try:
            from tscope_callbacks.capture.profile import profile

            if source is not None:
                prof = profile(pl_module, replay=source, info=info, faults=self.faults)
            else:
                prof = profile(pl_module, layer_details=details, check_finite=check, info=info, compiled=compiled,
                               faults=self.faults)
            prof.start()
        except Exception as e:
            prof = None
            self.faults.report(f"starting the profile of {stage} step {step}", e)
        cap = Capture(coord, trainer, stage, step, members, prof, sig, reason, scheduled, key)
        cap.inputs = signature_inputs(sig or batch_signature(batch))
        coord.running = cap

    def _finish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Stop the running capture, gather per-rank step times (all ranks, same steps), hand out the records."""
        coord = self.coordinator(trainer)
        s = coord.take()
        if s is None:
            return
        result: StepProfile | None = None
        prof = s.profile
        try:
            if s.profile is not None:
                s.profile.label(micro_batches=max(s.micro_batches, 1))
            result = s.stop()
            coord.after_capture(s.key, prof, result)
        except Exception as e:
            self.faults.report("stopping the profile", e)
        step_s = float((result.info.step_time_s or 0.0) if result is not None else 0.0)
        # all ranks reach here at the same steps when the schedule (deterministic in the step) made it due; a
        # recount (local batch shapes) may happen on one rank only, so it never joins a collective
        times = [step_s]
        if s.scheduled:
            try:
                times = [row[0] for row in gather_floats(trainer, [step_s])]
            except Exception as e:
                self.faults.report("gathering step times across ranks", e)
        if result is None:
            return
        # the LightningModule itself was never called: the batch's tensors are the model's inputs
        inputs = s.inputs if not result.info.inputs and s.inputs else result.info.inputs
        result.info = dataclasses.replace(result.info, inputs=inputs, rank_step_times_s=times)
        if s.scheduled and trainer.world_size > 1:
            self._gather_comm(trainer, result)
        ctx = ProfileContext(stage=s.stage, step=s.step, global_step=s.global_step, epoch=s.epoch,
                             step_times_s=times, world_size=trainer.world_size, is_global_zero=trainer.is_global_zero,
                             batch_signature=s.signature, micro_batches=max(s.micro_batches, 1), reason=s.reason)
        for m in s.members:
            try:
                m._on_profile(trainer, pl_module, result, ctx)
            except Exception as e:
                m.faults.report(f"handling the profile of {s.stage} step {s.step}", e)

    def _gather_comm(self, trainer: pl.Trainer, result: StepProfile) -> None:
        """Every rank's collectives (kind, start on the host clock, duration), for the rank-skew analysis."""
        from tscope_callbacks.analysis.comm import skew

        origin = (result.info.clock_origin_ns or 0) * 1e-9
        mine = [(r.comm["collective"], origin + (r.start_s or 0.0), r.time_s or 0.0) for r in result.ops
                if r.comm and r.comm.get("collective") != "wait"]
        try:
            per_rank = gather_objects(trainer, mine)
            result.info = dataclasses.replace(result.info, skew=skew(per_rank))
        except Exception as e:
            self.faults.report("gathering collectives across ranks", e)

    # ------------------------------------------------------------------ training hooks
    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step < self._next_train:
            return
        try:
            self._train_due(trainer, pl_module, batch)
        except Exception as e:
            self.coordinator(trainer).abort()
            self._replan(trainer.global_step + 1)
            self.faults.report("scheduling a profile", e)

    def _train_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        step = trainer.global_step
        sched = self.schedules["train"]
        if not sched.is_due(step):
            self._replan(step)  # resumed past a due step, or already profiled
            return
        self._start(trainer, pl_module, "train", step, batch)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        s = self.coordinator(trainer).running
        if s is not None and s.stage == "train":
            s.mark_optimizer()

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        s = self.coordinator(trainer).running
        if s is None or s.stage != "train":
            return
        s.count_batch(batch_idx)
        if (pl_module.automatic_optimization and trainer.global_step == s.global_step
                and s.micro_batches < trainer.accumulate_grad_batches):
            return  # still inside the accumulation window
        self._finish(trainer, pl_module)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        s = self.coordinator(trainer).running
        if s is not None and s.stage == "train":
            self._finish(trainer, pl_module)

    # ------------------------------------------------------------------ eval stages (forward only, by batch index)
    def _eval_epoch_start(self, stage: str) -> None:
        sched = self.schedules.get(stage)
        self._next_eval[stage] = sched.next_due(0, ignore_last=True) if sched is not None else NEVER

    def _eval_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, batch: Any,
                          batch_idx: int) -> None:
        if batch_idx >= self._eval_batches.get(stage, 0) and stage in self.schedules and not trainer.sanity_checking:
            self._eval_batches[stage] = batch_idx + 1
        if batch_idx < self._next_eval.get(stage, NEVER) or trainer.sanity_checking:
            return
        try:
            if self._due(stage, batch_idx):
                self._start(trainer, pl_module, stage, batch_idx, batch)
            else:
                self._next_eval[stage] = self.schedules[stage].next_due(batch_idx + 1, ignore_last=True)
        except Exception as e:
            self.coordinator(trainer).abort()
            self._next_eval[stage] = batch_idx + 1
            self.faults.report("scheduling a profile", e)

    def _eval_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, batch_idx: int) -> None:
        s = self.coordinator(trainer).running
        if s is not None and s.stage == stage and s.step == batch_idx:
            s.count_batch(batch_idx)
            self._finish(trainer, pl_module)

    def _pause_training_capture(self, trainer: pl.Trainer, paused: bool) -> None:
        s = self.coordinator(trainer).running
        if s is not None and s.stage == "train":
            s.pause(paused)  # validation inside a profiled training window is not training work

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause_training_capture(trainer, True)
        self._eval_epoch_start("validation")

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause_training_capture(trainer, False)

    @override
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, pl_module, "validation", batch, batch_idx)

    @override
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, pl_module, "validation", batch_idx)

    @override
    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_epoch_start("test")

    @override
    def on_test_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, pl_module, "test", batch, batch_idx)

    @override
    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, pl_module, "test", batch_idx)

    @override
    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_epoch_start("predict")

    @override
    def on_predict_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                               batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, pl_module, "predict", batch, batch_idx)

    @override
    def on_predict_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, pl_module, "predict", batch_idx)

    # ------------------------------------------------------------------ cleanup
    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.coordinator(trainer).abort()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.release_coordinator()
        try:
            self._explain_silence(trainer, stage)
        except Exception:
            pass

    def _explain_silence(self, trainer: pl.Trainer, fn: str) -> None:
        """Say once why a run profiled nothing, where a user expects output."""
        from lightning.pytorch.utilities import rank_zero_warn

        name = type(self).__name__
        fn = str(getattr(fn, "value", fn))  # Lightning passes its TrainerFn enum
        whys = []
        if fn == "fit" and "train" in self.schedules and self.schedules["train"].taken == 0:
            start = self.schedules["train"].start_step
            if trainer.fast_dev_run:
                whys.append(f"fast_dev_run runs {trainer.global_step} step(s) and turns logging off; the first profile "
                            f"is due at step {start}: nothing was profiled or written")
            elif trainer.global_step <= start:
                whys.append(f"the run ended at step {trainer.global_step}, before the first profile (start_step={start}):"
                            " nothing was profiled; lower start_step")
        if fn == "fit" and "validation" in self.schedules and self.schedules["validation"].taken == 0:
            whys.append(self._eval_silence("validation"))
        elif fn in ("validate", "test", "predict"):
            stage = "validation" if fn == "validate" else fn
            if stage not in self.schedules:
                whys.append(f"trainer.{fn}() ran, but this callback profiles stages={self.stages}: nothing was "
                            f"profiled; pass stages=({', '.join(repr(s) for s in (*self.stages, stage))})")
            elif self.schedules[stage].taken == 0:
                whys.append(self._eval_silence(stage))
        self._eval_batches.clear()
        for why in whys:
            if (fn, why) not in self._silence_told:
                self._silence_told.add((fn, why))
                rank_zero_warn(f"tscope {name}: {why}")

    def _eval_silence(self, stage: str) -> str:
        """Why ``stage`` (validation, test or predict) was never profiled: no batch of it ran, or too few."""
        n, start = self._eval_batches.get(stage, 0), self.schedules[stage].start_step
        if n == 0:
            why = {"validation": "no validation batch ran (the fit has no val_dataloader, or limit_val_batches=0, or "
                                 "it ended before check_val_every_n_epoch / val_check_interval came)",
                   "test": "no test batch ran (no test_dataloader, or limit_test_batches=0)",
                   "predict": "no predict batch ran (no predict_dataloader, or limit_predict_batches=0)"}[stage]
            return f"stages includes {stage!r}, but {why}: nothing was profiled there"
        return (f"{stage} epochs ran {n} batch{'es' * (n != 1)}, and the first {stage} profile is due at batch index "
                f"{start} (start_step counts {stage} batches): nothing was profiled there; lower start_step")

    # ------------------------------------------------------------------ checkpointing
    @property
    @override
    def state_key(self) -> str:
        s = next(iter(self.schedules.values()))
        return self._generate_state_key(stages=self.stages, every_n_steps=s.every_n_steps, start_step=s.start_step)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"schedules": {k: v.state_dict() for k, v in self.schedules.items()}}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for k, v in (state_dict.get("schedules") or {}).items():
            if k in self.schedules:
                self.schedules[k].load_state_dict(v)
        if "train" in self.schedules:
            self._replan(0)
