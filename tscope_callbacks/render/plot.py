"""Log-log roofline plot of a :class:`~tscope_callbacks.analysis.report.ReportData`.

Built on ``matplotlib.figure.Figure`` with the Agg canvas (never ``pyplot``): thread-safe, no global figures left
behind, usable from a callback (``figure(report)`` for sinks that call ``add_figure``).
x = arithmetic intensity (FLOP/B), y = attained FLOP/s (TFLOP/s; GFLOP/s under a CPU's roofs); one point per layer x
phase, size by its share of step time; memory slope, one flat roof per precision in the profile (matrix solid, vector
dashed, achievable dotted), ridge points marked. Untimed profiles plot their expected times (the shape-aware kernel estimates: on the roof, or
below it where the kernel model expects a shortfall, as the dashboard draws them) as hollow markers.
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from tscope_callbacks.analysis.basis import time_of
from tscope_callbacks.analysis.fmt import bw_text, pct_text, rate_text, sig, time_text
from tscope_callbacks.analysis.report import ReportData, RoofUsed
from tscope_callbacks.analysis.roofs import roof_bandwidth
from tscope_callbacks.capture.paths import ancestors
from tscope_callbacks.records import LayerRecord

__all__ = ["figure", "plot", "card_figure", "card_layer_bars", "bar_rows", "displayed_font_px", "unused_bandwidth_label",
           "CARD_WIDTH_PX", "CARD_HEIGHT_PX", "PHASE_COLORS", "PRECISION_COLORS"]

PHASE_COLORS = {"forward": "#1f77b4", "backward": "#ff7f0e", "recompute": "#9467bd", "optimizer": "#2ca02c"}
PRECISION_COLORS = {"bf16": "#d62728", "fp16": "#e377c2", "tf32": "#17becf", "fp32": "#8c564b", "fp64": "#7f7f7f",
                    "fp8": "#bcbd22", "int8": "#9467bd"}
_SHORT = {"forward": "fwd", "backward": "bwd", "recompute": "recomp", "optimizer": "opt"}


def _points(report: ReportData) -> list[dict[str, Any]]:
    """Plottable layer x phase rows: positive FLOPs and bytes; y from measured time (untimed: the expected,
    shape-aware kernel time, the dashboard's basis too)."""
    total = (report.summary.op_time_s if report.timed else report.summary.estimated_step_s) or 0.0
    pts = []
    for r in report.rows["layer_phase"]:
        t = time_of(r, report.timed)
        if r.flops <= 0 or r.bytes <= 0 or not t:
            continue
        pts.append({"row": r, "x": r.flops / r.bytes, "y": r.flops / t / 1e12, "share": t / total if total else 0.0,
                    "label": f"{r.name} ({_SHORT.get(r.phase, r.phase)})"})
    return pts


def _scatter_phases(ax: Any, pts: list[dict[str, Any]], timed: bool, *, size: tuple[float, float],
                    widths: tuple[float, float], short: bool) -> None:
    """The points, one scatter per phase (known phases first, in their order), sized ``size[0] + size[1] x`` their
    share of the step; untimed: hollow with black edges (``widths``: timed, untimed edge width); labelled by phase
    (``short``: "fwd", "bwd", ...)."""
    present = {p["row"].phase for p in pts}
    for phase in [ph for ph in PHASE_COLORS if ph in present] + sorted(present - set(PHASE_COLORS)):
        sel = [p for p in pts if p["row"].phase == phase]
        c = PHASE_COLORS.get(phase, "0.5")
        ax.scatter([p["x"] for p in sel], [p["y"] for p in sel], s=[size[0] + size[1] * p["share"] for p in sel],
                   facecolors=c if timed else "none", edgecolors=c if not timed else "black",
                   linewidths=widths[0] if timed else widths[1], alpha=0.75 if timed else 1.0, zorder=3,
                   label=_SHORT.get(phase, phase) if short else phase)


def _groups(ax: Any, pts: list[dict[str, Any]], px: float) -> list[list[dict[str, Any]]]:
    """Points of one phase within 4 px of each other (repeated blocks) share a label; largest groups first."""
    groups: list[list[dict[str, Any]]] = []
    for p in sorted(pts, key=lambda p: -p["share"]):
        x, y = ax.transData.transform((p["x"], p["y"]))
        p["px"] = (x, y)
        for g in groups:
            gx, gy = g[0]["px"]
            if g[0]["row"].phase == p["row"].phase and abs(gx - x) < 4 * px and abs(gy - y) < 4 * px:
                g.append(p)
                break
        else:
            groups.append([p])
    return sorted(groups, key=lambda g: -sum(p["share"] for p in g))


def _group_label(g: list[dict[str, Any]]) -> str:
    """One point: "name (phase)"; repeated blocks: "layers.*.mlp (bwd) ×12" (numeric path parts starred)."""
    if len(g) == 1:
        return g[0]["label"]
    r = g[0]["row"]
    pats = sorted({re.sub(r"(?:(?<=\.)|^)\d+(?=\.|$)", "*", p["row"].name) for p in g})
    name = ", ".join(pats) if len(pats) <= 2 else f"{pats[0]} +{len(pats) - 1}"
    return f"{name} ({_SHORT.get(r.phase, r.phase)}) ×{len(g)}"


def _shorten(label: str, max_chars: int) -> str:
    """A long "a.b.c.d (bwd) ×2" label as its last path parts: "…c.d (bwd) ×2"."""
    name, sep, tail = label.partition(" (")
    parts = name.split(".")
    while len(parts) > 1 and len(".".join(parts)) + len(sep + tail) + 1 > max_chars:
        parts.pop(0)
    short = ".".join(parts)
    return (short if short == name else "…" + short) + sep + tail


def _place_labels(ax: Any, fig: Figure, pts: list[dict[str, Any]], n: int, fontsize: float = 8,
                  marker: tuple[float, float] = (25, 900), max_chars: int | None = None) -> None:
    """Label the n largest points (or groups of coinciding ones): per label, the first candidate offset whose drawn
    box stays inside the axes and overlaps no marker, text, legend or earlier label; a label with no such place is
    left out (an overlapping label is unreadable, and it hides what it overlaps). The boxes are the drawn text's own
    extents (the limits and the axes box are fixed)."""
    px = fig.dpi / 72.0
    renderer = fig.canvas.get_renderer()
    legends = [a for a in ax.get_children() if isinstance(a, Legend)] + list(fig.legends)
    boxes = [tuple(a.get_window_extent(renderer).extents) for a in list(ax.texts) + legends]
    for p in pts:  # the markers themselves are obstacles too
        x, y = ax.transData.transform((p["x"], p["y"]))
        r = math.sqrt(marker[0] + marker[1] * p["share"]) / 2 * px
        boxes.append((x - r, y - r, x + r, y + r))
    soft = []  # the flat roofs: a label avoids them where it can (a compute-bound point's label lands on them first)
    for ln in ax.get_lines():
        xs, ys = ln.get_xdata(), ln.get_ydata()
        if len(xs) == 2 and ys[0] == ys[1]:
            (x0, y0), (x1, _) = ax.transData.transform([(xs[0], ys[0]), (xs[1], ys[1])])
            soft.append((x0, y0 - 2 * px, x1, y0 + 2 * px))
    ax0, ay0, ax1, ay1 = ax.get_window_extent(renderer).extents
    offsets = [(8, 6), (8, -14), (-8, 6), (-8, -14), (14, 22), (14, -30), (-14, 22), (-14, -30), (24, 38), (24, -46),
               (-24, 38), (-24, -46), (0, 54), (0, -62), (-40, 20), (-40, -28)]

    def overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
        return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])

    def place(p: dict[str, Any], label: str, dx: int, dy: int) -> tuple[Any, tuple[float, ...] | None]:
        """The label at offset (dx, dy), and its box when it is inside the axes and covers no hard obstacle."""
        note = ax.annotate(label, (p["x"], p["y"]), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                           ha="right" if dx < 0 else "left", va="bottom", zorder=4)
        box = tuple(note.get_window_extent(renderer).extents)
        inside = ax0 <= box[0] and box[2] <= ax1 and ay0 <= box[1] and box[3] <= ay1
        return note, box if inside and not any(overlaps(box, b) for b in boxes) else None

    for g in _groups(ax, pts, px)[:n]:
        p, label = g[0], _group_label(g)
        if max_chars:
            label = _shorten(label, max_chars)
        fallback = None
        for dx, dy in offsets:  # the first free place; else the first that only crosses a roof line
            note, box = place(p, label, dx, dy)
            note.remove()
            if box is not None and not any(overlaps(box, b) for b in soft):
                fallback = (dx, dy, box)
                break
            if box is not None and fallback is None:
                fallback = (dx, dy, box)
        if fallback is not None:
            dx, dy, box = fallback
            ax.annotate(label, (p["x"], p["y"]), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                        ha="right" if dx < 0 else "left", va="bottom", zorder=4,
                        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.4"} if abs(dy) > 10 else None)
            boxes.append(box)


def _phase_key(ax: Any, fig: Figure, pts: list[dict[str, Any]], **kw: Any) -> Legend:
    """The phases' key in the first corner where it covers no point and no roof line (sampled along each line),
    else where it covers the fewest (matplotlib's "best" counts a line's two vertices, not the slope between them,
    and put the key on the memory roof)."""
    renderer = fig.canvas.get_renderer()
    marks = ax.transData.transform([(p["x"], p["y"]) for p in pts])
    line_pts = []
    for ln in ax.get_lines():
        xs, ys = ln.get_xdata(), ln.get_ydata()
        for i in range(len(xs) - 1):  # along each segment, evenly in the log-log display
            for f in (j / 40 for j in range(41)):
                x = xs[i] ** (1 - f) * xs[i + 1] ** f
                y = ys[i] ** (1 - f) * ys[i + 1] ** f
                line_pts.append(ax.transData.transform((x, y)))
    best: tuple[int, str] | None = None
    for loc in ("lower right", "upper left", "lower left", "center right", "upper right"):
        leg = ax.legend(loc=loc, **kw)
        b = leg.get_window_extent(renderer)
        covered = sum(b.contains(x, y) for x, y in marks) * 10 + sum(b.contains(x, y) for x, y in line_pts)
        if best is None or covered < best[0]:
            best = (covered, loc)
        if covered == 0:
            return leg
    assert best is not None
    return ax.legend(loc=best[1], **kw)


def _limits(pts: list[dict[str, Any]], roofs: Sequence[RoofUsed], bw: float) -> tuple[float, float, float, float]:
    """(x_lo, x_hi, y_lo, y_hi): decades around the points and the ridges."""
    xs = [p["x"] for p in pts] + [r.ridge for r in roofs]
    ys = [p["y"] for p in pts] + [r.peak_flops / 1e12 for r in roofs]
    xs = xs or [1.0]
    ys = ys or [bw / 1e12]
    x_lo = 10 ** math.floor(math.log10(min(xs) / 3))
    x_hi = 10 ** math.ceil(math.log10(max(xs) * 3))
    y_hi = max(ys) * 4
    y_lo = min(min(ys) / 3, x_lo * min(bw, roof_bandwidth(roofs, bw)) / 1e12)
    return x_lo, x_hi, max(y_lo, y_hi * 1e-7), y_hi


def _y_axis(ax: Any, roofs: Sequence[RoofUsed], pts: list[dict[str, Any]]) -> str:
    """Format the y axis (drawn in TFLOP/s) in the unit its roofs read in: GFLOP/s where the highest roof (or point,
    without roofs) is under 1 TFLOP/s (a CPU's: ticks of 0.001 TFLOP/s read as 1 GFLOP/s); returns the unit."""
    top = max([r.peak_flops / 1e12 for r in roofs] or [p["y"] for p in pts] or [1.0])
    unit, k = ("GFLOP/s", 1e3) if top < 1 else ("TFLOP/s", 1.0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v * k:g}"))
    return unit


def unused_bandwidth_label(bw: float, measured: bool, *, short: bool = False) -> str:
    """The dashed line of the device's bandwidth when an op beat it (the roofs drawn use the widened one): the
    dashboard's words (``short``: a card's)."""
    return f"{'measured' if measured else 'datasheet'} {bw_text(bw)} (not used" + (")" if short else ": an op beat it)")


def _draw_roofs(ax: Any, roofs: Sequence[RoofUsed], bw: float, x_lo: float, x_hi: float,
                ridge_fontsize: float | None = 7, *, measured: bool = False) -> list[Line2D]:
    """The memory slope up to the highest ridge, then one flat roof per precision from its ridge (achievable roofs
    dotted); returns the legend handles, named as the dashboard names them (``measured``: the device's roofs were
    measured on this machine)."""
    ridge_max = max((r.ridge for r in roofs), default=x_hi)
    used = roof_bandwidth(roofs, bw)
    ax.plot([x_lo, ridge_max], [x_lo * used / 1e12, ridge_max * used / 1e12], color="0.2", lw=1.8)
    handles = [Line2D([], [], color="0.2", lw=1.8, label=f"memory {bw_text(used)}")]
    if used != bw and bw > 0:  # the device's (measured / datasheet) bandwidth the roof was widened from: dashed
        top = max((r.peak_flops for r in roofs), default=bw * x_hi)
        ax.plot([x_lo, top / bw], [x_lo * bw / 1e12, top / 1e12], color="0.45", lw=1.2, ls="--")
        handles.append(Line2D([], [], color="0.45", lw=1.2, ls="--", label=unused_bandwidth_label(bw, measured)))
    ridges: set[tuple[float, float]] = set()
    labelled: list[tuple[float, float]] = []  # (ridge, peak) of the ridge labels drawn so far
    for r in roofs:
        c = PRECISION_COLORS.get(r.precision, "0.5")
        ls = "-" if r.matrix else "--"
        peak = r.peak_flops / 1e12
        ax.plot([r.ridge, x_hi], [peak, peak], color=c, lw=1.8, ls=ls)
        if (r.ridge, peak) not in ridges:  # a matrix and a vector roof at one peak (a CPU's) share their ridge: once
            ridges.add((r.ridge, peak))
            ax.plot([r.ridge], [peak], marker="o", ms=5, color=c)
            if ridge_fontsize:
                # ridges close on both axes (a CPU's matrix and vector roofs a few percent apart) would print their
                # labels over each other: each one more stacks a line higher
                near = sum(1 for x, y in labelled if 1 / 1.6 < r.ridge / x < 1.6 and 1 / 1.6 < peak / y < 1.6)
                labelled.append((r.ridge, peak))
                ax.annotate(f"ridge {sig(r.ridge)}", (r.ridge, peak), xytext=(-4, 4 + near * 1.8 * ridge_fontsize),
                            textcoords="offset points", fontsize=ridge_fontsize, ha="right", color=c)
        kind = "matrix" if r.matrix else "vector"
        handles.append(Line2D([], [], color=c, ls=ls, lw=1.8, label=f"{r.precision} {kind} {rate_text(r.peak_flops)}"))
        a_peak, a_bw = r.achievable_peak_flops, r.achievable_bandwidth
        if a_peak and a_bw:
            a_ridge = a_peak / a_bw
            ax.plot([x_lo, a_ridge, x_hi], [x_lo * a_bw / 1e12, a_peak / 1e12, a_peak / 1e12], color=c, ls=":",
                    lw=1.4)
            handles.append(Line2D([], [], color=c, ls=":", lw=1.4,
                                  label=f"{r.precision} achievable {rate_text(a_peak)}, {bw_text(a_bw)}"))
    return handles


def figure(report: ReportData, top_labels: int = 8, *, figsize: tuple[float, float] = (10, 6), dpi: int = 120) -> Figure:
    """The roofline as a standalone :class:`~matplotlib.figure.Figure` (Agg canvas attached; no pyplot state)."""
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.08, right=0.965, bottom=0.09, top=0.9)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    roofs = report.roofs
    bw = report.summary.bandwidth
    pts = _points(report)
    x_lo, x_hi, y_lo, y_hi = _limits(pts, roofs, bw)
    handles = _draw_roofs(ax, roofs, bw, x_lo, x_hi, measured=report.device.measured)

    timed = report.timed
    _scatter_phases(ax, pts, timed, size=(25, 900), widths=(0.8, 1.6), short=False)
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    unit = _y_axis(ax, roofs, pts)
    ax.set_xlabel("arithmetic intensity (FLOP/B)")
    ax.set_ylabel(f"attained performance ({unit})" + ("" if timed else " — estimated"))
    ax.grid(True, which="major", color="0.9", lw=0.6)
    s = report.summary
    title = " · ".join(str(v) for v in (s.device, s.model, f"step {s.step}" if s.step is not None
                                        else None) if v)
    if timed:
        sub = (f"MFU {pct_text(s.mfu)} ({s.mfu_precision}) · MBU {pct_text(s.mbu)} · measured "
               f"{time_text(s.measured_step_s)} ({s.step_time_basis_text}) · roofline estimate "
               f"{time_text(s.estimated_step_s)}")
    else:
        sub = f"untimed: estimates (hollow) · estimated step {time_text(s.estimated_step_s)}"
    ax.set_title(f"Roofline — {title}\n{sub}", fontsize=11)
    leg = ax.legend(handles=handles, loc="upper left", fontsize=8, title="roofs", title_fontsize=8)
    ax.add_artist(leg)
    if pts:
        ph = ax.legend(loc="lower right", fontsize=8, title="layer x phase (size = time share)", title_fontsize=8,
                       markerscale=0.5)
        for h in ph.legend_handles:
            h.set_sizes([40])
    if pts:
        _place_labels(ax, fig, pts, top_labels)
    skipped = len(report.rows["layer_phase"]) - len(pts)
    notes = [n.replace("`", "") for n in report.context.roof_notes]
    if notes and roof_bandwidth(roofs, bw) != bw:
        notes.append(f"MBU uses the device's {bw_text(bw)}; % of roof and the roofs drawn use the widened "
                     f"{bw_text(roof_bandwidth(roofs, bw))}")
    if notes:  # why a roof was widened / beaten, under the x label (7 pt: about 170 characters a line at 10 in)
        lines = [ln for n in notes for ln in textwrap.wrap("Roof note: " + n, 170, subsequent_indent="    ")]
        # room for every line under the x label, the "not shown" line's too (without it the label sat on the first)
        fig.subplots_adjust(bottom=0.09 + 0.022 * (len(lines) + (1 if skipped else 0)))
        for i, ln in enumerate(reversed(lines)):
            fig.text(0.01, 0.01 + 0.022 * (i + (1 if skipped else 0)), ln, fontsize=7, color="0.3")
    if skipped:
        fig.text(0.01, 0.01, f"not shown: {skipped} layer x phase row{'s' if skipped > 1 else ''} without FLOPs or "
                 "bytes (uncounted / views)", fontsize=7, color="0.4")
    return fig


