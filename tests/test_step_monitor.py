"""The step monitor: the step breakdown, input-bound verdicts, anomaly triggers and their alerts (CPU fits).

The fits run on the scripted host (tests/scripted_host.py): a step takes exactly the host time its model and dataset
spend (2 ms of host work, a data wait of ``sleep_s`` per sample, 30 ms more in a slow layer), so every verdict below
holds whatever the machine's load; real time would make a busy machine's slow step an alert."""

from __future__ import annotations

import dataclasses
import logging
import random
import types

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

import tscope_callbacks as ts
from tests.cb_utils import FAST
from tests.scripted_host import ScriptedHost, spend
from tscope_callbacks import hostclock
from tscope_callbacks.analysis import anomaly as an
from tscope_callbacks.analysis import step_parts as sp
from tscope_callbacks.analysis.step_parts import PARTS, StepTimes, summarize
from tscope_callbacks.callbacks.monitor import MonitorOptions, StepMonitor, loader_settings

#: the step the slow layer or loader starts at: after the monitor's 30 healthy steps (and its baseline's 4)
SLOW_FROM = 50
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
def test_slow_steps_threshold_comes_from_the_runs_spread() -> None:
    # healthy: 10 ms steps alternating +-0.5 ms: the median of 12 steps is 10 ms every time, so its spread is 0 and
    # the threshold is the 10% floor (11 ms). Then 9 steps at 11.5 ms: the 12-step median crosses when 7 of 12 are
    # slow (the 7th slow step), and the trigger names the first slow step. (A step joins the healthy window 12
    # steps later: the 6 slow steps before the trigger never move its median)
    s = an.SlowSteps(k=4.0, n=12, min_rise=0.10, window=100, min_steps=30)
    for i in range(60):
        assert s.add(i, 0.0095 if i % 2 else 0.0105) is None
    med, spread, thr = s.baseline()
    assert med == pytest.approx(0.010) and spread == pytest.approx(0.0, abs=1e-12) and thr == pytest.approx(0.011)
    got = [s.add(60 + i, 0.0115) for i in range(9)]
    assert [g is not None for g in got] == [False] * 6 + [True, False, False]
    trig = got[6]
    assert trig["first"] == 60 and trig["step"] == 66 and trig["ratio"] == pytest.approx(1.15)
    assert trig["threshold_s"] == pytest.approx(0.011)
    # a noisy run: the same +15% is inside its own spread (steps of 5-15 ms): no trigger
    n = an.SlowSteps(k=4.0, n=12, min_rise=0.10, window=100, min_steps=30)
    for i in range(100):
        n.add(i, 0.005 + 0.010 * ((i * 7) % 11) / 10)
    assert n.baseline()[2] > 1.15 * n.median()
    assert all(n.add(100 + i, 1.15 * (0.005 + 0.010 * ((i * 7) % 11) / 10)) is None for i in range(30))


def test_slow_steps_took_what_the_slow_steps_took() -> None:
    # 10 ms steps, then 20 ms ones: the 12-step median crosses the 11 ms threshold at the 6th slow step, when it is
    # (10.5 + 20) / 2 = 15.25 ms with 6 healthy steps still in the window. The alert said "took 15.2 ms, 1.52x" of
    # steps that took 20 (a trial's "took 8.85 ms, 1.54x" beside its own breakdown's 12.1 ms): it is the slow steps'
    # own median from the first slow one, 20 ms and 2x
    s = an.SlowSteps(k=4.0, n=12, min_rise=0.10, window=100, min_steps=30)
    for i in range(60):
        s.add(i, 0.0095 if i % 2 else 0.0105)
    got = [s.add(60 + i, 0.020) for i in range(6)]
    trig = got[-1]
    assert trig is not None and trig["first"] == 60 and trig["step"] == 65
    assert trig["window_s"] == pytest.approx((0.0105 + 0.020) / 2)
    assert trig["slow_s"] == pytest.approx(0.020) and trig["ratio"] == pytest.approx(2.0)
    text = an.alert_text(trig, [], None)
    assert "steps 60-65 took 20 ms, 2x the healthy median 10 ms" in text


