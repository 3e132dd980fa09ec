"""Gradient norms and losses over the run, per layer, and what they said before a divergence (the NaN guard's
history).

The NaN guard already reduces every gradient to its L2 norm on the device at each checked step (one fused
``_foreach_norm``) and brings that vector to the host without a sync. :class:`GradHistory` keeps those norms:

- the **global norm** of a step: ``sqrt(sum of squared per-tensor norms)`` (what ``clip_grad_norm_`` computes);
- **per layer**: the same over the parameters a module owns directly (``"transformer.h.0.attn.c_attn"`` for
  ``"transformer.h.0.attn.c_attn.weight"`` and ``.bias``);
- the **loss** of each of those steps, read with the norms (no extra sync): the sum over the step's micro-batches
  (Lightning hands each one divided by ``accumulate_grad_batches``, so the sum is their mean), and its **learning
  rate** (the first param group's, a host number);
- a **spike**: a healthy step whose global norm exceeds ``spike_factor`` x the median of the previous checked steps
  (``window`` of them, at least ``min_steps``), with the layer that grew most against its own median;
- the **trend** before a non-finite step: how the global norm and the loss moved over the window, the first step
  that crossed ``spike_factor`` x the median before it, and the layer that grew most -- where a divergence usually
  starts, steps before the first NaN;
- its **onset** (:meth:`GradHistory.onset`): ``"built-up"`` when, at the last checked step before it, the gradient
  norm was at least :data:`BUILT_UP_NORM` x the median of the steps before, or the loss :data:`BUILT_UP_LOSS` x its
  median (an optimization instability: learning rate, warmup, clipping; the sentence says when the learning rate
  rose :data:`LR_ROSE` x or more over the window, as at the end of a warmup); ``"sudden"`` when both were below that
  (one step went wrong: its batch, or a numerical fault in one op); ``""`` when the history cannot tell (fewer than
  :data:`MIN_ONSET_STEPS` steps before the last, or the last checked step is not the one just before the event).

Norms of sharded parameters (FSDP2/TP DTensors) and the loss are this rank's.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tscope_callbacks.capture.paths import owner

__all__ = ["GradHistory", "LayerNorms", "layer_norms", "layer_sums", "global_norm", "owner", "spike_text", "step_loss", "BUILT_UP_NORM",
           "BUILT_UP_LOSS", "MIN_ONSET_STEPS", "LR_ROSE"]

BUILT_UP_NORM = 3.0  #: the last checked step's gradient norm over the median before it, from which it "built up"
BUILT_UP_LOSS = 1.5  #: the same for the loss (compared only over a positive median: a loss may be negative)
MIN_ONSET_STEPS = 5  #: checked steps before the last one that an onset verdict needs (medians of fewer mislead)
LR_ROSE = 1.5  #: the learning rate's rise over the window (last / first) from which a built-up onset names it


def global_norm(norms: Sequence[float]) -> float:
    """L2 norm of all gradients together from their per-tensor L2 norms (``math.hypot``: one C call, and no
    overflow of the squares)."""
    return math.hypot(*norms)


def layer_sums(names: Sequence[str], values: Sequence[float]) -> dict[str, float]:
    """Per owning module (:func:`owner`), the sum of its parameters' values."""
    out: dict[str, float] = {}
    for name, v in zip(names, values):
        layer = owner(name)
        out[layer] = out.get(layer, 0.0) + v
    return out


class LayerNorms(Mapping[str, float]):
    """:func:`layer_norms` of one step, computed on first read: a healthy step is recorded without the per-layer
    work (a spike, the trend, an event and the logged scalars read it; most steps nobody does)."""

    __slots__ = ("_names", "_norms", "_d")

    def __init__(self, names: Sequence[str], norms: Sequence[float]) -> None:
        self._names, self._norms, self._d = names, norms, None

    def _get(self) -> dict[str, float]:
        if self._d is None:
            self._d = layer_norms(self._names, self._norms)
            self._names = self._norms = ()
        return self._d

    def __getitem__(self, key: str) -> float:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())


def layer_norms(names: Sequence[str], norms: Sequence[float]) -> dict[str, float]:
    """Per owning module (:func:`owner`), the L2 norm of its gradients."""
    return {k: math.sqrt(v) for k, v in layer_sums(names, [n * n for n in norms]).items()}


