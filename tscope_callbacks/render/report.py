"""``RooflineReport``: a roofline analysis with its renderings one call away (markdown, CSV, dict, console, plot)."""

from __future__ import annotations

from typing import Any

from tscope_callbacks.analysis.roofline import RooflineAnalysis
from tscope_callbacks.render import markdown, plot

__all__ = ["RooflineReport"]


class RooflineReport(RooflineAnalysis):
    """The analysis (see :class:`~tscope_callbacks.analysis.roofline.RooflineAnalysis` for its tables and figures)
    plus one-line renderings. Build with ``tscope_callbacks.roofline(prof, spec)``."""

    def to_markdown(self, top: int = 20) -> str:
        """Markdown: header figures, layer x phase table, op-class comparison, opportunities."""
        return markdown.to_markdown(self, top=top)

    def to_csv(self, path: Any) -> None:
        """Every row of every table, ungrouped."""
        markdown.to_csv(self, path)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (``json.dumps`` works: no inf/nan)."""
        return markdown.to_dict(self)

    def to_console(self, top: int = 20, console: Any = None) -> None:
        """Print with rich when installed, plain markdown otherwise."""
        markdown.to_console(self, top=top, console=console)

    def figure(self, top_labels: int = 8) -> Any:
        """The roofline as a matplotlib Figure (no pyplot state)."""
        return plot.figure(self, top_labels=top_labels)

    def save_trace(self, path: Any) -> Any:
        """Write the step as a Chrome/Perfetto trace (``render.trace``): ops (and CUDA kernels) with their layer,
        FLOPs, bytes and roofline bound."""
        from types import SimpleNamespace

        from tscope_callbacks.render.trace import save_trace

        return save_trace(SimpleNamespace(ops=[o.record for o in self.op_roofs], meta=self.meta), path, self)

    def plot(self, path: Any, top_labels: int = 8) -> Any:
        """Write the roofline PNG to ``path``."""
        return plot.plot(self, path, top_labels=top_labels)
