"""NaNGuardCallback: detection, exact location of injected NaNs, actions, alerts/rate limiting, sinks, AMP."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from models import TinyLM

import tscope_callbacks as ts
from tscope_callbacks import NaNGuardCallback, NonFiniteError

NAN = float("nan")


def make_trainer(*callbacks, max_steps: int = 6, **kw) -> pl.Trainer:
    kw.setdefault("logger", False)
    kw.setdefault("enable_checkpointing", False)
    return pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, callbacks=list(callbacks),
                      enable_progress_bar=False, enable_model_summary=False, **kw)


def inject_activation(model: TinyLM, path: str = "model.blocks.1.mlp", steps=(3,)) -> None:
    """Forward hook making ``path``'s output NaN at the given optimizer steps (global_step is fixed during a step,
    so the guard's replay reproduces it)."""
    def hook(mod, args, out):
        return out * NAN if model.trainer.global_step in steps else out

    model.get_submodule(path).register_forward_hook(hook)


def nan_alerts(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tscope_callbacks" and r.levelno == logging.WARNING
            and "internal error" not in r.getMessage()]


class WeightProbe(Callback):
    """Copies of all weights at the start and end of the batch of optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step, self.before, self.after = step, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            self.before = {n: p.detach().clone() for n, p in pl_module.named_parameters()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step + 1 and self.after is None:
            self.after = {n: p.detach().clone() for n, p in pl_module.named_parameters()}


# ---------------------------------------------------------------------------------------------------- config
def test_exports_and_config_validation():
    assert NaNGuardCallback().action == "stop"
    with pytest.raises(ValueError, match="action must be one of"):
        NaNGuardCallback(action="explode")
    with pytest.raises(ValueError, match="every_n_steps must be >= 1"):
        NaNGuardCallback(every_n_steps=0)
    with pytest.raises(TypeError, match="every_n_steps must be an int"):
        NaNGuardCallback(every_n_steps=True)
    with pytest.raises(TypeError, match="locate must be a bool"):
        NaNGuardCallback(locate="yes")
    with pytest.raises(ValueError, match="alert_every_s"):
        NaNGuardCallback(options=ts.NaNGuardOptions(alert_every_s=-1))
    with pytest.raises(TypeError):
        NaNGuardCallback("warn")  # keyword-only


def test_nonfinite_total_and_counts():
    from tscope_callbacks.analysis import nonfinite as nan_locate

    good = [torch.ones(100_000), torch.ones(10), torch.ones(3, dtype=torch.float16), torch.tensor(2.0)]
    total = nan_locate.nonfinite_total(good)
    assert total.shape == (1,) and torch.isfinite(total).all()
    for i in range(len(good)):  # large (sum) and small (_foreach_norm) tensors, fp16, a 0-d loss
        for bad_value in (NAN, float("inf"), float("-inf")):
            bad = [t.clone() for t in good]
            bad[i].view(-1)[-1] = bad_value
            assert not torch.isfinite(nan_locate.nonfinite_total(bad)).all()
    assert nan_locate.nonfinite_total([torch.arange(3)]) is None  # integer tensors are ignored
    assert nan_locate.count_nonfinite([("a", torch.tensor([1.0, NAN, float("-inf")]))]) == {"a": 2}


# ---------------------------------------------------------------------------------------------------- healthy
def test_healthy_run_no_events_no_replay(caplog):
    guard = NaNGuardCallback(action="raise", check_params=True)
    trainer = make_trainer(guard, max_steps=5)
    trainer.fit(TinyLM())
    assert trainer.global_step == 5
    assert guard.events == [] and guard.num_events == 0 and guard.replays == 0 and guard.alerts == 0
    assert nan_alerts(caplog) == []


# ---------------------------------------------------------------------------------------------------- locate
def test_activation_nan_located_and_stop(caplog):
    model = TinyLM()
    inject_activation(model, "model.blocks.1.mlp", steps=(3,))
    probe = WeightProbe(3)
    guard = NaNGuardCallback(action="stop")
    trainer = make_trainer(guard, probe, max_steps=10)
    trainer.fit(model)
    assert trainer.global_step == 4  # step 3 ran (its update dropped), then the run ended
    assert len(guard.events) == 1
    ev = guard.events[0]
    assert (ev.kind, ev.layer, ev.step, ev.batch_idx, ev.ranks) == ("activation", "model.blocks.1.mlp", 3, 3, [0])
    assert ev.loss is not None and ev.loss != ev.loss  # NaN
    assert "model.head.weight" in ev.parameters and ev.num_nonfinite == sum(ev.parameters.values())
    assert guard.replays == 1
    assert all(torch.equal(probe.before[n], probe.after[n]) for n in probe.before)  # stop drops the bad update
    text = str(ev)
    assert "activation" in text and "'model.blocks.1.mlp'" in text and "step 3" in text
    # the op and line: the injecting hook's multiply by a NaN scalar (an explicit NaN is never intended)
    hook = next(i for i, ln in enumerate(open(__file__).read().splitlines(), 1) if "return out * NAN" in ln)
    assert f"Origin: first NaN made by aten.mul in the forward, called at test_nan_guard.py:{hook} in hook" in ev.note
    json.dumps(ev.to_dict())
    assert any("model.blocks.1.mlp" in m for m in nan_alerts(caplog))


def test_the_nan_event_is_among_the_run_s_alerts_on_the_dashboard(tmp_path):
    # the page's "Over the run" lists the run's alerts: the NaN guard's event was in the console, TensorBoard's Text
    # tab and alerts.jsonl, never on the page (a run that diverged showed "no NaN / Inf in this step")
    from lightning.pytorch.loggers import TensorBoardLogger

    from tscope_callbacks.dashboard import logdir as ld

    model = TinyLM()
    inject_activation(model, "model.blocks.1.mlp", steps=(3,))
    logger = TensorBoardLogger(str(tmp_path), name="run")
    trainer = make_trainer(NaNGuardCallback(action="stop"), max_steps=10, logger=logger)
    trainer.fit(model)
    alerts = ld.series(Path(logger.log_dir))["alerts"]
    assert len(alerts) == 1 and alerts[0][0] == 3 and "non-finite activation at step 3 in layer " \
        "'model.blocks.1.mlp'" in alerts[0][1], alerts  # once: the event file and alerts.jsonl both hold it


def test_overflow_from_a_huge_finite_weight_names_the_weight():
    class Blowup(Callback):  # a finite weight so large that the layer's output overflows (fp32 max 3.4e38)
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 3:
                with torch.no_grad():
                    pl_module.model.blocks[1].mlp.fc.weight[0] = 3e38

    guard = NaNGuardCallback(action="stop")
    trainer = make_trainer(Blowup(), guard, max_steps=10)
    trainer.fit(TinyLM())
    (ev,) = guard.events
    assert (ev.kind, ev.layer, ev.step) == ("activation", "model.blocks.1.mlp.fc", 3)
    # the op that overflowed and its inputs: the weight's 3e38 among them
    assert "Origin: first inf made by aten.addmm in the forward, called at model.py:" in ev.note
    assert re.search(r"float32\[32x128\] min -0\.\d+ max 3e\+38", ev.note)  # fc.weight transposed


class _OpLM(pl.LightningModule):
    """A masked softmax (an intentional -inf fill), then at step 2 a log of zeros (forward) or a sqrt of zeros (its
    backward divides by zero): the ops the NaN guard's origin must name, with their lines."""

    def __init__(self, fault: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.fault = fault
        self.register_buffer("mask", torch.arange(8) == 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.lin(x).masked_fill(self.mask, float("-inf")).softmax(-1)[:, 1:]  # -inf on purpose: not an origin
        if self.trainer.global_step == 2:
            p = p - p  # finite zeros
        if self.fault == "log":
            return -torch.log(p).mean()  # FAULT-LOG
        return torch.sqrt(p).sum() + p.mean()  # FAULT-SQRT

    def training_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8)), batch_size=4)