def plot(report: ReportData, path: str | os.PathLike[str], top_labels: int = 8) -> str:
    """Write the roofline PNG (10x6 in at 120 dpi) to ``path``; returns the path."""
    fig = figure(report, top_labels=top_labels)
    fig.savefig(os.fspath(path), dpi=fig.dpi)
    return os.fspath(path)


#: what a layer bar measures: its ops and those of its sub-layers that are not listed themselves (a listing cut at a
#: depth leaves them out); the self time where every layer is listed
BAR_BASIS = "time without listed sub-layers (ms)"


def bar_rows(layers: Mapping[str, LayerRecord], top: int) -> list[tuple[LayerRecord, float, float]]:
    """The ``top`` layers of ``layers`` by their forward + backward time without their listed sub-layers (each
    listed layer's inclusive time less its nearest listed descendants': the listed layers split the step between
    them, and under a depth cut (``LayerProfilerCallback(depth=3)``) a listed block carries its sub-layers' time
    instead of dropping out of the chart), largest last (a bar chart's top row), as (layer, forward s, backward s);
    the root and layers with no time left out."""
    inner_f: dict[str, float] = {}
    inner_b: dict[str, float] = {}
    for p, L in layers.items():
        if not p:
            continue
        parent = next((a for a in ancestors(p)[1:] if a in layers), None)
        if parent:
            inner_f[parent] = inner_f.get(parent, 0.0) + L.forward_s
            inner_b[parent] = inner_b.get(parent, 0.0) + L.backward_s
    rows = []
    for p, L in layers.items():
        f, b = max(0.0, L.forward_s - inner_f.get(p, 0.0)), max(0.0, L.backward_s - inner_b.get(p, 0.0))
        if p and (f or b):
            rows.append((L, f, b))
    rows.sort(key=lambda r: -(r[1] + r[2]))
    return rows[:top][::-1]


