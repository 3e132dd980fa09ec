"""Capture on real model families: HF GPT-2 (ModelOutput, kwargs), the bundled TinyGPT, meta-device analysis."""

from __future__ import annotations

import pytest
import torch

import tscope_callbacks as ts
from tscope_callbacks.demo.model import GPTConfig, TinyGPT, matmul_flops, random_tokens

transformers = pytest.importorskip("transformers")


def _gpt2(n_layer=2, d=64, heads=4, vocab=128, pos=32):
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=d, n_head=heads, vocab_size=vocab, n_positions=pos,
                                  bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_gpt2_matmul_flops_match_analytic_forward_and_backward():
    model = _gpt2()
    b, t, d, v, L = 2, 16, 64, 128, 2
    ids = torch.randint(0, v, (b, t))
    with ts.profile(model) as prof:
        out = model(input_ids=ids, attention_mask=torch.ones(b, t, dtype=torch.long), labels=ids)
        out.loss.backward()
    n = b * t
    # per block (Conv1D = addmm): c_attn 2*n*d*3d + attn.c_proj 2*n*d*d + mlp.c_fc 2*n*d*4d + mlp.c_proj 2*n*4d*d
    per_block = 2 * n * d * 3 * d + 2 * n * d * d + 2 * n * d * 4 * d + 2 * n * 4 * d * d  # = 24*n*d^2 = 3,145,728
    head = 2 * n * d * v  # lm_head: 2*32*64*128 = 524,288
    fwd = sum(r.flops for r in prof.ops if r.phase == "forward" and r.category == "matmul")
    assert fwd == L * per_block + head
    # backward: weight grads for every layer (same FLOPs as forward) + input grads for every layer
    # (the embeddings' input is integer ids, so every matmul's input needs a grad) -> exactly 2x forward
    bwd = sum(r.flops for r in prof.ops if r.phase == "backward" and r.category == "matmul")
    assert bwd == 2 * fwd
    # per-layer attribution in backward: the MLP's matmuls land on the MLP's modules
    by_layer = {}
    for r in prof.ops:
        if r.category == "matmul" and r.phase == "backward":
            by_layer[r.layer] = by_layer.get(r.layer, 0) + r.flops
    assert by_layer["transformer.h.1.mlp.c_fc"] == 2 * (2 * n * d * 4 * d)
    # attention goes through a fused SDPA op, counted as attention (causal)
    assert any(r.category == "attention" and r.counted for r in prof.ops)
    assert prof.layers["transformer.h.0"].calls == 1
    assert prof.coverage() > 0.9


def test_tinygpt_counts_match_analytic_with_tied_weights():
    cfg = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layer=2, n_head=4, tie_weights=True)
    model = TinyGPT(cfg)
    x, y = random_tokens(cfg, 3)
    with ts.profile(model) as prof:
        model.loss(x, y).backward()
    fwd = sum(r.flops for r in prof.ops if r.phase == "forward" and r.category == "matmul")
    assert fwd == matmul_flops(cfg, 3)["total"]
    # tied head/embedding weight: one parameter, counted once, owned by the first path that registers it
    assert prof.layers[""].num_parameters == sum(p.numel() for p in model.parameters())


def test_analyze_model_on_meta_for_a_gpu_not_here():
    pytest.importorskip("tscope_callbacks.analysis.roofline")
    cfg = GPTConfig(vocab_size=256, seq_len=128, d_model=256, n_layer=2, n_head=4)
    report = ts.analyze_model(TinyGPT(cfg), input_shape=[(8, 128)], input_dtypes=["long"], gpu="NVIDIA H100 80GB HBM3",
                              precision="bf16", backward=True)
    prof = report.profile
    assert prof.info.timing == "none" and all(r.time_s is None for r in prof.ops)
    fwd = sum(r.flops for r in prof.ops if r.phase == "forward" and r.category == "matmul")
    assert fwd == matmul_flops(cfg, 8)["total"]
    assert {r.dtype for r in prof.ops if r.category == "matmul"} == {"bfloat16"}
    assert report.summary.roof_step_s > 0 and report.summary.estimated_step_s >= report.summary.roof_step_s
