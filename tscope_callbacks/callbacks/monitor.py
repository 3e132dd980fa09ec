"""``StepMonitor``: where every step's time goes, in named parts measured where they happen; input-bound and
loop-overhead verdicts; late ranks with their cost; GPU power, clocks and energy; and a diagnosis when steps get
slow or the loss or gradient norm spikes. The parts are the probe's (``callbacks.loop_probe``), their maths in
``analysis.step_parts``, the triggers and what grew in ``analysis.anomaly``, the device's side in
``callbacks.clock.DeviceClock`` (CUDA events read once complete: no host sync), NVML in ``devices.nvml``, each
layer's host time in ``capture.module_clock``."""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from tscope_callbacks.analysis import anomaly as an
from tscope_callbacks.analysis import step_parts as sp
from tscope_callbacks.analysis.anomaly import loader_settings
from tscope_callbacks.analysis.fmt import figure_text, pct_text
from tscope_callbacks.analysis.step_parts import Breakdown, StepTimes
from tscope_callbacks.callbacks.base import ProfileContext, ProfilingCallback
from tscope_callbacks.callbacks.clock import DeviceClock
from tscope_callbacks.callbacks.context import batch_signature, batch_size
from tscope_callbacks.callbacks.loop_probe import LoopProbe, progress_bar_reads, read_segments
from tscope_callbacks.callbacks.options import check_int, check_number
from tscope_callbacks.callbacks.sinks import alert_or_log, metric_key
from tscope_callbacks.devices.calibrate import CpuSnapshot, cpu_snapshot, others_load_per_cpu
from tscope_callbacks.hostclock import host_time
from tscope_callbacks.records import ProfileReason, StepProfile

__all__ = ["StepMonitor", "MonitorOptions", "CONFIRM_STEPS", "LAYER_STEPS", "loader_settings"]

log = logging.getLogger("tscope_callbacks")

#: after a diagnosis, this many clean steps must still be slow (their median above the trigger's threshold) before
#: a slow-steps alert goes out; a slowdown that went away is counted in ``transients``
CONFIRM_STEPS = 3
#: clean steps before the monitor's own baseline profile (alone in a trainer): warm-up is over
BASELINE_STEPS = 20
#: other processes' CPU load is read at logging steps at most this often (seconds)
LOAD_EVERY_S = 1.0
#: steps whose layers' forward host times are timed after a diagnosis' profile (their median is compared)
LAYER_STEPS = 3


@dataclass(frozen=True, kw_only=True)
class MonitorOptions:
    """The step monitor's thresholds. Every field is keyword-only."""

    #: a slowdown is significant at this many times the spread of the healthy steps' n-step medians ...
    spread_k: float = an.SPREAD_K
    #: ... where n is this many recent steps (their median is compared with the healthy median) ...
    recent_steps: int = an.RECENT_STEPS
    #: ... and when it is at least this share of the healthy median (0.15: slowdowns of 15% or more)
    min_rise: float = an.MIN_RISE
    #: healthy steps behind the median and spread
    window: int = an.WINDOW
    #: healthy steps before any slow-steps trigger
    min_steps: int = an.MIN_STEPS
    #: clean steps after a diagnosis that must still be slow before a slow-steps alert
    confirm_steps: int = CONFIRM_STEPS
    #: loss spike factor (a loss above this many times its rolling median); None: off
    loss_spike: float | None = an.LOSS_SPIKE
    #: trigger on a ``NaNGuardCallback``'s gradient-norm spikes (same trainer, read-only)
    grad_spikes: bool = True
    #: fetch + transfer share of the step from which a run is input-bound
    input_bound_share: float = sp.INPUT_BOUND_SHARE
    #: the loop's own work (hooks, logging, checkpoints, Lightning's bookkeeping) share from which it is a finding
    loop_share: float = sp.LOOP_SHARE
    #: a late rank is a finding when the others wait for it this share of the step ...
    late_share: float = sp.LATE_SHARE
    #: ... and at least this many ms a step
    late_min_ms: float = sp.LATE_MIN_MS
    #: at most one diagnosis per this many steps ...
    min_gap_steps: int = an.MIN_GAP_STEPS
    #: ... and this many per fit (None: no cap)
    max_alerts: int | None = 10
    #: no capture (a profile, per-layer timing) before this step. In a trainer with a scheduled tscope callback
    #: (``RooflineCallback``, ``LayerProfilerCallback``) their earliest ``start_step`` applies and the monitor's
    #: baseline is their first profile; alone, the monitor takes its own baseline profile at this step or later
    start_step: int = 0
    #: also alert on a slowdown explained by other processes' load (default: logged at INFO, kept in ``contended``)
    alert_on_contention: bool = False

    def __post_init__(self) -> None:
        for name in ("spread_k", "min_rise", "input_bound_share", "loop_share", "late_share", "late_min_ms"):
            check_number("MonitorOptions", name, getattr(self, name), 0.0, strict=True)
        for name in ("input_bound_share", "loop_share", "late_share"):  # shares of a step: above 1 never fires
            if getattr(self, name) >= 1:
                raise ValueError(f"MonitorOptions.{name} is a share of the step: a number > 0 and < 1 (0.1 is 10%), "
                                 f"got {getattr(self, name)!r}")
        check_number("MonitorOptions", "loss_spike", self.loss_spike, 1.0, strict=True, none="off")
        for name in ("recent_steps", "window", "min_steps", "confirm_steps", "min_gap_steps", "max_alerts",
                     "start_step"):
            v = getattr(self, name)
            if name == "max_alerts" and v is None:
                continue
            check_int("MonitorOptions", name, v, 0 if name == "start_step" else 1)
        if self.recent_steps > self.window // 2:
            raise ValueError(f"MonitorOptions.recent_steps ({self.recent_steps}) must be at most half the window "
                             f"({self.window})")