def layer_bars(layers: Mapping[str, LayerRecord], top: int = 15, *, dpi: int = 110) -> Figure:
    """Per-layer forward/backward time and memory as horizontal bars, largest first: the layer-level picture beside
    the roofline. ``layers``: ``{path: LayerRecord}``; the ``top`` layers by their time without their listed
    sub-layers (:func:`bar_rows`). Memory: output MiB and, with layer details, saved MiB."""
    picked = bar_rows(layers, top)
    rows = [L for L, _, _ in picked]
    fig = Figure(figsize=(11, 0.35 * max(len(rows), 4) + 1.2), dpi=dpi)
    FigureCanvasAgg(fig)
    ax_t, ax_m = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    names = [L.path for L in rows]
    y = range(len(rows))
    fwd = [f * 1e3 for _, f, _ in picked]
    bwd = [b * 1e3 for _, _, b in picked]
    ax_t.barh(y, fwd, color="#4c72b0", label="forward")
    ax_t.barh(y, bwd, left=fwd, color="#dd8452", label="backward")
    ax_t.set_yticks(list(y), names, fontsize=8)
    ax_t.set_xlabel(BAR_BASIS)
    ax_t.legend(loc="lower right", fontsize=8)
    out_mb = [L.output_bytes / 2**20 for L in rows]
    saved_mb = [L.saved_bytes / 2**20 for L in rows]
    ax_m.barh(y, out_mb, color="#55a868", label="output")
    if any(saved_mb):
        ax_m.barh(y, saved_mb, left=out_mb, color="#c44e52", label="saved for backward")
    ax_m.set_xlabel("memory (MiB)")
    ax_m.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"layers by time (top {len(rows)})", fontsize=10)
    fig.tight_layout()
    return fig


