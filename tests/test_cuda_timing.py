"""CUDA op timing from Kineto kernel records, tested with ``_KinetoEvent``-shaped fakes and the real H100 kernel names
recorded in ``tests/data/h100_kernel_names.txt`` (no GPU here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import tscope_callbacks as ts
from tscope_callbacks.analysis.fmt import time_text
from tscope_callbacks.capture.cuda_timing import (
    PAUSED_RANGE,
    RANGE_PREFIX,
    Timeline,
    assign_kernels,
    is_tensor_core_kernel,
    union_s,
)

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


@dataclass
class Ev:
    """The ``_KinetoEvent`` methods ``assign_kernels`` calls."""

    _name: str
    _dev: object
    _corr: int = 0
    _link: int = 0
    _start: int = 0
    _end: int = 0
    _stream: int = 7
    _annotation: bool = False
    _thread: int = 1
    _kind: str | None = None  #: ``activity_type()``: None as a torch without it (the reads below sort the event)
    reads: int = 0  #: calls of ``name()``

    def name(self):
        self.reads += 1
        return self._name

    def activity_type(self): return self._kind  # noqa: E704
    def device_type(self): return self._dev  # noqa: E704
    def correlation_id(self): return self._corr  # noqa: E704
    def linked_correlation_id(self): return self._link  # noqa: E704
    def start_ns(self): return self._start  # noqa: E704
    def end_ns(self): return self._end  # noqa: E704
    def duration_ns(self): return self._end - self._start  # noqa: E704
    def device_resource_id(self): return self._stream  # noqa: E704
    def device_index(self): return 0  # noqa: E704
    def is_user_annotation(self): return self._annotation  # noqa: E704
    def start_thread_id(self): return self._thread  # noqa: E704


def _kinded(e: Ev) -> Ev:
    """``e`` with the kind real Kineto gives it (libkineto's ActivityType names; our ranges read "user_annotation" on
    torch 2.13's CPU Kineto): the host's runtime and driver calls, its ranges and other events, the device's work
    and its copies of ranges."""
    if e._dev == CPU:
        kind = ("user_annotation" if e._name.startswith("tscope#") else "cuda_driver" if e._name.startswith("cu")
                and e._name[2:3].isupper() else "cuda_runtime" if e._name.startswith("cuda") else "overhead")
    else:
        kind = ("gpu_user_annotation" if e._annotation else "gpu_memset" if e._name.startswith("Memset")
                else "gpu_memcpy" if e._name.startswith("Memcpy") else "kernel")
    return Ev(**{**e.__dict__, "_kind": kind, "reads": 0})


@pytest.fixture(params=["methods", "kinds"])
def assign(request):
    """``assign_kernels`` on the events as a torch without ``activity_type`` gives them, and with Kineto's kinds: the
    same timeline either way."""
    if request.param == "methods":
        return assign_kernels
    return lambda events, *a, **k: assign_kernels([_kinded(e) for e in events], *a, **k)


def _range(i, corr):
    return Ev(f"{RANGE_PREFIX}{i}", CPU, _corr=corr)


def _kernel(name, link, start, end, stream=7):
    return Ev(name, CUDA, _link=link, _start=start, _end=end, _stream=stream)


def test_kernels_are_assigned_to_the_op_whose_range_launched_them(assign):
    events = [
        _range(0, 101), _range(1, 102), _range(2, 103),  # op 3 recorded no range (not timed)
        Ev("cudaLaunchKernel", CPU, _corr=900),  # runtime API events are not ranges
        _kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 101, 1_000, 41_000),  # op 0: 40 us
        _kernel("void at::native::vectorized_elementwise_kernel<4>", 101, 42_000, 44_500),  # op 0: + 2.5 us
        _kernel("void at::native::reduce_kernel<512, 1>", 103, 50_000, 53_000),  # op 2: 3 us
        _kernel("Memset (Device)", 555, 60_000, 61_000),  # launched outside any op range (e.g. DDP's reducer)
        Ev(f"{RANGE_PREFIX}0", CUDA, _link=101, _start=1_000, _end=44_500, _annotation=True),  # Kineto's GPU copy
    ]
    tl = assign(events, 4)
    assert tl.times == [pytest.approx(42.5e-6), 0.0, pytest.approx(3e-6), None]  # op 1 ran no kernel: 0, not None
    assert tl.tensor_core == [True, None, False, None]
    assert [k.op for k in tl.kernels] == [0, 0, 2, None]
    assert tl.busy_s == pytest.approx((40 + 2.5 + 3 + 1) * 1e-6)  # every kernel of the region counts as busy
    assert tl.span_s == pytest.approx(60e-6)


def test_torch_2_11_links_kernels_through_their_launch_call(assign):
    """Recorded on an H100 (torch 2.11, CUDA 13): with only USER_SCOPE ranges recorded every
    ``linked_correlation_id`` is 0; a kernel shares its ``correlation_id`` with the runtime call that launched it,
    and that call ran inside our range. 'Activity Buffer Request' reuses range 0's id 1 and is not a launch."""
    t0 = 1795411223765041706
    events = [
        Ev("tscope#0", CPU, _corr=1, _start=t0, _end=t0 + 2592679),
        Ev("Activity Buffer Request", CPU, _corr=1, _start=t0 + 201062, _end=t0 + 2457723),
        Ev("cudaLaunchKernelExC", CPU, _corr=11, _start=t0 + 2460478, _end=t0 + 2512553),
        Ev("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8", CUDA, _corr=11, _start=t0 + 2506849,
           _end=t0 + 2563426),
        Ev("tscope#0", CUDA, _corr=1, _start=t0 + 2506849, _end=t0 + 2563426, _annotation=True),
        Ev("tscope#1", CPU, _corr=2, _start=t0 + 2609122, _end=t0 + 28557578),
        Ev("cudaLaunchKernel", CPU, _corr=24, _start=t0 + 25302412, _end=t0 + 28485460),
        Ev("void at::native::vectorized_elementwise_kernel<4>", CUDA, _corr=24, _start=t0 + 28479058,
           _end=t0 + 28481810),
        Ev("cudaDeviceSynchronize", CPU, _corr=30, _start=t0 + 28641115, _end=t0 + 28659211),
    ]
    tl = assign(events, 2)
    assert [k.op for k in tl.kernels] == [0, 1]
    assert tl.times == [pytest.approx(56577e-9), pytest.approx(2752e-9)]
    assert tl.tensor_core == [False, False]  # an FP32 SIMT GEMM (TF32 off) and an elementwise kernel


def test_launches_are_matched_on_their_own_thread(assign):
    """Recorded on an H100: a backward range on the autograd device thread reads start_thread_id 2, the runtime
    calls it makes read 1 (as do the main thread's); both carry the system thread id (446) in device_resource_id.
    Here op 0's range [0, 100) runs on thread 446 while op 1's [50, 80) runs on the main thread 425."""
    events = [
        Ev("tscope#0", CPU, _corr=1, _start=0, _end=100, _thread=2, _stream=446),
        Ev("tscope#1", CPU, _corr=2, _start=50, _end=80, _thread=1, _stream=425),
        Ev("cudaLaunchKernel", CPU, _corr=7, _start=60, _end=61, _thread=1, _stream=446),
        Ev("cuLaunchKernel", CPU, _corr=8, _start=70, _end=71, _thread=1, _stream=425),
        Ev("cudaMemsetAsync", CPU, _corr=9, _start=90, _end=91, _thread=1, _stream=425),  # after op 1's range
        Ev(PAUSED_RANGE, CPU, _corr=3, _start=200, _end=300, _thread=1, _stream=425),
        Ev("cudaLaunchKernel", CPU, _corr=10, _start=250, _end=251, _thread=1, _stream=425),  # tscope's own check
        Ev("nvjet_sm90_tst_128x64", CUDA, _corr=7, _start=1000, _end=2000),
        Ev("reduce_kernel", CUDA, _corr=8, _start=2000, _end=2500),
        Ev("Memset (Device)", CUDA, _corr=9, _start=2600, _end=2700),
        Ev("aminmax_kernel", CUDA, _corr=10, _start=3000, _end=3100),
    ]
    tl = assign(events, 2)
    assert [(k.name, k.op) for k in tl.kernels] == [("nvjet_sm90_tst_128x64", 0), ("reduce_kernel", 1),
                                                    ("Memset (Device)", None)]
    assert tl.tensor_core == [True, False]
    assert tl.kernels[0].stream == 7  # device events keep their stream in device_resource_id


def test_tscope_own_kernels_are_left_out(assign):
    events = [_range(0, 1), Ev(PAUSED_RANGE, CPU, _corr=2),
              _kernel("gemm_nvjet", 1, 0, 10_000), _kernel("aminmax_kernel", 2, 11_000, 12_000)]
    tl = assign(events, 1)
    assert tl.times == [pytest.approx(10e-6)] and [k.name for k in tl.kernels] == ["gemm_nvjet"]


def test_busy_time_is_the_union_of_intervals_across_streams():
    # compute [0, 10) on stream 7 overlapped by a copy [5, 20) on stream 9, then [30, 35): 20 + 5 = 25
    assert union_s([(0, 10), (5, 20), (30, 35)]) == pytest.approx(25e-9)
    tl = Timeline([None], [None], [])
    assert tl.busy_s == 0.0 and tl.span_s == 0.0


def _sections() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    cur = None
    for line in (Path(__file__).parent / "data" / "h100_kernel_names.txt").read_text().splitlines():
        if line.startswith("## "):
            cur = out.setdefault(line[3:], [])
        elif line and not line.startswith("#") and cur is not None:
            cur.append(line)
    return out


def test_tensor_core_detection_on_real_h100_kernel_names():
    sec = _sections()
    tc = {k: [n for n in v if is_tensor_core_kernel(n)] for k, v in sec.items()}
    # FP32 SIMT GEMMs (TF32 off): sm80_xmma ..._ffma_... and cutlass_80_simt_sgemm are CUDA-core kernels
    assert tc["fp32 Linear, TF32 off (expect no tensor cores)"] == []
    assert tc["fp32 mm, TF32 off"] == []
    assert tc["SDPA causal fwd+bwd backend MATH"] == []  # fp32 math attention: ffma GEMMs + elementwise
    # TF32, bf16, fp16 and FP64-tensor GEMMs are tensor-core kernels; their dtype-copy kernels are not
    assert [n[:34] for n in tc["fp32 Linear, TF32 on"]] == ["sm90_xmma_gemm_f32f32_tf32f32_f32_"]
    assert [n[:20] for n in tc["bf16 mm"]] == ["nvjet_sm90_tst_256x1"]
    assert [n[:20] for n in tc["fp16 mm"]] == ["nvjet_sm90_hsh_256x1"]
    assert len(tc["fp64 mm"]) == 1 and "tensor16x8x16" in tc["fp64 mm"][0]
    # attention backends: the main kernels are; flash's convert_dq / dot_do_o helpers and memsets are not
    flash = tc["SDPA causal fwd+bwd backend FLASH_ATTENTION"]
    assert len(flash) == 2 and all("flash_fwd_kernel" in n or "dq_dk_dv" in n for n in flash)
    assert len(tc["SDPA causal fwd+bwd backend EFFICIENT_ATTENTION"]) == 2  # fmha_cutlassF / fmha_cutlassB
    assert len(tc["SDPA causal fwd+bwd backend CUDNN_ATTENTION"]) == 2  # cuDNN flash fprop / bprop (wgmma)
    step = sec["GPT-2 training step (all kernels)"]
    step_tc = tc["GPT-2 training step (all kernels)"]
    assert sum("nvjet" in n for n in step_tc) == sum("nvjet" in n for n in step) == 9
    assert sum("cutlass_75_tensorop" in n for n in step_tc) == 3
    assert all(not is_tensor_core_kernel(n) for n in step if "elementwise" in n or "reduce_kernel" in n
               or "layer_norm" in n or "softmax" in n.lower() or "cub::" in n)
    assert len(step_tc) == 14  # 9 nvjet + 3 cutlass tensorop + 2 cuDNN attention


@pytest.mark.parametrize(("name", "tc"), [
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", True),
    ("volta_h884gemm_64x64_ldg8_nn", True),
    ("ampere_sgemm_128x64_nn", False),  # FP32 SIMT GEMM: tf32 disabled
    ("sm80_xmma_gemm_f64f64_f64f64_f64_nn_n_tilesize32x64x16_stage3_warpsize2x2x1_dfma_execute_kernel", False),
    ("void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 4, 4, false, false>", False),
])
def test_tensor_core_other_families(name, tc):
    assert is_tensor_core_kernel(name) is tc


class FakeTimeline:
    """Stands for the capture's Kineto session: records the ranges entered, gives each op one tensor-core kernel
    of 10 us x (its index + 1) at stop."""

    synced_ns = None  #: as KernelTimeline's: the fakes' device is done when stop() is called
    cost: dict = {}

    last = None  #: the latest instance (its ranges, for the checks)

    def __init__(self) -> None:
        self.names: list[str] = []
        FakeTimeline.last = self

    def start(self) -> None:
        pass

    def enter(self, name):
        self.names.append(name)
        return name

    def exit(self, handle) -> None:
        pass

    def stop(self, n_ops, no_range=()):
        corr = {n: i + 1 for i, n in enumerate(self.names)}
        events = [Ev(n, CPU, _corr=c) for n, c in corr.items()]
        events += [_kernel("nvjet_gemm", corr[f"{RANGE_PREFIX}{i}"], 10**6 * i, 10**6 * i + 10_000 * (i + 1))
                   for i in range(n_ops) if f"{RANGE_PREFIX}{i}" in corr]
        return assign_kernels(events, n_ops, no_range)

    def abort(self) -> None:
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    import tscope_callbacks.capture.region as region

    monkeypatch.setattr(region, "KernelTimeline", FakeTimeline)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


VIEWS = {"aten.t", "aten.view", "aten.expand", "aten.transpose", "aten.detach", "aten.alias", "aten._reshape_alias",
         "aten.unsqueeze", "aten.squeeze", "aten.permute", "aten.select", "aten.slice", "aten.split"}


def test_capture_uses_the_kernel_timeline(fake_cuda):
    """The capture's CUDA path on a fake timeline: a range per op but views (metadata, never a kernel: no range,
    device time 0), times and flags assigned by index at stop, device-busy time as the step-time basis."""
    model = torch.nn.Linear(4, 4)
    with ts.profile(model, timing="cuda") as prof:
        model(torch.randn(2, 4)).view(4, 2).sum().backward()
    n = len(prof.ops)
    views = [r.index for r in prof.ops if r.op in VIEWS]
    assert {prof.ops[i].op for i in views} >= {"aten.t", "aten.view"}  # linear's weight transpose, the user's view
    assert prof.info.timing == "cuda-kernels"
    ranged = [int(n.removeprefix(RANGE_PREFIX)) for n in FakeTimeline.last.names if n != PAUSED_RANGE]
    assert ranged == [i for i in range(n) if i not in views]  # one range per op, none for a view
    assert [r.time_s for r in prof.ops] == [0.0 if i in views else pytest.approx(10e-6 * (i + 1)) for i in range(n)]
    assert [r.tensor_core for r in prof.ops] == [None if i in views else True for i in range(n)]
    assert prof.info.step_time_basis == "device-busy"
    assert prof.info.step_time_s == pytest.approx(sum(10e-6 * (i + 1) for i in range(n) if i not in views))
    assert prof.timeline is not None and len(prof.timeline.kernels) == n - len(views)


def _embedding_counted_after_the_region(monkeypatch, timing):
    """An embedding step under ``ts.profile(timing=...)`` with ``torch.unique`` spied on: its index values are read
    once, after the region (never inside it, where a CUDA read would sync the host); its op record."""
    emb = torch.nn.Embedding(10, 128)
    real_unique, seen = torch.unique, []
    running = {}

    def unique(*a, **k):
        seen.append(running["prof"].running)
        return real_unique(*a, **k)

    monkeypatch.setattr(torch, "unique", unique)
    prof = ts.profile(emb, timing=timing)
    running["prof"] = prof
    with prof:
        emb(torch.full((32,), 3)).sum().backward()
    assert seen == [False]  # one read, after the region
    (r,) = [r for r in prof.ops if r.op == "aten.embedding"]
    return r


def test_value_dependent_counts_wait_for_the_stop(fake_cuda, monkeypatch):
    # an embedding's distinct rows need its index values: on CUDA, reading them inside the region would sync the host
    # mid-step, so the count is taken at stop (which has synchronized anyway); the figure is the same
    r = _embedding_counted_after_the_region(monkeypatch, timing="cuda")
    assert r.bytes_read == 32 * 8 + 128 * 4  # indices + the one distinct row


def test_cupti_note_is_given_once_and_only_when_teardown_is_unset(monkeypatch):
    import tscope_callbacks.capture.cuda_timing as ct

    monkeypatch.setattr(ct, "_noted", False)
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # the user chose: no notice
    assert ct.cupti_teardown_note() is None
    monkeypatch.delenv("TEARDOWN_CUPTI")
    note = ct.cupti_teardown_note()
    assert note is not None and "TEARDOWN_CUPTI=1" in note and "1.27" in note
    assert ct.cupti_teardown_note() is None  # once per process


def test_region_ends_when_the_device_is_done_not_after_tscope_reads_the_kernels(monkeypatch):
    """The real ``KernelTimeline.stop`` with Kineto faked: the device needs 30 ms more at stop (the sync), and reading
    the events back takes 60 ms (tscope's own work). The region's wall time, and the GPU idle derived from it, end at
    the sync; the read-out is reported apart in ``meta["capture_cost"]``, never as GPU idle."""
    import time

    import torch.autograd.profiler as tap

    import tscope_callbacks.capture.cuda_timing as ct
    import tscope_callbacks.capture.region as region

    class Kineto(ct.KernelTimeline):
        def start(self):
            self.names = []

        def enter(self, name):
            self.names.append(name)
            return name

        def exit(self, handle):
            pass

    made: list = []
    monkeypatch.setattr(region, "KernelTimeline", lambda: made.append(Kineto()) or made[-1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: time.sleep(0.03))

    class Result:
        def events(self):
            time.sleep(0.06)
            names = made[-1].names
            return ([Ev(n, CPU, _corr=i + 1) for i, n in enumerate(names)]
                    + [_kernel("nvjet_gemm", i + 1, 10**6 * i, 10**6 * i + 10_000) for i in range(len(names))])

    monkeypatch.setattr(tap, "_disable_profiler", lambda: Result())
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    t0 = time.perf_counter()
    with ts.profile(model, timing="cuda") as prof:
        model(x).sum().backward()
    total = time.perf_counter() - t0
    cost = prof.info.capture_cost
    assert cost["sync_s"] >= 0.03 and cost["kineto_s"] >= 0.06
    assert prof.wall_time_s == cost["region_s"] >= 0.03  # up to the device done, the sync included
    assert prof.wall_time_s <= total - 0.06  # the read-out left out
    busy = prof.info.device_busy_s
    assert prof.info.device_idle_s == pytest.approx(prof.wall_time_s - busy)
    assert cost["ops"] == len(prof.ops) and cost["build_s"] > 0 and cost["start_s"] >= 0
    from tscope_callbacks.render.markdown import _cost_text

    # Kineto's read-out (at least the 60 ms it slept), then the assignment
    assert f"device read-out {time_text(cost['kineto_s'])} + " in _cost_text(cost) and cost["kineto_s"] >= 0.06


def test_the_report_gives_tscope_own_time_beside_the_region():
    model = torch.nn.Linear(4, 4)
    with ts.profile(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    rep = ts.roofline(prof.result, ts.DeviceSpec(name="this CPU", flops={"fp32": 1e11}, bandwidth=1e10))
    step = next(line for line in rep.to_markdown().splitlines() if line.startswith("- **Step**"))
    assert "tscope's own host time outside it: start" in step and "records" in step
    assert "device read-out" not in step  # no Kineto on CPU


def test_events_whose_methods_are_instance_attributes_are_read_too():
    # the per-type method lookup falls back to the instance: an event object built with callables as attributes
    # (another torch's binding, a wrapper) reads the same as one whose class defines them
    from types import SimpleNamespace

    def ev(name, dev, **kw):
        vals = {"name": name, "device_type": dev, "correlation_id": 0, "linked_correlation_id": 0, "start_ns": 0,
                "end_ns": 50_000, "device_resource_id": 7, "device_index": 0, "is_user_annotation": False, **kw}
        return SimpleNamespace(**{k: (lambda v=v: v) for k, v in vals.items()})

    events = [ev(f"{RANGE_PREFIX}0", CPU, correlation_id=101),
              ev("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", CUDA, linked_correlation_id=101, start_ns=1_000,
                 end_ns=41_000)]
    tl = assign_kernels(events, 1)
    assert tl.times == [pytest.approx(40e-6)] and tl.tensor_core == [True]
    assert [(k.stream, k.op) for k in tl.kernels] == [(7, 0)]


def test_tensor_core_flags_are_remembered_per_name():
    # the patterns run once per distinct kernel name; repeated names read the remembered flag, the same answer
    names = ["void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
             "nvjet_sm90_tst_128x128_64x6_4x2_h_bz_NTT", "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_ffma"]
    first = [is_tensor_core_kernel(n) for n in names]
    assert first == [False, True, False] and [is_tensor_core_kernel(n) for n in names * 3] == first * 3


def test_kernel_timeline_asks_kineto_for_no_external_correlation(monkeypatch):
    # no CUPTI external-correlation push per range and no device-side copy of each range: kernels pair with their
    # launch by CUPTI's correlation id (assign_kernels' launch path). The session still records every op range.
    import warnings

    from tscope_callbacks.capture import cuda_timing

    seen = {}
    real = torch.autograd.profiler.profile

    def spy(*a, **k):
        seen.update(k)
        return real(*a, **k)

    monkeypatch.setattr(torch.autograd.profiler, "profile", spy)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    with warnings.catch_warnings():  # this CPU build: "CUDA is not available, disabling CUDA profiling"
        warnings.simplefilter("ignore")
        kt = cuda_timing.KernelTimeline()
    cfg = seen.get("experimental_config")
    # its state, as pickled: the 7th field is disable_external_correlation (False in the default config)
    from torch._C._profiler import _ExperimentalConfig

    assert cfg.__getstate__() == _ExperimentalConfig(disable_external_correlation=True).__getstate__()
    assert cfg.__getstate__() != _ExperimentalConfig().__getstate__()
    kt.start()
    for i in range(3):
        h = kt.enter(f"{RANGE_PREFIX}{i}")
        torch.ones(4).add_(1)
        kt.exit(h)
    tl = kt.stop(3)
    assert tl.times == [0.0, 0.0, 0.0] and tl.kernels == []  # three ranges seen; no device here to run kernels


def test_a_modules_finite_checks_run_in_one_paused_range(fake_cuda):
    """The non-finite checks of a module's outputs are tscope's own kernels: they run in one ``tscope#paused`` range
    per module call (one range's CUPTI and Kineto cost, not one per tensor), and still flag each output."""

    class Three(torch.nn.Module):
        def forward(self, x):
            return x + 1, x * 2, x / 0  # the last one holds inf (and nan at 0 / 0)

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.three = Three()

        def forward(self, x):
            a, b, c = self.three(x)
            return a, b  # handed up: already checked, the same tensors again

    x = torch.arange(4.0)
    with ts.profile(Outer(), timing="cuda", layer_details=True, check_finite=True) as prof:
        prof.model(x)
    names = FakeTimeline.last.names
    # one range for `three`'s three outputs, none for the root's (its outputs are `three`'s, reduced once)
    assert names.count(PAUSED_RANGE) == 1
    assert prof.layers["three"].nonfinite_output and prof.layers[""].nonfinite_output is False
    assert [r.op for r in prof.ops] == ["aten.add", "aten.mul", "aten.div"]  # the checks' own ops: not recorded


def test_an_untimed_capture_of_a_cuda_model_counts_values_at_stop_too(monkeypatch):
    # timing=None on a CUDA model: no kernel timeline, but reading an embedding's indices mid-step would still sync
    # the host, so the count waits for the stop as a timed capture's does (the device is faked: a CPU model whose
    # parameters report CUDA to the capture)
    from tscope_callbacks.capture.paths import ModelTree

    monkeypatch.setattr(ModelTree, "device", lambda self: torch.device("cuda"))
    r = _embedding_counted_after_the_region(monkeypatch, timing=None)
    assert r.bytes_read == 32 * 8 + 128 * 4 and r.time_s is None  # indices + the one distinct row; untimed


def test_a_step_s_runtime_calls_are_kept_unread_where_kineto_names_their_kind():
    """A replayed step has no range: its runtime calls (tens of thousands on a GPT-2 step: every launch, device query
    and stream check) never need their names; with Kineto's kinds each costs one read (its kind), not three. A full
    capture reads the names of the needed launches only."""
    calls = [Ev("cudaGetDevice", CPU, _corr=1000 + i) for i in range(50)]
    launch = Ev("cudaLaunchKernel", CPU, _corr=11, _start=50, _end=60)
    kernel = Ev("nvjet_sm90_tst_128x64", CUDA, _corr=11, _start=100, _end=200)
    replay = [_kinded(e) for e in calls + [launch, kernel]]
    tl = assign_kernels(replay, 0)
    assert [k.name for k in tl.kernels] == ["nvjet_sm90_tst_128x64"] and tl.kernels[0].op is None
    assert sum(e.reads for e in replay[:-1]) == 0  # no host call's name read
    full = [_kinded(e) for e in [Ev("tscope#0", CPU, _corr=1, _start=0, _end=100)] + calls + [launch, kernel]]
    tl = assign_kernels(full, 1)
    assert tl.times == [pytest.approx(100e-9)] and tl.kernels[0].op == 0
    assert sum(e.reads for e in full[1:-2]) == 0 and full[-2].reads == 1  # only the launch's name, to check it
