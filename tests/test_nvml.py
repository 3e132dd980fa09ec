"""GPU telemetry (devices.nvml) against a fake ``pynvml`` that replays recorded counter sequences
(tests/data/nvml_replay.json: synthetic, shaped like a power-capped H100; see its note)."""

from __future__ import annotations

import csv
import json
import logging
import sys
import types
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import CSVLogger

from tests.cb_utils import FAST
from tests.scripted_host import StepCost
from tests.test_step_monitor import _Flags, _Net
from tscope_callbacks.callbacks.monitor import StepMonitor
from tscope_callbacks.devices import nvml

REPLAY = json.loads((Path(__file__).parent / "data" / "nvml_replay.json").read_text())


def fake_pynvml(rec: dict, *, gpm: bool = True) -> types.ModuleType:
    """A ``pynvml`` stand-in: each read returns the next value of its sequence (the last one repeats)."""
    m = types.ModuleType("pynvml")
    calls: dict[str, int] = {}
    m.calls = calls

    def nxt(key: str):
        i = calls.get(key, 0)
        calls[key] = i + 1
        seq = rec[key]
        return seq[min(i, len(seq) - 1)]

    class Gpm:
        def __init__(self) -> None:
            self.index = None

    class Metric:
        metricId, nvmlReturn, value = 0, 0, 0.0

    class MetricsGet:
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [Metric() for _ in range(4)]

    m.NVML_CLOCK_SM, m.NVML_TEMPERATURE_GPU, m.NVML_GPM_METRICS_GET_VERSION = 1, 0, 1
    m.NVML_GPM_METRIC_ANY_TENSOR_UTIL, m.NVML_GPM_METRIC_HMMA_TENSOR_UTIL = 5, 7
    m.nvmlInit = lambda: calls.__setitem__("init", 1)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    m.nvmlDeviceGetName = lambda h: rec["name"].encode()
    m.nvmlDeviceGetArchitecture = lambda h: rec["architecture"]
    m.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=int(gpm))
    m.nvmlDeviceGetTotalEnergyConsumption = lambda h: nxt("energy_mj")
    m.nvmlDeviceGetPowerUsage = lambda h: nxt("power_mw")
    m.nvmlDeviceGetClockInfo = lambda h, t: nxt("sm_clock_mhz") if t == 1 else 0
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: nxt("reasons")
    m.nvmlDeviceGetTemperature = lambda h, s: nxt("temperature_c")
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=nxt("memory_used_b"))
    m.nvmlGpmSampleAlloc = Gpm

    def sample_get(h, s):
        s.index = nxt("gpm_samples") if "gpm_samples" in rec else calls.setdefault("gpm", 0)
        calls["gpm"] = s.index + 1
        return s

    def metrics_get(req):
        for i in range(req.numMetrics):
            mt = req.metrics[i]
            v = rec["any_tensor_util"][req.sample2.index] if mt.metricId == 5 else None
            mt.nvmlReturn, mt.value = (0, v) if v is not None else (3, 0.0)
        return req

    m.nvmlGpmSampleGet = sample_get
    m.nvmlGpmSampleFree = lambda s: calls.__setitem__("freed", calls.get("freed", 0) + 1)
    m.c_nvmlGpmMetricsGet_t = MetricsGet
    m.nvmlGpmMetricsGet = metrics_get
    return m


@pytest.fixture
def pynvml(monkeypatch):
    fake = fake_pynvml(REPLAY)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_decode_reasons() -> None:
    assert nvml.decode_reasons(0) == []
    assert nvml.decode_reasons(0x4 | 0x20) == ["sw_power_cap", "sw_thermal"]
    assert nvml.decode_reasons(0x1 | 0x10000) == ["gpu_idle", "bit_0x10000"]


def test_missing_package_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    tel, why = nvml.open_telemetry(0)
    assert tel is None and "pip install 'tscope-callbacks[nvml]'" in why


def test_windows_from_replayed_counters(pynvml) -> None:
    tel, why = nvml.open_telemetry(0)
    assert why == "" and tel.name == "NVIDIA H100 80GB HBM3" and tel.gpm
    assert tel.window(10, tokens_per_step=4096) == {}  # the first sample opens the first window
    w = tel.window(20, tokens_per_step=4096)
    # energy: (5000650000 - 5000000000) mJ = 650 J over 10 steps = 65 J/step; over 10 x 4096 tokens = 15.87 mJ/token
    assert w["energy_j_per_step"] == pytest.approx(65.0)
    assert w["energy_j_per_token"] == pytest.approx(650.0 / 40960)
    assert w["power_w"] == pytest.approx(655.0) and w["sm_clock_mhz"] == 1980.0 and w["temperature_c"] == 58.0
    assert w["memory_used_mb"] == pytest.approx(45097156608 / 2**20) and w["throttled"] == 0.0
    assert w["tensor_active"] == pytest.approx(0.615)  # GPM between samples 0 and 1: 61.5%
    tel.window(30, 4096)
    w = tel.window(40, 4096)  # the 4th sample: power-capped
    assert w["energy_j_per_step"] == pytest.approx(67.0)  # (5001980000 - 5001310000) mJ / 10 steps
    assert w["sm_clock_mhz"] == 1755.0 and w["throttle_reasons"] == ["sw_power_cap"] and w["throttled"] == 1.0
    assert pynvml.calls["freed"] == 2  # two GPM samples alive at most
    tel.close()
    assert pynvml.calls["freed"] == 4


