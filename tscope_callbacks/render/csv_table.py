"""A report as CSV: every row of every table (layer x phase, layer totals, inclusive, op class, op name, total),
ungrouped, one line each. Times in milliseconds, shares in percent (the markdown table's units)."""

from __future__ import annotations

import csv
import os

from tscope_callbacks.analysis.report import ReportData

__all__ = ["CSV_FIELDS", "to_csv"]

CSV_FIELDS = ["table", "name", "layer", "type", "phase", "category", "precision", "n_ops", "flops", "bytes",
              "intensity", "ridge", "bound", "estimate_ms", "expected_ms", "achievable_estimate_ms", "measured_ms",
              "pct_of_roof", "pct_of_achievable", "recoverable_ms"]

#: the CSV's table names -> the report's ``rows`` keys
_TABLES = (("layer", "layer_phase"), ("layer_total", "layer"), ("inclusive", "inclusive"), ("category", "category"),
           ("op", "op_name"), ("total", "total"))


def to_csv(report: ReportData, path: str | os.PathLike[str]) -> None:
    """Every row of every table, ungrouped (``CSV_FIELDS``)."""
    ms = lambda s: "" if s is None else s * 1e3  # noqa: E731
    pct = lambda x: "" if x is None else 100.0 * x  # noqa: E731
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for table, key in _TABLES:
            for r in report.rows[key]:
                w.writerow([table, r.name, r.layer, r.type, r.phase, r.category, r.precision, r.n_ops, r.flops,
                            r.bytes, "" if r.intensity is None else r.intensity, "" if r.ridge is None else r.ridge,
                            r.bound, ms(r.estimate_s), ms(r.expected_s), ms(r.achievable_estimate_s), ms(r.measured_s),
                            pct(r.attained), pct(r.attained_achievable), ms(r.recoverable_s)])