def spike_text(spike: Mapping[str, Any], steps_before: int) -> str:
    """The alert for a gradient spike (:meth:`GradHistory.add`): the norm against the median of the ``steps_before``
    checked steps before it, the layer that grew most, the loss and the learning rate, and what to do."""
    step = spike["step"]
    where = (f"; the layer that grew most: '{spike['layer'] or '<root>'}' ({spike['layer_ratio']:.3g}x its "
             "median)") if spike["layer"] is not None else ""
    if spike.get("loss") is not None:
        where += f"; loss {spike['loss']:.4g}" + (f" (median {spike['loss_median']:.4g})"
                                                  if spike.get("loss_median") is not None else "")
    if spike.get("lr") is not None:
        where += f"; learning rate {spike['lr']:.3g}"
    return (f"NaN guard: gradient spike at step {step}: global norm {spike['norm']:.4g} = {spike['ratio']:.3g}x the "
            f"median of the last {steps_before} checked steps ({spike['median']:.4g}){where}. Training goes on "
            "(values are finite); a lower learning rate, gradient clipping or a look at that layer's inputs often "
            "prevents the divergence that follows.")


def step_loss(values: Sequence[float]) -> float | None:
    """A step's loss from the losses the guard read for it (one per micro-batch, each already divided by
    ``accumulate_grad_batches``: their sum); None when it read none."""
    return float(sum(values)) if len(values) else None