def test_a_slowdown_spread_over_the_whole_step_is_said_so() -> None:
    # every part 1.3x, no other process's load: no part is a cause; the alert says the whole step slowed and what can
    # do that (a trial's healthy CPU runs read "What grew: forward ...; optimizer step ...; backward ..." as causes)
    h = _snap(20, load=0.0, fetch=0.3, forward=1.2, backward=1.0, optimizer=1.2)
    n = _snap(40, load=0.0, fetch=0.39, forward=1.56, backward=1.3, optimizer=1.56)
    f = an.what_grew(h, n, cuda=False)
    assert f and an.whole_step(h, n, f) and not an.contention(h, n, f)
    trig = {"kind": "slow-steps", "step": 126, "first": 118, "slow_s": 0.00481, "median_s": 0.0037, "ratio": 1.3,
            "threshold_s": 0.0045}
    text = an.alert_text(trig, f, 20, uniform=True)
    assert "Spread over the whole step against the healthy steps and the baseline profile of step 20: no part, " \
           "layer or op grew more than the rest" in text and "the machine (clock speed" in text
    assert "Each part: " in text and "What grew" not in text
    one = _snap(40, load=0.0, fetch=0.3, forward=4.0, backward=1.0, optimizer=1.2)  # the forward alone
    assert not an.whole_step(h, one, an.what_grew(h, one, cuda=False))


def test_slow_steps_lasting_change_becomes_the_new_normal() -> None:
    s = an.SlowSteps(k=4.0, n=12, min_rise=0.10, window=40, min_steps=30)
    for i in range(60):
        s.add(i, 0.010)
    trig = [s.add(60 + i, 0.020) for i in range(60)]
    assert sum(t is not None for t in trig) == 1  # one trigger for the stretch, not one per step
    assert s.median() == pytest.approx(0.020)  # after window // 2 slow steps: the new normal


def _snap(step: int, load: float | None = None, layers: dict | None = None, **parts: float) -> an.Snapshot:
    st = [StepTimes(0, sum(parts.values()) / 1e3, tuple(parts.get(p, 0.0) / 1e3 for p in PARTS))]
    return an.Snapshot(step, summarize(st), layers=dict(layers or {}), load=load)


def test_what_grew_names_parts_hooks_layers_and_keeps_tscope_apart() -> None:
    h = _snap(20, layers={"a": 0.001, "b": 0.002}, fetch=1.0, forward=5.0, backward=3.0, tscope=0.1, other=1.0)
    n = _snap(40, layers={"a": 0.001, "b": 0.0215}, fetch=1.0, forward=24.5, backward=3.0, tscope=0.6, other=1.0)
    f = an.what_grew(h, n, cuda=False)
    kinds = {(x.kind, x.name) for x in f}
    # the step grew 20 ms: parts that grew >= 3 ms (15%): forward (+19.5); layer b (+19.5 ms); tscope's +0.5 ms is
    # under the floor (and would be said as tscope's, never as the run's)
    assert ("part", "forward") in kinds and ("layer", "b") in kinds and ("layer", "a") not in kinds
    assert ("part", "fetch") not in kinds and not any(x.kind == "tscope" for x in f)
    text = an.alert_text({"kind": "slow-steps", "step": 40, "first": 36, "slow_s": 0.03, "median_s": 0.01,
                          "ratio": 3.0, "threshold_s": 0.011}, f, 20)
    assert "steps 36-40" in text and "forward 5 ms -> 24.5 ms a step" in text and "layer 'b'" in text
    assert "baseline profile of step 20" in text
    big = _snap(40, fetch=1.0, forward=5.0, backward=3.0, tscope=20.1, other=1.0)
    assert [(x.kind, x.name) for x in an.what_grew(h, big, cuda=False)] == [("tscope", "tscope")]


