"""Attention dropout on a CPU: SDPA with ``dropout_p > 0`` runs its math path (the dispatch sees bmm, softmax and
dropout's ops, no attention op), which must count the model FLOPs the fused op counts without dropout."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import tscope_callbacks as ts
from tscope_callbacks.records import model_flops, op_model_flops

transformers = pytest.importorskip("transformers")

# GPT-2: 2 layers, d=32, 2 heads (head dim 16), T=256, batch 4; B*H = 8 (batch, head) pairs per layer.
# Causal pairs per (batch, head): 256*257/2 = 32,896 of the 256*256 = 65,536 square.
# One GEMM (Q K^T or P V) over the square: 2 * 8 * 256*256 * 16 = 16,777,216 FLOPs; over the attended pairs:
# 2 * 8 * 32,896 * 16 = 8,421,376.
# Per layer, forward: attended 2 * 8,421,376 = 16,842,752; full 2 * 16,777,216 = 33,554,432.
# Per layer, backward (4 GEMMs = 2x forward): attended 33,685,504; full 67,108,864.
PER_LAYER = {"attended": {"forward": 16_842_752, "backward": 33_685_504},
             "full": {"forward": 33_554_432, "backward": 67_108_864}}
# full - attended over the step: 2 layers * ((33,554,432 - 16,842,752) + (67,108,864 - 33,685,504))
# = 2 * (16,711,680 + 33,423,360) = 100,270,080
FULL_MINUS_ATTENDED = 100_270_080


def _gpt2(attn_pdrop: float, train: bool = True, impl: str = "sdpa"):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=256,
                                  attn_pdrop=attn_pdrop, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_implementation=impl)
    model = transformers.GPT2LMHeadModel(cfg).train(train)
    x = torch.randint(0, 128, (4, 256), generator=torch.Generator().manual_seed(1))
    with ts.profile(model) as prof:
        if train:
            model(x, labels=x).loss.backward()
        else:
            with torch.no_grad():
                model(x)
    return prof.result


def _attention(result, convention: str) -> dict:
    """Per (layer, phase): the model FLOPs of the attention's GEMMs (the math path's bmm) or of the fused op."""
    out: dict = {}
    for r in result.ops:
        if r.layer.endswith(".attn") and (r.op == "aten.bmm" or r.category == "attention"):
            key = (r.layer, r.phase)
            out[key] = out.get(key, 0) + op_model_flops(r, convention)
    return out


@pytest.fixture(scope="module")
def gpt2_runs():
    return {p: _gpt2(p) for p in (0.0, 0.1)}


def test_gpt2_attention_dropout_takes_the_math_path(gpt2_runs):
    dropped, plain = gpt2_runs[0.1], gpt2_runs[0.0]
    assert not [r for r in dropped.ops if r.category == "attention"]  # the math path: no attention op
    assert [r.op for r in plain.ops if r.category == "attention"] == [
        "aten._scaled_dot_product_flash_attention_for_cpu"] * 2 + [
        "aten._scaled_dot_product_flash_attention_for_cpu_backward"] * 2
    bmm = [r for r in dropped.ops if r.op == "aten.bmm" and r.layer.endswith(".attn")]
    assert len(bmm) == 2 * (2 + 4)  # per layer: Q K^T and P V, and the four GEMMs of their backward
    assert [r.flops for r in bmm] == [16_777_216] * 12  # hardware: the math path computes the full square
    assert [r.model_flops for r in bmm] == [8_421_376] * 12  # model: the attended pairs
    assert [r.flops_dense for r in bmm] == [16_777_216] * 12


@pytest.mark.parametrize("convention", ["attended", "full"])
def test_gpt2_with_and_without_attention_dropout_count_the_same_attention(gpt2_runs, convention):
    want = {(f"transformer.h.{i}.attn", ph): PER_LAYER[convention][ph] for i in range(2)
            for ph in ("forward", "backward")}
    assert _attention(gpt2_runs[0.1], convention) == want
    assert _attention(gpt2_runs[0.0], convention) == want


def test_gpt2_step_model_flops_do_not_depend_on_attention_dropout(gpt2_runs):
    # the math path's scale of Q and K, its causal mask from is_causal, its softmax and its dropout count no
    # model FLOPs, as the fused op's formula counts none for them: the whole step counts what dropout 0 counts
    dropped, plain = gpt2_runs[0.1], gpt2_runs[0.0]
    for convention in ("attended", "full"):
        assert model_flops(dropped, convention) == model_flops(plain, convention), convention
    assert model_flops(dropped, "full") - model_flops(dropped, "attended") == FULL_MINUS_ATTENDED
    # what RooflineCallback(mfu=ts.MFUOptions(attention_flops="full")) sets
    full = dataclasses.replace(dropped, info=dataclasses.replace(dropped.info, attention_flops="full"))
    assert full.model_flops == model_flops(plain, "full") != dropped.model_flops == model_flops(plain, "attended")
    # dropout's own elementwise work: hardware FLOPs (4*2*256*256 = 524,288 each), no model FLOPs
    drop = [r for r in dropped.ops if r.layer.endswith(".attn") and r.phase == "forward"
            and r.op in ("aten.bernoulli_", "aten.div_", "aten.mul") and r.input_shapes[0] == [4, 2, 256, 256]]
    assert [r.op for r in drop] == ["aten.bernoulli_", "aten.div_", "aten.mul"] * 2
    assert [r.flops for r in drop] == [524_288] * 6 and [r.model_flops for r in drop] == [0] * 6
    # the rest of the step is the same op for op; the hardware count keeps the math path's extra work
    assert dropped.total_flops > plain.total_flops


def test_gpt2_eval_is_unchanged_by_attention_dropout():
    # eval: HF passes dropout 0, the fused op runs; forward per layer 16,842,752 attended (see above)
    dropped, plain = _gpt2(0.1, train=False), _gpt2(0.0, train=False)
    for convention in ("attended", "full"):
        assert model_flops(dropped, convention) == model_flops(plain, convention)
        assert _attention(dropped, convention) == {(f"transformer.h.{i}.attn", "forward"):
                                                   PER_LAYER[convention]["forward"] for i in range(2)}


def test_hf_eager_attention_with_cpu_dropout_counts_its_gemms_as_without():
    # HF eager attention drops out with F.dropout, which a CPU runs as empty_like/bernoulli_/div_/mul (CUDA:
    # native_dropout): its GEMMs count the attended pairs as without dropout (per layer as above)
    dropped, plain = _gpt2(0.1, impl="eager"), _gpt2(0.0, impl="eager")
    for convention in ("attended", "full"):
        want = {(f"transformer.h.{i}.attn", ph): PER_LAYER[convention][ph] for i in range(2)
                for ph in ("forward", "backward")}
        assert _attention(dropped, convention) == _attention(plain, convention) == want, convention
        assert model_flops(dropped, convention) == model_flops(plain, convention), convention


@pytest.mark.parametrize("mask", ["is_causal", "bool"])
def test_sdpa_dropout_counts_what_sdpa_without_dropout_counts(mask):
    """F.scaled_dot_product_attention on a CPU, dropout 0.1 (math path) and 0 (the fused CPU kernel).
    B=2, H=4, L=64, d=16, causal: P = 64*65/2 = 2080 pairs; forward attended = B*H * P * 2 * (d + d) =
    8*2080*64 = 1,064,960, backward 2x = 2,129,920; full square: forward 8*4096*64 = 2,097,152, backward 4,194,304."""
    b, h, n, d = 2, 4, 64, 16
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    kw = {"is_causal": True} if mask == "is_causal" else {"attn_mask": causal}
    anchor = torch.nn.Linear(1, 1)
    runs = {}
    for p in (0.1, 0.0):
        q.grad = k.grad = v.grad = None
        with ts.profile(anchor) as prof:
            F.scaled_dot_product_attention(q, k, v, dropout_p=p, **kw).sum().backward()
        runs[p] = prof.result
    assert not [r for r in runs[0.1].ops if r.category == "attention"]
    assert [r.category for r in runs[0.0].ops if r.category == "attention"] == ["attention"] * 2
    want = {"attended": {"forward": 1_064_960, "backward": 2_129_920},
            "full": {"forward": 2_097_152, "backward": 4_194_304}}
    for convention in ("attended", "full"):
        gemms = {ph: sum(op_model_flops(r, convention) for r in runs[0.1].ops
                         if r.op == "aten.bmm" and r.phase == ph) for ph in ("forward", "backward")}
        assert gemms == want[convention], convention
        assert model_flops(runs[0.1], convention) == model_flops(runs[0.0], convention), convention


def test_a_reused_storage_address_does_not_carry_an_earlier_layers_scale(monkeypatch):
    # the math path scales Q and K by a number and copies them ahead of its Q K^T GEMM; each copy joins the scale's
    # entry by storage address. When layer 2's copy lands at the address of layer 1's dead copy (the allocator reuses
    # it: T5 train on CPU, about one process in 10-30), the copy joined layer 1's stale entry, so layer 2's GEMM took
    # layer 1's scale and its own Q scale (2*4*32*32 = 8,192 FLOPs) counted as model FLOPs, forward and backward.
    # The reuse simulated here by a storage id both copies share
    from tscope_callbacks.capture import masks

    real_sid = masks.storage_id
    monkeypatch.setattr(masks, "storage_id", lambda t: getattr(t, "_fake_sid", None) or real_sid(t))
    ea, mute = masks.EagerAttention(masks.MaskCounts()), lambda: __import__("contextlib").nullcontext()
    aten, seq = torch.ops.aten, iter(range(1, 100))

    def layer(first: int) -> masks._Chain:
        q, k = torch.randn(2, 4, 8), torch.randn(2, 8, 4)
        qs, ks = q * 0.5, k * 0.5
        ea.forward(first, aten.mul.Tensor, "pointwise", (q, 0.5), qs, next(seq), mute)
        ea.forward(first + 1, aten.mul.Tensor, "pointwise", (k, 0.5), ks, next(seq), mute)
        qc = qs.clone()
        qc._fake_sid = 12345  # the same address in both layers
        ea.forward(first + 2, aten.clone.default, "memory", (qs,), qc, next(seq), mute)
        scores = torch.bmm(qc, ks)
        ea.forward(first + 3, aten.bmm.default, "matmul", (qc, ks), scores, next(seq), mute)
        return ea._chain_of(scores)

    assert layer(0).scaled == 0
    chain = layer(10)  # layer 1's tensors are dead: its entries stale
    assert chain.scaled == 10 and {10, 11} <= set(chain.ops) and 0 not in chain.ops