# Figures for a logger's image card. TensorBoard shows an image in a box until "Show actual image size" is ticked
# (measured in TensorBoard 2.21, headless Chromium): 350 px wide in the Images tab, 215 px high (and at most the
# card's ~370 px wide) in the Time Series tab. The full 1200 x 720 px plot is shrunk 3.4x there and its 8 pt labels
# read about 4 px. A card figure is 3.5 x 2.15 in at 200 dpi (700 x 430 px: sharp on a 2x screen), which both boxes
# show at half size: 1 pt = 200 / 72 / 2 = 1.39 px, so its smallest text, 8 pt, reads 11.1 px. Fewer labels (the 3
# largest layer x phase points), no ridge labels, short legends. ``report.plot(path)`` and ``figure`` keep the
# full-size figure.
CARD_WIDTH_PX = 350  #: the width, in CSS px, at which TensorBoard's Images tab shows an image
CARD_HEIGHT_PX = 215  #: the height of the image box of TensorBoard's Time Series tab
CARD_WIDTH_IN, CARD_HEIGHT_IN = 3.5, 2.15
CARD_DPI = 200
CARD_FONT_PT = 8.0  #: the smallest text on a card figure


def displayed_font_px(points: float, fig: Figure, width_px: float = CARD_WIDTH_PX,
                      height_px: float = CARD_HEIGHT_PX) -> float:
    """The height in screen px of a ``points`` font of ``fig`` when the image is fitted into a ``width_px`` x
    ``height_px`` box (TensorBoard's Images tab fits the width; its Time Series tab the height; the smaller scale
    of the two)."""
    w, h = fig.get_figwidth() * fig.dpi, fig.get_figheight() * fig.dpi
    return points * fig.dpi / 72.0 * min(width_px / w, height_px / h)


