"""The tscope dashboard page (``tscope_callbacks.dashboard.page`` re-exports it): one HTML page (inline JS and CSS,
no library, no network) that renders ReportData dicts, and what it needs computed in Python.

The page's JavaScript is small CommonJS modules in ``static/js/`` (``main.js`` starts the page; the pure ones --
formatting, scales, the layer tree, the report's cards, the steps -- have ``node --test`` tests in ``tests/js``).
:func:`page_script` inlines them behind a loader of a few lines (each module a function of ``module, exports,
require``, as node wraps it), so the page stays one self-contained file: the standalone page, the TSCOPE tab
(served by the TensorBoard plugin with the script's hash in its CSP) and W&B's ``wandb.Html``.

Rules are computed here, not in the JavaScript: the step diff (``analysis.diff``), the warnings on how far the times
can be trusted (``render.notes.environment_warnings``) and whether a step has layer details.

Two modes, one JS data layer (``static/js/data.js``):

- **TensorBoard mode** (``page_html(None)``): the page fetches the plugin's routes, relative to its own URL (or to
  ``window.TSCOPE_BASE`` when the host sets it): ``runs``, ``step?run=&step=&stage=``, ``ops?run=&step=&stage=&layer=``,
  ``series?run=`` and ``diff?run=&a=<stage>:<step>&b=<stage>:<step>``.
- **Standalone mode** (``page_html(data)``): the data is inline. ``<script type="application/json" id="tscope-data">``
  holds ``{"runs": [...], "hint": null, "steps": {}, "ops": {}, "diffs": {}, "series": {"<run>": {...}}}`` (a run's
  series: ``dashboard.logdir.series``' keys, ``"alerts"`` included); each step's report (without its ops, with its
  ``page`` section: :func:`page_section`) is in its own ``<script type="application/json"
  data-tscope-step="<run>/<stage>/<step>">``, its ops in ``<script type="application/json"
  data-tscope-ops="<run>/<stage>/<step>">`` (columnar: ``{"cols": [...], "rows": [[...]], "note": str|null}``) and the
  diff of two of a run's steps (``StepDiff.to_dict``) in ``<script type="application/json"
  data-tscope-diff="<run>|<stage>:<step>|<stage>:<step>">`` (before, after), each parsed only when the page needs it.
  A key of ``steps``/``ops``/``diffs`` in ``tscope-data`` itself is read first.

A run's step entry (the runs index, here and in ``dashboard.logdir.scan``): ``{"step", "stage", "readable", "error",
"details"}`` (``details``: the step has layer details; the page opens on the latest such training step).

Selectors (for browser tests):

- run / step / diff selectors: ``#run-select``, ``#step-select`` (option values ``"<stage>:<step>"``), ``#diff-select``
- a step without layer details when another has them: ``#details-banner`` (``#details-goto`` shows that step)
- the warnings: ``#env-banner li[data-warning=busy|oversubscribed|roof-load|roof-note|noise]``
- cards: ``[data-card=step_time|mfu|mbu|hfu|tokens_per_s|memory|flop_coverage] .value`` (and ``.sub``: the basis);
  the value is ``analysis.fmt.figure_text`` of the header figure (the same text in both languages)
- roofline: ``svg#roofline circle.pt`` (one per ``rows.layer_phase`` row with FLOPs > 0, bytes > 0 and a time;
  ``data-layer``, ``data-phase``), op points ``circle.op-pt`` (checkbox ``#show-ops``), roofs ``path.roof``
  (``data-precision``); the tooltip ``#tooltip``; a click lists the layer's ops in ``#ops-panel`` (``#ops-table``)
- layer tree: ``#tree-table tr.tree-row`` (``data-path``, ``data-depth``; a click on the name cell toggles;
  ``.open`` when expanded), ``#tree-expand``, ``#tree-collapse``
- the tree's memory and time cells: ``td[data-unmeasured]`` ("–", the reason in ``title``) where the report holds
  null (per-layer memory without layer details) or the step is untimed
- opportunities ``#opps li.opp`` (``[data-evidence=predicted]``: how the saving was predicted,
  ``[data-evidence=measured]``: the measured ratio); time split ``#split`` (``input_s``: "input-bound (data wait)");
  memory ``#mem``; NaN events ``#nan-table``; gradient spikes ``#spike-table tr.spike`` (``data-step``);
  communication ``#comm-panel``; compiled vs eager ``#cve-table tr[data-layer]``; FSDP what-if ``#fsdp-panel``
  (``#fsdp-memory [data-key]``, ``#fsdp-time``, ``#fsdp-comm``); the what-if device ``#whatif-banner``; panels of
  absent sections are hidden
- over-time charts ``#charts [data-series=mfu|step_ms|tokens_per_s]``, and, when the run has the step monitor's
  series, ``[data-series=step_parts]`` (the parts of a step: ``path[data-line="step/<part>_ms"]``),
  ``[data-series=step_device]`` (``path[data-line="step/<key>"]``: device busy, idle, sync), ``energy_per_token``,
  ``power``,
  ``sm_clock``, and per rank ``rank_step_ms``, ``rank_sync_ms`` (``path[data-line="rank/<r>"]``), ``late_rank``; anomaly alerts: ``line.alert-mark[data-step]`` in each chart spanning the step, and ``#alerts
  li.alert[data-step]``
- TensorBoard mode polls ``runs`` every 10 s while ``document.visibilityState`` is visible (and when the page becomes
  visible): new steps join the selectors, the selected run, step and diff stay (``window.tscopeDashboard.poll()``:
  one poll, resolves true when the list changed; ``state.pollMs``)
- diff: ``#diff`` (``#diff-headline tr[data-figure]``, each change cell ``td[data-verdict=better|worse|noise|
  unknown]``; ``#diff-layers``, ``#diff-classes``; ``#diff-notes``)
- ``body[data-ready="1"]`` once a step is drawn (``window.tscopePainted``: its ``performance.now()``)
"""

