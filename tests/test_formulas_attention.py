"""Attention: CPU SDPA (causal exact, masks, GQA) through real dispatch; CUDA kernels by shape and on meta."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from formula_utils import count, one
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

import tscope_callbacks as ts
from tscope_callbacks.formulas import DEFAULT_REGISTRY
from tscope_callbacks.formulas.attention import attended_pairs

aten = torch.ops.aten
S = torch.Size
B, H, L, D = 2, 4, 6, 8
BH = B * H  # 8
# per (batch, head): non-causal pairs 6*6 = 36; causal (top-left) pairs 1+2+...+6 = 21
FWD_DENSE = BH * 36 * 2 * (D + D)  # 8 * 36 * 32 = 9216
FWD_CAUSAL = BH * 21 * 2 * (D + D)  # 8 * 21 * 32 = 5376
BWD_DENSE = BH * 36 * 2 * (3 * D + 2 * D)  # 8 * 36 * 80 = 23040
BWD_CAUSAL = BH * 21 * 2 * (3 * D + 2 * D)  # 8 * 21 * 80 = 13440


def _qkv(hk=H, lq=L, sk=L, grad=True):
    q = torch.randn(B, H, lq, D, requires_grad=grad)
    k = torch.randn(B, hk, sk, D, requires_grad=grad)
    v = torch.randn(B, hk, sk, D, requires_grad=grad)
    return q, k, v


def test_attended_pairs_closed_form_matches_brute_force():
    rnd = random.Random(0)
    for _ in range(200):
        lq, sk = rnd.randint(0, 9), rnd.randint(0, 9)
        lo = rnd.choice([None, rnd.randint(-10, 10)])
        hi = rnd.choice([None, rnd.randint(-10, 10)])
        brute = sum(1 for i in range(lq) for j in range(sk)
                    if (lo is None or j - i >= lo) and (hi is None or j - i <= hi))
        assert attended_pairs(lq, sk, lo, hi) == brute, (lq, sk, lo, hi)


@pytest.mark.parametrize("causal, fwd, bwd", [(False, FWD_DENSE, BWD_DENSE), (True, FWD_CAUSAL, BWD_CAUSAL)])
def test_cpu_sdpa_forward_backward_exact(causal, fwd, bwd):
    q, k, v = _qkv()
    rec = count(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward())
    f = one(rec, "aten._scaled_dot_product_flash_attention_for_cpu")
    b = one(rec, "aten._scaled_dot_product_flash_attention_for_cpu_backward")
    assert (f.flops, b.flops) == (fwd, bwd) and f.category == b.category == "attention"
    # fused kernel bytes: read q, k, v (3 * 384 elements * 4 B = 4608); write out 1536 + logsumexp 48*4 = 192
    assert (f.bytes_read, f.bytes_written) == (4608, 1728)
    # backward: read grad_out (an expand of a 0-d grad: 4 B) + q, k, v, out (4 * 1536) + logsumexp 192;
    # write grad q, k, v: 3 * 1536
    assert (b.bytes_read, b.bytes_written) == (4 + 4 * 1536 + 192, 3 * 1536)


def test_causal_is_exactly_sum_of_attended_keys_not_half():
    q, k, v = _qkv(grad=False)
    dense = one(count(lambda: F.scaled_dot_product_attention(q, k, v)), "aten._scaled_dot_product_flash_attention_for_cpu")
    causal = one(count(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                 "aten._scaled_dot_product_flash_attention_for_cpu")
    assert causal.flops * 36 == dense.flops * 21  # (L+1)/(2L) = 21/36, not 1/2


def test_causal_top_left_alignment_when_query_shorter_than_keys():
    q, k, v = _qkv(lq=4, sk=6, grad=False)
    c = one(count(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
            "aten._scaled_dot_product_flash_attention_for_cpu")
    # top-left: row i attends keys 0..i -> 1+2+3+4 = 10 pairs per (b, h): 8 * 10 * 32 = 2560
    assert c.flops == BH * 10 * 32


def test_attn_mask_counts_dense_work_and_reads_the_mask():
    q, k, v = _qkv(grad=False)
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    rec = count(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    c = one(rec, "aten._scaled_dot_product_flash_attention_for_cpu")
    assert c.flops == FWD_DENSE  # a mask does not skip work in the kernel
    # the bool mask is turned into a float additive mask (6x6 fp32 = 144 B), read by the kernel
    assert c.bytes_read == 4608 + 144


def test_gqa_counts_query_heads_and_reads_fewer_kv_bytes():
    q, k, v = _qkv(hk=2)
    rec = count(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True).sum().backward())
    f = one(rec, "aten._scaled_dot_product_flash_attention_for_cpu")
    b = one(rec, "aten._scaled_dot_product_flash_attention_for_cpu_backward")
    assert (f.flops, b.flops) == (FWD_DENSE, BWD_DENSE)  # work follows the 4 query heads
    assert f.bytes_read == (384 + 2 * 192) * 4  # q 384 elements, k and v 192 each


def test_sdpa_flops_equal_torch_formulas_when_not_causal():
    q, k, v = _qkv()
    rec = count(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    assert one(rec, "aten._scaled_dot_product_flash_attention_for_cpu").flops == flop_counter.sdpa_flop_count(
        q.shape, k.shape, v.shape)
    assert one(rec, "aten._scaled_dot_product_flash_attention_for_cpu_backward").flops == \
        flop_counter.sdpa_backward_flop_count(q.shape, q.shape, k.shape, v.shape)
    # FlopCounterMode itself has no formula for the CPU kernel (counts 0): we do
    with FlopCounterMode(display=False) as fc:
        F.scaled_dot_product_attention(q, k, v)
    assert fc.get_total_flops() == 0


def _lookup(op):
    return DEFAULT_REGISTRY.lookup(op).flops


def test_cuda_sdpa_kernels_by_shape_forward_and_backward():
    q = S([B, H, L, D])
    lse = S([B, H, L])
    for causal, fwd, bwd in [(False, FWD_DENSE, BWD_DENSE), (True, FWD_CAUSAL, BWD_CAUSAL)]:
        # _scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, return_debug_mask, *, scale)
        assert _lookup(aten._scaled_dot_product_flash_attention.default)(q, q, q, 0.0, causal, out=None) == fwd
        # (grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, seed, offset)
        assert _lookup(aten._scaled_dot_product_flash_attention_backward.default)(
            q, q, q, q, q, lse, S([0]), S([0]), L, L, 0.0, causal, S([]), S([]), out=None) == bwd
        # efficient(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal)
        assert _lookup(aten._scaled_dot_product_efficient_attention.default)(
            q, q, q, None, True, 0.0, causal, out=None) == fwd
        # (grad_out_, q, k, v, attn_bias, out, logsumexp, seed, offset, dropout_p, grad_input_mask, is_causal)
        assert _lookup(aten._scaled_dot_product_efficient_attention_backward.default)(
            q, q, q, q, S([0]), q, lse, S([]), S([]), 0.0, [True, True, True, False], causal, out=None) == bwd
        # cudnn(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask)
        assert _lookup(aten._scaled_dot_product_cudnn_attention.default)(
            q, q, q, None, True, 0.0, causal, False, out=None) == fwd
        # (grad_out, q, k, v, out, lse, seed, offset, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, causal)
        assert _lookup(aten._scaled_dot_product_cudnn_attention_backward.default)(
            q, q, q, q, q, lse, S([]), S([]), S([0]), S([0]), S([0]), L, L, 0.0, causal, out=None) == bwd
        # _cudnn_attention_forward is (B, H, L, D) as well
        assert _lookup(aten._cudnn_attention_forward.default)(
            q, q, q, None, None, None, L, L, True, 0.0, causal, out=None) == fwd


def test_low_level_flash_and_efficient_kernels_use_blhd_layout_and_bottom_right_causal():
    q = S([B, L, H, D])  # (batch, seq, heads, dim)
    flash = _lookup(aten._flash_attention_forward.default)
    # (q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask)
    assert flash(q, q, q, None, None, L, L, 0.0, False, False, out=None) == FWD_DENSE
    assert flash(q, q, q, None, None, L, L, 0.0, True, False, out=None) == FWD_CAUSAL
    # Lq=4 < Sk=6, bottom-right: row i attends keys <= i + 2 -> 3+4+5+6 = 18 pairs; 8 * 18 * 32 = 4608
    q4, k6 = S([B, 4, H, D]), S([B, 6, H, D])
    assert flash(q4, k6, k6, None, None, 4, 6, 0.0, True, False, out=None) == BH * 18 * 32
    # sliding window left=1, right=0 (L=S=6): keys i-1..i -> 6 + 5 = 11 pairs
    assert flash(q, q, q, None, None, L, L, 0.0, False, False, out=None, window_size_left=1,
                 window_size_right=0) == BH * 11 * 32
    # varlen: 2 sequences of 6 packed as (T=12, H, D), cum_seq_q has 3 entries -> same as dense B=2
    assert flash(S([12, H, D]), S([12, H, D]), S([12, H, D]), S([3]), S([3]), 6, 6, 0.0, True, False,
                 out=None) == FWD_CAUSAL
    fb = _lookup(aten._flash_attention_backward.default)
    lse = S([B, H, L])
    assert fb(q, q, q, q, q, lse, None, None, L, L, 0.0, True, S([2]), S([]), out=None) == BWD_CAUSAL
    eff = _lookup(aten._efficient_attention_forward.default)
    # (q, k, v, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, custom_mask_type)
    assert eff(q, q, q, None, None, None, None, None, 0.0, 0, out=None) == FWD_DENSE
    assert eff(q4, k6, k6, None, None, None, None, None, 0.0, 1, out=None) == BH * 10 * 32  # top-left
    assert eff(q4, k6, k6, None, None, None, None, None, 0.0, 2, out=None) == BH * 18 * 32  # bottom-right
    eb = _lookup(aten._efficient_attention_backward.default)
    # (grad_out_, q, k, v, bias, out, cu_q, cu_k, max_q, max_k, logsumexp, dropout_p, seed, offset, mask_type, ...)
    assert eb(q, q, q, q, None, q, None, None, L, L, lse, 0.0, S([]), S([]), 1, False, out=None) == BWD_CAUSAL


def test_torch_flop_counter_misreads_the_blhd_layout_of_low_level_kernels():
    # documented difference: torch reads (B, L, H, D) as (B, H, L, D)
    q4, k6 = S([B, 4, H, D]), S([B, 6, H, D])
    ours = _lookup(aten._flash_attention_forward.default)(q4, k6, k6, None, None, 4, 6, 0.0, False, False, out=None)
    assert ours == BH * 24 * 32  # 4*6 pairs per (b, h) = 6144
    with pytest.raises(AssertionError):  # its shape check rejects the (B, L, H, D) key with a different L
        flop_counter.sdpa_flop_count(q4, k6, k6)


def test_cuda_kernels_through_count_op_on_meta_tensors():
    m = torch.empty(B, H, L, D, device="meta")
    mb = torch.empty(B, L, H, D, device="meta")
    rec = count(lambda: (aten._scaled_dot_product_flash_attention(m, m, m, 0.0, True),
                         aten._scaled_dot_product_efficient_attention(m, m, m, None, True, 0.0, False),
                         aten._flash_attention_forward(mb, mb, mb, None, None, L, L, 0.0, True, False)))
    assert one(rec, "aten._scaled_dot_product_flash_attention").flops == FWD_CAUSAL
    assert one(rec, "aten._scaled_dot_product_efficient_attention").flops == FWD_DENSE
    fl = one(rec, "aten._flash_attention_forward")
    # the same tensor three times is read once: 384 * 4 B; writes out 1536 + lse 192 + rng state (16+8) B
    assert fl.flops == FWD_CAUSAL and fl.bytes_read == 1536
    assert fl.bytes_written == 1536 + 192 + 16 + 8
    # FlopCounterMode agrees on the SDPA-level kernels when not causal
    with FlopCounterMode(display=False) as fc:
        aten._scaled_dot_product_efficient_attention(m, m, m, None, True, 0.0, False)
    assert fc.get_total_flops() == FWD_DENSE


def test_model_and_full_square_conventions_for_mfu():
    """Hardware FLOPs (the roofline's), model FLOPs (MFU: backward = 2x forward) and the full-square convention."""
    import tscope_callbacks as ts
    from tscope_callbacks.analysis.throughput import model_flops

    B, H, L, D = 2, 3, 16, 8
    q = torch.randn(B, H, L, D, requires_grad=True)
    k, v = torch.randn(B, H, L, D, requires_grad=True), torch.randn(B, H, L, D, requires_grad=True)
    m = torch.nn.Identity()
    with ts.profile(m) as prof:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    att = [r for r in prof.ops if r.category == "attention"]
    fwd = next(r for r in att if r.phase == "forward")
    bwd = next(r for r in att if r.phase == "backward")
    pairs = L * (L + 1) // 2  # 136 attended (query, key) pairs per (batch, head)
    assert fwd.flops == 2 * pairs * (D + D) * B * H == 26112 and fwd.flops_model is None
    assert fwd.flops_dense == 2 * L * L * (D + D) * B * H == 49152
    assert bwd.flops == 2 * pairs * (3 * D + 2 * D) * B * H == 65280  # the kernels recompute the scores
    # MFU: 4 GEMMs, like PaLM / Megatron; FlopCounterMode (torch 2.13) counts 2.5x the forward (5 GEMMs, the
    # recomputed scores too: our hardware count over the full square, 2 * L*L * (3*D + 2*D) * B*H = 122,880)
    assert bwd.flops_model == 2 * fwd.flops == 52224
    shape = (B, H, L, D)
    fc_bwd = flop_counter.sdpa_backward_flop_count(shape, shape, shape, shape)
    assert fc_bwd == 2 * L * L * (3 * D + 2 * D) * B * H == 122880 == 2.5 * fwd.flops_dense
    assert bwd.flops_dense == 2 * 49152
    other = sum(r.flops for r in prof.ops if r.category != "attention" and r.phase != "recompute")
    assert model_flops(prof.result) == other + 26112 + 52224 == prof.result.model_flops
    assert model_flops(prof.result, "full") == other + 49152 + 98304
    assert prof.result.total_flops == other + 26112 + 65280  # hardware (HFU, achieved TFLOP/s)


def test_explicit_causal_mask_counts_the_same_model_flops_as_is_causal():
    """A causal mask passed as a tensor (bool, or HF's additive finfo.min mask) gives the model count of
    ``is_causal``: the pairs the mask lets through; the hardware count stays the full square (a dense mask skips
    no work).
    B=2, H=4, L=64, d=16: P = 64*65/2 = 2080 attended pairs; forward model = B*H*P*2*(d+d) = 8*2080*64 = 1,064,960;
    backward model = 2x forward = 2,129,920; full square: forward 8*4096*64 = 2,097,152."""
    b, h, n, d = 2, 4, 64, 16
    q = torch.randn(b, h, n, d, requires_grad=True)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    hf_mask = torch.zeros(n, n).masked_fill(~causal, torch.finfo(torch.float32).min)  # HF's additive mask
    anchor = torch.nn.Linear(1, 1)
    got = {}
    for name, kw in (("is_causal", {"is_causal": True}), ("bool", {"attn_mask": causal}),
                     ("float", {"attn_mask": hf_mask})):
        with ts.profile(anchor) as p:
            F.scaled_dot_product_attention(q, q, q, **kw).sum().backward()
        got[name] = [(r.phase, r.flops_model if r.flops_model is not None else r.flops, r.flops)
                     for r in p.ops if r.category == "attention"]
    assert [m for _, m, _ in got["is_causal"]] == [1_064_960, 2_129_920]
    assert [m for _, m, _ in got["bool"]] == [m for _, m, _ in got["float"]] == [1_064_960, 2_129_920]
    assert got["bool"][0][2] == 2_097_152  # hardware: the kernel runs the full square


def test_mask_is_read_when_the_call_runs_not_at_stop():
    """Inductor reuses a dead buffer in place, so the mask's memory may hold other data by the time the capture
    stops (on an H100 the compiled GPT-2 step counted its attention as the full square: 309 vs 155 GFLOP forward).
    Simulated here by overwriting the mask after the step: the count still follows the mask the call saw.
    B=2, H=4, L=64, d=16: forward model FLOPs = 8 * 2080 pairs * 64 = 1,064,960 (see the test above)."""
    b, h, n, d = 2, 4, 64, 16
    q = torch.randn(b, h, n, d, requires_grad=True)
    anchor = torch.nn.Linear(1, 1)
    for mask in (torch.ones(n, n, dtype=torch.bool).tril(),
                 torch.zeros(n, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))):
        with ts.profile(anchor) as p:
            F.scaled_dot_product_attention(q, q, q, attn_mask=mask).sum().backward()
            F.scaled_dot_product_attention(q, q, q, attn_mask=mask).sum().backward()  # same mask: reduced once
            with torch.no_grad():
                mask.fill_(True if mask.dtype == torch.bool else 0.0)  # the buffer now lets every pair through
        model = [r.flops_model for r in p.ops if r.category == "attention"]
        assert model == [1_064_960, 2_129_920] * 2, mask.dtype


