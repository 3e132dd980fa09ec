"""Advice by layer type (``analysis.layer_advice``): each rule names the change in the user's code and a saving
derived by hand from the step's own records (comments give the arithmetic), or says nothing."""

from __future__ import annotations

import math

import pytest
from profiles import a100, make_profile, op

import tscope_callbacks as ts
from tscope_callbacks import LayerRecord, api

#: a CPU roof given as a datasheet (not measured: a measured roof is widened when an op beats it, which would move
#: the bandwidth the hand-derived savings use)
CPU = ts.DeviceSpec("CPU (test)", {"fp32": 1e12, "bf16": 1e12}, 20e9, vendor="cpu", source="tests")
ACT = [32, 64, 56, 56]  # an activation: 6,422,528 elements, 25,690,112 B in fp32
ACT_B = math.prod(ACT) * 4
POOLED = [32, 64, 28, 28]


def rec(name, layer, phase="forward", *, ins=(), outs=(), ms=1.0, category="pointwise", dtype="float32", flops=0,
        tensor_core=None):
    item = 2 if dtype == "bfloat16" else 4
    r = op(name, layer, phase, flops=flops or sum(math.prod(s) for s in outs), read=item * sum(math.prod(s) for s in ins),
           written=item * sum(math.prod(s) for s in outs), dtype=dtype, time_s=ms * 1e-3, category=category,
           shapes=[list(s) for s in ins])
    r.output_shapes = [list(s) for s in outs]
    r.tensor_core = tensor_core
    return r


def report(ops, spec=CPU, types=None, **meta):
    layers = {k: LayerRecord(path=k, type=v) for k, v in {"": "Net", **(types or {})}.items()}
    meta.setdefault("device", "cpu")
    meta.setdefault("step_time_s", 100e-3)
    meta.setdefault("step_time_basis", "unprofiled-median")
    return api.roofline(make_profile(ops, layers=layers, **meta), spec)


def found(rep, kind):
    return [o for o in rep.opportunities[:20] if o.kind == kind]


def conv_ops(dtype="float32", fwd_ms=20.0, bwd_ms=40.0, x=ACT, w=(64, 64, 3, 3), tensor_core=None):
    y = [x[0], w[0], x[2], x[3]]
    flops = 2 * math.prod(y) * w[1] * w[2] * w[3]
    return [rec("aten.convolution", "conv", ins=(x, w), outs=(y,), ms=fwd_ms, category="conv", dtype=dtype,
                flops=flops, tensor_core=tensor_core),
            rec("aten.convolution_backward", "conv", "backward", ins=(y, x, w), outs=(x, w), ms=bwd_ms,
                category="conv", dtype=dtype, flops=2 * flops, tensor_core=tensor_core)]


def cl_step(pool_ms=10.0, bn_ms=(12.0, 24.0)):
    """A channels-first CPU step: conv, BatchNorm, ReLU, max pooling, forward and backward."""
    ops = conv_ops()[:1] + [
        rec("aten.native_batch_norm", "bn", ins=(ACT, [64], [64]), outs=(ACT, [64]), ms=bn_ms[0], category="norm"),
        rec("aten.relu", "relu", ins=(ACT,), outs=(ACT,), ms=3.0),
        rec("aten.max_pool2d_with_indices", "pool", ins=(ACT,), outs=(POOLED, POOLED), ms=pool_ms,
            category="reduction"),
        rec("aten.max_pool2d_with_indices_backward", "pool", "backward", ins=(POOLED, ACT, POOLED), outs=(ACT,),
            ms=1.0, category="reduction"),
        rec("aten.threshold_backward", "relu", "backward", ins=(ACT, ACT), outs=(ACT,), ms=4.0),
        rec("aten.native_batch_norm_backward", "bn", "backward", ins=(ACT, ACT, [64]), outs=(ACT, [64]),
            ms=bn_ms[1], category="norm")] + conv_ops()[1:]
    return ops


