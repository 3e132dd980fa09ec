"""Sinks: real TensorBoard / CSV / file outputs read back, sink failures isolated, logger selection."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tscope_callbacks.callbacks.sink_setup import build_sinks, resolve_log_dir
from tscope_callbacks.callbacks.sinks import (
    CSVSink,
    FileSink,
    MetricsSink,
    Sink,
    SinkGroup,
    TensorBoardSink,
    rows_to_markdown,
)

ROWS = [{"layer": "enc.a", "intensity": 2.5, "achieved_gflops_per_s": 10.0, "shape": [4, 8]},
        {"layer": "head", "intensity": 0.5, "achieved_gflops_per_s": 1.0, "shape": [4, 2]}]


def _fig():
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 2], [1, 4])
    return fig


def _emit(sink: Sink, step: int = 3) -> None:
    fig = _fig()
    try:
        sink.log_scalars({"tscope/roofline/mfu": 0.25, "tscope/roofline/achieved_tflops": 1.5}, step)
        sink.log_text("tscope/roofline/table", "| a | b |\n|---|---|\n| 1 | 2 |", step)
        sink.log_figure("tscope/roofline/plot", fig, step)
        sink.log_table("tscope/roofline/layers", ROWS, step)
        sink.log_scatter("tscope/roofline/scatter", ROWS, "intensity", "achieved_gflops_per_s", step)
    finally:
        plt.close(fig)


def _events(log_dir: str) -> EventAccumulator:
    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    return acc


def test_rows_to_markdown() -> None:
    md = rows_to_markdown([{"a": 1, "b": 0.123456}, {"a": "x|y", "b": 2.0}])
    # numbers right-aligned, text left
    assert md.splitlines() == ["| a | b |", "|:--|--:|", "| 1 | 0.123 |", "| x\\|y | 2 |"]
    assert rows_to_markdown([]) == "(empty)"
    # a narrow view (TensorBoard): long-text columns first, then the columns past max_cols, are left out and named
    wide = [{"layer": "blocks.0", "ms": 1.0, "shapes": "[[8, 1024, 768], [8, 1024, 768]]", "a": 1, "b": 2, "c": 3}]
    md = rows_to_markdown(wide, max_cols=3)
    assert md.splitlines()[0] == "| layer | ms | a |"
    assert md.splitlines()[-1] == "(3 more columns -- shapes, b, c -- in the TSCOPE tab, `tscope report` and the W&B / CSV tables)"
    # the layer name is kept however long (an HF model's rows read "Conv1D, Conv1D, Dropout" without it), and so is
    # the first column
    hf = [{"layer": "model.transformer.h.0.attn.c_attn", "type": "Conv1D", "ms": 1.0, "a": 1, "b": 2},
          {"layer": "model.transformer.h.0.attn.attn_dropout", "type": "Dropout", "ms": 0.5, "a": 1, "b": 2}]
    md = rows_to_markdown(hf, max_cols=3)
    assert md.splitlines()[0] == "| layer | type | ms |"
    assert md.splitlines()[2].startswith("| model.transformer.h.0.attn.c_attn | Conv1D |")
    assert md.splitlines()[-1] == "(2 more columns -- a, b -- in the TSCOPE tab, `tscope report` and the W&B / CSV tables)"
    late = [{"k": "x" * 30, "ms": 1.0, "a": 1, "b": 2, "name": "n" * 30}]  # a name column past max_cols stays
    assert rows_to_markdown(late, max_cols=3).splitlines()[0] == "| k | ms | name |"


def test_tensorboard_sink_round_trip(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="tb")
    _emit(TensorBoardSink(logger))
    logger.experiment.flush()
    acc = _events(logger.log_dir)
    tags = acc.Tags()
    assert {"tscope/roofline/mfu", "tscope/roofline/achieved_tflops"} <= set(tags["scalars"])
    assert acc.Scalars("tscope/roofline/mfu")[0].step == 3
    assert acc.Scalars("tscope/roofline/mfu")[0].value == pytest.approx(0.25)
    assert "tscope/roofline/plot" in tags["images"]
    texts = [t for t in tags["tensors"] if t.startswith("tscope/roofline/table")]
    assert texts, tags["tensors"]
    layers_md = acc.Tensors(next(t for t in tags["tensors"] if t.startswith("tscope/roofline/layers")))
    assert b"enc.a" in layers_md[0].tensor_proto.string_val[0]


def test_csv_sink_metrics_and_files(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name="csv")
    _emit(CSVSink(logger))
    logger.save()
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        header = next(csv.reader(f))
    assert "tscope/roofline/mfu" in header and "tscope/roofline/achieved_tflops" in header
    files = {p.name for p in (Path(logger.log_dir) / "tscope").iterdir()}
    assert files == {"roofline_table_step_3.md", "roofline_plot_step_3.png", "roofline_layers_step_3.csv"}


def test_file_sink(tmp_path: Path) -> None:
    _emit(FileSink(tmp_path / "tscope"), step=0)
    _emit(FileSink(tmp_path / "tscope"), step=1)
    d = tmp_path / "tscope"
    with open(d / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["key"] for r in rows].count("tscope/roofline/mfu") == 2 and rows[-1]["step"] == "1"
    with open(d / "roofline_layers_step_0.csv") as f:
        table = list(csv.DictReader(f))
    assert table[0]["layer"] == "enc.a" and table[0]["shape"] == "[4, 8]"
    assert (d / "roofline_plot_step_1.png").stat().st_size > 0
    assert (d / "roofline_table_step_0.md").read_text().startswith("| a | b |")


class _Broken(Sink):
    name = "broken"

    def log_scalars(self, scalars, step):
        raise RuntimeError("backend down")

    log_text = log_figure = log_table = log_scatter = log_scalars  # type: ignore[assignment]


class _Recorder(Sink):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def log_scalars(self, scalars, step):
        self.calls.append("scalars")

    def log_text(self, key, markdown, step):
        self.calls.append("text")


def test_failing_sink_warns_once_and_others_still_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rec = _Recorder()
    group = SinkGroup([_Broken(), rec], tmp_path)
    with caplog.at_level("WARNING", logger="tscope_callbacks"):
        _emit(group)
        _emit(group)
    warned = [r for r in caplog.records if "broken sink failed" in r.getMessage()]
    assert len(warned) == 1 and "backend down" in warned[0].getMessage()
    assert rec.calls == ["scalars", "text", "scalars", "text"]
    strict = SinkGroup([_Broken()], tmp_path, raise_errors=True)
    with pytest.raises(RuntimeError, match="backend down"):
        strict.log_scalars({"a": 1.0}, 0)


def test_write_json(tmp_path: Path) -> None:
    group = SinkGroup([], tmp_path)
    path = group.write_json("step_4.json", {"a": [1, 2], "t": (1, 2)})
    assert path == tmp_path / "tscope" / "step_4.json"
    assert path.read_text() == '{"a": [1, 2], "t": [1, 2]}'


class _OtherLogger:
    def __init__(self) -> None:
        self.metrics: list[tuple[dict, int]] = []

    def log_metrics(self, metrics, step=None):
        self.metrics.append((metrics, step))


def test_build_sinks_selects_by_logger(tmp_path: Path) -> None:
    tb = TensorBoardLogger(tmp_path, name="tb")
    other = _OtherLogger()
    trainer = SimpleNamespace(loggers=[tb, CSVLogger(tmp_path, name="csv"), other], default_root_dir=str(tmp_path))
    group = build_sinks(trainer)
    assert [type(s) for s in group.sinks] == [TensorBoardSink, CSVSink, MetricsSink]
    assert group.log_dir == Path(tb.log_dir) == resolve_log_dir(trainer)
    group.log_scalars({"tscope/x": 1.0}, 2)
    assert other.metrics == [({"tscope/x": 1.0}, 2)]

    bare = build_sinks(SimpleNamespace(loggers=[], default_root_dir=str(tmp_path)))
    assert len(bare.sinks) == 1 and isinstance(bare.sinks[0], FileSink)
    assert bare.sinks[0].directory == tmp_path / "tscope" and bare.files_dir == tmp_path / "tscope"

    only_other = build_sinks(SimpleNamespace(loggers=[other], default_root_dir=str(tmp_path)))
    assert [type(s) for s in only_other.sinks] == [MetricsSink, FileSink]
    assert only_other.sinks[1].scalars is False  # scalars went to the logger already


def test_figure_sinks_do_not_close_figures(tmp_path: Path) -> None:
    fig = _fig()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FileSink(tmp_path).log_figure("tscope/roofline/plot", fig, 0)
    assert plt.fignum_exists(fig.number)
    plt.close(fig)


def test_facts_of_the_fit_are_hyperparameters_and_tensorboard_gets_a_layout(tmp_path: Path) -> None:
    """``tscope/model/*`` and the memory categories go to the loggers' hyperparameters, not to one-point charts; the
    step's measured memory peak stays a series; TensorBoard gets the custom-scalars layout once."""
    import json

    import yaml
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    tb = TensorBoardLogger(tmp_path, name="tb")
    csv_logger = CSVLogger(tmp_path, name="csv")
    group = SinkGroup([TensorBoardSink(tb), CSVSink(csv_logger), FileSink(tmp_path / "files")], tmp_path)
    group.log_scalars({"tscope/roofline/mfu": 0.25, "tscope/model/params_m": 1.5,
                       "tscope/memory/weights_mb": 6.0, "tscope/memory/step_peak_mb": 20.0}, 3)
    group.log_scalars({"tscope/roofline/mfu": 0.3, "tscope/memory/weights_mb": 6.5}, 5)
    tb.experiment.flush()
    csv_logger.save()
    events = [ev for f in sorted(Path(tb.log_dir).glob("events*")) for ev in LegacyEventFileLoader(str(f)).Load()]
    scalars = {(v.tag, ev.step) for ev in events for v in ev.summary.value if v.WhichOneof("value") == "simple_value"}
    assert scalars == {("tscope/roofline/mfu", 3), ("tscope/roofline/mfu", 5), ("tscope/memory/step_peak_mb", 3)}
    tags = [v.tag for ev in events for v in ev.summary.value]
    assert tags.count("custom_scalars__config__") == 1  # once per run
    hp = yaml.safe_load((Path(tb.log_dir) / "hparams.yaml").read_text())
    assert hp == {"tscope/model/params_m": 1.5, "tscope/memory/weights_mb": 6.5}  # updated by the later value
    assert yaml.safe_load((Path(csv_logger.log_dir) / "hparams.yaml").read_text()) == hp
    assert json.loads((tmp_path / "files" / "hparams.json").read_text()) == hp
    rows = list(csv.DictReader((tmp_path / "files" / "metrics.csv").open()))
    assert {r["key"] for r in rows} == {"tscope/roofline/mfu", "tscope/memory/step_peak_mb"}


def test_hyperparameters_reach_any_lightning_logger() -> None:
    """W&B (its run config) and other Lightning loggers get the facts of the fit through ``log_hyperparams``."""
    calls: list[tuple[str, dict]] = []
    logger = SimpleNamespace(log_metrics=lambda m, step: calls.append(("metrics", dict(m))),
                             log_hyperparams=lambda p: calls.append(("hparams", dict(p))))
    SinkGroup([MetricsSink(logger)], ".").log_scalars({"tscope/roofline/mfu": 0.5, "tscope/model/params_m": 2.0}, 7)
    assert calls == [("metrics", {"tscope/roofline/mfu": 0.5}), ("hparams", {"tscope/model/params_m": 2.0})]


def test_an_unwritable_log_dir_names_the_lost_files_and_the_directory(tmp_path, caplog) -> None:
    """logger=False and a default_root_dir tscope cannot write in (here a file, which no one, root included, can make
    a directory of): one warning names the directory, what is lost and what to do; each lost step file is named at
    INFO; training is unchanged."""
    import logging

    import lightning.pytorch as pl

    import tscope_callbacks as ts
    from tests.cb_utils import FAST, test_spec
    from tests.models import TinyLM

    root = tmp_path / "not_a_dir"
    root.write_text("a file where the run's directory should be\n")
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=2, every_n_steps=3, outputs=ts.RooflineOutputs(plot=False),
                             capture=ts.CaptureOptions(steps=1, wait_for_warmup=False))
    trainer = pl.Trainer(max_steps=9, default_root_dir=str(root), logger=False, callbacks=[cb], **FAST)
    with caplog.at_level(logging.INFO, logger="tscope_callbacks"):
        trainer.fit(TinyLM())
    assert trainer.global_step == 9 and [h["step"] for h in cb.history] == [2, 3, 6]
    msgs = [r.getMessage() for r in caplog.records if "tscope" in r.getMessage()]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    where = root / "tscope"
    first = [m for m in msgs if "cannot write" in m and "are lost" in m]
    assert len(first) == 1 and warned == first and f"in {where} (" in first[0], msgs
    assert "step_<N>.json" in first[0] and "default_root_dir" in first[0] and "training continues" in first[0]
    lost = sorted(m for m in msgs if m.startswith("tscope: step file "))
    assert {"step_2.json", "step_3.json", "step_6.json"} - {m.split()[3] for m in lost} <= {first[0].split()[3]}
    assert all(f"cannot write in {where}" in m for m in lost), lost
    assert not any("sink failed in" in m for m in msgs), msgs  # no internal method names


def test_alert_or_log_says_it_even_where_nothing_is_written(tmp_path: Path, caplog) -> None:
    # under fast_dev_run the sinks are NULL_SINK (nothing written): the alert's log line still goes out; elsewhere
    # the sinks alert (and log) it, and the run's alerts file holds it
    import json
    import logging

    from tscope_callbacks.callbacks.sinks import NULL_SINK, SinkGroup, alert_or_log

    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        alert_or_log(NULL_SINK, "tscope/nan", "NaN", "NaN guard: a NaN", 3)
        logger = CSVLogger(str(tmp_path), name="run")
        alert_or_log(SinkGroup([], logger.log_dir), "tscope/step/alerts", "Input-bound", "input-bound: ...", 40)
    assert [r.getMessage() for r in caplog.records] == ["NaN guard: a NaN", "input-bound: ..."]
    saved = [json.loads(x) for x in (Path(logger.log_dir) / "tscope" / "alerts.jsonl").read_text().splitlines()]
    assert [(a["step"], a["key"], a["text"]) for a in saved] == [(40, "tscope/step/alerts", "input-bound: ...")]
