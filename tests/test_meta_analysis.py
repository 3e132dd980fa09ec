"""``analyze_model`` correct by default: token inputs inferred, the attention op the target device runs (never the
math path, GQA without repeat), HF losses, T5 backward on meta, autocast emulated for "bf16-mixed", and counts on
meta equal to a real run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tscope_callbacks as ts
from tscope_callbacks import api
from tscope_callbacks.capture.meta_run import AutocastAs, backend_for

transformers = pytest.importorskip("transformers")


def _llama(n_kv: int = 2):
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                                   num_key_value_heads=n_kv, vocab_size=1000, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _attention(rep):
    return [o for o in rep.profile.ops if o.category == "attention"]


def test_backend_for_the_target_device():
    assert backend_for(ts.get_device_spec("h100")) == "cudnn"
    assert backend_for(ts.get_device_spec("h200")) == "cudnn"
    assert backend_for(ts.get_device_spec("a100")) == "flash"
    assert backend_for(ts.get_device_spec(torch.device("cpu"))) == "cpu"


def test_token_inputs_inferred_for_an_embedding_first_model():
    # used to raise "Expected tensor for argument #1 'indices' to have ... Long" with bf16 inputs
    with torch.device("meta"):
        g = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000))
    rep = ts.analyze_model(g, input_shape=[(4, 64)], gpu="h100", precision="bf16")
    emb = next(o for o in rep.profile.ops if o.category == "embedding")
    assert emb.input_shapes[1] == [4, 64] and emb.dtype == "bfloat16"
    # lm_head: 2 * 256 tokens * 128 * 1000
    assert any(o.flops == 2 * 256 * 128 * 1000 for o in rep.ops if o.layer == "lm_head")


def test_gpt2_on_h100_counts_cudnn_attention_and_its_real_loss():
    with torch.device("meta"):
        g = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000))
    rep = ts.analyze_model(g, input_shape=[(2, 256)], gpu="h100", precision="bf16", backward=True)
    assert rep.profile.info.attention_calls == {"cudnn": 2}
    assert rep.profile.info.backward_from == "loss (labels = input ids)"
    att = _attention(rep)
    assert {a.op for a in att} == {"aten._scaled_dot_product_cudnn_attention",
                                   "aten._scaled_dot_product_cudnn_attention_backward"}
    # causal forward: B*H * pairs * 4 * D = 2*4 * (256*257/2) * 4 * 32 = 33,685,504 FLOPs per layer
    assert [a.flops for a in att if a.phase == "forward"] == [2 * 4 * (256 * 257 // 2) * 4 * 32] * 2
    assert any(o.category == "loss" for o in rep.ops)  # cross-entropy, not a sum over the logits


def test_gqa_on_meta_takes_the_fused_path_and_matches_a_real_run():
    lm = _llama(n_kv=2)
    ids = torch.randint(0, 1000, (2, 128))
    meta = ts.analyze_model(lm, inputs=[ids], gpu="a100", precision="bf16", backward=True)
    real = ts.analyze_model(lm, inputs=[ids], gpu="a100", precision="bf16", backward=True, device="cpu")
    assert meta.profile.info.attention_calls == {"flash": 2}
    # no math fallback and no K/V repeat on meta
    assert not any(o.op in ("aten.repeat_interleave", "aten.bmm") for o in meta.ops
                   if o.layer.endswith("self_attn"))
    # causal, 8 query heads over 2 kv heads: 2*8 * (128*129/2) * 4 * 32 = 16,908,288 forward FLOPs per layer
    fwd = [a.flops for a in _attention(meta) if a.phase == "forward"]
    assert fwd == [2 * 8 * (128 * 129 // 2) * 4 * 32] * 2
    assert fwd == [a.flops for a in _attention(real) if a.phase == "forward"]
    assert [a.flops for a in _attention(meta) if a.phase == "backward"] == [
        a.flops for a in _attention(real) if a.phase == "backward"]
    # the whole step: FLOPs equal, bytes within 1%
    assert meta.summary.total_flops == real.summary.total_flops
    assert meta.summary.total_bytes == pytest.approx(real.summary.total_bytes, rel=0.01)


def test_t5_backward_on_meta():
    # the relative position bias requires grad: it goes to the mem-efficient kernel (bias gradient) on a GPU
    cfg = transformers.T5Config(d_model=128, d_ff=256, num_layers=2, num_heads=4, vocab_size=1000, d_kv=32,
                                decoder_start_token_id=0, pad_token_id=0)
    with torch.device("meta"):
        t5 = transformers.T5ForConditionalGeneration(cfg)
    ids = torch.zeros(2, 32, dtype=torch.long, device="meta")
    rep = ts.analyze_model(t5, inputs=[ids], gpu="h100", precision="bf16", backward=True)
    assert set(rep.profile.info.attention_calls) == {"efficient"}
    assert any(a.phase == "backward" for a in _attention(rep))


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(h + 0.044715 * torch.pow(h, 3.0))


def test_autocast_emulation_matches_cuda_autocast_rules():
    # meta, bf16-mixed: fp32 weights cast to bf16 once, linears in bf16, pow in fp32 (CUDA autocast's fp32 list),
    # then mul/add promote to fp32, and fc2 casts its input back to bf16
    rep = ts.analyze_model(_Mlp(), input_shape=[(32, 64)], gpu="h100", precision="bf16-mixed")
    by = [(o.op, o.dtype, o.layer) for o in rep.ops if o.category != "view"]
    mm = [d for op, d, _ in by if op in ("aten.addmm", "aten.mm")]
    assert mm == ["bfloat16", "bfloat16"]
    assert ("aten.pow", "float32", "") in by
    # casts: x, fc1.weight, fc1.bias (fc1); h to fp32 (pow); the fp32 sum, fc2.weight, fc2.bias (fc2) = 7
    copies = [o for o in rep.profile.ops if o.op == "aten._to_copy"]
    assert len(copies) == 7
    # the weights' casts: 64*256 + 256 + 256*64 + 64 params, 4 B read + 2 B written each
    n_w = 64 * 256 + 256 + 256 * 64 + 64
    assert sum(c.bytes for c in copies if c.layer in ("fc1", "fc2") and c.input_shapes[0] != [32, 64]
               and c.input_shapes[0] != [32, 256]) == 6 * n_w
    assert rep.profile.info.analysis_precision == "bf16-mixed"


def test_autocast_emulation_equals_real_autocast_on_the_shared_op_list():
    # CPU and CUDA autocast agree on linear (low precision) and relu (untouched): meta emulation == real CPU autocast
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    meta = ts.analyze_model(model, input_shape=[(16, 64)], gpu="h100", precision="bf16-mixed", backward=True)
    real = ts.analyze_model(model, input_shape=[(16, 64)], gpu="h100", precision="bf16-mixed", backward=True,
                            device="cpu")

    def sig(rep):  # sorted: C++ autocast casts a call's arguments in an unspecified order
        return sorted((o.op, o.dtype, o.flops, o.bytes) for o in rep.ops
                      if o.category != "view")

    assert sig(meta) == sig(real)


def test_autocast_mode_caches_weight_casts():
    w = nn.Parameter(torch.randn(8, 8))
    with AutocastAs(torch.bfloat16) as amp:
        a = torch.nn.functional.linear(torch.randn(2, 8), w)
        b = torch.nn.functional.linear(torch.randn(2, 8), w)
    assert a.dtype == b.dtype == torch.bfloat16 and len(amp._cache) == 1


def test_mixed_needs_a_16_bit_precision():
    with pytest.raises(ValueError, match="bf16 or fp16"):
        api.profile_model(_Mlp(), [(2, 64)], precision="fp32", mixed=True)


def test_a_tied_gpt2_from_the_cpu_counts_on_meta_as_it_runs():
    # moving to meta used to untie wte and lm_head: two weights, no gradient sum for the tie
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)  # CPU SDPA with dropout: math path
    g = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 1000, (2, 64))
    meta = ts.analyze_model(g, inputs=[ids], gpu="h100", backward=True, attention_backend="cpu")
    real = ts.analyze_model(g, inputs=[ids], gpu="h100", backward=True, device="cpu")
    n = sum(p.numel() for p in g.parameters())  # wte counted once
    assert meta.layers[0].num_parameters == real.layers[0].num_parameters == n
    assert meta.summary.total_flops == real.summary.total_flops
    assert [o.op for o in meta.ops if o.category != "view"] == [
        o.op for o in real.ops if o.category != "view"]


def _mixtral():
    cfg = transformers.MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2)
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_moe_grouped_gemms_in_fp32_run_on_meta_and_match_a_real_run(precision):
    """torch's meta kernel of _grouped_mm takes bf16 only; HF's MoE experts call it in fp32 (and under bf16-mixed,
    where HF casts the tokens to the fp32 weights). Both raised a RuntimeError from torch's meta registrations."""
    lm = _mixtral()
    ids = torch.randint(0, 256, (2, 16))
    meta = ts.analyze_model(lm, inputs=[ids], gpu="h100", precision=precision, backward=True)
    real = ts.analyze_model(lm, inputs=[ids], gpu="h100", precision="fp32", backward=True, device="cpu")
    grouped = [o for o in meta.profile.ops if o.op == "aten._grouped_mm"]
    # 2 layers x (gate_up, down) forward, and each one's input and weight gradients backward
    assert len(grouped) == 2 * 2 * 3 and all(r.dtype == "float32" for r in grouped)
    mm = lambda rep: sum(o.flops for o in rep.ops if o.category == "matmul")  # noqa: E731
    assert mm(meta) == mm(real)  # every matmul FLOP, experts included (same routing-independent shapes)
    assert meta.summary.total_flops == pytest.approx(real.summary.total_flops, rel=0.01) and not meta.summary.uncounted_ops


