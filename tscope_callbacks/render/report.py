"""``RooflineReport``: what ``tscope_callbacks.roofline`` returns -- the step's
:class:`~tscope_callbacks.analysis.report.StepReport` (``.step_report``) with its renderings one call away
(markdown, CSV, dict, console, plot, trace), each a pure function of that StepReport. The roofline analysis it was
built from stays reachable for its tables and figures (``report.layer_rows``, ``report.mfu``, ``report.op_roofs``...:
see :class:`~tscope_callbacks.analysis.roofline.RooflineAnalysis`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tscope_callbacks.analysis.analyze import AnalyzeOptions, report_of
from tscope_callbacks.analysis.report import StepReport
from tscope_callbacks.analysis.roofline import RooflineAnalysis
from tscope_callbacks.render import legacy, markdown, plot

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.console import Console

PathLike = str | os.PathLike[str]

__all__ = ["RooflineReport"]


class RooflineReport:
    """A StepReport and its renderings. Build with ``tscope_callbacks.roofline(prof, spec)``.

    ``meta``: the profile's meta plus ``what_if`` / ``fsdp_whatif`` when set (kept for code written against the
    version 1 report; read ``step_report.what_if`` / ``step_report.fsdp_whatif`` instead)."""

    def __init__(self, analysis: RooflineAnalysis, options: AnalyzeOptions | None = None) -> None:
        o = options or AnalyzeOptions()
        meta = dict(analysis.meta)
        if o.what_if:
            meta["what_if"] = o.what_if
        if o.fsdp_whatif is not None:
            meta["fsdp_whatif"] = o.fsdp_whatif
        self.__dict__.update(_analysis=analysis, _options=o, meta=meta, _built=None, profile=None)

    @property
    def analysis(self) -> RooflineAnalysis:
        """The roofline analysis the report was read from."""
        return self._analysis

    @property
    def options(self) -> AnalyzeOptions:
        """How the report was analysed."""
        return self._options

    @property
    def step_report(self) -> StepReport:
        """The typed report (built once; again only when a caller attaches another FSDP what-if to ``meta``)."""
        w = self.meta.get("fsdp_whatif")
        built = self._built
        if built is None or built[0] is not w:
            built = (w, report_of(self._analysis, dataclasses.replace(self._options, fsdp_whatif=w)))
            self.__dict__["_built"] = built
        return built[1]

    def __getattr__(self, name: str) -> Any:  # the analysis' tables and figures
        if name.startswith("_"):  # dunders, and our own fields before __init__ ran (copy, pickle)
            raise AttributeError(name)
        return getattr(self._analysis, name)

    def to_markdown(self, top: int = 20) -> str:
        """Markdown: header figures, layer x phase table, op-class comparison, opportunities."""
        return markdown.to_markdown(self.step_report, top=top)

    def to_html(self, path: PathLike | None = None) -> str:
        """The dashboard page of this step as one self-contained HTML file (``render.dashboard``: inline JS and CSS,
        no network); written to ``path`` too when given."""
        from tscope_callbacks.render.dashboard import report_html

        text = report_html(self.step_report)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text

    def to_csv(self, path: PathLike) -> None:
        """Every row of every table, ungrouped."""
        legacy.to_csv(self.step_report, path)

    def to_dict(self) -> dict[str, Any]:
        """The version 1 report dict (JSON-safe: ``json.dumps`` works, no inf/nan); ``step_report.to_dict()`` is the
        versioned StepReport JSON."""
        return legacy.to_dict(self.step_report)

    def to_console(self, top: int = 20, console: Console | None = None) -> None:
        """Print with rich when installed, plain markdown otherwise."""
        markdown.to_console(self.step_report, top=top, console=console)

    def figure(self, top_labels: int = 8) -> Figure:
        """The roofline as a matplotlib Figure (no pyplot state)."""
        return plot.figure(self.step_report, top_labels=top_labels)

    def save_trace(self, path: PathLike) -> Path:
        """Write the step as a Chrome/Perfetto trace (``render.trace``): ops (and CUDA kernels) with their layer,
        FLOPs, bytes and roofline bound."""
        from tscope_callbacks.records import StepProfile
        from tscope_callbacks.render.trace import save_trace

        prof = StepProfile(ops=[o.record for o in self._analysis.op_roofs], meta=self._analysis.meta)
        return save_trace(prof, path, self.step_report)

    def plot(self, path: PathLike, top_labels: int = 8) -> str:
        """Write the roofline PNG to ``path``."""
        return plot.plot(self.step_report, path, top_labels=top_labels)

    def __repr__(self) -> str:
        return repr(self._analysis).replace(type(self._analysis).__name__, type(self).__name__, 1)
