"""``tscope calibrate --gemm``: the GEMM table of this GPU, measured with a CUDA-graph timer (faked here), fitted,
cached and used by the kernel model from then on; its SDPA rows and its memory-bound op curves (the cases' ops and
their kernel bytes on real captures, CPU here: op wall times)."""

from __future__ import annotations

import json
import math
import types

import pytest
import torch
from profiles import op

from tscope_callbacks.analysis.estimate import expected_s
from tscope_callbacks.capture import kernel_timers
from tscope_callbacks.cli import main
from tscope_callbacks.devices import efficiency, memory_table
from tscope_callbacks.devices import gemm_table as gt
from tscope_callbacks.devices import sdpa_table as gt_sdpa
from tscope_callbacks.devices.efficiency import MIN_KERNEL_S, _curve
from tscope_callbacks.devices.resolve import get_device_spec

H100 = get_device_spec("h100")


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TSCOPE_CACHE_DIR", str(tmp_path))
    efficiency.forget(H100.name)
    yield tmp_path
    efficiency.forget(H100.name)


def one_tb_per_s(case: str, numel: int, precision: str) -> list | None:
    """A layer_norm backward streaming its kernel bytes (dY, X read twice, dX written: 5 tensors) at 1 TB/s after
    a 2.5 µs launch; the other cases measure nothing."""
    if case != "layer_norm":
        return None
    nbytes = 5 * numel * (2 if precision == "bf16" else 4)
    return [("aten.native_layer_norm_backward", "norm", nbytes, 2.5e-6 + nbytes / 1e12)]


def faster_gpu(m: int, n: int, k: int, precision: str) -> float:
    """A GPU 25% faster than the packaged H100 model on every shape."""
    return 0.8 * efficiency.build_model(H100).gemm_s(m, n, k, precision)


def test_shapes_cover_llm_layers_and_misaligned_neighbours():
    full, quick = gt.gemm_shapes(), gt.gemm_shapes(quick=True)
    assert (8192, 50257, 768) in full and (8192, 50304, 768) in full and (8192, 4095, 4096) in full
    assert {m for m, _, _ in full} == {16, 128, 512, 2048, 8192}
    assert set(quick) < set(full) and len(quick) <= len(full) / 3


def test_measured_table_is_cached_and_replaces_the_packaged_one(cache_in_tmp):
    before = efficiency.model_for(H100).gemm_s(8192, 3072, 768)
    table = gt.measure_gemm_table(H100, quick=True, timer=faster_gpu)
    assert table["device"] == H100.name and table["gemm_delta_s"] == 0.0 and table["timing"] == "cuda-graph"
    assert len(table["gemm"]["bf16"]) == len(gt.gemm_shapes(quick=True))
    assert (cache_in_tmp / gt.GEMM_CACHE).exists() and gt.cached_gemm_table(H100.name)["gemm"] == table["gemm"]
    model = efficiency.model_for(H100)  # forgotten by the calibration: rebuilt with the cached table
    assert "calibrate --gemm" in model.source
    # a measured shape is predicted at its measured (graph-timed, no host cost) time
    assert model.gemm_s(8192, 3072, 768) == pytest.approx(0.8 * before, rel=0.05)
    # attention and memory-bound ops still come from the packaged H100 sweeps
    assert model.memory_s("memory", 2**30) == pytest.approx(efficiency.build_model(H100, None).memory_s(
        "memory", 2**30))


def test_leave_one_out_summary_of_a_calibrated_table():
    table = gt.measure_gemm_table(H100, timer=faster_gpu, cache=False)
    s = gt.loo_summary(efficiency.build_model(H100, table={**table, "delta_s": 0.0}))
    assert s["shapes"] == len(gt.gemm_shapes())
    assert s["median_error"] < 0.25 and 0 <= s["within_1_3x"] <= 1 and math.isfinite(s["time_weighted_error"])


