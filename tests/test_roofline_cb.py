"""RooflineCallback with a real Trainer: schedule, accumulation, outputs read back, automatic MFU, cleanup."""

from __future__ import annotations

import csv
import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from cb_utils import FAST, LeakCheck, assert_clean, test_spec
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from models import TINY_CFG, TinyLM, token_dataloader
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

import tscope_callbacks as ts
from tests.scripted_host import ScriptedHost, StepCost

KEYS = ["mfu", "mbu", "achieved_tflops", "measured_step_ms", "estimated_step_ms", "compute_bound_time_frac",
        "memory_bound_time_frac", "flop_coverage"]
EXACT = dict(capture=ts.CaptureOptions(steps=1, wait_for_warmup=False))  #: exactly the scheduled steps, one step each
SCHED = dict(start_step=1, every_n_steps=3, **EXACT)


def _fit(tmp_path: Path, callbacks: list, *, max_steps: int = 8, model: pl.LightningModule | None = None,
         **kw: Any) -> pl.Trainer:
    kw.setdefault("logger", False)
    trainer = pl.Trainer(max_steps=max_steps, default_root_dir=tmp_path, callbacks=callbacks, **{**FAST, **kw})
    trainer.fit(model or TinyLM())
    return trainer


def test_tensorboard_outputs_schedule_and_auto_mfu(tmp_path: Path) -> None:
    leak = LeakCheck()
    cb = ts.RooflineCallback(gpu=test_spec(), **SCHED, outputs=ts.RooflineOutputs(top=5))
    trainer = _fit(tmp_path, [leak, cb], logger=TensorBoardLogger(tmp_path, name="tb"))
    assert [h["step"] for h in cb.history] == [1, 3, 6]
    assert leak.checked == 8
    assert_clean(trainer.lightning_module, trainer.optimizers)
    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    for k in KEYS:
        assert f"tscope/roofline/{k}" in tags["scalars"], k
    assert [e.step for e in acc.Scalars("tscope/roofline/estimated_step_ms")] == [1, 3, 6]
    # automatic MFU: every logging step that was not profiled, once the first profile counted the FLOPs
    mfu_steps = [e.step for e in acc.Scalars("tscope/roofline/mfu")]
    assert mfu_steps == [1, 2, 3, 4, 5, 6, 7]
    assert all(e.value > 0 for e in acc.Scalars("tscope/roofline/mfu"))
    assert cb.last_mfu is not None and cb.last_mfu > 0
    # throughput between profiles (Lightning's ThroughputMonitor's samples/s, plus tokens/s): the windows of the
    # automatic MFU (the steps not profiled), 4 samples of 2-D int64 ids (4 x seq tokens) per step
    ms = {e.step: e.value for e in acc.Scalars("tscope/roofline/step_ms")}
    assert sorted(ms) == [2, 4, 5, 7]
    for name, per_step in (("samples_per_s", 4), ("tokens_per_s", 4 * TINY_CFG.seq_len)):
        got = {e.step: e.value for e in acc.Scalars(f"tscope/roofline/{name}")}
        assert got == pytest.approx({k: per_step / (t / 1e3) for k, t in ms.items()}, rel=1e-6)
    assert any(t.startswith("tscope/roofline/table") for t in tags["tensors"])
    assert "tscope/roofline/plot" in tags["images"]
    assert [e.step for e in acc.Images("tscope/roofline/plot")] == [1, 3, 6]
    saved = json.loads((Path(trainer.logger.log_dir) / "tscope" / "step_6.json").read_text())
    assert set(saved) == {"profile", "device", "report"} and saved["device"]["name"] == "test-cpu"
    assert saved["profile"]["info"]["step"] == 6 and saved["profile"]["ops"]
    assert cb.last_report is not None and cb.last_profile is not None
    assert cb.last_profile.info.trainer_precision == "32-true"


