"""``StepMonitor``: where every step's time goes (data wait, host, device busy, idle), GPU power, clocks and energy,
and a diagnostic profile when a step gets slow or the loss or gradient norm spikes. The maths is in
``analysis.anomaly``, the timing in ``callbacks.clock.BreakdownClock`` (CUDA events read once complete: no host
sync), NVML in ``devices.nvml``, each layer's host time in ``capture.module_clock``."""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections import deque
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from tscope_callbacks.analysis import anomaly as an
from tscope_callbacks.analysis.anomaly import loader_settings
from tscope_callbacks.callbacks import session
from tscope_callbacks.callbacks.base import ProfileContext, ProfilingCallback
from tscope_callbacks.callbacks.clock import BreakdownClock
from tscope_callbacks.callbacks.sinks import metric_key
from tscope_callbacks.devices.calibrate import cpu_snapshot, others_load_per_cpu
from tscope_callbacks.records import StepProfile

__all__ = ["StepMonitor", "CONFIRM_STEPS", "loader_settings"]

log = logging.getLogger("tscope_callbacks")

#: after a slow-step trigger's profile, this many clean steps must still be slow (median above ``slow_factor`` x
#: the healthy median) before the alert goes out; a slowdown that went away is counted in ``transients``
CONFIRM_STEPS = 3


