"""Normalisation layers: layer / batch / group / RMS norm, forward and backward. FLOPs per input element N:

    forward, statistics computed (layer, group, batch train)   4   (mean 1; variance: centre + square-acc. 2;
                                                                    normalise: scale by rstd 1)
        + 1 with a weight (scale), + 1 with a bias (shift)
    forward, batch norm eval (running stats)                    2   (x * scale + shift, per-channel folded)
    forward, RMS norm                                           3   (square-acc. 2, scale by rstd 1) + 1 weight
    backward grad_input, statistics computed                    8   (x_hat 2, two row sums 1 + 2, combine 3)
        + 1 with a weight (g * w)
    backward grad_input, batch norm eval                        1   (g * per-channel folded scale)
    backward grad_input, RMS norm                               6   (x_hat 1, row sum 2, combine 3) + 1 weight
    backward grad_weight                                        2   (g * x_hat accumulated)
    backward grad_bias                                          1   (g accumulated)

Per-row / per-channel scalar work (rstd, running-stat updates) is ignored. ``output_mask`` is honoured.

Bytes of layer_norm backward (the lower bound): dY, X, mean and rstd are read; the weight only when grad_input is
computed (dX = f(dY * w, ...); dgamma and dbeta need dY and X alone); the bias never (dbeta = sum(dY): the bias is
passed for its shape and ``output_mask``, no kernel reads it). Each requested gradient is written.
"""

from __future__ import annotations

import torch

from tscope_callbacks.formulas.bytes import tensors_in, unique_bytes
from tscope_callbacks.formulas.common import numel, reg

__all__ = ["norm_forward_flops", "norm_backward_flops"]


def norm_forward_flops(n: int, *, weight: bool, bias: bool, stats: bool = True) -> int:
    if not stats:  # eval batch norm: one per-channel folded scale-and-shift
        return 2 * n
    return n * (4 + int(weight) + int(bias))


def norm_backward_flops(n: int, mask, *, weight: bool, stats: bool = True) -> int:
    mask = list(mask) if mask is not None else [True, True, True]
    total = 0
    if mask[0]:
        total += n * (8 + int(weight)) if stats else n  # eval: g * (w * invstd), the scale folded per channel
    if len(mask) > 1 and mask[1]:
        total += 2 * n
    if len(mask) > 2 and mask[2]:
        total += n
    return total


def _layer_norm(x, normalized_shape=None, weight=None, bias=None, *args, out=None, **kwargs) -> int:
    return norm_forward_flops(numel(x), weight=weight is not None, bias=bias is not None)


def _layer_norm_backward(g, x, normalized_shape, mean, rstd, weight=None, bias=None, output_mask=None, *args,
                         out=None, **kwargs) -> int:
    return norm_backward_flops(numel(x), output_mask, weight=weight is not None)


def _layer_norm_backward_bytes(args, kwargs, out):
    # native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask)
    names = ("grad_out", "input", "normalized_shape", "mean", "rstd", "weight", "bias", "output_mask")
    a = dict(zip(names, args))
    a.update(kwargs or {})
    mask = a.get("output_mask")
    reads = tensors_in([a.get(k) for k in ("grad_out", "input", "mean", "rstd")])
    if (mask is None or mask[0]) and isinstance(a.get("weight"), torch.Tensor):
        reads.append(a["weight"])
    return unique_bytes(reads), unique_bytes(tensors_in(out))


def _batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None, training=True, *args, out=None,
                **kwargs) -> int:
    return norm_forward_flops(numel(x), weight=weight is not None, bias=bias is not None, stats=bool(training))


def _batch_norm_legit(x, weight=None, bias=None, *args, out=None, **kwargs) -> int:
    # _native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, ...) and its .no_stats
    # overload (input, weight, bias, training, ...): find ``training`` as the first bool
    training = next((a for a in args if isinstance(a, bool)), True)
    return norm_forward_flops(numel(x), weight=weight is not None, bias=bias is not None, stats=training)


