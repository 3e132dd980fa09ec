"""RooflineCallback's path of a profiled step: analysed once into a StepReport, every output emitted as a function of
it (``callbacks.roofline_io.emit``), the step file holding that StepReport's JSON."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from cb_utils import FAST, test_spec
from lightning.pytorch.loggers import TensorBoardLogger
from models import TinyLM
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tscope_callbacks as ts
from tscope_callbacks import StepReport, load_step_file
from tscope_callbacks.callbacks import roofline_io as io
from tscope_callbacks.callbacks.context import ProfileContext
from tscope_callbacks.callbacks.sinks import Sink
from tscope_callbacks.capture.faults import Faults

SCHED = dict(start_step=1, every_n_steps=3, capture=ts.CaptureOptions(steps=1, wait_for_warmup=False))


class _Recorder(Sink):
    """Every call, with what it was given (figures by type: a matplotlib Figure has no equality)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def log_scalars(self, scalars, step):
        self.calls.append(("scalars", dict(scalars), step))

    def log_text(self, key, markdown, step):
        self.calls.append(("text", key, markdown, step))

    def log_figure(self, key, figure, step):
        self.calls.append(("figure", key, type(figure).__name__, step))

    def log_table(self, key, rows, step):
        self.calls.append(("table", key, [dict(r) for r in rows], step))

    def log_scatter(self, key, rows, x, y, step, title=""):
        self.calls.append(("scatter", key, [dict(r) for r in rows], x, y, step, title))

    def write_json(self, name, obj):
        self.calls.append(("json", name, json.loads(json.dumps(obj))))
        return None


def _fit(tmp_path: Path, cb: ts.RooflineCallback, **kw: Any) -> pl.Trainer:
    kw.setdefault("logger", False)
    trainer = pl.Trainer(max_steps=kw.pop("max_steps", 3), default_root_dir=tmp_path, callbacks=[cb], **{**FAST, **kw})
    trainer.fit(TinyLM())
    return trainer


def test_the_step_file_holds_the_step_report_and_every_output_is_a_function_of_it(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(gpu=test_spec(), **SCHED, outputs=ts.RooflineOutputs(top=5))
    trainer = _fit(tmp_path, cb, max_steps=4, logger=TensorBoardLogger(tmp_path, name="tb"))
    path = Path(trainer.logger.log_dir) / "tscope" / "step_3.json"
    saved = json.loads(path.read_text())
    d = saved["report"]
    assert d["schema"] == "tscope.step_report" and d["version"] == 3 and d["step"] == 3
    report = StepReport.from_dict(d)
    assert report.to_dict() == d  # round trip
    assert load_step_file(path).to_dict() == d
    assert cb.last_report is not None and cb.last_report.to_dict() == d  # what the callback emitted from
    # the scalars the callback logged at the step are the report's, under tscope/roofline/
    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    logged = {t.removeprefix("tscope/roofline/"): [e.value for e in acc.Scalars(t) if e.step == 3]
              for t in acc.Tags()["scalars"] if t.startswith("tscope/roofline/")}
    assert report.scalars and all(logged[k] == [pytest.approx(v, rel=1e-6)] for k, v in report.scalars.items())
    # emitted again from the report read back from the file (no records, no callback): the same outputs as from
    # the live report, but for the raw records the file keeps beside it
    ctx = ProfileContext(stage="train", step=3, global_step=3, epoch=0, step_times_s=[0.0], world_size=1,
                         is_global_zero=True)
    live, again = _Recorder(), _Recorder()
    prof = cb.last_profile
    for sink, rep in ((live, cb.last_report), (again, report)):
        io.emit(io.AnalysedStep(prof, rep, test_spec()), sink, ctx, io.EmitOptions(top=5), Faults("test"))
    assert again.calls == live.calls
    kinds = [c[0] if c[0] != "text" else c[1] for c in live.calls]
    assert kinds == ["scalars", "tscope/roofline/table", "scalars", "table", "scatter", "figure", "json"]
    assert live.calls[-1][2]["report"] == d
    assert live.calls[1][2] == "**train step 3**\n\n" + report.to_markdown(top=5)


def test_without_a_roof_the_outputs_are_the_records_totals(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(gpu=test_spec(), **SCHED)
    _fit(tmp_path, cb, max_steps=2)
    prof = cb.last_profile
    ctx = ProfileContext(stage="validation", step=1, global_step=5, epoch=0, step_times_s=[0.01, 0.02],
                         world_size=2, is_global_zero=True, micro_batches=2)
    rec = _Recorder()
    io.emit(io.AnalysedStep(prof, None, None), rec, ctx, io.EmitOptions(), Faults("test"))
    (_, scalars, at), (_, key, text, _), (_, name, body) = rec.calls
    assert at == 5 and key == "tscope/roofline/validation/table" and name == "validation_step_1.json"
    assert scalars["tscope/roofline/validation/step_ms_min"] == pytest.approx(10.0)  # 0.01 s
    assert scalars["tscope/roofline/validation/step_ms_max"] == pytest.approx(20.0)
    assert scalars["tscope/roofline/validation/flop_coverage"] == pytest.approx(prof.coverage())
    assert text.startswith("**validation step 1** (2 micro-batches) -- step time across 2 ranks: min 10 ms, "
                           "max 20 ms (slowest: rank 1) -- no device roof; op totals only")
    assert body == {"profile": json.loads(json.dumps(prof.to_dict())), "device": None, "report": None}


def test_a_failing_fsdp_whatif_is_said_once_and_the_step_is_still_written(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    import tscope_callbacks.analysis.fsdp as fsdp

    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("cannot shard this")

    monkeypatch.setattr(fsdp, "fsdp_whatif", broken)
    cb = ts.RooflineCallback(gpu=test_spec(), **SCHED, outputs=ts.RooflineOutputs(plot=False),
                             what_if=ts.WhatIf(fsdp_gpus=4))
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        _fit(tmp_path, cb, max_steps=5)
    said = [r.getMessage() for r in caplog.records if "cannot shard this" in r.getMessage()]
    assert said == ["tscope RooflineCallback: internal error in the FSDP what-if over 4 GPUs (training continues "
                    "unchanged; further errors there are not logged): RuntimeError: cannot shard this"]
    assert [h["step"] for h in cb.history] == [1, 3]  # both profiles analysed and logged
    files = {p.name for p in (tmp_path / "tscope").iterdir()}
    assert {"step_1.json", "step_3.json", "roofline_table_step_3.md"} <= files
    d = json.loads((tmp_path / "tscope" / "step_3.json").read_text())
    assert d["report"]["fsdp_whatif"] is None and "fsdp_whatif" not in ts.StepReport.from_dict(d["report"]).area_scalars


def test_the_outputs_take_no_callback() -> None:
    """roofline_io and auto_mfu never reach back into the callback: no parameter is a callback (``cb``), nothing
    there reads or writes ``cb.<x>``, and neither module imports the callback's classes."""
    import ast

    import tscope_callbacks.callbacks.auto_mfu as auto_mfu

    for mod in (io, auto_mfu):
        tree = ast.parse(Path(mod.__file__).read_text())
        params = [a.arg for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for a in f.args.args + f.args.kwonlyargs]
        assert not {"cb", "callback"} & set(params), mod.__name__
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in ("cb", "callback")], mod.__name__
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & {"tscope_callbacks.callbacks.roofline_cb", "tscope_callbacks.callbacks.base"}
