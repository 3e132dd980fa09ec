"""Locating where a bad step went non-finite: per-step replay state and the replay.

* :class:`StepSnapshot` -- what is kept per micro-batch so a bad step can be replayed: a *reference* to the batch (no
  copy), the in-place version counters of its tensors (to tell when ``training_step`` mutated it) and the RNG states
  (torch CPU, CUDA when initialised, python ``random``, numpy when imported). About 0.1 ms per micro-batch.
* :func:`replay_locate` -- re-runs ``training_step`` forward and backward on the same (not yet updated) parameters
  under the step's RNG state. It calls the LightningModule's own ``training_step``, never the DDP wrapper, so no
  collective runs inside it; the backward is ``torch.autograd.grad`` so ``.grad`` (and DDP's reducer) are untouched;
  ``self.log`` is silenced; module buffers (BatchNorm stats) and RNG states are restored after. Other side effects of
  ``training_step`` (user counters) happen twice. Results, as event fields:

  - ``kind="activation"``: ``layer`` is the first module, in forward execution order, whose output was non-finite
    (or the module whose own code made a child's input non-finite; ``None`` when the model input already was);
    ``kind="parameter"`` when that module's own weights were already non-finite.
  - ``kind="loss"``: every module output was finite, the loss computed in ``training_step`` was not.
  - ``kind="gradient"``: forward and loss finite, a gradient was not. ``layer`` is the module owning the first
    parameter whose gradient was non-finite in backward order, or, when an activation gradient went first, the
    module whose backward ran last before it (a heuristic under residual branches; the note says so).

  No replay (``layer=None``, a ``note`` says why) with manual optimization (``training_step`` steps optimizers
  itself) or strategies other than single-device/DDP (FSDP/DeepSpeed shard parameters). It may not reproduce with
  randomness outside the torch/python/numpy RNGs, non-deterministic kernels, a batch mutated in place by
  ``training_step`` (detected with tensor version counters and noted), or NaN gradients that reached a rank only
  through DDP's all-reduce (the rank where it reproduces is then reported).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tscope_callbacks.capture.eager import EagerStance
from tscope_callbacks.capture.op_origin import OpOrigin
from tscope_callbacks.capture.paths import clean_path, named_parameters, owner
from tscope_callbacks.capture.tensors import count_nonfinite, floating, iter_tensors
from tscope_callbacks.rng import RngState

__all__ = ["StepSnapshot", "LocateResult", "locate_step", "replay_locate"]


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
    origin: str = ""  # the op that made the first non-finite value, and its line (``capture.op_origin``)


class StepSnapshot:
    """Per micro-batch: batch reference, batch tensor versions, torch's RNG states (CPU and CUDA: dropout and any
    torch draw replay exactly; a step drawing from numpy or Python's ``random`` may replay differently, which the
    replay detects and reports), and (later) the loss it produced (the tensor ``training_step`` returned)."""

    __slots__ = ("batch", "batch_idx", "rng", "versions", "loss")

    def __init__(self, batch: Any, batch_idx: int, rng: RngState, versions: list[tuple[torch.Tensor, int]],
                 loss: torch.Tensor | None = None) -> None:
        self.batch, self.batch_idx, self.rng, self.versions, self.loss = batch, batch_idx, rng, versions, loss

    @classmethod
    def take(cls, batch: Any, batch_idx: int) -> StepSnapshot:
        """Taken before every checked step: a tensor, or a flat tuple, list or dict of tensors (most batches) skip
        the general walk."""
        tb = type(batch)
        if tb is torch.Tensor:
            versions = [(batch, batch._version)]
        else:
            versions = None
            flat = batch.values() if tb is dict else batch if tb is tuple or tb is list else None
            if flat is not None:
                try:
                    versions = [(t, t._version) for t in flat if type(t) is torch.Tensor or _not_tensor(t)]
                except _Nested:
                    versions = None
            if versions is None:
                versions = [(t, t._version) for t in iter_tensors(batch)]
        return cls(batch, batch_idx, RngState.torch_only(), versions)

    def mutated(self) -> bool:
        return any(t._version != v for t, v in self.versions)


class _Nested(Exception):
    """A flat batch holds something other than tensors: walk it in full."""


def _not_tensor(t: Any) -> bool:
    raise _Nested


class _Tracer:
    """Forward/backward hooks recording the first non-finite value. Removed by :meth:`close`."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.stack: list[str] = []
        self.fwd: tuple[str, str] | None = None  # (layer, how)
        self.bwd: tuple[str, str, str | None] | None = None  # (kind "param"|"output", layer, param name)
        self.last_bwd_layer: str | None = None
        self.hooked: dict[int, torch.Tensor] = {}  # one grad hook per tensor: the innermost module that output it
        self.handles: list[Any] = []
        for name, mod in root.named_modules():
            name = clean_path(name)
            self.handles.append(mod.register_forward_pre_hook(self._pre(name)))
            self.handles.append(mod.register_forward_hook(self._post(name)))
        for name, p in named_parameters(root):
            if p.requires_grad:
                self.handles.append(p.register_hook(self._param_grad(name)))

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.hooked.clear()

    @staticmethod
    def _bad(obj: Any) -> bool:
        return any(floating(t) and t.numel() and not bool(torch.isfinite(t).all()) for t in iter_tensors(obj))

    def _pre(self, name: str) -> Callable:
        def hook(mod, args):
            if self.fwd is None and self._bad(args):
                parent = self.stack[-1] if self.stack else None
                self.fwd = (parent, f"input of '{name or '<root>'}'") if parent is not None else (None, "model input")
            self.stack.append(name)

        return hook

    def _post(self, name: str) -> Callable:
        def hook(mod, args, output):
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
            if self.fwd is None and self._bad(output):
                self.fwd = (name, "output")
            for t in iter_tensors(output):
                if t.requires_grad and floating(t) and id(t) not in self.hooked:
                    self.hooked[id(t)] = t
                    t.register_hook(self._out_grad(name))

        return hook

    def _out_grad(self, name: str) -> Callable:
        def hook(g):
            if self.bwd is None and self._bad(g):
                self.bwd = ("output", self.last_bwd_layer, name)
            self.last_bwd_layer = name

        return hook

    def _param_grad(self, pname: str) -> Callable:
        def hook(g):
            if self.bwd is None and self._bad(g):
                self.bwd = ("param", owner(pname), pname)
            self.last_bwd_layer = owner(pname)

        return hook


