"""Why a step got slow: the step breakdown, the anomaly triggers and what grew (pure: numbers in, findings out).

The step monitor (``callbacks.monitor``) times every step in four parts (:class:`StepTimes`):

- **data wait**: from the previous batch's end to this batch's start on the host (the DataLoader's ``next``, and the
  loop's and other callbacks' hooks between two batches);
- **host**: this batch's start to its end on the host (forward, backward, optimizer: launching them on a GPU);
- **device busy**: on a GPU, the CUDA-event time between the batch's start and end on the stream (kernels and the
  launch gaps between them); on CPU the host is the device, so it equals the host time;
- **idle**: the rest of the step: the device's step (CUDA events from one batch end to the next; on CPU the host's)
  minus its busy time -- on a GPU the stream waited for the host, on CPU the data wait.

A step is **input-bound** when its data wait is at least :data:`INPUT_BOUND_SHARE` of the step (median over the log
interval); :func:`input_fixes` then names the DataLoader settings that would help, read from the loader itself.

Triggers (each asks for one diagnostic profile of the next step): :class:`SlowSteps` (``k`` x the rolling median
for ``m`` steps in a row), :class:`Spikes` (a loss above ``factor`` x its rolling median), and the NaN guard's
gradient-norm spikes. :func:`what_grew` compares the profiled step with the last healthy one and names what grew.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StepTimes", "summarize", "loader_settings", "input_fixes", "SlowSteps", "Spikes", "RateLimit", "Snapshot", "Finding",
           "what_grew", "alert_text", "witness", "INPUT_BOUND_SHARE", "SLOW_FACTOR", "SLOW_STEPS", "WINDOW",
           "MIN_STEPS", "MIN_VERDICT_STEPS", "VERDICT_WINDOW", "LOSS_SPIKE", "MIN_GAP_STEPS", "GREW_SHARE", "WITNESS_MARGIN", "CONTENTION_RISE", "CONTENTION_LOAD",
           "host_contention", "concentrated"]

#: data wait at or above this share of the step (median over the log interval) makes the step input-bound
INPUT_BOUND_SHARE = 0.10
#: fewest clean steps behind an input-bound verdict (the warning and its fixes): one slow first batch is no finding
MIN_VERDICT_STEPS = 8
#: the verdict is the median over at most this many recent clean steps (log intervals of one step add up)
VERDICT_WINDOW = 64
#: a step is slow above this many times the rolling median of the healthy steps before it ...
SLOW_FACTOR = 2.0
#: ... for this many steps in a row (one slow step is noise: a preemption, a checkpoint, a log flush)
SLOW_STEPS = 5
#: healthy steps the rolling medians keep
WINDOW = 100
#: healthy steps before any trigger (the median of fewer misleads)
MIN_STEPS = 20
#: the rolling medians are recomputed every this many healthy steps
REFRESH = 8
#: a loss above this many times the rolling median of the losses before it is a spike (positive medians only)
LOSS_SPIKE = 3.0
#: at most one triggered profile per this many steps (and ``max_alerts`` per fit, in the monitor)
MIN_GAP_STEPS = 100
#: a part of the step "grew" when it grew by at least this share of the whole step's growth
GREW_SHARE = 0.15
#: other processes' CPU load per CPU over the slow steps from which the host is contended (half of every CPU busy
#: with someone else's work), or its rise from the healthy steps
CONTENTION_LOAD = 0.5
CONTENTION_RISE = 0.25
#: the tensor pipes' active share and the FLOP-count MFU disagree above this many points (absolute, 0-1)
WITNESS_MARGIN = 0.20


@dataclass(slots=True)
class StepTimes:
    """One step's parts, in seconds (module doc). ``step_s`` is the device's step (CUDA events, batch end to batch
    end) on a GPU and the host's on CPU; ``dirty``: the step held non-training work (a profile, validation, an
    epoch boundary) and is no basis."""

    step: int
    data_wait_s: float
    host_s: float
    busy_s: float
    idle_s: float
    step_s: float
    dirty: bool = False


def summarize(steps: Sequence[StepTimes], share: float = INPUT_BOUND_SHARE) -> dict[str, float]:
    """The medians of clean ``steps`` as bare keys (``data_wait_ms``, ``host_ms``, ``device_busy_ms``, ``idle_ms``,
    ``step_ms``, ``data_wait_share``, ``input_bound`` 0/1, ``steps``); {} when none is clean."""
    clean = [s for s in steps if not s.dirty]
    if not clean:
        return {}
    med = lambda xs: statistics.median(xs)  # noqa: E731
    step = med([s.step_s for s in clean])
    wait = med([s.data_wait_s for s in clean])
    frac = med([s.data_wait_s / s.step_s for s in clean if s.step_s > 0] or [0.0])
    return {"data_wait_ms": wait * 1e3, "host_ms": med([s.host_s for s in clean]) * 1e3,
            "device_busy_ms": med([s.busy_s for s in clean]) * 1e3, "idle_ms": med([s.idle_s for s in clean]) * 1e3,
            "step_ms": step * 1e3, "data_wait_share": frac, "input_bound": float(frac >= share),
            "steps": float(len(clean))}


def loader_settings(trainer: Any) -> dict[str, Any]:
    """``num_workers``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor`` of a trainer's (first) training
    DataLoader (``trainer.train_dataloader``; a CombinedLoader, list or dict: its first loader); {} when there is
    none to read."""
    dl: Any = getattr(trainer, "train_dataloader", None)
    for _ in range(3):
        if dl is None or hasattr(dl, "num_workers"):
            break
        inner = getattr(dl, "flattened", None) or getattr(dl, "iterables", None) or dl
        if isinstance(inner, dict):
            inner = list(inner.values())
        dl = inner[0] if isinstance(inner, (list, tuple)) and inner else None
    if dl is None or not hasattr(dl, "num_workers"):
        return {}
    return {k: getattr(dl, k, None) for k in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")}


def input_fixes(loader: Mapping[str, Any], cuda: bool) -> list[str]:
    """What to change in an input-bound run's DataLoader, from its settings (``num_workers``, ``pin_memory``,
    ``persistent_workers``, ``prefetch_factor``; a missing key is not judged). Every missing setting is named; with
    all set, raising ``prefetch_factor`` / ``num_workers`` or a cheaper ``__getitem__`` is what is left."""
    out = []
    workers = loader.get("num_workers")
    if workers == 0:
        out.append("num_workers=0: the batches are loaded in the training process between steps; set num_workers "
                   "(e.g. 4-8 per GPU) so workers load them while the step runs")
    if cuda and loader.get("pin_memory") is False:
        out.append("pin_memory=False: host-to-GPU copies go through pageable memory; set pin_memory=True")
    if workers and loader.get("persistent_workers") is False:
        out.append("persistent_workers=False: the workers restart every epoch; set persistent_workers=True")
    if workers and not out:
        pf = loader.get("prefetch_factor")
        out.append(f"num_workers={workers}, prefetch_factor={pf}: the workers do not keep up; raise prefetch_factor "
                   "or num_workers, or make __getitem__ cheaper (decode or augment on the GPU, cache)")
    if not out:
        out.append("the loader's settings are not known; check num_workers, pin_memory, persistent_workers and "
                   "prefetch_factor")
    return out


class SlowSteps:
    """Step times against the rolling median of the healthy ones: :meth:`add` returns the trigger when ``m`` steps
    in a row took more than ``k`` x that median. Slow steps stay out of the median; a slowdown that lasts
    ``window // 2`` steps becomes the new normal (the median restarts from it)."""

    def __init__(self, k: float = SLOW_FACTOR, m: int = SLOW_STEPS, window: int = WINDOW,
                 min_steps: int = MIN_STEPS) -> None:
        self.k, self.m, self.min_steps = k, m, min_steps
        self.healthy: deque[float] = deque(maxlen=window)
        self.run: list[tuple[int, float]] = []  #: the current run of slow steps (step, seconds)
        self._med: float | None = None
        self._added = 0  #: healthy steps added since the median was computed

    def median(self) -> float | None:
        """The rolling median (recomputed every :data:`REFRESH` healthy steps: it moves slowly, and sorting the
        window at every step would be most of the monitor's per-step cost)."""
        if self._med is None or self._added >= REFRESH:
            self._added = 0
            self._med = statistics.median(self.healthy) if len(self.healthy) >= self.min_steps else None
        return self._med

    def add(self, step: int, seconds: float) -> dict[str, Any] | None:
        med = self.median()
        if med is None or seconds <= self.k * med:
            if self.run:
                self.run.clear()
            self.healthy.append(seconds)
            self._added += 1
            if med is None:
                self._med = None
            return None
        self.run.append((step, seconds))
        if len(self.run) >= max(self.healthy.maxlen // 2, self.m + 1):  # type: ignore[operator]
            self.healthy.clear()  # a lasting change: the new normal
            self.healthy.extend(s for _, s in self.run)
            self.run.clear()
            self._med = None
            return None
        if len(self.run) == self.m:
            slow = statistics.median(s for _, s in self.run)
            return {"kind": "slow-steps", "step": step, "first": self.run[0][0], "median_s": med, "slow_s": slow,
                    "ratio": slow / med}
        return None


class Spikes:
    """A value (the loss) above ``factor`` x the rolling median of the values before it (positive medians only)."""

    def __init__(self, factor: float = LOSS_SPIKE, window: int = WINDOW, min_steps: int = MIN_STEPS) -> None:
        self.factor, self.min_steps = factor, min_steps
        self.values: deque[float] = deque(maxlen=window)
        self._med: float | None = None
        self._added = 0

    def add(self, step: int, value: float) -> dict[str, Any] | None:
        if not math.isfinite(value):
            return None  # the NaN guard's business
        if len(self.values) >= self.min_steps and (self._med is None or self._added >= REFRESH):
            self._med, self._added = statistics.median(self.values), 0  # every REFRESH steps (see SlowSteps)
        med = self._med
        if med is not None and med > 0 and value > self.factor * med:
            return {"kind": "loss-spike", "step": step, "value": value, "median": med, "ratio": value / med}
        self.values.append(value)
        self._added += 1
        return None


class RateLimit:
    """At most one trigger per ``gap`` steps and ``most`` in all (None: no cap); ``suppressed`` counts the rest."""

    def __init__(self, gap: int = MIN_GAP_STEPS, most: int | None = 10) -> None:
        self.gap, self.most = gap, most
        self.last: int | None = None
        self.count = self.suppressed = 0

    def admit(self, step: int) -> bool:
        if (self.last is not None and step - self.last < self.gap) or (self.most is not None
                                                                       and self.count >= self.most):
            self.suppressed += 1
            return False
        self.last, self.count = step, self.count + 1
        return True


@dataclass
class Snapshot:
    """What one diagnostic profile saw: the breakdown (``summarize`` keys, ms), per-layer host time (seconds, self:
    without children), per-op time (seconds, summed by op name), telemetry (``devices.nvml`` keys), communication
    time (seconds) and the ranks' step times (seconds)."""

    step: int
    breakdown: dict[str, float] = field(default_factory=dict)
    layers: dict[str, float] = field(default_factory=dict)
    ops: dict[str, float] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)
    comm_s: float | None = None
    rank_step_s: list[float] = field(default_factory=list)
    load: float | None = None  #: other processes' CPU load per CPU over the steps (None: not known)


