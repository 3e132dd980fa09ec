"""``tscope specs [NAME]``: the device roof table, or one device in full."""

from __future__ import annotations

import argparse
import json
import sys

from tscope_callbacks.devices.resolve import get_device_spec, list_specs
from tscope_callbacks.render.text import spec_detail, specs_table

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", default=None,
                   help="a device name, alias, real torch.cuda.get_device_name() string, JSON path, or 'auto'")
    p.add_argument("--table", default=None, help="an extra JSON table searched before the built-in one")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of text")


def run(args: argparse.Namespace) -> int:
    try:
        if args.name is None:
            specs = list_specs(table=args.table)
            print(json.dumps([s.to_dict() for s in specs], indent=1) if args.json else specs_table(specs))
            if not args.json:
                print(f"\n{len(specs)} devices; dense peaks; `tscope specs NAME` shows one in full.")
            return 0
        spec = get_device_spec(args.name, table=args.table)
    except ValueError as e:  # UnknownDeviceError, SpecFileError: a message, not a traceback
        print(f"tscope specs: {e}", file=sys.stderr)
        return 2
    print(json.dumps(spec.to_dict(), indent=1) if args.json else spec_detail(spec))
    return 0