CL_TYPES = {"conv": "Conv2d", "bn": "BatchNorm2d", "relu": "ReLU", "pool": "MaxPool2d"}


def test_channels_last_on_cpu_puts_the_slow_nchw_ops_at_the_steps_elementwise_rate():
    rep = report(cl_step(), types=CL_TYPES, conv_channels_last=False, step_time_s=200e-3)  # ops: 114 ms of it
    (o,) = found(rep, "channels_last")
    # the step's element-wise rate, the upper quartile of its element-wise ops' rates: relu 2 x 25,690,112 B in
    # 3 ms = 17.13 GB/s, threshold_backward 3 x 25,690,112 B in 4 ms = 19.27 GB/s: 19.27 GB/s (under the 20 GB/s roof)
    rate = 3 * ACT_B / 4e-3
    # the channels-last kernels' bytes: BatchNorm forward in training passes over its input twice (statistics, then
    # the output): 3 x ACT_B + 3 x 256 B, 4.20 ms at the rate, measured 12; its backward over the gradient and the
    # input twice: 5 x ACT_B + 2 x 256 B, 7.00 ms, measured 24; the max pooling forward, ACT_B + 2 x 6,422,528 B:
    # 2.10 ms, measured 10. Each under half its measured time: slow in NCHW. The pooling backward (1 ms) is not
    bn_f, bn_b, pool_f = 3 * ACT_B + 3 * 256, 5 * ACT_B + 2 * 256, ACT_B + 2 * math.prod(POOLED) * 4
    ops = (12e-3 - bn_f / rate) + (24e-3 - bn_b / rate) + (10e-3 - pool_f / rate)
    # the convolutions' activations once more read and written at the rate: forward 4 x ACT_B, backward 6 x ACT_B
    conv = 10 * ACT_B / rate
    assert o.saving_s == pytest.approx(ops + conv) and o.predicted_by == "layout_rate"
    assert "torch.channels_last" in o.change and o.layer == "" and o.evidence["ops"] == 3
    assert set(o.rows) >= {("bn", "forward"), ("bn", "backward"), ("pool", "forward"), ("conv", "forward")}
    # nothing to say: the model is channels-last already, or its layout is unknown
    assert not found(report(cl_step(), types=CL_TYPES, conv_channels_last=True), "channels_last")
    assert not found(report(cl_step(), types=CL_TYPES), "channels_last")
    # the NCHW ops already near the element-wise rate: the conversions alone are no finding
    fast = cl_step(pool_ms=2.2, bn_ms=(5.0, 8.0))
    assert not found(report(fast, types=CL_TYPES, conv_channels_last=False), "channels_last")


def test_channels_last_on_cuda_is_the_conversion_kernels_time():
    h100 = ts.get_device_spec("h100")
    ops = conv_ops("bfloat16", fwd_ms=1.0, bwd_ms=2.0)
    # cuDNN's layout conversions around the forward (op 0) and backward (op 1) convolutions: 4 kernels, 0.35 ms
    kernels = [["void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16>", 0, 100_000, 7, 0],
               ["sm90_xmma_fprop_implicit_gemm_bf16", 100_000, 600_000, 7, 0],
               ["void cudnn::ops::nhwcToNchwKernel<__nv_bfloat16>", 700_000, 50_000, 7, 0],
               ["void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16>", 800_000, 150_000, 7, 1],
               ["void cudnn::ops::nhwcToNchwKernel<__nv_bfloat16>", 950_000, 50_000, 7, 1]]
    rep = report(ops, spec=h100, types={"conv": "Conv2d"}, device="cuda", timing="cuda-kernels",
                 conv_channels_last=False, kernels=kernels, step_time_s=10e-3)
    (o,) = found(rep, "channels_last")
    assert o.saving_s == pytest.approx(0.35e-3) and o.predicted_by == "conversion"
    # fp32 convolutions without TF32 run NCHW kernels: nothing to convert
    fp32 = report(conv_ops("float32", 1.0, 2.0), spec=h100, types={"conv": "Conv2d"}, device="cuda",
                  timing="cuda-kernels", conv_channels_last=False, float32_matmul_precision="highest",
                  step_time_s=10e-3)
    assert not found(fp32, "channels_last")