def test_accumulation_covers_both_micro_batches_and_the_optimizer(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(**EXACT, gpu=test_spec(), start_step=1, every_n_steps=10,
                             outputs=ts.RooflineOutputs(plot=False))
    _fit(tmp_path, [cb], max_steps=3, accumulate_grad_batches=2, model=TinyLM(optimizer="adamw"))
    assert [h["step"] for h in cb.history] == [1]
    prof = cb.last_profile
    assert prof.info.micro_batches == 2
    phases = {r.phase for r in prof.ops}
    assert {"forward", "backward", "optimizer"} <= phases
    emb_fwd = [r for r in prof.ops if r.op == "aten.embedding" and r.phase == "forward"]
    assert len(emb_fwd) == 4  # tok + pos, two micro-batches
    assert all(r.layer.startswith("model") or r.layer == "" for r in prof.ops if r.phase == "optimizer")
    opt_ops = [r for r in prof.ops if r.phase == "optimizer"]
    assert opt_ops and opt_ops[-1].index > max(r.index for r in prof.ops if r.phase == "backward")


class _SubmoduleLM(TinyLM):
    """Calls ``self.model`` directly, as most LightningModules do: the LightningModule's own forward never runs."""

    def compute_loss(self, batch) -> torch.Tensor:
        x, y = batch
        logits = self.model(x)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def test_throughput_from_the_batch_when_the_module_itself_is_never_called(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(**EXACT, gpu=test_spec(), start_step=1, every_n_steps=10,
                             outputs=ts.RooflineOutputs(plot=False))
    layers = ts.LayerProfilerCallback(start_step=1, every_n_steps=10)  # layer details: the saved activations
    _fit(tmp_path, [cb, layers], max_steps=4, accumulate_grad_batches=2, model=_SubmoduleLM())
    prof, rep = cb.last_profile, cb.last_report
    assert prof.info.inputs == [[[4, TINY_CFG.seq_len], "int64"], [[4, TINY_CFG.seq_len], "int64"]]  # (x, y)
    m = rep.model
    step = rep.summary.measured_step_s
    assert m["batch"] == 8 and m["samples_per_s"] == pytest.approx(8 / step)  # 2 micro-batches of 4
    assert m["tokens_per_s"] == pytest.approx(8 * TINY_CFG.seq_len / step)
    root = prof.layers[""]
    assert root.peak_fwd_bytes == 0 and root.saved_bytes > 0  # no forward of its own: what its children saved
    assert m["activations_mb"] == pytest.approx(root.saved_bytes / 2 / 2**20)  # one micro-batch's: each backward
    assert m["activations_source"] == "bytes saved for backward, mean of 2 micro-batches"  # frees its own
    text = rep.to_markdown()
    assert "per step of 2 micro-batches" in text and "tokens/s" in text


class _ManualLM(TinyLM):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        opt.step()
        return loss


def test_manual_optimization_profiles_the_whole_training_step(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(**EXACT, gpu=test_spec(), start_step=1, every_n_steps=10,
                             outputs=ts.RooflineOutputs(plot=False))
    trainer = _fit(tmp_path, [LeakCheck(), cb], max_steps=3, model=_ManualLM())
    assert [h["step"] for h in cb.history] == [1]
    assert {"forward", "backward", "optimizer"} <= {r.phase for r in cb.last_profile.ops}
    assert_clean(trainer.lightning_module, trainer.optimizers)


def test_start_beyond_max_steps_profiles_nothing(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=50, every_n_steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _fit(tmp_path, [LeakCheck(), cb], max_steps=4)
    assert not cb.history and cb.last_report is None and cb.last_mfu is None
    assert not (tmp_path / "tscope").exists()


def test_state_dict_resume_continues_the_schedule(tmp_path: Path) -> None:
    kw = dict(gpu=test_spec(), outputs=ts.RooflineOutputs(plot=False), max_profiles=3, **SCHED)
    first = ts.RooflineCallback(**kw)
    trainer = _fit(tmp_path, [first], max_steps=4)
    assert [h["step"] for h in first.history] == [1, 3]
    ckpt = tmp_path / "run.ckpt"
    trainer.save_checkpoint(ckpt)
    state = first.state_dict()
    assert state["schedules"]["train"] == {"taken": 2, "last_step": 3}
    second = ts.RooflineCallback(**kw)
    trainer2 = pl.Trainer(max_steps=12, default_root_dir=tmp_path, callbacks=[second], logger=False, **FAST)
    trainer2.fit(TinyLM(), ckpt_path=ckpt)
    assert [h["step"] for h in second.history] == [6]  # 9 is past max_profiles=3, 3 is not profiled again
    assert second.schedules["train"].taken == 3


class _Boom(TinyLM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == 1:
            raise RuntimeError("boom in training_step")
        return super().training_step(batch, batch_idx)


def test_exception_inside_a_profiled_step_leaves_nothing_installed(tmp_path: Path) -> None:
    model = _Boom()
    cb = ts.RooflineCallback(gpu=test_spec(), **SCHED)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(tmp_path, [cb], model=model)
    assert_clean(model, model.trainer.optimizers if model._trainer else ())


def test_unknown_auto_device_warns_and_logs_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tscope_callbacks.devices import resolve as specs
    from tscope_callbacks.devices.spec import UnknownDeviceError

    def unknown(name: Any = "auto", *a: Any, **k: Any) -> Any:
        raise UnknownDeviceError(str(name), ["NVIDIA L4"])

    monkeypatch.setattr(specs, "get_device_spec", unknown)
    cb = ts.RooflineCallback(gpu="auto", **SCHED)
    with pytest.warns(UserWarning, match="roofline part is skipped"):
        _fit(tmp_path, [cb], max_steps=3, logger=CSVLogger(tmp_path, name="csv"))
    assert cb.spec is None and cb.last_report is None
    assert [h["step"] for h in cb.history] == [1]
    assert {"tscope/roofline/achieved_tflops", "tscope/roofline/measured_step_ms",
            "tscope/roofline/flop_coverage"} <= set(cb.history[0])
    log_dir = tmp_path / "csv" / "version_0"
    assert "no device roof" in (log_dir / "tscope" / "roofline_table_step_1.md").read_text()


def test_named_unknown_device_is_an_error_at_construction() -> None:
    with pytest.raises(ts.UnknownDeviceError, match="Closest known names"):  # before any training starts
        ts.RooflineCallback(gpu="NVIDIA Imaginary X9000", **SCHED)


def test_csv_logger_metrics_contain_the_keys(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(gpu=test_spec(), **SCHED, outputs=ts.RooflineOutputs(plot=False))
    trainer = _fit(tmp_path, [cb], max_steps=3, logger=CSVLogger(tmp_path, name="csv"))
    header = (Path(trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()[0].split(",")
    for k in KEYS:
        assert f"tscope/roofline/{k}" in header, k
    assert (Path(trainer.logger.log_dir) / "tscope" / "roofline_table_step_1.md").exists()


def test_no_logger_writes_files_under_default_root_dir(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(gpu=test_spec(), **SCHED)
    _fit(tmp_path, [cb], max_steps=2)
    files = {p.name for p in (tmp_path / "tscope").iterdir()}
    assert {"step_1.json", "metrics.csv", "roofline_table_step_1.md", "roofline_plot_step_1.png",
            "roofline_layers_step_1.csv"} <= files


def test_internal_errors_log_once_or_raise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    import tscope_callbacks.api as rl

    def broken(*a: Any, **k: Any) -> Any:
        raise ValueError("analysis exploded")

    monkeypatch.setattr(rl, "analyze", broken)
    cb = ts.RooflineCallback(**EXACT, gpu=test_spec(), start_step=1, every_n_steps=1)
    with caplog.at_level("WARNING", logger="tscope_callbacks"):
        trainer = _fit(tmp_path, [cb], max_steps=4)
    lines = [r.getMessage() for r in caplog.records if "analysis exploded" in r.getMessage()]
    assert lines == ["tscope RooflineCallback: internal error in the roofline analysis (training continues unchanged; "
                     "further errors there are not logged): ValueError: analysis exploded"]
    assert cb.faults.counts["the roofline analysis"] == 3  # steps 1, 2, 3 profiled; logged once
    assert trainer.global_step == 4
    assert cb.last_report is None and "tscope/roofline/measured_step_ms" in cb.history[-1]  # counts still logged
    strict = ts.RooflineCallback(gpu=test_spec(), raise_errors=True, **SCHED)
    model = TinyLM()
    with pytest.raises(ValueError, match="analysis exploded"):
        _fit(tmp_path, [strict], max_steps=3, model=model)
    assert_clean(model)


def _shape_loader(n_long: int, n_short: int) -> DataLoader:
    long_ = list(token_dataloader(TINY_CFG, n_batches=n_long))
    short = [(x[:, :8].contiguous(), y[:, :8].contiguous()) for x, y in token_dataloader(TINY_CFG, n_batches=n_short)]
    return DataLoader(long_ + short, batch_size=None)  # pre-batched: 4 batches of seq 16, then seq 8


def test_auto_mfu_recounts_when_the_batch_shape_changes(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(**EXACT, gpu=test_spec(), start_step=1, every_n_steps=100,
                             outputs=ts.RooflineOutputs(plot=False, save_json=False))
    model = TinyLM()
    model.train_dataloader = lambda: _shape_loader(4, 6)  # type: ignore[method-assign]
    _fit(tmp_path, [cb], max_steps=10, model=model)
    assert [(h["step"], h["reason"]) for h in cb.history] == [(1, "schedule"), (5, "recount")]
    assert len(cb._flops) == 2
    f_long, f_short = sorted(cb._flops.values(), reverse=True)
    assert f_short < f_long


class _LinearLM(pl.LightningModule):
    """A few ops per step: the cheapest model a Trainer can profile."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.fc(batch[0]).square().mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=2)


def test_memory_stays_flat_over_many_profiles(tmp_path: Path) -> None:
    import gc

    from tscope_callbacks.records import OpRecord

    def live_records() -> int:
        gc.collect()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance on deprecated torch module objects warns
            return sum(isinstance(o, OpRecord) for o in gc.get_objects())

    before = live_records()  # other tests may keep records alive
    cb = ts.RooflineCallback(**EXACT, gpu=test_spec(), start_step=0, every_n_steps=1,
                             outputs=ts.RooflineOutputs(plot=False, save_json=False, history=8))
    _fit(tmp_path, [cb], max_steps=50, model=_LinearLM())
    assert cb.schedules["train"].taken == 50 and len(cb.history) == 8
    held = live_records() - before
    assert 0 < len(cb.last_profile.ops) <= held <= 2 * len(cb.last_profile.ops), held  # one profile, not fifty


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="every_n_steps"):
        ts.RooflineCallback(every_n_steps=0)
    with pytest.raises(TypeError, match="gpu"):
        ts.RooflineCallback(gpu=3)
    with pytest.raises(ValueError, match="top"):
        ts.RooflineCallback(outputs=ts.RooflineOutputs(top=0))
    with pytest.raises(TypeError, match="plot"):
        ts.RooflineCallback(outputs=ts.RooflineOutputs(plot="yes"))
    with pytest.raises(ValueError, match="stage"):
        ts.RooflineCallback(stages=["eval"])
    with pytest.raises(ValueError, match="precision|fp"):
        ts.RooflineCallback(what_if=ts.WhatIf(precision="fp7"))
    with pytest.raises(TypeError):
        ts.RooflineCallback("auto", None, 20)  # type: ignore[misc]  # schedule/top are keyword-only


def test_validation_stage_profiles_forward_only(tmp_path: Path) -> None:
    class ValLM(TinyLM):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self.compute_loss(batch))

        def val_dataloader(self) -> Any:
            return token_dataloader(TINY_CFG, n_batches=3)

    cb = ts.RooflineCallback(gpu=test_spec(), stages=("validation",), start_step=1, every_n_steps=10,
                             outputs=ts.RooflineOutputs(plot=False))
    _fit(tmp_path, [LeakCheck(), cb], max_steps=4, model=ValLM(), val_check_interval=2, limit_val_batches=3)
    assert [(h["stage"], h["step"]) for h in cb.history] == [("validation", 1), ("validation", 1)]
    assert {r.phase for r in cb.last_profile.ops} == {"forward"}
    assert (tmp_path / "tscope" / "validation_step_1.json").exists()
    assert cb._flops == {}  # eval profiles do not feed the training MFU


def test_test_and_predict_stages_by_batch_index(tmp_path: Path) -> None:
    class EvalLM(TinyLM):
        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("test_loss", self.compute_loss(batch))

        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            return self(batch[0])

    cb = ts.RooflineCallback(gpu=test_spec(), stages=("test", "predict"), start_step=0, every_n_steps=2,
                             outputs=ts.RooflineOutputs(plot=False))
    model = EvalLM()
    trainer = pl.Trainer(default_root_dir=tmp_path, callbacks=[cb], logger=False, **FAST)
    trainer.test(model, dataloaders=token_dataloader(TINY_CFG, n_batches=5), verbose=False)
    trainer.predict(model, dataloaders=token_dataloader(TINY_CFG, n_batches=3))
    assert [(h["stage"], h["step"]) for h in cb.history] == [("test", 0), ("test", 2), ("test", 4), ("predict", 0),
                                                             ("predict", 2)]
    assert {r.phase for r in cb.last_profile.ops} == {"forward"}
    assert_clean(model)
    files = {p.name for p in (tmp_path / "tscope").iterdir()}
    assert {"test_step_4.json", "predict_step_2.json", "roofline_test_table_step_2.md"} <= files


def test_fsdp_whatif_option_adds_the_section_and_scalars(tmp_path: Path) -> None:
    import csv

    from tscope_callbacks.analysis.fsdp import fsdp_whatif

    with pytest.raises(ValueError, match="WhatIf.fsdp_gpus must be an int >= 2"):
        ts.RooflineCallback(gpu=test_spec(), what_if=ts.WhatIf(fsdp_gpus=1))
    # a 600 GB/s (bidirectional) link, so the what-if also times the step (test_spec has none)

    spec = dataclasses.replace(test_spec(), interconnect={"nvlink": 6e11})
    cb = ts.RooflineCallback(gpu=spec, **SCHED, outputs=ts.RooflineOutputs(plot=False), what_if=ts.WhatIf(fsdp_gpus=4))
    model = TinyLM()
    trainer = _fit(tmp_path, [cb], max_steps=3, model=model, logger=CSVLogger(tmp_path, name="csv"))
    w = cb.last_report.fsdp_whatif
    assert w["n"] == 4 and w["memory"]["peak"] and w["time"]["step_s"] > 0
    # the callback's profile had the memory timeline (layer details): the same what-if recomputed agrees
    again = fsdp_whatif(cb.last_report, model, 4)
    assert again["memory"]["peak"] == w["memory"]["peak"]
    assert 0 < w["memory"]["peak"] < cb.last_report.profile.info.memory_categories["step_peak"]  # sharding saves memory
    log_dir = Path(trainer.logger.log_dir)
    rows = list(csv.DictReader((log_dir / "metrics.csv").open()))
    peak = [float(r["tscope/fsdp_whatif/peak_mb"]) for r in rows if r.get("tscope/fsdp_whatif/peak_mb")]
    step_ms = [float(r["tscope/fsdp_whatif/step_ms"]) for r in rows if r.get("tscope/fsdp_whatif/step_ms")]
    assert peak == [w["memory"]["peak"] / 2**20] and step_ms == [pytest.approx(w["time"]["step_s"] * 1e3)]
    assert "### FSDP over 4 GPUs (what-if, per GPU)" in (log_dir / "tscope" / "roofline_table_step_1.md").read_text()


def test_the_step_a_report_is_written_in_is_no_mfu_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          host: ScriptedHost) -> None:
    """A profile series is analysed and written a few steps after it (once the steps after it are timed), inside a
    training step: that step's window is dropped, not logged as a slow window. On an H200 GPT-2 fit the report's
    ~0.4 s of host work made one 10-step window read 95 ms a step and an automatic MFU of 7% against 11.8%.

    On the scripted host every step takes 5 ms and the report 300 ms: the windows are exact at any load."""
    from tscope_callbacks.callbacks import roofline_cb

    written: list[int] = []
    original = roofline_cb.RooflineCallback._analyse

    def slow_analyse(self, trainer, pl_module, result, ctx):  # the report's host work, made unmistakable: 0.3 s
        written.append(trainer.global_step)
        host.advance(0.3)
        return original(self, trainer, pl_module, result, ctx)

    monkeypatch.setattr(roofline_cb.RooflineCallback, "_analyse", slow_analyse)
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=3, every_n_steps=12,
                             capture=ts.CaptureOptions(steps=3, wait_for_warmup=False))
    _fit(tmp_path, [cb, StepCost(host, 0.005)], max_steps=32, logger=CSVLogger(tmp_path, name="csv"),
         log_every_n_steps=1)
    # the series of steps 3-5 and 15-17, each written steps later (not in its own steps); the automatic MFU runs from
    # the first report on, so the second is written inside its windows
    assert len(written) >= 2 and written[0] > 5 and written[1] > 17, written
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    ms = {int(r["step"]): float(r["tscope/roofline/step_ms"]) for r in rows if r.get("tscope/roofline/step_ms")}
    assert ms, "windows were logged"
    # every logged window is a plain 5 ms step, none holds the 300 ms of the report
    assert list(ms.values()) == [pytest.approx(5.0)] * len(ms), ms
    # the report is written at the start of a step, before the window running since the step before closes (it is
    # logged at its last step): that window holds the 300 ms, and is dropped
    assert written[1] - 1 not in ms and written[1] in ms
