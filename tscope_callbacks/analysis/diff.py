"""Two profiled steps side by side: did a change help, and where (``tscope diff A.json B.json``).

HTA's ``TraceDiff`` compares two traces' kernels by name and count. This compares what the report already knows, on
each step's own basis: the step time MFU is computed from (the unprofiled steps' median, device-busy, or op time:
``RooflineReport.step_time_source``), MFU, model FLOPs, tokens/s, the step's memory peak, then per layer and per op
class the op time (measured; expected kernel time when a side is untimed, said so), ranked by how much each moved.

When the two steps do different work (model FLOPs differ by more than 1%: another batch shape, model or
precision), the step time is not comparable and the diff says to read throughput and MFU instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.fmt import fig
from tscope_callbacks.analysis.fmt import n as _n
from tscope_callbacks.analysis.model_summary import model_summary
from tscope_callbacks.analysis.view import RooflineView
from tscope_callbacks.records import model_flops

__all__ = ["StepDiff", "diff_reports"]


@dataclass
class DiffRow:
    """One layer or op class: time in A and in B (seconds; None when absent on that side)."""

    name: str
    a_s: float | None
    b_s: float | None

    @property
    def delta_s(self) -> float:
        return (self.b_s or 0.0) - (self.a_s or 0.0)

    @property
    def ratio(self) -> float | None:
        """B / A (below 1: faster in B)."""
        return _div(self.b_s, self.a_s) if self.a_s and self.b_s is not None else None


@dataclass
class StepDiff:
    """The comparison of two reports (``a``: before, ``b``: after)."""

    a: RooflineView
    b: RooflineView
    labels: tuple[str, str] = ("A", "B")
    headline: list[tuple[str, Any, Any, str]] = field(default_factory=list)  #: (figure, A, B, change)
    layers: list[DiffRow] = field(default_factory=list)  #: largest |change| first
    classes: list[DiffRow] = field(default_factory=list)
    same_work: bool = True
    basis: str = "measured op time"
    notes: list[str] = field(default_factory=list)

    def to_markdown(self, top: int = 15) -> str:
        la, lb = self.labels
        lines = [f"## Step diff — {la} → {lb}", "", f"| | {la} | {lb} | change |", "|---|---|---|---|"]
        lines += [f"| {name} | {va or '–'} | {vb or '–'} | {ch} |" for name, va, vb, ch in self.headline]
        lines += [""] + [f"- {n}" for n in self.notes]
        for title, rows in ((f"Layers ({self.basis}, self time, all phases; largest change first)", self.layers),
                            (f"Op classes ({self.basis})", self.classes)):
            lines += ["", f"### {title}", "", f"| name | {la} ms | {lb} ms | change ms | {lb}/{la} |",
                      "|---|---|---|---|---|"]
            for r in rows[:top]:
                lines.append(f"| `{r.name or '(root)'}` | {_ms(r.a_s) or '–'} | {_ms(r.b_s) or '–'} | "
                             f"{r.delta_s * 1e3:+.3g} | {_ratio(r.ratio)} |")
            if len(rows) > top:
                rest = rows[top:]
                lines.append(f"| ({len(rest)} more) | {_ms(sum(r.a_s or 0 for r in rest))} | "
                             f"{_ms(sum(r.b_s or 0 for r in rest))} | {sum(r.delta_s for r in rest) * 1e3:+.3g} | |")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        rows = lambda rs: [{"name": r.name, "a_s": r.a_s, "b_s": r.b_s, "delta_s": r.delta_s,  # noqa: E731
                            "ratio": r.ratio} for r in rs]
        return {"labels": list(self.labels), "same_work": self.same_work, "basis": self.basis, "notes": self.notes,
                "headline": [{"figure": n, "a": a, "b": b, "change": c} for n, a, b, c in self.headline],
                "layers": rows(self.layers), "classes": rows(self.classes)}


def _ratio(r: float | None) -> str:
    """B / A: three decimals near 1 (1.005x, 0.953x; three significant figures read "1x"), else 3 figures."""
    if r is None:
        return "–"
    return f"{r:.3f}x" if 0.1 <= r < 10 else f"{r:.3g}x"


def _num(x: float | None, scale: float = 1.0) -> str:
    """``x * scale``, thousands separated (never an exponent); "" when missing."""
    return _n(x * scale) if x is not None else ""


def _ms(s: float | None) -> str:
    return _num(s, 1e3)


def _throughput(summary: dict[str, Any]) -> float | None:
    return summary.get("tokens_per_s") or summary.get("samples_per_s")


def _times(rows: list[Any], timed: bool) -> dict[str, float]:
    return {r.name if r.kind != "layer_total" else r.layer: ((r.measured_s or 0.0) if timed else r.expected_s)
            for r in rows}


def _change(a: float | None, b: float | None, *, lower_better: bool = False, points: bool = False) -> str:
    if a is None or b is None:
        return ""
    if points:
        return f"{round((b - a) * 100, 9) + 0.0:+.3g} pts"  # (rounded: float noise never reads "-7.1e-15 pts")
    if not a:
        return ""
    rel = b / a - 1
    txt = f"{rel:+.1%}"
    if lower_better and b and b != a:
        f = a / b if b < a else b / a  # the factor only where it reads as more than 1.00x
        if f >= 1.005:
            txt += f" ({f:.2f}x {'faster' if b < a else 'slower'})"
    return txt


def _peak(report: RooflineView) -> float | None:
    cats = report.meta.get("memory_categories") or {}
    v = cats.get("step_peak") if isinstance(cats, dict) else None
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def diff_reports(a: RooflineView, b: RooflineView, labels: tuple[str, str] = ("A", "B")) -> StepDiff:
    """Compare two ``RooflineReport``s (module doc)."""
    timed = a.timed and b.timed
    d = StepDiff(a, b, labels, basis="measured op time" if timed else "expected kernel time")
    if not timed:
        d.notes.append("one side is untimed (an analysis): layers and classes compare expected kernel times")
    fa, fb = a.model_flops, b.model_flops  # records.model_flops under each step's attention convention
    conv = [r.meta.get("attention_flops") or "attended" for r in (a, b)]
    if conv[0] != conv[1]:  # the same attention counted two ways: compare the work under one convention
        same = [model_flops([o.record for o in r.op_roofs], "attended") for r in (a, b)]
        d.notes.append(f"model FLOPs count causal attention differently ({conv[0]} vs {conv[1]}): the work is "
                       "compared over the attended pairs, MFU as each step counts it")
    else:
        same = [fa, fb]
    d.same_work = bool(same[0] and same[1] and abs(same[1] / same[0] - 1) <= 0.01)
    if not d.same_work:
        d.notes.append(f"the steps do different work (model FLOPs {fa / 1e9:.4g} vs {fb / 1e9:.4g} GFLOP): compare "
                       "throughput and MFU, not times")
    if a.spec.name != b.spec.name:
        d.notes.append(f"different devices: {a.spec.name} vs {b.spec.name}")
    sa, sb = a.measured_step_s, b.measured_step_s
    if sa is not None and sb is not None and a.step_time_source != b.step_time_source:
        d.notes.append(f"the step times have different bases: {a.step_time_source} vs {b.step_time_source}")
    # MFU is against each step's matrix roof; a measured roof widened where an op beat it differs from step to step:
    # the change is then on the first step's roof
    mfu_b, roof_a, roof_b = b.mfu, a.mfu_peak_flops, b.mfu_peak_flops
    if mfu_b is not None and roof_a and roof_b and abs(roof_b / roof_a - 1) > 1e-3:
        mfu_b = mfu_b * roof_b / roof_a
        d.notes.append(f"the steps' MFU roofs differ ({_num(roof_a, 1e-9)} vs {_num(roof_b, 1e-9)} GFLOP/s): the MFU "
                       f"change is on {labels[0]}'s roof ({labels[1]} there: {mfu_b:.2%})")
    ma, mb = model_summary(a), model_summary(b)
    pa, pb = _peak(a), _peak(b)
    step_a, step_b = sa or a.estimated_step_s, sb or b.estimated_step_s
    d.headline = [
        ("step ms" + ("" if sa is not None and sb is not None else " (expected)"), _ms(step_a), _ms(step_b),
         _change(step_a, step_b, lower_better=True) if d.same_work else "(different work)"),
        ("MFU", fig(a.mfu, ".2%"), fig(b.mfu, ".2%"), _change(a.mfu, mfu_b, points=True)),
        ("model GFLOP per step", _num(fa, 1e-9), _num(fb, 1e-9), _change(fa, fb)),
        ("tokens/s" if ma.get("tokens_per_s") else "samples/s", fig(_throughput(ma), ",.0f"),
         fig(_throughput(mb), ",.0f"), _change(_throughput(ma), _throughput(mb))),
        ("op time ms", _ms((a.op_time_s or 0) if timed else None), _ms((b.op_time_s or 0) if timed else None),
         _change(a.op_time_s, b.op_time_s, lower_better=True) if timed else ""),
        ("ops", str(len(a.op_roofs)), str(len(b.op_roofs)), _change(len(a.op_roofs), len(b.op_roofs))),
    ]
    if pa is not None or pb is not None:
        d.headline.append(("step peak MiB", _num(pa, 2**-20), _num(pb, 2**-20), _change(pa, pb)))
    for attr, rows in (("layers", "layer_totals"), ("classes", "category_rows")):
        ta, tb = _times(getattr(a, rows), timed), _times(getattr(b, rows), timed)
        out = [DiffRow(k, ta.get(k), tb.get(k)) for k in sorted(set(ta) | set(tb))]  # ties by name
        out.sort(key=lambda r: -abs(r.delta_s))
        setattr(d, attr, out)
    return d
