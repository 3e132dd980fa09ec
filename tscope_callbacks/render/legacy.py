"""A StepReport as CSV (every row of every table, ungrouped) and as the version 1 report dict (``RooflineReport.to_dict``:
``summary``, ``scalars``, ``roofs``, ``layers``...), for readers of the files written before the StepReport schema.
Pure functions of the report."""

from __future__ import annotations

import csv
import dataclasses
import os
from typing import Any

from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.report import Opportunity, ReportLike, Row, StepReport, json_safe, step_report_of

__all__ = ["CSV_FIELDS", "to_csv", "to_dict", "row_v1", "opportunity_v1", "category_comparison", "noise_dict"]

CSV_FIELDS = ["table", "name", "layer", "type", "phase", "category", "precision", "n_ops", "flops", "bytes",
              "intensity", "ridge", "bound", "estimate_ms", "expected_ms", "achievable_estimate_ms", "measured_ms",
              "pct_of_roof", "pct_of_achievable", "recoverable_ms"]

#: the CSV's table names -> StepReport.rows keys
_TABLES = (("layer", "layer_phase"), ("layer_total", "layer"), ("inclusive", "inclusive"), ("category", "category"),
           ("op", "op_name"), ("total", "total"))


def to_csv(report: ReportLike, path: str | os.PathLike[str]) -> None:
    """Every row of every table (layer x phase, layer totals, inclusive, op class, op name), ungrouped."""
    report = step_report_of(report)
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


def row_v1(r: Row) -> dict[str, Any]:
    """A row as version 1 wrote it (``analysis.rows.Row.to_dict``)."""
    mm = r.largest_matmul
    return {
        "name": r.name, "kind": r.kind, "layer": r.layer, "type": r.type, "phase": r.phase,
        "category": r.category, "precision": r.precision, "n_ops": r.n_ops, "flops": r.flops,
        "bytes": r.bytes, "intensity": r.intensity, "ridge": r.ridge, "bound": r.bound,
        "estimate_s": r.estimate_s, "expected_s": r.expected_s, "achievable_estimate_s": r.achievable_estimate_s,
        "measured_s": r.measured_s, "attained": r.attained, "attained_achievable": r.attained_achievable,
        "recoverable_s": r.recoverable_s, "uncounted_ops": dict(r.uncounted_ops),
        "largest_matmul": list(mm) if mm else None,
    }


def opportunity_v1(o: Opportunity) -> dict[str, Any]:
    """A finding as version 1 wrote it (``analysis.rows.Opportunity.to_dict``)."""
    return {"layer": o.layer, "phase": o.phase, "type": o.type, "recoverable_s": o.recoverable_s,
            "measured_s": o.measured_s, "estimate_s": o.estimate_s, "bound": o.bound, "intensity": o.intensity,
            "ridge": o.ridge, "attained": o.attained, "reason": o.cause, "kind": o.kind, "saving_s": o.saving_s,
            "fix": o.change, "evidence": dict(o.evidence)}


def category_comparison(report: StepReport) -> list[dict[str, Any]]:
    """Per op class: measured time against the roofline bound and the shape-aware expectation."""
    return [{"category": r.name, "n_ops": r.n_ops, "measured_s": r.measured_s, "estimated_s": r.estimate_s,
             "expected_s": r.expected_s, "ratio": r.ratio, "expected_ratio": r.expected_ratio,
             "achievable_estimated_s": r.achievable_estimate_s,
             "ratio_achievable": _div(r.measured_s, r.achievable_estimate_s)} for r in report.rows["category"]]


def noise_dict(report: StepReport) -> dict[str, Any]:
    """The version 1 JSON of the noise: steps merged, rows marked, findings held back as within it."""
    n = report.noise
    return {"steps": n.steps, "floor_s": n.floor_s,
            "marks": [{"layer": m.layer, "phase": m.phase, "kind": m.kind, "measured_s": m.measured_s,
                       "typical_s": m.typical_s, "spread_s": m.spread_s, "samples": list(m.samples),
                       "siblings": list(m.siblings), "text": m.text} for m in n.marks],
            "suppressed": [opportunity_v1(o) for o in n.suppressed]}


_V1_SUMMARY_EXTRA = ("group_small", "has_kernel_model", "has_achievable")


def to_dict(report: ReportLike) -> dict[str, Any]:
    """The version 1 report dict: ``summary``, ``scalars``, ``roofs``, ``layers`` (layer x phase),
    ``layer_totals``, ``inclusive``, ``by_category``, ``by_op``, ``category_comparison``, ``opportunities``,
    ``noise``, ``totals`` (JSON-safe)."""
    report = step_report_of(report)
    summary = {f.name: getattr(report.summary, f.name) for f in dataclasses.fields(report.summary)
               if f.name not in _V1_SUMMARY_EXTRA}
    return json_safe({
        "version": 1,
        "summary": summary,
        "scalars": dict(report.scalars),
        "roofs": [dataclasses.asdict(r) for r in report.roofs],
        "layers": [row_v1(r) for r in report.rows["layer_phase"]],
        "layer_totals": [row_v1(r) for r in report.rows["layer"]],
        "inclusive": [row_v1(r) for r in report.rows["inclusive"]],
        "by_category": [row_v1(r) for r in report.rows["category"]],
        "by_op": [row_v1(r) for r in report.rows["op_name"]],
        "category_comparison": category_comparison(report),
        "opportunities": [opportunity_v1(o) for o in report.opportunities],
        "noise": noise_dict(report),
        "totals": row_v1(report.totals),
    })