class _HostLoad:
    """Other processes' CPU load per CPU (``devices.calibrate``: ``/proc/stat`` less this process)."""

    def snapshot(self) -> CpuSnapshot:
        return cpu_snapshot()

    def load(self, since: CpuSnapshot) -> float | None:
        return others_load_per_cpu(since)

    def load_between(self, a: CpuSnapshot, b: CpuSnapshot) -> float | None:
        return others_load_per_cpu(a, b)


class _Work:
    """Registered with the coordinator's clocks: ``mark_dirty()`` (a profile ended, a report was written, layers were
    timed) says the running logging interval holds tscope's own work."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False

    def mark_dirty(self) -> None:
        self.seen = True


@dataclass
class _Diagnosis:
    """One diagnosis under way: its trigger (None: the healthy baseline), the step it starts at, whether it may
    capture (a profile, per-layer timing: past ``start_step``), and what it collected."""

    why: dict[str, Any] | None
    at: int
    capture: bool
    snap: an.Snapshot
    slow: list[StepTimes] = field(default_factory=list)  #: the slow steps that triggered it
    started: bool = False
    profile_step: int | None = None
    layer_steps: list[tuple[int, dict[str, float]]] = field(default_factory=list)  #: (step, layer -> host s)
    confirm: list[StepTimes] = field(default_factory=list)
    load_since: CpuSnapshot | None = None
    note: str = ""


class _RankGather:
    """Every rank's step parts at logging steps (one all-gather, at a step every rank reaches): on CPU the rows
    come back at once (gloo waits for the ranks: that wait is counted as sync); on CUDA the gather runs on the
    stream and its rows are read at a later logging step once an event says it completed (no host sync)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.pending: deque[tuple[int, Any, Any]] = deque(maxlen=4)

    def exchange(self, trainer: pl.Trainer, vec: list[float], step: int) -> list[tuple[int, list[list[float]]]]:
        t = torch.tensor(vec, dtype=torch.float64, device=trainer.strategy.root_device)
        g = trainer.strategy.all_gather(t).reshape(trainer.world_size, len(vec))
        if not self.cuda:
            return [(step, g.tolist())]
        ev = torch.cuda.Event()
        ev.record()
        self.pending.append((step, g, ev))
        out = []
        while self.pending and self.pending[0][2].query():
            s, rows, _ = self.pending.popleft()
            out.append((s, rows.tolist()))
        return out


