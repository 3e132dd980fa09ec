"""Two profiled steps side by side: did a change help, and where (``tscope diff A.json B.json``, the dashboard's
step diff: one function, :func:`diff_reports`, for both).

HTA's ``TraceDiff`` compares two traces' kernels by name and count. This compares what the reports already know, like
with like: the step time MFU is computed from (the unprofiled steps' median; the expected step time of both when
either side is an estimate), MFU (on the first step's matrix roof when the roofs differ), model FLOPs, samples/s,
tokens/s (only when both steps have tokens), the op time, the number of ops and the step's memory peak; then per
layer (self time, all phases) and per op class the op time (measured; expected kernel time when a side is untimed,
said so), largest change first. When the steps do different work (model FLOPs differ by more than 1%: another batch
shape, model or precision), the step time is not compared and the diff says to read throughput and MFU instead.

**Noise.** Every change is judged against the two steps' own noise, read from their reports:

- step time, and MFU and throughput (the same FLOPs or samples over it): each step's typical deviation of its
  unprofiled steps (``RunContext.step_time_spread_s``, their median absolute deviation), scaled to the figure;
- a layer: the spread (max - min) of its times over the profiled steps each report merged (``noise.spread``; its
  phases' added in quadrature), and on a busy machine at least the steps' typical deviation (``noise.floor_s``), as
  the advice's rule (``analysis.advice``); the op time: every row's spread, added in quadrature (preemptions land on
  ops at random), at least that floor;
- an op class: the busy machine's floor (classes keep no spread of their own); the memory peak: none (allocator
  peaks repeat exactly); counts (FLOPs, ops): not judged.

The noise of a change is the two sides' noise added in quadrature (sqrt(a^2 + b^2), as for the difference of two
independent measurements); a change within it is marked ``noise``, beyond it ``better`` or ``worse``; where either
side's noise was not measured (one profiled step on an idle machine, an estimate) ``unknown``. The per-step deviation
is a conservative basis: the medians compared vary less than one step does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tscope_callbacks.analysis.basis import time_of
from tscope_callbacks.analysis.fmt import (
    bytes_text,
    count_text,
    div,
    flops_text,
    ms_text,
    pct_text,
    ratio_text,
    sig,
    time_text,
)
from tscope_callbacks.analysis.report import ReportData

__all__ = ["Change", "DiffRow", "StepDiff", "diff_reports", "VERDICTS", "SAME_WORK_TOL", "DIFF_TOP"]

#: a change's verdict: beyond the noise and for the better or worse, within the noise, noise not measured, or not
#: judged ("": counts, different work)
VERDICTS = ("better", "worse", "noise", "unknown", "")
SAME_WORK_TOL = 0.01  #: model FLOPs within this relative difference: the same work
DIFF_TOP = 15  #: rows per layer / op class table, in ``tscope diff`` and the page alike (the rest summed in one row)
_WORD = {"better": "better", "worse": "worse", "noise": "within noise", "unknown": "noise not measured", "": ""}


def _rss(a: float | None, b: float | None) -> float | None:
    """The noise of b - a from each side's: added in quadrature; None when either is unknown."""
    return None if a is None or b is None else math.hypot(a, b)


def verdict(delta: float | None, noise: float | None, *, higher_better: bool) -> str:
    """``delta`` (B - A) against ``noise``: "better", "worse", "noise" (within it) or "unknown" (noise not measured);
    "" when there is no change to judge."""
    if delta is None:
        return ""
    if noise is None:
        return "unknown"
    if abs(delta) <= noise:
        return "noise"
    return "better" if (delta > 0) == higher_better else "worse"


def _rel_text(a: float | None, b: float | None, *, lower_better: bool = False) -> str:
    """B against A in percent (two decimals below 10%: "-0.12%", never a long tail); for a time, the factor
    ("1.39x faster") where it reads as more than 1.00x."""
    if a is None or b is None or not a:
        return ""
    p = round((b / a - 1) * 100, 9)  # float noise never reads -10.00% where it is -10%
    txt = ("+" if p >= 0 else "-") + (f"{abs(p):.2f}" if abs(p) < 10 else sig(abs(p))) + "%"
    if lower_better and b and b != a:
        f = a / b if b < a else b / a
        if f >= 1.005:
            txt += f" ({f:.2f}x {'faster' if b < a else 'slower'})" if f < 10 else f" ({sig(f)}x {'faster' if b < a else 'slower'})"
    return txt