def test_cudnn_benchmark_when_convs_are_slow_and_the_autotuner_is_off():
    h100 = ts.get_device_spec("h100")
    ops = conv_ops("bfloat16", fwd_ms=5.0, bwd_ms=10.0, x=[64, 256, 56, 56], w=(256, 256, 3, 3))
    rep = report(ops, spec=h100, types={"conv": "Conv2d"}, device="cuda", timing="cuda-kernels",
                 cudnn_benchmark=False, step_time_s=60e-3)
    (o,) = found(rep, "cudnn_benchmark")
    # saving = measured - what the H100's kernel model expects for these two conv shapes (both > 1.5x slower)
    exp = sum(r.expected_s for r in rep.ops)
    assert exp < 15e-3 / 1.5 and o.saving_s == pytest.approx(15e-3 - exp)
    assert "benchmark = True" in o.change and "Trainer(benchmark=True)" in o.change
    assert not any(x.kind == "slow_kernel" and x.layer == "conv" for x in rep.opportunities[:20])
    on = report(ops, spec=h100, types={"conv": "Conv2d"}, device="cuda", cudnn_benchmark=True, step_time_s=60e-3)
    assert not found(on, "cudnn_benchmark")


def test_conv_channel_counts_off_the_tensor_cores():
    x, w = [32, 60, 28, 28], (100, 60, 3, 3)  # 60 and 100 channels: neither a multiple of 8
    rep = report(conv_ops("bfloat16", 5.0, 10.0, x=x, w=w, tensor_core=False), spec=a100(), types={"conv": "Conv2d"},
                 device="cuda", step_time_s=60e-3)
    (o,) = found(rep, "conv_channels")
    # padded 60 -> 64 and 100 -> 104: work x 64/60 x 104/100; fwd 2*32*100*28*28*60*9 = 2,709,504,000 FLOP,
    # bwd twice that; at 312 TFLOP/s the padded convs take 3 x 2.7095e9 x 1.10933 / 312e12 = 0.0289 ms
    ratio = 64 / 60 * 104 / 100
    after = sum(max(r.flops * ratio / 312e12, r.bytes * ratio / 2.039e12) for r in rep.ops)
    assert after == pytest.approx(3 * 2_709_504_000 * ratio / 312e12, rel=1e-6)
    assert o.saving_s == pytest.approx(15e-3 - after) and "60 -> 64 and 100 -> 104" in o.change
    on_tc = report(conv_ops("bfloat16", 5.0, 10.0, x=x, w=w, tensor_core=True), spec=a100(),
                   types={"conv": "Conv2d"}, device="cuda", step_time_s=60e-3)
    assert not found(on_tc, "conv_channels")


def bn_relu(pool=False):
    ops = [rec("aten.native_batch_norm", "bn", ins=(ACT, [64], [64]), outs=(ACT, [64]), ms=6.0, category="norm"),
           rec("aten.relu", "relu", ins=(ACT,), outs=(ACT,), ms=3.0)]
    if pool:
        ops.append(rec("aten.max_pool2d_with_indices", "pool", ins=(ACT,), outs=(POOLED, POOLED), ms=2.0,
                       category="reduction"))
        ops.append(rec("aten.max_pool2d_with_indices_backward", "pool", "backward", ins=(POOLED, ACT, POOLED),
                       outs=(ACT,), ms=3.0, category="reduction"))
    ops += [rec("aten.threshold_backward", "relu", "backward", ins=(ACT, ACT), outs=(ACT,), ms=4.0),
            rec("aten.native_batch_norm_backward", "bn", "backward", ins=(ACT, ACT, [64]), outs=(ACT, [64]), ms=12.0,
                category="norm")]
    return ops


