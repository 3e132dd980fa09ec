"""Pointwise (elementwise) ops: a cost in FLOPs per *output* element, the same for the in-place variant.

Convention: one FLOP per arithmetic instruction of the op's textbook definition, one per special-function
evaluation (exp, log, tanh, erf, sqrt... each count 1), comparisons and selects count 1; a multiply-add that the
definition writes as one scaled accumulate (addcmul, addcdiv) counts 2.

    cost  ops
    1     add sub rsub mul div remainder fmod neg abs reciprocal square sqrt rsqrt pow; eq ne lt le gt ge
          maximum minimum fmax fmin clamp(_min/_max) where sign sgn floor ceil round trunc frac; logical_* bitwise_*
          isnan isinf nan_to_num; relu hardtanh threshold threshold_backward hardtanh_backward;
          exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh tanh
          erf erfc erfinv lgamma digamma
    2     addcmul addcdiv (product/quotient + scaled accumulate); leaky_relu(+_backward) hardshrink softshrink
          xlogy hardsigmoid_backward _prelu_kernel
    3     lerp (a + w*(b - a)); sigmoid (exp, add, div); sigmoid_backward g*y*(1-y); tanh_backward g*(1-y^2);
          elu celu logit hardsigmoid hardswish_backward elu_backward _prelu_kernel_backward
    4     silu (sigmoid + mul); selu; hardswish (x * hardsigmoid); softplus (mul, exp, log1p, div); mish;
          log_sigmoid_forward; glu (a * sigmoid(b), per output) and glu_backward (per grad_input element)
    5     gelu (approximate='none': x * 0.5 * (1 + erf(x / sqrt 2))); softplus_backward; log_sigmoid_backward
    8     silu_backward (sigmoid 3 + g*s*(1 + x*(1 - s)) 5)
    9     gelu (approximate='tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))))
    10    gelu_backward (erf: cdf 4 + pdf 3 + combine 3); mish_backward
    16    gelu_backward (approximate='tanh')

Any other op tagged ``torch.Tag.pointwise`` falls back to 1 FLOP per output element (see ``pointwise_fallback``).
The costs are one table with the reductions', dropout's and compiled kernels' (``formulas.costs``).
"""

from __future__ import annotations

from typing import Any

import torch

from tscope_callbacks.formulas.common import first_numel, out_numel, reg
from tscope_callbacks.formulas.costs import GELU_COSTS, POINTWISE_COSTS
from tscope_callbacks.formulas.registry import DEFAULT_REGISTRY, Formula

__all__ = ["POINTWISE_COSTS", "pointwise_flops", "pointwise_fallback"]

def pointwise_flops(cost: int):
    """A FLOP formula: ``cost`` per output element (the first list argument's elements for in-place foreach)."""

    def flops(*args: Any, out=None, **kwargs: Any) -> int:
        n = out_numel(out)
        if n == 0 and args:
            n = first_numel(args[0])
        return cost * n

    flops.__name__ = f"pointwise_{cost}_flops"
    return flops


def _gelu(x, *args, out=None, approximate="none", **kwargs) -> int:
    return GELU_COSTS["tanh" if approximate == "tanh" else "none"][0] * out_numel(out)


def _gelu_backward(g, x, *args, out=None, approximate="none", **kwargs) -> int:
    return GELU_COSTS["tanh" if approximate == "tanh" else "none"][1] * out_numel(out)


def _names_with_inplace(name: str) -> list[str]:
    return [name, name + "_"]


for _n, _c in POINTWISE_COSTS.items():
    reg(_names_with_inplace(_n), "pointwise", pointwise_flops(_c))
reg(_names_with_inplace("gelu"), "pointwise", _gelu)
reg(["gelu_backward"], "pointwise", _gelu_backward)
# binary max/min are pointwise (the packets are reductions: see reductions.py)
reg(["max.other", "min.other", "max.out", "min.out"], "pointwise", pointwise_flops(1))

_POINTWISE_FALLBACK = Formula(category="pointwise", flops=pointwise_flops(1))


def pointwise_fallback(func: Any) -> Formula | None:
    """Any op tagged ``torch.Tag.pointwise`` without its own formula: 1 FLOP per output element."""
    tags = getattr(func, "tags", None)
    if tags and torch.Tag.pointwise in tags:
        return _POINTWISE_FALLBACK
    return None


DEFAULT_REGISTRY.add_fallback(pointwise_fallback)
