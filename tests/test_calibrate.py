"""calibrate(): CPU roofs, the CUDA path with a fake timer, the cache, and `tscope calibrate`."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from tscope_callbacks.cli import main
from tscope_callbacks.devices.resolve import get_device_spec
from tscope_callbacks.devices.spec import DeviceSpec

# the module, not the ``ts.calibrate`` function the package exports under the same name
cal = importlib.import_module("tscope_callbacks.devices.calibrate")

FAKE_RATES = {"bf16": 700e12, "fp16": 720e12, "fp32": 50e12, "tf32": 380e12, "copy": 2.9e12}
FAKE_CPU = DeviceSpec("CPU (fake, 2 threads)", {"fp32": 6e10, "bf16": 1e9, "fp16": 1e9, "fp64": 2e10}, 7e9,
                      measured=True, vendor="cpu", vector_flops={"fp32": 6e10, "fp64": 2e10}, source="fake")


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cal, "_load_per_cpu", lambda *a: 0.0)  # test machines are busy; caching is tested apart
    return tmp_path


class FakeTimer(list):
    """Times a benchmark as work / FAKE_RATES[key] without calling ``setup()`` (no GPU needed); records each one."""

    def __call__(self, b: cal.Benchmark) -> float:
        self.append(b)
        return b.work / FAKE_RATES[b.key]


@pytest.fixture
def fake_gpu(monkeypatch) -> FakeTimer:
    """Pretend cuda:0 is an H100 SXM."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H100 80GB HBM3")
    return FakeTimer()


def test_calibrate_cpu_real_measurement(cache_in_tmp):
    spec = cal.calibrate("cpu", budget_s=0.15)
    assert spec.measured and spec.achievable is not None and spec.achievable.achievable is None
    assert spec.achievable.flops == spec.flops and spec.achievable.bandwidth == spec.bandwidth
    assert set(spec.flops) == {"fp32", "bf16", "fp16", "fp64"}
    assert all(v > 0 for v in spec.flops.values()) and spec.bandwidth > 0
    assert spec.extra["cache_key"] == cal.cpu_cache_key()
    assert "torch" in cal.cpu_cache_key() and "threads" in cal.cpu_cache_key()


def test_measure_cpu_respects_budget():
    import time

    t0 = time.process_time()  # this process's CPU time: other processes' load does not stretch it
    spec = cal.measure_cpu(budget_s=0.2)
    assert time.process_time() - t0 < 2.0  # first runs at each size may overshoot a little, never by seconds
    assert spec.extra["matmul_n"]["fp32"] >= 128 and spec.extra["copy_bytes"] >= 16 << 20


def test_cpu_cache_budget_rule(monkeypatch):
    calls = []
    monkeypatch.setattr(cal, "measure_cpu", lambda **kw: calls.append(kw["budget_s"]) or FAKE_CPU)
    cal.cpu_spec(budget_s=0.5)
    cal.cpu_spec(budget_s=0.9)  # cached 0.5 >= 0.45: reused
    cal.cpu_spec(budget_s=3.0)  # a much better measurement asked for: re-measured
    cal.cpu_spec(budget_s=0.1, cache=False)
    assert calls == [0.5, 3.0, 0.1]


def test_busy_cpu_measurement_is_cached_as_provisional_and_told_in_one_log_line(monkeypatch, cache_in_tmp, caplog,
                                                                                 recwarn):
    busy = DeviceSpec("CPU (busy)", {"fp32": 1e9}, 1e9, measured=True, extra={"load_per_cpu": 0.9})
    idle = DeviceSpec("CPU (idle)", {"fp32": 6e10}, 7e9, measured=True, extra={"load_per_cpu": 0.0})
    calls = []
    monkeypatch.setattr(cal, "measure_cpu", lambda **kw: calls.append(1) or (busy if len(calls) == 1 else idle))
    monkeypatch.setattr(cal, "_told_busy", set())
    now = {"load": 0.9}
    monkeypatch.setattr(cal, "_load_per_cpu", lambda *a: now["load"])
    with caplog.at_level("WARNING", logger="tscope_callbacks"):
        assert cal.cpu_spec(budget_s=0.1).name == "CPU (busy)"
        assert cal.cpu_spec(budget_s=0.1).name == "CPU (busy)"  # still busy: the cached one, not measured again
    assert len(calls) == 1 and (cache_in_tmp / "cpu_roofs.json").exists()
    lines = [r for r in caplog.records if r.name == "tscope_callbacks"]
    assert len(lines) == 1 and "0.90 of each CPU busy" in lines[0].getMessage()
    assert not [w for w in recwarn if "busy" in str(w.message)]  # no Python warning with file:line
    now["load"] = 0.0  # an idle moment: the provisional roof is replaced, then reused
    assert cal.cpu_spec(budget_s=0.1).name == "CPU (idle)"
    assert cal.cpu_spec(budget_s=0.1).name == "CPU (idle)" and len(calls) == 2
    now["load"] = 0.9  # an idle measurement is kept on a busy machine
    assert cal.cpu_spec(budget_s=0.1).name == "CPU (idle)" and len(calls) == 2


def test_others_load_excludes_this_process():
    snap = cal.cpu_snapshot()
    t0 = __import__("time").perf_counter()
    while __import__("time").perf_counter() - t0 < 0.2:  # this process busy: not someone else's load
        pass
    load = cal.others_load_per_cpu(snap)
    assert load is None or load >= 0.0
    env = cal.host_environment(snap, threads=64)
    assert env["torch_threads"] == 64 and env["host_oversubscribed"]  # more threads than CPUs


