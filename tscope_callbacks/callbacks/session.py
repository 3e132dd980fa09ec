"""State shared by the tscope callbacks of one trainer: the running capture, the sinks, the step clocks, and the one
all-gather helper.

Several tscope callbacks due at the same step share one capture (only one dispatch mode can run): the first one
whose hook runs starts it with the union of the options and hands the result to each of them (:class:`Capture`).
"""

from __future__ import annotations

import functools
import logging
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tscope_callbacks.analysis.model_summary import batch_counts
from tscope_callbacks.callbacks.sink_setup import build_sinks
from tscope_callbacks.callbacks.sinks import NULL_SINK, Sink
from tscope_callbacks.records import StepProfile

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from tscope_callbacks.callbacks.base import ProfilingCallback
    from tscope_callbacks.capture.profile import Profile

__all__ = ["ProfileContext", "Capture", "batch_signature", "signature_inputs", "batch_size", "gather_floats", "gather_objects", "running", "set_running", "abort",
           "sinks_for", "forget_trainer", "dirty_clocks", "register_clock", "replay_source", "after_capture"]

log = logging.getLogger("tscope_callbacks")


@dataclass
class ProfileContext:
    """What a callback gets with each profiled step's records."""

    stage: str  #: "train" | "validation" | "test" | "predict"
    step: int  #: optimizer step (train) or batch index (other stages)
    global_step: int  #: ``trainer.global_step`` when the profile started
    epoch: int
    step_times_s: list[float]  #: the step time (the report's basis) on each rank (one entry per rank)
    world_size: int
    is_global_zero: bool
    batch_signature: tuple = ()
    micro_batches: int = 1
    reason: str = "schedule"  #: "schedule" | "recount" (batch shapes changed)

    @property
    def log_step(self) -> int:
        """The step outputs are logged at: the optimizer step for ``train`` and ``validation`` (progress over
        training), the batch index for ``test``/``predict`` (where ``global_step`` does not move)."""
        return self.global_step if self.stage == "validation" else self.step


def batch_signature(batch: Any, _depth: int = 0) -> tuple:
    """A cheap, hashable signature of the tensor shapes (and dtypes) in a batch (tensors, tuples, lists, dicts)."""
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape), batch.dtype)
    if _depth > 3:
        return ()
    if isinstance(batch, (list, tuple)):
        return tuple(batch_signature(b, _depth + 1) for b in batch[:16])
    if isinstance(batch, dict):
        return tuple((k, batch_signature(v, _depth + 1)) for k, v in list(batch.items())[:16])
    return ()


def signature_inputs(sig: tuple) -> list[list]:
    """``[[shape, dtype name], ...]`` of a batch's tensors in batch order, from its :func:`batch_signature` (the
    shape a profile records for a model's inputs when the LightningModule's own forward is never called)."""
    out: list[list] = []

    def walk(s: Any) -> None:
        if len(s) == 2 and isinstance(s[1], torch.dtype):
            out.append([list(s[0]), str(s[1]).removeprefix("torch.")])
        elif len(s) == 2 and isinstance(s[0], str) and isinstance(s[1], tuple):  # a dict entry
            walk(s[1])
        else:
            for x in s:
                if isinstance(x, tuple):
                    walk(x)

    walk(sig)
    return out


@functools.lru_cache(maxsize=64)  # called every micro-batch; a run has few batch shapes
def batch_size(sig: tuple) -> tuple[int, int]:
    """(samples, tokens) of one batch from its :func:`batch_signature` (``model_summary.batch_counts``: the rule the
    profiled step's Model line uses)."""
    return batch_counts(signature_inputs(sig))


def gather_floats(trainer: pl.Trainer, values: list[float], device: Any = None) -> list[list[float]]:
    """One float list per rank (the one all-gather of the callbacks; every rank must call it at the same point).
    A single process returns ``[values]`` without any collective."""
    if trainer.world_size <= 1:
        return [list(values)]
    t = torch.tensor(values, dtype=torch.float64, device=device or trainer.strategy.root_device)
    g = trainer.strategy.all_gather(t)
    return [[float(v) for v in row] for row in g.reshape(trainer.world_size, len(values)).tolist()]