class GradHistory:
    """The last ``window`` healthy checked steps' gradient norms and losses (see the module doc)."""

    def __init__(self, window: int = 64, spike_factor: float | None = 10.0, min_steps: int = 10) -> None:
        self.spike_factor, self.min_steps = spike_factor, min_steps
        self.steps: deque[tuple[int, float, Mapping[str, float]]] = deque(maxlen=window)  #: (step, global, per layer)
        self._totals: deque[float] = deque(maxlen=window)  #: the global norms of ``steps`` (a cheap spike bound)
        self.floor = math.inf  #: the smallest of ``_totals`` (a spike needs a global norm over spike_factor x it)
        self.losses: deque[tuple[int, float]] = deque(maxlen=window)  #: (step, loss) of the steps that had one
        self.lrs: deque[tuple[int, float]] = deque(maxlen=window)  #: (step, learning rate) of the steps that had one

    def add(self, step: int, names: Sequence[str], norms: Sequence[float], loss: float | None = None,
            lr: float | None = None) -> dict[str, Any] | None:
        """Record a healthy step (``loss``: its loss, :func:`step_loss`; ``lr``: its learning rate). Returns its spike
        (``{"step", "norm", "median", "ratio", "layer", "layer_ratio", "loss", "loss_median", "lr"}``) when its
        global norm exceeds ``spike_factor`` x the median before it, else None. Steps with a non-finite norm are not
        recorded (they are the NaN guard's events); a non-finite loss or learning rate is left out."""
        total = math.hypot(*norms)  # global_norm
        if not math.isfinite(total):
            return None
        layers = LayerNorms(names, norms)
        factor = self.spike_factor
        totals = self._totals
        # a cheap bound first: under f x the smallest norm before it is under f x their median (the smallest kept up
        # to date as steps come and go: a full min only when the smallest one leaves the window)
        spike = (self._spike(step, total, layers) if factor is not None and total > factor * self.floor
                 and len(totals) >= self.min_steps else None)
        finite_loss = loss is not None and math.isfinite(loss)
        if spike is not None:
            spike["loss"] = float(loss) if finite_loss else None
            spike["loss_median"] = (statistics.median(v for _, v in self.losses)
                                    if finite_loss and self.losses else None)
            spike["lr"] = lr
        self.steps.append((step, total, layers))
        gone = totals[0] if len(totals) == totals.maxlen else None
        totals.append(total)
        if total <= self.floor:
            self.floor = total
        elif gone is not None and gone <= self.floor:
            self.floor = min(totals)
        if finite_loss:
            self.losses.append((step, float(loss)))
        if lr is not None and math.isfinite(lr):
            self.lrs.append((step, float(lr)))
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

    def onset(self, event_step: int | None = None, every: int = 1) -> tuple[str, str]:
        """How a non-finite step at ``event_step`` came about: (``"built-up"`` | ``"sudden"`` | ``""``, a sentence
        saying why and what to change). Reads the last checked step before it against the medians of the steps
        before that (see the module doc); ``every``: the guard's ``every_n_steps`` (the last checked step must be the
        one just before the event)."""
        if len(self.steps) <= MIN_ONSET_STEPS:
            return "", ""
        last_step, last, _ = self.steps[-1]
        gap = None if event_step is None else event_step - last_step
        if gap is not None and gap > every:
            return "", f"Onset: not known (the last healthy checked step, {last_step}, was {gap} steps before it)."
        med = statistics.median(t for _, t, _ in list(self.steps)[:-1])
        if med <= 0 and last <= 0:
            nr = 1.0  # all zero: steady
        elif med <= 0:
            return "built-up", (f"Onset: built up. The gradient norm rose from 0 (its median over the steps before) to "
                                f"{last:.4g} at step {last_step}, the last checked step before it.")
        else:
            nr = last / med
        lratio = None
        if len(self.losses) > MIN_ONSET_STEPS and self.losses[-1][0] == last_step:
            lmed = statistics.median(v for _, v in list(self.losses)[:-1])
            lratio = self.losses[-1][1] / lmed if lmed > 0 else None
        loss = "" if lratio is None else f" and the loss {lratio:.3g}x"
        if nr >= BUILT_UP_NORM or (lratio is not None and lratio >= BUILT_UP_LOSS):
            rise = self._lr_rise()
            warm = ("" if rise is None else f", while the learning rate rose {rise[2]:.3g}x from {rise[0]:.3g} to "
                    f"{rise[1]:.3g} (a warmup or schedule reaching its peak)")
            return "built-up", (
                f"Onset: built up. By step {last_step}, the last checked step before it, the gradient norm was "
                f"{nr:.3g}x the median of the steps before{loss}{warm}: an optimization instability more than one bad "
                f"batch. Lower the {'peak ' if rise else ''}learning rate or lengthen its warmup, clip gradients "
                f"(Trainer(gradient_clip_val=...) near {2 * med:.3g}, twice the median norm).")
        return "sudden", (
            f"Onset: sudden. At step {last_step}, the last checked step before it, the gradient norm was "
            f"{nr:.3g}x the median of the steps before{loss}: steady, so one step went wrong. Check that step's "
            "batch (extreme or invalid values, an empty or fully masked sequence) and the layer and op this event "
            "names (an overflow in low precision; a log, sqrt or division at 0).")

    def _lr_rise(self) -> tuple[float, float, float] | None:
        """(first, last, last / first) of the learning rate over the window when it rose :data:`LR_ROSE` x or more."""
        if len(self.lrs) < 2 or self.lrs[0][1] <= 0:
            return None
        first, last = self.lrs[0][1], self.lrs[-1][1]
        return (first, last, last / first) if last / first >= LR_ROSE else None

    def trend(self, layer_pointer: str = "lead") -> str:
        """What the recorded steps say before a non-finite step (empty without history): the global norm's median
        and its last value, the first step above ``spike_factor`` x the median of the steps before it, the loss's
        median and last value, the learning rate, and the layer whose norm grew most at the last step against its own
        median. The event's onset (:meth:`onset`) follows it in ``event.trend``.

        ``layer_pointer``: how that layer is named -- ``"lead"`` (where to look first: the origin is not known and the
        onset may be gradual), ``"secondary"`` (the op that made the first non-finite value is known: the layer is
        only evidence of how the gradients moved before it) or ``"off"`` (not named: a sudden onset, where the growth
        before the step says nothing about its cause)."""
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
        if self.losses:
            ls, lv = self.losses[-1]
            parts.append(f"Loss: median {statistics.median(v for _, v in self.losses):.4g}, {lv:.4g} at step {ls}.")
        if self.lrs:
            (s0, lr0), (s1, lr1) = self.lrs[0], self.lrs[-1]
            parts.append(f"Learning rate: {lr1:.3g} at step {s1}" + (f" ({lr0:.3g} at step {s0})." if lr1 != lr0
                                                                     else ", constant over the window."))
        layer, r = self._grew_most(last_layers, before=last_step) if layer_pointer != "off" else (None, None)
        if layer is not None and r is not None and r > 1.5:
            parts.append(f"Layer whose gradient grew most by step {last_step}: '{layer or '<root>'}' "
                         f"({last_layers[layer]:.4g}, {r:.3g}x its median)"
                         + (": look there first." if layer_pointer == "lead" else
                            " (secondary evidence: the first non-finite value appeared where named above)."))
        return " ".join(parts)
