"""Hyperparameters hold facts of the fit only: the model summary's latency and throughput, measured at the one
profiled step it comes from (often a warm-up step), are not written; the demo's TensorBoard run has no placeholder
``hp_metric`` chart (Lightning logs ``hp_metric = -1`` when a module's saved hyperparameters are logged without a
metric and the logger's ``default_hp_metric`` is on)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tscope_callbacks as ts
from tests.cb_utils import FAST, test_spec
from tscope_callbacks.callbacks.sinks import STEP_FIGURES, is_hparam, is_step_figure
from tscope_callbacks.cli.demo import _logger
from tscope_callbacks.demo.lightning import DemoLM, RandomTokenData


def test_step_figures_are_neither_hyperparameters_nor_series():
    for name in STEP_FIGURES["model"]:
        assert is_step_figure(f"tscope/model/{name}") and not is_hparam(f"tscope/model/{name}")
    assert is_hparam("tscope/model/params_m") and not is_step_figure("tscope/model/params_m")
    assert not is_step_figure("tscope/roofline/tokens_per_s") and not is_hparam("tscope/roofline/tokens_per_s")


def test_a_fit_keeps_step_figures_out_of_hparams_and_writes_no_hp_metric(tmp_path: Path):
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=2, outputs=ts.RooflineOutputs(plot=False),
                               capture=ts.CaptureOptions(steps=1))
    logger = _logger("tensorboard", str(tmp_path))  # the demo's logger
    trainer = pl.Trainer(max_steps=4, callbacks=[roof], logger=logger, **FAST)
    trainer.fit(DemoLM(d_model=32, n_layer=1), datamodule=RandomTokenData(batch_size=4, num_samples=64))
    hp = yaml.safe_load((Path(logger.log_dir) / "hparams.yaml").read_text())
    assert "tscope/model/params_m" in hp and "d_model" in hp  # our facts beside the module's own hyperparameters
    assert not {"tscope/model/latency_ms", "tscope/model/samples_per_s", "tscope/model/tokens_per_s"} & set(hp)
    acc = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "hp_metric" not in tags, tags
    assert not [t for t in tags if t.startswith("tscope/model/")]  # no one-point charts either
    assert "tscope/roofline/measured_step_ms" in tags  # the step time stays a series