def test_bad_timings_and_precisions_are_clear_errors():
    with pytest.raises(RuntimeError, match="timed 0"):
        gt.measure_gemm_table(H100, quick=True, timer=lambda *a: 0.0, cache=False)
    with pytest.raises(ValueError, match="precision 'int4'"):
        gt.measure_gemm_table(H100, quick=True, precisions=("int4",), timer=faster_gpu, cache=False)


def test_needs_a_gpu_without_a_timer(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        gt.measure_gemm_table(H100, quick=True)


def test_cli_gemm_on_a_fake_h100(monkeypatch, capsys, cache_in_tmp):
    cal = __import__("tscope_callbacks.devices.calibrate", fromlist=["x"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=None: types.SimpleNamespace(
        multi_processor_count=132))
    monkeypatch.setattr(cal, "measure_cuda", lambda *a, **kw: {"bf16": 700e12, "fp16": 700e12, "fp32": 50e12,
                                                               "tf32": 380e12, "bandwidth": 2.9e12})
    monkeypatch.setattr(gt, "cuda_graph_gemm_timer", lambda device=0: faster_gpu)
    monkeypatch.setattr(kernel_timers, "kernel_sdpa_timer", lambda device=0: kernel_sdpa)
    monkeypatch.setattr(kernel_timers, "kernel_memory_timer", lambda device=0: one_tb_per_s)
    assert main(["calibrate", "--gemm", "--quick"]) == 0
    out = capsys.readouterr().out
    # the fake: 2.5 µs + bytes at 1 TB/s. Its largest layer_norm-backward row, 32M elements (quick), bf16:
    # 5 x 2**25 x 2 B = 335.5 MB (320 MiB) in 2.5 + 335.5 = 338 µs = 0.993 TB/s (993 GB/s)
    assert "memory-bound: 1 ops timed as kernels" in out
    assert "aten.native_layer_norm_backward: 320 MiB in 338 µs = 993 GB/s" in out
    assert "GEMM table of NVIDIA H100 80GB HBM3" in out and "leave-one-out median error" in out
    assert "SDPA CUDNN_ATTENTION: 8 configurations; (8, 12, 1024, 64) causal: forward 32.2 µs" in out
    assert "bf16 8192x768 @ 768x50257" in out and "cached in" in out
    assert main(["calibrate", "--gemm", "--quick", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"spec", "gemm_table", "leave_one_out"} and data["gemm_table"]["sms"] == 132


def test_cli_gemm_on_cpu_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cal = __import__("tscope_callbacks.devices.calibrate", fromlist=["x"])
    monkeypatch.setattr(cal, "_load_per_cpu", lambda *a: 0.0)
    assert main(["calibrate", "--gemm", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "Traceback" not in err


def kernel_sdpa(backend: str, b: int, h: int, t: int, d: int, causal: bool):
    """A fake kernel-timed SDPA sweep: cuDNN at 400 TFLOP/s forward, 300 backward (hardware FLOPs over the attended
    pairs, the sweep's convention); no efficient-attention kernel for head dim 128."""
    if backend == "EFFICIENT_ATTENTION" and d == 128:
        return None
    pairs = t * (t + 1) // 2 if causal else t * t
    fwd = b * h * pairs * 4 * d
    return fwd / 400e12, 2.5 * fwd / 300e12


def test_calibrated_sdpa_rows_are_kernel_time_and_replace_the_packaged_ones():
    """GPT-2's attention (B=8, H=12, T=1024, d=64, causal): forward hardware FLOPs 4 * 96 * 524,800 pairs * 64 =
    12,897,484,800; the fake measures it at 12.9e9 / 400e12 = 32.2 µs. The packaged (event-timed) rows predict
    44 µs (from 4x16x2048x64, its nearest row above the host floor)."""
    packaged = efficiency.model_for(H100)
    table = gt.measure_gemm_table(H100, quick=True, timer=faster_gpu, sdpa_timer=kernel_sdpa)
    assert table["sdpa_timing"] == "kernels" and "SDPA" in table["source"]
    configs = gt_sdpa.sdpa_configs(quick=True)
    assert len(table["sdpa"]) == 3 * len(configs) - sum(d == 128 for *_, d, _ in configs)  # efficient d=128 skipped
    fwd = 4 * 96 * (1024 * 1025 // 2) * 64
    assert fwd == 12_897_484_800
    calibrated = efficiency.model_for(H100)  # rebuilt with the cached calibration
    assert calibrated.sdpa_source.startswith("kernel-timed") and packaged.sdpa_source.startswith("one call")
    assert calibrated.attention_s("CUDNN_ATTENTION", 96, 1024, 64, True, False, fwd) == pytest.approx(
        fwd / 400e12, rel=0.02)
    assert calibrated.attention_s("CUDNN_ATTENTION", 96, 1024, 64, True, True, 2.5 * fwd) == pytest.approx(
        2.5 * fwd / 300e12, rel=0.02)
    assert packaged.attention_s("CUDNN_ATTENTION", 96, 1024, 64, True, False, fwd) > 1.3 * fwd / 400e12
    # no SDPA measured with a fake GEMM timer alone: the packaged rows stay
    only_gemm = gt.measure_gemm_table(H100, quick=True, timer=faster_gpu)
    assert "sdpa" not in only_gemm and efficiency.model_for(H100).sdpa_source.startswith("one call")


def test_kernel_sdpa_timer_runs_the_capture_and_skips_missing_backends():
    """The timer's own code, on the CPU (op wall times instead of kernel times): forward and backward attention
    ops found and timed; a backend without a kernel here (cuDNN on a CPU) gives None."""
    timer = kernel_timers.kernel_sdpa_timer(reps=1, device_type="cpu")
    got = timer("FLASH_ATTENTION", 2, 2, 64, 16, True)
    assert got is not None and got[0] > 0 and got[1] > 0
    assert timer("CUDNN_ATTENTION", 2, 2, 64, 16, True) is None


# ---------------- memory-bound ops (devices.memory_table) ----------------
def test_layer_norm_case_times_both_passes_with_their_kernel_bytes():
    timer = kernel_timers.kernel_memory_timer(reps=1, device_type="cpu")
    got = {o: (b, t) for o, _, b, t in timer("layer_norm", 1 << 16, "fp32")}
    # 65536 elements at width 768: 85 rows; an activation is 85 x 768 x 4 B = 261,120 B
    act = 85 * 768 * 4
    # forward: reads x, gamma, beta (261,120 + 2 x 3,072), writes y and mean, rstd (261,120 + 2 x 340)
    assert got["aten.native_layer_norm"][0] == 2 * act + 2 * 3072 + 2 * 340
    # backward counted: reads dY, X (2 x act), mean, rstd (680), gamma (3,072; no kernel reads beta); writes dX
    # (act), dgamma, dbeta (6,144) = 793,256; its kernels read dY and X once more for the parameter gradients: + 2 x act
    assert got["aten.native_layer_norm_backward"][0] == 3 * act + 680 + 3072 + 6144 + 2 * act
    assert all(t > 0 for _, t in got.values())


def test_every_case_runs_and_names_its_ops():
    timer = kernel_timers.kernel_memory_timer(reps=1, device_type="cpu")
    want = {"add": "aten.add", "gelu": "aten.gelu_backward", "softmax": "aten._softmax_backward_data",
            "cross_entropy": "aten._log_softmax_backward_data", "bias_grad": "aten.sum", "cast": "aten._to_copy",
            "embedding": "aten.embedding_dense_backward"}
    assert set(want) | {"layer_norm"} == set(memory_table.MEMORY_CASES)
    for case, name in want.items():
        rows = timer(case, 1 << 16, "fp32")
        assert rows and name in {o for o, _, _, _ in rows}, case
        assert all(c in efficiency.KIND_OF_CATEGORY for _, c, _, _ in rows), case  # memory-bound classes only


def test_the_loss_is_calibrated_at_a_training_steps_row_count():
    # nll_loss's forward is one block per call: its time follows the rows, and an H200's quick calibration sized by
    # elements (at most 2^25 / 50257 = 667 rows) put GPT-2's 8,192-row loss at 0.238 ms against 0.019 ms measured
    seen: list[tuple[str, int, str]] = []

    def timer(case, numel, precision):
        seen.append((case, numel, precision))
        return None

    for quick in (True, False):
        seen.clear()
        memory_table.measure_memory_rows(timer, quick=quick)
        rows = sorted({n // 50257 for c, n, _ in seen if c == "cross_entropy"})
        assert rows == ([2048, 8192] if quick else [1024, 4096, 16384])
        assert max(rows) >= 8 * 1024  # GPT-2's 8 x 1024 tokens, measured rather than extrapolated
        # the other cases keep their element sizes
        assert {n for c, n, _ in seen if c == "add"} == set(memory_table.memory_sizes(quick))


def test_calibrated_ops_follow_their_own_curve(monkeypatch):
    # a fake GPU whose layer_norm backward streams its kernel bytes at 1 TB/s after a 2.5 µs launch
    def timer(case, numel, precision):
        if case != "layer_norm":
            return None
        nbytes = 5 * numel * 4
        return [("aten.native_layer_norm_backward", "norm", nbytes, MIN_KERNEL_S + nbytes / 1e12)]

    packaged = efficiency.model_for(H100)
    before = packaged.memory_s("norm", 126e6, "fp32", "aten.native_layer_norm_backward")
    table = gt.measure_gemm_table(H100, quick=True, timer=lambda m, n, k, p: 1e-4, memory_timer=timer)
    assert table["memory_timing"] == "kernels" and "memory-bound: 1 ops" in table["source"]
    assert set(table["memory_ops"]) == {"aten.native_layer_norm_backward"}
    assert table["memory_op_class"] == {"aten.native_layer_norm_backward": "norm"}
    model = efficiency.model_for(H100)  # rebuilt from the cached calibration
    assert "memory-bound: 1 ops kernel-timed" in model.source
    # GPT-2's layer_norm backward (8 x 1024 x 768 fp32): 75.6 MB counted + 50.3 MB re-read = 126 MB, between the
    # measured 42 MB and 168 MB rows (2M and 8M elements x 5 x 4 B): 2.5 µs + 126e6 / 1e12 = 128.5 µs
    t = model.memory_s("norm", 126e6, "fp32", "aten.native_layer_norm_backward")
    assert t == pytest.approx(MIN_KERNEL_S + 126e6 / 1e12, rel=1e-3)
    assert t != pytest.approx(before, rel=0.05)
    # another op of the class follows the class's calibrated rows; an op of an unmeasured class, the packaged curve
    assert model.memory_s("norm", 126e6, "fp32", "aten.native_group_norm") == pytest.approx(t, rel=1e-3)
    assert model.memory_s("pointwise", 50e6, "fp32", "aten.mul") == packaged.memory_s("pointwise", 50e6, "fp32")
    # and the estimate of a recorded op asks for its own curve
    rec = op("aten.native_layer_norm_backward", phase="backward", read=75_000_000, written=1_000_000,
             category="norm", shapes=[[8192, 768], [8192, 768]])
    rec.output_shapes = [[8192, 768], [768], [768]]
    nbytes = 76_000_000 + 2 * 8192 * 768 * 4
    assert expected_s(rec, "fp32", model) == pytest.approx(MIN_KERNEL_S + nbytes / 1e12, rel=1e-3)


def test_rows_at_one_size_merge_into_one_point():
    # two ops' rows at 2**20 bytes (shares 0.5 and 0.8) and one at 2**22: geometric mean sqrt(0.4) = 0.632
    pts = _curve([(20.0, 0.5), (22.0, 0.9), (20.0, 0.8)])
    assert [x for x, _ in pts] == [20.0, 22.0]
    assert pts[0][1] == pytest.approx(math.sqrt(0.5 * 0.8))