def _signed_ms(s: float) -> str:
    t = ms_text(s)
    return t if t.startswith("-") or t == "–" else "+" + t


@dataclass(frozen=True)
class Change:
    """One headline figure: A, B (in ``unit``), the change as read, its noise (in ``unit``; None: not measured)
    and the verdict (:data:`VERDICTS`)."""

    figure: str
    unit: str  #: "s" | "fraction" | "FLOP" | "samples/s" | "tokens/s" | "count" | "bytes"
    a: float | None
    b: float | None
    change: str
    noise: float | None
    verdict: str

    def text(self, x: float | None) -> str:
        """A value of this figure as the diff prints it."""
        if x is None:
            return "–"
        if self.unit == "s":
            return time_text(x)
        if self.unit == "fraction":
            return pct_text(x)
        if self.unit == "FLOP":
            return flops_text(x)
        if self.unit == "bytes":
            return bytes_text(x)
        return count_text(x)

    @property
    def noise_text(self) -> str:
        if not self.noise:  # not measured, or none (a memory peak): no "±0 B"
            return ""
        return f"{sig(self.noise * 100)} pts" if self.unit == "fraction" else self.text(self.noise)

    def to_dict(self) -> dict[str, Any]:
        return {"figure": self.figure, "unit": self.unit, "a": self.a, "b": self.b, "a_text": self.text(self.a),
                "b_text": self.text(self.b), "change": self.change, "noise": self.noise,
                "noise_text": self.noise_text, "verdict": self.verdict}


@dataclass(frozen=True)
class DiffRow:
    """One layer or op class: its time in A and in B (seconds; None when absent on that side) and the noise of
    the change (seconds; None: not measured)."""

    name: str
    a_s: float | None
    b_s: float | None
    noise_s: float | None = None

    @property
    def delta_s(self) -> float:
        return (self.b_s or 0.0) - (self.a_s or 0.0)

    @property
    def ratio(self) -> float | None:
        """B / A (below 1: faster in B)."""
        return div(self.b_s, self.a_s) if self.a_s and self.b_s is not None else None

    @property
    def verdict(self) -> str:
        return verdict(self.delta_s, self.noise_s, higher_better=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "a_s": self.a_s, "b_s": self.b_s, "delta_s": self.delta_s, "ratio": self.ratio,
                "noise_s": self.noise_s, "verdict": self.verdict, "a": ms_text(self.a_s), "b": ms_text(self.b_s),
                "change": _signed_ms(self.delta_s), "ratio_text": ratio_text(self.ratio) if self.ratio is not None
                else "", "noise_text": ms_text(self.noise_s) + " ms" if self.noise_s is not None else ""}


def _rest(rows: tuple[DiffRow, ...]) -> dict[str, Any]:
    """The rows past the top ones, summed once each."""
    a = sum(r.a_s or 0.0 for r in rows)
    b = sum(r.b_s or 0.0 for r in rows)
    return {"n": len(rows), "a_s": a, "b_s": b, "delta_s": b - a, "a": ms_text(a), "b": ms_text(b),
            "change": _signed_ms(b - a), "ratio_text": ratio_text(b / a) if a > 0 and b > 0 else ""}


