"""``tscope report PATH``: re-render a saved profiled step (JSON) as the roofline table, CSV, plot and trace.

PATH holds a step file (``StepReport.to_dict()`` with ``"schema": "tscope.step_report"``, version 2: what the
callbacks write as ``tscope/step_<N>.json``; read back as it is, without re-analysis, unless ``--gpu`` names another
device), or a profiled step to analyse: ``StepProfile.to_dict()``, or a version 1 wrapper ``{"profile": {...},
"device": {...} | "name"}`` (what ``tscope analyze --json`` writes). The device of a re-analysis is, in order:
``--gpu``, the wrapper's device, the profile's ``meta["device_name"]``.

Output: the markdown report on stdout; with file outputs (``--csv``, ``--plot``, ``--html``, ``--trace``) one line per
file written instead, and the report too only with ``--print`` (``--markdown``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tscope_callbacks.analysis.report import StepReport, load_step_file, read_step_json
from tscope_callbacks.cli.args import output_file, positive_int
from tscope_callbacks.records import StepProfile
from tscope_callbacks.render import legacy, markdown, plot
from tscope_callbacks.render.trace import save_trace

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a step file (tscope/step_<N>.json), or a profiled step: StepProfile.to_dict() or "
                                "{'profile': ..., 'device': ...}")
    p.add_argument("--top", type=positive_int, default=20, help="rows in the layer table (default 20)")
    p.add_argument("--plot", default=None, type=output_file, metavar="OUT.png", help="write the roofline plot here")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help="device name from `tscope specs` or a JSON spec path (default: the recorded device)")
    p.add_argument("--csv", default=None, type=output_file, metavar="OUT.csv", help="write every row (ungrouped) as CSV here")
    p.add_argument("--html", default=None, type=output_file, metavar="OUT.html",
                   help="write the dashboard page of the step here (one self-contained file, no network)")
    p.add_argument("--trace", default=None, type=output_file, metavar="OUT.json",
                   help="write a Chrome/Perfetto trace of the step here (ui.perfetto.dev; HTA/TraceLens read it)")
    p.add_argument("--print", "--markdown", dest="print_markdown", action="store_true",
                   help="print the markdown report too when writing files (printed by default only when no "
                        "--csv/--plot/--html/--trace is given; with them, one line per file written)")


def _stored(path: str, data: dict[str, Any]) -> tuple[StepReport, StepProfile | None] | None:
    """The StepReport of a version 2 step file (``data``: its JSON) and its profile (when the file keeps it); None
    for other files."""
    if not ("schema" in data or isinstance(data.get("report"), dict) and "schema" in data["report"]):
        return None
    report = load_step_file(path, data)  # StepFileError: another version, malformed
    prof = data.get("profile")
    try:
        return report, StepProfile.from_dict(prof) if isinstance(prof, dict) else None
    except (TypeError, AttributeError, KeyError):
        return report, None


def run(args: argparse.Namespace) -> int:
    from tscope_callbacks.api import load_profile_file, roofline

    try:
        data = read_step_json(args.path)  # the file read once
        stored = None if args.gpu else _stored(args.path, data)
        if stored is not None:
            report, prof = stored
        else:
            prof, dev = load_profile_file(args.path, data)
            report = roofline(prof, args.gpu or dev or None).step_report
    except (LookupError, ValueError, OSError) as e:  # StepFileError, UnknownDeviceError, a bad spec JSON path
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"tscope report: {msg or type(e).__name__}", file=sys.stderr)
        return 2
    if getattr(args, "print_markdown", False) or not any((args.csv, args.plot, args.html, args.trace)):
        print(markdown.to_markdown(report, top=args.top))
    if args.csv:
        legacy.to_csv(report, args.csv)
        print(f"CSV written to {args.csv}")
    if args.plot:
        plot.plot(report, args.plot)
        print(f"plot written to {args.plot}")
    if args.html:
        from tscope_callbacks.dashboard.page import report_html, run_name_of

        with open(args.html, "w", encoding="utf-8") as fh:
            fh.write(report_html(report, run=report.run or run_name_of(args.path)))
        print(f"dashboard page written to {args.html}")
    if args.trace:
        if prof is None:
            print(f"tscope report: {args.path} keeps no profile, so no trace can be written (the callbacks keep it "
                  "in the step file)", file=sys.stderr)
            return 2
        save_trace(prof, args.trace, report)
        print(f"trace written to {args.trace} (open it in ui.perfetto.dev)")
    return 0