def test_a_model_analysed_in_place_is_left_as_it_was():
    """On its own device at its own dtype, the model itself runs the analysis: its mode, gradients, buffers and (after
    optimizer=) its weights are restored. Before, a second analysis counted the first one's gradients (each backward
    accumulated into them) and optimizer= changed the user's weights."""
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    kw = dict(input_shape=[(32, 8)], gpu="h100", precision="fp32", backward=True, device="cpu")
    first = ts.analyze_model(net, optimizer="adamw", **kw)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # weights and BN statistics
    assert all(p.grad is None for p in net.parameters()) and not net.training
    again = ts.analyze_model(net, optimizer="adamw", **kw)
    assert again.summary.total_flops == first.summary.total_flops and len(again.ops) == len(first.ops)
    g = [torch.ones_like(p) for p in net.parameters()]
    for p, gi in zip(net.parameters(), g):
        p.grad = gi
    ts.analyze_model(net, **kw)
    assert all(p.grad is gi for p, gi in zip(net.parameters(), g))  # the user's own gradients, untouched


def _mistral():
    cfg = transformers.MistralConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, sliding_window=16,
                                     attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(cfg)


@pytest.mark.parametrize("gpu", ["auto", "a100"])
def test_a_sliding_window_mask_on_meta_counts_the_pairs_it_attends(gpu):
    # HF builds the sliding-window mask from constants (arange, comparisons): on meta it used to have no values and
    # the model FLOPs were the full square. Row i attends min(i + 1, 16) keys: 1 + ... + 16 + 48 * 16 = 904 pairs
    # of 64 * 64; forward per layer B*H * P * 2 * (d_qk + d_v) = 2*4 * 904 * 2 * 64 = 925,696 (full square:
    # 2*4 * 4096 * 128 = 4,194,304, what meta counted before)
    lm, ids = _mistral(), torch.randint(0, 1000, (2, 64))
    meta = ts.analyze_model(lm, inputs=[ids], gpu=gpu, backward=True)
    real = ts.analyze_model(lm, inputs=[ids], gpu=gpu, backward=True, device="cpu")
    fwd = [a for a in _attention(meta) if a.phase == "forward"]
    assert [a.model_flops for a in fwd] == [2 * 4 * 904 * 2 * 64] * 2
    assert [a.flops_dense for a in fwd] == [2 * 4 * 64 * 64 * 128] * 2
    assert [a.model_flops for a in _attention(meta)] == [a.model_flops for a in _attention(real)]
    assert meta.summary.model_flops == real.summary.model_flops


