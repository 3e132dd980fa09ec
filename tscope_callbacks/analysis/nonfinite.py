"""Non-finite values: the cheap per-step flag, exact counts, the event a step produces, and merging ranks' views.

* :func:`nonfinite_total` -- one fused reduction (``torch._foreach_norm``; NaN/Inf propagate through it) over the
  loss and all gradients, returned as a device tensor (no host sync). Finite values whose norm overflows would raise
  the flag spuriously, so a raised flag is always confirmed by :func:`count_nonfinite` before anything is reported.
* :class:`NonFiniteEvent` -- one bad step: its kind, the layer that produced it (from :mod:`.locate`), the
  non-finite gradients, the ranks. :class:`RankInfo` is one rank's view; :func:`merge_infos` merges them.

Nothing here imports Lightning.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["NonFiniteEvent", "NonFiniteError", "LocateResult", "RankInfo", "count_nonfinite", "iter_tensors",
           "max_abs_finite", "merge_infos", "nonfinite_total", "rank_info"]


def iter_tensors(obj: Any, _depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in a nested structure (tensor, list/tuple, dict, dataclass-like objects with ``__dict__``)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif _depth > 8 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from iter_tensors(v, _depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from iter_tensors(v, _depth + 1)
    elif hasattr(obj, "__dataclass_fields__"):
        for k in obj.__dataclass_fields__:
            yield from iter_tensors(getattr(obj, k, None), _depth + 1)


def floating(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def nonfinite_total(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """float32 tensor of shape (1,), non-finite iff some element of ``tensors`` is (or, rarely, finite values overflow
    the norm: callers confirm with :func:`count_nonfinite`). No host sync; None when there is no floating tensor.

    One ``torch._foreach_norm`` call per (device, dtype): a fused multi-tensor kernel on CUDA; on CPU as fast as
    per-tensor sums on an idle machine and much faster under CPU contention (no parallel region per tensor)."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        if t.is_floating_point() or t.is_complex():
            t = torch.view_as_real(t) if t.is_complex() else t
            groups.setdefault((t.device, t.dtype), []).append(t)
    totals = []
    for (_, dtype), ts in groups.items():
        norms = torch._foreach_norm(ts, 2, dtype=torch.float32 if dtype.itemsize <= 4 else None)
        totals.append(torch.stack(norms).sum().reshape(1).float())
    if len(totals) > 1:
        return torch.stack([t.to(totals[0].device) for t in totals]).sum().reshape(1)
    return totals[0] if totals else None


def count_nonfinite(named: list[tuple[str, torch.Tensor | None]]) -> dict[str, int]:
    """{name: number of non-finite elements} for the tensors that have any (exact; syncs once per tensor)."""
    out = {}
    for name, t in named:
        if t is not None and floating(t):
            n = int((~torch.isfinite(t)).sum())
            if n:
                out[name] = n
    return out


def max_abs_finite(tensors: list[torch.Tensor]) -> float | None:
    """Largest finite absolute value over the tensors (None when there is none)."""
    best = None
    for t in tensors:
        if t is None or not floating(t) or not t.numel():
            continue
        a = t.detach().abs()
        a = a[torch.isfinite(a)]
        if a.numel():
            v = float(a.max())
            best = v if best is None else max(best, v)
    return best


@dataclass
class NonFiniteEvent:
    """One step with non-finite values. ``step`` is the optimizer step (``trainer.global_step`` before it advanced)."""

    step: int
    epoch: int
    batch_idx: int
    kind: str  # "loss" | "gradient" | "activation" | "parameter"
    layer: str | None = None  # module path ("" is the root module); None when not located
    parameters: dict[str, int] = field(default_factory=dict)  # name -> non-finite elements (grads; params for kind "parameter")
    loss: float | None = None  # as passed to backward (divided by accumulate_grad_batches; AMP-unscaled)
    num_nonfinite: int = 0  # total non-finite elements over ``parameters``
    max_abs_grad: float | None = None  # largest finite |gradient| (|parameter| for kind "parameter")
    ranks: list[int] = field(default_factory=list)
    action: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        where = f"in layer '{self.layer or '<root>'}'" if self.layer is not None else "(layer not located)"
        what = {"activation": "first non-finite output (forward order)", "loss": "non-finite loss",
                "gradient": "first non-finite gradient (backward order)",
                "parameter": "non-finite parameter"}.get(self.kind, self.kind)
        parts = [f"NaN guard: non-finite {self.kind} at step {self.step} (epoch {self.epoch}, batch {self.batch_idx}) "
                 f"on rank(s) {self.ranks}: {what} {where}."]
        if self.parameters:
            shown = ", ".join(f"{n} ({c})" for n, c in list(self.parameters.items())[:5])
            more = len(self.parameters) - 5
            label = "parameters" if self.kind == "parameter" else "gradients"
            parts.append(f"Non-finite {label}: {shown}{f' and {more} more' if more > 0 else ''}; "
                         f"{self.num_nonfinite} non-finite elements.")
        if self.loss is not None:
            parts.append(f"Loss {self.loss:.6g}.")
        if self.max_abs_grad is not None:
            parts.append(f"Largest finite |value| {self.max_abs_grad:.4g}.")
        parts += [f"Action: {self.action}." if self.action else "", f"Note: {self.note}" if self.note else ""]
        return " ".join(p for p in parts if p)


