"""The callbacks' arguments: at most 12 each, the rest in typed, frozen option objects; a wrong or moved argument is
one line saying what to write; the step monitor RooflineCallback adds is one typed option, on by default."""

from __future__ import annotations

import dataclasses
import inspect

import lightning.pytorch as pl
import pytest
from models import TinyLM

import tscope_callbacks as ts

CALLBACKS = (ts.RooflineCallback, ts.LayerProfilerCallback, ts.NaNGuardCallback, ts.WatchCallback, ts.StepMonitor)
OPTIONS = (ts.CaptureOptions, ts.RooflineOutputs, ts.MFUOptions, ts.WhatIf, ts.LayerOutputs, ts.NaNGuardOptions,
           ts.MonitorOptions)


@pytest.mark.parametrize("cls", CALLBACKS, ids=lambda c: c.__name__)
def test_each_callback_takes_at_most_12_arguments(cls: type) -> None:
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert len(params) <= 12, params


@pytest.mark.parametrize("cls", OPTIONS, ids=lambda c: c.__name__)
def test_option_objects_are_frozen_keyword_only_and_documented(cls: type) -> None:
    opts = cls()
    field = dataclasses.fields(cls)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(opts, field.name, getattr(opts, field.name))
    with pytest.raises(TypeError):
        cls(getattr(opts, field.name))  # keyword-only
    assert dataclasses.replace(opts) == opts
    lines = inspect.getsource(cls).splitlines()
    for f in dataclasses.fields(cls):  # every field is documented in the comment just above it
        at = next(i for i, ln in enumerate(lines) if ln.startswith(f"    {f.name}:"))
        assert lines[at - 1].strip().startswith("#:") or lines[at - 1].strip().startswith("#"), f.name


@pytest.mark.parametrize(("cls", "kwargs", "says"), [
    (ts.RooflineCallback, {"plot": False}, "RooflineCallback(plot=...) moved: write outputs=ts.RooflineOutputs(plot=False)"),
    (ts.RooflineCallback, {"profile_steps": 1}, "write capture=ts.CaptureOptions(steps=1)"),
    (ts.RooflineCallback, {"steps": 5}, "write capture=ts.CaptureOptions(steps=5)"),  # not "did you mean stages=?"
    (ts.RooflineCallback, {"wait_for_warmup": False}, "write capture=ts.CaptureOptions(wait_for_warmup=False)"),
    (ts.RooflineCallback, {"precision": "fp8"}, "write what_if=ts.WhatIf(precision='fp8')"),
    (ts.RooflineCallback, {"fsdp_whatif": 8}, "write what_if=ts.WhatIf(fsdp_gpus=8)"),
    (ts.RooflineCallback, {"auto_mfu": False}, "write mfu=ts.MFUOptions(automatic=False)"),
    (ts.RooflineCallback, {"attention_flops": "full"}, "write mfu=ts.MFUOptions(attention_flops='full')"),
    (ts.RooflineCallback, {"monitor": False}, "write monitor=None"),
    (ts.RooflineCallback, {"monitor": True}, "write monitor=ts.MonitorOptions()"),
    (ts.RooflineCallback, {"outputs": {"plot": False}}, "write outputs=ts.RooflineOutputs(plot=False)"),
    (ts.RooflineCallback, {"capture": ts.RooflineOutputs()}, "capture must be a tscope_callbacks.CaptureOptions"),
    (ts.RooflineCallback, {"every_n_step": 5}, "did you mean every_n_steps=?"),
    (ts.LayerProfilerCallback, {"top_k": 3}, "write outputs=ts.LayerOutputs(top_k=3)"),
    (ts.LayerProfilerCallback, {"verbose": True}, "write outputs=ts.LayerOutputs(verbose=True)"),
    (ts.NaNGuardCallback, {"max_skips": 3}, "write options=ts.NaNGuardOptions(max_skips=3)"),
    (ts.NaNGuardCallback, {"spike_factor": None}, "write options=ts.NaNGuardOptions(spike_factor=None)"),
    (ts.NaNGuardCallback, {"options": ts.MonitorOptions()}, "options must be a tscope_callbacks.NaNGuardOptions"),
])
def test_a_wrong_argument_is_one_line_saying_what_to_write(cls: type, kwargs: dict, says: str) -> None:
    with pytest.raises(TypeError) as e:
        cls(**kwargs)
    msg = str(e.value)
    assert says in msg and "\n" not in msg, msg


