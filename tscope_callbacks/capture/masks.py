"""Explicit attention masks of a captured region: the model FLOPs of a masked call count the pairs its mask lets
through (``formulas.attention``). The count is taken on the device when the call runs (no host sync; tscope's own
kernel, not recorded) because the mask's memory may hold other data by the end of the step (Inductor reuses a dead
buffer in place), once per mask (a model passes the same mask to every layer), and read once at stop. On meta,
the count comes from the mask's CPU twin when the run knows its values (``capture.meta_values``: masks a model
builds from constants), so an estimate counts the pairs the real step does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from tscope_callbacks.capture.meta_values import value_of
from tscope_callbacks.formulas.attention import kept_share, mask_argument, mask_kept, masked_counts

__all__ = ["MaskCounts"]


class MaskCounts:
    """Per pending op index, the kept-pair count of its explicit mask."""

    def __init__(self) -> None:
        self.calls: dict[int, tuple[Any, int]] = {}  #: pending index -> (kept count on the device, mask entries)
        self._kept: dict[tuple, tuple[Any, Any]] = {}  #: mask identity -> (mask, its kept count)

    def add(self, index: int, func: Any, args: tuple, kwargs: dict | None, mute: Callable[[], Any]) -> None:
        """Note the mask of attention call ``index`` (``func(*args, **kwargs)``), if it has one."""
        mask = mask_argument(getattr(func, "_opname", ""), args, kwargs)
        if mask is not None:
            self.calls[index] = (self._count(mask, mute), mask.numel())

    def _count(self, mask: torch.Tensor, mute: Callable[[], Any]) -> Any:
        try:
            key = (id(mask), mask._version, mask.storage_offset(), tuple(mask.shape))
        except (RuntimeError, NotImplementedError):  # inference tensors have no version counter
            key = (id(mask), -1, mask.storage_offset(), tuple(mask.shape))
        hit = self._kept.get(key)
        if hit is not None and hit[0] is mask:
            return hit[1]
        with mute():
            # on meta: the mask's CPU twin, where the run knows its values (``capture.meta_values``)
            kept = mask_kept(value_of(mask) if mask.device.type == "meta" else mask)
        self._kept[key] = (mask, kept)  # the mask is held so that its id is not reused within the region
        return kept

    def apply(self, pending: list[tuple]) -> None:
        """Scale the model FLOPs of every masked call in ``pending`` (``(func, count, layer, phase, dt)`` tuples) to
        the pairs its mask let through; the full square stays the dense count. Reads each mask's count once."""
        shares: dict[int, float | None] = {}
        for i, (kept, numel) in self.calls.items():
            if id(kept) not in shares:
                shares[id(kept)] = kept_share(kept, numel)
            f, c, layer, phase, dt = pending[i]
            model, dense = masked_counts(c.flops if c.flops_model is None else c.flops_model, c.flops_dense,
                                         shares[id(kept)])
            pending[i] = (f, replace(c, flops_model=model, flops_dense=dense), layer, phase, dt)

    def clear(self) -> None:
        self.calls.clear()
        self._kept.clear()