def test_cuda_path_with_fake_timer(fake_gpu, cache_in_tmp):
    spec = cal.calibrate(timer=fake_gpu)
    assert spec.name == "NVIDIA H100 SXM" and not spec.measured
    ach = spec.achievable
    assert ach is not None and ach.measured and ach.name == "NVIDIA H100 80GB HBM3 (measured)"
    for key in ("bf16", "fp16", "fp32", "tf32"):
        assert ach.flops[key] == pytest.approx(FAKE_RATES[key])
    assert ach.bandwidth == pytest.approx(FAKE_RATES["copy"])
    assert ach.peak_flops("fp32", allow_tf32=False) == pytest.approx(50e12)
    assert ach.peak_flops("fp32", allow_tf32=True) == pytest.approx(380e12)
    keys = {b.key: b for b in fake_gpu}
    assert set(keys) == {"bf16", "fp16", "fp32", "tf32", "copy"}
    assert keys["tf32"].tf32 and not keys["fp32"].tf32
    assert keys["bf16"].work == 2.0 * 8192**3 and keys["copy"].work == 2.0 * (1 << 30)
    assert (cache_in_tmp / "gpu_roofs.json").is_file()


def test_cuda_calibration_cache(fake_gpu, cache_in_tmp):
    cal.calibrate(timer=fake_gpu)

    def no_timer(b):
        raise AssertionError("re-measured despite the cache")

    again = cal.calibrate(timer=no_timer)
    assert again.achievable.flops["bf16"] == pytest.approx(700e12)
    # get_device_spec("auto") on that GPU shows the datasheet with the cached achievable roofs beside it
    auto = get_device_spec("auto")
    assert auto.name == "NVIDIA H100 SXM" and auto.flops["bf16"] == pytest.approx(989.4e12)
    assert auto.achievable is not None and auto.achievable.flops["bf16"] == pytest.approx(700e12)
    n = len(fake_gpu)
    cal.calibrate(timer=fake_gpu, cache=False)
    assert len(fake_gpu) == 2 * n  # measured again


def test_cuda_quick_and_memory_limits(fake_gpu):
    spec = cal.calibrate("cuda:0", quick=True, timer=fake_gpu)
    assert spec.achievable.flops["bf16"] == pytest.approx(700e12)
    assert {b.work for b in fake_gpu if b.key != "copy"} == {2.0 * 4096**3}
    small = cal.cuda_benchmarks(0, free_bytes=1 << 30)  # 1 GiB free: smaller matmuls and copy
    mm = next(b for b in small if b.key == "bf16")
    cp = next(b for b in small if b.key == "copy")
    assert mm.work < 2.0 * 8192**3 and cp.work <= 2.0 * (256 << 20)


def test_cuda_skips_precisions_the_chip_lacks(monkeypatch, fake_gpu):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "Tesla V100-SXM2-16GB")
    spec = cal.calibrate(timer=fake_gpu)
    assert spec.name == "NVIDIA V100 SXM2"
    assert set(spec.achievable.flops) == {"fp16", "fp32"}  # no bf16/TF32 units to measure


def test_cuda_unknown_gpu_warns_and_returns_measured(monkeypatch, fake_gpu):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA Z9000")
    with pytest.warns(UserWarning, match="not in gpu_specs.json"):
        spec = cal.calibrate(timer=fake_gpu)
    assert spec.measured and spec.achievable is not None and spec.flops["tf32"] == pytest.approx(380e12)


def test_bad_device():
    with pytest.raises(ValueError, match="unsupported device"):
        cal.calibrate("meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_cuda_event_timer_real_gpu():
    rates = cal.measure_cuda(torch.cuda.current_device(), quick=True, precisions=("fp16",))
    assert rates["fp16"] > 1e12 and rates["bandwidth"] > 5e10


# ---------------- CLI ----------------
def test_cli_calibrate_cpu_table(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cal, "measure_cpu", lambda **kw: FAKE_CPU)
    assert main(["calibrate"]) == 0
    out = capsys.readouterr().out
    assert "precision | datasheet TFLOP/s | achievable TFLOP/s" in out and "CPU (fake, 2 threads)" in out
    assert "0.06" in out and "100%" in out and "bandwidth" in out and "0.007" in out


def test_cli_calibrate_gpu_json_and_no_cache(monkeypatch, capsys, fake_gpu):
    real_measure = cal.measure_cuda
    monkeypatch.setattr(cal, "measure_cuda", lambda *a, **kw: real_measure(*a, **{**kw, "timer": fake_gpu}))
    assert main(["calibrate"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("bf16"))
    assert "989.4" in row and "700" in row and "70.7%" in row
    assert main(["calibrate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["name"] == "NVIDIA H100 SXM" and data["achievable"]["flops"]["tf32"] == pytest.approx(380e12)
    n = len(fake_gpu)
    assert main(["calibrate", "--no-cache", "--quick"]) == 0
    assert len(fake_gpu) > n
    capsys.readouterr()


def test_cli_calibrate_error_exit(capsys):
    assert main(["calibrate", "--gpu", "meta"]) == 2
    err = capsys.readouterr().err
    assert "unsupported device" in err and "Traceback" not in err