class NonFiniteError(RuntimeError):
    """Raised by ``action="raise"``; ``.event`` is the :class:`NonFiniteEvent`."""

    def __init__(self, event: NonFiniteEvent) -> None:
        super().__init__(str(event))
        self.event = event


@dataclass
class LocateResult:
    """What a replay found (all fields picklable, so results can be gathered across ranks)."""

    kind: str | None = None  # "activation" | "loss" | "gradient" | "parameter"; None: not reproduced
    layer: str | None = None
    parameter: str | None = None  # first parameter whose replayed gradient was non-finite (backward order)
    parameters: dict[str, int] = field(default_factory=dict)
    loss: float | None = None
    reproduced: bool = False
    batch_idx: int | None = None  # the micro-batch replayed
    note: str = ""


@dataclass
class RankInfo:
    """One rank's view of a bad step (picklable: gathered across ranks under DDP)."""

    rank: int
    bad: bool = False
    loss_bad: bool = False
    loss: float | None = None
    parameters: dict[str, int] = field(default_factory=dict)
    max_abs: float | None = None
    located: LocateResult | None = None
    note: str = ""


def rank_info(rank: int, named_params: list[tuple[str, torch.Tensor]], flagged: bool, losses: list[torch.Tensor],
              unscale: float = 1.0) -> RankInfo:
    """This rank's view of a flagged step: exact non-finite gradient counts, the loss, the largest finite gradient."""
    info = RankInfo(rank)
    if flagged:
        info.parameters = count_nonfinite([(n, p.grad) for n, p in named_params])
    vals = [float(x.detach().float().sum()) / unscale for x in losses]
    bad_vals = [v for v in vals if not math.isfinite(v)]
    info.loss_bad, info.loss = bool(bad_vals), bad_vals[0] if bad_vals else (vals[-1] if vals else None)
    info.bad = info.loss_bad or bool(info.parameters)
    if info.bad:
        info.max_abs = max_abs_finite([p.grad for _, p in named_params if p.grad is not None])
    return info


def merge_infos(bad: list[RankInfo], world_size: int) -> dict[str, Any]:
    """Event fields from the ranks that saw non-finite values. ``ranks``: those where it originated (non-finite loss
    or reproduced by the replay), else all that saw it; the location comes from the lowest such rank."""
    located = [i for i in bad if i.located is not None and i.located.reproduced]
    origin = sorted({i.rank for i in bad if i.loss_bad or i in located}) or sorted(i.rank for i in bad)
    src = (located or [i for i in bad if i.loss_bad] or bad)[0]
    loc = src.located if src in located else None
    params = src.parameters or next((i.parameters for i in bad if i.parameters), {})
    notes = [loc.note if loc is not None else (src.located.note if src.located is not None else src.note)]
    if loc is not None and loc.parameter:
        notes.append(f"First non-finite gradient in backward order: {loc.parameter}.")
    if world_size > 1 and len(origin) < world_size:
        notes.append("Other ranks saw it only through the DDP gradient all-reduce.")
    return dict(batch_idx=loc.batch_idx if loc is not None else None, kind=loc.kind if loc is not None else ("loss" if src.loss_bad else "gradient"),
                layer=loc.layer if loc is not None else None, parameters=params,
                loss=src.loss if src.loss is not None else (loc.loss if loc is not None else None),
                num_nonfinite=sum(params.values()), max_abs_grad=src.max_abs, ranks=origin,
                note=" ".join(n for n in notes if n))
