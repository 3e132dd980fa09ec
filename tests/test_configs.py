"""LightningCLI snippets: configs/roofline.yaml and configs/layers.yaml build the callbacks with their arguments."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("jsonargparse")

from lightning.pytorch.cli import LightningCLI
from models import TinyLM

import tscope_callbacks as ts

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _cli(tmp_path: Path, *configs: str) -> LightningCLI:
    args: list[str] = []
    for c in configs:
        args += ["--config", str(CONFIGS / c)]
    args += ["--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}", "--trainer.accelerator=cpu",
             "--trainer.enable_progress_bar=false"]
    return LightningCLI(TinyLM, run=False, args=args, save_config_callback=None, seed_everything_default=False)


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py"])  # LightningCLI warns when pytest's own argv is present


def _only(cli: LightningCLI, cls: type) -> object:
    found = [cb for cb in cli.trainer.callbacks if isinstance(cb, cls)]
    assert len(found) == 1, cli.trainer.callbacks
    return found[0]


def test_roofline_yaml(tmp_path: Path) -> None:
    cb = _only(_cli(tmp_path, "roofline.yaml"), ts.RooflineCallback)
    assert cb.gpu == "auto" and cb.what_if == ts.WhatIf() and cb.outputs == ts.RooflineOutputs(top=20, plot=True)
    assert cb.capture == ts.CaptureOptions(steps=3) and isinstance(cb.monitor, ts.StepMonitor)
    s = cb.schedules["train"]
    assert (s.every_n_steps, s.start_step, s.max_profiles, s.profile_first) == (500, 10, None, True)
    assert cb.stages == ("train",)


def test_layers_yaml(tmp_path: Path) -> None:
    cb = _only(_cli(tmp_path, "layers.yaml"), ts.LayerProfilerCallback)
    assert cb.paths is None and cb.depth == 3 and cb.check_finite
    assert cb.outputs == ts.LayerOutputs(top_k=10, save_json=True)
    s = cb.schedules["train"]
    assert (s.every_n_steps, s.start_step, s.max_profiles) == (1000, 10, 5)


def test_class_paths_resolve_to_the_exported_classes() -> None:
    from tscope_callbacks.callbacks.layers_cb import LayerProfilerCallback
    from tscope_callbacks.callbacks.roofline_cb import RooflineCallback

    assert ts.RooflineCallback is RooflineCallback and ts.LayerProfilerCallback is LayerProfilerCallback


def test_option_objects_and_monitor_off_in_a_config(tmp_path: Path) -> None:
    """Option objects are nested mappings in a config; ``monitor: null`` turns the step monitor off."""
    cfg = tmp_path / "roof.yaml"
    cfg.write_text("trainer:\n  callbacks:\n    - class_path: tscope_callbacks.RooflineCallback\n      init_args:\n"
                   "        monitor: null\n        capture: {steps: 1, replay: false}\n"
                   "        what_if: {precision: bf16-mixed, fsdp_gpus: 8}\n        mfu: {attention_flops: full}\n")
    args = ["--config", str(cfg), "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}",
            "--trainer.accelerator=cpu"]
    cli = LightningCLI(TinyLM, run=False, args=args, save_config_callback=None, seed_everything_default=False)
    cb = _only(cli, ts.RooflineCallback)
    assert cb.monitor is None and cb.capture == ts.CaptureOptions(steps=1, replay=False)
    assert cb.what_if == ts.WhatIf(precision="bf16", fsdp_gpus=8) and cb.mfu.attention_flops == "full"
