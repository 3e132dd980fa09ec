"""Norms, softmax, pointwise/activations, reductions, embedding, losses, dropout, optimizers, views."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from formula_utils import count, one, only, total_flops

from tscope_callbacks.formulas import DEFAULT_REGISTRY
from tscope_callbacks.formulas.optimizer import adam_flops_per_element, sgd_flops_per_element

aten = torch.ops.aten


# ---------------- norms ----------------
def test_layer_norm_forward_backward():
    x = torch.randn(2, 4, 8, requires_grad=True)
    ln = nn.LayerNorm(8)
    rec = count(lambda: ln(x).sum().backward())
    f, b = one(rec, "aten.native_layer_norm"), one(rec, "aten.native_layer_norm_backward")
    # N = 64 elements; forward (4 + weight 1 + bias 1) * 64 = 384
    assert f.flops == 384 and f.category == "norm"
    # read x 256 B + weight 32 + bias 32 = 320; write y 256 + mean 32 + rstd 32 = 320
    assert (f.bytes_read, f.bytes_written) == (320, 320)
    # backward mask [T,T,T]: grad_input (8 + weight 1) * 64 = 576, grad_weight 2 * 64, grad_bias 64 -> 768
    assert b.flops == 768


def test_layer_norm_backward_reads_no_bias_and_the_weight_only_for_grad_input():
    # native_layer_norm_backward(dY, X, shape, mean, rstd, weight, bias, mask): dbeta = sum(dY) and dgamma =
    # sum(dY * x_hat) read no parameter; dX = f(dY * w, ...) reads the weight; no kernel reads the bias.
    # x (2, 4, 8) fp32: dY 256 B, X 256, mean 32, rstd 32, weight 32 (bias 32 was counted too: 640 before)
    ln = nn.LayerNorm(8)
    g = torch.randn(2, 4, 8)
    x = torch.randn(2, 4, 8, requires_grad=True)
    b = one(count(lambda: ln(x).backward(g)), "aten.native_layer_norm_backward")
    assert (b.bytes_read, b.bytes_written) == (256 + 256 + 32 + 32 + 32, 256 + 32 + 32)  # 608 (was 640), 320
    # no grad_input (mask [F, T, T]): dY, X, mean, rstd = 576 (was 640: weight and bias); writes dgamma, dbeta
    x = torch.randn(2, 4, 8)
    b = one(count(lambda: ln(x).backward(g)), "aten.native_layer_norm_backward")
    assert (b.bytes_read, b.bytes_written) == (576, 64)
    # bias frozen (mask [T, T, F]): 608 read (was 640), dX + dgamma written 288
    ln.bias.requires_grad_(False)
    x = torch.randn(2, 4, 8, requires_grad=True)
    b = one(count(lambda: ln(x).backward(g)), "aten.native_layer_norm_backward")
    assert (b.bytes_read, b.bytes_written) == (608, 288)


def test_batch_norm_train_eval_and_backward():
    x = torch.randn(3, 4, requires_grad=True)
    bn = nn.BatchNorm1d(4)
    rec = count(lambda: bn(x).sum().backward())
    f, b = one(rec, "aten.native_batch_norm"), one(rec, "aten.native_batch_norm_backward")
    assert f.flops == 12 * 6  # stats 4 + weight + bias per element
    # training updates the running stats in place: read x 48 + 4 params of 16 B = 112; write y 48 + save_mean 16
    # + save_invstd 16 + running_mean 16 + running_var 16 = 112
    assert (f.bytes_read, f.bytes_written) == (112, 112)
    assert b.flops == 12 * 9 + 2 * 12 + 12  # 144
    bn.eval()
    rec = count(lambda: bn(x).sum().backward())
    f, b = one(rec, "aten.native_batch_norm"), one(rec, "aten.native_batch_norm_backward")
    assert f.flops == 2 * 12  # folded scale-and-shift
    assert f.bytes_written == 48  # y; save_mean/invstd are empty, running stats untouched
    assert b.flops == 12 * 1 + 2 * 12 + 12  # eval grad_input 1 per element -> 48


def test_group_norm_forward_backward():
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    rec = count(lambda: nn.GroupNorm(2, 4)(x).sum().backward())
    assert one(rec, "aten.native_group_norm").flops == 72 * 6  # 432
    assert one(rec, "aten.native_group_norm_backward").flops == 72 * 9 + 2 * 72 + 72  # 864


def test_rms_norm_fused_formula_and_cpu_decomposition():
    f = DEFAULT_REGISTRY.lookup(aten._fused_rms_norm.default).flops
    b = DEFAULT_REGISTRY.lookup(aten._fused_rms_norm_backward.default).flops
    s = torch.Size([2, 4, 8])
    assert f(s, [8], torch.Size([8]), 1e-6, out=(s, torch.Size([2, 4, 1]))) == 64 * 4  # 3 + weight
    assert b(s, s, [8], torch.Size([2, 4, 1]), torch.Size([8]), [True, True], out=None) == 64 * 7 + 2 * 64
    x = torch.randn(2, 4, 8, requires_grad=True)
    rec = count(lambda: nn.RMSNorm(8)(x).sum().backward())
    assert all(c.counted for _, c in rec)  # on CPU it decomposes into pow/mean/rsqrt/mul, all counted


# ---------------- softmax, activations, pointwise ----------------
def test_softmax_and_log_softmax_forward_backward():
    x = torch.randn(2, 4, 8, requires_grad=True)
    rec = count(lambda: (F.softmax(x, -1) + F.log_softmax(x, -1)).sum().backward())
    assert one(rec, "aten._softmax").flops == 5 * 64  # max, sub, exp, sum, div
    assert one(rec, "aten._log_softmax").flops == 5 * 64
    assert one(rec, "aten._softmax_backward_data").flops == 4 * 64
    assert one(rec, "aten._log_softmax_backward_data").flops == 4 * 64
    assert {c.category for n, c in rec if "softmax" in n} == {"softmax"}


@pytest.mark.parametrize("fn, name, fwd, bwd", [
    (lambda x: F.gelu(x), "gelu", 5, 10),
    (lambda x: F.gelu(x, approximate="tanh"), "gelu", 9, 16),
    (F.silu, "silu", 4, 8),
    (torch.sigmoid, "sigmoid", 3, 3),
    (torch.tanh, "tanh", 1, 3),
    (F.relu, "relu", 1, 1),
])
def test_activations_forward_backward(fn, name, fwd, bwd):
    x = torch.randn(4, 8, requires_grad=True)
    rec = count(lambda: fn(x).sum().backward())
    f = one(rec, f"aten.{name}")
    assert f.flops == 32 * fwd and f.category == "pointwise"
    # read x 128 B, write y 128 B
    assert (f.bytes_read, f.bytes_written) == (128, 128)
    bwd_name = {"relu": "threshold_backward"}.get(name, f"{name}_backward")
    assert one(rec, f"aten.{bwd_name}").flops == 32 * bwd


def test_inplace_pointwise_counts_like_out_of_place():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    rec = count(lambda: (x.add(y), x.clone().add_(y), torch.relu(x), x.clone().relu_(), torch.addcmul(x, x, y),
                         x.clone().addcmul_(x, y)))
    assert one(rec, "aten.add").flops == one(rec, "aten.add_").flops == 32
    assert one(rec, "aten.relu").flops == one(rec, "aten.relu_").flops == 32
    assert one(rec, "aten.addcmul").flops == one(rec, "aten.addcmul_").flops == 64  # addcmul costs 2


def test_pointwise_tag_fallback_one_flop_per_output_element():
    x, y = torch.randn(3, 5), torch.randn(5)
    c = one(count(lambda: torch.nextafter(x, y)), "aten.nextafter")  # tagged pointwise, not in the cost table
    assert (c.flops, c.category, c.counted) == (15, "pointwise", True)


def test_binary_max_is_pointwise_reduction_max_is_reduction():
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    rec = count(lambda: (torch.max(x, y), torch.max(x, 1), x.max()))
    binary = one(rec, "aten.maximum")  # torch.max(x, y) arrives as maximum
    by_dim, full = only(rec, "aten.max")
    assert (binary.category, binary.flops) == ("pointwise", 15)
    assert DEFAULT_REGISTRY.lookup(aten.max.other).category == "pointwise"  # the overload, not the packet
    assert (by_dim.category, by_dim.flops) == ("reduction", 15)
    assert (full.category, full.flops) == ("reduction", 15)


# ---------------- reductions ----------------
def test_reductions_per_input_element():
    x = torch.randn(2, 4, 8)
    rec = count(lambda: (x.sum(), x.mean(-1), x.amax(1), x.argmax(), x.var(-1), x.std(), torch.var_mean(x, 0),
                         x.norm(), x.cumsum(0), x.logsumexp(-1)))
    got = {n: c.flops for n, c in rec}
    assert got["aten.sum"] == 64
    assert got["aten.mean"] == 64 + 8  # + divide per output (2x4)
    assert got["aten.amax"] == got["aten.argmax"] == got["aten.cumsum"] == 64
    assert got["aten.var"] == 3 * 64 and got["aten.var_mean"] == 3 * 64
    assert got["aten.std"] == 3 * 64 + 1  # + sqrt of the single output
    assert got["aten.linalg_vector_norm"] == 2 * 64 + 1
    assert got["aten.logsumexp"] == 4 * 64 + 2 * 8
    c = one(rec, "aten.argmax")
    assert (c.bytes_read, c.bytes_written) == (256, 8)  # an int64 index


# ---------------- embedding ----------------
def test_embedding_forward_reads_gathered_rows_only_and_backward():
    emb = nn.Embedding(1000, 8)
    idx = torch.tensor([[1, 2, 3], [4, 5, 1]])
    rec = count(lambda: emb(idx).sum().backward())
    f = one(rec, "aten.embedding")
    # 0 FLOPs; read indices 6*8 B + the 5 distinct rows (1 twice) * 8 * 4 B = 208 (NOT the 32000 B table);
    # write 6*8*4 = 192
    assert (f.flops, f.bytes_read, f.bytes_written, f.category) == (0, 208, 192, "embedding")
    # 32 lookups of one 128-wide fp32 row: indices 32*8 = 256 B + one row 512 B = 768 (not 32 x 512 + 256 = 16,640)
    wide = nn.Embedding(10, 128)
    same = one(count(lambda: wide(torch.full((32,), 3))), "aten.embedding")
    assert same.bytes_read == 256 + 512
    b = one(rec, "aten.embedding_dense_backward")
    # scatter-add 48 grad elements; read grad (expanded 0-d: 4 B) + indices 48 B; write the dense 1000x8 grad
    assert (b.flops, b.bytes_read, b.bytes_written) == (48, 52, 32000)


# ---------------- losses ----------------
def test_cross_entropy_forward_backward():
    logits = torch.randn(4, 10, requires_grad=True)
    tgt = torch.tensor([1, 0, 9, 3])
    rec = count(lambda: F.cross_entropy(logits, tgt).backward())
    assert one(rec, "aten._log_softmax").flops == 5 * 40
    nll = one(rec, "aten.nll_loss_forward")
    # 1 gather-accumulate per target; read targets 32 B + 4 gathered logits 16 B; write loss 4 + total_weight 4
    assert (nll.flops, nll.bytes_read, nll.bytes_written, nll.category) == (4, 48, 8, "loss")
    nb = one(rec, "aten.nll_loss_backward")
    # read grad 4 + targets 32 + total_weight 4 (not the logits); write the zero-filled grad 40*4 = 160
    assert (nb.flops, nb.bytes_read, nb.bytes_written) == (4, 40, 160)
    assert one(rec, "aten._log_softmax_backward_data").flops == 4 * 40


def test_mse_and_bce_losses():
    x = torch.randn(4, 5, requires_grad=True)
    y = torch.rand(4, 5)
    rec = count(lambda: (F.mse_loss(x, y) + F.binary_cross_entropy(torch.sigmoid(x), y)
                         + F.binary_cross_entropy_with_logits(x, y)).backward())
    assert one(rec, "aten.mse_loss").flops == 20 * 3  # sub, square + mean-reduce
    assert one(rec, "aten.mse_loss_backward").flops == 20 * 3
    assert one(rec, "aten.binary_cross_entropy").flops == 20 * 8
    assert one(rec, "aten.binary_cross_entropy_backward").flops == 20 * 6
    assert one(rec, "aten.binary_cross_entropy_with_logits").flops == 20 * 9
    assert all(c.counted for _, c in rec)


# ---------------- dropout ----------------
def test_dropout_cpu_decomposition_and_native_formulas():
    x = torch.randn(4, 8, requires_grad=True)
    rec = count(lambda: F.dropout(x, 0.5, training=True).sum().backward())
    bern = one(rec, "aten.bernoulli_")
    # the mask is drawn in place: 1 FLOP per element, written (128 B) but not read
    assert (bern.flops, bern.bytes_read, bern.bytes_written) == (32, 0, 128)
    assert all(c.counted for _, c in rec)
    nd = DEFAULT_REGISTRY.lookup(aten.native_dropout.default).flops
    s = torch.Size([4, 8])
    assert nd(s, 0.5, True, out=(s, s)) == 64 and nd(s, 0.5, False, out=(s, s)) == 0
    assert DEFAULT_REGISTRY.lookup(aten.native_dropout_backward.default).flops(s, s, 2.0, out=s) == 64
    assert count(lambda: F.dropout(x, 0.5, training=False)) == []  # eval: no op at all


# ---------------- optimizers ----------------
def _model():
    torch.manual_seed(0)
    m = nn.Linear(4, 3)  # 12 + 3 = 15 parameters
    m(torch.randn(2, 4)).sum().backward()
    return m


@pytest.mark.parametrize("kind", ["foreach", "fused"])
def test_sgd_momentum_step(kind):
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, **{kind: True})
    opt.step()  # first step creates the momentum buffers
    rec = count(opt.step)
    assert total_flops(rec, "optimizer") == 15 * sgd_flops_per_element(momentum=0.9) == 45
    if kind == "fused":
        c = one(rec, "aten._fused_sgd_")
        # read params, grads, bufs 3 * 60 B; write params and bufs 2 * 60 B
        assert (c.bytes_read, c.bytes_written) == (180, 120)


@pytest.mark.parametrize("kind", ["foreach", "fused"])
def test_adam_step(kind):
    m = _model()
    opt = torch.optim.Adam(m.parameters(), **{kind: True})
    opt.step()
    rec = count(opt.step)
    # 11 per parameter element (the same for foreach and fused) + the step counters' += 1 on 2 tensors
    assert total_flops(rec, "optimizer") == 15 * adam_flops_per_element() + 2 == 167
    if kind == "fused":
        c = one(rec, "aten._fused_adam_")
        # read params, grads, exp_avg, exp_avg_sq 4 * 60 B + 2 step scalars 8 B; write params, m, v 3 * 60 B
        assert (c.bytes_read, c.bytes_written) == (248, 180)
    else:
        assert {n for n, c in rec if c.category == "optimizer"} >= {"aten._foreach_lerp_", "aten._foreach_addcdiv_"}


# ---------------- views ----------------
def test_view_ops_are_known_zero():
    x = torch.randn(4, 6)
    rec = count(lambda: (x.view(6, 4), x.t(), x.transpose(0, 1), x.permute(1, 0), x.expand(2, 4, 6), x[1:3], x[0],
                         x.unsqueeze(0), x.unsqueeze(0).squeeze(0), x.detach(), x.split(2), x.unbind(0),
                         x.chunk(3, 1), x.as_strided((2, 2), (1, 1)), torch.empty(3), torch.empty_like(x),
                         x.new_empty((2,))))
    assert rec and all(c.category == "view" and c.flops == c.bytes_read == c.bytes_written == 0 and c.counted
                       for _, c in rec), [(n, c.category) for n, c in rec if c.category != "view"]


# ---------------- recurrent, sorting, gated ----------------
@pytest.mark.filterwarnings("ignore:TF32 acceleration")
def test_lstm_and_gru_fused_cpu_kernels():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16, requires_grad=True)  # 10 tokens
    lstm = nn.LSTM(16, 8, batch_first=True)
    rec = count(lambda: lstm(x)[0].sum().backward())
    f, b = one(rec, "aten.mkldnn_rnn_layer"), one(rec, "aten.mkldnn_rnn_layer_backward")
    # GEMMs 2 * 10 tokens * (w_ih 32x16 + w_hh 32x8 = 768) = 15360; gates 10 * 8 units * 19 = 1520
    assert (f.flops, b.flops) == (16880, 2 * 16880)
    with torch.backends.mkldnn.flags(enabled=False):  # the decomposed path does the same GEMMs
        dec = count(lambda: lstm(x))
    assert total_flops(dec, "matmul") == 15360
    # a GRU layer (on CPU the GRU is decomposed; the fused formula by shape): w_ih 24x16, w_hh 24x8
    f = DEFAULT_REGISTRY.lookup(aten.mkldnn_rnn_layer.default).flops
    S = torch.Size
    gru = f(S([2, 5, 16]), S([24, 16]), S([24, 8]), S([24]), S([24]), S([2, 8]), S([2, 8]), False, [], 3, 8, 1,
            True, False, True, False, out=None)
    assert gru == 2 * 10 * 576 + 10 * 8 * 16  # GEMMs 11520 + gates 1280


def test_cudnn_lstm_backward_always_counts_the_data_gradient_pass():
    # cuDNN's backward computes dx/dhx/dcx unconditionally (RNN.cpp), the weight grads only when asked for
    f = DEFAULT_REGISTRY.lookup(aten._cudnn_rnn_backward.default).flops
    S = torch.Size
    # LSTM, T=10 x B=4 tokens of 32 features, hidden 64, 1 layer: w_ih 256x32, w_hh 256x64 (+ biases)
    weights = [S([256, 32]), S([256, 64]), S([256]), S([256])]
    g = 2 * 40 * (256 * 32 + 256 * 64)  # 1,966,080: every weight times every token
    p = 40 * 64 * 19  # 48,640 gate FLOPs

    def bwd(mask):
        return f(S([10, 4, 32]), weights, 4, S([100]), S([1, 4, 64]), S([1, 4, 64]), S([10, 4, 64]),
                 S([10, 4, 64]), None, None, 2, 64, 0, 1, False, 0.0, True, False, [], None, S([10]), mask,
                 out=None)

    assert bwd([True, True, True, True]) == 2 * g + 2 * p
    # inputs that need no grad (e.g. embeddings frozen, or the first layer's data): the data pass still runs
    assert bwd([False, False, False, True]) == 2 * g + 2 * p
    assert bwd([True, True, True, False]) == g + 2 * p  # frozen weights: no weight pass


def test_sort_topk_median_glu():
    x = torch.randn(4, 16)
    rec = count(lambda: (x.sort(-1), x.topk(3, -1), x.median(), torch.nn.functional.glu(x, -1)))
    assert one(rec, "aten.sort").flops == 64 * 4  # ceil(log2 16) = 4 comparisons per element
    assert one(rec, "aten.topk").flops == 64 * 2  # ceil(log2(3 + 1)) = 2
    assert one(rec, "aten.median").flops == 64
    assert one(rec, "aten.glu").flops == 4 * 32  # a * sigmoid(b) per output element (4x8)


def test_histograms_count_their_input_once():
    """MoE routers count tokens per expert with ``histc`` (HF Mixtral, Qwen-MoE, OLMoE, GraniteMoE): it was the only
    uncounted op of those models' steps."""
    x = torch.rand(1000)
    edges = torch.linspace(0, 1, 9)
    ids = (x * 10).long()
    rec = count(lambda: (torch.histc(x, bins=10), torch.histc(x, bins=10, min=0, max=1),
                         torch.histogram(x, bins=5), torch.histogram(x, bins=5, range=(0.0, 1.0)),
                         torch.histogram(x, edges), torch.bincount(ids)))
    auto, fixed = only(rec, "aten.histc")
    assert auto.flops == 1000 * 4  # min = max = 0: a min and a max per element for the range, then subtract, scale
    assert fixed.flops == 1000 * 2  # subtract, scale
    assert (fixed.bytes_read, fixed.bytes_written, fixed.category) == (1000 * 4, 10 * 4, "reduction")
    h_auto, h_range, h_edges = only(rec, "aten.histogram")
    assert (h_auto.flops, h_range.flops) == (1000 * 4, 1000 * 2)
    assert h_edges.flops == 1000 * 4  # binary search over 9 edges: ceil(log2 9) = 4 comparisons per element
    assert h_range.bytes_written == 5 * 4 + 6 * 4  # the counts and the 6 edges
    b = one(rec, "aten.bincount")
    assert (b.flops, b.bytes_read, b.counted) == (1000, 1000 * 8, True)  # one increment per int64 index


def test_index_put_accumulate_counts_one_add_per_value_as_index_add_does():
    # the backward of advanced indexing x[idx] is index_put(accumulate=True): it adds 2 rows * 4 values = 8
    # elements into x (8 FLOPs), as index_add_ on the same rows counts; it used to count 0. A plain put adds nothing
    x, idx, vals = torch.zeros(100, 4), torch.tensor([1, 5]), torch.ones(2, 4)
    acc = one(count(lambda: x.clone().index_put_((idx,), vals, accumulate=True)), "aten.index_put_")
    add = one(count(lambda: x.clone().index_add_(0, idx, vals)), "aten.index_add_")
    assert acc.flops == add.flops == 2 * 4
    assert one(count(lambda: x.clone().index_put_((idx,), vals)), "aten.index_put_").flops == 0
    assert one(count(lambda: torch.index_put(x, (idx,), vals, True)), "aten.index_put").flops == 8
    w = torch.randn(100, 4, requires_grad=True)  # the backward of w[idx]: 8 accumulated elements
    bwd = [c for name, c in count(lambda: w[idx].sum().backward()) if "index_put" in name]
    assert [c.flops for c in bwd] == [8]
