"""The shape-aware kernel model (``devices.efficiency``) against the real H100/H200 measurements it was built from
(``../shared/gpu/<device>/``; the packaged tables in ``tscope_callbacks/devices/data`` are derived from them by
``scripts/build_efficiency_tables.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from profiles import a100

import tscope_callbacks as ts
from tscope_callbacks.devices.efficiency import MIN_KERNEL_S, aligned, build_model, model_for


@pytest.fixture(scope="module")
def h100():
    return model_for(ts.get_device_spec("h100"))


@pytest.mark.parametrize("device", ["h100", "h200"])
@pytest.mark.parametrize("precision,median,within", [("bf16", 0.12, 0.85), ("fp16", 0.18, 0.7), ("tf32", 0.18, 0.75),
                                                      ("fp32", 0.15, 0.7)])
def test_gemm_leave_one_out_accuracy(device, precision, median, within):
    # each measured shape predicted without itself: the literature's 10-15% (Habitat, vTrain) is the bar
    m = model_for(ts.get_device_spec(device))
    loo = m.gemm_loo(precision)
    assert len(loo) >= 200
    err = np.array([abs(math.log(p / t)) for *_, t, p in loo])
    big = np.array([t > 20e-6 for *_, t, _ in loo])
    assert np.median(np.exp(err) - 1) < median
    assert np.mean(err[big] < math.log(1.3)) >= within
    # time-weighted: what a step's sum of GEMMs would be off by
    assert sum(abs(p - t) for *_, t, p in loo) / sum(t for *_, t, _ in loo) < 0.13


# measured on the H100 (../shared/gpu/h100/gemm_bf16.txt), minus the table's per-call host cost (delta_s)
H100_BF16 = [  # (M, K, N, ms)
    (8192, 768, 50257, 5.032), (8192, 768, 50304, 0.959), (8192, 768, 3072, 0.074), (8192, 3072, 768, 0.070),
    (8192, 8192, 8192, 1.441), (4096, 4096, 4096, 0.219), (8192, 4096, 14336, 1.348), (8192, 4095, 4096, 2.058),
    (8193, 4096, 4096, 0.427), (128, 4096, 4096, 0.032),
]


@pytest.mark.parametrize("m,k,n,ms", H100_BF16)
def test_gemm_on_the_named_h100_shapes(h100, m, k, n, ms):
    # the shapes the issue quotes: the lm_head at 50257 (5.03 ms) vs 50304 (0.96 ms), K=4095 (2.06 ms) vs 4096
    pred = h100.gemm_s(m, n, k, "bf16")
    meas = ms * 1e-3 - h100.delta_s
    # under 20 us the subtracted host cost (15 us) is most of the measurement: 1.5x there
    tol = 1.3 if meas > 20e-6 else 1.5
    assert 1 / tol < pred / meas < tol, (pred, meas)


def test_alignment_is_what_separates_the_lm_head_shapes(h100):
    assert not aligned(50257, 768, 2) and aligned(50304, 768, 2) and not aligned(4096, 4095, 2)
    # 50304 is 0.09% more work and ~5x faster: predicted >= 4x
    assert h100.gemm_s(8192, 50257, 768) > 4 * h100.gemm_s(8192, 50304, 768)
    # never faster than the datasheet roof: 2*8192*50304*768 / 989.4e12 = 0.640 ms
    assert h100.gemm_s(8192, 50304, 768) > 2 * 8192 * 50304 * 768 / 989.4e12


def test_memory_bound_ops_follow_the_measured_bandwidth(h100):
    # copy of 512 MiB measured at 2.93 TB/s (read + write) on the H100: 2 * 512 MiB / 2.93e12 = 0.366 ms
    t = h100.memory_s("memory", 2 * 512 * 2**20, "bf16")
    assert t == pytest.approx(2 * 512 * 2**20 / 2.93e12, rel=0.1)
    # a tiny op costs a back-to-back kernel's launch and ramp, plus its bytes
    assert h100.memory_s("pointwise", 64) == pytest.approx(MIN_KERNEL_S, rel=1e-3)
    # small ops reach a smaller share of the bandwidth than large ones
    assert h100.memory_s("pointwise", 2**16) / 2**16 > h100.memory_s("pointwise", 2**30) / 2**30


def test_memory_sweep_rows_that_time_the_host_are_not_used(h100):
    # layer_norm over rows of 1024, fp32, H100 (memory_sweep.csv): 42.0 µs at 4K elements up to 42.0 µs at 1M, the
    # fastest call 31.17 µs at 4M -- all the op's host dispatch. Rows over 3 x 31.17 = 93.5 µs: 67M elements in
    # 260.29 µs and 268M in 880.88 µs. Kernel streaming time = call - fastest call: 67M elements read + written in
    # fp32 = 67108864 * 8 = 536.9 MB in 229.12 µs = 2.343 TB/s. GPT-2's layer_norm (8 x 1024 x 768 fp32, 50.4 MB
    # moved) lies under the smallest kept row, so it streams at that rate: 2.5 µs + 50.4e6 / 2.343e12 = 24.0 µs.
    # (The op kinds are named "layer_norm_1024" in the table: before this, norms fell back to the copy curve, whose
    # 4M-element row, 16.4 µs against a 23 µs host floor, said 4x the datasheet bandwidth.)
    assert h100.memory_s("norm", 50.4e6, "fp32") == pytest.approx(2.5e-6 + 50.4e6 / 2.343e12, rel=0.01)
    # add, bf16: fastest call 21.9 µs, first row over 65.7 µs is 67M elements in 147.3 µs: 3 x 2 B x 67108864 =
    # 402.7 MB in 125.4 µs = 3.21 TB/s; a 100 MB add: 2.5 µs + 100e6 / 3.21e12 = 33.6 µs
    assert h100.memory_s("pointwise", 100e6, "bf16") == pytest.approx(2.5e-6 + 100e6 / 3.21e12, rel=0.01)
    # add, fp32: fastest call 21.71 µs; the 16M-element row (75.58 µs) moves 3 x 4 B x 16777216 = 201.3 MB in
    # 53.87 µs = 3.74 TB/s, over the 3.35 TB/s of HBM3 (its operands were in L2 from the call before): not used.
    # The 67M row: 805.3 MB in 286.45 - 21.71 = 264.74 µs = 3.042 TB/s, so 100 MB of fp32 adds take
    # 2.5 µs + 100e6 / 3.042e12 = 35.4 µs, not the datasheet's 32.4 µs
    assert h100.memory_s("pointwise", 100e6, "fp32") == pytest.approx(2.5e-6 + 100e6 / 3.042e12, rel=0.01)
    # never faster than the datasheet bandwidth
    for cat in ("pointwise", "norm", "softmax", "reduction", "memory"):
        for nbytes in (1e5, 1e7, 1e9):
            assert h100.memory_s(cat, nbytes) >= nbytes / 3.35e12


def test_attention_from_the_backend_sweep(h100):
    # cuDNN, GPT-2 shape (B=8, H=12, T=1024, D=64, causal). Between CUDA events the sweep (sdpa_sweep.csv) measured
    # 0.0841 ms forward and 0.2347 ms backward, against 0.035 / 0.178 ms for its smallest shape (8x16x256): within 3x
    # of that floor a row is the call's host time, and is not used. The H100 GPT-2 bf16 training step measured
    # (profiler kernel records, cuDNN kernels) 2.47 ms for its 12 forward + 12 backward attention ops: 0.206 ms a layer.
    pairs = 1024 * 1025 // 2
    fwd = 8 * 12 * pairs * 4 * 64
    f = h100.attention_s("CUDNN_ATTENTION", 96, 1024, 64, True, False, fwd)
    b = h100.attention_s("CUDNN_ATTENTION", 96, 1024, 64, True, True, 2.5 * fwd)
    assert 0.206e-3 / 1.3 <= f + b <= 0.206e-3 * 1.3
    # the event-timed rows themselves would predict 0.0841 + 0.2347 - 2 x delta = 0.289 ms (the old 0.75x)
    assert f + b < 0.75 * (0.0841e-3 + 0.2347e-3 - 2 * h100.delta_s)
    # backward = the backend's backward/forward ratio on the shapes both directions measure (1x32x8192x128:
    # 4.969 / 1.6566 = 3.0; 2x32x4096x128: 2.95 and 3.02) x the forward
    assert b / f == pytest.approx(3.0, rel=0.03)
    tiny = h100.attention_s("CUDNN_ATTENTION", 128, 256, 64, True, True, 2.5 * 8 * 16 * (256 * 257 // 2) * 4 * 64)
    assert tiny < 0.1e-3
    # flash is slower than cuDNN on the H100 at this shape (0.1015 ms measured)
    assert h100.attention_s("FLASH_ATTENTION", 96, 1024, 64, True, False, fwd) > 1.1 * f


def test_attention_kernels_compute_whole_blocks():
    from tscope_callbacks.devices.efficiency import _tile_waste
    # causal T=1024 in 128-blocks: 8*9/2 = 36 blocks of 128^2 = 589,824 pairs computed for 1024*1025/2 = 524,800
    assert _tile_waste(1024, True) == pytest.approx(589824 / 524800)
    # T=1000 full: 8 blocks a side, (1024 / 1000)^2 computed per attended pair; T=2048 full: none wasted
    assert _tile_waste(1000, False) == pytest.approx(1.048576)
    assert _tile_waste(2048, False) == 1.0


def test_other_gpus_use_the_h100_efficiencies_on_their_own_roofs(h100):
    m = build_model(a100())
    assert m is not None and m.scaled and "scaled from" in m.source
    # a large aligned GEMM reaches the same share of the roof: 8192^3 on A100 ≈ the H100 time x 989.4/312
    ratio = m.gemm_s(8192, 8192, 8192) / h100.gemm_s(8192, 8192, 8192)
    assert ratio == pytest.approx(989.4 / 312, rel=0.15)
    # and the misalignment penalty carries over
    assert m.gemm_s(8192, 50257, 768) > 2 * m.gemm_s(8192, 50304, 768)


def test_no_kernel_model_for_measured_cpu_roofs():
    import torch
    assert model_for(ts.get_device_spec(torch.device("cpu"))) is None