def test_contention_is_a_slowdown_spread_over_the_step_with_the_load_rising() -> None:
    h = _snap(20, load=0.1, fetch=0.5, forward=1.0, backward=0.5)
    spread = _snap(40, load=0.8, fetch=1.25, forward=2.5, backward=1.25)  # everything 2.5x: nothing concentrated
    assert an.concentrated(h, spread) is None and an.contention(h, spread)
    one = _snap(40, load=0.8, fetch=0.5, forward=4.0, backward=0.5)  # the forward alone: the run's
    assert an.concentrated(h, one) == "forward" and not an.contention(h, one)
    # a slowdown concentrated in a part is the run's, however busy the machine
    busy_h, busy_one = dataclasses.replace(h, load=0.9), dataclasses.replace(one, load=0.9)
    assert not an.contention(busy_h, busy_one)
    # ... as long as the alert can name it: with no finding of a cause (only the load, the CPU wait) it is the load's
    assert an.contention(busy_h, busy_one, findings=[an.Finding("host load", "other processes", 0.9, 0.9, "", "")])
    assert not an.contention(busy_h, busy_one, findings=an.what_grew(busy_h, busy_one, cuda=False))
    # ... also when the machine's waits for a CPU inflated every part besides: the steps wait 2/3 of their time for a
    # CPU, before (1 ms of own time: 3 ms) and after, when a layer takes 1.5 ms more (2.5 ms of own time: 7.5 ms):
    # on the run's own time (each part less its share of the wait) the layer is the growth
    def waiting(step: int, forward: float, layer: float) -> an.Snapshot:
        parts = tuple({"fetch": 0.3, "forward": forward, "backward": 0.3}.get(p, 0.0) * 3e-3 for p in PARTS)
        st = StepTimes(0, sum(parts), parts, {}, sum(parts) * 2 / 3)
        return an.Snapshot(step, summarize([st]), layers={"l": layer}, load=0.8)

    wait_h, wait_n = waiting(20, 0.4, 0.0001), waiting(40, 1.9, 0.0016)
    assert wait_n.breakdown.medians_ms["forward"] == pytest.approx(1.9)  # 5.7 ms of which 3.8 waiting
    assert wait_n.breakdown.medians_ms["cpu_wait"] == pytest.approx(5.0)
    # the forward part grew 1.5 ms while a typical step waited 5 ms for a CPU: that wait could have landed in it
    # whole, so it proves nothing ...
    no_layer = dataclasses.replace(wait_n, layers={})
    assert an.concentrated(dataclasses.replace(wait_h, layers={}), no_layer) is None
    assert an.contention(dataclasses.replace(wait_h, layers={}), no_layer)
    # ... but the layer's time is the least of its timed steps on the run's own time (StepMonitor._layer_times): a
    # preemption in one of them cannot make it grow 1.5 ms, so it is the run's, however busy the machine
    assert an.concentrated(wait_h, wait_n) == "layer 'l'" and not an.contention(wait_h, wait_n)
    # the same 1.5 ms under a wait of 1 ms a step (a third of the healthy step, 1/9 of the slow one) is the run's
    def lightly(step: int, forward: float, layer: float) -> an.Snapshot:
        parts = tuple({"fetch": 0.3, "forward": forward, "backward": 0.3}.get(p, 0.0) * 1e-3 for p in PARTS)
        st = StepTimes(0, sum(parts) + 1e-3, parts, {}, 1e-3)
        return an.Snapshot(step, summarize([st]), layers={"l": layer}, load=0.8)

    assert an.concentrated(lightly(20, 0.4, 0.0001), lightly(40, 1.9, 0.0016)) is not None
    assert an.host_contention(None, 0.6) and not an.host_contention(0.1, 0.3) and an.host_contention(0.1, 0.36)
    assert not an.host_contention(0.1, None)


def test_layer_times_are_the_least_of_the_timed_steps_on_the_runs_own_time() -> None:
    mon = StepMonitor(telemetry=False)
    mon._shares = {5: 0.5, 6: 0.25}  # steps 5 and 6 waited half and 3/4 of their time for a CPU; 7's not in yet
    got = mon._layer_times([(5, {"a": 0.004, "b": 0.001}), (6, {"a": 0.012}), (7, {"a": 0.003, "b": 0.002})])
    # a: 4 ms x 0.5 = 2, 12 x 0.25 = 3, 3 x 0.375 (the median share, for step 7) = 1.125: the least
    assert got["a"] == pytest.approx(0.001125)
    assert got["b"] == pytest.approx(0.0)  # not timed in step 6: 0 there (a layer that did not run)


def test_witness_margin() -> None:
    assert an.witness(0.40, 0.50) is None  # 10 points apart: within the 20-point margin
    assert "exceeds" in an.witness(0.45, 0.20)
    assert "far below" in an.witness(0.10, 0.60)
    assert an.witness(None, 0.5) is None


def test_bad_arguments_say_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"MonitorOptions.min_rise must be a number > 0"):
        MonitorOptions(min_rise=0.0)
    with pytest.raises(ValueError, match="MonitorOptions.recent_steps must be an int >= 1"):
        MonitorOptions(recent_steps=0)
    # a share of the step above 1 can never fire: said (it was accepted)
    with pytest.raises(ValueError, match=r"MonitorOptions.input_bound_share is a share of the step: a number > 0 and "
                                         r"< 1 \(0.1 is 10%\), got 1.5"):
        MonitorOptions(input_bound_share=1.5)
    with pytest.raises(ValueError, match="loop_share is a share of the step"):
        MonitorOptions(loop_share=1.0)
    with pytest.raises(ValueError, match=r"loss_spike must be a number > 1 \(or None: off\)"):
        MonitorOptions(loss_spike=1.0)
    with pytest.raises(TypeError, match="options must be a tscope_callbacks.MonitorOptions, got dict"):
        StepMonitor({"min_rise": 0.2})
    with pytest.raises(TypeError):
        MonitorOptions(0.2)  # keyword-only