def _roof_label(r: RoofUsed, roofs: Sequence[RoofUsed]) -> str:
    """A card's name of a roof: "bf16 matrix 989 TFLOP/s"; the precision alone where its matrix and vector roofs
    share the peak."""
    both = sum(x.precision == r.precision and x.peak_flops == r.peak_flops for x in roofs) > 1
    return f"{r.precision}{'' if both else ' matrix' if r.matrix else ' vector'} {rate_text(r.peak_flops)}"


def _card_axes(fig: Figure) -> Any:
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.tick_params(labelsize=CARD_FONT_PT, pad=2)
    return ax


def card_figure(report: ReportData, top_labels: int = 3) -> Figure:
    """The roofline for a logger's image card (TensorBoard's Images and Time Series tabs, W&B media): 700 x 430 px,
    text 8 pt or more (11 px or more in TensorBoard's boxes), the 3 largest layer x phase points labelled."""
    fs = CARD_FONT_PT
    fig = Figure(figsize=(CARD_WIDTH_IN, CARD_HEIGHT_IN), dpi=CARD_DPI)
    ax = _card_axes(fig)
    ax.set_xscale("log")
    ax.set_yscale("log")
    bw = report.summary.bandwidth
    pts = _points(report)
    x_lo, x_hi, y_lo, y_hi = _limits(pts, report.roofs, bw)
    _draw_roofs(ax, report.roofs, bw, x_lo, x_hi, ridge_fontsize=None)
    used = roof_bandwidth(report.roofs, bw)
    handles = [Line2D([], [], color="0.2", lw=1.5, label=f"memory {bw_text(used)}")]
    if used != bw and bw > 0:  # the device's bandwidth the roof was widened from, drawn dashed
        handles.append(Line2D([], [], color="0.45", lw=1.2, ls="--",
                              label=unused_bandwidth_label(bw, report.device.measured, short=True)))
    seen: set[tuple[str, float]] = set()
    for r in report.roofs:  # a precision's matrix and vector roofs at one peak (a CPU's) are one line: one entry
        if (r.precision, r.peak_flops) not in seen:
            seen.add((r.precision, r.peak_flops))
            handles.append(Line2D([], [], color=PRECISION_COLORS.get(r.precision, "0.5"), ls="-" if r.matrix else "--",
                                  lw=1.5, label=_roof_label(r, report.roofs)))
    # the roofs' key above the axes (inside, it covered the memory slope, the ridge and the points): two to a row
    # when two fit the width; else two with the longest labels broken before their parenthesis (a CPU's "measured
    # 34.5 GB/s (not used)" kept a 700 x 430 card's key at four rows, a third of its height); else one
    renderer = fig.canvas.get_renderer()
    labels = [h.get_label() for h in handles]
    broken = [lb.replace(" (", "\n(", 1) if len(lb) > 24 else lb for lb in labels]
    tries = [(2, labels)] + ([(2, broken)] if broken != labels else []) + [(1, labels)]
    for ncol, names in tries:
        key = fig.legend(handles=handles, labels=names, loc="upper center", bbox_to_anchor=(0.5, 0.915), ncol=ncol,
                         fontsize=fs, handlelength=1.2, borderpad=0.2, labelspacing=0.15, handletextpad=0.4,
                         columnspacing=0.8, frameon=False)
        x0, y0, x1, _ = key.get_window_extent(renderer).extents
        if ncol == 1 or (x0 >= 0 and x1 <= fig.bbox.width):
            break
        key.remove()
    fig.subplots_adjust(left=0.15, right=0.94, bottom=0.15, top=y0 / fig.bbox.height - 0.03)
    timed = report.timed
    _scatter_phases(ax, pts, timed, size=(8, 200), widths=(0.5, 1.2), short=True)
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    unit = _y_axis(ax, report.roofs, pts)
    ax.set_xlabel("FLOP / byte", fontsize=fs, labelpad=1)
    ax.set_ylabel(unit + ("" if timed else " (est.)"), fontsize=fs, labelpad=1)
    ax.grid(True, which="major", color="0.9", lw=0.5)
    s = report.summary
    step = f"step {s.step} · " if s.step is not None else ""
    if timed:
        title = f"{step}MFU {pct_text(s.mfu)} · MBU {pct_text(s.mbu)} · {time_text(s.measured_step_s)}"
    else:
        title = f"{step}untimed (hollow) · estimated {time_text(s.estimated_step_s)}"
    fig.suptitle(title, fontsize=fs + 0.5, y=0.99)
    # the y tick labels and the axis label inside the image (wide ticks such as 0.0001 need a wider margin)
    over = -fig.get_tightbbox(renderer).x0 * fig.dpi
    if over > -2:
        fig.subplots_adjust(left=fig.subplotpars.left + (over + 4) / fig.bbox.width)
    if pts:  # the phases' key in a corner where it covers no point and no roof
        _phase_key(ax, fig, pts, fontsize=fs, markerscale=0.6, borderpad=0.25, labelspacing=0.1,
                   handletextpad=0.1, framealpha=0.8)
        _place_labels(ax, fig, pts, top_labels, fontsize=fs, marker=(8, 200), max_chars=22)
    return fig


