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
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tscope_callbacks.capture.locate import LocateResult
from tscope_callbacks.capture.step_memory import local_tensor
from tscope_callbacks.capture.tensors import count_nonfinite, floating, iter_tensors

__all__ = ["NonFiniteEvent", "NonFiniteError", "LocateResult", "RankInfo", "FlagChannel", "count_nonfinite",
           "iter_tensors", "loss_scalar", "max_abs_finite", "merge_infos", "nonfinite_total", "norm_vector", "per_tensor_norms",
           "rank_info", "tensor_norms", "read_now", "sync_points", "AlertLimiter"]


def local(t: Any) -> Any:
    """The rank's own shard of a distributed tensor (DTensor under FSDP2/TP: its local tensor), else ``t``: checks
    read local data only (no collective inside a check; the flag is all-reduced once by the caller)."""
    return None if t is None else local_tensor(t)


def grads_of(params: list) -> list:
    """The local gradients of ``params`` that exist (each ``.grad`` read once: a property, on every checked step)."""
    return [g if type(g) is torch.Tensor else local_tensor(g) for p in params if (g := p.grad) is not None]


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


def per_tensor_norms(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """float32 vector: one L2 norm per tensor, in order (non-finite where the tensor has a NaN/Inf, or, rarely, where
    finite values overflow; callers confirm). One fused ``_foreach_norm`` per (device, dtype) group, no host sync."""
    return torch.stack(tensor_norms(tensors)) if tensors else None


def norm_vector(tensors: list[torch.Tensor], scalars: list[torch.Tensor]) -> torch.Tensor:
    """The fused norm of a checked step: one float32 vector ``[L2 norm of each of tensors..., each of scalars...]``
    on the tensors' device, from one ``_foreach_norm`` over the tensors (:func:`tensor_norms`) and one ``stack`` of
    its per-tensor results with the scalars -- the two ops ``torch.nn.utils.get_total_norm`` runs before its final
    norm. ``tensors`` must not be empty. A scalar (a loss) that is already a float32 0-d tensor on that device is
    stacked as it is (no op); any other is summed to one there. Run under no-grad (a loss requires grad)."""
    norms = tensor_norms(tensors)
    if scalars:
        dev = norms[0].device
        norms += [loss_scalar(x, dev) for x in scalars]
    return torch.stack(norms)


def loss_scalar(x: torch.Tensor, device: Any, detach: bool = False) -> torch.Tensor:
    """A loss as one float32 scalar on ``device``, to stack with the gradient norms: a float32 0-d tensor there
    already (the usual loss) as it is -- no op; any other summed there. ``detach``: outside no-grad (the deferred
    path), cut from the graph."""
    if x.dtype is torch.float32 and x.ndim == 0 and x.device == device:
        return x.detach() if detach and x.requires_grad else x
    return (x.detach() if detach else x).float().sum().to(device)


def tensor_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`per_tensor_norms` as a list of float32 scalars (to stack with other values in one op). The usual
    case, every tensor real, at most 32-bit and on one device, is one ``_foreach_norm`` call with no per-tensor
    Python; fp64, complex or several devices take the grouped path."""
    try:
        out = list(torch._foreach_norm(tensors, 2, dtype=torch.float32))
        if out and out[0].device == out[-1].device:  # a foreach call over several devices: grouped path
            return out
    except (RuntimeError, TypeError):  # fp64 ("without narrowing") or complex inputs
        pass
    if not tensors:
        return []
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        t = torch.view_as_real(t) if t.is_complex() else t
        groups.setdefault((t.device, t.dtype), []).append(i)
    if len(groups) == 1:  # one fp64 or complex group: one fused call, in order
        ((_, dtype),) = groups
        ts = [torch.view_as_real(t) if t.is_complex() else t for t in tensors]
        return [n.float() for n in torch._foreach_norm(ts, 2, dtype=torch.float32 if dtype.itemsize <= 4 else None)]
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for (_, dtype), idx in groups.items():
        ts = [torch.view_as_real(tensors[i]) if tensors[i].is_complex() else tensors[i] for i in idx]
        norms = torch._foreach_norm(ts, 2, dtype=torch.float32 if dtype.itemsize <= 4 else None)
        for i, n in zip(idx, norms):
            out[i] = n.float()
    dev0 = out[0].device  # type: ignore[union-attr]
    return [n.to(dev0) for n in out]  # type: ignore[union-attr]


_SYNC_POINTS = [0]


def read_now(t: torch.Tensor) -> list[float]:
    """Read a (device) tensor to the host now: a host sync on a GPU. Every such read of the NaN guard goes through
    here and is counted (:func:`sync_points`), so tests can prove a healthy step makes none."""
    _SYNC_POINTS[0] += 1
    if t.dim() != 1 or t.requires_grad:
        t = t.detach().reshape(-1)
    return t.tolist()


def sync_points() -> int:
    return _SYNC_POINTS[0]


class FlagChannel:
    """Per-step flags kept on the device and read ``lag`` steps later, without a host sync.

    :meth:`push` copies a step's flag vector into pinned host memory with ``non_blocking=True`` and records a CUDA
    event; :meth:`due` hands out the entries of steps ``<= step - lag`` (the same steps on every rank, so a collective
    can follow). By then the GPU has long passed the copy; were it ``lag`` steps behind, the read waits for it
    (counted in ``waits``). On CPU the values are plain tensors: nothing to wait for."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.pending: list[tuple[int, torch.Tensor, Any, Any]] = []
        self.waits = 0

    def push(self, step: int, values: torch.Tensor, payload: Any) -> None:
        values = values.detach()
        if values.device.type == "cuda":
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
        else:
            host, ev = values, None
        self.pending.append((step, host, ev, payload))

    def due(self, step: int | None = None) -> list[tuple[int, list[float], Any]]:
        """Entries of steps ``<= step - lag`` (all of them when ``step`` is None: the end of training)."""
        out, keep = [], []
        for entry in self.pending:
            s, host, ev, payload = entry
            if step is not None and s > step - self.lag:
                keep.append(entry)
                continue
            if ev is not None and not ev.query():
                self.waits += 1
                ev.synchronize()
            out.append((s, host.reshape(-1).tolist(), payload))
        self.pending = keep
        return out

    def clear(self) -> None:
        self.pending.clear()


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
    #: parameter name -> non-finite elements of what ``counts`` names; -1: non-finite, element count not read
    #: (a flag read late, without a host sync, after the step's gradients were gone)
    parameters: dict[str, int] = field(default_factory=dict)
    loss: float | None = None  # as passed to backward (divided by accumulate_grad_batches; AMP-unscaled)
    num_nonfinite: int = 0  # total non-finite elements over ``parameters``
    max_abs_grad: float | None = None  # largest finite |value| of what ``counts`` names
    ranks: list[int] = field(default_factory=list)
    action: str = ""
    note: str = ""
    #: what the gradient norms of the checked steps before it said (``analysis.grad_history``); "" without history
    trend: str = ""
    #: how it came about (``GradHistory.onset``): "built-up" (the gradient norm or the loss was already rising at the
    #: last checked step before it), "sudden" (both steady), "" (not known)
    onset: str = ""
    #: what ``parameters``, ``num_nonfinite`` and ``max_abs_grad`` count: the step's "gradients" (also when a layer's
    #: weights were found non-finite by the replay: kind "parameter"), or the "parameters" after the update
    #: (``check_params``)
    counts: str = "gradients"
    #: the op that made the first non-finite value and the source line that called it, with its inputs
    #: (``capture.op_origin``, from the replay); "" when not found
    origin: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        """A short multi-line alert: the first line says the step, the layer and -- when the replay found it -- the op
        and the source line that made the first non-finite value, and the action; then the onset, then the
        evidence, one line each (markdown list items)."""
        where = f"in layer '{self.layer or '<root>'}'" if self.layer is not None else "(layer not located)"
        what = {"activation": "first non-finite output (forward order)", "loss": "non-finite loss",
                "gradient": "first non-finite gradient (backward order)",
                "parameter": "non-finite parameter"}.get(self.kind, self.kind)
        origin, _, inputs = self.origin.partition("; its inputs were finite: ")
        first = (f"NaN guard: non-finite {self.kind} at step {self.step} {where}: "
                 + (f"{origin}." if origin else f"{what}.")
                 + (f" Action: {self.action}." if self.action else ""))
        trend, onset = self.trend, ""
        if "Onset:" in trend:
            cut = trend.index("Onset:")
            trend, onset = trend[:cut].strip(), trend[cut:].strip()
        lines = [first, onset]
        if inputs:
            lines.append(f"Inputs of that op (all finite): {inputs}.")
        counts = [f"Epoch {self.epoch}, batch {self.batch_idx}, rank(s) {self.ranks}."]
        if self.parameters:
            shown = ", ".join(n if c < 0 else f"{n} ({c})" for n, c in list(self.parameters.items())[:5])
            more = len(self.parameters) - 5
            label = self.counts
            count = (f"; {self.num_nonfinite} non-finite elements" if all(c >= 0 for c in self.parameters.values())
                     else "")
            counts.append(f"Non-finite {label}: {shown}{f' and {more} more' if more > 0 else ''}{count}.")
        if self.loss is not None:
            counts.append(f"Loss {self.loss:.6g}.")
        if self.max_abs_grad is not None:
            one = self.counts.removesuffix("s")
            counts.append(f"Every finite {one} is 0." if self.max_abs_grad == 0 else
                          f"Largest finite |{one}| {self.max_abs_grad:.4g}.")
        note = self.note.replace(f"Origin: {self.origin}.", "").strip() if self.origin else self.note
        lines += [" ".join(counts), f"Before it: {trend}" if trend else "", f"Note: {note}" if note else ""]
        lines = [ln for ln in lines if ln]
        return "\n".join([lines[0], *(f"- {ln}" for ln in lines[1:])])


class NonFiniteError(RuntimeError):
    """Raised by ``action="raise"``; ``.event`` is the :class:`NonFiniteEvent`."""

    def __init__(self, event: NonFiniteEvent) -> None:
        super().__init__(str(event))
        self.event = event


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
        info.parameters = count_nonfinite([(n, local(p.grad)) for n, p in named_params])
    vals = [float(x.detach().float().sum()) / unscale for x in losses]
    bad_vals = [v for v in vals if not math.isfinite(v)]
    info.loss_bad, info.loss = bool(bad_vals), bad_vals[0] if bad_vals else (vals[-1] if vals else None)
    info.bad = info.loss_bad or bool(info.parameters)
    if info.bad:
        info.max_abs = max_abs_finite(grads_of([p for _, p in named_params]))
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
    if loc is not None and loc.origin:
        notes.append(f"Origin: {loc.origin}.")
    if world_size > 1 and len(origin) < world_size:
        notes.append("Other ranks saw it only through the DDP gradient all-reduce.")
    return dict(origin=loc.origin if loc is not None else "", batch_idx=loc.batch_idx if loc is not None else None, kind=loc.kind if loc is not None else ("loss" if src.loss_bad else "gradient"),
                layer=loc.layer if loc is not None else None, parameters=params,
                loss=src.loss if src.loss is not None else (loc.loss if loc is not None else None),
                num_nonfinite=sum(params.values()), max_abs_grad=src.max_abs, ranks=origin,
                note=" ".join(n if n.endswith(".") else n + "." for n in notes if n))


class AlertLimiter:
    """The first event is alerted, then at most one per ``every_s`` seconds or every ``every_n`` events (each alert
    says how many were not). Pure bookkeeping: the caller emits."""

    def __init__(self, every_s: float, every_n: int, clock: Any = None) -> None:
        import time

        self.every_s, self.every_n = every_s, every_n
        self._clock = clock or time.monotonic
        self.suppressed = 0
        self.events = 0
        self._last = -math.inf

    def admit(self, force: bool = False) -> tuple[bool, int]:
        """(alert this event?, events not alerted since the last alert). ``force``: alert it whatever the rate (the
        event that stops the run)."""
        self.events += 1
        now = self._clock()
        if not force and self.events > 1 and self.suppressed + 1 < self.every_n and now - self._last < self.every_s:
            self.suppressed += 1
            return False, 0
        missed, self.suppressed, self._last = self.suppressed, 0, now
        return True, missed
