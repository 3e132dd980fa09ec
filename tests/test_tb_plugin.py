"""The TSCOPE tab in a real TensorBoard, opened in headless Chromium.

A small test fit (``TinyLM`` from tests/models.py, ``RooflineCallback`` profiling three steps, a
``TensorBoardLogger``) writes the log dir; a corrupt step file and an older-schema step file are added to its run.
``tensorboard --logdir`` is started on a free localhost port (the plugin is found through the package's
``tensorboard_plugins`` entry point, as for a user), and:

- over HTTP: the plugin is listed as the TSCOPE tab; ``runs`` lists the profiled steps and the two bad files as
  unreadable with their reasons; ``step`` answers a profiled step's report (timed) and an error JSON for the bad
  files and bad parameters, after which the server keeps answering;
- in the browser (Debian ``chromium`` + ``chromium-driver``, driven by selenium): the TSCOPE tab shows the page; a
  step is selected; the cards show the report's numbers; the roofline has one point per layer and phase; hovering a
  point shows the tooltip; the layer tree expands; the diff of two steps shows a change; the bad files are listed
  with their reasons. Selectors are the page's (``tscope_callbacks/dashboard/page.py``'s docstring).

The browser tests skip, saying why, when Chromium, chromedriver or selenium is missing (``.ci/run`` installs them
as root); with ``TSCOPE_REQUIRE_BROWSER=1`` (set by ``.ci/run`` once the browser is there) a missing piece fails.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
from cb_utils import FAST, test_spec
from lightning.pytorch.loggers import TensorBoardLogger
from models import TinyLM

import tscope_callbacks as ts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from tb_server import TensorBoardUnavailable, get_json, serve

RUN = "demo/version_0"
STARTUP_S = 90.0
WAIT_S = 30.0
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tbplugin")
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=3, wait_for_warmup=False)
    trainer = pl.Trainer(**{**FAST, "log_every_n_steps": 2}, max_steps=8, callbacks=[roof],
                         logger=TensorBoardLogger(str(root), name="demo"))
    trainer.fit(TinyLM(n_batches=10))
    tdir = root / RUN / "tscope"
    good = sorted(tdir.glob("step_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    assert len(good) >= 2, [p.name for p in tdir.iterdir()]
    text = good[0].read_text()
    (tdir / "step_1001.json").write_text(text[: len(text) // 3])  # half-written: a run still writing
    (tdir / "step_1002.json").write_text(json.dumps({"schema": "tscope.step_report", "version": 1, "step": 1002}))
    return root


@pytest.fixture(scope="module")
def server(logdir: Path):
    try:
        ctx = serve(logdir, STARTUP_S)
        base = ctx.__enter__()
    except TensorBoardUnavailable as e:
        pytest.skip(str(e))
    try:
        yield base
    finally:
        ctx.__exit__(None, None, None)


def _get(base: str, route: str, **params: object) -> object:
    return get_json(base, f"/data/plugin/tscope/{route}", **{k: str(v) for k, v in params.items()})


def _good_steps(base: str) -> list[int]:
    run = next(r for r in _get(base, "runs")["runs"] if r["run"] == RUN)
    return [s["step"] for s in run["steps"] if s["readable"] and s["stage"] == "train"]


# ------------------------------------------------------------------------------------------------ HTTP
def test_the_tab_is_registered(server: str) -> None:
    listing = get_json(server, "/data/plugins_listing")
    tab = listing["tscope"]
    assert tab["enabled"] and tab["tab_name"] == "TSCOPE"
    assert tab["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/tscope/index.js"}


def test_runs_steps_and_unreadable_files(server: str, logdir: Path) -> None:
    idx = _get(server, "runs")
    assert idx["hint"] is None
    run = next(r for r in idx["runs"] if r["run"] == RUN)
    on_disk = sorted(int(p.stem.split("_")[1]) for p in (logdir / RUN / "tscope").glob("step_*.json"))
    assert [s["step"] for s in run["steps"]] == on_disk
    bad = {s["step"]: s["error"] for s in run["steps"] if not s["readable"]}
    assert set(bad) == {1001, 1002}
    assert "half-written" in bad[1001]
    assert "schema version 1" in bad[1002] and "version 2" in bad[1002]


def test_step_route_answers_the_report(server: str, logdir: Path) -> None:
    step = _good_steps(server)[0]
    _get(server, "step", run=RUN, step=step, stage="train")  # parse once (cached by path, mtime, size)
    t0 = time.perf_counter()
    rep = _get(server, "step", run=RUN, step=step, stage="train")
    ms = (time.perf_counter() - t0) * 1e3
    assert ms < 200, f"step route took {ms:.0f} ms"
    assert rep["schema"] == "tscope.step_report" and rep["version"] == 2 and rep["step"] == step
    assert "ops" not in rep and rep["ops_count"] > 0  # ops come lazily through the ops route
    from tscope_callbacks.dashboard import logdir as ld

    full = ld.load(logdir / RUN, step)
    assert rep["header"] == full["header"]
    assert len(_get(server, "ops", run=RUN, step=step, stage="train", layer="")["ops"]) == rep["ops_count"]
    series = _get(server, "series", run=RUN)
    assert len(series["mfu"]) >= 2 and all(v > 0 for _, v in series["mfu"])


def test_bad_files_and_parameters_never_break_the_server(server: str) -> None:
    assert "half-written" in _get(server, "step", run=RUN, step=1001, stage="train")["error"]
    assert "schema version 1" in _get(server, "step", run=RUN, step=1002, stage="train")["error"]
    for params in ({"run": RUN, "step": "x"}, {"run": "../../..", "step": 1}, {}, {"run": RUN, "step": 1,
                                                                                    "stage": "<script>"}):
        assert "error" in _get(server, "step", **params)
        assert "error" in _get(server, "ops", **params)
    assert "error" in _get(server, "series", run="/")
    assert get_json(server, "/data/runs") == [RUN]  # the server still answers
    assert _get(server, "runs")["runs"]


def test_empty_logdir_hint(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "plain"))
    w.add_scalar("tscope/roofline/loss", 1.0, 0)  # a run TensorBoard serves, without tscope step files
    w.close()
    try:
        with serve(tmp_path, STARTUP_S) as base:
            idx = _get(base, "runs")
    except TensorBoardUnavailable as e:
        pytest.skip(str(e))
    assert idx["runs"] == [] and "RooflineCallback" in idx["hint"]