TYPES = {"bn": "BatchNorm2d", "relu": "ReLU", "pool": "MaxPool2d"}


def test_batchnorm_then_activation_is_fused_on_cuda_only():
    a100_ = a100()
    rep = report(bn_relu(), spec=a100_, types=TYPES, device="cuda", timing="cuda-kernels")
    (o,) = found(rep, "bn_fusion")
    # fused, the activation's forward (3 ms) folds into BatchNorm's kernel, and its backward (4 ms: reads the
    # gradient and the mask, writes the gradient) keeps only the gradient's read: 3 + 4 x 2/3 = 5.667 ms
    assert o.saving_s == pytest.approx(3e-3 + 4e-3 * 2 / 3) and "torch.compile" in o.change
    assert set(o.rows) == {("relu", "forward"), ("relu", "backward")}
    assert not found(report(bn_relu(), spec=a100_, types=TYPES, device="cuda", compiled_modules_run_eagerly=["bn"]),
                     "bn_fusion")
    # on CPU a compiled BatchNorm + ReLU measured 3.6x slower than eager in training: no such advice
    assert not found(report(bn_relu(), types=TYPES), "bn_fusion")


def test_batchnorm_folds_into_the_convolution_in_an_inference_step():
    fwd = [conv_ops()[0], rec("aten.native_batch_norm", "bn", ins=(ACT, [64], [64]), outs=(ACT, [64]), ms=6.0,
                              category="norm"), rec("aten.relu", "relu", ins=(ACT,), outs=(ACT,), ms=3.0)]
    rep = report(fwd, types={"conv": "Conv2d", **TYPES})
    (o,) = found(rep, "bn_fold")
    assert o.saving_s == pytest.approx(6e-3) and "fuse_conv_bn_eval" in o.change and o.predicted_by == "removed"
    # a training step (backward ops) keeps BatchNorm's batch statistics: nothing to fold
    assert not found(report(cl_step(), types=CL_TYPES), "bn_fold")
    # a BatchNorm that does not follow a convolution has nothing to fold into
    assert not found(report(fwd[1:], types=TYPES), "bn_fold")


def test_batchnorm_and_pooling_rows_get_no_generic_hint():
    rep = report(bn_relu(pool=True), types=TYPES)
    for o in rep.opportunities[:20]:
        if o.layer not in ("bn", "pool"):
            continue
        assert "multiples of 64" not in o.cause and "fuse or lower precision" not in o.cause, o.cause


def test_max_pool_after_the_relu_and_its_indices():
    rep = report(bn_relu(pool=True), types=TYPES)
    (order,) = found(rep, "pool_order")
    # relu (2 x 25,690,112 B in 3 ms) + threshold_backward (3 x 25,690,112 B in 4 ms) on 4x the pooled elements:
    # applied after the pool they move a quarter of their 5 x 25,690,112 B, at the step's element-wise rate (the
    # upper quartile of the element-wise ops' rates: threshold_backward's 19.27 GB/s, above the pair's own 18.35):
    # 32,112,640 B / 19.27 GB/s = 1.667 ms instead of 7 ms
    rate = 3 * ACT_B / 4e-3
    assert order.saving_s == pytest.approx(7e-3 - 5 * ACT_B / 4 / rate) and "after the pooling" in order.change
    assert order.predicted_by == "elements" and set(order.rows) == {("relu", "forward"), ("relu", "backward")}
    assert not found(rep, "bn_fusion")  # the relu moves after the pool: BatchNorm's output then feeds the pool
    # CPU: a compiled max pooling measured slower than ATen's: no indices advice
    assert not found(rep, "pool_indices")
    (idx,) = found(report(bn_relu(pool=True), spec=a100(), types=TYPES, device="cuda", step_time_s=1e-3),
                   "pool_indices")
    # 1,605,632 int64 indices = 12,845,056 B written and read: int8 offsets save 7/8 of 2 x that at 2.039 TB/s
    assert idx.saving_s == pytest.approx(2 * 8 * math.prod(POOLED) * 7 / 8 / 2.039e12)
    assert "torch.compile" in idx.change


