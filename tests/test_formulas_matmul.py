"""Matmul family: exact FLOPs and ideal bytes of the dispatch-level ops, forward and backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from formula_utils import count, one, only, total_flops
from torch.utils.flop_counter import FlopCounterMode

from tscope_callbacks.formulas import DEFAULT_REGISTRY

aten = torch.ops.aten
S = torch.Size


def test_mm_forward_exact():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    c = one(count(lambda: torch.mm(a, b)), "aten.mm")
    # mm (4x8)@(8x3): 2*4*8*3 = 192 FLOPs; read (32+24)*4 = 224 B, write 12*4 = 48 B
    assert (c.flops, c.bytes_read, c.bytes_written) == (192, 224, 48)
    assert c.category == "matmul" and c.counted and c.dtype == "float32"
    assert c.input_shapes == [[4, 8], [8, 3]] and c.output_shapes == [[4, 3]]


def test_linear_forward_and_backward_decompose_to_addmm_and_mm():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(3, 8, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    rec = count(lambda: F.linear(x, w, b).sum().backward())
    assert "aten.linear" not in [n for n, _ in rec]  # composite: decomposed before dispatch
    addmm = one(rec, "aten.addmm")
    # addmm: 2*4*8*3 = 192 (bias epilogue not counted); read bias 3*4 + x 32*4 + W^T 24*4 = 236, write 12*4 = 48
    assert (addmm.flops, addmm.bytes_read, addmm.bytes_written) == (192, 236, 48)
    mms = only(rec, "aten.mm")
    # grad_x = g(4x3) @ W(3x8): 2*4*3*8 = 192; grad_W = g^T(3x4) @ x(4x8): 2*3*4*8 = 192
    assert [m.flops for m in mms] == [192, 192]
    # grad_x: g is an expand of sum's 0-d grad (strides 0): 1 element = 4 B, + W 24*4 = 100 B; write 32*4 = 128
    assert (mms[0].bytes_read, mms[0].bytes_written) == (100, 128)
    # forward .sum() over 4x3 and the bias grad (sum over the batch of the broadcast grad): 12 FLOPs each
    assert [c.flops for c in only(rec, "aten.sum")] == [12, 12]
    assert total_flops(rec, "matmul") == 3 * 192


def test_linear_3d_input_views_then_addmm():
    x = torch.randn(2, 4, 8)
    w, b = torch.randn(3, 8), torch.randn(3)
    rec = count(lambda: F.linear(x, w, b))
    # (2*4 x 8) @ (8 x 3): 2*8*8*3 = 384
    assert one(rec, "aten.addmm").flops == 384
    assert all(c.category == "view" and c.bytes_read == c.bytes_written == 0 for n, c in rec if n == "aten.view")


def test_bmm_forward_and_backward():
    a = torch.randn(2, 4, 8, requires_grad=True)
    b = torch.randn(2, 8, 5, requires_grad=True)
    rec = count(lambda: torch.matmul(a, b).sum().backward())
    bmms = only(rec, "aten.bmm")
    # fwd (2x4x8)@(2x8x5): 2*2*4*8*5 = 640; grad_a = g(2x4x5)@b^T(2x5x8) = 640; grad_b = a^T(2x8x4)@g(2x4x5) = 640
    assert [c.flops for c in bmms] == [640, 640, 640]
    # fwd bytes: read (64+80)*4 = 576, write 40*4 = 160
    assert (bmms[0].bytes_read, bmms[0].bytes_written) == (576, 160)


def test_baddbmm_addbmm_addmv_mv_dot_vdot():
    b1, b2 = torch.randn(3, 2, 4), torch.randn(3, 4, 5)
    m, v = torch.randn(6, 7), torch.randn(7)
    rec = count(lambda: (torch.baddbmm(torch.randn(3, 2, 5), b1, b2), torch.addbmm(torch.randn(2, 5), b1, b2),
                         torch.addmv(torch.randn(6), m, v), torch.mv(m, v), torch.dot(v, v), torch.vdot(v, v)))
    assert one(rec, "aten.baddbmm").flops == 2 * 3 * 2 * 4 * 5  # 240
    assert one(rec, "aten.addbmm").flops == 2 * 3 * 2 * 4 * 5  # 240 (batch reduction folded into the accumulate)
    assert one(rec, "aten.addmv").flops == 2 * 6 * 7  # 84
    assert one(rec, "aten.mv").flops == 2 * 6 * 7  # 84
    dot = one(rec, "aten.dot")
    # dot(v, v): 2*7 = 14 FLOPs; the same tensor twice is read once: 7*4 = 28 B
    assert (dot.flops, dot.bytes_read, dot.bytes_written) == (14, 28, 4)
    assert one(rec, "aten.vdot").flops == 14


def test_int_mm_and_scaled_mm_formulas_by_shape():
    int_mm = DEFAULT_REGISTRY.lookup(aten._int_mm.default)
    assert int_mm.category == "matmul"
    assert int_mm.flops(S([32, 64]), S([64, 16]), out=S([32, 16])) == 2 * 32 * 64 * 16  # 65536
    scaled = DEFAULT_REGISTRY.lookup(aten._scaled_mm.default)
    assert scaled.flops(S([16, 32]), S([32, 8]), S([]), S([]), None, out=S([16, 8])) == 2 * 16 * 32 * 8  # 8192
    w8 = DEFAULT_REGISTRY.lookup(aten._weight_int8pack_mm.default)
    assert w8.flops(S([4, 64]), S([32, 64]), S([32]), out=S([4, 32])) == 2 * 4 * 32 * 64  # 16384


def test_bf16_autocast_halves_matmul_bytes_not_flops():
    lin = torch.nn.Linear(64, 64, bias=False)
    x = torch.randn(32, 64)
    mm32 = one(count(lambda: lin(x)), "aten.mm")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rec16 = count(lambda: lin(x))
    mm16 = one(rec16, "aten.mm")
    # fp32: read x 32*64*4 + W 64*64*4 = 24576, write 32*64*4 = 8192; bf16: half of each
    assert (mm32.bytes_read, mm32.bytes_written) == (24576, 8192)
    assert (mm16.bytes_read, mm16.bytes_written) == (12288, 4096)
    assert mm16.flops == mm32.flops == 2 * 32 * 64 * 64 and mm16.dtype == "bfloat16"
    # the casts are memory ops: read fp32, write bf16 (x: 8192 -> 4096 B)
    casts = only(rec16, "aten._to_copy")
    assert {(c.category, c.flops) for c in casts} == {("memory", 0)}
    assert sorted((c.bytes_read, c.bytes_written) for c in casts) == [(8192, 4096), (16384, 8192)]


def test_inference_mode_composites_cost_what_their_decomposition_costs():
    x, w, b = torch.randn(4, 8), torch.randn(3, 8), torch.randn(3)
    y = torch.randn(2, 4, 8)
    z = torch.randn(2, 8, 5)

    def fn():
        F.linear(x, w, b)
        torch.matmul(y, z)
        torch.einsum("bij,bjk->bik", y, z)

    with torch.inference_mode():
        inf = count(fn)
    with torch.no_grad():
        ng = count(fn)
    assert {"aten.linear", "aten.matmul", "aten.einsum"} <= {n for n, _ in inf}
    # linear 2*4*8*3 = 192; matmul and einsum 2*2*4*8*5 = 640 each
    assert [c.flops for n, c in inf if c.category == "matmul"] == [192, 640, 640]
    assert total_flops(inf, "matmul") == total_flops(ng, "matmul") == 1472


def test_matches_torch_flop_counter():
    a, b = torch.randn(4, 8, requires_grad=True), torch.randn(8, 3, requires_grad=True)
    p, q = torch.randn(2, 4, 8, requires_grad=True), torch.randn(2, 8, 5, requires_grad=True)
    bias = torch.randn(3)

    def fn():
        (torch.mm(a, b).sum() + torch.addmm(bias, a, b).sum() + torch.bmm(p, q).sum()
         + torch.baddbmm(torch.zeros(2, 4, 5), p, q).sum()).backward()

    with FlopCounterMode(display=False) as fc:
        fn()
    ours = count(fn)
    assert total_flops(ours, "matmul") == fc.get_total_flops()
