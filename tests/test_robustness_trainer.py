"""All callbacks under the Trainer settings people use: results unchanged, nothing left behind, schedule intact."""

from __future__ import annotations

import signal
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from robust_utils import (
    FAST,
    MLPModule,
    all_callbacks,
    assert_nothing_left,
    assert_same_weights,
    fit,
    seeded_fit,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def _steps(cb: Any) -> list[int]:
    return [h["step"] for h in cb.history]


SETTINGS = {
    "accumulate": dict(accumulate_grad_batches=2),
    "bf16-mixed": dict(precision="bf16-mixed"),
    "clip": dict(gradient_clip_val=0.05, gradient_clip_algorithm="norm"),
    "val_check_interval": dict(val_check_interval=3, limit_val_batches=2),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_setting_profiles_and_changes_nothing(tmp_path: Path, name: str) -> None:
    kw = SETTINGS[name]
    plain, plain_log, _ = seeded_fit(tmp_path / "a", MLPModule, [], max_steps=5, **kw)
    cbs = all_callbacks()
    model, log, trainer = seeded_fit(tmp_path / "b", MLPModule, cbs, max_steps=5, **kw)
    assert _steps(cbs[0]) == [1, 2, 4] and cbs[1].last_layers
    assert_same_weights(plain, model)
    assert plain_log.metrics["train_loss"] == log.metrics["train_loss"]
    assert_nothing_left(model, trainer.optimizers)
    prof = cbs[0].last_profile
    assert {"forward", "backward", "optimizer"} <= {r.phase for r in prof.ops}
    if name == "accumulate":
        assert prof.info.micro_batches == 2
    if name == "bf16-mixed":
        assert "bfloat16" in {r.dtype for r in prof.ops if r.category == "matmul"}


def test_validation_inside_a_profiled_accumulation_window_is_not_counted_as_training(tmp_path: Path) -> None:
    # accumulate 2, validation after every 3rd batch: the validation of batch 3 runs inside step 1's window
    cbs = all_callbacks(start_step=1, every_n_steps=100)
    fit(tmp_path, cbs, MLPModule(dropout=0.0), max_steps=2, accumulate_grad_batches=2, val_check_interval=3,
        limit_val_batches=2)
    prof = cbs[0].last_profile
    assert prof.info.micro_batches == 2
    n_fwd_mm = sum(1 for r in prof.ops if r.phase == "forward" and r.category == "matmul")
    assert n_fwd_mm == 4, n_fwd_mm  # 2 Linear x 2 micro-batches; the validation forwards are not in it
    assert prof.info.paused_s > 0  # and the validation time is left out of the step's wall time


def test_nan_in_a_profiled_step_is_located_without_polluting_the_profile(tmp_path: Path) -> None:
    model = MLPModule(dropout=0.0)

    def inject(mod: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        return out * float("nan") if model.trainer.global_step == 2 else out

    handle = model.net[2].register_forward_hook(inject)
    cbs = all_callbacks()
    trainer = fit(tmp_path, cbs, model, max_steps=6)
    guard = cbs[2]
    assert trainer.global_step == 3 and guard.num_events == 1 and guard.replays == 1  # stopped after step 2
    assert guard.events[0].layer == "net.2" and guard.events[0].kind == "activation"
    prof = cbs[0].last_profile
    assert prof.info.step == 2
    assert sum(1 for r in prof.ops if r.phase == "forward" and r.category == "matmul") == 2  # replay not in it
    assert cbs[1].last_layers["net.2"].nonfinite_output
    handle.remove()  # the test's own hook
    assert_nothing_left(model, trainer.optimizers)


@pytest.mark.parametrize("precision", ["16-mixed", "16-true"])
def test_fp16_precisions_on_cpu(tmp_path: Path, precision: str) -> None:
    cbs = all_callbacks()
    model = MLPModule(optimizer="sgd")  # AdamW's eps=1e-8 underflows in pure fp16 (the guard would rightly stop)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*16-mixed.*not supported on CPU")
        trainer = fit(tmp_path, cbs, model, max_steps=3, precision=precision)
    assert _steps(cbs[0]) == [1, 2]
    mm = {r.dtype for r in cbs[0].last_profile.ops if r.category == "matmul"}
    if precision == "16-mixed":  # Lightning runs fp16 AMP on CPU as bf16-mixed; the profile says what really ran
        assert trainer.precision == "bf16-mixed" and mm == {"bfloat16"}
    else:
        assert mm == {"float16"}
    assert cbs[0].last_profile.info.trainer_precision == trainer.precision
    assert cbs[2].num_events == 0
    assert_nothing_left(model, trainer.optimizers)


class _TwoOptimizers(MLPModule):
    """Manual optimization with two optimizers (two ``global_step`` increments per batch)."""

    def __init__(self) -> None:
        super().__init__(dropout=0.0)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt_a, opt_b = self.optimizers()
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        opt_a.zero_grad()
        opt_b.zero_grad()
        self.manual_backward(loss)
        opt_a.step()
        opt_b.step()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return (torch.optim.SGD(self.net[0].parameters(), lr=0.05),
                torch.optim.AdamW(self.net[3].parameters(), lr=1e-2))


def test_manual_optimization_with_two_optimizers(tmp_path: Path) -> None:
    plain, plain_log, _ = seeded_fit(tmp_path / "a", _TwoOptimizers, [], max_steps=8)
    cbs = all_callbacks()
    model, log, trainer = seeded_fit(tmp_path / "b", _TwoOptimizers, cbs, max_steps=8)
    assert _steps(cbs[0]) == [2, 4, 6]  # global_step moves by 2 per batch: 0, 2, 4, 6
    ops = cbs[0].last_profile.ops
    assert {"forward", "backward", "optimizer"} <= {r.phase for r in ops}
    assert sum(1 for r in ops if r.op.startswith("aten._foreach") or r.phase == "optimizer") > 0
    assert_same_weights(plain, model)
    assert plain_log.metrics["train_loss"] == log.metrics["train_loss"]
    assert_nothing_left(model, trainer.optimizers)


def test_max_steps_before_start_step_profiles_nothing_and_writes_nothing(tmp_path: Path) -> None:
    cbs = all_callbacks(start_step=100)
    model = MLPModule()
    trainer = fit(tmp_path, cbs, model, max_steps=3)
    assert not cbs[0].history and cbs[1].last_layers is None
    assert not (tmp_path / "tscope").exists()
    assert_nothing_left(model, trainer.optimizers)


def test_resume_mid_schedule_continues_it(tmp_path: Path) -> None:
    first = all_callbacks(max_profiles=4)
    trainer = fit(tmp_path, first, MLPModule(), max_steps=3)
    assert _steps(first[0]) == [1, 2]
    ckpt = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(ckpt)
    second = all_callbacks(max_profiles=4)
    trainer2 = pl.Trainer(max_steps=12, default_root_dir=tmp_path, callbacks=second, logger=False, **FAST)
    trainer2.fit(MLPModule(), ckpt_path=ckpt)
    for cb in second[:2]:
        assert cb.schedules["train"].taken == 4 and cb.schedules["train"].last_step == 6
    assert _steps(second[0]) == [4, 6]  # 1 and 2 not again, and max_profiles counts the restored ones


def test_fast_dev_run(tmp_path: Path) -> None:
    cbs = all_callbacks(start_step=0)
    model = MLPModule()
    trainer = pl.Trainer(fast_dev_run=True, default_root_dir=tmp_path, callbacks=cbs, **FAST)
    trainer.fit(model)
    assert _steps(cbs[0]) == [0] and cbs[1].last_layers  # the code path runs ...
    assert not (tmp_path / "tscope").exists()  # ... but, like Lightning's loggers, writes nothing
    assert_nothing_left(model, trainer.optimizers)


def test_several_loggers_at_once_all_get_the_keys(tmp_path: Path) -> None:
    cbs = all_callbacks()
    tb, csv = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")
    fit(tmp_path, cbs, MLPModule(), max_steps=3, logger=[tb, csv])
    acc = EventAccumulator(tb.log_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert {"tscope/roofline/mfu", "tscope/roofline/flop_coverage"} <= set(acc.Tags()["scalars"])
    assert any(t.startswith("tscope/layers/table") for t in acc.Tags()["tensors"])
    header = (Path(csv.log_dir) / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "tscope/roofline/mfu" in header
    assert (Path(csv.log_dir) / "tscope" / "layers_table_step_2.md").exists()
    # per-step JSON goes to the first logger's directory, once
    assert sorted(p.name for p in (Path(tb.log_dir) / "tscope").glob("*.json")) == [
        "layers_step_1.json", "layers_step_2.json", "step_1.json", "step_2.json"]


def test_no_logger_at_all_writes_files(tmp_path: Path) -> None:
    cbs = all_callbacks()
    fit(tmp_path, cbs, MLPModule(), max_steps=2, logger=False)
    names = {p.name for p in (tmp_path / "tscope").iterdir()}
    assert {"metrics.csv", "step_1.json", "layers_step_1.json", "layers_table_step_1.md"} <= names


class _Raises(MLPModule):
    def __init__(self, exc: BaseException, where: str) -> None:
        super().__init__()
        self.exc, self.where = exc, where

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.trainer.global_step == 2 and self.where == "forward":
            raise self.exc
        if self.trainer.global_step == 2 and self.where == "backward":
            loss = _RaiseInBackward.apply(loss, self.exc)
        return loss


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, exc: BaseException) -> torch.Tensor:
        # keep the message only: an exception object in ctx would form a cycle through the C++ graph (never freed)
        ctx.exc_type, ctx.msg = type(exc), str(exc)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        raise ctx.exc_type(ctx.msg)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_exception_inside_a_profiled_step_leaves_nothing(tmp_path: Path, where: str) -> None:
    model = _Raises(RuntimeError("user bug"), where)
    cbs = all_callbacks()
    with pytest.raises(RuntimeError, match="user bug"):
        fit(tmp_path, cbs, model, max_steps=5)
    assert_nothing_left(model, model.trainer.optimizers)
    trainer = fit(tmp_path, all_callbacks(), MLPModule(), max_steps=3)  # the next fit profiles normally
    assert trainer.callbacks[0].schedules["train"].taken == 2


def test_keyboard_interrupt_inside_a_profiled_step_leaves_nothing(tmp_path: Path) -> None:
    model = _Raises(KeyboardInterrupt(), "forward")
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning: graceful shutdown, on_exception, then exit(1)
            fit(tmp_path, all_callbacks(), model, max_steps=5)
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores SIGINT while shutting down
    assert_nothing_left(model, model.trainer.optimizers)
