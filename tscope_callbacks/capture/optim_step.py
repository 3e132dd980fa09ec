"""The optimizer update of an analysed step (``api.analyze_model(..., optimizer=)``): one steady-state step.

The first ``step()`` creates the optimizer's state (``exp_avg``, ``exp_avg_sq``, momentum buffers): a one-time cost,
so it runs outside the capture, and the captured step is the one every later step repeats. Named optimizers run as
PyTorch runs them on a GPU: ``foreach`` (its default there) or, with ``-fused``, the fused kernel.

On ``meta`` two paths cannot run as they would on a GPU, and their device ops are issued directly, as the GPU's
``step()`` issues them (torch 2.x ``_multi_tensor_adam(w)`` and ``_fused_adam(w)``):

- Adam(W) foreach keeps its step counters on the CPU and reads them with ``.item()`` for the bias corrections: host
  work a meta run would count as device ops (two per parameter). The device side is ``_foreach_mul_`` (decoupled
  weight decay), ``_foreach_lerp_``, ``_foreach_mul_``, ``_foreach_addcmul_``, ``_foreach_sqrt``, ``_foreach_div_``,
  ``_foreach_add_`` and ``_foreach_addcdiv_``.
- the fused path's device check refuses meta tensors; the fused ops have meta kernels, so the step counters (on the
  device in this path) are incremented with ``_foreach_add_`` and ``torch._fused_adam(w)_`` is called on the
  optimizer's own state: the two kernels of a fused AdamW step on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["OPTIMIZERS", "optimizer_step"]

_CLASSES = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
OPTIMIZERS = tuple(sorted(_CLASSES)) + tuple(f"{n}-fused" for n in sorted(_CLASSES))
_ADAM = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
_SGD = {"lr": 1e-3, "momentum": 0.9, "weight_decay": 0.0}  # momentum: what SGD training uses


def optimizer_step(params: list[torch.nn.Parameter], optimizer: Any,
                   device: str) -> tuple[torch.optim.Optimizer, Callable[[], None]]:
    """Build ``optimizer`` over ``params`` (their ``.grad`` set) and run its first, state-creating step (the caller
    keeps that out of the capture); return the optimizer (its state: the step's memory) and the steady-state step
    to capture. ``optimizer``: a name in :data:`OPTIMIZERS`, or a factory ``params -> torch.optim.Optimizer``."""
    if callable(optimizer) and not isinstance(optimizer, str):
        try:
            opt = optimizer(params)
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"optimizer= factory returned {type(opt).__name__}, not a torch.optim.Optimizer")
            opt.step()
        except RuntimeError as e:  # e.g. fused=True refuses meta tensors at its first step
            raise ValueError(f"optimizer= factory failed on the {device} parameters ({e}); on meta, name the "
                             f"optimizer instead: one of {', '.join(OPTIMIZERS)}") from e
        return opt, opt.step
    name = str(optimizer).strip().lower()
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}: give one of {', '.join(OPTIMIZERS)}, or a factory "
                         "`lambda params: torch.optim.AdamW(params, ...)`")
    base, fused = name.removesuffix("-fused"), name.endswith("-fused")
    kw = dict(_SGD if base == "sgd" else _ADAM)
    if base == "adam":
        kw["weight_decay"] = 0.0
    on_meta = torch.device(device).type == "meta"
    if on_meta and name == "sgd-fused" and not _has_meta_kernel("_fused_sgd_"):
        raise ValueError("optimizer='sgd-fused': this torch has no meta kernel for _fused_sgd_; analyse with "
                         "optimizer='sgd' (foreach), or on a real device (device='cuda')")
    opt = _CLASSES[base](params, **kw, **({"fused": True} if fused and not on_meta else {"foreach": True}))
    opt.step()  # the state (on meta through the foreach path, whose state the fused kernels take as well)
    if not on_meta or (base == "sgd" and not fused):
        return opt, opt.step
    if not fused:
        return opt, _foreach_adam_on_meta(opt, decoupled=base == "adamw")
    steps = [torch.zeros((), device=device) for g in opt.param_groups for _ in g["params"]]  # on the device here

    @torch.no_grad()
    def fused_step() -> None:
        i = 0
        for group in opt.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            grads = [p.grad for p in ps]
            st = [opt.state[p] for p in ps]
            if base == "sgd":
                torch._fused_sgd_(ps, grads, [s["momentum_buffer"] for s in st], weight_decay=group["weight_decay"],
                                  momentum=group["momentum"], lr=group["lr"], dampening=group["dampening"],
                                  nesterov=group["nesterov"], maximize=group["maximize"], is_first_step=False)
                continue
            fn = torch._fused_adamw_ if base == "adamw" else torch._fused_adam_
            beta1, beta2 = group["betas"]
            torch._foreach_add_(steps[i:i + len(ps)], 1)  # the fused path keeps its step counters on the device
            fn(ps, grads, [s["exp_avg"] for s in st], [s["exp_avg_sq"] for s in st], [], steps[i:i + len(ps)],
               lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
               amsgrad=False, maximize=False)
            i += len(ps)

    return opt, fused_step


def _foreach_adam_on_meta(opt: torch.optim.Optimizer, decoupled: bool) -> Callable[[], None]:
    """The device ops of a foreach Adam(W) step on ``opt``'s state (see the module doc)."""

    @torch.no_grad()
    def step() -> None:
        for group in opt.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            if not ps:
                continue
            grads = [p.grad for p in ps]
            m = [opt.state[p]["exp_avg"] for p in ps]
            v = [opt.state[p]["exp_avg_sq"] for p in ps]
            lr, (beta1, beta2), wd, eps = group["lr"], group["betas"], group["weight_decay"], group["eps"]
            if wd and decoupled:
                torch._foreach_mul_(ps, 1 - lr * wd)
            elif wd:
                grads = torch._foreach_add(grads, ps, alpha=wd)
            torch._foreach_lerp_(m, grads, 1 - beta1)
            torch._foreach_mul_(v, beta2)
            torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
            denom = torch._foreach_sqrt(v)
            torch._foreach_div_(denom, [1.0] * len(ps))  # bias corrections: host floats, one per tensor
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(ps, m, denom, [-lr] * len(ps))

    return step


def _has_meta_kernel(op: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "Meta")
    except Exception:
        return False
