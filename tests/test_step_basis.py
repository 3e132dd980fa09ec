"""The step basis of RooflineCallback in a real CPU fit: MFU's step time is the median of unprofiled steps past
warm-up (checked against an independent clock on the very same steps: no timing threshold that can flake), the
first profile waits for warmed-up steps and says so, and each profile merges k consecutive steps."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
from cb_utils import FAST, test_spec
from models import TinyLM
from profiles import make_profile, matmul

import tscope_callbacks as ts
from tests.scripted_host import spend
from tscope_callbacks import api
from tscope_callbacks.callbacks.clock import SETTLE_STEPS, StepClock


class Times(pl.Callback):
    """An independent wall clock at each optimizer step's start (before the tscope callbacks' hooks)."""

    def __init__(self) -> None:
        self.t: dict[int, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.t.setdefault(trainer.global_step, time.perf_counter())


class SlowStart(TinyLM):
    """Warm-up made visible on the scripted host: the first ``slow`` steps take 30 ms, the others 5 ms."""

    def __init__(self, slow: int = 4) -> None:
        super().__init__()
        self.slow = slow

    def training_step(self, batch, batch_idx):
        spend(0.03 if self.trainer.global_step < self.slow else 0.005)
        return super().training_step(batch, batch_idx)


def _fit(tmp_path: Path, cb, model=None, max_steps: int = 30) -> tuple[Times, list[dict]]:
    times = Times()
    trainer = pl.Trainer(max_steps=max_steps, default_root_dir=tmp_path, callbacks=[times, cb],
                         logger=pl.loggers.CSVLogger(tmp_path), **FAST)
    trainer.fit(model or TinyLM())
    saved = sorted(Path(trainer.logger.log_dir, "tscope").glob("step_*.json"), key=lambda p: int(p.stem[5:]))
    return times, [json.loads(p.read_text()) for p in saved]


def _cost(step: int) -> float:
    """Step ``step``'s host time on the scripted host: 4, 5 or 6 ms in turn."""
    return 0.004 + 0.001 * (step % 3)


class Scripted(TinyLM):
    """Each step spends :func:`_cost` of host time on the scripted host (the test knows every step's duration)."""

    def training_step(self, batch, batch_idx):
        spend(_cost(self.trainer.global_step))
        return super().training_step(batch, batch_idx)


def test_mfu_basis_is_the_median_of_the_unprofiled_steps_around_each_profile(tmp_path, host):
    # on the scripted host each step takes _cost(step): the basis is checked against the durations the test spent
    # (the wall clock of a busy machine read 11% apart on the same steps)
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=5, every_n_steps=10, outputs=ts.RooflineOutputs(plot=False))
    _, saved = _fit(tmp_path, cb, Scripted(), max_steps=45)
    assert len(saved) >= 2  # the first waits for warm-up (up to 16 steps), then 10-step spacing
    profiled = {s for d in saved for s in d["profile"]["info"]["merged_steps"]}
    for d in saved:
        meta, rep = d["profile"]["info"], d["report"]
        assert meta["step_time_basis"] == "unprofiled-median" and len(meta["merged_steps"]) == 3
        window = meta["step_time_sample_steps"]  # each: from its start to the next step's start
        assert window[0] == meta["step_time_window"][0] and window[-1] == meta["step_time_window"][1]
        assert not profiled & set(window)  # only unprofiled steps: before the profile and the 5 after it
        assert window[0] < meta["step"] and (window[-1] > max(meta["merged_steps"]) or d is saved[-1])
        mine = [_cost(s) for s in window]  # each interval: step s's start to step s+1's, all of it step s's spend
        assert meta["step_time_samples_s"] == pytest.approx(mine, abs=1e-12)
        # the MFU ratio the issue asks for: the profile's MFU over the MFU of those unprofiled steps
        assert meta["step_time_s"] == pytest.approx(statistics.median(mine), abs=1e-12)
        s = rep["summary"]
        assert s["mfu"] == pytest.approx(s["model_flops"] / meta["step_time_s"] / s["mfu_peak_flops"])
        assert rep["summary"]["step_time_basis_text"].startswith("median of")


def test_the_first_profile_waits_for_warmed_up_steps_and_says_so(tmp_path, host):
    # steps 0-3 take 30 ms, then 5 ms: a basis from them would put MFU several times too low
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=2, every_n_steps=100, outputs=ts.RooflineOutputs(plot=False))
    _, saved = _fit(tmp_path, cb, SlowStart(slow=4), max_steps=26)
    meta = saved[0]["profile"]["info"]
    # 5 fast unprofiled steps agree (4-8) and settle the clock: the profile at step 9, its basis from step 4 on
    assert meta["deferred_from"] == 2 and meta["step"] == 4 + SETTLE_STEPS and meta["step_time_settled"]
    assert meta["step_time_window"][0] >= 4 and meta["step_time_s"] == pytest.approx(0.005)
    text = api.roofline(ts.StepProfile.from_dict(saved[0]["profile"]), test_spec()).to_markdown()
    assert f"the first profile waited from step 2 to step {meta['step']}" in text


