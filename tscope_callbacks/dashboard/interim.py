"""A version-1 step file (``{"profile", "device", "report"}``, written before the StepReport schema) as the dashboard's
report dict: its profile is analysed again on its recorded device (as ``tscope report`` does), and the page gets
``StepReport.to_dict()`` (schema ``tscope.step_report`` version 2) like any other step. ``dashboard.logdir`` calls
:func:`report_dict_from_file` for such files.
"""

from __future__ import annotations

import os
import re
from typing import Any

from tscope_callbacks.analysis.report import StepFileError

__all__ = ["report_dict_from_file", "StepFileError"]


def report_dict_from_file(path: str, *, run: str | None = None, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The StepReport dict of a saved step file (version 2 as it is; version 1 re-analysed from its profile; ``data``:
    the file's JSON, when already read); :class:`StepFileError` with a one-line reason when unusable."""
    from tscope_callbacks.analysis.report import SCHEMA, VERSION, read_step_json
    from tscope_callbacks.api import load_profile_file, roofline

    name = os.path.basename(path)
    if data is None:
        data = read_step_json(path, name)
    rep = data.get("report") if "schema" not in data else data
    if isinstance(rep, dict) and rep.get("schema") == SCHEMA:
        if rep.get("version") != VERSION:
            raise StepFileError(f"{name}: schema {SCHEMA} version {rep.get('version')}; this dashboard reads "
                                f"version {VERSION}")
        return rep
    try:
        prof, dev = load_profile_file(path, data)
        d = roofline(prof, dev or None).step_report.to_dict()
    except (LookupError, ValueError, OSError, TypeError) as e:
        raise StepFileError(f"{name}: {e}") from None
    m = re.search(r"(?:([a-z]+)_)?step_(\d+)\.json$", name)
    if m:
        d["step"], d["stage"] = int(m.group(2)), m.group(1) or "train"
    if run is not None:
        d["run"] = run
    return d