def _line_of(marker: str) -> int:
    return next(i for i, ln in enumerate(open(__file__).read().splitlines(), 1) if marker in ln and "return" in ln)


@pytest.mark.parametrize("fault", ["log", "sqrt"])
def test_the_op_and_line_that_made_the_first_nonfinite_value_are_named(fault):
    """What detect_anomaly answers (backward only, raising, 1.4-5.8x every step), on the replay of the bad step only:
    the op, forward or backward, that made the first non-finite value from finite inputs, the line that called it,
    and its inputs. The intentional -inf of the masked softmax is never blamed."""
    guard = NaNGuardCallback(action="stop")
    make_trainer(guard, max_steps=6).fit(_OpLM(fault))
    (ev,) = guard.events
    assert ev.step == 2
    here = f"test_nan_guard.py:{_line_of('FAULT-' + fault.upper())} in forward"
    if fault == "log":
        assert f"Origin: first inf made by aten.log in the forward, called at {here}: return -torch.log(p)" in ev.note
        assert "its inputs were finite: float32[4x7] min 0 max 0, 28 zero" in ev.note
    else:  # sqrt(0) is 0; its backward, grad / (2 sqrt(0)), is inf
        assert ev.kind == "gradient"
        assert "Origin: first inf made by aten.div in the backward of SqrtBackward0, whose forward op was called at " \
               f"{here}: return torch.sqrt(p).sum()" in ev.note
    assert "masked_fill" not in ev.note and "softmax" not in ev.note


