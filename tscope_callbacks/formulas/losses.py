"""Losses, dropout and random fills.

Losses, FLOPs per element of ``self`` (``+1`` per element when reduced, i.e. ``reduction`` is mean/sum):
    mse_loss                        2  (sub, square)                 backward 3 (sub, scale, mul by grad)
    smooth_l1_loss / huber_loss     5  (sub, abs, cmp, quad|lin 2)   backward 4
    soft_margin_loss                4  (mul, neg, exp, log1p)        backward 5
    binary_cross_entropy            7  (2 logs, 1 - x, 2 muls, add, neg) (+1 weight)   backward 6 (+1 weight)
    binary_cross_entropy_with_logits 8 (stable log-sigmoid form) (+1 weight, +2 pos_weight)
    nll_loss(2d)                    per *target* element: 1 gather-accumulate (+1 with class weights);
                                    backward 1 per target element (+1 with weights)
``cross_entropy`` arrives as ``_log_softmax`` + ``nll_loss_forward`` (softmax costs: reductions.py).
nll_loss bytes (override): the forward reads the targets and one logit per target (not the whole logits tensor);
the backward reads grad_output, targets, total_weight (and gathered class weights) and writes the full
zero-filled grad_input; ``self`` is only used for its shape.

Dropout (category pointwise): ``native_dropout`` in training 2 per element (compare the draw, scale-multiply),
0 in eval; ``native_dropout_backward`` 2 per element (mask, scale). Random fills (``bernoulli_``, ``uniform_``,
``normal_``, ...) 1 per element; their ``self`` is written, not read (bytes override).
"""

from __future__ import annotations

import torch

from tscope_callbacks.formulas.bytes import tensor_bytes, tensors_in, unique_bytes, write_only_bytes
from tscope_callbacks.formulas.common import numel, out_numel, reg
from tscope_callbacks.formulas.costs import DROPOUT_COSTS, RANDOM_COST

__all__: list[str] = []


def _red(reduction) -> int:
    return 1 if reduction not in (0, None) else 0


def _elementwise_loss(cost: int):
    def flops(x, target, reduction=1, *args, out=None, **kwargs) -> int:
        return numel(x) * (cost + _red(reduction))

    return flops


def _bce(x, target, weight=None, reduction=1, *args, out=None, **kwargs) -> int:
    return numel(x) * (7 + int(weight is not None) + _red(reduction))


def _loss_backward(cost: int):
    def flops(g, x, target, *args, out=None, **kwargs) -> int:
        return numel(x) * cost

    return flops


def _bce_backward(g, x, target, weight=None, *args, out=None, **kwargs) -> int:
    return numel(x) * (6 + int(weight is not None))


def _bce_logits(x, target, weight=None, pos_weight=None, reduction=1, *args, out=None, **kwargs) -> int:
    return numel(x) * (8 + int(weight is not None) + 2 * int(pos_weight is not None) + _red(reduction))


def _nll(x, target, weight=None, *args, out=None, **kwargs) -> int:
    return numel(target) * (1 + int(weight is not None))


def _nll_backward(g, x, target, weight=None, *args, out=None, **kwargs) -> int:
    return numel(target) * (1 + int(weight is not None))


def _nll_bytes(args, kwargs, out):
    x, target = args[0], args[1]
    weight = args[2] if len(args) > 2 else kwargs.get("weight")
    n = target.numel()
    read = tensor_bytes(target) + n * x.element_size()
    if isinstance(weight, torch.Tensor):
        read += min(n, weight.numel()) * weight.element_size()
    return read, unique_bytes(tensors_in(out))


def _nll_backward_bytes(args, kwargs, out):
    g, target, total_weight = args[0], args[2], args[6]
    weight = args[3]
    read = unique_bytes([g, target, total_weight])
    if isinstance(weight, torch.Tensor):
        read += min(target.numel(), weight.numel()) * weight.element_size()
    res = out if isinstance(out, torch.Tensor) else kwargs.get("grad_input")
    return read, tensor_bytes(res)


reg(["mse_loss"], "loss", _elementwise_loss(2))
reg(["smooth_l1_loss", "huber_loss"], "loss", _elementwise_loss(5))
reg(["soft_margin_loss"], "loss", _elementwise_loss(4))
reg(["binary_cross_entropy"], "loss", _bce)
reg(["binary_cross_entropy_with_logits"], "loss", _bce_logits)
reg(["mse_loss_backward"], "loss", _loss_backward(3))
reg(["smooth_l1_loss_backward", "huber_loss_backward"], "loss", _loss_backward(4))
reg(["soft_margin_loss_backward"], "loss", _loss_backward(5))
reg(["binary_cross_entropy_backward"], "loss", _bce_backward)
reg(["nll_loss_forward", "nll_loss2d_forward"], "loss", _nll, bytes=_nll_bytes)
reg(["nll_loss_backward", "nll_loss2d_backward"], "loss", _nll_backward, bytes=_nll_backward_bytes)


# ---- dropout and random fills ----
def _native_dropout(x, p=0.5, train=True, *args, out=None, **kwargs) -> int:
    return DROPOUT_COSTS["native_dropout"] * numel(x) if train is not False and p else 0


def _native_dropout_backward(g, mask, *args, out=None, **kwargs) -> int:
    return DROPOUT_COSTS["native_dropout_backward"] * numel(g)


def _per_out(cost: int):
    def flops(*args, out=None, **kwargs) -> int:
        return cost * out_numel(out)

    return flops


reg(["native_dropout"], "pointwise", _native_dropout)
reg(["native_dropout_backward"], "pointwise", _native_dropout_backward)
reg(["bernoulli_", "uniform_", "normal_", "random_", "exponential_", "geometric_", "cauchy_", "log_normal_",
     "bernoulli.p", "rand_like", "randn_like", "randint_like"], "pointwise", _per_out(RANDOM_COST),
    bytes=write_only_bytes)
reg(["bernoulli", "rand", "randn", "randint", "normal", "poisson", "multinomial", "randperm"], "pointwise",
    _per_out(RANDOM_COST))