def _loss_of(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return out.get("loss")
    return None


class _NoLog:
    """Temporarily shadows ``log``/``log_dict`` on the module instance with no-ops (the replay must not log)."""

    def __init__(self, module: nn.Module) -> None:
        self.module, self.saved = module, {}

    def __enter__(self) -> None:
        for n in ("log", "log_dict"):
            if hasattr(self.module, n):
                if n in self.module.__dict__:
                    self.saved[n] = self.module.__dict__[n]
                object.__setattr__(self.module, n, lambda *a, **k: None)

    def __exit__(self, *exc: Any) -> None:
        for n in ("log", "log_dict"):
            self.module.__dict__.pop(n, None)
        self.module.__dict__.update(self.saved)


def replay_locate(module: nn.Module, step_fn: Callable[[Any, int], Any], snap: StepSnapshot, *,
                  autocast: Callable[[], AbstractContextManager] | None = None,
                  scale: Callable[[torch.Tensor], torch.Tensor] | None = None) -> LocateResult:
    """Replay one micro-batch (``step_fn(batch, batch_idx)``, e.g. ``pl_module.training_step``) and locate.

    ``autocast``: the precision context Lightning ran the step under; ``scale``: the loss scaling the real backward
    used (a GradScaler's ``scale``), so fp16 overflows reproduce. The parameters must not have been updated since
    the step ran (true in ``on_before_optimizer_step``).
    """
    res = LocateResult()
    named = named_parameters(module)
    names = {id(p): n for n, p in named}
    params = [p for p in module.parameters() if p.requires_grad]
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    after = RngState()
    stance = EagerStance()  # a compiled model replays eagerly: the tracer's hooks are never compiled into its graphs
    stance.enter()
    tracer = _Tracer(module)
    origin = OpOrigin()  # the op (and line) that made the first non-finite value, forward or backward
    try:
        snap.rng.restore()
        with ExitStack() as stack:
            stack.enter_context(torch.enable_grad())
            stack.enter_context(autocast() if autocast is not None else nullcontext())
            stack.enter_context(_NoLog(module))
            stack.enter_context(origin)
            loss = _loss_of(step_fn(snap.batch, snap.batch_idx))
        if loss is not None:
            res.loss = float(loss.detach().float().sum())
        if tracer.fwd is not None:
            layer, how = tracer.fwd
            res.kind, res.layer, res.reproduced = "activation", layer, True
            own = [p for n, p in named if layer is not None and owner(n) == layer]
            bad_own = count_nonfinite([(names[id(p)], p.detach()) for p in own])
            if bad_own:
                res.kind = "parameter"
                own_n = {names[id(p)]: p.numel() for p in own}
                res.note = ("the layer's own parameters were already non-finite before this step's forward: " + ", ".join(
                    f"{n} ({c} of {own_n[n]} elements)" for n, c in sorted(bad_own.items())) + ". Something outside "
                    "the optimizer update wrote them, or an earlier update that was not checked.")
            elif how != "output":
                res.note = (f"first non-finite value seen at the {how}: produced by the code of "
                            f"{'the layer' if layer is not None else 'training_step before the model call'}")
            if loss is not None and loss.requires_grad and params:  # which gradients it reached (exact counts)
                grads = torch.autograd.grad(scale(loss) if scale else loss, params, allow_unused=True)
                res.parameters = count_nonfinite([(names[id(p)], g) for p, g in zip(params, grads)])
            res.origin = str(origin.origin) if origin.origin is not None else ""
            return res
        if loss is None or not loss.requires_grad:
            res.note = "training_step returned no differentiable loss during the replay"
            return res
        if not torch.isfinite(loss.detach()).all():
            res.kind, res.reproduced = "loss", True
            res.note = "every module output was finite: the loss computation in training_step made it non-finite"
            res.origin = str(origin.origin) if origin.origin is not None else ""
            return res
        if not params:
            res.note = "the module has no trainable parameters"
            return res
        with origin:
            grads = torch.autograd.grad(scale(loss) if scale else loss, params, allow_unused=True)
        res.parameters = count_nonfinite([(names[id(p)], g) for p, g in zip(params, grads)])
        res.origin = str(origin.origin) if origin.origin is not None else ""
        if tracer.bwd is not None:
            how, layer, pname = tracer.bwd
            res.kind, res.layer, res.reproduced = "gradient", layer, True
            if how == "param":
                res.parameter = pname
            elif layer is None:
                res.note = (f"the gradient of the output of '{pname}' was the first non-finite one and no module's "
                            "backward ran before it: the loss computation in training_step produced it")
            else:
                res.note = (f"the gradient of the output of '{pname}' was the first non-finite one; '{layer}' is "
                            "the module whose backward ran last before it (approximate under branches/residuals)")
        elif res.parameters:
            res.kind, res.reproduced = "gradient", True
    finally:
        tracer.close()
        stance.exit()
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        after.restore()
    return res


def locate_step(module: nn.Module, step_fn: Callable[[Any, int], Any], snaps: list[StepSnapshot],
                **kw: Any) -> tuple[LocateResult, int]:
    """Replay the step's micro-batches (those whose loss was non-finite first) until one reproduces.

    Returns the result and the number of replays run."""
    first = [s for s in snaps if s.loss is not None and not bool(torch.isfinite(s.loss).all())]
    res, n = LocateResult(), 0
    for snap in first + [s for s in snaps if not any(s is f for f in first)]:
        n += 1
        res = replay_locate(module, step_fn, snap, **kw)
        res.batch_idx = snap.batch_idx
        if snap.mutated():
            res.note = f"{res.note} The batch was modified in place by training_step; the replay used it.".strip()
        if res.reproduced:
            return res, n
    res.note = ("the replay did not reproduce the non-finite values (non-deterministic ops, randomness outside "
                f"torch/python/numpy RNGs, or values received from another rank): layer not located. {res.note}")
    return res, n
