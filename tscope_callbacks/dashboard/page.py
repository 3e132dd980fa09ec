"""The tscope dashboard page: the pure HTML builder is ``render.dashboard`` (its docstring lists the two data modes
and the page's selectors); this module adds the log-dir readers: :func:`run_html` (``tscope view``) and the names the
TensorBoard plugin and the tests import."""

from __future__ import annotations

import os

from tscope_callbacks.analysis.report import parse_step_file_name
from tscope_callbacks.render.dashboard import (
    OPS_BUDGET_BYTES,
    pack_ops,
    page_html,
    report_html,
    series_from_reports,
    standalone_data,
)

__all__ = ["page_html", "standalone_data", "report_html", "run_html", "run_name_of", "write_html", "pack_ops",
           "series_from_reports", "OPS_BUDGET_BYTES"]


# ---------- a logdir or run directory ----------

def run_name_of(path: str) -> str:
    """The run a step file belongs to, by its directory: ``<run>/tscope/step_N.json`` -> ``<run>`` (a Lightning
    ``version_N`` directory with its parent: ``tiny/version_0``); a step file elsewhere -> its directory's name; any
    other file (``tscope analyze --json gpt2.json``) -> its own name (``gpt2``)."""
    base = os.path.basename(path)
    if parse_step_file_name(base) is None:  # a saved analysis, say gpt2.json: its own name
        return os.path.splitext(base)[0] or "run"
    d = os.path.dirname(os.path.abspath(path))
    if os.path.basename(d) == "tscope":
        d = os.path.dirname(d)
    name = os.path.basename(d)
    if name.startswith("version_") and os.path.basename(os.path.dirname(d)):
        name = os.path.basename(os.path.dirname(d)) + "/" + name
    return name or os.path.splitext(os.path.basename(path))[0] or "run"


def run_html(path: str, *, title: str | None = None, ops_budget: int = OPS_BUDGET_BYTES) -> str:
    """Every run with step files at or under ``path`` (a log dir, a run directory, or one step JSON) as one page,
    read by ``dashboard.logdir``. Raises ``FileNotFoundError`` naming what to add when there is none; an unreadable
    step file is listed as such in the page with its reason."""
    from tscope_callbacks.dashboard import logdir as ld

    if os.path.isfile(path):
        run = run_name_of(path)
        try:
            d = ld.read_step_file(path)
        except ld.StepFileError as e:
            raise ValueError(str(e)) from None
        return report_html(d, run=run, title=title)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such directory")
    idx = ld.scan(path)
    if not idx.get("runs"):
        raise FileNotFoundError(f"no tscope step files under {path}: {ld.HOW_TO}")
    reports, bad, series = [], [], {}
    for r in idx["runs"]:
        for st in r["steps"]:
            d = ld.load(r["dir"], st["step"], st["stage"]) if st.get("readable", True) else {"error": st.get("error")}
            if "schema" in d:
                reports.append((r["run"], {**d, "step": st["step"], "stage": st["stage"]}))
            else:
                bad.append((r["run"], st["stage"], st["step"], d.get("error") or "unreadable"))
        ser = ld.series(r["dir"])
        series[r["run"]] = {k: v for k, v in ser.items() if k != "profiles" and isinstance(v, (list, dict))}
    name = title or f"tscope · {os.path.basename(os.path.abspath(path))}"
    return page_html(standalone_data(reports, series=series, unreadable=bad, ops_budget=ops_budget), title=name)


def write_html(text: str, out: str) -> str:
    """Write ``text`` to ``out`` (parents created); returns ``out``."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    return out