def card_layer_bars(layers: Mapping[str, LayerRecord], top: int = 7) -> Figure:
    """Per-layer forward/backward time for a logger's image card (700 x 430 px, as :func:`card_figure`): the ``top``
    layers by their time without their listed sub-layers (:func:`bar_rows`), largest first, each full path beside
    its bar at 8 pt. Memory is in the layer table."""
    picked = bar_rows(layers, top)
    fs = CARD_FONT_PT
    fig = Figure(figsize=(CARD_WIDTH_IN, CARD_HEIGHT_IN), dpi=CARD_DPI)
    ax = _card_axes(fig)
    y = list(range(len(picked)))
    fwd = [f * 1e3 for _, f, _ in picked]
    bwd = [b * 1e3 for _, _, b in picked]
    ax.barh(y, fwd, height=0.7, color="#4c72b0", label="forward")
    ax.barh(y, bwd, left=fwd, height=0.7, color="#dd8452", label="backward")
    ax.set_yticks(y, [L.path for L, _, _ in picked], fontsize=fs)
    ax.set_ylim(-0.6, max(len(picked), 3) - 0.4)
    ax.set_xlabel(BAR_BASIS, fontsize=fs, labelpad=1)
    ax.legend(loc="lower right", fontsize=fs, borderpad=0.25, labelspacing=0.1, framealpha=0.8)
    ax.set_title(f"layers by time (top {len(picked)})", fontsize=fs + 0.5, pad=3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout(pad=0.3)
    return fig
