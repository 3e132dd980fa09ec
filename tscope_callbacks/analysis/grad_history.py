"""Gradient norms over the run, per layer, and what they said before a divergence (the NaN guard's history).

The NaN guard already reduces every gradient to its L2 norm on the device at each checked step (one fused
``_foreach_norm``) and brings that vector to the host without a sync. :class:`GradHistory` keeps those norms:

- the **global norm** of a step: ``sqrt(sum of squared per-tensor norms)`` (what ``clip_grad_norm_`` computes);
- **per layer**: the same over the parameters a module owns directly (``"transformer.h.0.attn.c_attn"`` for
  ``"transformer.h.0.attn.c_attn.weight"`` and ``.bias``);
- a **spike**: a healthy step whose global norm exceeds ``spike_factor`` x the median of the previous checked steps
  (``window`` of them, at least ``min_steps``), with the layer that grew most against its own median;
- the **trend** before a non-finite step: how the global norm moved over the window, the first step that crossed
  ``spike_factor`` x the median before it, and the layer that grew most -- where a divergence usually starts, steps
  before the first NaN.

Norms of sharded parameters (FSDP2/TP DTensors) are this rank's local shards.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = ["GradHistory", "layer_norms", "layer_sums", "global_norm", "owner"]


def global_norm(norms: Sequence[float]) -> float:
    """L2 norm of all gradients together from their per-tensor L2 norms."""
    return math.sqrt(sum(n * n for n in norms))


def owner(name: str) -> str:
    """The module owning a parameter: its name without the last part ("" for the root's own)."""
    return name.rpartition(".")[0]


def layer_sums(names: Sequence[str], values: Sequence[float]) -> dict[str, float]:
    """Per owning module (:func:`owner`), the sum of its parameters' values."""
    out: dict[str, float] = {}
    for name, v in zip(names, values):
        layer = owner(name)
        out[layer] = out.get(layer, 0.0) + v
    return out


def layer_norms(names: Sequence[str], norms: Sequence[float]) -> dict[str, float]:
    """Per owning module (:func:`owner`), the L2 norm of its gradients."""
    return {k: math.sqrt(v) for k, v in layer_sums(names, [n * n for n in norms]).items()}


class GradHistory:
    """The last ``window`` healthy checked steps' gradient norms (see the module doc)."""

    def __init__(self, window: int = 64, spike_factor: float | None = 10.0, min_steps: int = 10) -> None:
        self.spike_factor, self.min_steps = spike_factor, min_steps
        self.steps: deque[tuple[int, float, dict[str, float]]] = deque(maxlen=window)  #: (step, global, per layer)

    def add(self, step: int, names: Sequence[str], norms: Sequence[float]) -> dict[str, Any] | None:
        """Record a healthy step; returns its spike (``{"step", "norm", "median", "ratio", "layer",
        "layer_ratio"}``) when its global norm exceeds ``spike_factor`` x the median before it, else None. Steps
        with a non-finite norm are not recorded (they are the NaN guard's events)."""
        total = global_norm(norms)
        if not math.isfinite(total):
            return None
        layers = layer_norms(names, norms)
        spike = self._spike(step, total, layers)
        self.steps.append((step, total, layers))
        return spike

    def _spike(self, step: int, total: float, layers: dict[str, float]) -> dict[str, Any] | None:
        if self.spike_factor is None or len(self.steps) < self.min_steps:
            return None
        med = statistics.median(t for _, t, _ in self.steps)
        if med <= 0 or total <= self.spike_factor * med:
            return None
        layer, lratio = self._grew_most(layers)
        return {"step": step, "norm": total, "median": med, "ratio": total / med, "layer": layer,
                "layer_ratio": lratio}

    def _grew_most(self, layers: dict[str, float], before: int | None = None) -> tuple[str | None, float | None]:
        """The layer whose norm in ``layers`` is largest against its median over the history (steps before
        ``before`` only, when given)."""
        hist = [ls for s, _, ls in self.steps if before is None or s < before]
        best, best_r = None, None
        for name, v in layers.items():
            past = [ls[name] for ls in hist if name in ls]
            if not past:
                continue
            med = statistics.median(past)
            r = v / med if med > 0 else (math.inf if v > 0 else 1.0)
            if best_r is None or r > best_r:
                best, best_r = name, r
        return best, best_r

    def trend(self) -> str:
        """What the recorded steps say before a non-finite step (empty without history): the global norm's median
        and its last value, the first step above ``spike_factor`` x the median of the steps before it, and the layer
        whose norm grew most at the last step against its own median."""
        if not self.steps:
            return ""
        totals = [t for _, t, _ in self.steps]
        med = statistics.median(totals)
        last_step, last, last_layers = self.steps[-1]
        parts = [f"Gradient norm over the last {len(totals)} checked step(s): median {med:.4g}, "
                 f"{last:.4g} at step {last_step} ({last / med:.3g}x the median)." if med > 0 else
                 f"Gradient norm over the last {len(totals)} checked step(s): all 0."]
        factor = self.spike_factor
        if factor is not None:
            for i in range(1, len(self.steps)):
                before = statistics.median(totals[:i])
                if before > 0 and totals[i] > factor * before:
                    parts.append(f"It first exceeded {factor:g}x the median of the steps before at step "
                                 f"{self.steps[i][0]} ({totals[i]:.4g} vs {before:.4g}).")
                    break
        layer, r = self._grew_most(last_layers, before=last_step)
        if layer is not None and r is not None and r > 1.5:
            parts.append(f"Layer whose gradient grew most by step {last_step}: '{layer or '<root>'}' "
                         f"({last_layers[layer]:.4g}, {r:.3g}x its median): look there first.")
        return " ".join(parts)