@dataclass(frozen=True)
class StepDiff:
    """The comparison of two reports (``labels``: before, after)."""

    labels: tuple[str, str]
    basis: str  #: "measured op time" | "expected kernel time" (the layers' and classes' times)
    same_work: bool
    notes: tuple[str, ...]
    headline: tuple[Change, ...]
    layers: tuple[DiffRow, ...]  #: largest |change| first
    classes: tuple[DiffRow, ...]

    def change(self, figure: str) -> Change | None:
        """The headline figure named ``figure`` ("step time", "MFU", "samples/s", ...; its row may say more: "MFU
        (expected)", "MFU on A's roof"), or None."""
        return next((c for c in self.headline if c.figure == figure or c.figure.startswith((figure + " (",
                                                                                             figure + " on "))), None)

    def tables(self) -> tuple[tuple[str, tuple[DiffRow, ...]], ...]:
        return ((f"Layers ({self.basis}, self time, all phases; largest change first)", self.layers),
                (f"Op classes ({self.basis})", self.classes))

    def to_markdown(self, top: int = DIFF_TOP) -> str:
        la, lb = self.labels
        lines = [f"## Step diff — {la} → {lb}", "", f"| | {la} | {lb} | change | noise | |", "|---|---|---|---|---|---|"]
        lines += [f"| {c.figure} | {c.text(c.a)} | {c.text(c.b)} | {c.change} | "
                  f"{'±' + c.noise_text if c.noise_text else ''} | {_WORD[c.verdict]} |" for c in self.headline]
        lines += [""] + [f"- {n}" for n in self.notes]
        for title, rows in self.tables():
            lines += ["", f"### {title}", "", f"| name | {la} ms | {lb} ms | change ms | ratio (B/A) | |",
                      "|---|---|---|---|---|---|"]
            for r in rows[:top]:
                d = r.to_dict()
                lines.append(f"| `{r.name or '(root)'}` | {d['a']} | {d['b']} | {d['change']} | "
                             f"{d['ratio_text'] or '–'} | {_WORD[r.verdict]} |")
            if len(rows) > top:
                m = _rest(rows[top:])
                lines.append(f"| ({m['n']} more) | {m['a']} | {m['b']} | {m['change']} | {m['ratio_text'] or '–'} | |")
        return "\n".join(lines)

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """JSON-safe; ``top``: rows per table (the rest summed in ``more``; None: every row)."""
        def part(title: str, rows: tuple[DiffRow, ...]) -> dict[str, Any]:
            n = len(rows) if top is None else top
            return {"title": title, "rows": [r.to_dict() for r in rows[:n]],
                    "more": _rest(rows[n:]) if len(rows) > n else None}

        (lt, lr), (ct, cr) = self.tables()
        return {"labels": list(self.labels), "basis": self.basis, "same_work": self.same_work,
                "notes": list(self.notes), "headline": [c.to_dict() for c in self.headline],
                "layers": part(lt, lr), "classes": part(ct, cr)}


# ------------------------------------------------------------------------------------------------------ the rules
def _value(r: ReportData, key: str) -> float | None:
    f = r.header.get(key)
    v = f.value if f is not None else None
    return float(v) if v is not None and math.isfinite(v) and v > 0 else None


def _throughput(r: ReportData, key: str, measured: bool) -> float | None:
    """``samples_per_s`` / ``tokens_per_s`` on the diff's step basis: the header's is per the measured step where the
    report has one; where the diff compares expected steps (a side is untimed), per the expected step, as its step
    time row (an analysis against a measured step printed the expected 32.9 ms beside the measured step's 320 samples/s)."""
    v = _value(r, key)
    s = r.summary
    if v is not None and not measured and s.measured_step_s and s.estimated_step_s:
        v *= s.measured_step_s / s.estimated_step_s
    return v


def _step_noise(r: ReportData, measured: bool) -> float | None:
    """The step time's noise: the typical deviation of its unprofiled steps (an estimate has none)."""
    return r.context.step_time_spread_s if measured else None


def _floor(r: ReportData) -> float | None:
    return r.noise.floor_s if r.noise.floor_s > 0 else None


def _rows_noise(r: ReportData, layer: str | None) -> float | None:
    """A layer's (``layer`` None: all rows') spread over the profiled steps, at least the busy machine's floor;
    None when the report merged one step and the machine was idle (nothing measured)."""
    if r.noise.steps < 2:
        return _floor(r)
    spread = math.sqrt(sum(float(s[2]) ** 2 for s in r.noise.spread if layer is None or s[0] == layer))
    return max(spread, r.noise.floor_s)


def _scaled_noise(value: float | None, step_s: float | None, step_noise: float | None) -> float | None:
    """The noise of a figure proportional to 1 / step time (MFU, throughput): value x relative step noise."""
    if value is None or not step_s or step_noise is None:
        return None
    return value * step_noise / step_s


def _times(rows: tuple[Any, ...], timed: bool, key: str) -> dict[str, float | None]:
    return {getattr(r, key): time_of(r, timed) for r in rows}


