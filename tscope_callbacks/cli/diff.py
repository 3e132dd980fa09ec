"""``tscope diff A.json B.json``: two saved profiled steps (or analyses) side by side (``analysis.diff``)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from tscope_callbacks.cli.args import output_file, positive_int
from tscope_callbacks.report import StepReport

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="the step before (a step_<N>.json, or a `tscope analyze --json` file)")
    p.add_argument("b", help="the step after")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help="rate both on this device (default: each file's recorded device)")
    p.add_argument("--top", type=positive_int, default=15, help="rows per table (default 15)")
    p.add_argument("--json", default=None, type=output_file, metavar="OUT.json", help="write the comparison as JSON here")


def _report(path: str, gpu: str | None) -> StepReport:
    """The step's saved report (what the callback wrote: the numbers the dashboard shows); with ``gpu``, or for a
    file without one, its profile analysed."""
    from tscope_callbacks.analysis.report import StepFileError
    from tscope_callbacks.api import analyze, load_profile_file
    from tscope_callbacks.report import load_step_file

    if gpu is None:
        try:
            return load_step_file(path)
        except StepFileError:
            pass  # a profile without a report (or of another version): analysed below, or its one-line error
    prof, dev = load_profile_file(path)
    return analyze(prof, gpu or dev or None)


def run(args: argparse.Namespace) -> int:
    from tscope_callbacks.analysis.diff import diff_reports

    reports = []
    for path in (args.a, args.b):
        try:
            reports.append(_report(path, args.gpu))
        except (LookupError, ValueError, OSError) as e:
            msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
            print(f"tscope diff: {msg or type(e).__name__}", file=sys.stderr)
            return 2
    names = [os.path.basename(args.a), os.path.basename(args.b)]
    if names[0] == names[1]:
        names = [args.a, args.b]
    d = diff_reports(reports[0], reports[1], labels=(names[0], names[1]))
    print(d.to_markdown(top=args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(d.to_dict(), f)
        print(f"JSON written to {args.json}")
    return 0
