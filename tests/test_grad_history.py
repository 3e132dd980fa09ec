"""Gradient norms in the NaN guard: the per-tensor norms its check computes anyway, kept per layer, logged, a spike
alerted, and the trend before a non-finite step told in the event -- against norms computed independently."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from models import TinyLM

import tscope_callbacks as ts
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


def _steady(h: GradHistory, steps: int, names=("enc.w", "dec.w")) -> None:
    for s in range(steps):  # norms sqrt(2) and loss 2.0, give or take 5%
        w = 1.0 + 0.05 * (-1) ** s
        h.add(s, list(names), [w, w], loss=2.0 * w)


def test_onset_built_up_when_norm_or_loss_was_already_rising_before_the_bad_step():
    h = GradHistory(window=64, spike_factor=10.0)
    _steady(h, 12)
    h.add(12, ["enc.w", "dec.w"], [1.0, 4.3], loss=2.1)
    # step 12: global sqrt(1 + 4.3²) = 4.415 over the median of steps 0-11 (sqrt(2) x 0.95 and x 1.05 in equal
    # numbers: median sqrt(2) = 1.414): 3.12x >= BUILT_UP_NORM (3); the loss 2.1 / 2.0 = 1.05x
    kind, text = h.onset(event_step=13)
    assert kind == "built-up" and "gradient norm was 3.12x the median of the steps before and the loss 1.05x" in text
    assert "gradient_clip_val" in text and "2.83" in text  # twice the median norm: 2 sqrt(2)

    h2 = GradHistory()
    _steady(h2, 12)
    h2.add(12, ["enc.w", "dec.w"], [1.0, 1.0], loss=3.2)  # norm steady (1x), loss 3.2 / 2.0 = 1.6x >= 1.5
    assert h2.onset(13)[0] == "built-up"
    # the trend's median is over all 13 steps, the last included: six 1.9, six 2.1 and 3.2 -> 2.1
    assert "Loss: median 2.1, 3.2 at step 12." in h2.trend()


def test_onset_names_a_learning_rate_that_rose_over_the_window():
    h = GradHistory()
    for s in range(12):  # a linear warmup 1e-4 -> 3e-4 over the window, norm and loss steady
        h.add(s, ["w"], [1.0], loss=2.0, lr=1e-4 + 2e-4 * s / 11)
    h.add(12, ["w"], [5.0], loss=2.0, lr=3e-4)  # norm 5x the median (1): built up
    kind, text = h.onset(13)
    assert kind == "built-up"
    assert "while the learning rate rose 3x from 0.0001 to 0.0003" in text and "Lower the peak learning rate" in text
    assert "Learning rate: 0.0003 at step 12 (0.0001 at step 0)." in h.trend()
    flat = GradHistory()
    for s in range(12):
        flat.add(s, ["w"], [1.0 if s < 11 else 5.0], lr=1e-3)
    assert "rose" not in flat.onset(12)[1] and "Lower the learning rate" in flat.onset(12)[1]
    assert "Learning rate: 0.001 at step 11, constant over the window." in flat.trend()


def test_the_learning_rate_is_read_without_a_sync():
    from tscope_callbacks.callbacks.nan_steps import learning_rate

    w = [torch.nn.Parameter(torch.zeros(2))]
    assert learning_rate(torch.optim.SGD(w, lr=0.5)) == 0.5
    assert learning_rate(torch.optim.Adam(w, lr=torch.tensor(0.25))) == 0.25  # a CPU tensor: read
    meta = torch.optim.SGD(w, lr=0.5)
    meta.param_groups[0]["lr"] = torch.tensor(0.25, device="meta")  # a device tensor (capturable on CUDA): not read
    assert learning_rate(meta) is None and learning_rate(object()) is None


def test_onset_sudden_when_both_were_steady_and_unknown_without_the_step_before():
    h = GradHistory()
    _steady(h, 12)
    kind, text = h.onset(event_step=12)
    # step 11 (odd: x0.95): norm 0.95 sqrt(2) over the median of steps 0-10 (six at x1.05, five at x0.95: median
    # 1.05 sqrt(2)) = 0.905x; loss 1.9 / 2.1 = 0.905x
    assert kind == "sudden" and "0.905x the median of the steps before and the loss 0.905x" in text and "batch" in text
    assert h.onset(event_step=14) == ("", "Onset: not known (the last healthy checked step, 11, was 3 steps before "
                                          "it).")
    assert h.onset(event_step=14, every=3)[0] == "sudden"  # every_n_steps=3: step 11 was the one checked before
    zero = GradHistory()
    for s in range(12):  # frozen (all-zero gradients), then a gradient at step 11
        zero.add(s, ["w"], [0.0 if s < 11 else 0.5])
    assert zero.onset(12) == ("built-up", "Onset: built up. The gradient norm rose from 0 (its median over the steps "
                                          "before) to 0.5 at step 11, the last checked step before it.")
    few = GradHistory()
    _steady(few, 5)  # four steps before the last one: below MIN_ONSET_STEPS (5)
    assert few.onset(5) == ("", "")
    neg = GradHistory()
    for s in range(12):  # a loss that can be negative (a log-likelihood of densities) is not compared
        neg.add(s, ["w"], [1.0], loss=-5.0 if s < 11 else -1.0)
    assert neg.onset(12)[1].endswith("steady, so one step went wrong. Check that step's batch (extreme or invalid "
                                     "values, an empty or fully masked sequence) and the layer and op this event "
                                     "names (an overflow in low precision; a log, sqrt or division at 0).")
    assert "the loss" not in neg.onset(12)[1]


class GradProbe(Callback):
    """Each step's gradient norms per parameter, computed here in float64 (after the guard, same hook), and its
    loss as Lightning hands it to backward."""

    def __init__(self) -> None:
        self.norms: dict[int, dict[str, float]] = {}
        self.losses: dict[int, float] = {}

    def on_before_backward(self, trainer, pl_module, loss):
        self.losses[trainer.global_step] = self.losses.get(trainer.global_step, 0.0) + float(loss.detach())

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
    for step, total, layers in guard.grad_history.steps:
        want = probe.norms[step]
        assert total == pytest.approx(math.sqrt(sum(v * v for v in want.values())), rel=1e-5)
        fc = math.sqrt(want[f"{SPIKE_LAYER}.weight"] ** 2 + want[f"{SPIKE_LAYER}.bias"] ** 2)
        assert layers[SPIKE_LAYER] == pytest.approx(fc, rel=1e-5)
    # healthy steps only, each once (deferred: the run stops a step after the bad one, which is checked too)
    assert [s for s, _, _ in guard.grad_history.steps] == list(range(16)) + ([] if sync is None else [17])
    (spike, *later) = guard.spikes
    assert spike["step"] == 14 and spike["layer"] == SPIKE_LAYER and spike["ratio"] > 10
    assert [s["step"] for s in later] == [15] + ([] if sync is None else [17])
    alerts = [r.getMessage() for r in caplog.records if "gradient spike at step 14" in r.getMessage()]
    assert alerts and all(SPIKE_LAYER in a and f"; loss {probe.losses[14]:.4g} (median " in a
                          and "; learning rate 0.01" in a for a in alerts)
    # the losses read with the norms are the ones Lightning handed to backward
    assert [s for s, _ in guard.grad_history.losses] == [s for s, _, _ in guard.grad_history.steps]
    for step, loss in guard.grad_history.losses:
        assert loss == pytest.approx(probe.losses[step], rel=1e-6)
    assert spike["loss"] == pytest.approx(probe.losses[14], rel=1e-6)
    assert guard.grad_history.lrs and all(lr == model.lr for _, lr in guard.grad_history.lrs)  # read late too (payload)
    (event,) = guard.events
    assert event.step == 16
    assert "first exceeded 10x the median of the steps before at step 14" in event.trend
    assert f"'{SPIKE_LAYER}'" in event.trend and "Before it:" in str(event)
    assert event.onset == "built-up" and "Onset: built up. By step 15" in event.trend
    if sync is False:
        assert guard.host_syncs == 0 and nl.sync_points() == syncs  # the norms rode on the late flag read


@pytest.mark.parametrize("sync", [None, False])
def test_a_nan_out_of_steady_steps_is_sudden(sync):
    model = TinyLM(optimizer="adamw-fused")
    _spiking(model, spike_step=10**6, nan_step=12)  # no spike: a NaN output at step 12 out of nowhere
    guard = NaNGuardCallback(action="stop", sync=sync)
    probe = _fit(guard, model, 16)
    (event,) = guard.events
    assert event.step == 12 and event.onset == "sudden"
    assert "Onset: sudden. At step 11, the last checked step before it" in event.trend
    assert f"{probe.losses[11]:.4g} at step 11" in event.trend


def test_a_divergence_at_the_end_of_a_warmup_names_the_learning_rate():
    model = TinyLM(optimizer="adamw-fused", lr=1e-2)
    _spiking(model, spike_step=14, nan_step=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    model.configure_optimizers = lambda: {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}
    guard = NaNGuardCallback(action="stop")
    _fit(guard, model, 20)
    # checked before the update of step s, after s scheduler steps: 1e-2 x min(1, (s + 1) / 10)
    assert [(s, pytest.approx(lr)) for s, lr in guard.grad_history.lrs] == [(s, 1e-2 * min(1.0, (s + 1) / 10))
                                                                          for s in range(16)]
    (event,) = guard.events
    assert event.onset == "built-up" and "while the learning rate rose 10x from 0.001 to 0.01" in event.trend


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
    assert [s for s, _, _ in guard.grad_history.steps] == list(range(6))
    for e in total:
        assert e.value == pytest.approx(math.sqrt(sum(v * v for v in probe.norms[e.step].values())), rel=1e-5)
    assert [e.step for e in acc.Scalars(f"tscope/grad_norm/{SPIKE_LAYER}")] == [0, 3]


def test_off_and_validated():
    guard = NaNGuardCallback(grad_norms=False)
    _fit(guard, TinyLM(), 3)
    assert not guard.grad_history.steps and not guard.spikes
    with pytest.raises(TypeError, match="grad_norms must be a bool"):
        NaNGuardCallback(grad_norms="yes")
    with pytest.raises(ValueError, match="spike_factor must be a number >= 1"):
        NaNGuardCallback(options=ts.NaNGuardOptions(spike_factor=0.5))
    with pytest.raises(ValueError, match="history must be an int >= 2"):
        NaNGuardCallback(options=ts.NaNGuardOptions(history=1))


def test_steps_and_epochs_come_from_lightnings_trackers_also_after_a_resume(tmp_path):
    # the guard reads global_step and current_epoch as one attribute of the progress trackers those properties end
    # at: equal to the properties at every optimizer step, with gradient accumulation, across epochs and a resume
    from tscope_callbacks.callbacks.nan_steps import TrainerCounter, progress_trackers

    class Probe(Callback):
        def __init__(self) -> None:
            self.rows, self.kinds = [], None

        def on_fit_start(self, trainer, pl_module):
            self.trackers = progress_trackers(trainer, pl_module)
            self.kinds = [type(t) for t in self.trackers]

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            step, epoch = self.trackers
            self.rows.append((step.completed, epoch.completed, trainer.global_step, trainer.current_epoch))

    def fit(guard, probe, max_steps, ckpt=None):
        trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, callbacks=[guard, probe], logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             accumulate_grad_batches=2, limit_train_batches=6)
        trainer.fit(TinyLM(), ckpt_path=ckpt)
        return trainer

    first, probe = NaNGuardCallback(), Probe()
    trainer = fit(first, probe, 4)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    resumed, probe2 = NaNGuardCallback(), Probe()
    fit(resumed, probe2, 8, ckpt=str(tmp_path / "mid.ckpt"))
    for p in (probe, probe2):
        assert TrainerCounter not in p.kinds  # Lightning's own trackers, not the adapters
        assert all(s == gs and e == ge for s, e, gs, ge in p.rows), p.rows
    # 6 batches an epoch, 2 per optimizer step: 3 steps an epoch; the resumed fit goes on from step 4 (the epoch
    # Lightning resumes a mid-epoch checkpoint at is its own business: the trackers say what the property says)
    assert [r[2:] for r in probe.rows] == [(0, 0), (1, 0), (2, 0), (3, 1)]
    assert [r[2] for r in probe2.rows] == [4, 5, 6, 7] and probe2.rows[0][3] >= 1
    assert [s for s, _, _ in first.grad_history.steps] == [0, 1, 2, 3]
    assert [s for s, _, _ in resumed.grad_history.steps] == [4, 5, 6, 7]


def test_healthy_steps_enter_the_history_in_batches_but_a_spike_is_alerted_at_its_own_step():
    # the history takes healthy steps 16 at a time (a cheaper step), yet what anyone reads is complete: a spike is
    # in guard.spikes at the end of its own step, the history read mid-fit holds every checked step up to it
    from tscope_callbacks.callbacks import nan_guard

    model = TinyLM(optimizer="adamw-fused")
    _spiking(model, spike_step=22, nan_step=None)
    seen = {}

    class Reader(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            s = trainer.global_step - 1  # the step that just ran
            seen[s] = [x["step"] for x in guard.spikes]
            if s == 5:  # a read of the history flushes the queue: steps 0..5, none missing
                seen["history@5"] = [st for st, _, _ in guard.grad_history.steps]

    guard = NaNGuardCallback(action="warn")
    pl.Trainer(max_steps=24, accelerator="cpu", devices=1, callbacks=[guard, Reader()], logger=False,
               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(model)
    assert nan_guard.HISTORY_BATCH == 16
    assert seen["history@5"] == list(range(6))
    assert seen[21] == [] and seen[22] == [22]  # alerted at step 22 itself, not at the next batch of 16
    assert [s for s, _, _ in guard.grad_history.steps] == list(range(24))  # the end of training flushes the rest


def test_a_parameter_replaced_in_the_optimizers_list_is_checked_at_once():
    # the guard reads the gradients from the optimizer's own list each step (compared one by one with its cached list
    # only every IDENTITY_EVERY steps): a parameter swapped into that list is checked from the next step on
    from tscope_callbacks.callbacks import nan_steps

    model = TinyLM()
    swapped = {}

    class Swap(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 3 and not swapped:  # a new Parameter object in place of the fc weight
                opt = trainer.optimizers[0]
                fc = pl_module.get_submodule(SPIKE_LAYER)
                params = opt.param_groups[0]["params"]
                i = next(i for i, p in enumerate(params) if p is fc.weight)
                new = torch.nn.Parameter(fc.weight.detach().clone())
                opt.state[new] = opt.state.pop(fc.weight, {})
                fc.weight = params[i] = new
                swapped["step"] = 3
            if trainer.global_step == 5:  # its gradient non-finite: only the new object holds it
                pl_module.get_submodule(SPIKE_LAYER).weight.register_hook(lambda g: g * NAN)

    guard = NaNGuardCallback(action="warn", locate=False)
    pl.Trainer(max_steps=8, accelerator="cpu", devices=1, callbacks=[Swap(), guard], logger=False,
               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(model)
    assert nan_steps.IDENTITY_EVERY > 5  # the swap falls between two one-by-one comparisons
    assert [e.step for e in guard.events][:1] == [5]
    assert f"{SPIKE_LAYER}.weight" in str(guard.events[0])


def test_the_guard_keeps_no_trainer_alive_after_the_fit():
    # its history is flushed at the fit's end, so the guard needs the trainer no longer: a guard kept for its events
    # and history must not keep the trainer, and through it the model and the optimizer, in memory
    import gc
    import weakref

    guard = NaNGuardCallback(action="warn")
    trainer = pl.Trainer(max_steps=5, accelerator="cpu", devices=1, callbacks=[guard], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = TinyLM()
    trainer.fit(model)
    assert [s for s, _, _ in guard.grad_history.steps] == list(range(5))
    refs = weakref.ref(trainer), weakref.ref(model)
    # Lightning binds every callback's log/log_dict to the module (callback_connector): not the guard's reference
    del guard.log, guard.log_dict, trainer, model
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert len(guard.grad_history.steps) == 5  # still readable
