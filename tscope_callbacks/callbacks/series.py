"""When RooflineCallback's profiles happen and how many steps each one is: the first profile's wait for warmed-up
unprofiled steps (:class:`FirstProfileWait`) and the k consecutive profiled steps merged into one report
(:class:`ProfileSeries`, ``analysis.noise.merge_steps``). Pure bookkeeping: no Lightning, no capture."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tscope_callbacks.records import StepProfile

if TYPE_CHECKING:
    from tscope_callbacks.callbacks.clock import StepClock
    from tscope_callbacks.callbacks.context import ProfileContext
    from tscope_callbacks.capture.faults import Faults

    Profiled = tuple[StepProfile, ProfileContext]  #: a step's records and the context they were captured in

__all__ = ["ProfileSeries", "FirstProfileWait", "MAX_DEFER_STEPS", "AFTER_STEPS"]

#: the first profile waits at most this many steps for the step time to settle (warm-up), then goes ahead
MAX_DEFER_STEPS = 16
#: unprofiled steps timed after a series before its report is made, so its basis is the steps around it
AFTER_STEPS = 5
log = logging.getLogger("tscope_callbacks")


class ProfileSeries:
    """The profiles of a running series of ``k`` consecutive steps (``next``: the step it profiles next)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.items: list[Profiled] = []
        self.next: int | None = None
        #: a merged series waiting for the unprofiled steps after it (``AFTER_STEPS``), and the step it waits for
        self.pending: Profiled | None = None
        self.pending_until: int | None = None
        self.last_step = -1  #: the last step of the series ``take`` ended

    def hold(self, merged: Profiled, last_step: int) -> None:
        """Keep ``merged`` until AFTER_STEPS unprofiled steps after its last profiled step ``last_step`` are timed."""
        self.pending, self.pending_until = merged, last_step + 1 + AFTER_STEPS

    def release(self, step: int | None = None, *, now: bool = False) -> Profiled | None:
        """The held series when ``step`` reached the step it waits for (or ``now``); it is released."""
        if self.pending is None or not (now or (step is not None and step >= (self.pending_until or 0))):
            return None
        out, self.pending, self.pending_until = self.pending, None, None
        return out

    def begin(self, result: StepProfile, ctx: ProfileContext) -> bool:
        """Start a series with a scheduled profile; False when one step is all it takes (k = 1)."""
        if self.k <= 1:
            return False
        self.items, self.next = [(result, ctx)], ctx.step + 1
        return True

    def add(self, result: StepProfile, ctx: ProfileContext) -> bool:
        """Add the next step's profile; True when the series is complete (or none was running)."""
        if not self.items:
            return True
        self.items.append((result, ctx))
        if len(self.items) < self.k:
            self.next = ctx.step + 1
            return False
        return True

    def take(self, faults: Faults) -> Profiled | None:
        """The merged profile (each op's median time over the steps) with the first step's context; None when no
        series runs. The series ends."""
        items, self.items, self.next = self.items, [], None
        if not items:
            return None
        self.last_step = items[-1][1].step
        from tscope_callbacks.analysis.noise import merge_steps

        try:
            return merge_steps([r for r, _ in items]), items[0][1]
        except Exception as e:
            faults.report("merging the profiled steps", e)
            return items[0]


class FirstProfileWait:
    """The first profile waits until the step clock has settled (warm-up over), at most :data:`MAX_DEFER_STEPS`
    steps and never into the last ``k`` steps of ``max_steps``; ``deferred_from`` is its scheduled step."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.deferred_from: int | None = None

    def waiting(self, step: int) -> bool:
        return self.deferred_from is not None and step > self.deferred_from

    def hold(self, clock: StepClock, step: int, max_steps: int | None, k: int) -> bool:
        """Whether the profile due at ``step`` waits one more step (it says so once it goes ahead)."""
        waited = step - (self.deferred_from if self.deferred_from is not None else step)
        room = max_steps is None or max_steps < 0 or step + k < max_steps
        settled = clock.settle()
        if self.enabled and room and not settled and waited < MAX_DEFER_STEPS:
            if self.deferred_from is None:
                self.deferred_from = step
            return True
        if self.deferred_from is not None:
            log.info("tscope RooflineCallback: the first profile moved from step %d to step %d: %s",
                     self.deferred_from, step, "it waited for warmed-up unprofiled steps (the step-time basis)"
                     if settled else f"the step time did not settle in {waited} steps; the basis is noisy")
        return False

    def labels(self) -> dict[str, Any]:
        return {"deferred_from": self.deferred_from} if self.deferred_from is not None else {}
