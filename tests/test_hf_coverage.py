"""Every op of a training step of real model families has a formula: tiny Hugging Face models built from a config
(no download), forward + backward under ``ts.profile``, no uncounted op. Covers what a hand-written test model
would not: MoE routing (``histc``, ``_grouped_mm``, top-k, scatter), Mamba's selective scan, RWKV's recurrence,
T5's relative position bias, DeBERTa's disentangled attention."""

from __future__ import annotations

import pytest
import torch

import tscope_callbacks as ts

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=128)
FAMILIES = {
    "mixtral": (transformers.MixtralConfig, dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": (transformers.Qwen2MoeConfig, dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                                    moe_intermediate_size=64, shared_expert_intermediate_size=64)),
    "mamba": (transformers.MambaConfig, dict(state_size=8, expand=2, conv_kernel=4, time_step_rank=8)),
    "rwkv": (transformers.RwkvConfig, dict(attention_hidden_size=64, context_length=128)),
    "deberta-v2": (transformers.DebertaV2Config, {}),
    "gemma2": (transformers.Gemma2Config, dict(num_key_value_heads=2, head_dim=16)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_training_step_has_no_uncounted_op(family):
    cfg_cls, extra = FAMILIES[family]
    names = set(cfg_cls().to_dict())
    cfg = cfg_cls(**{k: v for k, v in {**SMALL, **extra}.items() if k in names or k in extra})
    auto = transformers.AutoModelForMaskedLM if family == "deberta-v2" else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    model = auto.from_config(cfg)
    ids = torch.randint(0, 200, (2, 16))
    with ts.profile(model) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    assert prof.uncounted_ops() == {}, f"{family}: no formula for {prof.uncounted_ops()}"
    assert prof.coverage() == 1.0
    mm = [r for r in prof.ops if r.category == "matmul" and r.phase == "backward"]
    assert mm and all(r.flops > 0 for r in mm)  # the backward ran and was counted