def test_no_gpm_before_hopper(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({**REPLAY, "architecture": 7}))  # Ampere
    tel, _ = nvml.open_telemetry(0)
    tel.window(0)
    assert not tel.gpm and "tensor_active" not in tel.window(10)


def test_counter_wrap_or_reset_gives_no_energy(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({**REPLAY, "energy_mj": [900, 100]}))
    tel, _ = nvml.open_telemetry(0)
    tel.window(0)
    assert "energy_j_per_step" not in tel.window(10)  # a counter that went back (driver reload) is not energy


class _Mfu(pl.Callback):
    """Stands in for a RooflineCallback's automatic MFU."""

    last_mfu = 0.05


def test_monitor_logs_telemetry_and_flags_the_mfu_witness(pynvml, host, tmp_path, caplog) -> None:
    # every step takes 5 ms on the scripted host: no slow-step diagnosis (tscope's own work, which drops an
    # interval's energy) can start because the machine is busy
    mon = StepMonitor()

    class _Inject(pl.Callback):  # a CPU run: open the fake GPU's telemetry as the monitor does on CUDA
        def on_fit_start(self, trainer, pl_module):
            mon._tel, mon.telemetry_off = nvml.open_telemetry(0)

    trainer = pl.Trainer(max_steps=40, callbacks=[mon, _Inject(), _Mfu(), StepCost(host)],
                         logger=CSVLogger(str(tmp_path), name="run"), **{**FAST, "log_every_n_steps": 10})
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        trainer.fit(_Net(_Flags()))
    with open(tmp_path / "run" / "version_0" / "metrics.csv") as f:
        got = {(int(row["step"]), k): float(v) for row in csv.DictReader(f) for k, v in row.items()
               if k.startswith("tscope/") and v != ""}
    # samples at steps 10, 20, 30, 40: windows end at 20, 30, 40 (J/step: 650/10, 660/10, 670/10), each
    # logged at its last step's index (19, 29, 39), as Lightning logs its own metrics
    assert got[(19, "tscope/gpu/energy_j_per_step")] == pytest.approx(65.0)
    assert got[(39, "tscope/gpu/energy_j_per_step")] == pytest.approx(67.0)
    assert got[(39, "tscope/gpu/throttled")] == 1.0 and got[(39, "tscope/gpu/sm_clock_mhz")] == 1755.0
    assert got[(19, "tscope/gpu/power_w")] == pytest.approx(655.0)
    assert got[(19, "tscope/gpu/mfu_witness_gap")] == pytest.approx(0.615 - 0.05)
    assert (19, "tscope/gpu/energy_j_per_token") not in got  # float features: no tokens counted
    msgs = [r.message for r in caplog.records if "tensor pipes" in r.message]
    assert len(msgs) == 1 and "MFU is 5%" in msgs[0]  # 61.5% active vs 5% MFU: beyond the 20-point margin


def test_an_interval_with_tscopes_own_work_logs_no_energy_per_step(pynvml, host, tmp_path) -> None:
    # a profile, its report or timed layers inside a logging interval (the coordinator's dirty_clocks) put tscope's time into
    # the energy counter's difference: on an H200 GPT-2 fit those intervals read twice the energy per token
    mon = StepMonitor()

    class _Inject(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            mon._tel, mon.telemetry_off = nvml.open_telemetry(0)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 25:
                mon.coordinator(trainer).dirty_clocks()  # what a profile's end or a report's analysis does

    trainer = pl.Trainer(max_steps=40, callbacks=[mon, _Inject(), StepCost(host)],
                         logger=CSVLogger(str(tmp_path), name="run"),
                         **{**FAST, "log_every_n_steps": 10})
    trainer.fit(_Net(_Flags()))
    with open(tmp_path / "run" / "version_0" / "metrics.csv") as f:
        got = {(int(row["step"]), k): float(v) for row in csv.DictReader(f) for k, v in row.items()
               if k.startswith("tscope/") and v != ""}
    # windows end at 20, 30, 40 (650/10, 660/10, 670/10 J a step), logged at 19, 29, 39; the one holding
    # step 25 is left out
    assert got[(19, "tscope/gpu/energy_j_per_step")] == pytest.approx(65.0)
    assert (29, "tscope/gpu/energy_j_per_step") not in got and (29, "tscope/gpu/power_w") in got
    assert got[(39, "tscope/gpu/energy_j_per_step")] == pytest.approx(67.0)
