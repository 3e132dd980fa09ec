"""Number formatting shared by the analysis' reason strings and the renderers (no inf/nan ever printed)."""

from __future__ import annotations

import math

__all__ = ["div", "fig", "pct", "g", "n"]


def div(a: float | None, b: float | None) -> float | None:
    """a / b; None when either is None or b is 0 (inf/nan never leave the analysis' figures)."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def fig(x: float | None, spec: str = ".4g", scale: float = 1.0) -> str:
    """``x * scale`` formatted with ``spec``; "" when missing (untimed) or not finite."""
    if x is None or not math.isfinite(x):
        return ""
    return format(x * scale, spec)


def pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 or x == 0 else f"{x:.1%}"


def g(x: float | None) -> str:
    """3 significant figures, no exponent below 1e5 (1365.3 -> "1365", 0.125 -> "0.125")."""
    if x is None or not math.isfinite(x):
        return ""
    return f"{x:.0f}" if 1000 <= abs(x) < 1e5 else f"{x:.3g}"


def n(x: float | None) -> str:
    """4 significant figures; thousands without exponent ("70,540", "446.7", "0.01678"); "" when missing."""
    if x is None or not math.isfinite(x):
        return ""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