# ---------------------------------------------------------------------------------------------- fits on CPU
def test_breakdown_keys_and_input_bound_from_a_sleeping_loader(tmp_path, caplog) -> None:
    mon = StepMonitor()
    roof = ts.RooflineCallback(gpu=ts.DeviceSpec(name="test-cpu", flops={"fp32": 1e11}, bandwidth=2e10,
                                                 source="tests", measured=True, vendor="cpu"),
                               start_step=30, every_n_steps=None,
                               capture=ts.CaptureOptions(steps=1, wait_for_warmup=False),
                               outputs=ts.RooflineOutputs(plot=False, save_json=False))
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        # each sample sleeps 1 ms: 16 ms of fetch per batch against a ~1-3 ms step
        _fit(_Net(_Flags(), sleep_s=0.001), 34, mon, roof, logger=CSVLogger(str(tmp_path), name="run"))
    b = mon.last_breakdown
    # 16 samples of 1 ms each: 16 ms of fetch, then 2 ms of forward (the scripted host: exact)
    assert b.input_bound and b.parts_ms["fetch"] == pytest.approx(16.0) and b.parts_ms["forward"] == pytest.approx(2.0)
    assert b.fetch_share == pytest.approx(16 / 18) and b.step_ms == pytest.approx(18.0)
    # the parts add up to the step (host: on CPU the step), to the float
    assert sum(b.parts_ms.values()) == pytest.approx(b.host_ms, rel=1e-9) and b.step_ms == pytest.approx(b.host_ms)
    assert b.device_busy_ms is None and b.idle_ms is None  # CPU: no device figures
    assert mon.input_fixes and mon.input_fixes[0].startswith("num_workers=0")
    assert any("input-bound" in r.message and "num_workers" in r.message for r in caplog.records)
    # the report's time split: the profiled step carries the breakdown
    sb = roof.last_profile.info.step_breakdown
    assert sb["input_bound"] and sb["basis"] == "host wall clock" and "num_workers" in sb["input_fixes"][0]
    rep = ts.analyze(roof.last_profile, roof.spec)
    split = rep.time_split
    fetch_ms = sb["parts_ms"]["fetch"] + sb["parts_ms"]["transfer"]
    assert split.input_s == pytest.approx(fetch_ms / 1e3)  # the StepReport's time split
    assert split.input_share == pytest.approx(sb["fetch_share"]) and split.input_steps == sb["steps"] >= 8
    assert split.input_bound and split.input_fixes[0].startswith("num_workers=0")
    assert split.input_bound == bool(sb["input_bound"])  # the monitor's verdict, not a second rule
    (line,) = [ln for ln in rep.to_markdown().splitlines() if ln.startswith("- **Input**")]
    assert f"spends {fetch_ms:.4g} ms fetching its batch" in line and "**input-bound**" in line
    assert f"mean of the last {int(sb['steps'])} steps" in line and "set num_workers" in line
    assert ts.StepReport.from_dict(rep.to_dict()).time_split == split  # through the step file
    # the verdict is among the run's alerts (the page lists them): it was a log line only, and a run whose profile
    # came before the verdict showed it nowhere on the page
    from tscope_callbacks.dashboard import logdir as ld

    said = [t for _, t in ld.series(tmp_path / "run" / "version_0").get("alerts", []) if "input-bound" in t]
    assert len(said) == 1 and "num_workers=0" in said[0] and not mon.alerts  # not a diagnosed slowdown
    keys = (tmp_path / "run" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    for k in ("step_ms", "fetch_ms", "transfer_ms", "forward_ms", "backward_ms", "optimizer_ms", "sync_ms",
              "hooks_ms", "logging_ms", "checkpoint_ms", "tscope_ms", "other_ms", "loop_ms", "fetch_share",
              "input_bound"):
        assert f"tscope/step/{k}" in keys


def test_no_logger_no_files(tmp_path) -> None:
    mon = StepMonitor()
    _fit(_Net(_Flags()), 25, mon, default_root_dir=str(tmp_path))
    assert mon.last_breakdown and not (tmp_path / "tscope").exists()


def test_no_input_bound_verdict_from_a_few_steps(caplog) -> None:
    # the same sleeping loader (16 ms of fetch a step), logged at every step, but a fit of 10 steps: fewer clean
    # steps than MIN_VERDICT_STEPS, so no warning and no fixes; the series still has the fetch
    mon = StepMonitor()
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        _fit(_Net(_Flags(), sleep_s=0.001), 10, mon, log_every_n_steps=1)
    assert sp.MIN_VERDICT_STEPS > 9
    assert mon.last_breakdown.parts_ms["fetch"] == pytest.approx(16.0) and mon.last_breakdown.input_bound
    assert not mon.input_fixes and not any("input-bound" in r.message for r in caplog.records)
    # one-step log intervals add up: 30 steps logged at every step reach a verdict
    mon = StepMonitor()
    _fit(_Net(_Flags(), sleep_s=0.001), 30, mon, log_every_n_steps=1)
    assert mon.input_fixes


def test_a_fast_fetch_gets_no_workers_but_one_indexing_a_batch() -> None:
    # an in-memory TensorDataset's 208 us a batch, 16.5% of a 1.26 ms step: the fix said "set num_workers (e.g. 4-8
    # per GPU)", and applied it made the run 3x slower (0.85 -> 2.52 ms a step with 2 persistent workers, a trial on
    # this 2-core VM: each batch a worker makes crosses processes). Under WORKERS_PAY_MS a batch the fix is to build
    # the batch in one indexing (benchmarks/loader_fix.py: the change applied)
    (fast,) = an.input_fixes({"num_workers": 0}, cuda=False, fetch_ms=0.208)
    assert fast.startswith("num_workers=0 and 208 µs a batch: workers would cost more than that")
    assert "__getitems__(indices)" in fast and "BatchSampler" in fast and "set num_workers" not in fast
    (slow,) = an.input_fixes({"num_workers": 0}, cuda=False, fetch_ms=16.0)  # a sleeping loader: workers pay
    assert "set num_workers (a few, leaving the training process its cores)" in slow and "GPU" not in slow
    assert "(e.g. 4-8 per GPU)" in an.input_fixes({"num_workers": 0}, cuda=True, fetch_ms=16.0)[0]
    assert "set num_workers" in an.input_fixes({"num_workers": 0}, cuda=True)[0]  # fetch not known: as before


def test_in_memory_data_is_not_input_bound_whatever_the_loop_costs(caplog) -> None:
    # in-memory data and a callback that spends 2 ms after every batch: the time between two batches is mostly
    # the callback's, which is the loop's own work (a finding naming it), never a reason to add DataLoader workers
    class _Slow(pl.Callback):
        def on_train_batch_end(self, *args) -> None:
            spend(0.002)

    mon = StepMonitor()
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        _fit(_Net(_Flags()), 40, mon, _Slow(), log_every_n_steps=1)
    assert not mon.input_fixes and not any("input-bound" in r.message for r in caplog.records)
    assert mon.loop_finding is not None and "_Slow" in mon.loop_finding.split(":")[1], mon.loop_finding
    assert "tscope's own hooks" in mon.loop_finding
    assert any("loop overhead" in r.message and "_Slow" in r.message for r in caplog.records)


def test_slow_layer_alert_names_the_layer() -> None:
    mon = StepMonitor()
    _fit(_Net(_Flags(), slow="layer"), SLOW_FROM + 30, mon)
    assert len(mon.alerts) == 1, [a["text"] for a in mon.alerts]
    a = mon.alerts[0]
    assert SLOW_FROM < a["step"] <= SLOW_FROM + 30, a["text"]
    assert a["trigger"]["kind"] == "slow-steps"
    assert any(f.kind == "layer" and f.name == "block.1" for f in a["findings"]), a["text"]
    assert any(f.kind == "part" and f.name == "forward" for f in a["findings"]), a["text"]
    assert "layer 'block.1'" in a["text"] and "fetching" not in a["text"]


def test_slow_loader_alert_names_the_fetch() -> None:
    mon = StepMonitor()
    _fit(_Net(_Flags(), slow="data", sleep_s=0.002), SLOW_FROM + 30, mon)
    assert len(mon.alerts) == 1, [a["text"] for a in mon.alerts]
    a = mon.alerts[0]
    assert SLOW_FROM < a["step"] <= SLOW_FROM + 30, a["text"]
    assert (a["findings"][0].kind, a["findings"][0].name) == ("part", "fetch"), a["text"]
    assert not any(f.kind == "layer" for f in a["findings"]), a["text"]


def test_healthy_fit_has_no_alert() -> None:
    # host work varying +-30% from step to step, and a 3x hiccup every 25 steps: noise, not a slowdown
    mon = StepMonitor()
    _fit(_Net(_Flags(), jitter=0.3), 300, mon)
    assert mon.alerts == [], [(a["text"], a["healthy"], a["breakdown"]) for a in mon.alerts]
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

    def synchronize(self) -> None:  # never called: the test fails if anything waits
        raise AssertionError("a CUDA event was waited on")

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.t - self.t) * 1e3  # ms, as torch's