@pytest.mark.parametrize(("make", "says"), [
    (lambda: ts.CaptureOptions(steps=0), "CaptureOptions.steps must be an int >= 1, got 0"),
    (lambda: ts.CaptureOptions(replay="yes"), "CaptureOptions.replay must be True or False, got 'yes'"),
    (lambda: ts.RooflineOutputs(top=0), "RooflineOutputs.top must be an int >= 1, got 0"),
    (lambda: ts.MFUOptions(attention_flops="causal"), "MFUOptions.attention_flops must be one of 'attended', 'full'"),
    (lambda: ts.WhatIf(fsdp_gpus=1), "WhatIf.fsdp_gpus must be an int >= 2 (or None: off), got 1"),
    (lambda: ts.WhatIf(precision="fp7"), "unknown precision 'fp7'"),
    (lambda: ts.LayerOutputs(top_k=-1), "LayerOutputs.top_k must be an int >= 0, got -1"),
    (lambda: ts.NaNGuardOptions(alert_every_s=float("nan")), "NaNGuardOptions.alert_every_s must be a number >= 0"),
])
def test_a_wrong_option_value_is_one_line_naming_the_field(make, says: str) -> None:
    with pytest.raises((TypeError, ValueError)) as e:
        make()
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_options_reach_the_callbacks_behaviour() -> None:
    cb = ts.RooflineCallback(what_if=ts.WhatIf(precision="bf16-mixed"), capture=ts.CaptureOptions(steps=2),
                             outputs=ts.RooflineOutputs(history=4))
    assert cb.what_if.precision == "bf16" and cb.history.maxlen == 4 and cb._series.k == 2


def _fit(tmp_path, callbacks, steps=4) -> pl.Trainer:
    trainer = pl.Trainer(max_steps=steps, default_root_dir=tmp_path, callbacks=callbacks, logger=False,
                         accelerator="cpu", devices=1, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(TinyLM())
    return trainer


def test_the_step_monitor_is_on_by_default_and_one_typed_option(tmp_path, caplog) -> None:
    default = ts.RooflineCallback(gpu="auto")  # as in the README: unchanged
    with caplog.at_level("INFO", logger="tscope_callbacks"):
        trainer = _fit(tmp_path / "a", [default])
    assert "added its StepMonitor to the trainer's callbacks (monitor=None turns it off)" in caplog.text
    monitors = [c for c in trainer.callbacks if isinstance(c, ts.StepMonitor)]
    assert monitors == [default.monitor] and default.monitor.options == ts.MonitorOptions()
    assert default.monitor.last_breakdown is not None  # it ran: every step timed in parts

    tuned = ts.RooflineCallback(gpu="auto", monitor=ts.MonitorOptions(window=16, recent_steps=4))
    assert tuned.monitor.options.window == 16
    trainer = _fit(tmp_path / "b", [tuned])
    assert [c for c in trainer.callbacks if isinstance(c, ts.StepMonitor)] == [tuned.monitor]

    off = ts.RooflineCallback(gpu="auto", monitor=None)
    trainer = _fit(tmp_path / "c", [off])
    assert off.monitor is None and not [c for c in trainer.callbacks if isinstance(c, ts.StepMonitor)]

    own = ts.StepMonitor(telemetry=False)  # the user's own monitor in the trainer: no second one is added
    trainer = _fit(tmp_path / "d", [ts.RooflineCallback(gpu="auto"), own])
    assert [c for c in trainer.callbacks if isinstance(c, ts.StepMonitor)] == [own]
