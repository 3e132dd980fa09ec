"""The tscope dashboard page (``tscope_callbacks.dashboard.page`` re-exports it): one HTML page (inline JS and CSS, no library, no network) that renders StepReport dicts.

Two modes, one JS data layer (``static/dashboard.js``, ``API``):

- **TensorBoard mode** (``page_html(None)``): the page fetches the plugin's routes, relative to its own URL (or to
  ``window.TSCOPE_BASE`` when the host sets it): ``runs``, ``step?run=&step=&stage=``, ``ops?run=&step=&stage=&layer=``
  and ``series?run=``.
- **Standalone mode** (``page_html(data)``): the data is inline. ``<script type="application/json" id="tscope-data">``
  holds ``{"runs": [...], "hint": null, "steps": {}, "ops": {}, "series": {"<run>": {...}}}`` (a run's series:
  ``dashboard.logdir.series``' keys, ``"alerts"`` included); each step's report
  (without its ops) is in its own ``<script type="application/json" data-tscope-step="<run>/<stage>/<step>">`` and its
  ops in ``<script type="application/json" data-tscope-ops="<run>/<stage>/<step>">`` (columnar: ``{"cols": [...],
  "rows": [[...]], "note": str|null}``), each parsed only when the page needs it (the ops: a click on a layer, or the
  roofline's "ops" box). A key of ``steps``/``ops`` in ``tscope-data`` itself is read first.

Selectors (for browser tests):

- run / step / diff selectors: ``#run-select``, ``#step-select`` (option values ``"<stage>:<step>"``), ``#diff-select``
- cards: ``[data-card=step_time|mfu|mbu|hfu|tokens_per_s|memory|flop_coverage] .value`` (and ``.sub``: the basis);
  ``fmt_figure`` below formats a header figure exactly as the card shows it
- roofline: ``svg#roofline circle.pt`` (one per ``rows.layer_phase`` row with FLOPs > 0, bytes > 0 and a time;
  ``data-layer``, ``data-phase``), op points ``circle.op-pt`` (checkbox ``#show-ops``), roofs ``path.roof``
  (``data-precision``); the tooltip ``#tooltip``; a click lists the layer's ops in ``#ops-panel`` (``#ops-table``)
- layer tree: ``#tree-table tr.tree-row`` (``data-path``, ``data-depth``; a click on the name cell toggles;
  ``.open`` when expanded), ``#tree-expand``, ``#tree-collapse``
- the tree's memory and time cells: ``td[data-unmeasured]`` ("–", the reason in ``title``) where the report holds
  null (per-layer memory without layer details) or the step is untimed
- opportunities ``#opps li.opp``; time split ``#split`` (``input_s``: "input-bound (data wait)"); memory ``#mem``;
  NaN events ``#nan-table``; gradient spikes ``#spike-table tr.spike`` (``data-step``); communication
  ``#comm-panel``; compiled vs eager ``#cve-table tr[data-layer]``; FSDP what-if ``#fsdp-panel`` (``#fsdp-memory
  [data-key]``, ``#fsdp-time``, ``#fsdp-comm``); the what-if device ``#whatif-banner``; panels of absent sections
  are hidden
- over-time charts ``#charts [data-series=mfu|step_ms|tokens_per_s]``, and, when the run has the step monitor's
  series, ``[data-series=step_breakdown]`` (``path[data-line="step/<key>"]``), ``energy_per_token``, ``power``,
  ``sm_clock``; anomaly alerts: ``line.alert-mark[data-step]`` in each chart spanning the step, and ``#alerts
  li.alert[data-step]``
- TensorBoard mode polls ``runs`` every 10 s while ``document.visibilityState`` is visible (and when the page becomes
  visible): new steps join the selectors, the selected run, step and diff stay (``window.tscopeDashboard.poll()``:
  one poll, resolves true when the list changed; ``state.pollMs``)
- diff: ``#diff`` (``#diff-headline tr[data-figure]``, ``#diff-layers``, ``#diff-classes``)
- ``body[data-ready="1"]`` once a step is drawn (``window.tscopePainted``: its ``performance.now()``)
"""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from typing import Any

from tscope_callbacks.analysis.report import ReportLike, step_report_of

__all__ = ["page_html", "standalone_data", "report_html", "fmt_figure", "sig", "pack_ops", "series_from_reports",
           "OPS_BUDGET_BYTES"]

