"""A real ``tensorboard`` server serves what the callbacks logged: the ``tscope/roofline/*`` scalars, the markdown
tables (text plugin) and the roofline plot (images plugin), read back through its HTTP API.

A few-step fit with ``RooflineCallback`` + ``LayerProfilerCallback`` and a ``TensorBoardLogger`` writes the log dir;
the server is started on a free localhost port and polled (bounded). Skips when no port can be opened or the server
does not come up; the server is always stopped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
from cb_utils import FAST, test_spec
from lightning.pytorch.loggers import TensorBoardLogger
from models import TinyLM

import tscope_callbacks as ts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from tb_server import TensorBoardUnavailable, get_json, serve

STARTUP_S = 60.0
ROOFLINE_SCALARS = {"mfu", "mbu", "achieved_tflops", "measured_step_ms", "estimated_step_ms",
                    "compute_bound_time_frac", "memory_bound_time_frac", "flop_coverage"}


def _get(base: str, path: str, **params: str) -> object:
    return get_json(base, path, **params)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tb")
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=2)
    layers = ts.LayerProfilerCallback(start_step=1, every_n_steps=100, depth=2)
    trainer = pl.Trainer(**{**FAST, "log_every_n_steps": 2}, max_steps=6, callbacks=[roof, layers],
                         logger=TensorBoardLogger(str(root), name="demo"))
    trainer.fit(TinyLM(n_batches=8))
    assert roof.last_report is not None
    return root


@pytest.fixture(scope="module")
def server(logdir: Path):
    """Base URL of a tensorboard serving ``logdir``, once its scalars endpoint lists the run's tscope tags."""
    try:
        ctx = serve(logdir, STARTUP_S)
        base = ctx.__enter__()
    except TensorBoardUnavailable as e:
        pytest.skip(str(e))
    try:
        yield base
    finally:
        ctx.__exit__(None, None, None)


def test_runs_and_plugins(server: str) -> None:
    assert _get(server, "/data/runs") == ["demo/version_0"]
    plugins = _get(server, "/data/plugins_listing")
    for name in ("scalars", "text", "images", "timeseries"):
        assert plugins[name]["enabled"], name


def test_roofline_scalars_are_served(server: str) -> None:
    tags = _get(server, "/data/plugin/scalars/tags")["demo/version_0"]
    assert {t.split("/", 2)[2] for t in tags if t.startswith("tscope/roofline/")} >= ROOFLINE_SCALARS
    assert any(t.startswith("tscope/layers/") and t.endswith("/forward_ms") for t in tags)
    points = _get(server, "/data/plugin/scalars/scalars", run="demo/version_0", tag="tscope/roofline/mfu")
    steps = [p[1] for p in points]  # [wall_time, step, value]
    assert {1, 2, 4} <= set(steps)  # profiled: start_step 1, then every 2nd step
    assert all(0.0 < p[2] for p in points)
    coverage = _get(server, "/data/plugin/scalars/scalars", run="demo/version_0", tag="tscope/roofline/flop_coverage")
    assert coverage[-1][2] == pytest.approx(1.0)


def test_roofline_table_and_plot_are_served(server: str) -> None:
    text_tags = _get(server, "/data/plugin/text/tags")["demo/version_0"]
    table_tag = next(t for t in text_tags if t.startswith("tscope/roofline/table"))  # Lightning adds /text_summary
    assert any(t.startswith("tscope/layers/table") for t in text_tags)
    entries = _get(server, "/data/plugin/text/text", run="demo/version_0", tag=table_tag)
    html = entries[-1]["text"]
    assert "Roofline" in html and "test-cpu" in html and "<table>" in html
    assert "model.blocks.0" in html
    images = _get(server, "/data/plugin/images/tags")["demo/version_0"]
    assert "tscope/roofline/plot" in images
