"""``tscope calibrate``: measure this machine's achievable roofs and show them beside the datasheet."""

from __future__ import annotations

import argparse
import json
import sys

from tscope_callbacks.devices.calibrate import calibrate
from tscope_callbacks.render.text import calibration_table

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default auto: the current GPU, else the CPU)")
    p.add_argument("--quick", action="store_true", help="smaller, faster measurements")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--no-cache", action="store_true", help="measure again even when a cached result exists")


def run(args: argparse.Namespace) -> int:
    try:
        spec = calibrate(args.device, quick=args.quick, cache=not args.no_cache)
    except (ValueError, RuntimeError) as e:
        print(f"tscope calibrate: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(spec.to_dict(), indent=2))
    else:
        print(calibration_table(spec))
    return 0
