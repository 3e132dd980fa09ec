"""``tscope report PATH``: re-render a saved profiled step (JSON) as the roofline table, CSV, plot, page and trace.

PATH holds a step file (what the callbacks write as ``tscope/step_<N>.json`` and ``tscope analyze --json`` writes:
``{"profile", "device", "report"}``, the report read back as it is, without re-analysis, unless ``--gpu`` names
another device), a report JSON (``report.to_dict()``), or a profiled step to analyse (``StepProfile.to_dict()``, or
a step file without a report). The device of an analysis is, in order: ``--gpu``, the file's device, the profile's
``info.device_name``. A file of another version is refused in one line.

Output: the markdown report on stdout; with file outputs (``--csv``, ``--plot``, ``--html``, ``--trace``) one line per
file written instead, and the report too only with ``--print`` (``--markdown``).
"""

from __future__ import annotations

import argparse
import sys

from tscope_callbacks.analysis.report import read_step_json
from tscope_callbacks.cli.args import output_file, positive_int

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


def run(args: argparse.Namespace) -> int:
    from tscope_callbacks.api import analyze, load_profile_file
    from tscope_callbacks.report import load_step_file

    try:
        data = read_step_json(args.path)  # the file read once
        if not args.gpu and ("schema" in data or data.get("report") is not None):
            report = load_step_file(args.path, data)  # StepFileError: another version, malformed
        else:
            prof, dev = load_profile_file(args.path, data)
            report = analyze(prof, args.gpu or dev or None)
    except (LookupError, ValueError, OSError) as e:  # StepFileError, UnknownDeviceError, a bad spec JSON path
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"tscope report: {msg or type(e).__name__}", file=sys.stderr)
        return 2
    if getattr(args, "print_markdown", False) or not any((args.csv, args.plot, args.html, args.trace)):
        print(report.to_markdown(top=args.top))
    if args.csv:
        report.to_csv(args.csv)
        print(f"CSV written to {args.csv}")
    if args.plot:
        report.plot(args.plot)
        print(f"plot written to {args.plot}")
    if args.html:
        from tscope_callbacks.dashboard.page import report_html, run_name_of

        with open(args.html, "w", encoding="utf-8") as fh:
            fh.write(report_html(report, run=report.run or run_name_of(args.path)))
        print(f"dashboard page written to {args.html}")
    if args.trace:
        if report.profile is None:
            print(f"tscope report: {args.path} keeps no profile, so no trace can be written (the callbacks keep it "
                  "in the step file)", file=sys.stderr)
            return 2
        report.save_trace(args.trace)
        print(f"trace written to {args.trace} (open it in ui.perfetto.dev)")
    return 0
