"""CUDA op timing from profiler kernel records, tested with recorded-shape fake events (no GPU here)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tscope_callbacks.capture.cuda_timing import RANGE_PREFIX, is_tensor_core_kernel, kernel_times, tensor_core_flags


@dataclass
class Kernel:
    name: str
    duration: float  # µs, as profiler_util.Kernel


@dataclass
class Event:
    """The fields of torch.autograd.profiler_util.FunctionEvent that kernel_times reads."""

    name: str
    kernels: list = field(default_factory=list)
    cpu_children: list = field(default_factory=list)


@dataclass
class EventWithTotal:
    name: str
    device_time_total: float  # µs


def test_device_time_total_is_used_when_present():
    evts = [
        EventWithTotal(f"{RANGE_PREFIX}0", 120.0),
        EventWithTotal("aten::mm", 999.0),  # not ours: ignored
        EventWithTotal(f"{RANGE_PREFIX}2", 0.0),  # launched nothing (a view): 0, not None
    ]
    assert kernel_times(evts, 4) == [pytest.approx(120e-6), None, 0.0, None]


def test_kernels_of_children_are_summed():
    # tscope#1 -> aten::addmm -> cudaLaunchKernel; the profiler attaches kernels to the aten op (child)
    addmm = Event("aten::addmm", kernels=[Kernel("sm90_gemm", 40.0), Kernel("splitK_reduce", 2.5)])
    wrapper = Event(f"{RANGE_PREFIX}1", cpu_children=[addmm])
    own = Event(f"{RANGE_PREFIX}0", kernels=[Kernel("elementwise", 3.0)])
    out = kernel_times([own, wrapper, addmm], 2)
    assert out == [pytest.approx(3e-6), pytest.approx(42.5e-6)]


def test_out_of_range_and_malformed_names_are_ignored():
    evts = [EventWithTotal(f"{RANGE_PREFIX}x", 5.0), EventWithTotal(f"{RANGE_PREFIX}7", 5.0)]
    assert kernel_times(evts, 3) == [None, None, None]


def test_capture_uses_kernel_times(monkeypatch):
    """The capture engine's CUDA path: ranges per op, kernel times assigned by index after stop."""
    import torch

    import tscope_callbacks as ts
    import tscope_callbacks.capture.cuda_timing as ct

    class FakeRanges:
        def __init__(self) -> None:
            self.n = 0

        def start(self) -> None:
            pass

        def op_range(self, index):
            import contextlib

            self.n = max(self.n, index + 1)
            return contextlib.nullcontext()

        def stop(self, n_ops):
            evts = [EventWithTotal(f"{RANGE_PREFIX}{i}", 10.0 * (i + 1)) for i in range(n_ops)]
            return kernel_times(evts, n_ops)

        def abort(self) -> None:
            pass

    monkeypatch.setattr(ct, "OpRangeProfiler", FakeRanges)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    model = torch.nn.Linear(4, 4)
    with ts.profile(model, timing="cuda") as prof:
        model(torch.randn(2, 4)).sum().backward()
    assert prof.meta["timing"] == "cuda-kernels"
    assert [r.time_s for r in prof.ops] == [pytest.approx(10e-6 * (i + 1)) for i in range(len(prof.ops))]


@pytest.mark.parametrize(
    ("name", "tc"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off", True),
        ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", True),
        ("volta_h884gemm_64x64_ldg8_nn", True),
        ("cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4", True),
        ("flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>", True),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", True),
        ("ampere_sgemm_128x64_nn", False),  # FP32 SIMT GEMM: tf32 disabled
        ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", False),
        ("void at::native::reduce_kernel<512, 1>", False),
    ],
)
def test_tensor_core_kernel_names(name, tc):
    assert is_tensor_core_kernel(name) is tc


def test_tensor_core_flags_per_op():
    gemm = Event("aten::mm", kernels=[Kernel("sm90_xmma_gemm_bf16bf16", 10.0)])
    simt = Event("aten::mm", kernels=[Kernel("ampere_sgemm_128x64_nn", 10.0)])
    evts = [
        Event(f"{RANGE_PREFIX}0", cpu_children=[gemm]),
        Event(f"{RANGE_PREFIX}1", cpu_children=[simt]),
        Event(f"{RANGE_PREFIX}2"),  # a view: no kernel
    ]
    assert tensor_core_flags(evts, 4) == [True, False, None, None]
