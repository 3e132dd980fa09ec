"""The one report type: :class:`StepReport`, what ``ts.roofline``, ``ts.analyze``, ``ts.analyze_model``,
``ts.load_step_file`` and the callbacks' ``last_report`` return -- one profiled (or estimated) step, analysed once,
frozen and typed (``analysis.report.ReportData``: every figure with its basis, the tables, the findings, the noise),
with each rendering one call away: ``to_markdown``, ``to_console``, ``to_csv``, ``to_dict`` (the versioned JSON),
``plot`` / ``figure``, ``save_trace``, ``to_html``. Each rendering is a pure function of the report
(``tscope_callbacks.render``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tscope_callbacks.analysis.report import ReportData, read_step_report
from tscope_callbacks.render import csv_table, dashboard, markdown, plot, trace

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.console import Console

__all__ = ["StepReport", "load_step_file"]

PathLike = str | os.PathLike[str]


class StepReport(ReportData):
    """One step, analysed once (fields: ``analysis.report.ReportData``), with its renderings.

    ``summary`` holds the model-level figures (``summary.mfu``, ``summary.measured_step_s``, ...), ``header`` the
    headline figures with their unit and basis, ``rows`` the tables (``table(kind, top)`` groups the small rows),
    ``ops`` every op on its roof, ``opportunities`` the findings; ``profile`` is the StepProfile it was analysed
    from, when known."""

    def to_markdown(self, top: int = 20) -> str:
        """Markdown: header figures, layer x phase table, op-class comparison, opportunities."""
        return markdown.to_markdown(self, top=top)

    def to_console(self, top: int = 20, console: Console | None = None) -> None:
        """Print with rich when installed, plain markdown otherwise."""
        markdown.to_console(self, top=top, console=console)

    def to_csv(self, path: PathLike) -> None:
        """Every row of every table, ungrouped (``render.csv_table.CSV_FIELDS``)."""
        csv_table.to_csv(self, path)

    def figure(self, top_labels: int = 8) -> Figure:
        """The roofline as a matplotlib Figure (no pyplot state)."""
        return plot.figure(self, top_labels=top_labels)

    def plot(self, path: PathLike, top_labels: int = 8) -> str:
        """Write the roofline PNG to ``path``."""
        return plot.plot(self, path, top_labels=top_labels)

    def save_trace(self, path: PathLike) -> Path:
        """Write the step as a Chrome/Perfetto trace (``render.trace``): ops (and CUDA kernels) with their layer,
        FLOPs, bytes and roofline bound. Needs the step's records (``profile``): a report read from a bare report
        JSON has none."""
        if self.profile is None:
            raise ValueError("this report has no records to trace (read from a report JSON without its profile): "
                             "load the step file (step_<N>.json) instead")
        return trace.save_trace(self.profile, path, self)

    def to_html(self, path: PathLike | None = None) -> str:
        """The dashboard page of this step as one self-contained HTML file (inline JS and CSS, no network);
        written to ``path`` too when given."""
        text = dashboard.report_html(self)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text


def load_step_file(path: PathLike, data: dict[str, Any] | None = None) -> StepReport:
    """The report of a step file (``<log_dir>/tscope/step_<N>.json``, with its profile) or of a report JSON
    (``report.to_dict()``); ``data``: its JSON, when already read. Raises ``StepFileError`` (a ValueError) with one
    line for a missing, unreadable, corrupt or half-written file, or one of another version."""
    return read_step_report(StepReport, path, data)