def test_cuda_device_figures_are_read_once_complete_never_waited(monkeypatch) -> None:
    from tscope_callbacks.callbacks.clock import DeviceClock

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    _FakeEvent.done = False
    c = DeviceClock()
    # GPU times: step 0 runs 0.000-0.008, step 1 0.010-0.018 (the stream waits 2 ms for the host between them)
    for step, (t0, t1) in enumerate(((0.000, 0.008), (0.010, 0.018), (0.020, 0.028))):
        _FakeEvent.now = t0
        c.begin(step)
        _FakeEvent.now = t1
        c.end()
    assert c.ready() == []  # the GPU has not passed the events: nothing is read, nothing waits
    _FakeEvent.done = True
    out = c.ready()
    assert [s[0] for s in out] == [0, 1, 2] and out[0][4]  # the first step has no previous end: no basis
    step, busy, span, idle, first = out[1]
    assert busy == pytest.approx(0.008) and span == pytest.approx(0.010) and idle == pytest.approx(0.002)


def test_cuda_steps_join_host_parts_device_figures_and_the_ddp_tail(monkeypatch) -> None:
    # the monitor's CUDA path on fake events: a host step from the probe, its device figures from the DeviceClock
    # and the DDP tail's events from the probe, joined once every event is complete (no waiting)
    from tscope_callbacks.callbacks.clock import DeviceClock

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    _FakeEvent.done = False
    mon = StepMonitor(telemetry=False)
    mon._reset(True)
    added: list[StepTimes] = []
    mon._add = lambda trainer, st: added.append(st)  # type: ignore[method-assign]
    assert isinstance(mon.device, DeviceClock)
    for step, (t0, t1) in enumerate(((0.000, 0.008), (0.010, 0.018))):
        _FakeEvent.now = t0
        mon.device.begin(step)
        _FakeEvent.now = t1
        mon.device.end()
        g, e = _FakeEvent(), _FakeEvent()
        _FakeEvent.now = t1 - 0.003  # the last gradient accumulated 3 ms before backward's end on the stream
        g.record()
        _FakeEvent.now = t1
        e.record()
        st = StepTimes(step, 0.011, tuple([0.001] * len(PARTS)), {}, None)
        mon.probe.done.append((st, [(g, e)], []))
    mon._collect(None)
    assert added == []  # nothing complete yet: nothing read
    _FakeEvent.done = True
    mon._collect(None)
    assert [s.step for s in added] == [0, 1] and added[0].dirty and not added[1].dirty
    s1 = added[1]
    assert s1.step_s == pytest.approx(0.010) and s1.busy_s == pytest.approx(0.008)
    assert s1.idle_s == pytest.approx(0.002) and s1.device_sync_s == pytest.approx(0.003)
    assert s1.host_s == pytest.approx(0.011)  # the host's step stays the probe's
    b = summarize(added)
    assert b.device_sync_ms == pytest.approx(3.0) and sp.rank_vector(b)[1 + PARTS.index("sync")] == pytest.approx(3.0)


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

    mon = StepMonitor(MonitorOptions(loss_spike=None))  # the loss trigger off: only the guard's spike may trigger
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
    trainer = pl.Trainer(max_steps=SLOW_FROM + 25, callbacks=[mon], logger=logger, **{**FAST, "log_every_n_steps": 10})
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
    trainer = _fit(_WithVal(_Flags(), slow="layer"), SLOW_FROM + 25, mon, limit_val_batches=2, val_check_interval=1.0,
                   limit_train_batches=200)
    assert len(mon.alerts) == 1 and mon.last_breakdown
    trainer.validate(trainer.lightning_module, verbose=False)
    assert len(mon.alerts) == 1 and mon.last_breakdown  # setup("validate") resets nothing
    assert not [w for w in recwarn if "StepMonitor" in str(w.message)]  # it has no schedule to explain