@dataclass(frozen=True)
class Finding:
    """One thing that grew: ``kind`` (``data wait``, ``host time``, ``GPU idle``, ``device busy``, ``layer``,
    ``op``, ``communication``, ``straggler``, ``clocks``, ``power``), its name, before and after (units in
    ``unit``) and the sentence for the alert."""

    kind: str
    name: str
    before: float | None
    after: float | None
    unit: str
    text: str


_PARTS = (("data_wait_ms", "data wait"), ("host_ms", "host time"), ("idle_ms", "GPU idle"),
          ("device_busy_ms", "device busy"))


def _grown(before: Mapping[str, float], after: Mapping[str, float], floor: float) -> list[tuple[str, float, float]]:
    rows = [(k, before.get(k, 0.0), v) for k, v in after.items() if v - before.get(k, 0.0) >= floor]
    return sorted(rows, key=lambda r: r[1] - r[2])


def what_grew(healthy: Snapshot, now: Snapshot, *, cuda: bool, top: int = 3) -> list[Finding]:
    """What grew from ``healthy`` to ``now``, largest first within each kind: the breakdown's parts that grew by at
    least :data:`GREW_SHARE` of the step's growth (on CPU ``GPU idle`` is not a part: it is the data wait), the
    ``top`` layers by host time and ops by time that grew by that much, communication, a straggler rank, and the
    SM clock (dropped over 10%, with the throttle reasons) and power."""
    out: list[Finding] = []
    hb, nb = healthy.breakdown, now.breakdown
    grew_ms = max(nb.get("step_ms", 0.0) - hb.get("step_ms", 0.0), 0.0)
    floor_ms = max(GREW_SHARE * grew_ms, 1e-3)
    for key, name in _PARTS:
        if (key == "idle_ms" or key == "device_busy_ms") and not cuda:
            continue
        a, b = hb.get(key), nb.get(key)
        if a is not None and b is not None and b - a >= floor_ms:
            out.append(Finding(name, name, a, b, "ms", f"{name} {a:.3g} -> {b:.3g} ms"))
    floor_s = floor_ms / 1e3
    for kind, before, after in (("layer", healthy.layers, now.layers), ("op", healthy.ops, now.ops)):
        for name, a, b in _grown(before, after, floor_s)[:top]:
            label = f"'{name or '<root>'}'" if kind == "layer" else name
            out.append(Finding(kind, name, a * 1e3, b * 1e3, "ms",
                               f"{kind} {label} {a * 1e3:.3g} -> {b * 1e3:.3g} ms"))
    if now.comm_s is not None and (now.comm_s - (healthy.comm_s or 0.0)) >= floor_s:
        a = (healthy.comm_s or 0.0) * 1e3
        out.append(Finding("communication", "collectives", a, now.comm_s * 1e3, "ms",
                           f"communication {a:.3g} -> {now.comm_s * 1e3:.3g} ms"))
    ranks = now.rank_step_s
    if len(ranks) > 1 and min(ranks) > 0 and max(ranks) / min(ranks) > 1.2:
        r = max(range(len(ranks)), key=ranks.__getitem__)
        out.append(Finding("straggler", f"rank {r}", min(ranks) * 1e3, ranks[r] * 1e3, "ms",
                           f"straggler rank {r}: {ranks[r] * 1e3:.3g} ms vs {min(ranks) * 1e3:.3g} ms on the fastest "
                           f"({ranks[r] / min(ranks):.3g}x)"))
    if host_contention(healthy.load, now.load):
        was = "" if healthy.load is None else f"{healthy.load:.2f} -> "
        out.append(Finding("host load", "other processes", healthy.load, now.load, "per CPU",
                           f"other processes' CPU load {was}{now.load:.2f} per CPU"))
    ht, nt = healthy.telemetry, now.telemetry
    a, b = ht.get("sm_clock_mhz"), nt.get("sm_clock_mhz")
    if a and b and b < 0.9 * a:
        why = ", ".join(nt.get("throttle_reasons") or []) or "no throttle reason reported"
        out.append(Finding("clocks", "SM clock", a, b, "MHz", f"SM clock {a:.0f} -> {b:.0f} MHz (throttled: {why})"))
    a, b = ht.get("power_w"), nt.get("power_w")
    limited = {"sw_power_cap", "hw_power_brake", "hw_slowdown", "sw_thermal", "hw_thermal"} & set(
        nt.get("throttle_reasons") or [])
    if a and b and limited:
        out.append(Finding("power", "power", a, b, "W", f"power {a:.0f} -> {b:.0f} W under {', '.join(sorted(limited))}"))
    return out