def test_k_steps_are_merged_and_a_short_run_still_reports(tmp_path):
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=3, every_n_steps=100, outputs=ts.RooflineOutputs(plot=False),
                             capture=ts.CaptureOptions(wait_for_warmup=False))
    _, saved = _fit(tmp_path, cb, max_steps=5)  # steps 3, 4: the end of training cuts the series at 2
    (d,) = saved
    assert d["profile"]["info"]["merged_steps"] == [3, 4] and d["profile"]["info"]["step"] == 3
    assert all(len(o["time_samples"]) == 2 for o in d["profile"]["ops"] if o["time_s"] is not None)
    assert [h["step"] for h in cb.history] == [3]


def test_clock_settles_only_on_agreeing_steps():
    clock = StepClock(cuda=False)
    t = 0.0
    for step, dt in enumerate([0.033] * 4 + [0.005] * 6):
        clock._stamps.append((step, type("S", (), {"t": t, "ready": lambda self: True,
                                                   "seconds_since": lambda self, a: self.t - a.t})(), False, None))
        t += dt
    b = clock.basis()
    assert clock.settled_from == 4 and b.first == 4 and b.median_s == pytest.approx(0.005)


def test_environment_is_named_in_the_header():
    p = make_profile([matmul(1024, 1024, 1024, dtype="float32", time_s=1e-3)], step=7, step_time_s=2e-3,
                     step_time_basis="unprofiled-median", host_cpus=2, torch_threads=2,
                     host_others_load_per_cpu=0.5, host_busy=True, host_oversubscribed=True)
    busy_roof = ts.DeviceSpec("CPU (test)", {"fp32": 1e11}, 2e10, measured=True, vendor="cpu",
                              extra={"load_per_cpu": 0.9})
    md = api.roofline(p, busy_roof).to_markdown()
    env = next(line for line in md.splitlines() if line.startswith("- **Environment**"))
    assert "**busy**" in env and "0.50 of each of the 2 CPUs" in env
    assert "**oversubscribed**" in env and "torch's 2 thread(s) plus 1.0 busy cores exceed the 2 CPUs" in env
    assert "`torch.set_num_threads(1)`" in env
    assert "- **Roof measured under load**: other processes kept 0.90 of each CPU busy" in md
    idle = make_profile([matmul(64, 64, 64, dtype="float32", time_s=1e-4)], host_cpus=2, torch_threads=1,
                        host_others_load_per_cpu=0.01, host_busy=False, host_oversubscribed=False)
    md = api.roofline(idle, test_spec()).to_markdown()
    assert "- **Environment**: idle (other processes: 0.01 per CPU" in md and "Roof measured under load" not in md


def test_a_deferred_first_profile_is_not_cut_by_the_next_scheduled_one(tmp_path, monkeypatch):
    # the step time settles at step 8 (made so: the clock has ticked at steps 0-8): the first profile, due at 5, waits
    # until 8, where the profile scheduled at 10 used to cut its 3-step series ([8, 9]) and left no unprofiled step
    # after it (its basis); the next profile now moves to the first scheduled step past them (20)
    def settle(self) -> bool:
        if self.settled_from is None and len(self._stamps) > 8:
            self.settled_from = 3
        return self.settled_from is not None

    monkeypatch.setattr(StepClock, "settle", settle)
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=5, every_n_steps=10, monitor=None,
                             outputs=ts.RooflineOutputs(plot=False))
    _, saved = _fit(tmp_path, cb, max_steps=45)
    first = saved[0]["profile"]["info"]
    assert first["deferred_from"] == 5 and first["merged_steps"] == [8, 9, 10]
    assert max(first["step_time_sample_steps"]) > 10  # unprofiled steps after the series
    assert [d["profile"]["info"]["step"] for d in saved] == [8, 20, 30, 40]
    assert all(len(d["profile"]["info"]["merged_steps"]) == 3 for d in saved)


def test_the_step_monitors_layer_timing_steps_are_no_step_time_basis(tmp_path, monkeypatch, host):
    # the monitor's baseline is RooflineCallback's first profile (steps 5-7) and 3 steps with ModuleClock's forward
    # hooks on every layer (slower) once that series and the 5 unprofiled steps timed after it are over: the next
    # profile's step clock (and the MFU windows) must leave them out. On the scripted host (every step 5 ms): a busy
    # machine's slow steps would start a slow-step diagnosis, with 3 more such steps
    from tscope_callbacks.capture import module_clock

    ran: list[int] = []
    start = module_clock.ModuleClock.start
    monkeypatch.setattr(module_clock.ModuleClock, "start",
                        lambda self: (ran.append(self.model.trainer.global_step), start(self))[1])
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=5, every_n_steps=20, outputs=ts.RooflineOutputs(plot=False),
                             capture=ts.CaptureOptions(wait_for_warmup=False))
    _, saved = _fit(tmp_path, cb, SlowStart(slow=0), max_steps=30)
    assert len(ran) == 3 and min(ran) >= 5 + 3 + 5 and max(ran) < 20  # after the series' basis, before the next
    stamps = {s: dirty for s, _, dirty, _ in cb._clock._stamps}
    assert all(stamps[m + 1] for m in ran)  # each interval from a ModuleClock step's start to the next step's
    for d in saved:
        assert not set(ran) & set(d["profile"]["info"]["step_time_sample_steps"])
