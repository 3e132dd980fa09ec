"""LayerProfilerCallback with a real Trainer: tree table, per-layer scalars, InspectorGadgets JSON, W&B offline,
a capture shared with RooflineCallback, selection, argument errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from cb_utils import FAST, LeakCheck, assert_clean, test_spec
from lightning.pytorch.loggers import TensorBoardLogger
from models import TinyLM
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tscope_callbacks as ts

SCHED = dict(start_step=1, every_n_steps=3)


def _fit(tmp_path: Path, callbacks: list, *, max_steps: int = 5, **kw: Any) -> pl.Trainer:
    kw.setdefault("logger", False)
    trainer = pl.Trainer(max_steps=max_steps, default_root_dir=tmp_path, callbacks=callbacks, **{**FAST, **kw})
    trainer.fit(TinyLM())
    return trainer


def test_tensorboard_table_scalars_and_inspector_gadgets_json(tmp_path: Path) -> None:
    cb = ts.LayerProfilerCallback(depth=3, **SCHED, outputs=ts.LayerOutputs(top_k=3))
    trainer = _fit(tmp_path, [LeakCheck(), cb], logger=TensorBoardLogger(tmp_path, name="tb"))
    assert_clean(trainer.lightning_module, trainer.optimizers)
    layers = cb.last_layers
    assert max(p.count(".") + 1 for p in layers if p) == 3 and "model.blocks.0" in layers
    assert layers["model.blocks.0"].calls == 1 and layers["model.head"].calls == 1
    assert cb.last_table.splitlines()[0].startswith("tscope layers -- TinyLM, train step 3 only (op times of this one step")
    assert "│   ├── 0" in cb.last_table and "└── head" in cb.last_table

    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    assert any(t.startswith("tscope/layers/table") for t in tags["tensors"])
    per_layer = [t for t in tags["scalars"] if t.startswith("tscope/layers/")]
    assert {t.rsplit("/", 1)[1] for t in per_layer} == {"forward_ms", "backward_ms"}
    for step in (1, 3):  # top_k layers x {forward_ms, backward_ms} per profiled step, the same layers each time
        assert sum(any(e.step == step for e in acc.Scalars(t)) for t in per_layer) == 3 * 2
    assert len(per_layer) == 3 * 2  # a stable set (by FLOPs): no new charts at the second profile

    doc = json.loads((Path(trainer.logger.log_dir) / "tscope" / "layers_step_3.json").read_text())
    assert list(doc) == ["TinyLM"]
    model = doc["TinyLM"]["children"]["model"]
    block = model["children"]["blocks"]["children"]["0"]
    info = block["info"]
    assert info["type"] == "Block" and info["input_shapes"] == [[4, 16, 32]]
    assert info["grad_out_shape"] == [[4, 16, 32]] and info["forward_latency"] > 0 and info["backward_latency"] > 0
    assert info["num_parameters"] > 0 and info["flops_fwd"] > 0 and info["forward_nan"] is False
    assert block["children"] == {}  # depth 3: the block's submodules are folded into it


def test_shares_the_capture_with_roofline_and_prints(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    roof = ts.RooflineCallback(gpu=test_spec(), **SCHED, outputs=ts.RooflineOutputs(plot=False))
    lay = ts.LayerProfilerCallback(paths=["model.blocks.?"], **SCHED,
                                   outputs=ts.LayerOutputs(verbose=True, save_json=False))
    _fit(tmp_path, [lay, roof], max_steps=4)
    assert [h["step"] for h in roof.history] == [1, 3]
    assert roof.last_profile.layers is not lay.last_layers
    assert set(lay.last_layers) == {"", "model.blocks.0", "model.blocks.1"}
    # the shared capture kept full detail for the roofline
    assert "model.blocks.0.attn.qkv" in roof.last_profile.layers
    out = capsys.readouterr().out
    assert out.count("tscope layers -- TinyLM, train step") == 2 and "├── model.blocks.0" in out


def test_csv_and_no_logger_files(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    cb = ts.LayerProfilerCallback(depth=2, start_step=1, every_n_steps=10, outputs=ts.LayerOutputs(top_k=2))
    trainer = _fit(tmp_path, [cb], max_steps=2, logger=CSVLogger(tmp_path, name="csv"))
    d = Path(trainer.logger.log_dir)
    header = (d / "metrics.csv").read_text().splitlines()[0]
    assert "forward_ms" in header and "tscope/layers/" in header
    assert {"layers_table_step_1.md", "layers_rows_step_1.csv", "layers_step_1.json"} <= {
        p.name for p in (d / "tscope").iterdir()}

    bare = ts.LayerProfilerCallback(depth=1, start_step=1, every_n_steps=10)
    _fit(tmp_path / "bare", [bare], max_steps=2)
    assert {"layers_step_1.json", "metrics.csv", "layers_table_step_1.md"} <= {
        p.name for p in (tmp_path / "bare" / "tscope").iterdir()}


def test_wandb_offline_tables_image_and_scatter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, console="off", disable_git=True,
                              save_code=False)
    for _ in range(2):  # two runs with the same save_dir: their step files must not overwrite each other
        logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="tscope-test", settings=settings)
        roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=10)
        lay = ts.LayerProfilerCallback(depth=2, start_step=1, every_n_steps=10)
        try:
            _fit(tmp_path, [roof, lay], max_steps=2, logger=logger)
        finally:
            wandb.finish()
    run_dirs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 2
    for run in run_dirs:  # each run's files in its own folder (W&B uploads them with the run)
        assert (run / "files" / "tscope" / "step_1.json").exists()
        assert (run / "files" / "tscope" / "layers_step_1.json").exists()
    run_dirs = run_dirs[-1:]
    media = run_dirs[0] / "files" / "media"
    tables = [p.relative_to(media / "table").as_posix() for p in (media / "table").rglob("*.table.json")]
    assert any(t.startswith("tscope/layers/rows") for t in tables), tables
    assert any(t.startswith("tscope/roofline/layers") for t in tables), tables
    assert any(t.startswith("tscope/roofline/scatter") for t in tables), tables
    rows = json.loads(next((media / "table").rglob("rows*.table.json")).read_text())
    assert "forward_ms" in rows["columns"] and any(r[0] == "model.blocks" for r in rows["data"])
    assert list((media / "images").rglob("plot*.png"))
    assert not (tmp_path / "tscope").exists()  # nothing shared between runs


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="depth"):
        ts.LayerProfilerCallback(depth=-1)
    with pytest.raises(TypeError, match="paths"):
        ts.LayerProfilerCallback(paths=[1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="paths"):
        ts.LayerProfilerCallback(paths=[])
    with pytest.raises(ValueError, match="top_k"):
        ts.LayerProfilerCallback(outputs=ts.LayerOutputs(top_k=-3))
    with pytest.raises(TypeError, match="check_finite"):
        ts.LayerProfilerCallback(check_finite="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="start_step"):
        ts.LayerProfilerCallback(start_step=-1)
    with pytest.raises(ValueError, match="max_profiles"):
        ts.LayerProfilerCallback(max_profiles=-1)
    assert ts.LayerProfilerCallback(paths="model.blocks.*").paths == ["model.blocks.*"]