def _same_work(a: ReportData, b: ReportData, notes: list[str]) -> bool:
    """Whether the two steps do the same work (model FLOPs within ``SAME_WORK_TOL``; on the FLOPs that ran when the
    steps count causal attention differently), with the notes that say on what basis."""
    sa, sb = a.summary, b.summary
    fa, fb = sa.model_flops, sb.model_flops
    conv = [r.context.attention_flops or "attended" for r in (a, b)]
    if conv[0] != conv[1]:  # the same attention counted two ways: the work is compared on what ran
        work = (sa.hardware_flops, sb.hardware_flops)
        notes.append(f"model FLOPs count causal attention differently ({conv[0]} vs {conv[1]}): the work is "
                     "compared on the FLOPs that ran (hardware FLOPs), MFU as each step counts it")
    else:
        work = (fa, fb)
    same_work = bool(work[0] and work[1] and abs(work[1] / work[0] - 1) <= SAME_WORK_TOL)
    if not same_work:
        notes.append(f"the steps do different work (model FLOPs {flops_text(fa)} vs {flops_text(fb)}): compare "
                     "throughput and MFU, not times")
    if sa.device != sb.device:
        notes.append(f"different devices: {sa.device} vs {sb.device}")
    return same_work


def _step_changes(a: ReportData, b: ReportData, labels: tuple[str, str], same_work: bool,
                  notes: list[str]) -> list[Change]:
    """Step time, MFU and throughput, like with like: both measured steps, else both expected ones; MFU against
    each step's matrix roof (where the roofs differ, the change is read on the first step's roof); samples/s with
    samples/s, tokens/s only when both steps have tokens. Each with its noise from the steps' own spread."""
    sa, sb = a.summary, b.summary
    measured = sa.measured_step_s is not None and sb.measured_step_s is not None
    if measured and sa.step_time_source != sb.step_time_source:
        notes.append(f"the step times have different bases: {sa.step_time_source} vs {sb.step_time_source}")
    step_a = sa.measured_step_s if measured else sa.estimated_step_s
    step_b = sb.measured_step_s if measured else sb.estimated_step_s
    na, nb = _step_noise(a, measured), _step_noise(b, measured)
    step_noise = _rss(na, nb)
    name = "step time" + ("" if measured else " (expected)")
    head = [Change(name, "s", step_a, step_b, _rel_text(step_a, step_b, lower_better=True), step_noise,
                   verdict(step_b - step_a if step_a and step_b else None, step_noise, higher_better=False))
            if same_work else Change(name, "s", step_a, step_b, "(different work)", step_noise, "")]
    mfu_a, mfu_b = (sa.mfu, sb.mfu) if measured else (sa.estimated_mfu, sb.estimated_mfu)
    mfu_b_on_a = mfu_b
    if mfu_b is not None and sa.mfu_peak_flops and sb.mfu_peak_flops and \
            abs(sb.mfu_peak_flops / sa.mfu_peak_flops - 1) > 1e-3:
        mfu_b_on_a = mfu_b * sb.mfu_peak_flops / sa.mfu_peak_flops
        notes.append(f"the steps' MFU roofs differ ({flops_text(sa.mfu_peak_flops)}/s vs "
                     f"{flops_text(sb.mfu_peak_flops)}/s): the MFU row is on {labels[0]}'s roof ({labels[1]} on its "
                     f"own roof: {pct_text(mfu_b)})")
    d_mfu = None if mfu_a is None or mfu_b_on_a is None else round(mfu_b_on_a - mfu_a, 12)
    mfu_noise = _rss(_scaled_noise(mfu_a, step_a, na), _scaled_noise(mfu_b_on_a, step_b, nb))
    # the row shows the two figures its change is the difference of: where the roofs differ, B's MFU on A's roof
    # (its own is in the note), never B's own beside a change computed on another roof
    on_roof = f" on {labels[0]}'s roof" if mfu_b_on_a is not mfu_b else ""
    head.append(Change("MFU" + ("" if measured else " (expected)") + on_roof, "fraction", mfu_a, mfu_b_on_a,
                       "" if d_mfu is None else ("+" if d_mfu >= 0 else "") + sig(d_mfu * 100) + " pts",
                       mfu_noise, verdict(d_mfu, mfu_noise, higher_better=True)))
    fa, fb = sa.model_flops, sb.model_flops
    head.append(Change("model FLOPs per step", "FLOP", float(fa), float(fb), _rel_text(fa, fb), None, ""))
    for key, unit in (("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s")):
        ta, tb = _throughput(a, key, measured), _throughput(b, key, measured)
        if key == "tokens_per_s" and (ta is None or tb is None):
            if (ta is None) != (tb is None):
                notes.append(f"tokens/s is not compared: only {labels[0] if ta is not None else labels[1]} has "
                             "tokens")
            continue
        if ta is None and tb is None:
            continue
        noise = _rss(_scaled_noise(ta, step_a, na), _scaled_noise(tb, step_b, nb))
        name = unit + ("" if measured else " (expected)")
        if not same_work:  # another model or batch: its throughput is no better or worse than this one's
            head.append(Change(name, unit, ta, tb, "(different work)", noise, ""))
            continue
        head.append(Change(name, unit, ta, tb, _rel_text(ta, tb), noise,
                           verdict(tb - ta if ta is not None and tb is not None else None, noise, higher_better=True)))
    return head