def test_gradient_nan_in_one_parameter_is_named():
    model = TinyLM()
    w = inject_gradient(model, steps=(2,))
    guard = NaNGuardCallback(action="stop")
    trainer = make_trainer(guard)
    trainer.fit(model)
    assert trainer.global_step == 3
    (ev,) = guard.events
    assert ev.kind == "gradient" and ev.step == 2
    assert ev.parameters == {"model.blocks.0.mlp.fc.weight": w.numel()}
    assert ev.layer == "model.blocks.0.mlp.fc"  # the module owning the parameter
    assert ev.loss is not None and ev.loss == ev.loss  # the loss was finite
    assert "model.blocks.0.mlp.fc.weight" in str(ev)


def test_huge_finite_gradients_are_not_events():
    model = TinyLM(lr=0.0)
    inject_gradient_scale = 1e25  # the fused norm overflows to inf; the exact confirmation finds nothing non-finite
    model.model.blocks[0].mlp.fc.weight.register_hook(
        lambda g: g * inject_gradient_scale if model.trainer.global_step == 2 else g)
    guard = NaNGuardCallback(action="raise")
    make_trainer(guard, max_steps=4).fit(model)
    assert guard.num_events == 0 and guard.replays == 0


class LossNaN(TinyLM):
    def training_step(self, batch, batch_idx):
        loss = self.compute_loss(batch)
        return loss * NAN if self.trainer.global_step == 2 else loss


def test_loss_nan_kind_loss():
    guard = NaNGuardCallback(action="stop")
    trainer = make_trainer(guard)
    trainer.fit(LossNaN())
    (ev,) = guard.events
    assert (ev.kind, ev.layer, ev.step) == ("loss", None, 2)
    assert "loss computation" in ev.note


class MutatesBatch(LossNaN):
    def training_step(self, batch, batch_idx):
        batch[0].add_(0)  # in place: bumps the tensor's version counter
        return super().training_step(batch, batch_idx)


class ManualOpt(TinyLM):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.compute_loss(batch)
        loss = loss * NAN if self.trainer.global_step == 2 else loss
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()


def test_replay_limits_are_reported():
    guard = NaNGuardCallback(action="stop")
    make_trainer(guard).fit(MutatesBatch())
    (ev,) = guard.events
    assert ev.kind == "loss" and "modified in place" in ev.note
    guard = NaNGuardCallback(action="stop")
    trainer = make_trainer(guard)
    trainer.fit(ManualOpt())
    (ev,) = guard.events
    assert (ev.kind, ev.layer, ev.step) == ("loss", None, 2) and "manual optimization" in ev.note
    assert guard.replays == 0 and trainer.global_step == 3


class AccumulatedInjection(TinyLM):
    """NaN in block 0's attention output for the first micro-batch of optimizer step 1 (batch_idx 2)."""

    def __init__(self):
        super().__init__()
        self.inject = False
        self.model.blocks[0].attn.register_forward_hook(lambda m, a, o: o * NAN if self.inject else o)

    def training_step(self, batch, batch_idx):
        self.inject = batch_idx == 2
        return super().training_step(batch, batch_idx)


def test_grad_accumulation_replays_the_right_micro_batch():
    guard = NaNGuardCallback(action="stop")
    trainer = make_trainer(guard, accumulate_grad_batches=2)
    trainer.fit(AccumulatedInjection())
    (ev,) = guard.events
    assert (ev.kind, ev.layer, ev.step, ev.batch_idx) == ("activation", "model.blocks.0.attn", 1, 2)
    assert trainer.global_step == 2


