"""The step monitor: the step breakdown, input-bound verdicts, anomaly triggers and their alerts (CPU fits).

The fits run on the scripted host (tests/scripted_host.py): a step takes exactly the host time its model and dataset
spend (2 ms of host work, a data wait of ``sleep_s`` per sample, 30 ms more in a slow layer), so every verdict below
holds whatever the machine's load; real time would make a busy machine's slow step an alert."""

from __future__ import annotations

import logging
import random

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

import tscope_callbacks as ts
from tests.cb_utils import FAST
from tests.scripted_host import ScriptedHost, spend
from tscope_callbacks.analysis import anomaly as an
from tscope_callbacks.callbacks.monitor import StepMonitor, loader_settings

SLOW_FROM = 30
STEP_S = 0.002  #: each training step's host work on the scripted host


@pytest.fixture(autouse=True)
def _scripted(host: ScriptedHost) -> ScriptedHost:
    return host


class _Flags:
    slow_layer = False
    slow_data = False


class _Data(Dataset):
    """Random regression samples; each sample spends ``sleep_s`` (always, or from the slow step on)."""

    def __init__(self, n: int = 4096, sleep_s: float = 0.0, flags: _Flags | None = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randn(n, 8, generator=g)
        self.sleep_s, self.flags = sleep_s, flags

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.sleep_s and (self.flags is None or self.flags.slow_data):
            spend(self.sleep_s)
        return self.x[i], self.y[i]


class _Slowable(torch.nn.Module):
    def __init__(self, flags: _Flags) -> None:
        super().__init__()
        self.lin, self.flags = torch.nn.Linear(128, 128), flags

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flags.slow_layer:
            spend(0.03)
        return torch.relu(self.lin(x))


class _Net(pl.LightningModule):
    """A small MLP whose steps spend ``STEP_S`` of host time; ``flags`` make its ``block.1`` (30 ms more in forward)
    or its data slow from step ``SLOW_FROM``; ``jitter``: each step's host work varies by up to that share, and
    every 25th step is a 3x hiccup (a seeded stand-in for a real machine's noise)."""

    def __init__(self, flags: _Flags, slow: str = "", sleep_s: float = 0.0, workers: int = 0,
                 jitter: float = 0.0) -> None:
        super().__init__()
        self.flags, self.slow, self.sleep_s, self.workers, self.jitter = flags, slow, sleep_s, workers, jitter
        self.noise = random.Random(0)
        self.block = torch.nn.Sequential(torch.nn.Linear(64, 128), _Slowable(flags), torch.nn.Linear(128, 8))

    def training_step(self, batch, batch_idx):
        if self.global_step >= SLOW_FROM:
            self.flags.slow_layer = self.slow == "layer"
            self.flags.slow_data = self.slow == "data"
        hiccup = 3.0 if self.jitter and self.global_step % 25 == 24 else 1.0
        spend(STEP_S * hiccup * (1.0 + self.jitter * self.noise.uniform(-1.0, 1.0)))
        x, y = batch
        return torch.nn.functional.mse_loss(self.block(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(_Data(sleep_s=self.sleep_s, flags=self.flags if self.slow == "data" else None),
                          batch_size=16, num_workers=self.workers)


def _fit(model: pl.LightningModule, steps: int, *callbacks: pl.Callback, **kw) -> pl.Trainer:
    trainer = pl.Trainer(max_steps=steps, callbacks=list(callbacks), **{"logger": False, **FAST,
                                                                       "log_every_n_steps": 10, **kw})
    trainer.fit(model)
    return trainer


# ---------------------------------------------------------------------------------------------- pure parts
def test_slow_steps_needs_m_in_a_row_and_adapts() -> None:
    s = an.SlowSteps(k=2.0, m=3, window=20, min_steps=5)
    for i in range(10):
        assert s.add(i, 1.0) is None
    assert s.add(10, 5.0) is None and s.add(11, 5.0) is None  # two slow steps: not yet
    assert s.add(12, 1.0) is None  # the run is broken
    assert s.add(13, 5.0) is None and s.add(14, 5.0) is None
    trig = s.add(15, 4.0)
    assert trig is not None and trig["first"] == 13 and trig["ratio"] == pytest.approx(5.0)  # median(5,5,4)/1
    for i in range(16, 30):  # a lasting slowdown becomes the new normal (window // 2 = 10 slow steps)
        s.add(i, 5.0)
    assert s.median() == pytest.approx(5.0)


def test_spikes_and_rate_limit() -> None:
    sp = an.Spikes(factor=3.0, window=50, min_steps=5)
    assert all(sp.add(i, 2.0) is None for i in range(5))
    assert sp.add(5, 5.9) is None  # 2.95x
    out = sp.add(6, 6.2)
    assert out is not None and out["ratio"] == pytest.approx(3.1)
    assert sp.add(7, float("nan")) is None
    rl = an.RateLimit(gap=100, most=2)
    assert rl.admit(10) and not rl.admit(50) and rl.admit(110) and not rl.admit(400)
    assert rl.suppressed == 2


def test_summarize_and_input_bound_threshold() -> None:
    # 3 steps of 10 ms with a 1 ms data wait (10%: input-bound at the 10% threshold), one dirty step left out
    steps = [an.StepTimes(i, 0.001, 0.009, 0.009, 0.001, 0.010) for i in range(3)]
    steps.append(an.StepTimes(3, 0.5, 0.5, 0.5, 0.5, 1.0, dirty=True))
    out = an.summarize(steps)
    assert out["step_ms"] == pytest.approx(10.0) and out["data_wait_ms"] == pytest.approx(1.0)
    assert out["data_wait_share"] == pytest.approx(0.1) and out["input_bound"] == 1.0 and out["steps"] == 3
    assert an.summarize(steps, share=0.11)["input_bound"] == 0.0
    assert an.summarize([steps[-1]]) == {}


def test_input_fixes_name_what_is_missing() -> None:
    assert "num_workers=0" in an.input_fixes({"num_workers": 0, "pin_memory": False}, cuda=False)[0]
    cuda = an.input_fixes({"num_workers": 4, "pin_memory": False, "persistent_workers": False}, cuda=True)
    assert [f.split("=")[0] for f in cuda] == ["pin_memory", "persistent_workers"]
    done = an.input_fixes({"num_workers": 4, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 2},
                          cuda=True)
    assert len(done) == 1 and "prefetch_factor" in done[0]


def test_what_grew_names_parts_layers_ops_clocks() -> None:
    h = an.Snapshot(20, {"step_ms": 10.0, "data_wait_ms": 1.0, "host_ms": 9.0, "device_busy_ms": 8.0, "idle_ms": 2.0},
                    layers={"a": 0.001, "b": 0.002}, ops={"aten.mm": 0.004},
                    telemetry={"sm_clock_mhz": 1980.0, "power_w": 690.0})
    n = an.Snapshot(40, {"step_ms": 30.0, "data_wait_ms": 1.0, "host_ms": 29.0, "device_busy_ms": 8.5, "idle_ms": 21.5},
                    layers={"a": 0.001, "b": 0.0215}, ops={"aten.mm": 0.0041},
                    telemetry={"sm_clock_mhz": 1400.0, "power_w": 700.0, "throttle_reasons": ["sw_power_cap"]},
                    rank_step_s=[0.030, 0.030, 0.045])
    f = an.what_grew(h, n, cuda=True)
    kinds = {(x.kind, x.name) for x in f}
    # the step grew 20 ms: parts that grew >= 3 ms (15%): host (+20), idle (+19.5); layer b (+19.5 ms); not a, not mm
    assert ("host time", "host time") in kinds and ("GPU idle", "GPU idle") in kinds
    assert ("layer", "b") in kinds and ("layer", "a") not in kinds and ("op", "aten.mm") not in kinds
    assert ("data wait", "data wait") not in kinds and ("device busy", "device busy") not in kinds
    assert ("straggler", "rank 2") in kinds and ("clocks", "SM clock") in kinds and ("power", "power") in kinds
    assert not any(x.kind == "GPU idle" for x in an.what_grew(h, n, cuda=False))
    text = an.alert_text({"kind": "slow-steps", "step": 40, "first": 36, "slow_s": 0.03, "median_s": 0.01,
                          "ratio": 3.0}, f, 20)
    assert "steps 36-40" in text and "layer 'b'" in text and "healthy profile of step 20" in text


def test_contention_is_a_slowdown_spread_over_the_step() -> None:
    h = an.Snapshot(20, {"step_ms": 2.0, "data_wait_ms": 0.5}, layers={"a": 0.0005, "b": 0.0005}, load=0.1)
    # everything 5x slower: nothing grew beyond the step's own ratio (5 x its healthy time)
    spread = an.Snapshot(40, {"step_ms": 10.0, "data_wait_ms": 2.6}, layers={"a": 0.0026, "b": 0.0024}, load=0.8)
    assert an.concentrated(h, spread) is None and an.host_contention(h.load, spread.load)
    assert any(f.kind == "host load" for f in an.what_grew(h, spread, cuda=False))
    # layer b: 0.5 -> 8 ms, 5.5 ms beyond 5x its healthy 0.5 ms (2.5 ms): at least half the 8 ms the step grew
    one = an.Snapshot(40, {"step_ms": 10.0, "data_wait_ms": 0.5}, layers={"a": 0.0005, "b": 0.008}, load=0.8)
    assert an.concentrated(h, one) == "layer 'b'"
    assert not an.host_contention(0.1, 0.2) and an.host_contention(0.1, 0.36) and not an.host_contention(None, None)


def test_witness_margin() -> None:
    assert an.witness(0.40, 0.50) is None  # 10 points apart: within the 20-point margin
    assert "exceeds" in an.witness(0.45, 0.20)
    assert "far below" in an.witness(0.10, 0.60)
    assert an.witness(None, 0.5) is None


def test_bad_arguments_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="slow_factor must be a number > 1"):
        StepMonitor(slow_factor=0.5)
    with pytest.raises(ValueError, match="slow_steps must be an int >= 1"):
        StepMonitor(slow_steps=0)
    with pytest.raises(ValueError, match=r"loss_spike must be a number > 1 \(or None: off\)"):
        StepMonitor(loss_spike=1.0)


# ---------------------------------------------------------------------------------------------- fits on CPU
def test_breakdown_keys_and_input_bound_from_a_sleeping_loader(tmp_path, caplog) -> None:
    mon = StepMonitor()
    roof = ts.RooflineCallback(gpu=ts.DeviceSpec(name="test-cpu", flops={"fp32": 1e11}, bandwidth=2e10,
                                                 source="tests", measured=True, vendor="cpu"),
                               start_step=12, every_n_steps=None, profile_steps=1, wait_for_warmup=False,
                               plot=False, save_json=False)
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        # each sample spends 1 ms: 16 ms of data wait per batch against a 2 ms step
        _fit(_Net(_Flags(), sleep_s=0.001), 20, mon, roof, logger=CSVLogger(str(tmp_path), name="run"))
    b = mon.last_breakdown
    assert b["input_bound"] == 1.0 and b["data_wait_ms"] == pytest.approx(16.0) and b["host_ms"] == pytest.approx(2.0)
    assert b["data_wait_share"] == pytest.approx(16 / 18) and b["step_ms"] == pytest.approx(18.0)
    # CPU: the host is the device (busy = host) and idle is the data wait
    assert b["device_busy_ms"] == pytest.approx(b["host_ms"]) and b["idle_ms"] == pytest.approx(b["data_wait_ms"])
    # each step is its data wait plus its host time (previous batch end -> this batch end), to the float
    assert all(st.step_s == pytest.approx(st.data_wait_s + st.host_s, rel=1e-9) for st in mon.recent)
    assert mon.input_fixes and mon.input_fixes[0].startswith("num_workers=0")
    assert any("input-bound" in r.message and "num_workers" in r.message for r in caplog.records)
    # the report's time split: the profiled step carries the breakdown
    sb = roof.last_profile.meta["step_breakdown"]
    assert sb["input_bound"] == 1.0 and sb["basis"] == "host wall clock" and "num_workers" in sb["input_fixes"][0]
    rep = ts.analyze(roof.last_profile, roof.spec)
    split = rep.time_split
    assert split.input_s == pytest.approx(sb["data_wait_ms"] / 1e3)  # the StepReport's time split
    assert split.input_share == pytest.approx(sb["data_wait_share"]) and split.input_steps == sb["steps"] >= 8
    assert split.input_bound and split.input_fixes[0].startswith("num_workers=0")
    assert split.input_bound == bool(sb["input_bound"])  # the monitor's verdict, not a second rule
    # the markdown report says it, with the wait, its share, and what to change
    from tscope_callbacks.analysis.report import StepReport
    from tscope_callbacks.render.markdown import to_markdown

    (line,) = [ln for ln in to_markdown(rep).splitlines() if ln.startswith("- **Input**")]
    assert f"waits {sb['data_wait_ms']:.4g} ms for its batch" in line and "**input-bound**" in line
    assert f"median of the last {int(sb['steps'])} steps" in line and "set num_workers" in line
    assert StepReport.from_dict(rep.to_dict()).time_split == split  # through the step file
    # keys written (the run's logger; without one the monitor writes no files)
    keys = (tmp_path / "run" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    for k in ("data_wait_ms", "host_ms", "device_busy_ms", "idle_ms", "step_ms", "data_wait_share", "input_bound"):
        assert f"tscope/step/{k}" in keys


def test_no_logger_no_files(tmp_path) -> None:
    mon = StepMonitor()
    _fit(_Net(_Flags()), 25, mon, default_root_dir=str(tmp_path))
    assert mon.last_breakdown and not (tmp_path / "tscope").exists()


def test_no_input_bound_verdict_from_a_few_steps(caplog) -> None:
    # the same slow loader (16 ms of data wait a step), logged at every step, but a fit of 6 steps: fewer clean
    # steps than MIN_VERDICT_STEPS (the first is warm-up), so no warning and no fixes; the series still has the wait
    mon = StepMonitor()
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        _fit(_Net(_Flags(), sleep_s=0.001), 6, mon, log_every_n_steps=1)
    assert an.MIN_VERDICT_STEPS > 5
    assert mon.last_breakdown["data_wait_ms"] == pytest.approx(16.0) and mon.last_breakdown["input_bound"] == 0.0
    assert not mon.input_fixes and not any("input-bound" in r.message for r in caplog.records)
    # one-step log intervals add up: 20 steps logged at every step reach a verdict
    mon = StepMonitor()
    _fit(_Net(_Flags(), sleep_s=0.001), 20, mon, log_every_n_steps=1)
    assert mon.last_breakdown["input_bound"] == 1.0 and mon.input_fixes


def test_input_bound_share_is_the_threshold() -> None:
    # 16 samples of 0.5 ms: 8 ms of data wait in a 10 ms step, 80%: input-bound at the default threshold, not at 90%
    mon = StepMonitor(input_bound_share=0.9)
    _fit(_Net(_Flags(), sleep_s=0.0005), 20, mon)
    assert mon.last_breakdown["data_wait_share"] == pytest.approx(0.8)
    assert mon.last_breakdown["input_bound"] == 0.0 and not mon.input_fixes
    mon = StepMonitor()
    _fit(_Net(_Flags(), sleep_s=0.0005), 20, mon)
    assert mon.last_breakdown["input_bound"] == 1.0 and mon.input_fixes


def test_slow_layer_alert_names_the_layer() -> None:
    mon = StepMonitor()
    _fit(_Net(_Flags(), slow="layer"), 60, mon)
    assert len(mon.alerts) == 1, [a["text"] for a in mon.alerts]
    a = mon.alerts[0]
    assert SLOW_FROM < a["step"] <= SLOW_FROM + 10, a["text"]
    assert a["trigger"]["kind"] == "slow-steps"
    assert any(f.kind == "layer" and f.name == "block.1" for f in a["findings"]), a["text"]
    assert "layer 'block.1'" in a["text"] and "data wait" not in a["text"]


def test_slow_loader_alert_names_data_wait() -> None:
    mon = StepMonitor()
    _fit(_Net(_Flags(), slow="data", sleep_s=0.002), 60, mon)
    assert len(mon.alerts) == 1, [a["text"] for a in mon.alerts]
    a = mon.alerts[0]
    assert SLOW_FROM < a["step"] <= SLOW_FROM + 10, a["text"]
    assert [f.kind for f in a["findings"]][0] == "data wait", a["text"]
    assert not any(f.kind == "layer" for f in a["findings"]), a["text"]


def test_healthy_fit_has_no_alert() -> None:
    # host work varying +-30% from step to step, and a 3x hiccup every 25 steps: noise, not a slowdown
    mon = StepMonitor()
    _fit(_Net(_Flags(), jitter=0.3), 300, mon)
    assert mon.alerts == [], [(a["text"], a["healthy"], a["breakdown"], mon._load_healthy) for a in mon.alerts]
    assert mon.healthy is not None and mon.healthy.layers  # the baseline profile was taken


def test_loader_settings_read_from_the_trainer() -> None:
    class _Probe(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            self.settings = loader_settings(trainer)

    p = _Probe()
    _fit(_Net(_Flags()), 2, p)
    assert p.settings["num_workers"] == 0 and p.settings["pin_memory"] is False


class _FakeEvent:
    """A CUDA event stand-in: ``record`` takes a scripted GPU time; ``query`` is False until ``done`` says so."""

    now = 0.0
    done = False

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = None

    def record(self) -> None:
        self.t = _FakeEvent.now

    def query(self) -> bool:
        return _FakeEvent.done

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.t - self.t) * 1e3  # ms, as torch's


def test_cuda_breakdown_is_read_once_complete_never_waited(monkeypatch) -> None:
    from tscope_callbacks.callbacks.clock import BreakdownClock

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    _FakeEvent.done = False
    c = BreakdownClock(cuda=True)
    # GPU times: step 0 runs 0.000-0.008, step 1 0.010-0.018 (the stream waits 2 ms for the host between them)
    for step, (t0, t1) in enumerate(((0.000, 0.008), (0.010, 0.018), (0.020, 0.028))):
        _FakeEvent.now = t0
        c.begin(step)
        _FakeEvent.now = t1
        assert c.end() is None  # on CUDA nothing is known at the step's end
    assert c.ready() == []  # the GPU has not passed the events: nothing is read, nothing waits
    _FakeEvent.done = True
    out = c.ready()
    assert [s.step for s in out] == [0, 1, 2] and out[0].dirty  # the first step has no previous end: no basis
    s1 = out[1]
    assert s1.busy_s == pytest.approx(0.008) and s1.step_s == pytest.approx(0.010)  # 0.008 -> 0.018
    assert s1.idle_s == pytest.approx(0.002) and not s1.dirty


def test_loss_spike_profiles_the_next_step_and_alerts() -> None:
    class _Spiky(_Net):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * 20 if self.global_step == 40 else loss

    from tscope_callbacks.capture.profile import Profile

    captured: dict[int, int] = {}  # the profiles the monitor took: step -> ops recorded by the capture
    stop = Profile.stop

    def spy(self):
        res = stop(self)
        captured[res.info.step] = len(res.ops)
        return res

    mon = StepMonitor()
    Profile.stop = spy
    try:
        _fit(_Spiky(_Flags()), 50, mon)
    finally:
        Profile.stop = stop
    spikes = [a for a in mon.alerts if a["trigger"]["kind"] == "loss-spike"]
    assert len(spikes) == 1 and spikes[0]["trigger"]["step"] == 40 and spikes[0]["profile_step"] == 41
    assert "loss spike at step 40" in spikes[0]["text"]
    # the triggered profile is the capture every profile takes (ts.profile's Profile), with its op records
    assert captured.get(41, 0) > 0


def test_nan_guard_gradient_spike_triggers_a_profile() -> None:
    class _Spiky(_Net):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * 1000 if self.global_step == 40 else loss  # gradients 1000x: the guard's 10x spike

    mon = StepMonitor(loss_spike=None)  # the loss trigger off: only the guard's spike may trigger
    guard = ts.NaNGuardCallback(action="warn")
    _fit(_Spiky(_Flags()), 50, guard, mon)
    assert [s["step"] for s in guard.spikes] == [40]
    kinds = [a["trigger"]["kind"] for a in mon.alerts]
    assert kinds == ["grad-spike"] and mon.alerts[0]["profile_step"] == 41  # the next step
    assert "gradient-norm spike at step 40" in mon.alerts[0]["text"]


def test_alert_goes_to_wandb_and_the_log(tmp_path, monkeypatch, caplog) -> None:
    wandb = pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sent = []
    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "alert", lambda self, **kw: sent.append(kw), raising=False)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="tscope-test")
    mon = StepMonitor()
    trainer = pl.Trainer(max_steps=45, callbacks=[mon], logger=logger, **{**FAST, "log_every_n_steps": 10})
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        trainer.fit(_Net(_Flags(), slow="layer"))
    logger.experiment.finish()
    assert len(mon.alerts) == 1 and len(sent) == 1
    assert sent[0]["title"].startswith("Slow steps at step") and "layer 'block.1'" in sent[0]["text"]
    assert sent[0]["level"] == wandb.AlertLevel.WARN
    assert any("layer 'block.1'" in r.getMessage() for r in caplog.records)  # and the log line


def test_no_silence_warning_and_validate_keeps_the_fits_state(recwarn) -> None:
    class _WithVal(_Net):
        def validation_step(self, batch, batch_idx):
            return self.training_step(batch, batch_idx)

        def val_dataloader(self):
            return self.train_dataloader()

    mon = StepMonitor()
    trainer = _fit(_WithVal(_Flags(), slow="layer"), 45, mon, limit_val_batches=2, val_check_interval=1.0,
                   limit_train_batches=100)
    assert len(mon.alerts) == 1 and mon.last_breakdown
    trainer.validate(trainer.lightning_module, verbose=False)
    assert len(mon.alerts) == 1 and mon.last_breakdown  # setup("validate") resets nothing
    assert not [w for w in recwarn if "StepMonitor" in str(w.message)]  # it has no schedule to explain


def _roof(**kw) -> ts.RooflineCallback:
    spec = ts.DeviceSpec(name="test-cpu", flops={"fp32": 1e11}, bandwidth=2e10, source="tests", measured=True,
                         vendor="cpu")
    return ts.RooflineCallback(gpu=spec, plot=False, save_json=False, **kw)


def test_on_by_default_inside_roofline_callback() -> None:
    # profiles at steps 5-7, 25-27 and 45-47 (3-step series): their steps are no basis and raise no alert
    roof = _roof(start_step=5, every_n_steps=20)
    trainer = _fit(_Net(_Flags()), 60, roof)
    assert [c for c in trainer.callbacks if isinstance(c, StepMonitor)] == [roof.monitor]
    assert roof.monitor.last_breakdown["steps"] > 0 and roof.monitor.alerts == []
    assert roof.last_profile.meta["step_breakdown"]["basis"] == "host wall clock"
    mine = StepMonitor()  # a monitor the trainer already has is the one: not a second
    trainer = _fit(_Net(_Flags()), 3, mine, _roof())
    assert [c for c in trainer.callbacks if isinstance(c, StepMonitor)] == [mine]
    trainer = _fit(_Net(_Flags()), 3, _roof(monitor=False))
    assert not [c for c in trainer.callbacks if isinstance(c, StepMonitor)]
    with pytest.raises(TypeError, match="monitor must be True, False or a StepMonitor, got str"):
        _roof(monitor="yes")
