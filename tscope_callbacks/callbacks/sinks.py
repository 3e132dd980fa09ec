"""Where the callbacks' outputs go: one small interface over the trainer's loggers (public logger API only).

==================  =====================================================================================
logger              what each call does
==================  =====================================================================================
TensorBoardLogger   ``experiment.add_scalar`` / ``add_text`` (markdown; tables as markdown) / ``add_figure`` /
                    ``add_histogram_raw`` (histograms computed on the device)
WandbLogger         ``log_metrics``; text as ``wandb.Html`` (markdown rendered to HTML); histograms as
                    ``wandb.Histogram(np_histogram=...)``; ``log_table`` (a
                    ``wandb.Table``); figures as ``wandb.Image``; scatter plots with ``wandb.plot.scatter``;
                    files (step JSON) in the run's own folder, uploaded with the run
CSVLogger           ``log_metrics``; text (``.md``), tables and histograms (``.csv``) and figures (``.png``) in
                    ``<its log_dir>/tscope/``
other loggers       ``log_metrics`` only (plus the file sink below for the rest)
no logger           files under ``<default_root_dir>/tscope/``: ``metrics.csv``, ``.md``, ``.csv``, ``.png``
==================  =====================================================================================

Several loggers at once: all of them get everything. A sink that raises is reported once (a warning naming it; one
per directory for the files) and skipped for that call; training never stops because of a sink.

Facts of the fit, not series: the keys of ``HPARAM_AREAS`` (``tscope/model/*``, the model summary, and the memory
categories ``tscope/memory/{weights,grads,optimizer_state,activations_saved}_mb``) go to the loggers' hyperparameters (``log_hyperparams``: TensorBoard's
HPARAMS tab and ``hparams.yaml``, the W&B run config, CSVLogger's ``hparams.yaml``; ``hparams.json`` for the file
sink) instead of a one-point scalar chart; the dashboard shows them per step. The model summary's step figures
(``STEP_FIGURES``: its latency and throughput, measured at one step) are not facts of the fit and are not written.
Writing the hyperparameters never creates TensorBoard's ``hp_metric`` chart (Lightning's ``TensorBoardLogger`` logs
``hp_metric = -1`` when ``log_hyperparams`` is called without metrics and ``default_hp_metric`` is on: the
TensorBoard sink writes the HPARAMS session itself instead). TensorBoard also gets a custom-scalars
layout (``CUSTOM_SCALARS``, its CUSTOM SCALARS tab) grouping MFU, step time and throughput.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "METRIC_ROOT",
    "alert_or_log",
    "HPARAM_AREAS",
    "CUSTOM_SCALARS",
    "is_hparam",
    "STEP_FIGURES",
    "is_step_figure",
    "metric_key",
    "NULL_SINK",
    "NullSink",
    "Sink",
    "TensorBoardSink",
    "WandbSink",
    "CSVSink",
    "FileSink",
    "MetricsSink",
    "SinkGroup",
    "rows_to_markdown",
]

from tscope_callbacks.analysis.report import ALERTS_FILE
from tscope_callbacks.render.tables import narrow_markdown, rows_to_markdown

log = logging.getLogger("tscope_callbacks")

Row = Mapping[str, Any]

#: the namespace of every key the callbacks write
METRIC_ROOT = "tscope"

#: facts of the fit (one point per fit as a chart), logged as hyperparameters: every ``tscope/model/*`` key (the model
#: summary, once per fit) and the memory categories that are fixed for a model and batch shape (the step's measured
#: peak, ``step_peak_mb``, and ``device_share`` stay series: they are measured at each profile)
HPARAM_AREAS = {"model": None, "memory": ("weights_mb", "grads_mb", "optimizer_state_mb", "activations_saved_mb")}

#: the model summary's figures measured at the one step it was made from (the first profile, often a warm-up step):
#: not facts of the fit, so never hyperparameters, and not one-point charts either: they are not written. The series
#: ``tscope/roofline/measured_step_ms`` (each profile), ``step_ms``, ``samples_per_s`` and ``tokens_per_s`` (each
#: logging step) carry them over the run, and the dashboard shows the summary of each profiled step
STEP_FIGURES = {"model": ("latency_ms", "samples_per_s", "tokens_per_s")}

#: TensorBoard's custom-scalars layout (written once per run with the first ``tscope/roofline/*`` scalar); each
#: chart's tags are regular expressions
CUSTOM_SCALARS = {
    "tscope": {
        "MFU, HFU, MBU (fraction of peak)": ["Multiline", [r"^tscope/roofline/(mfu|hfu|mbu)$"]],
        "step time (ms)": ["Multiline", [r"^tscope/roofline/(step_ms|measured_step_ms|estimated_step_ms)$"]],
        "tokens/s": ["Multiline", [r"^tscope/roofline/tokens_per_s$"]],
        "samples/s": ["Multiline", [r"^tscope/roofline/samples_per_s$"]],
        "achieved TFLOP/s": ["Multiline", [r"^tscope/roofline/achieved_tflops$"]],
    },
}


def metric_key(area: str, name: str, stage: str = "train") -> str:
    """``tscope/<area>/<name>`` for training, ``tscope/<area>/<stage>/<name>`` for the other stages (the analysis
    hands out bare names; the adapters add the namespace and stage here, in one place)."""
    return f"{METRIC_ROOT}/{area}/{name}" if stage == "train" else f"{METRIC_ROOT}/{area}/{stage}/{name}"


def is_step_figure(key: str) -> bool:
    """A key of ``STEP_FIGURES`` (``tscope/model/latency_ms``...): measured at one step, not a fact of the fit."""
    parts = key.split("/", 2)
    return len(parts) == 3 and parts[0] == METRIC_ROOT and parts[2] in STEP_FIGURES.get(parts[1], ())


def is_hparam(key: str) -> bool:
    """A key of ``HPARAM_AREAS`` (``tscope/model/*``, ``tscope/memory/weights_mb``...): logged as a hyperparameter
    (``STEP_FIGURES`` excepted)."""
    parts = key.split("/", 2)
    if len(parts) != 3 or parts[0] != METRIC_ROOT or parts[1] not in HPARAM_AREAS or is_step_figure(key):
        return False
    names = HPARAM_AREAS[parts[1]]
    return names is None or parts[2] in names


def _slug(key: str) -> str:
    """``"tscope/roofline/table"`` -> ``"roofline_table"`` (a file-name-safe key)."""
    key = key[len(METRIC_ROOT) + 1 :] if key.startswith(METRIC_ROOT + "/") else key
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_") or "output"


class Sink:
    """The interface the callbacks write through. Every method is optional for a backend (default: no-op)."""

    name = "sink"

    @property
    def key(self) -> Any:
        """What a failure is reported once for (the backend; a directory for file sinks)."""
        return id(self)

    @property
    def files_dir(self) -> Path | None:
        """The directory this sink writes files in (None: it writes none)."""
        return None

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """Scalars keyed by metric name (``tscope/...``) at ``step``."""

    def log_hparams(self, params: Mapping[str, float]) -> None:
        """Facts of the fit (``tscope/model/*``, ``tscope/memory/*``) as the logger's hyperparameters (updated)."""

    def log_text(self, key: str, markdown: str, step: int) -> None:
        """A markdown text (e.g. a table) at ``step``."""

    def log_figure(self, key: str, figure: Any, step: int) -> None:
        """A matplotlib figure (the caller closes it)."""

    def log_html(self, key: str, make_html: Any, step: int) -> None:
        """A self-contained HTML page (the dashboard), built by calling ``make_html()`` only in backends that show
        HTML (W&B)."""

    def log_table(self, key: str, rows: Sequence[Row], step: int) -> None:
        """Tabular rows (dicts with the same keys)."""

    def log_scatter(self, key: str, rows: Sequence[Row], x: str, y: str, step: int, title: str = "") -> None:
        """A scatter plot of ``rows`` (``x`` vs ``y`` columns); only backends with interactive plots implement it."""

    def alert(self, key: str, title: str, text: str, step: int, wait_s: float = 0.0) -> None:
        """An alert: a text entry under ``key`` (TensorBoard, files) or a W&B ``run.alert``."""

    def log_histograms(self, key: str, hists: Sequence[Any], step: int) -> None:
        """Histograms (``analysis.histograms.Histogram``), each under ``<key>/<its name>``."""

    def write_json(self, name: str, obj: Any) -> Path | None:
        """A JSON file next to the run's logs (see :class:`SinkGroup`); None when nothing is written."""
        return None


class NullSink(Sink):
    """Writes nothing: the sink of ranks other than zero and of ``fast_dev_run`` (no ``None`` checks needed)."""

    name = "null"


NULL_SINK = NullSink()


def alert_or_log(sinks: Sink, key: str, title: str, text: str, step: int, wait_s: float = 0.0) -> None:
    """An alert through ``sinks`` (which log it too); where they are :data:`NULL_SINK` (``fast_dev_run``: nothing is
    written) the log line still goes out. Callers send from rank zero only."""
    if sinks is NULL_SINK:
        log.warning("%s", text)
    else:
        sinks.alert(key, title, text, step, wait_s=wait_s)


class FileSink(Sink):
    """Files in ``directory``: ``metrics.csv`` (step,key,value), ``<key>_step_<N>.md|.csv|.png``."""

    name = "files"

    def __init__(self, directory: str | os.PathLike[str], *, scalars: bool = True) -> None:
        self.directory = Path(directory)
        self.scalars = scalars

    @property
    def key(self) -> Any:
        return ("files", str(self.directory))

    @property
    def files_dir(self) -> Path | None:
        return self.directory

    def _path(self, key: str, step: int, ext: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        return self.directory / f"{_slug(key)}_step_{step}.{ext}"

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        if not self.scalars or not scalars:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "metrics.csv"
        new = not path.exists()
        with path.open("a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["step", "key", "value"])
            for k, v in scalars.items():
                w.writerow([step, k, v])

    def log_hparams(self, params: Mapping[str, float]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "hparams.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**old, **params}, indent=1, sort_keys=True) + "\n")

    def log_text(self, key: str, markdown: str, step: int) -> None:
        self._path(key, step, "md").write_text(markdown + "\n")

    def log_figure(self, key: str, figure: Any, step: int) -> None:
        figure.savefig(self._path(key, step, "png"), dpi=figure.dpi)  # the pixels TensorBoard's image gets

    def alert(self, key: str, title: str, text: str, step: int, wait_s: float = 0.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / f"{_slug(key)}_alerts.md").open("a") as f:
            f.write(f"## step {step}: {title}\n\n{text}\n\n")

    def log_histograms(self, key: str, hists: Sequence[Any], step: int) -> None:
        self.log_table(key, [h.to_dict() for h in hists], step)  # one CSV per step: a row per tensor

    def log_table(self, key: str, rows: Sequence[Row], step: int) -> None:
        if not rows:
            return
        with self._path(key, step, "csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()), extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({k: _cell(v) for k, v in r.items()})


def _cell(v: Any) -> Any:
    return json.dumps(v) if isinstance(v, (list, tuple, dict)) else v


class MetricsSink(Sink):
    """Any Lightning logger: scalars through its public ``log_metrics``."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self.name = type(logger).__name__

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        if scalars:
            self.logger.log_metrics(dict(scalars), step=step)

    def log_hparams(self, params: Mapping[str, float]) -> None:
        if params:  # W&B: the run config (updated); CSVLogger: hparams.yaml
            self.logger.log_hyperparams(dict(params))


class CSVSink(MetricsSink):
    """CSVLogger: ``log_metrics`` for scalars; text/tables/figures as files in ``<log_dir>/tscope/``."""

    def __init__(self, logger: Any) -> None:
        super().__init__(logger)
        self.files = FileSink(Path(logger.log_dir) / "tscope", scalars=False)

    @property
    def files_dir(self) -> Path | None:
        return self.files.directory

    def log_text(self, key: str, markdown: str, step: int) -> None:
        self.files.log_text(key, markdown, step)

    def log_figure(self, key: str, figure: Any, step: int) -> None:
        self.files.log_figure(key, figure, step)

    def log_table(self, key: str, rows: Sequence[Row], step: int) -> None:
        self.files.log_table(key, rows, step)

    def alert(self, key: str, title: str, text: str, step: int, wait_s: float = 0.0) -> None:
        self.files.alert(key, title, text, step)

    def log_histograms(self, key: str, hists: Sequence[Any], step: int) -> None:
        self.files.log_histograms(key, hists, step)


class TensorBoardSink(Sink):
    """TensorBoardLogger: scalars, markdown text (tables rendered as markdown) and figures as images."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self.name = type(logger).__name__

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        exp = self.logger.experiment
        if not getattr(self, "_layout", False) and any(k.startswith(f"{METRIC_ROOT}/roofline/") for k in scalars):
            self._layout = True
            exp.add_custom_scalars(CUSTOM_SCALARS)
        for k, v in scalars.items():
            exp.add_scalar(k, float(v), global_step=step)

    def log_hparams(self, params: Mapping[str, float]) -> None:
        """The logger's hyperparameters updated with ``params``: its ``hparams.yaml`` rewritten and the HPARAMS
        tab's session written again with all of them (no metric values are written here)."""
        if not params:
            return
        from torch.utils.tensorboard.summary import hparams

        lg = self.logger
        lg.hparams.update(params)  # what Lightning's log_hyperparams records, without its placeholder hp_metric
        flat = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in lg.hparams.items()}
        metrics = {"hp_metric": 0.0} if getattr(lg, "_default_hp_metric", False) else {}  # names only
        writer = lg.experiment._get_file_writer()
        for summary in hparams(flat, metrics):
            writer.add_summary(summary)
        from lightning.pytorch.core.saving import save_hparams_to_yaml

        save_hparams_to_yaml(os.path.join(lg.log_dir, "hparams.yaml"), lg.hparams)

    def log_text(self, key: str, markdown: str, step: int) -> None:
        # tables narrowed: TensorBoard's Text tab breaks words anywhere once a table is wider than its card
        self.logger.experiment.add_text(key, narrow_markdown(markdown), global_step=step)

    def log_figure(self, key: str, figure: Any, step: int) -> None:
        self.logger.experiment.add_figure(key, figure, global_step=step, close=False)

    def log_table(self, key: str, rows: Sequence[Row], step: int) -> None:
        self.logger.experiment.add_text(key, rows_to_markdown(rows, max_cols=9), global_step=step)

    def alert(self, key: str, title: str, text: str, step: int, wait_s: float = 0.0) -> None:
        self.logger.experiment.add_text(key, text, global_step=step)

    def log_histograms(self, key: str, hists: Sequence[Any], step: int) -> None:
        exp = self.logger.experiment
        for h in hists:  # bucket limits are right edges; the first bucket starts at min
            if h.num:
                exp.add_histogram_raw(f"{key}/{h.name}", h.min, h.max, h.num, h.sum, h.sum_squares, h.edges[1:],
                                      h.counts, global_step=step)


class WandbSink(MetricsSink):
    """WandbLogger: scalars, ``wandb.Table`` rows, ``wandb.Image`` figures, ``wandb.plot.scatter``, text as HTML."""

    def log_text(self, key: str, markdown: str, step: int) -> None:
        import wandb

        from tscope_callbacks.render.html import markdown_to_html

        self.logger.log_metrics({key: wandb.Html(markdown_to_html(markdown))}, step=step)

    def log_html(self, key: str, make_html: Any, step: int) -> None:
        import wandb

        self.logger.log_metrics({key: wandb.Html(make_html(), inject=False)}, step=step)

    def log_figure(self, key: str, figure: Any, step: int) -> None:
        import wandb

        self.logger.log_image(key, [wandb.Image(figure)], step=step)

    def log_table(self, key: str, rows: Sequence[Row], step: int) -> None:
        if not rows:
            return
        cols = list(rows[0].keys())
        self.logger.log_table(key, columns=cols, data=[[_cell(r.get(c)) for c in cols] for r in rows], step=step)

    def alert(self, key: str, title: str, text: str, step: int, wait_s: float = 0.0) -> None:
        import wandb

        self.logger.experiment.alert(title=title, text=text, level=wandb.AlertLevel.WARN, wait_duration=wait_s)

    def log_histograms(self, key: str, hists: Sequence[Any], step: int) -> None:
        import wandb

        data = {f"{key}/{h.name}": wandb.Histogram(np_histogram=(h.counts, h.edges)) for h in hists if h.num}
        if data:
            self.logger.log_metrics(data, step=step)

    def log_scatter(self, key: str, rows: Sequence[Row], x: str, y: str, step: int, title: str = "") -> None:
        import wandb

        pts = [[r[x], r[y], r.get("layer", "")] for r in rows if r.get(x) is not None and r.get(y) is not None]
        if not pts:
            return
        table = wandb.Table(columns=[x, y, "layer"], data=pts)
        self.logger.log_metrics({key: wandb.plot.scatter(table, x, y, title=title or key)}, step=step)


class SinkGroup(Sink):
    """Fan-out to several sinks. A sink that raises is warned about once and skipped; the others still run.

    ``log_dir`` is the trainer's log directory (``<log_dir>/tscope/`` holds the per-step JSON files).
    """

    name = "group"

    def __init__(self, sinks: Sequence[Sink], log_dir: str | os.PathLike[str], *, raise_errors: bool = False) -> None:
        self.sinks = list(sinks)
        self.log_dir = Path(log_dir)
        self.raise_errors = raise_errors
        self._warned: set[Any] = set()
        self._lost: set[str] = set()  #: step files lost (each named once)

    @property
    def files_dir(self) -> Path:
        return self.log_dir / "tscope"

    def _failed(self, key: Any, what: str, e: Exception) -> None:
        if self.raise_errors:
            raise e
        if key not in self._warned:
            self._warned.add(key)
            log.warning("tscope: %s (%s: %s); further failures of this sink are not reported, training continues",
                        what, type(e).__name__, e)

    def _files_lost(self, directory: Path, name: str | None, e: Exception, step_file: bool = False) -> None:
        """A file in ``directory`` could not be written: the first time, one warning naming the file, the directory,
        what is lost and what to do; after it, each lost step file (``step_file``) by name at INFO (one warning per
        run, not one per profile)."""
        if self.raise_errors:
            raise e
        why = f"{type(e).__name__}: {getattr(e, 'strerror', None) or e}"
        key = ("files", str(directory))
        if key not in self._warned:
            self._warned.add(key)
            log.warning("tscope: cannot write %s in %s (%s): the tscope files of this run there (the step files "
                        "step_<N>.json that `tscope report` and the dashboard read, tables, plots, alerts) are lost; "
                        "make %s writable, or give the Trainer a writable default_root_dir (or its logger a writable "
                        "save_dir); training continues", name or "files", directory, why, directory)
        elif step_file and name is not None and name not in self._lost:
            self._lost.add(name)
            log.info("tscope: step file %s lost: cannot write in %s (%s)", name, directory, why)

    def _each(self, method: str, *args: Any) -> None:
        for s in self.sinks:
            try:
                getattr(s, method)(*args)
            except Exception as e:
                directory = s.files_dir
                if directory is not None and isinstance(e, OSError):
                    where = Path(e.filename) if isinstance(e.filename, (str, os.PathLike)) else None
                    self._files_lost(directory, where.name if where is not None and where.parent == directory
                                     else None, e)
                else:
                    self._failed(s.key, f"the {s.name} sink failed in {method}", e)

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        series = {k: v for k, v in scalars.items() if not is_hparam(k) and not is_step_figure(k)}
        facts = {k: v for k, v in scalars.items() if is_hparam(k)}
        if series:
            self._each("log_scalars", series, step)
        if facts:
            self._each("log_hparams", facts)

    def log_hparams(self, params: Mapping[str, float]) -> None:
        self._each("log_hparams", params)

    def log_text(self, key: str, markdown: str, step: int) -> None:
        self._each("log_text", key, markdown, step)

    def log_figure(self, key: str, figure: Any, step: int) -> None:
        self._each("log_figure", key, figure, step)

    def log_html(self, key: str, make_html: Any, step: int) -> None:
        self._each("log_html", key, make_html, step)

    def log_table(self, key: str, rows: Sequence[Row], step: int) -> None:
        self._each("log_table", key, rows, step)

    def log_scatter(self, key: str, rows: Sequence[Row], x: str, y: str, step: int, title: str = "") -> None:
        self._each("log_scatter", key, rows, x, y, step, title)

    def log_histograms(self, key: str, hists: Sequence[Any], step: int) -> None:
        self._each("log_histograms", key, hists, step)

    def alert(self, key: str, title: str, text: str, step: int, wait_s: float = 0.0) -> None:
        """Log a warning on logger ``tscope_callbacks``, alert through every backend that has alerts, and append the
        alert to ``<log_dir>/tscope/alerts.jsonl`` (whatever the logger: the offline dashboard reads it)."""
        log.warning("%s", text)
        self._each("alert", key, title, text, step, wait_s)
        path = self.files_dir / ALERTS_FILE
        try:
            self.files_dir.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"step": int(step), "key": key, "title": title, "text": text}) + "\n")
        except Exception as e:
            self._files_lost(self.files_dir, path.name, e)

    def write_json(self, name: str, obj: Any) -> Path | None:
        """Write ``obj`` as ``<log_dir>/tscope/<name>`` (atomically). A failure (e.g. an unwritable directory) is
        warned about once per directory, together with the file sinks writing there; None then."""
        path = self.files_dir / name
        try:
            self.files_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(path.suffix + ".tmp")
            with tmp.open("w") as f:
                json.dump(obj, f, default=_json_default)
            os.replace(tmp, path)
        except Exception as e:
            self._files_lost(self.files_dir, path.name, e, step_file=True)
            return None
        return path


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)