def test_parameter_check_after_update():
    class Corrupt(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:  # after the update of step 2
                with torch.no_grad():
                    pl_module.model.blocks[1].attn.proj.weight[0, 0] = float("inf")

    guard = NaNGuardCallback(action="skip", check_params=True)
    trainer = make_trainer(Corrupt(), guard)
    trainer.fit(TinyLM())
    (ev,) = guard.events
    assert (ev.kind, ev.step, ev.layer) == ("parameter", 2, "model.blocks.1.attn.proj")
    assert ev.parameters == {"model.blocks.1.attn.proj.weight": 1} and ev.counts == "parameters"
    assert "Non-finite parameters: model.blocks.1.attn.proj.weight (1)" in str(ev)
    assert trainer.global_step == 3 and "cannot be skipped" in ev.note  # skip cannot undo an update: stop


def test_every_n_steps_and_corrupted_weights_found_by_replay():
    model = TinyLM()
    inject_gradient(model, steps=(3,))  # an unchecked step: its NaN update reaches the weights of blocks.0.mlp.fc
    guard = NaNGuardCallback(action="stop", every_n_steps=2)
    trainer = make_trainer(guard, max_steps=10)
    trainer.fit(model)
    (ev,) = guard.events
    assert (ev.step, ev.kind, ev.layer) == (4, "parameter", "model.blocks.0.mlp.fc")
    assert "already non-finite" in ev.note
    # the counts are this step's gradients (what the corrupted weights reached), and they are called that; the note
    # counts the weights' own non-finite elements
    fc = model.model.blocks[0].mlp.fc.weight
    assert ev.counts == "gradients" and "Non-finite gradients:" in str(ev) and "Non-finite parameters" not in str(ev)
    bad = int((~torch.isfinite(fc)).sum())
    assert f"model.blocks.0.mlp.fc.weight ({bad} of {fc.numel()} elements)" in ev.note


# ---------------------------------------------------------------------------------------------------- actions
def test_stop_keeps_checkpointing_working(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    model = TinyLM()
    inject_activation(model, steps=(3,))
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=1)
    guard = NaNGuardCallback(action="stop")
    trainer = make_trainer(guard, ckpt, max_steps=10, enable_checkpointing=True)
    trainer.fit(model)
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert state["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values())  # the bad update was dropped


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_skip_keeps_weights_bit_identical(optimizer):
    model = TinyLM(optimizer=optimizer)
    inject_activation(model, steps=(3,))
    probe = WeightProbe(3)
    guard = NaNGuardCallback(action="skip")
    trainer = make_trainer(guard, probe, max_steps=6)
    trainer.fit(model)
    assert trainer.global_step == 6 and guard.skipped_steps == 1 and len(guard.events) == 1
    assert all(torch.equal(probe.before[n], probe.after[n]) for n in probe.before)  # momentum / decay did not move
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_skip_stops_after_max_skips(caplog):
    model = TinyLM()
    inject_gradient(model, steps=range(2, 100))
    guard = NaNGuardCallback(action="skip", options=ts.NaNGuardOptions(max_skips=3))
    trainer = make_trainer(guard, max_steps=20)
    trainer.fit(model)
    assert guard.skipped_steps == 3 and trainer.global_step == 5  # steps 2, 3, 4 skipped, then stop
    assert "max_skips reached" in guard.events[-1].action
    assert guard.replays == 1  # located once per streak
    # the alert rate let the first skip through and held the next; the stop is said all the same (it was only in
    # guard.events: the run ended at step 5 of 20 with no word why)
    alerts = nan_alerts(caplog)
    assert len(alerts) == 2 and "max_skips reached: stopping the run" in alerts[1], alerts
    assert "(1 event(s) since the last alert were not alerted; 3 in total.)" in alerts[1]  # step 3's, held back


def test_raise():
    model = TinyLM()
    inject_activation(model, steps=(2,))
    guard = NaNGuardCallback(action="raise")
    with pytest.raises(NonFiniteError, match="model.blocks.1.mlp") as exc:
        make_trainer(guard).fit(model)
    assert exc.value.event.step == 2 and exc.value.event.kind == "activation"


def inject_gradient(model: TinyLM, steps) -> torch.nn.Parameter:
    """NaN only in the gradient of ``model.blocks.0.mlp.fc.weight`` at the given optimizer steps."""
    w = model.model.blocks[0].mlp.fc.weight
    w.register_hook(lambda g: g * NAN if model.trainer.global_step in steps else g)
    return w


def test_warn_continues():
    model = TinyLM()
    inject_gradient(model, steps=(4,))
    guard = NaNGuardCallback(action="warn")
    trainer = make_trainer(guard, max_steps=6)
    trainer.fit(model)
    assert trainer.global_step == 6 and guard.events[0].step == 4
    assert not torch.isfinite(model.model.blocks[0].mlp.fc.weight).all()  # warn applies the update


def test_rate_limited_alerts_in_a_streak(caplog):
    model = TinyLM()
    inject_gradient(model, steps=range(2, 22))  # a streak of 20 bad steps
    guard = NaNGuardCallback(action="skip", options=ts.NaNGuardOptions(max_skips=100))
    trainer = make_trainer(guard, max_steps=24)
    trainer.fit(model)
    assert trainer.global_step == 24 and guard.skipped_steps == 20
    assert guard.num_events == 20 and [e.step for e in guard.events] == list(range(2, 22))
    alerts = nan_alerts(caplog)
    assert 1 <= len(alerts) <= 3 and guard.alerts == len(alerts)
    assert "were not alerted" in alerts[-1] and "20 event(s) in total" in alerts[-1]
    assert guard.replays == 1  # located once per streak
    assert guard.events[0].layer == "model.blocks.0.mlp.fc" and "same streak" in guard.events[1].note


def test_internal_errors_never_break_training(monkeypatch, caplog):
    from tscope_callbacks.analysis import nonfinite as nan_locate

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(nan_locate, "nonfinite_total", boom)
    monkeypatch.setattr(nan_locate, "tensor_norms", boom)  # the check's reductions (with or without norms)
    guard = NaNGuardCallback()
    trainer = make_trainer(guard, max_steps=3)
    trainer.fit(TinyLM())
    assert trainer.global_step == 3
    assert any("internal error" in r.getMessage() for r in caplog.records if r.name == "tscope_callbacks")


# ---------------------------------------------------------------------------------------------------- sinks
def test_tensorboard_text_and_scalar(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = TinyLM()
    inject_activation(model, steps=(2,))
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tb", version=0)
    guard = NaNGuardCallback(action="stop")
    make_trainer(guard, logger=logger, log_every_n_steps=1).fit(model)
    acc = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars("tscope/nan/events")] == [1.0]
    (text,) = acc.Tensors("tscope/nan/text_summary")
    msg = text.tensor_proto.string_val[0].decode()
    assert "model.blocks.1.mlp" in msg and text.step == 2


def test_wandb_offline_does_not_crash(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    model = TinyLM()
    inject_activation(model, steps=(1,))
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="tscope-test")
    guard = NaNGuardCallback(action="stop")
    trainer = make_trainer(guard, logger=logger)
    trainer.fit(model)
    logger.experiment.finish()
    assert trainer.global_step == 2 and guard.events[0].layer == "model.blocks.1.mlp" and guard.alerts == 1


# ---------------------------------------------------------------------------------------------------- AMP
def amp_plugin():
    from lightning.pytorch.plugins.precision import MixedPrecision

    # fp16 autocast and a real GradScaler on CPU (Lightning's precision="16-mixed" falls back to bf16 on CPU)
    return MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=2.0**16))