OPS_BUDGET_BYTES = 1_500_000  #: inline ops above this are summarised (the largest ops by time are kept)
_OP_COLS = ["i", "op", "layer", "phase", "category", "flops", "bytes", "time_s", "estimate_s", "expected_s",
            "pct_of_roof", "bound", "precision", "dtype", "input_shapes", "output_shapes", "counted"]


def _asset(name: str) -> str:
    return resources.files("tscope_callbacks.render").joinpath("static", name).read_text(encoding="utf-8")


def _json_for_script(obj: Any) -> str:
    """JSON safe inside a ``<script>`` element (``<`` escaped, so no ``</script>`` or ``<!--`` can occur)."""
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


# ---------- the numbers as the page shows them (mirrors dashboard.js: sig, F, figText) ----------

def sig(x: float | None, n: int = 3) -> str:
    """``x`` to ``n`` significant digits, trailing zeros dropped; 1000 and above: a rounded integer with commas."""
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return "–"
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{round(x):,}"
    v = float(f"{x:.{n}g}")
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else repr(v)


def _scaled(x: float, units: list[str], base: float) -> str:
    i, v = 0, float(x)
    while abs(v) >= base and i < len(units) - 1:
        v /= base
        i += 1
    return f"{sig(v)} {units[i]}"


def _time(sec: float) -> str:
    a = abs(sec)
    if a == 0:
        return "0 ms"
    if a >= 1:
        return f"{sig(sec)} s"
    if a >= 1e-3:
        return f"{sig(sec * 1e3)} ms"
    if a >= 1e-6:
        return f"{sig(sec * 1e6)} µs"
    return f"{sig(sec * 1e9)} ns"


def fmt_figure(fig: dict[str, Any] | None) -> str:
    """A header figure (``{value, unit, basis}``) as the page's card shows it."""
    if not fig or not isinstance(fig.get("value"), (int, float)) or not math.isfinite(fig["value"]):
        return "–"
    v, u = float(fig["value"]), fig.get("unit") or ""
    if u == "ms":
        return _time(v / 1e3)
    if u == "s":
        return _time(v)
    if u in ("ratio", "fraction"):
        return f"{sig(v * 100)}%"
    if u in ("B", "bytes"):
        return _scaled(v, ["B", "KiB", "MiB", "GiB", "TiB"], 1024)
    if u == "TFLOP/s":
        return _scaled(v * 1e12, ["FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s"], 1000)
    if u in ("tokens/s", "samples/s"):
        if abs(v) >= 1e6:
            return _scaled(v, ["", "k", "M", "G", "T"], 1000).strip() + " " + u
        return f"{sig(v)} {u}"
    return sig(v) + (f" {u}" if u else "")


# ---------- building the page ----------

def page_html(data: dict[str, Any] | None = None, *, title: str = "tscope dashboard") -> str:
    """The page. ``data`` None: TensorBoard mode (fetches the plugin's routes); a dict from :func:`standalone_data`:
    one self-contained file."""
    parts = ["<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
             f"<title>{html.escape(title)}</title>", "<style>", _asset("dashboard.css"), "</style></head><body>",
             "<div id=\"app\"><div class=\"empty\" style=\"padding:24px\">loading…</div></div>"]
    if data is not None:
        steps, ops = data.get("steps") or {}, data.get("ops") or {}
        index = {k: v for k, v in data.items() if k not in ("steps", "ops")}
        index.setdefault("steps", {})
        index.setdefault("ops", {})
        parts.append(f"<script type=\"application/json\" id=\"tscope-data\">{_json_for_script(index)}</script>")
        for k, rep in steps.items():
            parts.append(f"<script type=\"application/json\" data-tscope-step=\"{html.escape(k)}\">"
                         f"{_json_for_script(rep)}</script>")
        for k, o in ops.items():
            parts.append(f"<script type=\"application/json\" data-tscope-ops=\"{html.escape(k)}\">"
                         f"{_json_for_script(o)}</script>")
    parts += ["<script>", _asset("dashboard.js"), "</script></body></html>\n"]
    return "\n".join(parts)


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.4g}") if math.isfinite(v) else None
    return v


def _shape_str(sh: Any) -> str:
    if not sh:
        return ""
    if isinstance(sh, str):
        return sh
    return ", ".join("×".join(str(d) for d in x) if isinstance(x, (list, tuple)) and x else
                     ("scalar" if isinstance(x, (list, tuple)) else str(x)) for x in sh)


