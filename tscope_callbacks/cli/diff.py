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


def labels(a: str, b: str) -> tuple[str, str]:
    """Short names for two step files: their file names where they sit in one folder, else each from the first
    folder where their paths part (``logs/…/step_10.json`` vs ``logs2/…/step_10.json``), so two runs' files of one
    name, or of two names, say which run they are."""
    pa, pb = os.path.normpath(a).split(os.sep), os.path.normpath(b).split(os.sep)
    if pa[:-1] == pb[:-1]:
        return pa[-1], pb[-1]
    # the first folder where they part (one path may be the other's folder plus more: its last shared depth)
    i = next((k for k, (x, y) in enumerate(zip(pa[:-1], pb[:-1])) if x != y), min(len(pa), len(pb)) - 1)

    def short(p: list[str]) -> str:
        rest = p[i:]
        return "/".join(rest) if len(rest) <= 3 else f"{rest[0]}/…/{rest[-1]}"

    return short(pa), short(pb)


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
    d = diff_reports(reports[0], reports[1], labels=labels(args.a, args.b))
    print(d.to_markdown(top=args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(d.to_dict(), f)
        print(f"JSON written to {args.json}")
    return 0
