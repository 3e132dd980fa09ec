"""Gradient norms in the NaN guard: the per-tensor norms its check computes anyway, kept per layer, logged, a spike
alerted, and the trend before a non-finite step told in the event -- against norms computed independently."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback
from models import TinyLM

from tscope_callbacks.analysis import nonfinite as nl
from tscope_callbacks.analysis.grad_history import GradHistory, global_norm, layer_norms
from tscope_callbacks.callbacks.nan_guard import NaNGuardCallback

NAN = float("nan")
SPIKE_LAYER = "model.blocks.1.mlp.fc"


def test_layer_and_global_norms_by_hand():
    names = ["a.w", "a.b", "b.w", "c"]
    norms = [3.0, 4.0, 12.0, 5.0]
    # a: sqrt(3² + 4²) = 5; b: 12; the root's own "c": 5; all: sqrt(9 + 16 + 144 + 25) = sqrt(194)
    assert layer_norms(names, norms) == {"a": 5.0, "b": 12.0, "": 5.0}
    assert global_norm(norms) == pytest.approx(math.sqrt(194))


def test_spike_needs_history_and_names_the_layer_that_grew():
    h = GradHistory(window=16, spike_factor=10.0, min_steps=10)
    names = ["x.w", "y.w"]
    for s in range(9):  # too few steps for a median: a jump is not a spike yet
        assert h.add(s, names, [1.0, 1.0]) is None
    assert h.add(9, names, [30.0, 1.0]) is None  # 9 steps before it
    h.steps.pop()
    h.add(9, names, [1.0, 1.0])
    spike = h.add(10, names, [1.0, 20.0])
    # global: sqrt(1 + 400) = 20.02 vs the median sqrt(2) = 1.414: 14.2x; y.w grew 20x, x.w 1x
    assert spike["ratio"] == pytest.approx(math.sqrt(401) / math.sqrt(2))
    assert spike["layer"] == "y" and spike["layer_ratio"] == pytest.approx(20.0)
    assert h.add(11, names, [NAN, 1.0]) is None and h.steps[-1][0] == 10  # non-finite steps are not history


def test_trend_tells_where_the_growth_started():
    h = GradHistory(window=64, spike_factor=10.0)
    names = ["enc.w", "dec.w"]
    for s in range(12):
        h.add(s, names, [1.0, 1.0])
    for s, g in ((12, 3.0), (13, 30.0), (14, 300.0)):  # dec grows from step 12; first > 10x the median at 13
        h.add(s, names, [1.0, g])
    text = h.trend()
    assert "15 checked step(s)" in text and "at step 14" in text
    assert "first exceeded 10x the median of the steps before at step 13" in text
    assert "'dec'" in text and "look there first" in text
    assert GradHistory().trend() == ""


class GradProbe(Callback):
    """Each step's gradient norms per parameter, computed here in float64 (after the guard, same hook)."""

    def __init__(self) -> None:
        self.norms: dict[int, dict[str, float]] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.norms[trainer.global_step] = {n: float(p.grad.double().norm()) for n, p in pl_module.named_parameters()
                                           if p.grad is not None}


def _spiking(model: TinyLM, spike_step: int, nan_step: int | None) -> None:
    """fc's weight gradient x1000 at ``spike_step``, then growing x10 per step up to a NaN output at ``nan_step``."""
    fc = model.get_submodule(SPIKE_LAYER)

    def scale(g):
        s = model.trainer.global_step
        return g * 1000.0 * 10.0 ** (s - spike_step) if s >= spike_step else g

    fc.weight.register_hook(scale)
    if nan_step is not None:
        model.get_submodule("model.blocks.1.mlp").register_forward_hook(
            lambda m, a, o: o * NAN if model.trainer.global_step == nan_step else o)


def _fit(guard: NaNGuardCallback, model: TinyLM, steps: int, **kw) -> GradProbe:
    probe = GradProbe()
    kw.setdefault("logger", False)
    pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=[guard, probe], enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, **kw).fit(model)
    return probe


@pytest.mark.parametrize("sync", [None, False])  # immediate (CPU default) and deferred (the GPU default)
def test_the_guard_keeps_exact_norms_alerts_the_spike_and_tells_the_trend(sync, caplog):
    model = TinyLM(optimizer="adamw-fused")
    _spiking(model, spike_step=14, nan_step=16)
    syncs = nl.sync_points()
    guard = NaNGuardCallback(action="stop", sync=sync)
    probe = _fit(guard, model, 20)
    assert guard.mode == ("immediate" if sync is None else "deferred")
    # per layer and global, equal to the norms computed independently (float32 per-tensor norms: 1e-5)
    for step, total, layers in guard._history.steps:
        want = probe.norms[step]
        assert total == pytest.approx(math.sqrt(sum(v * v for v in want.values())), rel=1e-5)
        fc = math.sqrt(want[f"{SPIKE_LAYER}.weight"] ** 2 + want[f"{SPIKE_LAYER}.bias"] ** 2)
        assert layers[SPIKE_LAYER] == pytest.approx(fc, rel=1e-5)
    # healthy steps only, each once (deferred: the run stops a step after the bad one, which is checked too)
    assert [s for s, _, _ in guard._history.steps] == list(range(16)) + ([] if sync is None else [17])
    (spike, *later) = guard.spikes
    assert spike["step"] == 14 and spike["layer"] == SPIKE_LAYER and spike["ratio"] > 10
    assert [s["step"] for s in later] == [15] + ([] if sync is None else [17])
    assert any("gradient spike at step 14" in r.getMessage() and SPIKE_LAYER in r.getMessage()
               for r in caplog.records)
    (event,) = guard.events
    assert event.step == 16
    assert "first exceeded 10x the median of the steps before at step 14" in event.trend
    assert f"'{SPIKE_LAYER}'" in event.trend and "Before it:" in str(event)
    if sync is False:
        assert guard.host_syncs == 0 and nl.sync_points() == syncs  # the norms rode on the late flag read


def test_norms_are_logged_at_the_log_interval_global_and_per_layer(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tb", version=0)
    guard = NaNGuardCallback()
    probe = _fit(guard, TinyLM(), 6, logger=logger, log_every_n_steps=3)
    acc = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    total = acc.Scalars("tscope/grad_norm/total")
    assert [e.step for e in total] == [0, 3]  # log_every_n_steps=3; every step is in the history
    assert [s for s, _, _ in guard._history.steps] == list(range(6))
    for e in total:
        assert e.value == pytest.approx(math.sqrt(sum(v * v for v in probe.norms[e.step].values())), rel=1e-5)
    assert [e.step for e in acc.Scalars(f"tscope/grad_norm/{SPIKE_LAYER}")] == [0, 3]


def test_off_and_validated():
    guard = NaNGuardCallback(grad_norms=False)
    _fit(guard, TinyLM(), 3)
    assert not guard._history.steps and not guard.spikes
    with pytest.raises(TypeError, match="grad_norms must be a bool"):
        NaNGuardCallback(grad_norms="yes")
    with pytest.raises(ValueError, match="spike_factor must be >= 1"):
        NaNGuardCallback(spike_factor=0.5)
    with pytest.raises(ValueError, match="history must be >= 2"):
        NaNGuardCallback(history=1)
