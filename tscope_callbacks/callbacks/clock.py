"""Step timing without a host sync: when the real (unprofiled) steps take, for MFU and for the reports' step time.

On CUDA a timestamp is a ``torch.cuda.Event`` recorded on the current stream; it is read (``elapsed_time``) only
once ``query()`` says the GPU has passed it, never by waiting, so the CPU keeps running ahead of the device. On CPU
it is the host clock (``hostclock.host_time``: ``time.perf_counter`` unless a test scripted it).

Two uses:

- :meth:`StepClock.tick` at the start of each optimizer step in the few steps before a scheduled profile; the
  report of the profile then uses the median duration of those unprofiled steps (intervals that contained a
  profile, validation or an epoch boundary are marked dirty and left out). Warm-up steps are never a basis: the
  clock counts steps from the moment they settle (:data:`SETTLE_STEPS` clean steps in a row, each within
  :data:`SETTLE_TOL` of their median), and the first profile waits for it (:meth:`StepClock.basis`).
- :class:`WindowTimer` at logging steps only: one timestamp per window of ``log_every_n_steps`` steps; a window is
  read one window later (by then its events are long complete), so the automatic MFU costs no sync either.
- :class:`DeviceClock` at every step on a GPU (the step monitor): an event at each step's start and end; the
  device's busy and idle time are read once the end event has completed (``query()``), never by waiting. The
  step's host parts are the monitor's probe's (``callbacks.loop_probe``).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from tscope_callbacks.devices.calibrate import CpuSnapshot, cpu_snapshot, host_environment
from tscope_callbacks.hostclock import host_time

__all__ = ["Stamp", "StepClock", "StepBasis", "WindowTimer", "PendingWindow", "DeviceClock", "SETTLE_STEPS", "SETTLE_TOL",
           "MIN_BASIS_STEPS"]

#: clean unprofiled steps in a row whose durations must agree before any is a step-time basis (warm-up is over)
SETTLE_STEPS = 5
#: ... agree: each is within this share of their median (slow warm-up steps followed by fast ones never agree)
SETTLE_TOL = 0.25
#: fewest unprofiled steps behind a basis
MIN_BASIS_STEPS = 3


class Stamp:
    """One timestamp: a recorded CUDA event, or a host time on CPU."""

    __slots__ = ("event", "t")

    def __init__(self, cuda: bool) -> None:
        if cuda:
            self.event: Any = torch.cuda.Event(enable_timing=True)
            self.event.record()
            self.t = None
        else:
            self.event = None
            self.t = host_time()

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def seconds_since(self, earlier: Stamp) -> float:
        """Seconds from ``earlier`` to this stamp (both must be ``ready``)."""
        if self.event is not None:
            return earlier.event.elapsed_time(self.event) / 1e3
        return self.t - earlier.t  # type: ignore[operator]


@dataclass(frozen=True)
class StepBasis:
    """The step time behind a profile's MFU: the median of ``n`` clean unprofiled steps ``first``..``last`` (their
    own durations in ``times_s``), whether they are past warm-up (``settled``), and the host load over them."""

    median_s: float
    n: int
    first: int
    last: int
    settled: bool
    times_s: tuple[float, ...]
    since: CpuSnapshot | None = None
    steps: tuple[int, ...] = ()  #: the steps (each timed from its start to the next one's)  #: CPU counters at the start of the first step (``host_environment``)

    @property
    def spread_s(self) -> float:
        """Median absolute deviation of the steps (their typical distance from the median)."""
        return statistics.median(abs(t - self.median_s) for t in self.times_s)


def _settled(times: list[float]) -> bool:
    med = statistics.median(times)
    return med > 0 and all(abs(t - med) <= SETTLE_TOL * med for t in times)


class StepClock:
    """Durations of recent unprofiled steps. ``tick(step)`` at each step start (only where needed: see module doc),
    ``mark_dirty()`` when the running interval holds non-training work."""

    def __init__(self, cuda: bool, keep: int = 32) -> None:
        self.cuda = cuda
        #: (step, stamp, interval dirty, CPU counters)
        self._stamps: deque[tuple[int, Stamp, bool, CpuSnapshot | None]] = deque(maxlen=keep + 1)
        self._dirty = True  #: the interval ending at the next tick (the first one always: warm-up, data loading)
        self.settled_from: int | None = None  #: first step of the first run of SETTLE_STEPS steps that agreed

    def tick(self, step: int) -> None:
        self._stamps.append((step, Stamp(self.cuda), self._dirty, cpu_snapshot()))
        self._dirty = False

    def mark_dirty(self) -> None:
        self._dirty = True

    def _intervals(self) -> list[tuple[int, float, CpuSnapshot | None]]:
        """(start step, seconds, CPU counters at its start) of the clean one-step intervals the device has passed."""
        out = []
        stamps = list(self._stamps)
        for (s0, a, _, snap), (s1, b, dirty, _) in zip(stamps, stamps[1:]):
            if dirty or s1 != s0 + 1 or not b.ready():
                continue
            out.append((s0, b.seconds_since(a), snap))
        return out

    def step_times(self, n: int = 16) -> list[float]:
        """Seconds of the last ``n`` clean one-step intervals whose end the device has passed (no waiting)."""
        return [t for _, t, _ in self._intervals()][-n:]

    def settle(self) -> bool:
        """Whether the step time has settled (warm-up over): once SETTLE_STEPS clean steps in a row agreed, it has
        for good, and only steps from there on are a basis."""
        if self.settled_from is None:
            iv = self._intervals()
            for i in range(len(iv) - SETTLE_STEPS + 1):
                run = iv[i:i + SETTLE_STEPS]
                if run[-1][0] - run[0][0] == SETTLE_STEPS - 1 and _settled([t for _, t, _ in run]):
                    self.settled_from = run[0][0]
                    break
        return self.settled_from is not None

    def basis(self, n: int = 16, minimum: int = MIN_BASIS_STEPS) -> StepBasis | None:
        """The median of the last ``n`` clean steps past warm-up (before settling: the clean steps after the first
        two), None when fewer than ``minimum`` are known."""
        settled = self.settle()
        iv = self._intervals()
        if settled:
            iv = [x for x in iv if x[0] >= self.settled_from]  # type: ignore[operator]
        elif iv:
            first = self._stamps[0][0]
            iv = [x for x in iv if x[0] >= first + 2] or iv
        iv = iv[-n:]
        if len(iv) < minimum:
            return None
        times = tuple(t for _, t, _ in iv)
        return StepBasis(statistics.median(times), len(times), iv[0][0], iv[-1][0], settled, times, iv[0][2],
                         tuple(x[0] for x in iv))

    def labels(self, n: int = 16) -> dict[str, Any]:
        """A profile's step-time labels (``step_time_*``: the basis, its steps, spread, warm-up) and the host's load
        over those steps (``host_*``, ``torch_threads``: ``devices.calibrate.host_environment``)."""
        b = self.basis(n)
        if b is None:
            return host_environment(None)
        return {"step_time_s": b.median_s, "step_time_basis": "unprofiled-median", "step_time_steps": b.n,
                "step_time_clock": "CUDA events" if self.cuda else "wall clock",
                "step_time_window": [b.first, b.last], "step_time_spread_s": b.spread_s,
                "step_time_settled": b.settled, "step_time_samples_s": list(b.times_s),
                "step_time_sample_steps": list(b.steps), **host_environment(b.since)}

    def median_step_s(self, n: int = 16, minimum: int = MIN_BASIS_STEPS) -> tuple[float | None, int]:
        """(median of the recent clean step times past warm-up, how many) -- None when fewer than ``minimum``."""
        b = self.basis(n, minimum)
        return (None, len(self.step_times(n))) if b is None else (b.median_s, b.n)


@dataclass
class PendingWindow:
    start_step: int
    start: Stamp
    flops: float = 0.0
    steps: int = 0
    samples: int = 0
    tokens: int = 0
    dirty: bool = False
    end_step: int = -1
    end: Stamp | None = field(default=None)


class WindowTimer:
    """Windows between logging steps, read late (see module doc)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.current: PendingWindow | None = None
        self.closed: list[PendingWindow] = []

    def boundary(self, step: int) -> None:
        """Close the running window (if any) and start the next one, at the start of optimizer step ``step``."""
        stamp = Stamp(self.cuda)
        if self.current is not None:
            self.current.end, self.current.end_step = stamp, step
            self.closed.append(self.current)
        self.current = PendingWindow(step, stamp)

    def add(self, flops: float) -> None:
        """One optimizer step of ``flops`` model FLOPs in the running window."""
        if self.current is not None:
            self.current.flops += flops
            self.current.steps += 1

    def add_samples(self, samples: int, tokens: int = 0) -> None:
        """One micro-batch of ``samples`` (and ``tokens``) in the running window."""
        if self.current is not None:
            self.current.samples += samples
            self.current.tokens += tokens

    def mark_dirty(self) -> None:
        if self.current is not None:
            self.current.dirty = True

    def restart(self) -> None:
        """Drop the running window (its steps are not all comparable: e.g. a new epoch or after validation)."""
        self.current = None

    def ready(self, wait: bool = False) -> list[tuple[PendingWindow, float]]:
        """(window, seconds) of closed clean windows the device has finished; ``wait`` forces it (end of training)."""
        done, keep = [], []
        for w in self.closed:
            if wait:
                w.end.wait()  # type: ignore[union-attr]
            if w.end is not None and w.end.ready():
                if not w.dirty and w.steps:
                    done.append((w, w.end.seconds_since(w.start)))
            else:
                keep.append(w)
        self.closed = keep
        return done


