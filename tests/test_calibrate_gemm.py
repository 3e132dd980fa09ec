"""``tscope calibrate --gemm``: the GEMM table of this GPU, measured with a CUDA-graph timer (faked here), fitted,
cached and used by the kernel model from then on."""

from __future__ import annotations

import json
import math
import types

import pytest
import torch

from tscope_callbacks.cli import main
from tscope_callbacks.devices import efficiency
from tscope_callbacks.devices import gemm_table as gt
from tscope_callbacks.devices.resolve import get_device_spec

H100 = get_device_spec("h100")


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TSCOPE_CACHE_DIR", str(tmp_path))
    efficiency.forget(H100.name)
    yield tmp_path
    efficiency.forget(H100.name)


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
    assert main(["calibrate", "--gemm", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "GEMM table of NVIDIA H100 80GB HBM3" in out and "leave-one-out median error" in out
    assert "bf16 8192x768 @ 768x50257" in out and "cached in" in out
    assert main(["calibrate", "--gemm", "--quick", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"spec", "gemm_table", "leave_one_out"} and data["gemm_table"]["sms"] == 132


def test_cli_gemm_on_cpu_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cal = __import__("tscope_callbacks.devices.calibrate", fromlist=["x"])
    monkeypatch.setattr(cal, "_load_per_cpu", lambda: 0.0)
    assert main(["calibrate", "--gemm", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "Traceback" not in err