def test_bart_on_meta_reads_the_mask_it_built():
    # HF's _ignore_causal_mask_sdpa calls .item() on the padding mask it built with torch.ones: meta used to raise
    # "Tensor.item() cannot be called on meta tensors"; the run knows that mask's values, so it takes is_causal as
    # the real step does (decoder self-attention: 2*4 * (32*33/2) * 2 * 64 = 540,672 forward FLOPs per layer)
    cfg = transformers.BartConfig(d_model=128, encoder_ffn_dim=256, decoder_ffn_dim=256, encoder_layers=2,
                                  decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                                  vocab_size=1000, max_position_embeddings=128)
    torch.manual_seed(0)
    bart, ids = transformers.BartForConditionalGeneration(cfg), torch.randint(3, 1000, (2, 32))
    meta = ts.analyze_model(bart, inputs=[ids], gpu="auto", backward=True)
    real = ts.analyze_model(bart, inputs=[ids], gpu="auto", backward=True, device="cpu")
    dec = [a.flops for a in _attention(meta) if a.phase == "forward" and a.layer.endswith("decoder.layers.0.self_attn")]
    assert dec == [2 * 4 * (32 * 33 // 2) * 2 * 64]
    assert meta.summary.model_flops == real.summary.model_flops and meta.summary.total_flops == real.summary.total_flops


class _ReadsItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) if x.sum().item() > 0 else -self.fc(x)


def test_a_value_meta_cannot_know_says_to_run_on_the_cpu():
    # the input's values do not exist on meta: the error says what helps (a real device), not precision or shapes
    with pytest.raises(Exception, match=r"holds no values.*device='cpu'"):
        ts.analyze_model(_ReadsItsInput(), input_shape=[(4, 8)], gpu="a100")


@pytest.fixture
def cpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu="auto" resolves to this machine's CPU even where a GPU is visible (the tests below are about a CPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_gpu_auto_on_a_cpu_machine_counts_the_cpu_step(cpu_machine):
    # gpu="auto" here is the CPU: meta must run what torch's CPU dispatch runs. GQA (8 query heads over 2 K/V heads):
    # the CPU flash kernel reads the 2 K/V heads directly (it used to fall back to the math path on meta: +3.9%
    # FLOPs), causal forward 2*8 * (128*129/2) * 4 * 32 = 16,908,288 FLOPs per layer, as on the real step
    lm, ids = _llama(n_kv=2), torch.randint(0, 1000, (2, 128))
    meta = ts.analyze_model(lm, inputs=[ids], gpu="auto", backward=True)
    real = ts.analyze_model(lm, inputs=[ids], gpu="auto", backward=True, device="cpu")
    assert meta.profile.info.attention_calls == {"cpu": 2}
    assert [a.flops for a in _attention(meta) if a.phase == "forward"] == [2 * 8 * (128 * 129 // 2) * 4 * 32] * 2
    assert meta.summary.total_flops == real.summary.total_flops and meta.summary.model_flops == real.summary.model_flops
    assert not any(o.op == "aten.bmm" for o in meta.ops if o.layer.endswith("self_attn"))


def test_t5_with_gpu_auto_on_a_cpu_machine(cpu_machine):
    # T5's position bias requires grad and its attention has dropout: the CPU flash kernel takes neither, so the
    # CPU runs the math path (meta used to call the CPU flash op and raise "not differentiable w.r.t. attn_mask")
    cfg = transformers.T5Config(d_model=128, d_ff=256, num_layers=2, num_heads=4, vocab_size=1000, d_kv=32,
                                decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    t5, ids = transformers.T5ForConditionalGeneration(cfg), torch.randint(1, 1000, (2, 32))
    meta = ts.analyze_model(t5, inputs=[ids], gpu="auto", backward=True)
    real = ts.analyze_model(t5, inputs=[ids], gpu="auto", backward=True, device="cpu")
    assert meta.summary.total_flops == real.summary.total_flops and meta.summary.model_flops == real.summary.model_flops


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_eager_and_sdpa_llama_give_the_same_model_flops(device):
    # the same HF Llama (8 heads, no GQA, causal, L=128) with attn_implementation eager and sdpa: eager's attention
    # GEMMs count the 128*129/2 = 8,256 pairs the causal mask keeps, as SDPA's is_causal does. Per layer forward:
    # B*H * P * 2 * (d + d) = 2*8 * 8256 * 2 * 64 = 16,908,288. Eager used to count 4.2% more model FLOPs for the
    # step (its GEMMs over the full square, plus the softmax and masking); what remains is eager building the
    # 128 x 128 mask (le, where, add: 49,408 FLOPs)
    def run(impl):
        cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                       num_attention_heads=8, num_key_value_heads=8, vocab_size=1000,
                                       attn_implementation=impl)
        torch.manual_seed(0)
        return ts.analyze_model(transformers.LlamaForCausalLM(cfg), inputs=[torch.randint(0, 1000, (2, 128))],
                                gpu="auto", backward=True, device=device).profile

    eager, sdpa = run("eager"), run("sdpa")
    per_layer = lambda p, ph: [sum(o.model_flops for o in p.ops if o.phase == ph and o.layer == f"model.layers.{i}.self_attn")  # noqa: E731
                               for i in range(2)]
    # (the attention's own bmm: some transformers versions also compute the rotary angles with a bmm)
    assert [o.model_flops for o in eager.ops if o.op == "aten.bmm" and o.phase == "forward"
            and o.layer.endswith(".self_attn")] == [2 * 8 * 8256 * 2 * 32] * 4  # QK^T and PV, each half of 16,908,288
    for ph in ("forward", "backward"):
        assert per_layer(eager, ph) == per_layer(sdpa, ph)
    assert eager.model_flops - sdpa.model_flops == 49_408


class _ConvLstm(nn.Module):
    """conv + BatchNorm + LSTM + head: an audio/sequence tagger."""

    def __init__(self, layers: int = 1, bidirectional: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm1d(16)
        self.lstm = nn.LSTM(16, 32, num_layers=layers, bidirectional=bidirectional, batch_first=True)
        self.head = nn.Linear(32 * (2 if bidirectional else 1), 4)

    def forward(self, x):
        y, _ = self.lstm(torch.relu(self.bn(self.conv(x))).transpose(1, 2))
        return self.head(y)


def _lstm_ops(rep):
    return [r for r in rep.profile.ops if r.layer == "lstm" and r.flops]


def test_an_lstm_on_meta_is_the_fused_kernel_the_step_runs():
    # x (4, 8, 24): the LSTM sees T = 24 steps x B = 4 = 96 tokens of 16 features, hidden 32 (G = 4 gates):
    # w_ih 128x16 + w_hh 128x32 = 6,144 weights; GEMMs 2 * 96 * 6,144 = 1,179,648; gate math 96 * 32 * 19 = 58,368;
    # forward 1,238,016 in one fused op, backward 2 x that = 2,476,032 (data and weight grads, gate math twice).
    # Meta decomposed it per time step (mm/sigmoid_/tanh/mul/add per gate and step, ~1,400 ops): 4,061,185 FLOPs
    # for the step against 3,968,641 on the real CPU step (+2.3%). Now the CPU target counts oneDNN's
    # mkldnn_rnn_layer as the CPU step does, and a GPU target cuDNN's _cudnn_rnn, with the same FLOPs.
    kw = dict(input_shape=[(4, 8, 24)], backward=True)
    torch.manual_seed(0)
    m = _ConvLstm()
    meta = ts.analyze_model(m, gpu="h100", attention_backend="cpu", **kw)
    real = ts.analyze_model(m, gpu="h100", device="cpu", **kw)
    gpu = ts.analyze_model(m, gpu="h100", **kw)
    step = lambda rep: sum(r.flops for r in rep.profile.ops)  # noqa: E731
    assert step(meta) == step(real) == 3_968_641  # meta was 4,061,185
    assert [(r.op, r.flops) for r in _lstm_ops(meta)] == [(r.op, r.flops) for r in _lstm_ops(real)] == [
        ("aten.mkldnn_rnn_layer", 1_238_016), ("aten.mkldnn_rnn_layer_backward", 2_476_032)]
    assert [(r.op, r.flops) for r in _lstm_ops(gpu)] == [
        ("aten._cudnn_rnn", 1_238_016), ("aten._cudnn_rnn_backward", 2_476_032)]
    assert len(meta.profile.ops) < 100  # was 1,485
    # two layers, bidirectional: layer 1 reads 64 features: per direction w_ih 128x64 + w_hh 128x32 = 12,288 weights
    # -> 2 * 96 * 12,288 = 2,359,296 + 58,368 gate math; layer 0 as above; 2 directions: forward
    # 2 * (1,238,016 + 2,417,664) = 7,311,360, equal on the CPU step, the GPU route and the fused formula
    m2 = _ConvLstm(layers=2, bidirectional=True)
    lstm = lambda rep, phase: sum(r.flops for r in _lstm_ops(rep) if r.phase == phase)  # noqa: E731
    meta2 = ts.analyze_model(m2, gpu="h100", attention_backend="cpu", **kw)
    real2 = ts.analyze_model(m2, gpu="h100", device="cpu", **kw)
    gpu2 = ts.analyze_model(m2, gpu="h100", **kw)
    assert lstm(meta2, "forward") == lstm(real2, "forward") == lstm(gpu2, "forward") == 7_311_360
    # backward 2 x forward = 14,622,720 in cuDNN's one op; oneDNN runs one op per layer and direction, and autograd
    # adds the two directions' gradients of each layer's input: 96 x 64 + 96 x 16 = 7,680 FLOPs more on the CPU
    assert lstm(gpu2, "backward") == 2 * 7_311_360
    assert lstm(meta2, "backward") == lstm(real2, "backward") == 2 * 7_311_360 + 7_680
    assert step(meta2) == step(real2)