def test_mask_fraction_reads_values_and_skips_meta():
    from tscope_callbacks.formulas.attention import kept_share, mask_kept, masked_counts

    def mask_fraction(mask):  # counted on the device, then read, as capture.masks does
        return kept_share(mask_kept(mask), mask.numel())

    m = torch.ones(4, 4, dtype=torch.bool).tril()  # 10 of 16
    assert mask_fraction(m) == pytest.approx(10 / 16)
    assert mask_fraction(torch.zeros(2, 1, 4, 4)) == 1.0  # an all-zero additive mask lets every pair through
    assert mask_fraction(torch.empty(4, 4, device="meta")) is None
    assert masked_counts(1000, None, None) == (1000, None)
    assert masked_counts(1000, None, 0.5) == (500, 1000)


def _eager_attention(q, k, v, mask):
    """Attention written as ops, as HF's eager_attention_forward does: scores, scale, mask, softmax, P V."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    elif mask is not None:
        scores = scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("spelling", ["bool", "additive"])
def test_eager_attention_counts_the_model_flops_of_sdpa_for_the_same_mask(spelling):
    """Model FLOPs do not depend on how attention is written: eager's two GEMMs (and the four of their backward)
    count the pairs the mask lets through, and the scale/mask/softmax between them count none, as SDPA's formula.
    B=2, H=4, L=64, d=16, causal: P = 64*65/2 = 2080 pairs; forward = B*H * P * 2 * (d + d) = 8*2080*64 =
    1,064,960 (QK^T 532,480 + PV 532,480); backward = 2x = 2,129,920. Eager counted the full square before:
    forward 2 * 8*64*64*16 * 2 = 2,097,152 plus the softmax and masking ops. The hardware FLOPs stay the full square."""
    b, h, n, d = 2, 4, 64, 16
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    mask = causal if spelling == "bool" else torch.zeros(n, n).masked_fill(~causal, torch.finfo(torch.float32).min)
    anchor = torch.nn.Linear(1, 1)
    with ts.profile(anchor) as eager:
        _eager_attention(q, k, v, mask).sum().backward()
    q.grad = k.grad = v.grad = None  # (accumulating into them would add 3 * 8192 FLOPs to the second backward)
    with ts.profile(anchor) as sdpa:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()

    def attention_model(p):  # all but the final .sum() and the ops on the mask alone (eager's ~mask, SDPA's where)
        return {ph: sum(r.model_flops for r in p.ops if r.phase == ph and r.op != "aten.sum"
                        and r.input_shapes[:1] != [[n, n]]) for ph in ("forward", "backward")}

    assert attention_model(eager) == attention_model(sdpa) == {"forward": 1_064_960, "backward": 2_129_920}
    bmm = [r for r in eager.ops if r.op == "aten.bmm"]
    assert [r.flops for r in bmm] == [2 * 8 * 64 * 64 * 16] * 6  # hardware: the full square
    assert [r.flops_dense for r in bmm] == [r.flops for r in bmm]


def test_eager_attention_without_a_mask_keeps_its_gemms():
    # no mask: the GEMMs count in full (B*H * L*L * 2 * (d + d) = 8 * 4096 * 64 = 2,097,152 forward), the softmax
    # counts no model FLOPs, as for SDPA without a mask
    b, h, n, d = 2, 4, 64, 16
    q = torch.randn(b, h, n, d, requires_grad=True)
    with ts.profile(torch.nn.Linear(1, 1)) as p:
        _eager_attention(q, q, q, None).sum().backward()
    assert sum(r.model_flops for r in p.ops if r.phase == "forward" and r.op != "aten.sum") == 2_097_152
    assert all(r.model_flops == 0 for r in p.ops if r.category == "softmax")