def pack_ops(ops: list[dict[str, Any]], budget: int = OPS_BUDGET_BYTES) -> dict[str, Any]:
    """The ops of one step, columnar and rounded to 4 significant digits; above ``budget`` bytes the shapes go, then
    only the largest ops by time are kept (each layer keeps its top ops), with a note saying how many were left out."""
    rows = [[_round(o.get(c)) if c not in ("input_shapes", "output_shapes") else _shape_str(o.get(c))
             for c in _OP_COLS] for o in ops]
    out = {"cols": _OP_COLS, "rows": rows, "note": None}
    size = len(_json_for_script(out))
    if size <= budget:
        return out
    si, so = _OP_COLS.index("input_shapes"), _OP_COLS.index("output_shapes")
    for r in rows:
        r[so] = ""
    size = len(_json_for_script(out))
    if size <= budget:
        out["note"] = "output shapes left out of this file to keep it small"
        return out
    ti, ei = _OP_COLS.index("time_s"), _OP_COLS.index("expected_s")
    per_row = max(1, size // max(1, len(rows)))
    keep_n = max(1, budget // per_row)
    order = sorted(range(len(rows)), key=lambda j: -(rows[j][ti] or rows[j][ei] or 0))
    keep = sorted(order[:keep_n])
    out["rows"] = [rows[j] for j in keep]
    for r in out["rows"]:
        r[si] = r[si][:60]
    out["note"] = (f"{len(keep):,} of {len(rows):,} ops kept in this file (the largest by time, "
                   f"{sum((rows[j][ti] or 0) for j in keep) / max(1e-30, sum((r[ti] or 0) for r in rows)):.0%} of op time)")
    return out


def _as_dict(report: ReportLike | dict[str, Any]) -> dict[str, Any]:
    """The contract dict of a StepReport, of an object carrying one (``ts.roofline``'s report), or the dict itself."""
    if isinstance(report, dict):
        return report
    return step_report_of(report).to_dict()


def _header_value(d: dict[str, Any], key: str) -> float | None:
    v = ((d.get("header") or {}).get(key) or {}).get("value")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def series_from_reports(reports: list[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """MFU, step ms, tokens/s and samples/s per profiled step, from the reports' headers."""
    out: dict[str, list[list[float]]] = {"mfu": [], "step_ms": [], "tokens_per_s": [], "samples_per_s": []}
    for d in sorted(reports, key=lambda d: d.get("step") or 0):
        if d.get("stage", "train") != "train" or d.get("step") is None:
            continue
        for k in out:
            v = _header_value(d, k)
            if v is not None:
                out[k].append([d["step"], v])
    return out


def standalone_data(reports: list[tuple[str, dict[str, Any]]], *, series: dict[str, dict] | None = None,
                    unreadable: list[tuple[str, str, int, str]] | None = None,
                    ops_budget: int = OPS_BUDGET_BYTES, hint: str | None = None) -> dict[str, Any]:
    """The inline data of a standalone page from ``(run, report dict)`` pairs (``unreadable``: ``(run, stage, step,
    error)`` listed as such); ``series`` per run (default: from the reports' headers)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    steps, ops, by_run = {}, {}, {}
    for run, d in reports:
        d = dict(d)
        stage, step = d.get("stage") or "train", d.get("step")
        entry = {"readable": True, "error": None}
        if step is None:  # an estimate (tscope analyze, ts.analyze_model): no trained step; listed as such
            entry["label"] = "estimate (no trained step)"
        step = 0 if step is None else int(step)
        k = f"{run}/{stage}/{step}"
        ops[k] = pack_ops(d.pop("ops", None) or [], ops_budget)
        steps[k] = d
        runs.setdefault(run, []).append({"step": step, "stage": stage, **entry})
        by_run.setdefault(run, []).append(d)
    for run, stage, step, err in unreadable or []:
        runs.setdefault(run, []).append({"step": step, "stage": stage, "readable": False, "error": err})
    ser = {run: series_from_reports(ds) for run, ds in by_run.items()}
    for run, s in (series or {}).items():
        ser[run] = {**ser.get(run, {}), **{k: v for k, v in s.items() if v}}
    return {"runs": [{"run": r, "steps": sorted(st, key=lambda x: (x["stage"] != "train", x["stage"], x["step"]))}
                     for r, st in runs.items()],
            "hint": hint, "steps": steps, "ops": ops, "series": ser}


def report_html(report: ReportLike | dict[str, Any], *, run: str | None = None, title: str | None = None) -> str:
    """One step as a self-contained page (``StepReport.to_html()``)."""
    d = _as_dict(report)
    name = run or d.get("run") or "run"
    t = title or f"tscope · {name} · " + (f"step {d['step']}" if d.get("step") is not None else "estimate")
    return page_html(standalone_data([(name, d)]), title=t)
