"""The one formatter: every figure the analysis' texts and the renderers print (no inf/nan ever printed)."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

__all__ = ["div", "sig", "time_text", "ms_text", "pct_text", "ratio_text", "bytes_text",
           "flops_text", "rate_text", "bw_text", "count_text", "figure_text"]


def div(a: float | None, b: float | None) -> float | None:
    """a / b; None when either is None or b is 0 (inf/nan never leave the analysis' figures)."""
    if a is None or b is None or b == 0:
        return None
    return a / b


# ---------------------------------------------------------------------------------------------------- figures
# Every figure with its unit, one convention per quantity: times auto-scaled (s, ms, µs, ns), bytes in binary units
# (KiB, MiB, GiB: what allocators and nvidia-smi show), FLOPs, FLOP/s and bandwidth in decimal units (as datasheets
# quote them), 3 significant figures, thousands with commas, never an exponent. The dashboard's JavaScript
# (render/static/js/fmt.js) prints the same text: tests/js/format_cases.json holds the cases both must pass.

def _round_sig(x: float, digits: int) -> Decimal:
    """``x`` rounded to ``digits`` significant figures, ties away from zero (JavaScript's ``toPrecision``)."""
    d = Decimal(x)  # exact: the binary value, as toPrecision rounds it
    exp = d.adjusted() - digits + 1
    return d.quantize(Decimal(1).scaleb(exp), rounding=ROUND_HALF_UP)


def _plain(d: Decimal) -> str:
    """A decimal without exponent or trailing zeros (``1.20`` -> ``1.2``, ``1.00E+3`` -> ``1000``)."""
    s = format(d, "f")
    return s.rstrip("0").rstrip(".") if "." in s else s


def sig(x: float | None, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, trailing zeros dropped; 1000 and above a rounded integer with
    thousands commas; below 1e-6 in magnitude "0" (float noise such as a total minus its parts); "–" when missing."""
    if x is None or isinstance(x, bool) or not math.isfinite(x):
        return "–"
    if abs(x) < 1e-6:
        return "0"
    if abs(x) >= 1000:
        return f"{math.floor(x + 0.5):,}"
    return _plain(_round_sig(float(x), digits))


def _scaled(x: float | None, units: tuple[str, ...], base: float) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    i, v = 0, float(x)
    while abs(v) >= base and i < len(units) - 1:
        v /= base
        i += 1
    return f"{sig(v)} {units[i]}"


def time_text(sec: float | None) -> str:
    """Seconds as s / ms / µs / ns ("54.4 ms", "875 µs")."""
    if sec is None or not math.isfinite(sec):
        return "–"
    a = abs(sec)
    if a < 1e-12:  # 0, or float noise (a total minus its parts): never "0.00694 ns"
        return "0 ms"
    if a >= 1:
        return f"{sig(sec)} s"
    if a >= 1e-3:
        return f"{sig(sec * 1e3)} ms"
    if a >= 1e-6:
        return f"{sig(sec * 1e6)} µs"
    return f"{sig(sec * 1e9)} ns"


def ms_text(sec: float | None) -> str:
    """Seconds as a bare number of milliseconds, for a column headed "ms" ("4.36", "0.128", "1,234")."""
    return "–" if sec is None or not math.isfinite(sec) else sig(sec * 1e3)


def pct_text(r: float | None) -> str:
    """A fraction as a percentage ("58.3%", "<0.01%")."""
    if r is None or not math.isfinite(r):
        return "–"
    return "<0.01%" if r != 0 and abs(r) < 1e-4 else f"{sig(r * 100)}%"


def ratio_text(x: float | None) -> str:
    """A ratio; near 1 with three decimals ("1.005x", "0.953x": three significant figures would read "1x")."""
    if x is None or not math.isfinite(x):
        return "–"
    if 0.1 <= x < 10:
        return format(Decimal(x).quantize(Decimal("0.001"), rounding=ROUND_HALF_UP), "f") + "x"
    return f"{sig(x)}x"


def bytes_text(b: float | None) -> str:
    """Bytes in binary units ("29.3 MiB")."""
    return _scaled(b, ("B", "KiB", "MiB", "GiB", "TiB"), 1024)


def flops_text(f: float | None) -> str:
    return _scaled(f, ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"), 1000)


def rate_text(f: float | None) -> str:
    """FLOP/s ("93.2 GFLOP/s")."""
    return _scaled(f, ("FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s"), 1000)


def bw_text(b: float | None) -> str:
    """Bandwidth, bytes/s in decimal units ("25.7 GB/s")."""
    return _scaled(b, ("B/s", "kB/s", "MB/s", "GB/s", "TB/s"), 1000)


def count_text(x: float | None, unit: str = "") -> str:
    """A count with its unit; a million and above scaled ("18,832 tokens/s", "2.5 M tokens/s")."""
    if x is None or not math.isfinite(x):
        return "–"
    u = f" {unit}" if unit else ""
    if abs(x) >= 1e6:
        return _scaled(x, ("", "k", "M", "G", "T"), 1000).strip() + u
    return sig(x) + u


def figure_text(value: float | None, unit: str) -> str:
    """A figure by its unit, as the dashboard's cards show it (``ms``, ``s``, ``fraction``/``ratio``, ``bytes``/``B``,
    ``TFLOP/s``, ``FLOP/s``, ``B/s``, ``tokens/s``, ``samples/s``; another unit: 3 significant figures and the unit)."""
    if value is None or isinstance(value, bool) or not math.isfinite(value):
        return "–"
    v = float(value)
    if unit == "ms":
        return time_text(v / 1e3)
    if unit == "s":
        return time_text(v)
    if unit in ("ratio", "fraction"):
        return pct_text(v)
    if unit in ("B", "bytes"):
        return bytes_text(v)
    if unit == "TFLOP/s":
        return rate_text(v * 1e12)
    if unit == "FLOP/s":
        return rate_text(v)
    if unit == "B/s":
        return bw_text(v)
    if unit in ("tokens/s", "samples/s"):
        return count_text(v, unit)
    return sig(v) + (f" {unit}" if unit else "")
