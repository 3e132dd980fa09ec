"""Bytes PyTorch's CUDA kernels really move (``analysis.estimate.kernel_bytes``), on records captured for real, and
the expected kernel time of the H100 GPT-2 step per op class against what that step measured."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tscope_callbacks as ts
from tscope_callbacks.formulas.kernel_bytes import kernel_bytes, kernel_launches


def _captured(fn, *tensors):
    """The records of one forward + backward of ``fn`` (CPU capture: the same aten ops and counts as on CUDA)."""
    leaves = [t.requires_grad_() for t in tensors]
    model = fn if isinstance(fn, torch.nn.Module) else torch.nn.Module()
    with ts.profile(model) as prof:
        out = fn(*leaves).float()
        (out * out).sum().backward()  # a dense gradient, as a loss gives
    return {r.op: r for r in prof.ops}


def test_log_softmax_over_a_vocabulary_reads_its_input_three_times():
    n, v = 64, 50257  # GPT-2's vocabulary: 50257 x 4 B = 196 KB a row, over the 48 KB shared-memory cache
    ops = _captured(lambda x: F.log_softmax(x, dim=-1), torch.randn(n, v))
    fwd, bwd = ops["aten._log_softmax"], ops["aten._log_softmax_backward_data"]
    size = n * v * 4
    assert fwd.bytes == 2 * size  # the roofline's count: read once, written once
    # cunn_SoftMaxForward: max pass, sum-of-exp pass, write pass over the input (3 reads), one write
    assert kernel_bytes(fwd) == 3 * size + size
    # cunn_SoftMaxBackward: reads grad (its sum) then grad and output (the write pass), writes grad_input
    assert bwd.bytes == 3 * size
    assert kernel_bytes(bwd) == 2 * size + size + size


def test_softmax_rows_that_a_single_pass_kernel_handles_are_counted_once():
    # rows of 1024 fp32 (4 KB): the persistent warp softmax, one read and one write
    ops = _captured(lambda x: F.softmax(x, dim=-1), torch.randn(32, 1024))
    assert kernel_bytes(ops["aten._softmax"]) == ops["aten._softmax"].bytes
    assert kernel_bytes(ops["aten._softmax_backward_data"]) == ops["aten._softmax_backward_data"].bytes
    # rows of 4096 fp32 (16 KB) fit the shared-memory cache: read once into it
    ops = _captured(lambda x: F.softmax(x, dim=-1), torch.randn(32, 4096))
    assert kernel_bytes(ops["aten._softmax"]) == ops["aten._softmax"].bytes
    # but softmax's backward over them forms grad * output in its own pass (2 reads + 1 write), then reads that
    # product twice, the output once and writes grad_input: 7 tensors' bytes against the 3 counted
    bwd = ops["aten._softmax_backward_data"]
    assert kernel_bytes(bwd) == 7 * 32 * 4096 * 4


def test_layer_norm_backward_reads_dy_and_x_again_for_its_parameter_gradients():
    ln = torch.nn.LayerNorm(768)
    ops = _captured(ln, torch.randn(8, 128, 768))
    bwd = ops["aten.native_layer_norm_backward"]
    act = 8 * 128 * 768 * 4
    # grad-input kernel: dY, X (+ mean, rstd, gamma) -> dX; GammaBetaBackward kernel: dY and X again
    assert kernel_bytes(bwd) == bwd.bytes + 2 * act
    assert kernel_bytes(ops["aten.native_layer_norm"]) == ops["aten.native_layer_norm"].bytes
    # without affine parameters there is no second kernel
    ops = _captured(lambda x: F.layer_norm(x, (768,)), torch.randn(8, 128, 768))
    bwd = ops["aten.native_layer_norm_backward"]
    assert kernel_bytes(bwd) == bwd.bytes


def test_embedding_backward_kernels_and_bytes_follow_the_cuda_path_for_its_index_count():
    v, d = 5000, 64
    for n, path in ((4096, "sort"), (1024, "feature")):
        emb = torch.nn.Embedding(v, d)
        with ts.profile(emb) as prof:
            emb(torch.randint(0, v, (4, n // 4))).pow(2).sum().backward()
        bwd = next(r for r in prof.ops if r.op == "aten.embedding_dense_backward")
        table, rows = v * d * 4, n * d * 4  # fp32
        if path == "sort":
            # over 3072 indices: arange, radix sort of the int64 indices over 64 bits (histogram, exclusive sum, 8
            # onesweep passes), then zero fill, unique_by_key (2), partials per segment, exclusive sum (2), partial
            # count, partial offsets, compute_grad_weight, sum_and_scatter: 1 + 10 + 10 = 21 kernels
            assert kernel_launches(bwd) == 21
            # zero-filled table; gradient rows read; fp32 partials written and read back; table rows written;
            # the sort and scans over the n int64 indices (24 passes)
            assert kernel_bytes(bwd) == table + rows + 2 * n * d * 4 + rows + 24 * n * 8
        else:
            assert kernel_launches(bwd) == 2  # zero fill + embedding_backward_feature_kernel
            assert kernel_bytes(bwd) == table + rows + 2 * rows  # rows read, then table rows read and written


def test_launch_counts_of_multi_kernel_ops():
    ln = torch.nn.LayerNorm(768)
    ops = _captured(ln, torch.randn(4, 768))
    assert kernel_launches(ops["aten.native_layer_norm_backward"]) == 2  # grad input, then gamma/beta
    assert kernel_launches(ops["aten.native_layer_norm"]) == 1
    ops = _captured(lambda x: F.softmax(x, dim=-1), torch.randn(4, 50257))
    assert kernel_launches(ops["aten._softmax_backward_data"]) == 2  # grad * output, then the backward
    ops = _captured(lambda x: F.softmax(x, dim=-1), torch.randn(4, 512))
    assert kernel_launches(ops["aten._softmax_backward_data"]) == 1  # the persistent warp softmax


#: the H100 GPT-2 step (12 x 768, vocab 50257, batch 8 x 1024, bf16 autocast, fused AdamW), kernel time per op class
#: from the profiler's kernel records (benchmarks/results/roofline_accuracy_gpu.md as recorded on an NVIDIA H100 80GB
#: HBM3 on 2026-11-23, commit a59f682; that file now holds the H200 run of 2026-11-26)
H100_GPT2_MS = {"embedding": 0.30, "matmul": 21.73, "attention": 2.47, "softmax": 4.35, "norm": 2.58, "pointwise": 18.34,
                "memory": 10.24, "busy": 63.10, "optimizer": 1.33, "forward": 24.60,
                # its three lm_head GEMMs (issue "Estimates and advice"): forward 6.651 ms, backward 8.585 ms; the
                # weight gradient reads grad_output.t(), leading dimension 50257, and is as slow as the other two
                "lm_head": 6.651 + 8.585}


@pytest.fixture(scope="module")
def gpt2_meta_expected() -> dict[str, float]:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(cfg)
    rep = ts.analyze_model(model, input_shape=[(8, 1024)], gpu="h100", precision="bf16-mixed", backward=True,
                           optimizer="adamw-fused")
    out: dict[str, float] = {"forward": sum(o.expected_s for o in rep.ops if o.phase == "forward") * 1e3}
    for o in rep.ops:
        out[o.category] = out.get(o.category, 0.0) + o.expected_s * 1e3
        if o.layer == "lm_head" and o.category == "matmul":
            out["lm_head"] = out.get("lm_head", 0.0) + o.expected_s * 1e3
    return out


@pytest.mark.parametrize("cls", ["matmul", "attention", "softmax", "norm", "pointwise", "memory", "optimizer",
                                 "forward", "lm_head"])
def test_h100_gpt2_step_per_op_class_within_1_3x(gpt2_meta_expected, cls):
    ratio = H100_GPT2_MS[cls] / gpt2_meta_expected[cls]
    assert 1 / 1.3 <= ratio <= 1.3, f"{cls}: measured {H100_GPT2_MS[cls]} ms / expected " \
                                    f"{gpt2_meta_expected[cls]:.2f} ms = {ratio:.2f}"


def test_h100_gpt2_embedding_class_within_2x(gpt2_meta_expected):
    # the sort-based backward of the 8192-index lookup is 21 kernels: 0.09 ms expected as one copy (3.5x under the
    # measured 0.30 ms), 0.17 ms now; still under: the onesweep sort kernels are likely slower than a launch each
    ratio = H100_GPT2_MS["embedding"] / gpt2_meta_expected["embedding"]
    assert 1.0 <= ratio <= 2.0, ratio


def test_h100_gpt2_whole_step_within_1_3x(gpt2_meta_expected):
    # forward, backward and the fused AdamW update (analyze_model(optimizer="adamw-fused")) vs the step's busy time
    ratio = H100_GPT2_MS["busy"] / math.fsum(v for k, v in gpt2_meta_expected.items() if k not in ("forward", "lm_head"))
    assert 1 / 1.3 <= ratio <= 1.3


def test_gemm_alignment_follows_the_stored_layout_of_its_operands():
    # Linear(64 -> 1001): forward x[16,64] @ W.t() -> y[16,1001]; backward dX = dY[16,1001] @ W[1001,64] and
    # dW = dY.t()[1001,16] @ x[16,64]. dW's logical N=64, K=16 are aligned, but dY.t() is dY stored row-major:
    # BLAS reads it with leading dimension 1001 (1001 x 2 B is not a multiple of 16 B in bf16): the slow path
    from tscope_callbacks.analysis.estimate import expected_s, gemm_dims
    from tscope_callbacks.devices.efficiency import model_for

    lin = torch.nn.Linear(64, 1001, bias=False)
    with ts.profile(lin) as prof:
        lin(torch.randn(16, 64, requires_grad=True)).pow(2).sum().backward()
    mms = [r for r in prof.ops if r.category == "matmul"]
    assert len(mms) == 3 and all(1001 in r.leading_dims for r in mms)
    dw = next(r for r in mms if r.output_shapes == [[1001, 64]])
    assert sorted(dw.leading_dims) == [64, 64, 1001]  # dY.t(): 1001; x: 64; dW: 64
    model = model_for(ts.get_device_spec("h100"))
    m, n, k = gemm_dims(dw)
    assert (m, n, k) == (1001, 64, 16)
    assert expected_s(dw, "bf16", model) == model.gemm_s(m, n, k, "bf16", False)
    assert model.gemm_s(m, n, k, "bf16", False) > model.gemm_s(m, n, k, "bf16")  # the row-major reading
    # records without a recorded layout (profiles saved before it) keep the logical reading
    import dataclasses

    assert expected_s(dataclasses.replace(dw, leading_dims=None), "bf16", model) == model.gemm_s(m, n, k, "bf16")
