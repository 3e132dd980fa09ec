"""Convolution family: 1d/2d/3d, stride/padding/dilation, groups, transposed; backward honours output_mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from formula_utils import count, one, total_flops
from torch.utils.flop_counter import FlopCounterMode

from tscope_callbacks.formulas import DEFAULT_REGISTRY

aten = torch.ops.aten


@pytest.mark.parametrize(
    "x_shape, w_shape, kw, out_shape, flops",
    [
        # conv1d: out (2,4,6); 2 * numel(out)=48 * prod(w[1:])=3*3=9 -> 864
        ((2, 3, 8), (4, 3, 3), {}, (2, 4, 6), 2 * 48 * 9),
        # conv2d stride 2 pad 1 dil 2: out (2,6,3,3); 2 * 108 * (4*3*3=36) = 7776
        ((2, 4, 7, 7), (6, 4, 3, 3), dict(stride=2, padding=1, dilation=2), (2, 6, 3, 3), 2 * 108 * 36),
        # conv2d groups=2: w (6, 4/2, 3, 3); out (2,6,4,4) with stride 2 pad 1: 2 * 192 * 18 = 6912
        ((2, 4, 8, 8), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2), (2, 6, 4, 4), 2 * 192 * 18),
        # depthwise conv2d groups=4: w (4,1,3,3); out (1,4,6,6): 2 * 144 * 9 = 2592
        ((1, 4, 8, 8), (4, 1, 3, 3), dict(groups=4), (1, 4, 6, 6), 2 * 144 * 9),
        # conv3d: out (1,2,3,3,3); 2 * 54 * (2*2*2*2=16) = 1728
        ((1, 2, 4, 4, 4), (2, 2, 2, 2, 2), {}, (1, 2, 3, 3, 3), 2 * 54 * 16),
    ],
)
def test_conv_forward_exact(x_shape, w_shape, kw, out_shape, flops):
    x, w, b = torch.randn(x_shape), torch.randn(w_shape), torch.randn(w_shape[0])
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(x_shape)]
    c = one(count(lambda: conv(x, w, b, **kw)), "aten.convolution")
    assert c.output_shapes == [list(out_shape)]
    assert c.flops == flops and c.category == "conv"
    # bytes: read x + w + b once, write out once (fp32)
    assert c.bytes_read == 4 * (x.numel() + w.numel() + b.numel())
    assert c.bytes_written == 4 * torch.Size(out_shape).numel()


def test_conv_transpose_forward_counts_per_input_element():
    x, w = torch.randn(2, 4, 5, 5), torch.randn(4, 3, 3, 3)  # transposed weight: (C_in, C_out/groups, k, k)
    c = one(count(lambda: F.conv_transpose2d(x, w, stride=2)), "aten.convolution")
    # out (2,3,11,11); transposed: 2 * numel(x)=200 * prod(w[1:])=27 -> 10800
    assert c.output_shapes == [[2, 3, 11, 11]] and c.flops == 2 * 200 * 27
    xg, wg = torch.randn(1, 4, 5), torch.randn(4, 1, 3)  # grouped transposed 1d, groups=2 -> C_out = 2
    cg = one(count(lambda: F.conv_transpose1d(xg, wg, groups=2)), "aten.convolution")
    assert cg.output_shapes == [[1, 2, 7]] and cg.flops == 2 * 20 * 3  # 120


def _conv_bwd(x_grad: bool, w_grad: bool, bias: bool):
    x = torch.randn(2, 3, 6, 6, requires_grad=x_grad)
    w = torch.randn(4, 3, 3, 3, requires_grad=w_grad)
    b = torch.randn(4, requires_grad=True) if bias else None
    rec = count(lambda: F.conv2d(x, w, b, padding=1).sum().backward())
    return one(rec, "aten.convolution_backward")


@pytest.mark.parametrize(
    "x_grad, w_grad, bias, mask, flops",
    [
        # forward: out (2,4,6,6)=288 elements; 2 * 288 * 27 = 15552. grad_input = grad_weight = 15552 each,
        # grad_bias = 288 (one add per grad_out element)
        (True, True, True, [True, True, True], 2 * 15552 + 288),
        (False, True, True, [False, True, True], 15552 + 288),
        (False, True, False, [False, True, False], 15552),
        (True, False, False, [True, False, False], 15552),
    ],
)
def test_conv_backward_honours_output_mask(x_grad, w_grad, bias, mask, flops):
    c = _conv_bwd(x_grad, w_grad, bias)
    assert c.flops == flops and c.category == "conv"
    # outputs: only the requested grads are materialised (and written)
    written = (2 * 3 * 36 if mask[0] else 0) + (4 * 27 if mask[1] else 0) + (4 if mask[2] else 0)
    assert c.bytes_written == 4 * written


def test_conv_backward_formula_called_directly_for_every_mask():
    f = DEFAULT_REGISTRY.lookup(aten.convolution_backward.default).flops
    S = torch.Size
    g, x, w = S([2, 4, 6, 6]), S([2, 3, 6, 6]), S([4, 3, 3, 3])
    fwd = 2 * 288 * 27  # 15552
    args = ([4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    for mask, expected in [([True, False, False], fwd), ([False, True, False], fwd), ([False, False, True], 288),
                           ([False, False, False], 0), ([True, True, True], 2 * fwd + 288)]:
        assert f(g, x, w, *args, mask, out=(x, w, S([4]))) == expected


def test_conv3d_and_transposed_backward():
    x = torch.randn(1, 2, 4, 4, 4, requires_grad=True)
    w = torch.randn(2, 2, 2, 2, 2, requires_grad=True)
    c = one(count(lambda: F.conv3d(x, w).sum().backward()), "aten.convolution_backward")
    assert c.flops == 2 * 1728  # grad_input + grad_weight, forward 1728 each (no bias)
    xt = torch.randn(2, 4, 5, 5, requires_grad=True)
    wt = torch.randn(4, 3, 3, 3, requires_grad=True)
    ct = one(count(lambda: F.conv_transpose2d(xt, wt, stride=2).sum().backward()), "aten.convolution_backward")
    assert ct.flops == 2 * 10800


def test_matches_torch_flop_counter_groups_1_forward_and_backward():
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    xt = torch.randn(1, 4, 5, requires_grad=True)
    wt = torch.randn(4, 2, 3, requires_grad=True)

    def fn():  # no bias: torch's formula ignores the bias grad, which we count
        (F.conv2d(x, w, stride=2, padding=1).sum() + F.conv_transpose1d(xt, wt).sum()).backward()

    with FlopCounterMode(display=False) as fc:
        fn()
    assert total_flops(count(fn), "conv") == fc.get_total_flops()


def test_grouped_backward_deliberately_differs_from_torch():
    x = torch.randn(1, 4, 6, 6, requires_grad=True)
    w = torch.randn(4, 2, 3, 3, requires_grad=True)  # groups=2

    def fn():
        F.conv2d(x, w, groups=2).sum().backward()

    with FlopCounterMode(display=False) as fc:
        fn()
    fwd = 2 * (4 * 16) * 18  # out (1,4,4,4) = 64 elements, prod(w[1:]) = 18 -> 2304
    assert total_flops(count(fn), "conv") == 3 * fwd  # fwd + grad_input + grad_weight
    # torch multiplies its grad_weight by the full C_in (groups x too much): fwd + fwd + groups * fwd
    assert fc.get_total_flops() == fwd + fwd + 2 * fwd