from __future__ import annotations

import functools
import html
import json
import math
import re
from importlib import resources
from typing import Any

from tscope_callbacks.analysis.diff import DIFF_TOP, diff_reports
from tscope_callbacks.analysis.report import ReportData, StepFileError
from tscope_callbacks.render.markdown import input_lines
from tscope_callbacks.render.notes import environment_warnings

__all__ = ["page_html", "page_script", "standalone_data", "report_html", "pack_ops", "series_from_reports",
           "page_section", "page_step", "layer_details", "open_step", "step_diff", "step_label", "OPS_BUDGET_BYTES", "DIFF_TOP",
           "DIFF_ALL_PAIRS"]

OPS_BUDGET_BYTES = 1_500_000  #: inline ops above this are summarised (the largest ops by time are kept)
DIFF_ALL_PAIRS = 8  #: a standalone page holds the diff of every pair of a run's steps up to this many steps
_OP_COLS = ["i", "op", "layer", "phase", "category", "flops", "bytes", "time_s", "estimate_s", "expected_s",
            "pct_of_roof", "bound", "precision", "dtype", "input_shapes", "output_shapes", "counted"]
_LOADER = """(function () {
"use strict";
const defs = Object.create(null), cache = Object.create(null);
function require(name) {
  const id = name.replace(/^\\.\\//, "").replace(/\\.js$/, "");
  if (cache[id]) return cache[id].exports;
  if (!defs[id]) throw new Error("tscope dashboard: no module " + name);
  const module = cache[id] = {exports: {}};
  defs[id](module, module.exports, require);
  return module.exports;
}
"""


