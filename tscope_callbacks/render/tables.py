"""Rows (lists of dicts) as markdown tables, for the loggers' text views."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tscope_callbacks.analysis.fmt import sig

__all__ = ["rows_to_markdown", "narrow_markdown"]

_NAME_COLS = ("layer", "name", "path", "module", "op")

Row = Mapping[str, Any]

# A narrow view's column headers (TensorBoard's Text tab breaks a word anywhere once a table is wider than the card,
# so a table must fit: short headers; the CSV / W&B tables keep the keys)
SHORT_HEADERS = {"achieved_gflops_per_s": "GFLOP/s", "intensity": "FLOP/B", "measured_ms": "ms",
                 "estimated_ms": "exp. ms", "gflops": "GFLOP", "mb": "MiB", "forward_ms": "fwd ms",
                 "backward_ms": "bwd ms", "self_forward_ms": "self fwd", "self_backward_ms": "self bwd",
                 "gflops_fwd": "GFLOP fwd", "gflops_bwd": "GFLOP bwd", "output_mb": "out MiB",
                 "mem_fwd_mb": "mem fwd", "mem_bwd_mb": "mem bwd", "pct_of_roof": "% roof"}


def _fmt(v: Any) -> str:
    """A cell: a float to 3 significant figures (the one formatter), never an exponent (``analysis.fmt.sig``: float noise such as a
    total minus its parts reads 0, where ``.4g`` printed ``6.939e-15``)."""
    if isinstance(v, float):
        return sig(v)
    return str(v)


def rows_to_markdown(rows: Sequence[Row], *, max_cols: int | None = None) -> str:
    """A list of dicts (same keys) as a markdown table. ``max_cols``: a table to read in a narrow text view
    (TensorBoard): long-text columns (shapes) left out first, then the columns past ``max_cols``, never the row's
    name (the first column, a ``layer``/``name``/``path``/``module``/``op`` column); a last line says what was left
    out and where the full table is; the headers are the short ones of ``SHORT_HEADERS`` (the keys otherwise)."""
    if not rows:
        return "(empty)"
    cols = list(rows[0].keys())
    dropped: list[str] = []
    if max_cols is not None and len(cols) > max_cols:
        # the row's name (the first column, or a layer/name/op column) is kept however long: a row without it
        # reads "Conv1D, Conv1D, Dropout"
        keep = {cols[0]} | {c for c in cols if c in _NAME_COLS}
        wide = [c for c in cols if c not in keep
                and any(isinstance(r.get(c), str) and len(r.get(c)) > 24 for r in rows)]
        dropped = [c for c in cols if c in wide]
        budget = max_cols - sum(c in keep for c in cols)
        kept = []
        for c in (c for c in cols if c not in wide):
            if c in keep or budget > 0:
                kept.append(c)
                budget -= c not in keep
            else:
                dropped.append(c)
        cols = kept
    num = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) for r in rows) for c in cols]
    heads = [SHORT_HEADERS.get(c, c) for c in cols] if max_cols is not None else cols
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("--:" if n else ":--" for n in num) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")).replace("|", "\\|") for c in cols) + " |")
    if dropped:
        lines += ["", f"({len(dropped)} more columns -- {', '.join(dropped)} -- in the TSCOPE tab, `tscope report` "
                      "and the W&B / CSV tables)"]
    return "\n".join(lines)


# The report's table headers and phase names, shortened for a narrow view
_NARROW_HEADERS = {"measured ms": "ms", "% of roof": "% roof", "measured/roof": "×roof", "GFLOPs": "GFLOP",
                   "expected ms": "exp. ms", "estimated ms": "est. ms"}
_WIDE_DROPPED = ("type", "advice", "FLOP/B")  #: the columns a wide table loses in a narrow view
_NARROW_PHASES = {"forward": "fwd", "backward": "bwd", "optimizer": "opt", "recompute": "recomp"}


def narrow_markdown(markdown: str) -> str:
    """``markdown`` for TensorBoard's Text tab, which breaks words anywhere once a table is wider than its card
    ("comput e"): in every table the long headers shortened (``measured ms`` -> ``ms``, ``% of roof`` -> ``% roof``
    ...), a ``phase`` column's values abbreviated (fwd, bwd, opt) and a wide table's ``type``, ``advice`` and
    ``FLOP/B`` columns left out (the layer path names the type, the lists under the table give the advice; a last
    line says so); the text outside tables is unchanged. The file outputs keep the full markdown."""
    out: list[str] = []
    phase_col = drop = None
    dropped: set[str] = set()
    for line in markdown.split("\n"):
        if not line.startswith("|") or not line.rstrip().endswith("|"):
            phase_col = drop = None
            out.append(line)
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        if phase_col is None:  # the header row
            phase_col = cells.index("phase") if "phase" in cells else -1
            # a wide table (a layer x phase table) loses its module type (the layer path names it), its advice (the
            # Opportunities and "no known change" lists under it say it) and its intensity (GFLOP over MiB): ten
            # columns broke words in a 1400 px window's card (about 940 px)
            drop = {i for i, c in enumerate(cells) if c in _WIDE_DROPPED} if len(cells) > 8 else set()
            dropped.update(cells[i] for i in drop)
            cells = [_NARROW_HEADERS.get(c, c) for c in cells]
        elif 0 <= phase_col < len(cells):
            cells[phase_col] = _NARROW_PHASES.get(cells[phase_col], cells[phase_col])
        if drop:
            cells = [c for i, c in enumerate(cells) if i not in drop]
        out.append("| " + " | ".join(cells) + " |")
    if dropped:  # said once, at the end: where the columns left out are
        cols = ", ".join(c for c in _WIDE_DROPPED if c in dropped)
        out += ["", f"(narrowed for this view: the wide tables' {cols} columns are in `tscope report` and the TSCOPE "
                    "tab)"]
    return "\n".join(out)

