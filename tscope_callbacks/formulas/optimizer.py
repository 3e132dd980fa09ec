"""Optimizer kernels: ``_foreach_*`` lists and the fused Adam/AdamW/SGD/Adagrad kernels (category "optimizer").

``_foreach_<op>`` costs what ``<op>`` costs per element (pointwise.py's table), summed over the list;
``_foreach_norm`` 2 per element + 1 per tensor; ``_foreach_zero_``/``_foreach_copy_`` 0 FLOPs.

Fused kernels, FLOPs per parameter element, chosen equal to the ``foreach`` implementation's op sequence costed
with the same table (so switching ``fused=True`` does not change the count):
    Adam / AdamW   11  m.lerp_(g, 1-b1) 3; v.mul_(b2) 1; v.addcmul_(g, g, 1-b2) 2; sqrt 1; div 1; add eps 1;
                       p.addcdiv_(m, denom, -step) 2;  +1 weight decay (Adam: g += wd*p, AdamW: p *= 1-lr*wd),
                       +1 amsgrad (max), +1 grad_scale (unscale)
    SGD             1  p.add_(g, alpha=-lr);  with momentum: +2 (buf.mul_(m) 1, buf.add_(g) 1; the first step
                       copies g into buf: +0), +1 nesterov, +1 weight decay, +1 grad_scale
    Adagrad         6  sum.addcmul_(g, g) 2; sqrt 1; add eps 1; p.addcdiv_(g, std) 2; +1 weight decay
Bytes (override): every state list is read and written, grads are only read (no grad is written back),
``state_steps`` are read.
"""

from __future__ import annotations

import torch

from tscope_callbacks.formulas.bytes import copy_bytes, tensors_in, unique_bytes, write_only_bytes
from tscope_callbacks.formulas.common import first_numel, out_numel, reg
from tscope_callbacks.formulas.costs import POINTWISE_COSTS
from tscope_callbacks.formulas.pointwise import pointwise_flops

__all__ = ["adam_flops_per_element", "sgd_flops_per_element"]


def adam_flops_per_element(*, weight_decay: float = 0.0, amsgrad: bool = False, grad_scale: bool = False) -> int:
    return 11 + int(bool(weight_decay)) + int(bool(amsgrad)) + int(grad_scale)


def sgd_flops_per_element(*, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                          is_first_step: bool = False, grad_scale: bool = False) -> int:
    n = 1 + int(bool(weight_decay)) + int(grad_scale)
    if momentum:
        n += (0 if is_first_step else 2) + int(bool(nesterov))
    return n


def _fused_adam(params, grads, *args, out=None, weight_decay=0.0, amsgrad=False, grad_scale=None, **kwargs) -> int:
    per = adam_flops_per_element(weight_decay=weight_decay, amsgrad=amsgrad, grad_scale=grad_scale is not None)
    return per * first_numel(params)


def _fused_sgd(params, grads, *args, out=None, weight_decay=0.0, momentum=0.0, nesterov=False, is_first_step=False,
               grad_scale=None, **kwargs) -> int:
    per = sgd_flops_per_element(momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                                is_first_step=is_first_step, grad_scale=grad_scale is not None)
    return per * first_numel(params)


def _fused_adagrad(params, grads, *args, out=None, weight_decay=0.0, **kwargs) -> int:
    return (6 + int(bool(weight_decay))) * first_numel(params)


def _listed(*lists) -> list:
    return [t for lst in lists if lst for t in tensors_in(lst)]


def _scalars(kwargs) -> list:
    return [kwargs[k] for k in ("grad_scale", "found_inf", "lr") if isinstance(kwargs.get(k), torch.Tensor)]


def _adam_bytes(args, kwargs, out):
    params, grads, m, v, vmax, steps = args[:6]
    state = _listed(params, m, v, vmax if kwargs.get("amsgrad") else None)
    return unique_bytes(state + _listed(grads, steps) + _scalars(kwargs)), unique_bytes(state)


def _sgd_bytes(args, kwargs, out):
    params, grads, bufs = args[:3]
    momentum = bool(kwargs.get("momentum"))
    read = _listed(params, grads, bufs if momentum and not kwargs.get("is_first_step") else None)
    return unique_bytes(read + _scalars(kwargs)), unique_bytes(_listed(params, bufs if momentum else None))


def _adagrad_bytes(args, kwargs, out):
    params, grads, sums, steps = args[:4]
    return unique_bytes(_listed(params, grads, sums, steps) + _scalars(kwargs)), unique_bytes(_listed(params, sums))


def _foreach_norm(xs, *args, out=None, **kwargs) -> int:
    return 2 * first_numel(xs) + out_numel(out)


def _amp_unscale(xs, *args, out=None, **kwargs) -> int:
    return 2 * first_numel(xs)


for _n, _c in POINTWISE_COSTS.items():
    reg([f"_foreach_{_n}", f"_foreach_{_n}_"], "optimizer", pointwise_flops(_c))
reg(["_foreach_norm"], "optimizer", _foreach_norm)
reg(["_foreach_max"], "optimizer", pointwise_flops(1))
reg(["_foreach_zero_"], "optimizer", None, bytes=write_only_bytes)
reg(["_foreach_copy_"], "optimizer", None, bytes=copy_bytes)
reg(["_fused_adam_", "_fused_adamw_", "_fused_adam", "_fused_adamw"], "optimizer", _fused_adam, bytes=_adam_bytes)
reg(["_fused_sgd_", "_fused_sgd"], "optimizer", _fused_sgd, bytes=_sgd_bytes)
reg(["_fused_adagrad_", "_fused_adagrad"], "optimizer", _fused_adagrad, bytes=_adagrad_bytes)
reg(["_amp_foreach_non_finite_check_and_unscale_"], "optimizer", _amp_unscale)
reg(["_amp_update_scale_"], "optimizer", None)