def host_contention(before: float | None, after: float | None) -> bool:
    """Whether other processes kept the CPUs busy over the slow steps: their load per CPU reached
    :data:`CONTENTION_LOAD`, or rose by :data:`CONTENTION_RISE` (``before``: over healthy steps)."""
    if after is None:
        return False
    return after >= CONTENTION_LOAD or (before is not None and after - before >= CONTENTION_RISE)


def concentrated(healthy: Snapshot, now: Snapshot) -> str | None:
    """The data wait, layer or op whose growth beyond a uniform slowdown of the whole step (its healthy time x
    the step's ratio) is at least half the step's growth, or None: the step got slower all over (host contention,
    lower clocks). A sleep in one layer or a slow loader is concentrated; a busy host is not."""
    a, b = healthy.breakdown.get("step_ms"), now.breakdown.get("step_ms")
    if not a or not b or b <= a:
        return None
    ratio, grew = b / a, b - a
    cands = [("data wait", healthy.breakdown.get("data_wait_ms", 0.0), now.breakdown.get("data_wait_ms", 0.0))]
    cands += [(f"layer '{k or '<root>'}'", healthy.layers.get(k, 0.0) * 1e3, v * 1e3) for k, v in now.layers.items()]
    cands += [(k, healthy.ops.get(k, 0.0) * 1e3, v * 1e3) for k, v in now.ops.items()]
    for name, x, y in cands:
        if y - ratio * x >= 0.5 * grew:
            return name
    return None