def _roof(**kw) -> ts.RooflineCallback:
    spec = ts.DeviceSpec(name="test-cpu", flops={"fp32": 1e11}, bandwidth=2e10, source="tests", measured=True,
                         vendor="cpu")
    return ts.RooflineCallback(gpu=spec, **kw, outputs=ts.RooflineOutputs(plot=False, save_json=False))


def test_on_by_default_inside_roofline_callback() -> None:
    # profiles at steps 5-7, 25-27 and 45-47 (3-step series): their steps are no basis and raise no alert
    roof = _roof(start_step=5, every_n_steps=20)
    trainer = _fit(_Net(_Flags()), 60, roof)
    assert [c for c in trainer.callbacks if isinstance(c, StepMonitor)] == [roof.monitor]
    assert roof.monitor.last_breakdown.steps > 0 and roof.monitor.alerts == []
    assert roof.last_profile.info.step_breakdown["basis"] == "host wall clock"
    # the monitor's baseline is the scheduled profile (its ops) and the layers timed after its series: it took no
    # profile of its own
    first = roof.history[0]["step"]  # 5, or later where the warm-up took longer (wait_for_warmup)
    assert roof.monitor.healthy is not None and roof.monitor.healthy.step == first and roof.monitor.healthy.ops
    assert min(roof.monitor.captures) > first + 2 + 5  # the layers: after the series and its 5 unprofiled steps
    mine = StepMonitor()  # a monitor the trainer already has is the one: not a second
    trainer = _fit(_Net(_Flags()), 3, mine, _roof())
    assert [c for c in trainer.callbacks if isinstance(c, StepMonitor)] == [mine]
    trainer = _fit(_Net(_Flags()), 3, _roof(monitor=None))
    assert not [c for c in trainer.callbacks if isinstance(c, StepMonitor)]
    with pytest.raises(TypeError, match="monitor takes a tscope_callbacks.MonitorOptions .* got 'yes'"):
        _roof(monitor="yes")


