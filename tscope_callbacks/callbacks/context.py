"""What the tscope callbacks hand each other with a profiled step, and the stateless helpers they share: a batch's
signature and counts, the all-gathers. No state lives here: a trainer's shared state is its
:class:`~tscope_callbacks.callbacks.coordinator.Coordinator`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tscope_callbacks.analysis.model_summary import batch_counts
from tscope_callbacks.records import ProfileReason

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["ProfileContext", "batch_signature", "signature_inputs", "batch_size", "gather_floats", "gather_objects"]


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
    reason: ProfileReason = ProfileReason.SCHEDULE  #: why the step was profiled

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