def _batch_norm_no_training(x, weight=None, bias=None, *args, out=None, **kwargs) -> int:
    return norm_forward_flops(numel(x), weight=weight is not None, bias=bias is not None, stats=False)


def _batch_norm_with_update(x, weight=None, bias=None, *args, out=None, **kwargs) -> int:
    return norm_forward_flops(numel(x), weight=weight is not None, bias=bias is not None, stats=True)


def _batch_norm_backward(g, x, weight=None, running_mean=None, running_var=None, save_mean=None, save_invstd=None,
                         train=True, eps=1e-5, output_mask=None, *args, out=None, **kwargs) -> int:
    return norm_backward_flops(numel(x), output_mask, weight=weight is not None, stats=bool(train))


def _batch_norm_backward_new(g, x, weight=None, running_mean=None, running_var=None, save_mean=None, save_var=None,
                             update=True, eps=1e-5, output_mask=None, *args, out=None, **kwargs) -> int:
    return norm_backward_flops(numel(x), output_mask, weight=weight is not None, stats=bool(update))


def _cudnn_batch_norm_backward(x, g, weight=None, *args, out=None, **kwargs) -> int:
    return norm_backward_flops(numel(x), None, weight=weight is not None)


def _group_norm(x, weight=None, bias=None, *args, out=None, **kwargs) -> int:
    return norm_forward_flops(numel(x), weight=weight is not None, bias=bias is not None)


def _group_norm_backward(g, x, mean, rstd, weight=None, n=0, c=0, hxw=0, group=1, output_mask=None, *args, out=None,
                         **kwargs) -> int:
    return norm_backward_flops(numel(x), output_mask, weight=weight is not None)


def _rms_norm(x, normalized_shape=None, weight=None, *args, out=None, **kwargs) -> int:
    return numel(x) * (3 + int(weight is not None))


def _rms_norm_backward(g, x, normalized_shape, rstd, weight=None, output_mask=None, *args, out=None, **kwargs) -> int:
    n = numel(x)
    mask = list(output_mask) if output_mask is not None else [True, True]
    total = n * (6 + int(weight is not None)) if mask[0] else 0
    if len(mask) > 1 and mask[1]:
        total += 2 * n
    return total


def _batch_norm_bytes(args, kwargs, out):
    """native/cudnn/miopen batch norm: the schema does not mark the running stats as written, but in training
    they are updated in place (read, and written)."""
    ins = [t for t in args[:5] if isinstance(t, torch.Tensor)]
    written = tensors_in(out)
    if len(args) > 5 and args[5]:
        written += [t for t in args[3:5] if isinstance(t, torch.Tensor)]
    return unique_bytes(ins), unique_bytes(written)


reg(["native_layer_norm"], "norm", _layer_norm)
reg(["native_layer_norm_backward"], "norm", _layer_norm_backward, bytes=_layer_norm_backward_bytes)
reg(["native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm"], "norm", _batch_norm, bytes=_batch_norm_bytes)
reg(["_native_batch_norm_legit"], "norm", _batch_norm_legit)
reg(["_native_batch_norm_legit_no_training", "_batch_norm_no_update"], "norm", _batch_norm_no_training)
reg(["_batch_norm_with_update", "_batch_norm_with_update_functional"], "norm", _batch_norm_with_update)
reg(["native_batch_norm_backward"], "norm", _batch_norm_backward)
reg(["batch_norm_backward"], "norm", _batch_norm_backward_new)
reg(["cudnn_batch_norm_backward", "miopen_batch_norm_backward"], "norm", _cudnn_batch_norm_backward)
reg(["native_group_norm"], "norm", _group_norm)
reg(["native_group_norm_backward"], "norm", _group_norm_backward)
reg(["_fused_rms_norm", "rms_norm"], "norm", _rms_norm)
reg(["_fused_rms_norm_backward"], "norm", _rms_norm_backward)