def alert_text(trigger: Mapping[str, Any], findings: Sequence[Finding], healthy_step: int | None) -> str:
    """The alert's sentence: the trigger, then what grew against the healthy profile (or that nothing did)."""
    kind = trigger.get("kind")
    if kind == "slow-steps":
        head = (f"steps {trigger['first']}-{trigger['step']} took {trigger['slow_s'] * 1e3:.3g} ms, "
                f"{trigger['ratio']:.3g}x the rolling median {trigger['median_s'] * 1e3:.3g} ms")
    elif kind == "loss-spike":
        head = f"loss spike at step {trigger['step']}: {trigger['value']:.4g}, {trigger['ratio']:.3g}x its median"
    elif kind == "grad-spike":
        head = (f"gradient-norm spike at step {trigger['step']}: {trigger.get('ratio', 0.0):.3g}x the median (NaN "
                "guard)")
    else:
        head = f"{kind} at step {trigger.get('step')}"
    base = f"against the healthy profile of step {healthy_step}" if healthy_step is not None else "(no healthy profile)"
    if not findings:
        return f"tscope step monitor: {head}. Profiled the next step {base}: nothing grew beyond the noise."
    return f"tscope step monitor: {head}. What grew {base}: " + "; ".join(f.text for f in findings) + "."


def witness(mfu: float | None, tensor_active: float | None, margin: float = WITNESS_MARGIN) -> str | None:
    """A flag when the FLOP-count MFU and the tensor pipes' active share (GPM, 0-1) disagree by more than
    ``margin``; None when they agree or one is missing. Tensor pipes active at full rate for a share ``u`` of the
    time give at most ``u`` of the peak, so MFU well above ``u`` means the FLOP count or the peak is off; ``u`` well
    above MFU means the tensor kernels run far below their peak rate (small tiles, low occupancy) or work is not
    counted."""
    if mfu is None or tensor_active is None:
        return None
    if mfu - tensor_active > margin:
        return (f"MFU {mfu:.1%} exceeds the tensor pipes' active share {tensor_active:.1%} by more than "
                f"{margin:.0%}: the FLOP count or the device peak is off")
    if tensor_active - mfu > margin:
        return (f"the tensor pipes were active {tensor_active:.1%} of the time but MFU is {mfu:.1%} (more than "
                f"{margin:.0%} apart): tensor kernels run far below their peak rate, or work is not counted")
    return None
