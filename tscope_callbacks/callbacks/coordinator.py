"""One :class:`Coordinator` per trainer: what the tscope callbacks of that trainer share, and nothing shared beyond it.

Several tscope callbacks due at the same step share one capture (only one dispatch mode can run): the first one
whose hook runs starts it with the union of the options and hands the result to each of them (:class:`Capture`).
The coordinator holds that running capture, the trainer's sink group, the clocks told when a step holds tscope's own
work, the full captures later steps are replayed from, and the NaN guard the other callbacks read the gradient
spikes of. A callback reaches its trainer's coordinator with ``self.coordinator(trainer)``
(:meth:`~tscope_callbacks.callbacks.guarded.GuardedCallback.coordinator`); it is found through the trainer's own
callbacks, so two trainers in one process -- one after the other or one inside the other's fit -- never see each
other's captures, sinks, clocks, replay sources or spikes. Nothing here is module-level state.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tscope_callbacks.callbacks.sink_setup import build_sinks
from tscope_callbacks.callbacks.sinks import NULL_SINK, Sink
from tscope_callbacks.records import ProfileReason, StepProfile

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from tscope_callbacks.capture.profile import Profile

__all__ = ["Coordinator", "Capture", "CaptureMember", "Clock", "GradSpikes", "coordinator_of"]

log = logging.getLogger("tscope_callbacks")


class Clock(Protocol):
    """A step clock told when the running interval holds non-training work (a profile, a report, timed layers)."""

    def mark_dirty(self) -> None: ...


class GradSpikes(Protocol):
    """What the other callbacks read of the NaN guard (``NaNGuardCallback`` registers itself at fit start):
    its gradient-norm spikes, oldest first (dicts: step, norm, median, ratio, layer, loss, learning rate)."""

    spikes: list[dict[str, Any]]


class CaptureMember(Protocol):
    """A callback sharing a capture: it gets the records (``ProfilingCallback._on_profile``) and reports its own
    errors."""

    faults: Any

    def _on_profile(self, trainer: Any, pl_module: Any, result: StepProfile, ctx: Any) -> None: ...


class Capture:
    """One capture shared by the callbacks due at the same step."""

    def __init__(self, coordinator: Coordinator, trainer: pl.Trainer, stage: str, step: int,
                 members: Sequence[CaptureMember], profile: Profile | None, signature: tuple, reason: ProfileReason,
                 scheduled: bool, key: tuple = ()) -> None:
        self.coordinator, self.stage, self.step, self.members = coordinator, stage, step, list(members)
        self.key = key  #: what a replay of this capture must share with it (stage, batch shapes, options)
        self.profile, self.signature, self.reason, self.scheduled = profile, signature, reason, scheduled
        self.global_step = trainer.global_step
        self.epoch = trainer.current_epoch
        self.micro_batches = 0
        self.inputs: list[list] = []  #: [shape, dtype] of the first batch's tensors (``context.signature_inputs``)
        self._last_batch: int | None = None  #: batch_idx last counted (each member's batch-end hook sees it)
        self.paused = False
        self._handles: list[Any] = []
        if profile is not None and stage == "train":
            for opt in trainer.optimizers:
                if hasattr(opt, "register_step_post_hook"):
                    self._handles.append(opt.register_step_post_hook(self._after_optimizer_step))

    def _after_optimizer_step(self, *_: Any) -> None:  # inside the user's optimizer.step(): never raises
        if self.profile is not None:
            try:
                self.profile.set_phase(None)
            except Exception as e:
                self.profile.faults.report("the optimizer step post-hook", e)

    def count_batch(self, batch_idx: int) -> None:
        """Count the micro-batch ``batch_idx`` once, however many member callbacks report its end."""
        if batch_idx != self._last_batch:
            self._last_batch = batch_idx
            self.micro_batches += 1

    def pause(self, paused: bool) -> None:
        """Pause the capture while another stage runs inside the window (validation during accumulation)."""
        if self.profile is not None and paused != self.paused:
            self.paused = paused
            (self.profile.pause if paused else self.profile.resume)()

    def mark_optimizer(self) -> None:
        """From ``on_before_optimizer_step`` (gradient clipping and the update) until the step's post-hook."""
        if self.profile is not None:
            self.profile.set_phase("optimizer")

    def stop(self) -> StepProfile | None:
        """Stop capturing and remove every hook (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.coordinator.dirty_clocks()
        if self.profile is None:
            return None
        prof, self.profile = self.profile, None
        return prof.stop()


class Coordinator:
    """What the tscope callbacks of one trainer share (module docstring). Made by the first of them that needs it
    (:func:`coordinator_of`); :meth:`close` at teardown stops a capture left running and forgets the rest."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self._trainer = weakref.ref(trainer)
        self.running: Capture | None = None  #: the capture running now (None: none)
        #: the NaN guard of this trainer (``NaNGuardCallback`` registers itself at fit start), or None
        self.guard: GradSpikes | None = None
        self._sinks: dict[bool, Sink] = {}
        self._clocks: list[Clock] = []
        #: capture key -> the full CUDA capture later steps of that key are replayed from (None: replay failed for
        #: that key once; every later profile of it is a full capture)
        self._sources: dict[tuple, Profile | None] = {}

    def serves(self, trainer: pl.Trainer) -> bool:
        return self._trainer() is trainer

    # ------------------------------------------------------------------ the running capture
    def take(self) -> Capture | None:
        """The running capture, no longer running (its owner stops it)."""
        c, self.running = self.running, None
        return c

    def abort(self) -> None:
        """Stop the running capture, if any (exceptions, teardown)."""
        c = self.take()
        if c is not None:
            try:
                c.stop()
            except Exception as e:  # pragma: no cover - stop() removes hooks in a finally
                log.warning("tscope: error while stopping a profile: %s", e)

    # ------------------------------------------------------------------ outputs and clocks
    def sinks(self, trainer: pl.Trainer, raise_errors: bool) -> Sink:
        """The trainer's sink group, shared by its tscope callbacks (a failure is warned once). Ranks other than
        zero, and ``fast_dev_run`` (which, like Lightning's loggers and checkpoints, writes nothing), get a
        do-nothing sink."""
        if not trainer.is_global_zero or trainer.fast_dev_run:
            return NULL_SINK
        if raise_errors not in self._sinks:
            self._sinks[raise_errors] = build_sinks(trainer, raise_errors=raise_errors)
        return self._sinks[raise_errors]

    def register_clock(self, clock: Clock) -> None:
        """A clock told (``mark_dirty()``) when the running interval holds non-training work."""
        if clock not in self._clocks:
            self._clocks.append(clock)

    def dirty_clocks(self) -> None:
        for c in self._clocks:
            c.mark_dirty()

    # ------------------------------------------------------------------ the NaN guard
    def grad_spikes(self, up_to_step: int) -> tuple[dict[str, Any], ...]:
        """The NaN guard's gradient spikes up to ``up_to_step`` (for a report and the dashboard); () without one."""
        spikes = self.guard.spikes if self.guard is not None else ()
        return tuple(dict(x) for x in spikes
                     if isinstance(x, dict) and isinstance(x.get("step"), int) and x["step"] <= up_to_step)

    # ------------------------------------------------------------------ replay sources
    def replay_source(self, key: tuple) -> Profile | None:
        """The full capture a step of ``key`` can be replayed from (``capture.replay``), or None."""
        return self._sources.get(key)

    def after_capture(self, key: tuple, prof: Profile | None, result: StepProfile | None) -> None:
        """Keep a full capture with CUDA kernel records as the replay source of its key; a replay whose kernels did
        not match its source ends replays of that key (said once in the log)."""
        if prof is None or result is None or not key:
            return
        rep = result.info.replay
        if rep is not None:
            if rep.get("status") != "matched":
                self._sources[key] = None
                log.warning("tscope: a replayed step's kernels did not match its full capture (%s); later profiles of "
                            "these batch shapes are full captures", rep.get("note", ""))
            return
        from tscope_callbacks.capture.replay import can_replay

        if key not in self._sources and can_replay(prof):
            self._sources[key] = prof

    def replay_sources(self) -> list[Profile]:
        """The full captures kept as replay sources."""
        return [p for p in self._sources.values() if p is not None]

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Teardown: stop a capture left running, forget the sinks, clocks, replay sources and the guard (a later
        ``fit``/``validate`` of the same trainer registers them again)."""
        self.abort()
        self._sinks.clear()
        self._clocks.clear()
        self._sources.clear()
        self.guard = None


def coordinator_of(trainer: pl.Trainer) -> Coordinator:
    """The coordinator of ``trainer``'s tscope callbacks: the one one of them already holds, else a new one."""
    found = find_coordinator(trainer)
    return found if found is not None else Coordinator(trainer)


def find_coordinator(trainer: pl.Trainer) -> Coordinator | None:
    """The coordinator one of ``trainer``'s callbacks holds for it, or None."""
    for cb in getattr(trainer, "callbacks", ()):
        c = getattr(cb, "_coordinator", None)
        if isinstance(c, Coordinator) and c.serves(trainer):
            return c
    return None
