"""What ``torch.compile`` bought, per layer: the compiled step's kernel times next to an eager run of the same step.

``compiled_vs_eager(compiled, eager)`` takes the per-layer rows and the total of two steps of the same model and batch
-- one captured in kernels mode (``capture.compiled``: the compiled execution), one eager -- and returns per layer (all phases, self
attribution): compiled and eager measured time, the speedup, the compiled time's share of the roofline bound (how
far the fused kernels still are from the roof) and the number of kernels each ran. Layers are matched by path
(kernels-mode records carry the layer their parameters belong to); the totals row is the whole step's op time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.report import Row

__all__ = ["compiled_vs_eager"]

#: a step's per-layer rows (all phases, self attribution) and its total row
Rows = tuple[Sequence[Row], Row]


def compiled_vs_eager(compiled: Rows, eager: Rows) -> list[dict[str, Any]]:
    """Rows (largest eager time first): ``layer``, ``compiled_ms``, ``eager_ms``, ``speedup`` (eager / compiled),
    ``compiled_pct_of_roof``, ``compiled_ops``, ``eager_ops``; the last row is ``(total)``."""
    c, e = {r.layer: r for r in compiled[0]}, {r.layer: r for r in eager[0]}
    compiled_total, eager_total = compiled[1], eager[1]
    rows = []
    for layer in sorted(set(c) | set(e), key=lambda k: -((e[k].measured_s or 0.0) if k in e else 0.0)):
        rc, re_ = c.get(layer), e.get(layer)
        cm = rc.measured_s if rc is not None else None
        em = re_.measured_s if re_ is not None else None
        rows.append({"layer": layer or "(root)", "compiled_ms": None if cm is None else cm * 1e3,
                     "eager_ms": None if em is None else em * 1e3, "speedup": _div(em, cm),
                     "compiled_pct_of_roof": rc.attained if rc is not None else None,
                     "compiled_ops": rc.n_ops if rc is not None else 0, "eager_ops": re_.n_ops if re_ is not None else 0})
    ct, et = compiled_total.measured_s, eager_total.measured_s
    rows.append({"layer": "(total)", "compiled_ms": None if ct is None else ct * 1e3,
                 "eager_ms": None if et is None else et * 1e3, "speedup": _div(et, ct),
                 "compiled_pct_of_roof": compiled_total.attained, "compiled_ops": compiled_total.n_ops,
                 "eager_ops": eager_total.n_ops})
    return rows