def test_amp_overflow_is_the_scalers_business_until_the_scale_collapses():
    model = TinyLM()
    w = model.model.blocks[0].mlp.fc.weight
    w.register_hook(lambda g: g * float("inf") if model.trainer.global_step in (1, 3, 4, 5, 6, 7) else g)
    guard = NaNGuardCallback(action="stop", options=ts.NaNGuardOptions(amp_max_overflows=4))
    trainer = make_trainer(guard, max_steps=12, plugins=[amp_plugin()])
    trainer.fit(model)
    # step 1: a lone overflow; steps 3..6: 4 in a row -> collapse reported at step 6
    (ev,) = guard.events
    assert ev.kind == "gradient" and ev.step == 6 and "AMP loss scale collapsed" in ev.note
    assert trainer.global_step == 7 and guard.replays == 0
    assert trainer.precision_plugin.scaler.get_scale() == 2.0**16 / 2**5


def test_amp_nonfinite_loss_is_reported():
    guard = NaNGuardCallback(action="stop")
    trainer = make_trainer(guard, plugins=[amp_plugin()])
    trainer.fit(LossNaN())
    (ev,) = guard.events
    assert (ev.kind, ev.step) == ("loss", 2)


# ---------------------------------------------------------------------------------------------------- CLI config
def test_nan_guard_yaml(monkeypatch, tmp_path):
    pytest.importorskip("jsonargparse")
    from pathlib import Path

    from lightning.pytorch.cli import LightningCLI

    monkeypatch.setattr("sys.argv", ["train.py"])
    cfg = Path(__file__).resolve().parents[1] / "configs" / "nan_guard.yaml"
    cli = LightningCLI(TinyLM, run=False, save_config_callback=None, seed_everything_default=False,
                       args=["--config", str(cfg), "--trainer.logger=false", "--trainer.accelerator=cpu",
                             f"--trainer.default_root_dir={tmp_path}"])
    (guard,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, NaNGuardCallback)]
    assert (guard.action, guard.every_n_steps, guard.locate, guard.check_params) == ("stop", 1, True, False)
    o = guard.options
    assert (o.max_skips, o.alert_every_s, o.alert_every_n, o.amp_min_scale, o.amp_max_overflows) == (10, 300.0, 100, 1e-4, 16)


