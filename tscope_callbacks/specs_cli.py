"""``tscope specs [NAME]``: the device roof table, or one device in full."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tscope_callbacks.specs import PRECISIONS, DeviceSpec, get_device_spec, list_specs

__all__ = ["add_arguments", "run", "format_table", "tflops", "specs_table", "spec_detail"]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain aligned text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), "-+-".join("-" * w for w in widths), *(line(r) for r in rows)])


def tflops(x: float | None) -> str:
    """FLOP/s as TFLOP/s with 5 significant digits, "-" when absent."""
    return "-" if x is None else f"{x / 1e12:.5g}"


def _l2(spec: DeviceSpec) -> str:
    return "-" if spec.l2_bytes is None else f"{spec.l2_bytes / 2**20:.4g}"


def specs_table(specs: Sequence[DeviceSpec]) -> str:
    """One line per device: dense matrix peaks as listed (no fallbacks), bandwidth, bf16 ridge, L2."""
    rows = []
    for s in specs:
        bf16 = s.flops.get("bf16")
        rows.append([s.name, tflops(bf16), tflops(s.flops.get("fp16")), tflops(s.flops.get("tf32")),
                     tflops(s.flops.get("fp32")), f"{s.bandwidth / 1e12:.4g}",
                     "-" if bf16 is None else f"{bf16 / s.bandwidth:.0f}", _l2(s)])
    headers = ["device", "bf16 TFLOP/s", "fp16 TFLOP/s", "tf32 TFLOP/s", "fp32 TFLOP/s", "TB/s",
               "ridge bf16 FLOP/B", "L2 MB"]
    return format_table(headers, rows)


def spec_detail(spec: DeviceSpec) -> str:
    """Every field of one device, and per precision the matrix and vector peaks and ridges (with fallbacks)."""
    def names(xs: Sequence[str]) -> str:
        return ", ".join(repr(x) for x in xs) or "-"

    head = [
        f"{spec.name}" + (f"  [{spec.vendor}]" if spec.vendor else "") + ("  (measured)" if spec.measured else ""),
        f"  source:     {spec.source or '-'}",
        f"  matches:    {names(spec.match)}",
        f"  patterns:   {names(spec.patterns)}",
        f"  aliases:    {names(spec.aliases)}",
        f"  bandwidth:  {spec.bandwidth / 1e12:.4g} TB/s ({spec.bandwidth / 1e9:.4g} GB/s)",
        f"  L2:         {_l2(spec)} MB",
    ]
    if spec.extra.get("notes"):
        head.append(f"  notes:      {spec.extra['notes']}")
    rows = []
    for p in PRECISIONS:
        cells = [p]
        for matrix in (True, False):
            try:
                eff = spec.effective_precision(p, matrix, allow_tf32=False)
                v = spec.peak_flops(p, matrix, allow_tf32=False)
            except ValueError:
                cells += ["-", "-"]
                continue
            note = f" (as {eff})" if matrix and eff != p else ""  # vector: fp32 unless listed (docstring)
            cells += [tflops(v) + note, f"{v / spec.bandwidth:.4g}"]
        rows.append(cells)
    table = format_table(["precision", "matrix TFLOP/s", "ridge FLOP/B", "vector TFLOP/s", "vector ridge FLOP/B"],
                         rows)
    foot = ("fp32 matmuls use the tf32 row when torch.get_float32_matmul_precision() != 'highest'."
            if "tf32" in spec.flops else "")
    out = "\n".join([*head, "", table] + ([foot] if foot else []))
    if spec.achievable is not None:
        from tscope_callbacks.calibrate import calibration_table

        out += "\n\nachievable (calibrated):\n" + calibration_table(spec)
    return out


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