# ---------------------------------------------------------------------------------------------- scripted runs
class _Load:
    """Other processes' CPU load, scripted: ``level`` now (per CPU)."""

    def __init__(self) -> None:
        self.level = 0.1

    def snapshot(self):
        return types.SimpleNamespace(wall=hostclock.host_time(), level=self.level)

    def load(self, since):
        return self.level

    def load_between(self, a, b):
        return a.level


_BASE = {"fetch": 0.4, "transfer": 0.1, "forward": 4.0, "backward": 3.0, "optimizer": 1.0, "hooks": 0.2,
         "logging": 0.1, "tscope": 0.05, "other": 0.15}  # ms: a 9 ms step


def _noisy_steps(n: int, rng: random.Random, *, busy: bool, change=None) -> list[StepTimes]:
    """``n`` steps of a 9 ms step with the noise of this shared 2-core machine: each part x lognormal(0, 0.08);
    busy: another process takes the CPU now and then (the run-queue wait comes in 4 ms ticks, 30% of the steps, and
    lands in a random part) and 20-step episodes inflate the CPU time 1.3x; ``change(i, parts, wait)`` alters step
    i (returns the load level too)."""
    out = []
    episode = 0
    for i in range(n):
        parts = {k: v * rng.lognormvariate(0.0, 0.08) for k, v in _BASE.items()}
        wait = 0.0
        if busy:
            if rng.random() < 0.3:
                wait = 4.0 * rng.choice((1, 1, 1, 2))
                parts[rng.choice(list(parts))] += wait
            if episode == 0 and rng.random() < 0.01:
                episode = 20
            if episode:
                episode -= 1
                parts = {k: v * 1.3 for k, v in parts.items()}
        if change is not None:
            parts, wait = change(i, parts, wait)
        host = sum(parts.values())
        out.append(StepTimes(i, host / 1e3, tuple(parts.get(p, 0.0) / 1e3 for p in PARTS), {}, wait / 1e3))
    return out


def _run_scripted(steps: list[StepTimes], load: _Load, levels=None) -> StepMonitor:
    """Drive a monitor with scripted steps as its hooks would (a step closes, the next one starts; a logging step
    every 10; the scripted host's clock moves by each step), no capture allowed (start_step past the end): its
    parts-only diagnosis decides."""
    mon = StepMonitor(MonitorOptions(start_step=10**9), telemetry=False)
    mon.host_load = load
    mon.sinks = lambda trainer: ts.callbacks.sinks.NULL_SINK  # type: ignore[method-assign]
    trainer = types.SimpleNamespace(world_size=1, is_global_zero=True, loggers=[], log_every_n_steps=10,
                                    callbacks=[], fast_dev_run=False)
    mon._load_start = load.snapshot()
    for st in steps:
        if levels is not None:
            load.level = levels(st.step)
        spend(st.host_s)
        mon._gs = st.step + 1
        mon.probe.done.append((st, [], []))
        mon._tick(trainer, None, st.step + 1, None)
        if (st.step + 1) % 10 == 0:
            mon._log(trainer, st.step + 1, None)
    return mon


@pytest.mark.parametrize("busy", [False, True])
def test_a_healthy_1000_step_run_raises_no_alert(busy: bool) -> None:
    # a healthy run on an idle machine, and beside a process that keeps a CPU busy the whole time (run-queue waits
    # and CPU-time episodes, at a steady other-process load of 0.6 per CPU): no alert in 1000 steps
    load = _Load()
    load.level = 0.6 if busy else 0.05
    for seed in range(3):
        mon = _run_scripted(_noisy_steps(1000, random.Random(seed), busy=busy), load)
        assert mon.alerts == [], [a["text"] for a in mon.alerts]