class StepMonitor(ProfilingCallback):
    """Always-on step monitor (on by default inside ``RooflineCallback``; usable alone).

    Every optimizer step is timed from the start of its first fetch to the start of the next step's, in named
    parts, each measured where it happens (``callbacks.loop_probe``: the same actions Lightning's ``SimpleProfiler``
    times): **fetch** (the DataLoader's ``next``), **transfer** (to the device), **forward**, **backward**,
    **optimizer**, **sync** (waiting for other ranks: DDP's all-reduce wait at the end of backward, Lightning's
    per-step SIGTERM broadcast), **hooks** (other callbacks', the module's), **logging**, **checkpoint**,
    **tscope** (tscope's own hooks: shown, never blamed on the run) and **other** (Lightning's bookkeeping); beside
    them the training thread's **wait for a CPU** (the kernel's run-queue wait: contention) and, on a GPU, the
    device's busy and idle time (CUDA events, read once complete: no host sync).

    Verdicts, over the last 64 clean steps and from 8 on, once per fit: **input-bound** when fetch + transfer are at
    least ``input_bound_share`` of the step (on a GPU the device idles that long too), naming the DataLoader
    setting to change; **loop overhead** when the loop's own work is at least ``loop_share`` of the step, naming its
    biggest items (a logger at every step, a checkpoint every N steps, a slow callback). On a GPU a host part costs
    the step only its **device time** (the device's time while the host ran it, from CUDA events around the parts:
    ``callbacks.loop_probe``): host time spent blocked in a device sync, or hidden behind the device's work, is no
    overhead; a value logged for the progress bar and read back every step is named as a **host-device sync** where
    the device then waited for the host (``analysis.step_parts.sync_text``). Where a CUDA profile of the step gives
    its kernel time, host work (the sync's wait, the loop's work) costs the step the step less the longer of the
    kernel time and the host's step without it (``step_parts.removal_saving``: the device's idle after it, in the
    next forward, counted); the verdict waits for the baseline profile when one is due. Under DDP every rank's parts
    are gathered at logging steps and the **late rank** is named with how much every other rank waits for it a step
    and the part it is slow in (its data, its compute, its host): scalars, an alert, and the dashboard's per-rank
    view (alerted once it holds two logging intervals in a row, once per rank and kind).

    A **slowdown** of the run's own step time (the step less its wait for a CPU) is found from the run's own
    spread (``analysis.anomaly.SlowSteps``: the median of the last 12 steps against the healthy median plus 4x
    the spread of 12-step medians, and at least 15%); a loss spike and a ``NaNGuardCallback``'s gradient-norm spike
    are triggers too. Each trigger starts one diagnosis: where a capture is allowed (from ``start_step``; once a
    baseline profile exists to compare with) a profile of the next step and each layer's forward host time over the
    3 steps after it; then 3 clean steps must confirm the slowdown. The alert names what grew against the healthy
    steps (parts, hooks, layers, ops, communication, the late rank, clocks, power); a slowdown spread over the
    whole step while other processes load the CPUs is contention, logged at INFO and kept in ``contended``.

    GPU telemetry (``telemetry=True``, needs the ``nvml`` extra, CUDA only; never a CUDA sync), sampled at logging
    steps: power, energy per step and per token, SM clock, throttle reasons, temperature, memory used and, on Hopper
    and later, the GPM tensor-pipe active share, flagged when it and a ``RooflineCallback``'s MFU are more than
    ``analysis.anomaly.WITNESS_MARGIN`` apart.

    Args:
        options: the thresholds (:class:`MonitorOptions`).
        profile: take diagnostic and baseline profiles (False: no ``ts.profile``; the layers' host times, the parts
            and telemetry still compare).
        telemetry: read NVML on CUDA devices.
        raise_errors: let tscope's own errors propagate (default: one log line per failing part).

    Keys (logging steps; to the run's loggers only): ``tscope/step/{step_ms, fetch_ms, transfer_ms, forward_ms,
    backward_ms, optimizer_ms, sync_ms, hooks_ms, logging_ms, checkpoint_ms, tscope_ms, other_ms, loop_ms,
    cpu_wait_ms, fetch_share, input_bound}`` (means over the interval's clean steps; on a GPU also
    ``device_busy_ms``, ``idle_ms``, ``loop_device_ms``, ``tscope_device_ms``, ``host_idle_ms`` and under DDP
    ``device_sync_ms``); under DDP ``tscope/ranks/step_ms/<rank>``,
    ``tscope/ranks/sync_ms/<rank>``, ``tscope/ranks/late_rank``, ``tscope/ranks/late_cost_ms``; with telemetry
    ``tscope/gpu/{power_w, energy_j_per_step, energy_j_per_token, sm_clock_mhz, throttled, temperature_c,
    memory_used_mb, tensor_active, mfu_witness_gap}``; alerts as text ``tscope/step/alerts``.

    Attributes: ``alerts`` (dicts: step, profile_step, trigger, findings (``anomaly.Finding``), text, breakdown and
    healthy (``Breakdown``)), ``transients``, ``contended``, ``last_breakdown`` (the last logged ``Breakdown``),
    ``input_fixes``, ``loop_finding``, ``progress_bar_reads`` (GPU), ``kernel`` (GPU: the step's
    ``step_parts.KernelTime`` from the latest CUDA profile of a training step; None: none), ``late`` (the last ``step_parts.LateRank``), ``rank_history``,
    ``telemetry_off``, ``healthy`` (the baseline ``anomaly.Snapshot``), ``captures`` (steps the monitor captured).
    """

    def __init__(self, options: MonitorOptions | None = None, *, profile: bool = True, telemetry: bool = True,
                 raise_errors: bool = False) -> None:
        super().__init__(every_n_steps=None, start_step=0, max_profiles=0, raise_errors=raise_errors)
        if options is not None and not isinstance(options, MonitorOptions):
            raise TypeError(f"options must be a tscope_callbacks.MonitorOptions, got {type(options).__name__}")
        for name, v in (("profile", profile), ("telemetry", telemetry)):
            if not isinstance(v, bool):
                raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
        self.options = options or MonitorOptions()
        self.profile, self.telemetry = profile, telemetry
        self.probe = LoopProbe()
        #: other processes' CPU load: ``snapshot()`` now, ``load(since)`` per CPU since then (tests script it)
        self.host_load: Any = _HostLoad()
        self._reset(False)

    def _reset(self, cuda: bool) -> None:
        o = self.options
        self.cuda = cuda
        self.probe.cuda = cuda
        self.device = DeviceClock() if cuda else None
        self.slow = an.SlowSteps(o.spread_k, o.recent_steps, o.min_rise, o.window, o.min_steps)
        self.losses = an.Spikes(o.loss_spike or 1.0, o.window, o.min_steps)
        self.limit = an.RateLimit(o.min_gap_steps, None)  #: diagnostic profiles: one per min_gap_steps
        self.suppressed = 0  #: alerts over ``max_alerts`` (logged at INFO, not sent)
        self.recent = sp.Rolling(o.window)  #: healthy clean steps
        self.interval: list[StepTimes] = []  #: steps since the last logging step
        self._verdict = sp.Rolling(sp.VERDICT_WINDOW)  #: recent clean steps (verdicts)
        self._latest = sp.Rolling(2 * o.recent_steps, named=False)  #: the latest clean steps (contention episodes)
        self._lag: deque[StepTimes] = deque()  #: clean steps on their way to ``recent`` (n steps behind)
        self._clean = 0  #: clean steps seen
        self._shares: dict[int, float] = {}  #: the recent steps' own shares (1 - CPU wait / step), dirty ones too
        self._host: dict[int, tuple[StepTimes, list]] = {}  #: CUDA: host steps waiting for their device figures
        self._dev: dict[int, tuple[float, float, float, bool]] = {}  #: ... and device figures waiting for them
        self.alerts: list[dict[str, Any]] = []
        self.contended: list[dict[str, Any]] = []
        self.transients = 0
        self.last_breakdown: Breakdown | None = None
        self.input_fixes: list[str] = []
        self.loop_finding: str | None = None
        #: GPU: the values Lightning reads back to the host every step (``self.log(..., prog_bar=True)``): a sync
        self.progress_bar_reads: tuple[str, ...] = ()
        #: GPU: the step's CUDA kernel time from the latest profile of a training step (its own baseline or
        #: diagnosis, or a scheduled tscope callback's): the basis of the sync and loop findings' cost; None: none yet
        self.kernel: sp.KernelTime | None = None
        self.late: sp.LateRank | None = None
        self.rank_history: list[tuple[int, sp.LateRank]] = []
        self.healthy: an.Snapshot | None = None
        self.captures: list[int] = []  #: steps the monitor captured (profiles and layer timing)
        self.telemetry_off = "" if cuda else "not a CUDA device"
        self._gs = -1
        self._diag: _Diagnosis | None = None
        self._diag_step: int | None = None  #: the step of the running diagnostic profile
        self._modclock: Any = None
        self._scheduled: list[ProfilingCallback] = []  #: the trainer's scheduled tscope callbacks
        self._capture_from = self.options.start_step
        self._base_ops: tuple[int, dict[str, float]] | None = None  #: a scheduled profile's step and ops
        self._load_snap: CpuSnapshot | None = None
        self._load_start: CpuSnapshot | None = None
        self._load_healthy: float | None = None
        self._losses_pending: deque[tuple[int, Any, Any]] = deque(maxlen=64)
        self._tel: Any = None
        self._work = _Work()
        self.tel_last: dict[str, Any] = {}
        self._guard, self._guard_seen = None, 0
        self._loader: dict[str, Any] = {}
        self._input_told = self._witness_told = self._loop_told = False
        self._late_told: set[tuple[int, str]] = set()
        self._late_prev: tuple[int, str] | None = None  #: the last interval's late rank and kind (a finding)
        self._episode_checked = -(10**9)
        self._contended_since: int | None = None  #: the first step of a slow stretch found to be contention
        self._wait_episode: int | None = None  #: the step a contention episode began (None: none running)
        self._gather = _RankGather(cuda)

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if str(getattr(stage, "value", stage)) != "fit":
            return  # validate/test/predict: the fit's alerts and breakdown stay
        dev = trainer.strategy.root_device
        self._reset(dev.type == "cuda")
        coord = self.coordinator(trainer)
        coord.register_clock(self._work)  # told when a step holds tscope's own work
        coord.register_clock(self.probe)
        try:
            self.probe.install(trainer)
        except Exception as e:
            self.probe.remove()
            self.faults.report("installing the step-parts probe", e)
        if self.cuda and self.telemetry:
            from tscope_callbacks.devices.nvml import open_telemetry

            self._tel, self.telemetry_off = open_telemetry(dev.index or 0)
            if self._tel is None and trainer.is_global_zero:
                log.info("tscope StepMonitor: %s", self.telemetry_off)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._loader = loader_settings(trainer)
        self._load_start = self.host_load.snapshot()  # other processes' load from here (until a healthy one)
        self._guard = self.coordinator(trainer).guard  # the trainer's NaN guard (registered at its fit start)
        self.probe.refresh_callbacks(trainer)  # callbacks added during setup (this monitor, by RooflineCallback)
        self._scheduled = [c for c in trainer.callbacks if isinstance(c, ProfilingCallback) and c is not self
                           and "train" in c.schedules and c.schedules["train"].max_profiles != 0]
        if self._scheduled:
            self._capture_from = max(self.options.start_step,
                                     min(c.schedules["train"].start_step for c in self._scheduled))

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.probe.mark_dirty()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.probe.mark_dirty()

    # ------------------------------------------------------------------ every step
    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        gs = trainer.global_step
        if gs == self._gs:
            return  # a later micro-batch of the same optimizer step
        self._gs = gs
        self.probe.batch_start(gs)
        if self.device is not None:
            self.device.begin(gs)
        self._tick(trainer, pl_module, gs, batch)

    def _tick(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None, gs: int, batch: Any) -> None:
        """A step starts: take the steps closed since, then start, go on with or finish a diagnosis."""
        self._collect(trainer)
        d = self._diag
        if d is not None and not d.started and gs >= d.at:
            self._begin_diagnosis(trainer, pl_module, d, gs, batch)
        elif d is not None and d.started and d.capture and len(d.layer_steps) < LAYER_STEPS \
                and gs > (d.profile_step if d.profile_step is not None else d.at - 1) and self.coordinator(trainer).running is None:
            from tscope_callbacks.capture.module_clock import ModuleClock

            self._modclock = ModuleClock(pl_module)  # each layer's forward host time over the steps after it
            self.captures.append(gs)
            self._modclock.start()
        elif d is None and self.healthy is None:
            self._maybe_baseline(trainer, pl_module, gs, batch)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        s = self.coordinator(trainer).running
        if s is not None and s.stage == "train" and self.last_breakdown is not None and s.profile is not None:
            v = self._verdict.summary(self.options.input_bound_share)
            loop = []
            if v is not None and self._loop_told:
                loop = (sp.sync_findings(v, self.progress_bar_reads, self.options.loop_share, self.kernel)
                        or sp.loop_findings(v, self.options.loop_share, kernel=self.kernel))
            s.profile.label(step_breakdown={**self.last_breakdown.to_dict(), "input_fixes": list(self.input_fixes),
                                            "input_bound_share": self.options.input_bound_share,
                                            "loop_findings": loop,
                                            "basis": "CUDA events" if self.cuda else "host wall clock"})
        super().on_before_optimizer_step(trainer, pl_module, optimizer)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        gs = trainer.global_step
        if gs == self._gs and pl_module.automatic_optimization:
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # accumulating
        try:
            self._step_end(trainer, pl_module, outputs, batch, batch_idx, gs)
        finally:  # every rank reaches the logging step's gather, whatever failed before it
            if gs % max(trainer.log_every_n_steps, 1) == 0:
                self._log(trainer, gs, batch)

    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
                  gs: int) -> None:
        self.probe.end_of_step()
        if self.device is not None:
            self.device.end()
        d = self._diag
        if self._modclock is not None:
            layers = self._modclock.stop()
            self._modclock = None
            if d is not None:
                d.layer_steps.append((self._gs, layers))
            # its forward hooks slowed this step: no basis for any clock. Said at the step's end, before the next
            # step's, whatever the order of the callbacks' batch-start hooks
            self.coordinator(trainer).dirty_clocks()
        if self.options.loss_spike is not None:
            self._loss(trainer, outputs)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # finishes a running capture
        self._maybe_done(trainer)
        if self.options.grad_spikes and self._guard is not None and len(self._guard.spikes) > self._guard_seen:
            spike = self._guard.spikes[-1]
            self._guard_seen = len(self._guard.spikes)
            self._trigger(gs, {"kind": "grad-spike", **spike})  # (at a batch end gs is the next step's number)

    # ------------------------------------------------------------------ the parts
    def _collect(self, trainer: pl.Trainer) -> None:
        """The steps the probe closed (and, on a GPU, whose device figures are in), oldest first."""
        if self.device is None:
            for st, _, _ in self.probe.take():
                self._add(trainer, st)
            return
        for st, tail, segs in self.probe.take():
            self._host[st.step] = (st, tail, segs)
        for step, busy, span, idle, first in self.device.ready():
            self._dev[step] = (busy, span, idle, first)
        for step in sorted(self._host):
            if step not in self._dev:
                if len(self._host) > 64:  # device figures that never came (a step the device clock missed)
                    self._host.pop(step)
                continue
            st, tail, segs = self._host[step]
            if tail and not all(e1.query() for _, e1 in tail):
                break
            parts = read_segments(segs) if segs else None
            if segs and parts is None:
                break  # the device has not passed the step's last segment yet
            self._host.pop(step)
            if segs:
                self.probe.release(segs)
            busy, span, idle, first = self._dev.pop(step)
            dsync = sum(e0.elapsed_time(e1) / 1e3 for e0, e1 in tail) if tail else None
            self._add(trainer, dataclasses.replace(st, step_s=span, busy_s=busy, idle_s=idle, device_sync_s=dsync,
                                                   dirty=st.dirty or first,
                                                   dev_parts=parts[0] if parts else None,
                                                   dev_named=parts[1] if parts else None))
        for step in [s for s in self._dev if s < min(self._host, default=self._gs)]:
            self._dev.pop(step)  # a step the probe left out (it never ended its batches)

    def _add(self, trainer: pl.Trainer, st: StepTimes) -> None:
        self._shares[st.step] = st.own_share  # (the layer-timing steps are dirty: their own share is read here)
        if len(self._shares) > 64:
            del self._shares[next(iter(self._shares))]
        self.interval.append(st)
        if len(self.interval) > 4 * self.options.window:  # logging steps far apart: the latest steps are the interval
            del self.interval[:-self.options.window]
        if st.dirty:
            return
        self._verdict.add(st)
        self._latest.add(st)
        d = self._diag
        if d is not None:  # the steps after a trigger: its confirmation
            if d.started and st.step > (d.profile_step if d.profile_step is not None else d.at - 1):
                d.confirm.append(st)
                self._maybe_done(trainer)
            elif not d.started and d.why is not None and d.why.get("kind") == "slow-steps":
                d.slow.append(st)
            return
        trig = self.slow.add(st.step, st.own_s)
        if self._contended_since is not None and not self.slow.run and self.slow.recent_slow() is False:
            self._contended_since = None  # the contended stretch ended
        if trig is not None:  # the slow stretch: the steps from its first one, not healthy
            slow = [s for s in self._lag if s.step >= trig["first"]] + [st]
            self._lag.clear()
            self._trigger(st.step + 1, trig, slow)
        elif not self.slow.run:
            # a step is healthy once the steps after it showed no slowdown: the start of one stays out
            self._lag.append(st)
            if len(self._lag) > self.options.recent_steps:
                self.recent.add(self._lag.popleft())
        self._clean += 1

    def _loss(self, trainer: pl.Trainer, outputs: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        if loss.device.type == "cuda":  # read when the GPU has passed it
            ev = torch.cuda.Event()
            host = loss.detach().to("cpu", non_blocking=True)
            ev.record()
            self._losses_pending.append((self._gs, host, ev))
            while self._losses_pending and self._losses_pending[0][2].query():
                step, h, _ = self._losses_pending.popleft()
                self._loss_value(step, float(h))
        else:
            self._loss_value(self._gs, float(loss))

    def _loss_value(self, step: int, value: float) -> None:
        spike = self.losses.add(step, value)
        if spike is not None:
            self._trigger(step + 1, spike)

    # ------------------------------------------------------------------ triggers and diagnosis
    def _may_capture(self, step: int) -> bool:
        return step >= self._capture_from

    def _maybe_baseline(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None, gs: int, batch: Any) -> None:
        """The healthy baseline: alone, the monitor's own profile once the step time is known and ``start_step``
        is reached; with a scheduled tscope callback, that callback's first profile (joined) then the layers' times
        once its series is over."""
        if self._scheduled:
            if self._base_ops is None or self.coordinator(trainer).running is not None:
                return
            if gs < max(c.held_until() for c in self._scheduled):
                return  # its series and the unprofiled steps it times after it
            if min(c.schedules["train"].next_due(gs) for c in self._scheduled) <= gs + LAYER_STEPS:
                return  # a profile is due before the layers' steps end: later (they would slow its basis)
            step, ops = self._base_ops
            self._diag = _Diagnosis(None, gs, True, an.Snapshot(step, ops=dict(ops)), started=True, profile_step=gs - 1,
                                    load_since=self.host_load.snapshot())
        elif self._clean >= BASELINE_STEPS and self._may_capture(gs):
            self._diag = _Diagnosis(None, gs, True, an.Snapshot(gs))
            self._begin_diagnosis(trainer, pl_module, self._diag, gs, batch)

    def _trigger(self, at: int, why: dict[str, Any], slow: list[StepTimes] | None = None) -> None:
        if self._diag is not None:
            if self._diag.why is not None or self._diag.started:
                return  # one diagnosis at a time
            self._diag = None  # a baseline not started yet waits
        if not self._may_capture(at):
            capture, note = False, f"no profile: before start_step {self._capture_from}"
        elif self.healthy is None:
            capture, note = False, "no profile: no baseline profile yet to compare with"
        elif not self.limit.admit(at):  # profiles are rate-limited; the diagnosis still runs on the parts
            capture, note = False, f"no profile: the last one was under {self.options.min_gap_steps} steps ago"
        else:
            capture, note = True, ""
        self._diag = _Diagnosis(dict(why), at, capture, an.Snapshot(at), slow=list(slow or []), note=note)

    def _begin_diagnosis(self, trainer: pl.Trainer, pl_module: pl.LightningModule, d: _Diagnosis, gs: int,
                         batch: Any) -> None:
        """Profile this step where allowed; then the layers are timed over the next steps, then the confirmation."""
        d.started = True
        d.snap = an.Snapshot(gs, telemetry=dict(self.tel_last))
        d.load_since = self.host_load.snapshot()
        self.probe.mark_dirty()
        if d.capture and self.profile:
            d.profile_step = self._diag_step = gs
            self.captures.append(gs)
            self._start(trainer, pl_module, "train", gs, batch, reason=ProfileReason.ANOMALY if d.why else ProfileReason.BASELINE)
        elif d.capture:
            d.profile_step = gs - 1  # no profile: the layers are timed from this step

    @override
    def _wants(self, stage: str, step: int) -> bool:
        if stage != "train":
            return False
        if self._diag_step == step:
            return True
        return bool(self._scheduled) and self._base_ops is None and self.healthy is None and self._may_capture(step)

    @override
    def _on_profile(self, trainer: pl.Trainer, pl_module: pl.LightningModule, result: StepProfile,
                    ctx: ProfileContext) -> None:
        if ctx.stage != "train":
            return
        if self.cuda:
            self.kernel = sp.kernel_time(result.ops, result.info.timing, ctx.step) or self.kernel
        ops: dict[str, float] = {}
        comm = 0.0
        for r in result.ops:
            if r.time_s:
                ops[r.op] = ops.get(r.op, 0.0) + r.time_s
                if r.comm:
                    comm += r.time_s
        d = self._diag
        rep = result.info.replay
        if d is not None and ctx.step == self._diag_step:
            self._diag_step = None
            d.snap.ops, d.snap.comm_s = ops, comm or None
            d.snap.rank_step_s = list(ctx.step_times_s)
            if rep is not None and rep.get("status") != "matched":  # a replay (CUDA) whose kernels changed
                miss = (f"no op times: the profiled step ran other kernels than the full capture of step "
                        f"{rep.get('source_step')}, {rep.get('kernels_matched')} of its {rep.get('kernels_planned')} "
                        f"matched in {rep.get('kernels_run')} run; the next diagnosis profiles in full")
                d.note = f"{d.note}; {miss}" if d.note else miss
        elif self._scheduled and self._base_ops is None:
            self._base_ops = (ctx.step, ops)  # the first scheduled profile: the baseline's ops

    def _maybe_done(self, trainer: pl.Trainer) -> None:
        d = self._diag
        if d is None or not d.started:
            return
        if d.capture and len(d.layer_steps) < LAYER_STEPS:
            return
        if d.why is not None and len(d.confirm) < self.options.confirm_steps:
            return
        self._diag, self._diag_step = None, None
        snap = d.snap
        if d.layer_steps:
            snap.layers = self._layer_times(d.layer_steps)
        snap.load = self.host_load.load(d.load_since) if d.load_since is not None else None
        snap.late_rank = self.late
        why = d.why
        if why is None:  # the healthy baseline
            snap.breakdown, snap.load = self.recent.summary(), self._load_healthy
            self.healthy = snap
            return
        steps = d.confirm
        if why["kind"] == "slow-steps":
            now = statistics.median(s.own_s for s in d.confirm)
            if now <= why["threshold_s"]:
                self.transients += 1  # the slowdown went away
                self.slow.forget_run()
                self.recent.extend(d.slow)  # (the stretch was healthy after all)
                log.debug("tscope StepMonitor: the slowdown of steps %s-%s went away", why["first"], why["step"])
                return
            steps = d.slow + d.confirm
        snap.breakdown = sp.summarize(steps)
        self._alert(trainer, why, snap, d, steps)

    def _layer_times(self, layer_steps: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
        """Each layer's forward time over the timed steps, on the run's own time: each step's layer times times that
        step's own share (1 - its wait for a CPU / its time: a busy machine inflates every layer alike), then the
        least over the steps (a preemption only inflates, and lands whole in whatever ran: to grow in the least of
        3 steps, a layer must be slower in every one of them)."""
        shares = list(self._shares.values())
        fallback = statistics.median(shares) if shares else 1.0  # (a step whose times are not in yet)
        scaled = [{k: v * self._shares.get(step, fallback) for k, v in layers.items()} for step, layers in layer_steps]
        names = {k for x in scaled for k in x}
        return {k: min(x.get(k, 0.0) for x in scaled) for k in names}

    def _alert(self, trainer: pl.Trainer, why: dict[str, Any], snap: an.Snapshot, d: _Diagnosis,
               steps: list[StepTimes]) -> None:
        base = self.healthy or an.Snapshot(-1)
        load = self._load_healthy
        if load is None and self._load_start is not None and d.load_since is not None:
            load = self.host_load.load_between(self._load_start, d.load_since)  # from the fit's start to the slowdown
        healthy = dataclasses.replace(base, breakdown=self.recent.summary(medians=True), load=load)
        findings = an.what_grew(healthy, snap, cuda=self.cuda)
        text = an.alert_text(why, findings, self.healthy.step if self.healthy is not None else None, d.note,
                             uniform=an.whole_step(healthy, snap, findings))
        entry = {"step": self._gs, "profile_step": d.profile_step if d.profile_step is not None and self.profile
                 and d.capture else None, "trigger": dict(why), "findings": findings, "text": text,
                 "breakdown": snap.breakdown, "healthy": healthy.breakdown}
        if why["kind"] == "slow-steps":
            if an.contention(healthy, snap, findings):
                entry["text"] = text = an.contention_text(why, findings, healthy, snap)
                if not self.options.alert_on_contention:
                    # the machine's load, not the run: the healthy steps stay the basis. A stretch that stays slow
                    # is diagnosed again after n fresh steps (its cause may change: a slowdown of the run inside
                    # the contention is alerted then); one that lasts half the window is the new normal
                    first = self._contended_since is None
                    if first:
                        self._contended_since = why["first"]
                        self.contended.append(entry)
                        log.info("%s", text)
                    if self._gs - (self._contended_since or 0) >= self.options.window // 2:
                        self.slow.rebase([s.own_s for s in steps])
                        self._contended_since = None
                        log.info("tscope StepMonitor: the contention since step %s lasted %d steps: its step time "
                                 "is the new normal", why["first"], self.options.window // 2)
                    else:
                        self.slow.restart_run()
                    return
            self._contended_since = None
            self.slow.rebase([s.own_s for s in steps])  # alerted: the new normal (no second alert for it)
            self.recent.clear()
            self.recent.extend(steps)
            self._lag.clear()
        if self.options.max_alerts is not None and len(self.alerts) >= self.options.max_alerts:
            self.suppressed += 1
            log.info("%s (Not sent: max_alerts=%d reached.)", text, self.options.max_alerts)
            return
        self.alerts.append(entry)
        title = {"slow-steps": "Slow steps", "loss-spike": "Loss spike", "grad-spike": "Gradient spike"}.get(
            why["kind"], why["kind"])
        self.sinks(trainer).alert(metric_key("step", "alerts"), f"{title} at step {why.get('step')}", text, self._gs)

    # ------------------------------------------------------------------ logging steps
    def _log(self, trainer: pl.Trainer, gs: int, batch: Any) -> None:
        scalars: dict[str, float] = {}
        b: Breakdown | None = None
        try:
            b = self._interval(trainer, gs, scalars)
        except Exception as e:
            self.faults.report("summarizing the step parts", e)
        if trainer.world_size > 1:
            self._ranks(trainer, gs, b, scalars)
        try:
            if self._tel is not None:
                tel = self._telemetry(trainer, gs, batch)
                if self._work.seen:  # the interval held tscope's own work (a profile, its report, timed layers): its
                    # energy per step and per token are not the training's (an H200 fit read 2x at those intervals)
                    for k in ("energy_j_per_step", "energy_j_per_token"):
                        tel.pop(metric_key("gpu", k), None)
                scalars.update(tel)
            self._work.seen = False
            if scalars and trainer.loggers:  # always-on series go to the run's loggers only (no files of their own)
                self.sinks(trainer).log_scalars(scalars, gs - 1)  # the last step of the interval (its index, as Lightning logs)
        except Exception as e:
            self.faults.report("logging the step parts", e)

    def _interval(self, trainer: pl.Trainer, gs: int, scalars: dict[str, float]) -> Breakdown | None:
        steps, self.interval = self.interval, []
        now = host_time()
        if self._load_snap is None or now - self._load_snap.wall >= LOAD_EVERY_S:  # (reading /proc/stat costs)
            if self._diag is None and not self.slow.run and self._load_snap is not None:  # a healthy stretch's load
                load = self.host_load.load(self._load_snap)
                self._load_healthy = load if load is not None else self._load_healthy
            self._load_snap = self.host_load.snapshot()
        if self.cuda:  # (a few attribute reads: the values logged this step)
            self.progress_bar_reads = progress_bar_reads(trainer) or self.progress_bar_reads
        b = sp.summarize(steps, self.options.input_bound_share)
        if b is None:
            return None
        self.last_breakdown = b
        scalars.update({metric_key("step", k): v for k, v in b.scalars().items()})
        if gs - self._episode_checked >= self.options.recent_steps:
            self._episode_checked = gs
            self._contention_episode(gs)
        if len(self._verdict) < sp.MIN_VERDICT_STEPS or (self._input_told and self._loop_told):
            return b
        v = self._verdict.summary(self.options.input_bound_share)
        if v is None:
            return b
        if v.input_bound and not self._input_told:
            self._input_told = True
            self.input_fixes = an.input_fixes(self._loader, self.cuda, v.parts_ms.get("fetch"))
            if trainer.is_global_zero:
                text = (f"tscope StepMonitor: input-bound: fetching the batch takes {pct_text(v.fetch_share)} of the "
                        f"step ({figure_text(v.fetch_ms, 'ms')} of {figure_text(v.host_ms, 'ms')}, mean of {v.steps} "
                        f"steps; threshold {pct_text(self.options.input_bound_share)}). "
                        f"{'; '.join(self.input_fixes)}.")
                self._verdict_alert(trainer, f"Input-bound at step {gs}", text, gs)
        if self._loop_told or self._kernel_due(gs):
            return b
        # on a GPU only what the device lost counts (step_parts): a sync that left the device waiting is named as
        # such (the logged value read back every step), else the loop's own work; with the step's kernel time, by
        # the step less the longer of it and the host's step without the work, else by the parts' device times
        kind, text = "host-device sync", sp.sync_text(v, self.progress_bar_reads, self.options.loop_share, self.kernel)
        if text is None:
            kind, text = "loop overhead", sp.loop_text(v, self.options.loop_share, kernel=self.kernel)
        if text is not None:
            self._loop_told, self.loop_finding = True, text
            if trainer.is_global_zero:
                self._verdict_alert(trainer, f"{kind[0].upper()}{kind[1:]} at step {gs}",
                                    f"tscope StepMonitor: {kind}: {text}.", gs)
        return b

    def _verdict_alert(self, trainer: pl.Trainer, title: str, text: str, gs: int) -> None:
        """A verdict on the run (input-bound, loop overhead, a host-device sync), said once: a warning, and where the
        run's alerts go (TensorBoard's text, ``alerts.jsonl``: the page lists it beside the slowdowns; it was a log
        line only, so a run whose profile came before the verdict showed it nowhere). Not one of ``alerts`` (the
        slowdowns diagnosed) nor counted against ``max_alerts``."""
        alert_or_log(self.sinks(trainer), metric_key("step", "alerts"), title, text, gs)

    def _kernel_due(self, gs: int) -> bool:
        """GPU: the loop and sync verdicts wait for the step's kernel time while a profile of the step is coming
        (the baseline, the monitor's own or a scheduled callback's first, within a verdict window of steps); with
        none coming they use the parts' device times."""
        return (self.cuda and self.kernel is None and self.healthy is None and (self.profile or bool(self._scheduled))
                and self._capture_from <= gs + sp.VERDICT_WINDOW)

    def _contention_episode(self, gs: int) -> None:
        """Rising contention named as such: the latest steps' wait for a CPU grew by at least ``min_rise`` of the
        healthy step (kept in ``contended``, said at INFO, once per episode and at most once per ``min_gap_steps``
        steps; the slow-steps trigger reads the step less this wait, so it never fires on it)."""
        if len(self._latest) < self._latest.n:
            return
        h, b = self.recent.summary(), self._latest.summary()
        if h is None or b is None or h.cpu_wait_ms is None or b.cpu_wait_ms is None:
            return
        rise = b.cpu_wait_ms - h.cpu_wait_ms
        if rise < 0.5 * self.options.min_rise * h.step_ms:
            if self._wait_episode is not None and gs - self._wait_episode >= self.options.min_gap_steps:
                self._wait_episode = None  # over: the next one is a new episode
            return
        if rise < self.options.min_rise * h.step_ms or self._wait_episode is not None:
            return
        self._wait_episode = gs
        text = (f"tscope StepMonitor: contention at step {gs}: the last {b.steps} steps took "
                f"{figure_text(b.step_ms, 'ms')} against {figure_text(h.step_ms, 'ms')}, and the training thread waited "
                f"{figure_text(b.cpu_wait_ms, 'ms')} a step for a CPU ({figure_text(h.cpu_wait_ms, 'ms')} before): "
                f"other processes' work, not the run's")
        self.contended.append({"step": gs, "trigger": {"kind": "cpu-wait"}, "findings": [], "text": text,
                               "breakdown": b, "healthy": h})
        log.info("%s.", text)

    def _ranks(self, trainer: pl.Trainer, gs: int, b: Breakdown | None, scalars: dict[str, float]) -> None:
        """Every rank's parts of the interval (one all-gather at this logging step, every rank), the late rank."""
        try:
            vec = sp.rank_vector(b)
        except Exception as e:
            vec = [math.nan] * len(sp.RANK_FIELDS)
            self.faults.report("the rank vector", e)
        t = host_time()
        try:
            got = self._gather.exchange(trainer, vec, gs)
        except Exception as e:
            self.faults.report("gathering the ranks' step parts", e)
            return
        finally:
            if not self.cuda:  # gloo waited here for the other ranks: their lateness, not tscope's cost
                self.probe.account("sync", "tscope's gather of the ranks' parts", host_time() - t)
        for step, rows in got:
            late = sp.late_rank(rows, self.options.late_share, self.options.late_min_ms)
            if late is None:
                continue
            self.late = late
            self.rank_history.append((step, late))
            for r, (st, sy) in enumerate(zip(late.step_ms, late.sync_ms)):
                scalars[f"tscope/ranks/step_ms/{r}"] = st
                scalars[f"tscope/ranks/sync_ms/{r}"] = sy
            scalars["tscope/ranks/late_rank"] = float(late.rank)
            scalars["tscope/ranks/late_cost_ms"] = late.cost_ms
            key = (late.rank, late.kind) if late.finding else None
            seen_before, self._late_prev = self._late_prev == key, key
            # alerted once it held two logging intervals in a row (one noisy interval, the warm-up's, is no
            # finding), once per rank and kind (a rank late in its data, later in its compute: two findings)
            if key is not None and seen_before and key not in self._late_told:
                self._late_told.add(key)
                text = f"tscope step monitor: {late.text} (logging step {step})."
                entry = {"step": gs, "profile_step": None, "trigger": {"kind": "late-rank", "step": step},
                         "findings": [an.Finding("late rank", f"rank {late.rank}", None, late.cost_ms, "ms",
                                                 late.text)], "text": text, "breakdown": b, "healthy": None}
                self.alerts.append(entry)
                self.sinks(trainer).alert(metric_key("step", "alerts"), f"Late rank {late.rank}", text, gs)

    def _telemetry(self, trainer: pl.Trainer, gs: int, batch: Any) -> dict[str, float]:
        _, tokens = batch_size(batch_signature(batch))
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

    # ------------------------------------------------------------------ cleanup
    def _cleanup(self) -> None:
        """Remove everything the monitor installed (never raises)."""
        mc, self._modclock = self._modclock, None
        if mc is not None:
            try:
                mc.stop()
            except Exception:
                pass
        self.probe.remove()
        self._diag_step = None

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._cleanup()
        super().on_exception(trainer, pl_module, exception)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._cleanup()
        if self._tel is not None:
            self._tel.close()
            self._tel = None
        super().teardown(trainer, pl_module, stage)
