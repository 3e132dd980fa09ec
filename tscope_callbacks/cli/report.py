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
import dataclasses
import json
import sys
from typing import Any

from tscope_callbacks.analysis.report import StepReport, load_step_file
from tscope_callbacks.cli.args import output_file, positive_int
from tscope_callbacks.records import StepProfile
from tscope_callbacks.render import legacy, markdown, plot
from tscope_callbacks.render.trace import save_trace

__all__ = ["add_arguments", "run", "load", "spec_from_dict"]


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


def spec_from_dict(d: dict[str, Any]) -> Any:
    """A DeviceSpec from a ``gpu_specs.json``-style row (``DeviceSpec.to_dict()``; ``achievable`` nested)."""
    from tscope_callbacks.devices.spec import DeviceSpec

    if hasattr(DeviceSpec, "from_dict"):
        return DeviceSpec.from_dict(d, where="the profile's device")
    names = {f.name for f in dataclasses.fields(DeviceSpec)}
    kw = {k: v for k, v in d.items() if k in names}
    if isinstance(kw.get("achievable"), dict):
        kw["achievable"] = spec_from_dict(kw["achievable"])
    return DeviceSpec(**kw)


def load(path: str) -> tuple[StepProfile, Any]:
    """(profile, device or None) from a saved JSON; raises ValueError with a one-line message when unusable."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    prof = data.get("profile", data) if isinstance(data, dict) else None
    if not isinstance(prof, dict) or not isinstance(prof.get("ops"), list):
        raise ValueError(f"{path} is not a profiled step (expected StepProfile.to_dict() or {{'profile': ...}})")
    try:
        profile = StepProfile.from_dict(prof)
    except (TypeError, AttributeError, KeyError) as e:
        raise ValueError(f"{path}: malformed profile ({e})") from None
    dev = data.get("device") if "profile" in data else None
    if isinstance(dev, dict):
        have = [k for k in ("flops", "bandwidth") if k in dev]
        if len(have) == 1:  # a roof row with half its roofs: say which field, not "unknown device"
            need = "bandwidth (bytes/s)" if have == ["flops"] else "flops (peak FLOP/s per precision)"
            raise ValueError(f"{path}: the device row {dev.get('name', '')!r} has no {need}; add it to the file, or "
                             "pass --gpu NAME (`tscope specs` lists the known devices)")
        try:
            dev = spec_from_dict(dev) if "flops" in dev and "bandwidth" in dev else dev.get("name")
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: malformed device ({e})") from None
    return profile, dev


def _stored(path: str) -> tuple[StepReport, StepProfile | None] | None:
    """The StepReport of a version 2 step file and its profile (when the file keeps it); None for other files."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None  # load() says why
    if not isinstance(data, dict) or not ("schema" in data or isinstance(data.get("report"), dict)
                                          and "schema" in data["report"]):
        return None
    report = load_step_file(path)  # StepFileError: another version, malformed
    prof = data.get("profile")
    try:
        return report, StepProfile.from_dict(prof) if isinstance(prof, dict) else None
    except (TypeError, AttributeError, KeyError):
        return report, None


def run(args: argparse.Namespace) -> int:
    from tscope_callbacks.api import roofline

    try:
        stored = None if args.gpu else _stored(args.path)
        if stored is not None:
            report, prof = stored
        else:
            prof, dev = load(args.path)
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
