"""Why a step got slow: the anomaly triggers and what grew (pure: numbers in, findings out).

The step monitor (``callbacks.monitor``) times every step in named parts (``analysis.step_parts``: fetch, transfer,
forward, backward, optimizer, sync, hooks, logging, checkpoint, tscope, other) and the training thread's wait for a
CPU. Triggers (each asks for one diagnosis: a profile of the next step where one may be taken, each layer's forward
host time over the steps after it, then a few clean steps to confirm):

- :class:`SlowSteps`: a sustained slowdown of the run's own step time (the step less its wait for a CPU): the median
  of the last ``n`` steps above the healthy median by at least ``min_rise`` of it and by ``k`` x the spread of
  ``n``-step medians among the healthy steps (the run's own noise, bursts included);
- :class:`Spikes`: a loss above ``factor`` x its rolling median; and the NaN guard's gradient-norm spikes.

:func:`what_grew` compares the slow steps with the healthy ones (parts, hooks, layers, ops, communication, ranks,
clocks) and names what grew; :func:`contention` says when the whole step slowed with other processes' load (the
machine, not the run).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tscope_callbacks.analysis.fmt import figure_text, pct_text, sig, time_text
from tscope_callbacks.analysis.step_parts import (
    INPUT_BOUND_SHARE,
    MIN_VERDICT_STEPS,
    PART_TEXT,
    PARTS,
    VERDICT_WINDOW,
    Breakdown,
    StepTimes,
    summarize,
)

__all__ = ["StepTimes", "Breakdown", "summarize", "loader_settings", "input_fixes", "SlowSteps", "Spikes", "RateLimit",
           "Snapshot", "Finding", "what_grew", "alert_text", "witness", "INPUT_BOUND_SHARE", "SPREAD_K", "RECENT_STEPS",
           "MIN_RISE", "WINDOW", "MIN_STEPS", "MIN_VERDICT_STEPS", "VERDICT_WINDOW", "LOSS_SPIKE", "MIN_GAP_STEPS",
           "GREW_SHARE", "NOISE_SHARE", "WORKERS_PAY_MS", "WITNESS_MARGIN", "CONTENTION_RISE", "CONTENTION_LOAD", "CONTENTION_WAIT_SHARE", "host_contention", "concentrated",
           "contention", "contention_text", "CAUSES", "REFRESH", "whole_step"]

#: a slowdown is significant above this many times the spread of the healthy steps' n-step medians ...
SPREAD_K = 4.0
#: ... where n is this many recent steps (their median is what is compared) ...
RECENT_STEPS = 12
#: ... and when it is at least this share of the healthy median (smaller changes are not reported: on a shared machine
#: the run's own time drifts by 10% for dozens of steps)
MIN_RISE = 0.15
#: healthy steps the rolling median and spread keep
WINDOW = 100
#: healthy steps before any trigger (the median of fewer misleads)
MIN_STEPS = 30
#: the healthy median and spread are recomputed every this many healthy steps
REFRESH = 8
#: a loss above this many times the rolling median of the losses before it is a spike (positive medians only)
LOSS_SPIKE = 3.0
#: at most one triggered diagnosis per this many steps (and ``max_alerts`` per fit, in the monitor)
MIN_GAP_STEPS = 100
#: a part of the step "grew" when it grew by at least this share of the whole step's growth
GREW_SHARE = 0.15
#: ... and by at least this share of the healthy step (smaller changes are the steps' own noise)
NOISE_SHARE = 0.05
#: other processes' CPU load per CPU over the slow steps from which the host is contended (half of every CPU busy
#: with someone else's work), or its rise from the healthy steps
CONTENTION_LOAD = 0.5
CONTENTION_RISE = 0.25
#: ... or the training thread waited for a CPU at least this share of the slow steps
CONTENTION_WAIT_SHARE = 0.10
#: the tensor pipes' active share and the FLOP-count MFU disagree above this many points (absolute, 0-1)
WITNESS_MARGIN = 0.20


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


#: a batch fetched in less than this (ms) costs less in the training process than through DataLoader workers: each
#: batch they make crosses processes (pickled, through shared memory and a queue). An in-memory 32x64 batch here:
#: 188 us a batch in the process, 1.7 ms through 2 workers, 36 us indexed whole by a dataset's ``__getitems__``
WORKERS_PAY_MS = 1.0


def input_fixes(loader: Mapping[str, Any], cuda: bool, fetch_ms: float | None = None) -> list[str]:
    """What to change in an input-bound run's DataLoader, from its settings (``num_workers``, ``pin_memory``,
    ``persistent_workers``, ``prefetch_factor``; a missing key is not judged) and ``fetch_ms``, the fetch a batch.
    Every missing setting is named; with all set, raising ``prefetch_factor`` / ``num_workers`` or a cheaper
    ``__getitem__`` is what is left. A batch fetched in under :data:`WORKERS_PAY_MS` gets no workers (they would cost
    more): building it in one indexing instead of one sample at a time is what pays."""
    out = []
    workers = loader.get("num_workers")
    if workers == 0 and fetch_ms is not None and fetch_ms < WORKERS_PAY_MS:
        out.append(f"num_workers=0 and {figure_text(fetch_ms, 'ms')} a batch: workers would cost more than that (each "
                   "batch they make crosses processes); build the batch in one indexing instead of one sample at a "
                   "time: a dataset __getitems__(indices) returning the whole batch (the DataLoader calls it with "
                   "each batch's indices), or batches sampled outright (a BatchSampler as the sampler, "
                   "batch_size=None)")
    elif workers == 0:
        per = "(e.g. 4-8 per GPU)" if cuda else "(a few, leaving the training process its cores)"
        out.append(f"num_workers=0: the batches are loaded in the training process between steps; set num_workers "
                   f"{per} so workers load them while the step runs")
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
    """A sustained slowdown (module doc): :meth:`add` each clean step's own time; it returns the trigger when the
    median of the last ``n`` steps first crosses the threshold (:meth:`baseline`). A step joins the healthy window
    ``n`` steps later, once no slowdown was found in them: the steps of a slow stretch stay out of it; a stretch that lasts ``window // 2`` steps becomes the new normal, and so does one the
    monitor confirmed (:meth:`rebase`)."""

    def __init__(self, k: float = SPREAD_K, n: int = RECENT_STEPS, min_rise: float = MIN_RISE, window: int = WINDOW,
                 min_steps: int = MIN_STEPS) -> None:
        self.k, self.n, self.min_rise, self.min_steps = k, n, min_rise, max(min_steps, n)
        self.healthy: deque[float] = deque(maxlen=window)
        self.recent: deque[tuple[int, float]] = deque(maxlen=n)
        self._lag: deque[float] = deque()  #: the latest steps on their way to ``healthy``
        self.run: list[tuple[int, float]] = []  #: the steps of the running slow stretch (step, seconds)
        self._base: tuple[float, float, float] | None = None  #: (median, spread of n-medians, threshold)
        self._added = 0  #: healthy steps added since the baseline was computed

    def baseline(self) -> tuple[float, float, float] | None:
        """(healthy median, spread of its ``n``-step medians, threshold) in seconds; None before ``min_steps``
        healthy steps. Recomputed every :data:`REFRESH` healthy steps (sorting the window at every step would be
        most of the monitor's per-step cost). Spread: 1.4826 x the median absolute deviation of the medians of
        ``n`` consecutive healthy steps (every ``n // 3``-th start): the noise of the very figure compared,
        bursts and their autocorrelation included. Threshold: the median plus the larger of ``min_rise`` of it
        and ``k`` x the spread."""
        if self._base is None or self._added >= REFRESH:
            self._added = 0
            h = list(self.healthy)
            if len(h) < self.min_steps:
                self._base = None
                return None
            med = statistics.median(h)
            stride = max(1, self.n // 3)
            meds = [statistics.median(h[i:i + self.n]) for i in range(0, len(h) - self.n + 1, stride)]
            mm = statistics.median(meds)
            spread = 1.4826 * statistics.median(abs(m - mm) for m in meds)
            self._base = (med, spread, med + max(self.min_rise * med, self.k * spread))
        return self._base

    def median(self) -> float | None:
        b = self.baseline()
        return None if b is None else b[0]

    def recent_slow(self) -> bool | None:
        """Whether the recent steps' median is over the threshold (a slow stretch is on, triggered or not); None
        before ``n`` recent steps or a threshold."""
        b = self._base
        if b is None or len(self.recent) < self.n:
            return None
        return statistics.median(s for _, s in self.recent) > b[2]

    def add(self, step: int, seconds: float) -> dict[str, Any] | None:
        b = self.baseline()
        self.recent.append((step, seconds))
        if b is not None and len(self.recent) == self.n:
            med, _, thr = b
            now = statistics.median(s for _, s in self.recent)
            if now > thr:
                self.run.append((step, seconds))
                if len(self.run) >= max((self.healthy.maxlen or 0) // 2, self.n + 1):
                    self.rebase()  # a lasting change nobody confirmed (no diagnosis allowed): the new normal
                    return None
                if len(self.run) == 1:
                    self._lag.clear()  # the slow stretch: never healthy
                    mid = med + (now - med) / 2
                    first = next((st for st, s in self.recent if s > mid), step)
                    # the slow steps' own median (from the first slow one): the window's median crossed the
                    # threshold with healthy steps still in it ("took 8.85 ms" of steps that took 12)
                    slow = statistics.median(s for st, s in self.recent if st >= first)
                    return {"kind": "slow-steps", "step": step, "first": first, "median_s": med, "slow_s": slow,
                            "ratio": slow / med, "threshold_s": thr, "window_s": now}
                return None
        if self.run:
            self.run.clear()
        # a step is healthy once the n steps after it showed no slowdown: the start of a slowdown stays out
        self._lag.append(seconds)
        if len(self._lag) > self.n:
            self.healthy.append(self._lag.popleft())
            self._added += 1
            if b is None:
                self._base = None
        return None

    def rebase(self, steps: Sequence[float] = ()) -> None:
        """A confirmed slowdown is the new normal: the healthy window restarts from ``steps`` (default: the slow
        stretch's); the threshold comes back once it holds ``min_steps`` again."""
        self.healthy.clear()
        self.healthy.extend(steps or [s for _, s in self.run] or [s for _, s in self.recent])
        self.run.clear()
        self._lag.clear()
        self._base = None

    def restart_run(self) -> None:
        """The running slow stretch was explained (contention): a new trigger needs ``n`` fresh steps still over the
        threshold (its cause may have changed); its steps never join the healthy window."""
        self.run.clear()
        self.recent.clear()
        self._lag.clear()

    def forget_run(self) -> None:
        """The slow stretch went away (a diagnosis found it transient): its steps were healthy after all; the recent
        steps start over."""
        self.run.clear()
        self.healthy.extend(s for _, s in self.recent)
        self.recent.clear()


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
    """What a stretch of steps showed: the parts' breakdown (``step_parts.Breakdown``; None: no clean step),
    per-layer forward host time (seconds, self: without children; {} without layer timing), per-op time (seconds,
    summed by op name; {} without a profile), telemetry (``devices.nvml`` keys), communication time (seconds), the
    ranks' step times (seconds), the late rank (``step_parts.LateRank`` text and cost, when one was found) and other
    processes' CPU load per CPU (None: not known)."""

    step: int
    breakdown: Breakdown | None = None
    layers: dict[str, float] = field(default_factory=dict)
    ops: dict[str, float] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)
    comm_s: float | None = None
    rank_step_s: list[float] = field(default_factory=list)
    late_rank: Any = None
    load: float | None = None


@dataclass(frozen=True)
class Finding:
    """One thing that grew: ``kind`` (``part``, ``hook``, ``cpu wait``, ``GPU idle``, ``device busy``, ``layer``,
    ``op``, ``communication``, ``late rank``, ``straggler``, ``host load``, ``clocks``, ``power``, ``tscope``), its
    name, before and after (units in ``unit``) and the sentence for the alert."""

    kind: str
    name: str
    before: float | None
    after: float | None
    unit: str
    text: str


def _grown(before: Mapping[str, float], after: Mapping[str, float], floor: float) -> list[tuple[str, float, float]]:
    rows = [(k, before.get(k, 0.0), v) for k, v in after.items() if v - before.get(k, 0.0) >= floor]
    return sorted(rows, key=lambda r: r[1] - r[2])


def _step_ms(b: Breakdown | None) -> float:
    return b.step_ms if b is not None else 0.0


def _part(hb: Breakdown, nb: Breakdown, p: str) -> tuple[float, float]:
    """A part before and after: the steps' medians where both have them (a preemption or a GC in one step lands
    in whatever part ran: the median of each part is the typical step's), else the means."""
    if p in hb.medians_ms and p in nb.medians_ms:
        return hb.medians_ms[p], nb.medians_ms[p]
    if hb.device_parts_ms is not None and nb.device_parts_ms is not None:  # a GPU: what each part cost the device
        return hb.device_parts_ms.get(p, 0.0), nb.device_parts_ms.get(p, 0.0)
    return hb.parts_ms.get(p, 0.0), nb.parts_ms.get(p, 0.0)


def what_grew(healthy: Snapshot, now: Snapshot, *, cuda: bool, top: int = 3) -> list[Finding]:
    """What grew from ``healthy`` to ``now``, largest first within each kind, by at least :data:`GREW_SHARE` of the
    step's growth and :data:`NOISE_SHARE` of the healthy step: the parts (``tscope`` apart: tscope's own cost, never the run's), the hooks, loggers and
    callbacks by name, the wait for a CPU, on a GPU the device's busy and idle time, the ``top`` layers by forward
    host time and ops by time, communication, the late rank and a straggler rank, other processes' CPU load, the SM
    clock (dropped over 10%, with the throttle reasons) and power."""
    out: list[Finding] = []
    hb, nb = healthy.breakdown, now.breakdown
    grew_ms = max(_step_ms(nb) - _step_ms(hb), 0.0)
    floor_ms = max(GREW_SHARE * grew_ms, NOISE_SHARE * _step_ms(hb), 1e-3)
    if hb is not None and nb is not None:
        # on a GPU the parts' and items' device times: a host part's wait in a device sync grows with any slower
        # kernel, and is none of the step's cost
        on = " on the device" if hb.device_parts_ms is not None and nb.device_parts_ms is not None else ""
        rows = [(p, *_part(hb, nb, p)) for p in PARTS]
        for p, a, b in sorted(rows, key=lambda r: r[1] - r[2]):
            if b - a >= floor_ms:
                kind = "tscope" if p == "tscope" else "part"
                out.append(Finding(kind, p, a, b, "ms",
                                   f"{PART_TEXT[p]} {figure_text(a, 'ms')} -> {figure_text(b, 'ms')} a step{on}"))
        before = {f"{c.part}:{c.name}": c.cost_ms for c in hb.named}
        after = {f"{c.part}:{c.name}": c.cost_ms for c in nb.named if c.part in ("hooks", "logging", "checkpoint")}
        for key, a, b in _grown(before, after, floor_ms)[:top]:
            name = key.partition(":")[2]
            out.append(Finding("hook", name, a, b, "ms",
                               f"{name} {figure_text(a, 'ms')} -> {figure_text(b, 'ms')} a step{on}"))
        if hb.cpu_wait_ms is not None and nb.cpu_wait_ms is not None and nb.cpu_wait_ms - hb.cpu_wait_ms >= floor_ms:
            out.append(Finding("cpu wait", "waiting for a CPU", hb.cpu_wait_ms, nb.cpu_wait_ms, "ms",
                               f"waiting for a CPU (other processes' work) {figure_text(hb.cpu_wait_ms, 'ms')} -> "
                               f"{figure_text(nb.cpu_wait_ms, 'ms')} a step"))
        if cuda:
            for name, a, b in (("GPU idle", hb.idle_ms, nb.idle_ms), ("device busy", hb.device_busy_ms,
                                                                      nb.device_busy_ms)):
                if a is not None and b is not None and b - a >= floor_ms:
                    out.append(Finding(name, name, a, b, "ms",
                                       f"{name} {figure_text(a, 'ms')} -> {figure_text(b, 'ms')}"))
    floor_s = floor_ms / 1e3
    for kind, before_s, after_s in (("layer", healthy.layers, now.layers), ("op", healthy.ops, now.ops)):
        if not before_s:
            continue  # no healthy figures to compare with
        for name, a, b in _grown(before_s, after_s, floor_s)[:top]:
            label = f"'{name or '<root>'}'" if kind == "layer" else name
            out.append(Finding(kind, name, a * 1e3, b * 1e3, "ms",
                               f"{kind} {label} {time_text(a)} -> {time_text(b)}"))
    if now.comm_s is not None and (now.comm_s - (healthy.comm_s or 0.0)) >= floor_s:
        a = (healthy.comm_s or 0.0) * 1e3
        out.append(Finding("communication", "collectives", a, now.comm_s * 1e3, "ms",
                           f"communication {figure_text(a, 'ms')} -> {time_text(now.comm_s)}"))
    late = now.late_rank
    if late is not None and late.finding:
        out.append(Finding("late rank", f"rank {late.rank}", None, late.cost_ms, "ms", late.text))
    ranks = now.rank_step_s
    if len(ranks) > 1 and min(ranks) > 0 and max(ranks) / min(ranks) > 1.2:
        r = max(range(len(ranks)), key=ranks.__getitem__)
        out.append(Finding("straggler", f"rank {r}", min(ranks) * 1e3, ranks[r] * 1e3, "ms",
                           f"straggler rank {r}: {time_text(ranks[r])} vs {time_text(min(ranks))} on the fastest "
                           f"({sig(ranks[r] / min(ranks))}x)"))
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
    """The part, hook, layer or op whose growth beyond the slowdown of the rest of the step (its healthy time x the
    rest's ratio) is at least half the step's growth, or None: the step got slower all over (host contention, lower
    clocks). A sleep in one layer, a slow loader or a slow callback is concentrated; a busy host is not. The parts
    are compared by their medians over the steps on the run's own time (``Breakdown.medians_ms``: each step less its
    wait for a CPU), and a cause must grow by more than a typical slow step's wait for a CPU (a preemption lands whole
    in whatever ran)."""
    hb, nb = healthy.breakdown, now.breakdown
    if hb is None or nb is None:
        return None
    parts = {p: _part(hb, nb, p) for p in PARTS}
    a, b = sum(x for x, _ in parts.values()), sum(y for _, y in parts.values())
    if a <= 0 or b <= a:
        return None
    grew = b - a
    cands = [(PART_TEXT[p], x, y) for p, (x, y) in parts.items() if p != "other"]
    before = {f"{c.part}:{c.name}": c.cost_ms for c in hb.named}
    cands += [(c.name, before.get(f"{c.part}:{c.name}", 0.0), c.cost_ms) for c in nb.named]
    # a cause clears the steps' own noise (a few hundredths of the step) and a typical step's wait for a CPU: that
    # wait lands whole in whatever part or op was running (a preemption), so growth under it proves nothing. A
    # layer's time is the least of its timed steps on the run's own time (the monitor's ``_layer_times``): a
    # preemption in one of them does not move it, so the noise floor alone
    noise = NOISE_SHARE * a
    floor = max(noise, nb.medians_ms.get("cpu_wait", 0.0))
    rows = [(name, x, y, floor) for name, x, y in cands]
    if healthy.layers:
        rows += [(f"layer '{k or '<root>'}'", healthy.layers.get(k, 0.0) * 1e3, v * 1e3, noise)
                 for k, v in now.layers.items()]
    if healthy.ops:
        rows += [(k, healthy.ops.get(k, 0.0) * 1e3, v * 1e3, floor) for k, v in now.ops.items()]
    for name, x, y, cut in rows:
        rest = max(b - y, 0.0) / (a - x) if a - x > 0 else 1.0  # how much the rest of the step slowed
        if y - max(rest, 1.0) * x >= max(0.5 * grew, cut):
            return name
    return None


#: the kinds of findings that name a cause in the run (the others: the machine's load, the CPU wait, tscope's own)
CAUSES = ("part", "hook", "layer", "op", "communication", "late rank", "straggler", "GPU idle", "device busy",
          "clocks", "power")


def contention(healthy: Snapshot, now: Snapshot, findings: Sequence[Finding] | None = None) -> bool:
    """A slowdown of the run's own time (its step less its wait for a CPU: what the trigger reads) that is the
    machine's, not the run's: the step slowed all over (nothing :func:`concentrated`) while other processes loaded the
    CPUs (:func:`host_contention`) or the training thread waited for a CPU at least :data:`CONTENTION_WAIT_SHARE` of
    its steps (a machine that busy runs everything slower too: hyperthreads, caches, a VM's stolen time), which
    timing alone cannot tell from a slower run. A slowdown concentrated in a part, hook,
    layer or op is the run's, whatever the load. (A longer wait for a CPU alone is no slowdown of the run's own time:
    the monitor names it as contention at its logging steps.)"""
    if concentrated(healthy, now) is not None and (findings is None or any(f.kind in CAUSES for f in findings)):
        return False  # (a cause too small to be a finding names nothing: no cause)
    nb = now.breakdown
    waited = (nb is not None and nb.cpu_wait_ms is not None and nb.step_ms > 0
              and nb.cpu_wait_ms >= CONTENTION_WAIT_SHARE * nb.step_ms)
    return host_contention(healthy.load, now.load) or waited


def contention_text(trigger: Mapping[str, Any], findings: Sequence[Finding], healthy: Snapshot,
                    now: Snapshot) -> str:
    """A slowdown named as contention (:func:`contention`): when, how much, the load and the CPU wait behind it."""
    hb, nb = healthy.breakdown, now.breakdown
    why = []
    if now.load is not None:
        why.append(f"other processes' CPU load {'' if healthy.load is None else f'{healthy.load:.2f} -> '}"
                   f"{now.load:.2f} per CPU")
    if hb is not None and nb is not None and hb.cpu_wait_ms is not None and nb.cpu_wait_ms is not None:
        why.append(f"the training thread waiting {figure_text(hb.cpu_wait_ms, 'ms')} -> "
                   f"{figure_text(nb.cpu_wait_ms, 'ms')} a step for a CPU")
    grew = [f.text for f in findings if f.kind not in ("host load", "cpu wait")]
    return (f"tscope step monitor: contention at steps {trigger['first']}-{trigger['step']}: the steps took "
            f"{time_text(trigger['slow_s'])}, {sig(trigger['ratio'])}x the healthy median "
            f"{time_text(trigger['median_s'])}, spread over the whole step, with " + " and ".join(why or ["the CPUs "
            "busy"]) + ": the machine's load, not the run's (not alerted)"
            + (f". What grew: {'; '.join(grew)}." if grew else "."))


def whole_step(healthy: Snapshot, now: Snapshot, findings: Sequence[Finding]) -> bool:
    """A slowdown spread over the whole step: nothing :func:`concentrated` (every part, layer and op grew alike) and
    no finding that names another cause (:data:`CAUSES` beyond the step's own places: clocks, power, a late rank,
    communication, GPU idle...). Without other processes' load (:func:`contention`) its cause is outside what the
    monitor sees -- the machine (clock speed, a shared host's other tenants, caches) or more work in each step
    (longer inputs) -- and the alert says so instead of listing the parts as if each were a cause."""
    places = ("part", "hook", "layer", "op")
    return concentrated(healthy, now) is None and not any(f.kind in CAUSES and f.kind not in places for f in findings)


def alert_text(trigger: Mapping[str, Any], findings: Sequence[Finding], healthy_step: int | None,
               note: str = "", *, uniform: bool = False) -> str:
    """The alert's sentence: the trigger, then what grew against the healthy steps (and the baseline profile of
    ``healthy_step`` where there is one), or that nothing did; ``note``: why there was no profile; ``uniform``: the
    slowdown is spread over the whole step (:func:`whole_step`)."""
    kind = trigger.get("kind")
    if kind == "slow-steps":
        head = (f"steps {trigger['first']}-{trigger['step']} took {time_text(trigger['slow_s'])}, "
                f"{sig(trigger['ratio'])}x the healthy median {time_text(trigger['median_s'])} (threshold "
                f"{time_text(trigger['threshold_s'])} from the run's own spread)")
    elif kind == "loss-spike":
        head = f"loss spike at step {trigger['step']}: {trigger['value']:.4g}, {sig(trigger['ratio'])}x its median"
    elif kind == "grad-spike":
        head = (f"gradient-norm spike at step {trigger['step']}: {sig(trigger.get('ratio', 0.0))}x the median (NaN "
                "guard)")
    elif kind == "late-rank":
        head = f"a late rank at step {trigger.get('step')}"
    else:
        head = f"{kind} at step {trigger.get('step')}"
    base = (f"against the healthy steps and the baseline profile of step {healthy_step}" if healthy_step is not None
            else "against the healthy steps")
    tail = f" ({note})" if note else ""
    if not findings:
        return f"tscope step monitor: {head}. Compared {base}{tail}: nothing grew beyond the noise."
    if uniform and kind == "slow-steps":
        return (f"tscope step monitor: {head}. Spread over the whole step {base}{tail}: no part, layer or op grew "
                "more than the rest, and no other process loaded the CPUs -- the machine (clock speed, a shared "
                "host's other tenants) or more work in each step (longer inputs), not one place in the run. Each "
                "part: " + "; ".join(f.text for f in findings) + ".")
    return f"tscope step monitor: {head}. What grew {base}{tail}: " + "; ".join(f.text for f in findings) + "."


def witness(mfu: float | None, tensor_active: float | None, margin: float = WITNESS_MARGIN) -> str | None:
    """A flag when the FLOP-count MFU and the tensor pipes' active share (GPM, 0-1) disagree by more than
    ``margin``; None when they agree or one is missing. Tensor pipes active at full rate for a share ``u`` of the
    time give at most ``u`` of the peak, so MFU well above ``u`` means the FLOP count or the peak is off; ``u`` well
    above MFU means the tensor kernels run far below their peak rate (small tiles, low occupancy) or work is not
    counted."""
    if mfu is None or tensor_active is None:
        return None
    if mfu - tensor_active > margin:
        return (f"MFU {pct_text(mfu)} exceeds the tensor pipes' active share {pct_text(tensor_active)} by more than "
                f"{pct_text(margin)}: the FLOP count or the device peak is off")
    if tensor_active - mfu > margin:
        return (f"the tensor pipes were active {pct_text(tensor_active)} of the time but MFU is {pct_text(mfu)} (more than "
                f"{pct_text(margin)} apart): tensor kernels run far below their peak rate, or work is not counted")
    return None
