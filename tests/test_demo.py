"""``tscope demo``: a short real run prints the roofline table, the opportunities, MFU and the TensorBoard command;
``--nan-at`` shows the NaN guard naming the layer the NaN came from. In-process through the console script's
``main`` (one Lightning import for both runs); each run is a few dozen CPU steps."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tscope_callbacks.cli import main
from tscope_callbacks.cli.demo import _cpu_threads, _train_step_files


@pytest.fixture
def torch_settings():
    """The demo must leave process-wide torch settings as it found them."""
    before = (torch.get_num_threads(), torch.get_float32_matmul_precision())
    yield
    assert (torch.get_num_threads(), torch.get_float32_matmul_precision()) == before


def test_demo_prints_table_opportunities_mfu_and_tensorboard_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], torch_settings: None, caplog) -> None:
    out_dir = tmp_path / "logs"
    assert main(["demo", "--steps", "25", "--every", "10", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "litlogger" not in out + caplog.text  # Lightning's advertisement is filtered out of the demo
    assert "tscope demo: 25 steps in" in out
    assert "## Roofline" in out and "· DemoLM · step 20" in out  # profiled at 10 and 20: the last one is shown
    # on a GPU the table adds the shape-aware "expected ms" and an "advice" column (kernel tables exist there)
    assert re.search(r"\| layer \| type \| phase \| GFLOPs \| MiB \| FLOP/B \| bound \| roof ms \| "
                     r"(expected ms \| )?measured ms \| % of roof \|", out), out[:3000]
    assert "### Opportunities" in out
    assert "**MFU**" in out and "Automatic MFU" in out
    view = next(line for line in out.splitlines() if line.startswith("View them:"))
    assert view.endswith(f"tensorboard --logdir {out_dir.resolve()}")
    assert _runnable(view.split()[2])  # the printed command works as printed, venv activated or not
    assert "NaN guard:" not in out  # a healthy run has no events
    run_dir = out_dir / "tscope_demo" / "version_0"
    assert list(run_dir.glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (run_dir / "tscope").glob("step_*.json")) == ["step_10.json", "step_20.json"]
    dash = next(line for line in out.splitlines() if line.startswith("The dashboard:"))
    assert f"tscope view {out_dir.resolve()}" in dash and "TSCOPE tab" in dash
    assert _runnable(dash.split()[2])
    again = next(line for line in out.splitlines() if line.startswith("Re-render a profiled step:"))
    assert f"tscope report {run_dir.resolve() / 'tscope' / 'step_20.json'}" in again
    assert _runnable(again.split()[4])


def _runnable(word: str) -> bool:
    """A printed command's first word runs as typed: a full path to an executable, or a name PATH finds."""
    return os.access(word, os.X_OK) if os.sep in word else shutil.which(word) is not None


def test_printed_commands_work_without_an_activated_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off PATH (a venv not activated), a hint names this environment's script by its full path; on PATH, by its
    name; with no script at all, ``python -m`` with this interpreter's full path."""
    from tscope_callbacks.cli import hints

    if hints._script("tscope") is None:
        pytest.skip("the tscope console script is not installed in this environment (pip install -e .)")
    monkeypatch.setattr(hints.shutil, "which", lambda name: None)
    full = hints.command("tscope", "tscope_callbacks.cli")
    assert os.path.isabs(full) and full.endswith("tscope") and _runnable(full)
    monkeypatch.setattr(hints.shutil, "which", lambda name: full)
    assert hints.command("tscope", "tscope_callbacks.cli") == "tscope"
    monkeypatch.setattr(hints, "_script", lambda name: None)
    assert hints.command("tensorboard", "tensorboard.main") == f"{sys.executable} -m tensorboard.main"