def test_origin_in_hf_gpt2_names_the_injecting_multiply_not_an_allocation():
    # HF's SDPA path allocates with empty_like: uninitialised memory may hold NaN, and an allocation is never an origin
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                  attn_implementation="sdpa")

    class HF(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = transformers.GPT2LMHeadModel(cfg)

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(0)),
                                               batch_size=4)

    model = HF()
    inject_activation(model, "model.transformer.h.1.mlp", steps=(2,))
    guard = NaNGuardCallback(action="stop")
    make_trainer(guard, max_steps=6).fit(model)
    (ev,) = guard.events
    assert (ev.kind, ev.layer, ev.step) == ("activation", "model.transformer.h.1.mlp", 2)
    hook = next(i for i, ln in enumerate(open(__file__).read().splitlines(), 1) if "return out * NAN" in ln)
    assert f"Origin: first NaN made by aten.mul in the forward, called at test_nan_guard.py:{hook} in hook" in ev.note
    assert "empty" not in ev.note


def test_origin_reads_an_in_place_input_as_the_op_saw_it_and_an_out_buffer_not_at_all():
    from tscope_callbacks.capture.op_origin import OpOrigin

    zeros = torch.zeros(4)
    with OpOrigin() as mode:
        y = zeros.clone()
        y.div_(0.0)  # 0/0 in place: its input was finite before the op overwrote it
    assert mode.origin is not None and (mode.origin.op, mode.origin.nan) == ("aten.div_", True)

    buf = torch.full((4,), float("nan"))  # an out= buffer holding garbage (as torch.empty may)
    with OpOrigin() as mode:
        torch.empty(4)  # an allocation: undefined contents, never an origin
        torch.log(zeros, out=buf)  # log(0) = -inf from finite inputs
    assert mode.origin is not None and (mode.origin.op, mode.origin.nan) == ("aten.log", False)


def test_a_healthy_checked_step_costs_one_fused_norm_one_stack_and_one_read():
    # the always-on cost, counted in ops rather than timed: whatever the model, the guard's check of a healthy step
    # dispatches one _foreach_norm over all gradients, one stack of those norms with the loss, and reads it once
    from torch.utils._python_dispatch import TorchDispatchMode

    from tscope_callbacks.analysis import nonfinite as nan_locate

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    seen = []

    class Enter(Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.mode = Ops()
            self.mode.__enter__()

    class Exit(Callback):
        def __init__(self, enter):
            self.enter = enter

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.enter.mode.__exit__(None, None, None)
            seen.append(self.enter.mode.ops)

    enter = Enter()
    guard = NaNGuardCallback()
    before = nan_locate.sync_points()
    make_trainer(enter, guard, Exit(enter), max_steps=4).fit(TinyLM())
    assert len(seen) == 4 and guard.host_syncs == 4 and nan_locate.sync_points() - before == 4
    for ops in seen:
        assert [o for o in ops if o not in ("_local_scalar_dense",)] == ["_foreach_norm", "stack"], ops