def diff_reports(a: ReportData, b: ReportData, labels: tuple[str, str] = ("A", "B")) -> StepDiff:
    """Compare two step reports, ``a`` before and ``b`` after (module doc)."""
    notes: list[str] = []
    sa, sb = a.summary, b.summary
    timed = sa.timed and sb.timed
    basis = "measured op time" if timed else "expected kernel time"
    if not timed:
        notes.append("one side is untimed (an analysis): step time and MFU are the expected ones, layers and classes "
                     "compare expected kernel times")
    same_work = _same_work(a, b, notes)
    for label, r in zip(labels, (a, b)):
        w = r.what_if
        if w is not None:  # times of one device on another's roofs: MFU and % of roof are a what-if
            notes.append(f"{label} is a what-if: times measured on {w.measured_on} placed on the roofs of "
                         f"{w.roofs_of} (its MFU and % of roof compare two devices)")
    head = _step_changes(a, b, labels, same_work, notes)
    if timed:
        oa, ob = sa.op_time_s or 0.0, sb.op_time_s or 0.0
        noise = _rss(_rows_noise(a, None), _rows_noise(b, None))
        head.append(Change("op time", "s", oa, ob, _rel_text(oa, ob, lower_better=True), noise,
                           verdict(ob - oa, noise, higher_better=False)) if same_work else
                    Change("op time", "s", oa, ob, "(different work)", noise, ""))
    head.append(Change("ops", "count", float(sa.n_ops), float(sb.n_ops), _rel_text(sa.n_ops, sb.n_ops), None, ""))
    pa, pb = _value(a, "memory_peak_bytes"), _value(b, "memory_peak_bytes")
    if (pa is None) != (pb is None):  # one side's "–" says why: the peak is measured with layer details only
        notes.append(f"{labels[0] if pa is None else labels[1]} has no step memory peak: it is measured in a step "
                     "profiled with layer details (a LayerProfilerCallback's)")
    if pa is not None or pb is not None:
        if pa is not None and pa == pb:  # allocator peaks repeat exactly: an equal one is unchanged, not "within noise"
            head.append(Change("step memory peak", "bytes", pa, pb, "unchanged", 0.0, ""))
        else:
            head.append(Change("step memory peak", "bytes", pa, pb, _rel_text(pa, pb), 0.0 if pa and pb else None,
                               verdict(pb - pa if pa is not None and pb is not None else None, 0.0,
                                       higher_better=False)))
    # per layer (self time, all phases) and per op class
    la, lb = _times(a.rows["layer"], timed, "layer"), _times(b.rows["layer"], timed, "layer")
    layers = [DiffRow(k, la.get(k), lb.get(k), _rss(_rows_noise(a, k), _rows_noise(b, k)))
              for k in sorted(set(la) | set(lb))]
    ca, cb = _times(a.rows["category"], timed, "name"), _times(b.rows["category"], timed, "name")
    floor = _rss(_floor(a), _floor(b))
    classes = [DiffRow(k, ca.get(k), cb.get(k), floor) for k in sorted(set(ca) | set(cb))]
    layers.sort(key=lambda r: -abs(r.delta_s))  # stable: ties stay by name
    classes.sort(key=lambda r: -abs(r.delta_s))
    if timed and not any(x.verdict in ("better", "worse", "noise") for x in layers):
        notes.append("the layers' noise was not measured (a report of one profiled step, with no busy-machine "
                     "floor): their changes are not judged")
    return StepDiff(tuple(labels), basis, same_work, tuple(notes), tuple(head), tuple(layers), tuple(classes))
