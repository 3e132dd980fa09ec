"""Convolution family, 1d/2d/3d, strided/padded/dilated, grouped, transposed, forward and backward.

Forward FLOPs are 2 per multiply-add of the dense kernel:
    non-transposed  2 * numel(out) * prod(w[1:])     (w = (C_out, C_in/groups, *k): one dot product per output)
    transposed      2 * numel(x)   * prod(w[1:])     (w = (C_in, C_out/groups, *k): one scatter per input)
Multiplies against padding are counted (the kernel performs them), the bias epilogue is not (as addmm's; same as
``torch.utils.flop_counter``). Stride, padding, dilation and groups enter through the output shape and ``w``.

Backward (``convolution_backward`` with ``output_mask = [grad_input, grad_weight, grad_bias]``): grad_input and
grad_weight each perform exactly the forward's multiply-adds; grad_bias is a reduction of grad_out, 1 FLOP per
grad_out element (the same thing the linear layer's bias grad costs as a separate ``sum``).

Deliberate difference from ``torch.utils.flop_counter``: for grouped convolutions torch's grad_weight formula
multiplies by the full C_in (``groups`` times too much); ours is the forward count.
"""

from __future__ import annotations

from math import prod

from tscope_callbacks.formulas.common import numel, reg

__all__ = ["conv_forward_flops", "conv_backward_flops"]


def conv_forward_flops(x, w, out, transposed: bool) -> int:
    return 2 * (numel(x) if transposed else numel(out)) * int(prod(w[1:]))


def _convolution(x, w, bias=None, stride=None, padding=None, dilation=None, transposed=False, *args, out=None,
                 **kwargs) -> int:
    return conv_forward_flops(x, w, out, bool(transposed))


def _conv_nontransposed(x, w, *args, out=None, **kwargs) -> int:
    return conv_forward_flops(x, w, out, False)


def _conv_transposed(x, w, *args, out=None, **kwargs) -> int:
    return conv_forward_flops(x, w, out, True)


def conv_backward_flops(grad_out, x, w, transposed: bool, output_mask) -> int:
    fwd = conv_forward_flops(x, w, grad_out, transposed)
    mask = list(output_mask) if output_mask is not None else [True, True, True]
    total = 0
    if mask[0]:
        total += fwd  # grad_input: conv_transpose(grad_out, w) (or conv for a transposed forward)
    if mask[1]:
        total += fwd  # grad_weight: conv(x, grad_out) with batch as the reduction dim
    if len(mask) > 2 and mask[2]:
        total += numel(grad_out)  # grad_bias: sum over batch and space
    return total


def _convolution_backward(grad_out, x, w, bias_sizes=None, stride=None, padding=None, dilation=None,
                          transposed=False, output_padding=None, groups=1, output_mask=None, *args, out=None,
                          **kwargs) -> int:
    return conv_backward_flops(grad_out, x, w, bool(transposed), output_mask)


def _convolution_backward_overrideable(grad_out, x, w, stride=None, padding=None, dilation=None, transposed=False,
                                       output_padding=None, groups=1, output_mask=None, *args, out=None,
                                       **kwargs) -> int:
    return conv_backward_flops(grad_out, x, w, bool(transposed), output_mask)


def _slow_conv2d_backward(grad_out, x, w, kernel_size=None, stride=None, padding=None, output_mask=None, *args,
                          out=None, **kwargs) -> int:
    if output_mask is None:  # the .grad_input overload computes all three
        output_mask = [True, True, True]
    return conv_backward_flops(grad_out, x, w, False, output_mask)


# convolution-like ops with the ``transposed`` flag at position 6
reg(["convolution", "_convolution", "convolution_overrideable"], "conv", _convolution)
# backend kernels (they reach dispatch only when called directly or under some backends)
reg(
    [
        "cudnn_convolution",
        "mkldnn_convolution",
        "miopen_convolution",
        "miopen_depthwise_convolution",
        "_mps_convolution",
        "cudnn_convolution_relu",
        "cudnn_convolution_add_relu",
        "_slow_conv2d_forward",
        "slow_conv3d_forward",
        "slow_conv_dilated2d",
        "slow_conv_dilated3d",
        "_conv_depthwise2d",
        "conv_depthwise3d",
        "thnn_conv2d",
    ],
    "conv",
    _conv_nontransposed,
)
reg(
    [
        "cudnn_convolution_transpose",
        "miopen_convolution_transpose",
        "_mps_convolution_transpose",
        "slow_conv_transpose2d",
        "slow_conv_transpose3d",
    ],
    "conv",
    _conv_transposed,
)
reg(["convolution_backward"], "conv", _convolution_backward)
reg(["convolution_backward_overrideable"], "conv", _convolution_backward_overrideable)
reg(["_slow_conv2d_backward"], "conv", _slow_conv2d_backward)