def test_demo_nan_guard_names_the_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       torch_settings: None) -> None:
    out_dir = tmp_path / "logs"
    assert main(["demo", "--steps", "25", "--every", "10", "--nan-at", "15", "--logger", "csv",
                 "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    event = next(line for line in out.splitlines() if "NaN guard: non-finite" in line)
    assert "at step 15" in event
    assert "in layer 'model.blocks.1.mlp.fc'" in event
    assert "stopping the run" in event
    # the first line also names the op and the line that made the NaN (the demo's injecting hook); the alert is a
    # few short lines, onset second, and never points at another layer to "look there first" once the origin is known
    assert "first NaN made by aten.mul in the forward, called at lightning.py:" in event
    alert = out.split("event(s). First:\n", 1)[1].split("\n\n", 1)[0].split("\n=")[0].splitlines()
    assert alert[0].strip() == event.strip() and alert[1].startswith("  - Onset: sudden.") and len(alert) <= 7
    alert_text = "\n".join(alert)  # never points at another layer (the report below may list model.ln_f as noise)
    assert "look there first" not in out and "model.ln_f" not in alert_text
    assert "tscope demo: 16 steps in" in out  # action="stop": the run ends after the bad step (update dropped)
    assert "tensorboard --logdir" not in out  # CSV logger: no TensorBoard command
    metrics = next(out_dir.rglob("metrics.csv")).read_text()
    assert "tscope/nan/events" in metrics.splitlines()[0]


def test_demo_rejects_bad_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # refused by the parser, before any work
        main(["demo", "--steps", "0"])
    assert exc.value.code == 2
    assert "argument --steps: 0 is not a whole number >= 1" in capsys.readouterr().err


def test_cpu_threads_and_step_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert _cpu_threads(3) == 3
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    monkeypatch.setattr("os.getloadavg", lambda: (3.6, 0.0, 0.0))
    assert _cpu_threads(None) == 1  # 4 cores, 3.6 busy: the idle share, never below 1
    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))
    assert _cpu_threads(None) == min(torch.get_num_threads(), 4)
    # the training step files in step order (not text order); traces, layer trees, other stages and files of
    # another name are not step files
    for name in ("step_90.json", "step_10.json", "step_120.json", "trace_step_10.json", "layers_step_10.json",
                 "validation_step_5.json", "gpt2.json"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in _train_step_files(tmp_path)] == ["step_10.json", "step_90.json", "step_120.json"]


def test_demo_arguments_defaults() -> None:
    from tscope_callbacks.cli.demo import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([])
    assert (args.steps, args.every, args.logger, args.nan_at) == (300, 100, "tensorboard", None)


def test_demo_yaml_runs_through_lightning_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """configs/demo.yaml: the same demo through LightningCLI, a few real steps (one profiled)."""
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    import tscope_callbacks as ts
    from tscope_callbacks.demo.lightning import DemoLM, RandomTokenData

    monkeypatch.setattr("sys.argv", ["train.py"])  # LightningCLI warns about pytest's own argv
    cfg = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
    cli = LightningCLI(DemoLM, RandomTokenData, args=[
        "fit", "--config", str(cfg), "--trainer.max_steps=11", "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={tmp_path}"])
    kinds = {type(cb) for cb in cli.trainer.callbacks}
    assert {ts.RooflineCallback, ts.LayerProfilerCallback, ts.NaNGuardCallback} <= kinds
    assert cli.trainer.global_step == 11
    roof = next(cb for cb in cli.trainer.callbacks if isinstance(cb, ts.RooflineCallback))
    assert roof.last_report is not None  # start_step 10 was profiled
    run_dir = tmp_path / "tscope_demo_cli" / "version_0"
    assert (run_dir / "tscope" / "step_10.json").is_file() and (run_dir / "config.yaml").is_file()


def test_gpu_sized_demo_needs_a_gpu(capsys: pytest.CaptureFixture[str], torch_settings: None) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["demo", "--size", "gpu", "--steps", "1"]) == 2
    assert "--size gpu needs a CUDA device" in capsys.readouterr().err


def test_gpu_demo_is_gpt2_shaped() -> None:
    from tscope_callbacks.demo.lightning import GPU_DEMO, DemoLM

    with torch.device("meta"):
        m = DemoLM(**GPU_DEMO["model"])
    n = sum(p.numel() for p in m.parameters())
    # GPT-2 124M with untied head: 124.4M + 38.6M head = 163M; blocks 12 x 7.08M
    assert 160e6 < n < 166e6 and GPU_DEMO["precision"] == "bf16-mixed"


def test_the_demo_nan_is_located_when_the_flag_is_read_later(torch_settings: None) -> None:
    """On a GPU the guard reads its flag a few steps after the bad one and replays that step then: the demo's NaN
    comes with its batch, so the replay reproduces it and names the layer (an H200 demo said 'layer not located' when
    the injection was tied to the step instead). sync=False forces the GPU's deferred reading on the CPU."""
    import lightning.pytorch as pl

    import tscope_callbacks as ts
    from tscope_callbacks.demo.lightning import DemoLM, NaNInjector, RandomTokenData

    guard, inject = ts.NaNGuardCallback(action="stop", sync=False), NaNInjector(6)
    model = DemoLM(fused=True)  # as the GPU demo: a fused optimizer skips a flagged update on the device
    trainer = pl.Trainer(max_steps=12, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[guard, inject])
    trainer.fit(model, datamodule=RandomTokenData(num_samples=256))
    assert guard.mode == "deferred" and guard.num_events == 1
    event = guard.events[0]
    assert (event.step, event.layer) == (6, "model.blocks.1.mlp.fc"), event
    # no hook of the injector survives the fit
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