class _Work:
    """Registered with the session's clocks: ``mark_dirty()`` (a profile ended, a report was written, layers were
    timed) says the running logging interval holds tscope's own work."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False

    def mark_dirty(self) -> None:
        self.seen = True


class StepMonitor(ProfilingCallback):
    """Always-on step monitor (on by default inside ``RooflineCallback``; usable alone).

    Every optimizer step is timed in four parts without a host sync (``callbacks.clock.BreakdownClock``): **data
    wait** (previous batch end to this batch start on the host: the DataLoader), **host** time (batch start to end),
    **device busy** (CUDA events around the step; on CPU the host time: the host is the device) and **idle** (the
    device's step minus its busy time; on CPU the data wait). A step is **input-bound** when its data wait is at
    least ``input_bound_share`` of the step; the monitor then says which DataLoader setting to change
    (``num_workers``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor``: read from the trainer's loader),
    once per fit, and labels profiled steps with it (``meta["step_breakdown"]``: the report's time split).

    Triggers, each profiling the next step once (``ts.profile`` plus each layer's forward host time), rate-limited
    to one per ``min_gap_steps`` and ``max_alerts`` per fit: ``slow_steps`` steps in a row slower than
    ``slow_factor`` x the rolling median of the healthy steps (confirmed by :data:`CONFIRM_STEPS` more slow steps
    after the profile); a loss above ``loss_spike`` x its rolling median; a gradient-norm spike found by a
    ``NaNGuardCallback`` in the same trainer (read-only). The profile is compared with the healthy baseline profile
    the monitor takes once ``min_steps`` healthy steps are known, and an alert names what grew (data wait, host
    time, GPU idle, layers, ops, communication, a straggler rank, SM clock and power): a log line on logger
    ``tscope_callbacks``, a TensorBoard/file text entry and, with a W&B logger, ``wandb.alert``.

    GPU telemetry (``telemetry=True``, needs the ``nvml`` extra, CUDA only; never a CUDA sync), sampled at logging
    steps: power, energy per step and per token from the total-energy counter, SM clock, throttle reasons,
    temperature, memory used and, on Hopper and later, the GPM tensor-pipe active share, flagged when it and the
    FLOP-count MFU (a ``RooflineCallback``'s) are more than ``analysis.anomaly.WITNESS_MARGIN`` apart.

    Args:
        slow_factor, slow_steps: a step is slow above ``slow_factor`` x the rolling median (default 2.0) for
            ``slow_steps`` steps in a row (default 5).
        window, min_steps: healthy steps behind the rolling medians (100), and before any trigger (20).
        loss_spike: loss spike factor (3.0); None: off.
        grad_spikes: trigger on the NaN guard's gradient-norm spikes.
        input_bound_share: data-wait share of the step from which a step is input-bound (0.10).
        min_gap_steps, max_alerts: rate limit of triggered profiles (100 steps apart, 10 per fit; None: no cap).
        profile: take the diagnostic profiles (False: no ``ts.profile``; the layers' host times, the breakdown and
            telemetry still compare).
        telemetry: read NVML on CUDA devices.
        alert_on_contention: also alert when the whole step slowed (nothing concentrated in the data wait, a layer
            or an op) while other processes kept the CPUs busy (``anomaly.host_contention``; default: such a
            slowdown is logged at INFO and kept in ``contended``, not alerted).
        raise_errors: let tscope's own errors propagate (default: one log line per failing part).

    Keys (logging steps; with a logger only, as the NaN guard's norms): ``tscope/step/{data_wait_ms, host_ms,
    device_busy_ms, idle_ms, step_ms, data_wait_share, input_bound}`` (medians over the interval's clean steps);
    with telemetry ``tscope/gpu/{power_w, energy_j_per_step, energy_j_per_token, sm_clock_mhz, throttled,
    temperature_c, memory_used_mb, tensor_active, mfu_witness_gap}``; alerts as text ``tscope/step/alerts``.

    Attributes: ``alerts`` (dicts: step (when it went out), profile_step, trigger, findings (``anomaly.Finding``),
    text, breakdown and healthy (``summarize`` keys)), ``transients`` (slow runs that went away before
    the alert), ``contended`` (slowdowns explained by other processes' load), ``last_breakdown`` (the last logged medians), ``input_fixes``, ``telemetry_off`` (why no telemetry),
    ``healthy`` (the baseline ``anomaly.Snapshot``).
    """

    def __init__(self, *, slow_factor: float = an.SLOW_FACTOR, slow_steps: int = an.SLOW_STEPS,
                 window: int = an.WINDOW, min_steps: int = an.MIN_STEPS, loss_spike: float | None = an.LOSS_SPIKE,
                 grad_spikes: bool = True, input_bound_share: float = an.INPUT_BOUND_SHARE,
                 min_gap_steps: int = an.MIN_GAP_STEPS, max_alerts: int | None = 10, profile: bool = True,
                 telemetry: bool = True, alert_on_contention: bool = False, raise_errors: bool = False) -> None:
        super().__init__(every_n_steps=None, start_step=0, max_profiles=0, raise_errors=raise_errors)
        for name, v, lo in (("slow_factor", slow_factor, 1.0), ("input_bound_share", input_bound_share, 0.0),
                            ("loss_spike", 2.0 if loss_spike is None else loss_spike, 1.0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > lo:
                raise ValueError(f"{name} must be a number > {lo:g}{' (or None: off)' * (name == 'loss_spike')}, "
                                 f"got {v!r}")
        for name, v in (("slow_steps", slow_steps), ("window", window), ("min_steps", min_steps),
                        ("min_gap_steps", min_gap_steps), ("max_alerts", 1 if max_alerts is None else max_alerts)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.slow_factor, self.slow_steps, self.window, self.min_steps = float(slow_factor), slow_steps, window, min_steps
        self.loss_spike, self.grad_spikes, self.input_bound_share = loss_spike, grad_spikes, float(input_bound_share)
        self.min_gap_steps, self.max_alerts, self.profile, self.telemetry = min_gap_steps, max_alerts, profile, telemetry
        self.alert_on_contention = alert_on_contention
        self._reset(False)

    def _reset(self, cuda: bool) -> None:
        self.cuda = cuda
        self.clock = BreakdownClock(cuda)
        self.slow = an.SlowSteps(self.slow_factor, self.slow_steps, self.window, self.min_steps)
        self.losses = an.Spikes(self.loss_spike or 1.0, self.window, self.min_steps)
        self.limit = an.RateLimit(self.min_gap_steps, self.max_alerts)
        self.recent: deque[an.StepTimes] = deque(maxlen=self.window)  #: healthy clean steps
        self.interval: list[an.StepTimes] = []  #: steps since the last logging step
        self._verdict: deque[an.StepTimes] = deque(maxlen=an.VERDICT_WINDOW)  #: recent clean steps (input-bound)
        self.alerts: list[dict[str, Any]] = []
        self.contended: list[dict[str, Any]] = []
        self.transients = 0
        self.last_breakdown: dict[str, float] = {}
        self.input_fixes: list[str] = []
        self.healthy: an.Snapshot | None = None
        self.telemetry_off = "" if cuda else "not a CUDA device"
        self._gs = -1
        self._profile_at: int | None = None  #: the step the next diagnostic profile is due at
        self._diag_step: int | None = None  #: the step of the running diagnostic profile
        self._why: dict[str, Any] | None = None  #: its trigger (None: the healthy baseline)
        self._modclock: Any = None
        self._snap: an.Snapshot | None = None  #: the diagnosis under way (its profile's step)
        self._confirm: list[an.StepTimes] = []  #: the clean steps after it
        self._layer_steps: list[dict[str, float]] = []  #: each layer's forward host time in those steps
        self._slow_run, self._slow_trigger_run = [], []  # (StepTimes) the running slow run; the trigger's
        self._load_since = self._load_snap = None  #: CPU counters (others' load over the diagnosis, the interval)
        self._load_healthy: float | None = None
        self._losses_pending: deque[tuple[int, Any, Any]] = deque(maxlen=64)
        self._tel: Any = None
        self._work = _Work()  #: whether the logging interval held tscope's own work (profiles, reports)
        self.tel_last: dict[str, Any] = {}
        self._guard, self._guard_seen = None, 0  #: a NaN guard in the trainer, and its spikes seen
        self._loader: dict[str, Any] = {}
        self._input_told = self._witness_told = False

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if str(getattr(stage, "value", stage)) != "fit":
            return  # validate/test/predict: the fit's alerts and breakdown stay
        dev = trainer.strategy.root_device
        self._reset(dev.type == "cuda")
        session.register_clock(trainer, self._work)  # told when a step holds tscope's own work
        if self.cuda and self.telemetry:
            from tscope_callbacks.devices.nvml import open_telemetry

            self._tel, self.telemetry_off = open_telemetry(dev.index or 0)
            if self._tel is None and trainer.is_global_zero:
                log.info("tscope StepMonitor: %s", self.telemetry_off)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._loader = loader_settings(trainer)
        self._guard = next((c for c in trainer.callbacks if type(c).__name__ == "NaNGuardCallback"), None)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.mark_dirty()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.mark_dirty()

    # ------------------------------------------------------------------ every step
    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        gs = trainer.global_step
        if gs == self._gs:
            return  # a later micro-batch of the same optimizer step
        self._gs = gs
        self.clock.begin(gs)
        if self.cuda:
            for st in self.clock.ready():
                self._add(trainer, st)
            self._read_losses(trainer)
        if self._profile_at is not None and gs >= self._profile_at:
            self._profile_at = None
            self._diagnose(trainer, pl_module, gs, batch)
        elif self._snap is not None and len(self._layer_steps) < CONFIRM_STEPS and gs > self._snap.step:
            from tscope_callbacks.capture.module_clock import ModuleClock

            self._modclock = ModuleClock(pl_module)  # each layer's forward host time over the steps after it
            self._modclock.start()

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        s = session.running()
        if s is not None and s.stage == "train":
            self.clock.mark_dirty()  # a profiled step is no basis
            if self.last_breakdown and s.profile is not None:
                s.profile.label(step_breakdown={**self.last_breakdown, "input_fixes": list(self.input_fixes),
                                                "input_bound_share": self.input_bound_share,
                                                "basis": "CUDA events" if self.cuda else "host wall clock"})
        super().on_before_optimizer_step(trainer, pl_module, optimizer)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        gs = trainer.global_step  # (a property walk: read once)
        if gs == self._gs and pl_module.automatic_optimization:
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # accumulating
        st = self.clock.end()
        if self._modclock is not None:
            self._layer_steps.append(self._modclock.stop())
            self._modclock = None
            # its forward hooks slowed this step: no step-time basis nor MFU window (RooflineCallback's clocks). Said
            # at the step's end, before the next step's tick, whatever the order of the callbacks' batch-start hooks
            session.dirty_clocks(trainer)
        if st is not None:
            self._add(trainer, st)
        if self.loss_spike is not None:
            self._loss(trainer, outputs)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # finishes a running capture
        self._maybe_done(trainer)
        if gs % max(trainer.log_every_n_steps, 1) == 0:
            self._log(trainer, gs, batch)
        if self.grad_spikes and self._guard is not None and len(self._guard.spikes) > self._guard_seen:
            spike = self._guard.spikes[-1]
            self._guard_seen = len(self._guard.spikes)
            self._trigger(gs, {"kind": "grad-spike", **spike})

    # ------------------------------------------------------------------ the parts
    def _add(self, trainer: pl.Trainer, st: an.StepTimes) -> None:
        self.interval.append(st)
        if len(self.interval) > 4 * self.window:  # logging steps far apart: the latest steps are the interval
            del self.interval[:-self.window]
        if st.dirty:
            return
        if self._snap is not None:  # the steps after a diagnostic profile: its confirmation
            if st.step > self._snap.step:
                self._confirm.append(st)
                self._maybe_done(trainer)
            return
        trig = self.slow.add(st.step, st.step_s)
        if self.slow.run:
            self._slow_run.append(st)
        else:
            self._slow_run.clear()
            self.recent.append(st)
        if trig is not None:
            self._trigger(st.step + 1, trig)
        elif self.healthy is None and self._profile_at is None and self.slow.median() is not None:
            self._why, self._profile_at = None, st.step + 1  # the healthy baseline profile

    def _loss(self, trainer: pl.Trainer, outputs: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        if loss.device.type == "cuda":  # read when the GPU has passed it
            ev = torch.cuda.Event()
            host = loss.detach().to("cpu", non_blocking=True)
            ev.record()
            self._losses_pending.append((self._gs, host, ev))
        else:
            self._loss_value(self._gs, float(loss))

    def _read_losses(self, trainer: pl.Trainer) -> None:
        while self._losses_pending and self._losses_pending[0][2].query():
            step, host, _ = self._losses_pending.popleft()
            self._loss_value(step, float(host))

    def _loss_value(self, step: int, value: float) -> None:
        spike = self.losses.add(step, value)
        if spike is not None:
            self._trigger(step + 1, spike)

    # ------------------------------------------------------------------ triggers and diagnosis
    def _trigger(self, at: int, why: dict[str, Any]) -> None:
        if self._snap is not None or self._profile_at is not None:
            return  # one diagnosis at a time
        if not self.limit.admit(at):
            return
        self._why, self._profile_at = why, at
        self._slow_trigger_run = list(self._slow_run) if why["kind"] == "slow-steps" else []

    def _diagnose(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int, batch: Any) -> None:
        """Profile this step (ops), then time each layer's forward over the CONFIRM_STEPS steps after it."""
        self._snap = an.Snapshot(step, telemetry=dict(self.tel_last))
        self._layer_steps, self._confirm = [], []
        self._load_since = cpu_snapshot()
        self.clock.mark_dirty()
        if self.profile:
            self._diag_step = step
            self._start(trainer, pl_module, "train", step, batch, reason="anomaly" if self._why else "baseline")

    @override
    def _wants(self, stage: str, step: int) -> bool:
        return stage == "train" and ((self._profile_at is not None and step >= self._profile_at)
                                     or self._diag_step == step)

    @override
    def _on_profile(self, trainer: pl.Trainer, pl_module: pl.LightningModule, result: StepProfile,
                    ctx: ProfileContext) -> None:
        if ctx.stage != "train" or ctx.step != self._diag_step or self._snap is None:
            return
        self._diag_step = None
        comm = 0.0
        for r in result.ops:
            if r.time_s:
                self._snap.ops[r.op] = self._snap.ops.get(r.op, 0.0) + r.time_s
                if r.comm:
                    comm += r.time_s
        self._snap.comm_s = comm or None
        self._snap.rank_step_s = list(ctx.step_times_s)

    def _maybe_done(self, trainer: pl.Trainer) -> None:
        snap = self._snap
        if snap is None or len(self._layer_steps) < CONFIRM_STEPS or len(self._confirm) < CONFIRM_STEPS:
            return
        self._snap, self._diag_step = None, None
        names = {k for d in self._layer_steps for k in d}
        snap.layers = {k: statistics.median(d.get(k, 0.0) for d in self._layer_steps) for k in names}
        snap.load = others_load_per_cpu(self._load_since)
        steps, why, self._why = self._confirm, self._why, None
        if why is None:  # the healthy baseline
            snap.breakdown, snap.load = an.summarize(self.recent), self._load_healthy
            self.healthy = snap
            return
        med = self.slow.median()
        if why["kind"] == "slow-steps":
            now = an.summarize(steps)
            if med is None or now.get("step_ms", 0.0) / 1e3 <= self.slow_factor * med:
                self.transients += 1  # the slowdown went away
                log.debug("tscope StepMonitor: the slowdown of steps %s-%s went away", why["first"], why["step"])
                return
            steps = self._slow_trigger_run + steps
        snap.breakdown = an.summarize(steps)
        self._alert(trainer, why, snap)

    def _alert(self, trainer: pl.Trainer, why: dict[str, Any], snap: an.Snapshot) -> None:
        # the breakdown and CPU load of the healthy steps just before; layers, ops and telemetry of the baseline
        healthy = dataclasses.replace(self.healthy or an.Snapshot(-1), breakdown=an.summarize(self.recent),
                                      load=self._load_healthy)
        findings = an.what_grew(healthy, snap, cuda=self.cuda)
        text = an.alert_text(why, findings, self.healthy.step if self.healthy is not None else None)
        entry = {"step": self._gs, "profile_step": snap.step, "trigger": dict(why), "findings": findings,
                 "text": text, "breakdown": dict(snap.breakdown), "healthy": dict(healthy.breakdown)}
        if (why["kind"] == "slow-steps" and not self.alert_on_contention and an.host_contention(healthy.load, snap.load)
                and an.concentrated(healthy, snap) is None):
            self.contended.append(entry)  # the whole step slowed with other processes' load: not the run's doing
            log.info("%s Not alerted: the step slowed all over while other processes loaded the CPUs.", text)
            return
        self.alerts.append(entry)
        title = {"slow-steps": "Slow steps", "loss-spike": "Loss spike", "grad-spike": "Gradient spike"}.get(
            why["kind"], why["kind"])
        self.sinks(trainer).alert(metric_key("step", "alerts"), f"{title} at step {why.get('step')}", text,
                                  self._gs)

    # ------------------------------------------------------------------ logging steps
    def _log(self, trainer: pl.Trainer, gs: int, batch: Any) -> None:
        steps, self.interval = self.interval, []
        if self._snap is None and self._profile_at is None and not self.slow.run:  # a healthy interval's CPU load
            load = others_load_per_cpu(self._load_snap) if self._load_snap is not None else None
            self._load_healthy = load if load is not None else self._load_healthy
        self._load_snap = cpu_snapshot()
        out = an.summarize(steps, self.input_bound_share)
        self._verdict.extend(s for s in steps if not s.dirty)
        scalars: dict[str, float] = {}
        if out:
            # the verdict needs evidence: the median over the recent clean steps, from MIN_VERDICT_STEPS of them
            verdict = (an.summarize(list(self._verdict), self.input_bound_share)
                       if len(self._verdict) >= an.MIN_VERDICT_STEPS else {})
            out["input_bound"] = verdict.get("input_bound", 0.0)
            self.last_breakdown = out
            scalars.update({metric_key("step", k): v for k, v in out.items() if k != "steps"})
            if out["input_bound"] and not self._input_told:
                out = {**out, "data_wait_share": verdict["data_wait_share"], "steps": verdict["steps"]}
                self._input_told = True
                self.input_fixes = an.input_fixes(self._loader, self.cuda)
                if trainer.is_global_zero:
                    log.warning("tscope StepMonitor: input-bound: the data wait is %.0f%% of the step (median over "
                                "%d steps, threshold %.0f%%). %s.", out["data_wait_share"] * 100, out["steps"],
                                self.input_bound_share * 100, "; ".join(self.input_fixes))
        if self._tel is not None:
            tel = self._telemetry(trainer, gs, batch)
            if self._work.seen:  # the interval held tscope's own work (a profile, its report, timed layers): its
                # energy per step and per token are not the training's (an H200 fit read 2x at those intervals)
                for k in ("energy_j_per_step", "energy_j_per_token"):
                    tel.pop(metric_key("gpu", k), None)
            scalars.update(tel)
        self._work.seen = False
        if scalars and trainer.loggers:  # always-on series go to the run's loggers only (no files of their own)
            self.sinks(trainer).log_scalars(scalars, gs)

    def _telemetry(self, trainer: pl.Trainer, gs: int, batch: Any) -> dict[str, float]:
        _, tokens = session.batch_size(session.batch_signature(batch))
        tel = self.tel_last = self._tel.window(gs, tokens * max(trainer.accumulate_grad_batches, 1))
        out = {metric_key("gpu", k): float(v) for k, v in tel.items() if isinstance(v, (int, float))}
        mfu = next((c.last_mfu for c in trainer.callbacks if getattr(c, "last_mfu", None) is not None), None)
        if mfu is not None and "tensor_active" in tel:
            out[metric_key("gpu", "mfu_witness_gap")] = tel["tensor_active"] - mfu
            flag = an.witness(mfu, tel["tensor_active"])
            if flag and not self._witness_told and trainer.is_global_zero:
                self._witness_told = True
                log.warning("tscope StepMonitor: %s (GPM tensor-pipe share vs FLOP-count MFU, step %d).", flag, gs)
        return out

    @override
    def _explain_silence(self, trainer: pl.Trainer, fn: str) -> None:
        """Nothing to explain: the monitor has no profile schedule (its profiles are triggered)."""

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._modclock is not None:
            self._modclock.stop()
            self._modclock = None
        if self._tel is not None:
            self._tel.close()
        super().teardown(trainer, pl_module, stage)