def test_pool_order_needs_a_monotonic_activation_right_before_a_max_pooling():
    gelu = [rec("aten.gelu", "act", ins=(ACT,), outs=(ACT,), ms=3.0),  # GELU is not monotonic
            rec("aten.max_pool2d_with_indices", "pool", ins=(ACT,), outs=(POOLED, POOLED), ms=2.0,
                category="reduction")]
    assert not found(report(gelu, types={"act": "GELU", "pool": "MaxPool2d"}), "pool_order")
    after = [rec("aten.max_pool2d_with_indices", "pool", ins=(ACT,), outs=(POOLED, POOLED), ms=2.0,
                 category="reduction"), rec("aten.relu", "act", ins=(POOLED,), outs=(POOLED,), ms=1.0)]
    assert not found(report(after, types={"act": "ReLU", "pool": "MaxPool2d"}), "pool_order")  # already after


def test_rnn_without_cudnn_on_cuda():
    ops = []
    for _ in range(12):  # 12 time steps, each a recurrent GEMM [8, 256] x [256, 1024] and a fused cell
        ops.append(rec("aten.mm", "lstm", ins=([8, 256], [256, 1024]), outs=([8, 1024],), ms=0.2, category="matmul",
                       dtype="bfloat16", flops=2 * 8 * 256 * 1024))
        ops.append(rec("aten._thnn_fused_lstm_cell", "lstm", ins=([8, 1024], [8, 1024], [8, 256]),
                       outs=([8, 256], [8, 256]), ms=0.1, dtype="bfloat16"))
    rep = report(ops, spec=a100(), types={"lstm": "LSTM"}, device="cuda", step_time_s=20e-3)
    (o,) = found(rep, "rnn_cudnn")
    # measured 12 x 0.3 = 3.6 ms; the same work at its roofline bound: the sum of the ops' max(flops/peak, bytes/bw)
    assert o.saving_s == pytest.approx(3.6e-3 - sum(r.estimate_s for r in rep.ops))
    assert "flatten_parameters" in o.change
    assert not found(report(ops, types={"lstm": "LSTM"}), "rnn_cudnn")  # CPU: nothing to change


def test_rnn_hidden_size_off_the_tensor_cores():
    flops = 2_000_000_000
    ops = [rec("aten._cudnn_rnn", "gru", ins=([50, 32, 128],), outs=([50, 32, 100],), ms=2.0, category="matmul",
               dtype="bfloat16", flops=flops, tensor_core=False)]
    rep = report(ops, spec=a100(), types={"gru": "GRU"}, device="cuda", step_time_s=20e-3)
    (o,) = found(rep, "rnn_hidden")
    # hidden 100 -> 104: 2e9 x 1.04 / 312e12 = 0.00667 ms on the tensor cores (bytes: 1.04 x 0.8 MB / 2.039 TB/s less)
    assert o.saving_s == pytest.approx(2e-3 - flops * 1.04 / 312e12) and "hidden_size=104" in o.change
    ok = [rec("aten._cudnn_rnn", "gru", ins=([50, 32, 128],), outs=([50, 32, 96],), ms=2.0, category="matmul",
              dtype="bfloat16", flops=flops, tensor_core=False)]
    assert not found(report(ok, spec=a100(), types={"gru": "GRU"}, device="cuda", step_time_s=20e-3), "rnn_hidden")


