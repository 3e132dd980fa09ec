"""FLOPs per element: one table for the ops the dispatcher sees (eager: their registered formulas) and the members of
a compiled (Inductor) kernel (``formulas.fused``), so an op costs the same whether it ran alone or fused.

Convention: one FLOP per arithmetic instruction of the op's textbook definition, one per special-function evaluation
(exp, log, tanh, erf, sqrt... each count 1), comparisons and selects count 1 (``formulas.pointwise`` has the table of
pointwise ops and their costs). Pointwise costs are per *output* element; reductions and softmax per *input* element,
plus a per-output term where the op finalises (a mean's divide). A fused kernel applies the per-input cost to its
iteration space (``formulas.fused``); the per-output terms are left out there (a kernel's outputs are not its
members').

Where the eager and the compiled counts used to differ, the count is what the kernel computes, the same in ATen's
kernel and in Inductor's decomposition:

- ``_softmax_backward_data(g, y)``: ``dx = y * (g - sum_j g_j y_j)``. Per element: ``g * y`` 1, the row sum's add 1,
  the subtraction 1, the product with ``y`` 1 = **4**. ATen's kernel computes the row dot product then ``y * (g -
  dot)``; Inductor decomposes it as ``gy = g * y; gy - y * sum(gy)`` (mul, add, mul, sub): 4 either way.
- ``_log_softmax_backward_data(g, y)``: ``dx = g - exp(y) * sum_j g_j``. Per element: the row sum's add 1, ``exp``
  1, the product 1, the subtraction 1 = **4** (ATen and Inductor's ``g - exp(y) * sum(g)`` alike).
- ``native_dropout_backward(g, mask, scale)``: ``g * mask * scale``: **2** multiplies per element (ATen); Inductor's
  ``g * (mask.type_as(g) * scale)`` is a free cast and the same 2 multiplies.
- ``var_mean(x)``: the work of ``var``, whose statistics already include the mean: accumulate for the mean 1, centre
  1, square-and-accumulate 1 (the norms' statistics are counted the same way: ``formulas.norm``) = **3**, as ``var``.
  ATen and Inductor run the same Welford pass for ``var`` and ``var_mean``; returning the mean costs nothing more.
"""

from __future__ import annotations

__all__ = ["POINTWISE_COSTS", "REDUCTION_COSTS", "GELU_COSTS", "DROPOUT_COSTS", "RANDOM_COST", "RANDOM_OPS",
           "element_cost"]

#: pointwise ops: FLOPs per output element (the in-place variant ``name_`` costs the same)
POINTWISE_COSTS: dict[str, int] = {}
for _names, _cost in [
    (
        "add sub rsub mul div true_divide floor_divide remainder fmod neg negative abs absolute reciprocal square "
        "sqrt rsqrt pow float_power copysign eq ne lt le gt ge greater greater_equal less less_equal not_equal "
        "maximum minimum fmax fmin clamp clamp_min clamp_max clip where sign sgn signbit heaviside floor ceil round "
        "trunc fix frac logical_and logical_or logical_xor logical_not bitwise_and bitwise_or bitwise_xor "
        "bitwise_not bitwise_left_shift bitwise_right_shift isnan isinf isposinf isneginf nan_to_num relu relu6 "
        "hardtanh threshold threshold_backward hardtanh_backward exp exp2 expm1 log log2 log10 log1p sin cos tan "
        "asin acos atan atan2 arctan2 sinh cosh asinh acosh atanh tanh erf erfc erfinv lgamma digamma i0 sinc "
        "positive conj_physical",
        1,
    ),
    ("addcmul addcdiv leaky_relu leaky_relu_backward hardshrink softshrink xlogy hardsigmoid_backward "
     "_prelu_kernel hypot", 2),
    ("lerp sigmoid sigmoid_backward tanh_backward elu celu logit hardsigmoid hardswish_backward elu_backward "
     "_prelu_kernel_backward", 3),
    ("silu selu hardswish softplus mish log_sigmoid_forward glu glu_backward", 4),
    ("softplus_backward log_sigmoid_backward", 5),
    ("silu_backward", 8),
    ("mish_backward", 10),
]:
    for _n in _names.split():
        POINTWISE_COSTS[_n] = _cost

#: GELU by ``approximate``: (forward, backward) FLOPs per element. "none": ``x * 0.5 * (1 + erf(x / sqrt 2))`` 5;
#: backward cdf 4 + pdf 3 + combine 3 = 10. "tanh": ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` 9; backward 16
GELU_COSTS: dict[str, tuple[int, int]] = {"none": (5, 10), "tanh": (9, 16)}

#: reductions, scans and softmax: (FLOPs per input element, per output element); the derivations of the softmax
#: backward and var_mean counts are in the module doc, the others in ``formulas.reductions``
REDUCTION_COSTS: dict[str, tuple[int, int]] = {}
for _names, _in, _out in [
    ("sum nansum prod amax amin max min argmax argmin any all count_nonzero cumsum cumsum_ cumprod cumprod_ "
     "cummax cummin _cummax_helper _cummin_helper", 1, 0),
    ("mean nanmean", 1, 1),
    ("aminmax", 2, 0),
    ("var var_mean", 3, 0),
    ("std std_mean", 3, 1),
    ("norm linalg_vector_norm", 2, 1),
    ("logsumexp", 4, 2),
    ("logcumsumexp _logcumsumexp", 3, 0),
    ("_softmax _log_softmax _safe_softmax", 5, 0),
    ("_softmax_backward_data _log_softmax_backward_data", 4, 0),
]:
    for _n in _names.split():
        REDUCTION_COSTS[_n] = (_in, _out)

#: dropout in training, FLOPs per element: forward compare the draw and scale-multiply 2; backward ``g * mask *
#: scale`` 2 (module doc)
DROPOUT_COSTS: dict[str, int] = {"native_dropout": 2, "native_dropout_backward": 2}

#: random fills and draws: 1 FLOP per element drawn
RANDOM_COST = 1
RANDOM_OPS = ("bernoulli", "rand", "randn", "randint", "normal", "poisson", "multinomial", "randperm", "uniform",
              "exponential", "geometric", "cauchy", "log_normal", "random", "rand_like", "randn_like",
              "randint_like")


def element_cost(name: str) -> int | None:
    """FLOPs per element of an op by its aten name (``"gelu"``, ``"var_mean"``, ``"add_"``): pointwise per output,
    reductions per input (their per-output term left out), GELU exact; None for an op not in the table."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    for n in (name, base):
        if n in POINTWISE_COSTS:
            return POINTWISE_COSTS[n]
        if n in REDUCTION_COSTS:
            return REDUCTION_COSTS[n][0]
        if n in DROPOUT_COSTS:
            return DROPOUT_COSTS[n]
        if n in ("gelu", "gelu_backward"):
            return GELU_COSTS["none"][n == "gelu_backward"]
        if n in RANDOM_OPS:
            return RANDOM_COST
    return None
