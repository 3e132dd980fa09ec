"""A training step's time in named parts, each measured where it happens (pure: numbers in, verdicts out).

The step monitor's probe (``callbacks.loop_probe``) times every optimizer step from the start of its first batch's
fetch to the start of the next step's, in these parts (:data:`PARTS`; host seconds, exclusive: a hook called inside
``training_step`` is the hook's time, not the forward's):

- ``fetch``: the DataLoader's ``next`` (Lightning's ``train_dataloader_next`` action);
- ``transfer``: the batch's way to the device (``on_before_batch_transfer``, the strategy's ``batch_to_device`` with
  the module's ``transfer_batch_to_device`` and ``on_after_batch_transfer``);
- ``forward``: the strategy's ``training_step``;
- ``backward``: the strategy's ``backward``, less the sync wait at its end;
- ``optimizer``: the optimizer step around the closure (``optimizer_step`` without the forward, backward and hooks
  inside it), ``optimizer_zero_grad`` and gradient clipping;
- ``sync``: waiting for the other ranks: DDP's gradient all-reduce wait at the end of backward (from the last
  gradient's accumulation to backward's end), Lightning's per-step SIGTERM broadcast, tscope's own gather of the
  ranks' parts at logging steps;
- ``hooks``: the other callbacks' hooks and the LightningModule's, DataModule's and strategy's hooks;
- ``logging``: Lightning's metric logging at each step and the loggers' ``log_metrics`` and ``save``;
- ``checkpoint``: ``save_checkpoint`` (a ``ModelCheckpoint`` saving inside its hook);
- ``tscope``: tscope's own callbacks' hooks (this monitor's included) and the probe's own instrumentation;
- ``other``: the rest of the step: Lightning's loop bookkeeping and whatever no hook marks.

The parts add up to the step. Beside them, ``cpu_wait``: the time the training thread was ready to run but waited
for a CPU (the kernel's run-queue wait, ``/proc/thread-self/schedstat``): contention, spread over the parts it
slowed. On a GPU the parts are host times, and each part also has its **device time**: the device's time while
the host ran it (CUDA events around the parts, ``callbacks.loop_probe``): for the loop's parts, the device's idle
while the host ran them. The host runs ahead of the device, so a host part costs a GPU step only its device time:
11 ms of host time in Lightning's metric bookkeeping that is the host blocked in a device sync while the device
runs the step's kernels costs nothing by itself.

A step is **input-bound** when fetch and transfer are at least ``share`` of the step (on a GPU their device time
must be that share: the device waited for the batch). The **loop's own work** (hooks, logging, checkpoints,
Lightning's bookkeeping) is a finding once it is at least :data:`LOOP_SHARE` of the step (on a GPU: its device
time), naming the biggest items. On a GPU a **host-device sync in the loop** (:func:`sync_text`: a value logged
for the progress bar, read back every step) is named where the device then idled at least that share of the step
while the host prepared the next step. A **late rank** (:func:`late_rank`) is the one the others wait for: each
rank's sync wait is gathered, the rank that waits least is the one the others wait for, its cost is how much
longer they wait.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tscope_callbacks.analysis.fmt import figure_text, pct_text

__all__ = ["PARTS", "DATA_PARTS", "COMPUTE_PARTS", "LOOP_PARTS", "PART_TEXT", "StepTimes", "Breakdown", "NamedCost",
           "summarize", "Rolling", "fetch_of", "input_bound", "loop_costs", "loop_text", "loop_findings", "sync_text", "sync_findings",
           "KernelTime", "kernel_time", "removal_saving",
           "LateRank", "HOST_PARTS", "late_rank", "RANK_FIELDS",
           "rank_vector", "INPUT_BOUND_SHARE", "LOOP_SHARE", "LATE_SHARE", "LATE_MIN_MS", "MIN_VERDICT_STEPS",
           "VERDICT_WINDOW"]

PARTS = ("fetch", "transfer", "forward", "backward", "optimizer", "sync", "hooks", "logging", "checkpoint", "tscope",
         "other")
DATA_PARTS = ("fetch", "transfer")
COMPUTE_PARTS = ("forward", "backward", "optimizer")
#: the loop's own work: what the user's loop setup costs besides the model (tscope's own cost is apart)
LOOP_PARTS = ("hooks", "logging", "checkpoint", "other")
#: the parts that queue no device work of their own: on a GPU their device time is the device's idle while the host
#: ran them
HOST_PARTS = ("fetch", "hooks", "logging", "checkpoint", "tscope", "other")
#: a part's name in a sentence
PART_TEXT = {"fetch": "fetching the batch", "transfer": "moving the batch to the device", "forward": "forward",
             "backward": "backward", "optimizer": "optimizer step", "sync": "waiting for other ranks",
             "hooks": "callbacks' and hooks' work", "logging": "logging", "checkpoint": "checkpointing",
             "tscope": "tscope's own hooks", "other": "Lightning's loop (unmarked)"}

#: fetch + transfer at or above this share of the step makes the step input-bound
INPUT_BOUND_SHARE = 0.10
#: the loop's own work at or above this share of the step is a finding
LOOP_SHARE = 0.05
#: a late rank is a finding when the others wait for it at least this share of the step ...
LATE_SHARE = 0.05
#: ... and at least this many ms a step
LATE_MIN_MS = 0.2
#: fewest clean steps behind a verdict (input-bound, loop overhead): one slow first batch is no finding
MIN_VERDICT_STEPS = 16
#: verdicts are taken over at most this many recent clean steps
VERDICT_WINDOW = 64

_IDX = {p: i for i, p in enumerate(PARTS)}
#: said where a GPU finding has no kernel time (no profile of the step): the parts' device times alone
NO_KERNEL = ("; no kernel time for the step yet (no profile of it): the device's idle after this work, in the next "
             "forward while the host launches it, is not counted, so it may cost more")


@dataclass(slots=True)
class StepTimes:
    """One optimizer step (module doc), in seconds.

    ``host_s``: the step on the host (start of its fetch to the start of the next step's); ``step_s``: the step's
    time, the host's on CPU and on a GPU the device's (CUDA events, one batch end to the next); ``parts``: host
    seconds per :data:`PARTS` (``other`` is the rest of ``host_s``); ``named``: seconds per hook, logger or
    callback (``"<part>:<name>"``: the loop's and tscope's items); ``cpu_wait_s``: run-queue wait (None: not
    known); ``busy_s``/``idle_s``/``device_sync_s``: the device's (GPU only); ``dev_parts``/``dev_named``: each
    part's and named item's device seconds (GPU only: the device's time while the host ran it, from CUDA events);
    ``dirty``: the step held non-training work (a profile, validation, an epoch boundary) and is no basis."""

    step: int
    host_s: float
    parts: tuple[float, ...]
    named: dict[str, float] = field(default_factory=dict)
    cpu_wait_s: float | None = None
    step_s: float = -1.0
    busy_s: float | None = None
    idle_s: float | None = None
    device_sync_s: float | None = None  #: GPU: the device's wait at the end of a DDP backward (CUDA events)
    dirty: bool = False
    dev_parts: tuple[float, ...] | None = None
    dev_named: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.step_s < 0:
            self.step_s = self.host_s

    def part(self, name: str) -> float:
        return self.parts[_IDX[name]]

    @property
    def own_share(self) -> float:
        """The share of the step's host time that was the run's own (not its wait for a CPU)."""
        return _own_share(self)

    @property
    def own_s(self) -> float:
        """The step less its wait for a CPU (contention): what the run itself took; the slowdown detector's input."""
        return max(self.step_s - (self.cpu_wait_s or 0.0), 0.0)


@dataclass(frozen=True)
class NamedCost:
    """One hook, logger or callback over a run of steps: its mean ``ms`` a step, the steps it ran in
    (``occurrences`` of ``steps``) and its mean per occurrence (a checkpoint every 50 steps: 40 ms each, 0.8 ms a
    step); on a GPU ``device_ms``: its device time a step (the device's idle while the host ran it; None: CPU)."""

    part: str
    name: str
    ms: float
    per_occurrence_ms: float
    occurrences: int
    steps: int
    device_ms: float | None = None

    @property
    def cost_ms(self) -> float:
        """What it costs the step a step: its device time on a GPU, its host time on CPU."""
        return self.ms if self.device_ms is None else self.device_ms

    @property
    def every(self) -> float:
        """Steps between two occurrences."""
        return self.steps / self.occurrences if self.occurrences else math.inf


@dataclass(frozen=True)
class Breakdown:
    """The means over ``steps`` clean steps (ms a step; the parts add up to ``step_ms`` on the host), ``cpu_wait_ms``
    (None: not known), the device's busy and idle time (GPU only), ``fetch_share`` ((fetch + transfer) / step),
    ``input_bound`` (:func:`input_bound`) and ``named`` (the loop's and tscope's items, largest first)."""

    steps: int
    step_ms: float
    host_ms: float
    parts_ms: dict[str, float]
    cpu_wait_ms: float | None = None
    device_busy_ms: float | None = None
    idle_ms: float | None = None
    device_sync_ms: float | None = None
    fetch_share: float = 0.0
    input_bound: bool = False
    named: tuple[NamedCost, ...] = ()
    #: each part's median over the steps on the run's own time (ms; each step's wait for a CPU taken off its parts in
    #: proportion; on a GPU each part's device time; {} where not taken): a typical step's, robust to the odd step a
    #: preemption or a GC landed in (the diagnosis compares these)
    medians_ms: dict[str, float] = field(default_factory=dict)
    #: GPU: each part's device time (ms a step: the device's time while the host ran it); None: CPU
    device_parts_ms: dict[str, float] | None = None

    @property
    def loop_ms(self) -> float:
        return sum(self.parts_ms.get(p, 0.0) for p in LOOP_PARTS)

    @property
    def loop_device_ms(self) -> float | None:
        """GPU: the loop's own work's device time (ms a step); None on CPU."""
        d = self.device_parts_ms
        return None if d is None else sum(d.get(p, 0.0) for p in LOOP_PARTS)

    @property
    def host_idle_ms(self) -> float | None:
        """GPU: the device's time while the host ran the parts that queue no device work (:data:`HOST_PARTS`): the
        device's idle waiting for the host (ms a step); None on CPU."""
        d = self.device_parts_ms
        return None if d is None else sum(d.get(p, 0.0) for p in HOST_PARTS)

    @property
    def fetch_ms(self) -> float:
        return sum(self.parts_ms.get(p, 0.0) for p in DATA_PARTS)

    def scalars(self) -> dict[str, float]:
        """Bare keys (the monitor logs them as ``tscope/step/<key>``)."""
        out = {f"{p}_ms": v for p, v in self.parts_ms.items()}
        out.update(step_ms=self.step_ms, fetch_share=self.fetch_share, input_bound=float(self.input_bound),
                   loop_ms=self.loop_ms)
        if self.cpu_wait_ms is not None:
            out["cpu_wait_ms"] = self.cpu_wait_ms
        if self.device_busy_ms is not None:
            out["device_busy_ms"] = self.device_busy_ms
        if self.idle_ms is not None:
            out["idle_ms"] = self.idle_ms
        if self.device_sync_ms is not None:
            out["device_sync_ms"] = self.device_sync_ms
        if self.device_parts_ms is not None:
            out["loop_device_ms"] = self.loop_device_ms or 0.0
            out["tscope_device_ms"] = self.device_parts_ms.get("tscope", 0.0)
            out["host_idle_ms"] = self.host_idle_ms or 0.0
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "step_ms": self.step_ms, "host_ms": self.host_ms, "parts_ms": dict(self.parts_ms),
                "cpu_wait_ms": self.cpu_wait_ms, "device_busy_ms": self.device_busy_ms, "idle_ms": self.idle_ms,
                "device_sync_ms": self.device_sync_ms, "fetch_share": self.fetch_share, "input_bound": self.input_bound,
                "device_parts_ms": None if self.device_parts_ms is None else dict(self.device_parts_ms),
                "named": [[c.part, c.name, c.ms, c.per_occurrence_ms, c.occurrences, c.steps]
                          + ([] if c.device_ms is None else [c.device_ms]) for c in self.named]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Breakdown:
        dev = d.get("device_parts_ms")
        return cls(steps=int(d["steps"]), step_ms=float(d["step_ms"]), host_ms=float(d.get("host_ms", d["step_ms"])),
                   parts_ms={str(k): float(v) for k, v in (d.get("parts_ms") or {}).items()},
                   cpu_wait_ms=d.get("cpu_wait_ms"), device_busy_ms=d.get("device_busy_ms"), idle_ms=d.get("idle_ms"),
                   device_sync_ms=d.get("device_sync_ms"), fetch_share=float(d.get("fetch_share", 0.0)),
                   input_bound=bool(d.get("input_bound")),
                   device_parts_ms=None if dev is None else {str(k): float(v) for k, v in dev.items()},
                   named=tuple(NamedCost(str(r[0]), str(r[1]), float(r[2]), float(r[3]), int(r[4]), int(r[5]),
                                         float(r[6]) if len(r) > 6 and r[6] is not None else None)
                               for r in d.get("named") or ()))


@dataclass(frozen=True)
class KernelTime:
    """A GPU step's CUDA kernel time (ms a step), from a profile of a step of the same shape (the op records' kernel
    time, ``timing == "cuda-kernels"``): per compute part (``forward``, ``backward`` with any recompute,
    ``optimizer``) and the ``step`` it was profiled at. What the device needs a step with a full queue; the device's
    step less it is the device's idle (it waited for the host). The sum of the kernels' durations: the few µs
    between two queued kernels are not in it, so a saving read against it is an upper bound by those."""

    parts_ms: dict[str, float]
    step: int | None = None

    @property
    def ms(self) -> float:
        return math.fsum(self.parts_ms.values())

    def text(self) -> str:
        at = f" (profile of step {self.step})" if self.step is not None else " (a profile of the step)"
        return f"its kernels take {figure_text(self.ms, 'ms')}{at}"


_KERNEL_PHASE = {"forward": "forward", "backward": "backward", "recompute": "backward", "optimizer": "optimizer"}


def kernel_time(ops: Iterable[Any], timing: str | None, step: int | None = None) -> KernelTime | None:
    """The :class:`KernelTime` of a profiled training step from its op records (``OpRecord``: ``phase``,
    ``time_s``) where their times are CUDA kernel times (``timing == "cuda-kernels"``) and the step has a forward and
    a backward; None otherwise (a CPU profile, an untimed one, an evaluation step)."""
    if timing != "cuda-kernels":
        return None
    parts = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    for r in ops:
        p = _KERNEL_PHASE.get(getattr(r, "phase", ""))
        t = getattr(r, "time_s", None)
        if p is not None and t is not None and math.isfinite(t):
            parts[p] += t * 1e3
    if parts["forward"] <= 0 or parts["backward"] <= 0:
        return None
    return KernelTime(parts, step)


def removal_saving(b: Breakdown, host_cut_ms: float, kernel: KernelTime) -> float:
    """GPU: what the device's step would lose if the host did ``host_cut_ms`` less a step (ms a step): the step's
    device time less the longer of its kernel time (the device with a full queue) and the host's step without that
    work (the host then paces the device). The device's idle between kernels after a sync, or while a callback's
    work drained the queue, is in it, wherever it fell (mostly in the next forward, while the host launches it)."""
    return max(b.step_ms - max(kernel.ms, b.host_ms - host_cut_ms), 0.0)


def fetch_of(bd: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(fetch + transfer in ms a step, their share of the step) from a :meth:`Breakdown.to_dict` (a profile's
    ``step_breakdown``); (None, None) where it has no parts."""
    parts = bd.get("parts_ms") or {}
    vals = [parts.get(p) for p in DATA_PARTS]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
        return None, None
    share = bd.get("fetch_share")
    return float(sum(vals)), float(share) if isinstance(share, (int, float)) and math.isfinite(share) else None


def input_bound(fetch_share: float, idle_share: float | None, share: float = INPUT_BOUND_SHARE) -> bool:
    """Input-bound: fetching the batch (fetch + transfer) takes at least ``share`` of the step and, on a GPU
    (``idle_share`` given: the device's time while the host fetched and moved the batch, else its idle between
    steps), the device idles at least that share too (it waited for the batch)."""
    return fetch_share >= share and (idle_share is None or idle_share >= share)


def _idle_share(dev: Mapping[str, float] | None, idle_ms: float | None, step_ms: float) -> float | None:
    """The device's share of the step spent waiting for the batch: the device time of fetch + transfer where known,
    else the device's idle between steps; None on CPU."""
    if step_ms <= 0:
        return None if dev is None and idle_ms is None else 0.0
    if dev is not None:
        return (dev.get("fetch", 0.0) + dev.get("transfer", 0.0)) / step_ms
    return None if idle_ms is None else idle_ms / step_ms


def _own_share(s: StepTimes) -> float:
    """The share of a step's host time that was the run's own (not its wait for a CPU)."""
    if not s.cpu_wait_s or s.host_s <= 0:
        return 1.0
    return max(1.0 - s.cpu_wait_s / s.host_s, 0.0)


def summarize(steps: Sequence[StepTimes], share: float = INPUT_BOUND_SHARE) -> Breakdown | None:
    """The means of the clean ``steps`` (:class:`Breakdown`); None when none is clean."""
    clean = [s for s in steps if not s.dirty]
    if not clean:
        return None
    n = len(clean)
    mean = lambda xs: math.fsum(xs) / n  # noqa: E731
    parts = {p: mean(s.parts[i] for s in clean) * 1e3 for i, p in enumerate(PARTS)}
    host, step = mean(s.host_s for s in clean) * 1e3, mean(s.step_s for s in clean) * 1e3
    waits = [s.cpu_wait_s for s in clean if s.cpu_wait_s is not None]
    cpu_wait = math.fsum(waits) / len(waits) * 1e3 if len(waits) == n else None
    busy = idle = None
    if all(s.busy_s is not None for s in clean):
        busy = mean(s.busy_s or 0.0 for s in clean) * 1e3
        idle = mean(s.idle_s or 0.0 for s in clean) * 1e3
    dsync = (mean(s.device_sync_s or 0.0 for s in clean) * 1e3
             if any(s.device_sync_s is not None for s in clean) else None)
    dev = None
    if all(s.dev_parts is not None for s in clean):
        dev = {p: mean(s.dev_parts[i] for s in clean) * 1e3 for i, p in enumerate(PARTS)}  # type: ignore[index]
    frac = (parts["fetch"] + parts["transfer"]) / host if host > 0 else 0.0
    idle_frac = _idle_share(dev, idle, step)
    # a typical step's parts on the run's own time: each step's parts less its wait for a CPU, spread over them in
    # proportion (the wait lands in whatever part ran), then each part's median over the steps. On a GPU each part's
    # device time (what it cost the step: a host part's wait in a device sync or behind the device's work is none)
    if dev is not None:
        own = [list(s.dev_parts or ()) for s in clean]
    else:
        own = [[v * _own_share(s) for v in s.parts] for s in clean]
    medians = {p: statistics.median(row[i] for row in own) * 1e3 for i, p in enumerate(PARTS)}
    medians["step"] = statistics.median(s.own_s for s in clean) * 1e3
    if cpu_wait is not None:  # a typical step's wait for a CPU: what may land in any one part of it
        medians["cpu_wait"] = statistics.median(s.cpu_wait_s or 0.0 for s in clean) * 1e3
    return Breakdown(steps=n, step_ms=step, host_ms=host, parts_ms=parts, cpu_wait_ms=cpu_wait, device_busy_ms=busy,
                     idle_ms=idle, device_sync_ms=dsync, fetch_share=frac, input_bound=input_bound(frac, idle_frac, share),
                     named=loop_costs(clean), medians_ms=medians, device_parts_ms=dev)


class Rolling:
    """The last ``n`` clean steps with running sums: :meth:`summary` is the :func:`summarize` of them in O(parts +
    named items), so the monitor's per-step cost does not grow with the window."""

    def __init__(self, n: int, *, named: bool = True) -> None:
        self.n, self.keep_named = n, named  #: ``named``: also the named items' sums (the loop's costs)
        self.steps: deque[StepTimes] = deque()
        self._sums = [0.0] * len(PARTS)
        self._host = self._step = self._wait = self._busy = self._idle = self._dsync = 0.0
        self._n_wait = self._n_busy = self._n_dsync = self._n_dev = 0
        self._dev = [0.0] * len(PARTS)
        self._named: dict[str, float] = {}
        self._dev_named: dict[str, float] = {}
        self._occ: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.steps)

    def __bool__(self) -> bool:
        return bool(self.steps)

    def _fold(self, st: StepTimes, sign: int) -> None:
        if sign > 0:
            self._sums = [a + b for a, b in zip(self._sums, st.parts)]
        else:
            self._sums = [a - b for a, b in zip(self._sums, st.parts)]
        self._host += sign * st.host_s
        self._step += sign * st.step_s
        if st.cpu_wait_s is not None:
            self._wait += sign * st.cpu_wait_s
            self._n_wait += sign
        if st.busy_s is not None:
            self._busy += sign * st.busy_s
            self._idle += sign * (st.idle_s or 0.0)
            self._n_busy += sign
        if st.device_sync_s is not None:
            self._dsync += sign * st.device_sync_s
            self._n_dsync += sign
        if st.dev_parts is not None:
            self._dev = [a + sign * b for a, b in zip(self._dev, st.dev_parts)]
            self._n_dev += sign
        if not self.keep_named:
            return
        for k, v in st.named.items():
            self._named[k] = self._named.get(k, 0.0) + sign * v
            c = self._occ.get(k, 0) + sign
            if c:
                self._occ[k] = c
            else:
                self._occ.pop(k, None)
                self._named.pop(k, None)
                self._dev_named.pop(k, None)
        for k, v in (st.dev_named or {}).items():
            if k in self._occ:
                self._dev_named[k] = self._dev_named.get(k, 0.0) + sign * v

    def add(self, st: StepTimes) -> None:
        if st.dirty:
            return
        if len(self.steps) >= self.n:
            self._fold(self.steps.popleft(), -1)
        self.steps.append(st)
        self._fold(st, 1)

    def extend(self, steps: Iterable[StepTimes]) -> None:
        for st in steps:
            self.add(st)

    def clear(self) -> None:
        self.__init__(self.n, named=self.keep_named)  # type: ignore[misc]

    def summary(self, share: float = INPUT_BOUND_SHARE, *, medians: bool = False) -> Breakdown | None:
        """The :class:`Breakdown` of the steps held; ``medians``: with each part's median (sorts the window: for a
        diagnosis, not every step)."""
        n = len(self.steps)
        if not n:
            return None
        if medians:
            return summarize(list(self.steps), share)
        parts = {p: max(self._sums[i], 0.0) / n * 1e3 for i, p in enumerate(PARTS)}
        host, step = self._host / n * 1e3, self._step / n * 1e3
        busy = self._busy / n * 1e3 if self._n_busy == n else None
        idle = self._idle / n * 1e3 if self._n_busy == n else None
        dev = ({p: max(self._dev[i], 0.0) / n * 1e3 for i, p in enumerate(PARTS)} if self._n_dev == n else None)
        frac = (parts["fetch"] + parts["transfer"]) / host if host > 0 else 0.0
        idle_frac = _idle_share(dev, idle, step)
        named = [NamedCost(*(k.partition(":")[::2]), max(v, 0.0) / n * 1e3, max(v, 0.0) / self._occ[k] * 1e3,
                           self._occ[k], n,
                           None if dev is None else max(self._dev_named.get(k, 0.0), 0.0) / n * 1e3)
                 for k, v in self._named.items()]
        return Breakdown(steps=n, step_ms=step, host_ms=host, parts_ms=parts,
                         cpu_wait_ms=self._wait / n * 1e3 if self._n_wait == n else None, device_busy_ms=busy,
                         idle_ms=idle, device_sync_ms=self._dsync / n * 1e3 if self._n_dsync else None,
                         fetch_share=frac, input_bound=input_bound(frac, idle_frac, share),
                         named=tuple(sorted(named, key=lambda c: -c.cost_ms)), device_parts_ms=dev)


def loop_costs(steps: Sequence[StepTimes]) -> tuple[NamedCost, ...]:
    """Each named item's cost over ``steps`` (all of them, clean or not as given), largest mean first."""
    tot: dict[str, float] = {}
    dev: dict[str, float] = {}
    occ: dict[str, int] = {}
    for s in steps:
        for k, v in s.named.items():
            tot[k] = tot.get(k, 0.0) + v
            occ[k] = occ.get(k, 0) + 1
        for k, v in (s.dev_named or {}).items():
            dev[k] = dev.get(k, 0.0) + v
    n = len(steps)
    on_device = bool(steps) and all(s.dev_parts is not None for s in steps)
    out = []
    for k, v in tot.items():
        part, _, name = k.partition(":")
        out.append(NamedCost(part, name, v / n * 1e3, v / occ[k] * 1e3, occ[k], n,
                             dev.get(k, 0.0) / n * 1e3 if on_device else None))
    return tuple(sorted(out, key=lambda c: -c.cost_ms))


def _cost(c: NamedCost) -> str:
    if c.occurrences < c.steps * 0.5:  # a periodic item (a checkpoint, logging every n steps): say how often
        return (f"{c.name} {figure_text(c.per_occurrence_ms, 'ms')} every {c.every:.3g} steps = "
                f"{figure_text(c.ms, 'ms')} a step")
    return f"{c.name} {figure_text(c.ms, 'ms')} a step"


def _device_cost(c: NamedCost) -> str:
    dev = c.device_ms or 0.0
    if c.occurrences < c.steps * 0.5:
        return (f"{c.name} {figure_text(dev * c.steps / c.occurrences, 'ms')} every {c.every:.3g} steps = "
                f"{figure_text(dev, 'ms')} a step (host {figure_text(c.ms, 'ms')})")
    return f"{c.name} {figure_text(dev, 'ms')} a step (host {figure_text(c.ms, 'ms')})"


def _device_loop_text(b: Breakdown, share: float, top: int) -> str | None:
    """:func:`loop_text` on a GPU: the loop's device time (module doc)."""
    dev = b.device_parts_ms or {}
    loop = b.loop_device_ms or 0.0
    if b.step_ms <= 0 or loop / b.step_ms < share:
        return None
    items = [c for c in b.named if c.part in LOOP_PARTS and (c.device_ms or 0.0) > 0.0][:top]
    named = [_device_cost(c) for c in items]
    other = dev.get("other", 0.0)
    if other >= 0.1 * loop:
        named.append(f"Lightning's own loop (bookkeeping no hook marks) {figure_text(other, 'ms')} a step "
                     f"(host {figure_text(b.parts_ms.get('other', 0.0), 'ms')})")
    return (f"the device waits {figure_text(loop, 'ms')} a step for the loop's own work ({pct_text(loop / b.step_ms)} of the "
            f"{figure_text(b.step_ms, 'ms')} step, mean of {b.steps} steps: the device's time while the host ran it; the host "
            f"spent {figure_text(b.loop_ms, 'ms')} in it, the rest while the device was busy): " + "; ".join(named)
            + f". tscope's own hooks: the device waited {figure_text(dev.get('tscope', 0.0), 'ms')} a step in them (host "
            f"{figure_text(b.parts_ms.get('tscope', 0.0), 'ms')}), not counted in it" + NO_KERNEL)


def _item_saving(b: Breakdown, c: NamedCost, kernel: KernelTime) -> float:
    return removal_saving(b, c.ms, kernel)


def _kernel_cost(b: Breakdown, c: NamedCost, kernel: KernelTime) -> str:
    saving = _item_saving(b, c, kernel)
    if c.occurrences < c.steps * 0.5:
        return (f"{c.name} {figure_text(saving, 'ms')} a step ({figure_text(c.per_occurrence_ms, 'ms')} on the host every "
                f"{c.every:.3g} steps)")
    return f"{c.name} {figure_text(saving, 'ms')} a step (host {figure_text(c.ms, 'ms')})"


def _kernel_loop_text(b: Breakdown, share: float, top: int, kernel: KernelTime) -> str | None:
    """:func:`loop_text` on a GPU with the step's kernel time known: what the loop's work costs the device's step
    (:func:`removal_saving`)."""
    cost = removal_saving(b, b.loop_ms, kernel)
    if b.step_ms <= 0 or cost / b.step_ms < share:
        return None
    items = sorted((c for c in b.named if c.part in LOOP_PARTS), key=lambda c: -_item_saving(b, c, kernel))
    named = [_kernel_cost(b, c, kernel) for c in items[:top] if _item_saving(b, c, kernel) > 0.0]
    other = b.parts_ms.get("other", 0.0)
    other_cost = removal_saving(b, other, kernel)
    if other_cost >= 0.1 * cost:
        named.append(f"Lightning's own loop (bookkeeping no hook marks) {figure_text(other_cost, 'ms')} a step "
                     f"(host {figure_text(other, 'ms')})")
    ts = b.parts_ms.get("tscope", 0.0)
    return (f"the device waits {figure_text(cost, 'ms')} a step for the loop's own work ({pct_text(cost / b.step_ms)} of the "
            f"{figure_text(b.step_ms, 'ms')} step, mean of {b.steps} steps: the step less the longer of its kernel time "
            f"and the host's step without that work; {kernel.text()}, the host's step without it "
            f"{figure_text(b.host_ms - b.loop_ms, 'ms')}; the host spent {figure_text(b.loop_ms, 'ms')} in it, the device's "
            f"time while it ran {figure_text(b.loop_device_ms or 0.0, 'ms')}, the rest of the device's wait falls in "
            f"the next forward while the host launches it): " + "; ".join(named)
            + f". tscope's own hooks: they cost the device {figure_text(removal_saving(b, ts, kernel), 'ms')} a step "
            f"(host {figure_text(ts, 'ms')}), not counted in it")


def loop_text(b: Breakdown, share: float = LOOP_SHARE, top: int = 3, kernel: KernelTime | None = None) -> str | None:
    """The loop-overhead finding: the loop's own work (hooks, logging, checkpoints, Lightning's bookkeeping) when it
    is at least ``share`` of the step, naming its ``top`` biggest items; tscope's own cost said apart. None below.
    On a GPU (:attr:`Breakdown.device_parts_ms`) only what the device lost counts: with the step's ``kernel`` time
    (a profile of the step), the step less the longer of that and the host's step without the work
    (:func:`removal_saving`); without it, each part's device time (the device's time while the host ran it: an
    under-count where the queue drained during the work and the device then idled in the next forward)."""
    if b.device_parts_ms is not None:
        if kernel is not None:
            return _kernel_loop_text(b, share, top, kernel)
        return _device_loop_text(b, share, top)
    if b.step_ms <= 0 or b.loop_ms / b.host_ms < share:
        return None
    items = [c for c in b.named if c.part in LOOP_PARTS][:top]
    other = b.parts_ms.get("other", 0.0)
    named = [_cost(c) for c in items]
    if other >= 0.1 * b.loop_ms:
        named.append(f"Lightning's own loop (bookkeeping no hook marks) {figure_text(other, 'ms')} a step")
    ts_ms = b.parts_ms.get("tscope", 0.0)
    return (f"the loop's own work takes {figure_text(b.loop_ms, 'ms')} a step ({pct_text(b.loop_ms / b.host_ms)} of the "
            f"{figure_text(b.host_ms, 'ms')} step, mean of {b.steps} steps): " + "; ".join(named)
            + f". tscope's own hooks: {figure_text(ts_ms, 'ms')} a step, not counted in it")


def _change(c: NamedCost) -> str:
    """What to change for one item of the loop's own work."""
    if c.part == "checkpoint":
        return (f"save checkpoints less often (ModelCheckpoint every_n_train_steps / train_time_interval): each save "
                f"takes {figure_text(c.per_occurrence_ms, 'ms')}, every {c.every:.3g} steps now")
    if c.part == "logging":
        if c.occurrences >= c.steps * 0.5:
            return f"log less often (raise the Trainer's log_every_n_steps, or log fewer values): {c.name} runs every step"
        return f"log less often (raise the Trainer's log_every_n_steps): {c.name} runs every {c.every:.3g} steps"
    return f"make {c.name}'s hooks cheaper, or run its work every few steps instead of every step"


def loop_findings(b: Breakdown, share: float = LOOP_SHARE, top: int = 3,
                  kernel: KernelTime | None = None) -> list[dict[str, Any]]:
    """The loop's own work as findings the report turns into opportunities: each of its ``top`` biggest items
    (hooks, loggers, checkpoints: not Lightning's unmarked bookkeeping, which has no change to name) when the loop's
    work is at least ``share`` of the step: ``{cause, change, saving_s}``, ``saving_s`` the item's mean cost a step
    (what removing it saves; making it rarer saves that share of it). On a GPU with the step's ``kernel`` time:
    :func:`removal_saving` of the loop's work and of each item."""
    gpu = b.device_parts_ms is not None
    step = b.step_ms if gpu else b.host_ms
    if gpu and kernel is not None:
        if step <= 0 or removal_saving(b, b.loop_ms, kernel) / step < share:
            return []
        out = []
        items = sorted((c for c in b.named if c.part in ("hooks", "logging", "checkpoint")),
                       key=lambda c: -_item_saving(b, c, kernel))
        for c in items[:top]:
            saving = _item_saving(b, c, kernel)
            if saving < 0.01 * step:
                continue
            out.append({"cause": f"the loop's own work: {_kernel_cost(b, c, kernel)} ({pct_text(saving / step)} of the "
                                 f"{figure_text(step, 'ms')} step: the step less the longer of its kernel time and the "
                                 f"host's step without it)",
                        "change": _change(c), "saving_s": saving / 1e3})
        return out
    loop = (b.loop_device_ms or 0.0) if gpu else b.loop_ms
    if step <= 0 or loop / step < share:
        return []
    out = []
    for c in [c for c in b.named if c.part in ("hooks", "logging", "checkpoint")][:top]:
        if c.cost_ms < 0.01 * step:
            continue  # under 1% of the step: not worth a change
        what = _device_cost(c) if gpu else _cost(c)
        out.append({"cause": f"the loop's own work: {what} ({pct_text(c.cost_ms / step)} of the "
                             f"{figure_text(step, 'ms')} step"
                             + (": the device's wait while the host ran it)" if gpu else ")"),
                    "change": _change(c), "saving_s": c.cost_ms / 1e3})
    return out


@dataclass(frozen=True)
class _Sync:
    reads: tuple[str, ...]
    idle_ms: float  #: the device's wait a step for the host (kernel time known: the step less it)
    at: NamedCost | None  #: where the host waited for the device
    blocked_ms: float
    saving_ms: float
    where: tuple[tuple[str, float, float], ...]  #: (what, device ms, host ms): where the device waited most
    kernel: KernelTime | None = None


def _sync(b: Breakdown, reads: Sequence[str], share: float, kernel: KernelTime | None = None) -> _Sync | None:
    """The figures of :func:`sync_text`; None where it is no finding."""
    dev = b.device_parts_ms
    if not reads or dev is None or b.step_ms <= 0:
        return None
    idle = b.host_idle_ms or 0.0
    if kernel is None and idle / b.step_ms < share:
        return None  # the device kept busy: the sync is hidden (the host's wait in it cost nothing)
    # where the host waited: the loop item whose host time most exceeds the device's time in it
    cands = [c for c in b.named if c.part in ("logging", "hooks") and c.device_ms is not None]
    at = max(cands, key=lambda c: c.ms - (c.device_ms or 0.0), default=None)
    blocked = max(at.ms - (at.device_ms or 0.0), 0.0) if at is not None else 0.0
    if kernel is not None:
        # the device's step less its kernels is its idle, wherever it fell (mostly in the next forward, the host
        # launching it kernel by kernel into an empty queue); without the wait the host's own work paces the device
        # only where it is longer than the kernels
        idle = max(b.step_ms - kernel.ms, 0.0)
        saving = removal_saving(b, blocked, kernel)
    else:
        # without the wait the host's own work a step is host_ms - blocked: the device keeps busy unless that
        # exceeds the step; the idle it can take back is at most the step less that work
        saving = min(idle, max(b.step_ms - (b.host_ms - blocked), 0.0))
    if saving < share * b.step_ms:
        return None  # the host's own work is the bottleneck, not the sync: the loop finding says so
    # where the device waited: the named items (a callback, a logger, tscope's hooks) and the unnamed parts
    items = [(c.name if c.part != "tscope" else f"tscope's {c.name}", c.device_ms or 0.0, c.ms) for c in b.named
             if c.part in HOST_PARTS and c is not at]
    items += [(PART_TEXT[p], dev.get(p, 0.0), b.parts_ms.get(p, 0.0)) for p in ("fetch", "other")]
    if kernel is not None:  # a compute part's device time beyond its kernels: the device idle between them
        items += [(f"{PART_TEXT[p]} (between its kernels: {figure_text(kernel.parts_ms.get(p, 0.0), 'ms')} of kernels)",
                   max(dev.get(p, 0.0) - kernel.parts_ms.get(p, 0.0), 0.0), b.parts_ms.get(p, 0.0))
                  for p in COMPUTE_PARTS]
    where = tuple(sorted((x for x in items if x[1] >= 0.05 * idle), key=lambda x: -x[1])[:4])
    return _Sync(tuple(reads), idle, at, blocked, saving, where, kernel)


def _reads_text(reads: Sequence[str]) -> str:
    names = ", ".join(repr(r) for r in reads)
    return f"the logged value{'s' * (len(reads) > 1)} {names}"


def sync_text(b: Breakdown, reads: Sequence[str], share: float = LOOP_SHARE,
              kernel: KernelTime | None = None) -> str | None:
    """A host-device sync in the loop, on a GPU: ``reads`` (``loop_probe.progress_bar_reads``: values logged for the
    progress bar, read back to the host after every batch) make the host wait for the device every step; the
    finding holds where the device then waited for the host at least ``share`` of the step (its time in the parts
    that queue no device work) and taking the sync away would give at least that back (the host's own work a step,
    its wait excluded, is shorter than the step). None otherwise (a sync the device never waits after costs
    nothing). With the step's ``kernel`` time (a profile of the step) the device's wait is the step less it and the
    saving the step less the longer of it and the host's step without the wait (:func:`removal_saving`): the idle
    after the sync mostly falls in the next forward, which the parts' device times alone do not count."""
    f = _sync(b, reads, share, kernel)
    if f is None:
        return None
    where = "; ".join(f"{w} {figure_text(d, 'ms')} (host {figure_text(h, 'ms')})" for w, d, h in f.where)
    at = (f" ({f.at.name}: {figure_text(f.at.ms, 'ms')} a step on the host, {figure_text(f.blocked_ms, 'ms')} of it while the device was "
          f"busy)" if f.at is not None else "")
    first = f.reads[0]
    kern = basis = ""
    if f.kernel is not None:
        kern = f": {f.kernel.text()}, the rest is the device waiting"
        basis = (f" (the step less the longer of its kernel time and the host's own work a step without the wait, "
                 f"{figure_text(b.host_ms - f.blocked_ms, 'ms')})")
    return (f"{_reads_text(f.reads)} {'is' if len(f.reads) == 1 else 'are'} read back to the host after every "
            f"batch: a device sync in the loop (logged with self.log(..., prog_bar=True), Lightning turns it into a "
            f"number with .item(), with or without a progress bar). The host waits there for the device{at}, then "
            f"the device, its queue empty, waits {figure_text(f.idle_ms, 'ms')} a step ({pct_text(f.idle_ms / b.step_ms)} of the "
            f"{figure_text(b.step_ms, 'ms')} step, mean of {b.steps} steps{kern}) while the host prepares the next step: {where}. "
            f"Change: self.log({first!r}, ..., prog_bar=False), or on_step=False (Lightning reduces it at the "
            f"epoch's end), or log it every few steps yourself: the host then runs ahead of the device; saves up to "
            f"{figure_text(f.saving_ms, 'ms')} a step{basis if f.kernel is not None else NO_KERNEL}")


def sync_findings(b: Breakdown, reads: Sequence[str], share: float = LOOP_SHARE,
                  kernel: KernelTime | None = None) -> list[dict[str, Any]]:
    """:func:`sync_text` as a finding the report turns into an opportunity (``{cause, change, saving_s}``)."""
    f = _sync(b, reads, share, kernel)
    if f is None:
        return []
    return [{"cause": f"a device sync in the loop: {_reads_text(f.reads)} read back to the host after every batch "
                      f"(self.log(..., prog_bar=True)); the device then waits {figure_text(f.idle_ms, 'ms')} a step for the host "
                      f"({pct_text(f.idle_ms / b.step_ms)} of the {figure_text(b.step_ms, 'ms')} step)",
             "change": f"self.log({f.reads[0]!r}, ..., prog_bar=False) or on_step=False (reduced at the epoch's end), "
                       f"so the host runs ahead of the device",
             "saving_s": f.saving_ms / 1e3}]


# ---------------------------------------------------------------------------------------------- late ranks
#: what each rank sends at a logging step (:func:`rank_vector`): its step, its parts and its CPU wait, ms a step
RANK_FIELDS = ("step_ms", *(f"{p}_ms" for p in PARTS), "cpu_wait_ms", "steps")


def rank_vector(b: Breakdown | None) -> list[float]:
    """One rank's :data:`RANK_FIELDS` (NaN everywhere without clean steps)."""
    if b is None:
        return [math.nan] * len(RANK_FIELDS)
    parts = dict(b.parts_ms)
    if b.device_sync_ms is not None:  # a GPU: the device's wait is the one the others' lateness makes
        parts["sync"] = b.device_sync_ms
    return [b.step_ms, *(parts[p] for p in PARTS), math.nan if b.cpu_wait_ms is None else b.cpu_wait_ms,
            float(b.steps)]


_KIND = {"fetch": "data", "transfer": "data", "forward": "compute", "backward": "compute", "optimizer": "compute",
         "hooks": "host", "logging": "host", "checkpoint": "host", "other": "host", "tscope": "host"}


@dataclass(frozen=True)
class LateRank:
    """The rank the others wait for: ``rank``, ``cost_ms`` (how much longer every other rank waits for it, a step:
    the median over the others of their sync wait less its own), the part it is slow in (``part``, ``kind``: data,
    compute or host, and ``excess_ms``: its part less the others' median), each rank's step and sync wait (ms a
    step), and whether it is a finding (``cost_ms`` at least :data:`LATE_SHARE` of the step and
    :data:`LATE_MIN_MS`)."""

    rank: int
    cost_ms: float
    part: str
    kind: str
    excess_ms: float
    step_ms: tuple[float, ...]
    sync_ms: tuple[float, ...]
    finding: bool

    @property
    def text(self) -> str:
        others = statistics.median(s for r, s in enumerate(self.step_ms) if r != self.rank)
        return (f"rank {self.rank} is late: every other rank waits {figure_text(self.cost_ms, 'ms')} a step for it "
                f"({pct_text(self.cost_ms / others)} of the {figure_text(others, 'ms')} step); it is slow in its {self.kind} "
                f"({PART_TEXT[self.part]} {self.excess_ms:+.3g} ms a step against the other ranks' median)")


def late_rank(rows: Sequence[Sequence[float]], share: float = LATE_SHARE, min_ms: float = LATE_MIN_MS) -> LateRank | None:
    """The late rank from each rank's :func:`rank_vector` (one row per rank), None with fewer than 2 ranks with
    figures. The late rank waits least (it arrives last at every collective); its cost is the median over the
    others of (their sync wait - its sync wait); the part it is slow in is its own-work part (not sync) that most
    exceeds the other ranks' median."""
    idx = {f: i for i, f in enumerate(RANK_FIELDS)}
    ok = [r for r, row in enumerate(rows) if len(row) == len(RANK_FIELDS) and not math.isnan(row[idx["step_ms"]])]
    if len(ok) < 2:
        return None
    sync = {r: rows[r][idx["sync_ms"]] for r in ok}
    late = min(ok, key=lambda r: (sync[r], r))
    others = [r for r in ok if r != late]
    cost = statistics.median(sync[r] - sync[late] for r in others)
    best, excess = "other", -math.inf
    for p in PARTS:
        if p == "sync":
            continue
        d = rows[late][idx[f"{p}_ms"]] - statistics.median(rows[r][idx[f"{p}_ms"]] for r in others)
        if d > excess:
            best, excess = p, d
    step = statistics.median(rows[r][idx["step_ms"]] for r in others)
    nan = lambda v: v if not math.isnan(v) else 0.0  # noqa: E731
    return LateRank(late, cost, best, _KIND[best], excess,
                    tuple(nan(row[idx["step_ms"]]) for row in rows), tuple(nan(row[idx["sync_ms"]]) for row in rows),
                    cost >= max(share * step, min_ms))