def test_embedding_dense_gradient_of_a_large_table():
    ops = [rec("aten.embedding_dense_backward", "emb", "backward", ins=([8, 128, 512], [8, 128]),
               outs=([50_000, 512],), ms=8.0, category="embedding")]
    rep = report(ops, types={"emb": "Embedding"}, step_time_s=50e-3)
    (o,) = found(rep, "embedding_sparse")
    # 1,024 rows looked up of 50,000: a sparse gradient writes 1,024 / 50,000 of the dense one: 8 x (1 - 0.02048)
    assert o.saving_s == pytest.approx(8e-3 * (1 - 1024 / 50_000)) and "sparse=True" in o.change
    assert o.predicted_by == "elements"
    small = [rec("aten.embedding_dense_backward", "emb", "backward", ins=([8, 128, 512], [8, 128]),
                 outs=([2_000, 512],), ms=8.0, category="embedding")]
    assert not found(report(small, types={"emb": "Embedding"}), "embedding_sparse")  # 2,000 < 4 x 1,024 rows
    # tied to the LM head (GPT-2): the table's gradient is summed with the head's, dense whatever the embedding does
    tied = ops + [rec("aten.add", "emb", "backward", ins=([50_000, 512], [50_000, 512]), outs=([50_000, 512],),
                      ms=2.0)]
    assert not found(report(tied, types={"emb": "Embedding"}, step_time_s=50e-3), "embedding_sparse")
    # on CUDA the sparse gradient and SparseAdam measured slower than the dense path (H200: -1.64 ms a step for
    # +0.19 ms predicted on a 50,304 x 768 table): no advice there
    cuda = report(ops, spec=ts.get_device_spec("h100"), types={"emb": "Embedding"}, device="cuda",
                  timing="cuda-kernels", step_time_s=50e-3)
    assert not found(cuda, "embedding_sparse")


def test_no_cuda_rule_fires_on_a_cpu_step():
    ops = conv_ops("bfloat16", 5.0, 10.0, x=[32, 60, 28, 28], w=(100, 60, 3, 3), tensor_core=False)
    rep = report(ops + bn_relu(pool=True), types={"conv": "Conv2d", **TYPES}, cudnn_benchmark=False)
    kinds = {o.kind for o in rep.opportunities[:20]}
    assert not kinds & {"cudnn_benchmark", "conv_channels", "bn_fusion", "pool_indices", "rnn_cudnn", "rnn_hidden",
                        "launch"}


def test_no_pool_order_in_an_inference_step_of_an_nchw_cpu_model():
    # PyTorch's NCHW max pooling on CPU is a scalar loop whose branches follow the data: in an inference step it
    # measured slower fed the BatchNorm's output than the ReLU's, more than the ReLU's forward saved
    fwd = [o for o in bn_relu(pool=True) if o.phase == "forward"]
    assert not found(report(fwd, types=TYPES, conv_channels_last=False), "pool_order")
    assert found(report(fwd, types=TYPES, conv_channels_last=True), "pool_order")  # channels-last: vectorized max
    # training: the ReLU's backward on a quarter of the elements saves more (measured 1.0x the prediction)
    assert found(report(bn_relu(pool=True), types=TYPES, conv_channels_last=False), "pool_order")


def test_the_capture_records_the_layout_and_the_autotuner():
    import torch

    from tscope_callbacks.capture.build import layout_facts

    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    assert layout_facts(m) == {"cudnn_benchmark": torch.backends.cudnn.benchmark, "conv_channels_last": False}
    assert layout_facts(m.to(memory_format=torch.channels_last))["conv_channels_last"] is True
    assert "conv_channels_last" not in layout_facts(torch.nn.Linear(4, 4))  # no convolution: no layout to judge
    with ts.profile(m) as prof:
        m(torch.randn(2, 3, 8, 8)).sum().backward()
    assert prof.result.info.conv_channels_last is True and prof.result.info.cudnn_benchmark is not None