def _asset(name: str) -> str:
    return resources.files("tscope_callbacks.render").joinpath("static", name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def page_script() -> str:
    """The page's JavaScript: every module of ``static/js`` inlined behind a CommonJS loader, ``main`` required."""
    folder = resources.files("tscope_callbacks.render").joinpath("static", "js")
    parts = [_LOADER]
    for f in sorted((f for f in folder.iterdir() if f.name.endswith(".js")), key=lambda f: f.name):
        text = f.read_text(encoding="utf-8")
        if re.search(r"</script|<!--", text, re.I):  # it would end (or confuse) the inline script element
            raise ValueError(f"{f.name}: '</script' or '<!--' cannot be inlined in the page")
        parts.append(f"defs[{json.dumps(f.name[:-3])}] = function (module, exports, require) {{\n{text}\n}};\n")
    parts.append('require("main");\n})();\n')
    return "".join(parts)


def _json_for_script(obj: Any) -> str:
    """JSON safe inside a ``<script>`` element (``<`` escaped, so no ``</script>`` or ``<!--`` can occur)."""
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


# ---------- what the page shows beside the report, computed here ----------

def _plain(markdown: str) -> str:
    """A markdown sentence as plain text (``**bold**`` and ```code``` marks dropped), capitalised."""
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", markdown).replace("`", "")
    return text[:1].upper() + text[1:]


def layer_details(d: dict[str, Any]) -> bool:
    """The step (its report dict) has layer details: some layer's memory was measured or its shapes recorded
    (``LayerProfilerCallback``, or a ``ts.profile`` with layer details)."""
    return any(isinstance(L, dict) and (L.get("memory_fwd_bytes") is not None or L.get("input_shapes"))
               for L in d.get("layers") or ())


def open_step(steps: list[dict[str, Any]]) -> str | None:
    """The step a run's page opens on, ``"<stage>:<step>"``: the richest, i.e. the latest readable training step with
    layer details, else the latest readable training step, else the latest readable step of another stage (``steps``:
    the run's step entries in the index's order); None when none is readable."""
    ok = [s for s in steps if s.get("readable", True)]
    train = [s for s in ok if (s.get("stage") or "train") == "train"]
    pick = next((s for s in reversed(train) if s.get("details")), None) or (train[-1] if train else None) or \
        next((s for s in reversed(ok) if s.get("details")), None) or (ok[-1] if ok else None)
    return None if pick is None else f"{pick.get('stage') or 'train'}:{pick['step']}"


def page_section(report: ReportData) -> dict[str, Any]:
    """The report's ``page`` section, the text report's own sentences as plain text: ``warnings``, how far its times
    can be trusted (``render.notes.environment_warnings``: kind, text), and ``input``, the step's time fetching its
    batch (``render.markdown.input_lines``; None without the step monitor's figures)."""
    inp = input_lines(report)
    return {"warnings": [{"kind": k, "text": _plain(t)} for k, t in environment_warnings(report)],
            "input": _plain(inp[0].removeprefix("- ")) if inp else None}


def page_step(d: dict[str, Any], report: ReportData | None = None) -> dict[str, Any]:
    """A step as the page reads it: its report dict without the ops (the page asks for them apart), with
    ``ops_count``, its ``header`` (the headline figures, derived: ``ReportData.header_json``) and its ``page``
    section (``report``: its ReportData when at hand, else read from ``d``; a dict that does not read as one gets no
    header and no warnings)."""
    if report is None:
        report = _report_or_none(d)
    out = {k: v for k, v in d.items() if k != "ops"}
    out["ops_count"] = len(d.get("ops") or ())
    out["header"] = report.header_json() if report is not None else {}
    out["page"] = page_section(report) if report is not None else {"warnings": [], "input": None}
    return out


def step_label(stage: str | None, step: int | None) -> str:
    """A step as the page names it ("step 200", "validation step 3")."""
    return ("" if (stage or "train") == "train" else f"{stage} ") + f"step {step}"


def step_diff(a: dict[str, Any] | ReportData, b: dict[str, Any] | ReportData, labels: tuple[str, str],
              top: int = DIFF_TOP) -> dict[str, Any]:
    """The page's diff of two steps (before, after): ``analysis.diff.diff_reports(...).to_dict(top)``, or
    ``{"error"}`` when a report cannot be read."""
    ra = a if isinstance(a, ReportData) else _report_or_none(a)
    rb = b if isinstance(b, ReportData) else _report_or_none(b)
    if ra is None or rb is None:
        return {"error": "a step's report cannot be read: " + ("the first" if ra is None else "the second")}
    return diff_reports(ra, rb, labels).to_dict(top=top)


def _diff_pairs(entries: list[tuple[str, int]]) -> list[tuple[int, int]]:
    """Which pairs of a run's steps (in order) a standalone page holds diffs of: every pair up to
    :data:`DIFF_ALL_PAIRS` steps; beyond, each step with the one before it and with the last."""
    n = len(entries)
    if n <= DIFF_ALL_PAIRS:
        return [(i, j) for i in range(n) for j in range(i + 1, n)]
    return sorted({(i - 1, i) for i in range(1, n)} | {(i, n - 1) for i in range(n - 1)})


# ---------- building the page ----------

def page_html(data: dict[str, Any] | None = None, *, title: str = "tscope dashboard") -> str:
    """The page. ``data`` None: TensorBoard mode (fetches the plugin's routes); a dict from :func:`standalone_data`:
    one self-contained file."""
    parts = ["<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
             f"<title>{html.escape(title)}</title>", "<style>", _asset("dashboard.css"), "</style></head><body>",
             "<div id=\"app\"><div class=\"empty\" style=\"padding:24px\">loading…</div></div>"]
    if data is not None:
        big = ("steps", "ops", "diffs")
        index = {k: v for k, v in data.items() if k not in big}
        index.update({k: {} for k in big})
        parts.append(f"<script type=\"application/json\" id=\"tscope-data\">{_json_for_script(index)}</script>")
        for key, attr in (("steps", "data-tscope-step"), ("ops", "data-tscope-ops"), ("diffs", "data-tscope-diff")):
            for k, v in (data.get(key) or {}).items():
                parts.append(f"<script type=\"application/json\" {attr}=\"{html.escape(k)}\">"
                             f"{_json_for_script(v)}</script>")
    parts += ["<script>", page_script(), "</script></body></html>\n"]
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


def _header_value(d: dict[str, Any], key: str) -> float | None:
    v = ((d.get("header") or {}).get(key) or {}).get("value")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def series_from_reports(reports: list[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """MFU, step ms, tokens/s and samples/s per profiled step, from the reports' headers (the dicts as
    :func:`page_step` gives them)."""
    out: dict[str, list[list[float]]] = {"mfu": [], "step_ms": [], "tokens_per_s": [], "samples_per_s": []}
    for d in sorted(reports, key=lambda d: d.get("step") or 0):
        if d.get("stage", "train") != "train" or d.get("step") is None:
            continue
        for k in out:
            v = _header_value(d, k)
            if v is not None:
                out[k].append([d["step"], v])
    return out


def standalone_data(reports: list[tuple[str, dict[str, Any] | ReportData]], *,
                    series: dict[str, dict] | None = None,
                    unreadable: list[tuple[str, str, int, str]] | None = None,
                    ops_budget: int = OPS_BUDGET_BYTES, hint: str | None = None) -> dict[str, Any]:
    """The inline data of a standalone page from ``(run, report)`` pairs (a report: its dict, or the ReportData);
    ``unreadable``: ``(run, stage, step, error)`` listed as such; ``series`` per run (default: from the reports'
    headers). Each step gets its ``page`` section, and each run the diffs of its steps (:func:`_diff_pairs`)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    steps, ops, by_run, objs, labels = {}, {}, {}, {}, {}
    for run, rep in reports:
        obj = rep if isinstance(rep, ReportData) else _report_or_none(rep)  # None: the page shows the dict alone
        d = rep.to_dict() if isinstance(rep, ReportData) else dict(rep)
        stage, step = d.get("stage") or "train", d.get("step")
        entry: dict[str, Any] = {"readable": True, "error": None, "details": layer_details(d)}
        if step is None:  # an estimate (tscope analyze, ts.analyze_model): no trained step; listed as such
            entry["label"] = "estimate (no trained step)"
        step = 0 if step is None else int(step)
        k = f"{run}/{stage}/{step}"
        ops[k] = pack_ops(d.get("ops") or [], ops_budget)
        steps[k] = d = page_step(d, obj)
        objs[k] = obj
        labels[k] = entry.get("label") or step_label(stage, step)
        runs.setdefault(run, []).append({"step": step, "stage": stage, **entry})
        by_run.setdefault(run, []).append(d)
    for run, stage, step, err in unreadable or []:
        runs.setdefault(run, []).append({"step": step, "stage": stage, "readable": False, "error": err})
    ser = {run: series_from_reports(ds) for run, ds in by_run.items()}
    for run, s in (series or {}).items():
        ser[run] = {**ser.get(run, {}), **{k: v for k, v in s.items() if v}}
    order = lambda x: (x["stage"] != "train", x["stage"], x["step"])  # noqa: E731
    index = [{"run": r, "steps": sorted(st, key=order)} for r, st in runs.items()]
    for r in index:
        r["open"] = open_step(r["steps"])
    diffs = {}
    for r in index:
        ok = [(x["stage"], x["step"]) for x in r["steps"] if x["readable"]]
        for i, j in _diff_pairs(ok):
            (sa, na), (sb, nb) = ok[i], ok[j]
            ka, kb = f"{r['run']}/{sa}/{na}", f"{r['run']}/{sb}/{nb}"
            if objs[ka] is not None and objs[kb] is not None:
                diffs[f"{r['run']}|{sa}:{na}|{sb}:{nb}"] = step_diff(objs[ka], objs[kb], (labels[ka], labels[kb]))
    return {"runs": index, "hint": hint, "steps": steps, "ops": ops, "diffs": diffs, "series": ser}


def _report_or_none(d: dict[str, Any]) -> ReportData | None:
    """The ReportData of a report dict, read without its op list: what the page section and the diff read (the
    ops are most of a large report's parsing time: 14,005 ops, 1.9 s of a 4.2 s page); None when it does not read."""
    try:
        return ReportData.from_dict({**d, "ops": []})
    except StepFileError:
        return None


def report_html(report: ReportData | dict[str, Any], *, run: str | None = None, title: str | None = None) -> str:
    """One step as a self-contained page (``StepReport.to_html()``)."""
    rep = report
    d = rep if isinstance(rep, dict) else {"run": rep.run, "step": rep.step}
    name = run or d.get("run") or "run"
    t = title or f"tscope · {name} · " + (f"step {d['step']}" if d.get("step") is not None else "estimate")
    return page_html(standalone_data([(name, rep)]), title=t)
