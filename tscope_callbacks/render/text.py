"""Plain-text renderings: aligned tables, the device roof table, one device in full, a calibration table."""

from __future__ import annotations

from collections.abc import Sequence

from tscope_callbacks.analysis.fmt import bw_text, pct_text, sig
from tscope_callbacks.devices.precision import PRECISIONS
from tscope_callbacks.devices.spec import DeviceSpec

__all__ = ["format_table", "tflops", "specs_table", "spec_detail", "calibration_table"]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain aligned text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), "-+-".join("-" * w for w in widths), *(line(r) for r in rows)])


def tflops(x: float | None) -> str:
    """FLOP/s as TFLOP/s with 5 significant digits, "-" when absent."""
    return "-" if x is None else sig(x / 1e12, 5)


def _l2(spec: DeviceSpec) -> str:
    return "-" if spec.l2_bytes is None else sig(spec.l2_bytes / 2**20, 4)


def specs_table(specs: Sequence[DeviceSpec]) -> str:
    """One line per device: dense matrix peaks as listed (no fallbacks), bandwidth, bf16 ridge, L2."""
    rows = []
    for s in specs:
        bf16 = s.flops.get("bf16")
        rows.append([s.name, tflops(bf16), tflops(s.flops.get("fp16")), tflops(s.flops.get("tf32")),
                     tflops(s.flops.get("fp32")), sig(s.bandwidth / 1e12, 4),
                     "-" if bf16 is None else sig(bf16 / s.bandwidth), _l2(s)])
    headers = ["device", "bf16 TFLOP/s", "fp16 TFLOP/s", "tf32 TFLOP/s", "fp32 TFLOP/s", "TB/s",
               "ridge bf16 FLOP/B", "L2 MiB"]
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
        f"  bandwidth:  {bw_text(spec.bandwidth)}",
        f"  L2:         {_l2(spec)} MiB",
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
            cells += [tflops(v) + note, sig(v / spec.bandwidth, 4)]
        rows.append(cells)
    table = format_table(["precision", "matrix TFLOP/s", "ridge FLOP/B", "vector TFLOP/s", "vector ridge FLOP/B"],
                         rows)
    foot = ("fp32 matmuls use the tf32 row when torch.get_float32_matmul_precision() != 'highest'."
            if "tf32" in spec.flops else "")
    out = "\n".join([*head, "", table] + ([foot] if foot else []))
    if spec.achievable is not None:
        out += "\n\nachievable (calibrated):\n" + calibration_table(spec)
    return out


def _pct(a: float | None, d: float | None) -> str:
    return pct_text(a / d) if a and d else "-"


def calibration_table(spec: DeviceSpec) -> str:
    """The datasheet | achievable | % table for a calibrated spec."""
    ach = spec.achievable or spec
    rows = []
    for p in PRECISIONS:
        d, a = spec.flops.get(p), ach.flops.get(p)
        if d is None and a is None:
            continue
        rows.append([p, tflops(d), tflops(a), _pct(a, d)])
    lines = [f"device: {spec.name}" + ("  (measured: the CPU has no datasheet roofs)" if spec.measured else ""),
             f"source: {spec.source}", "",
             format_table(["precision", "datasheet TFLOP/s", "achievable TFLOP/s", "%"], rows), "",
             format_table(["memory", "datasheet TB/s", "achievable TB/s", "%"],
                          [["bandwidth", sig(spec.bandwidth / 1e12, 4), sig(ach.bandwidth / 1e12, 4),
                            _pct(ach.bandwidth, spec.bandwidth)]])]
    return "\n".join(lines)