@pytest.mark.parametrize("part", ["forward", "fetch"])
def test_a_sustained_20_percent_slowdown_is_alerted_within_30_steps(part: str) -> None:
    # from step 500 one part takes 1.8 ms more: the step is 20% slower; the alert names that part
    def change(i, parts, wait):
        if i >= 500:
            parts[part] += 1.8
        return parts, wait

    for seed, busy in ((0, False), (1, True)):
        load = _Load()
        load.level = 0.6 if busy else 0.05
        mon = _run_scripted(_noisy_steps(700, random.Random(seed), busy=busy, change=change), load)
        assert len(mon.alerts) == 1, [a["text"] for a in mon.alerts]
        a = mon.alerts[0]
        assert 500 < a["step"] <= 530, a["text"]
        assert (a["findings"][0].kind, a["findings"][0].name) == ("part", part), a["text"]
        assert "no profile: before start_step" in a["text"]


def test_rising_contention_is_named_as_contention_not_alerted() -> None:
    # from step 500 other processes take the CPU: the training thread waits 6 ms a step for one (run-queue wait,
    # spread over the parts), and the CPU time of the rest inflates 1.3x while their load rises 0.1 -> 0.9
    def change(i, parts, wait):
        if i >= 500:
            parts = {k: v * 1.3 for k, v in parts.items()}
            parts["forward"] += 3.0
            parts["backward"] += 3.0
            wait += 6.0
        return parts, wait

    mon = _run_scripted(_noisy_steps(700, random.Random(0), busy=False, change=change), _Load(),
                        levels=lambda i: 0.9 if i >= 500 else 0.1)
    assert mon.alerts == [], [a["text"] for a in mon.alerts]
    assert mon.contended, "the contention was not named"
    c = mon.contended[0]
    assert 500 <= c["step"] <= 530 and "contention at step" in c["text"], c["text"]
    assert "0.10 -> 0.90 per CPU" in c["text"] and "0 ms -> 6 ms a step for a CPU" in c["text"], c["text"]


def test_contention_without_a_slowdown_of_the_run_is_named_from_the_cpu_wait() -> None:
    # only the run-queue wait rises (another process time-slices with the training thread: 5 ms a step more, the
    # CPU time unchanged): the trigger reads the step less that wait, so no slowdown; the wait is named at logging
    # steps as contention
    def change(i, parts, wait):
        if i >= 500:
            parts["forward"] += 5.0
            wait += 5.0
        return parts, wait

    mon = _run_scripted(_noisy_steps(700, random.Random(0), busy=False, change=change), _Load(),
                        levels=lambda i: 0.9 if i >= 500 else 0.1)
    assert mon.alerts == [] and [c["trigger"]["kind"] for c in mon.contended] == ["cpu-wait"]
    c = mon.contended[0]
    assert 500 <= c["step"] <= 540 and "ms a step for a CPU (0 ms before)" in c["text"], c["text"]


# ---------------------------------------------------------------------------------------------- start_step
def test_nothing_is_captured_before_start_step(monkeypatch) -> None:
    # RooflineCallback(start_step=10_000): its monitor takes no profile and times no layer in a fit that ends
    # first (it used to take its baseline profile at ~step 21), and a slowdown is still alerted, on its parts
    from tscope_callbacks.capture import module_clock
    from tscope_callbacks.capture import profile as capture_profile

    started: list[str] = []
    real_profile, real_start = capture_profile.profile, module_clock.ModuleClock.start
    monkeypatch.setattr(capture_profile, "profile", lambda *a, **k: (started.append("profile"),
                                                                      real_profile(*a, **k))[1])
    monkeypatch.setattr(module_clock.ModuleClock, "start", lambda self: (started.append("layers"),
                                                                          real_start(self))[1])
    roof = _roof(start_step=10_000)
    _fit(_Net(_Flags(), slow="layer"), SLOW_FROM + 25, roof)
    mon = roof.monitor
    assert started == [] and mon.captures == [] and not roof.history
    assert len(mon.alerts) == 1 and "no profile: before start_step 10000" in mon.alerts[0]["text"]
    assert [(f.kind, f.name) for f in mon.alerts[0]["findings"]][0] == ("part", "forward")
    # the same fit with start_step=20: the baseline is the scheduled profile, the diagnosis profiles its step
    started.clear()
    roof = _roof(start_step=20, every_n_steps=None, capture=ts.CaptureOptions(steps=1, wait_for_warmup=False))
    _fit(_Net(_Flags(), slow="layer"), SLOW_FROM + 25, roof)
    mon = roof.monitor
    assert mon.healthy is not None and mon.healthy.step == 20 and all(s >= 20 for s in mon.captures)
    assert started.count("profile") == 2  # the scheduled one at 20 (the monitor joined it) and the diagnosis'
    assert len(mon.alerts) == 1 and "layer 'block.1'" in mon.alerts[0]["text"], mon.alerts[0]["text"]