def gather_objects(trainer: pl.Trainer, obj: Any) -> list[Any]:
    """One picklable object per rank (rare paths only: a bad step's analysis); ``[obj]`` on a single process."""
    if trainer.world_size <= 1:
        return [obj]
    out: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


class Capture:
    """One capture shared by the callbacks due at the same step."""

    def __init__(self, trainer: pl.Trainer, stage: str, step: int, members: list[ProfilingCallback],
                 profile: Profile | None, signature: tuple, reason: str, scheduled: bool, key: tuple = ()) -> None:
        self.trainer, self.stage, self.step, self.members = trainer, stage, step, members
        self.key = key  #: what a replay of this capture must share with it (stage, batch shapes, options)
        self.profile, self.signature, self.reason, self.scheduled = profile, signature, reason, scheduled
        self.global_step = trainer.global_step
        self.epoch = trainer.current_epoch
        self.micro_batches = 0
        self.inputs: list[list] = []  #: [shape, dtype] of the first batch's tensors (``signature_inputs``)
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
        dirty_clocks(self.trainer)
        if self.profile is None:
            return None
        prof, self.profile = self.profile, None
        return prof.stop()


_RUNNING: Capture | None = None
#: per trainer: capture key -> the full CUDA capture later steps of that key are replayed from (None: replay failed
#: for that key once; every later profile of it is a full capture)
_SOURCES: weakref.WeakKeyDictionary[Any, dict[tuple, Profile | None]] = weakref.WeakKeyDictionary()
_SINKS: weakref.WeakKeyDictionary[Any, dict[bool, Sink]] = weakref.WeakKeyDictionary()
_CLOCKS: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def running() -> Capture | None:
    return _RUNNING


def set_running(c: Capture | None) -> None:
    global _RUNNING
    _RUNNING = c


def abort() -> None:
    """Stop the running capture, if any (exceptions, teardown, a capture left by another trainer)."""
    c = _RUNNING
    set_running(None)
    if c is not None:
        try:
            c.stop()
        except Exception as e:  # pragma: no cover - stop() removes hooks in a finally
            log.warning("tscope: error while stopping a profile: %s", e)


def sinks_for(trainer: pl.Trainer, raise_errors: bool) -> Sink:
    """The trainer's sink group, shared by its tscope callbacks (a failure is warned once). Ranks other than zero,
    and ``fast_dev_run`` (which, like Lightning's loggers and checkpoints, writes nothing), get a do-nothing sink."""
    if not trainer.is_global_zero or trainer.fast_dev_run:
        return NULL_SINK
    groups = _SINKS.setdefault(trainer, {})
    if raise_errors not in groups:
        groups[raise_errors] = build_sinks(trainer, raise_errors=raise_errors)
    return groups[raise_errors]


def register_clock(trainer: pl.Trainer, clock: Any) -> None:
    """Clocks (anything with ``mark_dirty()``) told when the running interval holds non-training work."""
    clocks = _CLOCKS.setdefault(trainer, [])
    if clock not in clocks:
        clocks.append(clock)


def dirty_clocks(trainer: pl.Trainer) -> None:
    for c in _CLOCKS.get(trainer, ()):
        c.mark_dirty()


def replay_source(trainer: pl.Trainer, key: tuple) -> Profile | None:
    """The full capture a step of ``key`` can be replayed from (``capture.replay``), or None."""
    return _SOURCES.get(trainer, {}).get(key)


def after_capture(trainer: pl.Trainer, key: tuple, prof: Profile | None, result: StepProfile | None) -> None:
    """Keep a full capture with CUDA kernel records as the replay source of its key; a replay whose kernels did
    not match its source ends replays of that key (said once in the log)."""
    if prof is None or result is None or not key:
        return
    sources = _SOURCES.setdefault(trainer, {})
    rep = result.info.replay
    if rep is not None:
        if rep.get("status") != "matched":
            sources[key] = None
            log.warning("tscope: a replayed step's kernels did not match its full capture (%s); later profiles of "
                        "these batch shapes are full captures", rep.get("note", ""))
        return
    from tscope_callbacks.capture.replay import can_replay

    if key not in sources and can_replay(prof):
        sources[key] = prof


def forget_trainer(trainer: pl.Trainer) -> None:
    _SINKS.pop(trainer, None)
    _CLOCKS.pop(trainer, None)
    _SOURCES.pop(trainer, None)