class DeviceClock:
    """The device's side of every step on a GPU, without a host sync: :meth:`begin` at a step's first batch start
    and :meth:`end` at its last batch end record a CUDA event each (reused: none is created per step);
    :meth:`ready` hands out ``(step, busy s, span s, idle s, first)`` of the steps whose end event the GPU has
    passed (``query()``, never waiting): busy from the step's start to its end on the stream, span from the
    previous step's end to this one's (the device's step), idle = span - busy (the stream waited for the host);
    ``first``: no previous end (no span)."""

    def __init__(self, keep: int = 64) -> None:
        self._e0: Any = None  #: the running step's start event
        self._step = -1
        self._prev: Any = None  #: the previous step's end event
        #: (step, start event, end event, previous end event) of steps not yet read
        self._pending: deque[tuple[int, Any, Any, Any]] = deque(maxlen=keep)
        self._free: list[Any] = []  #: events read and done with

    def _event(self) -> Any:
        e = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def begin(self, step: int) -> None:
        self._e0, self._step = self._event(), step

    def end(self) -> None:
        if self._e0 is None:
            return
        e1 = self._event()
        self._pending.append((self._step, self._e0, e1, self._prev))
        self._prev, self._e0 = e1, None

    def ready(self) -> list[tuple[int, float, float, float, bool]]:
        out = []
        while self._pending:
            step, e0, e1, prev = self._pending[0]
            if not e1.query():
                break
            self._pending.popleft()
            busy = e0.elapsed_time(e1) / 1e3
            span = prev.elapsed_time(e1) / 1e3 if prev is not None else busy
            out.append((step, busy, span, max(span - busy, 0.0), prev is None))
            self._free += [e0] if prev is None else [e0, prev]  # this step was the last to need them
        return out