def test_kernel_time_findings_are_held_back_on_a_launch_bound_cuda_step():
    from tscope_callbacks.analysis.advice import LAUNCH_BOUND_SHARE

    h100 = ts.get_device_spec("h100")
    # a launch-bound CUDA step of 5 ms: 400 kernels of 3 us (the ``launch`` finding's), and slow bf16 convolutions
    # with the autotuner off (the ``cudnn_benchmark`` finding's)
    small = [rec("aten.add", "emb", ins=([1024],), outs=([1024],), ms=0.003, dtype="bfloat16") for _ in range(400)]
    kernels = [["void at::vectorized_elementwise_kernel", 10_000 * i, 3_000, 7, i] for i in range(400)]
    ops = small + conv_ops("bfloat16", fwd_ms=0.3, bwd_ms=0.6, x=[8, 64, 28, 28], w=(64, 64, 3, 3))

    def rep(busy_s):
        return report(ops, spec=h100, types={"conv": "Conv2d", "emb": "Embedding"}, device="cuda",
                      timing="cuda-kernels", cudnn_benchmark=False, kernels=kernels, device_busy_s=busy_s,
                      step_time_s=5e-3)

    # device busy 1.2 ms: idle 3.8 ms, 76% of the step (over LAUNCH_BOUND_SHARE): the autotuner's kernel-time saving
    # does not shorten a step whose device waits for the host (H200: -0.14 to +0.10 ms measured on three such CNNs)
    bound = rep(1.2e-3)
    assert 3.8e-3 >= LAUNCH_BOUND_SHARE * 5e-3 and not found(bound, "cudnn_benchmark")
    (launch,) = found(bound, "launch")
    ((kind, layer, saving),) = launch.evidence["held_back"]
    assert kind == "cudnn_benchmark" and layer == "conv" and saving > 0.5e-3
    assert "held back until the step is device-bound" in launch.cause and "cudnn_benchmark `conv`" in launch.cause
    # the held-back finding itself, for the closed loop to check (``advice_effect.py`` applies it anyway)
    from tscope_callbacks.analysis.advice import opportunities
    from tscope_callbacks.analysis.roofline import build_roofline

    held: list = []
    eng = build_roofline(bound.profile, h100)
    assert not [o for o in opportunities(eng, top=20, held_back=held) if o.kind == "cudnn_benchmark"]
    assert [(o.kind, o.layer, o.saving_s) for o in held] == [("cudnn_benchmark", "conv", saving)]
    # device busy 4.0 ms: idle 1 ms, 20%: the launch finding still fires (10%), but the step is device-bound enough
    # that the kernel saving reaches it: both listed, nothing held back
    mid = rep(4.0e-3)
    assert found(mid, "launch") and "held_back" not in found(mid, "launch")[0].evidence
    (cb,) = found(mid, "cudnn_benchmark")
    assert cb.saving_s == pytest.approx(saving)
    # the device busy: no launch finding, the autotuner advised
    assert found(rep(4.9e-3), "cudnn_benchmark") and not found(rep(4.9e-3), "launch")


def merged_cl(pool_ms, bn_ms=(5.0, 8.0), step_s=100e-3):
    """``cl_step`` profiled over len(``pool_ms``) steps (merged as the callback merges them), the max pooling's
    forward taking ``pool_ms[i]`` in step i, every other op the same time in each step."""
    from tscope_callbacks.analysis.noise import merge_steps

    layers = {k: LayerRecord(path=k, type=v) for k, v in {"": "Net", **CL_TYPES}.items()}
    profs = []
    for i, p in enumerate(pool_ms):
        profs.append(make_profile(cl_step(pool_ms=p, bn_ms=bn_ms), layers=layers, step=i, device="cpu",
                                  step_time_s=step_s, step_time_basis="unprofiled-median",
                                  conv_channels_last=False))
    return api.roofline(merge_steps(profs), CPU)


def _row(md, layer, phase):
    return next(line for line in md.splitlines() if line.startswith(f"| `{layer}` |") and f"| {phase} |" in line)


