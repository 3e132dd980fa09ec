"""Step timing without a host sync: when the real (unprofiled) steps take, for MFU and for the reports' step time.

On CUDA a timestamp is a ``torch.cuda.Event`` recorded on the current stream; it is read (``elapsed_time``) only
once ``query()`` says the GPU has passed it, never by waiting, so the CPU keeps running ahead of the device. On CPU
it is ``time.perf_counter()``.

Two uses:

- :meth:`StepClock.tick` at the start of each optimizer step in the few steps before a scheduled profile; the
  report of the profile then uses the median duration of those unprofiled steps (intervals that contained a
  profile, validation or an epoch boundary are marked dirty and left out).
- :class:`WindowTimer` at logging steps only: one timestamp per window of ``log_every_n_steps`` steps; a window is
  read one window later (by then its events are long complete), so the automatic MFU costs no sync either.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Stamp", "StepClock", "WindowTimer", "PendingWindow"]


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
            self.t = time.perf_counter()

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


class StepClock:
    """Durations of recent unprofiled steps. ``tick(step)`` at each step start (only where needed: see module doc),
    ``mark_dirty()`` when the running interval holds non-training work."""

    def __init__(self, cuda: bool, keep: int = 32) -> None:
        self.cuda = cuda
        self._stamps: deque[tuple[int, Stamp, bool]] = deque(maxlen=keep + 1)  #: (step, stamp, interval dirty)
        self._dirty = True  #: the interval ending at the next tick (the first one always: warm-up, data loading)

    def tick(self, step: int) -> None:
        self._stamps.append((step, Stamp(self.cuda), self._dirty))
        self._dirty = False

    def mark_dirty(self) -> None:
        self._dirty = True

    def step_times(self, n: int = 16) -> list[float]:
        """Seconds of the last ``n`` clean one-step intervals whose end the device has passed (no waiting)."""
        out: list[float] = []
        stamps = list(self._stamps)
        for (s0, a, _), (s1, b, dirty) in zip(stamps, stamps[1:]):
            if dirty or s1 != s0 + 1 or not b.ready():
                continue
            out.append(b.seconds_since(a))
        return out[-n:]

    def median_step_s(self, n: int = 16, minimum: int = 3) -> tuple[float | None, int]:
        """(median of the recent clean step times, how many) -- None when fewer than ``minimum`` are known."""
        times = self.step_times(n)
        if len(times) < minimum:
            return None, len(times)
        return statistics.median(times), len(times)


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