def test_a_channels_last_finding_resting_on_a_noisy_pooling_row_is_not_made():
    # BatchNorm near the element-wise rate (5 and 8 ms: not slow in NCHW, as ``fast`` above); the max pooling's
    # forward 2.2, 10 and 25 ms over three steps: median 10 ms, spread 22.8 ms > 50% of it (and > 0.5 ms, 0.5% of the
    # step): marked noise. At its median 10 ms it alone would make the finding (2.10 ms at the element-wise rate)
    noisy = merged_cl((2.2, 10.0, 25.0))
    assert noisy.noise.is_marked("pool", "forward")
    assert not found(noisy, "channels_last")
    md = noisy.to_markdown()
    row = _row(md, "pool", "forward")
    assert "(noise)" in row and "#" not in row  # no advice number on a row marked noise
    assert all(("pool", "forward") not in o.rows for o in noisy.opportunities)
    # the same step with the pooling steady at 9.5, 10 and 10.5 ms (spread 1 ms, 10%: not noise): the finding stays,
    # the saving the single-step report predicts, and the pooling row carries its number
    steady = merged_cl((9.5, 10.0, 10.5))
    assert not steady.noise.is_marked("pool", "forward")
    (o,) = found(steady, "channels_last")
    (single,) = found(report(cl_step(pool_ms=10.0, bn_ms=(5.0, 8.0)), types=CL_TYPES, conv_channels_last=False),
                      "channels_last")
    assert o.saving_s == pytest.approx(single.saving_s) and ("pool", "forward") in o.rows
    n = steady.opportunities.index(o) + 1
    assert f"#{n}" in _row(steady.to_markdown(), "pool", "forward")


def test_a_noisy_pooling_rows_time_is_left_out_of_the_channels_last_saving():
    # BatchNorm slow in NCHW (12 and 24 ms, as in the first test), the pooling's forward noise (2.2, 10, 25 ms): the
    # finding stands on the BatchNorm ops and the convolutions alone: the saving without the pooling's
    # (10 ms - 2.10 ms at the rate), the first test's arithmetic
    rep = merged_cl((2.2, 10.0, 25.0), bn_ms=(12.0, 24.0), step_s=200e-3)
    (o,) = found(rep, "channels_last")
    rate = 3 * ACT_B / 4e-3
    bn_f, bn_b = 3 * ACT_B + 3 * 256, 5 * ACT_B + 2 * 256
    assert o.saving_s == pytest.approx((12e-3 - bn_f / rate) + (24e-3 - bn_b / rate) + 10 * ACT_B / rate)
    assert o.evidence["ops"] == 2 and ("pool", "forward") not in o.rows
    assert "#" not in _row(rep.to_markdown(), "pool", "forward")


def test_a_finding_whose_neighbour_row_is_noise_is_held_back_as_noise():
    # the pool-order finding is the ReLU's time (forward 3 ms, backward 4 ms); its forward 1, 3 and 12 ms over the
    # steps (spread 11 ms > 50% of 3 ms) is noise: the finding rests on it, so it is held back and named as noise
    from tscope_callbacks.analysis.noise import merge_steps

    layers = {k: LayerRecord(path=k, type=v) for k, v in {"": "Net", **CL_TYPES}.items()}
    profs = []
    for i, relu_ms in enumerate((1.0, 3.0, 12.0)):
        ops = cl_step()
        ops[2].time_s = relu_ms * 1e-3
        profs.append(make_profile(ops, layers=layers, step=i, device="cpu", step_time_s=200e-3,
                                  step_time_basis="unprofiled-median", conv_channels_last=True))
    rep = api.roofline(merge_steps(profs), CPU)
    assert rep.noise.is_marked("relu", "forward")
    assert not found(rep, "pool_order")
    (held,) = [o for o in rep.noise.suppressed if o.kind == "pool_order"]
    assert held.evidence["noise_rows"] == [["relu", "forward"]]
    md = rep.to_markdown()
    assert "rests on rows marked noise (`relu` forward): not a finding" in md
    assert "#" not in _row(md, "relu", "forward") and "#" not in _row(md, "relu", "backward")
